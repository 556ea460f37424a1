"""pgvector embeddings -> one device matrix: read_postgres of a vector(768) column (issue 18's goal).

A throwaway cluster (tests/fix_pg.py; pgserver's binaries bundle pgvector) holds ``emb`` (id int4,
e vector(768)), loaded by eight concurrent binary COPYs of rows built with NumPy. Measured in the same run:

- pystrom: ``read_postgres(table="emb", columns=["e"])`` with automatic partitions, then the (rows, 768)
  float32 matrix ``table["e"]`` on the device (zero copy);
- the server alone: ``COPY (...) TO '/dev/null' (FORMAT BINARY)`` over as many ctid ranges as pystrom
  opened, one backend each (the floor; goal: pystrom <= 1.2x of it);
- psycopg's binary COPY of the column with the rows parsed by NumPy (a fixed-size structured view:
  what a careful user writes without pystrom), then ``xp.asarray``;
- ADBC ``fetch_arrow_table`` of ``e::real[]`` (ADBC does not know pgvector's type), flattened to a
  NumPy matrix, then ``xp.asarray``.

``PYSTROM_BENCH_VEC_ROWS`` overrides the row count (full: 1,000,000 rows, 3.1 GB of vectors; quick: 50,000).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from _harness import Result, measure, measure_pair

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

DIM = 768


_LOADERS = 8  # concurrent COPYs: one took over 200 s for the full table on the GPU machine, eight 14-16 s
_BATCH = 20_000


def _vectors(lo: int, hi: int):
    """The vectors of ids [lo, hi) in batches, as the loader of that range writes them (seeded by lo)."""
    rng = np.random.default_rng(lo)
    for start in range(lo, hi, _BATCH):
        yield start, rng.standard_normal((min(_BATCH, hi - start), DIM), dtype=np.float32)


def _ranges(rows: int) -> list[tuple[int, int]]:
    return [(rows * i // _LOADERS, rows * (i + 1) // _LOADERS) for i in range(_LOADERS)]


def _load(conninfo: str, rows: int) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(f"DROP TABLE IF EXISTS emb; CREATE TABLE emb (id int4, e vector({DIM}))")
    row = np.dtype([("nf", ">i2"), ("l1", ">i4"), ("id", ">i4"), ("l2", ">i4"), ("dim", ">i2"), ("u", ">i2"),
                    ("v", ">f4", (DIM,))])  # fmt: skip

    def load(lo: int, hi: int) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            with conn.cursor().copy("COPY emb FROM STDIN (FORMAT BINARY)") as copy:
                copy.write(b"PGCOPY\n\xff\r\n\0" + b"\0" * 8)
                for start, values in _vectors(lo, hi):
                    part = np.zeros(len(values), dtype=row)
                    part["nf"], part["l1"], part["l2"], part["dim"] = 2, 4, 4 + 4 * DIM, DIM
                    part["id"] = np.arange(start, start + len(values))
                    part["v"] = values
                    copy.write(part.tobytes())
                copy.write(b"\xff\xff")

    with ThreadPoolExecutor(_LOADERS) as pool:
        list(pool.map(lambda r: load(*r), _ranges(rows)))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE emb")


def _loaded(rows: int) -> np.ndarray:
    """Every row's vector, by id: what :func:`_load` wrote."""
    out = np.empty((rows, DIM), dtype=np.float32)
    for lo, hi in _ranges(rows):
        for start, values in _vectors(lo, hi):
            out[start : start + len(values)] = values
    return out


def _psycopg_numpy(conninfo: str, rows: int, xp: Any) -> Any:
    """Binary COPY of the column read whole, the fixed-size rows viewed and byte-swapped by NumPy."""
    import psycopg

    chunks = []
    with psycopg.connect(conninfo) as conn, conn.cursor().copy("COPY emb (e) TO STDOUT (FORMAT BINARY)") as copy:
        for data in copy:
            chunks.append(bytes(data))
    raw = b"".join(chunks)
    row = np.dtype([("nf", ">i2"), ("len", ">i4"), ("dim", ">i2"), ("u", ">i2"), ("v", ">f4", (DIM,))])
    body = np.frombuffer(raw, dtype=row, count=rows, offset=19)  # the 19-byte header, then the rows
    assert (body["dim"] == DIM).all()
    return xp.asarray(body["v"].astype(np.float32))


def _adbc(uri: str, xp: Any) -> Any:
    import adbc_driver_postgresql.dbapi as adbc

    with adbc.connect(uri) as conn, conn.cursor() as cur:
        cur.execute("SELECT e::real[] AS e FROM emb")
        table = cur.fetch_arrow_table()
    flat = table.column("e").combine_chunks().flatten().to_numpy()
    return xp.asarray(flat.reshape(-1, DIM))


def run(device: str, quick: bool) -> list[Result]:
    import pystrom
    from pystrom.memory.backend import resolve_device

    try:
        import psycopg  # noqa: F401
        from fix_pg import PgCluster, _find_bindir
    except ImportError as exc:
        print(f"bench_pgvector: skipped ({exc})")
        return []
    bindir = _find_bindir()
    if bindir is None:
        print("bench_pgvector: skipped (no PostgreSQL binaries and no pgserver)")
        return []
    rows = int(os.environ.get("PYSTROM_BENCH_VEC_ROWS", 50_000 if quick else 1_000_000))
    backend = resolve_device(device)
    xp, sync = backend.xp, backend.synchronize
    cluster = PgCluster(bindir)
    results: list[Result] = []
    try:
        conninfo = cluster.conninfo
        try:
            _load(conninfo, rows)
        except Exception as exc:  # Debian's server without the extension
            print(f"bench_pgvector: skipped (no pgvector on this server: {str(exc).splitlines()[0]})")
            return []
        nbytes = rows * DIM * 4
        label = f"pgvector {rows:,} x vector({DIM})"

        def ours() -> Any:
            t = pystrom.read_postgres(conninfo, table="emb", columns=["e"], device=device)
            m = t["e"]
            assert tuple(m.shape) == (rows, DIM)
            return t

        ours()  # warm: the decoder compiled, the pages cached
        from bench_postgres import _auto_partitions, _server_copy

        parts = _auto_partitions(conninfo, "emb")
        repeat = 3
        t_ours, t_server = measure_pair(ours, lambda: _server_copy(conninfo, parts, "emb"), sync, repeat)
        results.append(Result(label, f"server COPY x{parts} to /dev/null (goal <= 1.2x)", t_ours, t_server, nbytes))
        t_psy = measure(lambda: _psycopg_numpy(conninfo, rows, xp), sync, 1)
        results.append(Result(label, "psycopg binary COPY + NumPy view", t_ours, t_psy, nbytes))
        try:
            uri = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
            t_adbc = measure(lambda: _adbc(uri, xp), sync, 1)
            results.append(Result(label, "ADBC e::real[] + flatten", t_ours, t_adbc, nbytes))
        except ImportError:
            print("bench_pgvector: ADBC is not installed: no ADBC baseline")
        got = backend.to_host(pystrom.read_postgres(conninfo, "SELECT e FROM emb ORDER BY id", device=device)["e"])
        assert np.array_equal(np.asarray(got), _loaded(rows)), "pystrom's matrix differs from the rows loaded"
    finally:
        cluster.destroy()
    return results
