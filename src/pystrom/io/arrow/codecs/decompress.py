"""Decompress the LZ4_FRAME / ZSTD buffers of Arrow IPC record batches into backend memory, in batches.

The caller (:mod:`.read.compressed_reads`) has read the compressed frames of a group of batches into one array
``src``; each frame's output goes either to a 64-byte aligned offset of one scratch ``dst`` or to an
array of its own (``dst_arrays``: a column's place in the table, decoded into without a copy); one
call decompresses them all:

- CPU: pystrom's LZ4 decoder and libzstd (pyarrow's codec where none loads) on a thread pool
  (:mod:`.codecs.host`);
- GPU: :func:`.codecs.device._inflate_device` (nvCOMP's batched decompression is meant to replace the
  host round trip it makes today).

What comes back is the number of bytes each frame really produced, -1 where a frame is corrupt: the
caller compares it with the length the file claimed, and refuses the file where they differ. With
``wait=False`` a GPU returns them on the device, ready when the current stream reaches this point: a
caller inflating one slice after another reads them all back with one synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .device import _inflate_device, decodes_on_host
from .host import inflate_host

__all__ = ["Frames", "inflate", "staged", "CODECS"]

CODECS = ("lz4_frame", "zstd")  # Arrow's CompressionType: 0 = LZ4_FRAME, 1 = ZSTD


@dataclass
class Frames:
    """Compressed frames of one codec and where their output goes."""

    codec: str  # "lz4_frame" or "zstd"
    src: Any  # backend uint8 array: the compressed frames (prefix already stripped), as read
    src_offsets: np.ndarray  # int64, start of frame i in src
    src_sizes: np.ndarray  # int64
    dst: Any  # backend uint8 array receiving the decompressed bytes (None if every frame has its own)
    dst_offsets: np.ndarray  # int64, where frame i's output starts in dst (64-byte aligned)
    dst_sizes: np.ndarray  # int64, the size the Arrow prefix claims
    # per frame, None or its own 1-D contiguous uint8 backend array (64-byte aligned, at least dst_sizes[i]
    # bytes): the output then starts there and dst_offsets[i] is unused
    dst_arrays: Sequence[Any] | None = None
    # per frame the address of its own output, 0 where it goes to dst; None: asked of dst_arrays (and
    # those checked). Given, they decide: the caller vouches for dst_sizes[i] writable bytes at each, and
    # dst_arrays (any sequence, e.g. one that builds each array when asked) are views of them for the
    # codecs that want arrays. The reader's (:mod:`.read.compressed_reads`) are the places of reads read_many checked
    # inside their destination: checking 16,384 arrays again cost more than a tenth of a many-batch read.
    dst_addresses: np.ndarray | None = None

    def out(self, i: int) -> Any:
        """The array frame ``i``'s output fills (``dst_sizes[i]`` bytes)."""
        own = self.dst_arrays[i] if self.dst_arrays is not None else None
        at, size = int(self.dst_offsets[i]), int(self.dst_sizes[i])
        return own[:size] if own is not None else self.dst[at : at + size]


def staged(backend: Any, codec: str) -> bool:
    """Whether a reader on ``backend`` has ``codec``'s frames read into host memory, decoded there and
    copied up (:mod:`.codecs.staged`) rather than read into ``backend`` memory and decoded by
    :func:`inflate` there: on a GPU, the codecs it would decode on the host anyway (ZSTD without nvCOMP)."""
    return backend.kind != "cpu" and decodes_on_host(codec)


def inflate(backend: Any, frames: Frames, wait: bool = True) -> Any:
    """Decompress every frame into its place (:class:`Frames`); the bytes each produced (int64), -1 where
    a frame is corrupt. Output bytes of a frame whose count differs from ``dst_sizes`` are undefined.
    ``wait=False``: on a GPU the counts may come back as a device array (module docstring)."""
    if frames.codec not in CODECS:
        raise ValueError(f"unknown codec {frames.codec!r}; expected one of {CODECS}")
    n = len(frames.src_offsets)
    if (
        len(frames.dst_offsets) != n
        or len(frames.dst_sizes) != n
        or (frames.dst_arrays is not None and len(frames.dst_arrays) != n)
        or (frames.dst_addresses is not None and len(frames.dst_addresses) != n)
    ):
        raise ValueError("src and dst describe different numbers of frames")
    _check_spans(frames.src_offsets, frames.src_sizes, int(frames.src.shape[0]), "src")
    shared = np.ones(n, dtype=bool)
    if frames.dst_addresses is not None:  # the caller's word for them (Frames.dst_addresses)
        at = np.asarray(frames.dst_addresses, dtype=np.int64).copy()
        shared = at == 0
    else:
        at = np.zeros(n, dtype=np.int64)
        for i, own in enumerate(frames.dst_arrays or ()):
            if own is not None:
                shared[i] = False
                size = int(frames.dst_sizes[i])
                if (own.ndim != 1 or own.dtype != np.uint8 or not own.flags.c_contiguous
                        or not 0 <= size <= own.shape[0]):  # fmt: skip
                    raise ValueError(f"frame {i}: its output array is not {frames.dst_sizes[i]} contiguous bytes")
                at[i] = backend.array_ptr(own)
    total = 0 if frames.dst is None else int(frames.dst.shape[0])
    _check_spans(frames.dst_offsets[shared], frames.dst_sizes[shared], total, "dst")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if shared.any() and frames.dst is not None:
        at[shared] = backend.array_ptr(frames.dst) + frames.dst_offsets[shared]
    order = np.flatnonzero(frames.dst_sizes > 0)  # frames write in parallel: no two outputs may overlap
    order = order[np.argsort(at[order], kind="stable")]
    if (at[order][:-1] + frames.dst_sizes[order][:-1] > at[order][1:]).any():
        raise ValueError("two frames' outputs overlap")
    if backend.kind == "cpu":
        return inflate_host(frames, at)
    return _inflate_device(backend, frames, at, wait)


def _check_spans(offsets: np.ndarray, sizes: np.ndarray, total: int, what: str) -> None:
    """The spans lie inside their array (the caller computed them: a failure is a bug, not a bad file)."""
    if len(offsets) != len(sizes):
        raise ValueError(f"{what}: {len(offsets)} offsets, {len(sizes)} sizes")
    if len(offsets) and ((offsets < 0).any() or (sizes < 0).any() or (offsets + sizes > total).any()):
        raise ValueError(f"{what}: a frame's span lies outside the {total}-byte array")
