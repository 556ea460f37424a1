"""Positional reads of file byte ranges straight into a backend's memory.

GPU: KvikIO (GPUDirect Storage where the cuFile driver is usable, else its threaded POSIX path with
pinned bounce buffers). Its defaults (1 thread, 4 MiB tasks) leave most of the bandwidth unused: on the
GPU machine 1 thread read 6.9 GB/s from the page cache, 16 threads with 16 MiB tasks 45.7 GB/s. So
unless the user set ``KVIKIO_NTHREADS`` / ``KVIKIO_TASK_SIZE`` / ``KVIKIO_BOUNCE_BUFFER_SIZE``
themselves, pystrom sets them from ``pystrom.defaults.io_threads`` / ``io_task_size`` once, before
the first read. ``KVIKIO_COMPAT_MODE`` is KvikIO's own and always honoured.

CPU: ``preadv`` (csrc/pread_runs.cpp, without the GIL) on a thread pool, into the table's memory;
the caller reads too while it waits, taking the reads no pool thread has started. The reads are
queued until :meth:`RangeReader.wait` and then coalesced: sorted by file offset, ranges that follow
each other in the file (a record batch's buffers of different columns, with at most ``_MAX_GAP``
bytes of padding between them, read into a scratch buffer) become one run of scatter ``preadv`` calls
of up to ``io_task_size`` bytes. A file written by pyarrow (64K-row batches) otherwise costs one read,
one future and one pool hand-off per column per batch (1,224 at 10M rows of 8 columns: about a third
of the read's time on the 2-core test machine). The column readers queue a column's pieces of every
batch at once (:meth:`RangeReader.read_many`: arrays, not a call a piece), and the runs are planned
and read in C++: 16,384 pieces (2048 batches x 8 columns) cost ~40 ms as Python objects.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import os
import threading
from typing import Any

import numpy as np

from .... import _core
from ...._dist import require
from ...._pools import SharedPool, run_all
from ...._settings import defaults
from ....errors import FileFormatError

__all__ = ["RangeReader", "check_pieces", "io_threads", "kvikio_settings", "read_pieces"]

_MAX_GAP = 64 << 10  # padding (or unselected buffers) read and dropped rather than a separate read


def io_threads() -> int:
    return defaults.io_threads or max(4, min(64, _cpu_count() or 4))


_cpu_count = functools.cache(os.cpu_count)  # it reads sysfs (~30 us), and a read asks twice


_kvikio_lock = threading.Lock()
_kvikio_configured: dict[str, Any] | None = None


def _configure_kvikio() -> Any:
    """Import KvikIO and size its pool once (the user's KVIKIO_* variables win)."""
    global _kvikio_configured
    with _kvikio_lock:
        kvikio = require("kvikio", "reading Arrow files onto a GPU")
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


_reads = SharedPool("pystrom-io", io_threads)


def _host_pool() -> cf.ThreadPoolExecutor:
    return _reads.get()


class RangeReader:
    """Submit reads of (file offset, size) into destination arrays; :meth:`wait` checks them all."""

    def __init__(self, path: str, backend: Any, progress: Any = None, fd: int | None = None):
        """``fd``: a descriptor of the file whose metadata gave the offsets (:meth:`.file.metadata.ArrowFile.fileno`),
        read through a duplicate of it on the CPU: ``path`` may name another file by now (a writer that
        replaced it, as write_arrow does over an existing file), whose bytes at those offsets are not
        the ones the metadata describes. KvikIO opens by path on a GPU."""
        self.path = path
        self.backend = backend
        self.bytes_read = 0
        self._progress = progress  # called with bytes_read as reads complete
        self._futures: list[tuple[Any, ...]] = []
        self._waited = 0  # futures waited for so far (tickets count futures: see submit)
        # reads not yet handed to the pool (CPU): (file offsets, sizes, destination addresses, their owner)
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, Any]] = []
        if backend.kind == "cuda":
            kvikio = _configure_kvikio()
            with backend.activate():
                self._file = kvikio.CuFile(path, "r")
            self._fd = -1
        else:
            self._file = None
            self._fd = os.open(path, os.O_RDONLY) if fd is None else os.dup(fd)
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
        view = memoryview(dst).cast("B")
        if view.readonly or len(view) < size:
            raise ValueError(f"read: the destination is read-only or shorter than {size} bytes")
        one = np.ones(1, dtype=np.int64)  # the view is the owner: it keeps dst alive and unresizable
        self._pending.append((one * offset, one * size, one * np.frombuffer(view, np.uint8).ctypes.data, view))

    def read_many(self, offsets: np.ndarray, sizes: np.ndarray, dst: Any, at: np.ndarray) -> None:
        """Read ``sizes[i]`` bytes at file ``offsets[i]`` into ``dst[at[i] : at[i] + sizes[i]]`` for every
        ``i`` (int64 arrays; empty reads skipped), ``dst`` a contiguous 1-D uint8 array."""
        keep = sizes > 0
        offsets, sizes, at = offsets[keep], sizes[keep], at[keep]
        check_pieces(dst, sizes, at)
        if self._file is not None:
            for offset, size, pos in zip(offsets.tolist(), sizes.tolist(), at.tolist()):
                self.read(offset, size, dst[pos : pos + size])
        elif len(sizes):
            self._pending.append((offsets.astype(np.int64), sizes.astype(np.int64), dst.ctypes.data + at, dst))

    def _submit_pending(self) -> None:
        """Hand the queued CPU reads to the pool, coalesced into runs (module docstring)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        offsets, sizes, addresses = (np.concatenate([p[i] for p in pending]) for i in range(3))
        owners = [p[3] for p in pending]  # alive until the reads are waited for
        task = defaults.io_task_size
        pieces = -(-sizes // task)
        if (pieces > 1).any():  # larger reads cut into task-sized pieces: the pool reads them side by side
            one = np.repeat(np.arange(len(sizes)), pieces)
            step = (np.arange(len(one)) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * task
            offsets, addresses = offsets[one] + step, addresses[one] + step
            sizes = np.minimum(task, sizes[one] - step)
        order = np.argsort(offsets, kind="stable")
        offsets, sizes, addresses = offsets[order], sizes[order], addresses[order]
        first = np.empty(len(offsets) + 1, dtype=np.int64)
        first = first[: _core.plan_runs(offsets, sizes, _MAX_GAP, task, first) + 1]
        start = offsets[first[:-1]]
        span = offsets[first[1:] - 1] + sizes[first[1:] - 1] - start
        wanted = np.add.reduceat(sizes, first[:-1])
        runs = 0
        for lo, hi, at, n, useful in zip(first[:-1].tolist(), first[1:].tolist(), start.tolist(), span.tolist(),
                                         wanted.tolist()):  # fmt: skip
            fut: cf.Future = cf.Future()
            self._queue.append((fut, self._fd, offsets, sizes, addresses, lo, hi))
            self._futures.append((fut, at, n, useful, owners))
            runs += 1
        # Pool threads that read runs until none is left, rather than a pool task a run (a task costs a
        # future, a work item and a queue hand-off more: ~1 ms of a 10M-row read's 40 runs)
        pool = _host_pool()
        for _ in range(min(runs, io_threads())):
            pool.submit(_drain, self._queue)

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


def _drain(queue: collections.deque) -> None:
    """Read runs of ``queue`` until none is left to start (a pool thread's task)."""
    while _run_one(queue):
        pass


def _run_one(queue: collections.deque) -> bool:
    """Run the oldest read of ``queue`` not started yet (by a pool thread or the waiting caller:
    each entry is taken exactly once); False when there was none."""
    try:
        fut, fd, offsets, sizes, addresses, lo, hi = queue.popleft()
    except IndexError:
        return False
    try:
        got = np.empty(1, dtype=np.int64)
        _core.pread_runs(fd, offsets, sizes, addresses, np.array([lo, hi], dtype=np.int64), 0, got)
        if got[0] < 0:
            raise OSError(int(-got[0]), os.strerror(int(-got[0])))
        fut.set_result(int(got[0]))
    except BaseException as exc:
        fut.set_exception(exc)
    return True


def read_pieces(fd: int, offsets: np.ndarray, sizes: np.ndarray, path: str, max_gap: int = 4096) -> np.ndarray:
    """Small pieces of a file read now, by the caller (metadata: the record batch messages, the length
    prefixes of compressed buffers): one uint8 array holding them back to back in the order given.
    ``pread`` in C++ rather than through a memory mapping: each piece touched there costs a page fault,
    and unmapping the file one more page (16,384 prefixes: ~20 ms). Pieces at most ``max_gap`` bytes
    apart are one read. A short read (the file shrank) is a FileFormatError naming ``path``."""
    sizes = np.asarray(sizes, dtype=np.int64)
    at = np.cumsum(sizes) - sizes
    out = np.empty(max(1, int(sizes.sum())), dtype=np.uint8)
    keep = np.flatnonzero(sizes > 0)
    keep = keep[np.argsort(offsets[keep], kind="stable")]
    if not len(keep):
        return out
    o, n = np.asarray(offsets, dtype=np.int64)[keep], sizes[keep]
    first = np.empty(len(keep) + 1, dtype=np.int64)
    first = first[: _core.plan_runs(o, n, max_gap, 1 << 62, first) + 1]
    runs = len(first) - 1
    got = np.empty(runs, dtype=np.int64)
    addresses = out.ctypes.data + at[keep]
    tasks = min(io_threads(), runs // 1024)  # a task of at least 1024 reads: ~0.5 ms on the pool

    def some(t: int) -> None:
        lo, hi = runs * t // tasks, runs * (t + 1) // tasks
        _core.pread_runs(fd, o, n, addresses, first[lo : hi + 1], 0, got[lo:hi])

    if tasks > 1:  # 16,384 prefixes took ~10 ms in one thread
        run_all(_host_pool(), some, range(tasks))
    else:
        _core.pread_runs(fd, o, n, addresses, first, 0, got)
    if (got < 0).any():
        code = int(-got[got < 0][0])
        raise OSError(code, f"reading {path!r} failed: {os.strerror(code)}")
    span = o[first[1:] - 1] + n[first[1:] - 1] - o[first[:-1]]
    if (got != span).any():
        r = int(np.flatnonzero(got != span)[0])
        raise FileFormatError(f"{path!r}: expected {int(span[r])} bytes at offset {int(o[first[r]])}, the file gave "
                              f"{int(got[r])} (truncated?)")  # fmt: skip
    return out


def check_pieces(dst: Any, sizes: np.ndarray, at: np.ndarray) -> None:
    """``read_many``'s contract: ``dst`` a contiguous 1-D uint8 array (NumPy or CuPy) holding every
    ``[at[i], at[i] + sizes[i])`` (a failure is the caller's bug, never the file's)."""
    if dst.ndim != 1 or dst.dtype != np.uint8 or not dst.flags.c_contiguous:
        raise ValueError("read_many: the destination must be a contiguous 1-D uint8 array")
    if len(sizes) and ((at < 0).any() or (at + sizes > dst.shape[0]).any()):
        raise ValueError(f"read_many: a piece lies outside the {dst.shape[0]}-byte destination")


def as_bytes(array: Any) -> Any:
    """A flat uint8 view of a contiguous array of either backend."""
    return array.reshape(-1).view(np.uint8) if isinstance(array, np.ndarray) else array.ravel().view("uint8")
