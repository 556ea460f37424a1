"""The IRLS (Newton) solver for binary logistic regression, written once for every kind of input.

The solver never sees the data: it calls ``evaluate(w)``, which makes one pass over all rows and
returns the float64 sums of that pass (:class:`~pystrom.ml._pass.PassTotals`). An in-memory array and
a scan of many batches differ only in how that pass is made. Steps, in order (as in scikit-learn's
``_NewtonSolver``): :meth:`IRLSSolver.setup`, then per iteration :meth:`~IRLSSolver.newton_direction`
(Cholesky in float64, a warned fallback), :meth:`~IRLSSolver.line_search` (step halving),
:meth:`~IRLSSolver.check_separation` and :meth:`~IRLSSolver.check_convergence`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._pass import PassTotals

__all__ = ["ConvergenceWarning", "PerfectSeparationWarning", "NumericalWarning", "IRLSSolver", "IRLSResult"]

_MAX_HALVINGS = 30


class ConvergenceWarning(UserWarning):
    """The solver stopped before its convergence criteria were met."""


class PerfectSeparationWarning(ConvergenceWarning):
    """The classes are (quasi-)perfectly separated: the unpenalized maximum likelihood estimate does not exist."""


class NumericalWarning(UserWarning):
    """A numerical fallback was taken (the Hessian was not positive definite)."""


@dataclass
class IRLSResult:
    w: np.ndarray  # (k + 1,): features, then the intercept (0 when there is none)
    totals: PassTotals  # the pass at w
    n_iter: int
    converged: bool
    separation: str | None  # None, "complete" or "quasi-complete"
    passes: int


class IRLSSolver:
    """Maximise sum s_i log p(y_i | x_i, w) - 1/(2C) ||w_features||^2 by Newton's method.

    Parameters
    ----------
    evaluate
        ``evaluate(w) -> PassTotals``: one pass over the data at ``w`` (k + 1 values, intercept last).
    n_features
        k.
    fit_intercept
        Whether the intercept (index k) is a free parameter; otherwise it stays 0.
    l2
        1 / C for ``penalty="l2"``, 0 for none. The intercept is never penalised.
    ll_rounding
        ``() -> (rtol, atol)``: how exact a pass's log-likelihood is, relative to its size and per unit
        of row weight (0 for float64 per-row arithmetic); asked for after the first pass.
    max_iter, tol
        At most ``max_iter`` Newton steps; converged when the relative change of the (penalised)
        log-likelihood is at most ``tol`` and so is the gradient's norm in the metric of the Hessian
        (the Newton decrement g^T H^-1 g, relative to the log-likelihood: it does not depend on how
        the features are scaled).
    """

    def __init__(
        self,
        evaluate: Callable[[np.ndarray], PassTotals],
        n_features: int,
        fit_intercept: bool,
        l2: float,
        max_iter: int,
        tol: float,
        ll_rounding: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0),
    ):
        self.evaluate = evaluate
        self.ll_rounding = ll_rounding
        self.k = n_features
        self.fit_intercept = fit_intercept
        self.l2 = float(l2)
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.passes = 0
        self._warned_fallback = False

    # -- named steps ------------------------------------------------------------------------------

    def setup(self, w0: np.ndarray | None = None, totals0: PassTotals | None = None) -> tuple[np.ndarray, PassTotals]:
        """Start at ``w0`` (default 0), using the pass already made there when given."""
        self.active = np.r_[np.arange(self.k), [self.k] if self.fit_intercept else []].astype(np.intp)
        w = np.zeros(self.k + 1) if w0 is None else np.array(w0, dtype=np.float64)
        totals = totals0 if totals0 is not None else self._pass(w)
        return w, totals

    def objective(self, w: np.ndarray, t: PassTotals) -> float:
        if not self.l2:
            return t.log_likelihood
        return t.log_likelihood - 0.5 * self.l2 * float(w[: self.k] @ w[: self.k])

    def penalized(self, w: np.ndarray, t: PassTotals) -> tuple[np.ndarray, np.ndarray]:
        """Gradient and negative Hessian of the objective over the free parameters."""
        if self.fit_intercept and not self.l2:  # every parameter free, nothing added: read-only use
            return t.gradient, t.hessian
        if self.fit_intercept:
            g, H = t.gradient.copy(), t.hessian.copy()
        else:
            a = self.active
            g, H = t.gradient[a].copy(), t.hessian[np.ix_(a, a)].copy()
        if self.l2:
            nf = self.k  # the features come first in `active`
            g[:nf] -= self.l2 * w[:nf]
            H[np.arange(nf), np.arange(nf)] += self.l2
        return g, H

    def newton_direction(self, w: np.ndarray, t: PassTotals) -> tuple[np.ndarray, float]:
        """The Newton step (full length, k + 1 values) and the decrement g^T H^-1 g, by Cholesky in float64."""
        g, H = self.penalized(w, t)
        try:
            step_a = _newton_solve(H, g)
        except np.linalg.LinAlgError:
            if not self._warned_fallback:
                warnings.warn(
                    "X^T R X is not positive definite (collinear or constant features, or fitted probabilities "
                    "at 0/1): IRLS fell back to a least-squares step; the statistics may be unreliable. "
                    "Drop redundant columns or use penalty='l2'.",
                    NumericalWarning,
                    stacklevel=4,
                )
                self._warned_fallback = True
            step_a = np.linalg.lstsq(H, g, rcond=None)[0]
        if len(step_a) == self.k + 1:  # every parameter is free
            return step_a, float(g @ step_a)
        step = np.zeros(self.k + 1)
        step[self.active] = step_a
        return step, float(g @ step_a)

    def line_search(self, w: np.ndarray, step: np.ndarray, t: PassTotals) -> tuple[np.ndarray, PassTotals, bool]:
        """Take the step, halving it while the objective gets worse. Returns (w, totals, improved)."""
        f0 = self.objective(w, t)
        # Not a real decrease: rounding in a sum over many rows, and, for float32 input, the float32
        # logs of the pass (either evaluation may err by that much; _pass.F32_LL_RTOL says why).
        rtol, atol = self.ll_rounding()
        slack = 1e-13 * max(1.0, abs(f0)) + 2.0 * (rtol * abs(t.log_likelihood) + atol * t.weight_sum)
        scale = 1.0
        for _ in range(_MAX_HALVINGS + 1):
            w_new = w + scale * step
            t_new = self._pass(w_new)
            f_new = self.objective(w_new, t_new)
            if np.isfinite(f_new) and f_new >= f0 - slack:
                return w_new, t_new, True
            scale *= 0.5
        return w, t, False

    def check_separation(self, t: PassTotals) -> bool:
        """Complete separation: the current weights classify every weighted row correctly with a
        positive margin, so scaling them up drives the log-likelihood to 0 and no maximum exists."""
        return self.l2 == 0.0 and t.weight_sum > 0 and t.min_margin > 0.0

    def check_convergence(self, f_old: float, f_new: float, decrement: float) -> bool:
        rel = abs(f_new - f_old) / max(abs(f_new), 1e-300)
        return rel <= self.tol and decrement <= self.tol * max(1.0, abs(f_new))

    # -- the loop ---------------------------------------------------------------------------------

    def solve(self, w0: np.ndarray | None = None, totals0: PassTotals | None = None) -> IRLSResult:
        w, t = self.setup(w0, totals0)
        step, dec = self.newton_direction(w, t)
        converged, separation, n_iter = False, None, 0
        w_prev = w  # the coefficients before the last step taken
        while n_iter < self.max_iter:
            if self.check_separation(t):
                separation = "complete"
                break
            n_iter += 1
            f_old = self.objective(w, t)
            w_new, t_new, improved = self.line_search(w, step, t)
            if not improved:  # no decrease possible: at the optimum up to rounding, or stuck
                converged = dec <= 1e-6 * max(1.0, abs(f_old))
                break
            w_prev, w, t = w, w_new, t_new
            step, dec = self.newton_direction(w, t)
            if self.check_separation(t):
                separation = "complete"
                break
            if self.check_convergence(f_old, self.objective(w, t), dec):
                converged = True
                break
        if separation is None and self.l2 == 0.0 and t.saturated_rows > 0:
            # Quasi-complete separation: some rows are fitted with probability 0/1 while the
            # coefficients still move by a sizeable fraction of themselves at every step.
            last_step_norm = float(np.max(np.abs(w - w_prev)))
            if not converged or last_step_norm > 1e-3 * max(1.0, float(np.max(np.abs(w)))):
                separation = "quasi-complete"
        if separation is not None:
            converged = False
            warnings.warn(
                (
                    "perfect separation: the current coefficients classify every row correctly"
                    if separation == "complete"
                    else f"perfect separation suspected: {t.saturated_rows:,} row(s) are fitted with probability 0 "
                    "or 1 while the coefficients keep growing (quasi-complete separation, or complete separation "
                    "not yet certified)"
                )
                + f" after {n_iter} iteration(s). The maximum likelihood estimate does not exist, so the coefficients "
                "are not meaningful (they would grow without bound). Use penalty='l2' (C=...) for a finite fit, "
                "or remove the feature(s) that separate the classes.",
                PerfectSeparationWarning,
                stacklevel=3,
            )
        elif not converged:
            warnings.warn(
                f"IRLS did not converge in {n_iter} iteration(s) (max_iter={self.max_iter}, tol={self.tol:g}); "
                "raise max_iter, or scale the features",
                ConvergenceWarning,
                stacklevel=3,
            )
        return IRLSResult(w, t, n_iter, converged, separation, self.passes)

    def _pass(self, w: np.ndarray) -> PassTotals:
        self.passes += 1
        return self.evaluate(w)


def _newton_solve(H: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Solve H x = g by Cholesky; np.linalg.LinAlgError where H is not positive definite.

    Up to 8 parameters in plain Python (factor and substitution on lists: a fifth of the time of
    NumPy's calls, whose overhead dwarfs the arithmetic; an in-memory fit of 40M rows spends ~0.4 ms a
    Newton step in the GPU pass, so the host's share shows); beyond that NumPy's Cholesky.
    """
    p = len(g)
    if p > 8:
        return _cholesky_solve(np.linalg.cholesky(H), g)
    a = H.tolist()
    L = [[0.0] * p for _ in range(p)]
    for j in range(p):
        Lj = L[j]
        d = a[j][j]
        for q in range(j):
            d -= Lj[q] * Lj[q]
        if not d > 0.0 or d == float("inf"):  # also NaN
            raise np.linalg.LinAlgError("Matrix is not positive definite")
        d = d**0.5
        Lj[j] = d
        for i in range(j + 1, p):
            Li = L[i]
            v = a[i][j]
            for q in range(j):
                v -= Li[q] * Lj[q]
            Li[j] = v / d
    z = g.tolist()
    for i in range(p):
        Li = L[i]
        v = z[i]
        for q in range(i):
            v -= Li[q] * z[q]
        z[i] = v / Li[i]
    for i in range(p - 1, -1, -1):
        v = z[i]
        for q in range(i + 1, p):
            v -= L[q][i] * z[q]
        z[i] = v / L[i][i]
    return np.array(z)


def _cholesky_solve(L: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Solve (L L^T) x = g by forward and back substitution (more than 8 parameters; _newton_solve
    does fewer itself).

    NumPy has no triangular solver, and its general one refactors the matrix (O(p^3); 1.3 ms for
    p = 257 on the GPU machine, twice per Newton step): from 64 parameters on, blocks of rows are
    substituted at once (a small general solve on each diagonal block, a matrix-vector product for
    the rest). Below that NumPy's solver is quicker (measured on the 2-core CI machine).
    """
    if len(g) >= 64:
        return _blocked_upper(L.T, _blocked_lower(L, g))
    return np.linalg.solve(L.T, np.linalg.solve(L, g))


_BLOCK = 32


def _blocked_lower(L: np.ndarray, b: np.ndarray) -> np.ndarray:
    z = np.array(b, dtype=np.float64)
    for i in range(0, len(z), _BLOCK):
        j = min(len(z), i + _BLOCK)
        z[i:j] = np.linalg.solve(L[i:j, i:j], z[i:j] - L[i:j, :i] @ z[:i])
    return z


def _blocked_upper(U: np.ndarray, b: np.ndarray) -> np.ndarray:
    z = np.array(b, dtype=np.float64)
    p = len(z)
    for j in range(p, 0, -_BLOCK):
        i = max(0, j - _BLOCK)
        z[i:j] = np.linalg.solve(U[i:j, i:j], z[i:j] - U[i:j, j:] @ z[j:])
    return z
