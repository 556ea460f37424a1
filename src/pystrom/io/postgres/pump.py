"""The one module that touches libpq and psycopg internals: the native COPY pump and the CPU decoder.

Everything above this module speaks psycopg's public API; here the connection's ``PGconn*`` goes to
the C++ pump (``pystrom._core.CopyPump``), which resolves libpq's functions from the copy psycopg has
already loaded (never a second libpq) and drains ``COPY ... TO STDOUT (FORMAT BINARY)`` with the GIL
released into staging buffers, recording where each row starts, how many NULLs and how many bytes
each column has. Those counts size the table before any value is decoded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import _core
from ...errors import PostgresError

__all__ = ["Kind", "Staged", "CopyStream", "decode_cpu", "drop_device_copies", "new_shape", "DESC_SLOTS", "FAILURES"]

DESC_SLOTS = 8  # int64 slots per column descriptor (csrc/pg_decode.hpp, kernels/pg_decode.cu)


class Kind:
    """Column kinds of the decoders (csrc/pg_decode.hpp)."""

    BOOL = 0
    INT2 = 1
    INT4 = 2
    INT8 = 3
    FLOAT4 = 4
    FLOAT8 = 5
    NUMERIC_F64 = 6
    NUMERIC_DEC128 = 7
    DATE = 8
    TIMESTAMP = 9
    VARLEN = 10
    UUID = 11
    OID = 12
    VECTOR_F4 = 13
    VECTOR_F2 = 14
    # one-dimensional arrays -> list<T> or fixed_size_list<T>[d] (descriptor slot 6 = d)
    ARRAY_BOOL = 15
    ARRAY_INT2 = 16
    ARRAY_INT4 = 17
    ARRAY_INT8 = 18
    ARRAY_FLOAT4 = 19
    ARRAY_FLOAT8 = 20
    ARRAYS = range(15, 21)
    MONEY = 21  # int64 -> decimal128


# Decoder failure codes (csrc/pg_decode.hpp) and what they mean to a user.
FAILURES = {
    1: "a value whose length does not fit its type",
    2: "a numeric value that needs more than 38 digits at the column's scale (decimal128 would overflow)",
    3: "NaN or Infinity, which decimal128 cannot hold (use numeric='float64' or filter them out)",
    4: "a numeric value with more fractional digits than the column's scale",
    5: "a NULL the planner did not count",
    6: "a timestamp after 294247 AD, which int64 microseconds since 1970 cannot hold (filter or cast it)",
    7: "a vector whose dimension is not the column's",
    8: "a multi-dimensional array; only one-dimensional arrays are read (flatten it in SQL, "
    "e.g. ARRAY(SELECT unnest(c)))",
    9: "an array whose element type is not the column's",
    10: "an array whose length is not the column's fixed_size_list length, or more elements than were counted "
    "(did the rows change after their lengths were checked? then make the scan again)",
    11: "a malformed array (its dimensions, NULL flag or element lengths do not match its bytes)",
}


@functools.cache
def _load_libpq() -> str:
    import psycopg

    path = ""
    if psycopg.pq.__impl__ == "python":  # the ctypes implementation knows the file it loaded
        from psycopg.pq import _pq_ctypes

        path = _pq_ctypes.pq._name
    try:
        return _core.pg_load_libpq(path)
    except RuntimeError as exc:
        raise PostgresError(f"cannot use psycopg's libpq: {exc}") from None


def _server_message(exc: BaseException) -> str:
    return " ".join(str(exc).split())  # libpq messages end in newlines and may span lines


@dataclass
class Staged:
    """Raw COPY bytes of consecutive rows, as the pump left them (host memory, pinned for a GPU)."""

    buf: np.ndarray  # uint8: the rows' bytes, each row starting with its int16 field count
    nbytes: int
    offsets: np.ndarray  # int64: row starts inside buf
    nrows: int
    nulls: np.ndarray  # int64 per column
    bytes: np.ndarray  # int64 per column: field bytes (the string bytes of text columns); array columns: elements
    shape: np.ndarray | None = None  # int64 [column, 3] of array columns: NULL elements, least and greatest length
    device: Any = None  # on a GPU: (bytes, row starts, event) copied to the device while others still stream


def drop_device_copies(chunks: Sequence[Staged]) -> bool:
    """Free the device copies made of these chunks while the read went on (after their copies end);
    True if there were any."""
    dropped = False
    for c in chunks:
        if c.device is not None:
            c.device[2].synchronize()  # its copy has finished: nothing still writes the scratch
            c.device = None
            dropped = True
    return dropped


def _size_class(nbytes: int) -> int:
    """The staging buffer for ``nbytes``: at least 1 MiB, else the next 2^k or 3 * 2^(k-1) bytes. CuPy's
    pinned pool keeps freed blocks by exact size and never frees them by itself, so sizes taken
    from tables' sizes must come from few classes (two per doubling, at most 1.5x the need)."""
    k = max(20, (nbytes - 1).bit_length())
    if k > 20 and 3 << (k - 2) >= nbytes:
        return 3 << (k - 2)
    return 1 << k


class CopyStream:
    """One ``COPY ... TO STDOUT (FORMAT BINARY)`` on a psycopg connection, drained into Staged chunks.

    ``allocate(nbytes)`` returns a writable uint8 host array (pinned memory when the target is a GPU).
    The stream is closed (the COPY finished or cancelled, the connection idle again) when ``read``
    returns or raises.
    """

    def __init__(
        self,
        conn: Any,
        ncols: int,
        allocate: Callable[[int], np.ndarray],
        chunk_bytes: int,
        arrays: Sequence[int] = (),
    ):
        """``arrays``: the indices of the array columns, whose elements the pump counts (Staged.shape)."""
        _load_libpq()
        self._conn = conn
        self._ncols = ncols
        self._allocate = allocate
        self._chunk_bytes = chunk_bytes
        flags = [0] * ncols
        for i in arrays:
            flags[i] = 1
        self._arrays = bool(arrays)
        self._pump = _core.CopyPump(conn.pgconn.pgconn_ptr, ncols, flags if arrays else [])

    def read(
        self,
        sql: str,
        on_chunk: Callable[[Staged], None] | None = None,
        size_hint: int | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> list[Staged]:
        """Run the COPY; ``size_hint`` (bytes it is expected to produce) sizes the first buffer.
        ``on_failure`` is told of an exception before the COPY is cancelled on its way out: cancelling
        ends the transaction, and with it a snapshot other connections may be importing just then."""
        chunks: list[Staged] = []
        try:
            self._drain(sql, on_chunk, size_hint, chunks)
        except BaseException as exc:
            if on_failure is not None:
                on_failure(exc)
            raise
        finally:
            if self._pump.active:  # an exception (or Ctrl-C) between buffers: cancel on the server
                self._pump.abort()
        return chunks

    def _drain(
        self, sql: str, on_chunk: Callable[[Staged], None] | None, size_hint: int | None, chunks: list[Staged]
    ) -> None:
        """The COPY's rows into ``chunks``, the pump's errors as PostgresError."""
        # Grow from small buffers so a few rows cost little; large reads settle at chunk_bytes. A
        # hint starts at its size class (_size_class).
        size = min(_size_class(size_hint or 0), self._chunk_bytes)
        min_row = 2 + 4 * max(self._ncols, 1)
        try:
            self._pump.start(sql)
            done = False
            while not done:
                buf = self._allocate(size)
                offsets = self._allocate(8 * max(1, size // min_row + 1)).view(np.int64)
                nulls = np.zeros(self._ncols, dtype=np.int64)
                nbytes_col = np.zeros(self._ncols, dtype=np.int64)
                shape = new_shape(self._ncols) if self._arrays else None
                nbytes, nrows, done, need = self._pump.fill(buf, offsets, nulls, nbytes_col, shape)
                if nrows:
                    chunk = Staged(buf, nbytes, offsets, nrows, nulls, nbytes_col, shape)
                    chunks.append(chunk)
                    if on_chunk is not None:
                        on_chunk(chunk)
                if need:
                    size = max(size, need)  # one row larger than the buffer: the next one fits it
                else:
                    size = min(size * 2, self._chunk_bytes) if size < self._chunk_bytes else size
        except _core.PgServerError as exc:
            raise PostgresError(f"PostgreSQL: {_server_message(exc)}") from None
        except _core.PgProtocolError as exc:
            raise PostgresError(f"unexpected data in the binary COPY stream: {exc}") from None

    def abort(self) -> None:
        self._pump.abort()


def new_shape(ncols: int) -> np.ndarray:
    """Array counts before any row (Staged.shape): no NULL elements, least length INT64_MAX, greatest -1."""
    shape = np.zeros((ncols, 3), dtype=np.int64)
    shape[:, 1] = np.iinfo(np.int64).max
    shape[:, 2] = -1
    return shape


def decode_cpu(chunk: Staged, row_base: int, desc: np.ndarray) -> tuple[int, int, int]:
    """Decode one chunk with the C++ decoder into the table memory ``desc`` points at; returns
    ``(failure, row, column)`` (failure 0: fine)."""
    return _core.pg_decode(chunk.buf, chunk.offsets, chunk.nrows, row_base, desc)


# -- the write path: COPY ... FROM STDIN (FORMAT BINARY) through the native sender ------------------

__all__ += ["CopyInStream"]


class CopyInStream:
    """One ``COPY ... FROM STDIN (FORMAT BINARY)`` on a psycopg connection, fed encoded rows.

    ``start`` sends the statement and the binary header, ``put`` whole encoded rows (blocking without
    the GIL while the server catches up), ``finish`` the trailer, returning the rows the server took;
    ``abort`` ends a COPY in progress with a failure, so the server rolls the statement back and the
    connection is idle again. The caller holds the connection's lock meanwhile.
    """

    def __init__(self, conn: Any):
        _load_libpq()
        self._conn = conn
        self._sender = _core.CopyInSender(conn.pgconn.pgconn_ptr)

    def start(self, sql: str) -> None:
        try:
            self._sender.start(sql)
        except _core.PgServerError as exc:
            raise PostgresError(f"PostgreSQL: {_server_message(exc)}") from None

    def put(self, buf: np.ndarray, nbytes: int) -> None:
        try:
            self._sender.put(buf, nbytes)
        except _core.PgServerError as exc:
            raise PostgresError(f"PostgreSQL: {_server_message(exc)}") from None

    def finish(self) -> int:
        try:
            tag = self._sender.finish()
        except _core.PgServerError as exc:
            raise PostgresError(f"PostgreSQL: {_server_message(exc)}") from None
        parts = tag.split()
        return int(parts[-1]) if len(parts) == 2 and parts[0] == "COPY" and parts[1].isdigit() else -1

    def abort(self, reason: str) -> None:
        self._sender.abort(reason)

    @property
    def active(self) -> bool:
        return self._sender.active
