"""The narrow logistic pass (kernels/logistic.cu, 40M x 4 float32, the seed fit's kernel) compiled with each
variant of its tuning macros and timed one pass at a time against the read-only floor, on one GPU:

    python benchmarks/narrow_variants.py [rows]

Each variant's sums are compared with the default build's (the same rows, another grid may sum in another
order: 1e-9 relative). The table at the end gives us per pass, the share of the read-only kernel's rate, the
registers and spills, and the resident blocks per SM. Used to choose the defaults in logistic.cu (issue 37).
"""

from __future__ import annotations

import sys
from importlib import resources

import cupy
import numpy as np

from pystrom.ml._narrow import _resident_blocks, layout_size

VARIANTS = {
    "default": (),
    "R_ROWS=1": ("-DR_ROWS=1",),
    "min_blocks 5": ("-DLOGIT_MIN_BLOCKS(K)=5",),
    "R_ROWS=1, min_blocks 5": ("-DR_ROWS=1", "-DLOGIT_MIN_BLOCKS(K)=5"),
    "no prefetch, R_ROWS=2, min_blocks 5": ("-DLOGIT_NO_PREFETCH", "-DR_ROWS=2", "-DLOGIT_MIN_BLOCKS(K)=5"),
    "no prefetch, R_ROWS=4": ("-DLOGIT_NO_PREFETCH", "-DR_ROWS=4"),
}


def _median_ms(fn, repeat: int = 25) -> float:
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000_000
    k = 4
    rng = cupy.random.default_rng(1)
    X = rng.standard_normal((n, k), dtype=np.float32)
    y = (rng.random(n) < 0.4).astype(np.uint8)
    m = layout_size(k)
    code = resources.files("pystrom.kernels").joinpath("logistic.cu").read_text()
    sms = int(cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"])

    # the floor: a read-only kernel over the same bytes (float4 loads, nothing written)
    floor_src = r"""
    extern "C" __global__ void ro(const float4* a, const unsigned char* y, long long n4, long long n, float* out) {
      float s = 0.f;
      unsigned t = 0;
      for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
           i += (long long)gridDim.x * blockDim.x) {
        float4 v = __ldg(a + i);
        s += v.x + v.y + v.z + v.w;
        if (i < n) t += y[i];
      }
      if (s == 12345.f && t == 7u) out[0] = s;
    }"""
    ro = cupy.RawKernel(floor_src, "ro")
    out = cupy.zeros(1, dtype=np.float32)
    floor = _median_ms(lambda: ro((sms * 8,), (256,), (X, y, np.int64(n * k // 4), np.int64(n), out)))
    print(f"{n:,} x {k} float32: read-only kernel {floor * 1e3:.0f} us ({(n * (4 * k + 1)) / floor / 1e6:.0f} GB/s)")

    w = [np.float64(v) for v in (0.3, -0.2, 0.1, 0.05, 0.2)] + [np.float64(0)] * 4
    rows = []
    reference = None
    for name, options in VARIANTS.items():
        module = cupy.RawModule(code=code, options=("--std=c++17", *options))
        fn = module.get_function("logit_pass_f32_k4")
        blocks = max(1, min((n + 127) // 128, sms * _resident_blocks(fn, 4)))
        partials = cupy.empty((blocks, m), dtype=np.float64)
        done = cupy.zeros(1, dtype=np.uint32)
        res = cupy.empty(m + 32, dtype=np.float64)
        args = (X, np.int64(n), np.int64(k), np.int64(1), y, partials, np.int32(0), np.int32(1),
                np.float64(1.0), np.float64(1.0), *w, np.uint64(0), np.uint64(0), partials, done, res)  # fmt: skip

        def once(fn=fn, blocks=blocks, args=args):
            fn((blocks,), (128,), args)

        once()
        t = _median_ms(once)
        sums = res[:m].get()
        if reference is None:
            reference = sums
        err = float(np.max(np.abs(sums - reference) / np.maximum(np.abs(reference), 1e-300)))
        regs = fn.num_regs
        spill = fn.local_size_bytes
        rows.append((name, t * 1e3, floor / t, regs, spill, blocks // sms, err))
    head = ("variant", "us/pass", "of floor", "regs", "local B", "blk/SM", "max rel diff")
    print("{:40s} {:>8s} {:>8s} {:>5s} {:>7s} {:>6s} {:>12s}".format(*head))
    for name, us, share, regs, spill, per_sm, err in rows:
        print(f"{name:40s} {us:8.0f} {share:8.2f} {regs:5d} {spill:7d} {per_sm:6d} {err:12.1e}")


if __name__ == "__main__":
    main()
