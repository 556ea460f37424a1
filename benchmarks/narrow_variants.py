"""The narrow logistic pass (kernels/logistic.cu, 40M x 4 float32, the seed fit's kernel) compiled with each
variant of its tuning macros and timed one pass at a time against the read-only floor, on one GPU:

    python benchmarks/narrow_variants.py [rows] [--bounds]

Each variant's sums are compared with the default build's (the same rows, another grid may sum in another
order: 1e-9 relative). The table at the end gives us per pass, the share of the read-only kernel's rate, the
registers and spills, and the resident blocks per SM. Used to choose the defaults in logistic.cu (issue 37).

``--bounds`` adds redesigns measured before anyone builds them: the kernel's source edited (BOUNDS below) so
that part of each row's arithmetic runs in float32. Their sums differ from the kernel's by float32 rounding
(tests/test_logistic_kernel.py checks they stay that close), so each row is what that much less arithmetic
could gain at most, not a kernel the fit could use as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import resources

VARIANTS = {
    "default": (),
    "R_ROWS=1": ("-DR_ROWS=1",),
    "min_blocks 5": ("-DLOGIT_MIN_BLOCKS(K)=5",),
    "R_ROWS=1, min_blocks 5": ("-DR_ROWS=1", "-DLOGIT_MIN_BLOCKS(K)=5"),
    "no prefetch, R_ROWS=2, min_blocks 5": ("-DLOGIT_NO_PREFETCH", "-DR_ROWS=2", "-DLOGIT_MIN_BLOCKS(K)=5"),
    "no prefetch, R_ROWS=4": ("-DLOGIT_NO_PREFETCH", "-DR_ROWS=4"),
    # the build an unweighted fit runs (the timed pass has no weights: every variant computes the same sums)
    "unweighted build": ("-DLOGIT_UNWEIGHTED",),
    "unweighted, R_ROWS=4": ("-DLOGIT_UNWEIGHTED", "-DR_ROWS=4"),
    "unweighted, min_blocks 5": ("-DLOGIT_UNWEIGHTED", "-DLOGIT_MIN_BLOCKS(K)=5"),
}


def _replace(src: str, old: str, new: str) -> str:
    if old not in src:
        raise ValueError(f"kernels/logistic.cu no longer holds the text this bound edits: {old[:60]!r}")
    return src.replace(old, new)


_SUM_START = "  auto sum = [&](long long base"
_ROWS_END = "#endif\n}\n\n// A thread's sums at the start of a pass"
_HESSIAN = """      int t = 0;
#pragma unroll
      for (int a = 0; a < P; ++a) {
        const double ra = rw * x[a];
#pragma unroll
        for (int b = a; b < P; ++b, ++t) acc[t] = fma(ra, x[b], acc[t]);
      }"""


def float32_hessian(src: str) -> str:
    """X^T R X summed per thread in float32 (r and x rounded to float32), added to the float64 sums once
    at the end; eta, the gradient and the log-likelihood as the kernel has them."""
    src = _replace(src, _SUM_START, "  float h32[NT] = {};\n" + _SUM_START)
    src = _replace(
        src,
        _HESSIAN,
        """      {
        const float rf = (float)rw;
        float xf[P];
#pragma unroll
        for (int j = 0; j < K; ++j) xf[j] = (float)xv[r][j];
        xf[K] = 1.0f;
        int t = 0;
#pragma unroll
        for (int a = 0; a < P; ++a) {
          const float ra = rf * xf[a];
#pragma unroll
          for (int b = a; b < P; ++b, ++t) h32[t] = fmaf(ra, xf[b], h32[t]);
        }
      }""",
    )
    flush = "#endif\n  for (int t = 0; t < NT; ++t) acc[t] += (double)h32[t];\n"
    return _replace(src, _ROWS_END, flush + _ROWS_END[len("#endif\n") :])


def float32_rows(src: str) -> str:
    """Every value of a row in float32 (eta from the weights rounded to float32) and every sum per thread
    in float32, added to the float64 sums once at the end: no float64 arithmetic per row at all."""
    start = src.index(_SUM_START)
    end = src.index("  const long long first =", start)
    body = r"""  float a32[NS] = {}, low = (float)min_margin, w32[P];
  for (int j = 0; j < P; ++j) w32[j] = (float)wv[j];
  auto sum = [&](long long base, const T (&xv)[R_ROWS][K], const unsigned char (&yv)[R_ROWS],
                 const double (&sv)[R_ROWS]) {
#pragma unroll
    for (int r = 0; r < R_ROWS; ++r) {
      if (base + r * stride >= n) continue;
      float x[P];
#pragma unroll
      for (int j = 0; j < K; ++j) x[j] = (float)xv[r][j];
      x[K] = 1.0f;
      float eta = w32[K];
#pragma unroll
      for (int j = 0; j < K; ++j) eta = fmaf(w32[j], x[j], eta);
      if (!isfinite(eta)) {
        a32[NS - 2] += 1.0f;
        continue;
      }
      const int yi = yv[r] != 0;
      const float s = (float)(sv[r] * (yi ? cw1 : cw0));
      if (s == 0.0f) continue;
      const float e = __expf(-fabsf(eta)), inv = __fdividef(1.0f, 1.0f + e), l1p = log1pf(e);
      const float rw = s * e * inv * inv, miss = (yi != 0) != (eta >= 0.0f) ? inv : e * inv;
      const float resid = yi ? s * miss : -s * miss;
      int t = 0;
#pragma unroll
      for (int a = 0; a < P; ++a) {
        const float ra = rw * x[a];
#pragma unroll
        for (int b = a; b < P; ++b, ++t) a32[t] = fmaf(ra, x[b], a32[t]);
      }
#pragma unroll
      for (int a = 0; a < P; ++a) a32[NT + a] = fmaf(resid, x[a], a32[NT + a]);
      a32[NT + P] += s * ((float)yi * eta - (fmaxf(eta, 0.0f) + l1p));
      a32[NT + P + 1] += s;
      a32[NT + P + 2] += s * (float)yi;
      const float margin = yi ? eta : -eta;
      if (margin > 20.0f) a32[NS - 1] += 1.0f;
      low = fminf(low, margin);
    }
  };
"""
    src = src[:start] + body + src[end:]
    flush = "#endif\n  for (int t = 0; t < NS; ++t) acc[t] += (double)a32[t];\n"
    flush += "  min_margin = fmin(min_margin, (double)low);\n"
    return _replace(src, _ROWS_END, flush + _ROWS_END[len("#endif\n") :])


def log1p_series(src: str) -> str:
    """log(1 + e) for e in [0, 1] as 2 atanh(e / (2 + e)), seven terms (a few float32 ulps) instead of
    log1pf (one ulp, ~25 instructions)."""
    series = """__device__ __forceinline__ float log1p_unit(float e) {
  const float u = __fdividef(e, 2.0f + e), v = u * u;
  float p = 1.0f / 13.0f;
  p = fmaf(p, v, 1.0f / 11.0f);
  p = fmaf(p, v, 1.0f / 9.0f);
  p = fmaf(p, v, 1.0f / 7.0f);
  p = fmaf(p, v, 1.0f / 5.0f);
  p = fmaf(p, v, 1.0f / 3.0f);
  p = fmaf(p, v, 1.0f);
  return 2.0f * u * p;
}

"""
    src = _replace(src, "// e = exp(-|eta|), inv = 1 / (1 + e)", series + "// e = exp(-|eta|), inv = 1 / (1 + e)")
    return _replace(src, "l1p = (double)log1pf(ef);", "l1p = (double)log1p_unit(ef);")


BOUNDS: dict[str, tuple[Callable[[str], str], ...]] = {
    "bound: Hessian summed in float32": (float32_hessian,),
    "bound: log(1 + e) by a series": (log1p_series,),
    "bound: both": (float32_hessian, log1p_series),
    "bound: every row value in float32": (float32_rows,),
}


def kernel_source(edits: tuple[Callable[[str], str], ...] = ()) -> str:
    src = resources.files("pystrom.kernels").joinpath("logistic.cu").read_text()
    for edit in edits:
        src = edit(src)
    return src


def _median_ms(cupy, fn, repeat: int = 25) -> float:
    import numpy as np

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
    import cupy
    import numpy as np

    from pystrom.ml._narrow import _resident_blocks, layout_size

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 40_000_000
    k = 4
    rng = cupy.random.default_rng(1)
    X = rng.standard_normal((n, k), dtype=np.float32)
    y = (rng.random(n) < 0.4).astype(np.uint8)
    m = layout_size(k)
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
    floor = _median_ms(cupy, lambda: ro((sms * 8,), (256,), (X, y, np.int64(n * k // 4), np.int64(n), out)))
    print(f"{n:,} x {k} float32: read-only kernel {floor * 1e3:.0f} us ({(n * (4 * k + 1)) / floor / 1e6:.0f} GB/s)")

    builds = {name: ((), options) for name, options in VARIANTS.items()}
    if "--bounds" in sys.argv:
        builds.update({name: (edits, ()) for name, edits in BOUNDS.items()})
    w = [np.float64(v) for v in (0.3, -0.2, 0.1, 0.05, 0.2)] + [np.float64(0)] * 4
    rows = []
    reference = None
    for name, (edits, options) in builds.items():
        # only a float32 fit's kernels of the timed width, as ml/_narrow.py logit_kernel builds them
        only = (f"-DLOGIT_K={k}", "-DLOGIT_F32_ONLY", "-DLOGIT_ONE_ARRAY_ONLY")
        module = cupy.RawModule(code=kernel_source(edits), options=("--std=c++17", *only, *options))
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
        t = _median_ms(cupy, once)
        sums = res[:m].get()
        if reference is None:
            reference = sums
        err = float(np.max(np.abs(sums - reference) / np.maximum(np.abs(reference), 1e-300)))
        rows.append((name, t * 1e3, floor / t, fn.num_regs, fn.local_size_bytes, blocks // sms, err))
    head = ("variant", "us/pass", "of floor", "regs", "local B", "blk/SM", "max rel diff")
    print("{:40s} {:>8s} {:>8s} {:>5s} {:>7s} {:>6s} {:>12s}".format(*head))
    for name, us, share, regs, spill, per_sm, err in rows:
        print(f"{name:40s} {us:8.0f} {share:8.2f} {regs:5d} {spill:7d} {per_sm:6d} {err:12.1e}")


if __name__ == "__main__":
    main()
