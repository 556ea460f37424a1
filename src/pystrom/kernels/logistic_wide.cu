// One IRLS pass for wide fits (more than 8 features, C-order rows) in three steps, with the
// features' block of the Hessian formed in float32 by cuBLAS (ml/_wide.py):
//
//   logit_wide_rows_<t>: a warp per row: eta = x . w + b summed in float64 (the lanes take every 32nd
//     feature, a shuffle reduction adds them), the row's weight r and residual s (y - mu) stored in
//     float64, the log-likelihood and the other per-row totals summed per block, and the row scaled
//     by sqrt(r) written in float32 (Z, for Z^T Z: one GEMM or syrk instead of a float64 GEMM of the
//     upcast matrix), or in float64 for the exact passes (the first, and the statistics at the end);
//   logit_wide_cols_<t>: X^T [resid, r] in float64, a thread per feature over a slice of rows;
//   cuBLAS: Z^T Z.
//
// The per-row arithmetic is the fused kernel's (logistic.cu: float32 sigmoids and logs for float32
// input), so its CPU twin is the same, ml/_pass.py xp_pass with hessian="float32"; the tests compare
// the two (tests/test_logistic_wide.py).

#define WIDE_TOTALS 6  // log-likelihood, sum s, sum s y, non-finite rows, saturated rows, min margin
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

template <typename T, typename ZT>
__device__ void wide_rows(const T* __restrict__ X, long long n, int k, long long rs, const unsigned char* __restrict__ y,
                          const double* __restrict__ sw, int has_sw, double cw0, double cw1,
                          const double* __restrict__ w, double* __restrict__ rr, double* __restrict__ resid,
                          ZT* __restrict__ Z, double* __restrict__ partials) {
  __shared__ double shared[32][WIDE_TOTALS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long gwarp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
  const double b = w[k];
  double ll = 0, ssum = 0, sy = 0, nonfinite = 0, saturated = 0, margin = __longlong_as_double(0x7ff0000000000000LL);
  for (long long i = gwarp; i < n; i += nwarps) {
    const T* x = X + i * rs;
    double acc = 0;
    for (int j = lane; j < k; j += 32) acc = fma((double)x[j], w[j], acc);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    double eta = acc + b;
    const double yv = y[i] ? 1.0 : 0.0;
    double s = (y[i] ? cw1 : cw0) * (has_sw ? sw[i] : 1.0);
    if (!isfinite(eta)) {  // counted; weight 0 (the pass is then an error: ml/_sources.py)
      nonfinite += 1;
      eta = 0;
      s = 0;
    }
    double e, inv, l1p;
    WideMath<T>::eval(eta, e, inv, l1p);
    const double mu = eta >= 0 ? inv : e * inv;
    const double r = s * e * inv * inv;
    const double res = s * (yv - mu);
    if (lane == 0) {
      rr[i] = r;
      resid[i] = res;
    }
    ll += s * (yv * eta - (fmax(eta, 0.0) + l1p));
    ssum += s;
    sy += s * yv;
    if (s != 0) {
      const double m = yv > 0 ? eta : -eta;
      margin = fmin(margin, m);
      if (m > SATURATED_MARGIN) saturated += 1;
    }
    if (Z != nullptr) {
      const double root = sqrt(r);
      ZT* z = Z + i * (long long)k;
      for (int j = lane; j < k; j += 32) z[j] = scaled<T, ZT>(x[j], root);
    }
  }
  // Every lane of a warp holds the same totals: lane 0 of each warp reports them.
  if (lane == 0) {
    shared[warp][0] = ll;
    shared[warp][1] = ssum;
    shared[warp][2] = sy;
    shared[warp][3] = nonfinite;
    shared[warp][4] = saturated;
    shared[warp][5] = margin;
  }
  __syncthreads();
  if (threadIdx.x < WIDE_TOTALS) {
    const int t = threadIdx.x;
    double v = shared[0][t];
    for (int q = 1; q < (int)(blockDim.x >> 5); ++q) v = t == 5 ? fmin(v, shared[q][t]) : v + shared[q][t];
    partials[(long long)blockIdx.x * WIDE_TOTALS + t] = v;
  }
}

// out: gridDim.y x 2 x k: rows of slice q summed into out[q][0][j] = sum x_ij resid_i, out[q][1][j] = sum x_ij r_i.
template <typename T>
__device__ void wide_cols(const T* __restrict__ X, long long n, int k, long long rs, const double* __restrict__ resid,
                          const double* __restrict__ rr, long long rows_per_slice, double* __restrict__ out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const long long start = (long long)blockIdx.y * rows_per_slice;
  const long long stop = min(n, start + rows_per_slice);
  double g = 0, h = 0;
  for (long long i = start; i < stop; ++i) {
    const double x = (double)X[i * rs + j];
    g = fma(x, resid[i], g);
    h = fma(x, rr[i], h);
  }
  out[((long long)blockIdx.y * 2) * k + j] = g;
  out[((long long)blockIdx.y * 2 + 1) * k + j] = h;
}

#define WIDE_ROWS(T, ZT, NAME)                                                                                     \
  extern "C" __global__ void logit_wide_rows_##NAME(                                                               \
      const T* __restrict__ X, long long n, int k, long long rs, const unsigned char* __restrict__ y,              \
      const double* __restrict__ sw, int has_sw, double cw0, double cw1, const double* __restrict__ w,             \
      double* __restrict__ rr, double* __restrict__ resid, ZT* __restrict__ Z, double* __restrict__ partials) {    \
    wide_rows<T, ZT>(X, n, k, rs, y, sw, has_sw, cw0, cw1, w, rr, resid, Z, partials);                             \
  }
#define WIDE_COLS(T, NAME)                                                                                         \
  extern "C" __global__ void logit_wide_cols_##NAME(const T* __restrict__ X, long long n, int k, long long rs,      \
                                                    const double* __restrict__ resid, const double* __restrict__ rr, \
                                                    long long rows_per_slice, double* __restrict__ out) {           \
    wide_cols<T>(X, n, k, rs, resid, rr, rows_per_slice, out);                                                     \
  }

WIDE_ROWS(float, float, f32_z32)
WIDE_ROWS(float, double, f32_z64)
WIDE_ROWS(double, float, f64_z32)
WIDE_ROWS(double, double, f64_z64)
WIDE_COLS(float, f32)
WIDE_COLS(double, f64)
