"""Host memory that other processes can map: anonymous shared memory files (Linux ``memfd``).

A CPU table lives in private memory until it is first exported; then :mod:`.hostmem` moves it
into a memfd made here, mapped over the table's own addresses, so the export shares the very
memory the exporter writes to. The store daemon's tables are memfds from the start. Why ``memfd``
rather than a named POSIX segment (``shm_open``):

- nothing is left behind when a process dies: the kernel frees the memory when the last file
  descriptor and mapping go (a named segment stays in ``/dev/shm`` until someone unlinks it, and
  Python's ``multiprocessing.resource_tracker`` before 3.13 unlinks segments it did not create);
- it is not bounded by the size of the ``/dev/shm`` mount (64 MiB in default Docker containers);
- it is reachable by name only through ``/proc/<pid>/fd/<n>``, which the kernel lets only the
  owner's uid (or a process allowed to trace it) open, and the descriptor itself can be passed
  over a Unix socket (the store daemon does);
- it can be sealed: against resizing (every memfd made here), against new writes while the
  mappings made before keep theirs (an exported table: ``F_SEAL_FUTURE_WRITE``, Linux 5.1), or
  against every write (a committed store table: ``F_SEAL_WRITE``). Whoever reopens
  ``/proc/<pid>/fd/<n>`` read-write then still cannot write or map it writable.

Where ``memfd`` is missing (not Linux), tables cannot be exported.
"""

from __future__ import annotations

import fcntl
import functools
import mmap
import os
import re
import secrets
import weakref

import numpy as np

__all__ = [
    "SharedMapping",
    "map_fd",
    "map_fd_owned",
    "create_fd",
    "close_quietly",
    "mapping_of",
    "is_name",
    "seals",
    "freeze",
    "seal_future_writes",
    "future_write_sealing",
    "reopen_read_only",
    "make_read_only",
    "HAVE_MEMFD",
]

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


# A store table the client maps to fill is written in full right away: faulting its pages in with the
# mapping is cheaper than one trap per page (measured on the development VM: 512 MiB in 0.45 s, not 0.60 s).
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_MAP_FIXED = 0x10  # Linux, every architecture


def new_name() -> str:
    return _PREFIX + secrets.token_hex(12)


_NAME = re.compile(r"pystrom-[0-9a-f]{24}")


def is_name(name: str) -> bool:
    """Whether ``name`` is one :func:`new_name` makes (the whole name, not a prefix)."""
    return _NAME.fullmatch(name) is not None


# Seals (memfd_create(2), fcntl(2)): a table's size never changes, so every memfd is sealed against
# shrinking and growing at once (an importer's mapping can then never SIGBUS on a truncated file); the
# store daemon adds the write seal at commit, which makes a committed table immutable for everyone.
SIZE_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0)
FROZEN_SEALS = SIZE_SEALS | getattr(fcntl, "F_SEAL_WRITE", 0)
_ALLOW_SEALING = getattr(os, "MFD_ALLOW_SEALING", 0)


def create_fd(size: int, name: str | None = None) -> tuple[int, str]:
    """A new memfd of ``size`` bytes (zero-filled, close-on-exec), sealed against resizing."""
    name = name or new_name()
    fd = os.memfd_create(name, os.MFD_CLOEXEC | _ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        if _ALLOW_SEALING and SIZE_SEALS:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SIZE_SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def seals(fd: int) -> int:
    """The seals of a memfd (0 where sealing is not supported)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except (OSError, AttributeError):
        return 0


def freeze(fd: int) -> None:
    """Seal a memfd against every write, for good (F_SEAL_WRITE, then F_SEAL_SEAL).

    Raises ``OSError`` (EBUSY) while some process still maps it writable: a writer must unmap (or
    remap read-only, :func:`make_read_only`) before it commits.
    """
    wanted = FROZEN_SEALS | fcntl.F_SEAL_SEAL
    if seals(fd) & wanted != wanted:  # sealed already (a commit retried after a refusal): nothing to add
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, wanted)


# Linux 5.1; Python's fcntl names it only from 3.12 on (the value is fixed by the kernel's ABI)
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)


@functools.cache
def future_write_sealing() -> bool:
    """Whether this kernel takes F_SEAL_FUTURE_WRITE (Linux 5.1 and later), found by trying it once."""
    if not (HAVE_MEMFD and _ALLOW_SEALING):
        return False
    try:
        fd = os.memfd_create("pystrom-probe", os.MFD_CLOEXEC | _ALLOW_SEALING)
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE)
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & F_SEAL_FUTURE_WRITE != 0
    except OSError:  # EINVAL: an older kernel
        return False
    finally:
        os.close(fd)


def seal_future_writes(fd: int) -> bool:
    """Forbid every new write to a memfd (``write``, a writable mapping, ``mprotect`` to writable),
    through any descriptor, while mappings made before keep writing. True once the memfd is sealed so
    (or against all writes); False where the kernel cannot (before Linux 5.1) or it takes no more seals.
    """
    if seals(fd) & (F_SEAL_FUTURE_WRITE | getattr(fcntl, "F_SEAL_WRITE", 0)):
        return True
    if not future_write_sealing():
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE)
    except OSError:  # EPERM: sealed with F_SEAL_SEAL already
        return False
    return True


def reopen_read_only(fd: int) -> int:
    """A new read-only open file description of the same memfd (to hand to readers)."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)


def make_read_only(m: SharedMapping) -> None:
    """Replace a writable mapping in place by a read-only one of the same file (``m.fd`` must be open).

    Arrays over the mapping keep their addresses; a write through them now faults. The kernel
    counts writable shared mappings of a memfd (F_SEAL_WRITE fails while one exists), and a mere
    ``mprotect`` would not lower that count: the mapping itself must be replaced.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    address = np.frombuffer(m, dtype=np.uint8).ctypes.data
    # through a read-only descriptor: a shared mapping of a read-write one stays "may write" for the kernel
    fd = reopen_read_only(m.fd)
    try:
        got = libc.mmap(address, len(m), mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        err = ctypes.get_errno()
    finally:
        os.close(fd)
    if got != address:
        raise OSError(err, f"cannot remap shared memory read-only: {os.strerror(err)}")


def map_fd(fd: int, size: int, name: str, writable: bool) -> np.ndarray:
    """Map ``size`` bytes of an open memfd; the caller keeps ownership of ``fd`` (close it when done)."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    m = SharedMapping(fd, size, flags=mmap.MAP_SHARED, prot=prot)
    m.fd, m.name = -1, name
    return np.frombuffer(m, dtype=np.uint8, count=size)


def map_fd_owned(fd: int, size: int, name: str) -> np.ndarray:
    """Map an open memfd writable and take ownership of ``fd`` (closed with the mapping)."""
    m = SharedMapping(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    m.fd, m.name = fd, name
    weakref.finalize(m, close_quietly, fd)
    return np.frombuffer(m, dtype=np.uint8, count=size)


def mapping_of(memory: np.ndarray) -> SharedMapping | None:
    """The SharedMapping under an array from :func:`map_fd`, if it is one."""
    base = memory
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer holds the mapping through a memoryview
        base = base.obj
    return base if isinstance(base, SharedMapping) else None
