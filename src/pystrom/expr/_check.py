"""Type checking: the syntax tree of :mod:`._parser` against an Arrow schema, into the typed tree of :mod:`._ir`.

Every error names the column (with its type) or the literal at fault and its position.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ExpressionError
from ._ir import ANY, LIT, ONE, Expr, const
from ._parser import Node
from ._temporal import UNIT_NS, parse_instant_ns, parse_time_ns

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["check", "ColumnInfo", "like_pattern"]

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_CMP = {"=": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
_ARITH = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "^": "pow"}


@dataclass(frozen=True)
class ColumnInfo:
    """What the checker learnt of one column: value kind, storage dtype, temporal family and unit."""

    name: str
    arrow: pa.DataType
    kind: str  # bool int uint float str
    dtype: str  # numpy storage dtype name ("" for strings)
    temporal: str = ""  # date timestamp time duration, or ""
    unit: str = ""  # D s ms us ns
    tz: str | None = None


@dataclass(frozen=True)
class _T:
    """A checked operand: its IR, its kind and, for messages, what it is."""

    expr: Expr
    kind: str  # bool int uint float str null
    what: str  # "column 'x' (int64)" / "the string literal 'a' at position 3"
    col: ColumnInfo | None = None
    literal: bool = False


def column_info(name: str, arrow: pa.DataType) -> ColumnInfo:
    import pyarrow as pa
    import pyarrow.types as pt

    t = arrow
    if pt.is_dictionary(t):
        t = t.value_type
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if pt.is_boolean(t):
        return ColumnInfo(name, arrow, "bool", "bool")
    if pt.is_integer(t):
        dt = np.dtype(t.to_pandas_dtype())
        return ColumnInfo(name, arrow, "uint" if dt == np.uint64 else "int", dt.name)
    if pt.is_floating(t):
        return ColumnInfo(name, arrow, "float", np.dtype(t.to_pandas_dtype()).name)
    if pt.is_string(t) or pt.is_large_string(t) or getattr(pt, "is_string_view", lambda _: False)(t):
        return ColumnInfo(name, arrow, "str", "")
    if pt.is_date32(t):
        return ColumnInfo(name, arrow, "int", "int32", "date", "D")
    if pt.is_date64(t):
        return ColumnInfo(name, arrow, "int", "int64", "date", "ms")
    if pt.is_timestamp(t):
        return ColumnInfo(name, arrow, "int", "int64", "timestamp", t.unit, t.tz)
    if pt.is_time32(t) or pt.is_time64(t):
        return ColumnInfo(name, arrow, "int", "int32" if pt.is_time32(t) else "int64", "time", t.unit)
    if pt.is_duration(t):
        return ColumnInfo(name, arrow, "int", "int64", "duration", t.unit)
    hint = ""
    if pt.is_decimal(t):
        hint = "; cast it to float64 first (e.g. table.cast() in pyarrow, or ::float8 in SQL)"
    raise ExpressionError(f"column {name!r} has type {arrow}, which where expressions cannot use{hint}")


def like_pattern(text: str, where: str) -> tuple[tuple[int, bytes], ...]:
    """Compile a LIKE pattern: '%' any run, '_' one character, backslash escapes the next character."""
    pieces: list[tuple[int, bytes]] = []
    lit: list[str] = []

    def flush() -> None:
        if lit:
            pieces.append((LIT, "".join(lit).encode("utf-8")))
            lit.clear()

    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 == len(text):
                raise ExpressionError(f"the LIKE pattern {where} ends with an escape character '\\'")
            lit.append(text[i + 1])
            i += 2
            continue
        if ch in "%_":
            flush()
            if ch == "_":
                pieces.append((ONE, b""))
            elif not pieces or pieces[-1][0] != ANY:  # "%%" is "%"
                pieces.append((ANY, b""))
        else:
            lit.append(ch)
        i += 1
    flush()
    return tuple(pieces)


class _Checker:
    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.fields = {f.name: f for f in schema}
        self.used: dict[str, ColumnInfo] = {}

    # -- leaves -----------------------------------------------------------------------------------

    def column(self, node: Node) -> _T:
        name = str(node.value)
        field = self.fields.get(name)
        if field is None:
            names = list(self.fields)
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            listing = ", ".join(repr(n) for n in names[:20]) + (", ..." if len(names) > 20 else "")
            raise ExpressionError(
                f"unknown column {name!r} at position {node.pos}{hint} (the columns are: {listing or 'none'})",
                node.pos,
            )
        try:
            info = column_info(name, field.type)
        except ExpressionError as exc:
            raise ExpressionError(f"{exc} (at position {node.pos})", node.pos) from None
        self.used[name] = info
        what = f"column {name!r} ({field.type}) at position {node.pos}"
        return _T(Expr("col", info.kind, value=name, dtype=info.dtype), info.kind, what, col=info)

    def literal(self, node: Node) -> _T:
        v = node.value
        if v is None:
            return _T(const(None, "null"), "null", f"NULL at position {node.pos}", literal=True)
        if isinstance(v, bool):
            return _T(const(v, "bool"), "bool", f"{node.text} at position {node.pos}", literal=True)
        if isinstance(v, int):
            if v < _INT64_MIN or v > _UINT64_MAX:
                raise ExpressionError(f"integer literal {node.text!r} at position {node.pos} is out of range", node.pos)
            kind = "uint" if v > _INT64_MAX else "int"
            return _T(const(v, kind), kind, f"the number {node.text} at position {node.pos}", literal=True)
        if isinstance(v, float):
            return _T(const(v, "float"), "float", f"the number {node.text} at position {node.pos}", literal=True)
        return _T(const(v, "str"), "str", f"the string literal {node.text} at position {node.pos}", literal=True)

    # -- dispatch ---------------------------------------------------------------------------------

    def visit(self, node: Node) -> _T:
        k = node.kind
        if k == "col":
            return self.column(node)
        if k == "lit":
            return self.literal(node)
        if k == "neg":
            return self.unary_numeric("neg", node, self.visit(node.args[0]))
        if k == "call":
            return self.unary_numeric(str(node.value), node, self.visit(node.args[0]))
        if k == "arith":
            return self.arith(node, self.visit(node.args[0]), self.visit(node.args[1]))
        if k == "cmp":
            return self.compare(node, node.op, self.visit(node.args[0]), self.visit(node.args[1]))
        if k in ("and", "or"):
            items = [self.boolean(self.visit(a), node) for a in node.args]
            return self.logic(k, items)
        if k == "not":
            return self.negate(self.boolean(self.visit(node.args[0]), node))
        if k == "isnull":
            return self.isnull(node, self.visit(node.args[0]))
        if k == "between":
            x, lo, hi = (self.visit(a) for a in node.args)
            out = self.logic("and", [self.compare(node, ">=", x, lo), self.compare(node, "<=", x, hi)])
            return self.negate(out) if node.negated else out
        if k == "in":
            x = self.visit(node.args[0])
            out = self.logic("or", [self.compare(node, "=", x, self.visit(a)) for a in node.args[1:]])
            return self.negate(out) if node.negated else out
        if k in ("like", "ilike"):
            return self.like(node, self.visit(node.args[0]), str(node.args[1].value))
        raise AssertionError(f"unknown node kind {k}")  # pragma: no cover - the parser makes only the above

    # -- booleans ---------------------------------------------------------------------------------

    def boolean(self, t: _T, node: Node) -> _T:
        if t.kind not in ("bool", "null"):
            raise ExpressionError(
                f"{node.text.upper()} at position {node.pos} needs conditions (true/false), but {t.what} is "
                f"{_kind_text(t)}",
                node.pos,
            )
        return t

    def logic(self, op: str, items: list[_T]) -> _T:
        exprs = tuple(const(None, "bool") if t.kind == "null" else t.expr for t in items)
        return _T(Expr(op, "bool", exprs), "bool", f"the {op.upper()} of {len(items)} conditions")

    def negate(self, t: _T) -> _T:
        if t.kind == "null":
            return _T(const(None, "bool"), "bool", t.what)
        return _T(Expr("not", "bool", (t.expr,)), "bool", f"NOT {t.what}")

    def isnull(self, node: Node, t: _T) -> _T:
        op = "notnull" if node.negated else "isnull"
        if t.expr.op == "const":
            return _T(const((t.expr.value is None) != node.negated, "bool"), "bool", "a constant", literal=True)
        return _T(Expr(op, "bool", (t.expr,)), "bool", f"IS NULL at position {node.pos}")

    def like(self, node: Node, x: _T, pattern: str) -> _T:
        if x.kind == "null":
            return _T(const(None, "bool"), "bool", x.what)
        if x.kind != "str" or x.literal:
            raise ExpressionError(
                f"{node.text.upper()} at position {node.pos} needs a string column on its left, but {x.what} is "
                f"{_kind_text(x)}",
                node.pos,
            )
        pieces = like_pattern(pattern, f"at position {node.args[1].pos}")
        out = Expr("like", "bool", (x.expr,), value=pieces, icase=node.kind == "ilike")
        t = _T(out, "bool", f"{node.text.upper()} at position {node.pos}")
        return self.negate(t) if node.negated else t

    # -- numbers ----------------------------------------------------------------------------------

    def numeric(self, t: _T, node: Node) -> None:
        if t.kind in ("int", "uint", "float", "null") and not (t.col and t.col.temporal):
            return
        if t.col is not None and t.col.temporal:
            raise ExpressionError(
                f"{_op_text(node)} at position {node.pos} needs numbers, but {t.what} is a {t.col.temporal}: "
                "temporal columns can only be compared (with ISO literals such as '2024-01-01 12:00' or with "
                "columns of the same type and unit)",
                node.pos,
            )
        raise ExpressionError(
            f"{_op_text(node)} at position {node.pos} needs numbers, but {t.what} is {_kind_text(t)}", node.pos
        )

    def unary_numeric(self, op: str, node: Node, x: _T) -> _T:
        self.numeric(x, node)
        what = f"{op}() at position {node.pos}" if node.kind == "call" else f"unary minus at position {node.pos}"
        if op in ("sqrt", "exp", "log") or x.kind == "float":
            kind = "float"
        else:
            kind = "int"  # uint64 arithmetic is int64 arithmetic (documented)
        if x.kind == "null":
            return _T(const(None, kind), "null", what, literal=True)
        e = _to(x, kind)
        if op in ("floor", "ceil") and kind == "int":
            return _T(e, kind, what)
        return _T(Expr(op, kind, (e,)), kind, what)

    def arith(self, node: Node, a: _T, b: _T) -> _T:
        self.numeric(a, node)
        self.numeric(b, node)
        op = _ARITH[node.op]
        ints = all(t.kind in ("int", "uint", "null") for t in (a, b))
        kind = "int" if ints and op in ("add", "sub", "mul", "mod") else "float"
        what = f"{node.op!r} at position {node.pos}"
        if a.kind == "null" or b.kind == "null":
            return _T(const(None, kind), "null", what, literal=True)
        if op == "pow" and b.expr.op == "const" and b.expr.value == 2:
            return _T(Expr("square", "float", (_to(a, "float"),)), "float", what)
        return _T(Expr(op, kind, (_to(a, kind), _to(b, kind))), kind, what)

    # -- comparisons ------------------------------------------------------------------------------

    def compare(self, node: Node, cmp: str, a: _T, b: _T) -> _T:
        op = _CMP[cmp]
        what = f"the comparison {cmp!r} at position {node.pos}"
        if a.kind == "null" or b.kind == "null":
            for t in (a, b):  # still refuse what could never be compared
                if t.col is not None and t.kind == "str" and cmp not in ("=", "!="):
                    self.compare_error(node, cmp, a, b, "strings can only be compared with = and != (or LIKE)")
            return _T(const(None, "bool"), "bool", what)
        ta, tb = a.col.temporal if a.col else "", b.col.temporal if b.col else ""
        if ta or tb:
            return self.compare_temporal(node, op, cmp, a, b)
        if a.kind == "str" or b.kind == "str":
            if a.kind != b.kind:
                self.compare_error(node, cmp, a, b, "a string can only be compared with a string")
            if cmp not in ("=", "!="):
                self.compare_error(node, cmp, a, b, "strings can only be compared with = and != (or LIKE)")
            if a.literal and b.literal:
                return _T(const((a.expr.value == b.expr.value) == (op == "eq"), "bool"), "bool", what, literal=True)
            ea, eb = (_str_const(t) for t in (a, b))
            return _T(Expr(op, "bool", (ea, eb)), "bool", what)
        if a.kind == "bool" or b.kind == "bool":
            if a.kind != b.kind:
                self.compare_error(node, cmp, a, b, "a boolean can only be compared with a boolean")
            if cmp not in ("=", "!="):
                self.compare_error(node, cmp, a, b, "booleans can only be compared with = and !=")
            return _T(Expr(op, "bool", (a.expr, b.expr)), "bool", what)
        if a.kind == "float" or b.kind == "float":
            return _T(Expr(op, "bool", (_to(a, "float"), _to(b, "float"))), "bool", what)
        return _T(Expr(op, "bool", (a.expr, b.expr)), "bool", what)  # int/uint, mixed compared exactly

    def compare_temporal(self, node: Node, op: str, cmp: str, a: _T, b: _T) -> _T:
        what = f"the comparison {cmp!r} at position {node.pos}"
        col, other = (a, b) if a.col and a.col.temporal else (b, a)
        info = col.col
        assert info is not None
        oc = other.col
        if oc is not None and oc.temporal:
            if (oc.temporal, oc.unit) != (info.temporal, info.unit):
                self.compare_error(node, cmp, a, b, "temporal columns compare only with the same type and unit")
            return _T(Expr(op, "bool", (a.expr, b.expr)), "bool", what)
        if info.temporal == "duration" and other.literal and other.kind == "int":
            return _T(Expr(op, "bool", (a.expr, b.expr)), "bool", what)
        if not (other.literal and other.kind == "str"):
            hint = (
                "compare it with an integer literal in the column's unit"
                if info.temporal == "duration"
                else "compare it with an ISO string literal such as '2024-01-01' or '2024-01-01 12:00:00'"
            )
            self.compare_error(node, cmp, a, b, hint)
        text = str(other.expr.value)
        try:
            if info.temporal == "time":
                ns = parse_time_ns(text)
            elif info.temporal == "duration":
                raise ValueError("durations compare with integer literals in the column's unit")
            else:
                ns = parse_instant_ns(text, info.tz if info.temporal == "timestamp" else "UTC")
        except ValueError as exc:
            raise ExpressionError(f"cannot read {other.what} as a value of {col.what}: {exc}", node.pos) from None
        unit = UNIT_NS[info.unit]
        column = col.expr
        if ns % unit == 0:
            lit = const(ns // unit, "int")
        else:  # the literal falls between two values of the column's unit: compare in a finer one
            finer = next(u for u in (10**9, 10**6, 10**3, 1) if ns % u == 0 and unit % u == 0)
            column = Expr("mul", "int", (column, const(unit // finer, "int")))
            lit = const(ns // finer, "int")
        if lit.value < _INT64_MIN or lit.value > _INT64_MAX:  # type: ignore[operator]
            raise ExpressionError(f"{other.what} is out of range for {col.what}", node.pos)
        args = (column, lit) if col is a else (lit, column)
        return _T(Expr(op, "bool", args), "bool", what)

    def compare_error(self, node: Node, cmp: str, a: _T, b: _T, why: str) -> None:
        raise ExpressionError(
            f"cannot compare {a.what} with {b.what} using {cmp!r} (at position {node.pos}): {why}", node.pos
        )


def _kind_text(t: _T) -> str:
    if t.col is not None and t.col.temporal:
        return f"a {t.col.temporal}"
    return {
        "str": "a string",
        "bool": "a condition (true/false)",
        "int": "a number",
        "uint": "a number",
        "float": "a number",
        "null": "NULL",
    }[t.kind]


def _op_text(node: Node) -> str:
    if node.kind == "call":
        return f"function {node.value}()"
    if node.kind == "neg":
        return "unary minus"
    return f"operator {node.text!r}"


def _to(t: _T, kind: str) -> Expr:
    """``t``'s IR converted to ``kind`` (float or int); constants are converted in place."""
    e = t.expr
    if t.kind == kind or t.kind == "null":
        return e
    if e.op == "const":
        v = e.value
        if kind == "float":
            return const(float(v), "float")  # type: ignore[arg-type]
        return const(int(np.array(v, dtype=np.uint64).view(np.int64)), "int")  # uint literal -> int64 wrap
    return Expr("tofloat" if kind == "float" else "toint", kind, (e,))


def _str_const(t: _T) -> Expr:
    if t.literal:
        return const(str(t.expr.value).encode("utf-8"), "str")
    return t.expr


def check(tree: Node, schema: pa.Schema) -> tuple[Expr, dict[str, ColumnInfo]]:
    """Type-check ``tree``; return the typed tree and the columns it reads (name -> info)."""
    checker = _Checker(schema)
    result = checker.visit(tree)
    if result.kind not in ("bool", "null"):
        raise ExpressionError(
            f"a where expression must be a condition (true/false), but this one is {_kind_text(result)}; "
            "compare it with something (e.g. '... > 0')",
            tree.pos,
        )
    expr = const(None, "bool") if result.kind == "null" else result.expr
    return expr, checker.used


# The Arrow type of a value expression's result, by kind (integers compute in int64, floats in float64).
VALUE_TYPES = {"bool": "bool_", "int": "int64", "uint": "uint64", "float": "float64"}


def check_value(tree: Node, schema: pa.Schema, text: str) -> tuple[Expr, dict[str, ColumnInfo]]:
    """Type-check a value expression (a new column): a number or a condition, never a string,
    a temporal value or a bare NULL (they have no column type to give)."""
    checker = _Checker(schema)
    result = checker.visit(tree)
    if result.col is not None and result.col.temporal:
        raise ExpressionError(
            f"the expression {text!r} is {result.what}: a {result.col.temporal} column can only be compared, "
            "not computed into a new column (select it to keep it)",
            tree.pos,
        )
    if result.kind == "str":
        raise ExpressionError(
            f"the expression {text!r} is {result.what}, a string: computed columns are numbers or conditions "
            "(select a string column to keep it)",
            tree.pos,
        )
    if result.kind == "null":
        raise ExpressionError(
            f"the expression {text!r} is always NULL and has no type: write it as a number or a condition "
            "(e.g. 'x / 0' is a float64 NULL, 'x > null' a bool NULL)",
            tree.pos,
        )
    return result.expr, checker.used
