"""``Table.describe``: summary statistics of the numeric and boolean columns, as polars gives them.

One row per statistic (count, null_count, mean, std, min, the percentiles, max), one float64
column per described column, in a new table on the table's device. The statistics are computed on
the device (one sort per column for the percentiles); only the few resulting numbers cross to the
host. Conventions are polars': ``count`` counts non-NULL values; ``std`` is the sample standard
deviation (ddof 1); ``min``/``max`` skip NaN (NaN only when every value is NaN) while the mean,
the std and the percentiles see NaN as the largest number; a boolean column gets count,
null_count, mean (the fraction true), min and max.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._ops import _decimal_to_float
from ._types import Layout
from .column import Column
from .errors import InvalidArgumentError, SchemaMismatchError, UnsupportedTypeError
from .table import Table

__all__ = ["describe", "INTERPOLATIONS"]

INTERPOLATIONS = ("nearest", "lower", "higher", "midpoint", "linear")


def _percentiles(percentiles: Sequence[float] | float | None) -> list[float]:
    if percentiles is None:
        return []
    if isinstance(percentiles, (int, float)) and not isinstance(percentiles, bool):
        percentiles = [percentiles]
    if not isinstance(percentiles, (list, tuple)):
        raise InvalidArgumentError(
            f"describe: percentiles must be a float, a list of floats or None; got {percentiles!r}"
        )
    out = []
    for p in percentiles:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise InvalidArgumentError(f"describe: each percentile is a number in [0, 1]; got {p!r}")
        out.append(float(p))
    return sorted(set(out))


def _label(p: float) -> str:
    return f"{p * 100:g}%"


def _numeric(col: Column) -> bool:
    import pyarrow.types as pt

    t = col.column_type.storage_arrow
    return col.column_type.layout == Layout.BOOL or pt.is_integer(t) or pt.is_floating(t) or pt.is_decimal128(t)


def _position(q: float, n: int, interpolation: str) -> tuple[int, int, float]:
    """(lower index, upper index, weight of the upper) of the q-quantile of n sorted values."""
    exact = q * (n - 1)
    low = math.floor(exact)
    high = min(low + 1, n - 1) if exact > low else low
    if interpolation == "nearest":  # half away from zero, as Rust's f64::round in polars
        pick = low + 1 if exact - low >= 0.5 else low
        return min(pick, n - 1), min(pick, n - 1), 0.0
    if interpolation == "lower":
        return low, low, 0.0
    if interpolation == "higher":
        return high, high, 0.0
    if interpolation == "midpoint":
        return low, high, 0.5 if high != low else 0.0
    return low, high, exact - low  # linear


def _statistics(col: Column, percentiles: list[float], interpolation: str) -> list[float | None]:
    xp = col._live_block().backend.xp
    valid = col.is_valid() if col.null_count else None
    if col.column_type.layout == Layout.BYTES:
        values = _decimal_to_float(xp, col, np.dtype(np.float64))
    else:
        values = col.values.astype(np.float64)
    if valid is not None:
        values = values[valid]
    count = int(values.shape[0])
    is_bool = col.column_type.layout == Layout.BOOL
    nothing = [None] * (3 + len(percentiles) + 1)  # mean, std, min, percentiles, max
    if count == 0:
        return [0.0, float(col.null_count), *nothing]
    numbers = values[~xp.isnan(values)]
    spread = numbers if int(numbers.shape[0]) else values  # min/max skip NaN unless there is nothing else
    mean = values.sum() / count  # in float64, integers too, as polars
    results = [mean, spread.min(), spread.max()]
    if not is_bool:
        if count > 1:
            results.append(xp.sqrt(((values - mean) ** 2).sum() / (count - 1)))
        ordered = xp.sort(values)  # NaN last, as polars orders it
        for q in percentiles:
            low, high, weight = _position(q, count, interpolation)
            a, b = ordered[low], ordered[high]
            if not weight:
                results.append(a)
            elif interpolation == "midpoint":  # (a + b) / 2 and a + (b - a) * w differ at infinities: polars' forms
                results.append((a + b) / 2)
            else:  # equal ends are the value itself (inf, not inf - inf = NaN), as in polars
                results.append(xp.where(a == b, a, a + (b - a) * weight))
    host = [float(v) for v in col._live_block().backend.to_host(xp.stack([xp.asarray(r) for r in results]))]
    mean_h, min_h, max_h = host[:3]
    std_h = None
    quantiles: list[float | None] = [None] * len(percentiles)
    if not is_bool:
        rest = host[3:]
        if count > 1:
            std_h, rest = rest[0], rest[1:]
        quantiles = list(rest)
    return [float(count), float(col.null_count), mean_h, std_h, min_h, *quantiles, max_h]


def describe(table: Table, percentiles: Sequence[float] | float | None, interpolation: str) -> Table:
    import pyarrow as pa

    qs = _percentiles(percentiles)
    if interpolation not in INTERPOLATIONS:
        raise InvalidArgumentError(f"describe: interpolation must be one of {INTERPOLATIONS}; got {interpolation!r}")
    backend = table._live().backend
    columns = [c for c in table.columns if _numeric(c)]
    if not columns:
        listing = ", ".join(f"{c.name!r} ({c.type})" for c in table.columns) or "none"
        raise UnsupportedTypeError(
            f"describe summarises numeric and bool columns; this table has none (columns: {listing})"
        )
    if "statistic" in table:
        raise SchemaMismatchError(
            "describe names its first column 'statistic', but the table has a column of that name"
        )
    names = ["count", "null_count", "mean", "std", "min", *(_label(q) for q in qs), "max"]
    out: dict[str, Any] = {"statistic": pa.array(names, pa.string())}
    with backend.activate(), np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in polars
        for col in columns:
            out[col.name] = pa.array(_statistics(col, qs, interpolation), pa.float64())
    return Table.from_arrays(out, device=table.device)
