"""PostgreSQL result columns -> pystrom column types.

:func:`describe` runs the statement with ``LIMIT 0``, reads each result column's type OID and typmod,
names every type in one round trip (for messages) and maps each column to the decoder's kind and the
Table's Arrow type, or refuses it naming the column and the cast to add.

Arrays of bool, int2, int4, int8, float4 and float8 become ``list<T>``, or ``fixed_size_list<T>[d]``
when every non-NULL array of the column has the same length d >= 1. Which one is known only from the
rows: ``read_postgres`` decides after streaming, from the lengths the COPY pump counted anyway
(:func:`settle_arrays`, free); readers that need one schema before reading (``scan_postgres``,
``pystrom.dask.read_postgres``) ask the server first (``describe_read(..., arrays="server")``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..._types import ColumnType, column_type
from ...errors import ColumnNotFoundError, PostgresError, SchemaMismatchError, UnsupportedTypeError
from .pump import Kind
from .statement import Plan, cast_item, rewrite_columns

__all__ = [
    "PgColumn",
    "describe",
    "field_of",
    "leaf_columns",
    "describe_read",
    "check_partition_key",
    "array_columns",
    "settle_arrays",
]


@dataclass(frozen=True)
class PgColumn:
    name: str
    pg_type: str  # as PostgreSQL spells it, for messages
    kind: int
    type: ColumnType
    scale: int = 0
    text_cast: bool = False  # read as its text in the SELECT (statement.cast_item)
    dim: int = 0  # elements of a pgvector vector/halfvec column, or d of an array read as fixed_size_list
    lengths_open: bool = False  # an array column whose list/fixed_size_list choice waits for the rows
    # A range or composite read as a struct: its fields, then its validity (a bool, last); each part's
    # ``part_of`` says how its SQL follows from the struct's (_part_sql). Only leaves reach the decoders.
    parts: tuple[PgColumn, ...] = ()
    part_of: tuple[str, str] | None = None  # ("call", function) or ("field", name)
    text_array: int = 0  # text[] and the like: their element type's OID; read as binary, then made list<string>
    flatten: bool = False  # a multi-dimensional array: read flattened (ARRAY(SELECT unnest(c))), held with its shape


STRUCT_KIND = -1  # the kind of a struct column: never decoded itself (its leaves are)
PG_TYPE_KEY = b"pystrom.pg_type"  # field metadata of a struct read from a range or composite: its type


def leaf_columns(cols: Sequence[PgColumn]) -> list[PgColumn]:
    """The columns the COPY carries, in order: each struct's parts in its place (recursively), each
    named by its path so that no two are alike (the struct takes the names back: assemble.fold_structs)."""
    out: list[PgColumn] = []
    for c in cols:
        if c.parts:
            out.extend(leaf_columns([replace(p, name=f"{c.name}\x00{i}") for i, p in enumerate(c.parts)]))
        else:
            out.append(c)
    return out


def field_of(col: PgColumn) -> Any:
    """The Arrow field of a read column; a struct read from a range or composite says which in its metadata."""
    import pyarrow as pa

    metadata = {PG_TYPE_KEY: col.pg_type.encode()} if col.parts else None
    return pa.field(col.name, col.type.arrow, nullable=True, metadata=metadata)


def _part_items(col: PgColumn, expr: Any, alias: list[int]) -> list[Any]:
    """The select items of ``col``'s leaves, ``expr`` being ``col``'s SQL; aliases numbered by ``alias``."""
    from psycopg import sql

    if not col.parts:
        alias[0] += 1
        name = f"_pystrom_{alias[0]}"
        return [cast_item(expr, name) if col.text_cast else sql.SQL("{} AS {}").format(expr, sql.Identifier(name))]
    return [item for p in col.parts for item in _part_items(p, _part_sql(p.part_of, expr), alias)]


def flattened(expr: Any, name: str) -> Any:
    """A multi-dimensional array as the one-dimensional array of its elements in storage order (NULL stays NULL)."""
    from psycopg import sql

    return sql.SQL("CASE WHEN {e} IS NOT NULL THEN ARRAY(SELECT unnest({e})) END AS {n}").format(
        e=expr, n=sql.Identifier(name)
    )


def _part_sql(part_of: tuple[str, str], expr: Any) -> Any:
    from psycopg import sql

    how, what = part_of
    if how == "field":
        return sql.SQL("({}).{}").format(expr, sql.Identifier(what))
    return sql.SQL(what + "({})").format(expr)  # what: one of this module's function names, never user text


# One-dimensional arrays the decoders read: array type OID -> (kind, element type). Any lower bound.
_ARRAYS = {
    1000: (Kind.ARRAY_BOOL, "bool_"),
    1005: (Kind.ARRAY_INT2, "int16"),
    1007: (Kind.ARRAY_INT4, "int32"),
    1016: (Kind.ARRAY_INT8, "int64"),
    1021: (Kind.ARRAY_FLOAT4, "float32"),
    1022: (Kind.ARRAY_FLOAT8, "float64"),
}
# Casts that make other arrays readable (else their text).
_ARRAY_CASTS = {1231: "::float8[]", 1028: "::int8[]"}  # numeric[], oid[]


def _arrow_for(oid: int) -> tuple[int, Any] | None:
    import pyarrow as pa

    simple = {
        16: (Kind.BOOL, pa.bool_()),
        21: (Kind.INT2, pa.int16()),
        23: (Kind.INT4, pa.int32()),
        20: (Kind.INT8, pa.int64()),
        26: (Kind.OID, pa.uint32()),
        700: (Kind.FLOAT4, pa.float32()),
        701: (Kind.FLOAT8, pa.float64()),
        1082: (Kind.DATE, pa.date32()),
        1114: (Kind.TIMESTAMP, pa.timestamp("us")),
        1184: (Kind.TIMESTAMP, pa.timestamp("us", tz="UTC")),
        1083: (Kind.INT8, pa.time64("us")),  # time: int64 microseconds since midnight, as Arrow's time64[us]
        # bit, varbit: the value is their binary form (int32 bit count, then the bits, first bit in the
        # high bit of the first byte): Arrow has no bit string, and the count cannot be left out (varbit)
        1560: (Kind.VARLEN, pa.binary()),
        1562: (Kind.VARLEN, pa.binary()),
        25: (Kind.VARLEN, pa.utf8()),  # text
        1043: (Kind.VARLEN, pa.utf8()),  # varchar
        1042: (Kind.VARLEN, pa.utf8()),  # bpchar
        19: (Kind.VARLEN, pa.utf8()),  # name
        17: (Kind.VARLEN, pa.binary()),  # bytea
        # json and xml travel in binary COPY as their text (in the client encoding, UTF8 for the loader)
        114: (Kind.VARLEN, pa.utf8()),  # json
        142: (Kind.VARLEN, pa.utf8()),  # xml
        2950: (Kind.UUID, pa.uuid() if hasattr(pa, "uuid") else pa.binary(16)),
        # interval: its 16 binary bytes are copied as a uuid's are, then rewritten in place by
        # assemble.intervals_to_arrow (PG-Strom's pg2arrow mapping)
        1186: (Kind.UUID, pa.month_day_nano_interval()),
    }
    return simple.get(oid)


# Types whose binary form is not their text but whose text is what users read (jsonb's binary form is
# a version byte then the text; inet/cidr/macaddr's are address bytes): the server casts them.
_TEXT_CAST = {3802: "jsonb", 869: "inet", 650: "cidr", 829: "macaddr", 774: "macaddr8"}

_CAST_HINTS = {18: "::text"}  # "char"

# Types refused with a reason and the SQL to read them instead ({c}: the column as SQL spells it).
_REFUSED = {
    1266: (
        "a time of day with a time zone offset, which Arrow has no type for: read the UTC time of day "
        "(and the offset, extract(timezone FROM {c}), as a column of its own if needed)",
        "({c} AT TIME ZONE 'UTC')::time",
    ),
    3614: ("a text search vector, which has no Arrow form: read its text (or tsvector_to_array's)", "{c}::text"),
    3615: ("a text search query, which has no Arrow form: read its text", "{c}::text"),
}


_DESCRIBE_PREFIX = "SELECT * FROM ("


def _in_statement(exc: PostgresError, conn: Any, select: Any) -> str:
    """The server's refusal of the statement read, placed in that statement rather than in the
    ``SELECT * FROM (...) LIMIT 0`` that wraps it to learn its columns (the server's own context
    lines quote the wrapper, which the user never wrote)."""
    diag = getattr(exc.__cause__, "diag", None)
    primary = getattr(diag, "message_primary", None)
    if not primary:
        return str(exc)
    text = select.as_string(conn)
    message = f"PostgreSQL refused the statement read: {primary}"
    position = getattr(diag, "statement_position", None)
    if position and str(position).isdigit():
        at = int(position) - 1 - len(_DESCRIBE_PREFIX)
        if at >= len(text):
            message += f", at the end of the statement (it stops short): {_excerpt(text, len(text))}"
        elif at >= 0:
            message += f", at character {at + 1} of the statement: {_excerpt(text, at)}"
    else:
        message += f"; the statement: {_excerpt(text, 0)}"
    hint = getattr(diag, "message_hint", None)
    return message + (f" (hint: {hint})" if hint else "")


def _excerpt(text: str, at: int, width: int = 40) -> str:
    """``text`` around character ``at``, on one line, with ``>>>`` where the server points."""
    start, end = max(0, at - width), min(len(text), at + width)
    before, after = re.sub(r"\s+", " ", text[start:at]), re.sub(r"\s+", " ", text[at:end])
    return f"'{'...' if start else ''}{before}>>>{after}{'...' if end < len(text) else ''}'"


def describe(conn: Any, select: Any, numeric: str, run: Callable[..., Any]) -> list[PgColumn]:
    """Run ``select`` with ``LIMIT 0`` and map its columns, or raise naming the column at fault."""
    from psycopg import sql

    try:
        cur = run(conn, "describing the result", sql.SQL(_DESCRIBE_PREFIX + "{}) AS _pystrom_q LIMIT 0").format(select))
    except PostgresError as exc:
        raise PostgresError(_in_statement(exc, conn, select)) from (exc.__cause__ or exc)
    res = cur.pgresult
    encoding = conn.info.encoding if conn.info.encoding != "SQL_ASCII" else "utf-8"
    names = [res.fname(i).decode(encoding, "replace") for i in range(res.nfields)]
    oids = [res.ftype(i) for i in range(res.nfields)]
    typmods = [res.fmod(i) for i in range(res.nfields)]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SchemaMismatchError(f"the result has two columns named {name!r}: give them distinct aliases")
        seen.add(name)
    if not names:
        return []
    # Every column's type name and kind in one round trip (one per column took 10-20 ms for 100 columns).
    pg_types = run(
        conn,
        "naming the types",
        "SELECT format_type(o, m), pg_type.typtype, pg_type.typname, pg_type.typcategory, e.typtype "
        "FROM unnest(%s::oid[], %s::int4[]) WITH ORDINALITY AS t(o, m, i) "
        "LEFT JOIN pg_type ON pg_type.oid = t.o LEFT JOIN pg_type e ON e.oid = pg_type.typelem ORDER BY i",
        (oids, [m if m >= 0 else None for m in typmods]),
    ).fetchall()
    cols = []
    money_scale = None
    for name, oid, typmod, (pg_type, typtype, typname, category, element) in zip(names, oids, typmods, pg_types):
        if typname in _PGVECTOR:  # the extension's types have no fixed OIDs: known by name
            dim = typmod if typmod > 0 else _vector_dimension(conn, select, name, pg_type, run)
            cols.append(_vector_column(name, pg_type, typname, dim))
        elif typname == "sparsevec":
            raise UnsupportedTypeError(
                f"column {name!r} has type {pg_type}: sparse vectors are not read; cast it to a dense one, "
                f"e.g. {_quoted(name)}::vector"
            )
        elif oid in _ARRAYS:
            cols.append(_array_column(name, oid, pg_type))
        elif oid in _TEXT_ARRAYS:
            import pyarrow as pa

            arrow = pa.list_(pa.utf8())
            cols.append(PgColumn(name, pg_type, Kind.VARLEN, column_type(arrow, name), text_array=_TEXT_ARRAYS[oid]))
        elif category in ("A", b"A"):
            raise UnsupportedTypeError(_array_refusal(name, oid, pg_type, element))
        elif typtype in ("r", b"r", "c", b"c"):
            cols.append(_struct_column(conn, select, name, pg_type, typtype in ("r", b"r"), numeric, run))
        else:
            if oid == 790 and money_scale is None:
                money_scale = _money_scale(conn, run)
            cols.append(_map(name, oid, typmod, pg_type, numeric, typtype, money_scale or 0))
    return cols


_RANGE_PARTS = (("lower", "lower"), ("upper", "upper"), ("lower_inc", "lower_inc"), ("upper_inc", "upper_inc"),
                ("empty", "isempty"))  # fmt: skip


def _struct_column(
    conn: Any, select: Any, name: str, pg_type: str, is_range: bool, numeric: str, run: Callable[..., Any]
) -> PgColumn:
    """A range (struct<lower, upper, lower_inc, upper_inc, empty>) or composite (struct of its fields)
    column: its parts are described by the server as the columns of a SELECT of them, and read as such."""
    import pyarrow as pa
    from psycopg import sql

    x = sql.SQL("_pystrom_q.{}").format(sql.Identifier(name))
    if is_range:
        part_of = [("call", f) for _, f in _RANGE_PARTS]
        items = sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(_part_sql(p, x), sql.Identifier(n)) for p, (n, _) in zip(part_of, _RANGE_PARTS)
        )
    else:
        items = sql.SQL("({}).*").format(x)
    try:
        parts = describe(conn, sql.SQL("SELECT {} FROM ({}) AS _pystrom_q").format(items, select), numeric, run)
    except UnsupportedTypeError as exc:
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type}, read as a struct of its "
            f"{'bounds' if is_range else 'fields'}, and one of them is not read: {exc} (in SQL, the field is "
            f"({_quoted(name)}).field)"
        ) from None
    for p in parts:
        if p.kind in Kind.ARRAYS or p.kind in (Kind.VECTOR_F4, Kind.VECTOR_F2) or p.text_array:
            raise UnsupportedTypeError(
                f"column {name!r} has PostgreSQL type {pg_type}, whose field {p.name!r} is an array or vector "
                f"({p.pg_type}): read the fields as columns of their own, e.g. ({_quoted(name)}).*"
            )
    if not is_range:
        part_of = [("field", p.name) for p in parts]
    parts = [replace(p, part_of=f) for p, f in zip(parts, part_of)]
    valid = PgColumn(
        "valid", "boolean", Kind.BOOL, column_type(pa.bool_(), name),
        part_of=("call", "0 = num_nulls"),  # a composite of NULL fields is not NULL; num_nulls sees the value
    )  # fmt: skip
    arrow = pa.struct([pa.field(p.name, p.type.arrow) for p in parts])
    return PgColumn(name, pg_type, STRUCT_KIND, column_type(arrow, name), parts=(*parts, valid))


def _money_scale(conn: Any, run: Callable[..., Any]) -> int:
    """The fraction digits money has in this session (lc_monetary's; the server's own fallback is 2)."""
    return int(run(conn, "asking money's fraction digits", "SELECT scale('0'::money::numeric)").fetchone()[0])


# Arrays whose elements are text -> list<string>: array type OID -> element type OID (text_arrays.py)
_TEXT_ARRAYS = {1009: 25, 1015: 1043, 1014: 1042, 1003: 19}  # text[], varchar[], bpchar[], name[]


def _array_refusal(name: str, oid: int, pg_type: str, element_typtype: Any) -> str:
    ident = _quoted(name)
    head = f"column {name!r} has PostgreSQL type {pg_type} (oid {oid}), "
    if element_typtype in ("r", b"r", "c", b"c"):
        return head + f"an array of ranges or composites, which pystrom's tables cannot hold: e.g. {ident}::text"
    return (
        head + "an array whose elements read_postgres cannot decode (arrays of bool, int2, int4, int8, float4 and "
        f"float8 are read): add a cast in SQL, e.g. {ident}{_ARRAY_CASTS.get(oid, '::text')}"
    )


def _array_column(name: str, oid: int, pg_type: str) -> PgColumn:
    """An array column, list<T> until its rows (or the server) settle it."""
    import pyarrow as pa

    kind, element = _ARRAYS[oid]
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


def _server_lengths(conn: Any, select: Any, cols: list[PgColumn], run: Callable[..., Any]) -> list[PgColumn]:
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
        f"(WHERE array_dims({_quoted(col.name)}) = ...), or flatten them, "
        f"e.g. ARRAY(SELECT unnest({_quoted(col.name)}))"
    )


# pgvector's dense types -> (decoder kind, element type)
_PGVECTOR = {"vector": ("VECTOR_F4", "float32"), "halfvec": ("VECTOR_F2", "float16")}


def _vector_dimension(conn: Any, select: Any, name: str, pg_type: str, run: Callable[..., Any]) -> int:
    """The one dimension of an undeclared vector column, asked of the server before anything is
    allocated (a scan of the result computing vector_dims; declare the column as vector(n) to skip it)."""
    from psycopg import sql

    col = sql.SQL("_pystrom_q.{}").format(sql.Identifier(name))
    lo, hi = run(
        conn,
        f"finding the dimension of {name!r}",
        sql.SQL("SELECT min(vector_dims({})), max(vector_dims({})) FROM ({}) AS _pystrom_q").format(col, col, select),
    ).fetchone()
    if lo is None:
        raise UnsupportedTypeError(
            f"column {name!r} has type {pg_type} without a declared dimension and no non-NULL value to take "
            f"one from: cast it, e.g. {_quoted(name)}::{pg_type}(768)"
        )
    if lo != hi:
        # A cast to one dimension (e::vector(3)) fails on every other row: the hints are a filter or lists.
        ident = _quoted(name)
        raise SchemaMismatchError(
            f"column {name!r} ({pg_type}) holds vectors of {lo} to {hi} dimensions; a matrix needs one: "
            f"keep one dimension, e.g. WHERE vector_dims({ident}) = {hi}, or read them as lists, "
            f"{ident}::real[] (a list<float32> column)"
        )
    return int(lo)


def _vector_column(name: str, pg_type: str, typname: str, dim: int) -> PgColumn:
    import pyarrow as pa

    kind, element = _PGVECTOR[typname]
    arrow = pa.list_(pa.float32() if element == "float32" else pa.float16(), dim)
    return PgColumn(name, pg_type, getattr(Kind, kind), column_type(arrow, name), dim=dim)


def describe_read(
    conn: Any, plan: Plan, numeric: str, run: Callable[..., Any], arrays: str = "rows"
) -> tuple[Plan, list[PgColumn]]:
    """:func:`describe` of ``plan``'s SELECT, and the plan that reads it: with ``::text`` on the columns
    whose type is read as its text (jsonb, inet, cidr, macaddr, macaddr8). ``arrays``: ``"rows"`` leaves
    the array columns' list/fixed_size_list choice to the rows read (:func:`settle_arrays`);
    ``"server"`` settles it now by asking the server (one scan of the result, only with array columns)."""
    cols = describe(conn, plan.select, numeric, run)
    if arrays == "server":
        cols = _server_lengths(conn, plan.select, cols, run)
    alias = [0]
    rewrites = [
        (lambda e, c=c: _part_items(c, e, alias)) if c.parts else (lambda e, n=c.name: [cast_item(e, n)]) if c.text_cast
        else (lambda e, n=c.name: [flattened(e, n)]) if c.flatten else None
        for c in cols
    ]  # fmt: skip
    return rewrite_columns(plan, [c.name for c in cols], rewrites), cols


def _map(
    name: str, oid: int, typmod: int, pg_type: str, numeric: str, typtype: Any = None, money_scale: int = 2
) -> PgColumn:
    import pyarrow as pa

    if typtype in ("e", b"e"):  # an enum: binary COPY sends the label's text
        return PgColumn(name, pg_type, Kind.VARLEN, column_type(pa.utf8(), name))
    if oid in _TEXT_CAST:
        return PgColumn(name, pg_type, Kind.VARLEN, column_type(pa.utf8(), name), text_cast=True)

    if oid == 1700:  # numeric
        if numeric == "float64":
            return PgColumn(name, pg_type, Kind.NUMERIC_F64, column_type(pa.float64(), name))
        if typmod < 4:
            raise UnsupportedTypeError(
                f"column {name!r} is numeric without a declared precision and scale, which decimal128 needs: "
                f"cast it in SQL, e.g. {_quoted(name)}::numeric(18, 6), or read it with numeric='float64'"
            )
        precision = ((typmod - 4) >> 16) & 0xFFFF
        scale = (((typmod - 4) & 0x7FF) ^ 1024) - 1024  # PostgreSQL 15 allows negative scales
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            raise UnsupportedTypeError(
                f"column {name!r} has type {pg_type}, which decimal128 cannot hold (precision <= 38, "
                f"0 <= scale <= precision): cast it in SQL, e.g. {_quoted(name)}::numeric(38, 6), "
                "or use numeric='float64'"
            )
        return PgColumn(name, pg_type, Kind.NUMERIC_DEC128, column_type(pa.decimal128(precision, scale), name), scale)
    if oid == 790:  # money: int64 in units of the currency's fraction digits (lc_monetary's)
        return PgColumn(name, pg_type, Kind.MONEY, column_type(pa.decimal128(19, money_scale), name), money_scale)
    if oid in _REFUSED:
        why, how = _REFUSED[oid]
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type}, {why.format(c=_quoted(name))}, e.g. "
            + how.format(c=_quoted(name))
        )
    if typtype in ("m", b"m"):
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type}, a multirange, which is not read: read its ranges as rows "
            f"with unnest({_quoted(name)}) (each a struct), or its text, e.g. {_quoted(name)}::text"
        )
    mapped = _arrow_for(oid)
    if mapped is None:
        cast = _CAST_HINTS.get(oid, "::text")
        ident = _quoted(name)
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type} (oid {oid}), which read_postgres cannot decode: "
            f"add a cast in SQL, e.g. {ident}{cast}"
        )
    kind, arrow = mapped
    return PgColumn(name, pg_type, kind, column_type(arrow, name))


_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")


def _quoted(name: str) -> str:
    """``name`` as an SQL identifier in a hint: bare when PostgreSQL reads it back unchanged (lower case
    letters, digits, underscores), else in double quotes (``"Weird Col"``). Keywords are quoted too."""
    if _PLAIN_IDENTIFIER.fullmatch(name) and name not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


# Reserved words a bare column name cannot be (PostgreSQL's reserved keywords, appendix C).
_KEYWORDS = frozenset(
    "all analyse analyze and any array as asc asymmetric both case cast check collate column constraint create "
    "current_catalog current_date current_role current_time current_timestamp current_user default deferrable "
    "desc distinct do else end except false fetch for foreign from grant group having in initially intersect "
    "into lateral leading limit localtime localtimestamp not null offset on only or order placing primary "
    "references returning select session_user some symmetric system_user table then to trailing true union "
    "unique user using variadic when where window with".split()
)


def check_partition_key(cols: Sequence[PgColumn], key: str) -> None:
    for col in cols:
        if col.name == key:
            if col.kind not in (Kind.INT2, Kind.INT4, Kind.INT8):
                raise UnsupportedTypeError(
                    f"partition_on column {key!r} has type {col.pg_type}; it must be int2, int4 or int8"
                )
            return
    raise ColumnNotFoundError(f"partition_on column {key!r} is not in the result; columns: {[c.name for c in cols]}")
