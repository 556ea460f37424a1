"""One pass over a batch of rows: the sums IRLS needs, in float64, as one flat vector.

The vector's layout is shared by the CUDA kernel (``kernels/logistic.cu``) and its NumPy twin
(:func:`xp_pass`, also run through CuPy for more than :data:`MAX_KERNEL_FEATURES` features), for
P = k + 1 (the intercept is the constant 1 at position k, never a materialised column):

    [0, P(P+1)/2)        upper triangle of H = sum r x~ x~^T, row-major
    next P               g = sum s (y - mu) x~
    then                 log-likelihood, sum s, sum s y, rows with non-finite eta, saturated rows
    last                 min over weighted rows of the signed margin (2y - 1) eta
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._narrow import MAX_KERNEL_FEATURES, kernel_pass, layout_size, uses_kernel

__all__ = ["MAX_KERNEL_FEATURES", "PassTotals", "layout_size", "xp_pass", "batch_pass"]

SATURATED_MARGIN = 20.0  # fitted probability within 2e-9 of the observed class
# Float32 input is evaluated with float32 sigmoids and logs (kernels/logistic.cu says why): the
# log-likelihood of a pass is then exact only to about this, relative to its size, plus at most
# F32_LL_ATOL per unit of row weight (rounding eta to float32 and the kernel's __expf each move
# e^-|eta| by up to about 1.2 |eta| ulps, and |eta| e^-|eta| <= 1/e). The line search must not read
# differences below that as a real decrease.
F32_LL_RTOL = 6 * 2.0**-23
F32_LL_ATOL = 0.37 * 2.5 * 2.0**-23
# Rows x features upcast to float64 at a time by the NumPy/CuPy path: on the CPU small enough that the
# temporaries stay in cache (1M x 4 float32, one pass on 2 shared cores: 0.23 s with 2^24, 0.07 s with
# 2^18), on a GPU large enough that each chunk's matrix products fill it and few launches and host
# waits are paid per pass (1M x 256 float32, one pass on an H200: 68.6 ms with 2^22 elements, 18.1
# with 2^24, 8.5 with 2^26, 7.0 with 2^28). 2^27 float64 elements are 1 GiB per temporary (two live).
_CHUNK_ELEMENTS = {"numpy": 1 << 18, "cupy": 1 << 27}


@dataclass
class PassTotals:
    """The sums of one full pass, unpacked (host, float64). H and g include the intercept at index k."""

    hessian: np.ndarray  # (P, P) symmetric
    gradient: np.ndarray  # (P,)
    log_likelihood: float
    weight_sum: float
    positive_weight: float
    nonfinite_rows: int
    saturated_rows: int
    min_margin: float
    exact_hessian: bool = True  # False: the features' block of the Hessian was formed in float32
    at: np.ndarray | None = None  # the coefficients of the pass (set by the solver)
    # the Newton step from this pass's sums as the source computed it (the narrow kernel's last block),
    # under the solver's rule step_rule = (free parameters, features among them, l2); None: not computed
    newton_step: np.ndarray | None = None
    step_rule: tuple | None = None

    @classmethod
    def unpack(cls, vec: np.ndarray, k: int) -> PassTotals:
        p = k + 1
        nt = p * (p + 1) // 2
        rows, cols = _triangle(p)
        h = np.empty((p, p))
        h[rows, cols] = vec[:nt]
        h[cols, rows] = vec[:nt]
        s = vec[nt + p :].tolist()
        return cls(h, vec[nt : nt + p].copy(), s[0], s[1], s[2], int(s[3]), int(s[4]), s[5])


@functools.cache
def _triangle(p: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(p)


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Totals of two batches: sums add, the margin takes the minimum."""
    out = a + b
    out[-1] = min(a[-1], b[-1])
    return out


def xp_pass(
    xp: Any,
    X: Any,
    y: Any,
    sw: Any | None,
    cw: tuple[float, float],
    w: np.ndarray,
    hessian: str = "float64",
    chunk_rows: int = 0,
) -> Any:
    """The CPU twin of the kernel (and the CuPy path for many features): returns the flat vector.

    Rows are processed in chunks upcast to float64, so float32 input is never upcast whole.
    ``hessian="float32"``: the features' block of X^T A X is formed in float32 (:func:`_gram32`); the
    gradient, the intercept's row and column of the Hessian, the log-likelihood and every total stay
    float64, so the pass's gradient (and with it the fixed point of Newton's iteration) is the float64
    one. ``hessian="tf32"``: the same, as a general product (:func:`_cupy_syrk`; float32 on the CPU).
    ``chunk_rows``: rows a chunk (0: by the device, :data:`_CHUNK_ELEMENTS`).
    """
    if hessian not in ("float64", "float32", "tf32"):
        raise ValueError(f"hessian must be 'float64', 'float32' or 'tf32'; got {hessian!r}")
    n, k = X.shape
    p = k + 1
    nt = p * (p + 1) // 2
    H = xp.zeros((p, p), dtype=np.float64)
    g = xp.zeros(p, dtype=np.float64)
    scal = xp.zeros(5, dtype=np.float64)
    min_margin = xp.full((), np.inf)
    wk = xp.asarray(w[:k], dtype=np.float64)
    b = float(w[k])
    single = hessian != "float64"
    chunk = int(chunk_rows) if chunk_rows else _chunk_rows(xp, k, single)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        Xr = X[start:stop]
        Xc = Xr.astype(np.float64)
        yc = y[start:stop].astype(np.float64)
        s = xp.where(yc > 0, cw[1], cw[0])
        if sw is not None:
            s = s * sw[start:stop]
        with np.errstate(invalid="ignore", over="ignore"):
            eta = Xc @ wk + b
        # Rows are masked, never dropped: no value goes to the host inside the loop (on a GPU each
        # would wait for the chunk's kernels). A row with a non-finite eta is counted and gets weight
        # 0. On the CPU its features are zeroed too, so the sums are exactly the other rows' (as the
        # kernel's, which the tests compare); on a GPU that test would wait for the chunk, and the sums
        # may hold NaN from such a row's features: any such row makes the pass an error (_sources.py).
        finite = xp.isfinite(eta)
        scal[3] += (~finite).sum()
        eta = xp.where(finite, eta, 0.0)
        s = xp.where(finite, s, 0.0)
        if xp is np and not finite.all():
            Xc = np.where(finite[:, None], Xc, 0.0)
            Xr = np.where(finite[:, None], Xr, 0).astype(Xr.dtype, copy=False)
        live = s != 0
        e, inv, l1p = _row_math(xp, eta, X.dtype == np.float32)
        r = s * e * inv * inv
        # y - mu as +-(the probability of the class not observed), the smaller one from e * inv: 1 - inv
        # would round it away (float32 from a margin of ~17, float64 of ~37), and with it the gradient
        # of the rows the separation diagnosis follows (as the kernels do)
        observed = yc > 0
        miss = xp.where(observed != (eta >= 0), inv, e * inv)
        resid = xp.where(observed, s * miss, -(s * miss))
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked on the totals (_sources.py)
            H[:k, :k] += _gram32(xp, Xr, Xc, r, hessian == "tf32") if single else _weighted_gram(xp, Xc, r)
        # Both matrix-vector products in one read of the chunk (CuPy's axis-0 sum of X r was 20x slower)
        both = Xc.T @ xp.stack([r, resid], axis=1)
        H[:k, k] += both[:, 0]
        H[k, k] += r.sum()
        g[:k] += both[:, 1]
        g[k] += resid.sum()
        margin = xp.where(live, xp.where(yc > 0, eta, -eta), np.inf)  # rows of weight 0 have none
        scal[0] += (s * (yc * eta - (xp.maximum(eta, 0.0) + l1p))).sum()
        scal[1] += s.sum()
        scal[2] += (s * yc).sum()
        scal[4] += ((margin > SATURATED_MARGIN) & live).sum()
        if margin.shape[0]:
            min_margin = xp.minimum(min_margin, margin.min())
    iu = _triangle(p)
    out = xp.empty(nt + p + 6, dtype=np.float64)
    out[:nt] = H[xp.asarray(iu[0]), xp.asarray(iu[1])]
    out[nt : nt + p] = g
    out[nt + p : nt + p + 5] = scal
    out[-1] = min_margin
    return out


def _chunk_rows(xp: Any, k: int, single: bool = False) -> int:
    if single and xp.__name__ == "cupy":
        # cuBLAS sums a chunk's float32 products over its rows in float32: fewer rows, smaller error
        # (the chunks' results add in float64); 2^17 rows keep a 256-column syrk at ~8 GFLOP a launch
        return max(1, min(1 << 17, _CHUNK_ELEMENTS["cupy"] // max(k, 1)))
    # ...but at least 8192 rows on the CPU: with many features, small chunks pay NumPy's per-call
    # overhead many times (20k x 256 float32, 20 iterations on the CI machine: 11.0 s with 1024-row
    # chunks, 2.9 s with 8192)
    return max(1 if xp.__name__ == "cupy" else 8192, _CHUNK_ELEMENTS.get(xp.__name__, 1 << 24) // max(k, 1))


def _weighted_gram(xp: Any, Xc: Any, r: Any) -> Any:
    """X^T diag(r) X (r >= 0). On the CPU, from 16 features, as Z^T Z with Z = sqrt(r) X: NumPy hands a
    product of an array with its own transpose to BLAS's symmetric rank-k update (syrk, half the
    multiplications; benchmarks/bench_logistic.py "CPU pass": 1.2-1.8x on 8192 x 256 chunks, up to 10x
    on 8192 x 32, on the shared 2-core CI machine); with fewer the square roots cost more than they save
    (0.9x at 8). On a GPU the DGEMM stays: a syrk there is unmeasured, and cuBLAS runs DGEMM on the FP64
    tensor cores."""
    if xp is np and Xc.shape[1] >= 16:
        Z = Xc * np.sqrt(r)[:, None]
        return Z.T @ Z
    return Xc.T @ (Xc * r[:, None])


def _gram32(xp: Any, Xr: Any, Xc: Any, r: Any, general: bool = False) -> Any:
    """X^T diag(r) X in float32 (returned as float64): Z^T Z with Z = sqrt(r) X rounded to float32 once.

    Float32 input is scaled in float32 straight from the chunk as it is stored (the upcast copy
    ``Xc`` serves the float64 products); float64 input is scaled in float64 and rounded. Each entry of
    the result errs by about sqrt(rows) float32 ulps of sum |z_a z_b| (BLAS sums a chunk in float32),
    which moves a Newton step by at most that times the Hessian's condition: the solver
    (``_irls.py``) watches that, and the statistics never use such a Hessian. NumPy hands Z^T Z to
    BLAS's ssyrk; on a GPU cuBLAS's ssyrk fills the upper triangle, mirrored here.
    """
    root = xp.sqrt(r)
    if Xr.dtype == np.float32:
        Z = Xr * root.astype(np.float32)[:, None]
    else:
        Z = (Xc * root[:, None]).astype(np.float32)
    if xp is np:
        return (Z.T @ Z).astype(np.float64)
    return _cupy_syrk(xp, Z, general)


F32_ROUNDING = 2.0**-24
# TF32 rounds each input to 11 bits (2^-11), but an entry sums thousands of products in float32 whose
# independent roundings mostly cancel (an assumption the benchmark's iteration counts test)
TF32_ROUNDING = 2.0**-17


def reduced_hessians(backend: Any, mode: str) -> tuple[tuple[str, float], ...]:
    """The reduced precisions a wide pass may form the features' Hessian block in, cheapest first, each
    with the relative error of its entries as the solver's guard reads it, for
    ``defaults.logit_hessian = mode`` ("float64": none). On a GPU "auto" offers TF32 (the wide
    kernels' GEMM on the tensor cores, :mod:`._wide`) then float32, so a fit whose condition TF32's
    guard refuses still saves the float64 products; ``CUPY_TF32=1`` makes float32 TF32 (CuPy runs its
    own float32 products there then). The CPU has float32 only."""
    f32, tf32 = ("float32", F32_ROUNDING), ("tf32", TF32_ROUNDING)
    if mode == "float64":
        return ()
    if backend.kind != "cuda":
        return (f32,)
    if mode == "tf32" or os.environ.get("CUPY_TF32", "0") == "1":
        return (tf32,)
    return (f32,) if mode == "float32" else (tf32, f32)


def _cupy_syrk(cupy: Any, Z: Any, general: bool = False) -> Any:
    """Z^T Z (float32 Z, rows x k) by cuBLAS's ssyrk, as a full symmetric float64 matrix.

    ``general`` (a "tf32" pass): the general product instead, which CuPy runs in TF32 under
    ``CUPY_TF32=1`` (its opt-in to the tensor cores for float32 products), else in float32: twice the
    multiplications at several times the rate. TF32's 10-bit mantissa is coarser than float32's,
    which the solver's checks allow for (:func:`reduced_hessians`).
    """
    try:
        from cupy import cublas
    except ImportError:  # a CuPy without the wrapper: the general product (twice the multiplications)
        cublas = None
    if cublas is None or general:
        return (Z.T @ Z).astype(np.float64)
    Z = cupy.ascontiguousarray(Z)
    k = Z.shape[1]
    # a C-order result: CuPy then hands the C-order Z to cuBLAS as is (for an F-order one it copies Z)
    half = cublas.syrk("T", Z, out=cupy.zeros((k, k), dtype=np.float32), lower=False).astype(np.float64)
    # syrk writes one triangle and leaves the other as it was (zeros): mirrored whichever it wrote
    return half + half.T - cupy.diag(cupy.diag(half))


def _row_math(xp: Any, eta: Any, single: bool) -> tuple[Any, Any, Any]:
    """exp(-|eta|), 1 / (1 + that) and log(1 + that), in float32 for float32 input (as the kernel does)."""
    if not single:
        e = xp.exp(-xp.abs(eta))
        return e, 1.0 / (1.0 + e), xp.log1p(e)
    ef = xp.exp(-xp.abs(eta).astype(np.float32))
    one = np.float32(1.0)
    return ef.astype(np.float64), (one / (one + ef)).astype(np.float64), xp.log1p(ef).astype(np.float64)


def batch_pass(
    backend: Any,
    X: Any,
    y: Any,
    sw: Any | None,
    cw: tuple[float, float],
    w: np.ndarray,
    hessian: str = "float64",
    chunk_rows: int = 0,
) -> Any:
    """The pass over one batch on its backend: the fused kernel on a GPU when it applies (always a
    float64 Hessian), else the xp twin with ``hessian`` and ``chunk_rows`` (:func:`xp_pass`)."""
    k = X.shape[1]
    if X.shape[0] == 0:
        out = backend.xp.zeros(layout_size(k), dtype=np.float64)
        out[-1] = np.inf
        return out
    if uses_kernel(backend, X):
        return kernel_pass(X, y, sw, cw, w, backend.ordinal)
    if not chunk_rows:
        from ._wide import uses_wide, wide_pass

        if uses_wide(backend, X):
            return wide_pass(backend, X, y, sw, cw, w, hessian)
    return xp_pass(backend.xp, X, y, sw, cw, w, hessian, chunk_rows)
