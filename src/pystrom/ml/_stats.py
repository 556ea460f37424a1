"""MADlib's ``logregr_train`` statistics from the final IRLS pass, and the readable summary.

Everything comes from X^T A X (A = diag of weighted mu (1 - mu)) at the final coefficients, the
matrix the last pass accumulated; the inverse taken here happens once, after the loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Statistics", "compute_statistics", "Summary"]

# Free parameters from which a fit on a GPU inverts its Hessian and takes its eigenvalues there
# (H100 and its 16-core host: 257 parameters 3.8 ms with CuPy against NumPy's 8.1 (its eigvalsh alone
# 3.3); 1025: 18 ms against 118)
GPU_STATISTICS_FROM = 64


@dataclass
class Statistics:
    coef: np.ndarray  # intercept first when there is one (MADlib's order)
    log_likelihood: float
    std_err: np.ndarray
    z_stats: np.ndarray
    p_values: np.ndarray
    odds_ratios: np.ndarray
    condition_no: float
    variance_covariance: np.ndarray


def compute_statistics(
    coef: np.ndarray, hessian: np.ndarray, log_likelihood: float, free: np.ndarray | None = None, xp: Any = None
) -> Statistics:
    """``coef`` and the (penalised, when a penalty was used) negative Hessian in the same order.

    ``free``: a mask of the fitted parameters; the others are aliased (collinear or constant columns)
    and get NaN for the coefficient and every statistic, as R's glm reports NA. The condition number
    is MADlib's: sqrt(lambda_max / lambda_min) of X^T A X (over the fitted parameters). ``xp``: CuPy
    for a fit on a GPU (the current device), which then takes the inverse and the eigenvalues from
    :data:`GPU_STATISTICS_FROM` parameters.
    """
    p = len(coef)
    free = np.ones(p, dtype=bool) if free is None else np.asarray(free, dtype=bool)
    idx = np.flatnonzero(free)
    Hf = hessian[np.ix_(idx, idx)]
    cov = np.full((p, p), np.nan)
    cond = float("inf")
    with np.errstate(all="ignore"):
        if len(idx) and np.isfinite(Hf).all():  # LAPACK may never return on non-finite input
            try:
                cov_f, eig = _inverse_and_eigenvalues(Hf, xp)
            except np.linalg.LinAlgError:  # singular (separation): the pseudo-inverse, as MADlib
                cov_f, eig = np.linalg.pinv(Hf), np.linalg.eigvalsh(Hf)
            cov[np.ix_(idx, idx)] = cov_f
            cond = float(np.sqrt(eig[-1] / eig[0])) if eig[0] > 0 and eig[-1] > 0 else float("inf")
        coef = np.where(free, coef, np.nan)
        std_err = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        z = coef / std_err
        p_values = np.array([math.erfc(abs(v) / math.sqrt(2.0)) if np.isfinite(v) else np.nan for v in z])
        odds = np.exp(coef)
    return Statistics(coef, float(log_likelihood), std_err, z, p_values, odds, cond, cov)


def _inverse_and_eigenvalues(Hf: np.ndarray, xp: Any) -> tuple[np.ndarray, np.ndarray]:
    """Hf^-1 (made exactly symmetric) and Hf's eigenvalues, ascending, on the host;
    np.linalg.LinAlgError where Hf is not positive definite (Cholesky's verdict). The inverse in one
    LAPACK call (LU): half the time of inverting the Cholesky factor by a general solve."""
    if xp is not None and xp.__name__ == "cupy" and len(Hf) >= GPU_STATISTICS_FROM:
        import cupyx

        d = xp.asarray(Hf)
        with cupyx.errstate(linalg="raise"):  # CuPy checks cuSOLVER's verdicts only when asked to
            xp.linalg.cholesky(d)
            inv = xp.linalg.inv(d)
        eig = xp.linalg.eigvalsh(d)
        return xp.asnumpy(0.5 * (inv + inv.T)), xp.asnumpy(eig)
    np.linalg.cholesky(Hf)
    inv = np.linalg.inv(Hf)
    return 0.5 * (inv + inv.T), np.linalg.eigvalsh(Hf)


@dataclass
class Summary:
    """A fitted model's statistics as a table: ``print(model.summary())``."""

    names: list[str]
    stats: Statistics
    header: list[tuple[str, str]] = field(default_factory=list)

    def rows(self) -> list[dict]:
        s = self.stats
        return [
            {
                "name": n,
                "coef": float(s.coef[i]),
                "std_err": float(s.std_err[i]),
                "z_stats": float(s.z_stats[i]),
                "p_values": float(s.p_values[i]),
                "odds_ratios": float(s.odds_ratios[i]),
            }
            for i, n in enumerate(self.names)
        ]

    def __str__(self) -> str:
        width = max([len(n) for n in self.names] + [9])
        lines = [f"{k:<28} {v}" for k, v in self.header]
        head = f"{'':<{width}} {'coef':>12} {'std_err':>12} {'z_stats':>10} {'p_values':>10} {'odds_ratios':>12}"
        lines += ["", head, "-" * len(head)]
        for r in self.rows():
            lines.append(
                f"{r['name']:<{width}} {r['coef']:12.6g} {r['std_err']:12.6g} {r['z_stats']:10.4g} "
                f"{r['p_values']:10.4g} {r['odds_ratios']:12.6g}"
            )
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        head = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in self.header)
        cols = ["coef", "std_err", "z_stats", "p_values", "odds_ratios"]
        body = "".join(
            "<tr><th>" + html.escape(r["name"]) + "</th>" + "".join(f"<td>{r[c]:.6g}</td>" for c in cols) + "</tr>"
            for r in self.rows()
        )
        th = "".join(f"<th>{c}</th>" for c in cols)
        return f"<table>{head}</table><table><tr><th></th>{th}</tr>{body}</table>"
