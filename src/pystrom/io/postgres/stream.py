"""Stream every COPY of a read through the native pump into staging buffers.

Each connection (the caller's, or one that joins the read's snapshot: :class:`.session.SnapshotJoiner`)
takes the next COPY statement from one queue as it finishes its last, so slower connections read
less and all end together. The pump (:mod:`.pump`) drains a statement's rows into staging buffers,
pinned host memory when the target is a GPU; there each filled chunk is copied to the device at once by
:class:`Uploader`, overlapping the other streams. A failed stream, or Ctrl-C, cancels the others on the
server and gives the device scratch back before the error reaches the caller. Every stream, even a
lone one, runs in a pool thread while the caller's thread waits, so Ctrl-C is seen at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from ..._progress import reporter
from ..._settings import defaults
from ...errors import CapacityError
from .pump import CopyStream, Staged, drop_device_copies

__all__ = ["CopyReader", "Uploader", "read_all"]


class Uploader:
    """Copies each staged chunk to the device from the reader thread that filled it, on that thread's
    own stream, so the transfer (600 MB for 10M rows of five columns, ~15 ms) overlaps the other streams
    instead of following the last byte. The table cannot be allocated before every count is known, so
    the copies land in device scratch that the decoder (:mod:`.decode_device`) reads and then frees. Where
    the device has no room for the scratch, the chunk stays on the host and the decoder copies it then.
    """

    def __init__(self, backend: Any):
        self.backend = backend
        self._local = threading.local()
        self._lock = threading.Lock()
        self._uploaded: list[Staged] = []

    def __call__(self, chunk: Staged) -> None:
        cp = self.backend.xp
        with self.backend.activate():
            stream = getattr(self._local, "stream", None)
            if stream is None:
                stream = self._local.stream = cp.cuda.Stream(non_blocking=True)
            try:
                with stream:
                    dbuf = cp.empty(chunk.nbytes, dtype=cp.uint8)
                    doffs = cp.empty(chunk.nrows, dtype=cp.int64)
            except cp.cuda.memory.OutOfMemoryError:
                return
            # Pinned sources: asynchronous copies; the chunk keeps the host memory alive meanwhile.
            dbuf.set(chunk.buf[: chunk.nbytes], stream=stream)
            doffs.set(chunk.offsets[: chunk.nrows], stream=stream)
            chunk.device = (dbuf, doffs, stream.record())
        with self._lock:
            self._uploaded.append(chunk)

    def release(self) -> None:
        """A failed read: give the scratch back now (not when the traceback that holds the chunks goes)."""
        with self._lock:
            chunks, self._uploaded = self._uploaded, []
        drop_device_copies(chunks)


# The most string bytes one column may hold: Arrow's int32 offsets address 2 GiB. The pump counts each
# column's bytes per chunk, so a read that passes it stops there instead of after its last byte.
STRING_COLUMN_LIMIT = 2**31 - 1


class CopyReader:
    """Runs the COPY streams of one read and cancels them all when one fails or the caller is interrupted.

    ``strings`` maps the index of each string column to its name for messages: a column whose bytes,
    summed over every stream, pass STRING_COLUMN_LIMIT stops the read with CapacityError at once.
    ``arrays``: the indices of the array columns, whose elements the pump counts."""

    def __init__(
        self,
        backend: Any,
        ncols: int,
        progress: Callable[[int], None] | None,
        strings: Mapping[int, str] | None = None,
        arrays: Sequence[int] = (),
    ):
        self._arrays = list(arrays)
        self._allocate = _staging_allocator(backend)
        self._upload = Uploader(backend) if backend.kind == "cuda" else None
        self._ncols = ncols
        self._progress = progress
        self._rows = 0
        self._lock = threading.Lock()
        self._strings = dict(strings or {})
        self._string_bytes = dict.fromkeys(self._strings, 0)
        self._first: list[BaseException] = []  # the failure that stopped the read (theirs may follow from it)

    def _note_failure(self, exc: BaseException) -> None:
        with self._lock:
            if not self._first:
                self._first.append(exc)

    def _on_chunk(self, chunk: Staged) -> None:
        if self._strings:
            with self._lock:
                for c in self._strings:
                    self._string_bytes[c] += int(chunk.bytes[c])
                    if self._string_bytes[c] > STRING_COLUMN_LIMIT:
                        raise CapacityError(
                            f"column {self._strings[c]} holds more than {STRING_COLUMN_LIMIT:,} bytes of strings "
                            f"(the 2 GiB that 32-bit offsets address) after {self._rows + chunk.nrows:,} rows: "
                            f"read it in parts (where=) or leave it out"
                        )
        if self._upload is not None:
            self._upload(chunk)
        with self._lock:
            self._rows += chunk.nrows
            if self._progress is not None:
                self._progress(self._rows)

    def read(self, conn: Any, sql_text: str, size_hint: int | None = None) -> list[Staged]:
        stream = CopyStream(conn, self._ncols, self._allocate, defaults.pg_staging_chunk, self._arrays)
        lock = getattr(conn, "lock", None)  # psycopg's own lock: nobody else uses the connection meanwhile
        # a failure is noted as it happens, before the COPY is cancelled (CopyStream.read): cancelling
        # aborts the transaction whose snapshot a stream still opening may be importing, and that
        # stream's failure ("could not import the requested snapshot") must not be the one reported
        # (seen on CI: 4 partitions, a string column past its limit)
        if lock is None:
            return stream.read(sql_text, self._on_chunk, size_hint, self._note_failure)
        with lock:
            return stream.read(sql_text, self._on_chunk, size_hint, self._note_failure)

    def read_all(self, sources: Sequence[Any], statements: Sequence[str], hints: Sequence[int | None]) -> list:
        """Run the COPY statements, each connection taking the next statement from one queue as it
        finishes its last; the chunks come back in statement order. ``sources`` are connections or
        callables that open one (SnapshotJoiner), called by the thread that then reads on it.
        ``hints``: each statement's expected size in bytes (None: unknown), its first buffer's size."""
        try:
            return self._read_all(sources, statements, hints)
        except BaseException:
            if self._upload is not None:
                self._upload.release()
            raise

    def _read_all(self, sources: Sequence[Any], statements: Sequence[str], hints: Sequence[int | None]) -> list:
        # Even one stream is read by a pool thread: the pump blocks in libpq (the GIL released) for as
        # long as the server takes to send a row, and a thread blocked there cannot see Ctrl-C. The
        # calling thread waits on the futures instead, which a signal interrupts at once; it then
        # cancels on the server and waits for the streams to drain (~0.1 s), whatever the server was
        # doing (planning, sleeping, or between rows). The pump's loop is unchanged.
        results: list[list[Staged]] = [[] for _ in statements]
        queue = iter(range(len(statements)))
        failed = threading.Event()
        self._first = []
        opened: list[Any] = []  # the connections reading now, for cancelling them

        def work(source: Any) -> None:
            try:
                conn = source() if callable(source) else source
                with self._lock:
                    opened.append(conn)
                while not failed.is_set():
                    with self._lock:
                        i = next(queue, None)
                    if i is None:
                        return
                    results[i] = self.read(conn, statements[i], hints[i])
            except BaseException as exc:
                self._note_failure(exc)  # (a failure inside a COPY was noted before its cancel)
                failed.set()  # the others take no further range
                raise

        with ThreadPoolExecutor(max_workers=len(sources), thread_name_prefix="pystrom-pg") as pool:
            futures = [pool.submit(work, source) for source in sources]
            try:
                # React to the first failure at once (a refused connection while the others read),
                # not when the connections before it in the list have finished.
                wait(futures, return_when=FIRST_EXCEPTION)
                if self._first:
                    # The first failure, not the first failed future in list order: a stream that fails
                    # ends the transaction whose snapshot the others import, and a stream still opening
                    # then fails too ("could not import the requested snapshot").
                    raise self._first[0]
                return results
            except BaseException:
                # One stream failed (or Ctrl-C): ask the server to stop the others, then let them drain.
                failed.set()
                with self._lock:
                    live = list(opened)
                for conn in live:
                    try:
                        conn.cancel()
                    except Exception:
                        pass
                for f in futures:
                    f.exception()
                raise


def read_all(
    backend: Any,
    ncols: int,
    jobs: tuple,
    progress: Any,
    strings: Mapping[int, str] | None = None,
    arrays: Sequence[int] = (),
) -> list[list[Staged]]:
    """jobs: (connections or SnapshotJoiners, COPY statements, their size hints); strings: the string
    columns' indices and names (their bytes are counted as they arrive); arrays: the array columns' indices."""
    with reporter(progress, unit="rows", desc="read_postgres") as report:
        return CopyReader(backend, ncols, report if report.active else None, strings, arrays).read_all(*jobs)


def _staging_allocator(backend: Any) -> Callable[[int], Any]:
    if backend.kind != "cuda":
        return lambda n: np.empty(n, dtype=np.uint8)
    cp = backend.xp

    def pinned(n: int) -> Any:  # page-locked, so the copy to the GPU runs at full PCIe speed
        with backend.activate():
            mem = cp.cuda.alloc_pinned_memory(n)
        return np.frombuffer(mem, dtype=np.uint8, count=n)  # keeps `mem` alive

    return pinned
