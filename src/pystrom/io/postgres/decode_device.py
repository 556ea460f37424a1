"""Decode staged COPY chunks on a GPU (kernels/pg_decode.cu).

Most chunks are on the device already: :class:`.stream.Uploader` copied each one from the reader thread
that filled it while the other streams still read. One launch then decodes every chunk, one thread per
row writing its values into the table; strings take a length pass, a scan and a copy pass, and so do
arrays read as list<T> (an element count pass, then the elements); pgvector columns take a copy pass
with a warp per row. Chunks left
on the host (no room for their copy) are copied, decoded and freed one at a time. The CPU twin is the
C++ decoder (``_core.pg_decode``, called by :mod:`.decode`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...kernels import launch
from ...memory.layout import TablePlan
from .chunks import ChunkLayout, decode_failure, descriptors
from .columns import PgColumn
from .pump import Kind

__all__ = ["decode_chunks"]


def decode_chunks(backend: Any, block: Any, plan: TablePlan, cols: Sequence[PgColumn], lay: ChunkLayout) -> None:
    """Decode every chunk into the table. When the Uploader put all of them on the device (the usual
    case), one launch decodes them all and one scan per string column makes its offsets; otherwise
    each chunk is copied, decoded and freed in turn, so the device holds one chunk's bytes at a time."""
    if not lay.chunks:
        return
    cp = backend.xp
    # Strings and list arrays: their offsets come from a scan of the lengths/counts the first pass wrote.
    varlen = [i for i, c in enumerate(cols) if c.kind == Kind.VARLEN or (c.kind in Kind.ARRAYS and c.dim == 0)]
    vectors = any(c.kind in (Kind.VECTOR_F4, Kind.VECTOR_F2) for c in cols)
    if all(c.device is not None for c in lay.chunks):
        groups = [range(len(lay.chunks))]
    else:
        groups = [range(i, i + 1) for i in range(len(lay.chunks))]
    with backend.activate():
        # One error word per chunk, read once at the end: a failure is reported for the first chunk
        # (in row order) that has one, without a wait after every launch.
        errors = cp.zeros((len(lay.chunks), 3), dtype=cp.int64)
        ddesc = cp.asarray(descriptors(cols, plan, block.ptr, lay, 0))  # the kernels never read slot 4 (per chunk)
        current = cp.cuda.get_current_stream()
        try:
            for group in groups:
                _decode_group(backend, block, plan, lay, group, ddesc, len(cols), varlen, vectors, errors, current)
            found = errors.get()  # waits for every kernel
        finally:
            current.synchronize()  # the scratch below goes back to the pool only after its last reader
            for chunk in lay.chunks:
                chunk.device = None
        for i, (code, row, column) in enumerate(found.tolist()):
            if code:
                raise decode_failure(cols, lay, i, code, row, column)


def _decode_group(
    backend: Any,
    block: Any,
    plan: TablePlan,
    lay: ChunkLayout,
    group: range,
    ddesc: Any,
    ncols: int,
    varlen: list[int],
    vectors: bool,
    errors: Any,
    current: Any,
) -> None:
    """Decode the consecutive chunks ``group`` (their device copies, made now where missing) in one launch."""
    cp = backend.xp
    table = np.empty((len(group), 3), dtype=np.int64)  # the kernels' chunk table: bytes, row starts, first row
    keep = []  # device copies made here: alive until the launches below are queued
    for j, i in enumerate(group):
        chunk = lay.chunks[i]
        if chunk.device is not None:
            dbuf, doffs, copied = chunk.device
            current.wait_event(copied)
        else:  # the staging buffers are pinned: these copies run at full PCIe speed
            dbuf = cp.empty(chunk.nbytes, dtype=cp.uint8)
            dbuf.set(chunk.buf[: chunk.nbytes])
            doffs = cp.empty(chunk.nrows, dtype=cp.int64)
            doffs.set(chunk.offsets[: chunk.nrows])
            keep.append((dbuf, doffs))
        table[j] = (dbuf.data.ptr, doffs.data.ptr, lay.row_bases[i])
    first = lay.row_bases[group[0]]
    nrows = sum(lay.chunks[i].nrows for i in group)
    dtable = cp.asarray(table)
    nchunks, ncols32 = np.int32(len(group)), np.int32(ncols)
    launch(
        "pg_decode",
        "pg_decode_rows",
        backend.ordinal,
        nrows,
        (dtable, nchunks, np.int64(nrows), ddesc, ncols32, errors[group[0] :]),
    )
    for c in varlen:  # lengths sit at offsets[row + 1]: scan them into offsets from the group's first byte (element)
        offs = block.array(plan.columns[c].values.offset, np.int32, (lay.nrows + 1,))
        start = int(lay.data_bases[group[0], c])
        seg = offs[first + 1 : first + nrows + 1]
        seg[...] = (cp.cumsum(seg, dtype=cp.int64) + start).astype(cp.int32)
        offs[first : first + 1].fill(start)
    if varlen:
        launch(
            "pg_decode",
            "pg_copy_strings",
            backend.ordinal,
            nrows,
            (dtable, nchunks, np.int64(nrows), ddesc, ncols32, errors[group[0] :]),
        )
    if vectors:  # a warp per row (32 work items each)
        args = (dtable, nchunks, np.int64(nrows), ddesc, ncols32)
        launch("pg_decode", "pg_copy_vectors", backend.ordinal, nrows * 32, args)
