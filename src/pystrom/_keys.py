"""Order and equality of rows, on the table's device: what ``sort``, ``unique`` and ``value_counts`` share.

A column becomes one or more *parts*: arrays (NumPy or CuPy, written once against ``xp``) whose
lexicographic order, most significant part first, is the column's order. A stable sort by the parts
of several columns is a stable multi-key sort (:func:`lexsort`: one stable argsort per part, least
significant first); rows whose parts are all equal are equal values (:func:`groups`).

- A *class* part comes first when the column has NULLs or NaNs: it places NULLs first or last and
  NaN where the caller asks (polars: NaN is the largest number; Arrow: NaN beside the NULLs).
  NULL and NaN slots get 0 in the other parts, so that they tie there and stay in input order.
- Numbers, booleans and temporal values are one part: their storage, inverted (``~x``, ``-x``)
  for a descending order, -0.0 made 0.0 (the two are equal) and float16 widened for the sort.
- decimal128: two parts, the signed high and unsigned low 64-bit words.
- fixed_size_binary (uuid): big-endian 8-byte words of the bytes, compared as unsigned integers.
- string and binary: one part, the rank of each value among the column's distinct values in byte
  order (UTF-8 byte order is code point order, as in Arrow and polars), found by refining ranks
  7 bytes at a time (:func:`_varbinary_ranks`) until every group of equal prefixes is settled.

Lists and intervals have no order here and are refused naming the column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._types import Layout
from .column import Column
from .errors import UnsupportedTypeError
from .memory.bitmap import count_true

__all__ = ["key_parts", "lexsort", "groups", "stable_argsort"]

_NAN_PLACEMENTS = ("largest", "with_nulls")


def stable_argsort(xp: Any, a: Any) -> Any:
    """Indices that sort ``a`` with equal elements kept in input order (int64)."""
    if xp is np:
        return np.argsort(a, kind="stable")
    return xp.argsort(a)  # CuPy's argsort is always stable (thrust's stable sort by key)


def lexsort(xp: Any, parts: Sequence[Any], n: int) -> Any:
    """The stable order of ``n`` rows by ``parts`` (most significant first), as int64 indices."""
    order = xp.arange(n, dtype=np.int64)
    for part in reversed(parts):
        order = order[stable_argsort(xp, part[order])]
    return order


def groups(xp: Any, parts: Sequence[Any], order: Any) -> Any:
    """Where each group of equal rows starts in ``order`` (the result of :func:`lexsort` by ``parts``).

    Returns int64 positions into ``order``, increasing, the first one 0 (empty when there are no rows).
    Because the sort is stable, ``order[starts]`` is the first row of each group in the input.
    """
    n = int(order.shape[0])
    if n == 0:
        return xp.zeros(0, dtype=np.int64)
    change = xp.zeros(n, dtype=bool)
    change[0] = True
    for part in parts:
        ordered = part[order]
        change[1:] |= ordered[1:] != ordered[:-1]
    return xp.flatnonzero(change).astype(np.int64, copy=False)


def key_parts(col: Column, descending: bool = False, nulls_last: bool = False, nan: str = "largest") -> list[Any]:
    """The parts whose lexicographic order is ``col``'s order, on the column's device.

    Parameters
    ----------
    col
        The column (any view of a table).
    descending
        Largest value first.
    nulls_last
        NULLs after every value (else before).
    nan
        ``"largest"``: NaN is larger than every number (polars), so it comes last ascending and first
        descending; ``"with_nulls"``: NaN sits between the values and the NULLs whichever the direction
        (Arrow's ``sort_by``).
    """
    if nan not in _NAN_PLACEMENTS:
        raise ValueError(f"nan placement {nan!r} is not one of {_NAN_PLACEMENTS}")
    backend = col._live_block().backend
    xp = backend.xp
    n = len(col)
    invalid = ~col.is_valid() if col.null_count else None
    parts, nans = _value_parts(xp, col, descending, invalid)
    blank = invalid if nans is None else (nans if invalid is None else invalid | nans)
    if blank is not None:
        for i, part in enumerate(parts):
            part = part.copy()
            part[blank] = 0
            parts[i] = part
    if invalid is None and nans is None:
        return parts
    # classes: NULLs first (0) or last (3); values 1 or 2; NaN on the side the caller asked for
    if nan == "largest":
        value_class, nan_class = (2, 1) if descending else (1, 2)
    else:
        value_class, nan_class = (2, 1) if not nulls_last else (0, 1)
    cls = xp.full(n, value_class, dtype=np.int8)
    if nans is not None:
        cls[nans] = nan_class
    if invalid is not None:
        cls[invalid] = 3 if nulls_last else 0
    return [cls, *parts]


def _refuse(col: Column, why: str) -> UnsupportedTypeError:
    return UnsupportedTypeError(f"column {col.name!r} has type {col.type}, which {why}")


def _value_parts(xp: Any, col: Column, descending: bool, invalid: Any) -> tuple[list[Any], Any]:
    """(parts in the column's order, NaN mask or None)."""
    import pyarrow as pa

    ctype = col.column_type
    layout = ctype.layout
    if layout in Layout.NESTED or layout == Layout.LIST_OF:
        raise _refuse(col, "has no order: its rows are lists")
    if layout == Layout.STRUCT:
        raise _refuse(col, "has no order: its rows are structs (sort by a field: with_columns(k=column.field(...)))")
    if layout == Layout.BOOL:
        part = col.values.view(np.uint8)
        return [part ^ np.uint8(1) if descending else part.copy()], None
    if layout == Layout.FIXED:
        values = col.values
        if values.dtype.kind == "f":
            values = values.astype(np.float32) if values.dtype.itemsize < 4 else values
            nans = xp.isnan(values)
            part = values + values.dtype.type(0)  # -0.0 + 0.0 is 0.0: the two are one value
            if descending:
                part = -part
            return [part], nans if count_true(nans) else None
        return [~values if descending else values], None
    if layout == Layout.VARBINARY:
        ranks = _varbinary_ranks(xp, col, invalid)
        return [-ranks if descending else ranks], None
    storage = ctype.storage_arrow
    if pa.types.is_decimal128(storage):
        words = xp.ascontiguousarray(col.values).view(np.uint64).reshape(len(col), 2)
        high, low = words[:, 1].view(np.int64), words[:, 0]
        return ([~high, ~low] if descending else [high.copy(), low.copy()]), None
    if pa.types.is_fixed_size_binary(storage):
        parts = _byte_words(xp, col.values)
        return ([~p for p in parts] if descending else parts), None
    raise _refuse(col, "has no order")


def _byte_words(xp: Any, matrix: Any) -> list[Any]:
    """An (n, w) uint8 matrix as ceil(w / 8) uint64 arrays whose order is the rows' byte order."""
    n, width = matrix.shape
    words = []
    for start in range(0, width, 8):
        word = xp.zeros(n, dtype=np.uint64)
        for j in range(start, min(start + 8, width)):
            word |= matrix[:, j].astype(np.uint64) << np.uint64(8 * (7 - (j - start)))
        words.append(word)
    return words


_CHUNK = 7  # bytes of a string compared per refinement step; the low byte of the key says how many remain


def _varbinary_ranks(xp: Any, col: Column, invalid: Any) -> Any:
    """For each row, the rank of its bytes among the column's distinct values (0 for the smallest),
    NULL rows ranked as the empty value.

    Ranks start equal and are refined one 7-byte chunk at a time: a row's key for chunk k is its
    bytes ``[7k, 7k + 7)`` big-endian (zero-padded) shifted left by 8, plus how many bytes remain
    from ``7k`` capped at 8 (8: the value goes on past this chunk). Rows sorted by (rank, key) and
    ranked again keep every earlier decision and order equal prefixes by the next chunk, a value
    that ends before another with the same bytes first. It stops when no two rows with the same
    rank have bytes left, so the number of steps follows the longest shared prefix, not the
    longest value.
    """
    n = len(col)
    offsets = col._offsets_in_bounds().astype(np.int64)  # a checked copy where another process may write
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    if invalid is not None:
        lengths = xp.where(invalid, 0, lengths)
    rank = xp.zeros(n, dtype=np.int64)
    if n == 0 or int(lengths.max()) == 0:
        return rank
    data = col.data
    k = 0
    while True:
        first = k * _CHUNK
        remaining = lengths - first
        key = xp.minimum(xp.maximum(remaining, 0), 8).astype(np.uint64)
        for j in range(_CHUNK):
            present = remaining > j
            byte = data[xp.where(present, starts + first + j, 0)].astype(np.uint64)
            key |= xp.where(present, byte, np.uint64(0)) << np.uint64(8 * (_CHUNK - j))
        order = lexsort(xp, [rank, key], n)
        starts_of_groups = groups(xp, [rank, key], order)
        group_of_sorted = xp.cumsum(_marks(xp, starts_of_groups, n)) - 1
        rank = xp.empty(n, dtype=np.int64)
        rank[order] = group_of_sorted
        k += 1
        if int(starts_of_groups.shape[0]) == n:
            break  # every value differs
        # each group's size from where the groups start (CuPy's bincount compiled a CUB reduction, ~4 s on
        # a machine's first call)
        sizes = xp.diff(starts_of_groups, append=n)
        if not count_true((sizes[rank] > 1) & (lengths > k * _CHUNK)):
            break  # equal ranks left only among values that are fully compared
    return rank


def _marks(xp: Any, positions: Any, n: int) -> Any:
    """An int64 array of ``n`` zeros with ones at ``positions``."""
    marks = xp.zeros(n, dtype=np.int64)
    marks[positions] = 1
    return marks
