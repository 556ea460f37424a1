"""Binary logistic regression: a scikit-learn-style estimator and MADlib's ``logregr_*`` functions.

The estimator only validates and wires things up; the solver is :class:`~pystrom.ml._irls.IRLSSolver`,
the pass over the data lives in :mod:`pystrom.ml._sources` / :mod:`pystrom.ml._pass`, and the
statistics in :mod:`pystrom.ml._stats`. scikit-learn is not needed: its estimator contract is
mirrored (``__init__`` stores parameters unchanged, ``get_params``/``set_params``, ``fit`` returns
``self``, learned attributes end in ``_``), so ``sklearn.base.clone`` and pipelines work.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError, NotFittedError, SchemaMismatchError, UnsupportedTypeError
from ..memory.backend import resolve_device
from ._data import is_scan, is_table, not_2d_message, prepare_array, prepare_table
from ._irls import IRLSSolver, NumericalWarning
from ._sources import ArraySource, ScanSource, Source
from ._staging import host_staging
from ._stats import Summary, compute_statistics

__all__ = ["LogisticRegression", "logregr_train", "logregr_predict", "logregr_predict_prob"]


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
        source, classes = self._source(X, y, sample_weight, columns, target)
        try:
            return self._solve(source, classes, rule, intercept_at)
        finally:
            source.close()  # a streamed fit's pinned memory and device buffers, also after an error

    def _solve(self, source: Source, classes: np.ndarray, rule: str, intercept_at: int) -> LogisticRegression:
        cw = self._class_weights(classes, source)
        source.class_weight = cw
        k = source.n_features
        l2 = 1.0 / float(self.C) if self.penalty == "l2" else 0.0
        solver = IRLSSolver(
            source.evaluate,
            k,
            bool(self.fit_intercept),
            l2,
            int(self.max_iter),
            float(self.tol),
            source.ll_rounding,
            rule=rule,
            approximate=source.approximate_hessian(),
            plan_steps=source.plan_steps,
        )
        res = solver.solve()
        order = list(range(k))
        if self.fit_intercept:
            order.insert(min(max(int(intercept_at), 0), k), k)
        self._set_learned(res, source, classes, l2, order)
        return self

    def _source(self, X: Any, y: Any, sample_weight: Any, columns: Any, target: Any) -> tuple[Source, np.ndarray]:
        if _is_dask(X):
            from ..dask._fit import dask_source  # up: fit takes dask collections; pystrom.dask builds on ml

            if self.device is not None:
                raise DataError("device= does not apply to dask input: the partitions are fitted where they live")
            source, classes, names = dask_source(X, y, sample_weight, columns, target)
            self._names_from_frame = False
            if target is not None:
                self.feature_names_in_ = np.array(names, dtype=object)
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
            return source, classes
        if is_table(X):
            weight = sample_weight if isinstance(sample_weight, str) else None
            if sample_weight is not None and weight is None:
                raise UnsupportedTypeError("with a Table, sample_weight is the name of a weight column")
            if y is not None:
                raise DataError("with a Table, name the target column: target='name' (y must be None)")
            batch, classes = prepare_table(X, columns, target, weight, self.device, binary01=False)
            self.feature_names_in_ = np.array(batch.names, dtype=object)
            self._names_from_frame = False
            return ArraySource(batch), classes
        if is_scan(X):
            weight = sample_weight if isinstance(sample_weight, str) else None
            if (sample_weight is not None and weight is None) or y is not None:
                raise UnsupportedTypeError("with a scan of Tables, pass target='name' (and sample_weight='column')")
            first = next(iter(X), None)
            if first is None:
                raise DataError("the scan yielded no batches: nothing to fit")
            if not is_table(first):
                raise UnsupportedTypeError(
                    f"a scan must yield pystrom Tables; its first item is a {type(first).__name__}"
                )
            device = self.device if self.device is not None else first.device
            backend = resolve_device(device)

            def prepare(table: Any) -> Any:
                if not is_table(table):
                    raise UnsupportedTypeError(f"a scan must yield pystrom Tables; it yielded a {type(table).__name__}")
                return prepare_table(table, columns, target, weight, backend, binary01=True)[0]

            batch0 = prepare(first)
            self.feature_names_in_ = np.array(batch0.names, dtype=object)
            self._names_from_frame = False
            read = None if columns is None else [*batch0.names, target] + ([weight] if weight else [])
            staging = host_staging(backend, first, read)
            return ScanSource(X, prepare, backend, batch0, staging), np.array([False, True])
        if columns is not None or target is not None:
            raise DataError("columns= and target= apply to Tables; for arrays pass fit(X, y)")
        if hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        names = _frame_names(X)
        batch, classes = prepare_array(X, y, sample_weight, self.device)
        self._names_from_frame = names is not None  # scikit-learn warns when such a model gets bare arrays
        if names is not None:
            self.feature_names_in_ = np.array(names, dtype=object)
            batch.names = list(names)
        return ArraySource(batch), classes

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
        unknown = [key for key in cw if not any(_same_label(key, c) for c in classes)]
        if unknown:
            raise DataError(f"class_weight names label(s) {unknown!r} that are not classes {list(classes)!r}")
        out = []
        for c in classes:
            match = [v for key, v in cw.items() if _same_label(key, c)]
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
            raise _not_fitted_error()("this LogisticRegression is not fitted yet: call fit(X, y) before using it")

    def decision_function(self, X: Any, *, columns: Sequence[str] | None = None) -> Any:
        """w.x + b for every row, on X's device (float64; float32 X is multiplied in float32); a dask
        array for a pystrom.dask collection or a dask array, computed where its partitions are.

        A Table may hold NULLs in the feature columns: those rows give NaN (MADlib returns NULL).
        Aliased coefficients (NaN) count as 0: the predictions are the reduced model's.
        """
        self._check_fitted()
        if _is_dask(X):
            return _dask_predict(self, "decision_function", X, columns)
        if is_table(X):
            names = list(columns) if columns is not None else list(getattr(self, "feature_names_in_", []))
            if not names:
                raise DataError("this model was fitted on an array: pass columns=[...] to predict from a Table")
            table = X if self.device is None else X.to(self.device)
            valid = _valid_rows(table, names)
            array = table.to_array(names, dtype=_table_dtype(table, names), nulls="raise" if valid is None else "nan")
            return self._decision_array(array, names, valid)
        if is_scan(X):
            parts = [self.decision_function(t, columns=columns) for t in X]
            xp = _xp_of(parts[0]) if parts else np
            return xp.concatenate(parts) if parts else np.zeros(0)
        frame_names = _frame_names(X)
        fitted_names = getattr(self, "feature_names_in_", None)
        if frame_names is not None and fitted_names is not None and list(frame_names) != list(fitted_names):
            raise DataError(_names_mismatch(list(frame_names), [str(n) for n in fitted_names]))
        if frame_names is not None and fitted_names is None:
            warnings.warn(
                "X has feature names, but LogisticRegression was fitted without feature names",
                UserWarning,
                stacklevel=2,
            )
        if frame_names is None and getattr(self, "_names_from_frame", False) and not _is_frame_like(X):
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
        names = list(frame_names) if frame_names is not None else [f"x{j}" for j in range(X.shape[1])]
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
            if bool(bad.any()):
                raise locate_nonfinite(xp, X if valid is None else X[valid], names)
            if valid is not None:
                out[~valid] = np.nan
            return out

    def predict_proba(self, X: Any, **kwargs: Any) -> Any:
        """(n, 2) probabilities of ``classes_[0]`` and ``classes_[1]`` (NaN for rows with NULLs)."""
        if _is_dask(X):
            return _dask_predict(self, "predict_proba", X, kwargs.get("columns"))
        d = self.decision_function(X, **kwargs)
        xp = _xp_of(d)
        p1 = _sigmoid(xp, d)
        return xp.stack([1.0 - p1, p1], axis=1)

    def predict_log_proba(self, X: Any, **kwargs: Any) -> Any:
        """(n, 2) natural logs of :meth:`predict_proba`, computed without rounding to 0 first."""
        if _is_dask(X):
            return _dask_predict(self, "predict_log_proba", X, kwargs.get("columns"))
        d = self.decision_function(X, **kwargs)
        xp = _xp_of(d)
        tail = xp.log1p(xp.exp(-xp.abs(d)))
        return xp.stack([-(xp.maximum(d, 0.0) + tail), -(xp.maximum(-d, 0.0) + tail)], axis=1)

    def predict(self, X: Any, **kwargs: Any) -> Any:
        """The predicted label of every row (``classes_[1]`` where the decision function is positive).

        Rows of a Table with NULL features have no label: the result is then float64 with NaN there
        for numeric or bool labels (True as 1.0, as pandas does), or a NumPy object array with None.
        """
        if _is_dask(X):
            return _dask_predict(self, "predict", X, kwargs.get("columns"))
        return self._labels(self.decision_function(X, **kwargs))

    def _labels(self, d: Any) -> Any:
        xp = _xp_of(d)
        missing = xp.isnan(d)
        classes = self.classes_
        if not bool(missing.any()):
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
        xp = _xp_of(d)
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
        skipped = int(d.shape[0] - int(xp.count_nonzero(keep)))
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


def _not_fitted_error() -> type:
    """Our NotFittedError; when scikit-learn is loaded, one that is also scikit-learn's (its checks ask for it)."""
    sk = sys.modules.get("sklearn.exceptions")
    if sk is None:
        return NotFittedError
    return _sklearn_not_fitted(sk.NotFittedError)


@functools.cache
def _sklearn_not_fitted(base: type) -> type:
    return type("NotFittedError", (NotFittedError, base), {"__module__": NotFittedError.__module__})


def _same_label(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _frame_names(X: Any) -> list[str] | None:
    """A pandas DataFrame's column names (all strings), as scikit-learn's ``feature_names_in_``."""
    cols = getattr(X, "columns", None)
    if cols is None or not hasattr(X, "iloc"):
        return None
    names = list(cols)
    return names if names and all(isinstance(n, str) for n in names) else None


def _names_mismatch(given: list[str], fitted: list[str]) -> str:
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


def _is_frame_like(X: Any) -> bool:
    return hasattr(X, "columns") and hasattr(X, "iloc")


def _valid_rows(table: Any, names: Sequence[str]) -> Any:
    """True where none of the named columns is NULL; None when they hold no NULLs."""
    valid = None
    for name in names:
        col = table.column(name)
        if col.null_count:
            v = col.is_valid()
            valid = v if valid is None else valid & v
    return valid


def _table_dtype(table: Any, names: list[str]) -> Any:
    return np.float32 if {str(table.column(n).type) for n in names} == {"float"} else np.float64


def _is_dask(x: Any) -> bool:
    """A pystrom.dask collection or a dask array (dask is never imported here: it was if x is one)."""
    if "dask" not in sys.modules:
        return False
    from ..dask._fit import is_dask_input  # up: fit and predict take dask input

    return is_dask_input(x)


def _dask_predict(model: LogisticRegression, method: str, X: Any, columns: Sequence[str] | None) -> Any:
    """``model.method`` on dask input: a dask array whose blocks are the method on each partition, where it lives."""
    from ..dask._fit import dask_predict  # up: predictions on dask input are dask arrays

    model._check_fitted()
    return dask_predict(model, method, X, columns, _table_dtype)


def _xp_of(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def _sigmoid(xp: Any, d: Any) -> Any:
    e = xp.exp(-xp.abs(d))
    return xp.where(d >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# -- MADlib's functions ---------------------------------------------------------------------------


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
    xp = _xp_of(d)
    missing = xp.isnan(d)
    if not bool(missing.any()):
        return d > 0
    out = (d > 0).astype(np.float64)
    out[missing] = np.nan
    return out


def logregr_predict_prob(model: Any, table: Any, independent: Any = None) -> Any:
    """MADlib's ``logregr_predict_prob``: the probability of the positive class for every row (NaN for NULLs)."""
    m, names = _model_and_names(model, independent)
    d = m.decision_function(table, columns=names)
    return _sigmoid(_xp_of(d), d)
