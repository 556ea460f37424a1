"""A range reader for record batches whose buffers are compressed: the column readers of :mod:`.direct`
ask it for byte ranges exactly as they ask :class:`.ranges.RangeReader`, and get decompressed bytes.

Offsets below :data:`.file.PACKED_BASE` are file offsets (uncompressed buffers, also those a writer
stored uncompressed inside a compressed body): passed to the file reader. Offsets above it fall in a
:class:`.file.Packed` buffer: the reads are queued, and :meth:`InflatingReader.wait` serves them a
slice of frames at a time:

1. the frames the queued reads touch (each once), in file order, cut into slices of at most
   ``scratch_bytes`` (compressed plus decompressed bytes; a larger frame makes a slice of its own);
2. per slice: the compressed frames read by the file reader into one scratch ``src``, one batched
   :func:`.inflate.inflate` call per codec into one scratch ``dst`` (each frame's output 64-byte
   aligned), each frame's produced size compared with its claim (FileFormatError naming the record
   batch, the column and the buffer), then every queued read copied out of ``dst`` (a device-to-device
   copy on a GPU, a memcpy on the CPU) before the slice's scratch is dropped.

So a group of batches needs, beside its table, at most one slice of scratch at a time (the default:
a quarter of :func:`pystrom._backend.stream_group_bytes`), never the whole compressed file plus its
inflated copy. The column readers wait twice (string offsets first, then the rest), so a frame is
inflated when it is first needed, and the offsets of strings and lists are checked (:mod:`.offsets`)
before their data is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..._backend import stream_group_bytes
from ...errors import FileFormatError
from .file import PACKED_BASE, BatchLayout, Packed
from .inflate import Frames, inflate
from .zstd_frames import check_zstd, zstd_reason

__all__ = ["InflatingReader", "packed_buffers", "scratch_bytes"]

_ALIGN = 64


def scratch_bytes(backend: Any) -> int:
    """Compressed plus decompressed scratch one slice of frames may take (module docstring)."""
    return max(16 << 20, stream_group_bytes(backend) // 4)


def packed_buffers(batches: Sequence[BatchLayout]) -> list[Packed]:
    """Every compressed buffer the batches' chunks name, by offset."""
    found = {}
    for b in batches:
        for c in b.chunks.values():
            for r in (c.validity, c.values, c.data, c.child_validity):
                if isinstance(r, Packed):
                    found[r.offset] = r
    return [found[k] for k in sorted(found)]


def _up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class InflatingReader:
    """:class:`.ranges.RangeReader`'s interface over ``reader`` (the file's), serving ``packed``."""

    def __init__(self, reader: Any, packed: Sequence[Packed], scratch: int | None = None):
        self._reader = reader
        self.backend = reader.backend
        self.path = reader.path
        self._packed = list(packed)
        self._starts = np.array([p.offset for p in self._packed], dtype=np.int64)
        self._scratch = scratch_bytes(self.backend) if scratch is None else scratch
        self._queued: list[tuple[int, int, Any]] = []
        self.frames_inflated = 0  # frames decompressed so far (one frame twice if read in two waits)

    @property
    def bytes_read(self) -> int:
        return self._reader.bytes_read

    def read(self, offset: int, size: int, dst: Any) -> None:
        if size <= 0:
            return
        if offset < PACKED_BASE:
            self._reader.read(offset, size, dst)
        else:
            self._queued.append((offset, size, dst))

    def wait(self) -> None:
        queued, self._queued = self._queued, []
        self._reader.wait()
        if not queued:
            return
        at = np.array([q[0] for q in queued], dtype=np.int64)
        which = np.searchsorted(self._starts, at, side="right") - 1
        for (offset, size, _), k in zip(queued, which.tolist()):
            p = self._packed[k] if k >= 0 else None
            if p is None or offset + size > p.offset + p.size:  # the layouts' checks make this a bug
                raise FileFormatError(f"{self.path!r}: a read of {size} bytes past a compressed buffer's end")
        needed = sorted(set(which.tolist()), key=lambda k: self._packed[k].frame.offset)
        reads: dict[int, list[tuple[int, int, Any]]] = {}
        for (offset, size, dst), k in zip(queued, which.tolist()):
            reads.setdefault(k, []).append((offset - self._packed[k].offset, size, dst))
        piece: list[int] = []
        used = 0
        for k in needed:
            p = self._packed[k]
            cost = _up(p.frame.size) + _up(p.size)
            if piece and used + cost > self._scratch:
                self._serve(piece, reads)
                piece, used = [], 0
            piece.append(k)
            used += cost
        if piece:
            self._serve(piece, reads)

    def _serve(self, piece: list[int], reads: dict[int, list[tuple[int, int, Any]]]) -> None:
        """Read, inflate and hand out one slice of frames (steps 2 of the module docstring)."""
        xp = self.backend.xp
        packed = [self._packed[k] for k in piece]
        src_sizes = np.array([p.frame.size for p in packed], dtype=np.int64)
        dst_sizes = np.array([p.size for p in packed], dtype=np.int64)
        src_offsets = np.cumsum([0, *[_up(n) for n in src_sizes.tolist()]]).astype(np.int64)
        dst_offsets = np.cumsum([0, *[_up(n) for n in dst_sizes.tolist()]]).astype(np.int64)
        src = xp.empty(max(int(src_offsets[-1]), 1), dtype=np.uint8)
        dst = xp.empty(max(int(dst_offsets[-1]), 1), dtype=np.uint8)
        for p, at in zip(packed, src_offsets.tolist()):
            self._reader.read(p.frame.offset, p.frame.size, src[at : at + p.frame.size])
        self._reader.wait()
        codecs = np.array([p.codec for p in packed])
        for codec in sorted(set(codecs.tolist())):
            mine = np.flatnonzero(codecs == codec)
            frames = Frames(codec, src, src_offsets[mine], src_sizes[mine], dst, dst_offsets[mine], dst_sizes[mine])
            produced = inflate(self.backend, frames)
            self.frames_inflated += len(mine)
            wrong = np.flatnonzero(produced != dst_sizes[mine])
            if len(wrong):
                i = int(mine[wrong[0]])
                got = int(produced[wrong[0]])
                why = "its frame is corrupt" if got < 0 else f"its frame decompresses to {got:,} bytes"
                if got < 0 and codec == "zstd":
                    why += self._zstd_why(src, int(src_offsets[i]), packed[i])
                raise FileFormatError(
                    f"{self.path!r}: {packed[i].what}: {why}, its length prefix claims {packed[i].size:,} "
                    f"({packed[i].codec}; corrupt file)"
                )
        for k, at in zip(piece, dst_offsets.tolist()):
            for rel, size, out in reads[k]:
                out[:size] = dst[at + rel : at + rel + size]

    def _zstd_why(self, src: Any, at: int, p: Packed) -> str:
        """The structural fault of a refused ZSTD frame, if it has one (a copy of its bytes to host)."""
        frame = self.backend.to_host(src[at : at + p.frame.size])
        code = int(check_zstd(frame, np.zeros(1), np.array([p.frame.size]), np.array([p.size]))[0])
        return f" ({zstd_reason(code)})" if code else ""
