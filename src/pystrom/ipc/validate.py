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
- after that, memory another process may still write (imported views, unsealed store tables,
  exported GPU tables: ``Block.others_may_write``) is checked again wherever its offsets are
  followed, on a private copy (``Column._offsets_in_bounds``): a write made after the import
  gives a ``DataError`` naming the column and row, never a read outside the buffer.
- null counts are never taken from the other process: a view's count is recomputed from its
  validity bitmap when first asked for (``Column.null_count``), so a lie cannot make a column
  with NULLs pass as dense.

The rules and their checks (one kernel launch per column on a GPU, vectorised NumPy on the CPU)
are in :mod:`pystrom.memory.offsets`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._types import Layout
from ..errors import InvalidHandleError
from ..memory.offsets import describe, first_bad_offset, first_bad_offsets_gpu

if TYPE_CHECKING:
    from ..column import Column
    from ..table import Table

__all__ = ["first_bad_offset", "first_bad_offsets_gpu", "check_table"]


def _offset_columns(table: Table) -> list[tuple[str, Column]]:
    """Every column whose offsets steer reads, child columns too, with its name for messages."""
    return [
        (repr(c.name) + (f" ({path})" if path else ""), view)
        for c in table._columns
        for path, view in c._with_offsets()
    ]


def check_table(table: Table, where: str) -> None:
    """Raise :class:`InvalidHandleError` naming the column and row when a string column's offsets are bad.

    ``where`` names the source (the handle, the store table). Fixed-width tables return at once.
    """
    cols = _offset_columns(table)
    if not cols:
        return
    backend = table._live().backend
    if backend.kind == "cpu":
        bad = [first_bad_offset(c.offsets, c._offsets_limit()) for _, c in cols]
    else:
        bad = first_bad_offsets_gpu(backend, [(c.offsets, c._offsets_limit()) for _, c in cols])
    for (label, col), p in zip(cols, bad):
        if p is None:
            continue
        base = max(p - 1, 0)
        window = backend.to_host(col.offsets[base : p + 2])  # the few offsets the message quotes
        is_list = col._plan.type.layout in (Layout.LIST, Layout.LIST_OF)
        reason = describe(
            window, p, base, len(col), col._offsets_limit(), "element child values" if is_list else "byte data"
        )
        raise InvalidHandleError(
            f"{where}: column {label}: {'list' if is_list else 'string'} offsets would read outside the "
            f"{'child values' if is_list else 'data buffer'}: {reason} "
            f"(row {p}); the exporter wrote them wrong, or wrote after exporting"
        )
