"""Logistic regression: pystrom's fused IRLS against a naive CuPy IRLS, torch IRLS and scikit-learn, same run.

Workloads (the rule of `pystrom demo`): 40M x 4 float32 with t = 1 + 2 x1 - 3 x2 + x3 + 0.5 x4 > 0, labels flipped
with probability 0.1 so the fit has an optimum (the separable original only tells the solvers apart
in that pystrom stops and warns); 20 iterations, and to convergence. Also 1M x 256 and 4M x 1024
features (float32 Hessians in the iterations, against the float64 path, naive CuPy and torch, with the
statistics' agreement with the float64 path), and the out-of-core path (the same rows as host Tables
streamed to the GPU every pass). scikit-learn fits the full data on every core (quick mode: a
subsample; its rows say so).

The floors, measured in the same run: each pass must read X and y once, so the in-memory floor is
passes x bytes / the read rate of a read-only kernel (float4 loads, nothing written), and the
out-of-core floor is passes x bytes / the rate of one large copy from pinned host memory.

Knobs (environment): PYSTROM_BENCH_CHUNKS="65536,131072,..." also times the wide 20-iteration fits at
those rows per chunk (pystrom.defaults.logit_chunk_rows); CUPY_TF32=1 lets cuBLAS use TF32 for the
float32 products (naive CuPy's too, and pystrom's float32 Hessian then uses the general product).
"""

from __future__ import annotations

import os
import time
import warnings

import numpy as np

from _harness import Result, measure, measure_pair


def _seed(xp, n: int, k: int = 4, noise: float = 0.1, seed: int = 0):
    rng = xp.random.default_rng(seed) if hasattr(xp.random, "default_rng") else xp.random.RandomState(seed)
    X = rng.standard_normal((n, k), dtype=np.float32)
    coef = xp.asarray(([2.0, -3.0, 1.0, 0.5] + [0.1] * max(0, k - 4))[:k], dtype=np.float32)
    t = (1.0 + X @ coef) > 0
    if noise:
        t ^= rng.random(n) < noise
    return X, t


def naive_irls(xp, X, t, iters: int):
    """The textbook chain of temporaries (a direct CuPy port of MADlib's IRLS): float32, a column of ones."""
    A = xp.concatenate([xp.ones((X.shape[0], 1), dtype=X.dtype), X], axis=1)
    y = t.astype(X.dtype)
    w = xp.zeros(A.shape[1], dtype=X.dtype)
    for _ in range(iters):
        z = 1.0 / (1.0 + xp.exp(-(A @ w)))
        R = z * (1.0 - z)
        H = (A * R[:, None]).T @ A
        w = w + xp.linalg.solve(H, A.T @ (y - z))
    return w


def torch_irls(torch, X, t, iters: int):
    A = torch.cat([torch.ones((X.shape[0], 1), device=X.device, dtype=X.dtype), X], dim=1)
    y = t.to(X.dtype)
    w = torch.zeros(A.shape[1], device=X.device, dtype=X.dtype)
    for _ in range(iters):
        z = torch.sigmoid(A @ w)
        R = z * (1.0 - z)
        H = (A * R[:, None]).T @ A
        w = w + torch.linalg.solve(H, A.T @ (y - z))
    return w


_READ_ONLY = r"""
extern "C" __global__ void read_only(const float4* __restrict__ a, long long n4, float* __restrict__ out) {
  float acc = 0.0f;
  const long long stride = (long long)blockDim.x * gridDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {  // four independent 16-byte loads in flight a thread
    const float4 v0 = __ldg(a + i), v1 = __ldg(a + i + stride), v2 = __ldg(a + i + 2 * stride),
                 v3 = __ldg(a + i + 3 * stride);
    acc += (v0.x + v1.y) + (v2.z + v3.w);
  }
  for (; i < n4; i += stride) acc += __ldg(a + i).x;
  if (acc == 1234.5f) out[0] = acc;  // never true for the data below; keeps the loads
}
"""


def _read_bandwidth(cupy) -> float:
    """Bytes per second a simple read-only kernel reaches on this device (the in-memory floor's rate)."""
    fn = cupy.RawKernel(_READ_ONLY, "read_only")
    a = cupy.full(1 << 28, 0.5, dtype=np.float32)  # 1 GiB
    out = cupy.zeros(1, dtype=np.float32)
    sms = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["multiProcessorCount"]
    n4 = np.int64(a.size // 4)
    s = measure(lambda: fn((sms * 8,), (256,), (a, n4, out)), cupy.cuda.Device().synchronize, 20)
    return (1 << 30) / s


def _pinned_h2d(cupy) -> float:
    """Bytes per second of one large copy from pinned host memory to the device (the out-of-core floor's rate)."""
    import cupyx

    host = cupyx.empty_pinned(1 << 28, dtype=np.float32)
    host[:] = 1.0
    dev = cupy.empty(1 << 28, dtype=np.float32)
    s = measure(lambda: dev.set(host), cupy.cuda.Device().synchronize, 10)
    return (1 << 30) / s


def _bandwidth(cupy) -> float:
    """Device memory bandwidth, bytes read + written per second, from a large device-to-device copy."""
    a = cupy.empty(1 << 28, dtype=np.float32)  # 1 GiB
    a.fill(1.0)
    b = cupy.empty_like(a)
    s = measure(lambda: b.__setitem__(Ellipsis, a), cupy.cuda.Device().synchronize, 10)
    return 2 * a.nbytes / s


def run(device: str, quick: bool) -> list[Result]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ConvergenceWarning of fits stopped at 20 iterations on purpose
        return _run(device, quick)


def _run(device: str, quick: bool) -> list[Result]:
    from pystrom import Table
    from pystrom.ml import LogisticRegression
    from pystrom.ml._staging import staging_stats

    results: list[Result] = []
    gpu = device.startswith("cuda")
    if gpu:
        import cupy as xp

        sync = xp.cuda.Device().synchronize
    else:
        xp, sync = np, (lambda: None)
    n = 1_000_000 if quick else 40_000_000
    repeat = 3 if quick else 5
    X, t = _seed(xp, n)
    label = f"{n // 1_000_000}Mx4 f32"
    floor_lines = []
    bw = _bandwidth(xp) if gpu else None
    read_bw = _read_bandwidth(xp) if gpu else None
    h2d_bw = _pinned_h2d(xp) if gpu else None

    def fit20():
        return LogisticRegression(max_iter=20, tol=0.0).fit(X, t)

    model = fit20()
    passes20 = model.n_passes_
    t_ours = measure(fit20, sync, repeat)
    if gpu:
        t_naive = measure(lambda: naive_irls(xp, X, t, 20), sync, repeat)
        results.append(Result(f"logreg {label}, 20 it", "naive CuPy IRLS, 20 it", t_ours, t_naive, X.nbytes))
        try:
            import torch

            Xt, tt = torch.as_tensor(X, device="cuda"), torch.as_tensor(t, device="cuda")
            t_torch = measure(lambda: torch_irls(torch, Xt, tt, 20), torch.cuda.synchronize, repeat)
            results.append(Result(f"logreg {label}, 20 it", "torch IRLS, 20 it", t_ours, t_torch, X.nbytes))
            del Xt, tt
        except ImportError:
            print("torch is not installed: no torch baseline")
        floor = passes20 * (X.nbytes + t.nbytes) / read_bw
        results.append(
            Result(f"logreg {label}, 20 it", f"read-only floor ({passes20} passes)", t_ours, floor, X.nbytes)
        )
        floor_lines.append(
            f"SEED logreg {label} 20 it: {t_ours * 1e3:.2f} ms; floor {floor * 1e3:.2f} ms ({passes20} passes of "
            f"{(X.nbytes + t.nbytes) / 1e6:.0f} MB at the read-only kernel's {read_bw / 1e9:.0f} GB/s); "
            f"time / floor = {t_ours / floor:.2f} (goal <= 1.3)"
        )

    if gpu:  # one pass alone (kernel + final reduction + the 8-byte-per-value result to the host)
        from pystrom.memory.backend import resolve_device
        from pystrom.ml._pass import batch_pass

        backend = resolve_device(device)
        y8 = t.astype(np.uint8)
        w = np.array([0.5, -0.5, 0.25, 0.1, 0.2])
        for order in ("C", "F"):
            Xo = X if order == "C" else xp.asfortranarray(X)
            s_pass = measure(lambda Xo=Xo: batch_pass(backend, Xo, y8, None, (1.0, 1.0), w).get(), sync, 20)
            nbytes = Xo.nbytes + y8.nbytes
            floor_lines.append(
                f"one pass {label} {order}-order: {s_pass * 1e6:.0f} us, {nbytes / s_pass / 1e9:.0f} GB/s read "
                f"({nbytes / s_pass / read_bw * 100:.0f}% of the read-only kernel's {read_bw / 1e9:.0f} GB/s)"
            )
            del Xo

    # Without flipped labels the rule separates the classes: pystrom stops with a PerfectSeparationWarning.
    Xs, ts = _seed(xp, n, noise=0.0)
    sep = LogisticRegression().fit(Xs, ts)
    t_sep = measure(lambda: LogisticRegression().fit(Xs, ts), sync, max(1, repeat - 2))
    if gpu:
        t_naive_sep = measure(lambda: naive_irls(xp, Xs, ts, 20), sync, max(1, repeat - 2))
        results.append(
            Result(
                f"logreg {label} separable: warns after {sep.n_iter_} it ({sep.separation_})",
                "naive CuPy IRLS, 20 it (runaway)",
                t_sep,
                t_naive_sep,
                Xs.nbytes,
            )
        )
    Xs = ts = None  # free the device memory before the next workload

    def fit_conv():
        return LogisticRegression().fit(X, t)

    conv = fit_conv()
    t_conv = measure(fit_conv, sync, repeat)
    conv_label = f"logreg {label}, to convergence ({conv.n_iter_} it)"
    if gpu:  # the textbook solvers have no convergence test: give them the iterations pystrom needed
        t_nc = measure(lambda: naive_irls(xp, X, t, conv.n_iter_), sync, repeat)
        results.append(Result(conv_label, f"naive CuPy IRLS, {conv.n_iter_} it", t_conv, t_nc, X.nbytes))
        try:
            import torch

            Xt, tt = torch.as_tensor(X, device="cuda"), torch.as_tensor(t, device="cuda")
            t_tc = measure(lambda: torch_irls(torch, Xt, tt, conv.n_iter_), torch.cuda.synchronize, repeat)
            results.append(Result(conv_label, f"torch IRLS, {conv.n_iter_} it", t_conv, t_tc, X.nbytes))
            del Xt, tt
        except ImportError:
            pass
    sub = 200_000 if quick else n  # the full data on every core (quick mode: a subsample, labelled)
    Xh = X[:sub].get() if gpu else X[:sub]
    th = t[:sub].get() if gpu else t[:sub]
    try:
        from sklearn.linear_model import LogisticRegression as SkLR

        for solver in ("lbfgs", "newton-cholesky"):
            sk = SkLR(solver=solver, penalty=None, tol=1e-8, max_iter=1000)
            start = time.perf_counter()  # one timed fit: minutes at full size, and nothing to warm up
            sk.fit(Xh, th)
            t_sk = time.perf_counter() - start
            where = f" ({sub / 1e6:g}M-row subsample)" if sub < n else f", {os.cpu_count()} cores"
            name = f"sklearn {solver}{where}"
            results.append(Result(conv_label, name, t_conv, t_sk, X.nbytes))
    except ImportError:
        print("scikit-learn is not installed: no scikit-learn baseline")
    if gpu:
        floor = conv.n_passes_ * (X.nbytes + t.nbytes) / read_bw
        floor_lines.append(f"logreg {label} to convergence: {t_conv * 1e3:.2f} ms, floor {floor * 1e3:.2f} ms")

    # Out of core: host Tables of 4M rows streamed to the GPU on every pass (H2D overlapped with compute).
    rows = n // 10
    Xh_all = X.get() if gpu else X
    th_all = t.get() if gpu else t
    batches = [
        Table.from_arrays({f"x{j}": Xh_all[s : s + rows, j] for j in range(4)} | {"t": th_all[s : s + rows]}, "cpu")
        for s in range(0, n, rows)
    ]
    del Xh_all, th_all

    def fit_ooc():
        return LogisticRegression(max_iter=20, tol=0.0, device=device).fit(batches, target="t")

    ooc = fit_ooc()
    t_ooc = measure(fit_ooc, lambda: None, 1 if not quick else 2)
    results.append(Result(f"out-of-core {label}, 20 it", "in-memory pystrom, 20 it", t_ooc, t_ours, X.nbytes))
    if gpu:
        h2d = ooc.n_passes_ * (X.nbytes + t.nbytes) / h2d_bw
        name = f"out-of-core {label}, 20 it"
        results.append(Result(name, f"H2D floor ({ooc.n_passes_} passes)", t_ooc, h2d, X.nbytes))
        floor_lines.append(
            f"OUT-OF-CORE {label} 20 it: {t_ooc:.3f} s; H2D floor {h2d:.3f} s ({ooc.n_passes_} passes at the pinned "
            f"copy's {h2d_bw / 1e9:.1f} GB/s); time / floor = {t_ooc / h2d:.2f} (goal <= 1.3)"
        )
        st = staging_stats()  # the timed fit's: pinning its host tables is part of its time
        floor_lines.append(
            f"OUT-OF-CORE staging: {st.get('registered_bytes', 0) / 1e6:.0f} MB registered in "
            f"{st.get('register_s', 0) * 1e3:.1f} ms, unregistered in {st.get('unregister_s', 0) * 1e3:.1f} ms; "
            f"{st.get('direct_bytes', 0) / 1e9:.2f} GB copied from registered memory, "
            f"{st.get('bounced_bytes', 0) / 1e9:.2f} GB through bounce buffers, {st.get('copies', 0):.0f} copies"
        )
    batches.clear()
    X = t = None

    # Many features: the chunked path, float32 Hessians in the iterations.
    sizes = [(1_000_000, 256), (4_000_000, 1024)] if not quick else [(100_000, 256), (200_000, 1024)]
    if not gpu:
        sizes = [(20_000, 256)]
    for nw, kw in sizes:
        res, lines = _wide(xp, sync, gpu, nw, kw, max(1, repeat - 3))
        results += res
        floor_lines += lines
        if gpu:  # the fits' chunks and the baselines' temporaries, before the next size
            xp.get_default_memory_pool().free_all_blocks()
    if not gpu:
        results += cpu_gram()
    if gpu:
        print(f"device: {xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)['name'].decode()}")
        print(
            f"device bandwidth: read-only kernel {read_bw / 1e9:.0f} GB/s, D2D copy (read+write) {bw / 1e9:.0f} GB/s; "
            f"pinned H2D {h2d_bw / 1e9:.1f} GB/s; cores: {os.cpu_count()}"
        )
    for line in floor_lines:
        print(line)
    return results


def _wide(xp, sync, gpu: bool, n: int, k: int, repeat: int) -> tuple[list[Result], list[str]]:
    """n x k float32, 20 iterations: pystrom's default ("auto": TF32 Hessians where the guard admits
    them, else float32, on a GPU) against float32 and TF32 alone, the float64 path, naive CuPy/NumPy and
    torch IRLS; then the default and the float64 path to convergence, and how far their statistics differ."""
    import pystrom
    from pystrom.ml import LogisticRegression

    results, lines = [], []
    X, t = _seed(xp, n, k=k)
    label = f"{n / 1e6:g}Mx{k} f32, 20 it"

    def fit20(hessian: str = "auto", chunk: int = 0):
        with pystrom.defaults.set(logit_hessian=hessian, logit_chunk_rows=chunk):
            return LogisticRegression(max_iter=20, tol=0.0).fit(X, t)

    t_ours = measure(fit20, sync, repeat)
    t_64 = measure(lambda: fit20("float64"), sync, repeat)
    results.append(Result(label, "pystrom float64 Hessians, 20 it", t_ours, t_64, X.nbytes))
    t_tf32 = measure(lambda: fit20("tf32"), sync, repeat) if gpu else None
    t_f32 = measure(lambda: fit20("float32"), sync, repeat) if gpu else None
    if gpu:
        t_naive = measure(lambda: naive_irls(xp, X, t, 20), sync, repeat)
        xp.get_default_memory_pool().free_all_blocks()  # the naive fit's temporaries, before torch allocates
        results.append(Result(label, "naive CuPy IRLS, 20 it", t_ours, t_naive, X.nbytes))
        try:
            import torch

            Xt, tt = torch.as_tensor(X, device="cuda"), torch.as_tensor(t, device="cuda")
            t_torch = measure(lambda: torch_irls(torch, Xt, tt, 20), torch.cuda.synchronize, repeat)
            results.append(Result(label, "torch IRLS, 20 it", t_ours, t_torch, X.nbytes))
            del Xt, tt
            torch.cuda.empty_cache()
        except ImportError:
            pass
        once = fit20()
        lines.append(
            f"WIDE {label}: auto {t_ours * 1e3:.1f} ms ({once.n_passes_} passes, {once.n_approx_passes_} approximate); "
            f"TF32 {t_tf32 * 1e3:.1f} ms (x{t_naive / t_tf32:.2f}); float32 {t_f32 * 1e3:.1f} ms "
            f"(x{t_naive / t_f32:.2f}); float64 Hessians {t_64 * 1e3:.1f} ms; naive CuPy {t_naive * 1e3:.1f} ms "
            f"(x{t_naive / t_ours:.2f}, goal >= 3)"
        )
        for chunk in [int(c) for c in os.environ.get("PYSTROM_BENCH_CHUNKS", "").split(",") if c.strip()]:
            t_c = measure(lambda chunk=chunk: fit20(chunk=chunk), sync, repeat)
            lines.append(f"WIDE {label} at {chunk} rows a chunk: {t_c * 1e3:.1f} ms")
    else:
        start = time.perf_counter()
        naive_irls(np, X, t, 20)
        results.append(Result(label, "naive NumPy IRLS, 20 it", t_ours, time.perf_counter() - start, X.nbytes))
    fast = LogisticRegression().fit(X, t)
    with pystrom.defaults.set(logit_hessian="float64"):
        exact = LogisticRegression().fit(X, t)
    d_coef = float(np.max(np.abs(fast.coefficients_ - exact.coefficients_) / np.abs(exact.coefficients_)))
    d_se = float(np.max(np.abs(fast.std_err_ - exact.std_err_) / exact.std_err_))
    lines.append(
        f"AGREEMENT {n / 1e6:g}Mx{k} f32 to convergence: auto Hessians {fast.n_iter_} it ({fast.n_passes_} passes, "
        f"{fast.n_approx_passes_} approximate), float64 {exact.n_iter_} it ({exact.n_passes_} passes); "
        f"max relative difference: coefficients {d_coef:.2e}, standard errors {d_se:.2e}"
    )
    return results, lines


def cpu_gram() -> list[Result]:
    """X^T A X of one chunk of the CPU pass (8192 rows, as ml/_pass.py makes them for many features):
    the symmetric rank-k update the pass uses, against the general product it replaced. Measured
    alternately (measure_pair): the CI machine's two cores are shared."""
    from pystrom.ml._pass import _weighted_gram

    rng = np.random.default_rng(1)
    out = []
    for k in (8, 32, 256):
        Xc = rng.standard_normal((8192, k))
        a = rng.random(8192)
        t_syrk, t_gemm = measure_pair(
            lambda Xc=Xc, a=a: _weighted_gram(np, Xc, a), lambda Xc=Xc, a=a: Xc.T @ (Xc * a[:, None]), lambda: None, 15
        )
        out.append(Result(f"CPU pass X^T A X, 8192x{k} chunk", "general product X^T (X a)", t_syrk, t_gemm, Xc.nbytes))
    return out
