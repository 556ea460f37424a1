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
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MAX_KERNEL_FEATURES", "PassTotals", "layout_size", "xp_pass", "kernel_pass", "batch_pass"]

MAX_KERNEL_FEATURES = 8  # the fused kernel keeps P(P+1)/2 + P + 6 float64 sums per thread in registers
SATURATED_MARGIN = 20.0  # fitted probability within 2e-9 of the observed class
_THREADS = 128  # LOGIT_THREADS in logistic.cu
# Rows x features upcast to float64 at a time by the NumPy/CuPy path: on the CPU small enough that the
# temporaries stay in cache (1M x 4 float32, one pass on 2 shared cores: 0.23 s with 2^24, 0.07 s with
# 2^18), on a GPU large enough that each chunk's matrix products fill it.
_CHUNK_ELEMENTS = {"numpy": 1 << 18, "cupy": 1 << 24}


def layout_size(k: int) -> int:
    p = k + 1
    return p * (p + 1) // 2 + p + 6


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

    @classmethod
    def unpack(cls, vec: np.ndarray, k: int) -> PassTotals:
        p = k + 1
        nt = p * (p + 1) // 2
        iu = np.triu_indices(p)
        h = np.zeros((p, p))
        h[iu] = vec[:nt]
        h = h + np.triu(h, 1).T
        s = vec[nt + p :]
        return cls(h, vec[nt : nt + p].copy(), float(s[0]), float(s[1]), float(s[2]), int(s[3]), int(s[4]), float(s[5]))


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Totals of two batches: sums add, the margin takes the minimum."""
    out = a + b
    out[-1] = min(a[-1], b[-1])
    return out


def xp_pass(xp: Any, X: Any, y: Any, sw: Any | None, cw: tuple[float, float], w: np.ndarray) -> Any:
    """The CPU twin of the kernel (and the CuPy path for many features): returns the flat vector.

    Rows are processed in chunks upcast to float64, so float32 input is never upcast whole.
    """
    n, k = X.shape
    p = k + 1
    nt = p * (p + 1) // 2
    H = xp.zeros((p, p), dtype=np.float64)
    g = xp.zeros(p, dtype=np.float64)
    scal = xp.zeros(5, dtype=np.float64)
    min_margin = np.inf
    wk = xp.asarray(w[:k], dtype=np.float64)
    b = float(w[k])
    chunk = max(1, _CHUNK_ELEMENTS.get(xp.__name__, 1 << 24) // max(k, 1))
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        Xc = X[start:stop].astype(np.float64)
        yc = y[start:stop].astype(np.float64)
        s = xp.where(yc > 0, cw[1], cw[0])
        if sw is not None:
            s = s * sw[start:stop]
        with np.errstate(invalid="ignore", over="ignore"):
            eta = Xc @ wk + b
        finite = xp.isfinite(eta)
        bad = int((~finite).sum())
        if bad:
            scal[3] += bad
            Xc, yc, s, eta = Xc[finite], yc[finite], s[finite], eta[finite]
        live = s != 0
        if not bool(live.all()):
            Xc, yc, s, eta = Xc[live], yc[live], s[live], eta[live]
        if eta.shape[0] == 0:
            continue
        e = xp.exp(-xp.abs(eta))
        inv = 1.0 / (1.0 + e)
        mu = xp.where(eta >= 0, inv, e * inv)
        r = s * e * inv * inv
        resid = s * (yc - mu)
        Xr = Xc * r[:, None]
        H[:k, :k] += Xc.T @ Xr
        H[:k, k] += Xc.T @ r  # a matrix-vector product: CuPy's axis-0 sum of Xr took 1.5 ms per chunk, this 0.07
        H[k, k] += r.sum()
        g[:k] += Xc.T @ resid
        g[k] += resid.sum()
        margin = xp.where(yc > 0, eta, -eta)
        scal[0] += (s * (yc * eta - (xp.maximum(eta, 0.0) + xp.log1p(e)))).sum()
        scal[1] += s.sum()
        scal[2] += (s * yc).sum()
        scal[4] += (margin > SATURATED_MARGIN).sum()
        min_margin = min(min_margin, float(margin.min()))
    iu = np.triu_indices(p)
    out = xp.empty(nt + p + 6, dtype=np.float64)
    out[:nt] = H[xp.asarray(iu[0]), xp.asarray(iu[1])]
    out[nt : nt + p] = g
    out[nt + p : nt + p + 5] = scal
    out[-1] = min_margin
    return out


def kernel_pass(X: Any, y: Any, sw: Any | None, cw: tuple[float, float], w: np.ndarray, ordinal: int) -> Any:
    """The fused CUDA pass (k <= MAX_KERNEL_FEATURES): a device vector, not synchronised."""
    import cupy

    from ..kernels import kernel, sm_count

    n, k = X.shape
    m = layout_size(k)
    item = X.dtype.itemsize
    rs, cs = X.strides[0] // item, X.strides[1] // item
    tname = "f32" if X.dtype == np.float32 else "f64"
    fn = kernel("logistic", f"logit_pass_{tname}_k{k}", ordinal)
    blocks = max(1, min((n + _THREADS - 1) // _THREADS, sm_count(ordinal) * _resident_blocks(fn, k)))
    partials = cupy.empty((blocks, m), dtype=np.float64)
    out = cupy.empty(m, dtype=np.float64)
    wd = cupy.asarray(np.ascontiguousarray(w, dtype=np.float64))
    has_sw = sw is not None
    swd = sw if has_sw else wd  # any valid pointer; not read when has_sw is 0
    fn(
        (blocks,),
        (_THREADS,),
        (X, np.int64(n), np.int64(rs), np.int64(cs), y, swd, np.int32(has_sw), np.float64(cw[0]),
         np.float64(cw[1]), wd, partials),
    )  # fmt: skip
    kernel("logistic", "logit_finish", ordinal)((m,), (256,), (partials, np.int32(blocks), np.int32(m), out))
    return out


@functools.cache
def _resident(fn_ptr: int, fallback: int) -> int:
    try:
        from cupy.cuda import driver

        return max(1, int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fn_ptr, _THREADS, 0)))
    except Exception:  # an older CuPy without the occupancy call: the kernel's launch bound
        return fallback


def _resident_blocks(fn: Any, k: int) -> int:
    """Blocks of the pass kernel that fit on one SM at once: the grid is one full wave (each block
    loops over rows), so no block waits for another to finish."""
    ptr = fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr  # CuPy's RawKernel wraps a Function
    return _resident(int(ptr), 4 if k <= 4 else 3 if k <= 6 else 2)


def batch_pass(backend: Any, X: Any, y: Any, sw: Any | None, cw: tuple[float, float], w: np.ndarray) -> Any:
    """The pass over one batch on its backend: the fused kernel on a GPU when it applies, else the xp twin."""
    k = X.shape[1]
    if X.shape[0] == 0:
        out = backend.xp.zeros(layout_size(k), dtype=np.float64)
        out[-1] = np.inf
        return out
    if backend.kind == "cuda" and 1 <= k <= MAX_KERNEL_FEATURES and X.dtype in (np.float32, np.float64):
        return kernel_pass(X, y, sw, cw, w, backend.ordinal)
    return xp_pass(backend.xp, X, y, sw, cw, w)
