"""Host memory of CPU tables: private, pooled, and moved into shared memory when first exported.

What happens to one table's memory, in order:

1. :func:`allocate` takes a private anonymous mapping of the size class of the request (a power of
   two or three times one, at least 64 KiB) from the pool when one is idle: its pages are resident
   already, so a producer that writes the whole table pays no page faults. Otherwise it maps a
   fresh one with ``MADV_HUGEPAGE`` (one fault per 2 MiB instead of per 4 KiB where the kernel has
   transparent huge pages). Pages are never faulted in up front: the producer is about to write
   every byte, and the first write faults them anyway.
2. Every array of the table is a view whose NumPy base is a small lease object; when the last view
   is gone, the lease's finalizer gives the mapping back to the pool. The pool keeps at most
   ``pystrom.defaults.host_pool_bytes`` of idle mappings, and at most 64 of them (oldest unmapped
   first).
3. :func:`exportable` (called by ``Table.export``) moves the memory into a ``memfd`` on the first
   export, in place: the bytes in use are written into a new memfd, and the memfd is mapped with
   ``MAP_FIXED`` over the very addresses of the private mapping, so every array handed out earlier
   now reads and writes the shared memory. That costs one copy of the table into shared memory
   (page-cache pages: about 1.2 GB/s on the development VM, measured with ``os.pwrite``), once per
   table. Writes made by other threads *during* that first export may be lost (as with any
   unsynchronised writer). A shared mapping never goes back to the pool: importers may still map
   it.

Measured on the development VM (64 MiB written in full): a memfd mapped with ``MAP_POPULATE`` (the
former allocator) 95 ms; private with huge pages 13 ms; a pooled mapping 8.7 ms (the copy alone).
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os
import sys
import weakref

import numpy as np

from .._pools import ForkSafeLock
from .._settings import defaults
from . import shm
from .layout import ALIGNMENT

__all__ = ["allocate", "exportable", "pool_bytes", "release_pool", "size_class"]

_HAVE_MMAP = sys.platform.startswith("linux") and hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")
_MIN_CLASS = 64 << 10
_MAX_IDLE = 64  # idle mappings kept, whatever their size: each is a kernel VMA (vm.max_map_count)
_MAP_FIXED = 0x10  # Linux, every architecture


class HostMapping(shm.SharedMapping):
    """A private anonymous mapping holding one table's memory (``fd`` -1 until it is shared)."""

    address: int
    pooled: bool


class _Lease:
    """The object NumPy sees as the owner of one table's memory (the base of all its views)."""

    __slots__ = ("__array_interface__", "mapping", "nbytes", "__weakref__")


def size_class(nbytes: int) -> int:
    """The mapping size used for ``nbytes``: the smallest 2^k or 3 * 2^(k-1) >= nbytes, >= 64 KiB.

    Two classes per power of two waste at most a third of the virtual size, and pages never
    touched cost no memory; few classes make idle mappings reusable by tables of other sizes.
    """
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    k = (nbytes - 1).bit_length()  # 2^(k-1) < nbytes <= 2^k
    three = 3 << (k - 2)
    return three if nbytes <= three else 1 << k


class _Pool:
    """Idle mappings by age. Finalizers (which may run inside any allocation, in any thread, also
    while this thread holds the lock) only append to ``returned`` and never wait for the lock;
    whoever holds it next files them."""

    def __init__(self) -> None:
        self.lock = ForkSafeLock()  # a forked child must not inherit it held by a parent's thread
        self.idle: collections.OrderedDict[int, HostMapping] = collections.OrderedDict()  # id -> mapping, oldest first
        self.idle_bytes = 0
        self.returned: collections.deque[HostMapping] = collections.deque()

    def take(self, size: int) -> HostMapping | None:
        found = None
        with self.lock:
            for key in reversed(list(self.idle)):  # the most recently used: likeliest still in the CPU caches
                if len(self.idle[key]) == size:
                    found = self.idle.pop(key)
                    self.idle_bytes -= size
                    break
        self.file_returned()
        return found

    def give(self, m: HostMapping) -> None:
        self.returned.append(m)
        self.file_returned()

    def file_returned(self) -> None:
        if not self.lock.acquire(blocking=False):
            return  # the holder files them
        dropped = []
        try:
            limit = defaults.host_pool_bytes
            while self.returned:
                m = self.returned.popleft()
                if m.fd >= 0 or len(m) > limit:  # shared memory is never reused: importers may map it
                    dropped.append(m)
                    continue
                while self.idle and (self.idle_bytes + len(m) > limit or len(self.idle) >= _MAX_IDLE):
                    _, old = self.idle.popitem(last=False)
                    self.idle_bytes -= len(old)
                    dropped.append(old)
                self.idle[id(m)] = m
                self.idle_bytes += len(m)
        finally:
            self.lock.release()
        for m in dropped:
            _unmap(m)

    def clear(self) -> None:
        self.file_returned()
        with self.lock:
            dropped = list(self.idle.values())
            self.idle.clear()
            self.idle_bytes = 0
        for m in dropped:
            _unmap(m)


_pool = _Pool()


def _unmap(m: HostMapping) -> None:
    try:
        m.close()
    except BufferError:  # a transient buffer export still holds it: unmapped when that goes
        pass


def _new_mapping(size: int) -> HostMapping:
    m = HostMapping(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # kernels without transparent huge pages
            pass
    m.fd, m.name = -1, ""
    m.address = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return m


def _give_back(m: HostMapping) -> None:
    if sys.is_finalizing():
        return
    _pool.give(m)


def allocate(nbytes: int) -> np.ndarray:
    """``nbytes`` of private host memory (uint8, 64-byte aligned, contents unspecified).

    Raises MemoryError when the system has no memory to give.
    """
    if not _HAVE_MMAP:
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGNMENT
        return raw[start : start + nbytes]
    size = size_class(max(nbytes, 1))
    m = _pool.take(size)
    if m is None:
        try:
            m = _new_mapping(size)
        except OSError:
            _pool.clear()  # idle mappings may be what is missing
            try:
                m = _new_mapping(size)
            except OSError as exc:
                raise MemoryError(f"cannot map {size:,} bytes of host memory: {exc}") from None
    lease = _Lease()
    lease.__array_interface__ = {"data": (m.address, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}
    lease.mapping = m
    lease.nbytes = nbytes
    fin = weakref.finalize(lease, _give_back, m)
    fin.atexit = False
    return np.asarray(lease)


_share_lock = ForkSafeLock()


def _lease_of(memory: np.ndarray) -> _Lease | None:
    base = memory
    while isinstance(base, np.ndarray):
        base = base.base
    return base if isinstance(base, _Lease) else None


def exportable(memory: np.ndarray) -> shm.SharedMapping | None:
    """The shared mapping under a CPU table's ``memory``, moving private memory into a memfd first.

    Returns None for memory that cannot be shared (no memfd on this system, or the private
    fallback of systems without anonymous mappings). A mapping imported from another process is
    returned as it is (its ``fd`` is -1: the caller refuses to export it again).
    """
    lease = _lease_of(memory)
    if lease is None:
        return shm.mapping_of(memory)
    m = lease.mapping
    with _share_lock:
        if m.fd < 0:
            if not shm.HAVE_MEMFD:
                return None
            _share_in_place(m, lease.nbytes)
    return m


def _share_in_place(m: HostMapping, used: int) -> None:
    """Put a memfd holding bytes ``[0, used)`` of ``m`` under ``m``'s own addresses."""
    size = len(m)
    fd, name = shm.create_fd(size)
    try:
        with memoryview(m) as view:
            done, end = 0, min(size, used)  # not a byte more: the rest may hold an earlier table's data
            while done < end:  # one pwrite moves at most ~2 GiB
                done += os.pwrite(fd, view[done:end], done)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        got = libc.mmap(m.address, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        if got != m.address:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot map shared memory over the table's memory: {os.strerror(err)}")
    except BaseException:
        os.close(fd)
        raise
    m.fd, m.name = fd, name
    weakref.finalize(m, shm.close_quietly, fd)


def pool_bytes() -> int:
    """Bytes of idle mappings the pool holds now."""
    return _pool.idle_bytes


def release_pool() -> None:
    """Unmap every idle mapping (their memory goes back to the system)."""
    _pool.clear()
