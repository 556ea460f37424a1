"""MADlib's logistic regression functions (``logregr_train``, ``logregr_predict``, ``logregr_predict_prob``)
over pystrom Tables, on :class:`~.logistic.LogisticRegression` (docs/ml.md lists where they follow MADlib)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from ..memory.bitmap import count_true
from ._inputs import sigmoid, xp_of
from .logistic import LogisticRegression

__all__ = ["logregr_train", "logregr_predict", "logregr_predict_prob"]


def _independent(independent: str | Sequence[Any]) -> tuple[list[str], int | None]:
    """Column names, and where MADlib's intercept marker ``1`` stands among the items (None: absent)."""
    if isinstance(independent, str):
        text = independent.strip()
        if text.upper().startswith("ARRAY[") and text.endswith("]"):
            text = text[6:-1]
        independent = [p.strip() for p in text.split(",") if p.strip()]
    names: list[str] = []
    intercept_at = None
    for item in independent:
        if not isinstance(item, bool) and (item == 1 or item == "1"):
            if intercept_at is not None:
                raise DataError("the independent variables hold the intercept marker 1 twice")
            intercept_at = len(names)
        elif isinstance(item, str):
            names.append(item)
        else:
            raise DataError(f"independent variables are column names (and 1 for the intercept); got {item!r}")
    return names, intercept_at


def logregr_train(
    table: Any,
    dependent: str,
    independent: str | Sequence[Any],
    max_iter: int = 20,
    tol: float = 1e-4,
    **kwargs: Any,
) -> LogisticRegression:
    """MADlib's ``logregr_train`` (optimizer ``'irls'``) on a Table or a scan: returns the fitted model.

    As in MADlib, point by point (docs/ml.md lists them): ``independent`` lists feature column names
    and the intercept is fitted only where it holds ``1`` (``"ARRAY[1, x1, x2]"`` or ``[1, "x1", "x2"]``);
    ``coefficients_`` and the statistics follow the array's order; iteration stops after ``max_iter``
    iterations or when the log-likelihood changed by less than ``tol`` (absolute), and the last
    iteration's Newton step is applied (its statistics are those of the pass before it); rows with a
    NULL are skipped and counted. Other keyword arguments go to :class:`LogisticRegression`.
    """
    names, intercept_at = _independent(independent)
    if "fit_intercept" in kwargs and bool(kwargs["fit_intercept"]) != (intercept_at is not None):
        raise DataError(
            "logregr_train takes the intercept from the independent array: include 1 in it, or leave it out"
        )
    kwargs["fit_intercept"] = intercept_at is not None
    model = LogisticRegression(max_iter=max_iter, tol=tol, **kwargs)
    return model._fit(table, None, None, names, dependent, rule="madlib", intercept_at=intercept_at or 0)


def _model_and_names(model: Any, independent: Any) -> tuple[LogisticRegression, list[str] | None]:
    if isinstance(model, LogisticRegression):
        model._check_fitted()
        return model, _independent(independent)[0] if independent is not None else None
    coef = np.asarray(model, dtype=np.float64).ravel()  # MADlib's coef array, in the array's order
    if independent is None:  # no array to align with: intercept first
        if coef.size < 2:
            raise DataError("coefficients must hold the intercept and at least one feature weight")
        intercept, weights, names = coef[0], coef[1:], None
    else:
        names, at = _independent(independent)
        if at is None and coef.size == len(names) + 1:  # names without the 1, coef with the intercept first
            at = 0
        if coef.size != len(names) + (at is not None):
            raise DataError(
                f"{coef.size} coefficient(s) for {len(names) + (at is not None)} independent variable(s): "
                "the lengths must be equal"
            )
        intercept = coef[at] if at is not None else 0.0
        weights = np.delete(coef, at) if at is not None else coef
        if not len(names):
            raise DataError("the independent variables name no column")
    m = LogisticRegression()
    m.coef_, m.intercept_ = weights.reshape(1, -1), np.array([intercept])
    m.classes_ = np.array([False, True])
    return m, names


def logregr_predict(model: Any, table: Any, independent: Any = None) -> Any:
    """MADlib's ``logregr_predict``: True where the predicted probability is above 0.5.

    Rows with a NULL feature have no prediction (MADlib: NULL): the result is then float64, NaN there.
    """
    m, names = _model_and_names(model, independent)
    d = m.decision_function(table, columns=names)
    xp = xp_of(d)
    missing = xp.isnan(d)
    if not count_true(missing):
        return d > 0
    out = (d > 0).astype(np.float64)
    out[missing] = np.nan
    return out


def logregr_predict_prob(model: Any, table: Any, independent: Any = None) -> Any:
    """MADlib's ``logregr_predict_prob``: the probability of the positive class for every row (NaN for NULLs)."""
    m, names = _model_and_names(model, independent)
    d = m.decision_function(table, columns=names)
    return sigmoid(xp_of(d), d)
