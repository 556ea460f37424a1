"""Encode a table on a GPU into binary COPY rows (kernels/pg_encode.cu); the CPU twin is :class:`.encode.HostEncoder`.

One launch of ``pg_encode_sizes`` checks every value and sizes every row, CuPy's scan turns the
sizes into row starts, and the chunks are cut where those starts cross multiples of the chunk size
(:func:`.encode.plan_chunks`, on the device: only the chunk bounds come to the host). Each writer
thread then encodes one chunk at a time on its own CUDA stream (``pg_encode_rows``, one thread per row
writing big-endian values, NULL markers and lengths into device scratch) and copies the bytes into its
pinned staging buffer, which the sender streams to the server while the GPU encodes the next chunk
of another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...kernels import launch
from .ddl import WriteColumn
from .encode import Chunk, descriptors, encode_failure, plan_chunks

__all__ = ["DeviceEncoder", "failure_key"]

_NO_FAILURE = (1 << 64) - 1


def failure_key(key: int) -> tuple[int, int, int]:
    """(code, row, column) of pg_encode_sizes's first failure: row << 14 | column << 3 | code."""
    return key & 7, key >> 14, (key >> 3) & 0x7FF


class DeviceEncoder:
    """The CUDA encoder over a table on GPU ``backend.ordinal``."""

    def __init__(self, table: Any, cols: Sequence[WriteColumn]):
        self._table = table  # keeps the buffers the descriptors point at alive
        self._backend = table._backend
        self.xp = self._backend.xp
        self.nrows = table.num_rows
        self.reset(cols)
        self._local = threading.local()

    @property
    def table(self) -> Any:
        """The table encoded."""
        return self._table

    def reset(self, cols: Sequence[WriteColumn]) -> None:
        """Encode the columns as ``cols`` says from now on (run :meth:`starts` again)."""
        self._cols = cols
        self._keep: list[Any] = []  # what the descriptors point at that the table does not hold
        with self._backend.activate():
            self._desc = self.xp.asarray(descriptors(self._table, cols, self._keep))
        self._starts: Any = None

    def starts(self) -> Any:
        """Every row's start on the device (n + 1 int64, the total last); raises :class:`DataError`
        naming the first value PostgreSQL cannot take."""
        cp, n = self.xp, self.nrows
        with self._backend.activate():
            sizes = cp.zeros(n + 1, dtype=cp.int64)
            first = cp.asarray(np.array([_NO_FAILURE], dtype=np.uint64))  # no Python int past int64 in CuPy's fill
            launch(
                "pg_encode",
                "pg_encode_sizes",
                self._backend.ordinal,
                n,
                (self._desc, np.int32(len(self._cols)), np.int64(0), np.int64(n), sizes[1:], first),
            )
            key = int(first.get()[0])  # waits for the kernel
            if key != _NO_FAILURE:
                raise encode_failure(self._cols, *failure_key(key))
            self._starts = cp.cumsum(sizes)  # sizes[0] is 0: the scan gives each row's start
        return self._starts

    def close(self) -> None:
        """Give the device memory back now (the row starts, the descriptors), not when a traceback goes."""
        with self._backend.activate():
            self.xp.cuda.get_current_stream().synchronize()
        self._starts = self._desc = self._table = None
        self._keep = []

    def chunks(self, chunk_bytes: int) -> list[Chunk]:
        """The rows cut into chunks (after :meth:`starts`); only the bounds come to the host."""
        with self._backend.activate():
            return plan_chunks(self.xp, self._starts, self.nrows, chunk_bytes)

    def buffer(self, nbytes: int) -> np.ndarray:
        """Pinned host memory: the copy from the device runs at full PCIe speed."""
        with self._backend.activate():
            mem = self.xp.cuda.alloc_pinned_memory(max(nbytes, 1))
        return np.frombuffer(mem, dtype=np.uint8, count=nbytes)  # keeps `mem` alive

    def encode(self, chunk: Chunk, out: np.ndarray) -> None:
        """Encode the chunk's rows on this thread's stream and copy them into ``out[:chunk.nbytes]``."""
        cp = self.xp
        with self._backend.activate():
            stream = getattr(self._local, "stream", None)
            if stream is None:
                stream = self._local.stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                rows = chunk.end - chunk.begin
                starts = self._starts[chunk.begin : chunk.end] - self._starts[chunk.begin]
                scratch = cp.empty(max(chunk.nbytes, 1), dtype=cp.uint8)
                launch(
                    "pg_encode",
                    "pg_encode_rows",
                    self._backend.ordinal,
                    rows,
                    (self._desc, np.int32(len(self._cols)), np.int64(chunk.begin), np.int64(rows), starts, scratch),
                )
                scratch[: chunk.nbytes].get(stream=stream, out=out[: chunk.nbytes])
            stream.synchronize()  # the bytes are in `out`; the scratch goes back to the pool after its last reader
