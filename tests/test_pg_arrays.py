"""PostgreSQL one-dimensional arrays (bool[], int2[], int4[], int8[], float4[], float8[]) -> list<T> or
fixed_size_list<T>[d], against what psycopg returns for the same rows.

The decoders (C++ ``_core.pg_decode`` and its GPU twin in kernels/pg_decode.cu) are also fed binary
COPY rows built here from the array send format (int32 ndim, int32 has-NULL flag, int32 element OID,
per dimension int32 size and lower bound, then per element int32 length or -1 and its bytes), lying
ones included: they must report a failure naming the row, never write outside the column's buffers.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom import _core
from pystrom.errors import UnsupportedTypeError
from pystrom.io.postgres.pump import FAILURES, Kind
from pystrom.testing import to_host

from conftest import needs_gpu  # noqa: E402

psycopg = pytest.importorskip("psycopg")

# element name -> (array kind, element OID, big-endian dtype, table dtype, Arrow type)
ELEMENTS = {
    "bool": (Kind.ARRAY_BOOL, 16, "?", np.bool_, pa.bool_()),
    "int2": (Kind.ARRAY_INT2, 21, ">i2", np.int16, pa.int16()),
    "int4": (Kind.ARRAY_INT4, 23, ">i4", np.int32, pa.int32()),
    "int8": (Kind.ARRAY_INT8, 20, ">i8", np.int64, pa.int64()),
    "float4": (Kind.ARRAY_FLOAT4, 700, ">f4", np.float32, pa.float32()),
    "float8": (Kind.ARRAY_FLOAT8, 701, ">f8", np.float64, pa.float64()),
}
UNEXPECTED_NULL, BAD_LENGTH = 5, 1
ARRAY_NDIM, ARRAY_ELEMENT, ARRAY_LENGTH, ARRAY_BAD = 8, 9, 10, 11


# -- synthetic COPY rows, decoded by the C++ decoder --------------------------------------------------


def _array(values: list | None, element: str, **lie) -> bytes | None:
    """The binary send form of a one-dimensional array (None: a NULL array); ``lie`` forges fields:
    ndim, flag, oid, size, elen (every element's length), tail (bytes appended), dims (extra dims)."""
    if values is None:
        return None
    _, oid, be, _, _ = ELEMENTS[element]
    has_null = any(v is None for v in values)
    ndim = lie.get("ndim", 1 if values else 0)
    head = struct.pack(">iiI", ndim, lie.get("flag", int(has_null)), lie.get("oid", oid))
    if values or "ndim" in lie:
        head += struct.pack(">ii", lie.get("size", len(values)), 0)  # lower bound 0: ignored
        for size in lie.get("dims", []):
            head += struct.pack(">ii", size, 1)
    body = b""
    for v in values:
        if v is None:
            body += struct.pack(">i", -1)
        else:
            raw = np.asarray([v], dtype=be).tobytes()
            body += struct.pack(">i", lie.get("elen", len(raw))) + raw
    return head + body + lie.get("tail", b"")


def _rows(fields: list[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """Binary COPY rows of one column from each row's field bytes (None: NULL)."""
    buf, offsets = bytearray(), []
    for f in fields:
        offsets.append(len(buf))
        buf += struct.pack(">h", 1)
        buf += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
    return np.frombuffer(bytes(buf), np.uint8), np.asarray(offsets, dtype=np.int64)


class Target:
    """A list (dim 0) or fixed_size_list (dim d) column's buffers, with guard bytes around each so a
    write outside them shows."""

    GUARD = 64

    def __init__(self, element: str, n: int, elements: int, dim: int = 0, child_nulls: bool = True, xp=np):
        self.kind, _, _, self.dtype, _ = ELEMENTS[element]
        self.n, self.elements, self.dim, self.xp = n, elements, dim, xp
        g = self.GUARD
        itemsize = np.dtype(self.dtype).itemsize
        self.raw_offsets = xp.full(n + 1 + 2 * g, 0x5A5A5A5A, dtype=np.int32)
        self.raw_values = xp.full(elements * itemsize + 2 * g, 0xA5, dtype=np.uint8)
        self.raw_valid = xp.full((n + 7) // 8 + 2 * g, 0xFF, dtype=np.uint8)
        self.raw_child = xp.full((elements + 7) // 8 + 2 * g, 0xFF, dtype=np.uint8)
        self.raw_offsets[g] = 0
        self.child_nulls = child_nulls

    def _ptr(self, a, offset: int) -> int:
        return (a.ctypes.data if self.xp is np else a.data.ptr) + offset

    def desc(self, first: int = 0) -> np.ndarray:
        g = self.GUARD
        desc = np.zeros(8, dtype=np.int64)
        desc[:] = [
            self.kind,
            0 if self.dim else self._ptr(self.raw_offsets, 4 * g),
            self._ptr(self.raw_valid, g),
            self._ptr(self.raw_values, g),
            0 if self.dim else first,
            self._ptr(self.raw_child, g) if self.child_nulls else 0,
            self.dim,
            self.elements,
        ]
        return desc

    def guards_intact(self) -> bool:
        g = self.GUARD
        host = [np.asarray(a.get() if self.xp is not np else a) for a in (self.raw_offsets, self.raw_values,
                                                                           self.raw_valid, self.raw_child)]  # fmt: skip
        offs, vals, valid, child = host
        return (
            bool((offs[:g] == 0x5A5A5A5A).all() and (offs[g + self.n + 1 :] == 0x5A5A5A5A).all())
            and bool((vals[:g] == 0xA5).all() and (vals[vals.size - g :] == 0xA5).all())
            and bool((valid[:g] == 0xFF).all() and (valid[valid.size - g :] == 0xFF).all())
            and bool((child[:g] == 0xFF).all() and (child[child.size - g :] == 0xFF).all())
        )

    def lists(self) -> list:
        """The decoded rows as Python lists (None: a NULL row or element)."""
        g = self.GUARD
        host = [np.asarray(a.get() if self.xp is not np else a) for a in (self.raw_offsets, self.raw_values,
                                                                           self.raw_valid, self.raw_child)]  # fmt: skip
        offs, vals, valid, child = host
        values = vals[g : vals.size - g].view(self.dtype)
        ok = np.unpackbits(valid[g:], bitorder="little")[: self.n].astype(bool)
        elem_ok = np.unpackbits(child[g:], bitorder="little")[: self.elements].astype(bool)
        out = []
        for i in range(self.n):
            if not ok[i]:
                out.append(None)
                continue
            a, b = (i * self.dim, (i + 1) * self.dim) if self.dim else (offs[g + i], offs[g + i + 1])
            out.append([values[j].item() if elem_ok[j] else None for j in range(a, b)])
        return out


def _decode_cpu(fields, target: Target) -> tuple[int, int]:
    buf, offsets = _rows(fields)
    code, row, _ = _core.pg_decode(buf, offsets, len(fields), 0, target.desc())
    return code, row


def _sample(element: str, rng: np.random.Generator, n: int, dim: int = 0) -> list:
    """Rows of arrays: NULL arrays, empty arrays (list only), NULL elements, random values."""
    _, _, _, dtype, _ = ELEMENTS[element]
    rows = []
    for i in range(n):
        if i % 7 == 3:
            rows.append(None)
            continue
        length = dim or int(rng.integers(0, 6))
        if dtype == np.bool_:
            vals = [bool(v) for v in rng.integers(0, 2, length)]
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            vals = [int(v) for v in rng.integers(info.min, info.max, length, dtype=dtype, endpoint=True)]
        else:
            vals = [float(np.asarray(v, dtype=dtype)) for v in rng.standard_normal(length) * 1e3]
        rows.append([None if (i + j) % 5 == 0 else v for j, v in enumerate(vals)])
    return rows


def _count(rows: list) -> int:
    return sum(len(r) for r in rows if r is not None)


@pytest.mark.parametrize("element", list(ELEMENTS))
@pytest.mark.parametrize("dim", [0, 3])
def test_decoder_writes_lists_and_fixed_size_lists(element, dim):
    rows = _sample(element, np.random.default_rng(len(element) + dim), 40, dim)
    target = Target(element, len(rows), _count(rows) if not dim else len(rows) * dim, dim)
    assert _decode_cpu([_array(r, element) for r in rows], target) == (0, 0)
    assert target.guards_intact()
    assert target.lists() == rows


def test_decoder_writes_a_chunk_from_its_first_element_and_closes_its_offsets():
    rows = [[1, 2], None, [], [3]]
    target = Target("int4", 4, 10)
    buf, offsets = _rows([_array(r, "int4") for r in rows])
    code, _, _ = _core.pg_decode(buf, offsets, 4, 0, target.desc(first=6))  # a later chunk: elements from 6
    assert code == 0
    g = Target.GUARD
    assert target.raw_offsets[g : g + 5].tolist() == [6, 8, 8, 8, 9]


# Lying arrays: (rows, element, lie on row 2, column dim, expected failure)
_GOOD = [[1, 2, 3], [4, None, 6], [7, 8, 9], [10, 11, 12]]
LIES = {
    "size past the bytes": (dict(size=1000), 0, ARRAY_BAD),
    "negative size": (dict(size=-1), 0, ARRAY_BAD),
    "size short of the bytes": (dict(size=2), 0, ARRAY_BAD),
    "element length": (dict(elen=8), 0, BAD_LENGTH),
    "huge element length": (dict(elen=2**31 - 1), 0, BAD_LENGTH),
    "element oid": (dict(oid=20), 0, ARRAY_ELEMENT),
    "two dimensions": (dict(ndim=2, dims=[1]), 0, ARRAY_NDIM),
    "seven dimensions": (dict(ndim=7), 0, ARRAY_NDIM),
    "negative ndim": (dict(ndim=-1), 0, ARRAY_BAD),
    "empty with elements": (dict(ndim=0), 0, ARRAY_BAD),
    "flag neither 0 nor 1": (dict(flag=2), 0, ARRAY_BAD),
    "trailing bytes": (dict(tail=b"\0\0\0\0"), 0, ARRAY_BAD),
    "fixed length": (dict(size=2), 3, ARRAY_LENGTH),
}


@pytest.mark.parametrize("lie", list(LIES))
def test_decoder_refuses_a_lying_array_naming_the_row(lie):
    forged, dim, failure = LIES[lie]
    fields = [_array(r, "int4") for r in _GOOD]
    fields[2] = _array(_GOOD[2], "int4", **forged)
    target = Target("int4", 4, 12, dim)
    assert _decode_cpu(fields, target) == (failure, 2)
    assert target.guards_intact()
    assert failure in FAILURES


def test_decoder_refuses_arrays_too_short_and_too_many():
    cases = [
        (b"\0" * 11, 0, ARRAY_BAD),  # shorter than a header
        (struct.pack(">iiI", 1, 0, 23) + b"\0\0\0", 0, ARRAY_BAD),  # one dimension without its size
        (_array([1, 2], "int4"), 3, ARRAY_LENGTH),  # a fixed_size_list row of another length
        (_array([1, None], "int4", flag=0), 0, ARRAY_BAD),  # a NULL element the flag denies
    ]
    for field, dim, failure in cases:
        fields = [_array([1, 2, 3], "int4"), field]
        target = Target("int4", 2, 6, dim)
        assert _decode_cpu(fields, target) == (failure, 1), field
        assert target.guards_intact()
    # more elements than the column was counted: refused before a write past them
    target = Target("int4", 2, 4)
    assert _decode_cpu([_array([1, 2, 3], "int4"), _array([4, 5], "int4")], target) == (ARRAY_LENGTH, 1)
    assert target.guards_intact()
    # a NULL element where none was counted (no element bitmap)
    target = Target("int4", 1, 2, child_nulls=False)
    assert _decode_cpu([_array([1, None], "int4")], target) == (UNEXPECTED_NULL, 0)
    assert target.guards_intact()


def test_decoder_survives_random_array_bytes():
    """Random bytes inside array fields (the row structure stays valid, as the pump guarantees): a
    failure or a decode, never a write outside the column's buffers."""
    rng = np.random.default_rng(18)
    good = [_array(r, "int8") for r in _sample("int8", rng, 12)]
    for trial in range(3000):
        fields = list(good)
        i = int(rng.integers(0, len(fields)))
        f = bytearray(fields[i] or _array([1, 2], "int8"))
        for _ in range(int(rng.integers(1, 4))):
            if rng.random() < 0.5 and len(f) >= 4:  # a random word
                j = int(rng.integers(0, len(f) - 3))
                f[j : j + 4] = struct.pack(">i", int(rng.choice([-1, 0, 1, 2, 7, 8, 1000, 2**31 - 1, -(2**31)])))
            elif f:
                f[int(rng.integers(0, len(f)))] = int(rng.integers(0, 256))
        if rng.random() < 0.2:
            f = f[: int(rng.integers(0, len(f) + 1))]
        fields[i] = bytes(f)
        for dim in (0, 2):
            target = Target("int8", len(fields), 40, dim)
            _decode_cpu(fields, target)
            assert target.guards_intact(), (trial, dim)


# -- end to end, against psycopg ----------------------------------------------------------------------


def _psycopg_rows(pg, query: str) -> list[tuple]:
    return pg.fetch(query)


def _literal(values: list | None, element: str) -> str:
    if values is None:
        return "NULL"
    items = ",".join("NULL" if v is None else (str(v).lower() if isinstance(v, bool) else repr(v)) for v in values)
    return f"'{{{items}}}'::{element}[]"


def _equal(got: list, want: list, element: str) -> None:
    assert len(got) == len(want)
    dtype = ELEMENTS[element][3]
    for g, w in zip(got, want):
        if w is None or g is None:
            assert g is w is None, (g, w)
            continue
        assert [x is None for x in g] == [x is None for x in w]
        assert [x for x in g if x is not None] == [np.asarray(x, dtype=dtype).item() for x in w if x is not None]


def _table_of(pg, element: str, rows: list) -> str:
    name = pg.name(f"arr_{element}")
    pg.execute(f"CREATE TABLE {name} (id int4, a {element}[])")
    if rows:
        values = ",".join(f"({i}, {_literal(r, element)})" for i, r in enumerate(rows))
        pg.execute(f"INSERT INTO {name} VALUES {values}")
    return name


@pytest.mark.parametrize("element", list(ELEMENTS))
def test_arrays_read_as_lists_equal_psycopg(pg, device, element):
    rows = _sample(element, np.random.default_rng(7), 200)
    name = _table_of(pg, element, rows)
    want = [r for (_, r) in _psycopg_rows(pg, f"SELECT id, a FROM {name} ORDER BY id")]
    for partitions in (1, 3):
        t = pystrom.read_postgres(pg.conninfo, table=name, partitions=partitions, device=device)
        assert t.schema.field("a").type == pa.list_(ELEMENTS[element][4])
        got = to_host(t).sort_by("id")
        _equal(got.column("a").to_pylist(), want, element)
        assert got.column("a").null_count == sum(r is None for r in rows)
        elements = got.column("a").combine_chunks().values  # the element bitmap: as many NULLs as psycopg's
        assert elements.null_count == sum(v is None for r in want if r is not None for v in r) > 0


def test_the_pump_counts_elements_null_elements_and_lengths(pg):
    from pystrom.io.postgres.pump import CopyStream

    q = (
        "COPY (SELECT * FROM (VALUES (1, '{1,NULL,3}'::int8[]), (2, NULL), (3, '{}'), (4, '{{1,2},{3,4}}'), "
        "(5, '[0:1]={NULL,NULL}')) v(id, a)) TO STDOUT (FORMAT BINARY)"
    )
    with psycopg.connect(pg.conninfo) as conn:
        (chunk,) = CopyStream(conn, 2, lambda n: np.zeros(n, np.uint8), 1 << 20, arrays=[1]).read(q)
    assert chunk.nrows == 5 and chunk.nulls.tolist() == [0, 1]
    assert chunk.bytes[1] == 3 + 0 + 2  # elements; the 2-D array counts nothing (the decoder refuses it)
    assert chunk.shape[1].tolist() == [3, 0, 3]  # NULL elements, least and greatest length


@pytest.mark.parametrize("element", list(ELEMENTS))
def test_arrays_of_one_length_read_as_fixed_size_lists(pg, device, element):
    rows = _sample(element, np.random.default_rng(8), 120, dim=4)
    name = _table_of(pg, element, rows)
    want = [r for (_, r) in _psycopg_rows(pg, f"SELECT id, a FROM {name} ORDER BY id")]
    t = pystrom.read_postgres(pg.conninfo, table=name, partitions=2, device=device)
    assert t.schema.field("a").type == pa.list_(ELEMENTS[element][4], 4)
    got = to_host(t).sort_by("id")
    _equal(got.column("a").to_pylist(), want, element)
    assert tuple(t.column("a").values.shape) == (120, 4)  # the zero-copy matrix


def test_list_or_fixed_size_list_follows_the_rows(pg, device):
    def read(q):
        return pystrom.read_postgres(pg.conninfo, q, device=device)

    int4 = pa.int32()
    one = read("SELECT '{1,2,3}'::int4[] AS a")
    assert one.schema.field("a").type == pa.list_(int4, 3) and to_host(one).column("a").to_pylist() == [[1, 2, 3]]
    zero = read("SELECT '{1,2,3}'::int4[] AS a WHERE false")
    assert zero.num_rows == 0 and zero.schema.field("a").type == pa.list_(int4)
    nulls = read("SELECT NULL::int4[] AS a FROM generate_series(1, 3)")
    assert nulls.schema.field("a").type == pa.list_(int4) and to_host(nulls).column("a").to_pylist() == [None] * 3
    empties = read("SELECT '{}'::int4[] AS a FROM generate_series(1, 3)")
    assert empties.schema.field("a").type == pa.list_(int4) and to_host(empties).column("a").to_pylist() == [[]] * 3
    q = "SELECT * FROM (VALUES ('{1,2}'::int4[]), (NULL), ('{3,NULL}'), ('[5:6]={5,6}')) v(a)"  # bounds ignored
    fixed = read(q)
    assert fixed.schema.field("a").type == pa.list_(int4, 2)
    assert to_host(fixed).column("a").to_pylist() == [[1, 2], None, [3, None], [5, 6]]
    mixed = read(q + " UNION ALL SELECT '{}'")
    assert mixed.schema.field("a").type == pa.list_(int4)
    assert to_host(mixed).column("a").to_pylist() == [[1, 2], None, [3, None], [5, 6], []]


def test_multidimensional_arrays_read_as_nested_fixed_size_lists(pg, device):
    """One shape in every non-NULL row: nested fixed_size_lists, the values an (n, d1, d2, ...) block; written back
    with their shape. Mixed shapes or dimension counts are refused naming the rows that differ."""
    rows = "(1, '{{1,2,3},{4,5,6}}'::int4[]), (2, NULL), (3, '[0:1][5:7]={{7,NULL,9},{10,11,12}}')"
    q = f"SELECT * FROM (VALUES {rows}) v(id, grid) ORDER BY id"
    for read in (lambda: pystrom.read_postgres(pg.conninfo, q, device=device),
                 lambda: next(iter(pystrom.scan_postgres(pg.conninfo, q, device=device)))):  # fmt: skip
        t = read()
        assert t.schema.field("grid").type == pa.list_(pa.list_(pa.int32(), 3), 2)
        assert tuple(t.column("grid").values.shape) == (3, 2, 3)
        assert to_host(t).column("grid").to_pylist() == [[[1, 2, 3], [4, 5, 6]], None, [[7, None, 9], [10, 11, 12]]]
    cube = pystrom.read_postgres(pg.conninfo, "SELECT ARRAY[[[1.5::float8]], [[2]]] AS c", device=device)
    assert cube.schema.field("c").type == pa.list_(pa.list_(pa.list_(pa.float64(), 1), 1), 2)
    out = pg.name("grid_back")
    assert pystrom.write_postgres(t, pg.conninfo, out) == 3
    src = f"SELECT id, array_to_json(grid)::text, array_ndims(grid) FROM (VALUES {rows}) v(id, grid)"
    dst = f'SELECT id, array_to_json(grid)::text, array_ndims(grid) FROM "{out}"'
    assert pg.fetch(f"{src} EXCEPT ALL {dst}") == [] and pg.fetch(f"{dst} EXCEPT ALL {src}") == []
    mixed = "SELECT * FROM (VALUES (1, '{1,2}'::int4[]), (2, '{{1,2},{3,4}}')) v(id, grid)"
    with pytest.raises(
        pystrom.SchemaMismatchError,
        match=r"column 'grid'.*number of dimensions.*row 1 is \[1:2\]\[1:2\], row 0 \[1:2\]",
    ):
        pystrom.read_postgres(pg.conninfo, mixed, device=device)
    ragged = "SELECT * FROM (VALUES (1, '{{1,2},{3,4}}'::int4[]), (2, '{{1,2,3}}')) v(id, grid)"
    with pytest.raises(pystrom.SchemaMismatchError, match=r"column 'grid'.*one shape.*row 1 is \[1:1\]\[1:3\]"):
        pystrom.read_postgres(pg.conninfo, ragged, device=device)


def test_arrays_of_other_elements_are_refused_with_a_cast(pg):
    with pytest.raises(UnsupportedTypeError, match=r"'tags'.*bytea\[\].*tags::text"):
        pystrom.read_postgres(pg.conninfo, "SELECT '{ab}'::bytea[] AS tags", device="cpu")
    with pytest.raises(UnsupportedTypeError, match=r"'n'.*numeric\[\].*n::float8\[\]"):
        pystrom.read_postgres(pg.conninfo, "SELECT '{1.5}'::numeric[] AS n", device="cpu")
    with pytest.raises(UnsupportedTypeError, match=r"'Days'.*date\[\].*\"Days\"::text"):
        pystrom.read_postgres(pg.conninfo, "SELECT '{2020-01-01}'::date[] AS \"Days\"", device="cpu")


def test_scan_and_dask_settle_the_layout_on_the_server(pg, device):
    name = pg.name("arr_scan")
    pg.execute(
        f"CREATE TABLE {name} AS SELECT g AS id, "
        "CASE WHEN g % 9 = 0 THEN NULL ELSE ARRAY[g, NULLIF(g % 4, 0), -g]::int8[] END AS fixed, "
        "CASE WHEN g % 11 = 0 THEN NULL ELSE (SELECT coalesce(array_agg(j::float4), '{}') "
        "FROM generate_series(1, g % 5) j) END AS ragged FROM generate_series(1, 3000) g"
    )
    want = pystrom.read_postgres(pg.conninfo, table=name, device="cpu")
    assert want.schema.field("fixed").type == pa.list_(pa.int64(), 3)
    assert want.schema.field("ragged").type == pa.list_(pa.float32())
    host = to_host(want).sort_by("id")
    scan = pystrom.scan_postgres(pg.conninfo, table=name, partitions=3, device=device)
    assert scan.schema == want.schema
    batches = [to_host(t) for t in scan]
    assert len(batches) == 3 and all(b.schema == want.schema for b in batches)
    assert pa.concat_tables(batches).sort_by("id").equals(host)
    pdask = pytest.importorskip("pystrom.dask")
    pytest.importorskip("dask")
    with pdask.read_postgres(pg.conninfo, table=name, npartitions=3, device=device) as parts:
        assert parts.schema == want.schema
        assert to_host(parts.compute()).sort_by("id").equals(host)


def test_arrow_round_trip_and_pg2arrow(pg, device, tmp_path):
    name = pg.name("arr_arrow")
    pg.execute(
        f"CREATE TABLE {name} AS SELECT g AS id, "
        "CASE WHEN g % 6 = 0 THEN NULL ELSE ARRAY[g % 2 = 0, NULL]::bool[] END AS flags, "
        "CASE WHEN g % 5 = 0 THEN '{}'::int2[] ELSE ARRAY[g::int2, NULL, 3::int2] END AS small, "
        "ARRAY[g * 0.5, g]::float8[] AS pair FROM generate_series(1, 500) g"
    )
    t = pystrom.read_postgres(pg.conninfo, table=name, device=device)
    assert [t.schema.field(c).type for c in ("flags", "small", "pair")] == [
        pa.list_(pa.bool_(), 2), pa.list_(pa.int16()), pa.list_(pa.float64(), 2)]  # fmt: skip
    path = str(tmp_path / "t.arrow")
    pystrom.write_arrow(t, path)
    back = pystrom.read_arrow(path, device=device)
    assert to_host(back).equals(to_host(t))
    out = str(tmp_path / "pg2arrow.arrow")
    pystrom.postgres_to_arrow(pg.conninfo, out, table=name, batch_rows=128)
    with pa.ipc.open_file(out) as reader:
        assert reader.num_record_batches == 4
        assert reader.read_all().sort_by("id").equals(to_host(t).sort_by("id"))
    cli = str(tmp_path / "cli.arrow")
    run = [sys.executable, "-m", "pystrom", "pg2arrow", "-d", pg.conninfo, "-o", cli, "-t", name]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert pa.ipc.open_file(cli).read_all().sort_by("id").equals(to_host(t).sort_by("id"))


# -- the GPU kernels against their CPU twin -----------------------------------------------------------


def _decode_gpu(fields, target: Target) -> tuple[int, int]:
    """pg_decode_rows, then (lists) the scan of the counts into offsets and pg_copy_strings, as
    io/postgres/decode_device.py runs them on one chunk."""
    import cupy

    from pystrom.kernels import launch

    buf, offsets = _rows(fields)
    n = len(fields)
    dbuf, doffs = cupy.asarray(buf), cupy.asarray(offsets)
    chunks = cupy.asarray(np.array([dbuf.data.ptr, doffs.data.ptr, 0], dtype=np.int64))
    errors = cupy.zeros((1, 3), dtype=np.int64)
    ddesc = cupy.asarray(target.desc())
    args = (chunks, np.int32(1), np.int64(n), ddesc, np.int32(1))
    launch("pg_decode", "pg_decode_rows", 0, n, (*args, errors))
    if not target.dim:
        g = Target.GUARD
        seg = target.raw_offsets[g + 1 : g + n + 1]
        seg[...] = cupy.cumsum(seg, dtype=cupy.int64).astype(cupy.int32)
        launch("pg_decode", "pg_copy_strings", 0, n, (*args, errors))
    code, row, _ = errors.get()[0].tolist()
    return code, row


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("element", list(ELEMENTS))
@pytest.mark.parametrize("dim", [0, 5])
def test_gpu_decoder_equals_the_cpu_twin(element, dim):
    import cupy

    rows = _sample(element, np.random.default_rng(11), 3000, dim)
    fields = [_array(r, element) for r in rows]
    m = _count(rows) if not dim else len(rows) * dim
    cpu = Target(element, len(rows), m, dim)
    assert _decode_cpu(fields, cpu) == (0, 0)
    gpu = Target(element, len(rows), m, dim, xp=cupy)
    assert _decode_gpu(fields, gpu) == (0, 0)
    assert gpu.lists() == cpu.lists() == rows
    assert gpu.guards_intact()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("lie", list(LIES))
def test_gpu_decoder_refuses_lying_arrays_as_the_twin_does(lie):
    import cupy

    forged, dim, failure = LIES[lie]
    fields = [_array(r, "int4") for r in _GOOD]
    fields[2] = _array(_GOOD[2], "int4", **forged)
    gpu = Target("int4", 4, 12, dim, xp=cupy)
    assert _decode_gpu(fields, gpu) == (failure, 2) == _decode_cpu(fields, Target("int4", 4, 12, dim))
    assert gpu.guards_intact()


@pytest.mark.gpu
@needs_gpu
def test_gpu_decoder_survives_random_array_bytes():
    import cupy

    rng = np.random.default_rng(19)
    good = [_array(r, "int2") for r in _sample("int2", rng, 64)]
    for trial in range(300):
        fields = list(good)
        for _ in range(int(rng.integers(1, 3))):
            i = int(rng.integers(0, len(fields)))
            f = bytearray(fields[i] or _array([1], "int2"))
            j = int(rng.integers(0, max(1, len(f) - 3)))
            if rng.random() < 0.5:  # a value byte, mostly: still a valid array
                f[j] = int(rng.integers(0, 256))
            else:
                f[j : j + 4] = struct.pack(">i", int(rng.choice([-1, 0, 1, 2, 3, 1000, 2**31 - 1])))[: len(f) - j]
            fields[i] = bytes(f)
        for dim in (0, 3):
            cpu = Target("int2", len(fields), 200, dim)
            gpu = Target("int2", len(fields), 200, dim, xp=cupy)
            code, _ = _decode_gpu(fields, gpu)
            assert gpu.guards_intact(), (trial, dim)
            # the twin agrees on what is valid (the first failing row may differ: threads race) and on the values
            assert (code == 0) == (_decode_cpu(fields, cpu)[0] == 0), (trial, dim)
            if code == 0:
                assert gpu.lists() == cpu.lists()
