"""A filtered read of a group of record batches on the CPU: the filter's columns read whole, the others
only where a row matched, through a buffer small enough to stay in the cache.

Read whole and then filtered, a column's bytes cross memory three times: the read copies them out of the
page cache into the table, the filter's gather reads them back, and the gather writes the matching rows.
On the CPU that traffic is the scan's cost (``read_arrow`` reaches 20-28 GB/s on the development VM, a
10%-selective scan of the same file a third of that). Here :func:`read_filtered` reads the columns the
filter needs (and any it cannot sieve) the ordinary way (:func:`.read.direct.read_batches`), evaluates the
filter, allocates the result, and then reads every other column slice by slice (:data:`SLICE_ROWS`)
into a scratch buffer from which the matching rows are gathered while the slice is still in the cache.
A slice holding no matching row is not read at all.

Sieved: fixed-width columns (numbers, dates, times, decimals, fixed-size binary) read directly, stored
uncompressed. Their validity bitmaps are read whole (an eighth of a byte a row), their NULLs counted
against each batch's claim as the ordinary read does, and the matching rows' bits packed into the
result; a batch claiming no NULL has no bitmap to read (the format lets readers ignore one, and pyarrow
and the ordinary read do). Everything the reads rely
on (each values buffer inside the file and long enough for its rows) was checked from the metadata by
:mod:`.file.metadata` and :mod:`.read.batches`; a read that comes back short (the file shrank) is a FileFormatError.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ...._ops import as_mask, gather_into
from ...._types import ColumnType, Layout
from ....errors import FileFormatError
from ....memory import bitmap
from ....memory.layout import ColumnSpec
from ....table import Table
from ..file.metadata import PACKED_BASE, ArrowFile
from ..read.direct import read_batches
from ..read.layouts import Layouts

__all__ = ["SLICE_ROWS", "read_filtered", "sieved_columns"]

# Rows of a column read at a time: 1 MiB of 8-byte values, half a core's L2 on the development VM, so
# the gather that follows each read finds the slice in the cache (256 KiB to 4 MiB measured within the
# VM's noise: 48-60 ms for a 10M-row scan).
SLICE_ROWS = 1 << 17


def sieved_columns(
    file: ArrowFile,
    layouts: Layouts,
    columns: Sequence[str],
    types: dict[str, ColumnType | None],
    needed: Sequence[str],
) -> list[str]:
    """The ``columns`` (not among the filter's ``needed`` ones) this module reads sieved (module docstring)."""
    if file.compressed:
        return []
    out = []
    for name in columns:
        ctype = types.get(name)
        chunks = layouts.chunks.get(name)
        if name in needed or ctype is None or chunks is None or ctype.layout not in (Layout.FIXED, Layout.BYTES):
            continue
        values = chunks.values.offset[chunks.length > 0]
        bitmaps = chunks.validity.offset[chunks.null_count > 0]
        buffers = np.concatenate([values, bitmaps])
        if (buffers < 0).any() or (buffers >= PACKED_BASE).any():  # missing, or stored compressed
            continue
        out.append(name)
    return out


def read_filtered(
    file: ArrowFile,
    layouts: Layouts,
    columns: Sequence[str],
    types: dict[str, ColumnType | None],
    backend: Any,
    predicate: Any,
) -> tuple[Table, int, int]:
    """The rows of the batches ``layouts`` that ``predicate`` keeps, ``columns`` of them, as one Table on
    the CPU ``backend``; also the file bytes read and the rows the batches hold."""
    sieved = sieved_columns(file, layouts, columns, types, predicate.columns)
    whole = [c for c in columns if c not in sieved]
    first, nbytes = read_batches(file, layouts, whole, types, backend)
    mask = as_mask(first, predicate.evaluate(first))
    if not sieved:
        return first.filter(mask), nbytes, first.num_rows
    rows = np.flatnonzero(mask)
    starts = np.concatenate([[0], np.cumsum(layouts.num_rows)])
    valid = {}
    nullable = [c for c in sieved if layouts.chunks[c].null_count.any()]
    if nullable:
        batch = np.searchsorted(starts, rows, side="right") - 1  # each row's batch, and its bit there
        local = rows - starts[batch]
        place = (batch, local >> 3, (local & 7).astype(np.uint8))
        for c in nullable:
            valid[c], bitmap_bytes = _validity(file, layouts, c, place, backend)
            nbytes += bitmap_bytes
    slots = [
        ColumnSpec(c, types[c], len(rows), len(rows) - int(np.count_nonzero(valid[c])) if c in valid else 0, 0)
        if c in sieved
        else first.column(c)
        for c in columns
    ]
    block, plan = gather_into(backend, rows, slots)
    targets = []
    for cplan in plan.columns:
        if cplan.name in sieved:
            ctype = cplan.type
            shape = (len(rows), ctype.width) if ctype.layout == Layout.BYTES else (len(rows),)
            targets.append((cplan.name, ctype, block.array(cplan.values.offset, ctype.storage, shape)))
            if cplan.validity is not None:
                block.write_device(cplan.validity.offset, bitmap.pack(backend, valid[cplan.name]))
    nbytes += _sieve(file, layouts, starts, rows, targets)
    fields = [file.schema.field(c) if c in sieved else first.schema.field(c) for c in columns]
    table = Table._wrap(block, plan, pa.schema(fields, metadata=file.schema.metadata), len(rows))
    return table, nbytes, first.num_rows


def _validity(
    file: ArrowFile, layouts: Layouts, name: str, place: tuple[np.ndarray, np.ndarray, np.ndarray], backend: Any
) -> tuple[np.ndarray, int]:
    """Whether each matching row of column ``name`` is valid (``place``: each row's batch, byte and bit
    in its batch's bitmap); the bytes read. Every
    bitmap of the group is read whole (an eighth of a byte a row) and its NULLs counted against the
    batch's claim first, as the ordinary read does: a file that disagrees with itself is refused the same
    way."""
    chunks = layouts.chunks[name]
    has = np.flatnonzero(chunks.null_count > 0)  # a batch claiming no NULL has no bitmap to read
    n = layouts.num_rows[has]
    sizes = (n + 7) // 8
    bitmaps = file.read_pieces(chunks.validity.offset[has], sizes)  # back to back, each from byte 0
    # set bits over the whole bitmaps, less those past each batch's last row in its last byte
    first_byte = np.full(len(layouts), -1, dtype=np.int64)
    first_byte[has] = np.cumsum(sizes) - sizes
    set_bits = sum(bitmap.count_set(backend, bitmaps, 8 * int(at), int(rows)) for at, rows in zip(first_byte[has], n))
    found = int(n.sum()) - set_bits
    claimed = int(chunks.null_count.sum())
    if found != claimed:
        raise FileFormatError(
            f"{file.path!r}: column {name!r}: the record batches claim {claimed} NULLs, their validity bitmaps "
            f"hold {found} (corrupt file)"
        )
    batch, byte, bit = place
    at = first_byte[batch]
    if len(has) == len(layouts):  # every batch has a bitmap
        valid = ((bitmaps[at + byte] >> bit) & 1).view(bool)
    else:
        valid = np.ones(len(batch), dtype=bool)
        some = at >= 0
        valid[some] = (bitmaps[at[some] + byte[some]] >> bit[some]) & 1
    return valid, int(sizes.sum())


def _sieve(
    file: ArrowFile, layouts: Layouts, starts: np.ndarray, rows: np.ndarray, targets: list[tuple[str, ColumnType, Any]]
) -> int:
    """Gather the values of ``rows`` (group row numbers, ascending) of each target column (name, type,
    output array) into its output, reading only the slices of its values buffers that hold one; the
    bytes read."""
    scratch = np.empty(SLICE_ROWS * max(ctype.width for _, ctype, _ in targets), dtype=np.uint8)
    views = []
    for _, ctype, _ in targets:
        view = scratch[: SLICE_ROWS * ctype.width].view(ctype.storage)
        views.append(view.reshape(SLICE_ROWS, ctype.width) if ctype.layout == Layout.BYTES else view)
    buffer = memoryview(scratch)
    fd = file.fileno()
    bounds = np.searchsorted(rows, starts)  # each batch's matching rows: rows[bounds[b]:bounds[b + 1]]
    read = 0
    for b in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
        base, n = int(bounds[b]), int(layouts.num_rows[b])
        local = rows[base : int(bounds[b + 1])] - starts[b]
        edges = np.searchsorted(local, np.arange(0, n + SLICE_ROWS, SLICE_ROWS))
        slices = []  # (first row of the slice, its rows, where its matches go in the output, their indices in it)
        for s in np.flatnonzero(edges[1:] > edges[:-1]).tolist():
            lo, hi, first = int(edges[s]), int(edges[s + 1]), s * SLICE_ROWS
            slices.append((first, min(SLICE_ROWS, n - first), slice(base + lo, base + hi), local[lo:hi] - first))
        for (name, ctype, out), view in zip(targets, views):
            offset, width = int(layouts.chunks[name].values.offset[b]), ctype.width
            for first, count, into, index in slices:
                size, at = count * width, offset + first * width
                got = os.preadv(fd, [buffer[:size]], at)
                if got != size:
                    raise FileFormatError(
                        f"{file.path!r}: record batch {int(layouts.index[b])}, column {name!r}: the file ends inside "
                        f"its values (read {got} of {size} bytes at offset {at}): it shrank while being read"
                    )
                read += size
                # mode="clip": the indices lie inside the slice by construction; "raise" would buffer the output
                np.take(view, index, axis=0, out=out[into], mode="clip")
    return read
