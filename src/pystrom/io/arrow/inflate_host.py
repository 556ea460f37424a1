"""Compressed Arrow buffers decompressed on the CPU: pyarrow's codecs on a thread pool.

``pa.Codec("lz4")`` is the LZ4 frame codec Arrow's IPC format uses, ``pa.Codec("zstd")`` ZSTD; both
release the GIL while they decompress (measured: a Python thread keeps its pace beside them), so
``io_threads`` frames decompress at once, the largest first.

pyarrow decompresses into memory it allocates, not into ours: each output is copied to its place
(:meth:`.inflate.Frames.out`: in ``dst`` or its own array; a memcpy, beside decompression's 1-3 GB/s per
core). The size a frame produced: ZSTD's decoder refuses a frame that does not fill the claimed size
exactly ("Corrupt ZSTD compressed data"), and every ZSTD frame is first checked for structure
(:mod:`.zstd_frames`, the check the GPU path needs before nvCOMP) so that both devices refuse the same
frames (e.g. a skippable or a second frame, which libzstd would accept); the LZ4 codec returns the
claimed size whatever the frame produced, so the frame's blocks and sequences are walked first
(``_core.lz4_frame_size``, no output) and a frame whose walk disagrees with the claim is not
decompressed at all.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
from typing import Any

import numpy as np
import pyarrow as pa

from ... import _core
from .ranges import io_threads
from .zstd_frames import check_zstd

__all__ = ["inflate_host"]

_PYARROW_NAMES = {"lz4_frame": "lz4", "zstd": "zstd"}


@functools.cache
def _pool() -> cf.ThreadPoolExecutor:
    return cf.ThreadPoolExecutor(io_threads(), thread_name_prefix="pystrom-inflate")


@functools.cache
def _codec(name: str) -> pa.Codec:
    return pa.Codec(_PYARROW_NAMES[name])


def inflate_host(frames: Any) -> np.ndarray:
    """:func:`.inflate.inflate` for NumPy ``src``/``dst`` (an :class:`.inflate.Frames`)."""
    codec = _codec(frames.codec)
    walk = frames.codec == "lz4_frame"
    src = frames.src
    so, ss = frames.src_offsets.tolist(), frames.src_sizes.tolist()
    ds = frames.dst_sizes.tolist()
    refused = (
        check_zstd(src, frames.src_offsets, frames.src_sizes, frames.dst_sizes).tolist()
        if frames.codec == "zstd"
        else [0] * len(so)
    )

    def one(i: int) -> int:
        frame = src[so[i] : so[i] + ss[i]]
        want = ds[i]
        if walk:
            produced = _core.lz4_frame_size(frame)
            if produced != want:
                return produced
        elif refused[i]:
            return -1
        try:
            out = codec.decompress(frame, decompressed_size=want)
        except (pa.ArrowException, OSError, ValueError):
            return -1
        if out.size != want:
            return -1
        if want:
            frames.out(i)[:] = np.frombuffer(out, dtype=np.uint8)
        return want

    order = sorted(range(len(so)), key=lambda i: -ds[i])  # largest first: the pool ends together
    produced = np.empty(len(so), dtype=np.int64)
    if len(order) == 1:
        produced[0] = one(0)
        return produced
    # Frames dealt round-robin (largest first) into a few tasks a thread: a task a frame cost ~15 us of
    # the pool's Python each (2048 batches x 8 columns: 0.25 s of a 0.65 s read on the 2-core VM)
    tasks = min(len(order), 4 * io_threads())

    def some(t: int) -> list[int]:
        return [one(i) for i in order[t::tasks]]

    for t, got in enumerate(_pool().map(some, range(tasks))):
        produced[order[t::tasks]] = got
    return produced
