"""Table behaviour: properties, column access, zero-copy views, to_array, filter, devices, lifetime."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pystrom
from pystrom import Table
from pystrom.testing import assert_same_on_all_devices, assert_tables_equal

from datagen import TYPES, make_sliced


def _ptr(xp, arr) -> int:
    return int(arr.data.ptr) if xp.__name__ == "cupy" else int(arr.ctypes.data)


def _sample(device, n=1000):
    rng = np.random.default_rng(1)
    return Table.from_arrays(
        {
            "x": rng.standard_normal(n),
            "y": rng.standard_normal(n),
            "z": rng.standard_normal(n),
            "k": np.arange(n, dtype=np.int32),
            "s": [f"s{i}" if i % 5 else None for i in range(n)],
            "flag": rng.random(n) < 0.5,
        },
        device=device,
    )


def test_properties(device):
    t = _sample(device)
    assert t.num_rows == len(t) == 1000
    assert t.num_columns == 6
    assert t.column_names == ["x", "y", "z", "k", "s", "flag"]
    assert t.schema.field("flag").type == pa.bool_()
    assert t.device == ("cpu" if device == "cpu" else "cuda:0")
    assert t.nbytes == 3 * 8000 + 4000 + 4004 + t.column("s").data.size + 125 + 1000
    assert "x" in t and "nope" not in t
    assert t.column(0).name == "x" and t.column(-1).name == "flag"


def test_a_table_is_not_iterable_and_says_so(device):
    """Python iterated a Table through table[0], table[1], ... (ColumnNotFoundError 'got 0'); iterating the names
    instead made np.asarray(table) and pandas.DataFrame(table) silently arrays of names. So iter() refuses."""
    from collections.abc import Iterable

    t = _sample(device)
    with pytest.raises(TypeError, match="'Table' object is not iterable"):
        iter(t)
    with pytest.raises(TypeError, match="not iterable"):
        list(t)
    assert not isinstance(t, Iterable)
    with pytest.raises(TypeError):
        np.asarray(t)
    with pytest.raises(TypeError, match="got one Table"):
        pystrom.concat(t)
    assert "x" in t and t.column_names[0] == "x"  # the names as ever


def test_columns_are_zero_copy_views_inside_the_allocation(device, xp):
    t = _sample(device)
    block = t._block
    for name in ["x", "k", "flag"]:
        arr = t[name]
        assert isinstance(arr, xp.ndarray)
        ptr = _ptr(xp, arr)
        assert block.ptr <= ptr and ptr + arr.nbytes <= block.ptr + block.nbytes
        assert ptr % 64 == 0
    col = t.column("s")
    for buf in (col.offsets, col.data, col.validity):
        assert block.ptr <= _ptr(xp, buf) < block.ptr + block.nbytes
        assert _ptr(xp, buf) % 64 == 0
    # writes through the array are visible through the table: it is the same memory
    t["x"][0] = 42.0
    assert float(t["x"][0]) == 42.0 and t.to_arrow().column("x")[0].as_py() == 42.0
    if device != "cpu":
        assert t["x"].__cuda_array_interface__["data"][0] == _ptr(xp, t["x"])


def test_bool_is_one_byte_per_value(device):
    t = Table.from_arrays({"b": [True, False, True]}, device=device)
    assert t["b"].dtype == np.bool_ and t["b"].nbytes == 3
    assert t.to_arrow().column("b").to_pylist() == [True, False, True]


def test_to_array_of_adjacent_float_columns_is_a_zero_copy_fortran_view(device, xp):
    t = _sample(device)
    arr = t.to_array(["x", "y", "z"])
    assert arr.shape == (1000, 3) and arr.dtype == np.float64
    assert _ptr(xp, arr) == _ptr(xp, t["x"])
    assert arr.strides[0] == 8 and arr.strides[1] >= 8000
    expected = np.stack([t.column(c).to_numpy() for c in "xyz"], axis=1)
    np.testing.assert_array_equal(arr.get() if device != "cpu" else arr, expected)
    # the view shares memory: writing through it changes the column
    arr[5, 1] = -1.0
    assert float(t["y"][5]) == -1.0
    # when the column size is a multiple of 64 bytes the view is exactly Fortran-contiguous
    u = Table.from_arrays({"a": np.ones(64), "b": np.zeros(64)}, device=device)
    assert u.to_array().flags.f_contiguous


def test_to_array_gathers_when_not_equally_spaced_or_cast(device, xp):
    t = _sample(device)
    arr = t.to_array(["z", "x", "y"])  # reversed order: a copy
    assert arr.flags.f_contiguous and _ptr(xp, arr) != _ptr(xp, t["z"])
    mixed = t.to_array(["x", "k"], dtype="float32")
    assert mixed.dtype == np.float32 and mixed.flags.f_contiguous
    np.testing.assert_allclose(pystrom.testing.to_host(mixed[:, 1]), np.arange(1000, dtype=np.float32))
    bools = t.to_array(["flag"], dtype="float64")
    assert set(np.unique(pystrom.testing.to_host(bools))) <= {0.0, 1.0}


def test_to_array_with_nulls(device):
    t = Table.from_arrays(
        {
            "a": pa.array([1.0, None, 3.0, 4.0]),
            "b": pa.array([1.0, 2.0, None, 4.0]),
            "c": np.arange(4, dtype=np.float64),
        },
        device=device,
    )
    with pytest.raises(pystrom.NullValuesError, match="'a' \\(1\\).*'b' \\(1\\)"):
        t.to_array()
    nan = pystrom.testing.to_host(t.to_array(nulls="nan"))
    np.testing.assert_array_equal(nan, [[1, 1, 0], [np.nan, 2, 1], [3, np.nan, 2], [4, 4, 3]])
    dropped = pystrom.testing.to_host(t.to_array(nulls="drop"))
    np.testing.assert_array_equal(dropped, [[1, 1, 0], [4, 4, 3]])
    with pytest.raises(pystrom.NullValuesError, match="floating-point"):
        Table.from_arrays({"i": pa.array([1, None])}, device=device).to_array(nulls="nan")
    # a slice without NULLs is fine
    assert t.slice(3, 1).to_array().shape == (1, 3)


def test_to_array_of_decimals_needs_a_float_dtype(device):
    from decimal import Decimal

    t = Table.from_arrays(
        {"d": pa.array([Decimal("1.25"), Decimal("-3.50"), Decimal("1e20")], pa.decimal128(38, 2))}, device=device
    )
    with pytest.raises(pystrom.UnsupportedTypeError, match="dtype='float64'"):
        t.to_array()
    np.testing.assert_allclose(pystrom.testing.to_host(t.to_array(dtype="float64"))[:, 0], [1.25, -3.5, 1e20])


def test_select_and_slice_are_views(device, xp):
    t = _sample(device)
    s = t.select(["z", "x"])
    assert s.column_names == ["z", "x"] and _ptr(xp, s["x"]) == _ptr(xp, t["x"])
    v = t.slice(10, 20)
    assert v.num_rows == 20 and _ptr(xp, v["x"]) == _ptr(xp, t["x"]) + 80
    assert t.slice(990, 100).num_rows == 10 and t.slice(5000).num_rows == 0
    assert_tables_equal(t[["k", "s"]].slice(3, 4), t.to_arrow().select(["k", "s"]).slice(3, 4))


def test_filter(device):
    t = _sample(device)
    mask = np.arange(1000) % 3 == 0
    expected = t.to_arrow().filter(pa.array(mask))
    assert_tables_equal(t.filter(mask), expected)
    assert_tables_equal(t.filter(list(mask)), expected)
    assert_tables_equal(t.filter(pa.array(mask)), expected)
    assert_tables_equal(t.filter("flag"), t.to_arrow().filter(t.to_arrow().column("flag")))
    assert t.filter(np.zeros(1000, dtype=bool)).num_rows == 0
    f = t.filter(mask)
    assert f._block is not t._block
    # filtering a slice (odd offset) keeps validity and strings right
    v = t.slice(3, 500)
    m = np.arange(500) % 2 == 1
    assert_tables_equal(v.filter(m), v.to_arrow().filter(pa.array(m)))


def test_filter_with_null_mask_drops_rows(device):
    t = Table.from_arrays({"a": [1, 2, 3], "m": pa.array([True, None, True])}, device=device)
    assert t.filter(t.to_arrow().column("m")).to_arrow().column("a").to_pylist() == [1, 3]
    assert t.filter("m").to_arrow().column("a").to_pylist() == [1, 3]


def test_backends_agree_on_operations():
    source = pa.table({k: make_sliced(t, 333, nulls=True, seed=i) for i, (k, t) in enumerate(TYPES.items())})
    mask = np.random.default_rng(0).random(333) < 0.4

    def run(device):
        t = Table.from_arrow(source, device=device)
        return [
            t.filter(mask),
            t.slice(17, 100).filter(mask[17:117]),
            t.to_array(["float64"], nulls="nan"),
            t.to_array(["int8", "int16", "uint8"], dtype="int32", nulls="drop"),
            t.column("string").null_count,
        ]

    assert_same_on_all_devices(run)


def test_to_other_device_and_back(device):
    t = _sample(device)
    cpu = t.to("cpu")
    assert cpu.device == "cpu"
    assert_tables_equal(cpu, t)
    back = cpu.to(device)
    assert_tables_equal(back, t)
    assert t.to(device) is t
    assert_tables_equal(t.slice(7, 300).to("cpu"), t.to_arrow().slice(7, 300))


def test_from_arrays_inputs(device, xp):
    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])
    t = Table.from_arrays(
        {
            "masked": masked,
            "list": [1, None, 3],
            "strings": np.array(["a", "bb", "ccc"]),
            "dates": np.array(["2020-01-01", "2021-06-30", "1969-12-31"], dtype="datetime64[D]"),
            "ts": np.array(["2020-01-01T00:00:01.5"] * 3, dtype="datetime64[us]"),
            "device": xp.arange(3, dtype=xp.float32),
            "big_endian": np.array([1, 2, 3], dtype=">i4"),
            "pa": pa.array([True, None, False]),
        },
        device=device,
    )
    arrow = t.to_arrow()
    assert arrow.column("masked").to_pylist() == [1.0, None, 3.0]
    assert arrow.column("list").to_pylist() == [1, None, 3]
    assert arrow.column("strings").to_pylist() == ["a", "bb", "ccc"]
    assert arrow.schema.field("dates").type == pa.date32()
    assert arrow.schema.field("ts").type == pa.timestamp("us")
    assert arrow.column("device").to_pylist() == [0.0, 1.0, 2.0]
    assert arrow.schema.field("device").type == pa.float32()
    assert arrow.column("big_endian").to_pylist() == [1, 2, 3]
    assert arrow.column("pa").to_pylist() == [True, None, False]


def test_empty_tables(device):
    t = Table.from_arrays({}, device=device)
    assert t.num_rows == 0 and t.num_columns == 0 and t.to_arrow().num_columns == 0
    rows_only = Table.from_arrow(pa.table({"a": [1, 2, 3]}).select([]), device=device)
    assert rows_only.num_rows == 3 and rows_only.to_arrow().num_rows == 3
    e = Table.from_arrays({"x": np.array([], dtype=np.float64), "s": pa.array([], pa.string())}, device=device)
    assert e.num_rows == 0 and e.to_array(["x"]).shape == (0, 1)
    assert e.filter(np.array([], dtype=bool)).num_rows == 0


def test_close_and_context_manager(device):
    with Table.from_arrays({"x": np.arange(10.0)}, device=device) as t:
        view = t.slice(2, 3)
        arr = t["x"]
        col = t.column("x")
    assert t.closed
    with pytest.raises(pystrom.ClosedError):
        t["x"]
    with pytest.raises(pystrom.ClosedError):
        t.num_rows
    with pytest.raises(pystrom.ClosedError, match="closed table"):
        col.values
    t.close()  # idempotent
    assert "closed" in repr(t)
    # views and arrays taken before close keep the memory alive and valid
    assert pystrom.testing.to_host(view["x"]).tolist() == [2.0, 3.0, 4.0]
    assert float(arr[9]) == 9.0


def _memory_probe(device):
    """A function telling whether a table's memory is still allocated."""
    if device == "cpu":
        refs = []

        def track(table):
            refs.append(weakref.ref(table._block.memory.base))  # the ndarray that owns the bytes

        return track, lambda: refs[-1]() is not None
    import cupy

    pool = cupy.get_default_memory_pool()
    gc.collect()
    baseline = pool.used_bytes()
    return (lambda table: None), lambda: pool.used_bytes() > baseline


def test_memory_is_released_on_close_and_on_gc(device):
    track, allocated = _memory_probe(device)
    t = Table.from_arrays({"x": np.arange(100_000.0)}, device=device)
    track(t)
    assert allocated()
    t.close()
    gc.collect()
    assert not allocated()
    t = Table.from_arrays({"x": np.arange(100_000.0)}, device=device)
    track(t)
    view = t.slice(1, 2)
    del t
    gc.collect()
    assert allocated()  # the view keeps its parent's memory alive
    del view
    gc.collect()
    assert not allocated()


def test_repr_and_html(device):
    t = _sample(device)
    text = repr(t)
    assert "1,000 rows x 6 columns" in text and t.device in text and "s: string" in text and "200 nulls" in text
    assert "... 990 more rows" in text
    html = t._repr_html_()
    assert "<table>" in html and "flag" in html and "1,000 rows" in html
    with pystrom.defaults.set(repr_rows=2):
        assert "... 998 more rows" in repr(t)
    assert "more rows" not in repr(t.slice(0, 3))
    assert repr(t.column("s")).startswith("<pystrom.Column 's': string")


@given(
    values=st.lists(st.integers(-(10**38) + 1, 10**38 - 1) | st.integers(-(2**64), 2**64), min_size=1, max_size=20),
    scale=st.integers(0, 38),
)
def test_property_decimal_to_float_matches_python(values, scale):
    from decimal import Context, Decimal

    exact = [Decimal(v).scaleb(-scale, context=Context(prec=60)) for v in values]
    arrow = pa.array(exact, pa.decimal128(38, scale))
    expected = np.array([float(d) for d in exact])
    got = pystrom.testing.assert_same_on_all_devices(
        lambda device: Table.from_arrays({"d": arrow}, device=device).to_array(dtype="float64")[:, 0]
    )
    np.testing.assert_allclose(got, expected, rtol=1e-15)


def test_head_and_shape(device):
    t = _sample(device)
    assert t.shape == (1000, 6) and t.slice(990).shape == (10, 6) and t.select(["x"]).shape == (1000, 1)
    h = t.head(3)
    assert h.shape == (3, 6) and h._block is t._block  # a view
    assert_tables_equal(h, t.to_arrow().slice(0, 3))
    assert t.head().num_rows == 5 and t.head(10**9).num_rows == 1000 and t.head(0).shape == (0, 6)
    for bad in (-1, 2.0, True, "3"):
        with pytest.raises(ValueError, match="head"):
            t.head(bad)


def test_to_array_promotes_like_numpy_without_dtype(device):
    t = Table.from_arrays(
        {
            "age": np.array([30, 70, 50], dtype=np.int32),
            "bmi": np.array([31.5, 22.0, 27.25]),
            "flag": np.array([True, False, True]),
            "i8": np.array([-1, 2, 3], dtype=np.int8),
            "u64": np.array([1, 2, 2**63], dtype=np.uint64),
            "f32": np.array([0.5, 1.5, 2.5], dtype=np.float32),
        },
        device=device,
    )
    host = pystrom.testing.to_host
    arr = t.to_array(["age", "bmi"])  # used to raise until dtype= was given
    assert arr.dtype == np.float64
    np.testing.assert_array_equal(host(arr), [[30, 31.5], [70, 22.0], [50, 27.25]])
    for names in (["flag", "i8"], ["age", "i8"], ["i8", "u64"], ["age", "f32"], ["flag", "f32"], ["age", "u64"]):
        want = np.result_type(*(t.column(n).dtype for n in names))
        got = t.to_array(names)
        assert got.dtype == want, names
        np.testing.assert_array_equal(host(got), np.column_stack([host(t[n]) for n in names]).astype(want))


def test_repr_shows_dates_beyond_pythons_datetime_as_stored_values(device, monkeypatch):
    """Valid Arrow data (any int64 of microseconds, any int32 of days) that datetime cannot hold."""
    monkeypatch.setenv("COLUMNS", "200")  # the three long cells side by side, none elided
    big = np.iinfo(np.int64).max
    arrow = pa.table(
        {
            "ts": pa.array([big, -(2**62), 0], pa.timestamp("us")),
            "d": pa.array([2**31 - 1, None, 0], pa.date32()),
            "ns": pa.array([big, 0, None], pa.timestamp("ns", tz="UTC")),
        }
    )
    t = Table.from_arrow(arrow, device=device)
    text = repr(t)
    assert f"<{big} us from 1970: beyond Python's datetime>" in text
    assert f"<{-(2**62)} us from 1970" in text and f"<{2**31 - 1} days from 1970" in text
    assert "1970-01-01 00:00:00" in text and "2262-04-11 23:47:16.854775807" in text  # in range: as before
    assert f"{big} us from 1970" in t._repr_html_()


def _wide(device, columns=32, rows=100):
    rng = np.random.default_rng(2)
    data = {f"feature_{i}": rng.standard_normal(rows) for i in range(columns - 2)}
    data["label"] = pa.array([None if i % 7 == 0 else i % 2 for i in range(rows)])
    data["name"] = [f"row {i}" for i in range(rows)]
    return Table.from_arrays(data, device=device)


@pytest.mark.parametrize("width", [100, 60, 200])
def test_repr_of_a_wide_table_fits_the_terminal(device, monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    t = _wide(device)
    lines = repr(t).splitlines()
    assert lines[0].startswith("pystrom.Table: 100 rows x 32 columns")
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    schema = lines[1 : lines.index("----")]
    assert len(schema) <= 5  # folded: not 32 lines
    assert "feature_0: double" in schema[0] and "name: string" in schema[-1] and "label: int64 (15 nulls)" in schema[-1]
    folded = any("more columns (table.schema lists all)" in line for line in schema)
    assert folded == (width < 200)  # 200 characters hold all 32 entries in 4 lines
    header = lines[lines.index("----") + 1].split()
    assert header[0] == "feature_0" and header[-1] == "name" and "…" in header  # first and last columns, elided middle
    assert len(header) < 32
    rows = lines[lines.index("----") + 2 : -1]
    assert len(rows) == 10 and all(r.split()[-2:] == ["row", str(i)] for i, r in enumerate(rows))
    assert lines[-1] == "... 90 more rows"


def test_repr_folds_nothing_when_everything_fits(device, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    t = _wide(device, columns=12)
    text = repr(t)
    assert "…" not in text and all(f"feature_{i}" in text.splitlines()[-2 - 10] for i in range(10))
    narrow = t.select(["feature_0", "label", "name"])
    assert repr(narrow).splitlines()[1:4] == ["  feature_0: double", "  label: int64 (15 nulls)", "  name: string"]


def test_repr_of_thousands_of_columns_stays_short(device, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    t = _wide(device, columns=2000, rows=3)
    lines = repr(t).splitlines()
    assert len(lines) <= 12 and all(len(line) <= 120 for line in lines)
    assert "1,993 more columns" in lines[3] or any("more columns" in line for line in lines)
    assert lines[lines.index("----") + 1].split()[-1] == "name"


def test_html_of_a_wide_table_shows_the_first_and_last_ten_columns(device):
    t = _wide(device)
    html = t._repr_html_()
    assert html.count("<th>") == 21 and "<th>…</th>" in html and html.count("<td>…</td>") == 10
    assert "feature_9<br>" in html and "feature_10<br>" not in html and "feature_22<br>" in html
    assert "label<br><small>int64 · 15 nulls</small>" in html and "32 columns" in html
    narrow = t.select([f"feature_{i}" for i in range(20)])._repr_html_()
    assert narrow.count("<th>") == 20 and "…</th>" not in narrow


def test_repr_shows_timestamps_uuids_and_decimals_whole(monkeypatch):
    import decimal
    import uuid

    monkeypatch.setenv("COLUMNS", "200")  # the four long cells side by side, none elided

    ts = pa.array([1_700_000_000_123_456_789], pa.timestamp("ns", tz="Europe/Paris"))
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    arrow = pa.table(
        {
            "ts": ts,
            "id": pa.array([u.bytes], pa.uuid()) if hasattr(pa, "uuid") else pa.array([u.bytes], pa.binary(16)),
            "d": pa.array([decimal.Decimal("-12345678901234567890.123456")], pa.decimal128(38, 6)),
            "memo": ["x" * 100],
        }
    )
    text = repr(Table.from_arrow(arrow, device="cpu"))
    assert str(ts[0].as_py()) in text  # 2023-11-14 23:13:20.123456789+01:00, not cut
    assert "-12345678901234567890.123456" in text
    if hasattr(pa, "uuid"):
        assert str(u) in text
    assert "x" * 39 + "…" in text and "x" * 41 not in text  # free text is still cut
    html = Table.from_arrow(arrow, device="cpu")._repr_html_()
    assert str(ts[0].as_py()) in html
