"""Table operations that compute on the table's device: gathering rows and building 2-D arrays.

Written once against ``xp`` (NumPy or CuPy); the only device-specific pieces are the bitmap and
string-gather kernels, each with a C++ twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core
from ._types import Layout
from .column import Column
from .errors import CapacityError, DataError, NullValuesError, SchemaMismatchError, UnsupportedTypeError
from .memory import bitmap
from .memory.backend import Backend, Block, backend_of_array, resolve_device
from .memory.layout import ColumnPlan, ColumnSpec, TablePlan, plan_table

if TYPE_CHECKING:
    from .table import Table

__all__ = ["gather", "gather_into", "Take", "as_mask", "to_array"]


# -- row gathering (filter, compaction) -----------------------------------------------------------

OFFSET_LIMIT = 2**31 - 1  # int32 offsets: a gathered string column's bytes, a list column's elements


def _offsets_fit(total: int, name: str, unit: str) -> int:
    """``total``, or CapacityError where the gathered column's int32 offsets cannot address it (rows taken
    more than once, as a broadcast value or a fill, can outgrow the column they come from)."""
    if total > OFFSET_LIMIT:
        raise CapacityError(f"column {name!r} would hold {total:,} {unit}; one column holds at most 2**31 - 1 "
                            "(its offsets are int32): take fewer rows")  # fmt: skip
    return total


def _row_ranges(xp: Any, col: Column, rows: Any) -> tuple[Any, Any]:
    """(start, end) offsets of ``rows`` of a string or list column: copies, read once, so what is checked
    here is what the gather follows. Memory another process may write (``Block.others_may_write``) is
    checked: every range must lie inside the data (or the child values), else DataError naming the row.
    Costs O(rows gathered), not O(column) like a check of all its offsets."""
    offsets = col.offsets
    starts, ends = offsets[rows], offsets[rows + 1]
    if col._live_block().others_may_write and rows.shape[0]:
        bad = (starts < 0) | (ends < starts) | (ends > col._offsets_limit())
        if bitmap.count_true(bad):
            i = int(xp.argmax(bad))
            row, a, b = int(rows[i]), int(starts[i]), int(ends[i])
            is_list = col.column_type.layout in (Layout.LIST, Layout.LIST_OF)
            where, unit = ("child values", "element") if is_list else ("data buffer", "byte")
            raise DataError(
                f"column {col.name!r}: its {'list' if is_list else 'string'} offsets no longer lie inside its "
                f"{where}: row {row} spans [{a}, {b}) of {col._offsets_limit()} {unit}s (row {row}); another "
                "process wrote them after this table was imported (its exporter, or the writer of a store table)"
            )
    return starts, ends


def _gather_varbinary(backend: Backend, col: Column, ranges: tuple[Any, Any], rows: Any, dst_offsets: Any,
                      dst: Any) -> None:  # fmt: skip
    """Copy the bytes of ``rows`` (their ``ranges`` from :func:`_row_ranges`). Where another process may
    write the offsets the gather follows the checked copies, laid out as offsets of their own; both
    gathers also check every range against both buffers (the CPU raises, the GPU clamps)."""
    xp = backend.xp
    src_data = col.data
    if col._live_block().others_may_write:
        starts, ends = ranges
        src_offsets = xp.empty(2 * starts.shape[0], dtype=np.int32)
        src_offsets[0::2], src_offsets[1::2] = starts, ends
        rows = xp.arange(0, src_offsets.shape[0], 2, dtype=np.int64)
    else:
        src_offsets = col.offsets
    if backend.kind == "cpu":
        try:
            _core.gather_varbinary(src_offsets, src_data, rows, dst_offsets, dst)
        except IndexError as exc:
            raise DataError(f"column {col.name!r}: {exc}") from None
    else:
        from .kernels import launch

        launch(
            "strings",
            "gather_varbinary",
            backend.ordinal,
            int(rows.shape[0]),
            (src_offsets, src_data, np.int64(src_data.size), rows, np.int64(rows.shape[0]), dst_offsets, dst,
             np.int64(dst.size)),
        )  # fmt: skip


def _list_elements(xp: Any, col: Column, rows: Any) -> tuple[Any, Any | None]:
    """For gathering ``rows`` of a list column: the source element indices (into ``child_values``), in
    output order, and the output's offsets (None for a fixed_size_list)."""
    ctype = col.column_type
    if ctype.layout == Layout.FIXED_LIST:
        d = ctype.list_size
        idx = (col.offset + rows)[:, None] * d + xp.arange(d, dtype=np.int64)[None, :]
        return idx.reshape(-1), None
    starts, ends = (r.astype(np.int64) for r in _row_ranges(xp, col, rows))
    new_offsets = xp.zeros(rows.shape[0] + 1, dtype=np.int64)
    xp.cumsum(ends - starts, out=new_offsets[1:])
    element = xp.arange(_offsets_fit(int(new_offsets[-1]), col.name, "elements"), dtype=np.int64)
    row = xp.searchsorted(new_offsets[1:], element, side="right")
    return starts[row] + (element - new_offsets[row]), new_offsets.astype(np.int32)


def gather(table: Table, rows: Any | None) -> Table:
    """A new table (new allocation, same device) holding ``rows`` (int64 indices into the view, on the
    table's device) of every column; ``None`` means all rows: a compact copy of a view."""
    backend = table._live().backend
    with backend.activate():
        if rows is None:
            rows = backend.xp.arange(table.num_rows, dtype=np.int64)
        return _gather(table, backend, rows)


def _gather(table: Table, backend: Backend, rows: Any) -> Table:
    block, plan = gather_into(backend, rows, table.columns)
    return type(table)._wrap(
        block, plan, table.schema, int(rows.shape[0])
    )  # the caller's class: _ops sits below table.py


@dataclass(frozen=True)
class Take:
    """A slot of :func:`gather_into` that gathers its own ``rows`` of ``column`` (which may belong to
    another block of the same device) under ``name``: a filled, broadcast or renamed column."""

    column: Column
    rows: Any = None  # int64 indices into the column; None: the rows every slot gathers
    name: str | None = None  # None: the column's name


def gather_into(backend: Backend, rows: Any, slots: Sequence[Column | ColumnSpec | Take]) -> tuple[Block, TablePlan]:
    """One new block laid out for ``slots`` in order: columns (their ``rows`` are gathered into the
    block), :class:`Take` slots (their own rows, under their own name) and specs of columns the
    caller fills itself (``Table.with_columns``). Every slot must have ``len(rows)`` rows."""
    m = int(rows.shape[0])
    specs, prepared, sources = [], [], []
    for slot in slots:
        if isinstance(slot, ColumnSpec):
            specs.append(slot)
            prepared.append(None)
            sources.append(None)
            continue
        col, name, col_rows = (slot.column, slot.name, slot.rows) if isinstance(slot, Take) else (slot, None, None)
        name = col.name if name is None else name
        if col_rows is None:
            col_rows = rows
        elif int(col_rows.shape[0]) != m:
            raise AssertionError(f"slot {name!r} gathers {int(col_rows.shape[0])} rows, the others {m}")
        sources.append((col, col_rows))
        spec, prep = _prepare(backend, col, col_rows, name)
        specs.append(spec)
        prepared.append(prep)
    plan = plan_table(specs)
    new_block = backend.allocate(plan.nbytes)
    for source, cplan, prep in zip(sources, plan.columns, prepared):
        if prep is not None:
            _write_gathered(new_block, cplan, source[0], source[1], *prep)
    return new_block, plan


def _prepare(backend: Backend, col: Column, rows: Any, name: str) -> tuple[ColumnSpec, tuple]:
    """What gathering ``rows`` of ``col`` takes: its spec in the new block and what :func:`_write_gathered`
    needs (the rows' validity, their string/list extents, and the same for each child column)."""
    xp = backend.xp
    m = int(rows.shape[0])
    ctype = col.column_type
    valid = None
    null_count = 0
    if col.null_count:
        valid = col.is_valid()[rows]
        null_count = m - bitmap.count_true(valid)
    lengths = data_size = None
    child_nulls = 0
    children: list[tuple[ColumnSpec, tuple]] = []
    if ctype.layout == Layout.VARBINARY:
        ranges = _row_ranges(xp, col, rows)
        # the rows' ends in the new data: their total sizes the block, and they are its offsets. A scan, not
        # CuPy's sum of int32 into int64, which compiles a CUB reduction (~4 s on a machine's first filter)
        ends = xp.cumsum(ranges[1] - ranges[0], dtype=np.int64)
        lengths = (ends, ranges)
        data_size = _offsets_fit(int(ends[-1]), name, "bytes") if m else 0
    elif ctype.layout in Layout.NESTED:  # lengths: (element indices, new offsets, element validity)
        idx, new_offsets = _list_elements(xp, col, rows)
        child_valid = None
        if col.child_validity is not None:
            bits = col.child_validity
            child_valid = bitmap.unpack(backend, bits, 0, bits.shape[0] * 8)[idx]
            child_nulls = int(idx.shape[0]) - bitmap.count_true(child_valid)
        lengths = (idx, new_offsets, child_valid)
        if new_offsets is not None:
            data_size = int(idx.shape[0]) * ctype.storage.itemsize
    elif ctype.layout == Layout.STRUCT:  # the fields' views share the struct's rows
        children = [_prepare(backend, c, rows, c.name) for c in col.children]
    elif ctype.layout == Layout.LIST_OF:  # lengths: (new offsets, the elements the element column gathers)
        idx, new_offsets = _list_elements(xp, col, rows)
        lengths = (new_offsets, idx)
        children = [_prepare(backend, col.elements, idx, col.elements.name)]
    spec = ColumnSpec(name, ctype, m, null_count, data_size or 0, child_nulls, tuple(s for s, _ in children))
    return spec, (valid if null_count else None, lengths, [p for _, p in children])


def _write_gathered(
    block: Block, plan: ColumnPlan, col: Column, rows: Any, valid: Any, lengths: Any, children: list
) -> None:
    backend = block.backend
    xp = backend.xp
    m = plan.length
    ctype = plan.type
    if ctype.layout == Layout.STRUCT:
        for child_plan, child, prep in zip(plan.children, col.children, children):
            _write_gathered(block, child_plan, child, rows, *prep)
    elif ctype.layout == Layout.LIST_OF:
        new_offsets, idx = lengths
        block.write_device(plan.values.offset, new_offsets)
        _write_gathered(block, plan.children[0], col.elements, idx, *children[0])
    elif ctype.layout == Layout.VARBINARY:
        ends, ranges = lengths
        offsets = block.array(plan.values.offset, np.int32, (m + 1,))
        offsets[0] = 0
        if m:
            offsets[1:] = ends  # at most OFFSET_LIMIT (_prepare)
            data = block.array(plan.data.offset, np.uint8, (plan.data.size,))
            _gather_varbinary(backend, col, ranges, rows, offsets, data)
    elif ctype.layout in Layout.NESTED:
        idx, new_offsets, child_valid = lengths
        values = col.child_values
        if new_offsets is not None:
            block.write_device(plan.values.offset, new_offsets)
        target = plan.data if new_offsets is not None else plan.values
        if idx.shape[0]:
            out = block.array(target.offset, ctype.storage, (int(idx.shape[0]),))
            xp.take(values, idx, out=out)
        if plan.child_validity is not None:
            block.write_device(plan.child_validity.offset, bitmap.pack(backend, child_valid))
    elif m:
        shape = (m, ctype.width) if ctype.layout == Layout.BYTES else (m,)
        out = block.array(plan.values.offset, ctype.storage, shape)
        xp.take(col.values, rows, axis=0, out=out)
    if plan.validity is not None:
        bits = bitmap.pack(backend, valid)
        block.write_device(plan.validity.offset, bits)


def as_mask(table: Table, mask: Any) -> Any:
    """Normalise a filter mask into a bool array on the table's device, checking its length.

    Accepted: a bool array of any backend (copied to the table's device if elsewhere), a list, a
    pyarrow BooleanArray (NULL counts as False), a bool Column of this table or its name.
    """
    import pyarrow as pa

    backend = table._live().backend
    if isinstance(mask, str):
        mask = table.column(mask)
    if isinstance(mask, Column):
        if mask.column_type.layout != Layout.BOOL:
            raise UnsupportedTypeError(f"filter column {mask.name!r} has type {mask.type}, not bool")
        if mask.device != backend.device:
            raise SchemaMismatchError(f"filter column {mask.name!r} is on {mask.device}, the table on {backend.device}")
        return mask.values & mask.is_valid() if mask.null_count else mask.values
    if isinstance(mask, (pa.Array, pa.ChunkedArray)):
        mask = mask.fill_null(False).to_numpy(zero_copy_only=False)
    owner = backend_of_array(mask)
    if owner is None:
        if backend.kind == "cuda" and hasattr(mask, "__cuda_array_interface__"):
            mask, owner = backend.xp.asarray(mask), backend
        else:
            mask, owner = np.asarray(mask), resolve_device("cpu")
    if mask.ndim != 1 or mask.dtype != np.bool_:
        raise UnsupportedTypeError(f"filter mask must be a 1-D bool array; got dtype {mask.dtype}, shape {mask.shape}")
    if mask.shape[0] != table.num_rows:
        raise SchemaMismatchError(f"filter mask has {mask.shape[0]:,} entries, the table {table.num_rows:,} rows")
    if owner is not backend:
        mask = backend.from_host(owner.to_host(mask))
    return mask


# -- 2-D arrays -----------------------------------------------------------------------------------

_NULL_MODES = ("raise", "nan", "drop")


def _decimal_to_float(xp: Any, col: Column, dtype: np.dtype) -> Any:
    """decimal128 -> float: negate negatives in 128-bit integer arithmetic first, so that no float
    subtraction cancels (-3.5 is hi=-1, lo=2**64-350: adding those as floats would give 0)."""
    words = col.values.view(xp.uint64).reshape(len(col), 2)
    lo, hi = words[:, 0], words[:, 1]
    negative = (hi >> xp.uint64(63)).astype(bool)
    lo_abs = xp.where(negative, ~lo + xp.uint64(1), lo)
    hi_abs = xp.where(negative, ~hi + (lo == 0).astype(xp.uint64), hi)
    magnitude = hi_abs.astype(xp.float64) * 18446744073709551616.0 + lo_abs.astype(xp.float64)
    value = xp.where(negative, -magnitude, magnitude) / 10.0**col.type.scale
    return value.astype(dtype, copy=False)


def _equally_spaced_view(backend: Backend, cols: Sequence[Column]) -> Any | None:
    """Columns of one dtype at a constant stride in memory form a zero-copy (n, k) view; else None."""
    first = cols[0].values
    if len(cols) == 1:
        return first.reshape(-1, 1)
    ptrs = [backend.array_ptr(c.values) for c in cols]
    stride = ptrs[1] - ptrs[0]
    itemsize = first.dtype.itemsize
    n = first.shape[0]
    if stride <= 0 or stride % itemsize or stride < n * itemsize:
        return None
    if any(b - a != stride for a, b in zip(ptrs, ptrs[1:])):
        return None
    shape, strides = (n, len(cols)), (itemsize, stride)
    if backend.kind == "cpu":
        return np.lib.stride_tricks.as_strided(first, shape=shape, strides=strides)
    return backend.xp.ndarray(shape, dtype=first.dtype, memptr=first.data, strides=strides)


def to_array(table: Table, columns: Sequence[str] | None, dtype: Any, nulls: str) -> Any:
    if nulls not in _NULL_MODES:
        raise ValueError(f"nulls={nulls!r} is not one of {_NULL_MODES}")
    backend = table._live().backend
    with backend.activate():
        return _to_array(table, backend, columns, dtype, nulls)


def _element_nulls(backend: Backend, col: Column) -> Any | None:
    """A fixed_size_list column's (n, d) element validity for its rows, or None when no element is NULL."""
    bits = col.child_validity if col.column_type.layout == Layout.FIXED_LIST else None
    if bits is None:
        return None
    d = col.column_type.list_size
    valid = bitmap.unpack(backend, bits, col.offset * d, len(col) * d).reshape(len(col), d)
    return None if bitmap.all_true(valid) else valid


def _to_array(table: Table, backend: Backend, columns: Sequence[str] | None, dtype: Any, nulls: str) -> Any:
    xp = backend.xp
    names = list(table.column_names if columns is None else ([columns] if isinstance(columns, str) else columns))
    if not names:
        raise ValueError("to_array needs at least one column")
    cols = [table.column(n) for n in names]
    for c in cols:
        layout = c.column_type.layout
        if layout in (Layout.VARBINARY, Layout.LIST, *Layout.COMPOSED) or (
            layout == Layout.BYTES and not _is_decimal(c)
        ):
            raise UnsupportedTypeError(
                f"column {c.name!r} has type {c.type}, which cannot be part of a 2-D numeric array"
            )
        if layout == Layout.BYTES and (dtype is None or np.dtype(dtype).kind != "f"):
            raise UnsupportedTypeError(
                f"column {c.name!r} has type {c.type}: pass dtype='float64' to convert decimals into a 2-D array"
            )
    if dtype is None:  # NumPy's promotion, as np.column_stack would give: int32 + float64 -> float64
        out_dtype = np.result_type(*(c.dtype for c in cols))
    else:
        out_dtype = np.dtype(dtype)
    elements = {c.name: _element_nulls(backend, c) for c in cols}
    with_nulls = [c for c in cols if c.null_count or elements[c.name] is not None]
    if with_nulls and nulls == "raise":
        listing = ", ".join(
            f"{c.name!r} ({c.null_count:,})" if c.null_count else f"{c.name!r} (NULL list elements)" for c in with_nulls
        )
        raise NullValuesError(f"columns with NULLs: {listing}; pass nulls='nan' (float results) or nulls='drop'")
    if with_nulls and nulls == "nan" and out_dtype.kind != "f":
        raise NullValuesError(f"nulls='nan' needs a floating-point dtype, not {out_dtype}; pass dtype='float64'")
    widths = [c.column_type.list_size if c.column_type.layout == Layout.FIXED_LIST else 1 for c in cols]
    if not with_nulls and all(c.dtype == out_dtype and c.column_type.layout != Layout.BYTES for c in cols):
        if len(cols) == 1 and cols[0].column_type.layout == Layout.FIXED_LIST:
            values = cols[0].values  # a fixed_size_list is already (n, d), C-ordered (nested: (n, d1, d2, ...))
            return values.reshape(values.shape[0], cols[0].column_type.list_size)
        view = _equally_spaced_view(backend, cols) if all(w == 1 for w in widths) else None
        if view is not None:
            return view
    n = table.num_rows
    out = xp.empty((n, sum(widths)), dtype=out_dtype, order="F")
    j = 0
    keep = xp.ones(n, dtype=bool) if with_nulls and nulls == "drop" else None
    for c, w in zip(cols, widths):
        part = out[:, j : j + w] if c.column_type.layout == Layout.FIXED_LIST else out[:, j]
        if c.column_type.layout == Layout.BYTES:
            part[...] = _decimal_to_float(xp, c, out_dtype)
        else:
            part[...] = c.values.reshape(n, w) if c.column_type.layout == Layout.FIXED_LIST else c.values
        valid_elements = elements[c.name]
        if c.null_count and nulls == "nan":
            part[~c.is_valid()] = xp.nan
        if valid_elements is not None and nulls == "nan":
            part[~valid_elements] = xp.nan
        if keep is not None:
            if c.null_count:
                keep &= c.is_valid()
            if valid_elements is not None:
                keep &= valid_elements.all(axis=1)
        j += w
    if keep is not None:
        out = xp.asfortranarray(out[keep])
    return out


def _is_decimal(col: Column) -> bool:
    import pyarrow.types as pt

    return pt.is_decimal128(col.column_type.storage_arrow)
