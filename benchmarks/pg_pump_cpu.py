"""CPU cost of the COPY pump per million rows, against the server's own cost for the same COPY.

Not a ``bench_*`` module (the runner does not pick it up): a probe for issue 4, where the client's
reader threads share the cores with the server's backends, so every client CPU second per row is
taken from the server. It starts a throwaway cluster, fills the ``logreg`` table (t bool, x1..x4
float8, as bench_postgres.py does) and prints, for TCP 127.0.0.1 and the Unix socket:

- server: backend CPU of ``COPY (...) TO '/dev/null' (FORMAT BINARY)`` (the floor),
- read_postgres(partitions=1 and 2, device="cpu"): wall time, the reader threads' CPU
  (``time.thread_time()`` around each stream), the backends' CPU, and the whole process's CPU.

CPU seconds are per million rows; each line is the best of ``--repeat`` runs (the machine is shared).
Run: ``python benchmarks/pg_pump_cpu.py --rows 4000000``.
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


def _postmaster(cluster) -> int:
    return int((cluster.datadir / "postmaster.pid").read_text().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--partitions", default="1,2")
    ap.add_argument("--transports", default="tcp,unix")
    args = ap.parse_args()

    import bench_postgres
    import psycopg
    from fix_pg import PgCluster, _find_bindir

    import pystrom
    from pystrom.io import postgres as pgmod

    cluster = PgCluster(_find_bindir())
    try:
        start = time.perf_counter()
        bench_postgres._load(cluster.conninfo, args.rows, 2)
        print(f"logreg: {args.rows:,} rows in {time.perf_counter() - start:.1f} s; psycopg {psycopg.pq.__impl__}")
        pm = _postmaster(cluster)
        per_m = 1e6 / args.rows

        # The reader threads' CPU: thread_time() around each stream of a read.
        reader_cpu: list[float] = []
        lock = threading.Lock()
        original = pgmod._Reader.read

        def timed_read(self, conn, sql_text):
            t0 = time.thread_time()
            try:
                return original(self, conn, sql_text)
            finally:
                with lock:
                    reader_cpu.append(time.thread_time() - t0)

        pgmod._Reader.read = timed_read
        transports = {
            "tcp": cluster.conninfo,
            "unix": f"host={cluster.root} port={cluster.port} user=postgres dbname=postgres",
        }
        heads = ("wall s", "client cpu/Mrow", "server cpu/Mrow", "process cpu/Mrow")
        print(f"{'what':34s} {heads[0]:>8s} {heads[1]:>16s} {heads[2]:>16s} {heads[3]:>17s}")
        for tname in args.transports.split(","):
            conninfo = transports[tname]
            for n in [1, 2]:
                best = None
                for _ in range(args.repeat):
                    s0 = _server_cpu(pm)
                    w0 = time.perf_counter()
                    bench_postgres._server_copy(conninfo, n)
                    wall = time.perf_counter() - w0
                    srv = _server_cpu(pm) - s0
                    if best is None or srv < best[1]:
                        best = (wall, srv)
                print(f"{tname} server COPY /dev/null x{n:<14d} {best[0]:8.3f} {'-':>16s} {best[1] * per_m:16.3f}")
            for parts in [int(p) for p in args.partitions.split(",")]:
                best = None
                for _ in range(args.repeat):
                    reader_cpu.clear()
                    s0, p0 = _server_cpu(pm), time.process_time()
                    w0 = time.perf_counter()
                    with pystrom.read_postgres(conninfo, table="logreg", partitions=parts, device="cpu") as t:
                        assert t.num_rows == args.rows
                    wall = time.perf_counter() - w0
                    row = (wall, sum(reader_cpu), _server_cpu(pm) - s0, time.process_time() - p0)
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
