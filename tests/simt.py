"""CUDA kernel sources run on the CPU: a SIMT emulation for the host compiler (the tests' own tool).

:data:`EMULATOR` is prepended to a kernel source, which is then compiled as C++20 by the host compiler:
a block's threads are OS threads (Python threads calling the kernel through ctypes, without the GIL),
``__syncthreads`` a ``std::barrier``, a warp shuffle an exchange between two barriers of the warp;
blocks run one after another, so ``__shared__`` (made ``static``)
variables belong to the running block, and a thread that returns counts as arrived, as on a GPU. It
checks a kernel's indexing, reductions and barriers against a NumPy twin on machines without a GPU
(CI). It knows only the intrinsics the emulated kernels use, and nothing of timing: a missing barrier
may well pass here.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
from importlib import resources
from pathlib import Path

import numpy as np

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

EMULATOR = r"""
// SIMT emulation for host C++: a block's threads are OS threads, __syncthreads a std::barrier,
// warp shuffles a per-warp exchange between two barriers; blocks run one after another, so
// __shared__ (static) variables are the running block's. Threads that return count as arrived.
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>
using std::isfinite;
using std::isinf;
struct Dim3 { unsigned x = 1, y = 1, z = 1; };
static Dim3 blockIdx, blockDim, gridDim;
static thread_local Dim3 threadIdx;
struct EmuBlock {
  std::unique_ptr<std::barrier<>> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<unsigned long long> slots;
};
static EmuBlock* emu_block;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)
static inline void __syncthreads() { emu_block->block->arrive_and_wait(); }
// A warp shuffle: every lane publishes v, then reads the value of lane source(lane) (its own where that
// is 32 or more), between two barriers of the warp.
template <typename T, typename Source>
static inline T emu_shuffle(T v, Source source) {
  static_assert(sizeof(T) <= 8, "8-byte slots");
  const unsigned t = threadIdx.x, w = t / 32;
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu_block->slots[t] = bits;
  emu_block->warps[w]->arrive_and_wait();
  T out = v;
  const unsigned from = source(t % 32);
  if (from < 32) {
    bits = emu_block->slots[w * 32 + from];
    std::memcpy(&out, &bits, sizeof(T));
  }
  emu_block->warps[w]->arrive_and_wait();
  return out;
}
template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int mask, int = 32) {
  return emu_shuffle(v, [mask](unsigned lane) { return lane ^ (unsigned)mask; });  // out of range: its own
}
template <typename T>
static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int = 32) {
  return emu_shuffle(v, [delta](unsigned lane) { return lane + delta; });  // past the end: its own value
}
template <typename T>
static inline T __shfl_sync(unsigned, T v, int src, int = 32) {
  return emu_shuffle(v, [src](unsigned) { return (unsigned)src & 31; });
}
template <typename T>
static inline T __ldcg(const T* p) { return *p; }
static inline float __fdividef(float a, float b) { return a / b; }
#define __expf(x) std::exp((float)(x))  // CUDA's fast exp: here the C library's (the tests allow its ulps)
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline int __double2hiint(double d) { long long v; std::memcpy(&v, &d, 8); return (int)(v >> 32); }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
struct float4 { float x, y, z, w; };
struct double2 { double x, y; };
struct float2 { float x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };  // CUDA's: 16-byte aligned
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

// atomics: the emulated threads run at once, so these are atomic on the host too
template <typename T>
static inline T atomicCAS(T* p, T expected, T v) {
  __atomic_compare_exchange_n(p, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
template <typename T>
static inline T atomicMin(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <typename T>
static inline T atomicMax(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <typename T>
static inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
static inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
static inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// correctly rounded double arithmetic: what x86-64's SSE2 does, with C++20's default -ffp-contract=off
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long both = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((both >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_block->warps[threadIdx.x / 32]->arrive_and_wait(); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
// The lanes' predicates (__ballot_sync) or the lanes holding the same value (__match_any_sync) as a mask,
// between two barriers of the warp.
template <typename Bit>
static inline unsigned emu_vote(unsigned long long v, Bit bit) {
  const unsigned t = threadIdx.x, w = t / 32;
  emu_block->slots[t] = v;
  emu_block->warps[w]->arrive_and_wait();
  unsigned mask = 0;
  for (unsigned i = 0; i < 32; ++i) mask |= bit(emu_block->slots[w * 32 + i], v) ? 1u << i : 0u;
  emu_block->warps[w]->arrive_and_wait();
  return mask;
}
static inline unsigned __ballot_sync(unsigned, int pred) {
  return emu_vote(pred != 0, [](unsigned long long other, unsigned long long) { return other != 0; });
}
template <typename T>
static inline unsigned __match_any_sync(unsigned, T v) {
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return emu_vote(bits, [](unsigned long long other, unsigned long long mine) { return other == mine; });
}
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == 0xffffffffu; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
template <typename T> static inline T __ldg(const T* p) { return *p; }
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  s &= 31;
  return s ? (lo >> s) | (hi << (32 - s)) : lo;
}
#define __align__(n) __attribute__((aligned(n)))

// A launch driven from Python (Emulated.launch): a block begun, each of its threads entering, calling
// the kernel through ctypes on a thread of its own, and leaving; then the block ended.
static EmuBlock* emu_python_block;
extern "C" void emu_block_begin(unsigned grid_x, unsigned grid_y, unsigned threads, unsigned x, unsigned y) {
  gridDim.x = grid_x;
  gridDim.y = grid_y;
  blockDim.x = threads;
  blockIdx.x = x;
  blockIdx.y = y;
  emu_python_block = new EmuBlock;
  emu_python_block->block = std::make_unique<std::barrier<>>(threads);
  for (unsigned w = 0; w < (threads + 31) / 32; ++w)
    emu_python_block->warps.push_back(std::make_unique<std::barrier<>>(32));
  emu_python_block->slots.assign(threads, 0);
  emu_block = emu_python_block;
}
extern "C" void emu_thread_enter(unsigned t) { threadIdx.x = t; }
extern "C" void emu_thread_exit(unsigned t) {
  emu_block->warps[t / 32]->arrive_and_drop();
  emu_block->block->arrive_and_drop();
}
extern "C" void emu_block_end() {
  delete emu_python_block;
  emu_python_block = nullptr;
}

"""


def build(
    source_name: str,
    wrappers: str,
    work: Path,
    mutant: tuple[str, str] | None = None,
    defines: tuple[str, ...] = (),
) -> ctypes.CDLL:
    """``kernels/<source_name>.cu`` after the emulator, then ``wrappers`` (more C++), as a shared library
    in ``work``. ``mutant``: (text, replacement) made once in the source first (a planted bug that the
    test using it must catch); the text must be there. ``defines``: ``"NAME=value"`` for the compiler, as
    ``kernels.kernel`` passes them to NVRTC."""
    source = resources.files("pystrom.kernels").joinpath(f"{source_name}.cu").read_text(encoding="utf-8")
    stem = source_name
    if mutant is not None:
        assert source.count(mutant[0]) == 1, f"the mutant's text is not in {source_name}.cu once: {mutant[0]!r}"
        source = source.replace(mutant[0], mutant[1])
        stem += f"_mutant{abs(hash(mutant)) % 10**8}"
    if defines:
        stem += f"_defines{abs(hash(defines)) % 10**8}"
    cpp, lib = work / f"{stem}_emulated.cpp", work / f"{stem}_emulated.so"
    cpp.write_text(EMULATOR + source + wrappers)
    cmd = [
        CXX,
        "-O1",
        "-std=c++20",
        "-pthread",
        "-w",
        "-fno-strict-aliasing",
        "-ffp-contract=off",
        "-shared",
        "-fPIC",
        *(f"-D{d}" for d in defines),
        "-o",
        str(lib),
        str(cpp),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{source_name}.cu does not compile under the emulator:\n{done.stderr[-3000:]}"
    return ctypes.CDLL(str(lib))


_C_TYPES = {
    np.dtype(np.int64): ctypes.c_longlong,
    np.dtype(np.int32): ctypes.c_int,
    np.dtype(np.uint32): ctypes.c_uint,
    np.dtype(np.uint64): ctypes.c_ulonglong,
    np.dtype(np.float64): ctypes.c_double,
    np.dtype(np.float32): ctypes.c_float,
}


class Emulated:
    """``kernels/<source_name>.cu`` under the emulation, launched as ``pystrom.kernels.launch`` launches:
    a grid-stride kernel of 256-thread blocks, its arguments NumPy arrays (passed as host pointers) and
    NumPy scalars. ``max_blocks`` keeps the grid small (grid-stride kernels are right for any grid)."""

    def __init__(
        self, source_name: str, work: Path, mutant: tuple[str, str] | None = None, defines: tuple[str, ...] = ()
    ):
        self.lib = build(source_name, "", work, mutant, defines)

    def launch(self, function: str, work_items: int, args: tuple, max_blocks: int = 1, timeout: float = 120.0) -> None:
        if work_items > 0:
            self.launch_grid(function, (min(-(-work_items // 256), max_blocks), 1), args, timeout=timeout)

    def launch_grid(
        self, function: str, grid: tuple[int, int], args: tuple, timeout: float = 120.0, threads: int = 256
    ) -> None:
        """One launch of ``threads``-thread blocks over a (x, y) grid, the blocks one after another."""
        fn = getattr(self.lib, function)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p if isinstance(a, np.ndarray) or a is None else _C_TYPES[np.asarray(a).dtype]
                       for a in args]  # fmt: skip
        cargs = [a.ctypes.data if isinstance(a, np.ndarray) else a for a in args]
        u = ctypes.c_uint
        for y in range(grid[1]):
            for x in range(grid[0]):
                self.lib.emu_block_begin(u(grid[0]), u(grid[1]), u(threads), u(x), u(y))

                def run(t: int) -> None:
                    self.lib.emu_thread_enter(ctypes.c_uint(t))
                    try:
                        fn(*cargs)
                    finally:
                        self.lib.emu_thread_exit(ctypes.c_uint(t))

                team = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
                for t in team:
                    t.start()
                for t in team:
                    t.join(timeout)
                    assert not t.is_alive(), f"{function}: an emulated thread did not finish (a barrier never reached?)"
                self.lib.emu_block_end()
