"""Where each buffer of a table sits inside its one allocation.

The plan is pure arithmetic, shared by every producer of tables (Arrow import, filters, the loaders)
and by the IPC handle, which records it. Order inside the allocation:

1. the values buffer of every column, in column order (for strings: the int32 offsets),
2. the validity bitmaps of the columns that have NULLs,
3. the data bytes of string/binary columns and the child values of list columns,
4. the child validity bitmaps of list columns whose elements have NULLs,
5. the child columns of struct and list<C> columns (``ColumnPlan.children``), each group of siblings
   laid out by these same rules, after every buffer of the level above.

A fixed_size_list column's values buffer is its child values (n * d of them); a list column's is its
int32 offsets and its child values are the data span (see :mod:`pystrom.interop.lists`).

Values come first and together so that adjacent fixed-width columns of one dtype sit at a constant
stride: ``Table.to_array`` then returns them as a zero-copy 2-D view. Every buffer starts on a
64-byte boundary (Arrow's recommendation, and enough for any vector load).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._types import ColumnType, Layout

__all__ = ["ALIGNMENT", "Span", "ColumnPlan", "ColumnSpec", "TablePlan", "plan_table", "align", "child_length"]

ALIGNMENT = 64


def align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass(frozen=True)
class Span:
    """A byte range inside the allocation."""

    offset: int
    size: int


@dataclass(frozen=True)
class ColumnSpec:
    """What a producer knows about a column before allocating: enough to plan its buffers."""

    name: str
    type: ColumnType
    length: int
    null_count: int
    data_size: int = 0  # string/binary bytes, list<T> child value bytes; 0 for other layouts
    child_null_count: int = 0  # NULL elements of a list column (a child bitmap is planned when > 0)
    children: tuple[ColumnSpec, ...] = ()  # struct: one per field (length: the struct's); list<C>: its elements


@dataclass(frozen=True)
class ColumnPlan:
    """A column's buffers inside the allocation (base column: offset 0, full length)."""

    name: str
    type: ColumnType
    length: int
    null_count: int
    values: Span  # values, or int32 offsets (length + 1) for strings
    validity: Span | None  # LSB bitmap, only when null_count > 0
    data: Span | None  # string bytes (VARBINARY), child values (LIST); None otherwise
    child_validity: Span | None = None  # LSB bitmap of a list column's elements, only when some are NULL
    child_null_count: int = 0
    children: tuple[ColumnPlan, ...] = ()  # struct and list<C> columns (Layout.COMPOSED): their child columns


@dataclass(frozen=True)
class TablePlan:
    columns: tuple[ColumnPlan, ...]
    nbytes: int


def values_size(spec: ColumnSpec) -> int:
    if spec.type.layout in (Layout.VARBINARY, Layout.LIST, Layout.LIST_OF):
        return (spec.length + 1) * 4
    if spec.type.layout == Layout.STRUCT:
        return 0
    return spec.length * spec.type.width


def child_length(spec: ColumnSpec | ColumnPlan) -> int:
    """Number of elements of a list column's child (0 for other layouts)."""
    ctype = spec.type
    if ctype.layout == Layout.FIXED_LIST:
        return spec.length * ctype.list_size
    if ctype.layout == Layout.LIST:
        size = spec.data_size if isinstance(spec, ColumnSpec) else spec.data.size
        return size // ctype.storage.itemsize
    return 0


def plan_table(specs: Sequence[ColumnSpec]) -> TablePlan:
    """Lay out the columns' buffers; the allocation needs ``nbytes`` bytes (at least one alignment unit)."""
    columns, cursor = _plan_level(specs, 0)
    return TablePlan(columns, max(cursor, ALIGNMENT))


def _plan_level(specs: Sequence[ColumnSpec], cursor: int) -> tuple[tuple[ColumnPlan, ...], int]:
    """Plan sibling columns from ``cursor``, then their children (recursively); return the plans and the end."""

    def take(size: int) -> Span:
        nonlocal cursor
        span = Span(cursor, size)
        cursor += align(size)
        return span

    values = [take(values_size(s)) for s in specs]
    validity = [take((s.length + 7) // 8) if s.null_count > 0 else None for s in specs]
    data = [take(s.data_size) if s.type.layout in (Layout.VARBINARY, Layout.LIST) else None for s in specs]
    child = [take((child_length(s) + 7) // 8) if s.child_null_count > 0 else None for s in specs]
    children = []
    for s in specs:
        planned: tuple[ColumnPlan, ...] = ()
        if s.children:
            planned, cursor = _plan_level(s.children, cursor)
        children.append(planned)
    columns = tuple(
        ColumnPlan(s.name, s.type, s.length, s.null_count, v, m, d, c, s.child_null_count, k)
        for s, v, m, d, c, k in zip(specs, values, validity, data, child, children)
    )
    return columns, cursor
