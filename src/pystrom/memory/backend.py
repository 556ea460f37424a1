"""Devices: which one a call means, and how memory is allocated, viewed and copied on it.

Two backends share one interface. ``cpu`` keeps a table in host memory as NumPy arrays; ``cuda:N``
keeps it in device memory as CuPy arrays. Everything above this module takes an ``xp`` (NumPy or
CuPy) from the backend instead of branching on the device. CuPy is imported only when a CUDA
backend is actually created, so ``import pystrom`` stays fast on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .._settings import defaults
from ..errors import DeviceError, MissingDependencyError, OutOfMemoryError
from . import hostmem
from .transfer import DeviceTransfer, host_copy

__all__ = ["Backend", "Block", "resolve_device", "cuda_device_count", "backend_of_array", "stream_group_bytes"]

_DEVICE_RE = re.compile(r"^(cpu|cuda|gpu)(?::(\d+))?$")


@functools.cache
def cuda_device_count() -> int:
    """GPUs visible to this process, found without importing CuPy where the driver can be asked directly."""
    if importlib.util.find_spec("cupy") is None:
        return 0
    if sys.platform.startswith("linux"):
        try:
            driver = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return 0
        count = ctypes.c_int(0)
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    try:  # other platforms: let CuPy ask the runtime
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


class _NoCupyError(MissingDependencyError, DeviceError):
    """A GPU asked for where CuPy is not installed: the missing extra, and a DeviceError as it always was."""


class Block:
    """One allocation holding all buffers of a table (host or device memory).

    Views handed out (NumPy/CuPy arrays) reference the underlying memory object, so the memory
    lives as long as any view does, whatever happens to the Block or the Table.

    ``others_may_write`` is True when another process may write this memory while it is used
    here (a table imported from another process, a GPU table exported or fetched from the store):
    code that follows its string or list offsets then takes a checked copy of them first
    (``Column._offsets_in_bounds``), so that a write made after the import cannot steer a read
    outside the table.
    """

    backend: Backend
    nbytes: int
    ptr: int
    others_may_write: bool = False

    def array(self, offset: int, dtype: Any, shape: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def write_host(self, offset: int, src: np.ndarray) -> None:
        """Copy a contiguous host array's bytes to ``offset``."""
        raise NotImplementedError

    def write_device(self, offset: int, src: Any) -> None:
        """Copy a contiguous array of this backend's kind to ``offset``."""
        raise NotImplementedError

    def read_host(self, offset: int, size: int) -> np.ndarray:
        """Bytes ``[offset, offset + size)`` as a host uint8 array (a view on the CPU, a copy on a GPU)."""
        raise NotImplementedError

    def write_host_many(self, pieces: Sequence[tuple[int, np.ndarray]]) -> None:
        """Copy many host uint8 arrays to their offsets, in parallel where that pays."""
        raise NotImplementedError

    def read_host_many(self, pieces: Sequence[tuple[np.ndarray, int]]) -> None:
        """Fill host uint8 arrays from offsets ``[(destination, offset), ...]``, in parallel where that pays."""
        raise NotImplementedError


class _HostBlock(Block):
    def __init__(self, backend: Backend, nbytes: int, memory: np.ndarray | None = None):
        self.backend = backend
        self.nbytes = nbytes
        if memory is None:
            # Private (pooled) memory; Table.export moves it into shared memory, in place (_hostmem).
            try:
                memory = hostmem.allocate(nbytes)
            except (MemoryError, ValueError):
                raise OutOfMemoryError(f"cannot allocate {nbytes:,} bytes of host memory for a table") from None
        self.memory = memory  # a view of other memory (imported tables) keeps that memory alive
        self.ptr = self.memory.ctypes.data

    def array(self, offset: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        dt = np.dtype(dtype)
        count = math.prod(shape)  # not np.prod: a reduction over a tuple costs ~5 us, a read asks per column
        return self.memory[offset : offset + count * dt.itemsize].view(dt).reshape(shape)

    def write_host(self, offset: int, src: np.ndarray) -> None:
        flat = src.reshape(-1).view(np.uint8)
        self.memory[offset : offset + flat.size] = flat

    write_device = write_host

    def read_host(self, offset: int, size: int) -> np.ndarray:
        return self.memory[offset : offset + size]

    def write_host_many(self, pieces: Sequence[tuple[int, np.ndarray]]) -> None:
        host_copy([(self.memory[off : off + src.size], src) for off, src in pieces])

    def read_host_many(self, pieces: Sequence[tuple[np.ndarray, int]]) -> None:
        host_copy([(dst, self.memory[off : off + dst.size]) for dst, off in pieces])


class _CudaBlock(Block):
    def __init__(self, backend: CudaBackend, nbytes: int, memptr: Any = None):
        cp = backend.xp
        self.backend = backend
        self.nbytes = nbytes
        if memptr is not None:  # memory mapped from elsewhere (IPC); memptr's owner keeps the mapping
            self.memptr = memptr
            self.ptr = int(memptr.ptr)
            return
        with backend.activate():
            try:
                self.memptr = cp.cuda.alloc(nbytes)
            except cp.cuda.memory.OutOfMemoryError:
                # Blocks cached by CuPy's pool may be what is missing; give them back and try once more.
                cp.get_default_memory_pool().free_all_blocks()
                try:
                    self.memptr = cp.cuda.alloc(nbytes)
                except cp.cuda.memory.OutOfMemoryError:
                    free, total = cp.cuda.runtime.memGetInfo()
                    raise OutOfMemoryError(
                        f"cannot allocate {nbytes:,} bytes on {backend.device} for a table "
                        f"({free:,} of {total:,} bytes free)"
                    ) from None
        self.ptr = int(self.memptr.ptr)

    def array(self, offset: int, dtype: Any, shape: tuple[int, ...]) -> Any:
        return self.backend.xp.ndarray(shape, dtype=dtype, memptr=self.memptr + offset)

    def _copy(self, dst: int, src: int, size: int) -> None:
        if size:
            rt = self.backend.xp.cuda.runtime
            with self.backend.activate():
                # cudaMemcpyDefault: the driver tells host from device pointers (unified addressing).
                rt.memcpy(dst, src, size, rt.memcpyDefault)

    def write_host(self, offset: int, src: np.ndarray) -> None:
        src = np.ascontiguousarray(src)
        self._copy(self.ptr + offset, src.ctypes.data, src.nbytes)

    def write_device(self, offset: int, src: Any) -> None:
        src = self.backend.xp.ascontiguousarray(src)
        self._copy(self.ptr + offset, int(src.data.ptr), src.nbytes)

    def read_host(self, offset: int, size: int) -> np.ndarray:
        out = np.empty(size, dtype=np.uint8)
        self._copy(out.ctypes.data, self.ptr + offset, size)
        return out

    def write_host_many(self, pieces: Sequence[tuple[int, np.ndarray]]) -> None:
        self.backend.transfer.to_device([(self.ptr + off, src) for off, src in pieces])

    def read_host_many(self, pieces: Sequence[tuple[np.ndarray, int]]) -> None:
        self.backend.transfer.to_host([(dst, self.ptr + off) for dst, off in pieces])


class Backend:
    """A device: ``cpu`` or ``cuda:N``."""

    device: str
    kind: str  # "cpu" or "cuda"
    ordinal: int  # -1 on the CPU
    xp: Any  # numpy or cupy

    def allocate(self, nbytes: int) -> Block:
        raise NotImplementedError

    def wrap(self, memory: Any, nbytes: int) -> Block:
        """A Block over memory that exists already (an IPC mapping): a uint8 NumPy array on the CPU,
        a CuPy ``MemoryPointer`` on a GPU. The memory's owner object keeps it alive."""
        raise NotImplementedError

    def activate(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def from_host(self, array: np.ndarray) -> Any:
        return np.asarray(array)

    def synchronize(self) -> None:
        pass

    def array_ptr(self, array: Any) -> int:
        """Address of an array's first element."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<pystrom backend {self.device}>"


class CpuBackend(Backend):
    device = "cpu"
    kind = "cpu"
    ordinal = -1
    xp = np

    def allocate(self, nbytes: int) -> Block:
        return _HostBlock(self, nbytes)

    def wrap(self, memory: np.ndarray, nbytes: int) -> Block:
        return _HostBlock(self, nbytes, memory)

    def array_ptr(self, array: np.ndarray) -> int:
        return int(array.ctypes.data)


class CudaBackend(Backend):
    kind = "cuda"

    def __init__(self, ordinal: int):
        import cupy

        self.xp = cupy
        self.ordinal = ordinal
        self.device = f"cuda:{ordinal}"

    def allocate(self, nbytes: int) -> Block:
        return _CudaBlock(self, nbytes)

    def wrap(self, memory: Any, nbytes: int) -> Block:
        return _CudaBlock(self, nbytes, memory)

    def activate(self) -> contextlib.AbstractContextManager:
        return self.xp.cuda.Device(self.ordinal)

    def to_host(self, array: Any) -> np.ndarray:
        with self.activate():
            return self.xp.asnumpy(array)

    def from_host(self, array: np.ndarray) -> Any:
        with self.activate():
            return self.xp.asarray(array)

    def synchronize(self) -> None:
        with self.activate():
            self.xp.cuda.get_current_stream().synchronize()

    def array_ptr(self, array: Any) -> int:
        return int(array.data.ptr)

    @functools.cached_property
    def transfer(self) -> DeviceTransfer:
        return DeviceTransfer(self)

    @functools.cached_property
    def name(self) -> str:
        props = self.xp.cuda.runtime.getDeviceProperties(self.ordinal)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)


_CPU = CpuBackend()


@functools.cache
def _cuda_backend(ordinal: int) -> CudaBackend:
    return CudaBackend(ordinal)


def no_gpu_reason() -> str:
    if importlib.util.find_spec("cupy") is None:
        from .._dist import install_hint

        return f"CuPy is not installed ({install_hint('cuda13', 'cuda12')})"
    return "no CUDA GPU is visible to this process"


def resolve_device(device: str | int | Backend | None = None) -> Backend:
    """Turn what a user passed as ``device=`` into a Backend.

    ``None`` means ``pystrom.defaults.device``, and when that is unset too: the current GPU if one is
    visible, else the CPU. Accepted: ``"cpu"``, ``"cuda"`` (the current GPU), ``"cuda:N"``, an int N.
    """
    if isinstance(device, Backend):
        return device
    if device is None:
        device = defaults.device
        if device is None:
            return _current_cuda() if cuda_device_count() > 0 else _CPU
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise DeviceError(f"device must be a string such as 'cpu', 'cuda' or 'cuda:0', or an int; got {device!r}")
    if isinstance(device, int):
        kind, ordinal = "cuda", device
        if ordinal < 0:
            raise DeviceError(f"device {device!r}: a GPU ordinal cannot be negative")
    else:
        match = _DEVICE_RE.match(device.strip().lower())
        if match is None:
            raise DeviceError(f"device {device!r} makes no sense: use 'cpu', 'cuda' or 'cuda:N'")
        kind = "cuda" if match.group(1) in ("cuda", "gpu") else "cpu"
        ordinal = int(match.group(2)) if match.group(2) is not None else None
        if kind == "cpu":
            if ordinal not in (None, 0):
                raise DeviceError(f"device {device!r} makes no sense: there is one CPU device, 'cpu'")
            return _CPU
    count = cuda_device_count()
    if count == 0:
        if importlib.util.find_spec("cupy") is None:
            from .._dist import missing

            raise missing("cupy", f"device {device!r}", error=_NoCupyError, advice="or use device='cpu'")
        raise DeviceError(f"device {device!r} was requested but {no_gpu_reason()}; use device='cpu'")
    if ordinal is None:
        return _current_cuda()
    if ordinal >= count:
        raise DeviceError(
            f"device {device!r} does not exist: {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})"
        )
    return _cuda_backend(ordinal)


def _current_cuda() -> CudaBackend:
    import cupy

    return _cuda_backend(int(cupy.cuda.runtime.getDevice()))


def backend_of_array(array: Any) -> Backend | None:
    """The backend an array lives on: CPU for NumPy, its GPU for CuPy; None for anything else."""
    if isinstance(array, np.ndarray):
        return _CPU
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(array, cupy.ndarray):
        return _cuda_backend(int(array.device.id))
    return None


def iter_devices() -> Iterator[str]:
    """Every device string usable here, CPU first."""
    yield "cpu"
    for i in range(cuda_device_count()):
        yield f"cuda:{i}"


def stream_group_bytes(backend: Backend) -> int:
    """Bytes a streaming read (scan_arrow, scan_postgres) gathers into one Table by default: 1 GiB
    (the measured sweep is in io/arrow/scan/scan.py), at most 1/32 of the device's or host's memory since a
    pass holds about four groups, at least 64 MiB."""
    if backend.kind == "cpu":
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    else:
        with backend.activate():
            total = backend.xp.cuda.runtime.memGetInfo()[1]
    return max(64 << 20, min(1 << 30, total // 32))
