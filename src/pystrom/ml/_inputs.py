"""What the estimator is given, made into what it fits and predicts on: sources of passes, feature names
checked as scikit-learn checks them, rows without NULLs, and dask input handed to :mod:`pystrom.dask`."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError, NotFittedError, UnsupportedTypeError
from ..memory.backend import resolve_device
from ._data import is_scan, is_table, prepare_array, prepare_table
from ._sources import ArraySource, ScanSource, Source
from ._staging import host_staging

__all__ = ["fit_source", "not_fitted_error", "frame_names", "names_mismatch", "valid_rows", "table_dtype"]


def fit_source(
    X: Any, y: Any, sample_weight: Any, columns: Any, target: Any, device: Any
) -> tuple[Source, np.ndarray, list[str] | None, bool]:
    """What :meth:`LogisticRegression.fit` was given, as a :class:`~._sources.Source` of passes over it: the
    source, the two classes, the feature names (None: the input has none) and whether they came from a
    pandas DataFrame (scikit-learn warns when such a model is given bare arrays)."""
    if is_dask(X):
        from ..dask._fit import dask_source  # up: fit takes dask collections; pystrom.dask builds on ml

        if device is not None:
            raise DataError("device= does not apply to dask input: the partitions are fitted where they live")
        source, classes, names = dask_source(X, y, sample_weight, columns, target)
        return source, classes, (list(names) if target is not None else None), False
    if is_table(X):
        weight = sample_weight if isinstance(sample_weight, str) else None
        if sample_weight is not None and weight is None:
            raise UnsupportedTypeError("with a Table, sample_weight is the name of a weight column")
        if y is not None:
            raise DataError("with a Table, name the target column: target='name' (y must be None)")
        batch, classes = prepare_table(X, columns, target, weight, device, binary01=False)
        return ArraySource(batch), classes, list(batch.names), False
    if is_scan(X):
        weight = sample_weight if isinstance(sample_weight, str) else None
        if (sample_weight is not None and weight is None) or y is not None:
            raise UnsupportedTypeError("with a scan of Tables, pass target='name' (and sample_weight='column')")
        first = next(iter(X), None)
        if first is None:
            raise DataError("the scan yielded no batches: nothing to fit")
        if not is_table(first):
            raise UnsupportedTypeError(f"a scan must yield pystrom Tables; its first item is a {type(first).__name__}")
        backend = resolve_device(device if device is not None else first.device)

        def prepare(table: Any) -> Any:
            if not is_table(table):
                raise UnsupportedTypeError(f"a scan must yield pystrom Tables; it yielded a {type(table).__name__}")
            return prepare_table(table, columns, target, weight, backend, binary01=True)[0]

        batch0 = prepare(first)
        read = None if columns is None else [*batch0.names, target] + ([weight] if weight else [])
        staging = host_staging(backend, first, read)
        return ScanSource(X, prepare, backend, batch0, staging), np.array([False, True]), list(batch0.names), False
    if columns is not None or target is not None:
        raise DataError("columns= and target= apply to Tables; for arrays pass fit(X, y)")
    names = frame_names(X)
    batch, classes = prepare_array(X, y, sample_weight, device)
    if names is not None:
        batch.names = list(names)
    return ArraySource(batch), classes, names, names is not None


def not_fitted_error() -> type:
    """Our NotFittedError; when scikit-learn is loaded, one that is also scikit-learn's (its checks ask for it)."""
    sk = sys.modules.get("sklearn.exceptions")
    if sk is None:
        return NotFittedError
    return _sklearn_not_fitted(sk.NotFittedError)


@functools.cache
def _sklearn_not_fitted(base: type) -> type:
    return type("NotFittedError", (NotFittedError, base), {"__module__": NotFittedError.__module__})


def same_label(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def frame_names(X: Any) -> list[str] | None:
    """A pandas DataFrame's column names (all strings), as scikit-learn's ``feature_names_in_``."""
    cols = getattr(X, "columns", None)
    if cols is None or not hasattr(X, "iloc"):
        return None
    names = list(cols)
    return names if names and all(isinstance(n, str) for n in names) else None


def names_mismatch(given: list[str], fitted: list[str]) -> str:
    """scikit-learn's wording (its checks match it), then the names."""
    unseen, missing = sorted(set(given) - set(fitted)), sorted(set(fitted) - set(given))
    text = "The feature names should match those that were passed during fit.\n"
    for title, names in (
        ("Feature names unseen at fit time:", unseen),
        ("Feature names seen at fit time, yet now missing:", missing),
    ):
        if names:
            text += title + "\n" + "".join(f"- {n}\n" for n in names[:5]) + ("- ...\n" if len(names) > 5 else "")
    if not unseen and not missing:
        text += "Feature names must be in the same order as they were in fit.\n"
    return text + f"(X has {given!r}; this model was fitted on {fitted!r})"


def is_frame_like(X: Any) -> bool:
    return hasattr(X, "columns") and hasattr(X, "iloc")


def valid_rows(table: Any, names: Sequence[str]) -> Any:
    """True where none of the named columns is NULL; None when they hold no NULLs."""
    valid = None
    for name in names:
        col = table.column(name)
        if col.null_count:
            v = col.is_valid()
            valid = v if valid is None else valid & v
    return valid


def table_dtype(table: Any, names: list[str]) -> Any:
    return np.float32 if {str(table.column(n).type) for n in names} == {"float"} else np.float64


def is_dask(x: Any) -> bool:
    """A pystrom.dask collection or a dask array (dask is never imported here: it was if x is one)."""
    if "dask" not in sys.modules:
        return False
    from ..dask._fit import is_dask_input  # up: fit and predict take dask input

    return is_dask_input(x)


def dask_predict(model: Any, method: str, X: Any, columns: Sequence[str] | None) -> Any:
    """``model.method`` on dask input: a dask array whose blocks are the method on each partition, where it lives."""
    from ..dask._fit import dask_predict  # up: predictions on dask input are dask arrays

    model._check_fitted()
    return dask_predict(model, method, X, columns, table_dtype)


def xp_of(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def sigmoid(xp: Any, d: Any) -> Any:
    e = xp.exp(-xp.abs(d))
    return xp.where(d >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
