"""The Arrow IPC file writer (pystrom.io.arrow.write.writer) and the statistics reader (pystrom.io.arrow.file.stats).

Files are checked with pyarrow's own reader: equal data, every buffer on a 64-byte file offset,
statistics visible as PG-Strom's keys, and stats that round-trip against pyarrow.compute.min_max.
"""

from __future__ import annotations

import decimal
import math
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pystrom
from pystrom.io.arrow.file.stats import STRING_STATS_MAX_BYTES, batch_stats
from pystrom.io.arrow.write.writer import WriteSummary, write_ipc_file

from datagen import TYPES, make_array, make_sliced

ALL_TYPES = {**TYPES, "large_string": pa.large_string(), "large_binary": pa.large_binary()}
ODD_LENGTHS = [9, 0, 1, 7, 8, 13, 64, 65, 1000, 3]


def _array(t: pa.DataType, n: int, nulls: bool, seed: int, offset: int) -> pa.Array:
    if t in (pa.large_string(), pa.large_binary()):
        small = pa.string() if t == pa.large_string() else pa.binary()
        return make_array(small, n + offset + 2, nulls, seed).cast(t).slice(offset, n)
    return make_sliced(t, n, nulls, seed, offset=offset)


def _batches(schema: pa.Schema, lengths: list[int], nulls: bool = True) -> list[pa.RecordBatch]:
    out = []
    for i, n in enumerate(lengths):
        cols = [_array(f.type, n, nulls and i % 3 != 1, seed=17 * i + j, offset=i % 11) for j, f in enumerate(schema)]
        out.append(pa.RecordBatch.from_arrays(cols, schema=schema))
    return out


def _read(path) -> pa.Table:
    with ipc.open_file(path) as r:
        return r.read_all()


def _buffer_offsets(path) -> list[tuple[int, int, int, int]]:
    """(batch, column, file offset, size) of every non-empty buffer, as pyarrow maps them."""
    out = []
    with pa.memory_map(str(path)) as m:
        whole = m.read_buffer()
        base, size = whole.address, whole.size
        m.seek(0)
        r = ipc.open_file(m)
        for i in range(r.num_record_batches):
            batch = r.get_batch(i)
            for j, col in enumerate(batch.columns):
                arr = col.storage if isinstance(col, pa.ExtensionArray) else col
                for buf in arr.buffers():
                    if buf is not None and buf.size:
                        assert base <= buf.address < base + size, "buffer not inside the mapped file"
                        out.append((i, j, buf.address - base, buf.size))
    return out


# ---------------------------------------------------------------------------------------------------
# data round trip


@pytest.mark.parametrize("nulls", [False, True], ids=["dense", "nulls"])
@pytest.mark.parametrize("name", list(ALL_TYPES))
def test_every_type_round_trips_sliced_and_aligned(tmp_path, name, nulls):
    schema = pa.schema([pa.field("c", ALL_TYPES[name]), pa.field("i", pa.int32())])
    batches = _batches(schema, ODD_LENGTHS, nulls)
    assert any(b.column(0).offset % 8 for b in batches), "inputs must be sliced at odd offsets"
    path = tmp_path / f"{name}.arrow"
    summary = write_ipc_file(path, schema, iter(batches))
    back = _read(path)
    assert back.schema.field("c").type == ALL_TYPES[name]
    assert back.equals(pa.Table.from_batches(batches, schema))
    assert summary == WriteSummary(str(path), sum(ODD_LENGTHS), len(ODD_LENGTHS), os.path.getsize(path))
    offsets = _buffer_offsets(path)
    assert offsets, "the file has data buffers"
    assert [o for o in offsets if o[2] % 64] == []
    # a Feather v2 reader agrees, and so does reading each batch on its own
    assert feather.read_table(path).equals(back)
    with ipc.open_file(path) as r:
        for i, b in enumerate(batches):
            assert r.get_batch(i).equals(b)


def test_all_types_in_one_file_many_batches(tmp_path):
    schema = pa.schema([pa.field(n, t) for n, t in ALL_TYPES.items()])
    lengths = [(i * 37) % 101 for i in range(60)]
    batches = _batches(schema, lengths)
    path = tmp_path / "all.arrow"
    write_ipc_file(path, schema, (b for b in batches))
    assert _read(path).equals(pa.Table.from_batches(batches, schema))
    offsets = _buffer_offsets(path)
    assert len(offsets) > 60 * len(schema)
    assert all(o[2] % 64 == 0 for o in offsets)
    with ipc.open_file(path) as r:
        assert r.num_record_batches == 60


def test_zero_batches_and_empty_batches(tmp_path):
    schema = pa.schema([("a", pa.int64()), ("s", pa.string()), ("b", pa.bool_())])
    path = tmp_path / "none.arrow"
    summary = write_ipc_file(path, schema, [])
    assert (summary.num_rows, summary.num_batches) == (0, 0)
    with ipc.open_file(path) as r:
        assert r.num_record_batches == 0
        assert r.schema.equals(schema)
        assert r.read_all().num_rows == 0
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    path2 = tmp_path / "empty.arrow"
    write_ipc_file(path2, schema, [empty, empty])
    with ipc.open_file(path2) as r:
        assert r.num_record_batches == 2
        assert r.get_batch(1).equals(empty)
        assert r.get_batch_with_custom_metadata(0).custom_metadata is None  # no stats for no rows


def test_all_null_and_bit_offsets(tmp_path):
    # Validity bitmaps and bool values cut at every bit offset 0..15 must come out shifted to bit 0.
    base = pa.array([None if i % 3 == 0 else (i % 2 == 0) for i in range(40)], pa.bool_())
    ints = pa.array([None if i % 5 == 0 else i for i in range(40)], pa.int16())
    schema = pa.schema([("b", pa.bool_()), ("i", pa.int16()), ("n", pa.float64())])
    batches = [
        pa.RecordBatch.from_arrays([base.slice(k, 17), ints.slice(k, 17), pa.nulls(17, pa.float64())], schema=schema)
        for k in range(16)
    ]
    path = tmp_path / "bits.arrow"
    write_ipc_file(path, schema, batches)
    assert _read(path).equals(pa.Table.from_batches(batches, schema))


def test_metadata_kept_and_stale_footer_stats_dropped(tmp_path):
    schema = pa.schema(
        [
            pa.field("a", pa.int64(), metadata={"unit": "m", "min_values": "0", "max_values": "1"}),
            pa.field("u", pa.uuid(), nullable=False, metadata={"note": "id"}),
            pa.field("t", pa.timestamp("ms", tz="Asia/Tokyo")),
        ],
        metadata={"origin": "test"},
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([5, 7], pa.int64()),
            pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"a" * 16, b"b" * 16], pa.binary(16))),
            pa.array([0, 1], pa.int64()).cast(pa.timestamp("ms", tz="Asia/Tokyo")),
        ],
        schema=schema,
    )
    path = tmp_path / "meta.arrow"
    write_ipc_file(path, schema, [batch], metadata={"writer": "pystrom", "origin": "override"})
    with ipc.open_file(path) as r:
        got = r.schema
        assert got.metadata == {b"origin": b"override", b"writer": b"pystrom"}
        assert got.field("a").metadata == {b"unit": b"m", b"min_values": b"5", b"max_values": b"7"}
        assert got.field("u").type == pa.uuid() and got.field("u").metadata == {b"note": b"id"}
        assert not got.field("u").nullable
        assert got.field("t").type == pa.timestamp("ms", tz="Asia/Tokyo")
        assert r.read_all().equals(pa.Table.from_batches([batch]))
    # with stats off, nothing of the stale lists survives
    write_ipc_file(path, schema, [batch], stats=False)
    with ipc.open_file(path) as r:
        assert r.schema.field("a").metadata == {b"unit": b"m"}
        assert r.get_batch_with_custom_metadata(0).custom_metadata is None


def test_batches_are_streamed_not_held(tmp_path):
    # Each batch allocates ~4 MB from pyarrow's pool; if the writer held them, usage would grow to 80 MB.
    schema = pa.schema([("x", pa.float64())])
    peak = []

    def gen():
        for i in range(20):
            arr = pc.add(pa.array(np.arange(500_000, dtype=np.float64)), i)  # pool-allocated
            peak.append(pa.total_allocated_bytes())
            yield pa.RecordBatch.from_arrays([arr], schema=schema)

    start = pa.total_allocated_bytes()
    write_ipc_file(tmp_path / "s.arrow", schema, gen())
    assert max(peak) - start < 3 * 4_000_000 + 1_000_000


# ---------------------------------------------------------------------------------------------------
# statistics as written


def _meta(batch_with_meta) -> dict[str, str]:
    md = batch_with_meta.custom_metadata
    return {k.decode(): v.decode() for k, v in (md or {}).items()}


def test_stats_visible_in_pg_strom_keys(tmp_path):
    D = decimal.Decimal
    schema = pa.schema(
        [
            ("i", pa.int32()),
            ("f", pa.float32()),
            ("d", pa.decimal128(9, 2)),
            ("ts", pa.timestamp("ns", tz="UTC")),
            ("dt", pa.date32()),
            ("s", pa.string()),
            ("b", pa.bool_()),
            ("bin", pa.binary()),
            ("dur", pa.duration("s")),
        ]
    )
    b0 = pa.RecordBatch.from_pydict(
        {
            "i": [3, None, -7],
            "f": [0.1, 2.5, None],
            "d": [D("1.50"), D("-0.05"), None],
            "ts": pa.array([10**18, None, -5], pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
            "dt": pa.array([19000, 1, None], pa.int32()).cast(pa.date32()),
            "s": ["pear", "apple", None],
            "b": [True, True, None],
            "bin": [b"x", b"y", None],
            "dur": pa.array([4, None, 2], pa.int64()).cast(pa.duration("s")),
        },
        schema=schema,
    )
    b1 = pa.RecordBatch.from_pydict({n: pa.nulls(2, t) for n, t in zip(schema.names, schema.types)}, schema=schema)
    path = tmp_path / "stats.arrow"
    write_ipc_file(path, schema, [b0, b1, b0])
    with ipc.open_file(path) as r:
        m0 = _meta(r.get_batch_with_custom_metadata(0))
        assert m0 == {
            "min_max_stats.i": "-7,3",
            "min_max_stats.f": f"{float(np.float32(0.1))!r},2.5",
            "min_max_stats.d": "-0.05,1.50",
            "min_max_stats.ts": f"-5,{10**18}",
            "min_max_stats.dt": "1,19000",
            "min_max_stats.s": "apple,pear",
            "min_max_stats.b": "1,1",
            "min_max_stats.dur": "2,4",
        }
        assert _meta(r.get_batch_with_custom_metadata(1)) == {}  # all NULL: no statistics
        assert _meta(r.get_batch_with_custom_metadata(2)) == m0
        fields = r.schema
        assert fields.field("i").metadata == {b"min_values": b"-7,null,-7", b"max_values": b"3,null,3"}
        assert fields.field("d").metadata == {b"min_values": b"-5,null,-5", b"max_values": b"150,null,150"}
        bits = struct.unpack("<i", struct.pack("<f", np.float32(0.1)))[0]
        assert fields.field("f").metadata[b"min_values"] == f"{bits},null,{bits}".encode()
        for name in ("s", "b", "bin", "dur"):  # the footer format has no entries for these
            assert fields.field(name).metadata is None
        for i in range(3):
            got = batch_stats(r.schema, i, r.get_batch_with_custom_metadata(i).custom_metadata, num_batches=3)
            if i == 1:
                assert got == {}
            else:
                assert got == {
                    "i": (-7, 3),
                    "f": (float(np.float32(0.1)), 2.5),
                    "d": (-5, 150),
                    "ts": (-5, 10**18),
                    "dt": (1, 19000),
                    "s": ("apple", "pear"),
                    "b": (True, True),
                    "dur": (2, 4),
                }


def test_nan_batches_get_no_float_stats(tmp_path):
    schema = pa.schema([("x", pa.float64()), ("h", pa.float16())])
    nan = float("nan")
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array([1.0, nan, 3.0]), pa.array(np.array([1, np.nan, 2], np.float16))], schema=schema
        ),
        pa.RecordBatch.from_arrays(
            [pa.array([-math.inf, 2.0, None]), pa.array(np.array([0.5, -1.5, 65504], np.float16))], schema=schema
        ),
    ]
    path = tmp_path / "nan.arrow"
    write_ipc_file(path, schema, batches)
    with ipc.open_file(path) as r:
        assert _meta(r.get_batch_with_custom_metadata(0)) == {}
        assert _meta(r.get_batch_with_custom_metadata(1)) == {
            "min_max_stats.x": "-inf,2.0",
            "min_max_stats.h": "-1.5,65504.0",
        }
        assert batch_stats(r.schema, 1, r.get_batch_with_custom_metadata(1).custom_metadata) == {
            "x": (-math.inf, 2.0),
            "h": (-1.5, 65504.0),
        }
        assert r.schema.field("x").metadata[b"min_values"].startswith(b"null,")


def test_uint64_above_int64_gets_no_stats(tmp_path):
    # PG-Strom parses with strtol: 2**64-1 would become 2**63-1 and exclude the row.
    schema = pa.schema([("u", pa.uint64())])
    batches = [pa.record_batch([pa.array([1, 2**64 - 1], pa.uint64())], schema=schema),
               pa.record_batch([pa.array([1, 2**63 - 1], pa.uint64())], schema=schema)]  # fmt: skip
    path = tmp_path / "u.arrow"
    write_ipc_file(path, schema, batches)
    with ipc.open_file(path) as r:
        assert _meta(r.get_batch_with_custom_metadata(0)) == {}
        assert _meta(r.get_batch_with_custom_metadata(1)) == {"min_max_stats.u": f"1,{2**63 - 1}"}


HARD_STRINGS = [
    "a,b",
    ",leading",
    "x" * 40,
    "ü" * 20,
    "€" * 11,
    "nul\0inside",
    "\U0010ffff" * 9,
    "ab+" + "z" * 40,
    "",
    "zz,",
]


@pytest.mark.parametrize("hi", HARD_STRINGS)
@pytest.mark.parametrize("lo", ["", "a,a", "\0", "b" * 50])
def test_string_bounds_are_safe_for_pg_strom(tmp_path, lo, hi):
    schema = pa.schema([("s", pa.string())])
    values = [lo, hi, None]
    batch = pa.record_batch([pa.array(values)], schema=schema)
    path = tmp_path / "s.arrow"
    write_ipc_file(path, schema, [batch])
    true_lo, true_hi = min(lo, hi), max(lo, hi)
    with ipc.open_file(path) as r:
        meta = _meta(r.get_batch_with_custom_metadata(0))
        got = batch_stats(r.schema, 0, r.get_batch_with_custom_metadata(0).custom_metadata)
    if not meta:
        assert true_hi.startswith("\U0010ffff" * 7)  # the only case that gets no bound
        return
    value = meta["min_max_stats.s"]
    # PG-Strom splits at the first comma and keeps 31 bytes of each side, up to a NUL
    smin, smax = value.split(",", 1)
    assert "," not in smax and "\0" not in value
    assert len(smin.encode()) <= STRING_STATS_MAX_BYTES and len(smax.encode()) <= STRING_STATS_MAX_BYTES
    assert smin <= true_lo and smax >= true_hi
    assert smin.encode() <= true_lo.encode() and smax.encode() >= true_hi.encode()
    assert got == {"s": (smin, smax)}
    exact = all(
        len(v.encode()) <= STRING_STATS_MAX_BYTES and "," not in v and "\0" not in v for v in (true_lo, true_hi)
    )
    if exact:
        assert (smin, smax) == (true_lo, true_hi)


def _pg_strom_accepts(kind: str, value: str) -> bool:
    """PG-Strom's per-batch parse: split at the first comma; strtol/strtod must consume each side."""
    lo, sep, hi = value.partition(",")
    if not sep:
        return False
    try:
        if kind == "int":
            return all(-(2**63) <= int(x) < 2**63 for x in (lo, hi)) and all(x.lstrip("-").isdigit() for x in (lo, hi))
        if kind == "float":
            return not any(math.isnan(float(x)) for x in (lo, hi))
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------
# hypothesis: batch_stats round-trips against pyarrow.compute.min_max


def _storage_minmax(t: pa.DataType, arr: pa.Array):
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        arr = arr.view(pa.int64())
    elif pa.types.is_date32(t):
        arr = arr.view(pa.int32())
    mm = pc.min_max(arr)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if pa.types.is_decimal(t):
        lo, hi = (int(v.scaleb(t.scale, context=decimal.Context(prec=80))) for v in (lo, hi))
    return lo, hi


_D = decimal.Decimal
COLUMNS = {
    "i8": (pa.int8(), st.integers(-128, 127)),
    "i64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "u32": (pa.uint32(), st.integers(0, 2**32 - 1)),
    "f64": (pa.float64(), st.floats(allow_nan=False)),
    "f32": (pa.float32(), st.floats(allow_nan=False, width=32)),
    "ts": (pa.timestamp("ns"), st.integers(-(2**63), 2**63 - 1)),
    "d32": (pa.date32(), st.integers(-(2**31), 2**31 - 1)),
    "dec": (
        pa.decimal128(38, 10),
        st.integers(-(10**38) + 1, 10**38 - 1).map(lambda n: _D((n < 0, tuple(map(int, str(abs(n)))), -10))),
    ),
    "s": (pa.string(), st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)),
}


def _typed(t: pa.DataType, values: list) -> pa.Array:
    if pa.types.is_timestamp(t) or pa.types.is_date32(t):
        storage = pa.int64() if pa.types.is_timestamp(t) else pa.int32()
        return pa.array(values, storage).cast(t)
    return pa.array(values, t)


@given(
    data=st.fixed_dictionaries({k: st.lists(st.none() | s, min_size=0, max_size=30) for k, (t, s) in COLUMNS.items()}),
    cuts=st.lists(st.integers(0, 30), max_size=4),
)
def test_batch_stats_round_trip_min_max(tmp_path_factory, data, cuts):
    n = min(len(v) for v in data.values())
    schema = pa.schema([(k, t) for k, (t, _) in COLUMNS.items()])
    table = pa.table({k: _typed(t, data[k][:n]) for k, (t, _) in COLUMNS.items()}, schema=schema)
    bounds = sorted({0, n, *(c for c in cuts if c <= n)})
    batches = [table.slice(a, b - a).to_batches()[0] if b > a else pa.RecordBatch.from_pylist([], schema=schema)
               for a, b in zip(bounds, bounds[1:])] or [pa.RecordBatch.from_pylist([], schema=schema)]  # fmt: skip
    path = tmp_path_factory.mktemp("rt") / "h.arrow"
    write_ipc_file(path, schema, batches)
    with ipc.open_file(path) as r:
        assert r.read_all().equals(pa.Table.from_batches(batches, schema))
        for i, batch in enumerate(batches):
            md = r.get_batch_with_custom_metadata(i).custom_metadata
            got = batch_stats(r.schema, i, md, num_batches=len(batches))
            footer_only = batch_stats(r.schema, i, None, num_batches=len(batches))
            for name, (t, _) in COLUMNS.items():
                col = batch.column(name)
                if col.null_count == len(col):
                    assert name not in got and name not in footer_only
                    continue
                lo, hi = _storage_minmax(t, col)
                if name == "s":
                    slo, shi = got[name]
                    assert slo <= lo and shi >= hi
                    if all(
                        len(v.encode()) <= STRING_STATS_MAX_BYTES and "," not in v and "\0" not in v for v in (lo, hi)
                    ):
                        assert (slo, shi) == (lo, hi)
                    continue
                assert got[name] == (lo, hi), name
                assert type(got[name][0]) is type(lo)
                value = {k.decode(): v.decode() for k, v in md.items()}[f"min_max_stats.{name}"]
                assert _pg_strom_accepts("float" if name.startswith("f") else "int" if name != "dec" else "dec", value)
                if name.startswith("f"):
                    assert name not in footer_only  # footer floats are IEEE bits: not trusted on reading
                else:
                    assert footer_only[name] == (lo, hi), name


# ---------------------------------------------------------------------------------------------------
# hostile statistics


INT_SCHEMA = pa.schema([("a", pa.int8()), ("f", pa.float64()), ("d", pa.decimal128(5, 2)), ("s", pa.string()),
                        ("b", pa.bool_()), ("x", pa.binary())])  # fmt: skip


@pytest.mark.parametrize(
    "key,value",
    [
        ("a", "1"),
        ("a", "1,"),
        ("a", ","),
        ("a", "1,2,3"),
        ("a", "5,1"),
        ("a", "-129,0"),
        ("a", "0,128"),
        ("a", "0x1,0x2"),
        ("a", "1_0,20"),
        ("a", "1.5,2"),
        ("a", "١,٢"),  # Arabic-Indic digits: Python's int() takes them, strtol does not
        ("f", "nan,1"),
        ("f", "1,nan"),
        ("f", "1e400x,2"),
        ("f", "1_0.0,2"),
        ("f", "2,1"),
        ("d", "1e999999999,2"),
        ("d", "-1e999999999,2"),
        ("d", "0,1e40"),
        ("d", "1.2.3,4"),
        ("d", "NaN,1"),
        ("d", "Infinity,1"),
        ("s", "b,a"),
        ("b", "2,1"),
        ("b", "yes,no"),
        ("x", "a,b"),
        ("nope", "1,2"),
    ],
)
def test_malformed_per_batch_stats_give_no_stats(key, value):
    got = batch_stats(INT_SCHEMA, 0, {f"min_max_stats.{key}".encode(): value.encode()})
    assert got == {}


def test_malformed_per_batch_entry_does_not_fall_back_to_footer():
    schema = pa.schema([pa.field("a", pa.int64(), metadata={"min_values": "1", "max_values": "9"})])
    assert batch_stats(schema, 0, None) == {"a": (1, 9)}
    assert batch_stats(schema, 0, {b"min_max_stats.a": b"junk"}) == {}
    assert batch_stats(schema, 0, {b"min_max_stats.a": b"+1,9 "}) == {"a": (1, 9)}


@pytest.mark.parametrize(
    "mins,maxs,index,num_batches",
    [
        ("1,2", "3", 0, None),  # lists of different lengths
        ("1,2", "3,4", 0, 3),  # not one entry per batch
        ("1,2", "3,4", 5, None),  # no entry for this batch
        ("1,2", "3,4", -1, None),
        ("null,2", "null,4", 0, None),
        ("x,2", "3,4", 0, None),
        ("9,2", "3,4", 0, None),
    ],
)
def test_malformed_footer_lists_give_no_stats(mins, maxs, index, num_batches):
    schema = pa.schema([pa.field("a", pa.int64(), metadata={"min_values": mins, "max_values": maxs})])
    assert batch_stats(schema, index, None, num_batches=num_batches) == {}


def test_odd_metadata_containers_do_not_raise():
    schema = pa.schema([("a", pa.int64()), ("a", pa.int32()), ("b", pa.int16())])
    # duplicate column names: a key cannot say which column it means
    assert batch_stats(schema, 0, {b"min_max_stats.a": b"1,2", b"min_max_stats.b": b"1,2"}) == {"b": (1, 2)}
    assert batch_stats(schema, 0, [(b"min_max_stats.b", b"1,2")]) == {}  # not a mapping
    assert batch_stats(schema, 0, {b"min_max_stats.b": b"\xff\xfe"}) == {}  # not UTF-8
    assert batch_stats(schema, 0, {1: 2, None: b"x"}) == {}
    dup = pa.KeyValueMetadata([(b"min_max_stats.b", b"1,2"), (b"min_max_stats.b", b"5,6")])
    assert batch_stats(schema, 0, dup) == {}
    assert batch_stats(schema, 0, None, footer_schema_metadata="garbage") == {}
    assert batch_stats(schema, 0, None, footer_schema_metadata=[None]) == {}


@given(value=st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_fuzzed_stats_never_raise_and_stay_in_range(value):
    schema = pa.schema(
        [pa.field(n, t, metadata={"min_values": value, "max_values": value}) for n, t in
         [("a", pa.int8()), ("f", pa.float32()), ("d", pa.decimal128(5, 2)), ("s", pa.string()),
          ("t", pa.timestamp("s")), ("u", pa.uint16()), ("b", pa.bool_())]]
    )  # fmt: skip
    md = {f"min_max_stats.{n}".encode(): value for n in schema.names}
    for meta in (md, None):
        got = batch_stats(schema, 0, meta)
        for name, (lo, hi) in got.items():
            assert lo <= hi
            if name == "a":
                assert -128 <= lo and hi <= 127
            if name == "u":
                assert 0 <= lo and hi <= 65535
            if name == "d":
                assert abs(lo) < 10**38 and abs(hi) < 10**38
            if name == "f":
                assert not math.isnan(lo) and not math.isnan(hi)


def test_hostile_stats_in_a_file_written_by_pyarrow(tmp_path):
    schema = pa.schema([("a", pa.int32()), ("s", pa.string())])
    path = tmp_path / "hostile.arrow"
    batch = pa.record_batch([pa.array([1, 2], pa.int32()), pa.array(["a", "b"])], schema=schema)
    junk = ["", ",", "9" * 5000, "1,2", "\u202e,\u202e", "-0,-0", "2147483648,1"]
    with ipc.new_file(path, schema) as w:
        for j in junk:
            w.write_batch(batch, custom_metadata={"min_max_stats.a": j, "min_max_stats.s": j})
    expected = [{}, {"s": ("", "")}, {}, {"a": (1, 2), "s": ("1", "2")}, {"s": ("\u202e", "\u202e")},
                {"a": (0, 0), "s": ("-0", "-0")}, {}]  # fmt: skip
    with ipc.open_file(path) as r:
        for i in range(r.num_record_batches):
            got = batch_stats(r.schema, i, r.get_batch_with_custom_metadata(i).custom_metadata)
            assert got == expected[i], junk[i]


# ---------------------------------------------------------------------------------------------------
# errors


def _leftovers(directory) -> list[str]:
    return [p for p in os.listdir(directory) if "pystrom-tmp" in p]


def test_unwritable_paths(tmp_path):
    schema = pa.schema([("a", pa.int64())])
    batch = pa.record_batch([pa.array([1])], schema=schema)
    missing = tmp_path / "no" / "such" / "dir" / "f.arrow"
    with pytest.raises(pystrom.FileError) as info:
        write_ipc_file(missing, schema, [batch])
    assert isinstance(info.value, OSError) and isinstance(info.value, pystrom.Error)
    assert str(missing) in str(info.value) and info.value.filename == str(missing)
    (tmp_path / "adir").mkdir()
    with pytest.raises(pystrom.FileError, match="adir"):
        write_ipc_file(tmp_path / "adir", schema, [batch])
    assert _leftovers(tmp_path) == [] and (tmp_path / "adir").is_dir()


def test_failure_mid_stream_leaves_no_file_and_keeps_the_old_one(tmp_path):
    schema = pa.schema([("a", pa.int64())])
    path = tmp_path / "f.arrow"
    path.write_bytes(b"previous contents")

    def gen():
        yield pa.record_batch([pa.array([1])], schema=schema)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        write_ipc_file(path, schema, gen())
    assert path.read_bytes() == b"previous contents"
    assert _leftovers(tmp_path) == []
    with pytest.raises(pystrom.SchemaMismatchError, match="'b'"):
        write_ipc_file(path, schema, [pa.record_batch([pa.array([1])], names=["b"])])
    with pytest.raises(pystrom.SchemaMismatchError, match="int32"):
        write_ipc_file(path, schema, [pa.record_batch([pa.array([1], pa.int32())], names=["a"])])
    with pytest.raises(pystrom.UnsupportedTypeError, match="Table"):
        write_ipc_file(path, schema, [pa.table({"a": [1]})])
    assert path.read_bytes() == b"previous contents" and _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "t",
    [
        pa.list_(pa.map_(pa.string(), pa.int8())),  # lists of strings and dates, structs: written (test_table_nested)
        pa.struct([("x", pa.int8()), ("d", pa.dictionary(pa.int32(), pa.string()))]),
        pa.dictionary(pa.int32(), pa.string()),
        pa.decimal256(40, 2),
        pa.string_view(),
        pa.null(),
        pa.map_(pa.string(), pa.int8()),
    ],
    ids=str,
)
def test_unsupported_types_are_refused_by_name(tmp_path, t):
    schema = pa.schema([("ok", pa.int8()), ("bad col", t)])
    with pytest.raises(pystrom.UnsupportedTypeError) as info:
        write_ipc_file(tmp_path / "x.arrow", schema, [])
    assert "'bad col'" in str(info.value) and str(t) in str(info.value)
    assert isinstance(info.value, TypeError)
    assert os.listdir(tmp_path) == []


def test_nan_under_a_null_is_not_a_nan(tmp_path):
    # The values buffer holds NaN in a NULL slot: that row does not exist, the range stands.
    values = pa.py_buffer(np.array([np.nan, 1.0, 4.0], dtype=np.float64))
    validity = pa.py_buffer(np.packbits([False, True, True], bitorder="little"))
    arr = pa.Array.from_buffers(pa.float64(), 3, [validity, values], null_count=1)
    schema = pa.schema([("x", pa.float64())])
    path = tmp_path / "n.arrow"
    write_ipc_file(path, schema, [pa.record_batch([arr], schema=schema)])
    with ipc.open_file(path) as r:
        assert _meta(r.get_batch_with_custom_metadata(0)) == {"min_max_stats.x": "1.0,4.0"}


def test_negative_scale_decimal_stats(tmp_path):
    t = pa.decimal128(5, -2)
    schema = pa.schema([("d", t)])
    arr = pa.array([decimal.Decimal("12300"), decimal.Decimal("-500")], t)
    path = tmp_path / "d.arrow"
    write_ipc_file(path, schema, [pa.record_batch([arr], schema=schema)])
    with ipc.open_file(path) as r:
        md = r.get_batch_with_custom_metadata(0).custom_metadata
        assert _meta(r.get_batch_with_custom_metadata(0)) == {"min_max_stats.d": "-500,12300"}
        assert r.schema.field("d").metadata == {b"min_values": b"-5", b"max_values": b"123"}
        assert batch_stats(r.schema, 0, md) == {"d": (-5, 123)}  # unscaled: value * 10**scale
        assert r.read_all().column("d").to_pylist() == arr.to_pylist()


class _Celsius(pa.ExtensionType):
    def __init__(self) -> None:
        super().__init__(pa.float32(), "pystrom.test.celsius")

    def __arrow_ext_serialize__(self) -> bytes:
        return b"unit=C"

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        assert serialized == b"unit=C"
        return cls()


def test_python_extension_type_round_trips_with_stats(tmp_path):
    ext = _Celsius()
    pa.register_extension_type(ext)
    try:
        schema = pa.schema([("c", ext)])
        arr = pa.ExtensionArray.from_storage(ext, pa.array([21.5, None, -3.0], pa.float32()))
        path = tmp_path / "e.arrow"
        write_ipc_file(path, schema, [pa.record_batch([arr], schema=schema)])
        with ipc.open_file(path) as r:
            assert r.schema.field("c").type == ext
            assert r.read_all().column("c").chunk(0).equals(arr)
            md = r.get_batch_with_custom_metadata(0).custom_metadata
            assert batch_stats(r.schema, 0, md) == {"c": (-3.0, 21.5)}
    finally:
        pa.unregister_extension_type("pystrom.test.celsius")


def test_formats_that_disagree_give_no_stats():
    schema = pa.schema([pa.field("a", pa.int64(), metadata={"min_values": "1,5", "max_values": "4,9"})])
    assert batch_stats(schema, 1, {b"min_max_stats.a": b"5,9"}) == {"a": (5, 9)}
    assert batch_stats(schema, 1, {b"min_max_stats.a": b"5,8"}) == {}


def test_footer_stats_can_be_left_out(tmp_path):
    # PG-Strom reads only the footer lists when a file has them; without them it reads the per-batch keys.
    schema = pa.schema([("a", pa.int64()), ("s", pa.string())])
    batch = pa.record_batch([pa.array([2, 1]), pa.array(["b", "a"])], schema=schema)
    path = tmp_path / "v2.arrow"
    write_ipc_file(path, schema, [batch], footer_stats=False)
    with ipc.open_file(path) as r:
        assert all(f.metadata is None for f in r.schema)
        md = r.get_batch_with_custom_metadata(0).custom_metadata
        assert batch_stats(r.schema, 0, md) == {"a": (1, 2), "s": ("a", "b")}


def test_repeated_column_names_get_no_per_batch_keys(tmp_path):
    schema = pa.schema([("a", pa.int64()), ("a", pa.int64()), ("b", pa.int64())])
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), pa.array([7, 8]), pa.array([3, 4])], schema=schema)
    path = tmp_path / "dup.arrow"
    write_ipc_file(path, schema, [batch])
    with ipc.open_file(path) as r:
        assert _meta(r.get_batch_with_custom_metadata(0)) == {"min_max_stats.b": "3,4"}
        assert [f.metadata[b"min_values"] for f in r.schema] == [b"1", b"7", b"3"]  # positional: fine
        assert r.read_all().equals(pa.Table.from_batches([batch]))


def test_malformed_input_arrays_are_refused(tmp_path):
    import nanoarrow as na  # pyarrow refuses to build such arrays; a foreign producer need not

    schema = pa.schema([("s", pa.string())])
    for ends in ([0, 3, 2],):  # decreasing offsets (pyarrow itself refuses first > last)
        offsets = na.c_buffer(np.array(ends, dtype=np.int32))
        bad = pa.array(na.c_array_from_buffers(na.string(), 2, [None, offsets, b"abcde"], validation_level="none"))
        with pytest.raises(pystrom.SchemaMismatchError, match="'s'"):
            write_ipc_file(tmp_path / "bad.arrow", schema, [pa.RecordBatch.from_arrays([bad], schema=schema)])
    assert os.listdir(tmp_path) == []


def test_footer_lists_found_whichever_way_they_are_passed(tmp_path):
    schema = pa.schema([("a", pa.int64())], metadata={"k": "v"})
    path = tmp_path / "f.arrow"
    write_ipc_file(path, schema, [pa.record_batch([pa.array([4, 2])], schema=schema)])
    with ipc.open_file(path) as r:
        footer = r.schema
    bare = pa.schema([("a", pa.int64())])
    for where in (footer, [f.metadata for f in footer]):
        assert batch_stats(bare, 0, None, where, num_batches=1) == {"a": (2, 4)}
    assert batch_stats(footer, 0, None, footer.metadata, num_batches=1) == {"a": (2, 4)}
    assert batch_stats(footer, 0, None, num_batches=2) == {}  # one entry, two batches: not trusted


def test_bad_arguments_are_pystrom_errors(tmp_path):
    schema = pa.schema([("a", pa.int64())])
    with pytest.raises(pystrom.UnsupportedTypeError, match="path"):
        write_ipc_file(None, schema, [])
    with pytest.raises(pystrom.UnsupportedTypeError, match="metadata"):
        write_ipc_file(tmp_path / "x.arrow", schema, [], metadata=[("a", "b")])
    with pytest.raises(pystrom.UnsupportedTypeError, match="Schema"):
        write_ipc_file(tmp_path / "x.arrow", {"a": "int64"}, [])
    with pytest.raises(pystrom.UnsupportedTypeError, match="ChunkedArray"):
        write_ipc_file(tmp_path / "x.arrow", schema, pa.table({"a": [1]}))
    assert os.listdir(tmp_path) == []
