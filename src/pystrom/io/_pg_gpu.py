"""Decode staged COPY chunks on a GPU (kernels/pg_decode.cu): copy each chunk's bytes and row starts
to the device, one thread per row writes the values into the table; strings take a length pass, a
scan and a copy pass. The CPU twin is the C++ decoder (``_core.pg_decode``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._layout import TablePlan
from ..kernels import launch
from ._pg_types import PgColumn, _Layout, decode_failure, descriptors
from ._pq import Kind

__all__ = ["decode_chunks"]


def decode_chunks(backend: Any, block: Any, plan: TablePlan, cols: Sequence[PgColumn], lay: _Layout) -> None:
    cp = backend.xp
    ordinal = backend.ordinal
    varlen = [i for i, c in enumerate(cols) if c.kind == Kind.VARLEN]
    ncols = np.int32(len(cols))
    with backend.activate():
        error = cp.zeros(3, dtype=cp.int64)
        first_failure = None
        for i, chunk in enumerate(lay.chunks):
            n, base = chunk.nrows, lay.row_bases[i]
            # The staging buffers are pinned: these copies run at full PCIe speed.
            dbuf = cp.empty(chunk.nbytes, dtype=cp.uint8)
            dbuf.set(chunk.buf[: chunk.nbytes])
            doffs = cp.empty(n, dtype=cp.int64)
            doffs.set(chunk.offsets[:n])
            ddesc = cp.asarray(descriptors(cols, plan, block.ptr, lay, i))
            launch(
                "pg_decode",
                "pg_decode_rows",
                ordinal,
                n,
                (dbuf, doffs, np.int64(n), np.int64(base), ddesc, ncols, error),
            )
            for c in varlen:  # lengths sit at offsets[row + 1]: scan them into this chunk's offsets
                offs = block.array(plan.columns[c].values.offset, np.int32, (lay.nrows + 1,))
                start = int(lay.data_bases[i, c])
                seg = offs[base + 1 : base + n + 1]
                seg[...] = (cp.cumsum(seg, dtype=cp.int64) + start).astype(cp.int32)
                offs[base : base + 1].fill(start)
            if varlen:
                launch(
                    "pg_decode", "pg_copy_strings", ordinal, n, (dbuf, doffs, np.int64(n), np.int64(base), ddesc, ncols)
                )
            if first_failure is None:
                code, row, column = (int(v) for v in error.get())
                if code:
                    first_failure = decode_failure(cols, lay, i, code, row, column)
                    break
        if first_failure is not None:
            raise first_failure
