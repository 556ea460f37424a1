"""Table.filter("expr") and Table.with_columns(name="expr") against pyarrow.compute, on both backends.

References: where_gen's expressions come with their meaning written in pyarrow.compute. The generated
with_columns kernel is also compiled for the host (as tests/test_where_kernel_source.py does for
predicates) and compared with the NumPy evaluator; the GPU test compares the real kernel with it.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_where_kernel_source import CXX, PRELUDE
from where_gen import data, expected_mask, numbers, predicates

import pystrom
from pystrom.errors import ExpressionError, UnsupportedTypeError
from pystrom.expr import compile_expression
from pystrom.expr._cuda import COLUMNS_FUNCTION
from pystrom.expr._numpy import evaluate_value

HYPOTHESIS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


def _table(arrow: pa.Table, device: str, offset: int = 0) -> pystrom.Table:
    t = pystrom.Table.from_arrow(arrow, device=device)
    return t.slice(offset) if offset else t


def _column(result: pystrom.Table, name: str) -> pa.Array:
    return result.to_arrow().column(name).combine_chunks()


def _assert_values_equal(got: pa.Array, want: pa.Array, text: str, exact: bool) -> None:
    """Same NULLs; same values where valid (floats to 1e-12 relative where libm may round differently,
    and 1e-14 absolute: a sum such as exp(b) + log(abs(b)) cancels to ~1e-5 from terms near 1, so one
    ulp of the terms is 5e-12 of the result)."""
    assert got.null_count == want.null_count, text
    valid = pc.is_valid(got).to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(valid, pc.is_valid(want).to_numpy(zero_copy_only=False), err_msg=text)
    g = got.to_numpy(zero_copy_only=False)[valid]
    w = pc.cast(want, got.type, safe=False).to_numpy(zero_copy_only=False)[valid]
    if pa.types.is_floating(got.type) and not exact:
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14, equal_nan=True, err_msg=text)
    else:
        np.testing.assert_array_equal(g, w, err_msg=text)


def _assert_same_rows(got: pa.Table, want: pa.Table, text: str) -> None:
    """Equal schemas and values, NaN equal to NaN (pyarrow's equals says NaN != NaN)."""

    def rows(t: pa.Table) -> list:
        return [["NaN" if isinstance(v, float) and v != v else v for v in c.to_pylist()] for c in t.columns]

    assert got.schema.equals(want.schema), text
    assert rows(got) == rows(want), text


def _transcendental(text: str) -> bool:
    return any(f in text for f in ("exp", "log", "^"))


# -- filter ---------------------------------------------------------------------------------------


@HYPOTHESIS
@given(table=data(), pred=predicates, offset=st.integers(0, 9))
def test_filter_expression_equals_pyarrow(device: str, table: pa.Table, pred, offset: int) -> None:
    text, ref = pred
    offset = min(offset, table.num_rows)
    got = _table(table, device, offset).filter(text)
    want = table.slice(offset).filter(pa.array(expected_mask(ref, table.slice(offset))))
    assert got.device.startswith(device) and got.schema == table.schema
    _assert_same_rows(got.to_arrow(), want, text)


def test_filter_expression_fixed_cases(device: str) -> None:
    arrow = pa.table(
        {
            "age": pa.array([30, 70, None, 50, 65], pa.int32()),
            "bmi": pa.array([31.0, 22.5, 35.0, None, float("nan")]),
            "name": pa.array(["ann", "bob", None, "al", "bo"]),
            "t": pa.array([True, None, False, True, True]),
        }
    )
    t = _table(arrow, device)
    assert t.filter("bmi > 30").to_arrow().column("age").to_pylist() == [30, None]
    assert t.filter("age >= 65 or bmi > 30").to_arrow().column("name").to_pylist() == ["ann", "bob", None, "bo"]
    assert t.filter("name like 'a%' and not (age is null)").to_arrow().column("age").to_pylist() == [30, 50]
    assert t.filter("t").num_rows == 3  # a bool column's name: NULL drops the row
    assert t.filter("t = false").num_rows == 1
    assert t.filter("bmi != bmi").num_rows == 1  # NaN is not equal to itself (NULL is not selected)
    assert t.filter("false").num_rows == 0 and t.filter("true").num_rows == 5
    assert t.filter("age > 0").slice(1).filter("age > 50").to_arrow().column("age").to_pylist() == [70, 65]
    empty = t.slice(5)
    assert empty.filter("age > 1").num_rows == 0 and empty.filter("age > 1").schema == arrow.schema
    one = t.slice(1, 1)
    assert one.filter("age = 70").to_arrow().equals(arrow.slice(1, 1))


def test_filter_expression_errors_name_the_expression_and_column(device: str) -> None:
    t = _table(pa.table({"bmi": [1.0, 2.0], "name": ["a", "b"], "n": pa.array([1, 2], pa.int8())}), device)
    with pytest.raises(ExpressionError, match=r"filter\('bmii > 30'\): unknown column 'bmii'.*did you mean 'bmi'"):
        t.filter("bmii > 30")
    with pytest.raises(ExpressionError, match=r"filter\('name > 3'\): cannot compare column 'name' \(string\)"):
        t.filter("name > 3")
    with pytest.raises(ExpressionError, match=r"filter\('bmi \* 2'\).*must be a condition.*a number"):
        t.filter("bmi * 2")
    with pytest.raises(ExpressionError, match=r"filter\('bmi >'\)"):
        t.filter("bmi >")
    with pytest.raises(UnsupportedTypeError, match="filter column 'n' has type int8, not bool"):
        t.filter("n")  # a column's name keeps meaning that column
    with pytest.raises(UnsupportedTypeError, match="1-D bool array"):
        t.filter(["bmi"])


# -- with_columns ------------------------------------------------------------------------------------


@HYPOTHESIS
@given(table=data(), expr=numbers, offset=st.integers(0, 9))
def test_with_columns_numbers_equal_pyarrow(device: str, table: pa.Table, expr, offset: int) -> None:
    text, ref, kind = expr
    offset = min(offset, table.num_rows)
    got = _table(table, device, offset).with_columns(out=text)
    column = _column(got, "out")
    assert column.type == (pa.int64() if kind == "int" else pa.float64()), text
    _assert_values_equal(column, ref(table.slice(offset)), text, exact=not _transcendental(text))
    _assert_same_rows(got.to_arrow().select(table.column_names), table.slice(offset), text)


@HYPOTHESIS
@given(table=data(), pred=predicates, offset=st.integers(0, 9))
def test_with_columns_conditions_equal_pyarrow(device: str, table: pa.Table, pred, offset: int) -> None:
    text, ref = pred
    assume(text != "null")  # a bare NULL has no type to give a column (refused; tested below)
    offset = min(offset, table.num_rows)
    got = _column(_table(table, device, offset).with_columns(out=text), "out")
    want = ref(table.slice(offset))
    if isinstance(want, pa.ChunkedArray):
        want = want.combine_chunks()
    assert got.type == pa.bool_()
    _assert_values_equal(got, want, text, exact=True)


def test_with_columns_layout_types_and_nulls(device: str) -> None:
    arrow = pa.table(
        {
            "w": pa.array([80.0, 70.0, 90.0, 60.0]),
            "h": pa.array([2.0, 1.75, 0.0, None]),
            "age": pa.array([30, 70, None, 50], pa.int32()),
            "u": pa.array([1, 2**64 - 1, 3, 4], pa.uint64()),
            "s": pa.array(["a", None, "ccc", "dd"]),
        }
    )
    t = _table(arrow, device)
    out = t.with_columns(bmi="w / h^2", old="age >= 65", age="age * 2", k="7", flag="true", u2="u", w="w + 1")
    assert out.column_names == ["w", "h", "age", "u", "s", "bmi", "old", "k", "flag", "u2"]
    types = {f.name: f.type for f in out.schema}
    assert types["bmi"] == pa.float64() and types["old"] == pa.bool_() and types["age"] == pa.int64()
    assert types["k"] == pa.int64() and types["flag"] == pa.bool_() and types["u2"] == pa.uint64()
    got = out.to_arrow().to_pydict()
    assert got["bmi"] == [20.0, 70.0 / 1.75**2, None, None]  # h = 0: NULL; h NULL: NULL
    assert got["old"] == [False, True, None, False]
    assert got["age"] == [60, 140, None, 100]
    assert got["w"] == [81.0, 71.0, 91.0, 61.0] and got["s"] == ["a", None, "ccc", "dd"]
    assert got["k"] == [7] * 4 and got["flag"] == [True] * 4 and got["u2"] == [1, 2**64 - 1, 3, 4]
    # a bitmap only where there are NULLs; one allocation for the whole table
    assert out.column("k").validity is None and out.column("w").validity is None
    assert out.column("bmi").null_count == 2 and out.column("bmi").validity is not None
    assert len({c._block for c in out.columns}) == 1 and out._block is not t._block
    assert t.to_arrow().equals(arrow)  # the input is unchanged
    # a division that never meets zero still plans a bitmap, then drops it
    assert t.with_columns(r="w / 2").column("r").validity is None


def test_with_columns_on_views_empty_and_one_row(device: str) -> None:
    arrow = pa.table(
        {"x": pa.array(np.arange(100, dtype=np.int64), mask=np.arange(100) % 3 == 0), "s": [str(i) for i in range(100)]}
    )
    t = _table(arrow, device).slice(13, 50)
    out = t.with_columns(y="x * x - 1", z="x % 4 = 1")
    ref = arrow.slice(13, 50)
    x = ref.column("x").combine_chunks()
    assert _column(out, "y").equals(pc.subtract(pc.multiply(x, x), 1))
    assert _column(out, "z").to_pylist() == [None if v is None else v % 4 == 1 for v in x.to_pylist()]
    assert out.to_arrow().select(["x", "s"]).equals(ref)
    empty = _table(arrow, device).slice(100).with_columns(y="x + 1", z="x > 2")
    assert empty.num_rows == 0 and empty.schema.field("y").type == pa.int64()
    one = _table(arrow, device).slice(4, 1).with_columns(y="x / 0", z="x is null")
    assert one.to_arrow().to_pydict() == {"x": [4], "s": ["4"], "y": [None], "z": [False]}


def test_with_columns_errors_name_the_expression_column_and_type(device: str) -> None:
    arrow = pa.table(
        {"x": [1.0], "s": ["a"], "ts": pa.array([0], pa.timestamp("us")), "d": pa.array([1], pa.decimal128(5, 2))}
    )
    t = _table(arrow, device)
    with pytest.raises(ExpressionError, match=r"with_columns\(y='xx \+ 1'\): unknown column 'xx'.*did you mean 'x'"):
        t.with_columns(y="xx + 1")
    with pytest.raises(ExpressionError, match=r"with_columns\(y='s'\).*column 's' \(string\).*a string"):
        t.with_columns(y="s")
    with pytest.raises(ExpressionError, match=r"with_columns\(y='ts'\).*column 'ts' \(timestamp\[us\]\).*timestamp"):
        t.with_columns(y="ts")
    with pytest.raises(ExpressionError, match=r"with_columns\(y='null'\).*always NULL"):
        t.with_columns(y="null")
    with pytest.raises(ExpressionError, match=r"with_columns\(y='d \* 2'\).*column 'd' has type decimal128\(5, 2\)"):
        t.with_columns(y="d * 2")
    with pytest.raises(ExpressionError, match=r"with_columns\(y='s \+ 1'\).*column 's' \(string\)"):
        t.with_columns(y="s + 1")
    with pytest.raises(UnsupportedTypeError, match=r"builtins.object cannot become a column.*expression \(str\)"):
        t.with_columns(y=object())  # not an expression, an array or a scalar (3 would be broadcast: test_with_arrays)
    with pytest.raises(ValueError, match="at least one"):
        t.with_columns()
    with pytest.raises(pystrom.SchemaMismatchError, match="non-empty"):
        t.with_columns({"": "x"})
    with pytest.raises(TypeError, match="mapping"):
        t.with_columns([("y", "x")])
    assert t.with_columns({"two words": "x * 2"}, z="x").column_names == ["x", "s", "ts", "d", "two words", "z"]


# -- the generated kernel, compiled for the host ------------------------------------------------------------


def _host_function(source: str, tmp: Path):
    helpers = resources.files("pystrom.kernels").joinpath("where.cu").read_text(encoding="utf-8")
    text = PRELUDE + helpers + "\n" + source
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    lib = tmp / f"columns_{digest}.so"
    if not lib.exists():
        src = tmp / f"columns_{digest}.cpp"
        src.write_text(text)
        done = subprocess.run(
            [CXX, "-std=c++17", "-O0", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True, text=True
        )
        assert done.returncode == 0, f"the kernel source does not compile:\n{done.stderr}\n{text}"
    return getattr(ctypes.CDLL(str(lib)), COLUMNS_FUNCTION)


def _host_run(texts: list[str], arrow: pa.Table, tmp: Path, offset: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from pystrom.expr import _columns_program
    from pystrom.expr._cuda import _column_arguments

    table = _table(arrow, "cpu", offset)
    exprs = tuple(compile_expression(text, arrow.schema) for text in texts)
    program = _columns_program(exprs)
    fn = _host_function(program.source, tmp)
    n = table.num_rows
    outs = [
        (np.full(n, 7, dtype=e.dtype) if e.dtype != bool else np.zeros(n, bool), np.zeros((n + 31) // 32, np.uint32))
        for e in exprs
    ]
    keep, cargs = [], [ctypes.c_longlong(n)]
    for a in [*_column_arguments(table, program.columns, program.kinds), *(x for pair in outs for x in pair)]:
        if isinstance(a, np.ndarray):
            a = np.ascontiguousarray(a)
            keep.append(a)
            cargs.append(ctypes.c_void_p(a.ctypes.data if a.size else 0))
        elif isinstance(a, np.uint64):
            cargs.append(ctypes.c_void_p(int(a) or None))
        else:
            cargs.append(ctypes.c_longlong(int(a)))
    fn(*cargs)
    return [(values, np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)) for values, words in outs]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("columns_kernels")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the kernel source for the host")
@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(table=data(), num=numbers, pred=predicates, offset=st.integers(0, 9))
def test_generated_kernel_on_the_host_equals_numpy(tmp: Path, table: pa.Table, num, pred, offset: int) -> None:
    offset = min(offset, table.num_rows)
    assume(pred[0] != "null")
    texts = [num[0], pred[0]]
    got = _host_run(texts, table, tmp, offset)
    view = _table(table, "cpu", offset)
    for text, (values, valid) in zip(texts, got):
        e = compile_expression(text, table.schema)
        twin = np.empty(view.num_rows, dtype=e.dtype)
        twin_valid = evaluate_value(e._expr, view, twin)
        twin_valid = np.ones(view.num_rows, bool) if twin_valid is None else twin_valid
        np.testing.assert_array_equal(valid, twin_valid, err_msg=text)
        if _transcendental(text):
            np.testing.assert_allclose(values, twin, rtol=1e-12, equal_nan=True, err_msg=text)
        else:
            np.testing.assert_array_equal(values, twin, err_msg=text)
        assert not values[~valid].any(), text  # NULL rows hold 0 on both


def test_one_kernel_for_all_new_columns() -> None:
    from pystrom.expr import _columns_program

    schema = pa.schema({"x": pa.float64(), "s": pa.string(), "k": pa.int32()})
    exprs = tuple(compile_expression(t, schema) for t in ("x * 2", "s like 'a%' or k > 3", "k % 2"))
    program = _columns_program(exprs)
    assert program is _columns_program(exprs)  # generated once per tuple of expressions
    assert program.source.count("__global__") == 1 and program.columns == ("x", "s", "k")
    assert program.source.count("pw_store_valid(") == 3 and "pw_like(" in program.source


# -- the GPU kernel against its NumPy twin --------------------------------------------------------


def test_gpu_kernel_equals_numpy_twin_on_larger_data(device: str) -> None:
    rng = np.random.default_rng(11)
    n = 100_003
    arrow = pa.table(
        {
            "a": pa.array(rng.integers(-1000, 1000, n), mask=rng.random(n) < 0.1),
            "b": pa.array(rng.normal(size=n), mask=rng.random(n) < 0.1),
            "c": pa.array(rng.integers(-5, 5, n).astype(np.int32)),
            "h": pa.array(rng.normal(size=n).astype(np.float16)),
            "s": pa.array([f"k{v}" for v in rng.integers(0, 500, n)]),
            "f": pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.05),
        }
    )
    named = {
        "m": "a % c",
        "d": "b / c",
        "p": "(a * 3 + c) * 2 - abs(a)",
        "q": "sqrt(abs(b)) + floor(b) * ceil(h)",
        "cond": "(a % 7 = 3 or b * 2 > 1.5) and s like 'k1%' and not (a between -10 and 10) or f",
        "isn": "b is null or a is not null",
        "e": "exp(b) + log(abs(b))",
    }
    got = _table(arrow, device, 7).with_columns(named).to_arrow()
    cpu = _table(arrow, "cpu", 7).with_columns(named).to_arrow()
    for name, text in named.items():
        _assert_values_equal(
            got.column(name).combine_chunks(), cpu.column(name).combine_chunks(), text, exact=name != "e"
        )
    assert 0 < got.column("m").null_count < n and got.column("isn").null_count == 0
