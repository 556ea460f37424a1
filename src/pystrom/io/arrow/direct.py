"""Read record batches of an Arrow IPC file into one Table: one allocation, reads straight into place.

Per column, the batches land one after the other:

- fixed-width values and string bytes are read from the file directly to their final position;
- string offsets are read to a scratch array first (their first/last values give each batch's exact
  byte count, needed before the table can be allocated), then rebased into place;
- bit-packed booleans and validity bitmaps are read to scratch and re-laid out by the bitmap kernels
  (a batch boundary is rarely on a multiple of 8 rows, and pystrom keeps booleans one byte each).

Columns whose file layout is not pystrom's (dictionaries, large or view strings) and files with
compressed bodies go through pyarrow on the host and the common table builder instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ... import _core
from ..._backend import Backend, Block
from ..._layout import ColumnPlan, ColumnSpec, plan_table
from ..._types import ColumnType, Layout
from ...errors import CapacityError, FileFormatError
from ...interop.arrow_import import host_column
from ...interop.build import HostColumn, _fill_host, _Writer
from ...kernels import launch
from ...table import Table
from .file import ArrowFile, BatchLayout
from .ranges import RangeReader, as_bytes

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
    batches: Sequence[BatchLayout],
    columns: Sequence[str],
    types: dict[str, ColumnType | None],
    backend: Backend,
    progress: Any = None,
) -> tuple[Any, int]:
    """The selected batches and columns as one Table on ``backend``; also the file bytes read.

    ``progress``, if given, is called with the bytes read so far as the reads complete.
    """
    schema = file.schema
    num_rows = sum(b.num_rows for b in batches)
    row_starts = np.cumsum([0] + [b.num_rows for b in batches])[:-1]
    direct = [c for c in columns if types[c] is not None and not file.compressed]
    host: dict[str, HostColumn] = {}
    host_names = [c for c in columns if c not in direct]
    if host_names:
        host_batches = [file.host_batch(b.index, host_names) for b in batches]
        for i, name in enumerate(host_names):
            field = schema.field(name)
            chunks = pa.chunked_array([hb.column(i) for hb in host_batches], type=field.type)
            host[name] = host_column(name, field, chunks)

    with RangeReader(file.path, backend, progress) as reader, backend.activate():
        xp = backend.xp
        strings = {
            name: _string_sizes(file, reader, xp, batches, name)
            for name in direct
            if types[name].layout == Layout.VARBINARY
        }
        specs = []
        for name in columns:
            if name in host:
                specs.append(host[name].spec())
                continue
            data_size = int(strings[name].nbytes.sum()) if name in strings else 0
            if data_size > _INT32_MAX:
                raise CapacityError(
                    f"column {name!r} holds {data_size:,} bytes of {schema.field(name).type} data in {file.path!r}; "
                    "one column holds at most 2 GiB (read fewer rows, e.g. with scan_arrow)"
                )
            null_count = sum(b.chunks[name].null_count for b in batches)
            specs.append(ColumnSpec(name, types[name], num_rows, null_count, data_size))
        plan = plan_table(specs)
        block = backend.allocate(plan.nbytes)
        fixups = []
        for col_plan in plan.columns:
            if col_plan.name in direct:
                fixups.append(_read_column(reader, block, col_plan, batches, row_starts, strings.get(col_plan.name)))
        reader.wait()
        for fixup in fixups:
            fixup()
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


def _string_sizes(file: ArrowFile, reader: RangeReader, xp: Any, batches: Sequence[BatchLayout], name: str):
    """Read a string column's offsets to scratch; check them; each batch's first offset and byte count."""
    counts = np.array([b.chunks[name].length for b in batches], dtype=np.int64)
    sizes = np.where(counts > 0, counts + 1, 0)
    starts = np.cumsum(np.concatenate([[0], sizes]))
    scratch = xp.zeros(int(starts[-1]), dtype=xp.int32)
    raw = as_bytes(scratch)
    for b, start, size in zip(batches, starts[:-1], sizes):
        if size:
            reader.read(b.chunks[name].values.offset, int(size) * 4, raw[int(start) * 4 : int(start + size) * 4])
    reader.wait()
    nonempty = counts > 0
    first = np.zeros(len(batches), dtype=np.int64)
    last = np.zeros(len(batches), dtype=np.int64)
    if nonempty.any():
        ends = starts[1:][nonempty] - 1
        firsts = starts[:-1][nonempty]
        backend = reader.backend
        edges = backend.to_host(scratch[backend.from_host(np.concatenate([firsts, ends]))])
        k = int(nonempty.sum())
        first[nonempty] = edges[:k]
        last[nonempty] = edges[k:]
        # offsets must not decrease inside a batch (batch boundaries are allowed to jump)
        steps = scratch[1:] - scratch[:-1]
        if len(steps):
            inner = xp.ones(len(steps), dtype=bool)
            boundary = starts[1:-1] - 1  # the step from one batch's last offset to the next batch's first
            boundary = boundary[(boundary >= 0) & (boundary < len(steps))]
            if len(boundary):
                inner[backend.from_host(boundary)] = False
            bad = bool(((steps < 0) & inner).any())
        else:
            bad = False
        data_sizes = np.array([b.chunks[name].data.size if b.chunks[name].data else 0 for b in batches])
        if bad or (first < 0).any() or (last < first).any() or (last > data_sizes).any():
            raise FileFormatError(f"{file.path!r}: column {name!r} has invalid string offsets (corrupt file)")
    return _StringSizes(scratch, starts[:-1], first, last - first)


def _read_column(
    reader: RangeReader,
    block: Block,
    plan: ColumnPlan,
    batches: Sequence[BatchLayout],
    row_starts: np.ndarray,
    strings: _StringSizes | None,
):
    """Submit the reads of one column; return the fix-up to run once they are done."""
    backend = reader.backend
    xp = backend.xp
    name, ctype = plan.name, plan.type
    raw = block.array(0, np.uint8, (block.nbytes,))
    layout = ctype.layout
    bits = None
    if layout in (Layout.FIXED, Layout.BYTES):
        width = ctype.width
        for b, start in zip(batches, row_starts):
            chunk = b.chunks[name]
            dst = plan.values.offset + int(start) * width
            size = chunk.length * width
            reader.read(chunk.values.offset, size, raw[dst : dst + size])
    elif layout == Layout.VARBINARY:
        base = np.cumsum(np.concatenate([[0], strings.nbytes]))
        for b, first, nbytes, pos in zip(batches, strings.first, strings.nbytes, base):
            if nbytes:
                dst = plan.data.offset + int(pos)
                reader.read(b.chunks[name].data.offset + int(first), int(nbytes), raw[dst : dst + int(nbytes)])
    else:  # BOOL: bit-packed in the file
        bits = _read_bitmaps(reader, xp, batches, name, lambda c: c.values)
    validity = _read_bitmaps(reader, xp, batches, name, lambda c: c.validity) if plan.validity else None

    def fixup() -> None:
        if layout == Layout.VARBINARY:
            _place_offsets(xp, block, plan, strings, row_starts, batches, name)
        elif layout == Layout.BOOL:
            values = block.array(plan.values.offset, np.uint8, (plan.length,))
            _unpack_batches(backend, bits, batches, name, row_starts, values, missing=None)
        if validity is not None:
            valid = xp.empty(plan.length, dtype=np.uint8)
            _unpack_batches(backend, validity, batches, name, row_starts, valid, missing=1)
            _pack_into(backend, valid, block.array(plan.validity.offset, np.uint8, (plan.validity.size,)))

    return fixup


def _read_bitmaps(reader: RangeReader, xp: Any, batches: Sequence[BatchLayout], name: str, which) -> tuple:
    """Read one bitmap per batch into a scratch array; (scratch, per-batch position or -1)."""
    sizes = []
    for b in batches:
        r = which(b.chunks[name])
        sizes.append((b.chunks[name].length + 7) // 8 if r is not None and b.chunks[name].length else 0)
    pos = np.cumsum([0] + sizes)
    scratch = xp.empty(max(int(pos[-1]), 1), dtype=np.uint8)
    where = []
    for b, p, size in zip(batches, pos[:-1], sizes):
        if size:
            reader.read(which(b.chunks[name]).offset, size, scratch[int(p) : int(p) + size])
            where.append(int(p))
        else:
            where.append(-1)
    return scratch, where


def _unpack_batches(backend: Backend, bitmaps: tuple, batches, name, row_starts, out: Any, missing: int | None) -> None:
    """Unpack each batch's bitmap into ``out`` (one byte per row) at the batch's first row."""
    scratch, where = bitmaps
    for b, start, p in zip(batches, row_starts, where):
        n = b.chunks[name].length
        if n == 0:
            continue
        dst = out[int(start) : int(start) + n]
        if p < 0:
            dst[...] = missing if missing is not None else 0
        elif backend.kind == "cpu":
            _core.unpack_bits(scratch[p:], 0, dst, n)
        else:
            launch("bitmap", "unpack_bits", backend.ordinal, n, (scratch[p:], np.int64(0), np.int64(n), dst))


def _pack_into(backend: Backend, bits: Any, out: Any) -> None:
    if backend.kind == "cpu":
        out[...] = np.packbits(bits.view(bool), bitorder="little")[: out.shape[0]]
        return
    n = int(bits.shape[0])
    launch("bitmap", "pack_bits", backend.ordinal, out.shape[0],
           (bits, np.int64(n), np.int32(0), out, np.int64(out.shape[0])))  # fmt: skip


def _place_offsets(xp, block: Block, plan: ColumnPlan, strings: _StringSizes, row_starts, batches, name) -> None:
    dst = block.array(plan.values.offset, np.int32, (plan.length + 1,))
    dst[0] = 0
    base = np.cumsum(np.concatenate([[0], strings.nbytes]))
    for b, start, pos, first, data_pos in zip(batches, row_starts, strings.starts, strings.first, base):
        n = b.chunks[name].length
        if n == 0:
            continue
        src = strings.scratch[int(pos) : int(pos) + n + 1]
        xp.subtract(src, np.int32(int(first) - int(data_pos)), out=dst[int(start) : int(start) + n + 1])
