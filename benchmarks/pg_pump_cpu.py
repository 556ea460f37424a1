"""CPU cost of the COPY pump per million rows, against the server's own cost for the same COPY.

Not a ``bench_*`` module (the runner does not pick it up): a probe for issue 4, where the client's
reader threads share the cores with the server's backends, so every client CPU second per row is
taken from the server. It starts a throwaway cluster, fills the ``logreg`` table (t bool, x1..x4
float8, as bench_postgres.py does) and prints, for TCP 127.0.0.1 and the Unix socket:

- server: backend CPU of ``COPY (...) TO '/dev/null' (FORMAT BINARY)`` (the floor),
- pump only: the COPY streams of a partitioned read drained by the pump into pre-touched memory
  (what a warm pinned pool gives the GPU path), no decoding: wall, reader threads' CPU
  (``time.thread_time()`` around each stream), backends' CPU,
- read_postgres(partitions=N, device="cpu"): the same plus the whole process's CPU (decoding, and
  the page faults of fresh staging buffers, included).

CPU seconds are per million rows; each line is the best of ``--repeat`` runs (the machine is shared).
Run: ``python benchmarks/pg_pump_cpu.py --rows 4000000 --partitions 1,2`` (on the GPU machine, e.g.
``--rows 10000000 --partitions 1,16 --transports tcp``).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

_TICK = os.sysconf("SC_CLK_TCK")


def _server_cpu(postmaster: int) -> float:
    """CPU seconds of the postmaster and all its children, live and exited (exited ones are reaped
    by the postmaster, so their time is in its cutime/cstime)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == postmaster:
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        elif ppid == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _settled_server_cpu(postmaster: int) -> float:
    """_server_cpu once the backends of the last read have exited and been reaped (until then the
    time of an exited backend is in neither its /proc entry nor the postmaster's cutime)."""
    time.sleep(0.3)
    return _server_cpu(postmaster)


def _postmaster(cluster) -> int:
    return int((cluster.datadir / "postmaster.pid").read_text().split()[0])


def _pump_only(conninfo: str, n: int, rows: int, arenas: list) -> tuple[float, float]:
    """The pump alone: n COPY streams over ctid ranges (as read_postgres splits a table) into
    pre-touched memory, as a warm pinned pool gives the GPU path. Returns (wall s, reader CPU s)."""
    import numpy as np
    import psycopg

    from pystrom.io.postgres.pump import CopyStream

    with psycopg.connect(conninfo, autocommit=True) as conn:
        pages = conn.execute("SELECT pg_relation_size('logreg') / current_setting('block_size')::int").fetchone()[0]
    bounds = [pages * i // n for i in range(n + 1)]
    sqls = [
        f"COPY (SELECT * FROM logreg WHERE ctid >= '({bounds[i]},0)'::tid"
        + (f" AND ctid < '({bounds[i + 1]},0)'::tid" if i + 1 < n else "")
        + ") TO STDOUT (FORMAT BINARY)"
        for i in range(n)
    ]
    conns = [psycopg.connect(conninfo, autocommit=True) for _ in range(n)]
    cpu, got = [0.0] * n, [0] * n

    def work(i: int) -> None:
        at = 0

        def take(k: int) -> np.ndarray:
            nonlocal at
            out = arenas[i][at : at + k]
            at += (k + 63) // 64 * 64
            return out if out.size == k else np.empty(k, np.uint8)  # past the arena: fresh memory

        t0 = time.thread_time()
        chunks = CopyStream(conns[i], 5, take, 64 << 20).read(sqls[i])
        cpu[i] = time.thread_time() - t0
        got[i] = sum(c.nrows for c in chunks)

    try:
        w0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - w0
    finally:
        for c in conns:
            c.close()
    assert sum(got) == rows, got
    return wall, sum(cpu)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--partitions", default="1,2")
    ap.add_argument("--transports", default="tcp,unix")
    args = ap.parse_args()
    parts_list = [int(p) for p in args.partitions.split(",")]

    import bench_postgres
    import numpy as np
    import psycopg
    from fix_pg import PgCluster, _find_bindir

    import pystrom
    from pystrom.io.postgres import stream as pgmod

    cluster = PgCluster(_find_bindir())
    try:
        start = time.perf_counter()
        bench_postgres._load(cluster.conninfo, args.rows, max(1, min(16, os.cpu_count() or 1)))
        print(f"logreg: {args.rows:,} rows in {time.perf_counter() - start:.1f} s; psycopg {psycopg.pq.__impl__}")
        pm = _postmaster(cluster)
        per_m = 1e6 / args.rows

        # The reader threads' CPU: thread_time() around each stream of a read.
        reader_cpu: list[float] = []
        lock = threading.Lock()
        original = pgmod.CopyReader.read

        def timed_read(self, conn, sql_text):
            t0 = time.thread_time()
            try:
                return original(self, conn, sql_text)
            finally:
                with lock:
                    reader_cpu.append(time.thread_time() - t0)

        pgmod.CopyReader.read = timed_read
        transports = {
            "tcp": cluster.conninfo,
            "unix": f"host={cluster.root} port={cluster.port} user=postgres dbname=postgres",
        }
        heads = ("wall s", "client cpu/Mrow", "server cpu/Mrow", "process cpu/Mrow")
        print(f"{'what':34s} {heads[0]:>8s} {heads[1]:>16s} {heads[2]:>16s} {heads[3]:>17s}")
        for tname in args.transports.split(","):
            conninfo = transports[tname]
            for n in parts_list:
                best = None
                for _ in range(args.repeat):
                    s0 = _server_cpu(pm)
                    w0 = time.perf_counter()
                    bench_postgres._server_copy(conninfo, n)
                    wall = time.perf_counter() - w0
                    srv = _settled_server_cpu(pm) - s0
                    if best is None or srv < best[1]:
                        best = (wall, srv)
                print(f"{tname} server COPY /dev/null x{n:<14d} {best[0]:8.3f} {'-':>16s} {best[1] * per_m:16.3f}")
            for parts in parts_list:
                arenas = [np.ones(args.rows * 55 * 5 // (2 * parts) + (192 << 20), np.uint8) for _ in range(parts)]
                best = None
                for _ in range(args.repeat):
                    s0 = _server_cpu(pm)
                    wall, cli = _pump_only(conninfo, parts, args.rows, arenas)
                    row = (wall, cli, _settled_server_cpu(pm) - s0)
                    if best is None or row[1] < best[1]:
                        best = row
                del arenas
                wall, cli, srv = best
                print(f"{tname} pump only x{parts:<17d} {wall:8.3f} {cli * per_m:16.3f} {srv * per_m:16.3f}")
                best = None
                for _ in range(args.repeat):
                    reader_cpu.clear()
                    s0, p0 = _server_cpu(pm), time.process_time()
                    w0 = time.perf_counter()
                    with pystrom.read_postgres(conninfo, table="logreg", partitions=parts, device="cpu") as t:
                        assert t.num_rows == args.rows
                    wall = time.perf_counter() - w0
                    proc = time.process_time() - p0
                    row = (wall, sum(reader_cpu), _settled_server_cpu(pm) - s0, proc)
                    if best is None or row[1] < best[1]:
                        best = row
                wall, cli, srv, proc = best
                print(
                    f"{tname} read_postgres partitions={parts:<8d} {wall:8.3f} {cli * per_m:16.3f} "
                    f"{srv * per_m:16.3f} {proc * per_m:17.3f}"
                )
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
