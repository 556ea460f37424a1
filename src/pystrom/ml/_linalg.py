"""The small dense linear algebra of the Newton step, in float64 on the host: which parameters are aliased
(collinear with the ones before them, or constant), and Cholesky solves fast at every size."""

from __future__ import annotations

import numpy as np

__all__ = ["ALIAS_RANK", "ALIAS_RESIDUAL", "find_aliased", "newton_solve", "cholesky_solve"]

# Aliasing is decided from X^T A X, a Gram matrix, not from X (a pass returns sums only), and its rounding
# is what the tolerances must clear. Scaled to a unit diagonal S, its eigenvalues are exact to about
# p * eps * lambda_max whatever its condition (measured: at most 2.5e-15 of the largest, 300 rank-deficient
# matrices of 4 to 512 columns, some scaled by 1e+-3), while a Cholesky pivot that should be 0 comes out as
# up to p * eps * cond (measured: 1.7e-12 at 4 columns, 1e-9 at 256): the old rule, a pivot below 1e-14 of
# its diagonal (R's QR tolerance squared), sat inside that rounding, so rows repeated or given as weights,
# or summed in another order, could alias different columns (issue 39). So: S's numerical rank from its
# eigenvalues (those below ALIAS_RANK of the largest are rounding), then R's rule in R's order on a square
# root of S at that rank (the eigenvectors scaled: B^T B = S, rank r): a column is aliased when the part of
# it that the kept columns before it leave unexplained has a norm below ALIAS_RESIDUAL of its own (R's glm:
# QR with tolerance 1e-7). A kept direction has an eigenvalue of at least ALIAS_RANK, so a kept column's
# unexplained part is at least sqrt(1e-13) = 3.2e-7 of its norm, while a dependent one's is rounding
# (~1e-11): the two rules agree, with margins on both sides.
ALIAS_RANK = 1e-13
ALIAS_RESIDUAL = 1e-7
# Where every Cholesky pivot of S is above this, no column is aliased (Cholesky's rounding stayed below
# 1e-9 in the measurements above) and LAPACK's factorisation decides at once (a 1025-parameter fit: ~15 ms
# instead of an eigendecomposition's ~120 ms); columns nearer collinear than that go the exact way.
ALIAS_CLEAR = 1e-6


def find_aliased(H: np.ndarray, order: list[int]) -> list[int]:
    """Parameters whose column of the (Gram) matrix ``H`` depends linearly on those before it in ``order``,
    by the rules above; a column with a zero diagonal (all zero where rows weigh) is aliased outright."""
    A = H[np.ix_(order, order)]
    d = np.diag(A)
    alive = np.isfinite(d) & (d > 0)  # (the sources refuse non-finite sums before any solver sees them)
    live = np.flatnonzero(alive)
    aliased = [order[j] for j in np.flatnonzero(~alive)]
    if len(live) == 0:
        return aliased
    root = 1.0 / np.sqrt(d[live])
    S = A[np.ix_(live, live)] * root[:, None] * root[None, :]
    if not aliased:
        try:
            if (np.diag(np.linalg.cholesky(S)) ** 2 > ALIAS_CLEAR).all():
                return []
        except np.linalg.LinAlgError:
            pass
    lam, V = np.linalg.eigh(S)
    rank = lam > lam.max() * ALIAS_RANK
    B = np.sqrt(lam[rank])[:, None] * V[:, rank].T  # r x m, B^T B = S but for the directions dropped
    basis = np.zeros((B.shape[0], B.shape[0]))
    kept = 0
    for j in range(B.shape[1]):
        v = B[:, j].copy()
        for _ in range(2):  # twice: Gram-Schmidt orthogonal to rounding (once loses cond * eps)
            v -= basis[:, :kept] @ (basis[:, :kept].T @ v)
        rest = float(np.linalg.norm(v))
        if rest > ALIAS_RESIDUAL and kept < B.shape[0]:  # S's diagonal is 1: the norm is relative
            basis[:, kept] = v / rest
            kept += 1
        else:
            aliased.append(order[int(live[j])])
    return aliased


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
