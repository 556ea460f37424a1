"""Arrow data going out: Columns as host pyarrow Arrays.

On the CPU backend the arrays reference the table's memory; only booleans are packed into bits and
a validity bitmap starting mid-byte is re-aligned. From a GPU, every buffer of every column is fetched
in one bulk transfer into one host allocation (booleans are packed on the device first, so only the
bits travel), and the arrays are views of that allocation.

The arrays reach pyarrow through the Arrow C data interface, with a release callback in C++
(``_core.arrow_array_capsule``, csrc/arrow_keep.hpp) that keeps the NumPy arrays over the memory
alive and never takes the GIL: pyarrow's pool threads may drop the last reference, even while the
interpreter shuts down, where a buffer that needs the GIL to go (``pa.py_buffer``) aborted the process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .. import _core
from .._types import Layout
from ..memory import bitmap as _bitmap
from ..memory.layout import align

if TYPE_CHECKING:
    from ..column import Column
    from ..memory.backend import Backend

__all__ = ["columns_to_arrow"]


def _aligned_validity(bitmap: np.ndarray, shift: int, n: int) -> np.ndarray:
    """A bitmap whose row 0 is bit 0 (Arrow arrays built here have offset 0)."""
    if shift == 0:
        return bitmap
    aligned = np.zeros((n + 7) // 8, dtype=np.uint8)
    _core.copy_bits(np.ascontiguousarray(bitmap), shift, aligned, 0, n)
    return aligned


def _finish(col: Column, buffers: list[np.ndarray | None]) -> pa.Array:
    """A pyarrow array over ``buffers`` (validity first; contiguous host arrays), which it keeps alive."""
    ctype = col.column_type
    addresses = [0 if b is None else b.ctypes.data for b in buffers]
    capsule = _core.arrow_array_capsule(tuple(b for b in buffers if b is not None), len(col), col.null_count, addresses)
    storage = pa.Array._import_from_c_capsule(ctype.storage_arrow.__arrow_c_schema__(), capsule)
    if isinstance(ctype.arrow, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(ctype.arrow, storage)
    return storage


def _primitive(arrow: pa.DataType, length: int, null_count: int, buffers: list[np.ndarray | None]) -> pa.Array:
    addresses = [0 if b is None else b.ctypes.data for b in buffers]
    capsule = _core.arrow_array_capsule(tuple(b for b in buffers if b is not None), length, null_count, addresses)
    return pa.Array._import_from_c_capsule(arrow.__arrow_c_schema__(), capsule)


def _buffer(array: np.ndarray) -> pa.Buffer:
    """A pyarrow Buffer over a host array, kept alive by the C++ release callback (not pa.py_buffer)."""
    flat = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    return _primitive(pa.uint8(), flat.size, 0, [None, flat]).buffers()[1]


def _list_span(col: Column, offsets: np.ndarray | None) -> tuple[int, int]:
    """(first element, element count) of a list column's rows; ``offsets`` are its host offsets (list only)."""
    if offsets is None:
        d = col.column_type.list_size
        return col.offset * d, len(col) * d
    return int(offsets[0]), int(offsets[-1] - offsets[0])


def _list_array(
    col: Column,
    validity: np.ndarray | None,
    offsets: np.ndarray | None,
    child: np.ndarray,
    child_bits: np.ndarray | None,
    child_shift: int,
    count: int,
) -> pa.Array:
    """Assemble a list array on the host: ``child`` holds the ``count`` elements (booleans packed),
    ``child_bits`` their bitmap from bit ``child_shift``, ``offsets`` the rows' offsets (rebased here)."""
    ctype = col.column_type
    storage = ctype.storage_arrow
    child_validity = child_nulls = None
    if child_bits is not None:
        child_validity = _aligned_validity(child_bits, child_shift, count)
        child_nulls = count - int(_core.count_bits(child_validity, 0, count)) if count else 0
    levels = [storage]  # a nested fixed_size_list: its inner list types, outermost first
    while pa.types.is_fixed_size_list(levels[-1].value_type):
        levels.append(levels[-1].value_type)
    elements = _primitive(
        levels[-1].value_type, count, child_nulls or 0, [child_validity if child_nulls else None, child]
    )
    for i in range(len(levels) - 1, 0, -1):  # inner lists have no NULLs: only the values and the rows do
        lists = len(col) * int(np.prod([t.list_size for t in levels[:i]]))  # counted down: a dimension may be 0
        elements = pa.Array.from_buffers(levels[i], lists, [None], children=[elements])
    parent = [_buffer(validity) if validity is not None else None]
    if offsets is not None:
        parent.append(_buffer((offsets - offsets[0]).astype(np.int32)))
    array = pa.Array.from_buffers(storage, len(col), parent, null_count=col.null_count, children=[elements])
    if isinstance(ctype.arrow, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(ctype.arrow, array)
    return array


def _cpu_list(col: Column, validity: np.ndarray | None) -> pa.Array:
    ctype = col.column_type
    offsets = col._offsets_in_bounds() if ctype.layout == Layout.LIST else None
    first, count = _list_span(col, offsets)
    child = col.child_values[first : first + count]
    if ctype.storage == np.bool_:
        child = np.packbits(child, bitorder="little")
    bits = col.child_validity
    if bits is not None:
        bits = bits[first // 8 : (first + count + 7) // 8]
    return _list_array(col, validity, offsets, child, bits, first % 8, count)


def _composed(col: Column, validity: np.ndarray | None, export: Any, host: Any) -> pa.Array:
    """A struct or list<C> array: its children exported by ``export`` (a list of Columns -> arrays),
    its offsets fetched by ``host`` (a device array -> NumPy)."""
    ctype = col.column_type
    storage = ctype.storage_arrow
    parent = [_buffer(validity) if validity is not None else None]
    if ctype.layout == Layout.STRUCT:
        children = export(list(col.children))
    else:
        offsets = host(col._offsets_in_bounds()).astype(np.int32, copy=False)
        first, count = int(offsets[0]), int(offsets[-1] - offsets[0])
        children = export([col._element_rows(first, count)])
        parent.append(_buffer(offsets - first))
    array = pa.Array.from_buffers(storage, len(col), parent, null_count=col.null_count, children=children)
    if isinstance(ctype.arrow, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(ctype.arrow, array)
    return array


def _cpu_column(col: Column) -> pa.Array:
    ctype = col.column_type
    validity = None
    if col.validity is not None and col.null_count:
        validity = _aligned_validity(col.validity, col.validity_offset, len(col))
    if ctype.layout in Layout.COMPOSED:
        return _composed(col, validity, lambda cols: [_cpu_column(c) for c in cols], np.asarray)
    if ctype.layout in Layout.NESTED:
        return _cpu_list(col, validity)
    if ctype.layout == Layout.BOOL:
        values = [np.packbits(col.values, bitorder="little")]
    elif ctype.layout == Layout.VARBINARY:
        values = [col._offsets_in_bounds(), col.data]  # offsets index the whole data buffer
    else:
        values = [col.values.reshape(-1)]
    return _finish(col, [validity, *values])


def _gpu_columns(backend: Backend, cols: Sequence[Column]) -> list[pa.Array]:
    requests: list[tuple[int, int]] = []  # (device address, bytes)
    keep = []  # device temporaries that must outlive the transfer

    def ask(address: int, size: int) -> int:
        requests.append((address, size))
        return len(requests) - 1

    def ask_array(array: Any) -> int:
        return ask(backend.array_ptr(array), array.nbytes)

    plans = []
    for col in cols:
        layout = col.column_type.layout
        validity = ask_array(col.validity) if col.validity is not None and col.null_count else None
        first = 0
        if layout in Layout.NESTED:  # [child values, child bitmap?, offsets?]
            offsets = col._offsets_in_bounds() if layout == Layout.LIST else None
            keep.append(offsets)  # a checked copy where another process may write: it must outlive the transfer
            ends = None if offsets is None else backend.to_host(offsets[[0, len(col)]])
            first, count = _list_span(col, ends)
            child = col.child_values[first : first + count]
            if col.column_type.storage == np.bool_:
                child = _bitmap.pack(backend, child)
                keep.append(child)
            values = [ask_array(child)]
            bits = col.child_validity
            values.append(None if bits is None else ask_array(bits[first // 8 : (first + count + 7) // 8]))
            values.append(None if offsets is None else ask_array(offsets))
            plans.append((validity, values, (first, count)))
            continue
        if layout == Layout.BOOL:
            bits = _bitmap.pack(backend, col.values)
            keep.append(bits)
            values = [ask_array(bits)]
        elif layout == Layout.VARBINARY:
            offsets = col._offsets_in_bounds()
            keep.append(offsets)
            ends = backend.to_host(offsets[[0, len(col)]])
            first = int(ends[0])
            values = [ask_array(offsets), ask(backend.array_ptr(col.data) + first, int(ends[1]) - first)]
        else:
            values = [ask_array(col.values)]
        plans.append((validity, values, first))

    starts = np.cumsum([0] + [align(size) for _, size in requests])
    host = np.empty(int(starts[-1]), dtype=np.uint8)
    views = [host[start : start + size] for start, (_, size) in zip(starts, requests)]
    # to_host first waits for the current stream, where the packing kernels ran
    backend.transfer.to_host([(view, address) for view, (address, _) in zip(views, requests)])
    del keep

    arrays = []
    for col, (validity, values, first) in zip(cols, plans):
        bitmap = _aligned_validity(views[validity], col.validity_offset, len(col)) if validity is not None else None
        if col.column_type.layout in Layout.NESTED:
            start, count = first
            child, bits, offsets = (None if i is None else views[i] for i in values)
            offsets = None if offsets is None else offsets.view(np.int32)
            if col.column_type.storage != np.bool_:
                child = child.view(col.column_type.storage)
            arrays.append(_list_array(col, bitmap, offsets, child, bits, start % 8, count))
            continue
        buffers = [views[i] for i in values]
        if col.column_type.layout == Layout.VARBINARY and first:
            offsets = buffers[0].view(np.int32)
            offsets -= first
        arrays.append(_finish(col, [bitmap, *buffers]))
    return arrays


def columns_to_arrow(cols: Sequence[Column]) -> list[pa.Array]:
    """Host pyarrow Arrays for columns of one table (zero copy on the CPU, one bulk copy from a GPU)."""
    _core.arrow_sweep()  # arrays pyarrow's threads let go of since the last export
    if not cols:
        return []
    backend = cols[0]._live_block().backend
    if backend.kind == "cpu":
        return [_cpu_column(c) for c in cols]
    with backend.activate():
        return _device_columns(backend, cols)


def _device_columns(backend: Backend, cols: Sequence[Column]) -> list[pa.Array]:
    """Flat columns in one bulk transfer; struct and list<C> columns each from their children's."""
    flat = [c for c in cols if c.column_type.layout not in Layout.COMPOSED]
    arrays = iter(_gpu_columns(backend, flat) if flat else [])
    out = []
    for col in cols:
        if col.column_type.layout not in Layout.COMPOSED:
            out.append(next(arrays))
            continue
        validity = None
        if col.validity is not None and col.null_count:
            validity = _aligned_validity(backend.to_host(col.validity), col.validity_offset, len(col))
        out.append(_composed(col, validity, lambda cs: _device_columns(backend, cs), backend.to_host))
    return out
