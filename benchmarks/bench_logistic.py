"""Logistic regression: pystrom's fused IRLS against a naive CuPy IRLS, torch IRLS and scikit-learn, same run.

Workloads (the rule of `pystrom demo`): 40M x 4 float32 with t = 1 + 2 x1 - 3 x2 + x3 + 0.5 x4 > 0, labels flipped
with probability 0.1 so the fit has an optimum (the separable original only tells the solvers apart
in that pystrom stops and warns); 20 iterations, and to convergence. Also 1M x 256 features, and the
out-of-core path (the same rows as host Tables streamed to the GPU every pass). scikit-learn fits
the full data on every core (quick mode: a subsample; its rows say so). The bandwidth floor: each
pass must read X and y once, so floor = passes x bytes / measured device bandwidth.
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
        floor = passes20 * (X.nbytes + t.nbytes) / bw
        results.append(
            Result(f"logreg {label}, 20 it", f"bandwidth floor ({passes20} passes)", t_ours, floor, X.nbytes)
        )
        floor_lines.append(
            f"logreg {label} 20 it: {t_ours * 1e3:.2f} ms, floor {floor * 1e3:.2f} ms, x{t_ours / floor:.1f}"
        )

    if gpu:  # one pass alone (kernel + final reduction + the 8-byte-per-value result to the host)
        from pystrom._backend import resolve_device
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
                f"({nbytes / s_pass / (bw / 2) * 100:.0f}% of the copy's read rate)"
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
        floor = conv.n_passes_ * (X.nbytes + t.nbytes) / bw
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
        h2d = ooc.n_passes_ * (X.nbytes + t.nbytes) / 54e9
        floor_lines.append(f"out-of-core 20 it: {t_ooc:.3f} s, H2D floor at 54 GB/s {h2d:.3f} s, x{t_ooc / h2d:.1f}")
    batches.clear()

    # Many features: the chunked cuBLAS path.
    nw = (100_000 if quick else 1_000_000) if gpu else 20_000
    Xw, tw = _seed(xp, nw, k=256)

    def fitw():
        return LogisticRegression(max_iter=20, tol=0.0).fit(Xw, tw)

    t_w = measure(fitw, sync, max(1, repeat - 2))
    wl = f"{nw / 1e6:g}Mx256 f32, 20 it"
    if gpu:
        t_nw = measure(lambda: naive_irls(xp, Xw, tw, 20), sync, max(1, repeat - 2))
        results.append(Result(wl, "naive CuPy IRLS, 20 it", t_w, t_nw, Xw.nbytes))
        passes = fitw().n_passes_
        floor_lines.append(f"{wl}: {t_w * 1e3:.1f} ms, bandwidth floor {passes * Xw.nbytes / bw * 1e3:.2f} ms")
    else:
        t0 = time.perf_counter()
        naive_irls(np, Xw, tw, 20)
        results.append(Result(wl, "naive NumPy IRLS, 20 it", t_w, time.perf_counter() - t0, Xw.nbytes))
    if not gpu:
        results += cpu_gram()
    if gpu:
        print(f"device bandwidth (read+write, D2D copy): {bw / 1e9:.0f} GB/s; cores: {os.cpu_count()}")
    for line in floor_lines:
        print(line)
    return results


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
