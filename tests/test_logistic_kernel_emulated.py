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
        args = (table, np.int32(nparts), np.float64(cw[0]), np.float64(cw[1]), *(np.float64(v) for v in w), partials,
                done, out)  # fmt: skip
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
