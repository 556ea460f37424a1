"""One Table from every partition's staged COPY chunks.

By the time the last stream ends the pump has counted every column's rows, NULLs and string bytes
(and each array column's elements, NULL elements and least and greatest length, which settle it as
list or fixed_size_list: :func:`.types.settle_arrays`), so the Table is allocated once at its final
size (:func:`pystrom.interop.build.build_table_in_place`)
and each chunk is decoded straight into its own row range (:mod:`.decode`). On a GPU the chunks'
device copies made during streaming may take the room the table needs: they are dropped and the
allocation tried once more, the decoder then copying from the pinned host buffers instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..._types import Layout, column_type
from ...errors import CapacityError, OutOfMemoryError, PostgresError
from ...interop.build import build_table_in_place
from ...memory import bitmap
from ...memory.layout import ColumnPlan, ColumnSpec, Span, TablePlan
from .arrays import settle_arrays
from .chunks import ChunkLayout, layout_chunks
from .columns import PgColumn, field_of, leaf_columns
from .decode import decode_into
from .pump import Kind, Staged, drop_device_copies

__all__ = ["assemble"]

_INT32_MAX = 2**31 - 1


def assemble(backend: Any, cols: Sequence[PgColumn], parts: Sequence[list[Staged]]) -> Any:
    """One Table from all partitions' staged chunks, decoded in place (``cols``: the described columns;
    the chunks hold their leaves, :func:`.types.leaf_columns`)."""
    leaves = leaf_columns(cols)
    lay = layout_chunks(parts, len(leaves))
    leaves = settle_arrays(leaves, lay.shape[:, 1], lay.shape[:, 2])
    try:
        try:
            table = _build(backend, leaves, lay)
        except OutOfMemoryError:
            if not drop_device_copies(lay.chunks):
                raise
            table = _build(backend, leaves, lay)
    finally:  # the decoder has dropped them on success; after a failure they go back now
        drop_device_copies(lay.chunks)
    if len(leaves) != len(cols):
        table = fold_structs(backend, table, cols)
    if any(c.text_array for c in cols):
        table = _text_arrays_to_lists(table, cols)
    return table


def _text_arrays_to_lists(table: Any, cols: Sequence[PgColumn]) -> Any:
    """``table`` with each text-array column (read as the arrays' binary form) made list<string>, on the
    host (the C++ parser, text_arrays.py); a new table (one copy), the read one closed."""
    from .text_arrays import lists_of_arrays

    lists = {c.name: lists_of_arrays(table.column(c.name).to_arrow(), c.text_array, c.name, c.type.arrow)
             for c in cols if c.text_array}  # fmt: skip
    with table, type(table).from_arrays(lists, device=table.device) as placed:  # on the table's device first
        return table.with_columns(**{name: placed.column(name) for name in lists})


def fold_structs(backend: Any, table: Any, cols: Sequence[PgColumn]) -> Any:
    """``table`` (the leaves, in order) with each struct's leaves taken back into it, without a copy:
    the fields become its children and its validity flags (one byte each) are packed into a bitmap in
    their own buffer."""
    import pyarrow as pa

    leaves = iter([c._plan for c in table._columns])
    n = table.num_rows
    with backend.activate():
        plans = [_fold(backend, table._block, c, leaves, n) for c in cols]
    schema = pa.schema([field_of(c) for c in cols])
    return type(table)._wrap(table._block, TablePlan(tuple(plans), table._block.nbytes), schema, n)


def _fold(backend: Any, block: Any, col: PgColumn, leaves: Any, n: int) -> ColumnPlan:
    if not col.parts:
        return replace(next(leaves), name=col.name)
    children = tuple(_fold(backend, block, p, leaves, n) for p in col.parts[:-1])
    flags = next(leaves).values  # the validity part: bool, never NULL
    valid = block.array(flags.offset, np.bool_, (n,))
    nulls = n - bitmap.count_true(valid)
    validity = None
    if nulls:
        block.write_device(flags.offset, bitmap.pack(backend, valid))  # packed first, then written over the flags
        validity = Span(flags.offset, (n + 7) // 8)
    return ColumnPlan(col.name, col.type, n, nulls, Span(flags.offset, 0), validity, None, None, 0, children)


def _build(backend: Any, cols: Sequence[PgColumn], lay: ChunkLayout) -> Any:
    import pyarrow as pa

    specs = []
    for i, col in enumerate(cols):
        # text arrays are read as their binary form first (_text_arrays_to_lists)
        ctype = column_type(pa.binary(), col.name) if col.text_array else col.type
        size = int(lay.nbytes[i]) if ctype.layout == Layout.VARBINARY else 0
        if size > _INT32_MAX:
            raise CapacityError(
                f"column {col.name!r} ({col.pg_type}) holds {size:,} bytes of strings, more than the 2 GiB "
                f"that 32-bit offsets address: read it in parts (where=) or leave it out"
            )
        child_nulls = 0
        if col.kind in Kind.ARRAYS:  # the pump counted elements (not bytes) and NULL elements
            child_nulls = int(lay.shape[i, 0])
            elements = int(lay.nbytes[i])
            if col.type.layout == Layout.LIST:
                if elements > _INT32_MAX:
                    raise CapacityError(
                        f"column {col.name!r} ({col.pg_type}) holds {elements:,} array elements, more than the "
                        f"{_INT32_MAX:,} that 32-bit list offsets address: read it in parts (where=) or leave it out"
                    )
                size = elements * col.type.storage.itemsize
        specs.append(ColumnSpec(col.name, ctype, lay.nrows, int(lay.nulls[i]), size, child_nulls))
    fields = [field_of(c) if not c.text_array else pa.field(c.name, pa.binary()) for c in cols]

    def fill(block: Any, plan: TablePlan) -> None:
        for cp in plan.columns:  # NULLs clear their bit; a column of strings starts at byte 0
            if cp.validity is not None:
                block.array(cp.validity.offset, np.uint8, (cp.validity.size,)).fill(0xFF)
            if cp.child_validity is not None:
                block.array(cp.child_validity.offset, np.uint8, (cp.child_validity.size,)).fill(0xFF)
            if cp.type.layout in (Layout.VARBINARY, Layout.LIST):
                block.array(cp.values.offset, np.int32, (1,)).fill(0)
        decode_into(backend, block, plan, cols, lay)
        for cp, col in zip(plan.columns, cols):
            if col.type.arrow.id == pa.month_day_nano_interval().id:
                intervals_to_arrow(backend, block.array(cp.values.offset, np.uint8, (lay.nrows, 16)), col)

    return build_table_in_place(backend, fields, specs, fill, lay.nrows)


_MAX_MICROS = (2**63 - 1) // 1000


def intervals_to_arrow(backend: Any, raw: Any, col: PgColumn) -> None:
    """Rewrite ``raw`` (rows x 16 bytes, on the backend's device) from PostgreSQL's binary interval
    (int64 microseconds, int32 days, int32 months, big-endian) to Arrow's month_day_nano_interval (int32
    months, int32 days, int64 nanoseconds, little-endian), in place; NULL rows (zeros) stay zeros. A
    time part beyond int64 nanoseconds (+-106,751 days, and PostgreSQL 17's infinite intervals) raises
    naming the row. The same array code runs on NumPy and CuPy (CuPy has no big-endian dtypes, so the
    bytes are assembled with shifts)."""
    xp = backend.xp
    n = raw.shape[0]
    if n == 0:
        return

    def big_endian(lo: int, hi: int) -> Any:
        shifts = xp.arange(8 * (hi - lo - 1), -1, -8, dtype=xp.int64).astype(xp.uint64)  # CuPy: no negative uint steps
        return (raw[:, lo:hi].astype(xp.uint64) << shifts).sum(axis=1, dtype=xp.uint64)

    micros = big_endian(0, 8).view(xp.int64)
    days = big_endian(8, 12).astype(xp.uint32).view(xp.int32)
    months = big_endian(12, 16).astype(xp.uint32).view(xp.int32)
    bad = xp.abs(micros) > _MAX_MICROS  # also INT64_MIN, whose abs stays negative: caught below
    bad |= micros == xp.iinfo(xp.int64).min
    if bitmap.count_true(bad):
        row = int(xp.argmax(bad))
        raise PostgresError(
            f"column {col.name!r} ({col.pg_type}), row {row}: an interval whose time part "
            f"({int(micros[row])} microseconds) does not fit int64 nanoseconds (about 292 years; infinite "
            f"intervals neither): filter it, or read it with extract(epoch from ...)"
        )
    out = xp.empty((n, 4), dtype=xp.int32)
    out[:, 0] = months
    out[:, 1] = days
    out[:, 2:] = (micros * 1000).view(xp.int32).reshape(n, 2)
    raw[...] = out.view(xp.uint8).reshape(n, 16)
