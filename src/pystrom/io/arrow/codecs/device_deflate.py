"""Body buffers compressed on the GPU: one LZ4 frame each, by :file:`kernels/lz4_encode.cu`.

Each buffer is cut into chunks of 64 KiB; a warp compresses a chunk into one LZ4 block (stored raw where
it would not shrink), all chunks of a call in one launch. The frame says its blocks are independent
(LZ4F's ``blockMode``), so every reader decodes them one after another without a window across blocks,
and carries no checksums (Arrow's own writer sets none either). After the launch the block sizes come to
the host, the blocks of each buffer are gathered behind its frame header on the GPU
(:file:`kernels/copies.cu`), and only the compressed bytes cross to the host, into pinned memory.

LZ4 only: Zstandard frames need an entropy coder (FSE for the sequences, Huffman for the literals) that
pystrom does not have on the GPU, so ``compression="zstd"`` compresses on the CPU codecs
(:mod:`.codecs.compress`). The CPU twin of the kernel is liblz4 (pyarrow's codec), which reads every
frame made here: tests/test_lz4_encode_emulated.py and tests/test_lz4_encode.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ....kernels import kernel, launch, launch_function

__all__ = ["CHUNK", "FRAME_HEADER", "END_MARK", "FrameLayout", "chunk_table", "lz4_frames_device"]

CHUNK = 1 << 16  # an LZ4 block of at most 64 KiB: the kernel's table holds 16-bit positions
_ENCODE_THREADS = 128  # kernels/lz4_encode.cu's ENCODE_WARPS warps a block (its hash tables are sized for them)
_MAGIC = b"\x04\x22\x4d\x18"
_FLG = 0x60  # version 01, blocks independent, no block or content checksum, no content size, no dictionary
_BD = 0x40  # blocks of at most 64 KiB


def _xxh32_short(data: bytes, seed: int = 0) -> int:
    """XXH32 of fewer than 16 bytes (the frame descriptor's check byte is its second byte)."""
    prime1, prime2, prime3, prime5 = 2654435761, 2246822519, 3266489917, 374761393
    mask = 0xFFFFFFFF
    assert len(data) < 16
    h = (seed + prime5 + len(data)) & mask
    for byte in data:
        h = (h + byte * prime5) & mask
        h = (((h << 11) | (h >> 21)) & mask) * prime1 & mask
    h ^= h >> 15
    h = h * prime2 & mask
    h ^= h >> 13
    h = h * prime3 & mask
    return h ^ (h >> 16)


FRAME_HEADER = _MAGIC + bytes([_FLG, _BD, (_xxh32_short(bytes([_FLG, _BD])) >> 8) & 0xFF])
END_MARK = bytes(4)  # a zero block size ends the frame


def chunk_table(offsets: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The chunks of buffers ``[offsets[i], offsets[i] + sizes[i])`` (every size > 0): for each chunk its
    buffer, its offset in the source, its size, and the offset of its block in the scratch (4 + size
    bytes of room each)."""
    per = (sizes + CHUNK - 1) // CHUNK
    owner = np.repeat(np.arange(len(sizes), dtype=np.int64), per)
    first = np.cumsum(per) - per
    k = np.arange(len(owner), dtype=np.int64) - first[owner]
    src = offsets[owner] + k * CHUNK
    size = np.minimum(CHUNK, sizes[owner] - k * CHUNK)
    room = size + 4
    return owner, src, size, np.cumsum(room) - room


@dataclass(frozen=True)
class FrameLayout:
    """Where the compressed frames go in the output, from the blocks' sizes: each kept buffer's frame
    (``frame_start``, ``frame_length``) back to back, and each chunk's block at ``block_at`` (meaningful
    where ``kept[owner]``). A buffer whose frame would not be smaller is not kept (stored raw)."""

    kept: np.ndarray
    frame_start: np.ndarray
    frame_length: np.ndarray
    block_at: np.ndarray
    total: int

    @staticmethod
    def of(owner: np.ndarray, block: np.ndarray, sizes: np.ndarray) -> FrameLayout:
        first = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])  # every buffer has a chunk
        before = np.cumsum(block) - block  # the blocks' bytes before each chunk, over all buffers
        frame_length = np.add.reduceat(block, first) + len(FRAME_HEADER) + len(END_MARK)
        kept = frame_length < sizes
        kept_bytes = np.where(kept, frame_length, 0)
        frame_start = np.cumsum(kept_bytes) - kept_bytes
        block_at = frame_start[owner] + len(FRAME_HEADER) + before - before[first][owner]
        return FrameLayout(kept, frame_start, frame_length, block_at, int(kept_bytes.sum()))

    def finish(self, host: np.ndarray) -> list:
        """Write each kept frame's header and end mark into ``host`` (the blocks are there); the spans."""
        header = np.frombuffer(FRAME_HEADER, dtype=np.uint8)
        spans: list = []
        for kept, start, length in zip(self.kept.tolist(), self.frame_start.tolist(), self.frame_length.tolist()):
            if kept:
                host[start : start + len(FRAME_HEADER)] = header
                host[start + length - len(END_MARK) : start + length] = 0
            spans.append((start, length) if kept else None)
        return spans


def lz4_frames_device(backend: Any, src: Any, offsets: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, list]:
    """Compress the device buffers ``src[offsets[i] : offsets[i] + sizes[i]]`` (``src``: a uint8 device
    array; every size > 0) to one LZ4 frame each, on the current stream of ``backend``'s GPU.

    Returns ``(host, spans)``: ``host`` a pinned uint8 array holding the frames back to back, and for each
    buffer ``(start, length)`` of its frame in ``host``, or None where the frame would not be smaller than
    the buffer (the caller then stores the buffer raw, as Arrow's writer does)."""
    cp = backend.xp
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(sizes) == 0:
        return np.zeros(0, dtype=np.uint8), []
    if (sizes <= 0).any():
        raise ValueError("lz4_frames_device compresses non-empty buffers only")
    owner, chunk_src, chunk_size, chunk_dst = chunk_table(offsets, sizes)
    n = len(owner)
    scratch = cp.empty(int(chunk_dst[-1] + chunk_size[-1] + 4), dtype=cp.uint8)
    table = cp.asarray(np.concatenate([chunk_src, chunk_size, chunk_dst]))
    blocks = cp.empty(n, dtype=cp.int64)
    function = kernel("lz4_encode", "lz4_encode", backend.ordinal)
    launch_function(function, backend.ordinal, n * 32, (src, scratch, table, np.int32(n), blocks), _ENCODE_THREADS)
    block = blocks.get()
    layout = FrameLayout.of(owner, block, sizes)
    host = _pinned(cp, layout.total)
    if layout.total:
        out = cp.empty(layout.total, dtype=cp.uint8)
        moved = layout.kept[owner]
        spans = np.concatenate([chunk_dst[moved], out.data.ptr + layout.block_at[moved], block[moved]])
        count = int(moved.sum())
        launch("copies", "copy_out", backend.ordinal, count * 256, (scratch, cp.asarray(spans), np.int64(count)))
        out.get(out=host)
    return host, layout.finish(host)


def _pinned(cp: Any, nbytes: int) -> np.ndarray:
    memory = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
    return np.frombuffer(memory, dtype=np.uint8, count=nbytes)
