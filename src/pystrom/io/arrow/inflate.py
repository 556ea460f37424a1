"""Decompress the LZ4_FRAME / ZSTD buffers of Arrow IPC record batches into backend memory, in batches.

The caller (:mod:`.inflating`) has read the compressed frames of a group of batches into one array
``src`` and allocated one ``dst`` holding every frame's output at a 64-byte aligned offset; one call
decompresses them all:

- CPU: pyarrow's codecs on a thread pool (:mod:`.inflate_host`);
- GPU: :func:`.inflate_device._inflate_device` (nvCOMP's batched decompression is meant to replace the
  host round trip it makes today).

What comes back is the number of bytes each frame really produced, -1 where a frame is corrupt: the
caller compares it with the length the file claimed, and refuses the file where they differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .inflate_device import _inflate_device
from .inflate_host import inflate_host

__all__ = ["Frames", "inflate", "CODECS"]

CODECS = ("lz4_frame", "zstd")  # Arrow's CompressionType: 0 = LZ4_FRAME, 1 = ZSTD


@dataclass
class Frames:
    """Compressed frames of one codec and where their output goes."""

    codec: str  # "lz4_frame" or "zstd"
    src: Any  # backend uint8 array: the compressed frames (prefix already stripped), as read
    src_offsets: np.ndarray  # int64, start of frame i in src
    src_sizes: np.ndarray  # int64
    dst: Any  # backend uint8 array receiving the decompressed bytes
    dst_offsets: np.ndarray  # int64, where frame i's output starts in dst (64-byte aligned)
    dst_sizes: np.ndarray  # int64, the size the Arrow prefix claims


def inflate(backend: Any, frames: Frames) -> np.ndarray:
    """Decompress every frame into its place in ``frames.dst``; the bytes each produced (int64), -1 where
    a frame is corrupt. Output bytes of a frame whose count differs from ``dst_sizes`` are undefined."""
    if frames.codec not in CODECS:
        raise ValueError(f"unknown codec {frames.codec!r}; expected one of {CODECS}")
    _check_spans(frames.src_offsets, frames.src_sizes, int(frames.src.shape[0]), "src")
    _check_spans(frames.dst_offsets, frames.dst_sizes, int(frames.dst.shape[0]), "dst")
    if len(frames.src_offsets) != len(frames.dst_offsets):
        raise ValueError("src and dst describe different numbers of frames")
    if len(frames.src_offsets) == 0:
        return np.zeros(0, dtype=np.int64)
    if backend.kind == "cpu":
        return inflate_host(frames)
    return _inflate_device(backend, frames)


def _check_spans(offsets: np.ndarray, sizes: np.ndarray, total: int, what: str) -> None:
    """The spans lie inside their array (the caller computed them: a failure is a bug, not a bad file)."""
    if len(offsets) != len(sizes):
        raise ValueError(f"{what}: {len(offsets)} offsets, {len(sizes)} sizes")
    if len(offsets) and ((offsets < 0).any() or (sizes < 0).any() or (offsets + sizes > total).any()):
        raise ValueError(f"{what}: a frame's span lies outside the {total}-byte array")
