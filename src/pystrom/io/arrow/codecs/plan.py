"""What one :meth:`.read.compressed_reads.InflatingReader.wait` does, planned in NumPy arrays.

A file of 2048 record batches x 8 columns queues 16,384 reads per wait; planning them one Python object
at a time (a dict of reads per buffer, a slice object grown frame by frame, the destination's address
asked twice per frame) took about as long as decoding them on the CPU. Here every step is an array
operation over the reads or the frames, and the only Python loop left runs once per slice:

- :func:`gather`: the queued reads as arrays: the compressed buffer each falls in (refused with a
  FileFormatError where it runs past that buffer's end: the layouts' checks make it a bug), its offset
  inside the decompressed bytes, its size, its destination's address and whether the destination is
  a 1-D contiguous uint8 array long enough for it;
- :func:`frames_of`: the frames those reads need, each once, in file order; which reads each serves; and
  which are inflated in place (read whole by exactly one read whose destination is usable and 64-byte
  aligned: the LZ4 kernel writes 64-byte aligned outputs);
- :func:`cut`: the frames cut into slices of at most ``budget`` bytes of scratch (compressed bytes plus
  the outputs that do not go in place; a larger frame makes a slice of its own), each slice's reads
  (frames at most ``GAP`` apart in the file are one read, the gap read and dropped) and every frame's
  place in the slice's ``src`` and scratch ``dst``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....errors import FileFormatError
from .decompress import CODECS

__all__ = ["ALIGN", "GAP", "Catalog", "Reads", "Needed", "Slice", "gather", "frames_of", "cut", "up"]

ALIGN = 64
GAP = 64 << 10  # file bytes between two frames read and dropped rather than a read of their own
_U8 = np.dtype(np.uint8)


def up(n: Any) -> Any:
    """``n`` rounded up to a multiple of :data:`ALIGN` (ints and int64 arrays)."""
    return -(-n // ALIGN) * ALIGN


@dataclass
class Catalog:
    """The compressed buffers a reader serves (:class:`.file.metadata.Packed`), as arrays, by place."""

    place: np.ndarray  # Packed.offset (ascending): where its decompressed bytes sit above PACKED_BASE
    size: np.ndarray  # the decompressed length its prefix claims
    frame_offset: np.ndarray  # the compressed frame's file range
    frame_size: np.ndarray
    codec: np.ndarray  # int8, index into CODECS
    # for errors: each buffer's record batch and an index into ``labels`` ("column 'x', buffer 1 (values)");
    # a batch of -1: the label is the whole description
    batch: np.ndarray
    label: np.ndarray
    labels: list[str]

    def what(self, k: int) -> str:
        """Buffer ``k`` in words (Packed.what): "record batch 3, column 'x', buffer 1 (values)"."""
        batch, label = int(self.batch[k]), self.labels[int(self.label[k])]
        return label if batch < 0 else f"record batch {batch}, {label}"

    @classmethod
    def of(cls, packed: Sequence[Any]) -> Catalog:
        n = len(packed)
        return cls(
            np.fromiter((p.offset for p in packed), np.int64, n),
            np.fromiter((p.size for p in packed), np.int64, n),
            np.fromiter((p.frame.offset for p in packed), np.int64, n),
            np.fromiter((p.frame.size for p in packed), np.int64, n),
            np.fromiter((CODECS.index(p.codec) for p in packed), np.int8, n),
            np.full(n, -1, dtype=np.int64),
            np.arange(n, dtype=np.int64),
            [p.what for p in packed],
        )

    @classmethod
    def join(cls, parts: Sequence[Catalog]) -> Catalog:
        """One catalog of ``parts`` (their places ascending part after part), labels renumbered."""
        labels: list[str] = []
        shifted = []
        for p in parts:
            shifted.append(p.label + len(labels))
            labels += p.labels
        cat = [np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0, np.int64)
               for f in ("place", "size", "frame_offset", "frame_size", "codec", "batch")]  # fmt: skip
        label = np.concatenate(shifted) if parts else np.zeros(0, np.int64)
        return cls(*cat[:4], cat[4].astype(np.int8), cat[5], label, labels)


@dataclass
class Reads:
    """Queued reads of decompressed bytes (:func:`gather`)."""

    k: np.ndarray  # the catalog's buffer each read falls in
    rel: np.ndarray  # its offset inside that buffer's decompressed bytes
    size: np.ndarray
    ptr: np.ndarray  # the destination's address
    usable: np.ndarray  # bool: the destination is a 1-D contiguous uint8 array of at least ``size`` bytes
    group: np.ndarray  # the queued group (an index into ``dsts``) each read came in
    at: np.ndarray  # where in that group's destination it goes
    dsts: list  # each group's destination array

    def dst(self, r: int) -> Any:
        """Read ``r``'s destination (its ``size`` bytes, when usable)."""
        at, d = int(self.at[r]), self.dsts[int(self.group[r])]
        return d[at : at + int(self.size[r])] if self.usable[r] else d


def gather(queued: Sequence[tuple[Any, ...]], catalog: Catalog, backend: Any, path: str) -> Reads:
    """``queued`` groups of reads ``(offsets above PACKED_BASE, sizes, destination, places in it,
    usable)`` as :class:`Reads`: a group of read_many's (many pieces of one contiguous uint8 array: usable
    by contract) or of one read (into an array of its own: ``usable`` None, found here)."""
    counts = np.array([len(q[0]) for q in queued], dtype=np.int64)
    offsets = np.concatenate([q[0] for q in queued])
    sizes = np.concatenate([q[1] for q in queued])
    at = np.concatenate([q[3] for q in queued])
    group = np.repeat(np.arange(len(queued)), counts)
    dsts = [q[2] for q in queued]
    k = np.searchsorted(catalog.place, offsets, side="right") - 1
    inside = k >= 0
    kk = np.maximum(k, 0)
    inside &= offsets + sizes <= catalog.place[kk] + catalog.size[kk]
    if not inside.all():  # the layouts' checks make this a bug
        i = int(np.flatnonzero(~inside)[0])
        raise FileFormatError(f"{path!r}: a read of {int(sizes[i])} bytes past a compressed buffer's end")
    if backend.kind == "cpu":  # one attribute walk per destination: asked per read, it was 1/8 of the planning
        base = np.fromiter((d.ctypes.data for d in dsts), np.int64, len(dsts))
    else:
        base = np.fromiter((d.data.ptr for d in dsts), np.int64, len(dsts))

    def fits(q: tuple[Any, ...]) -> bool:
        d, size = q[2], int(q[1][0])
        return d.ndim == 1 and d.dtype == _U8 and d.flags.c_contiguous and d.shape[0] >= size

    usable = np.fromiter((True if q[4] else fits(q) for q in queued), bool, len(queued))
    return Reads(k, offsets - catalog.place[k], sizes, base[group] + at, usable[group], group, at, dsts)


@dataclass
class Needed:
    """The frames a wait needs, each once, in file order (:func:`frames_of`)."""

    k: np.ndarray  # catalog index of each
    start: np.ndarray  # its reads: order[start[i] : start[i] + count[i]] (indices into the Reads)
    count: np.ndarray
    order: np.ndarray
    in_place: np.ndarray  # bool: inflated straight into its only read's destination (module docstring)
    whole: np.ndarray  # bool: read whole by one read into a usable destination, aligned or not

    def __len__(self) -> int:
        return len(self.k)

    def first(self) -> np.ndarray:
        """Each frame's first read (its only one when in place or whole)."""
        return self.order[self.start]

    def take(self, which: np.ndarray) -> Needed:
        """The frames ``which`` (a mask or indices), still in file order."""
        return Needed(self.k[which], self.start[which], self.count[which], self.order, self.in_place[which],
                      self.whole[which])  # fmt: skip

    def reads(self, which: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(read indices, the frame (an index into ``self``) each serves) of the frames ``which``, frame by frame."""
        frames = np.arange(len(self.k)) if which is None else np.asarray(which)
        if frames.dtype == bool:
            frames = np.flatnonzero(frames)
        counts = self.count[frames]
        of = np.repeat(frames, counts)
        step = np.arange(len(of)) - np.repeat(np.cumsum(counts) - counts, counts)
        return self.order[self.start[of] + step], of


def frames_of(reads: Reads, catalog: Catalog) -> Needed:
    """Step 2 of the module docstring."""
    ks, inverse = np.unique(reads.k, return_inverse=True)
    by_file = np.argsort(catalog.frame_offset[ks], kind="stable")
    ks = ks[by_file]
    position = np.empty(len(ks), dtype=np.int64)
    position[by_file] = np.arange(len(ks))
    frame = position[inverse.reshape(-1)]
    order = np.argsort(frame, kind="stable")
    count = np.bincount(frame, minlength=len(ks)).astype(np.int64)
    start = np.cumsum(count) - count
    first = order[start]
    whole = (count == 1) & (reads.rel[first] == 0) & (reads.size[first] == catalog.size[ks]) & reads.usable[first]
    in_place = whole & (reads.ptr[first] % ALIGN == 0)
    return Needed(ks, start, count, order, in_place, whole)


@dataclass
class Slice:
    """Frames ``[lo, hi)`` of a :class:`Needed`, read and inflated together."""

    lo: int
    hi: int
    runs: np.ndarray  # (r, 3) int64: file offset, size, place in src: one read each
    src_at: np.ndarray  # each frame's place in src
    src_bytes: int
    dst_at: np.ndarray  # each frame's place in the scratch dst; -1: none (its dst_cost was 0)
    dst_bytes: int


def cut(frame_offset: np.ndarray, frame_size: np.ndarray, dst_cost: np.ndarray, budget: int) -> list[Slice]:
    """Frames in file order (their file ranges; ``dst_cost``: the scratch each output takes, 0 for none)
    cut into slices of at most ``budget`` bytes of scratch, a frame larger than that alone (step 3 of the
    module docstring). Frames that overlap in the file (a hostile file) are read once each."""
    n = len(frame_offset)
    if n == 0:
        return []
    end = frame_offset + frame_size
    gap = np.empty(n, dtype=np.int64)
    gap[0] = -1
    gap[1:] = frame_offset[1:] - end[:-1]
    joins = (gap >= 0) & (gap <= GAP)
    # what a frame adds to a slice, at most: its gap or an alignment, its bytes, its output
    total = np.cumsum(frame_size + np.where(joins, gap, ALIGN - 1) + dst_cost)
    out = []
    lo = 0
    while lo < n:
        base = int(total[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(total, base + budget, side="right")))
        out.append(_slice(lo, hi, frame_offset, end, joins, dst_cost))
        lo = hi
    return out


def _slice(lo: int, hi: int, offset: np.ndarray, end: np.ndarray, joins: np.ndarray, dst_cost: np.ndarray) -> Slice:
    fo, fe = offset[lo:hi], end[lo:hi]
    new = ~joins[lo:hi]
    new[0] = True
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, hi - lo - 1)
    run = np.cumsum(new) - 1
    run_offset = fo[firsts]
    run_size = fe[lasts] - run_offset
    padded = up(run_size)
    run_at = np.cumsum(padded) - padded
    src_at = run_at[run] + fo - run_offset[run]
    cost = dst_cost[lo:hi]
    dst_at = np.where(cost > 0, np.cumsum(cost) - cost, -1)
    return Slice(lo, hi, np.stack([run_offset, run_size, run_at], axis=1), src_at,
                 int(run_at[-1] + run_size[-1]), dst_at, int(cost.sum()))  # fmt: skip
