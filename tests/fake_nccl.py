"""A stand-in for the part of CuPy and ``cupy.cuda.nccl`` that :class:`pystrom.dask._comm.NcclComm` uses, so
its code runs on the CPU with ranks as threads: device buffers are NumPy arrays found by fake addresses,
a stream is a list of pending operations, and ``allGather`` is asynchronous as NCCL's is (it returns at
once; the stream is done when every rank has contributed). Like the real thing, forming a communicator
blocks until all ranks joined and an all-gather never times out by itself; ``abort()`` ends what is in
flight. Reading a buffer while its stream still has work pending fails the test (the real copy would be
ordered after it: the code must have waited first).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import sys
import threading
import time
import types
from typing import Any

import numpy as np

NCCL_FLOAT64 = 8  # ncclFloat64
_ADDRESSES = itertools.count(0x10000, 0x1000)


class _Memory:
    def __init__(self) -> None:
        self.arrays: dict[int, np.ndarray] = {}
        self.streams: dict[int, FakeStream] = {}
        self.lock = threading.Lock()


_MEM = _Memory()


class FakeArray:
    def __init__(self, n: int, dtype: Any):
        self.a = np.zeros(n, dtype=dtype)
        self.size = n
        self.data = types.SimpleNamespace(ptr=next(_ADDRESSES))
        with _MEM.lock:
            _MEM.arrays[self.data.ptr] = self.a

    def set(self, host: np.ndarray, stream: Any = None) -> None:
        assert host.shape == self.a.shape and host.dtype == self.a.dtype
        self.a[...] = host

    def get(self, stream: Any = None, out: np.ndarray | None = None, blocking: bool = True) -> np.ndarray:
        if out is not None and blocking:  # CuPy 13+: the copy, then a wait for the whole stream (unbounded)
            stream.synchronize()
            out[...] = self.a
            return out
        assert stream is not None and stream.done, "a device buffer read while its stream's work was pending"
        return self.a.copy()


def _memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream_ptr: int) -> None:
    """``cudaMemcpyAsync`` between a fake device buffer and real (pinned) host memory: host to device at
    once (as a copy from pinned memory that nothing is reading yet), device to host queued behind the
    stream's work so far (made once that is done; never, if it never is)."""
    with _MEM.lock:
        stream = _MEM.streams[stream_ptr]
    if kind == _H2D:
        device = _MEM.arrays[dst]
        assert nbytes == device.nbytes
        device[...] = np.frombuffer((ctypes.c_char * nbytes).from_address(src), dtype=device.dtype)
        return
    assert kind == _D2H
    device = _MEM.arrays[src]
    assert nbytes == device.nbytes
    before, copied = list(stream.ops), threading.Event()

    def later() -> None:
        for op in before:
            if not op.wait(60):
                return
        ctypes.memmove(dst, device.ctypes.data, nbytes)
        copied.set()

    stream.ops.append(copied)
    threading.Thread(target=later, name="fake-copy", daemon=True).start()


_H2D, _D2H = 1, 2


class FakeStream:
    def __init__(self, non_blocking: bool = False):
        self.ptr = next(_ADDRESSES)
        self.ops: list[Any] = []
        with _MEM.lock:
            _MEM.streams[self.ptr] = self

    @property
    def done(self) -> bool:
        return all(op.is_set() for op in self.ops)

    def synchronize(self) -> None:
        end = time.monotonic() + 60
        while not self.done:
            assert time.monotonic() < end, "synchronize() on a stream whose work never ends"
            time.sleep(0.001)


class FakeDevice:
    def __init__(self, ordinal: int = 0):
        self.id = ordinal

    def __enter__(self) -> FakeDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Fabric:
    """The ranks of one unique id: who joined, and each exchange's contributions."""

    def __init__(self, world: int):
        self.world = world
        self.joined = 0
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.exchanges: dict[int, dict[int, tuple[np.ndarray, np.ndarray, threading.Event]]] = {}
        self.async_error: str | None = None


_FABRICS: dict[tuple, _Fabric] = {}
_FABRICS_LOCK = threading.Lock()
CREATED: list[FakeNcclCommunicator] = []  # every communicator formed, for the tests to inspect


class FakeNcclCommunicator:
    def __init__(self, ndev: int, commId: bytes, rank: int):
        if not isinstance(commId, bytes):
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(commId).__name__})")
        assert len(commId) == 128 and 0 <= rank < ndev
        with _FABRICS_LOCK:
            fabric = _FABRICS.setdefault(tuple(commId), _Fabric(ndev))
        with fabric.lock:
            fabric.joined += 1
            if fabric.joined == fabric.world:
                fabric.ready.set()
        if not fabric.ready.wait(120):  # the real one waits for ever; a test must not
            raise RuntimeError("fake NCCL: the other ranks never joined")
        self.fabric, self.rank, self.seq = fabric, rank, 0
        self.aborted = self.destroyed = False
        CREATED.append(self)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:  # noqa: N802
        assert not self.aborted and not self.destroyed
        assert datatype == NCCL_FLOAT64
        with _MEM.lock:
            send, recv, s = _MEM.arrays[sendbuf], _MEM.arrays[recvbuf], _MEM.streams[stream]
        assert send.size >= count and recv.size >= count * self.fabric.world
        self.seq += 1
        done = threading.Event()
        s.ops.append(done)
        fabric = self.fabric
        with fabric.lock:
            posted = fabric.exchanges.setdefault(self.seq, {})
            posted[self.rank] = (send[:count].copy(), recv, done)
            if len(posted) == fabric.world:
                rows = np.concatenate([posted[r][0] for r in range(fabric.world)])
                for _, out, event in posted.values():
                    out[: rows.size] = rows
                    event.set()
                del fabric.exchanges[self.seq]

    def check_async_error(self) -> None:
        if self.fabric.async_error:
            raise RuntimeError(self.fabric.async_error)

    def abort(self) -> None:
        self.aborted = True
        with self.fabric.lock:  # what this rank has in flight returns (as NCCL's kernels do on an abort)
            for posted in self.fabric.exchanges.values():
                if self.rank in posted:
                    posted[self.rank][2].set()

    def destroy(self) -> None:
        self.destroyed = True


def _unique_id() -> bytes:
    # CuPy 14's type (a tuple of ints before): the communicator takes exactly what this returned, so a rank
    # that converts it on the way (tuple(uid) broke CuPy 14 on the GPU machine) fails here too
    return np.random.default_rng().integers(0, 256, size=128, dtype=np.uint8).tobytes()


@contextlib.contextmanager
def installed():
    """Fake ``cupy``, ``cupy.cuda`` and ``cupy.cuda.nccl`` in sys.modules (restored afterwards)."""
    from pystrom.dask import _comm

    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    nccl.NCCL_FLOAT64 = NCCL_FLOAT64
    nccl.NcclCommunicator = FakeNcclCommunicator
    nccl.get_unique_id = _unique_id
    nccl.get_version = lambda: 22800
    cuda = types.ModuleType("cupy.cuda")
    cuda.Device, cuda.Stream, cuda.nccl = FakeDevice, FakeStream, nccl
    cuda.runtime = types.SimpleNamespace(memcpyAsync=_memcpy_async, memcpyHostToDevice=_H2D, memcpyDeviceToHost=_D2H)
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    cupy.empty = lambda n, dtype=np.float64: FakeArray(n, dtype)
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda n, dtype=np.float64: np.zeros(n, dtype=dtype)
    names = {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl, "cupyx": cupyx}
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules.update(names)
    _comm.nccl_module.cache_clear()
    try:
        yield nccl
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        _comm.nccl_module.cache_clear()
