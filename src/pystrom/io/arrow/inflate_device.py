"""Compressed Arrow buffers decompressed for a GPU table.

Today a correct fallback: the compressed frames are copied to the host, decompressed there by
:mod:`.inflate_host`, and the output copied back into ``frames.dst``. nvCOMP's batched LZ4/ZSTD
decompression (or a CUDA kernel) is meant to replace this body, keeping the contract of
:func:`.inflate.inflate`: every frame's output at its ``dst_offsets``, the bytes each produced returned
(-1 for a corrupt frame), nothing written outside a frame's ``[dst_offsets[i], + dst_sizes[i])``, and
the writes ordered before later work on the current CuPy stream.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .inflate_host import inflate_host

__all__ = ["_inflate_device"]


def _inflate_device(backend: Any, frames: Any) -> np.ndarray:
    """Decompress ``frames`` (an :class:`.inflate.Frames` over device arrays) on ``backend``'s GPU."""
    src = backend.to_host(frames.src)
    dst = np.empty(int(frames.dst.shape[0]), dtype=np.uint8)
    produced = inflate_host(dataclasses.replace(frames, src=src, dst=dst))
    if backend.kind == "cpu":
        frames.dst[...] = dst
    else:
        with backend.activate():
            frames.dst.set(dst)
    return produced
