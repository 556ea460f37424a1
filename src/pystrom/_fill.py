"""``fill_null`` and ``drop_nulls`` of a Table (and ``Column.fill_null``), on the table's device.

Filling a column is one gather: row i takes row ``src[i]`` of a source column, where ``src[i] = i``
for a valid row. The source is the column itself for ``forward``/``backward`` (the nearest valid
row before/after, within ``limit``) and ``min``/``max`` (the row holding it), and the column with
one more row, the fill value, appended for a value, ``mean``, ``zero`` and ``one``. Every type
goes through the same gather (strings, decimals and lists included), every filled column of a
table in one pass into one new allocation, and types never change (a value that a column's type
cannot hold exactly is an error naming the column, not a silent cast).
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _ops
from ._concat import concat
from ._keys import key_parts, lexsort
from ._types import Layout
from .column import Column
from .errors import InvalidArgumentError, UnsupportedTypeError
from .memory.bitmap import count_true
from .table import Table

__all__ = ["fill_null", "fill_column", "drop_nulls"]

STRATEGIES = ("forward", "backward", "min", "max", "mean", "zero", "one")


def _kind(col: Column) -> str:
    """What a column holds, for deciding which fills apply: int uint float bool decimal str binary
    fixed_binary timestamp date time duration, or '' (lists, intervals)."""
    import pyarrow.types as pt

    t = col.column_type.storage_arrow
    checks = [
        ("bool", pt.is_boolean), ("uint", pt.is_unsigned_integer), ("int", pt.is_integer), ("float", pt.is_floating),
        ("decimal", pt.is_decimal), ("str", pt.is_string), ("binary", pt.is_binary),
        ("fixed_binary", pt.is_fixed_size_binary), ("timestamp", pt.is_timestamp), ("date", pt.is_date),
        ("time", pt.is_time), ("duration", pt.is_duration),
    ]  # fmt: skip
    return next((kind for kind, check in checks if check(t)), "")


_NUMBERS = ("int", "uint", "float", "decimal")
_STRATEGY_KINDS = {
    "min": (*_NUMBERS, "bool", "str", "binary", "fixed_binary", "timestamp", "date", "time", "duration"),
    "mean": ("int", "uint", "float"),
    "zero": (*_NUMBERS, "bool"),
    "one": (*_NUMBERS, "bool"),
}
_STRATEGY_KINDS["max"] = _STRATEGY_KINDS["min"]


def _value_kinds(value: Any) -> tuple[str, ...]:
    """The column kinds a Python value fills (a float fills float columns only: an integer column
    cannot hold 1.5, and filling never changes a column's type)."""
    if isinstance(value, bool):
        return ("bool",)
    if isinstance(value, int):
        return _NUMBERS
    if isinstance(value, float):
        return ("float",)
    if isinstance(value, str):
        return ("str",)
    if isinstance(value, bytes):
        return ("binary", "fixed_binary")
    if isinstance(value, datetime.datetime):
        return ("timestamp",)
    if isinstance(value, datetime.date):
        return ("date",)
    if isinstance(value, datetime.time):
        return ("time",)
    if isinstance(value, datetime.timedelta):
        return ("duration",)
    if isinstance(value, decimal.Decimal):
        return ("decimal",)
    raise InvalidArgumentError(
        f"fill_null: cannot fill with a {type(value).__name__} ({value!r}); pass a bool, int, float, str, bytes, "
        "date/time value, Decimal, or a pyarrow scalar"
    )


def _normalize_value(value: Any) -> Any:
    import pyarrow as pa

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, pa.Scalar) and not value.is_valid:
        raise InvalidArgumentError("fill_null: the fill value is a NULL scalar, which fills nothing")
    return value


def _applies(col: Column, value: Any, strategy: str | None) -> bool:
    import pyarrow as pa

    if strategy in ("forward", "backward"):
        return True
    if strategy is not None:
        return _kind(col) in _STRATEGY_KINDS[strategy]
    if isinstance(value, pa.Scalar):
        return value.type == col.type
    return _kind(col) in _value_kinds(value)


def check_arguments(value: Any, strategy: str | None, limit: int | None) -> Any:
    """The value to fill with (NumPy scalars made Python ones), after checking the combination."""
    if strategy is None and value is None:
        raise InvalidArgumentError("fill_null needs a value or a strategy (one of " + ", ".join(STRATEGIES) + ")")
    if strategy is not None and value is not None:
        raise InvalidArgumentError("fill_null takes a value or a strategy, not both")
    if strategy is not None and strategy not in STRATEGIES:
        raise InvalidArgumentError(f"fill_null: strategy must be one of {STRATEGIES}; got {strategy!r}")
    if limit is not None:
        if strategy not in ("forward", "backward"):
            raise InvalidArgumentError("fill_null: limit applies only to the 'forward' and 'backward' strategies")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise InvalidArgumentError(f"fill_null: limit must be a non-negative int; got {limit!r}")
    value = _normalize_value(value)
    if value is not None and not _is_arrow_scalar(value):
        _value_kinds(value)  # a value of no usable type fails here, before any column is looked at
    return value


def _is_arrow_scalar(value: Any) -> bool:
    import pyarrow as pa

    return isinstance(value, pa.Scalar)


def fill_null(table: Table, value: Any, strategy: str | None, limit: int | None) -> Table:
    value = check_arguments(value, strategy, limit)
    backend = table._live().backend
    n = table.num_rows
    with backend.activate():
        slots: list[Any] = []
        for col in table.columns:
            take = (
                _fill_take(col, value, strategy, limit) if col.null_count and _applies(col, value, strategy) else None
            )
            slots.append(col if take is None else take)
        if all(isinstance(s, Column) for s in slots):
            return table.select(table.column_names)  # nothing to fill: a view, as cheap as it gets
        block, plan = _ops.gather_into(backend, backend.xp.arange(n, dtype=np.int64), slots)
        return Table._wrap(block, plan, table.schema, n)


def fill_column(col: Column, value: Any, strategy: str | None, limit: int | None) -> Column:
    value = check_arguments(value, strategy, limit)
    if not _applies(col, value, strategy):
        what = f"the {strategy!r} strategy" if strategy else f"{value!r} ({type(value).__name__})"
        raise UnsupportedTypeError(f"column {col.name!r} has type {col.type}, which cannot be filled with {what}")
    return fill_null(Table._of_column(col), value, strategy, limit).column(0)


def _fill_take(col: Column, value: Any, strategy: str | None, limit: int | None) -> _ops.Take | None:
    """The gather that fills ``col``, or None when there is nothing to fill it with (an all-NULL
    column has no min, max or mean)."""
    backend = col._live_block().backend
    xp = backend.xp
    n = len(col)
    if col.null_count == n and strategy in ("min", "max", "mean"):
        return None
    valid = col.is_valid()
    rows = xp.arange(n, dtype=np.int64)
    if strategy in ("forward", "backward"):
        return _ops.Take(col, _nearest_valid(xp, valid, rows, strategy == "forward", limit))
    if strategy in ("min", "max"):
        best = _extreme_row(col, valid, strategy == "max")
        return _ops.Take(col, xp.where(valid, rows, best))
    if strategy is not None:
        value = _strategy_value(col, valid, strategy)
    source = _with_value_row(col, value)
    return _ops.Take(source, xp.where(valid, rows, n))


def _nearest_valid(xp: Any, valid: Any, rows: Any, forward: bool, limit: int | None) -> Any:
    """For each row, the nearest valid row at or before it (forward) or at or after it (backward),
    or the row itself when there is none within ``limit`` rows."""
    n = int(rows.shape[0])
    positions = xp.flatnonzero(valid)
    if int(positions.shape[0]) == 0:
        return rows
    if forward:
        seen = xp.cumsum(valid, dtype=np.int64)  # valid rows at or before each row
        src = positions[xp.maximum(seen - 1, 0)]
        found = seen > 0
        distance = rows - src
    else:
        ahead = xp.cumsum(valid[::-1], dtype=np.int64)[::-1]  # valid rows at or after each row
        src = positions[xp.minimum(int(positions.shape[0]) - ahead, int(positions.shape[0]) - 1)]
        found = ahead > 0
        distance = src - rows
    if limit is not None:
        found &= distance <= limit
    return xp.where(found, src, rows) if n else rows


def _extreme_row(col: Column, valid: Any, largest: bool) -> Any:
    """The row holding the column's smallest (largest) value, NaN only when every value is NaN (as
    polars' min and max), as a 0-d int64 array on the device."""
    xp = col._live_block().backend.xp
    if col.column_type.layout in (Layout.FIXED, Layout.BOOL):
        values = col.values.view(np.uint8) if col.column_type.layout == Layout.BOOL else col.values
        candidates = valid & ~xp.isnan(values) if values.dtype.kind == "f" else valid
        if not count_true(candidates):
            candidates = valid  # only NaN
        rows = xp.flatnonzero(candidates)
        picked = values[rows]
        return rows[xp.argmax(picked) if largest else xp.argmin(picked)]
    # other types: the first row of the order that puts NULLs last and NaN-free values first
    order = lexsort(xp, key_parts(col, descending=largest, nulls_last=True, nan="with_nulls"), len(col))
    return order[0]


def _strategy_value(col: Column, valid: Any, strategy: str) -> Any:
    if strategy in ("zero", "one"):
        one = strategy == "one"
        return one if _kind(col) == "bool" else int(one)
    # mean: of the valid values in float64; an integer column gets it truncated toward zero, as in polars
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN here as in polars, without a warning
        mean = float(col.values[valid].astype(np.float64).mean())
    if _kind(col) not in ("int", "uint"):
        return mean
    info = np.iinfo(col.dtype)  # float64 rounding can carry the mean of values near the limits past them
    return min(max(int(mean), int(info.min)), int(info.max))


def _with_value_row(col: Column, value: Any) -> Column:
    """``col`` with one more row holding ``value`` (in the column's type), in a new allocation."""
    import pyarrow as pa

    try:
        row = pa.array([value.as_py() if isinstance(value, pa.Scalar) else value], type=col.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
        raise InvalidArgumentError(
            f"fill_null: column {col.name!r} ({col.type}) cannot hold {value!r}: {exc}"
        ) from None
    one = Table.from_arrays({col.name: row}, device=col.device)
    return concat([Table._of_column(col), one]).column(0)


def drop_nulls(table: Table, subset: str | Sequence[str] | None) -> Table:
    names = table.column_names if subset is None else [subset] if isinstance(subset, str) else list(subset)
    columns = [table.column(name) for name in names]  # ColumnNotFoundError names a missing one
    with_nulls = [c for c in columns if c.null_count]
    if not with_nulls:
        return table.select(table.column_names)  # no row to drop: a view
    backend = table._live().backend
    with backend.activate():
        keep = with_nulls[0].is_valid()
        for col in with_nulls[1:]:
            keep = keep & col.is_valid()
        return _ops.gather(table, backend.xp.flatnonzero(keep))
