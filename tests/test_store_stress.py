"""32 concurrent clients (8 spawned processes x 4 threads, each thread its own connection) putting,
getting, listing and dropping tables with checksums, then no memory left allocated.

Each client runs a fixed plan, not a time slice: ``PYSTROM_STRESS_ROUNDS`` rounds (default 20 on a GPU,
5 on the CPU) of 20 operations on 12 shared names in a seeded random order (6 puts, 8 gets, 3 lists, 3
drops a round), between a put, get and drop of a table of its own that no other client touches. What
is asserted does not depend on how the clients interleave: every planned operation ran (a get or drop
of a shared name that another client dropped meanwhile counts as a miss, and is not an error), every
client's own table came back with its checksum, every view held across others' drops still checks, and
nothing stays allocated. How many operations a second allowed is printed, never asserted (it was, and
a loaded 2-core machine once gave one process no drop in its 10 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from test_ipc import PRELUDE
from test_store import Daemon, wait_for

PROCESSES, THREADS = 8, 4

WORKER = """
import collections, random, threading, time, traceback
from pystrom.errors import TableExistsError, TableNotFoundError

path, device, rounds, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
failures, totals, lock = [], collections.Counter(), threading.Lock()
ROUND = ["put"] * 6 + ["get"] * 8 + ["list"] * 3 + ["drop"] * 3


def check(view, where):
    md = view.schema.metadata
    n, expected = int(md[b"n"]), int(md[b"sum"])
    assert view.num_rows == n, f"{where}: {view.num_rows} rows, metadata says {n}"
    x, y = view["x"], view["y"]
    got = int(x.sum())
    assert got == expected, f"{where}: checksum {got} != {expected}"
    assert bool((y * 2 == x).all()), f"{where}: column y does not match x"


def table(rng, nrng):
    n = rng.randrange(1, 40_000)
    x = nrng.integers(-(2**40), 2**40, n)
    arrow = pa.table({"x": x, "y": x * 0.5}, metadata={"n": str(n), "sum": str(int(x.sum()))})
    return pystrom.Table.from_arrow(arrow, device=device)


def client(k):
    rng = random.Random(seed * 100 + k)
    nrng = np.random.default_rng(seed * 100 + k)
    counts = collections.Counter()
    held = []
    try:
        store = pystrom.Store(path)
        own = f"own_{seed}_{k}"  # nobody else touches it: its put, get and drop must succeed
        store.put(own, table(rng, nrng))
        plan = [op for _ in range(rounds) for op in rng.sample(ROUND, len(ROUND))]
        for op in plan:
            name = f"t{rng.randrange(12)}"
            counts[op] += 1
            try:
                if op == "put":
                    store.put(name, table(rng, nrng), replace=rng.random() < 0.5)
                elif op == "get":
                    view = store.get(name)
                    check(view, f"get {name}")
                    if rng.random() < 0.3:
                        held.append((name, view))  # checked again later, after others dropped/replaced it
                    if len(held) > 3:
                        check(held[0][1], f"held {held[0][0]}")
                        held.pop(0)
                elif op == "list":
                    for t in store.list():
                        assert t["num_rows"] == int(t["schema"].metadata[b"n"]), t
                else:
                    store.drop(name)
            except (TableNotFoundError, TableExistsError):
                counts["miss"] += 1
        check(store.get(own), f"own table {own}")
        store.drop(own)
        counts["own"] += 1
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
    rounds = int(os.environ.get("PYSTROM_STRESS_ROUNDS", "20" if device == "cuda" else "5"))
    d = Daemon(str(tmp_path / "s.sock"), device)
    try:
        with d.store() as s:
            start = s.stats()
            code = PRELUDE + textwrap.dedent(WORKER).replace("{threads}", str(THREADS))
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", code, d.path, device, str(rounds), str(i)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for i in range(PROCESSES)
            ]
            outputs = []
            began = time.monotonic()
            try:
                for p in procs:
                    assert p.stdout.readline().strip() == "ready"
                for p in procs:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                for p in procs:
                    out, _ = p.communicate(timeout=600)
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
            took = time.monotonic() - began
            print(f"\nstress on {device}, {PROCESSES * THREADS} clients, {rounds} rounds each: {ops} in {took:.1f} s")
            clients = PROCESSES * THREADS
            misses = ops.pop("miss", 0)
            assert ops == {"put": 6 * rounds * clients, "get": 8 * rounds * clients, "list": 3 * rounds * clients,
                           "drop": 3 * rounds * clients, "own": clients}, ops  # fmt: skip
            assert misses <= ops["get"] + ops["drop"] + ops["put"]

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
        every = 'ROUND = ["get"] * 20'
        worker = worker.replace('name = f"t{rng.randrange(12)}"', 'name = "t0"')
        worker = worker.replace('ROUND = ["put"] * 6 + ["get"] * 8 + ["list"] * 3 + ["drop"] * 3', every)
        assert 'name = "t0"' in worker and every in worker  # every operation: get t0
        r = subprocess.run(
            [sys.executable, "-c", worker, d.path, "cpu", "1", "0"], input="go\n", capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert r.returncode == 1 and "checksum 3 != 4" in r.stdout
    finally:
        assert d.stop() == 0
