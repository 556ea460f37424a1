"""Predicate.may_match: batch skipping from min/max statistics. Never a false "no"; "no" where it is plain."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from where_gen import data, expected_mask, predicates

from pystrom.expr import compile_where

SCHEMA = pa.schema(
    {
        "x": pa.float64(),
        "y": pa.float64(),
        "z": pa.float64(),
        "a": pa.int64(),
        "u": pa.uint64(),
        "memo": pa.string(),
        "f": pa.bool_(),
        "ts": pa.timestamp("us"),
        "d": pa.date32(),
    }
)
SEED = "sqrt((x-200)^2 + (y-300)^2 + (z-400)^2) < 10"


def may(text: str, **stats: tuple) -> bool:
    return compile_where(text, SCHEMA).may_match(stats)


def test_seed_query_skips_far_batches() -> None:
    assert not may(SEED, x=(0.0, 100.0))
    assert not may(SEED, x=(195.0, 205.0), y=(0.0, 280.0))
    assert may(SEED, x=(195.0, 205.0), y=(295.0, 305.0), z=(395.0, 405.0))
    assert may(SEED, x=(0.0, 1000.0))
    assert may(SEED)  # nothing known: may match
    assert not may(SEED, x=(210.01, 300.0))
    assert may(SEED, x=(209.99, 300.0))
    assert not may("sqrt(x) < 0 or sqrt(x) > 2", x=(-5.0, 4.0))


def test_like_prefix_and_strings() -> None:
    assert not may("memo like 'abc%'", memo=("abd", "abz"))
    assert not may("memo like 'abc%'", memo=("a", "abb"))
    assert may("memo like 'abc%'", memo=("abb", "abd"))
    assert may("memo like 'abc%'", memo=("abc", "abc"))
    assert may("memo like 'abc%'", memo=("abcz", "b"))
    assert may("memo like '%abcd%'", memo=("x", "y"))  # no prefix: nothing known
    assert not may("memo like 'abc'", memo=("abd", "abz"))
    assert may("memo not like 'abc%'", memo=("abc", "abd"))
    assert may("memo ilike 'ABC%'", memo=("abd", "abz"))
    assert not may("memo = 'k'", memo=("a", "j"))
    assert may("memo = 'k'", memo=("a", "z"))
    assert not may("memo in ('k', 'zz')", memo=("a", "j"))
    assert not may("memo != 'k'", memo=("k", "k"))
    assert may("memo like 'ab%'", memo=(b"\xff", b"\xff"))  # undecodable bytes: unknown


def test_numbers_bools_and_constants() -> None:
    assert not may("a = 5", a=(1, 4))
    assert may("a = 5", a=(1, 5))
    assert not may("a in (1, 2)", a=(5, 9))
    assert not may("a between 10 and 20", a=(21, 30))
    assert may("a not between 10 and 20", a=(15, 30))
    assert not may("a not between 10 and 20", a=(12, 18))
    assert not may("not (a > 5)", a=(6, 10))  # an int cannot be NaN
    assert may("not (x > 5)", x=(6.0, 10.0))  # a NaN row makes x > 5 false, so NOT true
    assert not may("x > 5", x=(1.0, 5.0))
    assert not may("x + a > 100", x=(0.0, 10.0), a=(0, 50))
    assert may("x + a > 100", x=(0.0, 10.0), a=(0, 95))
    assert not may("a ^ 2 < 0", a=(-3, 3))  # x^2 is x*x: its interval starts at 0
    assert not may("abs(a) > 10", a=(-10, 10))
    assert not may("-a > 3", a=(-3, 10))
    assert not may("floor(x) = 3", x=(4.0, 5.0))
    assert not may("exp(x) > 1", x=(-5.0, -1.0))
    assert may("exp(x) > 1", x=(-5.0, 0.0001))
    assert not may("log(x) > 1", x=(0.5, 2.0))
    assert not may("log(x) > 1", x=(-1.0, 2.0))
    assert may("log(x) < -100", x=(-1.0, 2.0))
    assert not may("a / 2 > 10", a=(0, 19))
    assert may("a / x > 10", a=(0, 19), x=(-1.0, 1.0))  # divisor may be 0 (NULL) or tiny
    assert may("a % 7 = 3", a=(0, 1))  # % is not analysed: unknown
    assert not may("f", f=(False, False))
    assert may("f", f=(False, True))
    assert not may("not f", f=(True, True))
    assert may("f is null", f=(True, True))
    assert may("a is not null", a=(1, 1))
    assert not may("1 = 0")
    assert not may("null")
    assert not may("a = null", a=(1, 2))
    assert may("true or a > 100", a=(1, 2))
    assert not may("a > 100 and x < 0", a=(1, 200), x=(1.0, 2.0))
    assert may("a > 100 or x < 0", a=(1, 200), x=(1.0, 2.0))
    assert not may("u > 18446744073709551614", u=(0, 5))
    assert may("u > 18446744073709551614", u=(0, 2**64 - 1))
    assert may("u > -1", u=(0, 0))
    assert may("a > 1", a=(None, None))  # unknown bounds
    assert may("x > 1", x=(math.nan, math.nan))
    assert not may("a + 1 > 9223372036854775806", a=(0, 10))
    assert may("a + 1 < 0", a=(0, 2**63 - 1))  # int64 wraps: the overflow case may match


def test_temporal_ranges() -> None:
    us = lambda s: int((dt.datetime.fromisoformat(s) - dt.datetime(1970, 1, 1)).total_seconds()) * 10**6  # noqa: E731
    q = "ts between '2024-01-01' and '2024-01-02 12:00'"
    assert not may(q, ts=(us("2024-02-01 00:00:00"), us("2024-03-01 00:00:00")))
    assert may(q, ts=(us("2023-12-31 00:00:00"), us("2024-01-01 00:00:00")))
    assert not may(q, ts=(us("2024-01-02 12:00:01"), us("2024-01-03 00:00:00")))
    days = (dt.date(2024, 3, 1) - dt.date(1970, 1, 1)).days
    assert not may("d < '2024-03-01'", d=(days, days + 10))
    assert may("d <= '2024-03-01'", d=(days, days + 10))
    assert not may("d < '2024-03-01 00:00:00.5'", d=(days + 1, days + 10))
    assert may("d < '2024-03-01 00:00:00.5'", d=(days, days + 10))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(table=data(), pred=predicates)
def test_never_prunes_a_matching_batch(table: pa.Table, pred) -> None:
    text, ref = pred
    stats = {}
    for name in table.column_names:
        mm = pc.min_max(table[name]).as_py()
        if mm["min"] is not None:
            stats[name] = (mm["min"], mm["max"])
    p = compile_where(text, table.schema)
    if expected_mask(ref, table).any():
        assert p.may_match(stats), (text, stats)


def test_pruning_is_exact_on_sorted_batches() -> None:
    # a file sorted by ts cut into batches: the batches may_match keeps are exactly those with a match
    n, per = 10_000, 500
    ts = np.arange(n, dtype=np.int64) * 60 * 10**6  # one row a minute from 1970
    text = "ts between '1970-01-02 00:00' and '1970-01-02 06:00'"
    p = compile_where(text, SCHEMA)
    kept = [k for k in range(0, n, per) if p.may_match({"ts": (int(ts[k]), int(ts[min(k + per, n) - 1]))})]
    lo, hi = 24 * 60 * 60 * 10**6, 30 * 60 * 60 * 10**6
    wanted = [k for k in range(0, n, per) if ((ts[k : k + per] >= lo) & (ts[k : k + per] <= hi)).any()]
    assert kept == wanted and 0 < len(kept) < n // per


@pytest.mark.parametrize("stats", [{"a": (1, 2)}, {}, {"nope": (1, 2)}])
def test_stats_for_other_columns_are_ignored(stats: dict) -> None:
    assert may("x > 1", **stats)


def test_bad_statistics_are_refused_clearly() -> None:
    from pystrom.errors import UnsupportedTypeError

    p = compile_where("a > 1 and memo = 'x' and ts > '2024-01-01'", SCHEMA)
    with pytest.raises(UnsupportedTypeError, match="statistics for column 'a' must be a \\(min, max\\) pair, got 5"):
        p.may_match({"a": 5})
    with pytest.raises(UnsupportedTypeError, match="statistics for column 'a' \\(int64\\) must be ints, got '1'"):
        p.may_match({"a": ("1", "2")})
    with pytest.raises(UnsupportedTypeError, match="column 'memo' \\(string\\) must be str, got 3"):
        p.may_match({"memo": (3, 4)})
    with pytest.raises(UnsupportedTypeError, match="column 'ts' \\(timestamp\\[us\\]\\) must be ints \\(us since"):
        p.may_match({"ts": (dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2))})
    with pytest.raises(UnsupportedTypeError, match="needs a mapping"):
        p.may_match([("a", (1, 2))])  # type: ignore[arg-type]
    # NumPy scalars are fine, so are None bounds and statistics of columns the predicate does not read
    assert not p.may_match({"a": (np.int64(-5), np.int64(1)), "zzz": ("q", 1)})
    assert p.may_match({"a": (None, None), "memo": None})
