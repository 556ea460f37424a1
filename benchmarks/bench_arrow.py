"""Arrow IPC files to the device: read_arrow and scan_arrow against what users do without pystrom.

One file of 6 float64 + 2 int64 columns (8 GiB; 512 MiB with --quick), written once by
pystrom.write_arrow, and one file of a string column (1 GiB of string data; 64 MiB with --quick), whose
offsets read_arrow checks on the device before using them. Baselines, measured in the same run:

- ``pyarrow.feather.read_table`` + ``cupy.asarray`` per column (``numpy.array`` copies on the CPU);
- a raw KvikIO read of the whole file into one device buffer, with the same thread/task settings
  pystrom uses (the ceiling for reading these bytes; on the CPU backend: threaded preads);
- cold cache: the file's pages are dropped before every run (``posix_fadvise(DONTNEED)``), and
  ``dd iflag=direct`` gives the disk's own rate.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather

import pystrom

from _harness import Result, measure

FLOATS = [f"f{i}" for i in range(6)]
INTS = ["i0", "ts"]


def _write(path: str, rows: int, batch_rows: int) -> None:
    def batches():
        rng = np.random.default_rng(0)
        for start in range(0, rows, batch_rows):
            n = min(batch_rows, rows - start)
            cols = {name: rng.random(n) for name in FLOATS}
            cols["i0"] = rng.integers(0, 1 << 40, n)
            cols["ts"] = np.arange(start, start + n, dtype=np.int64)  # sorted: statistics can skip batches
            yield pa.RecordBatch.from_pydict(cols)

    pystrom.write_arrow(batches(), path)


def _write_strings(path: str, data_bytes: int, batch_rows: int) -> None:
    """One string column of ASCII values 0..31 bytes long (about ``data_bytes`` of string data)."""

    def batches():
        rng = np.random.default_rng(1)
        done = 0
        while done < data_bytes:
            lengths = rng.integers(0, 32, batch_rows, dtype=np.int32)
            offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int32)]).astype(np.int32)
            data = rng.integers(97, 123, int(offsets[-1]), dtype=np.uint8)
            arr = pa.StringArray.from_buffers(batch_rows, pa.py_buffer(offsets), pa.py_buffer(data))
            done += int(offsets[-1])
            yield pa.record_batch([arr], names=["s"])

    pystrom.write_arrow(batches(), path)


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _measure_cold(path: str, fn, sync, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        _drop_cache(path)
        start = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - start)
        del out
    return float(np.median(times))


def _dd_direct(path: str) -> float | None:
    if shutil.which("dd") is None:
        return None
    _drop_cache(path)
    start = time.perf_counter()
    done = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"], capture_output=True)
    if done.returncode != 0:
        return None
    return time.perf_counter() - start


def run(device: str, quick: bool) -> list[Result]:
    rows = (512 << 20) // 64 if quick else (8 << 30) // 64
    repeat = 3
    tmp = tempfile.mkdtemp(prefix="pystrom-bench-", dir=os.environ.get("PYSTROM_BENCH_DIR"))
    path = os.path.join(tmp, "data.arrow")
    try:
        _write(path, rows, 1 << 20)
        size = os.path.getsize(path)
        backend = pystrom.memory.backend.resolve_device(device)
        xp, sync = backend.xp, backend.synchronize
        gpu = backend.kind == "cuda"

        def baseline_read(columns=None):
            t = feather.read_table(path, columns=columns, memory_map=False)
            return {n: (xp.asarray(t.column(n).to_numpy()) if gpu else np.array(t.column(n).to_numpy()))
                    for n in t.column_names}  # fmt: skip

        def raw_read():
            return _raw_read(path, size, backend)

        results = []
        label = f"{size / 2**30:.1f} GiB file"
        ours = measure(lambda: pystrom.read_arrow(path, device=device), sync, repeat)
        results.append(Result(f"read_arrow {label}, warm", "feather.read_table + asarray", ours,
                              measure(baseline_read, sync, repeat), size))  # fmt: skip
        results.append(Result(f"read_arrow {label}, warm", "raw read of the whole file", ours,
                              measure(raw_read, sync, repeat), size))  # fmt: skip
        two = ["f0", "i0"]
        two_bytes = rows * 16
        results.append(Result("read_arrow 2 of 8 columns, warm", "feather.read_table(columns) + asarray",
                              measure(lambda: pystrom.read_arrow(path, columns=two, device=device), sync, repeat),
                              measure(lambda: baseline_read(two), sync, repeat), two_bytes))  # fmt: skip

        def baseline_filter():
            cols = baseline_read()
            mask = cols["f5"] < 0.1
            return {n: a[mask] for n, a in cols.items()}

        scan = pystrom.scan_arrow(path, where="f5 < 0.1", device=device)
        results.append(
            Result(
                "scan_arrow where f5 < 0.1 (10%), warm",
                "read + asarray + boolean mask",
                measure(scan.collect, sync, repeat),
                measure(baseline_filter, sync, repeat),
                size,
            )
        )
        narrow = pystrom.scan_arrow(path, where=f"ts between {rows // 2} and {rows // 2 + rows // 100}", device=device)
        results.append(Result("scan_arrow ts range (1%, stats skip)", "read + asarray + boolean mask",
                              measure(narrow.collect, sync, repeat),
                              measure(lambda: _mask_ts(baseline_read(), rows), sync, repeat), size))  # fmt: skip
        print(f"  stats of the narrow scan: {narrow.stats}")

        # A string column: its offsets are checked on the device (one launch for the read) before use.
        spath = os.path.join(tmp, "strings.arrow")
        _write_strings(spath, (64 << 20) if quick else (1 << 30), 1 << 20)
        ssize = os.path.getsize(spath)
        results.append(Result(f"read_arrow {ssize / 2**30:.2f} GiB string column, warm", "raw read of the whole file",
                              measure(lambda: pystrom.read_arrow(spath, device=device), sync, repeat),
                              measure(lambda: _raw_read(spath, ssize, backend), sync, repeat), ssize))  # fmt: skip
        os.unlink(spath)

        cold_repeat = 1 if quick else 2
        ours_cold = _measure_cold(path, lambda: pystrom.read_arrow(path, device=device), sync, cold_repeat)
        results.append(Result(f"read_arrow {label}, cold", "feather.read_table + asarray", ours_cold,
                              _measure_cold(path, baseline_read, sync, cold_repeat), size))  # fmt: skip
        results.append(Result(f"read_arrow {label}, cold", "raw read of the whole file", ours_cold,
                              _measure_cold(path, raw_read, sync, cold_repeat), size))  # fmt: skip
        dd = _dd_direct(path)
        if dd is not None:
            results.append(Result(f"read_arrow {label}, cold", "dd iflag=direct bs=16M (disk only)", ours_cold, dd,
                                  size))  # fmt: skip
        if gpu:
            from pystrom.io.arrow.file.ranges import kvikio_settings

            print(f"  KvikIO: {kvikio_settings()}")
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _mask_ts(cols: dict, rows: int) -> dict:
    ts = cols["ts"]
    mask = (ts >= rows // 2) & (ts <= rows // 2 + rows // 100)
    return {n: a[mask] for n, a in cols.items()}


def _raw_read(path: str, size: int, backend: Any) -> Any:
    from pystrom.io.arrow.file.ranges import RangeReader

    with backend.activate():
        buf = backend.xp.empty(size, dtype=np.uint8)
        with RangeReader(path, backend) as reader:
            reader.read(0, size, buf)
            reader.wait()
    return buf
