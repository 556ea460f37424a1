"""Host memory that other processes can map: anonymous shared memory files (Linux ``memfd``).

A CPU table lives in private memory until it is first exported; then :mod:`._hostmem` moves it
into a memfd made here, mapped over the table's own addresses, so the export shares the very
memory the exporter writes to. The store daemon's tables are memfds from the start. Why ``memfd``
rather than a named POSIX segment (``shm_open``):

- nothing is left behind when a process dies: the kernel frees the memory when the last file
  descriptor and mapping go (a named segment stays in ``/dev/shm`` until someone unlinks it, and
  Python's ``multiprocessing.resource_tracker`` before 3.13 unlinks segments it did not create);
- it is not bounded by the size of the ``/dev/shm`` mount (64 MiB in default Docker containers);
- it is reachable by name only through ``/proc/<pid>/fd/<n>``, which the kernel lets only the
  owner's uid (or a process allowed to trace it) open, and the descriptor itself can be passed
  over a Unix socket (the store daemon does).

Where ``memfd`` is missing (not Linux), tables cannot be exported.
"""

from __future__ import annotations

import mmap
import os
import secrets

import numpy as np

__all__ = ["SharedMapping", "map_fd", "create_fd", "close_quietly", "mapping_of", "HAVE_MEMFD"]

HAVE_MEMFD = hasattr(os, "memfd_create") and hasattr(mmap, "MAP_SHARED")
_PREFIX = "pystrom-"


class SharedMapping(mmap.mmap):
    """An ``mmap`` of a memfd that remembers the file (``fd``, ``name``) while the mapping lives.

    NumPy arrays made from it hold it as their base, so the descriptor is closed exactly when the
    last array over the memory goes.
    """

    fd: int  # -1 when the descriptor was closed after mapping (imported memory)
    name: str  # the memfd's name: "pystrom-<random hex>"; proves which file /proc/<pid>/fd/<n> is


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def new_name() -> str:
    return _PREFIX + secrets.token_hex(12)


def create_fd(size: int, name: str | None = None) -> tuple[int, str]:
    """A new memfd of ``size`` bytes (zero-filled, close-on-exec)."""
    name = name or new_name()
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def map_fd(fd: int, size: int, name: str, writable: bool) -> np.ndarray:
    """Map ``size`` bytes of an open memfd; the caller keeps ownership of ``fd`` (close it when done)."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    m = SharedMapping(fd, size, flags=mmap.MAP_SHARED, prot=prot)
    m.fd, m.name = -1, name
    return np.frombuffer(m, dtype=np.uint8, count=size)


def mapping_of(memory: np.ndarray) -> SharedMapping | None:
    """The SharedMapping under an array from :func:`map_fd`, if it is one."""
    base = memory
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer holds the mapping through a memoryview
        base = base.obj
    return base if isinstance(base, SharedMapping) else None
