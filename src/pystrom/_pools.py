"""Process-wide thread pools and locks that survive ``os.fork()``.

A pool made once and kept in a module (the CPU reads' pool, the host copies' pool) is inherited by a
forked child without its threads, and a lock that another thread of the parent held at the fork is
inherited held: the child then waits forever in ``submit`` (the executor's own lock) or in
``map`` (tasks no thread runs). Test harnesses and Dask's process workers fork from processes whose
threads are busy, so every such object here is made again in the child (``os.register_at_fork``),
before the child runs any of its own code.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import weakref
from collections.abc import Callable, Iterable

__all__ = ["SharedPool", "ForkSafeLock", "after_fork_in_child", "run_all"]

_resets: list[Callable[[], None]] = []
_renewed: weakref.WeakSet = weakref.WeakSet()  # pools and locks, each renewed by its _after_fork()


def after_fork_in_child(reset: Callable[[], None]) -> None:
    """Run ``reset`` in every child forked from now on (module state that must not be inherited)."""
    _resets.append(reset)


def _reset_all() -> None:
    for thing in list(_renewed):
        thing._after_fork()
    for reset in _resets:
        reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_all)


class SharedPool:
    """A thread pool made on first use and shared by the process; ``size`` is asked again at each use
    (a setting may change it: the pool is then made again). A forked child gets a fresh one."""

    def __init__(self, name: str, size: Callable[[], int]):
        self._name = name
        self._size = size
        self._lock = threading.Lock()
        self._pool: cf.ThreadPoolExecutor | None = None
        self._made_with = 0
        _renewed.add(self)

    def get(self) -> cf.ThreadPoolExecutor:
        n = self._size()
        with self._lock:
            if self._pool is None or self._made_with != n:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)  # its running tasks finish; new ones go to the new pool
                self._pool = cf.ThreadPoolExecutor(n, thread_name_prefix=self._name)
                self._made_with = n
            return self._pool

    def _after_fork(self) -> None:
        """In a forked child: the parent's pool has no threads here and its locks may be held."""
        self._lock = threading.Lock()
        self._pool = None


class ForkSafeLock:
    """A ``threading.Lock`` made again (released) in a forked child: a parent's thread may have held it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _renewed.add(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def run_all(pool: cf.Executor, fn: Callable, *iterables: Iterable) -> list:
    """``list(pool.map(fn, *iterables))``, except that every task has finished when this returns or raises
    (the first error, after all of them). ``Executor.map`` raises at the first failed task while the others
    still run: where they write through raw addresses (the C++ core's preads, decoders and copies take
    addresses, not arrays), the caller's unwinding would free the memory they write into."""
    futures = [pool.submit(fn, *args) for args in zip(*iterables)]
    cf.wait(futures)
    return [f.result() for f in futures]
