"""The GPU pass of a wide fit (more than 8 features) with the features' Hessian block in float32.

CuPy's version of :func:`._pass.xp_pass` upcasts every chunk to float64 and spends a dozen elementwise
launches around a float32 syrk; here one kernel makes each row's values (eta in float64, its weight and
residual, the row scaled by sqrt(r) in float32), one kernel sums X^T [resid, r] in float64, and cuBLAS
forms Z^T Z: a float32 GEMM, or one on the TF32 tensor cores (``hessian="tf32"``: twice the
multiplications of a syrk at several times the rate; 10-bit mantissas, which the solver's guard allows
for, :func:`._pass.reduced_hessians`), or for the exact passes a DGEMM of the float64-scaled rows.

The product is a strided batched GEMM over blocks of :data:`_SUB_ROWS` rows, each block's k x k result
summed in float64: one GEMM of k x k from a million rows has only (k/128)^2 output tiles to spread over
the GPU, and float32 would sum a million products per entry; blocks give the GPU thousands of tiles
and keep float32 sums short.

Kernels: :file:`kernels/logistic_wide.cu`; CPU twin: ``xp_pass(..., hessian="float32")``, which the
tests compare.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["wide_pass", "uses_wide"]

_THREADS = 256
_Z_ELEMENTS = 1 << 27  # rows x features of the scaled rows at a time (512 MiB in float32)
_SUB_ROWS = 4096  # rows summed by one GEMM of the batch (in its own precision; the blocks add in float64)
# cudaDataType and cublasComputeType_t values
_R_32F, _R_64F = 0, 1
_COMPUTE = {"float32": 68, "tf32": 77, "float64": 70}  # CUBLAS_COMPUTE_32F, _32F_FAST_TF32, _64F


def uses_wide(backend: Any, X: Any) -> bool:
    """Whether :func:`wide_pass` takes this batch: a GPU, float32/float64 rows of contiguous features."""
    if backend.kind != "cuda" or X.ndim != 2 or X.dtype not in (np.float32, np.float64):
        return False
    item = X.dtype.itemsize
    return X.shape[1] > 0 and X.strides[1] == item and X.strides[0] % item == 0 and X.strides[0] >= X.shape[1] * item


def wide_pass(
    backend: Any, X: Any, y: Any, sw: Any | None, cw: tuple[float, float], w: np.ndarray, hessian: str
) -> Any:
    """The flat float64 vector of :func:`._pass.xp_pass` (layout in :mod:`._pass`) on the current
    stream, not synchronised; the features' Hessian block by ``hessian``: "float64" (the scaled rows in
    float64, DGEMM), "float32" (a float32 GEMM) or "tf32" (a GEMM on the TF32 tensor cores)."""
    import cupy

    from ..kernels import kernel, sm_count

    n, k = X.shape
    p = k + 1
    rs = X.strides[0] // X.dtype.itemsize
    name = "f32" if X.dtype == np.float32 else "f64"
    exact = hessian == "float64"
    ztype = np.float64 if exact else np.float32
    rows_fn = kernel("logistic_wide", f"logit_wide_rows_{name}_z{'64' if exact else '32'}", backend.ordinal)
    cols_fn = kernel("logistic_wide", f"logit_wide_cols_{name}", backend.ordinal)
    wd = cupy.asarray(np.asarray(w, dtype=np.float64))
    rr = cupy.empty(n, dtype=np.float64)
    resid = cupy.empty(n, dtype=np.float64)
    chunk = max(1, min(n, _Z_ELEMENTS // k // (2 if exact else 1)))
    blocks = -(-chunk // _SUB_ROWS)
    Z = cupy.empty((blocks * _SUB_ROWS, k), dtype=ztype)  # whole blocks: a chunk's last one zero-padded
    gram = cupy.zeros((k, k), dtype=np.float64)
    parts = cupy.empty((blocks, k, k), dtype=ztype)
    sms = sm_count(backend.ordinal)
    row_blocks = max(1, min((chunk * 32 + _THREADS - 1) // _THREADS, sms * 8))
    totals = cupy.empty((row_blocks * ((n + chunk - 1) // chunk), 6), dtype=np.float64)
    has_sw = sw is not None
    swv = sw if has_sw else rr
    cw0, cw1 = np.float64(cw[0]), np.float64(cw[1])
    for c, start in enumerate(range(0, n, chunk)):
        m = min(chunk, n - start)
        Xc = X[start : start + m]
        args = (Xc, np.int64(m), np.int32(k), np.int64(rs), y[start:], swv[start:] if has_sw else swv,
                np.int32(has_sw), cw0, cw1, wd, rr[start:], resid[start:], Z,
                totals[c * row_blocks :])  # fmt: skip
        rows_fn((row_blocks,), (_THREADS,), args)
        used = -(-m // _SUB_ROWS)
        if used * _SUB_ROWS > m:
            Z[m : used * _SUB_ROWS] = 0
        _gram_blocks(cupy, Z, parts, used, _COMPUTE[hessian])
        gram += parts[:used].sum(axis=0, dtype=np.float64)
    # the GEMMs' two triangles may differ in their last bits (tiles summed in other orders): one mirrored
    lower = cupy.tril(gram)
    gram = lower + lower.T - cupy.diag(cupy.diag(gram))
    # X^T [resid, r] in float64: a thread per feature over slices of rows
    col_blocks = (k + _THREADS - 1) // _THREADS
    slices = max(1, min((n + 255) // 256, (sms * 16) // col_blocks))
    per = (n + slices - 1) // slices
    sums = cupy.empty((slices, 2, k), dtype=np.float64)
    cols_fn(
        (col_blocks, slices), (_THREADS,), (X, np.int64(n), np.int32(k), np.int64(rs), resid, rr, np.int64(per), sums)
    )
    gr = sums.sum(axis=0)
    tot = totals[:, :5].sum(axis=0)
    H = cupy.empty((p, p), dtype=np.float64)
    H[:k, :k] = gram
    H[:k, k] = gr[1]
    H[k, :k] = gr[1]
    H[k, k] = rr.sum()
    nt = p * (p + 1) // 2
    iu = np.triu_indices(p)  # the layout of ml/_pass.py (imported by it, so not importing it back)
    out = cupy.empty(nt + p + 6, dtype=np.float64)
    out[:nt] = H[cupy.asarray(iu[0]), cupy.asarray(iu[1])]
    out[nt : nt + k] = gr[0]
    out[nt + k] = resid.sum()
    out[nt + p : nt + p + 5] = tot
    out[-1] = totals[:, 5].min()
    return out


def _gram_blocks(cupy: Any, Z: Any, parts: Any, used: int, compute: int) -> None:
    """parts[b] = Z_b^T Z_b for the first ``used`` blocks of :data:`_SUB_ROWS` rows of Z, by one strided
    batched GEMM on the current stream (Z's dtype in, Z's dtype out, ``compute`` as cuBLAS's)."""
    from cupy.cuda import cublas, device

    k = Z.shape[1]
    handle = device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    dtype, dt = (np.float64, _R_64F) if Z.dtype == np.float64 else (np.float32, _R_32F)
    one, zero = np.array(1.0, dtype=dtype), np.array(0.0, dtype=dtype)
    try:
        # Z is row-major (rows x k): to column-major cuBLAS it is Zc = Z^T (k x rows, ld k), so block b
        # is Zc's columns [b S, (b + 1) S), and Z_b^T Z_b = Zc_b Zc_b^T. A GEMM, not ssyrk: cuBLAS's
        # ssyrk took 80 ms a pass at 1M x 256 on an H100.
        cublas.gemmStridedBatchedEx(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T, k, k, _SUB_ROWS,
                                    one.ctypes.data, Z.data.ptr, dt, k, _SUB_ROWS * k,
                                    Z.data.ptr, dt, k, _SUB_ROWS * k,
                                    zero.ctypes.data, parts.data.ptr, dt, k, k * k,
                                    used, compute, -1)  # fmt: skip
    finally:
        cublas.setPointerMode(handle, mode)
