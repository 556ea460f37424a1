"""Read record batches of an Arrow IPC file into one Table: one allocation, reads straight into place.

Per column, the batches land one after the other:

- fixed-width values and string bytes are read from the file directly to their final position;
- string and list offsets (all such columns of the read) are read to one scratch array first and checked
  there in one pass (:mod:`.read.offsets`: monotone, inside their data buffer or their elements); their
  first/last values give each batch's exact byte (element) count, needed before the table can be
  allocated; then they are rebased into place;
- a fixed_size_list's elements are read like fixed-width values (d per row), a list's elements like
  string bytes (the batch's [first, last) elements);
- bit-packed booleans and validity bitmaps (also the elements' bitmaps) are read to scratch and re-laid
  out by the bitmap kernels
  (a batch boundary is rarely on a multiple of 8 rows, and pystrom keeps booleans one byte each);
- the NULLs in the unpacked validity bitmaps are counted on the device and compared with the counts
  the metadata claimed (read back once, after every column is in place);
- string columns (not binary ones) are checked to be UTF-8, as the format requires (:mod:`.read.utf8`).

Compressed buffers (:class:`.file.metadata.Packed` ranges) are served by
:class:`.read.compressed_reads.InflatingReader`, which has the range reader's interface: the steps above run
unchanged on the decompressed bytes.
Columns whose file layout is not pystrom's (dictionaries, large or view strings, lists of booleans) and
files whose bodies pyarrow must rewrite (compressed streams, big-endian) go through pyarrow on the host
(:mod:`.read.host`, validated there) and the common table builder instead. Everything else the read
relies on (row counts, null counts, buffer ranges inside the file and long enough) was checked from
the metadata by :mod:`.file.metadata`, :mod:`.read.batches` or :mod:`.read.compressed_layouts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .... import _core
from ...._types import ColumnType, Layout
from ....errors import CapacityError, FileFormatError
from ....interop.build import _fill_host, _Writer
from ....kernels import launch
from ....memory.backend import Backend, Block
from ....memory.bitmap import count_true_queued
from ....memory.layout import ColumnPlan, ColumnSpec, plan_table
from ....table import Table
from ..file.metadata import ArrowFile
from ..file.ranges import RangeReader, as_bytes
from .compressed_reads import InflatingReader
from .host import host_columns
from .layouts import Buffers, Layouts
from .offsets import check_offsets
from .utf8 import StringColumn, check_utf8

__all__ = ["read_batches"]

_INT32_MAX = 2**31 - 1


@dataclass
class _StringSizes:
    scratch: Any  # int32 offsets of every batch, each batch's n + 1 entries back to back
    starts: np.ndarray  # position of each batch's offsets in scratch
    first: np.ndarray  # first offset of each batch (int64, host)
    nbytes: np.ndarray  # bytes of each batch


def read_batches(
    file: ArrowFile,
    layouts: Layouts,
    columns: Sequence[str],
    types: dict[str, ColumnType | None],
    backend: Backend,
    progress: Any = None,
) -> tuple[Any, int]:
    """The selected batches and columns as one Table on ``backend``; also the file bytes read.

    ``progress``, if given, is called with the bytes read so far as the reads complete.
    """
    schema = file.schema
    num_rows = int(layouts.num_rows.sum())
    row_starts = np.cumsum(layouts.num_rows) - layouts.num_rows
    direct = [c for c in columns if types[c] is not None and not file.compressed]
    host = host_columns(file, layouts, [c for c in columns if c not in direct])

    with RangeReader(file.path, backend, progress, fd=file.fileno()) as files, backend.activate():
        reader = InflatingReader(files, layouts.packed) if layouts.packed_count() else files
        xp = backend.xp
        offset_columns = [n for n in direct if types[n].layout in (Layout.VARBINARY, Layout.LIST)]
        strings = _string_sizes(file, reader, xp, layouts, offset_columns, types)
        claimed = _claimed_nulls(layouts, [n for n in columns if n not in host])
        specs = []
        for name in columns:
            if name in host:
                specs.append(host[name].spec())
                continue
            data_size = int(strings[name].nbytes.sum()) if name in strings else 0
            if types[name].layout == Layout.LIST:
                if data_size > _INT32_MAX:
                    raise CapacityError(f"column {name!r} holds {data_size:,} list elements in {file.path!r}; "
                                        "32-bit offsets address 2**31 - 1 (read fewer rows)")  # fmt: skip
                data_size *= types[name].storage.itemsize
            elif data_size > _INT32_MAX:
                raise CapacityError(
                    f"column {name!r} holds {data_size:,} bytes of {schema.field(name).type} data in {file.path!r}; "
                    "one column holds at most 2 GiB (read fewer rows, e.g. with scan_arrow)"
                )
            null_count, child_nulls = claimed[name]  # child_nulls > 0: an element bitmap
            specs.append(ColumnSpec(name, types[name], num_rows, null_count, data_size, child_nulls))
        plan = plan_table(specs)
        block = backend.allocate(plan.nbytes)
        fixups, fixed = [], []
        for col_plan in plan.columns:
            if col_plan.name in direct:
                fixups.append(_read_column(reader, block, col_plan, layouts, row_starts, strings.get(col_plan.name),
                                           fixed))  # fmt: skip
        if fixed:  # the fixed-width columns' values, every batch of every column in one call
            offsets, sizes, at = (np.concatenate(x) for x in zip(*fixed))
            reader.read_many(offsets, sizes, block.array(0, np.uint8, (block.nbytes,)), at)
        reader.wait()
        null_counts = [fixup() for fixup in fixups]
        check_utf8(backend, file.path, _string_columns(block, plan, direct, types), layouts.index, row_starts)
        _check_null_counts(file, backend, plan, [c for c in null_counts if c is not None])
        if host:
            writer = _Writer(block)
            for col_plan in plan.columns:
                if col_plan.name in host:
                    _fill_host(writer, col_plan, host[col_plan.name])
            writer.flush()
        backend.synchronize()
        bytes_read = reader.bytes_read
    fields = [host[n].field if n in host else schema.field(n) for n in columns]
    table = Table._wrap(block, plan, pa.schema(fields, metadata=schema.metadata), num_rows)
    return table, bytes_read


def _claimed_nulls(layouts: Layouts, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Each column's NULLs and NULL elements (lists) over all batches, as the metadata claims them: one
    NumPy sum for all columns rather than two a column."""
    if not names:
        return {}
    count = len(layouts)
    if count == 0:
        return {n: (0, 0) for n in names}
    chunks = [layouts.chunks[n] for n in names]
    flat = np.concatenate([a for c in chunks for a in (c.null_count, c.child_null_count)])
    sums = np.add.reduceat(flat, np.arange(0, flat.shape[0], count)).tolist()
    return {n: (sums[2 * i], sums[2 * i + 1]) for i, n in enumerate(names)}


def _string_sizes(
    file: ArrowFile,
    reader: RangeReader | InflatingReader,
    xp: Any,
    layouts: Layouts,
    names: Sequence[str],
    types: dict[str, ColumnType | None],
) -> dict[str, _StringSizes]:
    """Read the string and list columns' offsets to one scratch array; check them all (:mod:`.read.offsets`);
    each batch's first offset and byte (list: element) count per column."""
    if not names:
        return {}
    count = len(layouts)
    chunks = [layouts.chunks[n] for n in names]
    counts = np.concatenate([c.length for c in chunks])  # column by column, batch by batch
    sizes = np.where(counts > 0, counts + 1, 0)
    starts = np.cumsum(np.concatenate([[0], -(-sizes // 16) * 16]))  # 64-byte aligned: inflated in place
    scratch = xp.zeros(int(starts[-1]), dtype=xp.int32)
    reader.read_many(np.concatenate([c.values.offset for c in chunks]), sizes * 4, as_bytes(scratch), starts[:-1] * 4)
    reader.wait()
    nonempty = np.flatnonzero(sizes)
    # a string column's data (None where no batch has one: pyarrow's path, empty batches only)
    limits = [c.child_length if types[n].layout == Layout.LIST else c.data.size if c.data else 0 * c.length
              for n, c in zip(names, chunks)]  # fmt: skip
    data_sizes = np.concatenate(limits)
    f, la, bad = check_offsets(reader.backend, scratch, starts[:-1][nonempty], sizes[nonempty], data_sizes[nonempty])
    if bad.any():
        k = int(nonempty[int(np.flatnonzero(bad)[0])])
        name, batch = names[k // count], int(layouts.index[k % count])
        kind, limit = ("list", "its elements") if types[name].layout == Layout.LIST else ("string", "the data buffer")
        raise FileFormatError(
            f"{file.path!r}: record batch {batch}, column {name!r} has invalid {kind} offsets (they decrease, start "
            f"below 0 or end beyond {limit}: corrupt file)"
        )
    first = np.zeros(len(counts), dtype=np.int64)
    last = np.zeros(len(counts), dtype=np.int64)
    first[nonempty], last[nonempty] = f, la
    out = {}
    for i, name in enumerate(names):
        cols = slice(i * count, (i + 1) * count)
        out[name] = _StringSizes(scratch, starts[cols], first[cols], last[cols] - first[cols])
    return out


def _string_columns(block: Block, plan: Any, direct: Sequence[str], types: dict) -> list[StringColumn]:
    """The read's string columns (not binary: its bytes may be anything) as the table holds them."""
    out = []
    for cp in plan.columns:
        if (
            cp.name in direct
            and types[cp.name].layout == Layout.VARBINARY
            and pa.types.is_string(types[cp.name].storage_arrow)
        ):
            validity = None if cp.validity is None else block.array(cp.validity.offset, np.uint8, (cp.validity.size,))
            out.append(StringColumn(cp.name, block.array(cp.values.offset, np.int32, (cp.length + 1,)),
                                    block.array(cp.data.offset, np.uint8, (cp.data.size,)), validity))  # fmt: skip
    return out


def _check_null_counts(file: ArrowFile, backend: Backend, plan: Any, counted: list[tuple[str, int, int, Any]]) -> None:
    """Compare the NULLs found in the bitmaps with the counts the metadata gave (one copy back)."""
    if not counted:
        return
    xp = backend.xp
    valid = backend.to_host(xp.concatenate([c for *_, c in counted]))
    for (name, claimed, rows, _), set_bits in zip(counted, valid):
        got = rows - int(set_bits)
        if got != claimed:
            raise FileFormatError(
                f"{file.path!r}: column {name!r}: the record batches claim {claimed} NULLs, their validity bitmaps "
                f"hold {got} (corrupt file)"
            )


def _read_column(
    reader: RangeReader | InflatingReader,
    block: Block,
    plan: ColumnPlan,
    layouts: Layouts,
    row_starts: np.ndarray,
    strings: _StringSizes | None,
    fixed: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
):
    """Submit the reads of one column (a fixed-width column's values: appended to ``fixed``, (file offsets,
    sizes, places in the block) for the caller to read with the other columns'); return the fix-up to run
    once they are done."""
    backend = reader.backend
    xp = backend.xp
    ctype = plan.type
    chunks = layouts.chunks[plan.name]
    layout = ctype.layout
    bits = None
    if layout in (Layout.FIXED, Layout.BYTES, Layout.FIXED_LIST):
        width = ctype.width
        fixed.append((chunks.values.offset, chunks.length * width, plan.values.offset + row_starts * width))
    elif layout in (Layout.VARBINARY, Layout.LIST):
        unit = ctype.storage.itemsize if layout == Layout.LIST else 1  # bytes per offset step
        nbytes = strings.nbytes * unit
        at = plan.data.offset + np.cumsum(nbytes) - nbytes
        if chunks.data is not None:  # None: no batch has bytes (pyarrow's path, empty batches only)
            raw = block.array(0, np.uint8, (block.nbytes,))
            reader.read_many(chunks.data.offset + strings.first * unit, nbytes, raw, at)
    else:  # BOOL: bit-packed in the file
        bits = _read_bitmaps(reader, xp, chunks.values, chunks.length)
    validity = _read_bitmaps(reader, xp, chunks.validity, chunks.length) if plan.validity else None
    elements = None
    if plan.child_validity is not None:  # each batch's whole element bitmap; the rows' part is unpacked below
        elements = _read_bitmaps(reader, xp, chunks.child_validity, chunks.child_length)

    def fixup() -> tuple[str, int, int, Any] | None:
        """Lay out what was read; (name, NULLs claimed, rows, valid rows counted on the device) for a nullable
        column."""
        if layout in (Layout.VARBINARY, Layout.LIST):
            _place_offsets(backend, block, plan, strings, row_starts, chunks.length)
        if elements is not None:
            _place_elements(backend, block, plan, elements, chunks.length, row_starts, strings)
        elif layout == Layout.BOOL:
            values = block.array(plan.values.offset, np.uint8, (plan.length,))
            _unpack_batches(backend, bits, _spans(chunks.length, row_starts), values, missing=None)
        if validity is None:
            return None
        valid = xp.empty(plan.length, dtype=np.uint8)
        _unpack_batches(backend, validity, _spans(chunks.length, row_starts), valid, missing=1)
        _pack_into(backend, valid, block.array(plan.validity.offset, np.uint8, (plan.validity.size,)))
        return plan.name, plan.null_count, plan.length, count_true_queued(valid)

    return fixup


def _spans(lengths: np.ndarray, row_starts: np.ndarray) -> tuple:
    """Each batch's bits of a column's bitmaps: (first bit, count, row) arrays."""
    return np.zeros_like(row_starts), lengths, row_starts


def _read_bitmaps(reader: RangeReader | InflatingReader, xp: Any, bitmaps: Buffers | None, bits: np.ndarray) -> tuple:
    """Read one bitmap of ``bits[i]`` bits per batch into a scratch array (none where the batch has no
    bitmap); (scratch, each batch's position in it or -1)."""
    have = np.zeros(len(bits), dtype=bool) if bitmaps is None else bitmaps.offset >= 0
    sizes = np.where(have & (bits > 0), (bits + 7) // 8, 0)
    padded = -(-sizes // 64) * 64  # 64-byte aligned: inflated in place
    pos = np.cumsum(padded) - padded
    scratch = xp.empty(max(int(padded.sum()), 1), dtype=np.uint8)
    if bitmaps is not None:
        reader.read_many(bitmaps.offset, sizes, scratch, pos)
    return scratch, np.where(sizes > 0, pos, -1)


def _unpack_batches(backend: Backend, bitmaps: tuple, spans: tuple, out: Any, missing: int | None) -> None:
    """Unpack each batch's bitmap into ``out`` (one byte per row); ``spans``: per batch (first bit, bit
    count, position in ``out``) arrays; ``missing``: the byte where a batch has no bitmap (None: 0). All
    batches in one call (a kernel launch or a C++ call each cost more than a batch's bits)."""
    scratch, where = bitmaps
    bit, n, start = (np.asarray(a, dtype=np.int64) for a in spans)
    some = n > 0
    table = np.ascontiguousarray(np.stack([np.asarray(where, dtype=np.int64)[some], bit[some], n[some], start[some]]))
    count = table.shape[1]
    if count == 0:
        return
    fill = 0 if missing is None else missing
    if backend.kind == "cpu":
        _core.unpack_bit_spans(scratch, table, fill, out)
    else:  # a block a batch (kernels/bitmap.cu)
        launch("bitmap", "unpack_bit_spans", backend.ordinal, count * 256,
               (scratch, backend.xp.asarray(table), np.int64(count), np.int32(fill), out))  # fmt: skip


def _place_elements(backend: Backend, block: Block, plan: ColumnPlan, bitmaps: tuple, lengths, row_starts, strings):
    """The element bitmap of a list column: each batch's elements of its rows, one after the other."""
    xp = backend.xp
    if plan.type.layout == Layout.FIXED_LIST:
        d = plan.type.list_size
        spans = (np.zeros_like(lengths), lengths * d, row_starts * d)
    else:
        spans = (strings.first, strings.nbytes, np.cumsum(strings.nbytes) - strings.nbytes)
    count = int(spans[1].sum())
    if count == 0:
        return
    valid = xp.empty(count, dtype=np.uint8)
    _unpack_batches(backend, bitmaps, spans, valid, missing=1)
    span = plan.child_validity
    _pack_into(backend, valid, block.array(span.offset, np.uint8, (span.size,)))


def _pack_into(backend: Backend, bits: Any, out: Any) -> None:
    if backend.kind == "cpu":
        out[...] = np.packbits(bits.view(bool), bitorder="little")[: out.shape[0]]
        return
    n = int(bits.shape[0])
    launch("bitmap", "pack_bits", backend.ordinal, out.shape[0],
           (bits, np.int64(n), np.int32(0), out, np.int64(out.shape[0])))  # fmt: skip


def _place_offsets(backend: Backend, block: Block, plan: ColumnPlan, strings: _StringSizes, row_starts, lengths):
    """Each batch's offsets rebased to its bytes' place in the column, all batches in one call."""
    dst = block.array(plan.values.offset, np.int32, (plan.length + 1,))
    dst[0] = 0
    some = lengths > 0
    data_pos = np.cumsum(strings.nbytes) - strings.nbytes
    shift = strings.first - data_pos
    table = np.stack([strings.starts[some], lengths[some] + 1, shift[some], row_starts[some]]).astype(np.int64)
    _shift_spans(backend, strings.scratch, table, dst)


def _shift_spans(backend: Backend, src: Any, table: np.ndarray, dst: Any) -> None:
    """dst[start + j] = src[at + j] - shift for j < count, for each column (at, count, shift, start) of
    ``table`` (int32 ``src`` and ``dst``)."""
    count = table.shape[1]
    if count == 0:
        return
    if backend.kind == "cpu":
        _core.shift_spans(src, table, dst)
    else:  # a block a batch (kernels/strings.cu)
        launch("strings", "shift_spans", backend.ordinal, count * 256,
               (src, backend.xp.asarray(table), np.int64(count), dst))  # fmt: skip
