"""Where each buffer of a table sits inside its one allocation.

The plan is pure arithmetic, shared by every producer of tables (Arrow import, filters, the loaders)
and by the IPC handle, which records it. Order inside the allocation:

1. the values buffer of every column, in column order (for strings: the int32 offsets),
2. the validity bitmaps of the columns that have NULLs,
3. the data bytes of string/binary columns.

Values come first and together so that adjacent fixed-width columns of one dtype sit at a constant
stride: ``Table.to_array`` then returns them as a zero-copy 2-D view. Every buffer starts on a
64-byte boundary (Arrow's recommendation, and enough for any vector load).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._types import ColumnType, Layout

__all__ = ["ALIGNMENT", "Span", "ColumnPlan", "ColumnSpec", "TablePlan", "plan_table", "align"]

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
    data_size: int = 0  # string/binary bytes; 0 for other layouts


@dataclass(frozen=True)
class ColumnPlan:
    """A column's buffers inside the allocation (base column: offset 0, full length)."""

    name: str
    type: ColumnType
    length: int
    null_count: int
    values: Span  # values, or int32 offsets (length + 1) for strings
    validity: Span | None  # LSB bitmap, only when null_count > 0
    data: Span | None  # string bytes, only for VARBINARY


@dataclass(frozen=True)
class TablePlan:
    columns: tuple[ColumnPlan, ...]
    nbytes: int


def values_size(spec: ColumnSpec) -> int:
    if spec.type.layout == Layout.VARBINARY:
        return (spec.length + 1) * 4
    return spec.length * spec.type.width


def plan_table(specs: Sequence[ColumnSpec]) -> TablePlan:
    """Lay out the columns' buffers; the allocation needs ``nbytes`` bytes (at least one alignment unit)."""
    cursor = 0

    def take(size: int) -> Span:
        nonlocal cursor
        span = Span(cursor, size)
        cursor += align(size)
        return span

    values = [take(values_size(s)) for s in specs]
    validity = [take((s.length + 7) // 8) if s.null_count > 0 else None for s in specs]
    data = [take(s.data_size) if s.type.layout == Layout.VARBINARY else None for s in specs]
    columns = tuple(
        ColumnPlan(s.name, s.type, s.length, s.null_count, v, m, d) for s, v, m, d in zip(specs, values, validity, data)
    )
    return TablePlan(columns, max(cursor, ALIGNMENT))
