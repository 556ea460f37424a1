"""A Table's columns -> binary COPY rows, in chunks of whole rows: descriptors, sizes, chunks, the CPU encoder.

In order: :func:`descriptors` gives each column written 8 int64 slots (its kind and the addresses of
its buffers, csrc/pg_encode.hpp); the encoder's sizes pass checks every value (a date PostgreSQL cannot
hold raises here, before a byte is sent) and gives each row's encoded size; their scan gives each row's
start, and :func:`plan_chunks` cuts the rows into chunks of about ``chunk_bytes``; the writers then
encode one chunk at a time into a host buffer and send it. :class:`HostEncoder` runs the C++ encoder
(``_core.pg_encode_*``, without the GIL); :class:`.encode_device.DeviceEncoder` its CUDA twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import _core
from ..._types import Layout
from ...errors import DataError
from ...memory.transfer import worker_threads
from .ddl import ENCODE_FAILURES, EncodeKind, WriteColumn

__all__ = ["Chunk", "descriptors", "encode_failure", "plan_chunks", "HostEncoder", "SLOTS"]

SLOTS = 10  # int64 slots per column descriptor (csrc/pg_encode.hpp, kernels/pg_encode.cu)
_SIZE_RANGE = 1 << 20  # rows per task of the parallel sizes pass


@dataclass(frozen=True)
class Chunk:
    """Rows [begin, end) of the table, ``nbytes`` once encoded."""

    begin: int
    end: int
    nbytes: int


def descriptors(table: Any, cols: Sequence[WriteColumn], keep: list[Any]) -> np.ndarray:
    """The encoders' column descriptors (addresses on the table's device); ``keep`` receives the arrays
    they point at that the table does not hold (checked copies of offsets another process may write)."""
    backend = table._backend
    desc = np.zeros((len(cols), SLOTS), dtype=np.int64)
    for i, c in enumerate(cols):
        col = table.column(c.name)
        if c.kind == EncodeKind.VARLEN:  # offsets (absolute into data) and data
            values, data = col._offsets_in_bounds(), col.data
            keep.append(values)
            desc[i, 4] = backend.array_ptr(data) if data.size else 0
        elif c.kind in (EncodeKind.ARRAY, EncodeKind.VECTOR):  # elements by their index in the child buffer
            nested = col.column_type
            values = col._offsets_in_bounds() if nested.layout == Layout.LIST else col.child_values[:0]
            keep.append(values)
            child = col.child_values
            desc[i, 4] = backend.array_ptr(child) if child.size else 0
            bits = col.child_validity
            desc[i, 7] = backend.array_ptr(bits) if bits is not None else 0
            desc[i, 8] = col.offset * nested.list_size  # the fixed_size_list's first element
        else:
            values = col.values
        desc[i, 0] = c.kind
        desc[i, 1] = backend.array_ptr(values) if values.size else 0
        validity = col.validity if col.null_count else None
        if validity is not None:
            desc[i, 2] = backend.array_ptr(validity)
            desc[i, 3] = col.validity_offset
        desc[i, 5] = c.param
        desc[i, 6] = c.div
    return desc.reshape(-1)


def encode_failure(cols: Sequence[WriteColumn], code: int, row: int, column: int) -> DataError:
    c = cols[column]
    why = ENCODE_FAILURES.get(code, f"failure code {code}")
    return DataError(f"column {c.name!r} ({c.pg_type}), row {row}: {why}; nothing was written")


def plan_chunks(xp: Any, starts: Any, nrows: int, chunk_bytes: int) -> list[Chunk]:
    """Consecutive chunks of whole rows, each about ``chunk_bytes`` (a larger row is a chunk alone).
    ``starts``: each row's start and the total at ``starts[nrows]``, on the encoder's device."""
    if nrows == 0:
        return []
    total = int(starts[nrows])
    targets = xp.arange(chunk_bytes, total, chunk_bytes, dtype=xp.int64)
    bounds = xp.searchsorted(starts[: nrows + 1], targets, side="left")
    bounds = xp.unique(xp.concatenate([xp.asarray([0, nrows], dtype=bounds.dtype), bounds]))
    at = starts[bounds]
    bounds, at = (np.asarray(a.get() if hasattr(a, "get") else a).tolist() for a in (bounds, at))
    return [Chunk(a, b, nb_b - nb_a) for a, b, nb_a, nb_b in zip(bounds, bounds[1:], at, at[1:])]


class HostEncoder:
    """The C++ encoder over a table on the CPU."""

    def __init__(self, table: Any, cols: Sequence[WriteColumn]):
        self._table = table  # keeps the buffers the descriptors point at alive
        self.reset(cols)
        self.nrows = table.num_rows
        self.xp = np

    @property
    def table(self) -> Any:
        """The table encoded."""
        return self._table

    def reset(self, cols: Sequence[WriteColumn]) -> None:
        """Encode the columns as ``cols`` says from now on (run :meth:`starts` again)."""
        self._cols = cols
        self._keep: list[Any] = []  # what the descriptors point at that the table does not hold
        self._desc = descriptors(self._table, cols, self._keep)
        self._starts: np.ndarray | None = None

    def starts(self) -> np.ndarray:
        """Every row's start in one stream of all rows (n + 1 values: the total last); raises
        :class:`DataError` naming the first value PostgreSQL cannot take."""
        n = self.nrows
        sizes = np.empty(n + 1, dtype=np.int64)
        ranges = [(a, min(n, a + _SIZE_RANGE)) for a in range(0, n, _SIZE_RANGE)]

        def run(r: tuple[int, int]) -> tuple[int, int, int]:
            return _core.pg_encode_sizes(self._desc, r[0], r[1], sizes[r[0] + 1 : r[1] + 1])

        if len(ranges) > 1:
            with ThreadPoolExecutor(max_workers=worker_threads()) as pool:  # the sizes pass runs without the GIL
                results = list(pool.map(run, ranges))
        else:
            results = [run(r) for r in ranges]
        for code, row, column in results:
            if code:
                raise encode_failure(self._cols, code, row, column)
        sizes[0] = 0
        np.cumsum(sizes, out=sizes)
        self._starts = sizes
        return sizes

    def chunks(self, chunk_bytes: int) -> list[Chunk]:
        """The rows cut into chunks (after :meth:`starts`)."""
        return plan_chunks(np, self._starts, self.nrows, chunk_bytes)

    def close(self) -> None:
        self._table = self._starts = None
        self._keep = []

    def buffer(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def encode(self, chunk: Chunk, out: np.ndarray) -> None:
        """Write the chunk's rows into ``out[:chunk.nbytes]`` (GIL released)."""
        n = _core.pg_encode_rows(self._desc, chunk.begin, chunk.end, out[: chunk.nbytes])
        if n != chunk.nbytes:
            raise DataError(f"rows {chunk.begin}..{chunk.end} encoded to {n} bytes, {chunk.nbytes} planned")
