"""Columns made of columns -> their PostgreSQL binary form, on the host, before the COPY encoders run.

A list<string> column is sent as ``text[]`` (or the target's varchar[]/bpchar[]/name[]), a struct of a
range's parts (``lower``, ``upper``, ``lower_inc``, ``upper_inc``, ``empty``: what ``read_postgres``
reads a range as) as that range, and any other struct as a composite type that exists on the server.
Each becomes a binary column holding every row's value exactly as ``array_send``/``range_send``/
``record_send`` write it, which the encoders then send like ``bytea`` (EncodeKind.VARLEN): the CPU and
GPU encoders stay as they are. The fields of ranges and composites are encoded by the C++ COPY encoder
itself (a row of them is an int16 count, then each field's int32 length and bytes), and those rows
are reshaped into range or record values here, vectorised over the rows. The server says what the
target expects (the column's type, a composite's field types, a range's bound type), and a field whose
binary form would not be that type's is refused naming it. The cost is one copy of the table
(``with_columns``) and, from a GPU, the columns' round trip through host memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import DataError, UnsupportedTypeError
from ...table import Table
from .ddl import COMPOSITE, PG_TYPE_KEY, PRE_ENCODED, RANGE_FIELDS, EncodeKind, WriteColumn, target_columns
from .encode import Chunk, HostEncoder
from .session import run_sql
from .text_arrays import arrays_of_lists

__all__ = ["pre_encode"]

# Range binary flags (PostgreSQL's rangetypes.h)
_EMPTY, _LB_INC, _UB_INC, _LB_INF, _UB_INF = 0x01, 0x02, 0x04, 0x08, 0x10
_TEXT_LIKE = {25, 1043, 1042, 114, 142}  # text, varchar, bpchar, json, xml: one binary form (the bytes)
_JSONB = 3802  # its binary form: a version byte (1), then the text
_TIMESTAMPS = {1114, 1184}  # timestamp, timestamptz: one binary form (int64 microseconds since 2000)
_INT32_MAX = 2**31 - 1


def pre_encode(table: Any, cols: list[WriteColumn], conn: Any, target: Any) -> tuple[list[WriteColumn], Any]:
    """``(cols, table)`` with every PRE_ENCODED column of ``table`` replaced by its binary form (a new
    table) and its PostgreSQL type settled on the server over ``conn`` (``target``: the table written,
    a ``psycopg.sql.Identifier``; its existing columns' types decide); ``(cols, None)`` when there are none."""
    import pyarrow as pa

    names = [c.name for c in cols if c.kind == EncodeKind.VARLEN and c.param == PRE_ENCODED]
    if not names:
        return cols, None
    existing = {  # name -> (type OID, its SQL with the column's typmod: a staging table must take the values alike)
        name: (oid, sql_type)
        for name, oid, sql_type in run_sql(
            conn,
            "looking up the target's column types",
            "SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY(%s)",
            (target.as_string(conn), names),
        ).fetchall()
    }
    encoded, out = {}, []
    for c in cols:
        if c.name not in names:
            out.append(c)
            continue
        array = table.column(c.name).to_arrow()
        type_oid, declared = existing.get(c.name) or (_type_oid(conn, c, table.schema.field(c.name)), None)
        pg_type, (offsets, data) = _encode(conn, c.name, array, type_oid)
        out.append(replace(c, pg_type=declared or pg_type))
        validity = array.buffers()[0] if array.null_count else None
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
        encoded[c.name] = pa.Array.from_buffers(pa.binary(), len(array), buffers, null_count=array.null_count)
    with type(table).from_arrays(encoded, device=table.device) as placed:  # on the table's device first
        return out, table.with_columns(**{name: placed.column(name) for name in encoded})


def _type_oid(conn: Any, col: WriteColumn, field: Any) -> int:
    """The type a new column of ``col`` gets: text[] or the range ddl chose, or the composite its
    field's metadata names (which must exist on the server)."""
    named = col.pg_type
    if named == COMPOSITE:
        metadata = field.metadata or {}
        if PG_TYPE_KEY not in metadata:
            raise UnsupportedTypeError(
                f"column {col.name!r} has type {field.type}, which write_postgres sends as a composite type: name one "
                f"in the field's metadata ({PG_TYPE_KEY.decode()}, as read_postgres sets it) or write into an "
                "existing table whose column has that type; or write the struct's fields as columns of their own"
            )
        named = metadata[PG_TYPE_KEY].decode("utf-8", "replace")
    row = run_sql(conn, "looking up a type", "SELECT to_regtype(%s)::oid", (named,)).fetchone()
    if row is None or row[0] is None:
        raise UnsupportedTypeError(
            f"column {col.name!r}: its type {named!r} does not exist on the server: create it first "
            "(CREATE TYPE ... AS (...)), or write the struct's fields as columns of their own"
        )
    return int(row[0])


def _describe_type(conn: Any, oid: int) -> tuple[str, str, int, int]:
    """(format_type, typtype, typrelid, element or range subtype) of the type ``oid``."""
    return run_sql(
        conn,
        "looking up a type",
        "SELECT format_type(t.oid, NULL), t.typtype, t.typrelid, coalesce(r.rngsubtype, t.typelem) FROM pg_type t "
        "LEFT JOIN pg_range r ON r.rngtypid = t.oid WHERE t.oid = %s",
        (oid,),
    ).fetchone()


def _encode(conn: Any, name: str, array: Any, oid: int) -> tuple[str, tuple[np.ndarray, np.ndarray]]:
    """(the target type's SQL name, the binary values of ``array`` as that type: offsets and bytes)."""
    import pyarrow as pa

    pg_type, typtype, relid, element = _describe_type(conn, oid)
    typtype = typtype.decode() if isinstance(typtype, bytes) else typtype
    if pa.types.is_fixed_size_list(array.type):
        return pg_type, _shaped_arrays(conn, name, array, oid)
    if pa.types.is_list(array.type):
        if element not in (25, 1043, 1042, 19):
            raise UnsupportedTypeError(f"column {name!r} (list<string>) cannot go into a column of type {pg_type}")
        return pg_type, arrays_of_lists(array, element, name)
    fields = [f.name for f in array.type]
    if typtype == "r":
        if fields != list(RANGE_FIELDS):
            raise UnsupportedTypeError(
                f"column {name!r} ({array.type}) cannot go into a column of type {pg_type}: a range is sent from a "
                f"struct of {list(RANGE_FIELDS)}"
            )
        return pg_type, _ranges(conn, name, array, element, pg_type)
    if typtype == "c":
        return pg_type, _records(conn, name, array, relid, pg_type)
    raise UnsupportedTypeError(f"column {name!r} ({array.type}) cannot go into a column of type {pg_type}")


def _shaped_arrays(conn: Any, name: str, array: Any, oid: int) -> tuple[np.ndarray, np.ndarray]:
    """Nested fixed_size_lists as multi-dimensional arrays: the C++ encoder writes each row as a one-dimensional
    array of all its values, whose header (one dimension) is replaced by the row's dimensions here."""
    import pyarrow as pa

    shape, leaf = [], array
    while pa.types.is_fixed_size_list(leaf.type):
        d = leaf.type.list_size
        shape.append(d)
        leaf = leaf.values.slice(leaf.offset * d, len(leaf) * d)
    total = int(np.prod(shape))
    flat = pa.FixedSizeListArray.from_arrays(leaf, total, mask=array.is_null() if array.null_count else None)
    rows, _, at, lengths = _fields_as_rows(conn, name, {"a": flat}, [oid])
    k = len(shape)
    valid = lengths[:, 0] >= 0
    body = np.maximum(lengths[:, 0] - 20, 0)  # the elements, after the one-dimensional header's 20 bytes
    offsets, data = _layout(12 + 8 * k + body, valid, name)
    start = offsets[:-1][valid]
    src = at[valid, 0]
    header = _big_endian(k)
    data[start[:, None] + np.arange(4)] = header
    _copy_ranges(data, start + 4, rows, src + 4, np.full(len(start), 8))  # the NULL flag and the element OID
    for j, d in enumerate(shape):  # each dimension: its length, lower bound 1
        pair = _big_endian(d, 1)
        data[(start + 12 + 8 * j)[:, None] + np.arange(8)] = pair
    _copy_ranges(data, start + 12 + 8 * k, rows, src + 20, body[valid])
    return offsets.astype(np.int32), data


def _fields_as_rows(conn: Any, name: str, fields: dict[str, Any], expected: list[int]) -> tuple[np.ndarray, ...]:
    """``fields`` (pyarrow arrays of one length) encoded by the C++ COPY encoder, each checked against the
    type OID the target ``expected`` (composites inside are encoded first, as their own binary form).
    Returns (rows, starts, per-field value starts (rows x fields), per-field lengths (-1: NULL))."""
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401  (pa.compute)

    prepared = {}
    for (field, array), oid in zip(fields.items(), expected):
        if pa.types.is_struct(array.type) or (pa.types.is_list(array.type) and not _numeric_list(array.type)):
            _, (offsets, data) = _encode(conn, f"{name}.{field}", array, oid)
            validity = array.buffers()[0] if array.null_count else None
            array = pa.Array.from_buffers(
                pa.binary(), len(array), [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=-1
            )
            prepared[field] = (array, True)
        elif oid == _JSONB and pa.types.is_string(array.type):  # read_postgres reads jsonb as its text
            prefixed = pa.compute.binary_join_element_wise("\x01", array, "").cast(pa.binary())
            prepared[field] = (prefixed, True)
        else:
            prepared[field] = (array, False)
    with Table.from_arrays({f: a for f, (a, _) in prepared.items()}, device="cpu") as sub:
        cols = target_columns(sub, None)
        cols = [WriteColumn(c.name, "bytea", EncodeKind.VARLEN) if prepared[c.name][1] else c for c in cols]
        sent = _oids(conn, [c.pg_type for c in cols])
        for c, ours, theirs, (_, nested) in zip(cols, sent, expected, prepared.values()):
            if (
                not nested
                and ours != theirs
                and not (ours in _TEXT_LIKE and theirs in _TEXT_LIKE)
                and not (ours in _TIMESTAMPS and theirs in _TIMESTAMPS)
            ):
                wanted = run_sql(conn, "naming a type", "SELECT format_type(%s, NULL)", (theirs,)).fetchone()[0]
                raise UnsupportedTypeError(
                    f"column {name!r}: field {c.name!r} ({sub.schema.field(c.name).type}) is sent as {c.pg_type}, but "
                    f"the target's field is {wanted}: cast the field to the type it has there"
                )
        encoder = HostEncoder(sub, cols)
        try:
            starts = encoder.starts()
            rows = np.empty(int(starts[-1]), dtype=np.uint8)
            encoder.encode(Chunk(0, sub.num_rows, int(starts[-1])), rows)
        finally:
            encoder.close()
    n, k = len(starts) - 1, len(fields)
    at = np.empty((n, k), dtype=np.int64)
    lengths = np.empty((n, k), dtype=np.int64)
    pos = starts[:-1] + 2  # past each row's int16 field count
    for j in range(k):
        length = _be32(rows, pos).astype(np.int64)
        at[:, j], lengths[:, j] = pos + 4, length
        pos = pos + 4 + np.maximum(length, 0)
    return rows, starts, at, lengths


def _numeric_list(t: Any) -> bool:
    import pyarrow.types as pt

    v = t.value_type
    return pt.is_boolean(v) or pt.is_integer(v) or pt.is_floating(v)


def _oids(conn: Any, types: Sequence[str]) -> list[int]:
    rows = run_sql(
        conn, "looking up types", "SELECT t::regtype::oid FROM unnest(%s::text[]) WITH ORDINALITY u(t, i) ORDER BY i",
        (list(types),),
    ).fetchall()  # fmt: skip
    return [int(r[0]) for r in rows]


def _big_endian(*values: int, dtype: str = ">i4") -> np.ndarray:
    """``values`` as the bytes of big-endian 32-bit words, to broadcast into rows of output."""
    return np.array(values, dtype).view(np.uint8)


def _be32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    b = buf[at[:, None] + np.arange(4)].astype(np.int64)
    v = (b[:, 0] << 24) | (b[:, 1] << 16) | (b[:, 2] << 8) | b[:, 3]
    return np.where(v >= 2**31, v - 2**32, v)


def _copy_ranges(dst: np.ndarray, dst_at: np.ndarray, src: np.ndarray, src_at: np.ndarray, lengths: np.ndarray) -> None:
    """dst[dst_at[i] : dst_at[i] + lengths[i]] = src[src_at[i] : ...] for every i, in one gather."""
    keep = lengths > 0
    d, s, n = dst_at[keep], src_at[keep], lengths[keep]
    if not n.size:
        return
    within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    dst[np.repeat(d, n) + within] = src[np.repeat(s, n) + within]


def _layout(sizes: np.ndarray, valid: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.where(valid, sizes, 0)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] > _INT32_MAX:
        raise DataError(f"column {name!r}: its values take {offsets[-1]:,} bytes; write fewer rows at a time")
    return offsets, np.zeros(int(offsets[-1]), dtype=np.uint8)


def _ranges(conn: Any, name: str, array: Any, subtype: int, pg_type: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row as ``range_send`` writes it: a flags byte, then each finite bound's int32 length and value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(array)
    valid = array.is_valid().to_numpy(zero_copy_only=False) if array.null_count else np.ones(n, bool)

    def flag(f: str) -> np.ndarray:
        return pc.fill_null(array.field(f), False).to_numpy(zero_copy_only=False).astype(bool)

    empty = flag("empty")
    bounds, has = {}, {}
    for f in ("lower", "upper"):
        present = array.field(f).is_valid().to_numpy(zero_copy_only=False) & ~empty
        has[f] = present
        bounds[f] = pc.if_else(pa.array(present), array.field(f), pa.nulls(n, array.field(f).type))
    flags = np.where(empty, _EMPTY, 0) | np.where(flag("lower_inc") & has["lower"], _LB_INC, 0)
    flags |= np.where(flag("upper_inc") & has["upper"], _UB_INC, 0)
    flags |= np.where(~has["lower"] & ~empty, _LB_INF, 0) | np.where(~has["upper"] & ~empty, _UB_INF, 0)
    rows, _, at, lengths = _fields_as_rows(conn, name, bounds, [subtype, subtype])
    spans = np.where(lengths >= 0, 4 + lengths, 0)  # a NULL bound (unbounded or empty) is left out
    offsets, data = _layout(1 + spans.sum(axis=1), valid, name)
    start = offsets[:-1]
    data[start[valid]] = flags[valid].astype(np.uint8)
    _copy_ranges(data, start + 1, rows, at[:, 0] - 4, np.where(valid, spans[:, 0], 0))
    _copy_ranges(data, start + 1 + spans[:, 0], rows, at[:, 1] - 4, np.where(valid, spans[:, 1], 0))
    return offsets.astype(np.int32), data


def _records(conn: Any, name: str, array: Any, relid: int, pg_type: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row as ``record_send`` writes it: int32 field count, then per field its type OID, int32 length
    (-1: NULL) and value; the struct's fields must be the composite's, by name and in order."""
    attributes = run_sql(
        conn,
        "looking up a composite type's fields",
        "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum",
        (relid,),
    ).fetchall()
    fields = [f.name for f in array.type]
    if fields != [a[0] for a in attributes]:
        raise UnsupportedTypeError(
            f"column {name!r}: its fields {fields} are not those of {pg_type} ({[a[0] for a in attributes]}), "
            "in that order: select or rename them to match"
        )
    n, k = len(array), len(fields)
    valid = array.is_valid().to_numpy(zero_copy_only=False) if array.null_count else np.ones(n, bool)
    rows, _, at, lengths = _fields_as_rows(conn, name, {f: array.field(f) for f in fields}, [a[1] for a in attributes])
    values = np.maximum(lengths, 0)
    offsets, data = _layout(4 + (8 * k + values.sum(axis=1)), valid, name)
    start = offsets[:-1][valid]
    data[start[:, None] + np.arange(4)] = _big_endian(k)
    dst = start + 4
    for j, (_, oid) in enumerate(attributes):
        data[dst[:, None] + np.arange(4)] = _big_endian(oid, dtype=">u4")
        _copy_ranges(data, dst + 4, rows, at[valid, j] - 4, 4 + values[valid, j])
        dst = dst + 8 + values[valid, j]
    return offsets.astype(np.int32), data
