"""32 concurrent clients (8 spawned processes x 4 threads, each thread its own connection) putting,
getting, listing and dropping tables with checksums, then no memory left allocated.

Duration: ``PYSTROM_STRESS_SECONDS`` (default 30 s on a GPU, 10 s on the CPU: long enough that 32
clients on 2 busy cores all get a turn).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from test_ipc import PRELUDE
from test_store import Daemon, wait_for

PROCESSES, THREADS = 8, 4

WORKER = """
import collections, random, threading, time, traceback
from pystrom.errors import TableExistsError, TableNotFoundError

path, device, seconds, seed = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
failures, totals, lock = [], collections.Counter(), threading.Lock()


def check(view, where):
    md = view.schema.metadata
    n, expected = int(md[b"n"]), int(md[b"sum"])
    assert view.num_rows == n, f"{where}: {view.num_rows} rows, metadata says {n}"
    x, y = view["x"], view["y"]
    got = int(x.sum())
    assert got == expected, f"{where}: checksum {got} != {expected}"
    assert bool((y * 2 == x).all()), f"{where}: column y does not match x"


def client(k):
    rng = random.Random(seed * 100 + k)
    nrng = np.random.default_rng(seed * 100 + k)
    counts = collections.Counter()
    held = []
    try:
        store = pystrom.Store(path)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            name = f"t{rng.randrange(12)}"
            r = rng.random()
            try:
                if r < 0.3:
                    n = rng.randrange(1, 40_000)
                    x = nrng.integers(-(2**40), 2**40, n)
                    arrow = pa.table({"x": x, "y": x * 0.5}, metadata={"n": str(n), "sum": str(int(x.sum()))})
                    store.put(name, pystrom.Table.from_arrow(arrow, device=device), replace=rng.random() < 0.5)
                    counts["put"] += 1
                elif r < 0.7:
                    view = store.get(name)
                    check(view, f"get {name}")
                    if rng.random() < 0.3:
                        held.append((name, view))  # checked again later, after others dropped/replaced it
                    if len(held) > 3:
                        check(held[0][1], f"held {held[0][0]}")
                        held.pop(0)
                    counts["get"] += 1
                elif r < 0.85:
                    for t in store.list():
                        assert t["num_rows"] == int(t["schema"].metadata[b"n"]), t
                    counts["list"] += 1
                else:
                    store.drop(name)
                    counts["drop"] += 1
            except (TableNotFoundError, TableExistsError):
                counts["miss"] += 1
        for name, view in held:
            check(view, f"held {name} at the end")
        held.clear()
        store.close()
    except Exception:
        with lock:
            failures.append(traceback.format_exc())
    with lock:
        totals.update(counts)


threads = [threading.Thread(target=client, args=(k,)) for k in range({threads})]
print("ready", flush=True)
sys.stdin.readline()  # all processes start together, after their imports
for t in threads:
    t.start()
for t in threads:
    t.join()
print(" ".join(f"{k}={v}" for k, v in sorted(totals.items())))
for f in failures:
    print("FAILURE", f)
sys.exit(1 if failures else 0)
"""


def test_32_clients_with_checksums_and_no_leak(device, tmp_path):
    seconds = float(os.environ.get("PYSTROM_STRESS_SECONDS", "30" if device == "cuda" else "10"))
    d = Daemon(str(tmp_path / "s.sock"), device)
    try:
        with d.store() as s:
            start = s.stats()
            code = PRELUDE + textwrap.dedent(WORKER).replace("{threads}", str(THREADS))
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", code, d.path, device, str(seconds), str(i)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for i in range(PROCESSES)
            ]
            outputs = []
            try:
                for p in procs:
                    assert p.stdout.readline().strip() == "ready"
                for p in procs:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                for p in procs:
                    out, _ = p.communicate(timeout=seconds + 240)
                    outputs.append((p.returncode, out))
            finally:
                for p in procs:
                    p.kill()
            failed = [out for rc, out in outputs if rc != 0]
            assert not failed, "\n".join(failed)
            ops = {}
            for _, out in outputs:
                for item in out.split("\n")[-2].split():
                    k, v = item.split("=")
                    ops[k] = ops.get(k, 0) + int(v)
            print(f"\nstress {seconds:.0f} s on {device}, {PROCESSES * THREADS} clients: {ops}")
            assert ops.get("put", 0) > 0 and ops.get("get", 0) > 0 and ops.get("drop", 0) > 0

            for t in s.list():
                s.drop(t["name"])
            end = wait_for(s, lambda st: st["allocations"] == 0)
            assert end["allocated_bytes"] == 0 and end["pending_puts"] == 0 and end["dropped_in_use"] == 0
            if device == "cuda":  # what the driver says, not only our bookkeeping
                leaked = start["device_free_bytes"] - end["device_free_bytes"]
                print(f"device memory free before {start['device_free_bytes']:,}, after {end['device_free_bytes']:,}")
                assert leaked < 64 << 20, f"{leaked:,} bytes of device memory not given back"
    finally:
        assert d.stop() == 0


@pytest.mark.skipif(sys.platform != "linux", reason="memfd is Linux only")
def test_stress_worker_fails_loudly_on_a_bad_checksum(tmp_path):
    """The checker itself: a table whose metadata lies must be reported, or the stress test proves nothing."""
    d = Daemon(str(tmp_path / "s.sock"), "cpu")
    try:
        code = (
            PRELUDE
            + "s = pystrom.Store(sys.argv[1])\n"
            + "s.put('t0', pystrom.Table.from_arrow(pa.table({'x': [1, 2], 'y': [0.5, 1.0]}, "
            + "metadata={'n': '2', 'sum': '4'}), device='cpu'))\n"
        )
        subprocess.run([sys.executable, "-c", code, d.path], check=True, timeout=60)
        worker = PRELUDE + textwrap.dedent(WORKER).replace("{threads}", "1")
        worker = worker.replace('name = f"t{rng.randrange(12)}"', 'name = "t0"').replace("r = rng.random()", "r = 0.5")
        assert 'name = "t0"' in worker and "r = 0.5" in worker  # every operation: get t0
        r = subprocess.run(
            [sys.executable, "-c", worker, d.path, "cpu", "1", "0"], input="go\n", capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert r.returncode == 1 and "checksum 3 != 4" in r.stdout
    finally:
        assert d.stop() == 0
