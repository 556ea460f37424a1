"""The polars-named Table operations against polars and pyarrow, on random data with NULLs, on both backends.

sort, sort_by, unique, Column.unique, Column.value_counts, fill_null, drop_nulls, describe. Every random
table carries a row id column (``rid``), so a result is compared row for row: the same rows in the
same order (this is what shows a sort is stable, or which duplicate was kept). Tables are sliced
before use, so that columns start mid-buffer (string offsets not rebased, bitmaps mid-byte).
"""

from __future__ import annotations

import datetime
import math
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import Table
from pystrom.errors import ColumnNotFoundError, InvalidArgumentError, SchemaMismatchError, UnsupportedTypeError
from pystrom.testing import assert_tables_equal

try:  # the reference of most tests here; the GPU machine has none, and the cross-device tests need none
    import polars as pl
except ImportError:
    pl = None
needs_polars = pytest.mark.skipif(pl is None, reason="polars is not installed (pip install polars)")


HYPOTHESIS = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Values chosen to collide: few distinct integers, floats with NaN, -0.0, inf; strings sharing long prefixes
# (more than one 7-byte chunk) and differing in length only, non-ASCII, empty.
_INTS = st.none() | st.integers(-3, 3) | st.sampled_from([-(2**63), 2**63 - 1])
_FLOATS = st.none() | st.sampled_from([0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan, 1e300])
_PREFIX = "abcdefghijklmnopq"
_STRINGS = st.none() | st.sampled_from(
    ["", "a", "b", "ab", "é", "z\x00", _PREFIX, _PREFIX + "r", _PREFIX[:14], _PREFIX[:7]]
)
_BOOLS = st.none() | st.booleans()
_DATES = st.none() | st.integers(-5, 5)

COLUMNS = {"i": _INTS, "f": _FLOATS, "s": _STRINGS, "b": _BOOLS, "d": _DATES}
TYPES = {"i": pa.int64(), "f": pa.float64(), "s": pa.string(), "b": pa.bool_(), "d": pa.date32()}


@st.composite
def tables(draw, max_rows: int = 30) -> tuple[pa.Table, int]:
    """(a pyarrow table with the columns above and ``rid``, rows to slice off the front)."""
    n = draw(st.integers(0, max_rows))
    skip = draw(st.integers(0, 9))
    data = {k: draw(st.lists(s, min_size=n + skip, max_size=n + skip)) for k, s in COLUMNS.items()}
    arrays = {k: pa.array(v, pa.int32()).cast(TYPES[k]) if k == "d" else pa.array(v, TYPES[k]) for k, v in data.items()}
    arrays["rid"] = pa.array(np.arange(n + skip, dtype=np.int64) - skip)
    return pa.table(arrays), skip


def _load(arrow: pa.Table, skip: int, device: str) -> tuple[Table, pa.Table]:
    """The pystrom view (sliced) and the pyarrow table it holds."""
    return Table.from_arrow(arrow, device=device).slice(skip), arrow.slice(skip)


def _same(a: list, b: list) -> bool:
    """Equal lists where NaN equals NaN (and -0.0 equals 0.0, as ==)."""
    return len(a) == len(b) and all(
        (x is None and y is None) or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        or x == y for x, y in zip(a, b)
    )  # fmt: skip


def _rids(table) -> list[int]:
    arrow = table.to_arrow() if isinstance(table, Table) else table
    return arrow.column("rid").to_pylist()


# -- sort ---------------------------------------------------------------------------------------------

sort_keys = st.lists(st.sampled_from(list(COLUMNS)), min_size=1, max_size=3, unique=True)


@needs_polars
@HYPOTHESIS
@given(data=tables(), keys=sort_keys, flags=st.data())
def test_sort_matches_polars(device, data, keys, flags):
    arrow, skip = data
    t, expected_source = _load(arrow, skip, device)
    descending = flags.draw(st.booleans() | st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)))
    nulls_last = flags.draw(st.booleans() | st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)))
    got = t.sort(keys, descending=descending, nulls_last=nulls_last)
    want = pl.from_arrow(expected_source).sort(keys, descending=descending, nulls_last=nulls_last, maintain_order=True)
    assert _rids(got) == want["rid"].to_list()
    assert got.schema == expected_source.schema


@HYPOTHESIS
@given(data=tables(), keys=sort_keys, flags=st.data())
def test_sort_by_matches_pyarrow(device, data, keys, flags):
    arrow, skip = data
    t, source = _load(arrow, skip, device)
    orders = st.sampled_from(["ascending", "descending"])
    sorting = [(k, flags.draw(orders), *flags.draw(st.sampled_from([(), ("at_start",), ("at_end",)]))) for k in keys]
    got = t.sort_by(sorting)
    assert _rids(got) == _rids(source.sort_by(sorting))


@needs_polars
def test_sort_of_every_orderable_type_matches_pyarrow(device):
    rng = np.random.default_rng(3)
    n = 300
    picks = rng.integers(0, 6, n)
    words = [b"", b"\x00", b"abcdefgh", b"abcdefghi", b"\xff" * 9, b"abc"]
    cols = {
        "dec": pa.array(
            [None if p == 5 else (Decimal(int(p) - 2) / 7).quantize(Decimal("1e-6")) for p in picks],
            pa.decimal128(20, 6),
        ),
        "fsb": pa.array([None if p == 0 else bytes([p, 255 - p]) * 5 for p in picks], pa.binary(10)),
        "bin": pa.array([None if p == 1 else words[p] for p in picks], pa.binary()),
        "ts": pa.array([None if p == 2 else int(p) * 10**6 for p in picks], pa.timestamp("us", tz="UTC")),
        "u8": pa.array([None if p == 3 else 250 + int(p) for p in picks], pa.uint8()),
        "f16": pa.array(np.where(picks == 4, np.nan, picks - 2).astype(np.float16)),
        "rid": pa.array(np.arange(n)),
    }
    arrow = pa.table(cols)
    t = Table.from_arrow(arrow, device=device)
    for name in ["dec", "fsb", "bin", "ts", "u8"]:
        for order in ["ascending", "descending"]:
            for placement in ["at_start", "at_end"]:
                key = [(name, order, placement), ("u8", "ascending")] if name != "u8" else [(name, order, placement)]
                assert _rids(t.sort_by(key)) == _rids(arrow.sort_by(key)), (name, order, placement)
                if name != "u8":  # the keyword sets every key's placement
                    assert _rids(t.sort_by(key, null_placement="at_start")) == _rids(
                        arrow.sort_by([(k[0], k[1], "at_start") for k in key])
                    )
    # float16 widens to float32 for the sort; polars has no float16: compare with float32
    as32 = pl.from_arrow(arrow.set_column(5, "f16", arrow.column("f16").cast(pa.float32())))
    assert _rids(t.sort("f16", "rid", descending=True)) == as32.sort("f16", "rid", descending=True)["rid"].to_list()


@needs_polars
def test_sort_long_strings_with_shared_prefixes(device):
    rng = np.random.default_rng(5)
    base = "x" * 40
    values = [base + "".join(rng.choice(list("ab"), rng.integers(0, 12))) for _ in range(500)]
    values[::7] = [base] * len(values[::7])
    arrow = pa.table({"s": values, "rid": np.arange(500)})
    got = Table.from_arrow(arrow, device=device).sort("s", descending=True)
    assert _rids(got) == pl.from_arrow(arrow).sort("s", descending=True, maintain_order=True)["rid"].to_list()


def test_sort_refusals(device):
    t = Table.from_arrays({"a": [2, 1], "l": pa.array([[1], [2, 3]]), "iv": pa.array([(1, 2, 3), None],
                          pa.month_day_nano_interval())}, device=device)  # fmt: skip
    with pytest.raises(ColumnNotFoundError, match="'nope'"):
        t.sort("nope")
    with pytest.raises(UnsupportedTypeError, match="'l'.*lists"):
        t.sort("l")
    with pytest.raises(UnsupportedTypeError, match="'iv'.*no order"):
        t.sort("iv")
    with pytest.raises(InvalidArgumentError, match="descending has 1 entries for 2"):
        t.sort("a", "a", descending=[True])
    with pytest.raises(InvalidArgumentError, match="nulls_last"):
        t.sort("a", nulls_last="yes")
    with pytest.raises(InvalidArgumentError, match="at_end"):
        t.sort_by("a", null_placement="end")
    with pytest.raises(InvalidArgumentError, match="tuple"):
        t.sort_by([("a", "up")])
    with pytest.raises(InvalidArgumentError, match="tuple"):
        t.sort_by([("a", "ascending", "middle")])
    with pytest.raises(InvalidArgumentError, match="at least one"):
        t.sort([])
    assert t.sort("a", maintain_order=True, multithreaded=False).to_arrow().column("a").to_pylist() == [1, 2]


def test_sort_of_empty_and_columnless_tables(device):
    t = Table.from_arrays({"a": pa.array([], pa.int64()), "s": pa.array([], pa.string())}, device=device)
    assert t.sort("s", "a").num_rows == 0
    assert t.sort_by("a").schema == t.schema


# -- unique and value_counts ----------------------------------------------------------------------------


@needs_polars
@HYPOTHESIS
@given(data=tables(), subset=st.none() | sort_keys, keep=st.sampled_from(["first", "last", "none"]))
def test_unique_rows_match_polars(device, data, subset, keep):
    arrow, skip = data
    t, source = _load(arrow, skip, device)
    frame = pl.from_arrow(source.drop_columns(["rid"]) if subset is None else source)
    cols = subset if subset is not None else [c for c in COLUMNS]
    if subset is None:  # rid would make every row unique: compare the rows themselves
        got = t.drop("rid").unique(keep=keep, maintain_order=True)
        want = frame.unique(keep=keep, maintain_order=True)
        for c in cols:
            assert _same(got.to_arrow().column(c).to_pylist(), want[c].to_list()), c
        return
    got = t.unique(subset, keep=keep, maintain_order=True)
    assert _rids(got) == frame.unique(subset, keep=keep, maintain_order=True)["rid"].to_list()
    unordered = t.unique(subset, keep="any")
    assert sorted(_rids(unordered)) == sorted(_rids(t.unique(subset, keep="first")))


@needs_polars
@HYPOTHESIS
@given(data=tables(), name=st.sampled_from(list(COLUMNS)))
def test_column_unique_and_value_counts_match_polars(device, data, name):
    arrow, skip = data
    t, source = _load(arrow, skip, device)
    series = pl.from_arrow(source).get_column(name)
    col = t.column(name)
    assert _same(col.unique(maintain_order=True).to_arrow().to_pylist(), series.unique(maintain_order=True).to_list())
    assert _same(col.unique().to_arrow().to_pylist(), series.unique().sort(nulls_last=False).to_list())
    got = col.value_counts().to_arrow()
    want = series.value_counts()
    expected = {_key(v): c for v, c in zip(want[name].to_list(), want["count"].to_list())}
    assert {_key(v): c for v, c in zip(got.column(name).to_pylist(), got.column("count").to_pylist())} == expected
    assert (
        got.schema.field("count").type == pa.int64() and got.schema.field(name).type == source.schema.field(name).type
    )
    by_count = col.value_counts(sort=True, normalize=True, name="p").to_arrow()
    shares = by_count.column("p").to_pylist()
    assert shares == sorted(shares, reverse=True)
    assert all(math.isclose(s, expected[_key(v)] / len(t)) for v, s in zip(by_count.column(name).to_pylist(), shares))


def _key(v):
    """A dict key for a value: NaN as one key, -0.0 as 0.0."""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else v + 0.0
    return v


def test_unique_of_strings_and_other_types_matches_pyarrow(device):
    rng = np.random.default_rng(9)
    words = ["", "a", "ab", "abcdefghijklmn", "abcdefghijklmno", None]
    arrow = pa.table({
        "s": [words[i] for i in rng.integers(0, 6, 400)],
        "bin": pa.array([None if i == 0 else bytes([i]) * i for i in rng.integers(0, 5, 400)], pa.binary()),
        "dec": pa.array([None if i == 0 else Decimal(int(i)) for i in rng.integers(0, 4, 400)], pa.decimal128(9, 2)),
        "ts": pa.array(rng.integers(0, 3, 400) * 10**9, pa.timestamp("ns")),
    })  # fmt: skip
    t = Table.from_arrow(arrow, device=device)
    for name in arrow.column_names:
        got = t.column(name).unique(maintain_order=True).to_arrow()
        assert got.equals(pc.unique(arrow.column(name))), name
        counts = t.column(name).value_counts().to_arrow()
        want = pc.value_counts(arrow.column(name)).to_pylist()
        assert sorted(zip(counts.column(name).to_pylist(), counts.column("count").to_pylist()), key=repr) == sorted(
            ((d["values"], d["counts"]) for d in want), key=repr
        )


def test_unique_and_value_counts_refusals(device):
    t = Table.from_arrays({"count": [1, 1, 2], "x": [1, 2, 2]}, device=device)
    with pytest.raises(SchemaMismatchError, match="name="):
        t.column("count").value_counts()
    assert t.column("count").value_counts(name="n").to_arrow().column("n").to_pylist() == [2, 1]
    with pytest.raises(InvalidArgumentError, match="keep"):
        t.unique(keep="middle")
    with pytest.raises(ColumnNotFoundError, match="'y'"):
        t.unique("y")
    with pytest.raises(InvalidArgumentError, match="sort"):
        t.column("x").value_counts(sort="yes")
    empty = t.slice(3)
    assert empty.column("x").unique().to_arrow().to_pylist() == []
    assert empty.column("x").value_counts(normalize=True).num_rows == 0
    for keep in ["first", "last", "any", "none"]:
        assert empty.unique(keep=keep).num_rows == 0 and empty.unique("x", keep=keep, maintain_order=True).num_rows == 0


# -- fill_null and drop_nulls -------------------------------------------------------------------------


@needs_polars
@HYPOTHESIS
@given(data=tables(), strategy=st.sampled_from(["forward", "backward", "min", "max", "zero", "one"]),
       limit=st.none() | st.integers(0, 3))  # fmt: skip
def test_fill_null_strategies_match_polars(device, data, strategy, limit):
    arrow, skip = data
    t, source = _load(arrow, skip, device)
    limit = limit if strategy in ("forward", "backward") else None
    applies = ["i", "f", "b"] + (["s", "d"] if strategy in ("forward", "backward", "min", "max") else [])
    got = t.fill_null(strategy=strategy, limit=limit).to_arrow()
    want = pl.from_arrow(source.select(applies)).fill_null(strategy=strategy, limit=limit)
    for name in applies:
        assert _same(got.column(name).to_pylist(), want[name].to_list()), name
    for name in set(COLUMNS) - set(applies):
        assert got.column(name).equals(source.column(name)), name  # a strategy that does not apply leaves it
    assert got.schema == source.schema


@needs_polars
@HYPOTHESIS
@given(data=tables())
def test_fill_null_mean_matches_polars(device, data):
    arrow, skip = data
    t, source = _load(arrow, skip, device)
    got = t.fill_null(strategy="mean").to_arrow()
    frame = pl.from_arrow(source)
    assert _same(got.column("f").to_pylist(), frame.select("f").fill_null(strategy="mean")["f"].to_list())
    if all(abs(v) < 2**52 for v in source.column("i").drop_null().to_pylist()):  # polars panics near 2**63
        assert got.column("i").to_pylist() == frame.select("i").fill_null(strategy="mean")["i"].to_list()
    else:  # the mean of values near the limits, rounded in float64, stays inside the type
        assert got.column("i").null_count == (source.column("i").null_count if len(source) == source.column(
            "i").null_count else 0)  # fmt: skip
    assert got.column("s").equals(source.column("s")) and got.column("b").equals(source.column("b"))


@needs_polars
@HYPOTHESIS
@given(data=tables(), value=st.sampled_from([0, -7, 2.5, True, "fill", datetime.date(2020, 1, 2)]))
def test_fill_null_value_matches_polars_for_the_columns_of_its_kind(device, data, value):
    arrow, skip = data
    t, source = _load(arrow, skip, device)
    kinds = {bool: ["b"], int: ["i", "f"], float: ["f"], str: ["s"], datetime.date: ["d"]}[type(value)]
    got = t.fill_null(value).to_arrow()
    want = pl.from_arrow(source.select(kinds)).fill_null(value)
    for name in COLUMNS:
        if name in kinds:
            assert _same(got.column(name).to_pylist(), want[name].to_list()), name
        else:
            assert _same(got.column(name).to_pylist(), source.column(name).to_pylist()), name
    assert got.schema == source.schema


@needs_polars
@HYPOTHESIS
@given(data=tables(), subset=st.none() | sort_keys)
def test_drop_nulls_matches_polars(device, data, subset):
    arrow, skip = data
    t, source = _load(arrow, skip, device)
    assert _rids(t.drop_nulls(subset)) == pl.from_arrow(source).drop_nulls(subset)["rid"].to_list()


@needs_polars
def test_fill_null_every_type_and_one_column(device):
    arrow = pa.table({
        "dec": pa.array([Decimal("1.50"), None, Decimal("-2.25")], pa.decimal128(9, 2)),
        "bin": pa.array([b"x", None, b"yz"]),
        "fsb": pa.array([None, b"ab", b"cd"], pa.binary(2)),
        "lst": pa.array([[1, 2], None, [3]], pa.list_(pa.int32())),
        "u8": pa.array([None, 1, 2], pa.uint8()),
        "ts": pa.array([None, 5, 6], pa.timestamp("ms", tz="UTC")),
    })  # fmt: skip
    t = Table.from_arrow(arrow, device=device)
    assert t.fill_null(strategy="backward").to_arrow().to_pydict() == pl.from_arrow(arrow).fill_null(
        strategy="backward").to_arrow().cast(arrow.schema).to_pydict()  # fmt: skip
    assert t.fill_null(strategy="max").to_arrow().column("bin").to_pylist() == [b"x", b"yz", b"yz"]
    filled = t.fill_null(Decimal("0.5")).to_arrow()
    assert filled.column("dec").to_pylist() == [Decimal("1.50"), Decimal("0.50"), Decimal("-2.25")]
    assert t.fill_null(b"zz").to_arrow().column("fsb").to_pylist() == [b"zz", b"ab", b"cd"]
    assert t.fill_null(pa.scalar(9, pa.uint8())).to_arrow().column("u8").to_pylist() == [9, 1, 2]
    assert t.fill_null(7).to_arrow().column("u8").to_pylist() == [7, 1, 2]
    assert t.fill_null(strategy="min").to_arrow().column("ts").to_pylist()[0] == arrow.column("ts")[1].as_py()
    # one column: Column.fill_null, then with_columns puts it back
    col = t.column("u8").fill_null(strategy="zero")
    assert col.type == pa.uint8() and col.to_arrow().to_pylist() == [0, 1, 2] and col.null_count == 0
    back = t.with_columns(u8=col).to_arrow()
    assert back.column_names == arrow.column_names and back.column("u8").to_pylist() == [0, 1, 2]


def test_fill_null_refusals(device):
    t = Table.from_arrays({"u8": pa.array([None, 1], pa.uint8()), "s": ["a", None], "b": [True, None]}, device=device)
    with pytest.raises(InvalidArgumentError, match="'u8'.*uint8.*300"):
        t.fill_null(300)
    with pytest.raises(InvalidArgumentError, match="value or a strategy"):
        t.fill_null()
    with pytest.raises(InvalidArgumentError, match="not both"):
        t.fill_null(0, strategy="zero")
    with pytest.raises(InvalidArgumentError, match="strategy must be one of"):
        t.fill_null(strategy="median")
    with pytest.raises(InvalidArgumentError, match="limit applies only"):
        t.fill_null(strategy="min", limit=2)
    with pytest.raises(InvalidArgumentError, match="limit must be"):
        t.fill_null(strategy="forward", limit=-1)
    with pytest.raises(InvalidArgumentError, match="cannot fill with a list"):
        t.fill_null([1])
    with pytest.raises(UnsupportedTypeError, match="'s'.*'mean'"):
        t.column("s").fill_null(strategy="mean")
    with pytest.raises(UnsupportedTypeError, match="'b'.*1.5"):
        t.column("b").fill_null(1.5)
    with pytest.raises(ColumnNotFoundError, match="'zz'"):
        t.drop_nulls("zz")
    # nothing to fill or drop: views of the table
    assert t.fill_null(2.5)._block is t._block and t.drop_nulls([])._block is t._block
    # an all-NULL column has no min, max or mean: it stays NULL
    nulls = Table.from_arrays({"x": pa.array([None, None], pa.int64())}, device=device)
    assert nulls.fill_null(strategy="max").to_arrow().column("x").null_count == 2


def test_gathers_past_int32_offsets_are_refused_naming_the_column(device, monkeypatch):
    """Rows taken more than once (a broadcast value, a forward fill) can give a string or list column more
    bytes or elements than its int32 offsets address: CapacityError naming it, not offsets that wrap. The
    limit is lowered here; at 2**31 - 1 the same check stands before the offsets are written."""
    import pystrom._ops

    monkeypatch.setattr(pystrom._ops, "OFFSET_LIMIT", 20)
    t = Table.from_arrays({"x": np.arange(10)}, device=device)
    fits = t.head(5).with_columns(s=pa.scalar("abcd"))  # 20 bytes
    assert fits.to_arrow().column("s").to_pylist() == ["abcd"] * 5
    with pytest.raises(pystrom.CapacityError, match=r"column 's' would hold 40 bytes.*2\*\*31 - 1"):
        t.with_columns(s=pa.scalar("abcd"))
    lists = Table.from_arrays({"l": pa.array([[1, 2, 3, 4, 5], None, None, None, None], pa.list_(pa.int64()))},
                              device=device)  # fmt: skip
    assert lists.head(4).fill_null(strategy="forward").to_arrow().column("l").to_pylist() == [[1, 2, 3, 4, 5]] * 4
    with pytest.raises(pystrom.CapacityError, match="column 'l' would hold 25 elements"):
        lists.fill_null(strategy="forward")


def test_null_array_error_names_the_one_call_ways(device):
    t = Table.from_arrays({"x": [1.0, None]}, device=device)
    with pytest.raises(pystrom.NullValuesError) as err:
        t["x"]
    for way in ["fill_null(", "drop_nulls('x')", "to_array(['x'], nulls="]:
        assert way in str(err.value)
    assert t.fill_null(0.0)["x"].tolist() == [1.0, 0.0] and t.drop_nulls("x")["x"].tolist() == [1.0]
    assert t.column("x").is_null().tolist() == [False, True] and t.column("x").is_not_null().tolist() == [True, False]
    assert t.filter("x is not null").num_rows == 1  # the expression language says it too


# -- describe -----------------------------------------------------------------------------------------


@needs_polars
@HYPOTHESIS
@given(data=tables(), interpolation=st.sampled_from(["nearest", "lower", "higher", "midpoint", "linear"]),
       percentiles=st.sampled_from([(0.25, 0.5, 0.75), (0.1, 0.999), 0.5, None]))  # fmt: skip
def test_describe_matches_polars(device, data, interpolation, percentiles):
    arrow, skip = data
    numeric = ["i", "f", "b", "rid"]
    t, source = _load(arrow, skip, device)
    got = t.describe(percentiles, interpolation=interpolation).to_arrow()
    want = pl.from_arrow(source.select(numeric)).describe(percentiles, interpolation=interpolation)
    assert got.column_names == ["statistic", *numeric]  # the string and date columns are left out
    assert got.column("statistic").to_pylist() == want["statistic"].to_list()
    for name in numeric:
        # sums in float64 in another order: differences up to a few ulps of the largest value, times the rows
        finite = [abs(float(v)) for v in source.column(name).drop_null().to_pylist() if math.isfinite(float(v))]
        tolerance = 8 * np.finfo(float).eps * max(finite, default=0.0) * max(len(finite), 1)
        for stat, a, b in zip(want["statistic"], got.column(name).to_pylist(), want[name].to_list()):
            # linear percentiles: polars finds the position past the NULLs (nulls + q * (n - 1)), whose fraction
            # can differ from q * (n - 1)'s in the last bit
            interpolated = stat.endswith("%") and interpolation == "linear"
            inexact = stat in ("mean", "std") or interpolated
            if inexact and a is not None and b is not None and not (math.isnan(a) and math.isnan(b)):
                assert math.isclose(a, b, rel_tol=1e-9, abs_tol=tolerance) or a == b, (name, stat, a, b)
            else:
                assert _same([a], [b]), (name, stat, a, b)


@needs_polars
@pytest.mark.parametrize("interpolation", ["nearest", "lower", "higher", "midpoint", "linear"])
def test_describe_of_infinities_and_nan_matches_polars(device, interpolation):
    inf, nan = math.inf, math.nan
    for values in (
        [inf, inf],
        [-inf, 0.0],
        [0.0, inf],
        [-inf, inf],
        [1.0, nan],
        [nan, nan],
        [-0.0, 0.0],
        [1e308, 1.7e308],
    ):
        arrow = pa.table({"f": pa.array(values, pa.float64())})
        got = Table.from_arrow(arrow, device=device).describe([0.25, 0.5], interpolation=interpolation).to_arrow()
        want = pl.from_arrow(arrow).describe([0.25, 0.5], interpolation=interpolation)["f"].to_list()
        assert _same(got.column("f").to_pylist(), want), (values, got.column("f").to_pylist(), want)


def test_describe_decimals_and_refusals(device):
    t = Table.from_arrays({"d": pa.array([Decimal("1.5"), None, Decimal("-2.25")], pa.decimal128(9, 2)),
                           "s": ["a", "b", "c"]}, device=device)  # fmt: skip
    got = t.describe().to_arrow().to_pydict()
    assert got["d"] == [2.0, 1.0, -0.375, pytest.approx(2.651650429449553), -2.25, -2.25, 1.5, 1.5, 1.5]
    assert t.describe().device == t.device
    with pytest.raises(UnsupportedTypeError, match="numeric and bool.*'s' \\(string\\)"):
        t.select(["s"]).describe()
    with pytest.raises(SchemaMismatchError, match="statistic"):
        Table.from_arrays({"statistic": [1]}, device=device).describe()
    with pytest.raises(InvalidArgumentError, match="interpolation"):
        t.describe(interpolation="cubic")
    with pytest.raises(InvalidArgumentError, match="percentile"):
        t.describe([1.5])


# -- rename, drop, tail -------------------------------------------------------------------------------


def test_rename_drop_and_tail_are_views(device):
    t = Table.from_arrays({"a": [1, 2, 3], "b": ["x", None, "z"], "c": [0.5, 1.5, 2.5]}, device=device).slice(1)
    r = t.rename({"a": "b", "b": "a"})
    assert r.column_names == ["b", "a", "c"] and r._block is t._block
    assert r.to_arrow().column("a").to_pylist() == [None, "z"] and r.column("a").null_count == 1
    assert t.rename(str.upper).column_names == ["A", "B", "C"]
    assert t.rename({"zz": "y"}, strict=False).column_names == t.column_names
    with pytest.raises(ColumnNotFoundError, match="'zz'.*strict=False"):
        t.rename({"zz": "y"})
    with pytest.raises(SchemaMismatchError, match="'c'"):
        t.rename({"a": "c"})
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        t.rename({"a": ""})
    d = t.drop("b", ["c"])
    assert d.column_names == ["a"] and d._block is t._block and d.to_arrow().column("a").to_pylist() == [2, 3]
    assert t.drop("zz", strict=False).column_names == ["a", "b", "c"]
    with pytest.raises(ColumnNotFoundError, match="'zz'"):
        t.drop("zz")
    assert_tables_equal(t.tail(1), t.to_arrow().slice(1))
    assert t.tail(10).num_rows == 2 and t.tail(0).num_rows == 0 and t.tail()._block is t._block
    with pytest.raises(ValueError, match="tail"):
        t.tail(-1)
    # a renamed table is a table like any other: exported, filtered, sorted under its new names
    assert r.filter("c > 2").to_arrow().column("b").to_pylist() == [3]
    assert r.sort("a", nulls_last=True).to_arrow().column("a").to_pylist() == ["z", None]


def test_operations_agree_across_devices():
    arrow = pa.table({"i": [3, None, 1, 3], "s": ["b", None, "a", "b"], "f": [0.5, float("nan"), None, 0.5]})

    def run(device):
        t = Table.from_arrow(arrow, device=device)
        return [
            t.sort("s", "f", descending=[True, False]),
            t.sort_by([("f", "descending")]),
            t.unique(),
            t.column("s").value_counts(sort=True),
            t.fill_null(strategy="forward"),
            t.drop_nulls(),
            t.describe(),
        ]

    pystrom.testing.assert_same_on_all_devices(run)
