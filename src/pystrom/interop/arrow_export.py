"""Arrow data going out: a Column as a host pyarrow Array.

On the CPU backend the arrays reference the table's memory (pyarrow keeps it alive); only booleans
are packed into bits and a validity bitmap starting mid-byte is re-aligned. From a GPU, each buffer
is copied to the host once (booleans packed on the device first, so only the bits travel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from .. import _bitmap, _core
from .._types import Layout

if TYPE_CHECKING:
    from ..column import Column

__all__ = ["column_to_arrow"]


def _host_validity(col: Column) -> pa.Buffer | None:
    bitmap = col.validity
    if bitmap is None or col.null_count == 0:
        return None
    backend = col._live_block().backend
    host = backend.to_host(bitmap)
    shift, n = col.validity_offset, len(col)
    if shift == 0:
        return pa.py_buffer(host)
    aligned = np.zeros((n + 7) // 8, dtype=np.uint8)
    _core.copy_bits(np.ascontiguousarray(host), shift, aligned, 0, n)
    return pa.py_buffer(aligned)


def column_to_arrow(col: Column) -> pa.Array:
    ctype = col.column_type
    backend = col._live_block().backend
    n = len(col)
    validity = _host_validity(col)
    if ctype.layout == Layout.BOOL:
        bits = _bitmap.pack(backend, col.values)
        buffers = [validity, pa.py_buffer(backend.to_host(bits))]
    elif ctype.layout == Layout.VARBINARY:
        offsets = backend.to_host(col.offsets)
        first, last = int(offsets[0]), int(offsets[-1])
        if backend.kind == "cpu":
            data = col.data  # zero-copy: offsets keep indexing the whole data buffer
        else:
            data = backend.to_host(col.data[first:last])
            offsets = offsets - first
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    else:
        buffers = [validity, pa.py_buffer(np.ascontiguousarray(backend.to_host(col.values)).reshape(-1))]
    storage = pa.Array.from_buffers(ctype.storage_arrow, n, buffers, null_count=col.null_count)
    if isinstance(ctype.arrow, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(ctype.arrow, storage)
    return storage
