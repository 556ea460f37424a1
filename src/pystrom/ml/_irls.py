"""The IRLS (Newton) solver for binary logistic regression, written once for every kind of input.

The solver never sees the data: it calls ``evaluate(w)``, which makes one pass over all rows and
returns the float64 sums of that pass (:class:`~pystrom.ml._pass.PassTotals`). An in-memory array and
a scan of many batches differ only in how that pass is made. Steps, in order (as in scikit-learn's
``_NewtonSolver``):

1. :meth:`IRLSSolver.setup`: the first pass (at w = 0), and from its X^T A X the aliased parameters
   (collinear or constant columns, found in R's order: intercept first), which stay fixed at 0
   (unpenalised fits only), and whether the passes of the iterations may form the Hessian in float32
   (wide fits: :meth:`~IRLSSolver.allow_approximate`);
2. per iteration :meth:`~IRLSSolver.newton_direction` (Cholesky in float64, a warned fallback),
   :meth:`~IRLSSolver.line_search` (step halving) and :meth:`~IRLSSolver.check_convergence` (the
   ``"pystrom"`` rule, or MADlib's: an absolute change of the log-likelihood below tol), after a check
   of the complete-separation certificate;
3. :meth:`~IRLSSolver.finish`: the Newton step computed at the last pass is applied, as MADlib's last
   iteration does (its coefficients are one step past the pass its statistics come from);
4. :meth:`~IRLSSolver.diagnose_separation`: more Newton steps from there, which never change the
   result, to tell an existing maximum (the steps shrink quadratically) from a separation (they do
   not, and a certificate is checked), whatever tol the fit used;
5. where the last pass formed its Hessian in float32, it is made again with a float64 one before
   steps 3 and 4 (which then use float64 Hessians only), so the final step and the statistics are
   the float64 fit's (:meth:`~IRLSSolver.exact_totals` guards the statistics' pass); the iteration
   that ``max_iter`` makes the last asks for a float64 pass at once instead.

Approximate Hessians (more than 8 features, ``evaluate(w, exact=False, rounding=u)``): the gradient
and the log-likelihood of every pass stay float64, so the fixed point of the iteration, the line
search and the stopping rules are those of the float64 fit; only the Newton step is computed with a
Hessian that errs by about its condition number times the rounding ``u``, which turns Newton's
quadratic convergence into a linear one with that ratio. The source offers its reduced precisions
cheapest first (on a GPU: TF32, then float32); the first pass is exact, and the cheapest precision
whose guard its (diagonally scaled) condition passes (:data:`APPROX_MAX_COND`) drives the
iterations. An iteration whose full step near the optimum shrank the Newton decrement by less than
:data:`APPROX_MIN_GAIN` moves to the next precision (the last: float64); a decrement already at the
log-likelihood's rounding floor keeps the precision (an exact Hessian cannot make it smaller: with
``tol=0`` the iterations after convergence run there); a reduced-precision Hessian that is not
positive definite turns them off for the rest of the fit.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError
from ._linalg import find_aliased, newton_solve
from ._pass import PassTotals

__all__ = ["ConvergenceWarning", "PerfectSeparationWarning", "NumericalWarning", "IRLSSolver", "IRLSResult"]

_MAX_HALVINGS = 30
# Separation diagnosis: at most this many extra Newton steps; a step this small (in units of the
# linear predictor, relative to the coefficients) means Newton has settled on an existing maximum;
# and this many consecutive steps that do not shrink (ratio within [1/2, 2]) mean it never will.
DIAG_STEPS = 30
SETTLED = 1e-7
# ...and for float32 input, whose float32 sigmoids leave the steps at an existing maximum wandering by
# up to ~4e-7 of the coefficients (measured on 200 such fits, condition numbers up to 1.6e6), with more
# for worse conditioning; under separation a step is ~1/margin of them (the margin grows ~1 a step)
SETTLED_ROUNDED = 1e-4
STEADY_STEPS = 3
# Float32 Hessians: used only where the first pass's X^T A X, scaled to a unit diagonal, has a
# condition (estimated from its Cholesky factor) below this (float32's rounding times it is then far
# below 1, so a Newton step keeps nearly all of its quadratic gain); turned off when a full step near
# the optimum (decrement below APPROX_NEAR of the log-likelihood) shrinks the decrement less than
# APPROX_MIN_GAIN times, where a float64 Newton step shrinks it quadratically.
APPROX_MAX_COND = 1e4  # for float32's rounding (2^-24); scaled by the rounding the pass reports (TF32: 2^-17)
APPROX_NEAR = 1e-4
APPROX_MIN_GAIN = 0.25


class ConvergenceWarning(UserWarning):
    """The solver stopped before its convergence criteria were met."""


class PerfectSeparationWarning(ConvergenceWarning):
    """The classes are (quasi-)perfectly separated: the unpenalized maximum likelihood estimate does not exist."""


class NumericalWarning(UserWarning):
    """A numerical fallback was taken, or a tolerance could not be honoured at the input's precision."""


@dataclass
class IRLSResult:
    w: np.ndarray  # (k + 1,): features, then the intercept (0 when there is none); aliased ones are 0
    totals: PassTotals  # the pass the statistics use
    n_iter: int
    converged: bool
    separation: str | None  # None, "complete" or "quasi-complete"
    passes: int
    free: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))  # parameters fitted
    aliased: list[int] = field(default_factory=list)  # parameters fixed at 0 (collinear or constant)
    reach: float | None = None  # float32 input: the relative precision converged to, when tol asked for less
    approx_passes: int = 0  # passes whose Hessian was formed in float32


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
    max_iter, tol, rule
        ``rule="pystrom"``: at most ``max_iter`` Newton steps; converged when the relative change of
        the (penalised) log-likelihood is at most ``tol`` and so is the Newton decrement g^T H^-1 g
        relative to the log-likelihood (it does not depend on how the features are scaled).
        ``rule="madlib"``: MADlib's ``logregr_train``: at most ``max_iter`` iterations counting the
        final step; converged when the log-likelihood changed by less than ``tol`` (absolute).
        Either way the step computed at the last pass is applied (:meth:`finish`); ``tol=0`` never
        stops early.
    ll_rounding
        ``() -> (rtol, atol)``: how exact a pass's log-likelihood is, relative to its size and per unit
        of row weight (0 for float64 per-row arithmetic); asked for after the first pass.
    approximate
        0 or (), or the unit rounding(s) of the Hessians ``evaluate(w, exact=False, rounding=u)`` may
        form in reduced precision, cheapest first (2^-17 for TF32, 2^-24 for float32;
        ``PassTotals.exact_hessian`` says whether a pass was); the solver asks for the cheapest that
        :meth:`allow_approximate` admits, in the iterations its checks allow.
    plan_steps
        ``(active, n_free_features, l2, ahead, exact_next)``: tells the source the step rule, for a
        source whose passes compute the Newton step themselves (``PassTotals.newton_step``, used only
        when its ``step_rule`` is the solver's :meth:`step_rule`) and, with ``ahead``, start the pass at
        the full step before it is asked for, with a float64 Hessian where ``exact_next`` (the GPU
        passes: ``_narrow.py``, ``_wide.py``).
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
        rule: str = "pystrom",
        approximate: float | tuple[float, ...] = 0.0,
        plan_steps: Callable[[np.ndarray, int, float, bool, bool], None] | None = None,
    ):
        if rule not in ("pystrom", "madlib"):
            raise ValueError(f"rule must be 'pystrom' or 'madlib'; got {rule!r}")
        self.evaluate = evaluate
        self.ll_rounding = ll_rounding
        self.k = n_features
        self.fit_intercept = fit_intercept
        self.l2 = float(l2)
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.rule = rule
        self.passes = 0
        self.reach: float | None = None
        self._warned_fallback = False
        self._last_scale = 1.0
        levels = approximate if isinstance(approximate, tuple) else (approximate,) if approximate else ()
        self.levels = tuple(float(u) for u in levels)  # the reduced precisions left to use, cheapest first
        self.approx = False  # reduced-precision Hessians in use now (decided by setup, revoked by the checks)
        self.approx_passes = 0
        self.plan_steps = plan_steps

    @property
    def approximate(self) -> float:
        """The unit rounding of the reduced precision in use (0: none left)."""
        return self.levels[0] if self.levels else 0.0

    # -- named steps ------------------------------------------------------------------------------

    def setup(self, w0: np.ndarray | None = None) -> tuple[np.ndarray, PassTotals]:
        """The first pass (at ``w0``, default 0); the aliased parameters and the scale of each from it."""
        w = np.zeros(self.k + 1) if w0 is None else np.array(w0, dtype=np.float64)
        # R's order: the intercept first, then the columns as given; a later column is the aliased one
        order = ([self.k] if self.fit_intercept else []) + list(range(self.k))
        self._set_free(np.array(sorted(order), dtype=np.intp))  # until the first pass shows aliasing
        totals = self._pass(w)
        H = totals.hessian
        # (a penalised objective has its unique optimum with every column: scikit-learn's, kept)
        self.aliased = [] if self.l2 else sorted(find_aliased(H, order))
        if self.aliased:
            self._set_free(np.array(sorted(set(order) - set(self.aliased)), dtype=np.intp))
        w[self.aliased] = 0.0
        # Each parameter's unit in the linear predictor: the root mean square of its column, weighted
        # as X^T A X weights the rows (the intercept's column is 1), so step sizes compare across columns.
        with np.errstate(all="ignore"):
            base = H[self.k, self.k]
            scale = np.sqrt(np.clip(np.diag(H), 0.0, None) / base) if base > 0 else np.ones(self.k + 1)
        self.scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
        estimate = self._scaled_condition(H) if self.levels else float("inf")  # one factorisation for all
        admitted = [u for u in self.levels if self.allow_approximate(H, u, estimate)]
        self.levels = tuple(admitted)
        self.approx = bool(admitted)
        return w, totals

    def _set_free(self, active: np.ndarray) -> None:
        """The free parameters (features, then the intercept), told to the source as the step rule."""
        self.active = active
        self.n_free_features = int(np.count_nonzero(active < self.k))
        self._plan(ahead=True)

    def _plan(self, ahead: bool, exact_next: bool = False) -> None:
        """Tell the source the step rule, and whether to start the pass at each full step before it is
        asked for (``ahead``: not when no iteration will ask; _narrow.py), in float64 (``exact_next``:
        the last iteration's, see :meth:`solve`)."""
        if self.plan_steps is not None:
            self.plan_steps(self.active, self.n_free_features, self.l2, ahead, exact_next)

    def step_rule(self) -> tuple:
        """The rule a source's own Newton step must follow for the solver to use it (PassTotals.step_rule)."""
        return (tuple(int(j) for j in self.active), self.n_free_features, self.l2)

    def allow_approximate(self, H: np.ndarray, unit: float | None = None, estimate: float | None = None) -> bool:
        """Whether Hessians rounded to ``unit`` (default: the cheapest offered) may drive the steps: the
        free parameters' X^T A X of the first pass,
        scaled to a unit diagonal (float32 rounds each column relative to its own size), has an
        estimated condition below :data:`APPROX_MAX_COND` (the squared ratio of the largest to the
        smallest pivot of its Cholesky factor: cheap, and a lower bound of the true condition;
        ``estimate``: :meth:`_scaled_condition` of ``H`` already made)."""
        unit = self.approximate if unit is None else unit
        if not unit:
            return False
        cond = self._scaled_condition(H) if estimate is None else estimate
        limit = APPROX_MAX_COND * 2.0**-24 / unit
        return bool(cond < limit)

    def _scaled_condition(self, H: np.ndarray) -> float:
        """The condition estimate of :meth:`allow_approximate` (inf: not positive definite)."""
        a = self.active
        Hf = H[np.ix_(a, a)]
        d = np.diag(Hf)
        if len(a) == 0 or not (np.isfinite(Hf).all() and (d > 0).all()):
            return float("inf")
        root = 1.0 / np.sqrt(d)
        try:
            piv = np.diag(np.linalg.cholesky(Hf * root[:, None] * root[None, :]))
        except np.linalg.LinAlgError:
            return float("inf")
        return float((piv.max() / piv.min()) ** 2) if piv.min() > 0 else float("inf")

    def objective(self, w: np.ndarray, t: PassTotals) -> float:
        if not self.l2:
            return t.log_likelihood
        return t.log_likelihood - 0.5 * self.l2 * float(w[: self.k] @ w[: self.k])

    def penalized(self, w: np.ndarray, t: PassTotals) -> tuple[np.ndarray, np.ndarray]:
        """Gradient and negative Hessian of the objective over the free parameters."""
        a = self.active
        if len(a) == self.k + 1 and not self.l2:  # every parameter free, nothing added: read-only use
            return t.gradient, t.hessian
        g, H = t.gradient[a].copy(), t.hessian[np.ix_(a, a)].copy()
        if self.l2:
            nf = self.n_free_features  # the features come first in `active`
            g[:nf] -= self.l2 * w[a[:nf]]
            H[np.arange(nf), np.arange(nf)] += self.l2
        return g, H

    def newton_direction(self, w: np.ndarray, t: PassTotals) -> tuple[np.ndarray, float]:
        """The Newton step (full length, k + 1 values) and the decrement g^T H^-1 g, by Cholesky in float64."""
        g, H = self.penalized(w, t)
        if not (np.isfinite(H).all() and np.isfinite(g).all()):
            # LAPACK may never return on non-finite input (MADlib's MADLIB-138); the passes check
            # their sums, so this is a last guard
            raise DataError("IRLS met a non-finite X^T A X or gradient: the data overflow float64 arithmetic")
        try:
            if t.newton_step is not None and t.step_rule == self.step_rule():
                # the source computed this very step from the pass's sums (the narrow GPU kernel, which
                # then already runs the pass at w + step: _narrow.py); a failed one is None
                step_a = t.newton_step[self.active]
            else:
                step_a = newton_solve(H, g)
        except np.linalg.LinAlgError:
            if not t.exact_hessian:  # float32 rounding may take away definiteness: float64 from here on
                self.approx = False
                return self.newton_direction(w, self._pass(w))
            if not self._warned_fallback:
                warnings.warn(
                    "X^T A X is not positive definite (fitted probabilities at 0/1, or columns nearly "
                    "collinear): IRLS fell back to a least-squares step; the statistics may be unreliable. "
                    "Drop redundant columns or use penalty='l2'.",
                    NumericalWarning,
                    stacklevel=4,
                )
                self._warned_fallback = True
            step_a = np.linalg.lstsq(H, g, rcond=None)[0]
        if not np.isfinite(step_a).all():
            raise DataError("the Newton step overflowed float64: X^T A X is numerically singular; scale the features")
        dec = float(g @ step_a)
        if len(step_a) == self.k + 1:  # every parameter is free
            return step_a, dec
        step = np.zeros(self.k + 1)
        step[self.active] = step_a
        return step, dec

    def line_search(
        self, w: np.ndarray, step: np.ndarray, t: PassTotals, exact: bool = False
    ) -> tuple[np.ndarray, PassTotals, bool]:
        """Take the step, halving it while the objective gets worse. Returns (w, totals, improved).
        ``exact``: the passes with float64 Hessians even where reduced ones are in use."""
        f0 = self.objective(w, t)
        slack = self._slack(f0, t)
        scale = 1.0
        for _ in range(_MAX_HALVINGS + 1):
            w_new = w + scale * step
            t_new = self._pass(w_new, exact=exact or not self.approx)
            f_new = self.objective(w_new, t_new)
            if np.isfinite(f_new) and f_new >= f0 - slack:
                self._last_scale = scale
                return w_new, t_new, True
            scale *= 0.5
        return w, t, False

    def certifies_separation(self, t: PassTotals) -> bool:
        """Complete separation, proven: the weights of this pass classify every weighted row correctly
        with a positive margin, so scaling them up drives the log-likelihood to 0 and no maximum exists."""
        return self.l2 == 0.0 and t.weight_sum > 0 and t.min_margin > 0.0

    def check_convergence(self, f_old: float, f_new: float, dec: float, t: PassTotals) -> bool:
        if self.tol == 0.0:  # MADlib: "a zero disables the convergence criterion"
            return False
        change = abs(f_new - f_old)
        # float32 input: the log-likelihood is exact only to the pass's rounding; a tol below that is
        # honoured as far as it can be, and the fit says so
        floor = self._slack(f_new, t) if self.ll_rounding()[0] else 0.0
        if self.rule == "madlib":
            ok, waived = change < self.tol or change <= floor, change >= self.tol
        else:
            bound, dbound = self.tol * max(abs(f_new), 1e-300), self.tol * max(1.0, abs(f_new))
            ok = (change <= bound or change <= floor) and (dec <= dbound or dec <= floor)
            waived = dec > dbound  # the change of a float32 log-likelihood may jitter; its decrement is what counts
        if ok and waived:
            self.reach = floor / max(abs(f_new), 1e-300)
        return ok

    def finish(self, w: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Apply the Newton step computed at the last pass (MADlib's last iteration does)."""
        out = w + step
        out[self.aliased] = 0.0
        return out

    def diagnose_separation(
        self, w: np.ndarray, t: PassTotals, step: np.ndarray
    ) -> tuple[str | None, PassTotals | None]:
        """Whether the classes are separated, judged by Newton steps beyond the fit (which they leave alone).

        Near an existing maximum Newton's steps shrink quadratically; under separation they approach a
        constant step along the separating direction, for ever. So: step on until the step is
        negligible (the maximum exists) or :data:`STEADY_STEPS` steps in a row keep their size; then
        the direction of the steps (its negligible components dropped) is checked as a certificate:
        a pass at it has every signed margin >= 0. Returns the kind (None where the maximum exists)
        and the pass at ``w + step`` where one was made.
        """
        if self.l2:
            return None, None
        if self.certifies_separation(t):
            return "complete", None
        at_next, prev, steady, checked = None, None, 0, False
        settled = SETTLED_ROUNDED if self.ll_rounding()[0] else SETTLED
        for i in range(DIAG_STEPS):
            size = self._size(step)
            if size <= settled * max(1.0, self._size(w)):
                return None, at_next
            if prev is not None:
                ratio = size / max(self._size(prev), 1e-300)
                steady = steady + 1 if 0.5 <= ratio <= 2.0 and self._last_scale == 1.0 else 0
                # the certificate when the steps first look steady, and again once rows are saturated: the
                # direction's parts off the separating one shrink like e^-margin, every step adding ~1 to it
                if steady >= STEADY_STEPS and (not checked or t.saturated_rows > 0):
                    checked = True
                    kind = self._certify(step, t)
                    if kind is not None:
                        return kind, at_next
            w_new, t_new, improved = self.line_search(w, step, t)
            if not improved:
                return None, at_next
            if i == 0 and self._last_scale == 1.0:
                at_next = t_new
            if self.certifies_separation(t_new):
                return "complete", at_next
            prev, w, t = step, w_new, t_new
            step, _ = self.newton_direction(w, t)
        return None, at_next

    def _certify(self, step: np.ndarray, t: PassTotals) -> str | None:
        """The separation certificate at the direction of steady steps (its negligible components
        dropped): a pass there with every signed margin >= 0 (> 0: complete). Where the margins are not
        exactly >= 0 (the direction is a limit the steps approach), rows fitted with probability 0/1
        at ``t`` are the evidence."""
        d = step.copy()
        units = np.abs(d) * self.scale
        d[units < 1e-3 * units.max()] = 0.0
        cert = self._pass(d)
        if cert.min_margin > 0.0:
            return "complete"
        if cert.min_margin >= 0.0 or t.saturated_rows > 0:
            return "quasi-complete"
        return None

    # -- the loop ---------------------------------------------------------------------------------

    def solve(self, w0: np.ndarray | None = None) -> IRLSResult:
        w, t = self.setup(w0)
        step, dec = self.newton_direction(w, t)
        converged, separation, n_iter = False, None, 0
        # MADlib counts the final step (applied without a pass) as an iteration
        limit = self.max_iter - 1 if self.rule == "madlib" else self.max_iter
        while n_iter < limit:
            if self.certifies_separation(t):
                separation = "complete"
                break
            n_iter += 1
            if n_iter == limit:
                self._plan(ahead=False)  # the last iteration's pass is followed by no full step
            elif n_iter == limit - 1 and self.approx:
                # the last iteration's pass in float64 at once: the final step and the statistics need
                # its Hessian in float64, which a reduced one would make a pass again for (below)
                self._plan(ahead=True, exact_next=True)
            f_old = self.objective(w, t)
            w_new, t_new, improved = self.line_search(w, step, t, exact=n_iter == limit)
            if not improved:  # no increase possible: at the optimum up to rounding, or stuck
                converged = dec <= 1e-6 * max(1.0, abs(f_old))
                step = np.zeros_like(step)
                break
            w, t = w_new, t_new
            dec_old = dec
            step, dec = self.newton_direction(w, t)
            self._watch_approximate(dec_old, dec, self.objective(w, t), t)
            if self.check_convergence(f_old, self.objective(w, t), dec, t):
                converged = True
                break
        if separation is None and self.certifies_separation(t):
            separation = "complete"
        if not t.exact_hessian and separation is None:
            # the final step, the diagnosis and the statistics from float64 Hessians: the last pass
            # again with one (a float32 one's step would leave its rounding in the coefficients)
            self.approx = False
            t = self._pass(w)
            if step.any():
                step, dec = self.newton_direction(w, t)
        stats_totals = t
        if separation is None:
            self._plan(ahead=False)  # the diagnosis takes the step queued already, and seldom another
            separation, at_next = self.diagnose_separation(w, t, step)
            if at_next is not None and self.rule == "pystrom" and converged:
                stats_totals = at_next  # the statistics at the very coefficients returned
        w_out = w
        if separation is None and (converged or self.rule == "madlib") and step.any():
            w_out = self.finish(w, step)
            n_iter += 1
        stats_totals = self.exact_totals(stats_totals)
        if separation is not None:
            converged = False
            self._warn_separation(separation, stats_totals, n_iter)
        elif not converged:
            warnings.warn(
                f"IRLS did not converge in {n_iter} iteration(s) (max_iter={self.max_iter}, tol={self.tol:g}); "
                "raise max_iter, or scale the features",
                ConvergenceWarning,
                stacklevel=3,
            )
        return IRLSResult(
            w_out,
            stats_totals,
            n_iter,
            converged,
            separation,
            self.passes,
            self.active,
            list(self.aliased),
            self.reach,
            self.approx_passes,
        )

    # -- helpers ----------------------------------------------------------------------------------

    def exact_totals(self, t: PassTotals) -> PassTotals:
        """``t``, or where its Hessian was formed in float32, the pass at the same coefficients with a
        float64 one (the statistics, the aliasing and the condition number use only such)."""
        if t.exact_hessian:
            return t
        return self._pass(t.at)

    def _watch_approximate(self, dec_old: float, dec: float, f: float, t: PassTotals) -> None:
        """Move to the next precision (the last: float64) where a full step near the optimum did not
        shrink the decrement the way a Newton step does (quadratically): the Hessian's rounding then
        costs iterations. Not where the decrement is rounding already: no Hessian makes it smaller
        (with tol=0, H100, 1M x 256: 13 of 21 passes had turned to float64 for nothing)."""
        if not (self.approx and self._last_scale == 1.0 and 0.0 < dec_old <= APPROX_NEAR * max(1.0, abs(f))):
            return
        if dec > APPROX_MIN_GAIN * dec_old and dec > self._slack(f, t):
            self.levels = self.levels[1:]
            self.approx = bool(self.levels)

    def _pass(self, w: np.ndarray, exact: bool = True) -> PassTotals:
        self.passes += 1
        if exact or not self.approx:
            t = self.evaluate(w)
        else:
            t = self.evaluate(w, exact=False, rounding=self.approximate)
            self.approx_passes += not t.exact_hessian
        t.at = w.copy()
        return t

    def _size(self, v: np.ndarray) -> float:
        """The largest change a parameter vector makes to the linear predictor, column by column."""
        return float(np.max(np.abs(v[self.active]) * self.scale[self.active])) if len(self.active) else 0.0

    def _slack(self, f: float, t: PassTotals) -> float:
        """Differences of the objective below this are rounding: in a sum over many rows, and for
        float32 input the float32 logs of the pass (either evaluation may err by that much;
        _pass.F32_LL_RTOL says why)."""
        rtol, atol = self.ll_rounding()
        return 1e-13 * max(1.0, abs(f)) + 2.0 * (rtol * abs(t.log_likelihood) + atol * t.weight_sum)

    def _warn_separation(self, kind: str, t: PassTotals, n_iter: int) -> None:
        what = (
            "complete separation: the coefficients of a pass classify every row correctly"
            if kind == "complete"
            else "quasi-complete separation: Newton's steps do not shrink along a direction in which no row's "
            f"fit gets worse ({t.saturated_rows:,} row(s) fitted with probability 0 or 1)"
        )
        warnings.warn(
            f"perfect separation ({what}) after {n_iter} iteration(s). The maximum likelihood estimate does not "
            "exist, so the coefficients are not meaningful (they would grow without bound). Use penalty='l2' "
            "(C=...) for a finite fit, or remove the feature(s) that separate the classes.",
            PerfectSeparationWarning,
            stacklevel=4,
        )
