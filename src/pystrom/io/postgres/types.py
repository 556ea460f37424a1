"""PostgreSQL result columns -> pystrom column types.

:func:`describe` runs the statement with ``LIMIT 0``, reads each result column's type OID and typmod,
names every type in one round trip (for messages) and maps each column to the decoder's kind and the
Table's Arrow type, or refuses it naming the column and the cast to add.

Arrays are mapped in :mod:`.arrays` (``describe_read(..., arrays="server")`` settles them before reading);
ranges and composite types become structs whose parts the server sends as columns of their own
(:func:`_struct_column`, :mod:`.columns`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..._types import column_type
from ...errors import ColumnNotFoundError, PostgresError, SchemaMismatchError, UnsupportedTypeError
from .arrays import ARRAYS, TEXT_ARRAYS, array_column, array_refusal, server_lengths
from .columns import STRUCT_KIND, PgColumn, flattened, part_items, part_sql, quoted
from .pump import Kind
from .statement import Plan, cast_item, first_keyword, rewrite_columns

__all__ = ["describe", "describe_read", "check_partition_key"]


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
    message += f" (hint: {hint})" if hint else ""
    keyword = first_keyword(text)
    if getattr(diag, "sqlstate", None) == "42601" and keyword in _OTHER_STATEMENTS:
        message += (f"; read_postgres reads the rows of a query (SELECT, WITH ... SELECT, VALUES or TABLE): run a "
                    f"{keyword.upper()} statement with psycopg")  # fmt: skip
    return message


# Statements that cannot stand inside ``SELECT * FROM (...)`` (only SELECT, WITH ... SELECT, VALUES and TABLE
# can): a syntax error in one of them is that, not a typo inside a query.
_OTHER_STATEMENTS = frozenset(
    "insert update delete merge create drop alter truncate grant revoke copy vacuum analyze begin start commit "
    "rollback set reset call do refresh comment cluster reindex lock explain show listen notify prepare execute "
    "discard checkpoint".split()
)


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
                f"e.g. {quoted(name)}::vector"
            )
        elif oid in ARRAYS:
            cols.append(array_column(name, oid, pg_type))
        elif oid in TEXT_ARRAYS:
            import pyarrow as pa

            arrow = pa.list_(pa.utf8())
            cols.append(PgColumn(name, pg_type, Kind.VARLEN, column_type(arrow, name), text_array=TEXT_ARRAYS[oid]))
        elif category in ("A", b"A"):
            raise UnsupportedTypeError(array_refusal(name, oid, pg_type, element))
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
            sql.SQL("{} AS {}").format(part_sql(p, x), sql.Identifier(n)) for p, (n, _) in zip(part_of, _RANGE_PARTS)
        )
    else:
        items = sql.SQL("({}).*").format(x)
    try:
        parts = describe(conn, sql.SQL("SELECT {} FROM ({}) AS _pystrom_q").format(items, select), numeric, run)
    except UnsupportedTypeError as exc:
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type}, read as a struct of its "
            f"{'bounds' if is_range else 'fields'}, and one of them is not read: {exc} (in SQL, the field is "
            f"({quoted(name)}).field)"
        ) from None
    for p in parts:
        if p.kind in Kind.ARRAYS or p.kind in (Kind.VECTOR_F4, Kind.VECTOR_F2) or p.text_array:
            raise UnsupportedTypeError(
                f"column {name!r} has PostgreSQL type {pg_type}, whose field {p.name!r} is an array or vector "
                f"({p.pg_type}): read the fields as columns of their own, e.g. ({quoted(name)}).*"
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
            f"one from: cast it, e.g. {quoted(name)}::{pg_type}(768)"
        )
    if lo != hi:
        # A cast to one dimension (e::vector(3)) fails on every other row: the hints are a filter or lists.
        ident = quoted(name)
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
        cols = server_lengths(conn, plan.select, cols, run)
    alias = [0]
    rewrites = [
        (lambda e, c=c: part_items(c, e, alias)) if c.parts else (lambda e, n=c.name: [cast_item(e, n)]) if c.text_cast
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
                f"cast it in SQL, e.g. {quoted(name)}::numeric(18, 6), or read it with numeric='float64'"
            )
        precision = ((typmod - 4) >> 16) & 0xFFFF
        scale = (((typmod - 4) & 0x7FF) ^ 1024) - 1024  # PostgreSQL 15 allows negative scales
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            raise UnsupportedTypeError(
                f"column {name!r} has type {pg_type}, which decimal128 cannot hold (precision <= 38, "
                f"0 <= scale <= precision): cast it in SQL, e.g. {quoted(name)}::numeric(38, 6), "
                "or use numeric='float64'"
            )
        return PgColumn(name, pg_type, Kind.NUMERIC_DEC128, column_type(pa.decimal128(precision, scale), name), scale)
    if oid == 790:  # money: int64 in units of the currency's fraction digits (lc_monetary's)
        return PgColumn(name, pg_type, Kind.MONEY, column_type(pa.decimal128(19, money_scale), name), money_scale)
    if oid in _REFUSED:
        why, how = _REFUSED[oid]
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type}, {why.format(c=quoted(name))}, e.g. "
            + how.format(c=quoted(name))
        )
    if typtype in ("m", b"m"):
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type}, a multirange, which is not read: read its ranges as rows "
            f"with unnest({quoted(name)}) (each a struct), or its text, e.g. {quoted(name)}::text"
        )
    mapped = _arrow_for(oid)
    if mapped is None:
        cast = _CAST_HINTS.get(oid, "::text")
        ident = quoted(name)
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type} (oid {oid}), which read_postgres cannot decode: "
            f"add a cast in SQL, e.g. {ident}{cast}"
        )
    kind, arrow = mapped
    return PgColumn(name, pg_type, kind, column_type(arrow, name))


def check_partition_key(cols: Sequence[PgColumn], key: str) -> None:
    for col in cols:
        if col.name == key:
            if col.kind not in (Kind.INT2, Kind.INT4, Kind.INT8):
                raise UnsupportedTypeError(
                    f"partition_on column {key!r} has type {col.pg_type}; it must be int2, int4 or int8"
                )
            return
    raise ColumnNotFoundError(f"partition_on column {key!r} is not in the result; columns: {[c.name for c in cols]}")
