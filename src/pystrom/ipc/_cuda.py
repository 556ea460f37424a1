"""The CUDA driver calls IPC needs, through ctypes on ``libcuda`` (the one module that makes them).

Two ways to share device memory between processes:

- **legacy IPC** (``cudaIpcGetMemHandle``): a 64-byte handle for a whole ``cudaMalloc`` allocation.
  Anyone with the bytes on this machine can map it: the handle is a capability. Tables come from
  CuPy's pool, which hands out pieces of larger allocations, so an export names the *base*
  allocation (``cuMemGetAddressRange``) and the table's offset inside it.
- **virtual memory management** (``cuMemCreate`` with POSIX file-descriptor handles): the
  allocation is exported as a file descriptor, passed over a Unix socket with SCM_RIGHTS. Only a
  process that received the descriptor can map it, so the kernel enforces who may. The store
  daemon uses this where the driver supports it.

Driver calls need a current context: :func:`use_device` makes the device's primary context
current on the calling thread (through the runtime, as CuPy does).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

from ..errors import ExporterGoneError, IPCError

__all__ = ["use_device", "device_uuid", "address_range", "ipc_export", "ipc_open", "ipc_close", "Vmm"]

_c_ptr = ctypes.c_uint64  # CUdeviceptr
_c_handle = ctypes.c_uint64  # CUmemGenericAllocationHandle

# enum values from cuda.h (stable across CUDA 11-13)
_ALLOCATION_TYPE_PINNED = 1
_HANDLE_TYPE_POSIX_FD = 1
_LOCATION_TYPE_DEVICE = 1
_ACCESS_READ = 1  # CU_MEM_ACCESS_FLAGS_PROT_READ
_ACCESS_READWRITE = 3
_GRANULARITY_MINIMUM = 0
_ERROR_INVALID_VALUE = 1
_ERROR_INVALID_HANDLE = 400


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class DriverError(IPCError):
    """A CUDA driver call failed (code and name in the message)."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


@functools.cache
def _lib() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise IPCError(f"cannot load the CUDA driver (libcuda.so.1): {exc}") from None
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(_c_ptr), ctypes.POINTER(ctypes.c_size_t), _c_ptr]
    lib.cuMemCreate.argtypes = [
        ctypes.POINTER(_c_handle),
        ctypes.c_size_t,
        ctypes.POINTER(_AllocationProp),
        ctypes.c_ulonglong,
    ]
    lib.cuMemGetAllocationGranularity.argtypes = [
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(_AllocationProp),
        ctypes.c_int,
    ]
    lib.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, _c_handle, ctypes.c_int, ctypes.c_ulonglong]
    lib.cuMemImportFromShareableHandle.argtypes = [ctypes.POINTER(_c_handle), ctypes.c_void_p, ctypes.c_int]
    lib.cuMemAddressReserve.argtypes = [
        ctypes.POINTER(_c_ptr),
        ctypes.c_size_t,
        ctypes.c_size_t,
        _c_ptr,
        ctypes.c_ulonglong,
    ]
    lib.cuMemMap.argtypes = [_c_ptr, ctypes.c_size_t, ctypes.c_size_t, _c_handle, ctypes.c_ulonglong]
    lib.cuMemSetAccess.argtypes = [_c_ptr, ctypes.c_size_t, ctypes.POINTER(_AccessDesc), ctypes.c_size_t]
    lib.cuMemUnmap.argtypes = [_c_ptr, ctypes.c_size_t]
    lib.cuMemAddressFree.argtypes = [_c_ptr, ctypes.c_size_t]
    lib.cuMemRelease.argtypes = [_c_handle]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
    return lib


def _check(rc: int, what: str) -> None:
    if rc:
        name = ctypes.c_char_p()
        _lib().cuGetErrorName(rc, ctypes.byref(name))
        text = name.value.decode() if name.value else "unknown error"
        raise DriverError(f"CUDA driver: {what} failed with {text} ({rc})", rc)


def use_device(ordinal: int) -> None:
    """Make GPU ``ordinal``'s primary context current on this thread (driver calls need one)."""
    import cupy

    cupy.cuda.runtime.setDevice(ordinal)
    cupy.cuda.runtime.free(0)  # forces the runtime to create and bind the primary context


def synchronize() -> None:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


@functools.cache
def device_uuid(ordinal: int) -> bytes:
    """The 16-byte UUID of GPU ``ordinal`` (as numbered in this process)."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(ordinal)
    uuid = props.get("uuid")
    if isinstance(uuid, (bytes, bytearray)) and len(uuid) == 16:
        return bytes(uuid)
    lib = _lib()
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    buf = (ctypes.c_char * 16)()
    _check(lib.cuDeviceGetUuid(buf, dev), "cuDeviceGetUuid")
    return bytes(buf)


def address_range(ptr: int) -> tuple[int, int]:
    """(base address, size) of the allocation that contains device address ``ptr``."""
    base, size = _c_ptr(), ctypes.c_size_t()
    _check(_lib().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), _c_ptr(ptr)), "cuMemGetAddressRange")
    return int(base.value), int(size.value)


# -- legacy IPC -------------------------------------------------------------------------------------


def ipc_export(base: int) -> bytes:
    import cupy

    try:
        return bytes(cupy.cuda.runtime.ipcGetMemHandle(base))
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise IPCError(
            f"cannot export device memory at {base:#x} ({exc}); IPC needs memory from cudaMalloc "
            "(CuPy's default pool), not managed or stream-ordered memory"
        ) from None


def ipc_open(handle: bytes) -> int:
    import cupy

    try:
        return int(cupy.cuda.runtime.ipcOpenMemHandle(handle, 1))  # cudaIpcMemLazyEnablePeerAccess
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise ExporterGoneError(
            f"the CUDA IPC handle cannot be opened ({exc}): the exporting process has freed the memory or exited"
        ) from None


def ipc_close(ptr: int) -> None:
    import cupy

    cupy.cuda.runtime.ipcCloseMemHandle(ptr)


# -- virtual memory management with POSIX file descriptors ------------------------------------------


class Vmm:
    """cuMemCreate allocations exportable as file descriptors, on one GPU."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.prop = _AllocationProp()
        self.prop.type = _ALLOCATION_TYPE_PINNED
        self.prop.requestedHandleTypes = _HANDLE_TYPE_POSIX_FD
        self.prop.location = _Location(_LOCATION_TYPE_DEVICE, ordinal)
        gran = ctypes.c_size_t()
        _check(
            _lib().cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self.prop), _GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity",
        )
        self.granularity = int(gran.value)

    def rounded(self, nbytes: int) -> int:
        g = self.granularity
        return max(g, (nbytes + g - 1) // g * g)

    def create(self, nbytes: int) -> tuple[int, int]:
        """A new physical allocation of at least ``nbytes``: (allocation handle, size)."""
        size = self.rounded(nbytes)
        handle = _c_handle()
        _check(_lib().cuMemCreate(ctypes.byref(handle), size, ctypes.byref(self.prop), 0), f"cuMemCreate({size:,})")
        return int(handle.value), size

    @staticmethod
    def export_fd(handle: int) -> int:
        """A new file descriptor for the allocation (the caller closes it after sending it)."""
        fd = ctypes.c_int(-1)
        _check(
            _lib().cuMemExportToShareableHandle(ctypes.byref(fd), _c_handle(handle), _HANDLE_TYPE_POSIX_FD, 0),
            "cuMemExportToShareableHandle",
        )
        return int(fd.value)

    @staticmethod
    def release(handle: int) -> None:
        _check(_lib().cuMemRelease(_c_handle(handle)), "cuMemRelease")

    def map_fd(self, fd: int, size: int, read_only: bool = False) -> tuple[int, bool]:
        """Import the allocation behind ``fd`` and map ``size`` bytes of it on this GPU.

        ``read_only``: the mapping's access is ``CU_MEM_ACCESS_FLAGS_PROT_READ``, so a kernel that
        writes through it faults; where the driver refuses read-only access the mapping is
        read-write (the second value returned says which). The descriptor stays the caller's.
        Returns (device address, read-only); :meth:`unmap` undoes it.
        """
        lib = _lib()
        handle = _c_handle()
        _check(
            lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), _HANDLE_TYPE_POSIX_FD),
            "cuMemImportFromShareableHandle",
        )
        ptr = _c_ptr()
        try:
            _check(lib.cuMemAddressReserve(ctypes.byref(ptr), size, self.granularity, 0, 0), "cuMemAddressReserve")
            try:
                _check(lib.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
                try:
                    read_only = read_only and self._set_access(ptr, size, _ACCESS_READ) == 0
                    if not read_only:
                        _check(self._set_access(ptr, size, _ACCESS_READWRITE), "cuMemSetAccess")
                except BaseException:
                    lib.cuMemUnmap(ptr, size)
                    raise
            except BaseException:
                lib.cuMemAddressFree(ptr, size)
                raise
        finally:
            lib.cuMemRelease(handle)  # the mapping holds its own reference to the memory
        return int(ptr.value), read_only

    def _set_access(self, ptr: Any, size: int, flags: int) -> int:
        access = _AccessDesc(_Location(_LOCATION_TYPE_DEVICE, self.ordinal), flags)
        return int(_lib().cuMemSetAccess(ptr, size, ctypes.byref(access), 1))

    @staticmethod
    def unmap(ptr: int, size: int) -> None:
        lib = _lib()
        _check(lib.cuMemUnmap(_c_ptr(ptr), size), "cuMemUnmap")
        _check(lib.cuMemAddressFree(_c_ptr(ptr), size), "cuMemAddressFree")


def vmm_probe(ordinal: int) -> str | None:
    """None when fd-exportable VMM allocations work on GPU ``ordinal``, else why not.

    Creates a small allocation, exports it as a descriptor and maps it back: the calls a daemon
    and its clients make, in one process.
    """
    try:
        use_device(ordinal)
        vmm = Vmm(ordinal)
        handle, size = vmm.create(1)
        try:
            fd = vmm.export_fd(handle)
            try:
                ptr, _ = vmm.map_fd(fd, size)
                vmm.unmap(ptr, size)
            finally:
                os.close(fd)
        finally:
            vmm.release(handle)
    except (IPCError, AttributeError, OSError) as exc:
        return str(exc)
    return None
