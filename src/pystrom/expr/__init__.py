"""``where`` expressions: parsed, type-checked against an Arrow schema, evaluated on the CPU or the GPU.

>>> import pyarrow as pa
>>> from pystrom.expr import compile_where
>>> p = compile_where("sqrt((x-200)^2 + (y-300)^2) < 10 and memo like '%abcd%'",
...                   pa.schema({"x": pa.float64(), "y": pa.float64(), "memo": pa.string()}))
>>> p.columns
('x', 'y', 'memo')

The language is described in ``docs/where.md``. :func:`compile_expression` checks the same language
as a value (a number or a condition) for ``Table.with_columns``. The pieces: :mod:`._lexer` and :mod:`._parser`
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
from ..table import Table
from ._check import VALUE_TYPES, ColumnInfo, check, check_value, column_info
from ._ir import Expr
from ._parser import parse

if TYPE_CHECKING:
    import pyarrow as pa

    from ._cuda import CudaColumnsProgram, CudaProgram

__all__ = ["compile_where", "Predicate", "compile_expression", "Expression"]


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
        _check_table(self.text, self.columns, self._infos, table)

    def _cuda(self) -> CudaProgram:
        if self._program is None:  # built once per predicate: the source depends only on it and the schema
            from ._cuda import CudaProgram

            kinds = {n: (self._infos[n].kind, self._infos[n].dtype) for n in self.columns}
            self._program = CudaProgram(self._expr, self.columns, kinds)
        return self._program

    def __repr__(self) -> str:
        return f"<pystrom.expr.Predicate {self.text!r} on {list(self.columns)}>"


def _check_table(
    text: str, columns: tuple[str, ...], infos: dict[str, ColumnInfo], table: Table, what: str = "where expression"
) -> None:
    for name in columns:
        col = table.column(name)  # ColumnNotFoundError names the column
        want = infos[name]
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
                f"column {name!r} has type {col.type} in the table, but the {what} {text!r} "
                f"was compiled for {want.arrow}"
            )


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


class Expression:
    """A compiled value expression (a computed column); made by :func:`compile_expression`.

    Attributes
    ----------
    text : str
        The expression as given.
    columns : tuple of str
        The columns it reads, in schema order.
    schema : pyarrow.Schema
        The schema it was checked against.
    type : pyarrow.DataType
        The result's type: ``bool``, ``int64``, ``uint64`` (a bare uint64 column) or ``float64``.
    """

    __slots__ = ("text", "columns", "schema", "type", "_expr", "_infos")

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("Expression objects come from pystrom.expr.compile_expression(text, schema)")

    @classmethod
    def _make(cls, text: str, schema: pa.Schema, expr: Expr, infos: dict[str, ColumnInfo]) -> Expression:
        import pyarrow as pa

        self = object.__new__(cls)
        self.text = text
        self.schema = schema
        self.columns = tuple(f.name for f in schema if f.name in infos)
        self.type = getattr(pa, VALUE_TYPES[expr.kind])()
        self._expr = expr
        self._infos = infos
        return self

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of the values (bool, int64, uint64 or float64)."""
        return np.dtype(self.type.to_pandas_dtype())

    def may_be_null(self, table: Table) -> bool:
        """Whether some row of ``table`` could get NULL: a column read has NULLs there, or the
        expression divides (a zero divisor is NULL) or holds a NULL literal."""
        nullable = {n for n in self.columns if table.column(n).null_count}
        return _may_be_null(self._expr, nullable)

    def __repr__(self) -> str:
        return f"<pystrom.expr.Expression {self.text!r} -> {self.type} on {list(self.columns)}>"


def _may_be_null(e: Expr, nullable: set[str]) -> bool:
    if e.op == "col":
        return str(e.value) in nullable
    if e.op == "const":
        return e.value is None
    if e.op in ("isnull", "notnull"):
        return False
    if e.op in ("div", "mod"):
        return True
    return any(_may_be_null(a, nullable) for a in e.args)


def compile_expression(text: str, schema: pa.Schema) -> Expression:
    """Parse and type-check a value expression: the ``where`` language, but its result may be a
    number as well as a condition (``"weight / height^2"``, ``"age >= 65 or bmi > 30"``).

    Integer results are int64 (a bare uint64 column stays uint64), other numbers float64, conditions
    bool, with the rules of :func:`compile_where` (int64 wrapping, NULL for a zero divisor, SQL's
    NULL logic). Strings, temporal values and a bare NULL are refused: they have no computed type.

    Raises
    ------
    pystrom.errors.ExpressionError
        When the text does not parse or type-check; the message names the expression, the bad
        token or column (with its type) and its position.
    """
    import pyarrow as pa

    if not isinstance(text, str):
        raise ExpressionError(f"an expression must be a str, not {type(text).__name__}")
    if not isinstance(schema, pa.Schema):
        raise ExpressionError(f"compile_expression needs a pyarrow.Schema, got {type(schema).__name__}")
    return _compile_expression(text, schema)


@functools.lru_cache(maxsize=128)
def _compile_expression(text: str, schema: pa.Schema) -> Expression:
    expr, infos = check_value(parse(text), schema, text)
    return Expression._make(text, schema, expr, infos)


def evaluate_columns(expressions: tuple[Expression, ...], table: Table, outputs: list[tuple[Any, Any]]) -> list:
    """Compute ``expressions`` over every row of ``table`` into ``outputs``.

    ``outputs[j]`` is (values array of ``expressions[j].dtype``, validity target or None) on the
    table's device. On the CPU the validity target is ignored and the validity is returned (bool
    arrays, None where no row is NULL). On a GPU all expressions run as one generated kernel that
    writes values and validity together; the validity target is the uint32 word view of the new
    column's bitmap (None when :meth:`Expression.may_be_null` is False), and the result is a list
    of the targets.
    """
    if not isinstance(table, Table):
        raise UnsupportedTypeError(f"evaluate_columns needs a pystrom.Table, got {type(table).__name__}")
    for e in expressions:
        _check_table(e.text, e.columns, e._infos, table, "expression")
    if table._backend.kind == "cpu":
        from ._numpy import evaluate_value

        return [evaluate_value(e._expr, table, values) for e, (values, _) in zip(expressions, outputs)]
    _columns_program(expressions).run(table, outputs)
    return [words for _, words in outputs]


@functools.lru_cache(maxsize=64)
def _columns_program(expressions: tuple[Expression, ...]) -> CudaColumnsProgram:
    """One generated kernel per tuple of expressions (built once; compiled once per device)."""
    from ._cuda import CudaColumnsProgram

    infos: dict[str, ColumnInfo] = {}
    for e in expressions:
        infos.update(e._infos)
    names = tuple(dict.fromkeys(n for e in expressions for n in e.columns))
    kinds = {n: (infos[n].kind, infos[n].dtype) for n in names}
    return CudaColumnsProgram(tuple(e._expr for e in expressions), names, kinds)
