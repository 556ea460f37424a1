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

    if isinstance(tables, Table):
        raise TypeError("concat takes a list of pystrom Tables; got one Table (pystrom.concat([a, b]))")
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
    num_rows = sum(t.num_rows for t in tables)
    with backend.activate():
        pieces = [[t.column(name) for t in tables] for name in first.column_names]
        prepared = [_prepare(backend, name, cols, num_rows) for name, cols in zip(first.column_names, pieces)]
        plan = plan_table([spec for spec, _ in prepared])
        block = backend.allocate(plan.nbytes)
        for col_plan, cols, (_, state) in zip(plan.columns, pieces, prepared):
            _fill(backend, block, col_plan, cols, state)
        backend.synchronize()
    return Table._wrap(block, plan, first.schema, num_rows)


def _prepare(backend: Any, name: str, cols: list, num_rows: int) -> tuple[ColumnSpec, tuple]:
    """The spec of the concatenation of ``cols`` and what :func:`_fill` needs: each piece's offsets
    (checked copies where others may write them) and element spans, and the same for child columns."""
    ctype = cols[0].column_type
    data_size = child_nulls = 0
    offsets = edges = None
    children: list[tuple[ColumnSpec, tuple]] = []
    if ctype.layout in (Layout.VARBINARY, Layout.LIST, Layout.LIST_OF):
        offsets = [c._offsets_in_bounds() for c in cols]
        edges = [_edges(backend, o, len(c)) for o, c in zip(offsets, cols)]
        data_size = sum(b - a for a, b in edges)
        if data_size > _INT32_MAX:
            raise CapacityError(f"column {name!r} would hold {data_size:,} bytes or elements; at most 2 GiB "
                                "(2**31 - 1 elements) fit one column")  # fmt: skip
    if ctype.layout in Layout.NESTED:
        d = ctype.list_size
        if ctype.layout == Layout.FIXED_LIST:
            edges = [(c.offset * d, (c.offset + len(c)) * d) for c in cols]
        child_nulls = sum(_element_nulls(backend, c, a, b) for c, (a, b) in zip(cols, edges))
        data_size *= ctype.storage.itemsize if ctype.layout == Layout.LIST else 0
    elif ctype.layout == Layout.STRUCT:
        parts = [c.children for c in cols]
        children = [_prepare(backend, n, [p[i] for p in parts], num_rows) for i, n in enumerate(ctype.child_names)]
    elif ctype.layout == Layout.LIST_OF:
        elements = [c._element_rows(a, b - a) for c, (a, b) in zip(cols, edges)]
        children = [_prepare(backend, elements[0].name, elements, data_size)]
        data_size = 0
    spec = ColumnSpec(name, ctype, num_rows, sum(c.null_count for c in cols), data_size, child_nulls,
                      tuple(sp for sp, _ in children))  # fmt: skip
    return spec, (offsets, edges, children)


def _fill(backend: Any, block: Any, col_plan: Any, cols: list, state: tuple) -> None:
    xp = backend.xp
    offsets, edges, children = state
    num_rows = col_plan.length
    layout = col_plan.type.layout
    pos = 0
    if layout in Layout.NESTED:
        _concat_elements(backend, block, col_plan, cols, edges)
    if layout == Layout.STRUCT:
        parts = [c.children for c in cols]
        for i, (child_plan, (_, child_state)) in enumerate(zip(col_plan.children, children)):
            _fill(backend, block, child_plan, [p[i] for p in parts], child_state)
    elif layout == Layout.VARBINARY:
        out_offsets = block.array(col_plan.values.offset, np.int32, (num_rows + 1,))
        data = block.array(col_plan.data.offset, np.uint8, (col_plan.data.size,))
        out_offsets[0] = 0
        base = 0
        for c, o, (a, b) in zip(cols, offsets, edges):
            n = len(c)
            if n:
                xp.subtract(o, np.int32(a - base), out=out_offsets[pos : pos + n + 1])
                data[base : base + b - a] = c.data[a:b]
            pos += n
            base += b - a
    elif layout in (Layout.LIST, Layout.LIST_OF):
        out_offsets = block.array(col_plan.values.offset, np.int32, (num_rows + 1,))
        out_offsets[0] = 0
        base = 0
        for c, o, (a, b) in zip(cols, offsets, edges):
            if len(c):
                xp.subtract(o, np.int32(a - base), out=out_offsets[pos : pos + len(c) + 1])
            pos += len(c)
            base += b - a
        if layout == Layout.LIST_OF:
            elements = [c._element_rows(a, b - a) for c, (a, b) in zip(cols, edges)]
            _fill(backend, block, col_plan.children[0], elements, children[0][1])
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
