"""Bulk copies between pageable host memory and a GPU, and parallel copies on the host.

A plain ``cudaMemcpy`` from pageable memory runs at a fraction of the bus speed (the driver stages
through its own small pinned buffer, one piece at a time). Here several threads each own two pinned
staging slots and a stream: a thread copies host bytes into one slot while the DMA of its other
slot is in flight, so host-side copies run in parallel and overlap with the transfers. Pieces are
cut into chunks of ``defaults.staging_chunk`` bytes and dealt round-robin to the threads.

Host copies release the GIL (NumPy's copy loops do), which is what lets the threads run at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .._pools import SharedPool, run_all
from .._settings import defaults

if TYPE_CHECKING:
    from .backend import CudaBackend

__all__ = ["host_copy", "DeviceTransfer"]

# Below this many bytes in total, threads and staging cost more than they save.
_SMALL = 1 << 20


def worker_threads() -> int:
    """Threads for host copies and CPU decoding (``pystrom.defaults.copy_threads``, bounded by the cores)."""
    wanted = defaults.copy_threads
    return wanted if wanted else max(1, min(8, os.cpu_count() or 1))


_copiers = SharedPool("pystrom-copy", worker_threads)


def _executor() -> ThreadPoolExecutor:
    return _copiers.get()


def _chunks(pieces: Sequence[tuple[Any, Any, int]], chunk: int) -> list[tuple[Any, Any, int, int]]:
    """Cut (dst, src, size) pieces into (dst, src, start, size) chunks of at most ``chunk`` bytes."""
    out = []
    for dst, src, size in pieces:
        for start in range(0, size, chunk):
            out.append((dst, src, start, min(chunk, size - start)))
    return out


def _deal(items: list, n: int) -> list[list]:
    return [items[i::n] for i in range(n) if items[i::n]]


def host_copy(pieces: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    """Copy each ``src`` into ``dst`` (1-D uint8 arrays of equal size), in parallel when large."""
    work = [(d, s, d.size) for d, s in pieces if d.size]
    total = sum(size for _, _, size in work)
    if total < _SMALL or worker_threads() == 1:
        for d, s, _ in work:
            d[:] = s
        return
    chunks = _chunks(work, defaults.staging_chunk)

    def run(batch: list) -> None:
        for d, s, start, size in batch:
            d[start : start + size] = s[start : start + size]

    run_all(_executor(), run, _deal(chunks, worker_threads()))


class DeviceTransfer:
    """Pinned staging slots and streams of one GPU; made once per device and reused."""

    def __init__(self, backend: CudaBackend):
        self.backend = backend
        self._lock = threading.Lock()  # one bulk transfer at a time uses the slots
        self._lanes: list[Any] = []
        self._chunk = 0

    def _lanes_for(self, n: int, chunk: int) -> list[Any]:
        if len(self._lanes) != n or self._chunk != chunk:
            cp = self.backend.xp
            with self.backend.activate():
                self._lanes = []
                for _ in range(n):
                    memory = cp.cuda.alloc_pinned_memory(2 * chunk)
                    host = np.frombuffer(memory, dtype=np.uint8, count=2 * chunk)
                    slots = (host[:chunk], host[chunk:])
                    stream = cp.cuda.Stream(non_blocking=True)
                    events = (cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True))
                    self._lanes.append((memory, slots, stream, events))
            self._chunk = chunk
        return self._lanes

    def _run(self, work: list[tuple[Any, Any, int]], direct: Any, job: Any) -> None:
        """Copy ``(dst, src, size)`` pieces: ``direct`` one by one when small, else ``job`` per lane."""
        self.backend.synchronize()  # work queued on the current stream may still use these bytes
        if sum(size for _, _, size in work) < _SMALL:
            with self.backend.activate():
                for piece in work:
                    direct(*piece)
            return
        chunk = defaults.staging_chunk
        chunks = _chunks(work, chunk)
        n = min(worker_threads(), len(chunks))
        with self._lock:
            lanes = self._lanes_for(worker_threads(), chunk)
            run_all(_executor(), job, lanes[:n], _deal(chunks, n))

    def to_device(self, pieces: Sequence[tuple[int, np.ndarray]]) -> None:
        """Copy host uint8 arrays to device addresses: ``[(device_address, host_bytes), ...]``."""
        rt = self.backend.xp.cuda.runtime
        ordinal = self.backend.ordinal

        def direct(dst: int, src: np.ndarray, size: int) -> None:
            rt.memcpy(dst, src.ctypes.data, size, rt.memcpyHostToDevice)

        def job(lane: Any, batch: list) -> None:
            _, slots, stream, events = lane
            rt.setDevice(ordinal)
            for k, (dst, src, start, size) in enumerate(batch):
                i = k % 2
                events[i].synchronize()  # the slot's previous transfer is done
                slot = slots[i][:size]
                slot[:] = src[start : start + size]
                rt.memcpyAsync(dst + start, slot.ctypes.data, size, rt.memcpyHostToDevice, stream.ptr)
                events[i].record(stream)
            stream.synchronize()

        self._run([(dst, src, src.size) for dst, src in pieces if src.size], direct, job)

    def to_host(self, pieces: Sequence[tuple[np.ndarray, int]]) -> None:
        """Copy device bytes into host uint8 arrays: ``[(host_destination, device_address), ...]``."""
        rt = self.backend.xp.cuda.runtime
        ordinal = self.backend.ordinal

        def direct(dst: np.ndarray, src: int, size: int) -> None:
            rt.memcpy(dst.ctypes.data, src, size, rt.memcpyDeviceToHost)

        def job(lane: Any, batch: list) -> None:
            _, slots, stream, events = lane
            rt.setDevice(ordinal)

            def issue(k: int) -> None:
                _, src, start, size = batch[k]
                rt.memcpyAsync(slots[k % 2].ctypes.data, src + start, size, rt.memcpyDeviceToHost, stream.ptr)
                events[k % 2].record(stream)

            issue(0)
            for k, (dst, _, start, size) in enumerate(batch):
                if k + 1 < len(batch):
                    issue(k + 1)  # the next DMA runs while this slot is copied out
                events[k % 2].synchronize()
                dst[start : start + size] = slots[k % 2][:size]

        self._run([(dst, src, dst.size) for dst, src in pieces if dst.size], direct, job)
