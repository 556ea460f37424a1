"""The narrow logistic pass (kernels/logistic.cu) run on the CPU under tests/simt.py's emulation as
ml/_narrow.py launches it: blocks of 128 threads (4 warps), so the warp shuffles, the reduction across
warps through shared memory and the last block's reduction over every block's partials (the atomic
counter, reset for the next launch) all run as written. tests/test_logistic_kernel.py checks the same
source's arithmetic with blocks of one thread; the GPU machine runs the real kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
import simt
from test_logistic_kernel import TAIL, assert_pass_close

from pystrom.ml._narrow import vector_loads
from pystrom.ml._pass import MAX_KERNEL_FEATURES, layout_size, xp_pass

pytestmark = pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")

THREADS = 128  # _THREADS in ml/_narrow.py, LOGIT_THREADS in logistic.cu


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return simt.Emulated("logistic", tmp_path_factory.mktemp("logistic"))


@pytest.mark.parametrize("k", range(1, MAX_KERNEL_FEATURES + 1))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_pass_with_whole_blocks_against_the_numpy_twin(kernels, k, dtype):
    rng = np.random.default_rng(k)
    tname = "f32" if dtype == np.float32 else "f64"
    for n, blocks, weighted, order in (
        (1, 1, False, "C"),
        (700, 3, True, "C"),
        (1111, 5, False, "F"),
        (90, 4, True, "C"),
    ):
        X = np.asarray(rng.normal(size=(n, k)) * 2, dtype=dtype, order=order)
        if n > 10 and k > 1:
            X[5, k - 1] = np.nan  # a non-finite row: counted, left out of the sums
        y = (rng.random(n) < 0.4).astype(np.uint8)
        sw = rng.random(n) * 2 if weighted else None
        w = np.zeros(9)
        w[: k + 1] = rng.normal(size=k + 1)
        cw = (0.7, 1.3)
        m = layout_size(k)
        partials = np.full((blocks, m), np.nan)
        out = np.full(m + TAIL, np.nan)
        done = np.full(1, 0, dtype=np.uint32)
        item = X.dtype.itemsize
        rs, cs = X.strides[0] // item, X.strides[1] // item
        vec = vector_loads(item, k, rs, cs, X.ctypes.data)
        scalars = (np.int64(n), np.int64(rs), np.int64(cs))
        weights = (np.float64(cw[0]), np.float64(cw[1]), *(np.float64(v) for v in w))
        # sw: any array when unweighted (has_sw 0); wsrc, sums: none (an ordinary pass, no step)
        args = (X, *scalars, y, sw if weighted else w, np.int32(weighted), np.int32(vec), *weights, None, None,
                partials, done, out)  # fmt: skip
        kernels.launch_grid(f"logit_pass_{tname}_k{k}", (blocks, 1), args, threads=THREADS)
        assert done[0] == 0, "the last block resets the counter for the next launch"
        ref = xp_pass(np, X, y, sw, cw, w[: k + 1])
        assert_pass_close(out[:-TAIL], ref, dtype, n, f"k={k} {tname} n={n} blocks={blocks} {order} vec={vec}")


@pytest.mark.parametrize("k", [1, 4, 8])
def test_the_speculative_pass_with_whole_blocks(kernels, k):
    """logit_spec_* reads its weights from device memory (the step kernel's wnext: 9 weights, then a flag):
    with the flag set, the same sums as the plain pass given those weights as scalars; with it clear (the
    step failed), nothing: no sums, and the block counter left at 0."""
    rng = np.random.default_rng(40 + k)
    n, blocks = 900, 3
    X = rng.normal(size=(n, k)).astype(np.float32)
    y = (rng.random(n) < 0.4).astype(np.uint8)
    wsrc = np.zeros(10)
    wsrc[: k + 1] = rng.normal(size=k + 1) * 0.3
    m = layout_size(k)
    vec = np.int32(vector_loads(4, k, k, 1, X.ctypes.data))

    def run(name, weights, source):
        partials, out = np.full((blocks, m), np.nan), np.full(m + TAIL, np.nan)
        done = np.zeros(1, dtype=np.uint32)
        args = (X, np.int64(n), np.int64(k), np.int64(1), y, weights, np.int32(0), vec, np.float64(1.0),
                np.float64(1.0), *(np.float64(v) for v in weights), source, None, partials, done, out)  # fmt: skip
        kernels.launch_grid(f"{name}_f32_k{k}", (blocks, 1), args, threads=THREADS)
        return out, int(done[0])

    wsrc[9] = 1.0
    spec, done = run("logit_spec", np.zeros(9), wsrc)
    plain, _ = run("logit_pass", wsrc[:9].copy(), None)
    assert done == 0 and np.array_equal(spec[:m], plain[:m]) and np.isfinite(plain[:m]).all()
    wsrc[9] = 0.0
    skipped, done = run("logit_spec", np.zeros(9), wsrc)
    assert np.isnan(skipped).all() and done == 0


@pytest.mark.parametrize("k", [1, 3, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_pass_over_several_arrays(kernels, k, dtype):
    """logit_parts_* (a dask worker's partitions in one launch, ml/_narrow.py PartsPass): arrays of
    different layouts (C order with vector loads, Fortran order, C order one element off alignment),
    lengths (0 and 1 row among them) and weights (some weighted, some not) give the sums of one pass over
    their rows stacked; leaving the last array out of the count changes them (every array is read)."""
    rng = np.random.default_rng(70 + k)
    tname = "f32" if dtype == np.float32 else "f64"
    arrays, fields = [], []
    for n, order, weighted in ((700, "C", False), (0, "C", True), (333, "F", True), (1, "C", False),
                               (512, "shifted", True), (90, "C", True)):  # fmt: skip
        X = np.asarray(rng.normal(size=(n, k)) * 2, dtype=dtype, order="F" if order == "F" else "C")
        if order == "shifted":
            buf = np.empty(n * k + 1, dtype=dtype)
            buf[1:] = X.ravel()
            X = buf[1:].reshape(n, k)
        y = (rng.random(n) < 0.4).astype(np.uint8)
        sw = rng.random(n) * 2 if weighted else None
        item = X.dtype.itemsize
        rs, cs = X.strides[0] // item, X.strides[1] // item
        vec = vector_loads(item, k, rs, cs, X.ctypes.data)
        arrays.append((X, y, sw))
        fields.append([X.ctypes.data, n, rs, cs, y.ctypes.data, sw.ctypes.data if weighted else 0, int(weighted),
                       int(vec)])  # fmt: skip
    if k % 2 == 0:  # rows of an even number of values: vector loads where aligned
        assert any(f[7] for f in fields) and not all(f[7] for f in fields), "both kinds of loads are exercised"
    table = np.array(fields, dtype=np.int64)
    w = np.zeros(9)
    w[: k + 1] = rng.normal(size=k + 1) * 0.5
    cw = (0.7, 1.3)
    m, blocks = layout_size(k), 3

    def run(nparts):
        partials, out = np.full((blocks, m), np.nan), np.full(m, np.nan)
        done = np.zeros(1, dtype=np.uint32)
        args = (table, np.int32(nparts), np.float64(cw[0]), np.float64(cw[1]), *(np.float64(v) for v in w), None, None,
                partials, done, out)  # fmt: skip
        kernels.launch_grid(f"logit_parts_{tname}_k{k}", (blocks, 1), args, threads=THREADS)
        assert done[0] == 0, "the last block resets the counter for the next launch"
        return out

    X = np.concatenate([a[0] for a in arrays])
    y = np.concatenate([a[1] for a in arrays])
    sw = np.concatenate([a[2] if a[2] is not None else np.ones(len(a[1])) for a in arrays])
    ref = xp_pass(np, X, y, sw, cw, w[: k + 1])
    assert_pass_close(run(len(arrays)), ref, dtype, len(y), f"k={k} {tname}")
    short, cut = run(len(arrays) - 1), len(y) - len(arrays[-1][1])
    assert_pass_close(short, xp_pass(np, X[:cut], y[:cut], sw[:cut], cw, w[: k + 1]), dtype, cut, "the count honoured")
    assert not np.allclose(short, ref)


@pytest.fixture(scope="module")
def unweighted_kernels(tmp_path_factory):
    return simt.Emulated("logistic", tmp_path_factory.mktemp("logistic_unweighted"), defines=("LOGIT_UNWEIGHTED",))


@pytest.mark.parametrize("k", [1, 4, 7])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_unweighted_parts_build_gives_the_same_sums(kernels, unweighted_kernels, k, dtype):
    """PartsPass runs the LOGIT_UNWEIGHTED build of logit_parts_* for a worker without sample weights at
    class weights (1, 1): with 128-thread blocks, warp shuffles and the last block's reduction as written,
    its sums equal the weighted build's bit for bit, plain and speculative kinds alike."""
    rng = np.random.default_rng(90 + k)
    tname = "f32" if dtype == np.float32 else "f64"
    arrays, fields = [], []
    for n, order in ((600, "C"), (0, "C"), (301, "F"), (77, "C")):
        X = np.asarray(rng.normal(size=(n, k)) * 3, dtype=dtype, order=order)
        if n > 10:
            X[3, 0] = np.nan
        y = (rng.random(n) < 0.4).astype(np.uint8)
        item = X.dtype.itemsize
        rs, cs = X.strides[0] // item, X.strides[1] // item
        arrays.append((X, y))
        vec = vector_loads(item, k, rs, cs, X.ctypes.data)
        fields.append([X.ctypes.data, n, rs, cs, y.ctypes.data, 0, 0, int(vec)])
    table = np.array(fields, dtype=np.int64)
    w = np.zeros(10)
    w[: k + 1] = rng.normal(size=k + 1) * 0.5
    w[9] = 1.0  # the flag a speculative pass reads after the weights
    m, blocks = layout_size(k), 3

    def run(lib, spec):
        partials, out = np.full((blocks, m), np.nan), np.full(m, np.nan)
        done, wout = np.zeros(1, dtype=np.uint32), np.full(10, np.nan)
        weights = (np.float64(0),) * 9 if spec else tuple(np.float64(v) for v in w[:9])
        args = (table, np.int32(len(arrays)), np.float64(1.0), np.float64(1.0), *weights, w if spec else None,
                wout if spec else None, partials, done, out)  # fmt: skip
        lib.launch_grid(f"logit_parts{'_spec' if spec else ''}_{tname}_k{k}", (blocks, 1), args, threads=THREADS)
        assert done[0] == 0
        return out

    for spec in (False, True):
        want, got = run(kernels, spec), run(unweighted_kernels, spec)
        assert np.array_equal(got, want, equal_nan=True), f"k={k} {tname} spec={spec}"
    X = np.concatenate([a[0] for a in arrays])
    y = np.concatenate([a[1] for a in arrays])
    assert_pass_close(got, xp_pass(np, X, y, None, (1.0, 1.0), w[: k + 1]), dtype, len(y), "against the twin")


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_speculative_pass_over_several_arrays_writes_its_weights(kernels, k, dtype):
    """logit_parts_spec_* (a chained rank's speculative pass, dask/_chain.py) reads its weights from the
    step's wnext: with the flag set, the sums of logit_parts given them as scalars, and both write the
    weights they used to `wout` (the row the all-gather sends); with the flag clear, nothing at all."""
    rng = np.random.default_rng(90 + k)
    tname = "f32" if dtype == np.float32 else "f64"
    arrays = [np.asarray(rng.normal(size=(n, k)), dtype=dtype) for n in (400, 0, 257)]
    ys = [(rng.random(len(X)) < 0.4).astype(np.uint8) for X in arrays]
    fields = [[X.ctypes.data, len(X), k, 1, y.ctypes.data, 0, 0, 0] for X, y in zip(arrays, ys)]
    table = np.array(fields, dtype=np.int64)
    wsrc = np.zeros(10)
    wsrc[: k + 1] = rng.normal(size=k + 1) * 0.3
    m, blocks = layout_size(k), 3

    def run(name, weights, source):
        partials, out, wout = np.full((blocks, m), np.nan), np.full(m, np.nan), np.full(k + 1, np.nan)
        done = np.zeros(1, dtype=np.uint32)
        args = (table, np.int32(len(arrays)), np.float64(1.0), np.float64(1.0), *(np.float64(v) for v in weights),
                source, wout, partials, done, out)  # fmt: skip
        kernels.launch_grid(f"{name}_{tname}_k{k}", (blocks, 1), args, threads=THREADS)
        return out, wout, int(done[0])

    wsrc[9] = 1.0
    spec, spec_w, done = run("logit_parts_spec", np.zeros(9), wsrc)
    plain, plain_w, _ = run("logit_parts", wsrc[:9].copy(), None)
    assert done == 0 and np.isfinite(plain).all() and np.array_equal(spec, plain)
    assert np.array_equal(spec_w, wsrc[: k + 1]) and np.array_equal(plain_w, wsrc[: k + 1])
    X, y = np.concatenate(arrays), np.concatenate(ys)
    assert_pass_close(plain, xp_pass(np, X, y, np.ones(len(y)), (1.0, 1.0), wsrc[: k + 1]), dtype, len(y), "parts")
    wsrc[9] = 0.0
    skipped, skipped_w, done = run("logit_parts_spec", np.zeros(9), wsrc)
    assert np.isnan(skipped).all() and np.isnan(skipped_w).all() and done == 0


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("world", [1, 3])
def test_the_totals_and_step_after_an_all_gather(kernels, k, world):
    """logit_gather_step_k* (after a chained pass's all-gather): the rows copied to the host as they are,
    the totals exactly dask/_tasks.py sum_passes of the ranks' pass vectors (bit for bit: every rank and the
    host path agree), and the step the solver's own rule gives from those totals (logit_step's, checked
    against IRLSSolver in test_logistic_kernel.py) with the next weights w + step; no step without a rule,
    and nothing (flag 0, totals untouched) after a speculative pass that did not run."""
    from pystrom.dask._tasks import _EXTRA, sum_passes
    from pystrom.ml._irls import IRLSSolver
    from pystrom.ml._pass import PassTotals

    rng = np.random.default_rng(110 + k + world)
    m = layout_size(k)
    width, p = m + _EXTRA, k + 1
    rowlen = width + p + 2
    w = np.zeros(9)
    w[:p] = rng.normal(size=p) * 0.3
    rows = np.zeros((world, rowlen))
    for r in range(world):
        n = 300 + 50 * r
        X, y = rng.normal(size=(n, k)), (rng.random(n) < 0.4).astype(np.uint8)
        rows[r, :m] = xp_pass(np, X, y, None, (1.0, 1.0), w[:p])
        rows[r, m:width] = (n, r, float(r >= 1))  # rows, skipped, float32 seen (max, not sum)
        rows[r, width : width + p] = w[:p]
        rows[r, -2] = 1.0
    want = sum_passes(*rows[:, :width])
    free = list(range(p))

    def run(step_on, source=None):
        host_rows, totals, host_totals = np.full(world * rowlen, np.nan), np.full(width, np.nan), np.full(width, np.nan)
        tail, wnext = np.full(19, np.nan), np.full(10, np.nan)
        args = (rows, np.int32(world), np.int32(rowlen), np.int32(width), host_rows, totals, host_totals,
                *(np.float64(v) for v in w), source, np.uint32(sum(1 << j for j in free)), np.int32(k),
                np.float64(0.0), np.int32(step_on), tail, wnext)  # fmt: skip
        kernels.launch_grid(f"logit_gather_step_k{k}", (1, 1), args, threads=THREADS)
        return host_rows, totals, host_totals, tail, wnext

    host_rows, totals, host_totals, tail, wnext = run(1)
    assert np.array_equal(host_rows, rows.ravel())
    assert np.array_equal(totals, want) and np.array_equal(host_totals, want)
    solver = IRLSSolver(lambda w: None, k, True, 0.0, 10, 1e-8)
    solver.active, solver.n_free_features = np.arange(p), k
    step, _ = solver.newton_direction(w[:p], PassTotals.unpack(want[:m], k))
    assert tail[18] == 1.0 and wnext[9] == 1.0
    np.testing.assert_allclose(tail[:p], step, rtol=1e-10, atol=1e-12)
    assert np.array_equal(tail[9 : 9 + p], w[:p] + tail[:p]) and np.array_equal(wnext[:p], tail[9 : 9 + p])
    _, _, _, tail, wnext = run(0)
    assert tail[18] == 0.0 and wnext[9] == 0.0, "no rule: no step, no speculative pass after it"
    failed = np.zeros(10)  # the step before failed: the speculative pass did not run
    _, totals, host_totals, tail, wnext = run(1, failed)
    assert tail[18] == 0.0 and wnext[9] == 0.0 and np.isnan(totals).all() and np.isnan(host_totals).all()
