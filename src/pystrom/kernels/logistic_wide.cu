// One IRLS pass for wide fits (more than 8 features, C-order rows), with the features' block of the
// Hessian formed by cuBLAS from the scaled rows Z (ml/_wide.py):
//
//   logit_wide_fused_*: one read of X: eta, each row's weight r and residual s (y - mu), the per-row
//     totals, X^T [resid, r] in float64, and Z = the rows scaled by sqrt(r), in float32 (for a float32
//     or TF32 GEMM) or float64 (the exact passes: the first, and the statistics' at the end);
//   cuBLAS: Z^T Z by blocks of rows (logit_wide_gram_sum adds the blocks in float64);
//   logit_wide_finish: the pass's flat vector and its full Hessian;
//   logit_wide_system, cuSOLVER, logit_wide_next: the Newton step on the device and the next weights.
//
// The per-row arithmetic is the narrow kernel's (logistic.cu: float32 sigmoids and logs for float32
// input), so its CPU twin is the same, ml/_pass.py xp_pass with hessian="float32"; the tests compare
// the two (tests/test_logistic_wide.py).

#define SATURATED_MARGIN 20.0  // ml/_pass.py

template <typename T>
struct WideMath {
  static __device__ __forceinline__ void eval(double eta, double& e, double& inv, double& l1p) {
    e = exp(-fabs(eta));
    inv = 1.0 / (1.0 + e);
    l1p = log1p(e);
  }
};

template <>
struct WideMath<float> {  // as xp_pass's _row_math for float32 input (IEEE float32 functions)
  static __device__ __forceinline__ void eval(double eta, double& e, double& inv, double& l1p) {
    const float ef = expf(-fabsf((float)eta));
    e = (double)ef;
    inv = (double)(1.0f / (1.0f + ef));
    l1p = (double)log1pf(ef);
  }
};

// A feature scaled by sqrt(r) for the Hessian's product: float32 input scaled in float32 (as xp_pass's
// _gram32), anything else in float64 then rounded to the output's type.
template <typename T, typename Z>
__device__ __forceinline__ Z scaled(T x, double root) { return (Z)((double)x * root); }
template <>
__device__ __forceinline__ float scaled<float, float>(float x, double root) { return x * (float)root; }

// ---------------------------------------------------------------------------------------------------
// The fused pass: rows and columns in one read of X, for k <= F x threads.
//
// A block walks tiles of W R rows (W = its warps). Phase A, a warp per R rows: eta, the row's weight r
// and residual, its per-row totals, with r, the residual and sqrt(r) left in shared memory. Phase B, a thread per feature (F features a thread): for each row of the tile, x_ij r_i and
// x_ij resid_i added to float64 sums held in registers, and z_ij = x_ij sqrt(r_i) written; the tile's
// values were just loaded by phase A, so phase B reads them from the SM's cache, and X crosses the
// memory bus once a pass instead of twice. The shared values are double-buffered: one barrier a tile.
//
// acc, per block, FUSED_STRIDE(k) float64: [0, k) sum x resid, [k, 2k) sum x r, then FUSED_TOTALS:
// log-likelihood, sum s, sum s y, non-finite rows, saturated rows, sum r, sum resid, min margin.
// A pass over several chunks launches the same grid each time; ``accumulate`` adds to the block's
// slots instead of overwriting them (blocks own their slots: no atomics).

#define FUSED_TOTALS 8
#define FUSED_STRIDE(k) (2 * (long long)(k) + FUSED_TOTALS)

// Row i's weight r and residual (rw, res) at its eta, and its per-row totals added: the same lines in both
// fused kernels. A macro, not a function: as a __device__ function (a struct of the totals) the compiler
// allocated the float32 kinds' registers differently (the f2 kind spilled 32 bytes, none before) and the
// 1M x 512 float32 fit took 131 ms instead of 125 (H200, 2026-11-29).
#define WIDE_ROW_TERMS                                                                                         \
  const double yv = y[i] ? 1.0 : 0.0;                                                                          \
  double s = (y[i] ? cw1 : cw0) * (has_sw ? sw[i] : 1.0);                                                      \
  if (!isfinite(eta)) { /* counted; weight 0 (the pass is then an error: ml/_sources.py) */                    \
    nonfinite += 1;                                                                                            \
    eta = 0;                                                                                                   \
    s = 0;                                                                                                     \
  }                                                                                                            \
  double e, inv, l1p;                                                                                          \
  WideMath<T>::eval(eta, e, inv, l1p);                                                                         \
  const double rw = s * e * inv * inv;                                                                         \
  /* y - mu from the probability of the class not observed (logistic.cu says why) */                           \
  const double miss = (yv != 0.0) != (eta >= 0) ? inv : e * inv;                                               \
  const double res = yv != 0.0 ? s * miss : -s * miss;                                                         \
  ll += s * (yv * eta - (fmax(eta, 0.0) + l1p));                                                               \
  ssum += s;                                                                                                   \
  sy += s * yv;                                                                                                \
  rsum += rw;                                                                                                  \
  ressum += res;                                                                                               \
  if (s != 0) {                                                                                                \
    const double m = yv > 0 ? eta : -eta;                                                                      \
    margin = fmin(margin, m);                                                                                  \
    if (m > SATURATED_MARGIN) saturated += 1;                                                                  \
  }

template <typename T, typename ZT, int F, int R>
__device__ __forceinline__ void wide_fused(const T* __restrict__ X, long long n, int k, long long rs,
                                           const unsigned char* __restrict__ y, const double* __restrict__ sw,
                                           int has_sw, double cw0, double cw1, const double* __restrict__ w,
                                           ZT* __restrict__ Z, double* __restrict__ acc, int accumulate) {
  __shared__ double s_r[2][32 * R], s_res[2][32 * R], s_root[2][32 * R];
  __shared__ double s_tot[32][FUSED_TOTALS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int tile = warps * R;
  const double b = w[k];
  double g[F], h[F];
#pragma unroll
  for (int f = 0; f < F; ++f) g[f] = h[f] = 0.0;
  double ll = 0, ssum = 0, sy = 0, nonfinite = 0, saturated = 0, rsum = 0, ressum = 0;
  double margin = __longlong_as_double(0x7ff0000000000000LL);
  int buf = 0;
  for (long long base = (long long)blockIdx.x * tile; base < n; base += (long long)gridDim.x * tile) {
    // phase A: R rows a warp, their loads interleaved (a row past n reads row n - 1 and is dropped)
    const T* xr[R];
    double dot[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      xr[r] = X + min(base + warp * R + r, n - 1) * rs;
      dot[r] = 0.0;
    }
#pragma unroll 8
    for (int j = lane; j < k; j += 32) {  // unrolled: a lane's loads of a row in flight together
      const double wj = w[j];
#pragma unroll
      for (int r = 0; r < R; ++r) dot[r] = fma((double)xr[r][j], wj, dot[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const long long i = base + warp * R + r;
      double acc_r = dot[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc_r += __shfl_xor_sync(0xffffffffu, acc_r, o);
      if (i >= n) continue;
      double eta = acc_r + b;
      WIDE_ROW_TERMS
      if (lane == 0) {
        s_r[buf][warp * R + r] = rw;
        s_res[buf][warp * R + r] = res;
        s_root[buf][warp * R + r] = sqrt(rw);
      }
    }
    __syncthreads();
    // phase B: a thread per feature over the tile's rows
    const int rows = (int)min((long long)tile, n - base);
    for (int q = 0; q < rows; ++q) {
      const long long iq = base + q;
      const T* x = X + iq * rs;
      const double rq = s_r[buf][q], resq = s_res[buf][q], rootq = s_root[buf][q];
#pragma unroll
      for (int f = 0; f < F; ++f) {
        const int j = threadIdx.x + f * blockDim.x;
        if (j < k) {
          const T xv = x[j];
          g[f] = fma((double)xv, resq, g[f]);
          h[f] = fma((double)xv, rq, h[f]);
          if (Z != nullptr) Z[iq * (long long)k + j] = scaled<T, ZT>(xv, rootq);
        }
      }
    }
    buf ^= 1;  // the next tile writes the other buffer; the one after it waits at the next barrier
  }
  double* out = acc + (long long)blockIdx.x * FUSED_STRIDE(k);
#pragma unroll
  for (int f = 0; f < F; ++f) {
    const int j = threadIdx.x + f * blockDim.x;
    if (j < k) {
      out[j] = accumulate ? out[j] + g[f] : g[f];
      out[k + j] = accumulate ? out[k + j] + h[f] : h[f];
    }
  }
  if (lane == 0) {  // every lane of a warp holds the same totals
    s_tot[warp][0] = ll;
    s_tot[warp][1] = ssum;
    s_tot[warp][2] = sy;
    s_tot[warp][3] = nonfinite;
    s_tot[warp][4] = saturated;
    s_tot[warp][5] = rsum;
    s_tot[warp][6] = ressum;
    s_tot[warp][7] = margin;
  }
  __syncthreads();
  if (threadIdx.x < FUSED_TOTALS) {
    const int t = threadIdx.x;
    double v = s_tot[0][t];
    for (int q = 1; q < warps; ++q) v = t == 7 ? fmin(v, s_tot[q][t]) : v + s_tot[q][t];
    double* slot = out + 2 * (long long)k + t;
    *slot = !accumulate ? v : t == 7 ? fmin(*slot, v) : *slot + v;
  }
}

#define WIDE_FUSED(T, ZT, F, R, THREADS, NAME)                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS, THREADS == 256 && F < 8 ? 4 : 2048 / THREADS / 2)       \
      logit_wide_fused_##NAME(                                   \
      const T* __restrict__ X, long long n, int k, long long rs, const unsigned char* __restrict__ y,            \
      const double* __restrict__ sw, int has_sw, double cw0, double cw1, const double* __restrict__ w,           \
      ZT* __restrict__ Z, double* __restrict__ acc, int accumulate) {                                            \
    wide_fused<T, ZT, F, R>(X, n, k, rs, y, sw, has_sw, cw0, cw1, w, Z, acc, accumulate);                        \
  }
// names: logit_wide_fused_<x>_z<z>_f<F>_r<R>_t<threads>; k <= F x threads, R rows a warp in phase A
#define WIDE_FUSED_ALL(F, R, THREADS)                                               \
  WIDE_FUSED(float, float, F, R, THREADS, f32_z32_f##F##_r##R##_t##THREADS)         \
  WIDE_FUSED(float, double, F, R, THREADS, f32_z64_f##F##_r##R##_t##THREADS)        \
  WIDE_FUSED(double, float, F, R, THREADS, f64_z32_f##F##_r##R##_t##THREADS)        \
  WIDE_FUSED(double, double, F, R, THREADS, f64_z64_f##F##_r##R##_t##THREADS)
#define WIDE_FUSED_SHAPES(R)    \
  WIDE_FUSED_ALL(1, R, 256)     \
  WIDE_FUSED_ALL(2, R, 256)     \
  WIDE_FUSED_ALL(4, R, 256)     \
  WIDE_FUSED_ALL(8, R, 256)     \
  WIDE_FUSED_ALL(8, R, 1024)
// WIDE_FUSED_F / WIDE_VEC_Q with WIDE_THREADS: only the kernels of that one shape (ml/_wide.py builds
// the shape a fit needs: NVRTC compiles every kernel of a source, and all of them took 6.7 s on a cold
// cache on an H200). WIDE_ONE_FUSED expands its arguments before WIDE_FUSED_ALL pastes them into names.
#define WIDE_ONE_FUSED(F, THREADS) WIDE_FUSED_ALL(F, 1, THREADS)
#if defined(WIDE_FUSED_F)
WIDE_ONE_FUSED(WIDE_FUSED_F, WIDE_THREADS)
#elif !defined(WIDE_VEC_Q)
WIDE_FUSED_SHAPES(1)  // R = 2 and 4 were no faster (H100, 1M x 256: 0.632 / 0.694 ms a chunk against 0.611)
#endif

// The same pass with 16-byte loads and stores (rows of k = a multiple of N = 16 / sizeof(T) values,
// 16-byte aligned): fewer instructions a value, where the scalar kernel is bound by issuing them (an
// H100's profile of the scalar kernel at 1M x 256: 63% of issue slots busy, integer ALU the top pipe,
// DRAM at 52%). Phase A reads each row as N-value vectors, a lane every 32nd; in phase B the block's
// threads form ``groups`` row groups of ``qb`` threads, each thread FQ vectors of columns, a group
// every groups-th row of the tile; the groups' sums are added in turn at the end.
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int N = 4;
  static __device__ __forceinline__ void load(const float* p, float* v) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
  }
};
template <>
struct Vec<double> {
  static constexpr int N = 2;
  static __device__ __forceinline__ void load(const double* p, double* v) {
    const double2 a = *reinterpret_cast<const double2*>(p);
    v[0] = a.x;
    v[1] = a.y;
  }
};
template <typename T, typename ZT, int N>
__device__ __forceinline__ void store_scaled(ZT* z, const T* v, double root) {
#pragma unroll
  for (int i = 0; i < N; ++i) z[i] = scaled<T, ZT>(v[i], root);
}
template <>
__device__ __forceinline__ void store_scaled<float, float, 4>(float* z, const float* v, double root) {
  const float r = (float)root;
  *reinterpret_cast<float4*>(z) = make_float4(v[0] * r, v[1] * r, v[2] * r, v[3] * r);
}

template <typename T, typename ZT, int FQ>
__device__ __forceinline__ void wide_fused_vec(const T* __restrict__ X, long long n, int k, long long rs,
                                               const unsigned char* __restrict__ y, const double* __restrict__ sw,
                                               int has_sw, double cw0, double cw1, const double* __restrict__ w,
                                               ZT* __restrict__ Z, double* __restrict__ acc, int accumulate) {
  constexpr int N = Vec<T>::N;
  __shared__ double s_r[2][32], s_res[2][32], s_root[2][32];
  __shared__ double s_tot[32][FUSED_TOTALS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int quads = k / N;
  const int qb = min(quads, (int)blockDim.x);
  const int groups = blockDim.x / qb;
  const int group = threadIdx.x / qb, col = threadIdx.x % qb;
  const double b = w[k];
  double g[FQ][N], h[FQ][N];
#pragma unroll
  for (int f = 0; f < FQ; ++f)
#pragma unroll
    for (int i = 0; i < N; ++i) g[f][i] = h[f][i] = 0.0;
  double ll = 0, ssum = 0, sy = 0, nonfinite = 0, saturated = 0, rsum = 0, ressum = 0;
  double margin = __longlong_as_double(0x7ff0000000000000LL);
  int buf = 0;
  for (long long base = (long long)blockIdx.x * warps; base < n; base += (long long)gridDim.x * warps) {
    const long long i = base + warp;
    if (i < n) {
      const T* x = X + i * rs;
      double dot = 0;
#pragma unroll 4
      for (int jq = lane; jq < quads; jq += 32) {
        T v[N];
        Vec<T>::load(x + jq * N, v);
#pragma unroll
        for (int t = 0; t < N; ++t) dot = fma((double)v[t], w[jq * N + t], dot);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      double eta = dot + b;
      WIDE_ROW_TERMS
      if (lane == 0) {
        s_r[buf][warp] = rw;
        s_res[buf][warp] = res;
        s_root[buf][warp] = sqrt(rw);
      }
    }
    __syncthreads();
    const int rows = (int)min((long long)warps, n - base);
    if (group < groups) {
      for (int q = group; q < rows; q += groups) {
        const long long iq = base + q;
        const T* x = X + iq * rs;
        const double rq = s_r[buf][q], resq = s_res[buf][q], rootq = s_root[buf][q];
#pragma unroll
        for (int f = 0; f < FQ; ++f) {
          const int jq = col + f * qb;
          if (jq < quads) {
            T v[N];
            Vec<T>::load(x + jq * N, v);
#pragma unroll
            for (int t = 0; t < N; ++t) {
              g[f][t] = fma((double)v[t], resq, g[f][t]);
              h[f][t] = fma((double)v[t], rq, h[f][t]);
            }
            if (Z != nullptr) store_scaled<T, ZT, N>(Z + iq * (long long)k + jq * N, v, rootq);
          }
        }
      }
    }
    buf ^= 1;
  }
  double* out = acc + (long long)blockIdx.x * FUSED_STRIDE(k);
  for (int gg = 0; gg < groups; ++gg) {  // the row groups' sums, one group at a time
    if (group == gg) {
#pragma unroll
      for (int f = 0; f < FQ; ++f) {
        const int jq = col + f * qb;
        if (jq < quads) {
#pragma unroll
          for (int t = 0; t < N; ++t) {
            const int j = jq * N + t;
            const bool add = accumulate || gg > 0;
            out[j] = add ? out[j] + g[f][t] : g[f][t];
            out[k + j] = add ? out[k + j] + h[f][t] : h[f][t];
          }
        }
      }
    }
    __syncthreads();
  }
  if (lane == 0) {
    s_tot[warp][0] = ll;
    s_tot[warp][1] = ssum;
    s_tot[warp][2] = sy;
    s_tot[warp][3] = nonfinite;
    s_tot[warp][4] = saturated;
    s_tot[warp][5] = rsum;
    s_tot[warp][6] = ressum;
    s_tot[warp][7] = margin;
  }
  __syncthreads();
  if (threadIdx.x < FUSED_TOTALS) {
    const int t = threadIdx.x;
    double v = s_tot[0][t];
    for (int q = 1; q < warps; ++q) v = t == 7 ? fmin(v, s_tot[q][t]) : v + s_tot[q][t];
    double* slot = out + 2 * (long long)k + t;
    *slot = !accumulate ? v : t == 7 ? fmin(*slot, v) : *slot + v;
  }
}

#define WIDE_VEC(T, ZT, FQ, THREADS, NAME)                                                                        \
  extern "C" __global__ void __launch_bounds__(THREADS, THREADS == 256 ? 4 : 1) logit_wide_vec_##NAME(           \
      const T* __restrict__ X, long long n, int k, long long rs, const unsigned char* __restrict__ y,            \
      const double* __restrict__ sw, int has_sw, double cw0, double cw1, const double* __restrict__ w,           \
      ZT* __restrict__ Z, double* __restrict__ acc, int accumulate) {                                            \
    wide_fused_vec<T, ZT, FQ>(X, n, k, rs, y, sw, has_sw, cw0, cw1, w, Z, acc, accumulate);                      \
  }
// names: logit_wide_vec_<x>_z<z>_q<FQ>_t<threads>; k <= FQ x threads x N (N = 4 for float32, 2 for float64)
#define WIDE_VEC_ALL(FQ, THREADS)                                       \
  WIDE_VEC(float, float, FQ, THREADS, f32_z32_q##FQ##_t##THREADS)       \
  WIDE_VEC(float, double, FQ, THREADS, f32_z64_q##FQ##_t##THREADS)      \
  WIDE_VEC(double, float, FQ, THREADS, f64_z32_q##FQ##_t##THREADS)      \
  WIDE_VEC(double, double, FQ, THREADS, f64_z64_q##FQ##_t##THREADS)
#define WIDE_ONE_VEC(FQ, THREADS) WIDE_VEC_ALL(FQ, THREADS)
#if defined(WIDE_VEC_Q)
WIDE_ONE_VEC(WIDE_VEC_Q, WIDE_THREADS)
#elif !defined(WIDE_FUSED_F)
WIDE_VEC_ALL(1, 256)
WIDE_VEC_ALL(2, 256)
WIDE_VEC_ALL(2, 1024)
WIDE_VEC_ALL(4, 1024)
#endif

// gram (k x k float64) = (or +=) the sum over ``blocks`` GEMM results (k x k each, column-major) of
// the elements (r, c) with r <= c: the column-major upper triangle, which logit_wide_finish reads as
// the row-major lower one (the GEMMs of the panels below it are not made: _wide.py _gram_blocks).
template <typename ZT>
__device__ __forceinline__ void gram_sum(const ZT* __restrict__ parts, int blocks, int k, double* __restrict__ gram,
                                         int accumulate) {
  const long long kk = (long long)k * k;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < kk; e += (long long)gridDim.x * blockDim.x) {
    if (e % k > e / k) continue;
    double v = 0;
    for (int q = 0; q < blocks; ++q) v += (double)parts[q * kk + e];
    gram[e] = accumulate ? gram[e] + v : v;
  }
}
extern "C" __global__ void logit_wide_gram_sum_z32(const float* __restrict__ parts, int blocks, int k,
                                                   double* __restrict__ gram, int accumulate) {
  gram_sum<float>(parts, blocks, k, gram, accumulate);
}
extern "C" __global__ void logit_wide_gram_sum_z64(const double* __restrict__ parts, int blocks, int k,
                                                   double* __restrict__ gram, int accumulate) {
  gram_sum<double>(parts, blocks, k, gram, accumulate);
}

// The pass's flat vector (ml/_pass.py's layout, P = k + 1) and its full Hessian, from the blocks' acc
// and the features' Gram matrix (k x k float64, row-major; the GEMMs' two triangles may differ in their
// last bits, so the lower one is read for both): a thread per output value, each summing its value
// over the blocks (min for the margin).
extern "C" __global__ void logit_wide_finish(const double* __restrict__ acc, int blocks, int k,
                                             const double* __restrict__ gram, double* __restrict__ out,
                                             double* __restrict__ H) {
  const long long p = k + 1, nt = p * (p + 1) / 2, stride = FUSED_STRIDE(k);
  const long long total = nt + p + 6;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total;
       o += (long long)gridDim.x * blockDim.x) {
    long long src = -1;  // a column of acc to sum over the blocks, or -1: from the Gram matrix
    long long r = 0, c = 0;
    if (o < nt) {  // row r, column c >= r of the upper triangle, row-major
      long long rem = o;
      while (rem >= p - r) {
        rem -= p - r;
        ++r;
      }
      c = r + rem;
      if (c == k && r == k) src = 2 * (long long)k + 5;  // sum r
      else if (c == k) src = k + r;                      // sum x_r r
    } else if (o < nt + k) {
      src = o - nt;  // sum x resid
    } else if (o == nt + k) {
      src = 2 * (long long)k + 6;  // sum resid
    } else {
      const long long t = o - nt - p;  // 0..4: ll, s, s y, non-finite, saturated; 5: margin
      src = 2 * (long long)k + (t < 5 ? t : 7);
    }
    double v;
    if (src < 0) {
      v = gram[c * (long long)k + r];  // c >= r: the lower triangle's (c, r)
    } else if (src == 2 * (long long)k + 7) {
      v = acc[src];
      for (int q = 1; q < blocks; ++q) v = fmin(v, acc[q * stride + src]);
    } else {
      v = 0;
      for (int q = 0; q < blocks; ++q) v += acc[q * stride + src];
    }
    out[o] = v;
    if (o < nt && H != nullptr) {
      H[r * p + c] = v;
      H[c * p + r] = v;
    }
  }
}

// The Newton step's system over the free parameters (ml/_irls.py IRLSSolver.penalized): A = H[a, a]
// plus l2 on the free features' diagonal, rhs = g[a] minus l2 w there; m = len(a), features first.
extern "C" __global__ void logit_wide_system(const double* __restrict__ H, const double* __restrict__ g,
                                             const double* __restrict__ w, const long long* __restrict__ a, int m,
                                             int nfree, double l2, int p, double* __restrict__ A,
                                             double* __restrict__ rhs) {
  const long long total = (long long)m * m;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total;
       o += (long long)gridDim.x * blockDim.x) {
    const int i = (int)(o / m), j = (int)(o % m);
    A[o] = H[a[i] * (long long)p + a[j]] + (i == j && i < nfree ? l2 : 0.0);
    if (j == 0) rhs[i] = g[a[i]] - (i < nfree ? l2 * w[a[i]] : 0.0);
  }
}

// After cuSOLVER's factorisation and solve: the step over all P parameters (0 where not free), the next
// weights w + step, and a flag (1: the step exists, positive definite and finite), into tail =
// [step (P), next weights (P), flag]; wnext gets the next weights too (the speculative pass reads them).
// One block; ``info`` holds potrf's and potrs's devInfo.
extern "C" __global__ void logit_wide_next(const double* __restrict__ sol, const long long* __restrict__ a, int m,
                                           const int* __restrict__ info, const double* __restrict__ w, int p,
                                           double* __restrict__ tail, double* __restrict__ wnext) {
  __shared__ int bad;
  if (threadIdx.x == 0) bad = info[0] != 0 || info[1] != 0;
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += blockDim.x)
    if (!isfinite(sol[i])) bad = 1;
  for (int j = threadIdx.x; j < p; j += blockDim.x) tail[j] = 0.0;
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += blockDim.x) tail[a[i]] = bad ? 0.0 : sol[i];
  __syncthreads();
  for (int j = threadIdx.x; j < p; j += blockDim.x) {
    const double v = w[j] + tail[j];
    tail[p + j] = v;
    wnext[j] = v;
  }
  if (threadIdx.x == 0) tail[2 * p] = bad ? 0.0 : 1.0;
}
