"""Assemble a Table: plan the layout, allocate once, copy every column into place.

Sources are host Arrow chunks (from pyarrow, NumPy, lists) or device arrays (CuPy and anything with
``__cuda_array_interface__``). On the CPU backend host bytes are written straight into the table's
memory; on a GPU, buffers that need no change (values, string bytes) are copied from pyarrow's memory
to the device as they are, and the few that need work (booleans unpacked to bytes, validity bitmaps
re-aligned across chunks, string offsets rebased) are prepared on the host first.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .._types import ColumnType, Layout
from ..memory.backend import Backend, Block
from ..memory.layout import ColumnPlan, ColumnSpec, TablePlan, plan_table
from ..table import Table
from .lists import BufferColumn

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["HostColumn", "DeviceColumn", "build_table", "build_table_in_place"]


@dataclass
class HostColumn:
    field: pa.Field  # output field (logical type, nullability, metadata)
    type: ColumnType
    chunks: list  # storage-level pyarrow arrays
    length: int
    null_count: int
    data_size: int
    child_null_count: int = 0
    child_chunks: list | None = None  # list columns: each chunk's child values (storage arrays), sliced to its rows
    children: list[HostColumn] | None = None  # struct and list<C> columns: their child columns, prepared alike

    def spec(self) -> ColumnSpec:
        children = tuple(c.spec() for c in self.children) if self.children else ()
        return ColumnSpec(
            self.field.name, self.type, self.length, self.null_count, self.data_size, self.child_null_count, children
        )


@dataclass
class DeviceColumn:
    field: pa.Field
    type: ColumnType
    array: Any  # 1-D contiguous CuPy array, no NULLs

    def spec(self) -> ColumnSpec:
        return ColumnSpec(self.field.name, self.type, int(self.array.shape[0]), 0, 0)


class _Writer:
    """Host-side writes into a block. Small prepared buffers are written in place on the CPU and
    staged on a GPU; all plain copies are collected and run together by :meth:`flush`, which
    spreads them over threads (and pinned staging on a GPU)."""

    def __init__(self, block: Block):
        self.block = block
        self.in_place = block.backend.kind == "cpu"
        self.pending: list[tuple[int, np.ndarray]] = []

    @contextlib.contextmanager
    def region(self, offset: int, size: int) -> Iterator[np.ndarray]:
        if self.in_place:
            yield self.block.read_host(offset, size)  # a writable view of the block on the CPU
        else:
            staged = np.empty(size, dtype=np.uint8)
            yield staged
            self.pending.append((offset, staged))

    def copy(self, offset: int, src: np.ndarray) -> None:
        if src.size:
            self.pending.append((offset, src))

    def flush(self) -> None:
        self.block.write_host_many(self.pending)
        self.pending = []


def _bytes(buf: pa.Buffer, start: int, size: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8, count=size, offset=start)


def _fill_values(w: _Writer, offset: int, layout: str, width: int, chunks: list) -> None:
    """Copy the values of primitive chunks one after another from ``offset`` (booleans unpacked to bytes)."""
    if layout == Layout.BOOL:
        with w.region(offset, sum(len(c) for c in chunks)) as dst:
            pos = 0
            for c in chunks:
                n = len(c)
                _core.unpack_bits(c.buffers()[1], c.offset, dst[pos : pos + n], n)
                pos += n
        return
    pos = 0
    for c in chunks:
        n = len(c)
        w.copy(offset + pos * width, _bytes(c.buffers()[1], c.offset * width, n * width))
        pos += n


def _fill_validity(w: _Writer, span: Any, chunks: list) -> None:
    with w.region(span.offset, span.size) as dst:
        dst[:] = 0xFF  # chunks without a bitmap are all valid
        pos = 0
        for c in chunks:
            n = len(c)
            bitmap = c.buffers()[0]
            if bitmap is not None and c.null_count:
                _core.copy_bits(bitmap, c.offset, dst, pos, n)
            pos += n


def _fill_host(w: _Writer, plan: ColumnPlan, col: HostColumn) -> None:
    layout, width = col.type.layout, col.type.width
    chunks = [c for c in col.chunks if len(c)]
    if layout in Layout.COMPOSED:
        if layout == Layout.LIST_OF:
            _fill_offsets(w, plan.values, col.chunks, [len(c) for c in col.children[0].chunks])
        for child_plan, child in zip(plan.children, col.children):
            _fill_host(w, child_plan, child)
    elif layout in (Layout.FIXED, Layout.BYTES, Layout.BOOL):
        _fill_values(w, plan.values.offset, layout, width, chunks)
    elif layout in Layout.NESTED:
        children = [c for c in col.child_chunks if len(c)]
        child_layout = Layout.BOOL if col.type.storage == np.bool_ else Layout.FIXED
        target = plan.values.offset if layout == Layout.FIXED_LIST else plan.data.offset
        _fill_values(w, target, child_layout, col.type.storage.itemsize, children)
        if plan.child_validity is not None:
            _fill_validity(w, plan.child_validity, children)
        if layout == Layout.LIST:  # offsets rebased onto the one child buffer
            _fill_offsets(w, plan.values, col.chunks, [len(c) for c in col.child_chunks])
    else:  # VARBINARY: rebase each chunk's offsets onto one data buffer
        with w.region(plan.values.offset, plan.values.size) as dst:
            offsets = dst.view(np.int32)
            offsets[0] = 0
            pos = data_pos = 0
            for c in chunks:
                n = len(c)
                bufs = c.buffers()
                src = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=c.offset * 4)
                nbytes = int(src[-1] - src[0])
                offsets[pos : pos + n + 1] = src - src[0] + data_pos
                if nbytes:
                    w.copy(plan.data.offset + data_pos, _bytes(bufs[2], int(src[0]), nbytes))
                pos += n
                data_pos += nbytes
    if plan.validity is not None:
        _fill_validity(w, plan.validity, chunks)


def _fill_offsets(w: _Writer, span: Any, chunks: list, elements: list[int]) -> None:
    """A list column's offsets, each chunk's rebased onto the one child (chunk i has ``elements[i]``)."""
    with w.region(span.offset, span.size) as dst:
        offsets = dst.view(np.int32)
        offsets[0] = 0
        pos = base = 0
        for c, count in zip(chunks, elements):
            if not len(c):
                continue
            n = len(c)
            src = np.frombuffer(c.buffers()[1], dtype=np.int32, count=n + 1, offset=c.offset * 4)
            offsets[pos : pos + n + 1] = src - src[0] + base
            pos += n
            base += count


def _fill_device(block: Block, plan: ColumnPlan, col: DeviceColumn) -> None:
    if plan.length == 0:
        return
    if block.backend.kind == "cpu":
        import cupy

        block.write_host(plan.values.offset, cupy.asnumpy(col.array))
    else:
        block.write_device(plan.values.offset, col.array)


def build_table(
    backend: Backend,
    columns: Sequence[HostColumn | DeviceColumn | BufferColumn],
    metadata: Any = None,
    num_rows: int | None = None,
    allocate: Callable[[int], Block] | None = None,
) -> Table:
    """Allocate one block for ``columns`` on ``backend``, fill it and wrap it as a Table.

    ``allocate(nbytes)`` replaces ``backend.allocate``: the store uses it to build a table straight
    into daemon-owned memory (``Store.put_arrow``; loaders can pass it the same way).
    """
    plan = plan_table([c.spec() for c in columns])
    block = (allocate or backend.allocate)(plan.nbytes)
    writer = _Writer(block)
    for col_plan, col in zip(plan.columns, columns):
        if isinstance(col, HostColumn):
            _fill_host(writer, col_plan, col)
        elif isinstance(col, BufferColumn):
            col.fill(block, col_plan)
        else:
            _fill_device(block, col_plan, col)
    writer.flush()
    if num_rows is None:  # a table without columns still has a row count when it comes from Arrow
        num_rows = plan.columns[0].length if plan.columns else 0
    return _wrap(block, plan, [c.field for c in columns], metadata, num_rows)


def build_table_in_place(
    backend: Backend,
    fields: Sequence[pa.Field],
    specs: Sequence[ColumnSpec],
    fill: Callable[[Block, TablePlan], None],
    num_rows: int,
    metadata: Any = None,
    allocate: Callable[[int], Block] | None = None,
) -> Table:
    """Allocate one block for columns known only by their specs, let ``fill(block, plan)`` write every
    buffer (producers that decode straight into place, like the PostgreSQL loader), wrap it.

    If ``fill`` raises, the block is dropped with it: nothing stays allocated.
    """
    plan = plan_table(specs)
    block = (allocate or backend.allocate)(plan.nbytes)
    try:
        fill(block, plan)
    except BaseException as exc:
        # The traceback's frames hold views of the block (and scratch device arrays): clear their
        # locals so the memory goes back now, not when the caller drops the exception.
        traceback.clear_frames(exc.__traceback__)
        del block
        raise
    return _wrap(block, plan, fields, metadata, num_rows)


def _wrap(block: Block, plan: TablePlan, fields: Sequence[pa.Field], metadata: Any, num_rows: int) -> Table:
    import pyarrow as pa

    return Table._wrap(block, plan, pa.schema(list(fields), metadata=metadata), num_rows)
