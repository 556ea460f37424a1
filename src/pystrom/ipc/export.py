"""``Table.export()`` and ``pystrom.ipc_import``: one table's memory mapped by another process.

Mappings are cached per process: importing the same allocation twice maps it once, and the mapping
is closed when the last table view, column array or 2-D array made from it is gone (each holds
the mapping object through its memory pointer).

Who writes: the exporter's own mapping stays writable (importers see its later writes); a host
table's memfd is sealed at export against every other write (``F_SEAL_FUTURE_WRITE``), so an
importer of the same user that reopens ``/proc/<pid>/fd/<n>`` cannot write or map it writable;
where the kernel lacks that seal, the export hands out a copy sealed against all writes. Importers
check offsets at import and again wherever they follow them (``Block.others_may_write``).

Lifetime rule: the exporter must keep the table (or a view of it) alive while importers use it.
An importer that imports after the exporter exited gets :class:`~pystrom.errors.ExporterGoneError`;
memory already mapped stays valid after the exporter exits (the driver and the kernel keep it
until the last mapping goes). A table whose exporter *closed* it while the process lives on may be
reused for other data by the exporter: use the store daemon when tables must outlive their makers.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
import uuid
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DeviceError, ExporterGoneError, InvalidHandleError, IPCError
from ..memory import hostmem, shm
from ..memory.backend import Backend, Block, cuda_device_count, resolve_device
from . import handle as fmt
from . import validate

if TYPE_CHECKING:
    from ..table import Table

__all__ = ["export_table", "ipc_import", "boot_id", "process_start", "cuda_ordinal_for_uuid", "CudaIpcMapping"]

_lock = threading.Lock()
_mappings: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # key -> mapping object
_local: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (memory, offset) -> Block exported here


@functools.cache
def boot_id() -> bytes:
    """This machine's identity for host memory handles (changes at every boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return uuid.UUID(f.read().strip()).bytes
    except (OSError, ValueError):
        return uuid.UUID(int=uuid.getnode()).bytes


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])  # field 22 of proc(5); fields[0] is field 3


def cuda_ordinal_for_uuid(device_uuid: bytes, uuids: Sequence[bytes]) -> int | None:
    """Which of this process's GPUs (ordinals index ``uuids``) has ``device_uuid``."""
    for i, u in enumerate(uuids):
        if u == device_uuid:
            return i
    return None


def _visible_uuids() -> list[bytes]:
    from ._cuda import device_uuid

    return [device_uuid(i) for i in range(cuda_device_count())]


# -- export -----------------------------------------------------------------------------------------


def export_table(table: Table) -> bytes:
    block = table._live()
    backend = block.backend
    layout = fmt.TableLayout.of(table)
    me = os.getpid()
    if backend.kind == "cpu":
        m = hostmem.exportable(block.memory)  # private memory moves into a memfd here (first export only)
        if m is None or m.fd < 0:
            raise IPCError(
                "this CPU table's memory cannot be exported: it is "
                + ("imported from another process (export it there)" if m is not None else "private memory")
                + "; shared memory needs Linux memfd"
            )
        base = np.frombuffer(m, dtype=np.uint8).ctypes.data
        fd, name, size, offset = m.fd, m.name, len(m), block.ptr - base
        # Importers map read-only, but a process of this user could reopen /proc/<pid>/fd/<n> for writing:
        # the seal stops that and leaves this process's own mapping writable (the zero-copy contract).
        if not shm.seal_future_writes(fd):
            fd, name, size, offset = _sealed_copy(m, block.read_host(0, layout.nbytes))
        memory = struct.pack("<i", fd) + name.encode()
        h = fmt.Handle(fmt.HOST_MEMFD, boot_id(), size, offset, me, process_start(me) or 0, memory, layout)
        return fmt.encode(h)
    from . import _cuda

    backend.synchronize()  # what was written before export is what an importer sees
    with backend.activate():
        _cuda.use_device(backend.ordinal)
        base, size = _cuda.address_range(block.ptr)
        memory = _cuda.ipc_export(base)
    offset = block.ptr - base
    with _lock:
        _local[(memory, offset)] = block
    block.others_may_write = True  # a CUDA IPC mapping cannot be read-only: importers could write here
    uid = _cuda.device_uuid(backend.ordinal)
    h = fmt.Handle(fmt.CUDA_IPC, uid, size, offset, me, process_start(me) or 0, memory, layout)
    return fmt.encode(h)


def _sealed_copy(m: shm.SharedMapping, data: np.ndarray) -> tuple[int, str, int, int]:
    """Where the kernel cannot seal against future writes (before Linux 5.1): a copy of the table in a
    memfd of its own, sealed against every write, kept open as long as the table's memory. Importers
    see the table as it was at this export, not the exporter's later writes. (fd, name, size, offset)."""
    size = max(int(data.size), 1)
    fd, name = shm.create_fd(size)
    try:
        done = 0
        with memoryview(data) as view:
            while done < data.size:  # one pwrite moves at most ~2 GiB
                done += os.pwrite(fd, view[done:], done)
        shm.freeze(fd)
    except BaseException:
        os.close(fd)
        raise
    weakref.finalize(m, shm.close_quietly, fd)
    return fd, name, size, 0


# -- import -----------------------------------------------------------------------------------------


class CudaIpcMapping:
    """One legacy-IPC mapping of an exporter's allocation; closed when the last user is gone."""

    def __init__(self, ordinal: int, memory: bytes):
        from . import _cuda

        _cuda.use_device(ordinal)
        self.ordinal = ordinal
        self.ptr = _cuda.ipc_open(memory)
        try:
            self.base, self.size = _cuda.address_range(self.ptr)
        except _cuda.DriverError:  # cannot ask the driver: trust the handle's size (checked against it below)
            self.base, self.size = self.ptr, -1
        fin = weakref.finalize(self, _close_ipc, ordinal, self.ptr)
        fin.atexit = False  # at interpreter exit the driver tears everything down itself


def _close_ipc(ordinal: int, ptr: int) -> None:
    try:
        from . import _cuda

        _cuda.use_device(ordinal)
        _cuda.synchronize()  # no kernel may still read the memory when it goes
        _cuda.ipc_close(ptr)
    except Exception:  # nothing useful to do in a finalizer; the driver frees it at exit
        pass


def _check_exporter(h: fmt.Handle) -> None:
    if process_start(h.pid) != h.pid_start:
        raise ExporterGoneError(f"{h.describe()}: the exporting process {h.pid} has exited; nothing left to map")


def _open_memfd(h: fmt.Handle, fd: int, name: str) -> int:
    """A read-only descriptor of the exporter's memfd ``fd``, after checking it is the one named."""
    path = f"/proc/{h.pid}/fd/{fd}"
    try:
        target = os.readlink(path)
        # exact: a reused descriptor number holding another memfd whose name starts alike is not ours
        if target not in (f"/memfd:{name}", f"/memfd:{name} (deleted)"):
            raise FileNotFoundError
        src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ExporterGoneError(f"{h.describe()}: the exporter no longer holds this memory") from None
    except PermissionError:
        raise IPCError(f"{h.describe()}: not allowed to open {path} (another user's process)") from None
    # the descriptor may have changed between the readlink and the open: check the file itself
    if os.readlink(f"/proc/self/fd/{src}") not in (f"/memfd:{name}", f"/memfd:{name} (deleted)"):
        os.close(src)
        raise ExporterGoneError(f"{h.describe()}: the exporter no longer holds this memory")
    return src


def _map_host(h: fmt.Handle) -> np.ndarray:
    (fd,) = struct.unpack_from("<i", h.memory)
    name = h.memory[4:].decode(errors="replace")
    if not shm.is_name(name):
        raise InvalidHandleError(f"{h.describe()}: {name!r} is not the name of a pystrom memfd")
    if h.device_uuid != boot_id():
        raise IPCError(f"{h.describe()}: the handle comes from another machine (or an earlier boot) than this one")
    key = ("cpu", name)
    # Checked on every import, also when the mapping is cached: the exporter must still be alive and
    # hold this very memory at that descriptor, and the handle's sizes must be the memory's.
    _check_exporter(h)
    src = _open_memfd(h, fd, name)
    try:
        size = os.fstat(src).st_size
        if size != h.alloc_size:
            raise IPCError(f"{h.describe()}: the memory holds {size} bytes, the handle says {h.alloc_size}")
        with _lock:
            m = _mappings.get(key)
            if m is None or len(m) != size:
                arr = shm.map_fd(src, size, name, writable=False)
                m = shm.mapping_of(arr)
                _mappings[key] = m
    finally:
        os.close(src)
    return np.frombuffer(m, dtype=np.uint8)[h.offset : h.offset + h.layout.nbytes]


def _map_cuda(h: fmt.Handle) -> tuple[Backend, Any]:
    import cupy

    uuids = _visible_uuids()
    ordinal = cuda_ordinal_for_uuid(h.device_uuid, uuids)
    if ordinal is None:
        seen = ", ".join(str(uuid.UUID(bytes=u)) for u in uuids) or "none"
        raise IPCError(
            f"{h.describe()}: no GPU here has UUID {uuid.UUID(bytes=h.device_uuid)} (visible: {seen}); "
            "the handle comes from another machine or a GPU hidden by CUDA_VISIBLE_DEVICES"
        )
    backend = resolve_device(ordinal)
    nbytes = h.layout.nbytes
    if h.pid == os.getpid() and h.pid_start == process_start(h.pid):
        # CUDA refuses to open a process's own IPC handle: use the exported block itself.
        with _lock:
            block = _local.get((h.memory, h.offset))
        if block is None:
            raise ExporterGoneError(f"{h.describe()}: the exported table was freed in this process")
        return backend, block.memptr
    key = ("cuda", ordinal, h.memory)
    _check_exporter(h)  # also when the mapping is cached: a handle of a gone exporter is refused alike
    with _lock:
        m = _mappings.get(key)
        if m is None:
            with backend.activate():
                m = CudaIpcMapping(ordinal, h.memory)
            _mappings[key] = m
    if m.size != -1 and (m.size != h.alloc_size or m.base != m.ptr):
        raise IPCError(f"{h.describe()}: the mapped allocation holds {m.size} bytes, the handle says {h.alloc_size}")
    mem = cupy.cuda.UnownedMemory(m.ptr + h.offset, nbytes, m, device_id=ordinal)
    return backend, cupy.cuda.MemoryPointer(mem, 0)


def ipc_import(handle: bytes, columns: Sequence[str] | None = None, device: str | int | None = None) -> Table | Any:
    """Map a table exported by another process (zero copy).

    Parameters
    ----------
    handle
        Bytes from :meth:`pystrom.Table.export`. Every field is checked before anything is mapped;
        bad bytes raise :class:`~pystrom.errors.InvalidHandleError` naming the problem.
    columns
        None: return a read-only :class:`~pystrom.Table` view of the exporter's memory. A list of
        column names: return a 2-D array (rows x columns) of them, as ``Table.to_array(columns)``
        makes it: zero copy when they are adjacent columns of one dtype without NULLs.
    device
        None (default): the device the memory is on; a GPU handle maps on the GPU whose UUID it
        names, whatever its ordinal in this process. Another device: mapped, then copied there.

    Returns
    -------
    Table or array
        Views keep the mapping open; it is closed when the last of them is gone. Importing the
        same handle again while a view lives reuses the mapping. CPU views are read-only; GPU
        views must be treated as read-only (CuPy has no read-only arrays).

    Raises
    ------
    InvalidHandleError
        Malformed or altered handle bytes.
    ExporterGoneError
        The exporting process has exited, or freed the table.
    IPCError
        The memory is on another machine or a GPU not visible here, or the driver refused.
    """
    h = fmt.decode(handle)
    if h.kind == fmt.HOST_MEMFD:
        backend: Backend = resolve_device("cpu")
        memory: Any = _map_host(h)
    else:
        if cuda_device_count() == 0:
            raise DeviceError(f"{h.describe()} is GPU memory, but this process sees no CUDA GPU")
        backend, memory = _map_cuda(h)
    block: Block = backend.wrap(memory, h.layout.nbytes)
    block.others_may_write = True  # the exporter writes this memory: offsets are checked again where followed
    table = h.layout.table(block, "pystrom handle")
    validate.check_table(table, h.describe())  # offsets steer reads: checked before any read
    if device is not None:
        table = table.to(device)
    if columns is not None:
        if isinstance(columns, str):
            columns = [columns]
        return table.to_array(list(columns))
    return table


def mapping_count() -> int:
    """Mappings this process holds open now (tests check that they are closed)."""
    with _lock:
        return len(_mappings)
