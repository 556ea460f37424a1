"""Bitmap operations on either backend: CUDA kernels on a GPU, the C++ core on the CPU.

Bitmaps are Arrow's: LSB bit order, bit i of the column at ``bit_offset + i``. Results are
allocated on the backend's device, whichever device is current.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core
from .backend import Backend, backend_of_array

__all__ = ["unpack", "pack", "count_set", "count_true", "all_true", "count_true_queued"]


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
        touched = (bit_offset + count - 1) // 8 - bit_offset // 8 + 1
        args = (backend.xp.ascontiguousarray(bitmap), np.int64(bit_offset), np.int64(count))
        return int(_count_on_device(backend, "count_bits", touched, args).get()[0])


def count_true(mask: Any) -> int:
    """Number of true (nonzero) entries of ``mask``, a NumPy or CuPy array of any shape and dtype. What
    ``xp.count_nonzero`` gives, without CuPy's reduction: its CUB kernels take NVRTC ~5 s to compile on a
    machine's first call (an H200, 2026-11-29: the demo's first run 16.1 s, the second 5.8 s), and 0.23 ms
    a call for 1M rows after that; this is one launch of kernels/bitmap.cu's count_nonzero_bytes."""
    return int(count_true_queued(mask)[0])


def all_true(mask: Any) -> bool:
    """Whether every entry of ``mask`` is true (nonzero); true for an empty one. One count, one wait."""
    return count_true(mask) == mask.size


def count_true_queued(mask: Any) -> Any:
    """``count_true(mask)`` as a one-element uint64 array on ``mask``'s device, counted on the current stream
    without waiting for it: callers that gather several counts read them back in one copy."""
    backend = backend_of_array(mask)
    if backend is None or backend.kind == "cpu":
        return np.array([np.count_nonzero(mask)], dtype=np.uint64)
    xp = backend.xp
    with backend.activate():
        flat = xp.ascontiguousarray(mask if mask.dtype.itemsize == 1 else mask != 0).reshape(-1).view(xp.uint8)
        n = int(flat.shape[0])
        if not n:
            return xp.zeros(1, dtype=xp.uint64)
        return _count_on_device(backend, "count_nonzero_bytes", max(16, n // 16), (flat, np.int64(n)))


def _count_on_device(backend: Backend, function: str, threads: int, args: tuple) -> Any:
    """A count by kernels/bitmap.cu's ``function`` (its last argument: a zeroed uint64 it adds into), queued
    on the current stream with ``threads`` threads; the one-element device array, not waited for."""
    from ..kernels import launch

    out = backend.xp.zeros(1, dtype=backend.xp.uint64)
    launch("bitmap", function, backend.ordinal, threads, (*args, out))
    return out
