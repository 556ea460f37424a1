"""``Table.sort`` (polars' signature) and ``Table.sort_by`` (pyarrow's), on the table's device.

Both become one list of (column, descending, nulls_last) keys, turned into the parts of
:mod:`._keys` and sorted stably (rows with equal keys keep their order), then one gather of every
column into a new allocation. NaN is the largest number in ``sort`` (as in polars) and sits beside
the NULLs in ``sort_by`` (as in pyarrow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _ops
from ._keys import key_parts, lexsort
from .errors import InvalidArgumentError
from .table import Table

__all__ = ["sort", "sort_by"]


def _flags(what: str, value: bool | Sequence[bool], count: int) -> list[bool]:
    if isinstance(value, bool):
        return [value] * count
    if isinstance(value, (list, tuple)) and all(isinstance(v, bool) for v in value):
        if len(value) != count:
            raise InvalidArgumentError(f"sort: {what} has {len(value)} entries for {count} sort key(s)")
        return list(value)
    raise InvalidArgumentError(f"sort: {what} must be a bool or a list of bools, one per key; got {value!r}")


def _names(by: Any, more_by: tuple[Any, ...]) -> list[str]:
    names = [by] if isinstance(by, str) else list(by) if isinstance(by, (list, tuple)) else [by]
    names += list(more_by)
    if not names:
        raise InvalidArgumentError("sort needs at least one column name")
    for name in names:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"sort keys are column names (str); got {name!r}")
    return names


def sort(
    table: Table,
    by: str | Sequence[str],
    more_by: tuple[str, ...],
    descending: bool | Sequence[bool],
    nulls_last: bool | Sequence[bool],
) -> Table:
    names = _names(by, more_by)
    return _sorted(table, names, _flags("descending", descending, len(names)),
                   _flags("nulls_last", nulls_last, len(names)), "largest")  # fmt: skip


_ORDERS = {"ascending": False, "descending": True}
_PLACEMENTS = {"at_start": False, "at_end": True}


def sort_by(table: Table, sorting: str | Sequence[tuple[str, ...]], null_placement: str | None) -> Table:
    if null_placement is not None and null_placement not in _PLACEMENTS:
        raise InvalidArgumentError(f"sort_by: null_placement must be 'at_start' or 'at_end'; got {null_placement!r}")
    if isinstance(sorting, str):
        sorting = [(sorting, "ascending")]
    if not isinstance(sorting, (list, tuple)) or not sorting:
        raise InvalidArgumentError(
            f"sort_by takes a column name or a list of (name, 'ascending' | 'descending'[, 'at_start' | 'at_end']) "
            f"tuples; got {sorting!r}"
        )
    names, descending, nulls_last = [], [], []
    for key in sorting:
        if not (
            isinstance(key, (list, tuple))
            and len(key) in (2, 3)
            and isinstance(key[0], str)
            and key[1] in _ORDERS
            and (len(key) == 2 or key[2] in _PLACEMENTS)
        ):
            raise InvalidArgumentError(
                f"sort_by: each key is a (name, 'ascending' | 'descending'[, 'at_start' | 'at_end']) tuple; got {key!r}"
            )
        names.append(key[0])
        descending.append(_ORDERS[key[1]])
        placement = null_placement or (key[2] if len(key) == 3 else "at_end")
        nulls_last.append(_PLACEMENTS[placement])
    return _sorted(table, names, descending, nulls_last, "with_nulls")


def sort_order(table: Table, names: Sequence[str], descending: Sequence[bool], nulls_last: Sequence[bool],
               nan: str) -> Any:  # fmt: skip
    """The stable order of ``table``'s rows by the keys, as int64 indices on its device."""
    backend = table._live().backend
    columns = [table.column(name) for name in names]  # ColumnNotFoundError names a missing key
    with backend.activate():
        parts = []
        for col, desc, last in zip(columns, descending, nulls_last):
            parts += key_parts(col, desc, last, nan)
        return lexsort(backend.xp, parts, table.num_rows)


def _sorted(table: Table, names: list[str], descending: list[bool], nulls_last: list[bool], nan: str) -> Table:
    backend = table._live().backend
    order = sort_order(table, names, descending, nulls_last, nan)
    with backend.activate():
        return _ops.gather(table, order)
