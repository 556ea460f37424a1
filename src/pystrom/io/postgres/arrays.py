"""PostgreSQL arrays -> list, fixed_size_list and nested fixed_size_list columns.

Arrays of bool, int2, int4, int8, float4 and float8 become ``list<T>``, or ``fixed_size_list<T>[d]``
when every non-NULL array of the column has the same length d >= 1. Which one is known only from the
rows: ``read_postgres`` decides after streaming, from the lengths the COPY pump counted anyway
(:func:`settle_arrays`, free); readers that need one schema before reading (``scan_postgres``,
``pystrom.dask.read_postgres``) ask the server first (:func:`server_lengths`), which also gives
multi-dimensional arrays their one shape (nested fixed_size_lists, read flattened). Text-like arrays
(text[], varchar[], ...) are read as their binary form and parsed into list<string> (text_arrays.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._types import column_type
from ...errors import SchemaMismatchError
from .columns import PgColumn, leaf_columns, quoted
from .pump import Kind

__all__ = ["ARRAYS", "TEXT_ARRAYS", "array_refusal", "array_column", "array_columns", "settle_arrays",
           "server_lengths"]  # fmt: skip

ARRAYS = {
    1000: (Kind.ARRAY_BOOL, "bool_"),
    1005: (Kind.ARRAY_INT2, "int16"),
    1007: (Kind.ARRAY_INT4, "int32"),
    1016: (Kind.ARRAY_INT8, "int64"),
    1021: (Kind.ARRAY_FLOAT4, "float32"),
    1022: (Kind.ARRAY_FLOAT8, "float64"),
}
# Casts that make other arrays readable (else their text).
_ARRAY_CASTS = {1231: "::float8[]", 1028: "::int8[]"}  # numeric[], oid[]


# Arrays whose elements are text -> list<string>: array type OID -> element type OID (text_arrays.py)
TEXT_ARRAYS = {1009: 25, 1015: 1043, 1014: 1042, 1003: 19}  # text[], varchar[], bpchar[], name[]


def array_refusal(name: str, oid: int, pg_type: str, element_typtype: Any) -> str:
    ident = quoted(name)
    head = f"column {name!r} has PostgreSQL type {pg_type} (oid {oid}), "
    if element_typtype in ("r", b"r", "c", b"c"):
        return head + f"an array of ranges or composites, which pystrom's tables cannot hold: e.g. {ident}::text"
    return (
        head + "an array whose elements read_postgres cannot decode (arrays of bool, int2, int4, int8, float4 and "
        f"float8 are read): add a cast in SQL, e.g. {ident}{_ARRAY_CASTS.get(oid, '::text')}"
    )


def array_column(name: str, oid: int, pg_type: str) -> PgColumn:
    """An array column, list<T> until its rows (or the server) settle it."""
    import pyarrow as pa

    kind, element = ARRAYS[oid]
    arrow = pa.list_(getattr(pa, element)())
    return PgColumn(name, pg_type, kind, column_type(arrow, name), lengths_open=True)


def array_columns(cols: Sequence[PgColumn]) -> list[int]:
    """The indices of the array columns among the leaves (the COPY pump counts their elements)."""
    return [i for i, c in enumerate(leaf_columns(cols)) if c.kind in Kind.ARRAYS]


def _settled(col: PgColumn, least: int | None, greatest: int | None, shape: Sequence[int] = ()) -> PgColumn:
    """An array column as fixed_size_list<T>[d] when its non-NULL arrays all have d >= 1 elements, else list<T>;
    with ``shape`` (d1, d2, ...): arrays of that shape, as nested fixed_size_lists, read flattened."""
    import pyarrow as pa

    child = col.type.arrow.value_type
    if shape:
        arrow = child
        for d in reversed(shape):
            arrow = pa.list_(arrow, int(d))
        dim = int(np.prod(shape))
        return PgColumn(col.name, col.pg_type, col.kind, column_type(arrow, col.name), dim=dim, flatten=True)
    dim = int(least) if least is not None and least == greatest and least >= 1 else 0
    arrow = pa.list_(child, dim) if dim else pa.list_(child)
    return PgColumn(col.name, col.pg_type, col.kind, column_type(arrow, col.name), dim=dim)


def settle_arrays(cols: Sequence[PgColumn], least: Sequence[int], greatest: Sequence[int]) -> list[PgColumn]:
    """The columns with each open array column settled from the lengths the pump counted (least and
    greatest over its non-NULL arrays; greatest < 0: none)."""
    return [_settled(c, int(least[i]), int(greatest[i])) if c.lengths_open else c for i, c in enumerate(cols)]


def server_lengths(conn: Any, select: Any, cols: list[PgColumn], run: Callable[..., Any]) -> list[PgColumn]:
    """Settle the array columns before reading, by one scan of the result on the server (the least and
    greatest cardinality and the most dimensions of each): for readers whose batches or partitions
    must all have one schema."""
    from psycopg import sql

    arrays = [i for i, c in enumerate(cols) if c.kind in Kind.ARRAYS]  # top-level (structs hold no arrays)
    if not arrays:
        return cols
    parts = []
    for i in arrays:
        col = sql.SQL("_pystrom_q.{}").format(sql.Identifier(cols[i].name))
        parts.append(sql.SQL("min(cardinality({c})), max(cardinality({c})), max(array_ndims({c}))").format(c=col))
    row = run(
        conn,
        "checking the lengths of the array columns",
        sql.SQL("SELECT {} FROM ({}) AS _pystrom_q").format(sql.SQL(", ").join(parts), select),
    ).fetchone()
    out = list(cols)
    for j, i in enumerate(arrays):
        least, greatest, ndims = row[3 * j : 3 * j + 3]
        shape: tuple[int, ...] = ()
        if ndims is not None and ndims > 1:
            shape = _array_shape(conn, select, cols[i], ndims, run)
        out[i] = _settled(cols[i], least, greatest, shape)
    return out


def _array_shape(conn: Any, select: Any, col: PgColumn, ndims: int, run: Callable[..., Any]) -> tuple[int, ...]:
    """The one shape of a column's multi-dimensional arrays (every non-NULL one must have it), or a refusal
    naming the first row whose array differs (rows counted in the result's order, from 0)."""
    from psycopg import sql

    c = sql.SQL("_pystrom_q.{}").format(sql.Identifier(col.name))
    parts = [sql.SQL("min(array_ndims({c}))").format(c=c)]
    for k in range(1, ndims + 1):
        parts.append(sql.SQL("min(array_length({c}, {k})), max(array_length({c}, {k}))").format(c=c, k=sql.Literal(k)))
    row = run(
        conn,
        f"checking the shape of the arrays of {col.name!r}",
        sql.SQL("SELECT {} FROM ({}) AS _pystrom_q").format(sql.SQL(", ").join(parts), select),
    ).fetchone()
    least_ndims, bounds = row[0], row[1:]
    shape = tuple(bounds[0::2])
    if least_ndims == ndims and all(lo == hi for lo, hi in zip(bounds[0::2], bounds[1::2])):
        return tuple(int(d) for d in shape)
    lengths = "ARRAY(SELECT array_length({a}, i) FROM generate_series(1, array_ndims({a})) i)"
    dims = run(
        conn,
        f"finding a row of {col.name!r} of another shape",
        sql.SQL(
            "WITH r AS (SELECT row_number() OVER () - 1 AS n, {c} AS a FROM ({s}) AS _pystrom_q), "
            "f AS (SELECT n, a FROM r WHERE a IS NOT NULL ORDER BY n LIMIT 1) "
            "SELECT r.n, array_dims(r.a), f.n, array_dims(f.a) FROM r, f WHERE r.a IS NOT NULL AND "
            + lengths.format(a="r.a")
            + " <> "
            + lengths.format(a="f.a")
            + " ORDER BY r.n LIMIT 1"
        ).format(c=c, s=select),
    ).fetchone()
    ragged = least_ndims == ndims
    raise SchemaMismatchError(
        f"column {col.name!r} ({col.pg_type}) holds {ndims}-dimensional arrays of more than one "
        f"{'shape' if ragged else 'number of dimensions'}, which nested fixed_size_lists cannot hold "
        f"(row {dims[0]} is {dims[1]}, row {dims[2]} {dims[3]}): keep one shape "
        f"(WHERE array_dims({quoted(col.name)}) = ...), or flatten them, "
        f"e.g. ARRAY(SELECT unnest({quoted(col.name)}))"
    )


# pgvector's dense types -> (decoder kind, element type)
