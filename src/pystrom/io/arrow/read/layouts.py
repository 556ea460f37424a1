"""Where the selected columns' buffers sit in every record batch, as NumPy arrays: one per column and
buffer role over all batches, not a Python object per batch and buffer.

A file of 2048 record batches x 8 columns has 16,384 chunks and as many buffers: built, summed and
walked as objects (:class:`.file.metadata.ChunkLayout`, :class:`.file.metadata.Range`) they were most of a read's
host time, and the garbage collector's passes over them a good part of that. Here:

- :class:`Buffers`: one buffer role (validity, values, ...) of one column in every batch: offsets and
  sizes. An offset is a file offset, or a place at or above :data:`.file.metadata.PACKED_BASE` for a buffer
  stored compressed (the :class:`.codecs.plan.Catalog` of the layouts names its frame), or -1 where
  the batch has no such buffer (a bitmap where there are no NULLs);
- :class:`Chunks`: one column in every batch (:class:`.file.metadata.ChunkLayout`'s fields as arrays);
- :class:`Layouts`: the batches (their indices in the file and row counts), a :class:`Chunks` per
  column read directly, the catalog of compressed buffers. :meth:`Layouts.take` selects batches (a
  scan's groups share the file's catalog); :meth:`Layouts.batch` builds the objects of one batch
  (:class:`.file.metadata.BatchLayout`), which pyarrow's per-batch path (:meth:`.file.metadata.ArrowFile.layout`)
  produces and :meth:`Layouts.of` turns into arrays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..codecs.decompress import CODECS
from ..codecs.plan import Catalog
from ..file.metadata import PACKED_BASE, BatchLayout, ChunkLayout, Packed, Range

__all__ = ["Buffers", "Chunks", "Layouts"]


@dataclass
class Buffers:
    """One buffer of one column in every batch (module docstring)."""

    offset: np.ndarray  # int64: file offset, place >= PACKED_BASE (compressed), -1: none
    size: np.ndarray  # int64: 0 where there is none

    def take(self, which) -> Buffers:
        return Buffers(self.offset[which], self.size[which])

    @classmethod
    def of(cls, ranges: Sequence[Range | None]) -> Buffers:
        n = len(ranges)
        offset = np.fromiter((-1 if r is None else r.offset for r in ranges), np.int64, n)
        return cls(offset, np.fromiter((0 if r is None else r.size for r in ranges), np.int64, n))


@dataclass
class Chunks:
    """One column in every batch: :class:`.file.metadata.ChunkLayout`'s fields, each an array over the batches
    (``data``, ``child_validity``: None where no batch has one)."""

    length: np.ndarray
    null_count: np.ndarray
    validity: Buffers
    values: Buffers
    data: Buffers | None
    child_length: np.ndarray
    child_null_count: np.ndarray
    child_validity: Buffers | None = None

    def buffers(self) -> list[Buffers]:
        return [b for b in (self.validity, self.values, self.data, self.child_validity) if b is not None]

    def nbytes(self) -> np.ndarray:
        """The bytes of each batch's buffers (decompressed, for compressed ones)."""
        return sum((b.size for b in self.buffers()), np.zeros_like(self.length))

    def take(self, which) -> Chunks:
        def opt(b: Buffers | None) -> Buffers | None:
            return None if b is None else b.take(which)

        return Chunks(self.length[which], self.null_count[which], self.validity.take(which),
                      self.values.take(which), opt(self.data), self.child_length[which],
                      self.child_null_count[which], opt(self.child_validity))  # fmt: skip

    @classmethod
    def of(cls, chunks: Sequence[ChunkLayout]) -> Chunks:
        def ints(field: str) -> np.ndarray:
            return np.fromiter((getattr(c, field) for c in chunks), np.int64, len(chunks))

        def opt(field: str) -> Buffers | None:
            ranges = [getattr(c, field) for c in chunks]
            return None if ranges and all(r is None for r in ranges) else Buffers.of(ranges)  # no batch: empty

        return cls(ints("length"), ints("null_count"), Buffers.of([c.validity for c in chunks]),
                   Buffers.of([c.values for c in chunks]), opt("data"), ints("child_length"),
                   ints("child_null_count"), opt("child_validity"))  # fmt: skip


@dataclass(eq=False)
class Layouts:
    """Record batches of a file and the buffers of their directly read columns (module docstring)."""

    index: np.ndarray  # int64: each batch's index in the file
    num_rows: np.ndarray  # int64
    chunks: dict[str, Chunks]
    packed: Catalog | None = None  # the compressed buffers Packed places refer to (the whole file's)

    def __len__(self) -> int:
        return len(self.index)

    def take(self, which) -> Layouts:
        """The batches ``which`` (a slice, indices or a mask), in that order."""
        return Layouts(self.index[which], self.num_rows[which], {n: c.take(which) for n, c in self.chunks.items()},
                       self.packed)  # fmt: skip

    def nbytes(self) -> np.ndarray:
        """The bytes of each batch's chunks (int64)."""
        return sum((c.nbytes() for c in self.chunks.values()), np.zeros_like(self.num_rows))

    def packed_count(self) -> int:
        """How many compressed buffers the catalog holds (0: nothing to inflate)."""
        return 0 if self.packed is None else len(self.packed.place)

    # -- objects, one batch at a time (tests, pyarrow's per-batch path) --------------------------

    def batch(self, i: int) -> BatchLayout:
        """Batch ``i`` of these layouts as :class:`.file.metadata.BatchLayout` (its Range and Packed objects)."""
        chunks = {}
        for name, c in self.chunks.items():
            child = (int(c.child_length[i]), int(c.child_null_count[i]), self._range(c.child_validity, i))
            chunks[name] = ChunkLayout(int(c.length[i]), int(c.null_count[i]), self._range(c.validity, i),
                                       self._range(c.values, i), self._range(c.data, i), *child)  # fmt: skip
        return BatchLayout(int(self.index[i]), int(self.num_rows[i]), chunks)

    def __iter__(self) -> Iterator[BatchLayout]:
        return (self.batch(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        """The same batches, buffer for buffer (another Layouts, or a list of :class:`.file.metadata.BatchLayout`)."""
        if not isinstance(other, (Layouts, list)):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def packed_buffers(self) -> list[Packed]:
        """The compressed buffers these batches' chunks name, each once, by place."""
        places = [b.offset[b.offset >= PACKED_BASE] for c in self.chunks.values() for b in c.buffers()]
        cat = self.packed
        ks = np.searchsorted(cat.place, np.unique(np.concatenate(places))) if places and cat is not None else []
        return [self._packed(int(k)) for k in ks]

    def _range(self, b: Buffers | None, i: int) -> Range | None:
        if b is None or b.offset[i] < 0:
            return None
        offset, size = int(b.offset[i]), int(b.size[i])
        if offset < PACKED_BASE:
            return Range(offset, size)
        return self._packed(int(np.searchsorted(self.packed.place, offset)))

    def _packed(self, k: int) -> Packed:
        cat = self.packed
        frame = Range(int(cat.frame_offset[k]), int(cat.frame_size[k]))
        return Packed(int(cat.place[k]), int(cat.size[k]), frame, CODECS[int(cat.codec[k])], cat.what(k))

    @classmethod
    def of(cls, batches: Sequence[BatchLayout], names: Sequence[str]) -> Layouts:
        """``batches`` (pyarrow's path: uncompressed) as arrays; the ``names`` every batch has a chunk of."""
        kept = [n for n in names if all(n in b.chunks for b in batches)]
        n = len(batches)
        return cls(
            np.fromiter((b.index for b in batches), np.int64, n),
            np.fromiter((b.num_rows for b in batches), np.int64, n),
            {name: Chunks.of([b.chunks[name] for b in batches]) for name in kept},
        )
