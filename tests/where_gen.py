"""Random where expressions with their meaning written in pyarrow.compute (the reference), for property tests.

Each generated expression comes as (text, reference), where reference(table) computes the same
value with pyarrow.compute following the rules pystrom documents: int64 wrapping + - *, float64
for / and ^ and functions, NULL for a zero divisor, Kleene and/or/not, BETWEEN and IN spelled out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st

Ref = Callable[[pa.Table], pa.Array]

SCHEMA = pa.schema({"a": pa.int64(), "b": pa.float64(), "c": pa.int32(), "s": pa.string(), "f": pa.bool_()})
F64 = pa.float64()
CMP = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}


def _f(x: pa.Array) -> pa.Array:
    return pc.cast(x, F64, safe=False)  # int64 -> float64 rounds, as pystrom's does


def _i(x: pa.Array) -> pa.Array:
    return pc.cast(x, pa.int64())


def _lit(value: object, typ: pa.DataType) -> Ref:
    return lambda t: pa.array([value] * t.num_rows, typ)


def _column(name: str) -> Ref:
    return lambda t: t.column(name).combine_chunks()


def data(max_rows: int = 40) -> st.SearchStrategy[pa.Table]:
    ints = st.one_of(st.integers(-6, 6), st.sampled_from([2**63 - 1, -(2**63), 2**31 - 1, -(2**31)]))
    floats = st.one_of(
        st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0, -1.5, 3.25, 10.0]),
        st.floats(-20, 20, allow_nan=False, width=64),
        st.sampled_from([float("nan"), float("inf"), -float("inf")]),
    )
    i32 = st.integers(-(2**31), 2**31 - 1) | st.integers(-4, 4)
    text = st.text(alphabet="abAB%_é\n", max_size=5)

    @st.composite
    def build(draw: st.DrawFn) -> pa.Table:
        n = draw(st.integers(0, max_rows))

        def col(values: st.SearchStrategy) -> list:
            return draw(st.lists(st.none() | values, min_size=n, max_size=n))

        return pa.table(
            {
                "a": pa.array(col(ints), pa.int64()),
                "b": pa.array(col(floats), F64),
                "c": pa.array(col(i32), pa.int32()),
                "s": pa.array(col(text), pa.string()),
                "f": pa.array(col(st.booleans()), pa.bool_()),
            }
        )

    return build()


def _num_leaf() -> st.SearchStrategy[tuple[str, Ref, str]]:
    return st.one_of(
        st.sampled_from([("a", _column("a"), "int"), ("c", _column("c"), "int"), ("b", _column("b"), "float")]),
        st.integers(-5, 5).map(lambda v: (str(v), _lit(v, pa.int64()), "int")),
        st.sampled_from([0.5, 2.0, 1e3, 2.5e-1]).map(lambda v: (repr(v), _lit(v, F64), "float")),
    )


def _num_node(children: st.SearchStrategy) -> st.SearchStrategy[tuple[str, Ref, str]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, Ref, str]:
        choice = draw(
            st.sampled_from(["+", "-", "*", "/", "%", "^", "neg", "sqrt", "abs", "floor", "ceil", "exp", "log"])
        )
        ta, ra, ka = draw(children)
        if choice == "neg":
            return (f"-({ta})", lambda t: pc.negate(_i(ra(t)) if ka == "int" else ra(t)), ka)
        if choice in ("sqrt", "exp", "log"):
            fn = {"sqrt": pc.sqrt, "exp": pc.exp, "log": pc.ln}[choice]
            return (f"{choice}({ta})", lambda t: fn(_f(ra(t))), "float")
        if choice == "abs":
            return (f"abs({ta})", lambda t: pc.abs(_i(ra(t)) if ka == "int" else ra(t)), ka)
        if choice in ("floor", "ceil"):
            fn = pc.floor if choice == "floor" else pc.ceil
            return (f"{choice}({ta})", (lambda t: ra(t)) if ka == "int" else (lambda t: fn(ra(t))), ka)
        tb, rb, kb = draw(children)
        text = f"({ta}) {choice} ({tb})"
        if choice == "%":  # pyarrow has no remainder: C's fmod, NULL for a zero divisor, x % -1 = 0
            kind = "int" if ka == kb == "int" else "float"
            return (text, lambda t: _mod(ra(t), rb(t), kind), kind)
        if choice in ("/", "^"):
            if choice == "/":

                def ref(t: pa.Table) -> pa.Array:
                    b = _f(rb(t))
                    return pc.if_else(pc.equal(b, 0.0), pa.scalar(None, F64), pc.divide(_f(ra(t)), b))

                return (text, ref, "float")
            return (text, lambda t: pc.power(_f(ra(t)), _f(rb(t))), "float")
        fn = {"+": pc.add, "-": pc.subtract, "*": pc.multiply}[choice]
        if ka == kb == "int":
            return (text, lambda t: fn(_i(ra(t)), _i(rb(t))), "int")
        return (text, lambda t: fn(_f(ra(t)), _f(rb(t))), "float")

    return build()


def _mod(a: pa.Array, b: pa.Array, kind: str) -> pa.Array:
    cast = _i if kind == "int" else _f
    a, b = cast(a), cast(b)
    av = pc.fill_null(a, 0).to_numpy(zero_copy_only=False)
    bv = pc.fill_null(b, 1).to_numpy(zero_copy_only=False)
    valid = (pc.is_valid(a).to_numpy(zero_copy_only=False) & pc.is_valid(b).to_numpy(zero_copy_only=False)) & (bv != 0)
    with np.errstate(all="ignore"):
        safe = np.where((bv == 0) | (bv == -1), 1, bv) if kind == "int" else np.where(bv == 0, 1, bv)
        out = np.fmod(av, safe)
        if kind == "int":
            out = np.where(bv == -1, 0, out)
    return pa.array(out, mask=~valid)


numbers = st.recursive(_num_leaf(), _num_node, max_leaves=6)


def _compare(draw: st.DrawFn) -> tuple[str, Ref]:
    ta, ra, ka = draw(numbers)
    tb, rb, kb = draw(numbers)
    op = draw(st.sampled_from(list(CMP) + ["<>", "=="]))
    fn = CMP[{"<>": "!=", "==": "="}.get(op, op)]
    if ka == kb == "int":
        return (f"{ta} {op} {tb}", lambda t: fn(_i(ra(t)), _i(rb(t))))
    return (f"{ta} {op} {tb}", lambda t: fn(_f(ra(t)), _f(rb(t))))


@st.composite
def _bool_leaf(draw: st.DrawFn) -> tuple[str, Ref]:
    kind = draw(st.sampled_from(["cmp", "cmp", "flag", "strcmp", "like", "in", "between", "isnull", "const"]))
    if kind == "cmp":
        return _compare(draw)
    if kind == "flag":
        return ("f", _column("f"))
    if kind == "strcmp":
        lit = draw(st.text(alphabet="abA%é", max_size=3))
        op = draw(st.sampled_from(["=", "!="]))
        quoted = "'" + lit.replace("'", "''") + "'"
        return (f"s {op} {quoted}", lambda t: CMP[op](_column("s")(t), pa.scalar(lit, pa.string())))
    if kind == "like":
        pat = draw(st.text(alphabet="ab%_é\n", max_size=4))
        neg = draw(st.booleans())
        word = "not like" if neg else "like"

        def like(t: pa.Table) -> pa.Array:
            m = pc.match_like(_column("s")(t), pat)
            return pc.invert(m) if neg else m

        return (f"s {word} '{pat}'", like)
    if kind == "in":
        items = draw(st.lists(st.one_of(st.none(), st.integers(-4, 4)), min_size=1, max_size=4))
        neg = draw(st.booleans())
        text = (
            "a " + ("not in" if neg else "in") + " (" + ", ".join("null" if v is None else str(v) for v in items) + ")"
        )

        def isin(t: pa.Table) -> pa.Array:
            a = _column("a")(t)
            out = pc.equal(a, pa.scalar(items[0], pa.int64()))
            for v in items[1:]:
                out = pc.or_kleene(out, pc.equal(a, pa.scalar(v, pa.int64())))
            return pc.invert(out) if neg else out

        return (text, isin)
    if kind == "between":
        tx, rx, kx = draw(numbers)
        lo, hi = draw(st.integers(-5, 5)), draw(st.integers(-5, 5))
        neg = draw(st.booleans())

        def between(t: pa.Table) -> pa.Array:
            x = rx(t)
            x = _i(x) if kx == "int" else _f(x)
            out = pc.and_kleene(pc.greater_equal(x, lo), pc.less_equal(x, hi))
            return pc.invert(out) if neg else out

        return (f"{tx} {'not between' if neg else 'between'} {lo} and {hi}", between)
    if kind == "isnull":
        tx, rx, _ = draw(numbers)
        neg = draw(st.booleans())
        return (f"({tx}) is {'not ' if neg else ''}null", lambda t: pc.is_valid(rx(t)) if neg else pc.is_null(rx(t)))
    value = draw(st.sampled_from([True, False, None]))
    return ({True: "true", False: "false", None: "null"}[value], _lit(value, pa.bool_()))


def _bool_node(children: st.SearchStrategy) -> st.SearchStrategy[tuple[str, Ref]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, Ref]:
        op = draw(st.sampled_from(["and", "or", "not"]))
        ta, ra = draw(children)
        if op == "not":
            return (f"not ({ta})", lambda t: pc.invert(ra(t)))
        tb, rb = draw(children)
        fn = pc.and_kleene if op == "and" else pc.or_kleene
        return (f"({ta}) {op.upper()} ({tb})", lambda t: fn(ra(t), rb(t)))

    return build()


predicates = st.recursive(_bool_leaf(), _bool_node, max_leaves=5)


def expected_mask(ref: Ref, table: pa.Table) -> np.ndarray:
    """The rows where the reference is TRUE (NULL is not true)."""
    out = ref(table)
    if isinstance(out, pa.ChunkedArray):
        out = out.combine_chunks()
    return pc.fill_null(out, False).to_numpy(zero_copy_only=False).astype(bool)
