"""Host tables to a GPU for a streamed fit: pinned once per fit, one async copy a batch, reused buffers.

An out-of-core fit reads every batch once a pass, some twenty passes, so the host->device copies are
the fit's cost. Copying a host table with ``Table.to`` goes column by column from pageable memory:
about half the rate of a copy from pinned memory, and each copy holds the host until it is done.
Here, for a fit whose scan yields host (CPU) Tables while the model lives on a GPU:

- a list (or tuple) of Tables holds its tables for the whole fit, so each table's allocation is
  registered with CUDA (page-locked) the first time a pass meets it and unregistered when the fit
  ends (:meth:`HostStaging.close`, also after an error). Memory that cannot be registered, and the
  tables of other re-iterables (fresh tables every pass, which nothing may keep pinned), go through
  two reused pinned bounce buffers instead: a host copy into one, then the DMA from it;
- a batch's used bytes go to the GPU in one asynchronous copy (a whole table: the span of the used
  columns' buffers; a slice: one copy per buffer) on a copy stream, into one of two device buffers
  allocated once per fit (grown when a larger batch comes);
- the batch's device Table is a view of that buffer laid out as the host table (same column plans;
  a slice gets a compact plan of its rows), so ``prepare`` (features, target, NULLs, validation) runs
  on it unchanged, on the compute stream;
- events order the streams without host waits: the pass over batch k waits for its copy, the copy
  into a buffer waits for the pass that last read it, so the copy of batch k+1 runs during the pass
  over batch k. The host waits only before refilling a bounce buffer whose DMA is still in flight.

The device-side steps go through a small ``ops`` object (:class:`CudaOps` on a GPU), so the pipeline
itself runs on the CPU in tests with a stand-in that defers its copies as a slow copy engine would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .._types import Layout
from ..memory.layout import ColumnPlan, Span, align
from ..memory.transfer import host_copy

__all__ = ["HostStaging", "CudaOps", "batch_layout", "host_staging", "registered_ranges", "staging_stats"]

_lock = threading.Lock()
_registered = 0  # host ranges registered by stagers and not yet unregistered (read by the tests)
_last_stats: dict[str, float] = {}


def registered_ranges() -> int:
    """Host ranges registered (page-locked) by streamed fits and not yet unregistered: 0 between fits."""
    return _registered


def staging_stats() -> dict[str, float]:
    """What the last closed stager did: bytes registered and seconds spent (un)registering, bytes
    copied directly and through bounce buffers, copies queued (for the benchmark's report)."""
    return dict(_last_stats)


def _count(delta: int) -> None:
    global _registered
    with _lock:
        _registered += delta


_FIXED = (Layout.FIXED, Layout.BOOL, Layout.BYTES)


@dataclasses.dataclass
class _Layout:
    """Where a batch's bytes go: ``pieces`` (host offset, device offset, size) and the device columns."""

    pieces: list[tuple[int, int, int]]
    size: int  # device bytes the view needs
    columns: list[tuple[ColumnPlan, int, int, int | None]]  # (plan, row offset, rows, null count)


def batch_layout(table: Any, names: Sequence[str] | None) -> _Layout | None:
    """The device layout of ``table``'s columns ``names`` (None: all), or None where it cannot be
    staged (a slice with a column that is not fixed-width). Raises ColumnNotFoundError as ``column``."""
    cols = [table.column(n) for n in (dict.fromkeys(names) if names is not None else table.column_names)]
    if all(c.offset == 0 and len(c) == c._plan.length for c in cols):  # whole columns: one span, same plans
        spans = [s for c in cols for s in _spans(c._plan) if s.size]
        lo = min((s.offset for s in spans), default=0)
        hi = max((s.offset + s.size for s in spans), default=0)
        pieces = [(lo, lo, hi - lo)] if hi > lo else []
        return _Layout(pieces, hi, [(c._plan, 0, len(c), c.null_count) for c in cols])
    if any(c._plan.type.layout not in _FIXED for c in cols):
        return None
    pieces, out, cursor = [], [], 0
    for c in cols:  # a slice: its rows of each buffer, compact; validity keeps its bit position
        plan, n = c._plan, len(c)
        r = c.offset % 8 if plan.validity is not None else 0
        first = c.offset - r
        width = plan.type.width
        values = Span(cursor, (n + r) * width)
        pieces.append((plan.values.offset + first * width, cursor, values.size))
        cursor += align(values.size)
        validity = None
        if plan.validity is not None:
            validity = Span(cursor, (n + r + 7) // 8)
            pieces.append((plan.validity.offset + first // 8, cursor, validity.size))
            cursor += align(validity.size)
        device_plan = dataclasses.replace(plan, length=n + r, values=values, validity=validity, data=None)
        out.append((device_plan, r, n, c.null_count))  # counted on the host: no device sync later
    return _Layout([p for p in pieces if p[2]], cursor, out)


def _spans(plan: ColumnPlan) -> list[Span]:
    return [s for s in (plan.values, plan.validity, plan.data, plan.child_validity) if s is not None]


@dataclasses.dataclass
class _Slot:
    copied: Any  # event: the copy into `device` is done
    consumed: Any  # event: the work that last read `device` is done
    device: Any = None
    size: int = 0
    bounce: np.ndarray | None = None
    busy: bool = False  # a copy was queued since the compute stream last waited for it


class CudaOps:
    """The device side of the pipeline on one GPU: a copy stream, a compute stream, events."""

    def __init__(self, backend: Any):
        cp = backend.xp
        self.cp = cp
        self.backend = backend
        self.rt = cp.cuda.runtime
        with backend.activate():
            self.copy_stream = cp.cuda.Stream(non_blocking=True)
            self.stream = cp.cuda.Stream(non_blocking=True)

    def compute_context(self) -> contextlib.AbstractContextManager:
        return self.stream

    def event(self) -> Any:
        with self.backend.activate():
            return self.cp.cuda.Event(disable_timing=True)

    def register(self, ptr: int, nbytes: int) -> bool:
        try:
            with self.backend.activate():
                self.rt.hostRegister(ptr, nbytes, 0)  # cudaHostRegisterDefault: portable and mapped (UVA)
        except self.rt.CUDARuntimeError:  # CuPy clears the error state before raising
            return False
        return True

    def unregister(self, ptr: int) -> None:
        with contextlib.suppress(self.rt.CUDARuntimeError):
            self.rt.hostUnregister(ptr)

    def device_buffer(self, nbytes: int) -> Any:
        with self.backend.activate(), self.stream:  # the compute stream's arena of CuPy's pool
            return self.cp.cuda.alloc(nbytes)

    def pinned_buffer(self, nbytes: int) -> np.ndarray:
        memory = self.cp.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(memory, dtype=np.uint8, count=nbytes)  # its base keeps the pinned memory

    def block(self, buffer: Any, nbytes: int) -> Any:
        return self.backend.wrap(buffer, nbytes)

    def queue_copy(self, slot: _Slot, pieces: Sequence[tuple[int, int, int]]) -> None:
        """(host address, device offset, size) pieces into ``slot.device``, after ``slot.consumed``."""
        with self.backend.activate():
            self.copy_stream.wait_event(slot.consumed)  # the pass that last read this buffer is done
            base = int(slot.device.ptr)
            for src, off, size in pieces:
                self.rt.memcpyAsync(base + off, src, size, self.rt.memcpyHostToDevice, self.copy_stream.ptr)
            slot.copied.record(self.copy_stream)

    def compute_after(self, event: Any) -> None:
        self.stream.wait_event(event)

    def compute_done(self, event: Any) -> None:
        event.record(self.stream)

    def host_wait(self, event: Any) -> None:
        event.synchronize()

    def synchronize(self) -> None:
        with self.backend.activate():
            self.copy_stream.synchronize()
            self.stream.synchronize()


class HostStaging:
    """Streams host Tables of a fit to the device (see the module's docstring); :meth:`close` ends it."""

    def __init__(self, backend: Any, columns: Sequence[str] | None, ops: Any = None):
        self.backend = backend
        self.columns = list(columns) if columns is not None else None
        self.ops = ops if ops is not None else CudaOps(backend)
        self.slots = [_Slot(self.ops.event(), self.ops.event()) for _ in range(2)]
        self._pinned: dict[tuple[int, int], Any] = {}  # (address, size) -> the memory kept alive, None: refused
        self._stats = {"registered_bytes": 0, "register_s": 0.0, "unregister_s": 0.0, "direct_bytes": 0,
                       "bounced_bytes": 0, "copies": 0}  # fmt: skip
        self._closed = False

    def compute_context(self) -> contextlib.AbstractContextManager:
        """The stream the passes run on (their kernels wait for the copies through events)."""
        return self.ops.compute_context()

    def stageable(self, item: Any) -> bool:
        from ..table import Table  # a leaf import: ml reads Tables

        return isinstance(item, Table) and not item.closed and item._backend.kind == "cpu"

    def batches(self, items: Iterable[Any], prepare: Callable[[Any], Any]) -> Iterator[Any]:
        """``prepare`` of each item's device view, in order; items that are not host Tables (or that
        cannot be staged) go to ``prepare`` as they are. A list or tuple's tables are registered."""
        if self._closed:
            raise RuntimeError("this staging pipeline is closed")
        keep = isinstance(items, (list, tuple))
        source = iter(items)
        if not keep:  # a scan: its next table is made on a worker thread while this one is copied
            from ._data import prefetch

            source = prefetch(items, _same, None)
        pending: tuple[_Slot, Any, _Layout] | None = None
        k = 0
        try:
            for item in source:
                layout = batch_layout(item, self.columns) if self.stageable(item) else None
                if layout is None:
                    if pending is not None:
                        yield from self._deliver(*pending, prepare)
                        pending = None
                    yield prepare(item)
                    continue
                slot = self.slots[k % 2]
                k += 1
                self._queue(slot, item, layout, keep)  # batch k+1's copy is queued before batch k is handed over
                if pending is not None:
                    yield from self._deliver(*pending, prepare)
                pending = (slot, item, layout)
            if pending is not None:
                yield from self._deliver(*pending, prepare)
                pending = None
        finally:
            self._settle()
            if not keep:
                source.close()

    def _queue(self, slot: _Slot, table: Any, layout: _Layout, keep: bool) -> None:
        block = table._live()
        if slot.device is None or slot.size < layout.size:
            self.ops.host_wait(slot.consumed)  # the old buffer may still be read or written
            slot.device, slot.size = None, 0
            size = max(layout.size, 64)
            slot.device = self.ops.device_buffer(size)
            slot.size = size
        if not layout.pieces:
            slot.busy = True
            self.ops.queue_copy(slot, [])
            return
        moved = sum(size for _, _, size in layout.pieces)
        if keep and self._pin(block):
            pieces = [(block.ptr + src, dst, size) for src, dst, size in layout.pieces]
            self._stats["direct_bytes"] += moved
        else:
            self.ops.host_wait(slot.copied)  # the DMA out of this bounce buffer is done
            if slot.bounce is None or slot.bounce.size < slot.size:
                slot.bounce = None
                slot.bounce = self.ops.pinned_buffer(slot.size)
            host = block.read_host(0, block.nbytes)
            host_copy([(slot.bounce[dst : dst + size], host[src : src + size]) for src, dst, size in layout.pieces])
            lo = min(dst for _, dst, _ in layout.pieces)
            pieces = [(slot.bounce.ctypes.data + lo, lo, layout.size - lo)]
            self._stats["bounced_bytes"] += moved
        slot.busy = True
        self._stats["copies"] += len(pieces)
        self.ops.queue_copy(slot, pieces)

    def _pin(self, block: Any) -> bool:
        key = (block.ptr, block.nbytes)
        if key not in self._pinned:
            start = time.perf_counter()
            ok = block.nbytes > 0 and self.ops.register(block.ptr, block.nbytes)
            self._stats["register_s"] += time.perf_counter() - start
            self._pinned[key] = block.memory if ok else None  # registered memory must outlive the registration
            if ok:
                _count(1)
                self._stats["registered_bytes"] += block.nbytes
        return self._pinned[key] is not None

    def _deliver(self, slot: _Slot, table: Any, layout: _Layout, prepare: Callable[[Any], Any]) -> Iterator[Any]:
        """Hand over the batch in ``slot`` once its copy is done (on the compute stream); the buffer counts
        as read once the consumer's pass, queued before it asks for the next batch, is done."""
        from ..column import Column  # leaf imports: ml reads Tables
        from ..table import Table

        self.ops.compute_after(slot.copied)
        slot.busy = False
        block = self.ops.block(slot.device, slot.size)
        cols = [Column._view(block, plan, off, n, nulls) for plan, off, n, nulls in layout.columns]
        schema = table.schema if self.columns is None else _select_schema(table.schema, [c.name for c in cols])
        batch = prepare(Table._from_columns(block, schema, cols, table.num_rows))
        del cols, block
        yield batch
        del batch
        self.ops.compute_done(slot.consumed)

    def _settle(self) -> None:
        """At the end of a pass (or when it stops early): each buffer counts as read once everything
        queued on the compute stream is done, copies never waited for included."""
        for slot in self.slots:
            if slot.busy:
                self.ops.compute_after(slot.copied)
                slot.busy = False
            self.ops.compute_done(slot.consumed)

    def close(self) -> None:
        """Wait for the streams, unregister every registered range, let the buffers go (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.ops.synchronize()
        finally:
            start = time.perf_counter()
            for (ptr, _), memory in self._pinned.items():
                if memory is not None:
                    self.ops.unregister(ptr)
                    _count(-1)
            self._stats["unregister_s"] += time.perf_counter() - start
            self._pinned.clear()
            for slot in self.slots:
                slot.device = slot.bounce = None
                slot.size = 0
            _last_stats.clear()
            _last_stats.update(self._stats)


def _select_schema(schema: Any, names: list[str]) -> Any:
    import pyarrow as pa

    return pa.schema([schema.field(n) for n in names], metadata=schema.metadata)


def _same(item: Any) -> Any:
    return item


def host_staging(backend: Any, first: Any, columns: Sequence[str] | None) -> HostStaging | None:
    """A staging pipeline for a fit on ``backend`` whose scan starts with ``first``, or None where the
    scan's batches do not come from the host or the fit is not on a GPU (they stream as before)."""
    from ..table import Table

    if backend.kind != "cuda" or not isinstance(first, Table) or first._backend.kind != "cpu":
        return None
    return HostStaging(backend, columns)
