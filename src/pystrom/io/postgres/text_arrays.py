"""PostgreSQL's binary text-like arrays (text[], varchar[], bpchar[], name[]) <-> Arrow list<string> buffers.

Binary COPY carries an array as ``array_send`` writes it: int32 ndim, int32 has-NULL flag, uint32 element
OID, per dimension int32 size and lower bound, then per element an int32 length (-1: NULL) and its bytes,
all big-endian. :func:`decode_text_arrays` turns a varbinary column of such arrays (one per row) into the
buffers of a list<string> column; :func:`encode_text_arrays` does the reverse, for a binary COPY FROM.
Both run the C++ in csrc/pg_arrays.cpp without the GIL. Only one-dimensional (or empty) arrays fit a
list; their lower bounds are dropped, and written as 1.

The arrays come from a server: a malformed one raises :class:`~pystrom.errors.DataError` naming the
column, the row and what is wrong, and is never read past its bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _core
from ...errors import DataError

__all__ = ["TEXT_ELEMENT_OIDS", "decode_text_arrays", "encode_text_arrays", "lists_of_arrays", "arrays_of_lists"]

# Element type OIDs whose binary form is the string's bytes (textsend, varcharsend, bpcharsend, namesend).
TEXT_ELEMENT_OIDS = {25: "text", 1043: "varchar", 1042: "bpchar", 19: "name"}

_INT32_MAX = 2**31 - 1

# Failure codes of csrc/pg_decode.hpp that pg_text_arrays_measure / _fill return.
_FAILURES = {
    8: "a multi-dimensional array; only one-dimensional arrays are read (flatten it in SQL, "
    "e.g. ARRAY(SELECT unnest(c)))",
    9: "an array whose element type is not the column's",
    11: "a malformed array (its dimensions, NULL flag or element lengths do not match its bytes)",
    12: "more list elements or string bytes than Arrow's int32 offsets hold (2**31 - 1); read fewer rows at a time",
}


def _element_name(element_oid: int) -> str:
    try:
        return TEXT_ELEMENT_OIDS[element_oid]
    except KeyError:
        raise ValueError(
            f"element OID {element_oid} is not a text-like type (one of {sorted(TEXT_ELEMENT_OIDS)})"
        ) from None


def _bytes(buf) -> np.ndarray:
    """Any contiguous buffer (a NumPy array of any dtype, bytes, a pyarrow Buffer) as flat uint8, uncopied
    where it already is contiguous."""
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


def _bitmap(buf) -> np.ndarray | None:
    return None if buf is None else _bytes(buf)


def decode_text_arrays(
    offsets: np.ndarray,
    data: np.ndarray,
    validity: np.ndarray | None,
    bit_offset: int,
    element_oid: int,
    column: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Rows of binary arrays -> ``(list_offsets, str_offsets, str_data, elem_validity)`` of a list<string>.

    ``offsets``: int32, n + 1, row i's array at ``data[offsets[i]:offsets[i + 1]]``; ``validity``: an LSB
    bitmap whose bit ``bit_offset + i`` is row i (None: no NULL rows), NULL rows become empty lists.
    ``elem_validity`` is None where no element is NULL. ``element_oid``: the element type the arrays must
    hold (:data:`TEXT_ELEMENT_OIDS`); ``column`` names the column in errors.
    """
    element = _element_name(element_oid)
    offsets = np.ascontiguousarray(offsets)  # int32, or the binding refuses it: a cast could wrap
    data = _bytes(data)
    validity = _bitmap(validity)
    n = len(offsets) - 1
    elements, nbytes, nulls, row, failure = _core.pg_text_arrays_measure(
        offsets, data, validity, bit_offset, element_oid
    )
    if failure:
        raise DataError(f"column {column!r} ({element}[]), row {row}: {_FAILURES.get(failure, failure)}")
    list_offsets = np.empty(n + 1, dtype=np.int32)
    str_offsets = np.empty(elements + 1, dtype=np.int32)
    str_data = np.empty(nbytes, dtype=np.uint8)
    elem_validity = np.empty((elements + 7) // 8, dtype=np.uint8) if nulls else None
    failure, row = _core.pg_text_arrays_fill(
        offsets, data, validity, bit_offset, list_offsets, str_offsets, str_data, elem_validity
    )
    if failure:  # the same bytes passed the measure: only a buffer changed in between gets here
        raise DataError(f"column {column!r} ({element}[]), row {row}: {_FAILURES.get(failure, failure)}")
    return list_offsets, str_offsets, str_data, elem_validity


def encode_text_arrays(
    list_offsets: np.ndarray,
    row_validity: np.ndarray | None,
    row_bit_offset: int,
    str_offsets: np.ndarray,
    str_data: np.ndarray,
    elem_validity: np.ndarray | None,
    element_oid: int,
    column: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A list<string> column's buffers -> ``(offsets, data)``: row i's binary array (as ``array_send`` writes
    it, lower bound 1; an empty list with no dimensions) at ``data[offsets[i]:offsets[i + 1]]``, int32 offsets.

    ``list_offsets``: int32, n + 1, indexing elements (a sliced column's need not start at 0);
    ``row_validity``: bit ``row_bit_offset + i`` is row i (None: no NULL rows), a NULL row's range is empty
    (the COPY writer sends it as NULL); ``str_offsets`` (int32) index ``str_data``; ``elem_validity``: bit j
    is element j (None: no NULL elements). Bad offsets, or more than 2**31 - 1 bytes in all, raise
    :class:`~pystrom.errors.DataError` (a ValueError) naming the row.
    """
    element = _element_name(element_oid)
    where = f"column {column!r} ({element}[])" if column is not None else f"{element}[]"
    list_offsets = np.ascontiguousarray(list_offsets)  # int32, or the bindings refuse them: a cast could wrap
    str_offsets = np.ascontiguousarray(str_offsets)
    str_data = _bytes(str_data)
    row_validity, elem_validity = _bitmap(row_validity), _bitmap(elem_validity)
    n = len(list_offsets) - 1
    if n < 0:
        raise ValueError("list_offsets must hold n + 1 entries")
    try:
        total = _core.pg_text_arrays_encode_sizes(
            list_offsets, row_validity, row_bit_offset, str_offsets, elem_validity, n
        )
        if total > _INT32_MAX:
            raise DataError(
                f"{where}: the arrays take {total} bytes, more than a varbinary column's int32 offsets hold "
                "(2**31 - 1); write fewer rows at a time"
            )
        offsets = np.empty(n + 1, dtype=np.int32)
        data = np.empty(total, dtype=np.uint8)
        _core.pg_text_arrays_encode(
            list_offsets,
            row_validity,
            row_bit_offset,
            str_offsets,
            str_data,
            elem_validity,
            n,
            element_oid,
            offsets,
            data,
        )
    except DataError:
        raise
    except ValueError as e:
        raise DataError(f"{where}: {e}") from e
    return offsets, data


def lists_of_arrays(raw: Any, element_oid: int, column: str, arrow: Any) -> Any:
    """A pyarrow binary array of binary arrays (one per row, NULL rows NULL) as a list<string> array of
    type ``arrow`` (:func:`decode_text_arrays` on its buffers)."""
    import pyarrow as pa

    if raw.offset:  # exported arrays start at their row 0; anything else is compacted first
        raw = pa.concat_arrays([raw])
    bufs = raw.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(raw) + 1)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    rows_valid = bufs[0] if raw.null_count else None
    list_offsets, str_offsets, str_data, elements_valid = decode_text_arrays(
        offsets, data, None if rows_valid is None else np.frombuffer(rows_valid, np.uint8), 0, element_oid, column
    )
    bits = None if elements_valid is None else pa.py_buffer(elements_valid)
    strings = pa.Array.from_buffers(
        pa.utf8(), len(str_offsets) - 1, [bits, pa.py_buffer(str_offsets), pa.py_buffer(str_data)],
        null_count=-1 if bits is not None else 0,
    )  # fmt: skip
    return pa.Array.from_buffers(arrow, len(raw), [rows_valid, pa.py_buffer(list_offsets)], children=[strings],
                                 null_count=raw.null_count)  # fmt: skip


def arrays_of_lists(array: Any, element_oid: int, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A pyarrow list<string> array -> ``(offsets, data)`` of its rows' binary arrays (:func:`encode_text_arrays`)."""
    import pyarrow as pa

    if array.offset or array.values.offset:  # exports start at 0; anything else is compacted first
        array = pa.concat_arrays([array])
    values = array.values
    bufs, child = array.buffers(), values.buffers()
    list_offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(array) + 1)
    str_offsets = np.frombuffer(child[1], dtype=np.int32, count=len(values) + 1)
    data = np.frombuffer(child[2], dtype=np.uint8) if child[2] is not None else np.zeros(0, np.uint8)
    rows_valid = np.frombuffer(bufs[0], dtype=np.uint8) if array.null_count else None
    elements_valid = np.frombuffer(child[0], dtype=np.uint8) if values.null_count else None
    return encode_text_arrays(list_offsets, rows_valid, 0, str_offsets, data, elements_valid, element_oid, column)
