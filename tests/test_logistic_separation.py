"""Separation judged alike for float32 and float64 input (issue 39, item 4): the kind pystrom reports
against a linear-programming oracle over random small data sets, the issue's reproducer, a direction
that cancels on the overlapping rows only up to rounding, and the float32 residuals of rows fitted with
probability near 0 or 1, which the diagnosis's Newton steps follow."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_logistic import on

from pystrom.ml import LogisticRegression, PerfectSeparationWarning
from pystrom.ml._pass import PassTotals, xp_pass

linprog = pytest.importorskip("scipy.optimize").linprog

TOLS = (1e-2, 1e-4, 1e-8, 1e-12)


def lp_separation(X: np.ndarray, y: np.ndarray) -> str | None:
    """The kind of separation by linear programming, on the values as float64 (A: the rows with the
    intercept's 1, signed by the class). Separated exactly when some d, |d| <= 1, has every margin
    A d >= 0 and their sum > 0; complete when some d has every margin >= t > 0."""
    A = np.column_stack([X, np.ones(len(y))]) * np.where(y > 0, 1.0, -1.0)[:, None]
    n, p = A.shape
    box = [(-1.0, 1.0)] * p
    most = linprog(-A.sum(axis=0), A_ub=-A, b_ub=np.zeros(n), bounds=box, method="highs")
    if not (most.status == 0 and -most.fun > 1e-7):
        return None
    c = np.zeros(p + 1)
    c[-1] = -1.0  # maximise t
    least = linprog(c, A_ub=np.column_stack([-A, np.ones(n)]), b_ub=np.zeros(n), bounds=[*box, (None, 1.0)],
                    method="highs")  # fmt: skip
    return "complete" if least.status == 0 and -least.fun > 1e-7 else "quasi-complete"


def random_case(seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """8-79 rows, 1-3 features: plain, with a 0/1 dummy, with every dummy row of class 1 (Allison's
    quasi-complete case), or class 1 where the first column is at its largest; labels from a logistic
    model of varied strength; a tol of the fit."""
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(8, 80)), int(rng.integers(1, 4))
    X = rng.normal(size=(n, k))
    shape = int(rng.integers(0, 4))
    if shape:
        X[:, 0] = (rng.random(n) < 0.3).astype(float)
    strength = float(rng.choice([0.5, 2.0, 6.0]))
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ (rng.normal(size=k) * strength))))).astype(float)
    if shape == 2:
        y[X[:, 0] == 1] = 1.0
    if shape == 3:
        y[X[:, 0] == X[:, 0].max()] = 1.0
    return X, y, float(rng.choice(TOLS))


def _fit(device: str, X: np.ndarray, y: np.ndarray, **kw) -> tuple[LogisticRegression, bool]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        m = LogisticRegression(**kw).fit(on(device, X), on(device, y))
    return m, any(issubclass(r.category, PerfectSeparationWarning) for r in record)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_separation_kind_agrees_with_linear_programming(device, dtype):
    # before: float32 missed every quasi-complete case here (161 of 161), float64 one (tol 1e-2/1e-4)
    wrong, seen = [], {None: 0, "quasi-complete": 0, "complete": 0}
    for seed in range(300):
        X, y, tol = random_case(seed)
        if not 0 < y.sum() < len(y):
            continue
        Xd = X.astype(dtype)
        want = lp_separation(Xd.astype(np.float64), y)
        seen[want] += 1
        m, warned = _fit(device, Xd, y, tol=tol)
        if m.separation_ != want or warned != (want is not None) or (want is not None and m.converged_):
            wrong.append((seed, tol, want, m.separation_, warned))
    assert not wrong, f"{len(wrong)} misjudged (seed, tol, LP, pystrom, warned): {wrong[:10]}"
    assert min(seen.values()) >= 30, seen  # every kind well represented


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_issue_reproducer_is_quasi_complete(device, dtype):
    r = np.random.default_rng(0)
    n = 500
    d = (r.random(n) < 0.15).astype(float)
    x = r.standard_normal(n)
    y = (r.random(n) < 1 / (1 + np.exp(-x))).astype(int)
    y[d == 1] = 1
    X = np.c_[d, x].astype(dtype)
    assert lp_separation(X.astype(np.float64), y) == "quasi-complete"
    m, warned = _fit(device, X, y)  # was, for float32: None, converged, coefficient 14.3 (se 87.8)
    assert m.separation_ == "quasi-complete" and warned and not m.converged_


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("tol", TOLS)
def test_direction_that_cancels_on_the_overlap_up_to_rounding(device, dtype, tol):
    """The rows with x = 0 are all class 0, those with x = 1 overlap: the steps approach d = (1, -1),
    whose margin on the x = 1 rows, d_x + d_intercept, is 0 only up to rounding (float32's steps:
    about -2e-8). The diagnosis steps on until rows are saturated instead of giving up (before: missed
    for float32 at every tol, and for float64 at tol 1e-2 and 1e-4)."""
    X = np.array([[0.0], [0.0], [1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [1.0]], dtype=dtype)
    y = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1], dtype=float)
    m, warned = _fit(device, X, y, tol=tol)
    assert m.separation_ == "quasi-complete" and warned


def _saturated(dtype: type, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows every one fitted with probability within e^-20 of its class (margins 20 to 60, both classes)."""
    rng = np.random.default_rng(seed)
    n = 301
    X = (rng.normal(size=(n, k)) * 0.1).astype(dtype)
    margin = rng.uniform(20.0, 60.0, size=n)
    y = (rng.random(n) < 0.5).astype(np.uint8)
    X[:, 0] = np.where(y == 1, margin, -margin).astype(dtype)
    w = np.zeros(k + 1)
    w[0] = 1.0
    w[1:k] = rng.normal(size=k - 1) * 0.1
    return X, y, w


def exact_gradient(X: np.ndarray, y: np.ndarray, sw: np.ndarray | None, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum s (y - mu) x~ in float64 from exp, and the same sum of absolute values (its scale)."""
    Xt = np.column_stack([X.astype(np.float64), np.ones(len(y))])
    eta = Xt @ w
    miss = 1.0 / (1.0 + np.exp(np.where(y > 0, eta, -eta)))  # the probability of the class not observed
    resid = np.where(y > 0, miss, -miss) * (1.0 if sw is None else sw)
    return Xt.T @ resid, np.abs(Xt).T @ np.abs(resid)


def assert_saturated_gradient(got: np.ndarray, X: np.ndarray, y: np.ndarray, sw, w: np.ndarray, what: str) -> None:
    """float32 row math: each residual to ~(|eta| + 4) float32 ulps (4e-6 at a margin of 60)."""
    want, scale = exact_gradient(X, y, sw, w)
    assert (np.abs(got - want) <= 1e-4 * scale).all(), f"{what}: {got} against {want}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_twin_keeps_the_residuals_of_saturated_rows(dtype):
    # before: y - mu from 1 - 1/(1 + e) was 0 for float32 from a margin of ~17 (float64: ~37)
    for k in (1, 3, 12):
        X, y, w = _saturated(dtype, k, k)
        sw = np.random.default_rng(k).random(len(y)) * 2
        t = PassTotals.unpack(xp_pass(np, X, y, sw, (1.0, 1.0), w), k)
        assert t.saturated_rows == len(y)
        assert_saturated_gradient(t.gradient, X, y, sw, w, f"k={k} {dtype.__name__}")
