"""Wide fits (more than 8 features): Newton steps with float32 Hessians, statistics from a float64 one.

The iterations may form the features' block of X^T A X in float32 (``pystrom.defaults.logit_hessian
= "float32"``; "auto", the default, on the CPU); the gradient and log-likelihood stay float64, so the
fit converges to the float64 fit's
optimum, and the statistics come from a float64 Hessian at the returned coefficients. Checked against
statsmodels (which we did not write) at the accuracy tests' tolerances, on both backends, for 64 and
256 features, well and ill conditioned and close to separation, and against the float64 path's
iteration count.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from test_logistic import RTOL, _host, assert_matches_statsmodels, on

import pystrom
from pystrom import Table
from pystrom.ml import LogisticRegression, PerfectSeparationWarning
from pystrom.ml._pass import PassTotals

from conftest import needs_gpu

sm = pytest.importorskip("statsmodels.api")


def wide(n: int, k: int, kind: str, seed: int = 0, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Rows with a logistic target. ``kind``: "plain" (independent columns); "collinear" (the second
    half of the columns is 0.3 times the first plus 1e-2 of noise, and one column is 1000 times the
    others: ill conditioned); "near_separable" (large coefficients: most rows fitted with probability
    near 0 or 1, the maximum still finite)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k))
    beta = rng.normal(size=k) / np.sqrt(k)
    if kind == "collinear":
        h = k // 2
        X[:, h:] = 0.3 * X[:, :h] + 1e-2 * X[:, h:]
        X[:, 1] *= 1000.0
        beta[1] /= 1000.0
        beta[h:] = 0.0
    elif kind == "near_separable":
        beta *= 6.0
    eta = X @ beta + 0.3
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-eta))).astype(np.float64)
    return X.astype(dtype), y


def reference(X: np.ndarray, y: np.ndarray):
    # Newton in float64 to a tight tolerance: statsmodels' own default stops earlier than 1e-6 of the
    # coefficients on the ill-conditioned data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels warns that its tol=1e-14 was not reached
        # maxiter=25: Newton is at its fixed point long before (on the collinear data tol=1e-14 is never met,
        # and iterations 26-100 moved the coefficients by 3e-12 relative, the covariance by 4e-12: 4x the time)
        return sm.Logit(y, sm.add_constant(X.astype(np.float64))).fit(disp=0, method="newton", tol=1e-14, maxiter=25)


def fit(device: str, X: np.ndarray, y: np.ndarray, hessian: str = "float32", **kw) -> LogisticRegression:
    with pystrom.defaults.set(logit_hessian=hessian):
        return LogisticRegression(**kw).fit(on(device, X), on(device, y))


@pytest.mark.parametrize(
    ("k", "kind"),
    [
        (64, "plain"),
        (64, "collinear"),
        (64, "near_separable"),
        (256, "plain"),
        (256, "collinear"),
        (256, "near_separable"),
    ],  # fmt: skip
)
def test_wide_fit_matches_statsmodels_with_float32_hessians(device, k, kind):
    # near separation: fewer rows, so that no z statistic is so large that its p-value is denormal
    n = (20_000 if k == 64 else 24_000) // (3 if kind == "near_separable" and k == 64 else 1)
    X, y = wide(n // (2 if kind == "near_separable" and k == 256 else 1), k, kind)
    ref = reference(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, no convergence or separation warning
        model = fit(device, X, y)
        exact = fit(device, X, y, hessian="float64")
    assert model.n_approx_passes_ > 0  # the float32 Hessians really drove the steps
    assert exact.n_approx_passes_ == 0
    if kind == "plain":  # "auto": float32 Hessians (the wide kernels and ssyrk on a GPU)
        auto = fit(device, X, y, hessian="auto")
        assert auto.n_approx_passes_ > 0
    # With collinear columns (condition ~1e5) the covariance's entries near zero move with the order of
    # the float64 sums (seen on an H100: 3.5e-11 on entries of 5e-7 in a matrix whose largest is 0.2), in
    # the float64 path as well: they are compared at that scale.
    cov_atol = 1e-9 * float(np.abs(ref.cov_params()).max()) if kind == "collinear" else 1e-12
    assert_matches_statsmodels(model, ref, X, cov_atol)
    assert_matches_statsmodels(exact, ref, X, cov_atol)
    # the same optimum in (nearly) as many Newton steps: the last pass is made again in float64, and
    # cuBLAS's float32 sums took one more step than the float64 path at k=256 collinear on an H100
    assert exact.n_iter_ <= model.n_iter_ <= exact.n_iter_ + 1
    assert exact.n_passes_ + 1 <= model.n_passes_ <= exact.n_passes_ + 2
    np.testing.assert_allclose(model.coefficients_, exact.coefficients_, rtol=1e-9)
    np.testing.assert_allclose(model.std_err_, exact.std_err_, rtol=1e-9)


def test_wide_float32_input(device):
    X, y = wide(30_000, 64, "plain", seed=3, dtype=np.float32)
    ref = reference(X, y)
    model = fit(device, X, y)
    exact = fit(device, X, y, hessian="float64")
    assert model.n_approx_passes_ > 0 and model.n_iter_ == exact.n_iter_
    # float32 input takes float32 sigmoids (docs/ml.md), which move the optimum by a few 1e-7 at most
    np.testing.assert_allclose(model.coefficients_, ref.params, rtol=RTOL)
    np.testing.assert_allclose(model.std_err_, ref.bse, rtol=RTOL)
    # both stop where the float32 log-likelihood stops resolving changes: within float32 rounding
    np.testing.assert_allclose(model.coefficients_, exact.coefficients_, rtol=1e-6)


def test_badly_conditioned_fit_uses_float64_hessians(device):
    """Scaled condition far above what float32 Hessians serve: the first pass says so, and every pass
    is float64."""
    X, y = wide(20_000, 64, "plain", seed=4)
    X[:, 32:] = 0.3 * X[:, :32] + 1e-3 * X[:, 32:]  # scaled condition ~1e6
    ref = reference(X, y)
    model = fit(device, X, y)
    assert model.n_approx_passes_ == 0
    exact = fit(device, X, y, hessian="float64")
    assert np.array_equal(model.coefficients_, exact.coefficients_) and model.n_passes_ == exact.n_passes_
    # (the covariance's small off-diagonal entries of this conditioning differ from statsmodels' by
    # 1e-5 relative, in the float64 path too: the other statistics are checked)
    np.testing.assert_allclose(model.coefficients_, ref.params, rtol=RTOL)
    np.testing.assert_allclose(model.std_err_, ref.bse, rtol=RTOL)
    np.testing.assert_allclose(model.log_likelihood_, ref.llf, rtol=RTOL)


def test_forced_float32_hessians_still_reach_the_float64_answer(device, monkeypatch):
    """With the first pass's guard off, a condition where float32 Hessians slow Newton down: the
    solver's watch turns them off (or a non-definite one does), and the answer is the float64 one."""
    import pystrom.ml._irls as irls

    X, y = wide(20_000, 64, "plain", seed=4)
    X[:, 32:] = 0.3 * X[:, :32] + 1e-3 * X[:, 32:]
    ref = reference(X, y)
    exact = fit(device, X, y, hessian="float64")
    monkeypatch.setattr(irls, "APPROX_MAX_COND", np.inf)
    model = fit(device, X, y)
    assert model.n_approx_passes_ > 0
    assert model.n_iter_ <= exact.n_iter_ + 2
    np.testing.assert_allclose(model.coefficients_, ref.params, rtol=RTOL)
    np.testing.assert_allclose(model.std_err_, ref.bse, rtol=RTOL)
    np.testing.assert_allclose(model.coefficients_, exact.coefficients_, rtol=1e-9)
    # (H^-1 at a condition of 1e6 moves by 1e-5 relative between coefficients 1e-10 apart: not compared)


def test_wide_separation_still_warns(device):
    """Separated classes with 64 features: the float32 Hessians do not hide it."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(5_000, 64))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.float64)
    with pytest.warns(PerfectSeparationWarning):
        model = fit(device, X, y)
    assert model.separation_ == "complete" and not model.converged_


def test_wide_l2_and_weights(device):
    """Penalty, class and sample weights take the same path: float32 and float64 Hessians agree."""
    X, y = wide(10_000, 48, "plain", seed=6)
    sw = np.random.default_rng(6).random(len(y)) * 2
    for kw in ({"penalty": "l2", "C": 0.05}, {"class_weight": "balanced"}):
        with pystrom.defaults.set(logit_hessian="float32"):
            a = LogisticRegression(**kw).fit(on(device, X), on(device, y), sample_weight=on(device, sw))
        with pystrom.defaults.set(logit_hessian="float64"):
            b = LogisticRegression(**kw).fit(on(device, X), on(device, y), sample_weight=on(device, sw))
        assert a.n_approx_passes_ > 0 and a.n_iter_ == b.n_iter_
        np.testing.assert_allclose(a.coefficients_, b.coefficients_, rtol=1e-9, err_msg=str(kw))
        np.testing.assert_allclose(a.std_err_, b.std_err_, rtol=1e-9, err_msg=str(kw))


def test_wide_out_of_core_equals_in_memory(device):
    X, y = wide(12_000, 40, "plain", seed=7)
    names = [f"x{j}" for j in range(X.shape[1])]
    table = Table.from_arrays({n: X[:, j] for j, n in enumerate(names)} | {"y": y}, device="cpu")
    batches = [table.slice(s, 2_500) for s in range(0, table.num_rows, 2_500)]
    with pystrom.defaults.set(logit_hessian="float32"):  # "auto" is float64 on a GPU
        streamed = LogisticRegression(device=device).fit(batches, target="y")
    in_memory = fit(device, X, y)
    assert streamed.n_approx_passes_ > 0
    np.testing.assert_allclose(streamed.coefficients_, in_memory.coefficients_, rtol=1e-9)
    np.testing.assert_allclose(streamed.std_err_, in_memory.std_err_, rtol=1e-9)


def test_chunk_rows_do_not_change_the_fit(device):
    X, y = wide(9_000, 24, "plain", seed=8)
    ref = fit(device, X, y)
    for rows in (97, 777, 100_000):
        with pystrom.defaults.set(logit_chunk_rows=rows):
            model = fit(device, X, y)
        np.testing.assert_allclose(model.coefficients_, ref.coefficients_, rtol=1e-9, err_msg=f"rows={rows}")
        np.testing.assert_allclose(model.std_err_, ref.std_err_, rtol=1e-9, err_msg=f"rows={rows}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float32_hessian_pass_against_float64_twin(device, dtype):
    """One pass with the float32 Hessian (cuBLAS's ssyrk on a GPU, BLAS on the CPU) against the NumPy
    float64 pass: everything but the features' block of H equal to float64 rounding, that block to
    float32's."""
    from pystrom.memory.backend import resolve_device
    from pystrom.ml._pass import PassTotals, batch_pass, xp_pass

    rng = np.random.default_rng(9)
    backend = resolve_device(device)
    n, k = 50_001, 33
    X = np.asarray(rng.normal(size=(n, k)), dtype=dtype)
    X[:, 3] *= 50.0
    y = (rng.random(n) < 0.4).astype(np.uint8)
    sw = rng.random(n) * 2
    w = rng.normal(size=k + 1) * 0.1
    ref = PassTotals.unpack(xp_pass(np, X, y, sw, (0.7, 1.3), w), k)
    with backend.activate():
        got = batch_pass(backend, on(device, X), on(device, y), on(device, sw), (0.7, 1.3), w, "float32", 4096)
        vec = np.asarray(_host(got))
    t = PassTotals.unpack(vec, k)
    tight = {"rtol": 1e-6, "atol": 1e-9} if dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-10}
    np.testing.assert_allclose(t.gradient, ref.gradient, **tight)
    np.testing.assert_allclose(t.hessian[:, k], ref.hessian[:, k], **tight)
    np.testing.assert_allclose(t.log_likelihood, ref.log_likelihood, rtol=tight["rtol"])
    np.testing.assert_allclose(t.weight_sum, ref.weight_sum, rtol=1e-12)
    assert (t.nonfinite_rows, t.saturated_rows) == (0, ref.saturated_rows)
    assert t.min_margin == pytest.approx(ref.min_margin, rel=1e-12)  # the GPU's and NumPy's roundings
    # the float32 block: each entry within a few float32 ulps of sum |z_a z_b| times sqrt(rows a chunk)
    Z = np.abs(X.astype(np.float64)) * np.sqrt(np.abs(ref.hessian[k, k] / n))
    scale = Z.T @ Z
    err = np.abs(t.hessian[:k, :k] - ref.hessian[:k, :k])
    assert (err <= 2.0**-23 * 64 * np.sqrt(4096) * scale).all(), float((err / scale).max())
    assert np.array_equal(t.hessian[:k, :k], t.hessian[:k, :k].T)
    assert not np.array_equal(t.hessian[:k, :k], ref.hessian[:k, :k])  # float32 arithmetic really ran


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [9, 33, 300, 1100, 2100])
@pytest.mark.parametrize("weighted", [False, True])
def test_wide_kernels_against_the_numpy_twin(dtype, k, weighted, monkeypatch):
    """kernels/logistic_wide.cu (a warp per row, then a thread per feature, cuBLAS on the scaled rows)
    against xp_pass on NumPy: the float64 Hessian pass equal to float64 rounding, the float32 and TF32
    ones with everything but the features' block equal, that block within float32's (TF32's) rounding;
    for every shape of the fused kernel (1, 2, 8 features a thread; 256 and 1024 threads), in one chunk
    and in chunks that end inside a GEMM block (the blocks' sums then carry over launches)."""
    import cupy

    from pystrom.memory.backend import resolve_device
    from pystrom.ml import _wide
    from pystrom.ml._pass import PassTotals, xp_pass
    from pystrom.ml._wide import uses_wide, wide_pass

    rng = np.random.default_rng(k)
    backend = resolve_device("cuda")
    n = 70_003 if k < 1000 else 6_007
    X = np.asarray(rng.normal(size=(n, k)), dtype=dtype)
    X[:, 3] *= 50.0
    X[: n // 50, 5] = 30.0  # saturated rows
    y = (rng.random(n) < 0.4).astype(np.uint8)
    sw = rng.random(n) * 2 if weighted else None
    w = rng.normal(size=k + 1) * 0.1
    w[5] = 1.0
    ref = PassTotals.unpack(xp_pass(np, X, y, sw, (0.7, 1.3), w), k)
    tight = {"rtol": 1e-6, "atol": 1e-9} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}
    if dtype == np.float32:
        # float32 sigmoids (CUDA's expf against NumPy's, each within an ulp) move every row's r and
        # residual by ~2^-24 relative, independently: a feature's sums by ~sqrt(n) of that times its size
        rms = np.sqrt(np.mean(X.astype(np.float64) ** 2, axis=0))
        tight["atol"] = np.concatenate([2.0**-20 * np.sqrt(n) * rms, [2.0**-20 * np.sqrt(n)]])
    with backend.activate():
        dX, dy = cupy.asarray(X), cupy.asarray(y)
        dsw = cupy.asarray(sw) if weighted else None
        assert uses_wide(backend, dX) and not uses_wide(backend, dX[:, ::2])
        cases = [(h, u, z) for h, u in (("float64", 1e-12), ("float32", 2.0**-23), ("tf32", 2.0**-10))
                 for z in (_wide._Z_ELEMENTS, k * 5_000)]  # fmt: skip
        # rows k + 1 apart: the scalar kernel (16-byte vectors need rows of 16-byte multiples)
        padded = cupy.asarray(np.pad(X, ((0, 0), (0, 1))))[:, :k]
        assert _wide.WidePass(backend, dX, dy, None).vector == (k % (16 // X.itemsize) == 0)
        assert not _wide.WidePass(backend, padded, dy, None).vector
        for (hessian, rounding, z_elements), layout in itertools.product(cases, (dX, padded)):
            monkeypatch.setattr(_wide, "_Z_ELEMENTS", z_elements)
            t = PassTotals.unpack(wide_pass(backend, layout, dy, dsw, (0.7, 1.3), w, hessian).get(), k)
            for got, want in ((t.gradient, ref.gradient), (t.hessian[:, k], ref.hessian[:, k])):
                off = np.abs(got - want) - (tight["atol"] + tight["rtol"] * np.abs(want))
                assert (off <= 0).all(), (hessian, np.flatnonzero(off > 0)[:5], float(np.max(off)))
            np.testing.assert_allclose(t.log_likelihood, ref.log_likelihood, rtol=tight["rtol"])
            np.testing.assert_allclose(t.weight_sum, ref.weight_sum, rtol=1e-12)
            np.testing.assert_allclose(t.positive_weight, ref.positive_weight, rtol=1e-12)
            assert (t.nonfinite_rows, t.saturated_rows) == (0, ref.saturated_rows)
            assert t.min_margin == pytest.approx(ref.min_margin, rel=1e-6)
            scale = np.abs(X.astype(np.float64)).T @ (np.abs(X.astype(np.float64)) * (ref.hessian[k, k] / n))
            err = np.abs(t.hessian[:k, :k] - ref.hessian[:k, :k])
            # float32 input: each row's r carries its float32 sigmoid's rounding (CUDA's expf against
            # NumPy's, a few ulps, not always of random sign), in the float64 block too
            extra = 2.0**-21 if dtype == np.float32 else 0.0
            bound = (64 * rounding * np.sqrt(n) + extra) * scale + 1e-12
            assert (err <= bound).all(), (hessian, z_elements, float((err / scale).max()))
            assert np.array_equal(t.hessian, t.hessian.T)
        # a non-finite row is counted (the pass is then an error for the solver)
        dX[17, 2] = np.nan
        t = PassTotals.unpack(wide_pass(backend, dX, dy, dsw, (0.7, 1.3), w, "float32").get(), k)
        assert t.nonfinite_rows == 1


def test_settings_are_validated():
    with pytest.raises(ValueError, match="logit_hessian"):
        pystrom.defaults.set(logit_hessian="float16")
    with pytest.raises(ValueError, match="logit_chunk_rows"):
        pystrom.defaults.set(logit_chunk_rows=-1)
    from pystrom.ml._pass import xp_pass

    with pytest.raises(ValueError, match="hessian"):
        xp_pass(np, np.zeros((2, 9)), np.zeros(2), None, (1.0, 1.0), np.zeros(10), hessian="half")


def test_reduced_precision_guard_scales_with_the_rounding(monkeypatch):
    """TF32 reports a coarser rounding than float32, and the first pass's guard then admits only
    better-conditioned problems; on a GPU "auto" offers TF32 then float32, the CPU float32 only."""
    from pystrom.memory.backend import resolve_device
    from pystrom.ml._irls import IRLSSolver
    from pystrom.ml._pass import reduced_hessians

    class FakeCuda:
        kind = "cuda"

    f32, tf32 = ("float32", 2.0**-24), ("tf32", 2.0**-17)
    monkeypatch.setenv("CUPY_TF32", "0")
    assert reduced_hessians(FakeCuda(), "auto") == (tf32, f32)
    assert reduced_hessians(FakeCuda(), "float32") == (f32,)
    assert reduced_hessians(FakeCuda(), "tf32") == (tf32,)
    assert reduced_hessians(FakeCuda(), "float64") == ()
    for mode in ("auto", "float32", "tf32"):
        assert reduced_hessians(resolve_device("cpu"), mode) == (f32,)
    monkeypatch.setenv("CUPY_TF32", "1")  # CuPy's float32 products are TF32 then
    assert reduced_hessians(FakeCuda(), "float32") == (tf32,)
    H = np.diag([1.0, 1.0, 1.0])
    H[0, 1] = H[1, 0] = 0.999  # scaled condition ~2000 (pivots' estimate ~500)
    for unit, allowed in ((2.0**-24, True), (2.0**-17, False)):
        solver = IRLSSolver(lambda w, exact=True: None, 2, True, 0.0, 10, 1e-8, approximate=unit)
        solver.active = np.arange(3)
        assert solver.allow_approximate(H) is allowed
    # offered both, the solver takes the cheapest the guard admits: float32 here, TF32 when well conditioned
    evaluations = []

    def evaluate(w, exact=True, rounding=0.0):
        evaluations.append(0.0 if exact else rounding)
        t = PassTotals(H.copy(), np.zeros(3), -1.0, 1.0, 0.5, 0, 0, -1.0)
        t.exact_hessian = exact
        return t

    for hessian, want in ((H, 2.0**-24), (np.eye(3), 2.0**-17)):
        H = hessian
        evaluations.clear()
        solver = IRLSSolver(evaluate, 2, True, 0.0, 2, 0.0, approximate=(2.0**-17, 2.0**-24))
        solver.solve()
        assert evaluations[0] == 0.0 and set(evaluations[1:-1]) == {want}, evaluations


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wide_speculative_passes_are_the_passes_asked_for(dtype, monkeypatch):
    """WidePass under a step rule: each pass solves its Newton step on the device (cuSOLVER) as the
    solver would on the host (free subset, l2), queues the pass at w + step, and the requests for
    exactly those weights claim it (the same sums, bit for bit, as a pass launched for them); other
    requests get their own pass; a Hessian that is not positive definite gives no step; and a whole fit
    through them equals the fit whose steps the host solved."""
    from pystrom.memory.backend import resolve_device
    from pystrom.ml._irls import IRLSSolver
    from pystrom.ml._sources import ArraySource
    from pystrom.ml._wide import WidePass

    backend = resolve_device("cuda")
    X, y = wide(40_000, 30, "plain", seed=11, dtype=dtype)
    X[:, 7] = 0.0  # a column that makes X^T A X singular when it is free
    with backend.activate():
        import cupy

        Xd, yd = cupy.asarray(X), cupy.asarray(y.astype(np.uint8))
        wp = WidePass(backend, Xd, yd, None, to_host=True)
        plain = WidePass(backend, Xd, yd, None, to_host=True)
        active = np.array([j for j in range(31) if j != 7])
        for l2 in (0.0, 0.3):
            wp.plan(active, 29, l2)
            solver = IRLSSolver(lambda w: None, 30, True, l2, 10, 0.0)
            solver._set_free(active)
            w, before = np.zeros(31), wp.hits
            for i in range(6):
                hessian = "float64" if i == 0 else "tf32"
                vec, step = wp((1.0, 1.0), w, hessian, "tf32")
                assert np.array_equal(vec, plain((1.0, 1.0), w, hessian)[0]), (l2, i)
                t = PassTotals.unpack(vec, 30)
                want, _ = solver.newton_direction(w, t)
                assert step is not None and step[7] == 0.0
                np.testing.assert_allclose(step, want, rtol=1e-9, atol=1e-12)
                w = w + (step if i % 3 != 2 else 0.5 * step)  # every third request is not the queued pass
            assert wp.hits - before == 4, (l2, wp.hits)
        wp.plan(np.arange(31), 30, 0.0)  # column 7 free: not positive definite
        assert wp((1.0, 1.0), np.zeros(31), "float64")[1] is None
        wp.close()
        # whole fits, with the device's steps and speculation against the host's steps
        fits = []
        for speculate in (True, False):
            with monkeypatch.context() as m:
                if not speculate:
                    m.setattr(ArraySource, "plan_steps", lambda self, *args: None)
                with pystrom.defaults.set(logit_hessian="auto"):
                    fits.append(LogisticRegression(max_iter=30, tol=1e-10).fit(Xd, yd))
        np.testing.assert_allclose(fits[0].coef_, fits[1].coef_, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fits[0].std_err_, fits[1].std_err_, rtol=1e-9)
        assert fits[0].n_iter_ == fits[1].n_iter_ and fits[0].n_passes_ == fits[1].n_passes_
        assert len(fits[0].aliased_) == 1


@pytest.mark.gpu
@needs_gpu
def test_statistics_on_the_gpu_equal_numpys():
    """Many parameters: a GPU fit inverts its Hessian and takes its eigenvalues with CuPy (cuSOLVER);
    the statistics equal NumPy's to rounding, and a Hessian that is not positive definite takes the
    same fallback (the pseudo-inverse) on both."""
    import cupy

    from pystrom.ml._stats import GPU_STATISTICS_FROM, compute_statistics

    rng = np.random.default_rng(3)
    p = GPU_STATISTICS_FROM + 37
    A = rng.normal(size=(4 * p, p))
    w = rng.normal(size=p)
    singular = A.T @ A
    singular[-1, :] = singular[:, -1] = 0.0  # a zero pivot: Cholesky refuses it on both
    for H in (A.T @ A, singular):
        host = compute_statistics(w, H, -12.5)
        gpu = compute_statistics(w, H, -12.5, xp=cupy)
        for name in ("std_err", "z_stats", "p_values", "odds_ratios", "variance_covariance"):
            np.testing.assert_allclose(getattr(gpu, name), getattr(host, name), rtol=1e-9, atol=1e-12, err_msg=name)
        assert gpu.condition_no == pytest.approx(host.condition_no, rel=1e-9)
