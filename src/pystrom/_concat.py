"""Concatenate tables of one schema and one device into a new table (one allocation).

Used to collect a filtered scan into one Table. Everything stays on the tables' device: values,
string bytes and list elements are copied device-to-device, string and list offsets rebased, validity
(of rows and of list elements) re-packed (pieces rarely end on a multiple of 8 rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._types import Layout
from .errors import CapacityError, SchemaMismatchError
from .memory import bitmap
from .memory.layout import ColumnSpec, plan_table

if TYPE_CHECKING:
    from .table import Table

__all__ = ["concat"]

_INT32_MAX = 2**31 - 1


def concat(tables: Sequence[Table]) -> Table:
    """One table holding the rows of ``tables`` in order (same column names, types and device).

    Parameters
    ----------
    tables : sequence of Table
        At least one table; all with the same schema (names and types) on the same device.
    """
    from .table import Table  # up: concat builds a Table; table operations (fill_null) use concat

    tables = list(tables)
    if not tables:
        raise ValueError("concat needs at least one table")
    for t in tables:
        if not isinstance(t, Table):
            raise TypeError(f"concat takes pystrom Tables; got {type(t).__name__}")
    first = tables[0]
    for i, t in enumerate(tables[1:], 1):
        if t.device != first.device:
            raise SchemaMismatchError(f"table {i} is on {t.device}, table 0 on {first.device}; move them with .to()")
        if t.column_names != first.column_names or [f.type for f in t.schema] != [f.type for f in first.schema]:
            raise SchemaMismatchError(f"table {i} has schema {t.schema}, table 0 has {first.schema}")
    if len(tables) == 1:
        return first.select(first.column_names)  # a view: closing it leaves the input open
    backend = first._backend
    xp = backend.xp
    num_rows = sum(t.num_rows for t in tables)
    with backend.activate():
        specs = []
        edges: dict[str, list[tuple[int, int]]] = {}
        offsets: dict[str, list[Any]] = {}  # each table's offsets, checked copies where others may write them
        for name in first.column_names:
            cols = [t.column(name) for t in tables]
            ctype = cols[0].column_type
            data_size = child_nulls = 0
            if ctype.layout in (Layout.VARBINARY, Layout.LIST):
                offsets[name] = [c._offsets_in_bounds() for c in cols]
                edges[name] = [_edges(backend, o, len(c)) for o, c in zip(offsets[name], cols)]
                data_size = sum(b - a for a, b in edges[name])
                if data_size > _INT32_MAX:
                    raise CapacityError(f"column {name!r} would hold {data_size:,} bytes or elements; at most 2 GiB "
                                        "(2**31 - 1 elements) fit one column")  # fmt: skip
            if ctype.layout in Layout.NESTED:
                d = ctype.list_size
                spans = (
                    edges[name]
                    if ctype.layout == Layout.LIST
                    else [(c.offset * d, (c.offset + len(c)) * d) for c in cols]
                )
                edges[name] = spans
                child_nulls = sum(_element_nulls(backend, c, a, b) for c, (a, b) in zip(cols, spans))
                data_size *= ctype.storage.itemsize if ctype.layout == Layout.LIST else 0
            specs.append(ColumnSpec(name, ctype, num_rows, sum(c.null_count for c in cols), data_size, child_nulls))
        plan = plan_table(specs)
        block = backend.allocate(plan.nbytes)
        for col_plan in plan.columns:
            cols = [t.column(col_plan.name) for t in tables]
            layout = col_plan.type.layout
            pos = 0
            if layout in Layout.NESTED:
                _concat_elements(backend, block, col_plan, cols, edges[col_plan.name])
            if layout == Layout.VARBINARY:
                out_offsets = block.array(col_plan.values.offset, np.int32, (num_rows + 1,))
                data = block.array(col_plan.data.offset, np.uint8, (col_plan.data.size,))
                out_offsets[0] = 0
                base = 0
                for c, o, (a, b) in zip(cols, offsets[col_plan.name], edges[col_plan.name]):
                    n = len(c)
                    if n:
                        xp.subtract(o, np.int32(a - base), out=out_offsets[pos : pos + n + 1])
                        data[base : base + b - a] = c.data[a:b]
                    pos += n
                    base += b - a
            elif layout == Layout.LIST:
                out_offsets = block.array(col_plan.values.offset, np.int32, (num_rows + 1,))
                out_offsets[0] = 0
                base = 0
                for c, o, (a, b) in zip(cols, offsets[col_plan.name], edges[col_plan.name]):
                    if len(c):
                        xp.subtract(o, np.int32(a - base), out=out_offsets[pos : pos + len(c) + 1])
                    pos += len(c)
                    base += b - a
            elif layout != Layout.FIXED_LIST:  # its elements are its values, copied above
                width = col_plan.type.width
                values = block.array(col_plan.values.offset, np.uint8, (num_rows * width,))
                for c in cols:
                    n = len(c)
                    if n:
                        values[pos * width : (pos + n) * width] = _raw(c.values)
                    pos += n
            if col_plan.validity is not None:
                valid = xp.concatenate([c.is_valid().astype(np.uint8) for c in cols])
                out = block.array(col_plan.validity.offset, np.uint8, (col_plan.validity.size,))
                out[...] = bitmap.pack(backend, valid)
        backend.synchronize()
    return Table._wrap(block, plan, first.schema, num_rows)


def _element_nulls(backend: Any, column: Any, first: int, last: int) -> int:
    bits = column.child_validity
    if bits is None or last == first:
        return 0
    return (last - first) - bitmap.count_set(backend, bits, first, last - first)


def _concat_elements(backend: Any, block: Any, plan: Any, cols: Sequence[Any], spans: list[tuple[int, int]]) -> None:
    """A list column's elements (and their bitmap) for the rows of each table, one after the other;
    a list's elements go to its data span, a fixed_size_list's are its values."""
    xp = backend.xp
    ctype = plan.type
    span = plan.data if ctype.layout == Layout.LIST else plan.values
    total = sum(b - a for a, b in spans)
    out = block.array(span.offset, ctype.storage, (total,))
    pos = 0
    for c, (a, b) in zip(cols, spans):
        out[pos : pos + b - a] = c.child_values[a:b]
        pos += b - a
    if plan.child_validity is not None:
        valid = xp.concatenate(
            [xp.ones(0, dtype=bool)]
            + [
                xp.ones(b - a, dtype=bool)
                if c.child_validity is None
                else bitmap.unpack(backend, c.child_validity, a, b - a)
                for c, (a, b) in zip(cols, spans)
            ]
        )
        dst = block.array(plan.child_validity.offset, np.uint8, (plan.child_validity.size,))
        dst[...] = bitmap.pack(backend, valid)[: plan.child_validity.size]


def _edges(backend: Any, offs: Any, n: int) -> tuple[int, int]:
    if n == 0:
        return 0, 0
    pair = backend.to_host(offs[backend.from_host(np.array([0, n]))])
    return int(pair[0]), int(pair[1])


def _raw(values: Any) -> Any:
    return values.reshape(-1).view(np.uint8)
