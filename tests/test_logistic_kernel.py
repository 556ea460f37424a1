"""The CUDA source of the fused logistic pass, compiled as C++ and run on the CPU, against its NumPy twin.

The GPU tests run the real kernel (test_logistic.py::test_kernel_equals_numpy_twin); this one checks the
kernel's arithmetic and indexing (strides, the packed upper triangle, weights, NaN rows, the margin, the
two-stage reduction over blocks) on every machine, CI included, with blocks of one thread so the warp
shuffles are the identity. It needs a C++ compiler (the project's extension needs one anyway).
"""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from pystrom.ml._narrow import vector_loads
from pystrom.ml._pass import MAX_KERNEL_FEATURES, PassTotals, layout_size, xp_pass

SHIM = r"""
#include <cmath>
#include <cstring>
using std::isfinite;
using std::isinf;
struct Dim3 { unsigned x = 1, y = 1, z = 1; };
static Dim3 blockIdx, blockDim, gridDim;
static Dim3 threadIdx = {0, 0, 0};
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define __launch_bounds__(threads, blocks)
#define LOGIT_ONE_THREAD_BLOCKS
static inline void __syncthreads() {}
#define __expf(x) expf(x)
#define __ldcg(p) (*(p))
static inline void __threadfence() {}
static inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned old = *p; *p += v; return old; }
#define __fdividef(a, b) ((a) / (b))
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline int __double2hiint(double d) { long long v; std::memcpy(&v, &d, 8); return (int)(v >> 32); }
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct double2 { double x, y; };
"""

DRIVER = r"""
#define DRIVE(TNAME, T, K)                                                                                   \
  extern "C" void drive_##TNAME##_k##K(const T* X, long long n, long long rs, long long cs,                 \
                                       const unsigned char* y, const double* sw, int has_sw, int vec,        \
                                       double cw0,                                                         \
                                       double cw1, const double* w, double* partials, int blocks,          \
                                       double* out, unsigned* done_after, const double* wsrc,              \
                                       double* sums) {                                                      \
    double v[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};                                                             \
    for (int j = 0; j <= K; ++j) v[j] = w[j];                                                               \
    gridDim.x = blocks;                                                                                     \
    unsigned done = 0;                                                                                      \
    for (unsigned b = 0; b < (unsigned)blocks; ++b) {                                                       \
      blockIdx.x = b;                                                                                       \
      if (wsrc)                                                                                             \
        logit_spec_##TNAME##_k##K(X, n, rs, cs, y, sw, has_sw, vec, cw0, cw1, v[0], v[1], v[2], v[3], v[4], \
                                  v[5], v[6], v[7], v[8], wsrc, sums, partials, &done, out);                \
      else                                                                                                  \
        logit_pass_##TNAME##_k##K(X, n, rs, cs, y, sw, has_sw, vec, cw0, cw1, v[0], v[1], v[2], v[3], v[4], \
                                  v[5], v[6], v[7], v[8], wsrc, sums, partials, &done, out);                \
    }                                                                                                       \
    *done_after = done;                                                                                     \
  }
#define STEP(K)                                                                                             \
  extern "C" void step_k##K(const double* sums, const double* w, const double* wsrc, unsigned mask,         \
                            int nfree, double l2, double* tail, double* wnext) {                            \
    double v[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};                                                             \
    for (int j = 0; j <= K; ++j) v[j] = w[j];                                                               \
    blockIdx.x = 0;                                                                                         \
    logit_step_k##K(sums, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], wsrc, mask, nfree, l2,      \
                    tail, wnext);                                                                           \
  }
#define DRIVE_BOTH(K) DRIVE(f32, float, K) DRIVE(f64, double, K) STEP(K)
DRIVE_BOTH(1) DRIVE_BOTH(2) DRIVE_BOTH(3) DRIVE_BOTH(4) DRIVE_BOTH(5) DRIVE_BOTH(6) DRIVE_BOTH(7) DRIVE_BOTH(8)
"""


def assert_pass_close(got: np.ndarray, ref: np.ndarray, dtype: type, n: int, what: str) -> None:
    """Kernel and twin agree: to rounding in float64; for float32 input to the float32 math's ulps.

    Both evaluate the sigmoid and log in float32 for float32 input, but with different libraries
    (CUDA's or the C library's expf/log1pf against NumPy's), so single rows may differ by an ulp or
    two of float32; every sum stays within that times the number of rows. Counts and the margin
    (float64 arithmetic on the same eta) agree exactly up to float64 rounding either way.
    """
    if dtype == np.float64:
        np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-10, err_msg=what)
        return
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=4 * 2.0**-23 * n, err_msg=what)
    np.testing.assert_allclose(got[-6:], ref[-6:], rtol=1e-6, atol=1e-9, err_msg=what)  # log-lik., counts, margin


# the kernel as shipped, and its variants the benchmark's probe compiles (prefetched rows, R_ROWS)
VARIANTS = {
    "shipped": "",
    "no_prefetch": "#define LOGIT_NO_PREFETCH\n",
    "rows8": "#define R_ROWS 8\n",
}


def _build(work, source: str) -> ctypes.CDLL:
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the kernel")
    (work / "k.cpp").write_text(SHIM + source + DRIVER)
    built = subprocess.run(
        [cxx, "-O1", "-std=c++17", "-shared", "-fPIC", "-o", str(work / "k.so"), str(work / "k.cpp")],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, f"the kernel source does not compile as C++:\n{built.stderr[-3000:]}"
    return ctypes.CDLL(str(work / "k.so"))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def emulated(tmp_path_factory, request):
    source = resources.files("pystrom.kernels").joinpath("logistic.cu").read_text(encoding="utf-8")
    return _build(tmp_path_factory.mktemp("logit_kernel"), VARIANTS[request.param] + source)


P_, I64, F64 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_double
TAIL = 19  # after the M sums: the step (9), the next weights (9), the flag (newton_step in logistic.cu)


def drive(emulated, X, y, sw, cw, w, blocks, wsrc=None, mask=0, nfree=0, l2=0.0):
    """One emulated pass, and with a step rule (``mask``) the step kernel after it, as KernelPass
    launches them; (the M sums and the tail, the device weights the step wrote, the done counter)."""
    n, k = X.shape
    tname = "f32" if X.dtype == np.float32 else "f64"
    m = layout_size(k)
    partials = np.full((blocks, m), np.nan)  # poisoned: every value must be written
    out = np.full(m + TAIL, np.nan)
    sums = np.full(m, np.nan)
    wnext = np.full(10, np.nan)
    done = ctypes.c_uint(12345)
    item = X.dtype.itemsize
    rs, cs = X.strides[0] // item, X.strides[1] // item
    vec = vector_loads(item, k, rs, cs, X.ctypes.data)
    swa = sw if sw is not None else w
    wp = P_(None if wsrc is None else wsrc.ctypes.data)
    getattr(emulated, f"drive_{tname}_k{k}")(
        P_(X.ctypes.data), I64(n), I64(rs), I64(cs), P_(y.ctypes.data), P_(swa.ctypes.data),
        ctypes.c_int(int(sw is not None)), ctypes.c_int(int(vec)), F64(cw[0]),
        F64(cw[1]), P_(w.ctypes.data), P_(partials.ctypes.data), ctypes.c_int(blocks), P_(out.ctypes.data),
        ctypes.byref(done), wp, P_(sums.ctypes.data if mask else None),
    )  # fmt: skip
    if mask:
        getattr(emulated, f"step_k{k}")(
            P_(sums.ctypes.data), P_(w.ctypes.data), wp, ctypes.c_uint(mask), ctypes.c_int(nfree), F64(l2),
            P_(out[m:].ctypes.data), P_(wnext.ctypes.data),
        )  # fmt: skip
        assert np.array_equal(sums, out[:m], equal_nan=True), "the step reads the very sums the pass wrote"
    return out, wnext, done.value


def test_kernel_source_matches_numpy_twin(emulated):
    rng = np.random.default_rng()  # fresh inputs every run
    for k in range(1, MAX_KERNEL_FEATURES + 1):
        for dtype in (np.float32, np.float64):
            for order in ("C", "F", "C shifted"):
                for weighted in (False, True):
                    n = int(rng.integers(1, 3000))
                    X = np.asarray(rng.normal(size=(n, k)) * 2, dtype=dtype, order=order[0])
                    if order == "C shifted":  # rows start one element past an aligned address: scalar loads
                        buf = np.empty(n * k + 1, dtype=dtype)
                        buf[1:] = X.ravel()
                        X = buf[1:].reshape(n, k)
                    if n > 10 and k > 1:
                        X[5, k - 1] = np.nan  # counted as a non-finite row, left out of the sums
                    y = (rng.random(n) < 0.4).astype(np.uint8)
                    sw = rng.random(n) * 2 if weighted else None
                    w = rng.normal(size=k + 1)
                    if weighted and n > 20:  # rows of weight 0 have no margin, neither saturated nor least
                        X[:2] = 60 * np.sign(w[:k])
                        y[:2] = (1, 0)
                        sw[:2] = 0.0
                    cw = (0.7, 1.3)
                    ref = xp_pass(np, X, y, sw, cw, w)
                    item = X.dtype.itemsize
                    vec = vector_loads(item, k, X.strides[0] // item, X.strides[1] // item, X.ctypes.data)
                    if order == "C" and k % 2 == 0:
                        assert vec, "C-order rows of an even number of values are read with vector loads"
                    if order != "C":
                        assert not vec
                    blocks = int(rng.integers(1, 40))
                    out, wnext, done = drive(emulated, X, y, sw, cw, w, blocks)
                    assert done == 0, "the last block must reset the counter for the next launch"
                    assert np.isnan(out[-TAIL:]).all() and np.isnan(wnext).all(), "no step asked for: none written"
                    what = f"k={k} {dtype.__name__} {order} vec={vec} weighted={weighted} n={n} blocks={blocks}"
                    assert_pass_close(out[:-TAIL], ref, dtype, n, what)


@pytest.fixture(scope="module")
def unweighted_build(tmp_path_factory):
    source = resources.files("pystrom.kernels").joinpath("logistic.cu").read_text(encoding="utf-8")
    return _build(tmp_path_factory.mktemp("logit_unweighted"), "#define LOGIT_UNWEIGHTED\n" + source)


def test_unweighted_build_gives_the_weighted_builds_sums_bit_for_bit(emulated, unweighted_build):
    """KernelPass runs the LOGIT_UNWEIGHTED build for passes with no sample weights and class weights 1
    (unweighted_pass): there it must give exactly the sums of the weighted build, every one of them, with
    the rows' weight 1 left out rather than multiplied in; and it ignores weights it is handed."""
    rng = np.random.default_rng()
    for k in range(1, MAX_KERNEL_FEATURES + 1):
        for dtype in (np.float32, np.float64):
            n = int(rng.integers(1, 3000))
            X = np.asarray(rng.normal(size=(n, k)) * 3, dtype=dtype, order="CF"[k % 2])
            if n > 10:
                X[7, 0] = np.inf  # a non-finite row
                X[9] = 30 * np.sign(rng.normal(size=k))  # saturated rows count either way
            y = (rng.random(n) < 0.4).astype(np.uint8)
            w = rng.normal(size=k + 1)
            blocks = int(rng.integers(1, 40))
            want, _, _ = drive(emulated, X, y, None, (1.0, 1.0), w, blocks)
            ones, _, _ = drive(emulated, X, y, np.ones(n), (1.0, 1.0), w, blocks)
            got, _, done = drive(unweighted_build, X, y, None, (1.0, 1.0), w, blocks)
            what = f"k={k} {dtype.__name__} n={n} blocks={blocks}"
            assert np.array_equal(want, ones, equal_nan=True), what
            assert np.array_equal(got, want, equal_nan=True), what
            assert done == 0
            ignored, _, _ = drive(unweighted_build, X, y, rng.random(n), (0.7, 1.3), w, blocks)
            assert np.array_equal(ignored, want, equal_nan=True), what


def test_only_unweighted_passes_run_the_unweighted_build():
    from pystrom.ml._narrow import unweighted_pass

    assert unweighted_pass(False, (1.0, 1.0)) and unweighted_pass(False, (np.float64(1), 1))
    for has_sw, cw in ((True, (1.0, 1.0)), (False, (1.0, 2.0)), (False, (0.5, 1.0)), (False, (0.0, 0.0))):
        assert not unweighted_pass(has_sw, cw), (has_sw, cw)


@pytest.mark.parametrize("penalised", [False, True])
def test_newton_step_is_the_solvers(emulated, penalised):
    """The step the last block computes for the speculative pass is the solver's own Newton step
    (IRLSSolver.newton_direction from the same sums), for any set of free parameters; the next weights
    are w + step as the solver forms them; a speculative launch reads them; a failed step launches nothing."""
    from pystrom.ml._irls import IRLSSolver
    from pystrom.ml._pass import PassTotals

    rng = np.random.default_rng()
    for k in range(1, MAX_KERNEL_FEATURES + 1):
        for dtype in (np.float32, np.float64):
            n = int(rng.integers(50, 2000))
            X = np.asarray(rng.normal(size=(n, k)), dtype=dtype)
            y = (rng.random(n) < 0.4).astype(np.uint8)
            w = rng.normal(size=k + 1) * 0.3
            free = [j for j in range(k + 1) if rng.random() < 0.8] or [k]
            mask = sum(1 << j for j in free)
            nf = sum(j < k for j in free)
            l2 = 0.5 if penalised else 0.0
            out, wnext, _ = drive(emulated, X, y, None, (1.0, 1.0), w, 3, mask=mask, nfree=nf, l2=l2)
            m = layout_size(k)
            solver = IRLSSolver(lambda w: None, k, k in free, l2, 10, 1e-8)
            solver.active, solver.n_free_features = np.array(free, dtype=np.intp), nf
            t = PassTotals.unpack(out[:m], k)
            want, _ = solver.newton_direction(w, t)
            what = f"k={k} {dtype.__name__} free={free} l2={l2}"
            assert out[m + 18] == 1.0 and wnext[9] == 1.0, what
            np.testing.assert_allclose(out[m : m + k + 1], want, rtol=1e-10, atol=1e-12, err_msg=what)
            assert np.array_equal(out[m + 9 : m + 10 + k], w + out[m : m + k + 1]), what
            assert np.array_equal(wnext[: k + 1], out[m + 9 : m + 10 + k]), what
            assert (out[m : m + k + 1][[j for j in range(k + 1) if j not in free]] == 0).all(), what
            # the speculative pass: weights from wnext, the same sums as a pass given them as scalars
            spec, _, _ = drive(emulated, X, y, None, (1.0, 1.0), np.zeros(k + 1), 3, wsrc=wnext)
            plain, _, _ = drive(emulated, X, y, None, (1.0, 1.0), wnext[: k + 1].copy(), 3)
            assert np.array_equal(spec[:m], plain[:m]), what
            # a step that fails (not positive definite: every weight 0 rows) says so and stops the next launch
            zero = np.zeros(n, dtype=np.float64)
            bad, bad_next, _ = drive(emulated, X, y, zero, (1.0, 1.0), w, 2, mask=mask, nfree=nf, l2=0.0)
            assert bad[m + 18] == 0.0 and bad_next[9] == 0.0, what
            skipped, after, done = drive(emulated, X, y, None, (1.0, 1.0), w, 2, wsrc=bad_next, mask=mask, nfree=nf)
            assert np.isnan(skipped[:m]).all() and done == 0, "a speculative pass after a failed step does nothing"
            assert skipped[m + 18] == 0.0 and after[9] == 0.0, "...and neither does the step after it"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_keeps_the_residuals_of_saturated_rows(emulated, dtype):
    """Rows fitted with probability within e^-20 of their class: y - mu from the smaller probability,
    to float32's relative rounding (before: 1 - 1/(1 + e), 0 for float32 from a margin of ~17)."""
    from test_logistic_separation import _saturated, assert_saturated_gradient

    for k in (1, 4, 8):
        X, y, w = _saturated(dtype, k, k)
        sw = np.random.default_rng(k).random(len(y)) * 2
        out, _, _ = drive(emulated, X, y, sw, (1.0, 1.0), w, 3)
        t = PassTotals.unpack(out[: layout_size(k)], k)
        assert t.saturated_rows == len(y)
        assert_saturated_gradient(t.gradient, X, y, sw, w, f"k={k} {dtype.__name__}")


def test_the_host_side_of_speculation():
    """What KernelPass and dask's ChainedPasses share on the host: the nine weight arguments, the step
    rule and its bit mask, and whether a queued pass is the one asked for (its weights bit for bit, its
    class weights, and a step that succeeded)."""
    from pystrom.ml._narrow import pass_weights, speculation_hit, step_rule

    w = np.array([0.5, -1.25, 3.0])
    args = pass_weights(w)
    assert len(args) == 9 and all(isinstance(a, np.float64) for a in args) and args[:3] == list(w)
    assert args[3:] == [0.0] * 6 and pass_weights(None) == [0.0] * 9
    rule, mask = step_rule(np.array([0, 2, 3], dtype=np.intp), 2, 0.5)
    assert rule == ((0, 2, 3), 2, 0.5) and mask == 0b1101
    before = np.zeros(19)  # the step, the next weights (at 9), the flag (at 18)
    before[9:12] = w
    before[18] = 1.0
    assert speculation_hit(before, 2, (1.0, 2.0), (1.0, 2.0), w)
    assert not speculation_hit(before, 2, (1.0, 2.0), (1.0, 2.5), w), "other class weights"
    assert not speculation_hit(before, 2, (1.0, 2.0), (1.0, 2.0), np.nextafter(w, 9.0)), "one ulp off"
    before[18] = 0.0
    assert not speculation_hit(before, 2, (1.0, 2.0), (1.0, 2.0), w), "the step failed"


def _narrow_variants():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "narrow_variants.py"
    spec = importlib.util.spec_from_file_location("narrow_variants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NARROW_VARIANTS = _narrow_variants()


@pytest.mark.parametrize("bound", sorted(NARROW_VARIANTS.BOUNDS))
def test_the_benchmarks_bounds_still_compute_the_pass(tmp_path, bound):
    """benchmarks/narrow_variants.py --bounds times edits of this source that do part of each row's
    arithmetic in float32. They bound what a redesign could gain only while they compute the same pass:
    every sum within float32 rounding of the twin's (a wrong index or term is off by far more), the counts
    exact. The edits also fail loudly once the kernel's text they edit has changed."""
    lib = _build(tmp_path, NARROW_VARIANTS.kernel_source(NARROW_VARIANTS.BOUNDS[bound]))
    rng = np.random.default_rng(7)
    cw = (0.7, 1.3)
    for k in (1, 4, 8):
        for weighted in (False, True):
            n = 2000
            X = np.asarray(rng.normal(size=(n, k)), dtype=np.float32)
            X[5, k - 1] = np.nan
            y = (rng.random(n) < 0.4).astype(np.uint8)
            sw = rng.random(n) * 2 if weighted else None
            w = rng.normal(size=k + 1) * 0.5
            ref = xp_pass(np, X, y, sw, cw, w)
            out, _, done = drive(lib, X, y, sw, cw, w, blocks=3)
            got = out[: layout_size(k)]
            what = f"{bound}: k={k} weighted={weighted}"
            # ~670 rows a thread summed in float32: at most that many float32 ulps of each sum's magnitude
            np.testing.assert_allclose(got[:-1], ref[:-1], rtol=1e-4, atol=1e-4 * n, err_msg=what)
            np.testing.assert_array_equal(got[-3:-1], ref[-3:-1], err_msg=what)  # non-finite, saturated counts
            np.testing.assert_allclose(got[-1], ref[-1], rtol=1e-5, err_msg=what)  # the margin
            assert done == 0
