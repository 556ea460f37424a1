"""Checks of buffer *contents* that another process wrote, before anything dereferences them.

A handle's layout says where each buffer is; the bytes inside some buffers steer reads too: a
string column's offsets say which bytes of its data buffer each row takes, a list column's which
elements of its child values. A forged handle, an
exporter that writes a bad offset after exporting, or a hostile writer committing to the store
daemon must never make a reader read outside the data buffer (SIGBUS, a segfault, or bytes from
elsewhere). The rule, per path (docs/ipc.md):

- ``ipc_import`` checks the offsets of every string/binary column of the view it returns, at
  import. A fixed-width table has none, so its import costs nothing more.
- the store daemon seals a host table (memfd seals) and then checks it at commit: readers whose
  descriptor carries the seals trust that check; any other memory (GPU tables, whose writer keeps
  its mapping) is checked again by every ``Store.get``.
- null counts are never taken from the other process: a view's count is recomputed from its
  validity bitmap when first asked for (``Column.null_count``), so a lie cannot make a column
  with NULLs pass as dense.

Offsets ``o[0..n]`` (the view's rows) must hold ``o[0] >= 0``, ``o[i] <= o[i + 1]`` and
``o[n] <= len(data)`` (in bytes for strings, in elements for lists). On a GPU one kernel launch
per string or list column folds the first failing position into one result array, read back with a
single copy per table; the CPU twin is vectorised NumPy (:func:`first_bad_offset`), and the GPU
tests compare the two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .._types import Layout
from ..errors import InvalidHandleError

if TYPE_CHECKING:
    from ..column import Column
    from ..table import Table

__all__ = ["first_bad_offset", "first_bad_offsets_gpu", "check_table"]

_NONE = np.uint64(np.iinfo(np.uint64).max)


def first_bad_offset(offsets: np.ndarray, data_size: int) -> int | None:
    """The first position p in [0, n] of int32 offsets ``o[0..n]`` that breaks the rules, or None.

    p == 0: ``o[0] < 0``; p < n: ``o[p + 1] < o[p]``; p == n: ``o[n] > data_size`` (the smallest
    failing position wins, as in the kernel).
    """
    o = np.asarray(offsets)
    n = o.size - 1
    if n < 0:
        return 0
    if o[0] < 0:
        return 0
    down = np.flatnonzero(o[1:] < o[:-1])
    if down.size:
        return int(down[0])
    if int(o[n]) > data_size:
        return n
    return None


def first_bad_offsets_gpu(backend: Any, columns: list[tuple[Any, int]]) -> list[int | None]:
    """The GPU twin of :func:`first_bad_offset` for many (offsets CuPy array, data size) at once.

    One launch per column on the current stream, one copy back for all of them.
    """
    from .. import kernels

    if not columns:
        return []
    xp = backend.xp
    with backend.activate():
        out = xp.full(len(columns), _NONE, dtype=xp.uint64)
        for k, (offsets, data_size) in enumerate(columns):
            n = int(offsets.size) - 1
            kernels.launch(
                "validate",
                "first_bad_offset",
                backend.ordinal,
                n + 1,
                (offsets, np.int64(n), np.int64(data_size), out[k:]),
            )
        host = backend.to_host(out)
    return [None if v == _NONE else int(v) for v in host]


def _offset_columns(table: Table) -> list[Column]:
    return [c for c in table._columns if c._plan.type.layout in (Layout.VARBINARY, Layout.LIST)]


def _limit(col: Column) -> int:
    """What the last offset may reach: data bytes (strings) or child elements (lists)."""
    plan = col._plan
    return plan.data.size if plan.type.layout == Layout.VARBINARY else plan.data.size // plan.type.storage.itemsize


def check_table(table: Table, where: str) -> None:
    """Raise :class:`InvalidHandleError` naming the column and row when a string column's offsets are bad.

    ``where`` names the source (the handle, the store table). Fixed-width tables return at once.
    """
    cols = _offset_columns(table)
    if not cols:
        return
    backend = table._live().backend
    if backend.kind == "cpu":
        bad = [first_bad_offset(c.offsets, _limit(c)) for c in cols]
    else:
        bad = first_bad_offsets_gpu(backend, [(c.offsets, _limit(c)) for c in cols])
    for col, p in zip(cols, bad):
        if p is None:
            continue
        base = max(p - 1, 0)
        window = backend.to_host(col.offsets[base : p + 2])  # the few offsets the message quotes
        is_list = col._plan.type.layout == Layout.LIST
        reason = _describe(window, p, base, len(col), _limit(col), "element child values" if is_list else "byte data")
        raise InvalidHandleError(
            f"{where}: column {col.name!r}: {'list' if is_list else 'string'} offsets would read outside the "
            f"{'child values' if is_list else 'data buffer'}: {reason} "
            f"(row {p}); the exporter wrote them wrong, or wrote after exporting"
        )


def _describe(window: np.ndarray, p: int, base: int, n: int, data_size: int, what: str) -> str:
    """Why position ``p`` fails, from the offsets ``window`` = ``o[base:p + 2]``."""
    here = int(window[p - base])
    if p == 0 and here < 0:
        return f"offsets[0] is {here} (negative)"
    if p < n:
        return f"offsets[{p}] = {here} > offsets[{p + 1}] = {int(window[p + 1 - base])} (not monotone)"
    return f"offsets[{n}] = {here} lies past the end of the {data_size}-{what} buffer"
