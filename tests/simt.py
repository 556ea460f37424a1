"""CUDA kernel sources run on the CPU: a SIMT emulation for the host compiler (the tests' own tool).

:data:`EMULATOR` is prepended to a kernel source, which is then compiled as C++20 by the host compiler:
a block's threads are ``std::thread``s, ``__syncthreads`` a ``std::barrier``, a warp shuffle an exchange
between two barriers of the warp; blocks run one after another, so ``__shared__`` (made ``static``)
variables belong to the running block, and a thread that returns counts as arrived, as on a GPU. It
checks a kernel's indexing, reductions and barriers against a NumPy twin on machines without a GPU
(CI). It knows only the intrinsics the emulated kernels use, and nothing of timing: a missing barrier
may well pass here.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from importlib import resources
from pathlib import Path

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

EMULATOR = r"""
// SIMT emulation for host C++: a block's threads are std::threads, __syncthreads a std::barrier,
// warp shuffles a per-warp exchange between two barriers; blocks run one after another, so
// __shared__ (static) variables are the running block's. Threads that return count as arrived.
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
using std::isfinite;
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
template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int mask, int = 32) {
  static_assert(sizeof(T) <= 8, "8-byte slots");
  const unsigned t = threadIdx.x, w = t / 32;
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu_block->slots[t] = bits;
  emu_block->warps[w]->arrive_and_wait();
  T out;
  bits = emu_block->slots[w * 32 + ((t % 32) ^ (unsigned)mask)];
  std::memcpy(&out, &bits, sizeof(T));
  emu_block->warps[w]->arrive_and_wait();
  return out;
}
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
struct float4 { float x, y, z, w; };
struct double2 { double x, y; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

template <typename F>
static void emu_launch(unsigned grid, unsigned threads, F body) {
  gridDim.x = grid;
  blockDim.x = threads;
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx.x = b;
    EmuBlock eb;
    eb.block = std::make_unique<std::barrier<>>(threads);
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) eb.warps.push_back(std::make_unique<std::barrier<>>(32));
    eb.slots.assign(threads, 0);
    emu_block = &eb;
    std::vector<std::thread> team;
    team.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
      team.emplace_back([&eb, &body, t] {
        threadIdx.x = t;
        body();
        eb.warps[t / 32]->arrive_and_drop();
        eb.block->arrive_and_drop();
      });
    }
    for (auto& th : team) th.join();
  }
}
"""


def build(source_name: str, wrappers: str, work: Path) -> ctypes.CDLL:
    """``kernels/<source_name>.cu`` after the emulator, then ``wrappers`` (extern "C" functions that call
    ``emu_launch``), as a shared library in ``work``."""
    source = resources.files("pystrom.kernels").joinpath(f"{source_name}.cu").read_text(encoding="utf-8")
    cpp, lib = work / f"{source_name}_emulated.cpp", work / f"{source_name}_emulated.so"
    cpp.write_text(EMULATOR + source + wrappers)
    cmd = [
        CXX,
        "-O1",
        "-std=c++20",
        "-pthread",
        "-w",
        "-fno-strict-aliasing",
        "-shared",
        "-fPIC",
        "-o",
        str(lib),
        str(cpp),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{source_name}.cu does not compile under the emulator:\n{done.stderr[-3000:]}"
    return ctypes.CDLL(str(lib))
