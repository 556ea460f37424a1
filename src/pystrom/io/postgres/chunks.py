"""Where the staged COPY chunks of a read go in the Table, and what the decoders are told about them.

The pump counted each chunk's rows, NULLs and string bytes (array elements) per column while it
streamed; from those counts :func:`layout_chunks` gives every chunk its first table row and, per
string (array) column, its first byte (element). :func:`descriptors` turns a column's place in the
allocation into the decoders' per-column slots (csrc/pg_decode.hpp, kernels/pg_decode.cu), and
:func:`decode_failure` a decoder's failure word into an error naming the column and the table row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._types import Layout
from ...errors import PostgresError
from ...memory.layout import TablePlan, child_length
from .columns import PgColumn
from .pump import DESC_SLOTS, FAILURES, Kind, Staged, new_shape

ARRAY_NDIM = 8  # the decoders' failure code of a multi-dimensional array (csrc/pg_decode.hpp)

__all__ = ["ChunkLayout", "layout_chunks", "descriptors", "decode_failure"]


@dataclass
class ChunkLayout:
    """Where every chunk goes: its first row and, per string (array) column, its first byte (element)."""

    chunks: list[Staged]
    row_bases: list[int]
    data_bases: np.ndarray  # [chunk, column] int64
    nrows: int
    nulls: np.ndarray
    nbytes: np.ndarray  # per column: string bytes; array columns: elements
    shape: np.ndarray  # [column, 3]: an array column's NULL elements, least and greatest length (else -1 ...)


def layout_chunks(parts: Sequence[list[Staged]], ncols: int) -> ChunkLayout:
    """The chunks of all partitions, in partition order, laid end to end."""
    chunks = [c for part in parts for c in part]
    rows = np.array([c.nrows for c in chunks], dtype=np.int64)
    row_bases = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    per_chunk = np.array([c.bytes for c in chunks], dtype=np.int64).reshape(len(chunks), ncols)
    data_bases = np.cumsum(per_chunk, axis=0) - per_chunk
    nulls = np.sum([c.nulls for c in chunks], axis=0, dtype=np.int64) if chunks else np.zeros(ncols, np.int64)
    shape = new_shape(ncols)
    for c in chunks:
        if c.shape is not None:
            shape[:, 0] += c.shape[:, 0]
            shape[:, 1] = np.minimum(shape[:, 1], c.shape[:, 1])
            shape[:, 2] = np.maximum(shape[:, 2], c.shape[:, 2])
    return ChunkLayout(
        chunks, [int(b) for b in row_bases[:-1]], data_bases, int(row_bases[-1]), nulls, per_chunk.sum(axis=0), shape
    )


def descriptors(cols: Sequence[PgColumn], plan: TablePlan, base_ptr: int, lay: ChunkLayout, chunk: int) -> np.ndarray:
    """The decoder's per-column descriptors for one chunk (csrc/pg_decode.hpp)."""
    desc = np.zeros((len(cols), DESC_SLOTS), dtype=np.int64)
    for i, (col, cp) in enumerate(zip(cols, plan.columns)):
        if col.kind in Kind.ARRAYS:
            desc[i] = _array_descriptor(col, cp, base_ptr, lay.data_bases[chunk, i])
            continue
        desc[i, 0] = col.kind
        desc[i, 1] = base_ptr + cp.values.offset
        desc[i, 2] = base_ptr + cp.validity.offset if cp.validity is not None else 0
        desc[i, 3] = base_ptr + cp.data.offset if cp.data is not None else 0
        desc[i, 4] = lay.data_bases[chunk, i] if col.kind == Kind.VARLEN else 0
        desc[i, 5] = col.scale
        desc[i, 6] = col.dim
        desc[i, 7] = cp.data.size if cp.data is not None else 0  # the GPU string copy stays inside it
    return desc


def _array_descriptor(col: PgColumn, cp: Any, base_ptr: int, first: int) -> list[int]:
    """An array column's slots (csrc/pg_decode.hpp): a list's offsets and elements, or a fixed_size_list's
    elements (its values span) and d; the element bitmap; the column's element count, which bounds
    every write."""
    listed = cp.type.layout == Layout.LIST
    return [
        col.kind,
        base_ptr + cp.values.offset if listed else 0,
        base_ptr + cp.validity.offset if cp.validity is not None else 0,
        base_ptr + (cp.data.offset if listed else cp.values.offset),
        int(first) if listed else 0,
        base_ptr + cp.child_validity.offset if cp.child_validity is not None else 0,
        0 if listed else cp.type.list_size,
        child_length(cp),
    ]


def decode_failure(
    cols: Sequence[PgColumn], lay: ChunkLayout, chunk: int, code: int, row: int, column: int
) -> Exception:
    col = cols[column]
    error = PostgresError(
        f"column {col.name!r} ({col.pg_type}), row {lay.row_bases[chunk] + row}: {FAILURES.get(code, code)}"
    )
    error.multi_dimensional = code == ARRAY_NDIM  # read_postgres reads again, the shapes asked of the server
    return error
