"""The GPU pass of a wide fit (more than 8 features) with the features' Hessian block in float32.

CuPy's version of :func:`._pass.xp_pass` upcasts every chunk to float64 and spends a dozen elementwise
launches around a float32 syrk; here one kernel reads each row once and makes everything but the
features' Hessian block: eta in float64, the row's weight and residual, the per-row totals, X^T
[resid, r] summed in float64 registers, and the row scaled by sqrt(r) (Z); cuBLAS forms Z^T Z: a
float32 GEMM, or one on the TF32 tensor cores (``hessian="tf32"``: twice the multiplications of a syrk
at several times the rate; 10-bit mantissas, which the solver's guard allows for,
:func:`._pass.reduced_hessians`), or for the exact passes a DGEMM of the float64-scaled rows.

The product is a strided batched GEMM over blocks of :data:`_SUB_ROWS` rows, each block's k x k result
summed in float64: one GEMM of k x k from a million rows has only (k/128)^2 output tiles to spread over
the GPU, and float32 would sum a million products per entry; blocks give the GPU thousands of tiles
and keep float32 sums short.

In-memory fits (:class:`WidePass`) also take the host out of the loop, as the narrow kernel does
(``_narrow.py``): under the solver's step rule each pass ends with the Newton step solved on the device
(cuSOLVER's Cholesky, in float64, of the system :meth:`._irls.IRLSSolver.penalized` forms), and the pass
at w + step is queued at once, while the host reads the sums; the solver takes it when it asks for
exactly those weights. Per iteration of a 1M x 256 fit the host used to spend ~2 ms (NumPy's Cholesky
and triangular solves, unpacking) with the GPU idle, about as long as the pass.

Kernels: :file:`kernels/logistic_wide.cu`; CPU twin: ``xp_pass(..., hessian="float32")``, which the
tests compare.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ._narrow import layout_size

__all__ = ["MAX_WIDE_FEATURES", "WidePass", "wide_pass", "uses_wide"]

_Z_ELEMENTS = 1 << 27  # rows x features of the scaled rows at a time (512 MiB in float32)
_SUB_ROWS = 4096  # rows summed by one GEMM of the batch (in its own precision; the blocks add in float64)
# cudaDataType and cublasComputeType_t values
_R_32F, _R_64F = 0, 1
_COMPUTE = {"float32": 68, "tf32": 77, "float64": 70}  # CUBLAS_COMPUTE_32F, _32F_FAST_TF32, _64F
# the fused kernel's shapes, (threads a block, features a thread), smallest first: its float64 sums of
# X^T [resid, r] live in registers, 2 F a thread
_FUSED = ((256, 1), (256, 2), (256, 4), (256, 8), (1024, 8))
# ...and of its kind with 16-byte loads and stores (rows of 16-byte multiples, aligned): (threads,
# vectors of features a thread); k <= threads x vectors x values a vector
_VECTOR = ((256, 1), (256, 2), (1024, 2), (1024, 4))
MAX_WIDE_FEATURES = _FUSED[-1][0] * _FUSED[-1][1]  # wider rows take xp_pass through CuPy
_FUSED_TOTALS = 8  # FUSED_TOTALS in logistic_wide.cu
_ROWS_PER_WARP = 1  # rows a warp of the one-value fused kernel reads at once (only 1 is compiled)
# The features' Hessian block by panels of columns, the upper triangle of panels only: the reduced
# passes in 2 panels (multiples of 256 wide, from 512 features: 3 GEMMs of 4), the exact ones in 4
# (multiples of 128, from 256 features: 10 GEMMs of 16). H100, one chunk's GEMMs (2^27 elements of
# Z), whole / 2 panels / 4 panels, ms: TF32 k=1024 1.14 / 0.90 / 1.10, k=2000 2.67 / 2.23 / 3.06
# (k=256 in 2 of 128: 0.34 -> 0.43, slower); DGEMM k=1024 4.98 / 3.80 / 3.44, k=2000 10.5 / 8.5 / 7.5,
# k=256 in 2 of 128: 0.65 -> 0.54, k=384 0.98 -> 0.81.
_PANELS = {False: (2, 256), True: (4, 128)}  # (panels, their width's multiple)


def uses_wide(backend: Any, X: Any) -> bool:
    """Whether :func:`wide_pass` takes this batch: a GPU, float32/float64 rows of contiguous features."""
    if backend.kind != "cuda" or X.ndim != 2 or X.dtype not in (np.float32, np.float64):
        return False
    item = X.dtype.itemsize
    k = X.shape[1]
    return 0 < k <= MAX_WIDE_FEATURES and X.strides[1] == item and X.strides[0] % item == 0 and X.strides[0] >= k * item


class WidePass:
    """The wide pass over one array, its buffers allocated once (module docstring).

    ``to_host``: results go to pinned host memory (two slots: a pass and the speculative one after it),
    and :meth:`plan` may turn on the device's Newton step and speculation; otherwise :meth:`launch`
    leaves each result in device memory (:func:`wide_pass`).
    """

    def __init__(self, backend: Any, X: Any, y: Any, sw: Any | None, to_host: bool = False):
        import cupy

        from ..kernels import sm_count

        n, k = X.shape
        self.backend, self.X, self.y, self.sw = backend, X, y, sw
        self.n, self.k, self.p = n, k, k + 1
        self.m = layout_size(k)
        self.size = self.m + 2 * self.p + 1  # the sums, then the tail: step, next weights, flag
        self.rs = X.strides[0] // X.dtype.itemsize
        tname = "f32" if X.dtype == np.float32 else "f64"
        ordinal = backend.ordinal
        width = 16 // X.dtype.itemsize  # values in a 16-byte vector
        self.vector = k % width == 0 and self.rs % width == 0 and X.data.ptr % 16 == 0
        if self.vector:
            self.threads, q = next(shape for shape in _VECTOR if k <= shape[0] * shape[1] * width)
            names = {z: f"logit_wide_vec_{tname}_z{z}_q{q}_t{self.threads}" for z in ("32", "64")}
            self._defines: tuple[str, ...] = (f"WIDE_VEC_Q={q}", f"WIDE_THREADS={self.threads}")
            rows_a_block = self.threads // 32
        else:
            self.threads, f = next(shape for shape in _FUSED if k <= shape[0] * shape[1])
            names = {z: f"logit_wide_fused_{tname}_z{z}_f{f}_r{_ROWS_PER_WARP}_t{self.threads}" for z in ("32", "64")}
            self._defines = (f"WIDE_FUSED_F={f}", f"WIDE_THREADS={self.threads}")
            rows_a_block = self.threads // 32 * _ROWS_PER_WARP
        self._fused = {z: self._kernel(name) for z, name in names.items()}
        self._finish = self._kernel("logit_wide_finish")
        self.panel = {exact: _panel_width(k, *shape) for exact, shape in _PANELS.items()}
        self._gram_sum = {z: self._kernel(f"logit_wide_gram_sum_z{z}") for z in ("32", "64")}
        self._sms = sm_count(ordinal)
        resident = _resident(_function_ptr(self._fused["64"]), self.threads)
        self.grid = max(1, min(self._sms * resident, -(-n // rows_a_block)))
        self.acc = cupy.empty((self.grid, 2 * k + _FUSED_TOTALS), dtype=np.float64)
        self.gram = cupy.empty((k, k), dtype=np.float64)
        self._scratch: dict[bool, tuple[Any, Any, int]] = {}
        self.to_host = to_host
        self._out: list[Any] = [None, None]
        self._H: list[Any] = [None, None]
        self._wdev: list[Any] = [None, None]
        self._wpin: list[Any] = [None, None]
        self._host: list[Any] = [None, None]
        self.wnext = [cupy.zeros(self.p, dtype=np.float64) for _ in range(2)]
        self.rule: tuple | None = None  # the solver's step rule (plan)
        self._system: tuple | None = None
        self.ahead = False
        self.launches = 0
        self.pending: tuple | None = None  # the speculative launch: (id, class weights, hessian)
        self.speculated = self.hits = 0

    # -- the step rule ------------------------------------------------------------------------------

    def plan(self, active: np.ndarray, n_free_features: int, l2: float, ahead: bool = True) -> None:
        """The solver's step rule (as ``KernelPass.plan``): from now on every pass solves the Newton step
        on the device, and with ``ahead`` queues the pass at w + step. Only with host results."""
        if not self.to_host:
            return
        import cupy
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusolver

        rule = (tuple(int(j) for j in active), int(n_free_features), float(l2))
        if rule != self.rule:
            self.rule = rule
            m = len(rule[0])
            A = cupy.empty((m, m), dtype=np.float64)
            handle = device.get_cusolver_handle()
            lwork = int(cusolver.dpotrf_bufferSize(handle, _LOWER, m, A.data.ptr, m)) if m else 0
            self._system = (
                cupy.asarray(np.array(rule[0], dtype=np.int64)),
                A,
                cupy.empty(max(m, 1), dtype=np.float64),
                cupy.empty(max(lwork, 1), dtype=np.float64),
                lwork,
                cupy.zeros(2, dtype=np.int32),
            )
        self.ahead = bool(ahead) and bool(self.rule[0])

    # -- passes -------------------------------------------------------------------------------------

    def launch(self, cw: tuple[float, float], w: np.ndarray | None, hessian: str) -> int:
        """Queue a pass on the current stream (``w`` None: at the next weights of the pass before, a
        speculative one) and, under a step rule, its Newton step; its launch id (slot = id % 2)."""
        import cupy

        self.launches += 1
        lid = self.launches
        slot = lid % 2
        out, H = self._slot(slot)
        stream = cupy.cuda.get_current_stream()
        if w is None:
            wsrc = self.wnext[(lid - 1) % 2]
        else:
            pin = self._wpin[slot]
            pin[...] = w
            wsrc = self._wdev[slot]
            wsrc.set(pin, stream=stream)  # from pinned memory: no wait for the queued passes
        exact = hessian == "float64"
        Z, parts, chunk = self._scratch_for(exact)
        fn = self._fused["64" if exact else "32"]
        has_sw = self.sw is not None
        cw0, cw1 = np.float64(cw[0]), np.float64(cw[1])
        n, k = self.n, self.k
        for c, start in enumerate(range(0, n, chunk)):
            rows = min(chunk, n - start)
            fn((self.grid,), (self.threads,), (self.X[start : start + rows], np.int64(rows), np.int32(k),
               np.int64(self.rs), self.y[start:], self.sw[start:] if has_sw else self.acc, np.int32(has_sw),
               cw0, cw1, wsrc, Z, self.acc, np.int32(c > 0)))  # fmt: skip
            used = -(-rows // _SUB_ROWS)
            if used * _SUB_ROWS > rows:  # the last block's rows past the chunk add nothing
                Z[rows : used * _SUB_ROWS] = 0
            _gram_blocks(cupy, Z, parts, used, _COMPUTE[hessian], self.panel[exact])
            gblocks = max(1, min(-(-k * k // 256), self._sms * 16))
            self._gram_sum["64" if exact else "32"](
                (gblocks,), (256,), (parts, np.int32(used), np.int32(k), self.gram, np.int32(c > 0))
            )
        blocks = max(1, min(-(-self.m // 256), self._sms * 8))
        self._finish((blocks,), (256,), (self.acc, np.int32(self.grid), np.int32(k), self.gram, out, H))
        if self.rule is not None:
            self._solve_step(out, H, wsrc, slot, stream)
        if self.to_host:
            host = self._host[slot]
            cupy.cuda.runtime.memcpyAsync(host.ctypes.data, out.data.ptr, out.nbytes,
                                          cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)  # fmt: skip
        return lid

    def result(self, lid: int) -> Any:
        """The device vector of launch ``lid`` (its sums, then the tail), valid until slot reuse."""
        return self._out[lid % 2]

    def __call__(
        self, cw: tuple[float, float], w: np.ndarray, hessian: str = "float64", next_hessian: str | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One pass at ``w``, waited for: the flat sums on the host, and the Newton step under the
        planned rule (None: no rule, or no step). With ``ahead``, the pass at w + step is queued with
        ``next_hessian`` (default: this pass's) before the wait."""
        import cupy

        lid = self._claim(cw, w, hessian)
        if lid is None:
            lid = self.launch(cw, w, hessian)
        event = cupy.cuda.Event(disable_timing=True)
        event.record()
        if self.rule is not None and self.ahead:
            nxt = next_hessian or hessian
            self.pending = (self.launch(cw, None, nxt), cw, nxt)
            self.speculated += 1
        event.synchronize()
        res = self._host[lid % 2].copy()
        vec, tail = res[: self.m], res[self.m :]
        ok = self.rule is not None and tail[2 * self.p] == 1.0
        return vec, (tail[: self.p].copy() if ok else None)

    def close(self) -> None:
        """Wait for a speculative pass still queued (it writes into this object's buffers)."""
        if self.pending is not None:
            import cupy

            self.pending = None
            cupy.cuda.get_current_stream().synchronize()

    # -- helpers ------------------------------------------------------------------------------------

    def _claim(self, cw: tuple[float, float], w: np.ndarray, hessian: str) -> int | None:
        """The pending speculative launch if it is the pass asked for (else its work is lost)."""
        if self.pending is None:
            return None
        lid, spec_cw, spec_hessian = self.pending
        self.pending = None
        before = self._host[(lid - 1) % 2][self.m :]  # the pass it followed: waited for, its tail here
        p = self.p
        if spec_cw == cw and spec_hessian == hessian and before[2 * p] == 1.0 and np.array_equal(before[p : 2 * p], w):
            self.hits += 1
            return lid
        return None

    def _slot(self, slot: int) -> tuple[Any, Any]:
        if self._out[slot] is None:
            import cupy
            import cupyx

            self._out[slot] = cupy.zeros(self.size, dtype=np.float64)
            self._H[slot] = cupy.empty((self.p, self.p), dtype=np.float64)
            self._wdev[slot] = cupy.empty(self.p, dtype=np.float64)
            self._wpin[slot] = cupyx.empty_pinned(self.p, dtype=np.float64)
            if self.to_host:
                self._host[slot] = cupyx.empty_pinned(self.size, dtype=np.float64)
        return self._out[slot], self._H[slot]

    def _scratch_for(self, exact: bool) -> tuple[Any, Any, int]:
        """The scaled rows Z (a chunk of whole :data:`_SUB_ROWS` blocks) and the blocks' products, in
        float64 for the exact passes, else float32."""
        if exact not in self._scratch:
            import cupy

            ztype = np.float64 if exact else np.float32
            chunk = max(1, min(self.n, _Z_ELEMENTS // self.k // (2 if exact else 1)))
            blocks = -(-chunk // _SUB_ROWS)
            Z = cupy.empty((blocks * _SUB_ROWS, self.k), dtype=ztype)
            parts = cupy.empty((blocks, self.k, self.k), dtype=ztype)
            self._scratch[exact] = (Z, parts, chunk)
        return self._scratch[exact]

    def _kernel(self, function: str) -> Any:
        """``function`` of kernels/logistic_wide.cu from a build of only this fit's shape (its defines):
        every kernel of the file took 6.7 s to compile on a cold cache."""
        from ..kernels import kernel

        return kernel("logistic_wide", function, self.backend.ordinal, self._defines)

    def _solve_step(self, out: Any, H: Any, wsrc: Any, slot: int, stream: Any) -> None:
        """The Newton step under the rule, from this pass's H and g, into out's tail and wnext[slot]."""
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusolver

        active, nfree, l2 = self.rule
        a_dev, A, rhs, work, lwork, info = self._system
        m = len(active)
        nt = self.p * (self.p + 1) // 2
        if m:
            blocks = max(1, min(-(-m * m // 256), self._sms * 8))
            self._kernel("logit_wide_system")(
                (blocks,), (256,), (H, out[nt:], wsrc, a_dev, np.int32(m), np.int32(nfree), np.float64(l2),
                                   np.int32(self.p), A, rhs))  # fmt: skip
            handle = device.get_cusolver_handle()
            cusolver.setStream(handle, stream.ptr)
            cusolver.dpotrf(handle, _LOWER, m, A.data.ptr, m, work.data.ptr, lwork, info.data.ptr)
            cusolver.dpotrs(handle, _LOWER, m, 1, A.data.ptr, m, rhs.data.ptr, m, info.data.ptr + 4)
        self._kernel("logit_wide_next")(
            (1,), (256,), (rhs, a_dev, np.int32(m), info, wsrc, np.int32(self.p), out[self.m :], self.wnext[slot])
        )


def wide_pass(
    backend: Any, X: Any, y: Any, sw: Any | None, cw: tuple[float, float], w: np.ndarray, hessian: str
) -> Any:
    """The flat float64 vector of :func:`._pass.xp_pass` (layout in :mod:`._pass`) on the current
    stream, not synchronised; the features' Hessian block by ``hessian``: "float64" (the scaled rows in
    float64, DGEMM), "float32" (a float32 GEMM) or "tf32" (a GEMM on the TF32 tensor cores)."""
    wp = WidePass(backend, X, y, sw)
    return wp.result(wp.launch(cw, w, hessian))[: wp.m]


_LOWER = 0  # CUBLAS_FILL_MODE_LOWER


def _panel_width(k: int, parts: int, grain: int) -> int:
    """Columns a panel of the Hessian's GEMMs for about ``parts`` panels, a multiple of ``grain``, from
    two panels of ``grain`` (0: one GEMM of the whole block)."""
    width = max(grain, -(-k // parts // grain) * grain)
    return width if k >= 2 * grain and width < k else 0


def _function_ptr(fn: Any) -> int:
    return int(fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr)  # CuPy's RawKernel wraps a Function


@functools.cache
def _resident(fn_ptr: int, threads: int) -> int:
    """Blocks of the fused kernel resident on one SM (its grid is one wave: blocks loop over tiles)."""
    try:
        from cupy.cuda import driver

        return max(1, int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fn_ptr, threads, 0)))
    except Exception:  # noqa: BLE001 - an older CuPy without the occupancy call
        return max(1, 2048 // threads)


def _gram_blocks(cupy: Any, Z: Any, parts: Any, used: int, compute: int, panel: int = 0) -> None:
    """parts[b] = Z_b^T Z_b (column-major) for the first ``used`` blocks of :data:`_SUB_ROWS` rows of Z,
    by strided batched GEMMs on the current stream (Z's dtype in, Z's dtype out, ``compute`` as
    cuBLAS's). ``panel``: only the panels (I, J) of that many columns with I <= J, the column-major
    upper triangle of blocks (fewer multiplications for wide rows; the rest of parts is left as it was);
    0: the whole product in one GEMM."""
    from cupy.cuda import cublas, device

    k = Z.shape[1]
    handle = device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    dtype, dt = (np.float64, _R_64F) if Z.dtype == np.float64 else (np.float32, _R_32F)
    item = Z.dtype.itemsize
    one, zero = np.array(1.0, dtype=dtype), np.array(0.0, dtype=dtype)
    edges = list(range(0, k, panel)) + [k] if 0 < panel < k else [0, k]
    try:
        # Z is row-major (rows x k): to column-major cuBLAS it is Zc = Z^T (k x rows, ld k), so block b
        # is Zc's columns [b S, (b + 1) S), and Z_b^T Z_b = Zc_b Zc_b^T; its panel (I, J) is Zc_b's rows
        # of panel I times the transpose of those of panel J. GEMMs, not ssyrk: cuBLAS's ssyrk took
        # 80 ms a pass at 1M x 256 on an H100.
        for i in range(len(edges) - 1):
            for j in range(i, len(edges) - 1):
                r0, rn, c0, cn = edges[i], edges[i + 1] - edges[i], edges[j], edges[j + 1] - edges[j]
                cublas.gemmStridedBatchedEx(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T, rn, cn, _SUB_ROWS,
                                            one.ctypes.data, Z.data.ptr + r0 * item, dt, k, _SUB_ROWS * k,
                                            Z.data.ptr + c0 * item, dt, k, _SUB_ROWS * k,
                                            zero.ctypes.data, parts.data.ptr + (r0 + c0 * k) * item, dt, k, k * k,
                                            used, compute, -1)  # fmt: skip
    finally:
        cublas.setPointerMode(handle, mode)
