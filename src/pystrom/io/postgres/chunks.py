"""Where the staged COPY chunks of a read go in the Table, and what the decoders are told about them.

The pump counted each chunk's rows, NULLs and string bytes per column while it streamed; from those
counts :func:`layout_chunks` gives every chunk its first table row and, per string column, its first
byte. :func:`descriptors` turns a column's place in the allocation into the decoders' per-column slots
(csrc/pg_decode.hpp, kernels/pg_decode.cu), and :func:`decode_failure` a decoder's failure word into an
error naming the column and the table row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..._layout import TablePlan
from ...errors import PostgresError
from .pump import DESC_SLOTS, FAILURES, Kind, Staged
from .types import PgColumn

__all__ = ["ChunkLayout", "layout_chunks", "descriptors", "decode_failure"]


@dataclass
class ChunkLayout:
    """Where every chunk goes: its first row and, per string column, its first byte."""

    chunks: list[Staged]
    row_bases: list[int]
    data_bases: np.ndarray  # [chunk, column] int64
    nrows: int
    nulls: np.ndarray
    nbytes: np.ndarray


def layout_chunks(parts: Sequence[list[Staged]], ncols: int) -> ChunkLayout:
    """The chunks of all partitions, in partition order, laid end to end."""
    chunks = [c for part in parts for c in part]
    rows = np.array([c.nrows for c in chunks], dtype=np.int64)
    row_bases = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    per_chunk = np.array([c.bytes for c in chunks], dtype=np.int64).reshape(len(chunks), ncols)
    data_bases = np.cumsum(per_chunk, axis=0) - per_chunk
    nulls = np.sum([c.nulls for c in chunks], axis=0, dtype=np.int64) if chunks else np.zeros(ncols, np.int64)
    return ChunkLayout(
        chunks, [int(b) for b in row_bases[:-1]], data_bases, int(row_bases[-1]), nulls, per_chunk.sum(axis=0)
    )


def descriptors(cols: Sequence[PgColumn], plan: TablePlan, base_ptr: int, lay: ChunkLayout, chunk: int) -> np.ndarray:
    """The decoder's per-column descriptors for one chunk (csrc/pg_decode.hpp)."""
    desc = np.zeros((len(cols), DESC_SLOTS), dtype=np.int64)
    for i, (col, cp) in enumerate(zip(cols, plan.columns)):
        desc[i, 0] = col.kind
        desc[i, 1] = base_ptr + cp.values.offset
        desc[i, 2] = base_ptr + cp.validity.offset if cp.validity is not None else 0
        desc[i, 3] = base_ptr + cp.data.offset if cp.data is not None else 0
        desc[i, 4] = lay.data_bases[chunk, i] if col.kind == Kind.VARLEN else 0
        desc[i, 5] = col.scale
        desc[i, 6] = col.dim
        desc[i, 7] = cp.data.size if cp.data is not None else 0  # the GPU string copy stays inside it
    return desc


def decode_failure(
    cols: Sequence[PgColumn], lay: ChunkLayout, chunk: int, code: int, row: int, column: int
) -> Exception:
    col = cols[column]
    return PostgresError(
        f"column {col.name!r} ({col.pg_type}), row {lay.row_bases[chunk] + row}: {FAILURES.get(code, code)}"
    )
