"""Positional reads of file byte ranges straight into a backend's memory.

GPU: KvikIO (GPUDirect Storage where the cuFile driver is usable, else its threaded POSIX path with
pinned bounce buffers). Its defaults (1 thread, 4 MiB tasks) leave most of the bandwidth unused: on the
GPU machine 1 thread read 6.9 GB/s from the page cache, 16 threads with 16 MiB tasks 45.7 GB/s. So
unless the user set ``KVIKIO_NTHREADS`` / ``KVIKIO_TASK_SIZE`` / ``KVIKIO_BOUNCE_BUFFER_SIZE``
themselves, pystrom sets them from ``pystrom.defaults.io_threads`` / ``io_task_size`` once, before
the first read. ``KVIKIO_COMPAT_MODE`` is KvikIO's own and always honoured.

CPU: ``os.preadv`` (the GIL is released during the call) on a thread pool, into the table's memory;
the caller reads too while it waits, taking the reads no pool thread has started. The reads are
queued until :meth:`RangeReader.wait` and then coalesced: sorted by file offset, ranges that follow
each other in the file (a record batch's buffers of different columns, with at most ``_MAX_GAP``
bytes of padding between them, read into a scratch buffer) become one scatter ``preadv`` of up to
``io_task_size`` bytes. A file written by pyarrow (64K-row batches) otherwise costs one read, one
future and one pool hand-off per column per batch (1,224 at 10M rows of 8 columns: about a third of
the read's time on the 2-core test machine).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import os
import threading
from typing import Any

import numpy as np

from ..._settings import defaults
from ...errors import FileFormatError

__all__ = ["RangeReader", "io_threads", "kvikio_settings"]

_MAX_GAP = 64 << 10  # padding (or unselected buffers) read and dropped rather than a separate read
_MAX_IOV = 512  # iovecs per preadv (the kernel allows IOV_MAX = 1024)


def io_threads() -> int:
    return defaults.io_threads or max(4, min(64, os.cpu_count() or 4))


_kvikio_lock = threading.Lock()
_kvikio_configured: dict[str, Any] | None = None


def _configure_kvikio() -> Any:
    """Import KvikIO and size its pool once (the user's KVIKIO_* variables win)."""
    global _kvikio_configured
    with _kvikio_lock:
        import kvikio
        import kvikio.defaults as kd

        if _kvikio_configured is None:
            wanted = {}
            if "KVIKIO_NTHREADS" not in os.environ:
                wanted["num_threads"] = io_threads()
            if "KVIKIO_TASK_SIZE" not in os.environ:
                wanted["task_size"] = defaults.io_task_size
            if "KVIKIO_BOUNCE_BUFFER_SIZE" not in os.environ:
                wanted["bounce_buffer_size"] = defaults.io_task_size
            for key, value in wanted.items():
                if hasattr(kd, "set"):
                    kd.set(key, value)
                else:  # KvikIO before 25.04
                    getattr(kd, f"{key}_reset")(value)
            _kvikio_configured = kvikio_settings(kd)
        return kvikio


def kvikio_settings(kd: Any = None) -> dict[str, Any]:
    """KvikIO's effective mode and sizes, for ``pystrom info`` and the benchmark."""
    if kd is None:
        import kvikio.defaults as kd

    def get(key: str) -> Any:
        if hasattr(kd, "get"):
            return kd.get(key)
        return getattr(kd, key)()

    out = {}
    for key in ("compat_mode", "num_threads", "task_size", "bounce_buffer_size"):
        try:
            out[key] = get(key)
        except Exception:  # an older KvikIO without that setting
            out[key] = None
    try:
        import kvikio.cufile_driver as drv

        out["gds_driver"] = bool(drv.get("is_gds_available")) if hasattr(drv, "get") else None
    except Exception:
        out["gds_driver"] = None
    return out


@functools.cache
def _host_pool() -> cf.ThreadPoolExecutor:
    return cf.ThreadPoolExecutor(io_threads(), thread_name_prefix="pystrom-io")


class RangeReader:
    """Submit reads of (file offset, size) into destination arrays; :meth:`wait` checks them all."""

    def __init__(self, path: str, backend: Any, progress: Any = None):
        self.path = path
        self.backend = backend
        self.bytes_read = 0
        self._progress = progress  # called with bytes_read as reads complete
        self._futures: list[tuple[Any, ...]] = []
        self._waited = 0  # futures waited for so far (tickets count futures: see submit)
        self._pending: list[tuple[int, int, memoryview]] = []  # reads not yet handed to the pool (CPU)
        if backend.kind == "cuda":
            kvikio = _configure_kvikio()
            with backend.activate():
                self._file = kvikio.CuFile(path, "r")
            self._fd = -1
        else:
            self._file = None
            self._fd = os.open(path, os.O_RDONLY)
            self._queue: collections.deque = collections.deque()  # reads not started yet (CPU)

    @property
    def progress(self) -> Any:
        """The callable given reads' progress (None: none), for readers layered on this one."""
        return self._progress

    def read(self, offset: int, size: int, dst: Any) -> None:
        """Read ``size`` bytes at file ``offset`` into the contiguous uint8 array ``dst``."""
        if size <= 0:
            return
        if self._file is not None:
            with self.backend.activate():
                self._futures.append((self._file.pread(dst, size, offset), offset, size))
            return
        self._pending.append((offset, size, memoryview(dst).cast("B")[:size]))

    def read_many(self, offsets: np.ndarray, sizes: np.ndarray, dst: Any, at: np.ndarray) -> None:
        """Read ``sizes[i]`` bytes at file ``offsets[i]`` into ``dst[at[i] : at[i] + sizes[i]]`` for every
        ``i`` (int64 arrays; empty reads skipped), ``dst`` a contiguous 1-D uint8 array."""
        for offset, size, pos in zip(offsets.tolist(), sizes.tolist(), at.tolist()):
            if size > 0:
                self.read(offset, size, dst[pos : pos + size])

    def _submit_pending(self) -> None:
        """Hand the queued CPU reads to the pool, coalesced into tasks (module docstring)."""
        pending, self._pending = self._pending, []
        task = defaults.io_task_size
        pool = _host_pool()
        current: list[memoryview] = []
        start = end = wanted = 0

        def flush() -> None:
            if current:
                fut: cf.Future = cf.Future()
                self._queue.append((fut, self._fd, list(current), start))
                pool.submit(_run_one, self._queue)
                self._futures.append((fut, start, end - start, wanted))
                current.clear()

        for offset, size, view in sorted(pending, key=lambda p: p[0]):
            for piece in range(0, size, task):
                n = min(task, size - piece)
                at = offset + piece
                gap = at - end
                if not (current and 0 <= gap <= _MAX_GAP and end - start + gap + n <= task
                        and len(current) + 2 <= _MAX_IOV):  # fmt: skip
                    flush()
                    start = end = at
                    wanted = 0
                elif gap:
                    current.append(memoryview(bytearray(gap)))
                current.append(view[piece : piece + n])
                end = at + n
                wanted += n
        flush()

    def submit(self) -> int:
        """Start the reads queued so far without waiting; a ticket for :meth:`wait` (the reads queued
        later may still be running when ``wait(ticket)`` returns)."""
        if self._file is None:
            self._submit_pending()
        return self._waited + len(self._futures)

    def wait(self, ticket: int | None = None) -> None:
        """Wait for (and check) the reads queued so far, or those up to :meth:`submit`'s ``ticket``."""
        if self._file is None and ticket is None:
            self._submit_pending()
        n = len(self._futures) if ticket is None else min(len(self._futures), max(0, ticket - self._waited))
        if self._file is None:
            # The caller reads what no pool thread has started yet: on a busy machine a thread's
            # wake-up can take longer than the read itself (measured: read_arrow of 64 MB twice as
            # slow under load with the caller only waiting). Oldest first: a ticket's reads first.
            k = 0
            while True:
                while k < n and self._futures[k][0].done():
                    k += 1
                if k == n or not _run_one(self._queue):
                    break
        futures, self._futures = self._futures[:n], self._futures[n:]
        self._waited += len(futures)
        error = None
        for fut, offset, size, *useful in futures:
            try:
                got = fut.get() if self._file is not None else fut.result()
            except Exception as exc:  # keep waiting: no read may outlive the buffers it writes into
                error = error or exc
                continue
            if got != size and error is None:
                error = FileFormatError(
                    f"{self.path!r}: expected {size} bytes at offset {offset}, the file gave {got} (truncated?)"
                )
            self.bytes_read += useful[0] if useful and got == size else got
            if self._progress is not None and error is None:
                self._progress(self.bytes_read)
        if error is not None:
            if isinstance(error, FileFormatError):
                raise error
            raise OSError(f"reading {self.path!r} failed: {error}") from error

    def close(self) -> None:
        try:
            if self._futures or self._pending:
                self.wait()
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._pending = []  # never started: nothing to wait for
            try:
                self.close()
            except Exception:
                pass  # the first error is the one to report
        else:
            self.close()


def _run_one(queue: collections.deque) -> bool:
    """Run the oldest read of ``queue`` not started yet (by a pool thread or the waiting caller:
    each entry is taken exactly once); False when there was none."""
    try:
        fut, fd, views, offset = queue.popleft()
    except IndexError:
        return False
    try:
        fut.set_result(_pread_all(fd, views, offset))
    except BaseException as exc:
        fut.set_exception(exc)
    return True


def _pread_all(fd: int, views: list[memoryview], offset: int) -> int:
    """Fill ``views`` (consecutive in the file from ``offset``); the bytes read, fewer at end of file."""
    done = first = 0
    while first < len(views):
        n = os.preadv(fd, views[first:] if first else views, offset + done)
        if n == 0:
            break  # end of file: reported as a short read
        done += n
        while first < len(views) and n >= len(views[first]):  # skip what is filled
            n -= len(views[first])
            first += 1
        if n:  # the read stopped inside this view: the next one starts where it stopped
            views[first] = views[first][n:]
    return done


def as_bytes(array: Any) -> Any:
    """A flat uint8 view of a contiguous array of either backend."""
    return array.reshape(-1).view(np.uint8) if isinstance(array, np.ndarray) else array.ravel().view("uint8")
