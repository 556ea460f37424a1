"""The GPU pass of a wide fit (more than 8 features) with the features' Hessian block in float32.

CuPy's version of :func:`._pass.xp_pass` upcasts every chunk to float64 and spends a dozen elementwise
launches around a float32 syrk; here one kernel makes each row's values (eta in float64, its weight and
residual, the row scaled by sqrt(r) in float32), one kernel sums X^T [resid, r] in float64, and cuBLAS
forms Z^T Z: a float32 GEMM, or with ``pystrom.defaults.logit_hessian = "tf32"`` one on the TF32 tensor cores
(twice the multiplications at several times the rate; 10-bit mantissas, which the solver's guard
allows for as for float32, :func:`._pass.gram32_rounding`). Kernels: :file:`kernels/logistic_wide.cu`;
CPU twin: ``xp_pass(..., hessian="float32")``, which the tests compare.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["wide_pass", "uses_wide"]

_THREADS = 256
_Z_ELEMENTS = 1 << 27  # rows x features of the float32 scaled rows at a time (512 MiB)


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
    # cuBLAS sums a chunk's float32 products over its rows in float32: 2^17 rows at most (as xp_pass)
    chunk = max(1, min(n, _Z_ELEMENTS // k // (2 if exact else 1), 1 << 30 if exact else 1 << 17))
    Z = cupy.empty((chunk, k), dtype=ztype)
    gram = cupy.zeros((k, k), dtype=np.float64)
    part = cupy.zeros((k, k), dtype=ztype)
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
        if exact:
            gram += Z[:m].T @ Z[:m]  # DGEMM (FP64 tensor cores)
        else:
            _gram32(cupy, Z[:m], part, hessian == "tf32")
            gram += part
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


def _gram32(cupy: Any, Z: Any, out: Any, tf32: bool) -> None:
    """out = Z^T Z (float32, k x k, full) by cuBLAS on the current stream."""
    from cupy.cuda import cublas, device

    m, k = Z.shape
    handle = device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        _gram32_call(cublas, handle, Z, out, m, k, tf32)
    finally:
        cublas.setPointerMode(handle, mode)
    # the GEMM's two triangles may differ in their last bits (tiles summed in other orders): one mirrored
    lower = cupy.tril(out)
    out[...] = lower + lower.T - cupy.diag(cupy.diag(out))


def _gram32_call(cublas: Any, handle: int, Z: Any, out: Any, m: int, k: int, tf32: bool) -> None:
    one = np.array(1.0, dtype=np.float32)
    zero = np.array(0.0, dtype=np.float32)
    # Z is row-major (m x k): to column-major cuBLAS it is Zc = Z^T (k x m, ld k); Z^T Z = Zc Zc^T.
    # A GEMM, not ssyrk: cuBLAS's ssyrk took 80 ms a pass at 1M x 256 on an H100 (the GEMM: ~3 ms in
    # float32, well under 1 in TF32). 0: CUDA_R_32F; 68: CUBLAS_COMPUTE_32F; 77: ..._32F_FAST_TF32.
    cublas.gemmEx(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T, k, k, m, one.ctypes.data, Z.data.ptr, 0, k,
                  Z.data.ptr, 0, k, zero.ctypes.data, out.data.ptr, 0, k, 77 if tf32 else 68, -1)  # fmt: skip
