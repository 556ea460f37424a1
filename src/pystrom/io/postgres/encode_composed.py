"""Columns made of columns -> their PostgreSQL binary form, on the host, before the COPY encoders run.

A list<string> column is sent as ``text[]`` and a struct of a range's parts (``lower``, ``upper``,
``lower_inc``, ``upper_inc``, ``empty``: what ``read_postgres`` reads a range as) as that range. Each is
first turned into a binary column holding every row's value exactly as ``array_send``/``range_send``
write it, which the encoders then send like ``bytea`` (EncodeKind.VARLEN): the CPU and GPU encoders
stay as they are. The cost is one copy of the table (``with_columns``) and, from a GPU, the column's
round trip through host memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..._types import Layout
from ...errors import DataError, UnsupportedTypeError

__all__ = ["PRE_ENCODED", "composed_column", "pre_encode"]

PRE_ENCODED = 1  # WriteColumn.param of a VARLEN column whose bytes this module makes

# Range binary flags (PostgreSQL's rangetypes.h)
_EMPTY, _LB_INC, _UB_INC, _LB_INF, _UB_INF = 0x01, 0x02, 0x04, 0x08, 0x10
_RANGE_FIELDS = ("lower", "upper", "lower_inc", "upper_inc", "empty")
_EPOCH_DAYS = 10957  # 1970-01-01 -> 2000-01-01
_EPOCH_MICROS = _EPOCH_DAYS * 86_400_000_000
_UNIT_MICROS = {"s": (1_000_000, 1), "ms": (1_000, 1), "us": (1, 1), "ns": (1, 1_000)}


def _range_type(arrow: Any) -> str | None:
    """The built-in range a struct of a range's parts is sent as (by its bounds' type), or None."""
    import pyarrow as pa
    import pyarrow.types as pt

    if [f.name for f in arrow] != list(_RANGE_FIELDS):
        return None
    bound = arrow.field("lower").type
    if arrow.field("upper").type != bound or any(arrow.field(f).type != pa.bool_() for f in _RANGE_FIELDS[2:]):
        return None
    if pt.is_timestamp(bound):
        return "tstzrange" if bound.tz else "tsrange"
    return {pa.date32(): "daterange", pa.int32(): "int4range", pa.int64(): "int8range"}.get(bound)


def composed_column(name: str, ctype: Any) -> tuple[str, int] | None:
    """(PostgreSQL type, PRE_ENCODED) for a column this module sends, None for any other; refuses the
    struct and list columns it cannot send, naming the column."""
    import pyarrow.types as pt

    if ctype.layout == Layout.LIST_OF:
        element = ctype.children[0].storage_arrow
        if pt.is_string(element):
            return "text[]", PRE_ENCODED
        raise UnsupportedTypeError(
            f"column {name!r} has type {ctype.arrow}, which write_postgres cannot send: lists of strings go as "
            "text[], lists of numbers and booleans as arrays of them; write a list's elements as rows of a table "
            "of their own"
        )
    if ctype.layout == Layout.STRUCT:
        range_type = _range_type(ctype.storage_arrow)
        if range_type is not None:
            return range_type, PRE_ENCODED
        raise UnsupportedTypeError(
            f"column {name!r} has type {ctype.arrow}, which write_postgres cannot send: a struct is sent as a range "
            "when its fields are lower, upper (timestamp, date32, int32 or int64), lower_inc, upper_inc and empty "
            "(bool), as read_postgres reads ranges; write other structs' fields as columns of their own, "
            f"e.g. table.with_columns(**{{f.name: table.column({name!r}).field(f.name) for f in ...}})"
        )
    return None


def pre_encode(table: Any, names: Sequence[str]) -> Any | None:
    """``table`` with the columns ``names`` (those sent PRE_ENCODED) replaced by their binary form (a new
    table), or None when there are none."""
    import pyarrow as pa

    encoded = {}
    for name in names:
        column = table.column(name)
        array = column.to_arrow()
        if column.column_type.layout == Layout.LIST_OF:
            offsets, data = _text_arrays(array, name)
        else:
            offsets, data = _ranges(array, name)
        validity = array.buffers()[0] if array.null_count else None
        encoded[name] = pa.Array.from_buffers(
            pa.binary(), len(array), [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=array.null_count
        )
    if not encoded:
        return None
    with type(table).from_arrays(encoded, device=table.device) as placed:  # on the table's device first
        return table.with_columns(**{name: placed.column(name) for name in encoded})


def _text_arrays(array: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa

    from .text_arrays import encode_text_arrays

    if array.offset or array.values.offset:  # exports start at 0; anything else is compacted first
        array = pa.concat_arrays([array])
    values = array.values
    bufs, child = array.buffers(), values.buffers()
    n, m = len(array), len(values)
    list_offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1)
    str_offsets = np.frombuffer(child[1], dtype=np.int32, count=m + 1)
    data = np.frombuffer(child[2], dtype=np.uint8) if child[2] is not None else np.zeros(0, np.uint8)
    valid = np.frombuffer(bufs[0], dtype=np.uint8) if array.null_count else None
    elements_valid = np.frombuffer(child[0], dtype=np.uint8) if values.null_count else None
    return encode_text_arrays(list_offsets, valid, 0, str_offsets, data, elements_valid, 25, name)


def _ranges(array: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row as ``range_send`` writes it: a flags byte, then each finite bound's int32 length and value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(array)
    parts = {f: array.field(f) for f in _RANGE_FIELDS}
    row_valid = np.ones(n, bool) if not array.null_count else array.is_valid().to_numpy(zero_copy_only=False)

    def flags_of(f: str) -> np.ndarray:
        return pc.fill_null(parts[f], False).to_numpy(zero_copy_only=False).astype(bool)

    empty = flags_of("empty")
    has = {}
    for f in ("lower", "upper"):
        has[f] = parts[f].is_valid().to_numpy(zero_copy_only=False) & ~empty
    flags = np.where(empty, _EMPTY, 0).astype(np.uint8)
    flags |= np.where(flags_of("lower_inc") & has["lower"], _LB_INC, 0).astype(np.uint8)
    flags |= np.where(flags_of("upper_inc") & has["upper"], _UB_INC, 0).astype(np.uint8)
    flags |= np.where(~has["lower"] & ~empty, _LB_INF, 0).astype(np.uint8)
    flags |= np.where(~has["upper"] & ~empty, _UB_INF, 0).astype(np.uint8)
    bound_type = array.type.field("lower").type
    width = 4 if bound_type in (pa.date32(), pa.int32()) else 8
    values = {f: _bound_values(parts[f], bound_type, name) for f in ("lower", "upper")}
    sizes = 1 + (4 + width) * (has["lower"].astype(np.int64) + has["upper"])
    sizes[~row_valid] = 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] > 2**31 - 1:
        raise DataError(f"column {name!r}: its ranges take {offsets[-1]:,} bytes; write fewer rows at a time")
    data = np.zeros(int(offsets[-1]), dtype=np.uint8)
    start = offsets[:-1]
    data[start[row_valid]] = flags[row_valid]
    length = np.frombuffer(np.array([width], ">i4").tobytes(), np.uint8)
    for i, f in enumerate(("lower", "upper")):
        rows = has[f] & row_valid
        at = start[rows] + 1 + (has["lower"][rows] * (4 + width) if i else 0)
        data[at[:, None] + np.arange(4)] = length
        big = values[f][rows].astype(f">i{width}").view(np.uint8).reshape(-1, width)
        data[at[:, None] + 4 + np.arange(width)] = big
    return offsets.astype(np.int32), data


def _bound_values(part: Any, bound_type: Any, name: str) -> np.ndarray:
    """A range's bounds as PostgreSQL counts them (int64 microseconds or int32 days since 2000-01-01)."""
    import pyarrow as pa

    raw = part.fill_null(0).cast(pa.int64() if bound_type not in (pa.date32(), pa.int32()) else pa.int32())
    values = raw.to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_timestamp(bound_type):
        mul, div = _UNIT_MICROS[bound_type.unit]
        sentinel = (values == np.iinfo(np.int64).max) | (values == np.iinfo(np.int64).min)  # +-infinity, as read
        with np.errstate(over="ignore"):
            micros = values // div * mul - _EPOCH_MICROS
        if mul > 1 and np.any(~sentinel & (np.abs(values) > (2**63 - 1) // mul)):
            raise DataError(f"column {name!r}: a range bound past what PostgreSQL's timestamps hold")
        values = np.where(sentinel, values, micros)
    elif bound_type == pa.date32():
        sentinel = (values == np.iinfo(np.int32).max) | (values == np.iinfo(np.int32).min)
        values = np.where(sentinel, values, values - _EPOCH_DAYS)
    return values
