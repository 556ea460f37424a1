"""``where`` expressions: parsed, type-checked against an Arrow schema, evaluated on the CPU or the GPU.

>>> import pyarrow as pa
>>> from pystrom.expr import compile_where
>>> p = compile_where("sqrt((x-200)^2 + (y-300)^2) < 10 and memo like '%abcd%'",
...                   pa.schema({"x": pa.float64(), "y": pa.float64(), "memo": pa.string()}))
>>> p.columns
('x', 'y', 'memo')

The language is described in ``docs/where.md``. The pieces: :mod:`._lexer` and :mod:`._parser`
(text to syntax tree, never ``eval``), :mod:`._check` (types, to the typed tree of :mod:`._ir`),
:mod:`._numpy` (CPU evaluator), :mod:`._cuda` (one generated CUDA kernel per predicate) and
:mod:`._prune` (min/max statistics: can a batch match at all?).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ExpressionError, SchemaMismatchError, UnsupportedTypeError
from ._check import ColumnInfo, check, column_info
from ._ir import Expr
from ._parser import parse

if TYPE_CHECKING:
    import pyarrow as pa

    from ..table import Table
    from ._cuda import CudaProgram

__all__ = ["compile_where", "Predicate"]


class Predicate:
    """A compiled ``where`` expression; made by :func:`compile_where`.

    Attributes
    ----------
    text : str
        The expression as given.
    columns : tuple of str
        The columns the predicate reads, in schema order.
    schema : pyarrow.Schema
        The schema it was checked against.
    """

    __slots__ = ("text", "columns", "schema", "_expr", "_infos", "_program")

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("Predicate objects come from pystrom.expr.compile_where(text, schema)")

    @classmethod
    def _make(cls, text: str, schema: pa.Schema, expr: Expr, infos: dict[str, ColumnInfo]) -> Predicate:
        self = object.__new__(cls)
        self.text = text
        self.schema = schema
        self.columns = tuple(f.name for f in schema if f.name in infos)
        self._expr = expr
        self._infos = infos
        self._program = None
        return self

    def evaluate(self, table: Table) -> Any:
        """Which rows of ``table`` satisfy the predicate.

        Parameters
        ----------
        table : pystrom.Table
            Must hold :attr:`columns` with the types the predicate was compiled for (other columns
            are ignored; the table may be a slice).

        Returns
        -------
        array of bool
            ``len == table.num_rows``, NumPy on the CPU, CuPy on the table's GPU: True only where
            the predicate is TRUE (NULL is not true). On a GPU the whole predicate runs as one kernel.
        """
        from ..table import Table

        if not isinstance(table, Table):
            raise UnsupportedTypeError(f"Predicate.evaluate needs a pystrom.Table, got {type(table).__name__}")
        self._check_table(table)
        if table._backend.kind == "cpu":
            from ._numpy import evaluate

            return evaluate(self._expr, table)
        return self._cuda().run(table)

    def may_match(self, stats: Mapping[str, tuple[Any, Any]]) -> bool:
        """False only when no row whose column values lie inside ``stats`` can satisfy the predicate.

        Parameters
        ----------
        stats
            ``{column: (min, max)}`` of the non-NULL values of a batch, in the column's storage form:
            int for integers, days (date32) / ms (date64) / integers in the column's unit (timestamp,
            time, duration), float, str for strings, bool. Columns left out are unconstrained.
        """
        from ._prune import may_match

        if not isinstance(stats, Mapping):
            raise UnsupportedTypeError(f"may_match needs a mapping of column -> (min, max), got {type(stats).__name__}")
        clean = {}
        for name in self.columns:
            if name in stats and stats[name] is not None:
                clean[name] = _stat_pair(name, self._infos[name], stats[name])
        return may_match(self._expr, clean)

    def _check_table(self, table: Table) -> None:
        for name in self.columns:
            col = table.column(name)  # ColumnNotFoundError names the column
            want = self._infos[name]
            try:
                got = column_info(name, col.type)
            except ExpressionError:
                got = None
            if got is None or (got.kind, got.dtype, got.temporal, got.unit) != (
                want.kind,
                want.dtype,
                want.temporal,
                want.unit,
            ):
                raise SchemaMismatchError(
                    f"column {name!r} has type {col.type} in the table, but the where expression {self.text!r} "
                    f"was compiled for {want.arrow}"
                )

    def _cuda(self) -> CudaProgram:
        if self._program is None:  # built once per predicate: the source depends only on it and the schema
            from ._cuda import CudaProgram

            kinds = {n: (self._infos[n].kind, self._infos[n].dtype) for n in self.columns}
            self._program = CudaProgram(self._expr, self.columns, kinds)
        return self._program

    def __repr__(self) -> str:
        return f"<pystrom.expr.Predicate {self.text!r} on {list(self.columns)}>"


def _stat_pair(name: str, info: ColumnInfo, pair: Any) -> tuple[Any, Any]:
    """(min, max) as Python values of the column's storage form; a clear error for anything else."""
    import numbers

    try:
        lo, hi = pair
    except (TypeError, ValueError):
        raise UnsupportedTypeError(f"statistics for column {name!r} must be a (min, max) pair, got {pair!r}") from None

    def one(v: Any) -> Any:
        if v is None:
            return None
        if info.kind == "bool" and isinstance(v, (bool, np.bool_)):
            return bool(v)
        if info.kind in ("int", "uint") and isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
            return int(v)
        if info.kind == "float" and isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)):
            return float(v)
        if info.kind == "str" and isinstance(v, (str, bytes)):
            return v
        unit = f" ({info.unit} since the epoch)" if info.temporal in ("date", "timestamp") else ""
        raise UnsupportedTypeError(
            f"statistics for column {name!r} ({info.arrow}) must be {_STAT_FORM[info.kind]}{unit}, got {v!r}"
        )

    return (one(lo), one(hi))


_STAT_FORM = {"bool": "bools", "int": "ints", "uint": "ints", "float": "floats", "str": "str"}


def compile_where(text: str, schema: pa.Schema) -> Predicate:
    """Parse and type-check a ``where`` expression against ``schema``.

    The language (see ``docs/where.md``): column names (bare, or "double quoted" with ``""`` for a
    quote), numbers, 'strings' (``''`` for a quote), true/false/null; ``+ - * / % ^ **`` and unary
    minus; ``= == != <> < <= > >=``; and/or/not; ``[not] between .. and ..``; ``[not] in (...)``;
    ``is [not] null``; ``[not] like`` / ``ilike`` with ``%`` and ``_``; functions ``sqrt abs exp log
    floor ceil`` (``log`` is the natural logarithm). Precedence as in PostgreSQL.

    Integer ``+ - * %`` and unary minus are int64 arithmetic that wraps on overflow; ``/``, ``^`` and
    sqrt/exp/log are float64; any float operand makes the operation float64. Division and ``%`` by
    zero give NULL (on both backends). Comparisons with NULL are NULL; and/or/not follow SQL's
    three-valued logic; rows where the whole predicate is NULL are not selected.

    Parameters
    ----------
    text : str
        The expression.
    schema : pyarrow.Schema
        The columns it may name, with their types.

    Returns
    -------
    Predicate

    Raises
    ------
    pystrom.errors.ExpressionError
        When the text does not parse or does not type-check; the message names the bad token or
        column and its position.
    """
    import pyarrow as pa

    if not isinstance(text, str):
        raise ExpressionError(f"a where expression must be a str, not {type(text).__name__}")
    if not isinstance(schema, pa.Schema):
        raise ExpressionError(f"compile_where needs a pyarrow.Schema, got {type(schema).__name__}")
    return _compile(text, schema)


@functools.lru_cache(maxsize=128)
def _compile(text: str, schema: pa.Schema) -> Predicate:
    tree = parse(text)
    expr, infos = check(tree, schema)
    return Predicate._make(text, schema, expr, infos)
