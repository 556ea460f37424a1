"""pystrom.ml.LogisticRegression against statsmodels and scikit-learn on real data, on every device."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest
from test_logistic_kernel import assert_pass_close

import pystrom
from pystrom import Table
from pystrom.ml import (
    ConvergenceWarning,
    LogisticRegression,
    PerfectSeparationWarning,
    logregr_predict,
    logregr_predict_prob,
    logregr_train,
)

sm = pytest.importorskip("statsmodels.api")
datasets = pytest.importorskip("sklearn.datasets")

RTOL = 1e-6


def breast_cancer() -> tuple[np.ndarray, np.ndarray, list[str]]:
    d = datasets.load_breast_cancer()
    cols = [0, 1, 4, 6]  # mean radius, texture, smoothness, concavity: not separable, well conditioned
    X = d.data[:, cols]
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X, d.target.astype(np.float64), [str(d.feature_names[c]).replace(" ", "_") for c in cols]


def spector() -> tuple[np.ndarray, np.ndarray, list[str]]:
    data = sm.datasets.spector.load_pandas()
    return data.exog.to_numpy(np.float64), data.endog.to_numpy(np.float64), list(data.exog.columns)


def seed_data(n: int, noise: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The seed's workload: t = 1 + 2 x1 - 3 x2 + x3 + 0.5 x4 > 0 (perfectly separable unless labels are flipped)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4)).astype(np.float32)
    t = 1 + 2 * X[:, 0] - 3 * X[:, 1] + X[:, 2] + 0.5 * X[:, 3] > 0
    if noise:
        t ^= rng.random(n) < noise
    return X, t


def on(device: str, a: np.ndarray):
    if device == "cpu":
        return a
    import cupy

    return cupy.asarray(a)


def statsmodels_fit(X: np.ndarray, y: np.ndarray, **kw):
    return sm.Logit(y, sm.add_constant(X)).fit(disp=0, tol=1e-12, maxiter=100, **kw)


def assert_matches_statsmodels(model: LogisticRegression, ref, X: np.ndarray, cov_atol: float = 1e-12) -> None:
    np.testing.assert_allclose(model.coefficients_, ref.params, rtol=RTOL)
    np.testing.assert_allclose(model.intercept_[0], ref.params[0], rtol=RTOL)
    np.testing.assert_allclose(model.coef_[0], ref.params[1:], rtol=RTOL)
    np.testing.assert_allclose(model.std_err_, ref.bse, rtol=RTOL)
    np.testing.assert_allclose(model.z_stats_, ref.tvalues, rtol=RTOL)
    np.testing.assert_allclose(model.p_values_, ref.pvalues, rtol=RTOL)
    np.testing.assert_allclose(model.odds_ratios_, np.exp(ref.params), rtol=RTOL)
    np.testing.assert_allclose(model.log_likelihood_, ref.llf, rtol=RTOL)
    np.testing.assert_allclose(model.variance_covariance_, ref.cov_params(), rtol=RTOL, atol=cov_atol)
    H = -ref.model.hessian(ref.params)  # X^T A X at statsmodels' solution
    # MADlib's condition_no: sqrt(lambda_max / lambda_min) of X^T A X (its install check: sqrt(106329))
    np.testing.assert_allclose(model.condition_no_, np.sqrt(np.linalg.cond(H)), rtol=RTOL)
    assert model.converged_ and model.separation_ is None
    assert model.num_rows_processed_ == X.shape[0] and model.num_missing_rows_skipped_ == 0


@pytest.mark.parametrize("data", [breast_cancer, spector])
@pytest.mark.parametrize("order", ["C", "F"])
def test_matches_statsmodels(device, data, order):
    X, y, _ = data()
    ref = statsmodels_fit(X, y)
    model = LogisticRegression().fit(on(device, np.asarray(X, order=order)), on(device, y))
    assert model.device_.startswith(device)
    assert_matches_statsmodels(model, ref, X)


def test_many_features_path_matches_statsmodels(device):
    """More features than the fused kernel specialises (the chunked cuBLAS / NumPy path)."""
    d = datasets.load_breast_cancer()
    X = d.data[:, :12]
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    y = d.target.astype(np.float64)
    model = LogisticRegression(penalty="l2", C=0.5, tol=1e-12).fit(on(device, X), on(device, y))
    from sklearn.linear_model import LogisticRegression as SkLR

    ref = SkLR(C=0.5, tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(model.coef_, ref.coef_, rtol=1e-5)
    np.testing.assert_allclose(model.intercept_, ref.intercept_, rtol=1e-5)


@pytest.mark.parametrize("C", [0.01, 1.0, 100.0])
def test_l2_matches_sklearn(device, C):
    from sklearn.linear_model import LogisticRegression as SkLR

    X, y, _ = breast_cancer()
    ref = SkLR(C=C, tol=1e-12, max_iter=10_000).fit(X, y)
    model = LogisticRegression(penalty="l2", C=C).fit(on(device, X), on(device, y))
    np.testing.assert_allclose(model.coef_, ref.coef_, rtol=1e-5)
    np.testing.assert_allclose(model.intercept_, ref.intercept_, rtol=1e-5)
    assert model.converged_
    np.testing.assert_allclose(_host(model.predict_proba(on(device, X))), ref.predict_proba(X), rtol=1e-5, atol=1e-9)


def test_class_weight_matches_sklearn(device):
    from sklearn.linear_model import LogisticRegression as SkLR

    X, y, _ = breast_cancer()
    sw = np.random.default_rng(7).random(len(y)) * 3
    for cw in [{0.0: 3.0, 1.0: 0.5}, "balanced"]:
        for weights in (None, sw):
            ref = SkLR(C=2.0, tol=1e-12, max_iter=10_000, class_weight=cw).fit(X, y, sample_weight=weights)
            model = LogisticRegression(penalty="l2", C=2.0, class_weight=cw)
            model.fit(on(device, X), on(device, y), sample_weight=None if weights is None else on(device, weights))
            np.testing.assert_allclose(model.coef_, ref.coef_, rtol=1e-5)
            np.testing.assert_allclose(model.intercept_, ref.intercept_, rtol=1e-5)
    # the same through a scan with a weight column
    names = ["a", "b", "c", "d"]
    arrays = {n: X[:, j] for j, n in enumerate(names)} | {"y": y > 0, "w": sw}
    table = Table.from_arrays(arrays, device=device)
    ref = SkLR(C=2.0, tol=1e-12, max_iter=10_000, class_weight="balanced").fit(X, y, sample_weight=sw)
    model = LogisticRegression(penalty="l2", C=2.0, class_weight="balanced")
    model.fit([table.slice(0, 200), table.slice(200)], sample_weight="w", columns=names, target="y")
    np.testing.assert_allclose(model.coef_, ref.coef_, rtol=1e-5)


def test_sample_weight_equals_repeated_rows(device):
    X, y, _ = spector()
    reps = np.arange(len(y)) % 3 + 1
    ref = statsmodels_fit(np.repeat(X, reps, axis=0), np.repeat(y, reps))
    model = LogisticRegression().fit(on(device, X), on(device, y), sample_weight=on(device, reps.astype(float)))
    np.testing.assert_allclose(model.coefficients_, ref.params, rtol=RTOL)
    np.testing.assert_allclose(model.std_err_, ref.bse, rtol=RTOL)
    np.testing.assert_allclose(model.log_likelihood_, ref.llf, rtol=RTOL)


def test_seed_separable_data_warns_instead_of_running_away(device):
    X, t = seed_data(20_000)
    with pytest.warns(PerfectSeparationWarning, match="penalty='l2'"):
        model = LogisticRegression().fit(on(device, X), on(device, t))
    assert model.converged_ is False
    assert model.separation_ in ("complete", "quasi-complete")
    assert "separation" in str(model.summary())
    # MADlib's 20 iterations: still a warning, never a silent runaway result
    table = Table.from_arrays({"x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2], "x4": X[:, 3], "t": t}, device=device)
    with pytest.warns(PerfectSeparationWarning):
        model = logregr_train(table, "t", "ARRAY[1, x1, x2, x3, x4]")
    assert model.converged_ is False
    # penalised: the optimum exists, finite and converged, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = LogisticRegression(penalty="l2", C=1.0).fit(on(device, X), on(device, t))
    assert model.converged_ and np.isfinite(model.coef_).all()
    # the direction is the seed's hyperplane
    direction = model.coef_[0] / model.coef_[0, 0]
    np.testing.assert_allclose(direction, [1, -1.5, 0.5, 0.25], rtol=0.05)


def test_quasi_complete_separation_warns(device):
    rng = np.random.default_rng(3)
    x = rng.normal(size=400)
    x[:40] = 0.0  # both classes at x = 0, perfectly split elsewhere
    y = (x > 0).astype(float)
    y[:20] = 1.0
    X = np.column_stack([x, rng.normal(size=400)])
    with pytest.warns(PerfectSeparationWarning):
        model = LogisticRegression(max_iter=50).fit(on(device, X), on(device, y))
    assert model.converged_ is False


def test_noisy_seed_converges_and_float32_is_not_upcast(device):
    X32, t = seed_data(50_000, noise=0.1)
    m32 = LogisticRegression().fit(on(device, X32), on(device, t))
    m64 = LogisticRegression().fit(on(device, X32.astype(np.float64)), on(device, t))
    assert m32.converged_ and m64.converged_
    # the same float32 values read as float32 or as float64: the float32 pass takes its sigmoids and
    # logs in float32 (sums stay float64), which moves the fit by a few 1e-9 here
    np.testing.assert_allclose(m32.coefficients_, m64.coefficients_, rtol=1e-7)
    assert not np.array_equal(m32.coefficients_, m64.coefficients_)  # float32 arithmetic really ran
    # at the optimum the float32 log-likelihood only jitters: the line search must not halve the step
    # over and over on that (without its allowance for float32 rounding this took 186 passes)
    with pytest.warns(ConvergenceWarning):
        m20 = LogisticRegression(max_iter=20, tol=0.0).fit(on(device, X32), on(device, t))
    assert (m20.n_iter_, m20.n_passes_) == (20, 21)
    np.testing.assert_allclose(m20.coefficients_, m32.coefficients_, rtol=1e-6)
    ref = statsmodels_fit(X32.astype(np.float64), t.astype(float))
    np.testing.assert_allclose(m32.coefficients_, ref.params, rtol=RTOL)


def _table(device: str, X: np.ndarray, y: np.ndarray, names: list[str], nulls: dict | None = None) -> Table:
    arrays = {n: pa.array(X[:, j]) for j, n in enumerate(names)}
    arrays["y"] = pa.array(y.astype(bool))
    for name, rows in (nulls or {}).items():
        values = arrays[name].to_pylist()
        for r in rows:
            values[r] = None
        arrays[name] = pa.array(values, type=arrays[name].type)
    return Table.from_arrow(pa.table(arrays), device=device)


def test_table_input_and_null_rows_skipped(device):
    X, y, names = breast_cancer()
    ref = statsmodels_fit(X, y)
    table = _table(device, X, y, names)
    model = LogisticRegression().fit(table, target="y")
    assert list(model.feature_names_in_) == names
    assert_matches_statsmodels(model, ref, X)
    # NULLs in a feature and in the target: those rows are skipped and counted (MADlib's rule)
    bad = {names[1]: [3, 50, 51], "y": [7, 50]}
    table = _table(device, X, y, names, nulls=bad)
    keep = np.ones(len(y), bool)
    keep[[3, 50, 51, 7]] = False
    model = LogisticRegression().fit(table, columns=names, target="y")
    assert model.num_missing_rows_skipped_ == 4 and model.num_rows_processed_ == keep.sum()
    ref = statsmodels_fit(X[keep], y[keep])
    np.testing.assert_allclose(model.coefficients_, ref.params, rtol=RTOL)
    np.testing.assert_allclose(model.std_err_, ref.bse, rtol=RTOL)
    # predictions from a Table use the fitted columns
    full = _table(device, X, y, names)
    np.testing.assert_array_equal(_host(model.predict(full)), _host(model.predict(on(device, X))).astype(bool))


class Scan:
    """A re-iterable of Tables: every iteration starts the scan again (as pystrom.scan_arrow will)."""

    def __init__(self, table: Table, rows: int):
        self.table, self.rows, self.iterations = table, rows, 0

    def __iter__(self):
        self.iterations += 1
        for start in range(0, self.table.num_rows, self.rows):
            yield self.table.slice(start, self.rows)


def test_out_of_core_equals_in_memory(device):
    X, t = seed_data(30_000, noise=0.15, seed=5)
    X = X.astype(np.float64)
    names = ["x1", "x2", "x3", "x4"]
    table = _table("cpu", X, t.astype(float), names)  # batches on the host, moved to the device per batch
    in_memory = LogisticRegression().fit(on(device, X), on(device, t))
    scan = Scan(table, 997)
    streamed = LogisticRegression(device=device).fit(scan, target="y")
    assert streamed.device_.startswith(device)
    assert scan.iterations == streamed.n_passes_ + 1  # +1: the first batch is looked at to learn the shape
    np.testing.assert_allclose(streamed.coefficients_, in_memory.coefficients_, rtol=1e-9)
    np.testing.assert_allclose(streamed.std_err_, in_memory.std_err_, rtol=1e-9)
    np.testing.assert_allclose(streamed.log_likelihood_, in_memory.log_likelihood_, rtol=1e-9)
    assert streamed.num_rows_processed_ == 30_000
    # a list of Tables is re-iterable too; predictions concatenate over the batches
    batches = list(Scan(table, 4096))
    listed = LogisticRegression(device=device).fit(batches, target="y")
    np.testing.assert_allclose(listed.coefficients_, in_memory.coefficients_, rtol=1e-9)
    p = _host(listed.predict_proba(batches))
    np.testing.assert_allclose(p, _host(in_memory.predict_proba(on(device, X))), rtol=1e-7, atol=1e-12)


def test_fit_on_scan_arrow(device, tmp_path):
    """pystrom.scan_arrow is re-iterable: every IRLS pass reads the file again, a group of batches at a time."""
    X, t = seed_data(20_000, noise=0.15, seed=9)
    X = X.astype(np.float64)
    names = ["x1", "x2", "x3", "x4"]
    path = tmp_path / "seed.arrow"
    pystrom.write_arrow(_table("cpu", X, t.astype(float), names), path, batch_rows=1000)
    in_memory = LogisticRegression().fit(on(device, X), on(device, t))
    scan = pystrom.scan_arrow(path, batch_rows=3000, device=device)
    streamed = LogisticRegression().fit(scan, target="y")
    np.testing.assert_allclose(streamed.coefficients_, in_memory.coefficients_, rtol=1e-9)
    np.testing.assert_allclose(streamed.std_err_, in_memory.std_err_, rtol=1e-9)
    assert streamed.num_rows_processed_ == 20_000 and streamed.device_.startswith(device)
    # a filtered scan fits the rows that match (where= needs the expression compiler, pystrom.expr)
    import importlib.util

    if importlib.util.find_spec("pystrom.expr") is None:
        return
    keep = X[:, 0] > 0
    ref = LogisticRegression().fit(on(device, X[keep]), on(device, t[keep]))
    filtered = LogisticRegression().fit(pystrom.scan_arrow(path, where="x1 > 0", device=device), target="y")
    np.testing.assert_allclose(filtered.coefficients_, ref.coefficients_, rtol=1e-9)
    assert filtered.num_rows_processed_ == keep.sum()


def test_out_of_core_separable_and_nulls(device):
    X, t = seed_data(5000)
    names = ["x1", "x2", "x3", "x4"]
    table = _table(device, X, t.astype(float), names, nulls={"x2": [10, 4000]})
    with pytest.warns(PerfectSeparationWarning):
        model = LogisticRegression().fit(Scan(table, 512), target="y")
    assert model.num_missing_rows_skipped_ == 2 and model.converged_ is False


def test_one_shot_iterator_is_refused():
    X, t = seed_data(100)
    table = _table("cpu", X, t.astype(float), ["a", "b", "c", "d"])
    with pytest.raises(TypeError, match="one-shot iterator"):
        LogisticRegression().fit(iter([table]), target="y")
    with pytest.raises(pystrom.DataError, match="no batches"):
        LogisticRegression().fit(_EmptyScan(), target="y")


class _BrokenScan:
    """Yields good batches, then fails the way a scan can: a bad batch, or an error while reading."""

    def __init__(self, good: list, bad):
        self.good, self.bad = good, bad

    def __iter__(self):
        yield from self.good
        if isinstance(self.bad, Exception):
            raise self.bad
        yield self.bad


def test_scan_errors_propagate_and_leave_no_thread(device):
    import threading

    X, t = seed_data(3000, noise=0.2)
    names = ["x1", "x2", "x3", "x4"]
    table = _table(device, X, t.astype(float), names)
    good = [table.slice(0, 1000), table.slice(1000, 1000)]
    other = Table.from_arrays({"x1": np.zeros(3), "y": np.array([True, False, True])}, device=device)
    cases = [
        (OSError("disk went away"), OSError, "disk went away"),
        (other, pystrom.ColumnNotFoundError, "x2"),
        ("not a table", pystrom.UnsupportedTypeError, "yielded a str"),
    ]
    for bad, exc, match in cases:
        with pytest.raises(exc, match=match):
            LogisticRegression(device=device).fit(_BrokenScan(good, bad), columns=names, target="y")
    with pytest.raises(pystrom.UnsupportedTypeError, match="first item is a int"):
        LogisticRegression().fit(_BrokenScan([], 5), target="y")
    assert not [th for th in threading.enumerate() if th.name == "pystrom-prefetch"]
    # a scan whose batches are views of one device table, columns of mixed types (int, bool, float32)
    mixed = Table.from_arrays(
        {"a": (X[:, 0] * 3).astype(np.int32), "b": X[:, 1] > 0, "c": X[:, 2], "y": t}, device=device
    )
    ref = LogisticRegression().fit(np.column_stack([(X[:, 0] * 3).astype(np.int32), X[:, 1] > 0, X[:, 2]]), t)
    for data in (mixed, [mixed.slice(0, 1234), mixed.slice(1234)]):
        model = LogisticRegression().fit(data, target="y")
        np.testing.assert_allclose(model.coefficients_, ref.coefficients_, rtol=1e-9)


class _EmptyScan:
    def __iter__(self):
        return iter(())


def test_kernel_equals_numpy_twin(device):
    """The fused CUDA pass against its NumPy twin, on fresh random data of every supported shape."""
    from pystrom.memory.backend import resolve_device
    from pystrom.ml._pass import MAX_KERNEL_FEATURES, batch_pass, xp_pass

    rng = np.random.default_rng()
    backend = resolve_device(device)
    for k in range(1, MAX_KERNEL_FEATURES + 2):
        for dtype in (np.float32, np.float64):
            for order in ("C", "F", "C shifted"):
                n = int(rng.integers(1, 5000))
                X = np.asarray(rng.normal(size=(n, k)), dtype=dtype, order=order[0])
                y = (rng.random(n) < 0.4).astype(np.uint8)
                sw = rng.random(n) * 2 if k % 2 else None
                w = rng.normal(size=k + 1) * 0.5
                ref = xp_pass(np, X, y, sw, (0.7, 1.3), w)
                with backend.activate():
                    Xd = on(device, X)
                    if order == "C shifted":  # rows one element past an aligned address: no vector loads
                        buf = on(device, np.zeros(n * k + 1, dtype=dtype))
                        buf[1:] = Xd.ravel()
                        Xd = buf[1:].reshape(n, k)
                    got = batch_pass(backend, Xd, on(device, y), None if sw is None else on(device, sw),
                                     (0.7, 1.3), w)  # fmt: skip
                assert_pass_close(_host(got), ref, dtype, n, f"k={k} {dtype} {order}")


def test_unweighted_passes_run_their_own_build_with_the_same_sums(device):
    """A pass with no sample weights and class weights 1 runs the LOGIT_UNWEIGHTED build; its sums equal
    the weighted build's (given weights of 1) bit for bit, and other class weights in the same KernelPass
    get the weighted build."""
    if device == "cpu":
        pytest.skip("the fused CUDA pass only")
    from pystrom.memory.backend import resolve_device
    from pystrom.ml._narrow import KernelPass, PartsPass
    from pystrom.ml._pass import xp_pass

    rng = np.random.default_rng()
    backend = resolve_device(device)
    for dtype, k in ((np.float32, 4), (np.float64, 3), (np.float32, 7)):
        X = rng.normal(size=(300_007, k)).astype(dtype)
        X[11, 0] = np.nan
        y = (rng.random(len(X)) < 0.3).astype(np.uint8)
        w = rng.normal(size=k + 1) * 0.5
        with backend.activate():
            Xd, yd = on(device, X), on(device, y)
            plain = KernelPass(Xd, yd, None, backend.ordinal, to_host=True)
            ones = KernelPass(Xd, yd, on(device, np.ones(len(X))), backend.ordinal, to_host=True)
            got, _ = plain((1.0, 1.0), w)
            assert set(plain._builds) == {True}, "an unweighted pass builds only the unweighted kernels"
            want, _ = ones((1.0, 1.0), w)
            assert set(ones._builds) == {False}
            assert np.array_equal(got, want), f"{dtype.__name__} k={k}"
            weighted, _ = plain((0.7, 1.3), w)
            assert set(plain._builds) == {True, False}
            assert_pass_close(weighted, xp_pass(np, X, y, None, (0.7, 1.3), w), dtype, len(X), "class weights")
            assert np.array_equal(plain((1.0, 1.0), w)[0], got), "back to the unweighted build"
            # a dask worker's partitions in one launch (PartsPass) switch builds the same way
            parts = [(Xd[:100_000], yd[:100_000], None), (Xd[100_000:], yd[100_000:], None)]
            fused = PartsPass(parts, backend.ordinal)
            sums = fused((1.0, 1.0), w)
            assert set(fused._builds) == {True}, "the parts' unweighted build only"
            assert fused.build((1.0, 1.0)).step_fn is not None, "with its gather step (dask/_chain.py)"
            assert_pass_close(sums, xp_pass(np, X, y, None, (1.0, 1.0), w), dtype, len(X), "parts")
            ones = PartsPass([(X_, y_, on(device, np.ones(len(y_)))) for X_, y_, _ in parts], backend.ordinal)
            assert np.array_equal(ones((1.0, 1.0), w), sums), "parts: bit for bit"
            assert set(ones._builds) == {False}, "sample weights: the weighted build"
            parted = fused((0.7, 1.3), w)
            assert set(fused._builds) == {True, False}
            assert_pass_close(parted, xp_pass(np, X, y, None, (0.7, 1.3), w), dtype, len(X), "parts, class weights")


def test_kernel_pass_to_host_repeats_exactly(device):
    """The in-memory pass (result written by the last block straight into mapped pinned memory) equals
    the device-result pass bit for bit, launch after launch (the block counter resets itself)."""
    if device == "cpu":
        pytest.skip("the fused CUDA pass only")
    from pystrom.memory.backend import resolve_device
    from pystrom.ml._narrow import KernelPass, kernel_pass

    rng = np.random.default_rng()
    backend = resolve_device(device)
    X = rng.normal(size=(200_003, 4)).astype(np.float32)
    y = (rng.random(len(X)) < 0.3).astype(np.uint8)
    with backend.activate():
        Xd, yd = on(device, X), on(device, y)
        kp = KernelPass(Xd, yd, None, backend.ordinal, to_host=True)
        w = np.array([0.3, -0.2, 0.1, 0.0, 0.5])
        first, step = kp((1.0, 1.0), w)
        assert np.isfinite(first).all() and step is None  # no step rule planned: no step, no speculation
        for _ in range(3):
            assert np.array_equal(kp((1.0, 1.0), w)[0], first)
        assert np.array_equal(_host(kernel_pass(Xd, yd, None, (1.0, 1.0), w, backend.ordinal)), first)
        other, _ = kp((1.0, 1.0), -w)  # new weights really reach the kernel
        assert not np.array_equal(other, first)
        assert_pass_close(other, xp_pass_ref(X, y, -w), np.float32, len(X), "weights -w")


def test_one_launch_over_several_arrays_equals_the_twin(device):
    """PartsPass (a dask worker's partitions in one launch): arrays of mixed layouts, lengths and weights
    give the sums of the NumPy twin over their rows stacked, launch after launch, with new weights."""
    if device == "cpu":
        pytest.skip("the fused CUDA pass only")
    from pystrom.memory.backend import resolve_device
    from pystrom.ml._narrow import PartsPass
    from pystrom.ml._pass import xp_pass

    rng = np.random.default_rng()
    backend = resolve_device(device)
    for k in (1, 4, 7):
        for dtype in (np.float32, np.float64):
            host, parts = [], []
            with backend.activate():
                for n, order, weighted in ((100_003, "C", False), (0, "C", True), (7_777, "F", True), (1, "C", True),
                                           (65_536, "shifted", False)):  # fmt: skip
                    X = np.asarray(rng.normal(size=(n, k)), dtype=dtype, order="F" if order == "F" else "C")
                    y = (rng.random(n) < 0.4).astype(np.uint8)
                    sw = rng.random(n) * 2 if weighted else None
                    Xd = on(device, X)
                    if order == "shifted":
                        buf = on(device, np.zeros(n * k + 1, dtype=dtype))
                        buf[1:] = Xd.ravel()
                        Xd = buf[1:].reshape(n, k)
                    host.append((X, y, sw if weighted else np.ones(n)))
                    parts.append((Xd, on(device, y), None if sw is None else on(device, sw)))
                fused = PartsPass(parts, backend.ordinal)
                X, y, sw = (np.concatenate([h[i] for h in host]) for i in range(3))
                for w in (rng.normal(size=k + 1) * 0.5, rng.normal(size=k + 1)):
                    want = xp_pass(np, X, y, sw, (0.7, 1.3), w)
                    got = fused((0.7, 1.3), w)
                    assert_pass_close(got, want, dtype, len(y), f"k={k} {dtype.__name__}")
                    assert np.array_equal(fused((0.7, 1.3), w), got), "the block counter resets: same sums again"


def test_speculative_passes_are_the_passes_asked_for(device, monkeypatch):
    """With a step rule planned, each pass queues the pass at w + its own step; the solver's full steps
    claim those (same sums, bit for bit, as a pass launched for them), any other request gets a pass of
    its own, and a fit through them equals the fit without speculation."""
    if device == "cpu":
        pytest.skip("the fused CUDA pass only")
    from pystrom.memory.backend import resolve_device
    from pystrom.ml._narrow import KernelPass
    from pystrom.ml._pass import PassTotals
    from pystrom.ml._sources import ArraySource

    backend = resolve_device(device)
    X, y = seed_data(300_001, noise=0.1)
    X = X.astype(np.float32)  # the seed's case: its speculative kernel must not spill (_Build.spec_ok)
    with backend.activate():
        Xd, yd = on(device, X), on(device, y.astype(np.uint8))
        kp = KernelPass(Xd, yd, None, backend.ordinal, to_host=True)
        plain = KernelPass(Xd, yd, None, backend.ordinal, to_host=True)
        assert kp.build((1.0, 1.0)).spec_ok
        kp.plan(np.arange(5), 4, 0.0)
        w = np.zeros(5)
        for i in range(6):
            vec, step = kp((1.0, 1.0), w)
            assert np.array_equal(vec, plain((1.0, 1.0), w)[0]), f"pass {i}"
            assert step is not None
            want = np.linalg.solve(PassTotals.unpack(vec, 4).hessian, PassTotals.unpack(vec, 4).gradient)
            np.testing.assert_allclose(step, want, rtol=1e-9, atol=1e-12)
            w = w + (step if i % 3 != 2 else 0.5 * step)  # every third request is not the queued pass
        assert kp.hits == 4 and kp.speculated == 6, (kp.hits, kp.speculated)
        kp.close()
        # a whole fit: the same coefficients as without the GPU's steps (rounding apart)
        fits = []
        for speculate in (True, False):
            with monkeypatch.context() as m:
                if not speculate:
                    m.setattr(ArraySource, "plan_steps", lambda self, *args: None)
                fits.append(LogisticRegression(max_iter=30, tol=1e-10).fit(Xd, yd))
        np.testing.assert_allclose(fits[0].coef_, fits[1].coef_, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fits[0].std_err_, fits[1].std_err_, rtol=1e-9)
        assert fits[0].n_iter_ == fits[1].n_iter_ and fits[0].n_passes_ == fits[1].n_passes_


def xp_pass_ref(X, y, w):
    from pystrom.ml._pass import xp_pass

    return xp_pass(np, X, y, None, (1.0, 1.0), w)


def test_logregr_functions(device):
    X, y, names = spector()
    table = _table(device, X, y, names)
    model = logregr_train(table, "y", ["1"] + names, max_iter=20, tol=1e-4)
    ref = statsmodels_fit(X, y)
    np.testing.assert_allclose(model.coefficients_, ref.params, rtol=1e-3)  # MADlib's loose default tol=1e-4
    assert model.coefficients_[0] == model.intercept_[0]
    prob = _host(logregr_predict_prob(model, table))
    np.testing.assert_allclose(prob, _host(model.predict_proba(table))[:, 1])
    np.testing.assert_array_equal(_host(logregr_predict(model, table)), prob > 0.5)
    # MADlib style: a coefficient array (intercept first) and the independent columns
    np.testing.assert_allclose(_host(logregr_predict_prob(model.coefficients_, table, names)), prob, rtol=1e-12)
    text = str(model.summary())
    for word in ["intercept", *names, "std_err", "p_values", "log-likelihood", "condition number"]:
        assert word in text
    assert "<table>" in model.summary()._repr_html_()


# -- hostile inputs ---------------------------------------------------------------------------------


def test_bad_inputs_give_clear_errors(device):
    X, y, names = spector()
    Xd, yd = on(device, X), on(device, y)
    est = LogisticRegression()
    with pytest.raises(pystrom.SchemaMismatchError, match="2-D"):
        est.fit(on(device, X[:, 0]), yd)
    with pytest.raises(pystrom.SchemaMismatchError, match="one value per row"):
        est.fit(Xd, yd[:-1])
    with pytest.raises(pystrom.DataError, match="one class only"):
        est.fit(Xd, on(device, np.ones_like(y)))
    with pytest.raises(pystrom.DataError, match="one class only .True.; logistic regression needs two"):
        est.fit(Xd, on(device, np.ones(len(y), dtype=bool)))  # the class as Python shows it (not np.True_)
    n3 = int(np.count_nonzero(np.arange(len(y)) % 3 == 1))
    with pytest.raises(pystrom.DataError, match=rf"{n3:,} rows hold neither its smallest value \(0\) nor its largest "
                       r"\(2\)\. Only binary"):  # fmt: skip
        est.fit(Xd, on(device, np.arange(len(y)) % 3))
    bad = X.copy()
    bad[5, 1] = np.nan
    with pytest.raises(pystrom.DataError, match="x1"):
        est.fit(on(device, bad), yd)
    bad[5, 1] = np.inf
    with pytest.raises(pystrom.DataError, match="NaN or Inf"):
        est.fit(on(device, bad), yd)
    with pytest.raises(pystrom.DataError, match="minimum of 1"):
        est.fit(on(device, np.zeros((0, 3))), on(device, np.zeros(0)))
    with pytest.raises(pystrom.DataError, match="NaN"):
        est.fit(Xd, on(device, np.where(np.arange(len(y)) == 3, np.nan, y)))
    with pytest.raises(pystrom.DataError, match="non-negative"):
        est.fit(Xd, yd, sample_weight=on(device, -np.ones(len(y))))
    table = _table(device, X, y, names)
    with pytest.raises(pystrom.ColumnNotFoundError, match="nope"):
        est.fit(table, columns=["GPA", "nope"], target="y")
    with pytest.raises(pystrom.ColumnNotFoundError, match="missing"):
        est.fit(table, target="missing")
    with pytest.raises(pystrom.DataError, match="target="):
        est.fit(table)
    strings = Table.from_arrays({"s": np.array(["a", "b"] * 5), "x": np.arange(10.0), "y": np.arange(10) % 2 == 0},
                                device=device)  # fmt: skip
    with pytest.raises(pystrom.UnsupportedTypeError, match="'s'"):
        est.fit(strings, target="y")
    nan_table = _table(device, np.where(np.arange(len(y))[:, None] == 2, np.nan, X), y, names)
    with pytest.raises(pystrom.DataError, match="GPA"):
        est.fit(nan_table, target="y")
    all_null = _table(device, X, y, names, nulls={"GPA": list(range(len(y)))})
    with pytest.raises(pystrom.DataError, match="no rows"):
        est.fit(all_null, target="y")
    with pytest.raises(pystrom.DataError, match="one class only"):
        LogisticRegression().fit(Scan(_table(device, X, np.zeros_like(y), names), 8), target="y")
    with pytest.raises(pystrom.DataError, match="0 and 1"):
        two = Table.from_arrays({"x": np.arange(10.0), "y": np.arange(10) % 2 + 5}, device=device)
        LogisticRegression().fit([two], target="y")


def test_params_validated_and_not_fitted():
    X, y, _ = spector()
    for bad in [dict(penalty="l1"), dict(C=0), dict(max_iter=0), dict(tol=-1), dict(class_weight="x")]:
        with pytest.raises(ValueError):
            LogisticRegression(**bad).fit(X, y)
    with pytest.raises(pystrom.NotFittedError, match="not fitted"):
        LogisticRegression().predict(X)
    with pytest.raises(AttributeError):
        LogisticRegression().summary()
    model = LogisticRegression().fit(X, y)
    with pytest.raises(pystrom.DataError, match="expecting 3"):
        model.predict(X[:, :2])
    with pytest.raises(pystrom.DataError, match="not classes"):
        LogisticRegression(class_weight={7: 1.0}).fit(X, y)


def test_labels_and_score():
    X, y, _ = breast_cancer()
    labels = np.where(y > 0, "benign", "malignant")
    model = LogisticRegression().fit(X, labels)
    assert list(model.classes_) == ["benign", "malignant"]
    numeric = LogisticRegression().fit(X, 1 - y)
    np.testing.assert_allclose(model.coef_, numeric.coef_, rtol=1e-12)
    assert set(model.predict(X)) <= {"benign", "malignant"}
    assert 0.85 < model.score(X, labels) <= 1.0


# -- the scikit-learn contract ----------------------------------------------------------------------


def test_sklearn_contract():
    from sklearn.base import clone
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.utils import estimator_checks as ec

    est = LogisticRegression(penalty="l2", C=0.3, max_iter=50)
    twin = clone(est)
    assert twin is not est and twin.get_params() == est.get_params()
    assert est.set_params(C=2.0) is est and est.C == 2.0
    with pytest.raises(ValueError, match="invalid parameter"):
        est.set_params(alpha=1)
    X, y, _ = breast_cancer()
    assert est.fit(X, y) is est
    assert clone(est).get_params() == est.get_params() and not hasattr(clone(est), "coef_")
    pipe = make_pipeline(StandardScaler(), LogisticRegression(penalty="l2")).fit(X, y)
    assert pipe.score(X, y) > 0.85
    name = "LogisticRegression"
    for check in [
        ec.check_get_params_invariance,
        ec.check_set_params,
        ec.check_no_attributes_set_in_init,
        ec.check_parameters_default_constructible,
        ec.check_estimators_fit_returns_self,
        ec.check_estimators_unfitted,
        ec.check_fit_score_takes_y,
        ec.check_dont_overwrite_parameters,
        ec.check_estimators_overwrite_params,
        ec.check_fit_idempotent,
        ec.check_estimators_pickle,
        ec.check_estimator_repr,
        ec.check_estimators_nan_inf,
        ec.check_classifiers_one_label,
        ec.check_f_contiguous_array_estimator,
        ec.check_classifier_not_supporting_multiclass,
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(name, LogisticRegression(penalty="l2"))
    # and every check scikit-learn has for a binary classifier, penalised and not (the default: its
    # aliased columns must not depend on weights against repeated rows, issue 39)
    for penalty in ("l2", None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = ec.check_estimator(LogisticRegression(penalty=penalty), on_fail=None)
        failed = [f"{r['check_name']}: {r['exception']}" for r in results if r["status"] == "failed"]
        assert not failed, f"penalty={penalty}:\n" + "\n".join(failed)
        assert len(results) > 40


def test_ml_is_lazy_attribute():
    import subprocess
    import sys

    code = "import sys, pystrom; assert 'pystrom.ml' not in sys.modules; pystrom.ml.LogisticRegression; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def test_cholesky_solve_every_size():
    """The Newton step's solve (lists, NumPy, blocks of rows, by size) equals a general solve, and
    refuses what is not positive definite as NumPy's Cholesky does."""
    from pystrom.ml._linalg import cholesky_solve, newton_solve

    for bad in ([[1.0, 2.0], [2.0, 1.0]], [[0.0]], [[np.nan, 0.0], [0.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]]):
        with pytest.raises(np.linalg.LinAlgError):
            newton_solve(np.array(bad), np.ones(len(bad)))

    rng = np.random.default_rng(7)
    for p in (1, 2, 5, 8, 9, 31, 32, 33, 63, 64, 65, 100, 257):
        A = rng.normal(size=(p + 5, p))
        H = A.T @ A + np.eye(p)
        g = rng.normal(size=p)
        ref = np.linalg.solve(H, g)
        np.testing.assert_allclose(cholesky_solve(np.linalg.cholesky(H), g), ref, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(newton_solve(H, g), ref, rtol=1e-9, atol=1e-12, err_msg=f"p={p}")
