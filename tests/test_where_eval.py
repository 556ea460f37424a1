"""where expressions evaluated on tables (CPU, and GPU through the `device` fixture) against pyarrow.compute."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from where_gen import data, expected_mask, predicates

import pystrom
from pystrom.errors import ColumnNotFoundError, SchemaMismatchError, UnsupportedTypeError
from pystrom.expr import compile_where
from pystrom.testing import to_host


def mask_of(text: str, arrow: pa.Table, device: str, offset: int = 0) -> np.ndarray:
    table = pystrom.Table.from_arrow(arrow, device=device)
    if offset:
        table = table.slice(offset)
    out = compile_where(text, arrow.schema).evaluate(table)
    assert out.dtype == bool and out.shape == (table.num_rows,)
    if device != "cpu":
        import cupy

        assert isinstance(out, cupy.ndarray)
    else:
        assert isinstance(out, np.ndarray)
    return to_host(out)


def points(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x, y, z = (rng.uniform(c - 15, c + 15, n) for c in (200, 300, 400))
    memo = [None if k % 7 == 0 else ("xxabcdyy" if k % 3 == 0 else "abc" + "d" * (k % 2)) for k in range(n)]
    xs = pa.array(x, mask=np.arange(n) % 11 == 5)
    return pa.table({"x": xs, "y": y, "z": z, "memo": pa.array(memo, pa.string())})


@pytest.mark.parametrize("offset", [0, 3, 8, 13])
def test_seed_queries_equal_pyarrow(device: str, offset: int) -> None:
    t = points(2000)
    got = mask_of("sqrt((x-200)^2 + (y-300)^2 + (z-400)^2) < 10", t, device, offset)
    tt = t.slice(offset)
    d = pc.sqrt(
        pc.add(
            pc.add(pc.power(pc.subtract(tt["x"], 200), 2), pc.power(pc.subtract(tt["y"], 300), 2)),
            pc.power(pc.subtract(tt["z"], 400), 2),
        )
    )
    want = pc.fill_null(pc.less(d, 10), False).to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(got, want)
    assert 0 < got.sum() < len(got)
    got = mask_of("memo like '%abcd%'", t, device, offset)
    want = pc.fill_null(pc.match_like(tt["memo"], "%abcd%"), False).to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(got, want)
    assert 0 < got.sum() < len(got)


def test_sphere_boundary_is_bit_identical(device: str) -> None:
    # points within an ulp or so of the sphere |p - c| = 10: a kernel that fused a*b + c into one FMA
    # (or any other rounding difference) would disagree with pyarrow/NumPy on some of them
    rng = np.random.default_rng(11)
    n = 200_000
    v = rng.normal(size=(n, 3))
    v *= (10 * (1 + rng.normal(scale=1e-15, size=n)) / np.linalg.norm(v, axis=1))[:, None]
    t = pa.table({"x": 200 + v[:, 0], "y": 300 + v[:, 1], "z": 400 + v[:, 2]})
    got = mask_of("sqrt((x-200)^2 + (y-300)^2 + (z-400)^2) < 10", t, device)
    d2 = [pc.multiply(pc.subtract(t[c], k), pc.subtract(t[c], k)) for c, k in (("x", 200), ("y", 300), ("z", 400))]
    want = pc.less(pc.sqrt(pc.add(pc.add(d2[0], d2[1]), d2[2])), 10).to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(got, want)
    assert 0.2 < got.mean() < 0.8  # the test data really sits on the boundary


@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(table=data(), pred=predicates, offset=st.integers(0, 9))
def test_random_predicates_equal_pyarrow(device: str, table: pa.Table, pred, offset: int) -> None:
    text, ref = pred
    offset = min(offset, table.num_rows)
    got = mask_of(text, table, device, offset)
    want = expected_mask(ref, table.slice(offset))
    np.testing.assert_array_equal(got, want, err_msg=text)


def test_null_semantics(device: str) -> None:
    t = pa.table({"a": pa.array([1, None, 3, None], pa.int64()), "f": pa.array([True, None, False, None])})
    cases = {
        "a = null": [0, 0, 0, 0],
        "a != null": [0, 0, 0, 0],
        "null": [0, 0, 0, 0],
        "not (a = null)": [0, 0, 0, 0],
        "a > 2 or f": [1, 0, 1, 0],  # NULL or TRUE is TRUE
        "not (a > 2 and f)": [1, 0, 1, 0],  # FALSE and NULL is FALSE
        "a is null": [0, 1, 0, 1],
        "a is not null and not f": [0, 0, 1, 0],
        "f is null or a / 0 is null": [1, 1, 1, 1],  # division by zero is NULL
        "a in (1, null)": [1, 0, 0, 0],
        "a not in (1, null)": [0, 0, 0, 0],  # 3 <> 1 and 3 <> NULL is NULL
        "a not in (1, 2)": [0, 0, 1, 0],
        "a not between 2 and 5": [1, 0, 0, 0],
        "f = true": [1, 0, 0, 0],
        "f != true": [0, 0, 1, 0],
        "true or a = null": [1, 1, 1, 1],
        "false and a / 0 > 1": [0, 0, 0, 0],
    }
    for text, want in cases.items():
        np.testing.assert_array_equal(mask_of(text, t, device), np.array(want, bool), err_msg=text)


def test_integer_arithmetic_rules(device: str) -> None:
    big = 2**63 - 1
    t = pa.table(
        {
            "a": pa.array([7, -7, 7, -7, big, -(2**63), 5, 0], pa.int64()),
            "b": pa.array([2, 2, -2, -2, 1, -1, 0, 0], pa.int64()),
            "s": pa.array([1, 2, 3, 4, 5, 6, 7, 8], pa.int8()),
        }
    )
    a, b = t["a"].to_numpy(), t["b"].to_numpy()
    with np.errstate(all="ignore"):
        checks = {
            "a % b = 1": np.fmod(a, np.where(b == 0, 1, b)) == 1,
            "a % b = -1": (np.fmod(a, np.where(b == 0, 1, b)) == -1) & (b != 0),
            "a % b = 0": (b != 0) & (np.where(b == -1, 0, np.fmod(a, np.where(b == 0, 1, b))) == 0),
            "a % b is null": b == 0,
            "a / b = 3.5": a / np.where(b == 0, 1, b) == 3.5,
            "a / b is null": b == 0,
            "a + b < 0": (a + b) < 0,  # int64 wraps: big + 1 is negative
            "a * 2 < 0": (a * 2) < 0,
            "-a = a": (-a) == a,  # true for 0 and INT64_MIN only
            "abs(a) < 0": np.abs(a) < 0,  # INT64_MIN stays negative
            "s * 100 > 500": t["s"].to_numpy().astype(np.int64) * 100 > 500,  # int8 computes in int64
            "2 ^ 3 ^ 2 = 64 and -2 ^ 2 = 4 and 7 / 2 = 3.5 and 2 ** 0.5 > 1.41": np.ones(8, bool),
            "floor(a / b) = 3": np.floor(a / np.where(b == 0, 1, b)) == 3,
            "ceil(-7 / 2) = -3 and floor(-7 / 2) = -4 and exp(0) = 1 and log(1) = 0": np.ones(8, bool),
        }
    for text, want in checks.items():
        np.testing.assert_array_equal(mask_of(text, t, device), want, err_msg=text)


def test_float_rules(device: str) -> None:
    nan, inf = float("nan"), float("inf")
    t = pa.table(
        {"x": pa.array([nan, inf, -inf, 0.0, -0.0, 2.5, -2.5, 1e308]), "h": pa.array(np.arange(8), pa.float16())}
    )
    x = t["x"].to_numpy()
    with np.errstate(all="ignore"):
        checks = {
            "x = x": x == x,
            "x != x": x != x,
            "x > 0": x > 0,
            "x / 0 is null": np.ones(8, bool),
            "x / x = 1": (x / x) == 1,
            "x % 2 = 0.5": np.fmod(x, 2) == 0.5,
            "x % -2 = -0.5": np.fmod(x, -2) == -0.5,
            "x * 10 = x * 10": np.isfinite(x * 10) | np.isinf(x * 10),
            "sqrt(x) >= 0": np.sqrt(x) >= 0,
            "h = 3 or h > 6.5": (np.arange(8) == 3) | (np.arange(8) > 6.5),
            "-x < 0": -x < 0,
        }
    for text, want in checks.items():
        np.testing.assert_array_equal(mask_of(text, t, device), want, err_msg=text)


def test_uint64_compares_exactly(device: str) -> None:
    top = 2**64 - 1
    vals = [0, 1, 2**63 - 1, 2**63, top, None]
    t = pa.table({"u": pa.array(vals, pa.uint64()), "i": pa.array([-1, 1, 2**63 - 1, -5, 3, 4], pa.int64())})
    checks = {
        "u > -1": [1, 1, 1, 1, 1, 0],
        "u < -1": [0, 0, 0, 0, 0, 0],
        "u = 18446744073709551615": [0, 0, 0, 0, 1, 0],
        "u >= 9223372036854775808": [0, 0, 0, 1, 1, 0],
        "u > i": [1, 0, 0, 1, 1, 0],
        "i < u": [1, 0, 0, 1, 1, 0],
        "u = i": [0, 1, 1, 0, 0, 0],
        "u != i": [1, 0, 0, 1, 1, 0],
        "u in (0, 18446744073709551615)": [1, 0, 0, 0, 1, 0],
        "u + 1 = 0": [0, 0, 0, 0, 1, 0],  # uint64 arithmetic is int64 arithmetic: it wraps
        "u / 2 > 1e19 / 2 - 1e10": [0, 0, 0, 0, 1, 0],
    }
    for text, want in checks.items():
        np.testing.assert_array_equal(mask_of(text, t, device), np.array(want, bool), err_msg=text)


def test_strings_like_ilike_in(device: str) -> None:
    words = ["abc", "ABC", "aéc", "a%c", "a_c", "a\\c", "", None, "xabcx", "a\nc", "日本語", "ab"]
    t = pa.table({"s": pa.array(words, pa.string()), "l": pa.array(words, pa.large_string())})
    t2 = pa.table({"s": pa.array(words[::-1], pa.string())})
    patterns = ["a_c", "a%", "%c", "%b%", "a\\%c", "a\\_c", "a\\\\c", "", "%", "_", "___", "日_語", "%%", "a%%c", "ab"]
    for col in ("s", "l"):
        for pat in patterns:
            quoted = pat.replace("'", "''")
            want = pc.fill_null(pc.match_like(t[col], pat), False).to_numpy(zero_copy_only=False)
            np.testing.assert_array_equal(mask_of(f"{col} like '{quoted}'", t, device), want, err_msg=pat)
            want_not = pc.fill_null(pc.invert(pc.match_like(t[col], pat)), False).to_numpy(zero_copy_only=False)
            np.testing.assert_array_equal(mask_of(f"{col} not like '{quoted}'", t, device), want_not, err_msg=pat)
    # ilike folds ASCII letters only (on both backends)
    got = mask_of("s ilike 'AB%'", t, device)
    np.testing.assert_array_equal(got, np.array([w is not None and w[:2].lower() == "ab" for w in words]))
    got = mask_of("s ilike '%É%'", t, device)  # no Unicode folding: É does not match é
    assert not got.any()
    got = mask_of("s = 'abc' or s in ('日本語', '')", t, device)
    np.testing.assert_array_equal(got, np.array([w in ("abc", "日本語", "") for w in words]))
    got = mask_of("s != 'abc' and s not in ('ab')", t, device)
    np.testing.assert_array_equal(got, np.array([w is not None and w not in ("abc", "ab") for w in words]))
    # two string columns compared with each other
    both = pa.table({"s": t["s"], "r": t2["s"]})
    got = mask_of("s = r", both, device)
    want = pc.fill_null(pc.equal(both["s"], both["r"]), False).to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(got, want)
    for off in (1, 5, 9):
        got = mask_of("s like 'a_c' and s != 'abc'", t, device, off)
        want = pc.fill_null(pc.and_kleene(pc.match_like(t["s"], "a_c"), pc.not_equal(t["s"], "abc")), False)
        np.testing.assert_array_equal(got, want.to_numpy(zero_copy_only=False)[off:])


def test_dictionary_strings_and_bool_columns(device: str) -> None:
    t = pa.table(
        {
            "cat": pa.array(["a", "b", None, "a", "c"]).dictionary_encode(),
            "ok": pa.array([True, False, None, True, True]),
        }
    )
    np.testing.assert_array_equal(mask_of("cat = 'a' and ok", t, device), [1, 0, 0, 1, 0])
    np.testing.assert_array_equal(mask_of("not ok or cat like 'c'", t, device), [0, 1, 0, 0, 1])
    np.testing.assert_array_equal(mask_of("ok is null", t, device), [0, 0, 1, 0, 0])


def test_temporal_columns(device: str) -> None:
    base = dt.datetime(2024, 1, 1)
    stamps = [base + dt.timedelta(hours=6 * k) for k in range(12)] + [None]
    t = pa.table(
        {
            "ts": pa.array(stamps, pa.timestamp("us")),
            "tss": pa.array(stamps, pa.timestamp("s")),
            "tsn": pa.array(stamps, pa.timestamp("ns")),
            "tz": pa.array(stamps, pa.timestamp("ms", tz="UTC")),
            "paris": pa.array(stamps, pa.timestamp("s", tz="Europe/Paris")),
            "d": pa.array([s.date() if s else None for s in stamps], pa.date32()),
            "d64": pa.array([s.date() if s else None for s in stamps], pa.date64()),
            "t": pa.array([s.time() if s else None for s in stamps], pa.time32("s")),
            "dur": pa.array([k * 1000 if k != 12 else None for k in range(13)], pa.duration("ms")),
        }
    )

    def ref(col: str, lo: object, hi: object) -> np.ndarray:
        c = t[col]
        lo_s, hi_s = pa.scalar(lo, c.type), pa.scalar(hi, c.type)
        out = pc.and_kleene(pc.greater_equal(c, lo_s), pc.less_equal(c, hi_s))
        return pc.fill_null(out, False).to_numpy(zero_copy_only=False)

    lo, hi = dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2, 12)
    for col in ("ts", "tss", "tsn"):
        got = mask_of(f"{col} between '2024-01-01' and '2024-01-02 12:00'", t, device)
        np.testing.assert_array_equal(got, ref(col, lo, hi), err_msg=col)
    utc = dt.timezone.utc
    got = mask_of("tz between '2024-01-01T00:00:00Z' and '2024-01-02T12:00:00+00:00'", t, device)
    np.testing.assert_array_equal(got, ref("tz", lo.replace(tzinfo=utc), hi.replace(tzinfo=utc)))
    # a zone-less literal is read in the column's zone: 07:00 in Paris is 06:00 UTC in winter
    got = mask_of("paris = '2024-01-01 07:00'", t, device)
    np.testing.assert_array_equal(got, np.array([s == base + dt.timedelta(hours=6) for s in stamps]))
    # literals between two values of the column's unit compare exactly
    got = mask_of("tss > '2024-01-01 05:59:59.5' and tss < '2024-01-01 06:00:00.000001'", t, device)
    np.testing.assert_array_equal(got, np.array([s == base + dt.timedelta(hours=6) for s in stamps]))
    got = mask_of("d = '2024-01-02' and d64 >= '2024-01-02' and d < '2024-01-02 00:00:01'", t, device)
    np.testing.assert_array_equal(got, np.array([s is not None and s.date() == dt.date(2024, 1, 2) for s in stamps]))
    got = mask_of("t >= '12:00' and t < '18:00:00.000'", t, device)
    np.testing.assert_array_equal(got, np.array([s is not None and s.hour == 12 for s in stamps]))
    got = mask_of("dur between 2000 and 4000 and ts = ts", t, device)
    np.testing.assert_array_equal(got, np.array([2 <= k <= 4 for k in range(13)]))


def test_columns_and_tables_checked(device: str) -> None:
    schema = pa.schema({"a": pa.int64(), "s": pa.string()})
    p = compile_where("a > 1", schema)
    t = pystrom.Table.from_arrow(pa.table({"b": [1, 2]}), device=device)
    with pytest.raises(ColumnNotFoundError, match="'a'"):
        p.evaluate(t)
    t = pystrom.Table.from_arrow(pa.table({"a": pa.array([1.0, 2.0])}), device=device)
    with pytest.raises(SchemaMismatchError, match="column 'a' has type double in the table, but the where expression"):
        p.evaluate(t)
    with pytest.raises(UnsupportedTypeError, match="needs a pystrom.Table, got Table"):
        p.evaluate(pa.table({"a": [1]}))  # type: ignore[arg-type]
    # other columns are ignored, large_string in the schema accepts string in the table, empty tables work
    q = compile_where("s like 'x%'", pa.schema({"s": pa.large_string()}))
    t = pystrom.Table.from_arrow(pa.table({"z": [1.0, 2.0], "s": ["xa", "b"]}), device=device)
    np.testing.assert_array_equal(to_host(q.evaluate(t)), [True, False])
    assert to_host(q.evaluate(t.slice(2))).shape == (0,)
    # a predicate that reads no column still has one value per row
    assert to_host(compile_where("1 < 2", schema).evaluate(t)).tolist() == [True, True]


def test_kernel_built_once_per_predicate(device: str) -> None:
    from pystrom import kernels

    arrow = pa.table({"k": pa.array(np.arange(1000) % 17, pa.int32())})
    table = pystrom.Table.from_arrow(arrow, device=device)
    p = compile_where("k % 5 = 2 and k > 3", arrow.schema)
    first = to_host(p.evaluate(table))
    if device == "cpu":
        assert p._program is None  # the CPU never generates CUDA source
    else:
        program = p._program
        before = kernels.generated.cache_info()
        again = to_host(p.evaluate(table.slice(10)))
        after = kernels.generated.cache_info()
        assert p._program is program and after.misses == before.misses and after.hits == before.hits + 1
        np.testing.assert_array_equal(again, first[10:])
    np.testing.assert_array_equal(first, (np.arange(1000) % 17 % 5 == 2) & (np.arange(1000) % 17 > 3))


def test_cpu_and_gpu_agree_on_larger_data(device: str) -> None:
    rng = np.random.default_rng(7)
    n = 50_000
    t = pa.table(
        {
            "a": pa.array(rng.integers(-1000, 1000, n), mask=rng.random(n) < 0.1),
            "b": pa.array(rng.normal(size=n), mask=rng.random(n) < 0.1),
            "s": pa.array([f"k{v}" for v in rng.integers(0, 500, n)]),
        }
    )
    text = "(a % 7 = 3 or b * 2 > 1.5) and s like 'k1%' and not (a between -10 and 10) or exp(b) < 0.2"
    got = mask_of(text, t, device, offset=5)
    cpu = mask_of(text, t, "cpu", offset=5)
    np.testing.assert_array_equal(got, cpu)
    assert 0 < got.sum() < n
