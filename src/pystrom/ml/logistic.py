"""Binary logistic regression: a scikit-learn-style estimator and MADlib's ``logregr_*`` functions.

The estimator only validates and wires things up; the solver is :class:`~pystrom.ml._irls.IRLSSolver`,
the pass over the data lives in :mod:`pystrom.ml._sources` / :mod:`pystrom.ml._pass`, and the
statistics in :mod:`pystrom.ml._stats`. scikit-learn is not needed: its estimator contract is
mirrored (``__init__`` stores parameters unchanged, ``get_params``/``set_params``, ``fit`` returns
``self``, learned attributes end in ``_``), so ``sklearn.base.clone`` and pipelines work.
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError, SchemaMismatchError, UnsupportedTypeError
from ..memory.bitmap import count_true
from ._data import is_scan, is_table, not_2d_message
from ._inputs import (
    dask_predict,
    fit_source,
    frame_names,
    is_dask,
    is_frame_like,
    names_mismatch,
    not_fitted_error,
    same_label,
    sigmoid,
    table_dtype,
    valid_rows,
    xp_of,
)
from ._irls import NumericalWarning
from ._sources import SolverSpec, Source
from ._stats import Summary, compute_statistics

__all__ = ["LogisticRegression"]


class LogisticRegression:
    """Binary logistic regression fitted by IRLS (Newton) on the GPU or the CPU, with MADlib's statistics.

    Parameters
    ----------
    penalty : {"l2", None}, default=None
        ``"l2"`` adds ``||coef||^2 / (2 C)`` to the negative log-likelihood (the intercept is not
        penalised), the objective of scikit-learn's ``LogisticRegression``. ``None`` is the plain
        maximum likelihood fit whose statistics match MADlib and statsmodels.
    C : float, default=1.0
        Inverse regularisation strength (``penalty="l2"`` only).
    fit_intercept : bool, default=True
    max_iter : int, default=100
        At most this many Newton steps (each one pass over the data, more when the step is halved).
    tol : float, default=1e-8
        Converged when the relative change of the log-likelihood and the Newton decrement (the
        gradient's norm in the Hessian's metric, relative to the log-likelihood) are both at most ``tol``;
        the Newton step computed at the last pass is then applied. ``0`` never stops early. For float32
        input a tol below its precision is honoured as far as it can be (a NumericalWarning says so).
    class_weight : dict, "balanced" or None
        Weights of the classes, ``{label: weight}``, multiplied into ``sample_weight``.
    device : str, optional
        Where to fit: ``"cpu"``, ``"cuda"``, ``"cuda:N"``. Default: where the data is.

    Attributes
    ----------
    coef_ : ndarray of shape (1, n_features)
        The feature coefficients.
    intercept_ : ndarray of shape (1,)
        The intercept (0 when ``fit_intercept=False``).
    classes_ : ndarray of shape (2,)
        The two labels; ``classes_[1]`` is the positive class.
    n_iter_ : int
        Newton steps taken, the final one (applied without a pass) included.
    converged_ : bool
        Whether they converged.
    coefficients_ : ndarray
        Intercept first (MADlib's ``coef``); the statistics below use this order.
    log_likelihood_, std_err_, z_stats_, p_values_, odds_ratios_, condition_no_, variance_covariance_
        MADlib's statistics (``std_err_`` etc. come from the inverse of X^T A X at the solution,
        penalised when ``penalty="l2"``). ``condition_no_`` is MADlib's, sqrt(lambda_max / lambda_min)
        of X^T A X. Aliased parameters have NaN (R's NA) in ``coef_`` and every statistic.
    num_rows_processed_, num_missing_rows_skipped_ : int
        Rows used, and rows left out for NULLs.
    n_features_in_, feature_names_in_
        As in scikit-learn (names for Tables and pandas DataFrames).
    aliased_ : ndarray of str
        Columns found collinear with the columns before them (or constant): fixed at 0, NaN in the
        statistics, named in a NumericalWarning; the model is the one without them.
    separation_ : {None, "complete", "quasi-complete"}
        Not None when a PerfectSeparationWarning was issued.
    fit_info_ : dict
        How the fit ran: ``"path"`` (``"memory"``, ``"scan"``; for pystrom.dask input ``"workers"``, the
        Newton loop on the workers, or ``"client"``), ``"passes"``, and for pystrom.dask input the
        workers, the communicator (``"comm"``: ``"nccl"``, ``"tcp"`` or ``"none"``), restarts, per-worker
        timings and the ``"reason"`` the path was chosen (docs/dask.md).
    """

    def __init__(
        self,
        penalty: str | None = None,
        C: float = 1.0,
        fit_intercept: bool = True,
        max_iter: int = 100,
        tol: float = 1e-8,
        class_weight: dict | str | None = None,
        device: str | None = None,
    ):
        self.penalty = penalty
        self.C = C
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.class_weight = class_weight
        self.device = device

    # -- scikit-learn's parameter protocol -------------------------------------------------------

    @classmethod
    def _get_param_names(cls) -> list[str]:
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments as a dict (scikit-learn's estimator contract)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> LogisticRegression:
        """Set constructor arguments by name and return the estimator (scikit-learn's contract)."""
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"invalid parameter {name!r} for LogisticRegression; valid: {', '.join(valid)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if v is not defaults.get(k) and v != defaults[k]]
        return f"LogisticRegression({', '.join(changed)})"

    def __sklearn_tags__(self) -> Any:
        from sklearn.utils import ClassifierTags, Tags, TargetTags  # only when scikit-learn asks

        tags = Tags(
            estimator_type="classifier", target_tags=TargetTags(required=True), classifier_tags=ClassifierTags()
        )
        tags.classifier_tags.multi_class = False
        return tags

    # -- fitting ----------------------------------------------------------------------------------

    def _validate_params(self) -> None:
        if self.penalty not in (None, "l2", "none"):
            raise ValueError(f"penalty={self.penalty!r} is not supported; use 'l2' or None")
        if isinstance(self.C, bool) or not isinstance(self.C, numbers.Real) or not self.C > 0:
            raise ValueError(f"C must be a positive number; got {self.C!r}")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, numbers.Integral) or self.max_iter < 1:
            raise ValueError(f"max_iter must be a positive int; got {self.max_iter!r}")
        if not isinstance(self.tol, numbers.Real) or not self.tol >= 0:
            raise ValueError(f"tol must be a non-negative number; got {self.tol!r}")
        if not (self.class_weight is None or self.class_weight == "balanced" or isinstance(self.class_weight, dict)):
            raise ValueError(f"class_weight must be None, 'balanced' or a dict; got {self.class_weight!r}")

    def fit(
        self,
        X: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        columns: Sequence[str] | None = None,
        target: str | None = None,
    ) -> LogisticRegression:
        """Fit on ``X`` (2-D NumPy/CuPy array, a Table with ``target=``, or a re-iterable of Tables).

        For Tables, ``columns`` names the features (default: every other column), ``target`` the
        0/1 or bool (or two-valued) target, and ``sample_weight`` may name a weight column. Rows with
        a NULL in any of them are skipped and counted in ``num_missing_rows_skipped_``.
        """
        return self._fit(X, y, sample_weight, columns, target)

    def _fit(
        self,
        X: Any,
        y: Any,
        sample_weight: Any,
        columns: Any,
        target: Any,
        rule: str = "pystrom",
        intercept_at: int = 0,
    ) -> LogisticRegression:
        """``rule``: the solver's stopping rule (``"madlib"`` for :func:`logregr_train`); ``intercept_at``:
        where the intercept goes in ``coefficients_`` and the statistics (MADlib: where the array holds 1)."""
        self._validate_params()
        if isinstance(y, str) and target is None and (is_table(X) or is_scan(X)):
            target, y = y, None
        source, classes, names, from_frame = fit_source(X, y, sample_weight, columns, target, self.device)
        self._names_from_frame = from_frame
        if names is not None:
            self.feature_names_in_ = np.array(names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        try:
            return self._solve(source, classes, rule, intercept_at)
        finally:
            source.close()  # a streamed fit's pinned memory and device buffers, also after an error

    def _solve(self, source: Source, classes: np.ndarray, rule: str, intercept_at: int) -> LogisticRegression:
        cw = self._class_weights(classes, source)
        source.class_weight = cw
        k = source.n_features
        l2 = 1.0 / float(self.C) if self.penalty == "l2" else 0.0
        res = source.solve(SolverSpec(k, bool(self.fit_intercept), l2, int(self.max_iter), float(self.tol), rule))
        order = list(range(k))
        if self.fit_intercept:
            order.insert(min(max(int(intercept_at), 0), k), k)
        self._set_learned(res, source, classes, l2, order)
        return self

    def _class_weights(self, classes: np.ndarray, source: Source) -> tuple[float, float]:
        cw = self.class_weight
        if cw is None:
            return (1.0, 1.0)
        if cw == "balanced":
            n0, n1 = source.counts()
            if n0 <= 0 or n1 <= 0:
                raise DataError("class_weight='balanced' needs rows of both classes")
            total = n0 + n1
            return (total / (2.0 * n0), total / (2.0 * n1))
        unknown = [key for key in cw if not any(same_label(key, c) for c in classes)]
        if unknown:
            raise DataError(f"class_weight names label(s) {unknown!r} that are not classes {list(classes)!r}")
        out = []
        for c in classes:
            match = [v for key, v in cw.items() if same_label(key, c)]
            out.append(float(match[0]) if match else 1.0)
        return out[0], out[1]

    def _set_learned(self, res: Any, source: Source, classes: np.ndarray, l2: float, order: list[int]) -> None:
        """``order``: the parameters (k = the intercept) in the order of ``coefficients_`` and the statistics."""
        k = source.n_features
        w = res.w
        free = np.zeros(k + 1, dtype=bool)
        free[res.free] = True
        self.classes_ = classes
        self.coef_ = np.where(free[:k], w[:k], np.nan).reshape(1, k)  # aliased: NaN, as R's NA
        self.intercept_ = np.array([w[k] if self.fit_intercept else 0.0])
        self.n_iter_ = res.n_iter
        self.converged_ = bool(res.converged)
        self.separation_ = res.separation
        self.n_features_in_ = k
        self.num_rows_processed_ = int(source.rows)
        self.num_missing_rows_skipped_ = int(source.skipped)
        self.n_passes_ = int(res.passes)
        self.n_approx_passes_ = int(res.approx_passes)  # passes whose Hessian was formed in float32
        self.device_ = source.backend.device
        self.fit_info_ = dict(source.fit_info)
        H = res.totals.hessian[np.ix_(order, order)].copy()
        if l2:
            feats = np.array([i for i, j in enumerate(order) if j != k], dtype=np.intp)
            H[feats, feats] += l2
        backend = source.backend
        with backend.activate():
            xp = backend.xp if backend.kind == "cuda" else None
            stats = compute_statistics(w[order], H, res.totals.log_likelihood, free[order], xp)
        self.coefficients_ = stats.coef
        self.log_likelihood_ = stats.log_likelihood
        self.std_err_ = stats.std_err
        self.z_stats_ = stats.z_stats
        self.p_values_ = stats.p_values
        self.odds_ratios_ = stats.odds_ratios
        self.condition_no_ = stats.condition_no
        self.variance_covariance_ = stats.variance_covariance
        names = [str(n) for n in getattr(self, "feature_names_in_", source.names)]
        self._stat_names = [names[j] if j < k else "intercept" for j in order]
        self._stats = stats
        self.aliased_ = np.array([names[j] if j < k else "intercept" for j in res.aliased], dtype=object)
        if len(self.aliased_):
            warnings.warn(
                f"column(s) {', '.join(map(repr, self.aliased_))} are aliased (collinear with the columns before "
                "them, or constant): their coefficients and statistics are NaN (R's NA) and the model is the "
                "one without them",
                NumericalWarning,
                stacklevel=4,
            )
        if res.reach is not None:
            warnings.warn(
                f"tol={self.tol:g} is below what float32 input can resolve: the fit converged to a relative change "
                f"of the log-likelihood of {res.reach:.2g} (float32 sigmoids and logs); pass float64 for more",
                NumericalWarning,
                stacklevel=4,
            )

    # -- using the model --------------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise not_fitted_error()("this LogisticRegression is not fitted yet: call fit(X, y) before using it")

    def decision_function(self, X: Any, *, columns: Sequence[str] | None = None) -> Any:
        """w.x + b for every row, on X's device (float64; float32 X is multiplied in float32); a dask
        array for a pystrom.dask collection or a dask array, computed where its partitions are.

        A Table may hold NULLs in the feature columns: those rows give NaN (MADlib returns NULL).
        Aliased coefficients (NaN) count as 0: the predictions are the reduced model's.
        """
        self._check_fitted()
        if is_dask(X):
            return dask_predict(self, "decision_function", X, columns)
        if is_table(X):
            names = list(columns) if columns is not None else list(getattr(self, "feature_names_in_", []))
            if not names:
                raise DataError("this model was fitted on an array: pass columns=[...] to predict from a Table")
            table = X if self.device is None else X.to(self.device)
            valid = valid_rows(table, names)
            array = table.to_array(names, dtype=table_dtype(table, names), nulls="raise" if valid is None else "nan")
            return self._decision_array(array, names, valid)
        if is_scan(X):
            parts = [self.decision_function(t, columns=columns) for t in X]
            xp = xp_of(parts[0]) if parts else np
            return xp.concatenate(parts) if parts else np.zeros(0)
        given_names = frame_names(X)
        fitted_names = getattr(self, "feature_names_in_", None)
        if given_names is not None and fitted_names is not None and list(given_names) != list(fitted_names):
            raise DataError(names_mismatch(list(given_names), [str(n) for n in fitted_names]))
        if given_names is not None and fitted_names is None:
            warnings.warn(
                "X has feature names, but LogisticRegression was fitted without feature names",
                UserWarning,
                stacklevel=2,
            )
        if given_names is None and getattr(self, "_names_from_frame", False) and not is_frame_like(X):
            warnings.warn(
                "X does not have valid feature names, but LogisticRegression was fitted with feature names",
                UserWarning,
                stacklevel=2,
            )
        if not hasattr(X, "__cuda_array_interface__") and not isinstance(X, np.ndarray):
            X = np.asarray(X)
        from ..memory.backend import backend_of_array

        if backend_of_array(X) is None:
            X = np.asarray(X)
        if X.ndim != 2:
            raise SchemaMismatchError(not_2d_message(X))
        if X.dtype == object:
            try:
                X = X.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise UnsupportedTypeError(f"X has dtype object and holds non-numbers: {exc}") from None
        if X.dtype.kind not in "iufb":
            raise UnsupportedTypeError(f"X has dtype {X.dtype}; numeric features are needed")
        names = list(given_names) if given_names is not None else [f"x{j}" for j in range(X.shape[1])]
        return self._decision_array(X, names)

    def _decision_array(self, X: Any, names: list[str], valid: Any = None) -> Any:
        from ..memory.backend import backend_of_array
        from ._data import locate_nonfinite

        k = self.coef_.shape[1]
        if X.shape[1] != k:
            raise DataError(f"X has {X.shape[1]} features, but LogisticRegression is expecting {k} features as input")
        backend = backend_of_array(X)
        with backend.activate():
            xp = backend.xp
            dtype = X.dtype if X.dtype in (np.float32, np.float64) else np.float64
            if X.dtype != dtype:
                X = X.astype(dtype)
            coef = xp.asarray(np.nan_to_num(self.coef_[0], nan=0.0).astype(dtype))
            intercept = float(np.nan_to_num(self.intercept_[0], nan=0.0))
            with np.errstate(over="ignore", invalid="ignore"):
                out = (X @ coef).astype(np.float64) + intercept
            bad = ~xp.isfinite(out)
            if valid is not None:
                bad &= valid
            if count_true(bad):
                raise locate_nonfinite(xp, X if valid is None else X[valid], names)
            if valid is not None:
                out[~valid] = np.nan
            return out

    def predict_proba(self, X: Any, **kwargs: Any) -> Any:
        """(n, 2) probabilities of ``classes_[0]`` and ``classes_[1]`` (NaN for rows with NULLs)."""
        if is_dask(X):
            return dask_predict(self, "predict_proba", X, kwargs.get("columns"))
        d = self.decision_function(X, **kwargs)
        xp = xp_of(d)
        p1 = sigmoid(xp, d)
        return xp.stack([1.0 - p1, p1], axis=1)

    def predict_log_proba(self, X: Any, **kwargs: Any) -> Any:
        """(n, 2) natural logs of :meth:`predict_proba`, computed without rounding to 0 first."""
        if is_dask(X):
            return dask_predict(self, "predict_log_proba", X, kwargs.get("columns"))
        d = self.decision_function(X, **kwargs)
        xp = xp_of(d)
        tail = xp.log1p(xp.exp(-xp.abs(d)))
        return xp.stack([-(xp.maximum(d, 0.0) + tail), -(xp.maximum(-d, 0.0) + tail)], axis=1)

    def predict(self, X: Any, **kwargs: Any) -> Any:
        """The predicted label of every row (``classes_[1]`` where the decision function is positive).

        Rows of a Table with NULL features have no label: the result is then float64 with NaN there
        for numeric or bool labels (True as 1.0, as pandas does), or a NumPy object array with None.
        """
        if is_dask(X):
            return dask_predict(self, "predict", X, kwargs.get("columns"))
        return self._labels(self.decision_function(X, **kwargs))

    def _labels(self, d: Any) -> Any:
        xp = xp_of(d)
        missing = xp.isnan(d)
        classes = self.classes_
        if not count_true(missing):
            return xp.asarray(classes)[(d > 0).astype(np.int64)]
        if classes.dtype.kind in "biuf":
            out = xp.asarray(classes.astype(np.float64))[(d > 0).astype(np.int64)]
            out[missing] = np.nan
            return out
        host = np.asarray(d.get() if xp is not np else d)
        out = classes[(host > 0).astype(np.int64)].astype(object)
        out[np.isnan(host)] = None
        return out

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy (weighted by ``sample_weight``).

        With a Table, ``y`` (and ``sample_weight``) may name columns; rows with a NULL in a feature,
        the target or the weight are skipped, with a warning that says how many.
        """
        if not is_table(X) and (isinstance(y, str) or isinstance(sample_weight, str)):
            raise DataError("score(X, 'name') names a column of a Table; for arrays pass the labels")
        d = self.decision_function(X)
        xp = xp_of(d)
        keep = ~xp.isnan(d)
        if is_table(X):
            table = X if self.device is None else X.to(self.device)
            if isinstance(y, str):
                keep &= table.column(y).is_valid()
                y = table.column(y).values
            if isinstance(sample_weight, str):
                keep &= table.column(sample_weight).is_valid()
                sample_weight = table.column(sample_weight).values
        pred = self._labels(d)
        if isinstance(pred, np.ndarray) and xp is not np:  # labels only a host array can hold
            xp = np
            keep = keep.get()
        if xp is np:
            y = y.get() if hasattr(y, "get") else y
            sample_weight = sample_weight.get() if hasattr(sample_weight, "get") else sample_weight
        y = xp.asarray(y)
        if y.shape != d.shape:
            raise SchemaMismatchError(f"y has shape {tuple(y.shape)} but X has {d.shape[0]:,} rows")
        skipped = int(d.shape[0]) - count_true(keep)
        if skipped:
            warnings.warn(f"score skipped {skipped:,} row(s) with NULLs", UserWarning, stacklevel=2)
            if skipped == d.shape[0]:
                raise DataError("score has no rows to compare: every row holds a NULL")
        hit = (pred[keep] == y[keep]).astype(np.float64)
        if sample_weight is None:
            return float(hit.mean())
        sw = xp.asarray(sample_weight, dtype=np.float64)[keep]
        return float((hit * sw).sum() / sw.sum())

    def summary(self) -> Summary:
        """MADlib's statistics as a readable table (``print(model.summary())``)."""
        self._check_fitted()
        status = "converged" if self.converged_ else "NOT converged"
        if self.separation_:
            status += f" ({self.separation_} separation: coefficients are not meaningful)"
        header = [
            ("rows processed", f"{self.num_rows_processed_:,}"),
            ("rows skipped (NULLs)", f"{self.num_missing_rows_skipped_:,}"),
            ("iterations", f"{self.n_iter_} ({status})"),
            ("penalty", f"l2, C={self.C}" if self.penalty == "l2" else "none"),
            ("log-likelihood", f"{self.log_likelihood_:.6f}"),
            ("condition number of X^T A X", f"{self.condition_no_:.4g}"),
        ]
        return Summary(self._stat_names, self._stats, header)
