"""Positional reads of file byte ranges straight into a backend's memory.

GPU: KvikIO (GPUDirect Storage where the cuFile driver is usable, else its threaded POSIX path with
pinned bounce buffers). Its defaults (1 thread, 4 MiB tasks) leave most of the bandwidth unused: on the
GPU machine 1 thread read 6.9 GB/s from the page cache, 16 threads with 16 MiB tasks 45.7 GB/s. So
unless the user set ``KVIKIO_NTHREADS`` / ``KVIKIO_TASK_SIZE`` / ``KVIKIO_BOUNCE_BUFFER_SIZE``
themselves, pystrom sets them from ``pystrom.defaults.io_threads`` / ``io_task_size`` once, before
the first read. ``KVIKIO_COMPAT_MODE`` is KvikIO's own and always honoured.

CPU: ``os.preadv`` (the GIL is released during the call) on a thread pool, into the table's memory;
the caller reads too while it waits, taking the reads no pool thread has started.
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
        self._futures: list[tuple[Any, int, int]] = []
        if backend.kind == "cuda":
            kvikio = _configure_kvikio()
            with backend.activate():
                self._file = kvikio.CuFile(path, "r")
            self._fd = -1
        else:
            self._file = None
            self._fd = os.open(path, os.O_RDONLY)
            self._queue: collections.deque = collections.deque()  # reads not started yet (CPU)

    def read(self, offset: int, size: int, dst: Any) -> None:
        """Read ``size`` bytes at file ``offset`` into the contiguous uint8 array ``dst``."""
        if size <= 0:
            return
        if self._file is not None:
            with self.backend.activate():
                self._futures.append((self._file.pread(dst, size, offset), offset, size))
            return
        task = defaults.io_task_size
        view = memoryview(dst).cast("B")
        for start in range(0, size, task):
            n = min(task, size - start)
            fut: cf.Future = cf.Future()
            self._queue.append((fut, self._fd, view[start : start + n], offset + start))
            _host_pool().submit(_run_one, self._queue)
            self._futures.append((fut, offset + start, n))

    def wait(self) -> None:
        if self._file is None:
            # The caller reads what no pool thread has started yet: on a busy machine a thread's
            # wake-up can take longer than the read itself (measured: read_arrow of 64 MB twice as
            # slow under load with the caller only waiting).
            while _run_one(self._queue):
                pass
        futures, self._futures = self._futures, []
        error = None
        for fut, offset, size in futures:
            try:
                got = fut.get() if self._file is not None else fut.result()
            except Exception as exc:  # keep waiting: no read may outlive the buffers it writes into
                error = error or exc
                continue
            if got != size and error is None:
                error = FileFormatError(
                    f"{self.path!r}: expected {size} bytes at offset {offset}, the file gave {got} (truncated?)"
                )
            self.bytes_read += got
            if self._progress is not None and error is None:
                self._progress(self.bytes_read)
        if error is not None:
            if isinstance(error, FileFormatError):
                raise error
            raise OSError(f"reading {self.path!r} failed: {error}") from error

    def close(self) -> None:
        try:
            if self._futures:
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
        fut, fd, view, offset = queue.popleft()
    except IndexError:
        return False
    try:
        fut.set_result(_pread_all(fd, view, offset))
    except BaseException as exc:
        fut.set_exception(exc)
    return True


def _pread_all(fd: int, view: memoryview, offset: int) -> int:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break  # end of file: reported as a short read
        done += n
    return done


def as_bytes(array: Any) -> Any:
    """A flat uint8 view of a contiguous array of either backend."""
    return array.reshape(-1).view(np.uint8) if isinstance(array, np.ndarray) else array.ravel().view("uint8")
