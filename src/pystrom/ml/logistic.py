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
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._backend import resolve_device
from ..errors import DataError, NotFittedError, SchemaMismatchError, UnsupportedTypeError
from ._data import is_scan, is_table, not_2d_message, prepare_array, prepare_table
from ._irls import IRLSSolver
from ._sources import ArraySource, ScanSource, Source
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
        gradient's norm in the Hessian's metric, relative to the log-likelihood) are both at most ``tol``.
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
        Newton steps taken.
    converged_ : bool
        Whether they converged.
    coefficients_ : ndarray
        Intercept first (MADlib's ``coef``); the statistics below use this order.
    log_likelihood_, std_err_, z_stats_, p_values_, odds_ratios_, condition_no_, variance_covariance_
        MADlib's statistics (``std_err_`` etc. come from the inverse of X^T A X at the solution,
        penalised when ``penalty="l2"``). ``condition_no_`` is the condition number of X^T A X.
    num_rows_processed_, num_missing_rows_skipped_ : int
        Rows used, and rows left out for NULLs.
    n_features_in_, feature_names_in_
        As in scikit-learn (names only for Tables).
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
        self._validate_params()
        if isinstance(y, str) and target is None and (is_table(X) or is_scan(X)):
            target, y = y, None
        source, classes = self._source(X, y, sample_weight, columns, target)
        cw = self._class_weights(classes, source)
        source.class_weight = cw
        k = source.n_features
        l2 = 1.0 / float(self.C) if self.penalty == "l2" else 0.0
        solver = IRLSSolver(
            source.evaluate, k, bool(self.fit_intercept), l2, int(self.max_iter), float(self.tol), source.ll_rounding
        )
        res = solver.solve()
        self._set_learned(res, source, classes, l2)
        return self

    def _source(self, X: Any, y: Any, sample_weight: Any, columns: Any, target: Any) -> tuple[Source, np.ndarray]:
        if _is_dask(X):
            from ..dask._fit import dask_source  # up: fit takes dask collections; pystrom.dask builds on ml

            if self.device is not None:
                raise DataError("device= does not apply to dask input: the partitions are fitted where they live")
            source, classes, names = dask_source(X, y, sample_weight, columns, target)
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
            return ScanSource(X, prepare, backend, batch0), np.array([False, True])
        if columns is not None or target is not None:
            raise DataError("columns= and target= apply to Tables; for arrays pass fit(X, y)")
        if hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        batch, classes = prepare_array(X, y, sample_weight, self.device)
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

    def _set_learned(self, res: Any, source: Source, classes: np.ndarray, l2: float) -> None:
        k = source.n_features
        w = res.w
        self.classes_ = classes
        self.coef_ = w[:k].reshape(1, k).copy()
        self.intercept_ = np.array([w[k] if self.fit_intercept else 0.0])
        self.n_iter_ = res.n_iter
        self.converged_ = bool(res.converged)
        self.separation_ = res.separation
        self.n_features_in_ = k
        self.num_rows_processed_ = int(source.rows)
        self.num_missing_rows_skipped_ = int(source.skipped)
        self.n_passes_ = int(res.passes)
        self.device_ = source.backend.device
        # MADlib's order: intercept first.
        order = ([k] if self.fit_intercept else []) + list(range(k))
        H = res.totals.hessian[np.ix_(order, order)].copy()
        if l2:
            feats = np.arange(1 if self.fit_intercept else 0, len(order))
            H[feats, feats] += l2
        stats = compute_statistics(w[order], H, res.totals.log_likelihood)
        self.coefficients_ = stats.coef
        self.log_likelihood_ = stats.log_likelihood
        self.std_err_ = stats.std_err
        self.z_stats_ = stats.z_stats
        self.p_values_ = stats.p_values
        self.odds_ratios_ = stats.odds_ratios
        self.condition_no_ = stats.condition_no
        self.variance_covariance_ = stats.variance_covariance
        names = list(getattr(self, "feature_names_in_", source.names))
        self._stat_names = (["intercept"] if self.fit_intercept else []) + [str(n) for n in names]
        self._stats = stats

    # -- using the model --------------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise _not_fitted_error()("this LogisticRegression is not fitted yet: call fit(X, y) before using it")

    def decision_function(self, X: Any, *, columns: Sequence[str] | None = None) -> Any:
        """w.x + b for every row, on X's device (float64; float32 X is multiplied in float32); a dask
        array for a pystrom.dask collection or a dask array, computed where its partitions are."""
        self._check_fitted()
        if _is_dask(X):
            return _dask_predict(self, "decision_function", X, columns)
        if is_table(X):
            names = list(columns) if columns is not None else list(getattr(self, "feature_names_in_", []))
            if not names:
                raise DataError("this model was fitted on an array: pass columns=[...] to predict from a Table")
            table = X if self.device is None else X.to(self.device)
            return self._decision_array(table.to_array(names, dtype=_table_dtype(table, names)), names)
        if is_scan(X):
            parts = [self.decision_function(t, columns=columns) for t in X]
            xp = _xp_of(parts[0]) if parts else np
            return xp.concatenate(parts) if parts else np.zeros(0)
        backend = None
        if not hasattr(X, "__cuda_array_interface__") and not isinstance(X, np.ndarray):
            X = np.asarray(X)
        from .._backend import backend_of_array

        backend = backend_of_array(X)
        if backend is None:
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
        return self._decision_array(X, [f"x{j}" for j in range(X.shape[1])])

    def _decision_array(self, X: Any, names: list[str]) -> Any:
        from .._backend import backend_of_array
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
            coef = xp.asarray(self.coef_[0].astype(dtype))
            out = (X @ coef).astype(np.float64) + float(self.intercept_[0])
            if not bool(xp.isfinite(out).all()):
                raise locate_nonfinite(xp, X, names)
            return out

    def predict_proba(self, X: Any, **kwargs: Any) -> Any:
        """(n, 2) probabilities of ``classes_[0]`` and ``classes_[1]``."""
        if _is_dask(X):
            return _dask_predict(self, "predict_proba", X, kwargs.get("columns"))
        d = self.decision_function(X, **kwargs)
        xp = _xp_of(d)
        p1 = _sigmoid(xp, d)
        return xp.stack([1.0 - p1, p1], axis=1)

    def predict(self, X: Any, **kwargs: Any) -> Any:
        """The predicted label of every row (``classes_[1]`` where the decision function is positive)."""
        if _is_dask(X):
            return _dask_predict(self, "predict", X, kwargs.get("columns"))
        d = self.decision_function(X, **kwargs)
        xp = _xp_of(d)
        return xp.asarray(self.classes_)[(d > 0).astype(np.int64)]

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy (weighted by ``sample_weight``)."""
        pred = self.predict(X)
        xp = _xp_of(pred)
        y = xp.asarray(y)
        hit = (pred == y).astype(np.float64)
        if sample_weight is None:
            return float(hit.mean())
        sw = xp.asarray(sample_weight, dtype=np.float64)
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


def _independent(independent: str | Sequence[Any]) -> tuple[list[str], bool]:
    """Column names, and whether MADlib's intercept marker ``1`` was among them."""
    if isinstance(independent, str):
        text = independent.strip()
        if text.upper().startswith("ARRAY[") and text.endswith("]"):
            text = text[6:-1]
        independent = [p.strip() for p in text.split(",") if p.strip()]
    names, intercept = [], False
    for item in independent:
        if item == 1 or item == "1":
            intercept = True
        elif isinstance(item, str):
            names.append(item)
        else:
            raise DataError(f"independent variables are column names (and 1 for the intercept); got {item!r}")
    return names, intercept


def logregr_train(
    table: Any,
    dependent: str,
    independent: str | Sequence[Any],
    max_iter: int = 20,
    tol: float = 1e-4,
    **kwargs: Any,
) -> LogisticRegression:
    """MADlib's ``logregr_train`` on a Table or a scan: returns the fitted model.

    ``independent`` lists feature column names (``"ARRAY[1, x1, x2]"`` or ``[1, "x1", "x2"]`` as in
    MADlib; the intercept is fitted either way unless ``fit_intercept=False`` is passed). The model's
    ``coefficients_`` hold the intercept first, like MADlib's ``coef``; the statistics are the
    estimator's attributes. Other keyword arguments go to :class:`LogisticRegression`.
    """
    names, _ = _independent(independent)
    model = LogisticRegression(max_iter=max_iter, tol=tol, **kwargs)
    return model.fit(table, columns=names, target=dependent)


def _model_and_names(model: Any, independent: Any) -> tuple[LogisticRegression, list[str] | None]:
    names = _independent(independent)[0] if independent is not None else None
    if isinstance(model, LogisticRegression):
        model._check_fitted()
        return model, names
    coef = np.asarray(model, dtype=np.float64).ravel()  # MADlib's coef array: intercept first
    if coef.size < 2:
        raise DataError("coefficients must hold the intercept and at least one feature weight")
    m = LogisticRegression()
    m.coef_, m.intercept_ = coef[1:].reshape(1, -1), coef[:1].copy()
    m.classes_ = np.array([False, True])
    return m, names


def logregr_predict(model: Any, table: Any, independent: Any = None) -> Any:
    """MADlib's ``logregr_predict``: True where the predicted probability is above 0.5."""
    m, names = _model_and_names(model, independent)
    return m.decision_function(table, columns=names) > 0


def logregr_predict_prob(model: Any, table: Any, independent: Any = None) -> Any:
    """MADlib's ``logregr_predict_prob``: the probability of the positive class for every row."""
    m, names = _model_and_names(model, independent)
    d = m.decision_function(table, columns=names)
    return _sigmoid(_xp_of(d), d)
