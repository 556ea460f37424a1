"""UDF calls inside ``where`` strings: ``table.filter("dist(x, y) < 10 and z > 0")`` and scans.

In order: the text is tokenized (the where language's own lexer); each call of a registered UDF on
column names is cut out and replaced by a temporary column name (``"__udf0"``, ...); the rest is
compiled as an ordinary predicate over the schema plus those columns (one generated kernel on a GPU).
Evaluating it computes the UDF columns of the batch first, then the predicate. Min/max statistics
know nothing of a UDF's range: the temporary columns have none, so a conjunct that involves a UDF
never skips a batch (the other conjuncts still may).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ExpressionError, UnsupportedTypeError
from ..expr import Predicate, compile_where
from ..expr._lexer import tokenize
from ..table import Table
from ._row import UDFCall, registered

__all__ = ["compile_where_udf", "UDFPredicate"]


def _split(text: str, names: list[str]) -> tuple[str, dict[str, UDFCall]]:
    tokens = tokenize(text)
    out, calls, last, i = [], {}, 0, 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        u = registered(str(tok.value)) if tok.kind == "ident" else None
        if u is None or nxt is None or nxt.kind != "op" or nxt.value != "(":
            i += 1
            continue
        args, j = [], i + 2
        while True:
            a = tokens[j]
            if a.kind != "ident":
                raise ExpressionError(
                    f"udf {u.name} at position {tok.pos} takes column names as arguments; got {a.describe()}", a.pos
                )
            args.append(str(a.value))
            sep = tokens[j + 1]
            if sep.kind == "op" and sep.value == ")":
                break
            if sep.kind != "op" or sep.value != ",":
                raise ExpressionError(
                    f"udf {u.name} at position {tok.pos}: expected ',' or ')' (a udf takes column names as "
                    f"arguments), got {sep.describe()}",
                    sep.pos,
                )
            j += 2
        temp = _temp_name(len(calls), names)
        calls[temp] = UDFCall(u, tuple(args))
        out.append(text[last : tok.pos])
        out.append('"' + temp + '"')
        last = tokens[j + 1].pos + 1
        i = j + 2
    out.append(text[last:])
    return "".join(out), calls


def _temp_name(k: int, names: list[str]) -> str:
    name = f"__udf{k}"
    while name in names:
        name = "_" + name
    return name


class UDFPredicate:
    """A ``where`` predicate with UDF calls: the duck twin of :class:`pystrom.expr.Predicate`."""

    def __init__(self, text: str, inner: Predicate, calls: dict[str, UDFCall], schema: Any):
        self.text = text
        self.schema = schema
        self._inner = inner
        self._calls = calls
        used = {c for call in calls.values() for c in call.columns} | {c for c in inner.columns if c not in calls}
        self.columns = tuple(f.name for f in schema if f.name in used)

    def evaluate(self, table: Table) -> Any:
        from .._compute import with_arrays  # up: UDF columns are added where tables are built

        extended = with_arrays(table, {name: call.evaluate(table) for name, call in self._calls.items()})
        return self._inner.evaluate(extended)

    def may_match(self, stats: Any) -> bool:
        return self._inner.may_match(stats)  # the UDF columns have no statistics: unconstrained

    def __repr__(self) -> str:
        return f"<pystrom where {self.text!r} (with UDFs {', '.join(map(repr, self._calls.values()))})>"


def compile_where_udf(text: str, schema: Any) -> Any:
    """:func:`pystrom.expr.compile_where`, with calls of registered UDFs allowed."""
    import pyarrow as pa

    if not isinstance(text, str):
        return compile_where(text, schema)  # its error
    rewritten, calls = _split(text, list(schema.names))
    if not calls:
        return compile_where(text, schema)
    fields = list(schema)
    for name, call in calls.items():
        for c in call.columns:
            if c not in schema.names:
                raise ExpressionError(f"where {text!r}: {call!r} names no column {c!r}; the columns are {schema.names}")
        types = [schema.field(c).type for c in call.columns]
        for c, t in zip(call.columns, types):
            if not (
                pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_float32(t) or pa.types.is_float64(t)
            ):
                raise UnsupportedTypeError(
                    f"where {text!r}: {call!r}: column {c!r} has type {t}; user functions take bool, integer and "
                    "float32/float64 columns"
                )
        out = call.udf.result_dtype(tuple(np.dtype(t.to_pandas_dtype()) for t in types), call.columns)
        fields.append(pa.field(name, pa.from_numpy_dtype(out)))
    inner = compile_where(rewritten, pa.schema(fields))
    return UDFPredicate(text, inner, calls, schema)
