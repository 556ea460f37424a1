"""The wide logistic pass's fused kernels (kernels/logistic_wide.cu) run on the CPU under the SIMT
emulation (tests/simt.py), against the NumPy twin (ml/_pass.py xp_pass).

Every kind _wide.py launches: the one-value kernel (1, 2, 4, 8 features a thread; 256 and 1024 threads)
and the 16-byte-vector kernel (1, 2, 4 vectors a thread), float32 and float64 input, float32 and float64
Z, with and without sample weights, over a few blocks whose tiles end inside the rows, and launched
twice with ``accumulate`` (a pass over two chunks). Checked: each block's sums of x resid and x r, its
totals (log-likelihood, weights, non-finite and saturated rows, sum r, sum resid, the least margin),
and Z = the rows scaled by sqrt(r). The GPU run of the same kernels, with cuBLAS's Gram and the finish
kernel, is tests/test_logistic_wide.py::test_wide_kernels_against_the_numpy_twin.
"""

from __future__ import annotations

import numpy as np
import pytest
import simt

from pystrom.ml import _wide
from pystrom.ml._pass import PassTotals, xp_pass

pytestmark = pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")

TOTALS = 8  # FUSED_TOTALS in logistic_wide.cu

_TYPES = {"f32": np.float32, "f64": np.float64}  # the input's type in a kernel's name
_Z = {"z32": np.float32, "z64": np.float64}  # Z's


def _kinds() -> list[tuple[str, int, int]]:
    """(kernel name, threads, a k it is chosen for) of every kind _wide.py can launch: its shape tables
    are searched in order for the first that holds k features, so one past the previous shape's reach."""
    out = []
    for t, dtype in _TYPES.items():
        width = 16 // np.dtype(dtype).itemsize
        for z in _Z:
            reach = 16
            for threads, f in _wide._FUSED:
                out.append((f"logit_wide_fused_{t}_{z}_f{f}_r{_wide._ROWS_PER_WARP}_t{threads}", threads, reach + 1))
                reach = threads * f
            reach = 4 * width
            for threads, q in _wide._VECTOR:
                if reach + width <= _wide.MAX_WIDE_FEATURES:
                    out.append((f"logit_wide_vec_{t}_{z}_q{q}_t{threads}", threads, reach + width))
                reach = threads * q * width
    return out


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return simt.Emulated("logistic_wide", tmp_path_factory.mktemp("wide"))


def _run(kernels, name, grid, X, y, sw, cw, w, Z, acc, accumulate):
    """One launch of ``grid`` blocks of the kind's threads, as WidePass launches it."""
    threads = int(name.rsplit("_t", 1)[1])
    shape = (np.int64(X.shape[0]), np.int32(X.shape[1]), np.int64(X.strides[0] // X.itemsize))
    weights = (sw, np.int32(sw is not None), np.float64(cw[0]), np.float64(cw[1]), w)
    args = (X, *shape, y, *weights, Z, acc, np.int32(accumulate))
    kernels.launch_grid(name, (grid, 1), args, threads=threads)


@pytest.mark.parametrize("name,threads,k", _kinds(), ids=[n for n, _, _ in _kinds()])
def test_fused_kernel_against_the_numpy_twin(emulated, name, threads, k):
    dtype = _TYPES[name.split("_")[3]]
    ztype = _Z[name.split("_")[4]]
    rng = np.random.default_rng(k)
    n = 101  # 4 blocks: tiles of 8 or 32 rows end inside the rows
    X = np.asarray(rng.normal(size=(n, k)), dtype=dtype)
    X[:, 3] *= 50.0
    X[:4, 5] = 30.0  # saturated rows
    y = (rng.random(n) < 0.4).astype(np.uint8)
    w = rng.normal(size=k + 1) * 0.1
    w[5] = 1.0
    cw = (0.7, 1.3)
    grid = 4
    stride = 2 * k + TOTALS
    for sw in (None, rng.random(n) * 2):
        Z = np.full((n, k), np.nan, dtype=ztype)
        acc = np.full((grid, stride), np.nan)
        half = n // 2  # two launches, the second accumulating: a pass over two chunks
        _run(emulated, name, grid, X[:half], y[:half], None if sw is None else sw[:half], cw, w, Z[:half], acc, 0)
        _run(emulated, name, grid, X[half:], y[half:], None if sw is None else sw[half:], cw, w, Z[half:], acc, 1)
        ref = PassTotals.unpack(xp_pass(np, X, y, sw, cw, w, "float32" if dtype == np.float32 else "float64"), k)
        sums = acc.sum(axis=0)
        tight = {"rtol": 1e-6, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-11}
        np.testing.assert_allclose(sums[:k], ref.gradient[:k], **tight, err_msg="x resid")
        np.testing.assert_allclose(sums[k : 2 * k], ref.hessian[:k, k], **tight, err_msg="x r")
        t = sums[2 * k :]
        np.testing.assert_allclose(t[0], ref.log_likelihood, rtol=tight["rtol"])
        np.testing.assert_allclose([t[1], t[2]], [ref.weight_sum, ref.positive_weight], rtol=1e-12)
        assert (t[3], t[4]) == (ref.nonfinite_rows, ref.saturated_rows) and ref.saturated_rows > 0
        np.testing.assert_allclose([t[5], t[6]], [ref.hessian[k, k], ref.gradient[k]], **tight)
        assert acc[:, 2 * k + 7].min() == pytest.approx(ref.min_margin, rel=1e-6)
        # Z: the rows scaled by sqrt(r), Z^T Z the features' Hessian block (to Z's rounding)
        assert np.isfinite(Z).all(), "every element of Z written"
        zz = Z.astype(np.float64).T @ Z.astype(np.float64)
        scale = np.abs(X.astype(np.float64)).T @ (np.abs(X.astype(np.float64)) * (ref.hessian[k, k] / n))
        rounding = 2.0**-22 if ztype == np.float32 or dtype == np.float32 else 1e-13
        assert (np.abs(zz - ref.hessian[:k, :k]) <= 8 * rounding * n * scale + 1e-12).all()


def test_a_non_finite_row_is_counted(emulated):
    name = f"logit_wide_fused_f64_z64_f1_r{_wide._ROWS_PER_WARP}_t256"
    rng = np.random.default_rng(3)
    n, k = 40, 12
    X = rng.normal(size=(n, k))
    X[17, 2] = np.nan
    y = (rng.random(n) < 0.5).astype(np.uint8)
    w = rng.normal(size=k + 1) * 0.1
    Z = np.zeros((n, k))
    acc = np.zeros((2, 2 * k + TOTALS))
    _run(emulated, name, 2, X, y, None, (1.0, 1.0), w, Z, acc, 0)
    assert acc[:, 2 * k + 3].sum() == 1


def test_gram_sum_finish_system_and_next(emulated):
    """The rest of a wide pass on the device (WidePass.finish and _solve_step), under emulation: the GEMM
    blocks' upper triangles summed in float64 (gram_sum), the flat vector and full Hessian built from the
    blocks' sums and that triangle (finish) against xp_pass; the Newton system over the free parameters,
    l2 on the features' diagonal (system); the step, next weights and flag from the solution (next)."""
    kernels = emulated
    name = f"logit_wide_fused_f64_z64_f1_r{_wide._ROWS_PER_WARP}_t256"
    rng = np.random.default_rng(9)
    n, k, grid = 150, 21, 3
    p = k + 1
    X = rng.normal(size=(n, k))
    y = (rng.random(n) < 0.4).astype(np.uint8)
    w = rng.normal(size=p) * 0.1
    cw = (0.7, 1.3)
    Z = np.zeros((n, k))
    acc = np.zeros((grid, 2 * k + TOTALS))
    _run(emulated, name, grid, X, y, None, cw, w, Z, acc, 0)
    ref = PassTotals.unpack(xp_pass(np, X, y, None, cw, w, "float64"), k)
    # the GEMMs of two row blocks (column-major k x k each; symmetric), summed over their upper triangle
    parts = np.stack([Z[:70].T @ Z[:70], Z[70:].T @ Z[70:]]).copy()
    gram = np.full((k, k), np.nan)  # the other triangle is never written, and must never be read
    kernels.launch("logit_wide_gram_sum_z64", k * k, (parts, np.int32(2), np.int32(k), gram, np.int32(0)), max_blocks=2)
    nt = p * (p + 1) // 2
    out = np.full(nt + p + 6, np.nan)
    H = np.full((p, p), np.nan)
    kernels.launch("logit_wide_finish", out.size, (acc, np.int32(grid), np.int32(k), gram, out, H), max_blocks=2)
    t = PassTotals.unpack(out, k)
    np.testing.assert_allclose(t.hessian, ref.hessian, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(H, ref.hessian, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(t.gradient, ref.gradient, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose([t.log_likelihood, t.weight_sum, t.positive_weight],
                               [ref.log_likelihood, ref.weight_sum, ref.positive_weight], rtol=1e-12)  # fmt: skip
    assert (t.nonfinite_rows, t.saturated_rows) == (ref.nonfinite_rows, ref.saturated_rows)
    assert t.min_margin == pytest.approx(ref.min_margin, rel=1e-12)
    # the system over the free parameters: features 0..k-1 but 4, then the intercept; l2 on the features
    a = np.array([j for j in range(k) if j != 4] + [k], dtype=np.int64)
    m, nfree, l2 = len(a), len(a) - 1, 0.25
    A, rhs = np.full((m, m), np.nan), np.full(m, np.nan)
    kernels.launch("logit_wide_system", m * m, (H, out[nt:].copy(), w, a, np.int32(m), np.int32(nfree),
                                                np.float64(l2), np.int32(p), A, rhs), max_blocks=2)  # fmt: skip
    want_A = H[np.ix_(a, a)] + np.diag([l2] * nfree + [0.0])
    want_rhs = t.gradient[a] - np.array([l2] * nfree + [0.0]) * w[a]
    np.testing.assert_array_equal(A, want_A)
    np.testing.assert_array_equal(rhs, want_rhs)
    sol = np.linalg.solve(A, rhs)
    for info, solution, ok in (
        ((0, 0), sol, True),
        ((3, 0), sol, False),
        ((0, 0), np.where(np.arange(m) == 2, np.nan, sol), False),
    ):
        tail, wnext = np.full(2 * p + 1, np.nan), np.full(p, np.nan)
        kernels.launch_grid("logit_wide_next", (1, 1), (solution.copy(), a, np.int32(m), np.array(info, np.int32), w,
                                                        np.int32(p), tail, wnext))  # fmt: skip
        step = np.zeros(p)
        if ok:
            step[a] = sol
        assert np.array_equal(tail[:p], step) and np.array_equal(tail[p : 2 * p], w + step)
        assert np.array_equal(wnext, w + step) and tail[2 * p] == (1.0 if ok else 0.0)


@pytest.mark.parametrize("t", sorted(_TYPES))
def test_fused_kernel_keeps_the_residuals_of_saturated_rows(emulated, t):
    """Rows fitted with probability within e^-20 of their class: the residuals to float32's relative
    rounding (before: 1 - 1/(1 + e), 0 for float32 from a margin of ~17)."""
    from test_logistic_separation import _saturated, assert_saturated_gradient

    name = f"logit_wide_fused_{t}_z64_f1_r{_wide._ROWS_PER_WARP}_t256"
    k, grid = 20, 3
    X, y, w = _saturated(_TYPES[t], k, 5)
    sw = np.random.default_rng(5).random(len(y)) * 2
    acc = np.zeros((grid, 2 * k + TOTALS))
    _run(emulated, name, grid, X, y, sw, (1.0, 1.0), w, np.zeros(X.shape, np.float64), acc, 0)
    sums = acc.sum(axis=0)
    assert sums[2 * k + 4] == len(y)  # every row saturated
    got = np.append(sums[:k], sums[2 * k + 6])  # x resid, then sum resid (the intercept's)
    assert_saturated_gradient(got, X, y, sw, w, name)
