"""Sharing tables between processes: import latency of a handle, and the store daemon's get().

Goal: importing a table is a mapping, not a copy, so it takes about the same time (<= 1 ms) for
1 MB as for 32 GB. A table with string columns also has its offsets checked at import (one kernel
launch per string column): measured on a 1 GB table of one string column, against copying it, and
so is ``to_arrow`` of that imported table, which copies and checks the offsets again (the exporter
may have written them since: issue 36).
The baseline is what a copy costs: a device-to-device copy of the same bytes (host memcpy on the
CPU), measured in the importing process in the same run. The importer is a
separate spawned process; each import is timed from handle bytes to a usable column array, and
the mapping is closed between repetitions (a cached re-import is listed separately).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import pystrom

from _harness import Result, measure

MB, GB = 1 << 20, 1 << 30

# The importer processes share this prelude: the handle and repeat count from argv, and the timers.
_CHILD = r"""
import gc, json, statistics, sys, time
import numpy as np
import pystrom

handle = open(sys.argv[1], "rb").read()
repeat = int(sys.argv[2])


def sync():
    if xp is not np:
        xp.cuda.runtime.deviceSynchronize()


def median_time(step, times, after=None):
    spent = []
    for _ in range(times):
        t0 = time.perf_counter()
        step()
        spent.append(time.perf_counter() - t0)
        if after is not None:
            after()
    return statistics.median(spent)


def copy_time(src):
    dst = xp.empty_like(src)
    return median_time(lambda: (sync(), xp.copyto(dst, src), sync()), max(3, repeat // 4))
"""

IMPORTER = (
    _CHILD
    + r"""
first = pystrom.ipc_import(handle)  # warm-up: imports pyarrow, creates the CUDA context
xp = np if first.device == "cpu" else __import__("cupy")
del first
gc.collect()
# each import maps again: collecting the last one closes its mapping
opened = median_time(lambda: pystrom.ipc_import(handle)["x"], repeat, after=gc.collect)
held = pystrom.ipc_import(handle)
cached = median_time(lambda: pystrom.ipc_import(handle)["x"], repeat)
copy = copy_time(held["x"])
print(json.dumps({"open": opened, "cached": cached, "copy": copy}))
"""
)


STRING_IMPORTER = (
    _CHILD
    + r"""
from pystrom.ipc.validate import check_table

first = pystrom.ipc_import(handle)  # warm-up: CUDA context, the validation kernel compiled
xp = np if first.device == "cpu" else __import__("cupy")
nbytes = first._live().nbytes
del first
gc.collect()
# maps, then checks the offsets of the string column
opened = median_time(lambda: pystrom.ipc_import(handle).column("s"), repeat, after=gc.collect)
held = pystrom.ipc_import(handle)
check = median_time(lambda: check_table(held, "bench"), repeat)  # one kernel launch, one 8-byte copy back
# the exporter may still write: every use copies the offsets and checks the copy (issue 36)
use = median_time(lambda: (held.to_arrow(), sync()), repeat)
copy = copy_time(held._live().array(0, np.uint8, (nbytes,)))
print(json.dumps({"open": opened, "check": check, "use": use, "copy": copy}))
"""
)


def _string_table(nbytes: int, device: str) -> pystrom.Table:
    """One string column of 12-byte values: 16 bytes per row with its offset."""
    import pyarrow as pa

    n = nbytes // 16
    offsets = np.arange(n + 1, dtype=np.int32) * 12
    data = np.random.default_rng(0).integers(ord("a"), ord("z") + 1, 12 * n, dtype=np.uint8)
    strings = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return pystrom.Table.from_arrow(pa.table({"s": strings}), device=device)


def _string_import(table: pystrom.Table, repeat: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".handle", delete=False) as f:
        f.write(table.export())
    try:
        out = subprocess.run(
            [sys.executable, "-c", STRING_IMPORTER, f.name, str(repeat)], capture_output=True, text=True, timeout=600
        )
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"importer failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(nbytes: int, device: str) -> pystrom.Table:
    n = nbytes // 8
    backend = pystrom.memory.backend.resolve_device(device)
    with backend.activate():
        source = backend.xp.arange(n, dtype=np.float64)
        table = pystrom.Table.from_arrays({"x": source}, device=device)
        del source
        if backend.kind == "cuda":
            backend.xp.get_default_memory_pool().free_all_blocks()
    return table


def _import_in_child(table: pystrom.Table, repeat: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".handle", delete=False) as f:
        f.write(table.export())
    try:
        out = subprocess.run(
            [sys.executable, "-c", IMPORTER, f.name, str(repeat)], capture_output=True, text=True, timeout=600
        )
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"importer failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _label(nbytes: int) -> str:
    return f"{nbytes // GB} GB" if nbytes >= GB else f"{nbytes // MB} MB"


def _daemon_round_trips(device: str, sizes: list[int], repeat: int, memory: str) -> list[Result]:
    folder = tempfile.mkdtemp(prefix="pystrom-bench-")
    sock = os.path.join(folder, "s.sock")
    argv = [sys.executable, "-m", "pystrom", "serve", "--device", device, "--socket", sock, "--memory", memory]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = []
    try:
        banner = proc.stdout.readline()
        if "serving" not in banner:
            print(f"  daemon with --memory {memory} did not start: {banner}{proc.stderr.read()[-500:]}")
            return []
        kind = banner.split("(")[1].split(" ")[0]
        with pystrom.Store(sock) as store:
            for nbytes in sizes:
                table = _table(nbytes, device)
                backend = table._block.backend
                put_s = measure(lambda t=table: store.put("t", t, replace=True), lambda: None, 1)
                copy = table  # the copy baseline copies its column
                dst = backend.xp.empty(nbytes // 8, dtype=np.float64) if backend.kind == "cuda" else None
                if dst is None:
                    dst = np.empty(nbytes // 8)

                def get(store=store):
                    v = store.get("t")
                    col = v["x"]
                    del v, col  # unmapped here; the hold goes back with the next request

                get_s = measure(get, lambda: None, repeat)
                xp = backend.xp
                copy_s = measure(lambda d=dst, c=copy, xp=xp: xp.copyto(d, c["x"]), backend.synchronize, repeat)
                results.append(Result(f"daemon get() {_label(nbytes)} ({kind})", "device copy", get_s, copy_s, 0))
                results.append(Result(f"daemon put() {_label(nbytes)} ({kind})", "device copy", put_s, copy_s, nbytes))
                store.drop("t")
                del table, copy, dst
                gc.collect()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
    return results


def run(device: str, quick: bool) -> list[Result]:
    gpu = device.startswith("cuda")
    if quick:
        sizes = [MB, 64 * MB]
    elif gpu:
        sizes = [MB, GB, 32 * GB]
    else:
        sizes = [MB, GB]
    repeat = 10 if quick else 30
    results = []
    for nbytes in sizes:
        start = time.perf_counter()
        table = _table(nbytes, device)
        export_s = measure(table.export, lambda: None, repeat)
        r = _import_in_child(table, repeat)
        label = _label(nbytes)
        results.append(Result(f"ipc_import {label} (map)", "D2D copy in importer", r["open"], r["copy"], 0))
        results.append(
            Result(f"ipc_import {label} (mapping cached)", "D2D copy in importer", r["cached"], r["copy"], 0)
        )
        results.append(Result(f"Table.export() {label}", "D2D copy in importer", export_s, r["copy"], 0))
        del table
        gc.collect()
        print(f"  {label}: import {r['open'] * 1e3:.3f} ms, copy {r['copy'] * 1e3:.3f} ms "
              f"({time.perf_counter() - start:.1f} s)", flush=True)  # fmt: skip
    # The cost of checking string offsets at import (issue 14): a table of one string column.
    nbytes = 64 * MB if quick else GB
    table = _string_table(nbytes, device)
    r = _string_import(table, repeat)
    label = _label(nbytes)
    results.append(Result(f"ipc_import {label} string column (map + check)", "D2D copy in importer", r["open"],
                          r["copy"], 0))  # fmt: skip
    results.append(Result(f"offsets check alone, {label} string column", "D2D copy in importer", r["check"],
                          r["copy"], 0))  # fmt: skip
    results.append(Result(f"to_arrow of the imported {label} string column", "D2D copy in importer", r["use"],
                          r["copy"], 0))  # fmt: skip
    print(f"  {label} strings: import {r['open'] * 1e3:.3f} ms, check {r['check'] * 1e3:.3f} ms, "
          f"to_arrow {r['use'] * 1e3:.3f} ms, copy {r['copy'] * 1e3:.3f} ms", flush=True)  # fmt: skip
    del table
    gc.collect()
    daemon_sizes = [MB, 64 * MB] if quick else [MB, GB]
    results += _daemon_round_trips(device, daemon_sizes, repeat, "auto")
    if gpu:
        results += _daemon_round_trips(device, daemon_sizes[:1], repeat, "legacy")
    return results
