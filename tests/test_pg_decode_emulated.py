"""The GPU decoder of binary COPY rows (kernels/pg_decode.cu) run on the CPU under tests/simt.py's
emulation, on real PostgreSQL data, against the C++ decoder (its CPU twin) on the very same staged chunks.

``read_postgres(device="cpu")`` stages the server's rows as it always does; at the decode step the test
decodes them twice: with the C++ decoder into the Table, and with the GPU kernels, launched as
io/postgres/decode_device.py launches them (one chunk table, the string and list offsets by a scan of
the lengths the first kernel wrote, then the string, array and vector copies) into a second block of
the same layout. The two must hold the same table. CI has no GPU: this is where a change to the
kernels is first checked; the GPU machine runs the real ones (tests/test_postgres.py and the others).

pgvector columns are also checked without a server, on COPY rows built here (pgvector's send format): vectors
of many dimensions (odd ones, so that output rows start at every alignment), rows starting at every byte
alignment in the staged chunks (NULLs and an int2 column between them), NULL vectors, halfvec, several
chunks; and the copy kernel with a lane's offset wrong, or its head or tail elements left out, must fail
these tests (the mutation check).
"""

from __future__ import annotations

import concurrent.futures as cf
import struct

import numpy as np
import pyarrow as pa
import pytest
import simt
from test_postgres import TYPES_DDL, TYPES_ROWS

import pystrom
from pystrom import _core
from pystrom.io.postgres import assemble
from pystrom.io.postgres.chunks import descriptors
from pystrom.io.postgres.pump import Kind
from pystrom.table import Table

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")


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


@pytest.mark.postgres
def test_every_scalar_type(pg, twice):
    name = pg.name("types")
    pg.execute(sql.SQL("CREATE TABLE {} " + TYPES_DDL).format(sql.Identifier(name)))
    pg.execute(sql.SQL("INSERT INTO {} VALUES " + TYPES_ROWS).format(sql.Identifier(name)))
    pystrom.read_postgres(pg.conninfo, table=name, device="cpu")
    _check(twice)


@pytest.mark.postgres
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


@pytest.mark.postgres
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


@pytest.mark.postgres
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


# -- pgvector rows built here: pg_copy_vectors against the C++ decoder ----------------------------------

# Columns of the built rows: an int2 (NULL in some rows, so rows start at every alignment), then vectors.
_INT2_EVERY = 3  # every third int2 is NULL


def _vector_rows(rng, nrows: int, dims: list[int], halves: list[bool]) -> tuple[bytes, list[int]]:
    """Binary COPY rows (int2, vector/halfvec columns; NULLs here and there) and each row's offset."""
    buf, offsets = bytearray(), []
    for i in range(nrows):
        offsets.append(len(buf))
        buf += struct.pack(">h", 1 + len(dims))
        buf += struct.pack(">i", -1) if i % _INT2_EVERY == 0 else struct.pack(">ih", 2, i)
        for j, (dim, half) in enumerate(zip(dims, halves)):
            if (i + j) % 5 == 2:
                buf += struct.pack(">i", -1)
                continue
            # values of every bit pattern a float may hold, NaNs and infinities included
            body = rng.integers(0, 256, dim * (2 if half else 4), dtype=np.uint8).tobytes()
            buf += struct.pack(">ihh", 4 + len(body), dim, 0) + body
    return bytes(buf), offsets


class _Case:
    """Rows split into chunks, each staged at its own misalignment in a buffer of its own; the columns'
    output buffers (the values ``out_shift`` bytes past a 64-byte boundary, as no real table has them,
    but the kernel must not care) and validity bitmaps."""

    def __init__(self, seed: int, nrows: int, dims: list[int], halves: list[bool], out_shift: int = 0):
        rng = np.random.default_rng(seed)
        self.nrows, self.dims, self.halves = nrows, dims, halves
        raw, offsets = _vector_rows(rng, nrows, dims, halves)
        bounds = np.unique(np.concatenate([[0, nrows], rng.integers(0, nrows, 3)])).tolist()
        self.chunks = []  # (bytes array, row offsets, first row)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            start, end = offsets[lo], offsets[hi] if hi < nrows else len(raw)
            pad = int(rng.integers(0, 16))
            staged = np.zeros(pad + end - start + 64, dtype=np.uint8)  # 64 spare bytes: a mutant may overread
            staged[pad : pad + end - start] = np.frombuffer(raw, np.uint8, end - start, start)
            self.chunks.append((staged[pad:], np.array(offsets[lo:hi], dtype=np.int64) - start, lo))
        self.out_shift = out_shift

    def outputs(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Fresh output buffers (values filled with 0xA5, every validity bit set) and the descriptors."""
        ncols = 1 + len(self.dims)
        desc = np.zeros((ncols, 8), dtype=np.int64)
        keep = []

        def buffer(nbytes: int, fill: int, shift: int = 0) -> np.ndarray:
            raw = np.full(nbytes + 128, fill, dtype=np.uint8)
            start = (-raw.ctypes.data) % 64 + shift
            keep.append(raw[start : start + nbytes])
            return keep[-1]

        desc[0, :3] = [Kind.INT2, buffer(2 * self.nrows, 0xA5).ctypes.data, buffer(self.nrows, 0xFF).ctypes.data]
        for c, (dim, half) in enumerate(zip(self.dims, self.halves), start=1):
            width = 2 if half else 4
            values = buffer(self.nrows * dim * width, 0xA5, self.out_shift * width // 4)
            desc[c, :3] = [Kind.VECTOR_F2 if half else Kind.VECTOR_F4, values.ctypes.data,
                           buffer(self.nrows, 0xFF).ctypes.data]  # fmt: skip
            desc[c, 6] = dim
        return keep, desc

    def decode_cpu(self) -> list[np.ndarray]:
        keep, desc = self.outputs()
        for buf, offs, first in self.chunks:
            assert _core.pg_decode(buf, offs, len(offs), first, desc.reshape(-1)) == (0, 0, 0)
        return keep

    def decode_emulated(self, kernels: simt.Emulated) -> list[np.ndarray]:
        keep, desc = self.outputs()
        table = np.array([(b.ctypes.data, o.ctypes.data, first) for b, o, first in self.chunks], dtype=np.int64)
        errors = np.zeros((len(self.chunks), 3), dtype=np.int64)
        args = (table, np.int32(len(self.chunks)), np.int64(self.nrows), desc.reshape(-1), np.int32(len(desc)))
        kernels.launch("pg_decode_rows", self.nrows, (*args, errors), max_blocks=1)
        kernels.launch("pg_copy_vectors", self.nrows * 32, args, max_blocks=2)
        assert not errors.any(), errors
        return keep


# Dimensions: below one 16-byte piece, whole pieces, pieces and a head and a tail, more pieces than a warp's
# lanes (so lanes loop), pgvector's usual 768.
_CASES = [
    dict(seed=1, nrows=40, dims=[1, 3], halves=[False, True]),
    dict(seed=2, nrows=37, dims=[4, 8, 5], halves=[False, True, False]),
    dict(seed=3, nrows=33, dims=[77, 77], halves=[False, True]),
    dict(seed=4, nrows=21, dims=[130, 261], halves=[True, False]),
    dict(seed=5, nrows=9, dims=[768], halves=[False]),
    dict(seed=6, nrows=17, dims=[13, 29], halves=[False, True], out_shift=4),  # output rows 4 bytes past 16
]


@pytest.fixture(scope="module")
def vector_kernels(tmp_path_factory):
    return simt.Emulated("pg_decode", tmp_path_factory.mktemp("pg_vectors"))


def _differences(kernels: simt.Emulated, case: _Case) -> list[str]:
    want, got = case.decode_cpu(), case.decode_emulated(kernels)
    names = ["int2", *(f"{'halfvec' if h else 'vector'}({d})" for d, h in zip(case.dims, case.halves))]
    return [f"{names[k // 2]} {'values' if k % 2 == 0 else 'validity'}"
            for k, (a, b) in enumerate(zip(want, got)) if a.tobytes() != b.tobytes()]  # fmt: skip


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_vectors_equal_the_cpu_twin(vector_kernels, case):
    """Every byte of every output (NULL rows' zeros, NaN payloads) as the C++ decoder writes it."""
    assert _differences(vector_kernels, _Case(**_CASES[case])) == []


# Each mutant must make some case differ from the C++ decoder: (what is broken, the line as it is, as broken).
_MUTANTS = [
    (
        "a lane loading the next piece",
        "uint4 v = load16(e + j * (long long)sizeof(T));",
        "uint4 v = load16(e + (j + per * (lane & 1)) * (long long)sizeof(T));",
    ),
    (
        "lanes stepping past pieces",
        "for (long long k = lane; k < pieces; k += 32)",
        "for (long long k = lane; k < pieces; k += 64)",
    ),
    ("the tail left out", "if (j < dim) o[j]", "if (j < dim - 1) o[j]"),
    ("the head left out", "if (lane < head) o[lane]", "if (lane + 1 < head) o[lane]"),
    ("the shift of an unaligned row's bytes", "r = (s & 3) * 8;", "r = (s & 3) * 4;"),
]


@pytest.mark.slow
def test_the_vector_cases_catch_broken_copies(tmp_path):
    def survivors(mutant: tuple[str, str, str]) -> str | None:
        what, line, broken = mutant
        work = tmp_path / what.replace(" ", "_").replace("'", "")
        work.mkdir()
        kernels = simt.Emulated("pg_decode", work, (line, broken))
        caught = any(_differences(kernels, _Case(**c)) for c in _CASES)
        return None if caught else what

    with cf.ThreadPoolExecutor(2) as pool:
        survived = [s for s in pool.map(survivors, _MUTANTS) if s is not None]
    assert survived == [], f"broken vector copies the cases do not catch: {survived}"
