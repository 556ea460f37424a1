"""Table columns -> PostgreSQL column types, and the statements that create and fill tables for a write.

:func:`target_columns` maps each column written to the PostgreSQL type a user would declare for it and
to the encoder's kind (csrc/pg_encode.hpp, kernels/pg_encode.cu), or refuses it naming the column.
:func:`create_table` composes ``CREATE [UNLOGGED] TABLE`` with :mod:`psycopg.sql` (identifiers are never
formatted into strings); :func:`copy_in_sql` the ``COPY ... FROM STDIN (FORMAT BINARY)`` that fills it.

=============================  ====================  ==================================================
pystrom (Arrow) type           PostgreSQL type       why
=============================  ====================  ==================================================
bool                           boolean
int8, uint8, int16             smallint              PostgreSQL has no 1-byte integer
uint16, int32                  integer
uint32, int64                  bigint                uint32 holds counts and ids: bigint keeps every
                                                     value and its arithmetic (oid is a system type)
uint64                         numeric(20, 0)        bigint would overflow past 2^63 - 1
float16, float32 / float64     real / double         NaN and +-Infinity kept
decimal128(p, s)               numeric(p, s)         exact; s < 0 refused (cast first)
date32, date64                 date                  the largest/smallest value: +-infinity
timestamp[unit]                timestamp             microseconds (ns floored); +-infinity as read
timestamp[unit, tz]            timestamptz           the values are UTC instants
time32, time64                 time                  microseconds (ns floored)
duration[unit]                 interval              microseconds, no days or months
month_day_nano_interval        interval              months, days, microseconds (ns floored)
string / binary                text / bytea          text must be valid in the server's encoding
fixed_size_binary(w)           bytea
uuid                           uuid
list<T>, fixed_size_list<T>    T[] (one dimension)   T as above (uint64: numeric(20, 0)[]); NULL
                                                     elements kept
fixed_size_list<float32>[d]    vector(d)             pgvector: with vector=True or into an existing
fixed_size_list<float16>[d]    halfvec(d)            vector/halfvec column (else real[])
binary into bit / varbit       varbit                the value is PostgreSQL's binary form of the bits
list<string>                   text[]                into varchar[]/bpchar[]/name[] too (encode_composed)
fixed_size_list<fixed_size_..  T[] of n dimensions   the shape kept (encode_composed)
struct of a range's parts      its range             by the bounds: int32/int64/date32/timestamp[tz]/
                                                     decimal128 -> int4/int8/date/ts/tstz/numrange
struct (a composite's fields)  its composite type    named by the field's pystrom.pg_type metadata or the
                                                     existing target column; the type must exist
=============================  ====================  ==================================================
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..._types import Layout
from ...errors import ColumnNotFoundError, InvalidArgumentError, SchemaMismatchError, UnsupportedTypeError
from .statement import check_identifier_length

__all__ = [
    "check_write_order",
    "EncodeKind",
    "retarget",
    "vector_column",
    "ENCODE_FAILURES",
    "WriteColumn",
    "target_columns",
    "target_name",
    "create_table",
    "copy_in_sql",
    "insert_select",
]


class EncodeKind:
    """Source kinds of the encoders (csrc/pg_encode.hpp)."""

    BOOL = 0
    INT8 = 1
    UINT8 = 2
    INT16 = 3
    UINT16 = 4
    INT32 = 5
    UINT32 = 6
    INT64 = 7
    UINT64 = 8
    FLOAT16 = 9
    FLOAT32 = 10
    FLOAT64 = 11
    DECIMAL = 12
    DATE32 = 13
    DATE64 = 14
    TIMESTAMP = 15
    TIME32 = 16
    TIME64 = 17
    INTERVAL = 18
    VARLEN = 19
    FIXED = 20
    MDN_INTERVAL = 21
    ARRAY = 22
    VECTOR = 23


# Encoder failure codes (csrc/pg_encode.hpp) and what they mean to a user.
ENCODE_FAILURES = {
    1: "a date or timestamp outside PostgreSQL's range (4713 BC to 5874897 AD for dates, 294276 AD for timestamps)",
    2: "a time of day outside 00:00 .. 24:00",
    3: "a duration whose microseconds overflow int64",
    4: "a NULL element in a vector (pgvector's vectors have none: fill or drop it first)",
    5: "NaN or +-Infinity in a vector (pgvector refuses them)",
    6: "a value larger than PostgreSQL's 1 GB field limit",
}

# A list element's NumPy dtype -> (encoder kind, PostgreSQL element type)
_ELEMENTS = {
    "bool": (EncodeKind.BOOL, "boolean"),
    "int8": (EncodeKind.INT8, "smallint"),
    "uint8": (EncodeKind.UINT8, "smallint"),
    "int16": (EncodeKind.INT16, "smallint"),
    "uint16": (EncodeKind.UINT16, "integer"),
    "int32": (EncodeKind.INT32, "integer"),
    "uint32": (EncodeKind.UINT32, "bigint"),
    "int64": (EncodeKind.INT64, "bigint"),
    "uint64": (EncodeKind.UINT64, "numeric(20, 0)"),
    "float16": (EncodeKind.FLOAT16, "real"),
    "float32": (EncodeKind.FLOAT32, "real"),
    "float64": (EncodeKind.FLOAT64, "double precision"),
}
# pgvector's dense types by element dtype, and the most dimensions either takes (VECTOR_MAX_DIM, HALFVEC_MAX_DIM)
_VECTORS = {"float32": (EncodeKind.FLOAT32, "vector"), "float16": (EncodeKind.FLOAT16, "halfvec")}
VECTOR_MAX_DIM = 16000

# WriteColumn.param of a VARLEN column sent as the binary form encode_composed builds (text arrays, ranges,
# composites): its pg_type is a range's or text[], or COMPOSITE until the server names the composite type
PRE_ENCODED = 1
COMPOSITE = "composite"
PG_TYPE_KEY = b"pystrom.pg_type"  # the field metadata read_postgres gives a struct read from a range or composite
RANGE_FIELDS = ("lower", "upper", "lower_inc", "upper_inc", "empty")

# unit -> (multiplier, divisor) to microseconds
_MICROS = {"s": (1_000_000, 1), "ms": (1_000, 1), "us": (1, 1), "ns": (1, 1_000)}


@dataclass(frozen=True)
class WriteColumn:
    name: str
    pg_type: str  # SQL type text, composed into DDL with sql.SQL (ours, never the user's)
    kind: int
    param: int = 0  # decimal scale, fixed width, unit multiplier or a list's element kind
    div: int = 1  # unit divisor (ns); d of a fixed_size_list or vector


def vector_column(name: str, ctype: Any) -> WriteColumn:
    """A fixed_size_list<float32|float16>[d] column as pgvector's vector(d) | halfvec(d), or refused."""
    element = ctype.storage.name if ctype.layout in Layout.NESTED else None
    if ctype.layout != Layout.FIXED_LIST or element not in _VECTORS:
        raise UnsupportedTypeError(
            f"column {name!r} has type {ctype.arrow}, which is not sent as a pgvector vector: vectors come from "
            "fixed_size_list<float32> (vector) or <float16> (halfvec) columns, e.g. a 2-D float32 array"
            + (" (cast it to float32 first)" if element == "float64" else "")
        )
    d = ctype.list_size
    if not 1 <= d <= VECTOR_MAX_DIM:
        raise UnsupportedTypeError(
            f"column {name!r} has type {ctype.arrow}: pgvector's vectors have 1 to {VECTOR_MAX_DIM} dimensions"
        )
    kind, pg = _VECTORS[element]
    return WriteColumn(name, f"{pg}({d})", EncodeKind.VECTOR, kind, d)


def range_type(arrow: Any) -> str | None:
    """The built-in range a struct of a range's parts goes to by default (by its bounds' type), or None."""
    import pyarrow as pa
    import pyarrow.types as pt

    if [f.name for f in arrow] != list(RANGE_FIELDS):
        return None
    bound = arrow.field("lower").type
    if arrow.field("upper").type != bound or any(arrow.field(f).type != pa.bool_() for f in RANGE_FIELDS[2:]):
        return None
    if pt.is_timestamp(bound):
        return "tstzrange" if bound.tz else "tsrange"
    if pt.is_decimal128(bound):
        return "numrange"
    return {pa.date32(): "daterange", pa.int32(): "int4range", pa.int64(): "int8range"}.get(bound)


def _composed(name: str, ctype: Any) -> WriteColumn | None:
    """How a struct or list<C> column is sent (as the binary form encode_composed builds), or a refusal."""
    import pyarrow.types as pt

    if ctype.layout == Layout.LIST_OF:
        if pt.is_string(ctype.children[0].storage_arrow):
            return WriteColumn(name, "text[]", EncodeKind.VARLEN, PRE_ENCODED)
        raise UnsupportedTypeError(
            f"column {name!r} has type {ctype.arrow}, which write_postgres cannot send: lists of strings go as "
            "text[], lists of numbers and booleans as arrays of them; write a list's elements as rows of a table "
            "of their own"
        )
    if ctype.layout == Layout.STRUCT:
        kind = range_type(ctype.storage_arrow)
        return WriteColumn(name, kind or COMPOSITE, EncodeKind.VARLEN, PRE_ENCODED)
    return None


def _map(name: str, ctype: Any) -> WriteColumn:
    import pyarrow as pa
    import pyarrow.types as pt

    arrow = ctype.arrow
    if isinstance(arrow, pa.BaseExtensionType):
        if arrow.extension_name == "arrow.uuid" and ctype.width == 16:
            return WriteColumn(name, "uuid", EncodeKind.FIXED, 16)
        arrow = arrow.storage_type
    simple = {
        pa.bool_(): ("boolean", EncodeKind.BOOL),
        pa.int8(): ("smallint", EncodeKind.INT8),
        pa.uint8(): ("smallint", EncodeKind.UINT8),
        pa.int16(): ("smallint", EncodeKind.INT16),
        pa.uint16(): ("integer", EncodeKind.UINT16),
        pa.int32(): ("integer", EncodeKind.INT32),
        pa.uint32(): ("bigint", EncodeKind.UINT32),
        pa.int64(): ("bigint", EncodeKind.INT64),
        pa.uint64(): ("numeric(20, 0)", EncodeKind.UINT64),
        pa.float16(): ("real", EncodeKind.FLOAT16),
        pa.float32(): ("real", EncodeKind.FLOAT32),
        pa.float64(): ("double precision", EncodeKind.FLOAT64),
        pa.date32(): ("date", EncodeKind.DATE32),
        pa.date64(): ("date", EncodeKind.DATE64),
        pa.string(): ("text", EncodeKind.VARLEN),
        pa.binary(): ("bytea", EncodeKind.VARLEN),
    }
    if arrow in simple:
        pg_type, kind = simple[arrow]
        return WriteColumn(name, pg_type, kind)
    if pt.is_decimal128(arrow):
        if arrow.scale < 0:
            raise UnsupportedTypeError(
                f"column {name!r} has type {arrow} with a negative scale, which write_postgres does not send: "
                "cast it to a decimal128 with scale >= 0 first"
            )
        return WriteColumn(name, f"numeric({arrow.precision}, {arrow.scale})", EncodeKind.DECIMAL, arrow.scale)
    if pt.is_timestamp(arrow):
        mul, div = _MICROS[arrow.unit]
        return WriteColumn(name, "timestamptz" if arrow.tz else "timestamp", EncodeKind.TIMESTAMP, mul, div)
    if pt.is_time32(arrow) or pt.is_time64(arrow):
        mul, div = _MICROS[arrow.unit]
        return WriteColumn(name, "time", EncodeKind.TIME32 if pt.is_time32(arrow) else EncodeKind.TIME64, mul, div)
    if pt.is_duration(arrow):
        mul, div = _MICROS[arrow.unit]
        return WriteColumn(name, "interval", EncodeKind.INTERVAL, mul, div)
    if pt.is_fixed_size_binary(arrow) and ctype.layout == Layout.BYTES:
        return WriteColumn(name, "bytea", EncodeKind.FIXED, ctype.width)
    if arrow == pa.month_day_nano_interval():
        return WriteColumn(name, "interval", EncodeKind.MDN_INTERVAL)
    if ctype.layout in Layout.NESTED:
        kind, element = _ELEMENTS[ctype.storage.name]
        if ctype.shape:  # nested fixed_size_lists: a multi-dimensional array (encode_composed)
            return WriteColumn(name, f"{element}[]", EncodeKind.VARLEN, PRE_ENCODED)
        return WriteColumn(name, f"{element}[]", EncodeKind.ARRAY, kind, ctype.list_size)
    composed = _composed(name, ctype)
    if composed is not None:
        return composed
    raise UnsupportedTypeError(f"column {name!r} has type {ctype.arrow}, which write_postgres cannot send")


def target_columns(table: Any, columns: Sequence[str] | None, vector: Any = False) -> list[WriteColumn]:
    """The columns to write (all, or ``columns`` in that order) and how each is sent. ``vector``: True
    sends every fixed_size_list<float32|float16> column as a pgvector vector (halfvec), a list of names
    those columns (each must be one)."""
    if columns is None:
        names = list(table.column_names)
    else:
        if isinstance(columns, str) or not all(isinstance(c, str) and c for c in columns) or not list(columns):
            raise InvalidArgumentError(f"columns must be a non-empty list of column names; got {columns!r}")
        names = list(columns)
        if len(set(names)) != len(names):
            raise SchemaMismatchError(f"columns names a column twice: {names}")
        for n in names:
            if n not in table.column_names:
                raise ColumnNotFoundError(f"column {n!r} is not in the table; columns: {table.column_names}")
    if not names:
        raise InvalidArgumentError("the table has no columns to write")
    if len(names) > 1600:
        raise InvalidArgumentError(f"PostgreSQL tables hold at most 1600 columns; got {len(names)}")
    for n in names:
        if "\x00" in n:
            raise InvalidArgumentError(f"column name {n!r} contains a NUL byte, which PostgreSQL refuses")
        check_identifier_length(n, "column")
    named = _vector_names(vector, names)
    cols = []
    for n in names:
        ctype = table.column(n).column_type
        if n in named:
            cols.append(vector_column(n, ctype))
        elif vector is True and _vector_shaped(ctype):
            cols.append(vector_column(n, ctype))
        else:
            cols.append(_map(n, ctype))
    return cols


def _vector_shaped(ctype: Any) -> bool:
    return ctype.layout == Layout.FIXED_LIST and ctype.storage.name in _VECTORS and ctype.list_size >= 1


def _vector_names(vector: Any, names: Sequence[str]) -> set[str]:
    if isinstance(vector, bool):
        return set()
    if isinstance(vector, str) or not isinstance(vector, Sequence) or not all(isinstance(v, str) for v in vector):
        raise InvalidArgumentError(f"vector must be True, False or a list of column names; got {vector!r}")
    for v in vector:
        if v not in names:
            raise ColumnNotFoundError(f"vector names column {v!r}, which is not written; columns: {list(names)}")
    return set(vector)


def retarget(cols: Sequence[WriteColumn], table: Any, existing: dict[str, str]) -> list[WriteColumn]:
    """The columns as sent into an existing table whose column types are ``existing`` (name -> pg_type's
    typname): a fixed_size_list<float32|float16> into a vector or halfvec column goes as a pgvector vector
    (the server casts halfvec and vector into each other), a binary column into bit or varbit as varbit
    (its bytes are PostgreSQL's binary form of the bits, as ``read_postgres`` reads them)."""
    out = []
    for c in cols:
        typ = existing.get(c.name)
        ctype = table.column(c.name).column_type
        if typ in ("vector", "halfvec") and c.kind != EncodeKind.VECTOR and _vector_shaped(ctype):
            c = vector_column(c.name, ctype)
        elif typ in ("bit", "varbit") and c.kind == EncodeKind.VARLEN and c.pg_type == "bytea":
            c = WriteColumn(c.name, "varbit", EncodeKind.VARLEN)
        out.append(c)
    return out


def target_name(name: Any) -> tuple[str | None, str]:
    """``name`` as (schema or None, relation): a string is one identifier taken literally, a tuple
    ``(schema, name)`` qualifies it."""
    if isinstance(name, str) and name and "\x00" not in name:
        check_identifier_length(name, "table")
        return None, name
    if (
        isinstance(name, (tuple, list))
        and len(name) == 2
        and all(isinstance(p, str) and p and "\x00" not in p for p in name)
    ):
        check_identifier_length(name[0], "schema")
        check_identifier_length(name[1], "table")
        return name[0], name[1]
    raise InvalidArgumentError(
        f"name must be a table name (taken literally, quotes and dots included) or a tuple "
        f"('schema', 'name'); got {name!r}"
    )


def _column_list(cols: Sequence[WriteColumn]) -> Any:
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(c.name) for c in cols)


def create_table(ident: Any, cols: Sequence[WriteColumn], *, unlogged: bool = False, temp: bool = False) -> Any:
    """``CREATE [UNLOGGED | TEMP] TABLE ident (col type, ...)``."""
    from psycopg import sql

    kind = "TEMP " if temp else "UNLOGGED " if unlogged else ""
    defs = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.pg_type)) for c in cols)
    return sql.SQL("CREATE " + kind + "TABLE {} ({})").format(ident, defs)


def copy_in_sql(conn: Any, ident: Any, cols: Sequence[WriteColumn]) -> str:
    from psycopg import sql

    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(ident, _column_list(cols)).as_string(conn)


def insert_select(target: Any, source: Any, cols: Sequence[WriteColumn]) -> Any:
    """``INSERT INTO target (cols) SELECT cols FROM source``: assignment casts let the target's
    column types differ from the ones written (int4 for int8, varchar for text...)."""
    from psycopg import sql

    names = _column_list(cols)
    return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(target, names, names, source)


# -- the arguments of write_postgres, in their order ---------------------------------------------------


_SIGNATURE = (
    "write_postgres(table, conninfo, name, *, if_exists='fail', columns=None, partitions=None, progress=None, "
    "vector=False)"
)


def check_write_order(table: Any, conninfo: Any, name: Any, psycopg: Any) -> None:
    """An error with the signature when the arguments are not in its order, or ``table`` is not
    tabular. Connection strings are described, never quoted: they may hold a password."""
    args = (table, conninfo, name)
    if not _is_table(table) and not _tabular(table) and any(_is_table(a) or _tabular(a) for a in args):
        raise InvalidArgumentError(
            f"{_SIGNATURE}: the table to write comes first, then the connection, then the target's name; "
            f"got {', '.join(_kind(a, psycopg) for a in args)}"
        )
    if isinstance(name, psycopg.Connection) or (_conninfo_like(name) and not _conninfo_like(conninfo)):
        raise InvalidArgumentError(
            f"{_SIGNATURE}: conninfo and name look swapped: name is {_kind(name, psycopg)}, conninfo "
            f"{_kind(conninfo, psycopg)}"
        )
    if not _is_table(table) and not _tabular(table):
        raise InvalidArgumentError(
            f"{_SIGNATURE}: table must be a pystrom.Table, a pandas DataFrame or a pyarrow Table; got "
            f"{type(table).__module__}.{type(table).__name__}"
        )


def _tabular(value: Any) -> bool:
    """A pandas DataFrame or a pyarrow Table/RecordBatch: data Table.from_arrow takes."""
    module, kind = type(value).__module__, type(value).__name__
    return (module.startswith("pandas") and kind == "DataFrame") or (
        module.startswith("pyarrow") and kind in ("Table", "RecordBatch")
    )


def _conninfo_like(value: Any) -> bool:
    """A string that reads as a libpq connection string or URI rather than a table name."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    return text.startswith(("postgres://", "postgresql://")) or re.match(r"[A-Za-z_]\w*\s*=", text) is not None


def _kind(value: Any, psycopg: Any) -> str:
    if _is_table(value):
        return "a pystrom.Table"
    if isinstance(value, psycopg.Connection):
        return "a psycopg.Connection"
    if _conninfo_like(value):
        return "a connection string (not shown: it may hold a password)"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value):
        return f"the name {tuple(value)!r}"
    return f"a {type(value).__module__}.{type(value).__name__}"


def _is_table(value: Any) -> bool:
    from ...table import Table

    return isinstance(value, Table)
