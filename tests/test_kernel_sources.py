"""Every CUDA source in pystrom/kernels compiles as host C++, and defines every kernel the package asks for.

CI has no GPU, so a syntax error in a ``.cu`` file, a template that no longer instantiates, or a kernel
removed or renamed while Python still asks for it would first show on the GPU machine, at a user's
first call. Here each source is compiled by the host compiler with CUDA's keywords and intrinsics defined
away (SHIM: compile-time stand-ins, never run), and the names are looked up in the result: every name
passed as a literal to ``kernels.kernel`` / ``kernels.launch`` anywhere in the package, and every name
the logistic passes build (ml/_narrow.py, ml/_wide.py from their shape tables). NVRTC, not g++, compiles
them for real: this catches what both would refuse, not everything NVRTC would. The kernels' arithmetic is
tested elsewhere (the emulated narrow pass, where's generated source) and on the GPU machine.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import ctypes
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

import pystrom
from pystrom.ml import _wide
from pystrom.ml._pass import MAX_KERNEL_FEATURES

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler (the project's extension needs one anyway)")

SHIM = r"""
#include <cmath>
#include <cstring>
using std::isfinite;
using std::isinf;
struct Dim3 { unsigned x = 1, y = 1, z = 1; };
static Dim3 blockIdx, blockDim, gridDim, threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)
static inline void __syncthreads() {}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int, int = 32) { return v; }
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
struct float4 { float x, y, z, w; };
struct double2 { double x, y; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
template <typename T> static inline T __shfl_down_sync(unsigned, T v, int, int = 32) { return v; }
template <typename T> static inline T __shfl_sync(unsigned, T v, int, int = 32) { return v; }
template <typename T> static inline T __ldg(const T* p) { return *p; }
template <typename T> static inline T __ldcg(const T* p) { return *p; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
template <typename T> static inline T atomicMin(T* p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T> static inline T atomicMax(T* p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <typename T> static inline T atomicAdd(T* p, T v) { T o = *p; *p += v; return o; }
template <typename T> static inline T atomicOr(T* p, T v) { T o = *p; *p |= v; return o; }
static inline void __threadfence() {}
struct float2 { float x, y; };
static inline float __fdividef(float a, float b) { return a / b; }
#define __expf(x) std::exp((float)(x))
#define __logf(x) std::log((float)(x))
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  s &= 31;
  return s ? (lo >> s) | (hi << (32 - s)) : lo;
}
static inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
  s &= 31;
  return s ? (hi << s) | (lo >> (32 - s)) : hi;
}
static inline void __syncwarp(unsigned = 0xffffffffu) {}
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
static inline int __clz(int v) { return v ? __builtin_clz((unsigned)v) : 32; }
static inline int __ffs(int v) { return __builtin_ffs(v); }
static inline unsigned __ballot_sync(unsigned, int p) { return p ? 1u : 0u; }
static inline int __any_sync(unsigned, int p) { return p; }
static inline int __all_sync(unsigned, int p) { return p; }
#define __align__(n) __attribute__((aligned(n)))
template <typename T> static inline T atomicAnd(T* p, T v) { T o = *p; *p &= v; return o; }
template <typename T> static inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long both = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((both >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
"""

SOURCES = sorted(p.stem for p in Path(str(resources.files("pystrom.kernels"))).glob("*.cu"))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, ctypes.CDLL]:
    work = tmp_path_factory.mktemp("kernels")

    def build(name: str) -> tuple[str, subprocess.CompletedProcess]:
        source = resources.files("pystrom.kernels").joinpath(f"{name}.cu").read_text(encoding="utf-8")
        (work / f"{name}.cpp").write_text(SHIM + source)
        cmd = [
            CXX,
            "-O0",
            "-std=c++17",
            "-w",
            "-shared",
            "-fPIC",
            "-o",
            str(work / f"{name}.so"),
            str(work / f"{name}.cpp"),
        ]
        return name, subprocess.run(cmd, capture_output=True, text=True)

    with cf.ThreadPoolExecutor(4) as pool:
        built = dict(pool.map(build, SOURCES))
    failed = {n: r.stderr[-2000:] for n, r in built.items() if r.returncode}
    assert not failed, f"kernel sources that do not compile as C++: {failed}"
    return {n: ctypes.CDLL(str(work / f"{n}.so")) for n in SOURCES}


def _literal_requests() -> set[tuple[str, str]]:
    """(source, kernel) of every kernel(...) / launch(...) call in the package whose first two arguments
    are string literals."""
    found = set()
    for path in Path(pystrom.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            a, b = node.args[:2]
            if name in ("kernel", "launch") and all(
                isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (a, b)
            ):
                found.add((a.value, b.value))
    return found


def _logistic_requests() -> set[tuple[str, str]]:
    """The names ml/_narrow.py and ml/_wide.py build, over every shape their tables allow."""
    out = set()
    for t in ("f32", "f64"):
        for k in range(1, MAX_KERNEL_FEATURES + 1):
            out |= {
                ("logistic", f"logit_pass_{t}_k{k}"),
                ("logistic", f"logit_spec_{t}_k{k}"),
                ("logistic", f"logit_step_k{k}"),
            }
        for z in ("32", "64"):
            for threads, f in _wide._FUSED:
                out.add(("logistic_wide", f"logit_wide_fused_{t}_z{z}_f{f}_r{_wide._ROWS_PER_WARP}_t{threads}"))
            for threads, q in _wide._VECTOR:
                out.add(("logistic_wide", f"logit_wide_vec_{t}_z{z}_q{q}_t{threads}"))
    return out


def test_every_source_compiles(compiled):
    assert set(compiled) == set(SOURCES) and len(SOURCES) >= 10


def test_every_kernel_asked_for_is_defined(compiled):
    literal = _literal_requests()
    assert len(literal) >= 15, literal  # the scan finds the package's calls (17 when written)
    assert {s for s, _ in literal} <= set(SOURCES), literal
    missing = sorted((s, k) for s, k in literal | _logistic_requests() if not hasattr(compiled[s], k))
    assert not missing, f"kernels asked for but not defined: {missing}"


def test_the_check_sees_a_missing_kernel(compiled):
    assert hasattr(compiled["logistic_wide"], "logit_wide_finish")
    assert not hasattr(compiled["logistic_wide"], "logit_wide_fused_f32_z32_f1_r2_t256")  # R = 2: not compiled
