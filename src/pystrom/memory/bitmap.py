"""Bitmap operations on either backend: CUDA kernels on a GPU, the C++ core on the CPU.

Bitmaps are Arrow's: LSB bit order, bit i of the column at ``bit_offset + i``. Results are
allocated on the backend's device, whichever device is current.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core
from .backend import Backend

__all__ = ["unpack", "pack", "count_set"]


def unpack(backend: Backend, bitmap: Any, bit_offset: int, count: int) -> Any:
    """``count`` bits starting at ``bit_offset`` as a bool array (1 = set)."""
    if backend.kind == "cpu":
        out = np.empty(count, dtype=bool)
        if count:
            _core.unpack_bits(np.ascontiguousarray(bitmap), bit_offset, out, count)
        return out
    from ..kernels import launch

    xp = backend.xp
    with backend.activate():
        out = xp.empty(count, dtype=bool)
        launch("bitmap", "unpack_bits", backend.ordinal, count,
               (xp.ascontiguousarray(bitmap), np.int64(bit_offset), np.int64(count), out))  # fmt: skip
    return out


def pack(backend: Backend, mask: Any, shift: int = 0) -> Any:
    """Pack a bool/0-1 array into an LSB bitmap whose first bit is bit ``shift`` (0..7) of byte 0."""
    count = int(mask.shape[0])
    nbytes = (shift + count + 7) // 8
    if backend.kind == "cpu":
        bits = np.asarray(mask, dtype=bool)
        if shift:
            bits = np.concatenate([np.zeros(shift, dtype=bool), bits])
        return np.packbits(bits, bitorder="little")
    from ..kernels import launch

    xp = backend.xp
    with backend.activate():
        out = xp.empty(nbytes, dtype=xp.uint8)
        src = xp.ascontiguousarray(mask).view(xp.uint8) if mask.dtype.itemsize == 1 else (mask != 0).view(xp.uint8)
        launch("bitmap", "pack_bits", backend.ordinal, nbytes,
               (src, np.int64(count), np.int32(shift), out, np.int64(nbytes)))  # fmt: skip
    return out


def count_set(backend: Backend, bitmap: Any, bit_offset: int, count: int) -> int:
    """Number of set bits among ``count`` bits starting at ``bit_offset``."""
    if count == 0:
        return 0
    if backend.kind == "cpu":
        return int(_core.count_bits(np.ascontiguousarray(bitmap), bit_offset, count))
    with backend.activate():
        return int(backend.xp.count_nonzero(unpack(backend, bitmap, bit_offset, count)))
