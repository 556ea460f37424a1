"""The small dense linear algebra of the Newton step, in float64 on the host: which parameters are aliased
(collinear with the ones before them, or constant), and Cholesky solves fast at every size."""

from __future__ import annotations

import numpy as np

__all__ = ["ALIAS_TOL", "find_aliased", "newton_solve", "cholesky_solve"]

# A column is aliased when the part of it not explained by the columns before it has a squared norm
# below this fraction of its own (R's glm: QR with tolerance 1e-7 on the column norms; squared here,
# since X^T A X is a Gram matrix).
ALIAS_TOL = 1e-14


def find_aliased(H: np.ndarray, order: list[int], tol: float = ALIAS_TOL) -> list[int]:
    """Parameters whose column of the (Gram) matrix ``H`` depends linearly on those before it in ``order``.

    A Cholesky factorisation in that order that skips such a column (its pivot, the squared norm of
    what the kept columns before it leave unexplained, is at most ``tol`` times its diagonal entry).
    """
    A = H[np.ix_(order, order)]
    p = len(order)
    # Where no column is aliased the loop below is a plain Cholesky factorisation, whose pivots L_jj^2
    # are its v[0]s: LAPACK's says so at once (a 1025-parameter fit: ~15 ms instead of ~200 ms of the
    # loop's copies); the loop decides the rest (up to rounding the same pivots, as LAPACK sums in
    # another order)
    d = np.diag(A)
    if p and np.isfinite(A).all() and (d > 0).all():
        try:
            pivots = np.diag(np.linalg.cholesky(A)) ** 2
        except np.linalg.LinAlgError:
            pivots = None
        if pivots is not None and (pivots > 4 * tol * d).all():
            return []
    L = np.zeros((p, p))
    keep = np.zeros(p, dtype=bool)
    for j in range(p):
        kept = np.flatnonzero(keep[:j])
        v = A[j:, j] - L[j:, kept] @ L[j, kept]
        if A[j, j] > 0 and v[0] > tol * A[j, j]:
            L[j:, j] = v / np.sqrt(v[0])
            keep[j] = True
    return [order[j] for j in range(p) if not keep[j]]


def newton_solve(H: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Solve H x = g by Cholesky; np.linalg.LinAlgError where H is not positive definite.

    Up to 8 parameters in plain Python (factor and substitution on lists: a fifth of the time of
    NumPy's calls, whose overhead dwarfs the arithmetic; an in-memory fit of 40M rows spends ~0.4 ms a
    Newton step in the GPU pass, so the host's share shows); beyond that NumPy's Cholesky.
    """
    p = len(g)
    if p > 8:
        return cholesky_solve(np.linalg.cholesky(H), g)
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


def cholesky_solve(L: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Solve (L L^T) x = g by forward and back substitution (more than 8 parameters; newton_solve
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
