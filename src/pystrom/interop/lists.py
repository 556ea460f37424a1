"""List columns: how ``fixed_size_list<T>[d]`` and ``list<T>`` sit in a table's one allocation, and
:func:`list_column`, which builds one from NumPy/CuPy buffers for :func:`~pystrom.interop.build.build_table`.

``T`` is bool, int8..64, uint8..64 or float16/32/64. A list column of ``n`` rows with ``m`` elements
in all (``m = n * d`` for a fixed_size_list) has, in the table's allocation (see :mod:`pystrom.memory.layout`;
every span starts on a 64-byte boundary):

=====================  ==========================================  =========================================
span (ColumnPlan)      fixed_size_list<T>[d] (Layout.FIXED_LIST)   list<T> (Layout.LIST)
=====================  ==========================================  =========================================
``values``             the m child values, contiguous, row i at    int32 offsets, n + 1 of them: offsets[0]
                       elements ``[i*d, (i+1)*d)``; ``T``'s        is 0, non-decreasing, offsets[n] is m;
                       NumPy dtype (bool: one byte, 0/1)           row i is elements [offsets[i], offsets[i+1])
``data``               None                                        the m child values, contiguous, ``T``'s
                                                                   NumPy dtype (bool: one byte, 0/1)
``validity``           LSB bitmap of the n rows (bit set = row is not NULL); only when some row is NULL
``child_validity``     LSB bitmap of the m elements (bit set = element is not NULL); only when some is NULL
=====================  ==========================================  =========================================

A NULL row of a fixed_size_list still owns its d slots (their values unspecified); a NULL row of a
list has whatever length its offsets give it (0 when written here from Arrow data with empty NULLs,
or any length: the elements exist, are unspecified and are ignored). ``ColumnType.storage`` is
``T``'s dtype, ``ColumnType.list_size`` is d (0 for list), ``ColumnType.width`` is the bytes per row
of the values span (``d * itemsize``; 4 for list). Producers that decode straight into place plan with
``ColumnSpec(name, type, n, null_count, data_size=m * itemsize (list only), child_null_count=...)``.

Seen from a :class:`~pystrom.Column`: ``values`` is the (n, d) child matrix of a fixed_size_list;
``offsets`` (n + 1, not rebased after slicing) and ``child_values`` (m) are a list's buffers;
``child_validity`` is the element bitmap of either, indexed by element position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .._types import ColumnType, Layout, column_type
from ..errors import InvalidArgumentError
from ..memory import bitmap as _bitmap
from ..memory.backend import Backend, Block, backend_of_array, resolve_device
from ..memory.layout import ColumnPlan, ColumnSpec

__all__ = ["BufferColumn", "list_column"]

_CHILD_KINDS = "biuf"  # bool, signed, unsigned, floating


@dataclass
class BufferColumn:
    """A list column given as buffers (host NumPy or device CuPy arrays), ready for build_table."""

    field: pa.Field
    type: ColumnType
    length: int
    null_count: int
    child_null_count: int
    values: Any  # 1-D contiguous child values (m)
    offsets: Any | None  # int32 (n + 1) for list, None for fixed_size_list
    validity: Any | None  # packed LSB bitmap of the rows, None when no row is NULL
    child_validity: Any | None  # packed LSB bitmap of the elements, None when no element is NULL

    def spec(self) -> ColumnSpec:
        data_size = self.values.nbytes if self.type.layout == Layout.LIST else 0
        return ColumnSpec(self.field.name, self.type, self.length, self.null_count, data_size, self.child_null_count)

    def fill(self, block: Block, plan: ColumnPlan) -> None:
        if self.type.layout == Layout.LIST:
            _put(block, plan.values.offset, self.offsets)
            _put(block, plan.data.offset, self.values)
        else:
            _put(block, plan.values.offset, self.values)
        if plan.validity is not None:
            _put(block, plan.validity.offset, self.validity[: plan.validity.size])
        if plan.child_validity is not None:
            _put(block, plan.child_validity.offset, self.child_validity[: plan.child_validity.size])


def _put(block: Block, offset: int, array: Any) -> None:
    if array.size == 0:
        return
    if isinstance(array, np.ndarray):
        block.write_host(offset, np.ascontiguousarray(array).view(np.uint8).reshape(-1))
    elif block.backend.kind == "cpu":
        import cupy

        block.write_host(offset, cupy.asnumpy(array).view(np.uint8).reshape(-1))
    else:
        block.write_device(offset, array.reshape(-1).view(array.dtype))


def _backend_of(array: Any) -> Backend:
    return backend_of_array(array) or resolve_device("cpu")


def _as_bitmap(name: str, what: str, given: Any, count: int) -> tuple[Any | None, int]:
    """A packed LSB bitmap of ``count`` bits (or None: nothing NULL) and the number of unset bits."""
    if given is None:
        return None, 0
    backend = _backend_of(given)
    if given.ndim != 1:
        raise InvalidArgumentError(f"column {name!r}: {what} must be 1-D; got shape {tuple(given.shape)}")
    if given.dtype == np.bool_:
        if given.shape[0] != count:
            raise InvalidArgumentError(f"column {name!r}: {what} has {given.shape[0]} flags for {count} slots")
        bitmap = _bitmap.pack(backend, given)
    elif given.dtype == np.uint8:
        if given.shape[0] < (count + 7) // 8:
            raise InvalidArgumentError(
                f"column {name!r}: {what} bitmap has {given.shape[0]} bytes; {count} slots need {(count + 7) // 8}"
            )
        bitmap = given
    else:
        raise InvalidArgumentError(f"column {name!r}: {what} must be bool flags or a uint8 bitmap; got {given.dtype}")
    nulls = count - _bitmap.count_set(backend, bitmap, 0, count)
    return (bitmap if nulls else None), nulls


def list_column(
    name: str,
    values: Any,
    *,
    list_size: int | None = None,
    offsets: Any = None,
    validity: Any = None,
    child_validity: Any = None,
    length: int | None = None,
    arrow_type: pa.DataType | None = None,
) -> BufferColumn:
    """A fixed_size_list (``list_size=d``) or list (``offsets=``) column from NumPy/CuPy buffers.

    ``values``: the child values, 1-D (or, for a fixed_size_list, 2-D (n, d) C-contiguous), of
    dtype bool or a fixed-width integer/float. ``offsets``: int32, n + 1, starting at 0,
    non-decreasing, ending at ``len(values)``. ``validity`` / ``child_validity``: bool flags (True =
    not NULL) or packed LSB bitmaps (uint8) of the rows / the elements; None = none NULL.
    ``length``: the row count of a fixed_size_list with d = 0 (otherwise it follows from the
    buffers). ``arrow_type``: the logical type (default ``list_(T)`` / ``list_(T, d)``).

    The arrays are copied into the table by build_table; nothing here keeps them.
    """
    if (list_size is None) == (offsets is None):
        raise InvalidArgumentError(
            f"column {name!r}: give exactly one of list_size (fixed_size_list) and offsets (list)"
        )
    if values.dtype.kind not in _CHILD_KINDS or values.dtype.itemsize > 8:
        raise InvalidArgumentError(
            f"column {name!r}: list elements must be bool or fixed-width integers/floats; got {values.dtype}"
        )
    child = pa.from_numpy_dtype(values.dtype)
    if list_size is not None:
        if not isinstance(list_size, int) or isinstance(list_size, bool) or list_size < 0:
            raise InvalidArgumentError(f"column {name!r}: list_size must be a non-negative int; got {list_size!r}")
        if values.ndim == 2 and values.shape[1] == list_size:
            values = values.reshape(-1)
        if values.ndim != 1:
            raise InvalidArgumentError(f"column {name!r}: values must be 1-D or (n, {list_size}); got {values.shape}")
        if list_size == 0:
            if length is None:
                raise InvalidArgumentError(f"column {name!r}: a fixed_size_list of size 0 needs length=")
            n = length
        elif values.shape[0] % list_size:
            raise InvalidArgumentError(f"column {name!r}: {values.shape[0]} values do not form rows of {list_size}")
        else:
            n = values.shape[0] // list_size
        logical = arrow_type or pa.list_(child, list_size)
    else:
        if offsets.ndim != 1 or offsets.dtype != np.int32 or offsets.shape[0] < 1:
            raise InvalidArgumentError(f"column {name!r}: offsets must be 1-D int32 with n + 1 entries")
        if values.ndim != 1:
            raise InvalidArgumentError(f"column {name!r}: list values must be 1-D; got shape {values.shape}")
        n = offsets.shape[0] - 1
        xp = _backend_of(offsets).xp
        ends = [int(v) for v in xp.asarray(offsets[xp.asarray([0, n])]).tolist()]
        decreasing = bool(xp.any(offsets[1:] < offsets[:-1])) if n else False
        if ends[0] != 0 or ends[1] != values.shape[0] or decreasing:
            raise InvalidArgumentError(
                f"column {name!r}: offsets must start at 0, never decrease and end at {values.shape[0]} "
                f"(the number of values); they go from {ends[0]} to {ends[1]}{' and decrease' if decreasing else ''}"
            )
        logical = arrow_type or pa.list_(child)
    ctype = column_type(logical, name)
    if ctype.layout not in Layout.NESTED or ctype.storage != values.dtype:
        raise InvalidArgumentError(f"column {name!r}: arrow_type {logical} does not hold {values.dtype} values")
    rows, nulls = _as_bitmap(name, "validity", validity, n)
    elems, child_nulls = _as_bitmap(name, "child_validity", child_validity, int(values.shape[0]))
    field = pa.field(name, logical, nullable=True)
    return BufferColumn(field, ctype, n, nulls, child_nulls, values, offsets, rows, elems)
