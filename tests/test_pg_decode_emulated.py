"""The GPU decoder of binary COPY rows (kernels/pg_decode.cu) run on the CPU under tests/simt.py's
emulation, on real PostgreSQL data, against the C++ decoder (its CPU twin) on the very same staged chunks.

``read_postgres(device="cpu")`` stages the server's rows as it always does; at the decode step the test
decodes them twice: with the C++ decoder into the Table, and with the GPU kernels, launched as
io/postgres/decode_device.py launches them (one chunk table, the string and list offsets by a scan of
the lengths the first kernel wrote, then the string, array and vector copies) into a second block of
the same layout. The two must hold the same table. CI has no GPU: this is where a change to the
kernels is first checked; the GPU machine runs the real ones (tests/test_postgres.py and the others).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import simt
from test_postgres import TYPES_DDL, TYPES_ROWS

import pystrom
from pystrom.io.postgres import assemble
from pystrom.io.postgres.chunks import descriptors
from pystrom.io.postgres.pump import Kind
from pystrom.table import Table

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = [pytest.mark.postgres, pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return simt.Emulated("pg_decode", tmp_path_factory.mktemp("pg_decode"))


def _decode_emulated(kernels, block, plan, cols, lay) -> np.ndarray:
    """decode_device.decode_chunks with host pointers: every chunk in one group; the error words."""
    nrows, ncols = lay.nrows, np.int32(len(cols))
    errors = np.zeros((len(lay.chunks), 3), dtype=np.int64)
    desc = descriptors(cols, plan, block.ptr, lay, 0)
    table = np.array([(c.buf.ctypes.data, c.offsets.ctypes.data, lay.row_bases[i]) for i, c in enumerate(lay.chunks)],
                     dtype=np.int64)  # fmt: skip
    nchunks = np.int32(len(lay.chunks))
    args = (table, nchunks, np.int64(nrows), desc, ncols, errors)
    kernels.launch("pg_decode_rows", nrows, args, max_blocks=2)
    varlen = [i for i, c in enumerate(cols) if c.kind == Kind.VARLEN or (c.kind in Kind.ARRAYS and c.dim == 0)]
    for c in varlen:  # the lengths sit at offsets[row + 1]: a scan makes them offsets
        offs = block.array(plan.columns[c].values.offset, np.int32, (nrows + 1,))
        start = int(lay.data_bases[0, c])
        offs[1:] = (np.cumsum(offs[1:], dtype=np.int64) + start).astype(np.int32)
        offs[0] = start
    if varlen:
        kernels.launch("pg_copy_strings", nrows, args, max_blocks=2)
    if any(c.kind in (Kind.VECTOR_F4, Kind.VECTOR_F2) for c in cols):
        kernels.launch("pg_copy_vectors", nrows * 32, args[:5], max_blocks=2)
    return errors


@pytest.fixture
def twice(monkeypatch, kernels):
    """Make read_postgres(device="cpu") decode with both decoders; the pairs of Tables."""
    return _decode_twice(monkeypatch, kernels)


def _decode_twice(monkeypatch, kernels, poison: bool = False):
    """``poison``: the emulated decoder's block starts as 0xEE bytes (a slot it fails to write shows)."""
    pairs = []
    real = assemble.decode_into

    def both(backend, block, plan, cols, lay):
        real(backend, block, plan, cols, lay)
        other = backend.allocate(plan.nbytes)
        if poison:
            other.array(0, np.uint8, (plan.nbytes,)).fill(0xEE)
        for cp in plan.columns:  # as assemble's fill prepares the block
            if cp.validity is not None:
                other.array(cp.validity.offset, np.uint8, (cp.validity.size,)).fill(0xFF)
            if cp.child_validity is not None:
                other.array(cp.child_validity.offset, np.uint8, (cp.child_validity.size,)).fill(0xFF)
        errors = _decode_emulated(kernels, other, plan, cols, lay)
        assert not errors.any(), errors[errors[:, 0] != 0][:3]
        schema = pa.schema([pa.field(c.name, c.type.arrow) for c in cols])
        raw = backend.allocate(plan.nbytes)  # the CPU decoder's bytes now: intervals are rewritten after this
        raw.array(0, np.uint8, (plan.nbytes,))[:] = block.array(0, np.uint8, (plan.nbytes,))
        pairs.append((Table._wrap(raw, plan, schema, lay.nrows), Table._wrap(other, plan, schema, lay.nrows)))

    monkeypatch.setattr(assemble, "decode_into", both)
    return pairs


def _check(pairs) -> None:
    assert pairs
    for cpu, gpu in pairs:
        for name in cpu.column_names:
            a, b = cpu.column(name).to_arrow(), gpu.column(name).to_arrow()
            assert a.is_valid().equals(b.is_valid()), name
            if pa.types.is_floating(a.type) or pa.types.is_interval(a.type):
                # bit for bit (NaN is not equal to itself; intervals are still PostgreSQL's raw bytes here)
                valid = np.asarray(a.is_valid())
                va, vb = np.asarray(cpu.column(name).values), np.asarray(gpu.column(name).values)
                assert va[valid].tobytes() == vb[valid].tobytes(), name
            else:
                assert a.equals(b), name


def test_every_scalar_type(pg, twice):
    name = pg.name("types")
    pg.execute(sql.SQL("CREATE TABLE {} " + TYPES_DDL).format(sql.Identifier(name)))
    pg.execute(sql.SQL("INSERT INTO {} VALUES " + TYPES_ROWS).format(sql.Identifier(name)))
    pystrom.read_postgres(pg.conninfo, table=name, device="cpu")
    _check(twice)


def test_many_chunks_partitions_nulls_and_arrays(pg, twice):
    name = pg.name("mixed")
    pg.execute(
        sql.SQL(
            "CREATE TABLE {} AS SELECT g AS id, (g % 7)::int2 AS s, g * 1.5 AS f, "
            "CASE WHEN g % 5 = 0 THEN NULL ELSE repeat('x', g % 13) END AS t, "
            "(g % 3 = 0) AS b, make_interval(days => g % 40, secs => g) AS iv, "
            "CASE WHEN g % 11 = 0 THEN NULL ELSE ARRAY[g, g + 1, NULLIF(g % 4, 0)] END AS ai, "
            "ARRAY[g::float8, -g::float8] AS af, (g::numeric / 7)::numeric(12, 3) AS n "
            "FROM generate_series(1, 6000) g"
        ).format(sql.Identifier(name))
    )
    with pystrom.defaults.set(pg_staging_chunk=1 << 14):
        t = pystrom.read_postgres(pg.conninfo, table=name, partitions=2, device="cpu")
    assert t.num_rows == 6000
    assert len(twice) == 1
    _check(twice)


NEW_READS = (
    "SELECT g AS id, make_time(g % 24, g % 60, (g % 60) + 0.123456) AS t, "
    "CASE WHEN g % 4 = 0 THEN NULL ELSE ((g - 50) * 1234567)::numeric::money END AS m, "
    "'-92233720368547758.08'::money AS mmin, "
    "CASE WHEN g % 3 = 0 THEN NULL ELSE (g::bit(12))::varbit END AS vb, (g % 32)::bit(5) AS b5 "
    "FROM generate_series(1, 100) g"
)


def test_time_money_and_bits(pg, monkeypatch, kernels):
    """The types read since issue 38: time (int64), money (int64 -> decimal128), bit/varbit (bytes); the
    emulated decoder's block poisoned, so NULL slots must be written too."""
    pairs = _decode_twice(monkeypatch, kernels, poison=True)
    t = pystrom.read_postgres(pg.conninfo, NEW_READS, device="cpu")
    assert t.schema.field("m").type == pa.decimal128(19, 2)
    _check_poisoned(pairs)


# (kernels/pg_decode.cu text, a planted bug): each must make the emulated decoder differ from the C++ one
DECODE_MUTANTS = [
    ("o[1] = (long long)v < 0 ? ~0ULL : 0ULL;", "o[1] = 0ULL;"),  # money: no sign extension
    ("case NUMERIC_DEC128: case UUID: case MONEY: {", "case NUMERIC_DEC128: case UUID: {"),  # NULL money not zeroed
]


@pytest.mark.parametrize("mutant", DECODE_MUTANTS, ids=["sign", "null"])
def test_a_planted_bug_in_the_new_kinds_is_caught(pg, monkeypatch, tmp_path, mutant):
    pairs = _decode_twice(monkeypatch, simt.Emulated("pg_decode", tmp_path, mutant), poison=True)
    with pystrom.defaults.set(pg_staging_chunk=1 << 14):
        pystrom.read_postgres(pg.conninfo, NEW_READS.replace("WHEN g % 4 = 0", "WHEN g % 4 = 1"), device="cpu")
    with pytest.raises(AssertionError):
        _check_poisoned(pairs)


def _check_poisoned(pairs) -> None:
    """_check, with the NULL slots' bytes compared too (a decoder must zero them: the block is not)."""
    _check(pairs)
    for cpu, gpu in pairs:
        for name in cpu.column_names:
            if cpu.column(name).column_type.layout == "bytes":
                assert np.asarray(cpu.column(name).values).tobytes() == np.asarray(gpu.column(name).values).tobytes()
