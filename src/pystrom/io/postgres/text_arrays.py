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

import numpy as np

from ... import _core
from ...errors import DataError

__all__ = ["TEXT_ELEMENT_OIDS", "decode_text_arrays", "encode_text_arrays"]

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
