"""UTF-8 validation of the string columns a direct read put in the table.

The Arrow format requires every value of a ``string`` column to be UTF-8; a file that breaks that (a
corrupt file, a writer that put binary bytes in a string column) used to come back as it was, and
``to_arrow().to_pylist()`` then raised a raw UnicodeDecodeError. Now a read refuses it with a
FileFormatError naming the file, the column, the record batch and the row, as pyarrow's full validation
refuses it: NULL rows are not values, their bytes are not judged.

When: after the read, on the table's own offsets and bytes (one pass over the column's data, the data
possibly in the CPU cache still). The read's offsets check (:mod:`.read.offsets`) cannot take it over: it
runs before the data is read, to size the table. What the two would share, the string starts, the UTF-8
check reads itself: a string starting inside a character is a cut row even where the bytes are fine as
a whole.

- CPU: ``_core.utf8_first_bad_row`` (csrc/utf8.cpp), without the GIL, the columns (and long columns in
  pieces of rows) spread over the read's thread pool: the whole span is checked in one pass (sixteen
  ASCII bytes at a time), rows one by one only where that pass fails.
- GPU: ``kernels/utf8.cu``, one launch for every string column of the read, each byte judged on its
  own (memory speed: the data streamed once, eight bytes a thread at a time), one copy back of a row
  per column. A column whose reported row is NULL is checked again on the host, skipping NULLs (its
  NULL rows' bytes may be anything).

Costs are in docs/arrow-files.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .... import _core
from ...._pools import run_all
from ....errors import FileFormatError
from ....kernels import kernel, sm_count
from ..file.ranges import _host_pool, io_threads

__all__ = ["StringColumn", "check_utf8", "first_bad_rows_twin"]

_THREADS = 256
_MAX_GRID_Y = 65535
_PIECE_BYTES = 32 << 20  # a CPU task's bytes: big enough that the pool's hand-off is noise
_NONE = np.iinfo(np.uint64).max


@dataclass
class StringColumn:
    """One string column of a read: its table arrays (``offsets``: n + 1 int32 from 0; ``validity``: its
    bitmap from bit 0, None without NULLs) and where its rows came from (for the error)."""

    name: str
    offsets: Any
    data: Any
    validity: Any


def check_utf8(backend: Any, path: str, columns: Sequence[StringColumn], batches: np.ndarray,
               row_starts: np.ndarray) -> None:  # fmt: skip
    """Refuse the read when a row of ``columns`` is not UTF-8 (module docstring); ``batches``: each record
    batch's index in the file, ``row_starts``: its first row in the table."""
    if not columns:
        return
    bad = _first_bad_rows_host(columns) if backend.kind == "cpu" else _first_bad_rows_device(backend, columns)
    for col, row in zip(columns, bad):
        if row >= 0:
            b = int(np.searchsorted(row_starts, row, side="right")) - 1
            raise FileFormatError(
                f"{path!r}: record batch {int(batches[b])}, column {col.name!r}: row {row - int(row_starts[b])} "
                f"(row {row} of the read) is not valid UTF-8, which the Arrow format requires of a string "
                "column (corrupt file; a writer that stores other bytes should declare the column binary)"
            )


def _first_bad_rows_host(columns: Sequence[StringColumn]) -> list[int]:
    """Each column's first bad row (-1: none), in pieces of about ``_PIECE_BYTES`` on the read's pool."""
    tasks = []
    for c, col in enumerate(columns):
        offsets = np.asarray(col.offsets)
        n = offsets.shape[0] - 1
        if n <= 0:
            continue
        pieces = min(4 * io_threads(), int(offsets[-1]) // _PIECE_BYTES)
        if pieces <= 1:
            tasks.append((c, 0, n))
            continue
        edges = np.unique(np.searchsorted(offsets, np.linspace(0, int(offsets[-1]), pieces + 1)[1:-1]))
        edges = [0, *[int(e) for e in edges if 0 < e < n], n]
        tasks += [(c, lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]

    def run(task: tuple[int, int, int]) -> int:
        c, lo, hi = task
        col = columns[c]
        row = _core.utf8_first_bad_row(col.data, col.offsets[lo : hi + 1], col.validity, lo)
        return -1 if row < 0 else lo + row

    found = run_all(_host_pool(), run, tasks) if len(tasks) > 1 else [run(t) for t in tasks]
    out = [-1] * len(columns)
    for (c, _, _), row in zip(tasks, found):  # tasks are in row order within a column: the first found wins
        if row >= 0 and out[c] < 0:
            out[c] = row
    return out


def _first_bad_rows_device(backend: Any, columns: Sequence[StringColumn]) -> list[int]:
    import cupy

    xp = backend.xp
    table = np.array([[backend.array_ptr(c.data) if c.data.shape[0] else backend.array_ptr(c.offsets),
                       backend.array_ptr(c.offsets), c.offsets.shape[0] - 1] for c in columns],
                     dtype=np.int64).reshape(-1)  # fmt: skip
    n = len(columns)
    out = xp.full(n, _NONE, dtype=xp.uint64)
    grid_y = min(n, _MAX_GRID_Y)
    grid_x = max(1, sm_count(backend.ordinal) * 32 // grid_y)
    fn = kernel("utf8", "utf8_check", backend.ordinal)
    with cupy.cuda.Device(backend.ordinal):
        fn((grid_x, grid_y), (_THREADS,), (xp.asarray(table), np.int64(n), out))
    rows = [-1 if r == _NONE else int(r) for r in backend.to_host(out).tolist()]
    for c, col in enumerate(columns):  # the kernel does not tell NULL rows apart: the host does, skipping them
        if rows[c] >= 0 and col.validity is not None:
            host = StringColumn(col.name, backend.to_host(col.offsets), backend.to_host(col.data),
                                backend.to_host(col.validity))  # fmt: skip
            rows[c] = _first_bad_rows_host([host])[0]
    return rows


def first_bad_rows_twin(columns: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[int]:
    """``kernels/utf8.cu``'s rule in NumPy, position by position (the kernel's twin in the tests): per
    column (data, offsets), the lowest row holding a bad byte or cut by a string start inside a
    character, NULLs not told apart; -1 where there is none."""
    out = []
    for data, offsets in columns:
        n = offsets.shape[0] - 1
        size = int(offsets[-1]) if n > 0 else 0
        b = np.asarray(data[:size], dtype=np.uint8)
        cont = (b & 0xC0) == 0x80
        length = _lengths(b)
        tail = np.concatenate([b, np.zeros(3, np.uint8)])
        b1, b2, b3 = tail[1 : size + 1], tail[2 : size + 2], tail[3 : size + 3]
        lo = np.where(b == 0xE0, 0xA0, np.where(b == 0xF0, 0x90, 0x80))
        hi = np.where(b == 0xED, 0x9F, np.where(b == 0xF4, 0x8F, 0xBF))
        at = np.arange(size)
        lead = (b >= 0x80) & ~cont
        bad_lead = lead & (
            (length == 0)
            | (at + length > size)
            | (b1 < lo)
            | (b1 > hi)
            | ((length >= 3) & ((b2 & 0xC0) != 0x80))
            | ((length == 4) & ((b3 & 0xC0) != 0x80))
        )
        head = np.concatenate([np.full(3, 0x80, np.uint8), b])  # before the data: nothing covers
        q1, q2, q3 = head[2 : size + 2], head[1 : size + 1], head[:size]
        c1, c2, c3 = ((q & 0xC0) == 0x80 for q in (q1, q2, q3))
        covered = np.where(~c1, _lengths(q1) > 1, np.where(~c2, _lengths(q2) > 2, ~c3 & (_lengths(q3) > 3)))
        bad = np.flatnonzero(bad_lead | (cont & ~covered))
        starts = np.asarray(offsets[1:n], dtype=np.int64)
        starts = starts[(starts > 0) & (starts < size)]
        cut = starts[cont[starts] & covered[starts]] - 1
        rows = np.searchsorted(offsets, np.concatenate([bad, cut]), side="right") - 1
        out.append(int(rows.min()) if len(rows) else -1)
    return out


def _lengths(b: np.ndarray) -> np.ndarray:
    """Bytes in the sequence each byte starts (1 to 4), 0 where it starts none (kernels/utf8.cu)."""
    return np.select([b < 0x80, b < 0xC2, b < 0xE0, b < 0xF0, b < 0xF5], [1, 0, 2, 3, 4], 0)
