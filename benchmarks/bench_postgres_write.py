"""Table -> PostgreSQL: write_postgres against what the server itself can do and what users write today.

The table is the seed's ``logreg`` shape (t bool, x1..x4 float8: normals, t = 1 + 2 x1 - 3 x2 + x3 +
0.5 x4 > 0, as bench_postgres.py generates it in the server), built here with NumPy on the device.
Each write replaces its target table (a new, WAL-logged table each time). Baselines, measured in the
same run:

- the floor: the server's own ``COPY ... FROM '<file>' (FORMAT BINARY)`` of local binary files
  (written beforehand by the server from the same rows), one per backend, as many backends as
  write_postgres's automatic choice opens, into one new table; run alternately with pystrom's write,
- ADBC ``adbc_ingest`` (mode "replace") of the table converted to Arrow on the host,
- psycopg ``copy.write_row`` row by row and pandas ``to_sql(method="multi")`` through SQLAlchemy:
  on 10 % of the rows only (they would take minutes on all of them), against write_postgres on the
  same 10 %; their labels say so.

``PYSTROM_BENCH_PG_WRITE_ROWS`` overrides the size (full mode: 10M rows; quick: 1M).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _harness import Result, measure, measure_pair

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

_COLS = "t bool, x1 float8, x2 float8, x3 float8, x4 float8"


def _table(rows: int, device: str) -> Any:
    import numpy as np

    import pystrom

    rng = np.random.default_rng(42)
    x = rng.standard_normal((4, rows))
    t = 1 + 2 * x[0] - 3 * x[1] + x[2] + 0.5 * x[3] > 0
    return pystrom.Table.from_arrays({"t": t, "x1": x[0], "x2": x[1], "x3": x[2], "x4": x[3]}, device=device)


def _execute(conninfo: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _floor_files(conninfo: str, source: str, n: int) -> list[str]:
    """n binary COPY files of the table ``source``, written by the server into its data directory."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        pages = conn.execute(f"SELECT pg_relation_size('{source}') / current_setting('block_size')::int").fetchone()[0]
        bounds = [pages * i // n for i in range(n + 1)]
        data_dir = conn.execute("SELECT current_setting('data_directory')").fetchone()[0]
        files = []
        for i in range(n):
            cond = f"ctid >= '({bounds[i]},0)'::tid" + (f" AND ctid < '({bounds[i + 1]},0)'::tid" if i + 1 < n else "")
            path = f"{data_dir}/pystrom_floor_{i}.bin"  # the server's own disk, as the floor reads it
            conn.execute(f"COPY (SELECT * FROM {source} WHERE {cond}) TO '{path}' (FORMAT BINARY)")
            files.append(path)
    return files


def _server_copy_from(conninfo: str, files: list[str]) -> None:
    """The floor: a new table, filled by one backend per file, as a replace would leave it."""
    _execute(conninfo, "DROP TABLE IF EXISTS w_floor", f"CREATE TABLE w_floor ({_COLS})")

    def part(path: str) -> None:
        _execute(conninfo, f"COPY w_floor FROM '{path}' (FORMAT BINARY)")

    threads = [threading.Thread(target=part, args=(f,)) for f in files]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def _adbc(uri: str, table: Any) -> None:
    import adbc_driver_postgresql.dbapi as adbc

    data = table.to_arrow()  # to the host, as a user must first
    with adbc.connect(uri) as conn:
        with conn.cursor() as cur:
            cur.adbc_ingest("w_adbc", data, mode="replace")
        conn.commit()


def _psycopg_rows(conninfo: str, table: Any) -> None:
    import psycopg

    rows = zip(*(table.column(c).to_numpy().tolist() for c in table.column_names))
    with psycopg.connect(conninfo) as conn:
        conn.execute("DROP TABLE IF EXISTS w_psycopg")
        conn.execute(f"CREATE TABLE w_psycopg ({_COLS})")
        with conn.cursor().copy("COPY w_psycopg FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def _pandas(engine: Any, table: Any) -> None:
    frame = table.to_pandas()
    frame.to_sql("w_pandas", engine, if_exists="replace", index=False, method="multi", chunksize=10_000)


def run(device: str, quick: bool) -> list[Result]:
    import pystrom
    from pystrom.memory.backend import resolve_device

    try:
        import psycopg
        from fix_pg import PgCluster, _find_bindir
    except ImportError as exc:
        print(f"bench_postgres_write: skipped ({exc})")
        return []
    bindir = _find_bindir()
    if bindir is None:
        print("bench_postgres_write: skipped (no PostgreSQL binaries and no pgserver)")
        return []
    env = os.environ.get("PYSTROM_BENCH_PG_WRITE_ROWS")
    rows = int(env) if env else (1_000_000 if quick else 10_000_000)
    backend = resolve_device(device)
    sync = backend.synchronize
    cluster = PgCluster(bindir)
    results: list[Result] = []
    try:
        conninfo = cluster.conninfo
        uri = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
        table = _table(rows, device)
        nbytes = rows * (1 + 4 * 8)
        label = f"{rows / 1e6:g}M"

        def ours() -> int:
            return pystrom.write_postgres(table, conninfo, "w_pystrom", if_exists="replace")

        assert ours() == rows
        with psycopg.connect(conninfo, autocommit=True) as conn:
            from pystrom.io.postgres.session import auto_partitions

            n = auto_partitions(conn, (rows * 55) // 8192)  # what write_postgres picks: 55 bytes per encoded row
            assert conn.execute("SELECT count(*), count(*) FILTER (WHERE t) FROM w_pystrom").fetchone()[0] == rows
        files = _floor_files(conninfo, "w_pystrom", n)
        print(f"  logreg {label}: write_postgres auto partitions: {n}; floor files: {len(files)}")
        t_ours, t_floor = measure_pair(ours, lambda: _server_copy_from(conninfo, files), sync, 5)
        results.append(
            Result(f"pg write {label} auto ({n} conns)", f"server COPY FROM file x{n}", t_ours, t_floor, nbytes)
        )
        try:
            t_adbc = measure(lambda: _adbc(uri, table), lambda: None, 1)
            results.append(Result(f"pg write {label} auto", "ADBC adbc_ingest", t_ours, t_adbc, nbytes))
        except ImportError as exc:
            print(f"  ADBC baseline skipped: {exc}")

        # The slow baselines on 10 % of the rows, against write_postgres on the same rows.
        small = table.slice(0, max(1, rows // 10))
        small_label = f"{small.num_rows / 1e6:g}M (10% rows)"

        def ours_small() -> int:
            return pystrom.write_postgres(small, conninfo, "w_pystrom_small", if_exists="replace")

        t_small = measure(ours_small, sync, 3)
        t_psy = measure(lambda: _psycopg_rows(conninfo, small), lambda: None, 1)
        results.append(Result(f"pg write {small_label} auto", "psycopg copy.write_row", t_small, t_psy, nbytes // 10))
        try:
            import sqlalchemy

            engine = sqlalchemy.create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{cluster.port}/postgres")
            try:
                t_pd = measure(lambda: _pandas(engine, small), lambda: None, 1)
            finally:
                engine.dispose()
            results.append(
                Result(f"pg write {small_label} auto", 'pandas to_sql(method="multi")', t_small, t_pd, nbytes // 10)
            )
        except ImportError as exc:
            print(f"  pandas to_sql baseline skipped: {exc}")
        start = time.perf_counter()
        _execute(conninfo, "DROP TABLE IF EXISTS w_floor, w_adbc, w_psycopg, w_pandas, w_pystrom, w_pystrom_small")
        print(f"  cleanup {time.perf_counter() - start:.1f} s")
    finally:
        cluster.destroy()
    return results
