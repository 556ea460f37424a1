"""Distinct values and rows: ``Column.unique``, ``Column.value_counts`` and ``Table.unique``.

Rows are grouped by sorting them stably by the parts of :mod:`._keys` (so equal values are
adjacent, each group's rows in input order) and marking where the parts change. NULL is one value,
NaN is one value, -0.0 and 0.0 are one value (the first one seen is kept), as in polars. Results
come in the values' order (NULL first) unless ``maintain_order`` asks for the order of first
appearance; everything runs on the table's device and ends in one gather.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _ops
from ._keys import groups, key_parts, lexsort, stable_argsort
from .column import Column
from .errors import InvalidArgumentError, SchemaMismatchError
from .table import Table

__all__ = ["unique_rows", "unique_values", "value_counts"]

_KEEP = ("first", "last", "any", "none")


def _grouped(table: Table, names: Sequence[str]) -> tuple[Any, Any]:
    """(stable order of the rows by the columns ``names``, where each group starts in it)."""
    xp = table._backend.xp
    parts = []
    for name in names:
        parts += key_parts(table.column(name))
    if not parts:  # no columns: every row is the same (empty) row
        order = xp.arange(table.num_rows, dtype=np.int64)
        return order, xp.zeros(min(table.num_rows, 1), dtype=np.int64)
    order = lexsort(xp, parts, table.num_rows)
    return order, groups(xp, parts, order)


def _subset(table: Table, subset: str | Sequence[str] | None) -> list[str]:
    if subset is None:
        return table.column_names
    names = [subset] if isinstance(subset, str) else list(subset)
    for name in names:
        table.column(name)  # ColumnNotFoundError names it
    return names


def unique_rows(table: Table, subset: str | Sequence[str] | None, keep: str, maintain_order: bool) -> Table:
    if keep not in _KEEP:
        raise InvalidArgumentError(f"unique: keep must be one of {_KEEP}; got {keep!r}")
    if not isinstance(maintain_order, bool):
        raise InvalidArgumentError(f"unique: maintain_order must be a bool; got {maintain_order!r}")
    names = _subset(table, subset)
    backend = table._live().backend
    xp = backend.xp
    with backend.activate():
        order, starts = _grouped(table, names)
        ends = xp.concatenate([starts, xp.asarray([table.num_rows], dtype=np.int64)])[1:] - 1  # none if no rows
        if keep == "last":
            rows = order[ends]
        elif keep == "none":
            rows = order[starts[ends == starts]]
        else:  # "first", and "any" (the first is as good as any)
            rows = order[starts]
        if maintain_order:
            rows = xp.sort(rows)
        return _ops.gather(table, rows)


def unique_values(col: Column, maintain_order: bool) -> Column:
    table = Table._of_column(col)
    return unique_rows(table, [col.name], "first", maintain_order).column(0)


def value_counts(col: Column, sort: bool, name: str | None, normalize: bool) -> Table:
    from ._compute import with_arrays  # up: a convenience method; _compute builds Tables

    for flag, value in (("sort", sort), ("normalize", normalize)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"value_counts: {flag} must be a bool; got {value!r}")
    count_name = name if name is not None else ("proportion" if normalize else "count")
    if not isinstance(count_name, str) or not count_name:
        raise InvalidArgumentError(f"value_counts: name must be a non-empty str; got {name!r}")
    if count_name == col.name:
        raise SchemaMismatchError(
            f"value_counts of column {col.name!r} would give two columns named {count_name!r}: pass name='...'"
        )
    table = Table._of_column(col)
    backend = table._live().backend
    xp = backend.xp
    n = table.num_rows
    with backend.activate():
        order, starts = _grouped(table, [col.name])
        counts = xp.diff(xp.concatenate([starts, xp.asarray([n], dtype=np.int64)]))
        rows = order[starts]
        if sort:  # most frequent first; equal counts stay in the values' order
            by_count = stable_argsort(xp, -counts)
            rows, counts = rows[by_count], counts[by_count]
        values = _ops.gather(table, rows)
        column = counts / n if normalize else counts.astype(np.int64, copy=False)
        return with_arrays(values, {count_name: (column, None)})
