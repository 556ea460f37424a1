// One fused pass of logistic regression (IRLS / Newton) over a 2-D feature matrix.
// CPU twin: pystrom.ml._pass.xp_pass (NumPy, also run through CuPy for k > 8).
//
// For every row i with weight s_i = sample_weight_i * class_weight[y_i] and the augmented row
// x~ = (x_1 .. x_K, 1):   eta = w . x~,  mu = sigmoid(eta),  r = s mu (1 - mu)
// the pass accumulates, in float64 whatever the input dtype:
//   H   = sum r x~ x~^T        (upper triangle, row-major, P(P+1)/2 values, P = K + 1)
//   g   = sum s (y - mu) x~    (P values)
//   ll  = sum s (y eta - log(1 + e^eta))
//   sum s, sum s y, count of rows whose eta is not finite (NaN/Inf in X), count of rows fitted with
//   probability within 2e-9 of the observed class (|eta| > 20, correctly classified)
// and, as the last value, min over rows with s > 0 of the signed margin (2y - 1) eta: when it is
// positive the current weights separate the classes completely and the maximum likelihood estimate
// does not exist.
//
// Per-row precision follows the input: for float64 X every per-row value is float64; for float32 X
// the sigmoid and log(1 + e^-|eta|) are evaluated in float32 (eta itself, the weights r and residuals
// and every sum stay float64). The float64 transcendentals cost more than reading X (one pass over
// 40M x 4 float32 on an H200: 637 us with them, 341 us without), and float32 inputs carry no more
// precision than that. Only log(1 + e) of each row's log-likelihood term is then float32 (log1pf to
// 1 ulp, __expf and the rounding of eta to float32 as RowMath<float> says), and -term >= log(1 + e), so
// the log-likelihood is exact to the bounds F32_LL_RTOL / F32_LL_ATOL in ml/_pass.py (about 7e-7
// relative); the solver's line search allows for that.
//
// The intercept is the constant 1 at position K: no column of ones is ever materialised. X is read
// with element strides (row_stride, col_stride), so C-order, Fortran-order and a pystrom Table's
// equally spaced columns are all read in place, float32 staying float32 in memory.
//
// Loads: where X is in C order with rows of K contiguous values and its base aligned to the vector
// width (the host checks, ml/_pass.py vector_width, and passes `vec`), each row is read with 16-byte
// (float4 / double2) or 8-byte (float2) loads instead of K scalar ones: a quarter of the load
// instructions for 40M x 4 float32, the same bytes. Other layouts read element by element.
//
// One launch (logit_pass_<t>_k<K>): each thread keeps its sums in registers over a grid-stride loop
// (R rows loaded before any is used, so enough bytes are in flight), then each block reduces its
// threads into one row of `partials` (nblocks x M); the last block to finish (a counter) reduces
// every column over the blocks in a fixed order, so results are deterministic, and writes the M
// values to `out` (device memory, or pinned host memory mapped into the device's address space, so
// the host reads the result after the stream's wait with no copy). One launch instead of a second
// reduction kernel: an in-memory fit is ~20 passes of ~0.35 ms, and each launch costs the host ~6 us.

// A thread's rows per round (loaded before any is summed), and LOGIT_PREFETCH: the loads of its next
// R_ROWS rows are issued before the current ones are summed (registers double-buffered), so its bytes
// stay in flight while it computes. H100, 40M x 4 float32, one pass (the read-only kernel: 220 us):
// prefetched R_ROWS 2 313 us (70% of the read-only rate), 4 320; not prefetched R_ROWS 4 337, 2 375,
// 8 520 (spills at 4 blocks an SM). LOGIT_NO_PREFETCH and R_ROWS select the others (the tests' CPU
// emulation compiles them too).
#ifndef LOGIT_NO_PREFETCH
#define LOGIT_PREFETCH
#endif
#ifndef R_ROWS
#ifdef LOGIT_PREFETCH
#define R_ROWS 2
#else
#define R_ROWS 4
#endif
#endif

// LOGIT_UNWEIGHTED: a build for passes with neither sample nor class weights (ml/_narrow.py
// unweighted_pass): every row's weight s is the constant 1, so its sums are the weighted build's bit for
// bit (1 x v = v, fma(1, v, a) = a + v) from fewer instructions a row. A run-time choice inside one kernel
// made the float64 kinds spill (k = 6 speculative: 0 -> 10 bytes), so it is a build of its own.
#ifdef LOGIT_UNWEIGHTED
#define LOGIT_WEIGHTED false
#else
#define LOGIT_WEIGHTED true
#endif

template <int K>
struct Layout {
  static constexpr int P = K + 1;
  static constexpr int NT = P * (P + 1) / 2;
  static constexpr int NS = NT + P + 5;  // sums: H, g, ll, sum s, sum s y, non-finite, saturated
  static constexpr int M = NS + 1;       // + min margin
};

// LOGIT_ONE_THREAD_BLOCKS: the tests compile this file as C++ and run it on the CPU with blocks of one
// thread (tests/test_logistic_kernel.py), where a warp reduction is the identity.
__device__ __forceinline__ double warp_sum(double v) {
#ifndef LOGIT_ONE_THREAD_BLOCKS
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
#endif
  return v;
}

__device__ __forceinline__ double warp_min(double v) {
#ifndef LOGIT_ONE_THREAD_BLOCKS
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmin(v, __shfl_down_sync(0xffffffffu, v, o));
#endif
  return v;
}

// One row of K values at p (C order, aligned to VecWidth<T, K>::bytes) with vector loads.
template <typename T, int K>
struct VecWidth {
  static constexpr int bytes = (sizeof(T) == 4 && K % 4 == 0) || (sizeof(T) == 8 && K % 2 == 0) ? 16
                               : (sizeof(T) == 4 && K % 2 == 0)                                  ? 8
                                                                                                  : 0;
};

template <typename T, int K>
__device__ __forceinline__ void load_row_vec(const T* __restrict__ p, T (&x)[K]) {
  if constexpr (sizeof(T) == 4 && K % 4 == 0) {
#pragma unroll
    for (int q = 0; q < K / 4; ++q) {
      const float4 v = reinterpret_cast<const float4*>(p)[q];
      x[4 * q] = v.x;
      x[4 * q + 1] = v.y;
      x[4 * q + 2] = v.z;
      x[4 * q + 3] = v.w;
    }
  } else if constexpr (sizeof(T) == 4 && K % 2 == 0) {
#pragma unroll
    for (int q = 0; q < K / 2; ++q) {
      const float2 v = reinterpret_cast<const float2*>(p)[q];
      x[2 * q] = v.x;
      x[2 * q + 1] = v.y;
    }
  } else if constexpr (sizeof(T) == 8 && K % 2 == 0) {
#pragma unroll
    for (int q = 0; q < K / 2; ++q) {
      const double2 v = reinterpret_cast<const double2*>(p)[q];
      x[2 * q] = v.x;
      x[2 * q + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < K; ++j) x[j] = p[j];
  }
}

// e = exp(-|eta|), inv = 1 / (1 + e) and l1p = log(1 + e) of one row, in T's precision.
template <typename T>
struct RowMath {
  static __device__ __forceinline__ void eval(double eta, double& e, double& inv, double& l1p) {
    e = exp(-fabs(eta));
    inv = 1.0 / (1.0 + e);
    l1p = log1p(e);
  }
};

template <>
struct RowMath<float> {
  static __device__ __forceinline__ void eval(double eta, double& e, double& inv, double& l1p) {
    // The intrinsics: 341 instead of 378 us a pass (40M x 4, H200). __expf errs by 2 + 1.16 |eta| ulp,
    // the same form as rounding eta to float32 (F32_LL_ATOL), and __fdividef by 2 ulp on [1, 2].
    const float ef = __expf(-fabsf((float)eta));
    e = (double)ef;
    inv = (double)__fdividef(1.0f, 1.0f + ef);
    l1p = (double)log1pf(ef);
  }
};

// The sums of a block's threads into dst[0 .. M): warps by shuffles, then across the (at most 32)
// warps through shared memory, in a fixed order (deterministic). Every thread of the block calls it.
template <int NS>
__device__ void block_reduce(const double (&acc)[NS], double min_margin, double (*shared)[NS + 1], double* dst,
                             double* keep = nullptr) {
  constexpr int M = NS + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int j = 0; j < NS; ++j) {
    const double v = warp_sum(acc[j]);
    if (lane == 0) shared[warp][j] = v;
  }
  {
    const double v = warp_min(min_margin);
    if (lane == 0) shared[warp][NS] = v;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < M; j += blockDim.x) {
    double v = shared[0][j];
    for (int q = 1; q < nwarps; ++q) v = (j == NS) ? fmin(v, shared[q][j]) : v + shared[q][j];
    dst[j] = v;
    if (keep) keep[j] = v;
  }
}

// The solver's next Newton step, computed from a pass's sums on the device (logit_step_k<K>, one thread,
// launched after the pass), so the pass the solver most likely asks for next (a full step: ml/_irls.py
// line_search with scale 1) can be queued before the host has seen this one (KernelPass in
// ml/_narrow.py: the speculative pass). A kernel of its own: inside the pass's last block (and the pass's
// polling for a cancellation) it cost the pass's main loop registers, 314 -> 353 us (H100, 40M x 4).
// The rule is the solver's (IRLSSolver.newton_direction): the free parameters are the bits of `mask`
// (features, then the intercept at K, in that order), the first `nfree` of them features penalised by
// `l2` (g -= l2 w, H += l2 I), H~ = L L^T by Cholesky in float64, step = H~^-1 g over them, 0 elsewhere.
// Written to `tail` (mapped host memory, after the pass's M sums): the step (P values), the next
// weights w + step (P values; the solver forms them with the same IEEE additions) and a flag, 1 where
// the factorisation succeeded and every value is finite; and the next weights and the flag to `wnext`
// (device memory: the weights the speculative pass reads). The flag 0 makes that pass do nothing, and
// the host then computes the step itself (its fallbacks, warnings and errors stay in one place).
constexpr int STEP_STRIDE = 9;  // tail: step[9], next weights[9], flag; wnext: weights[9], flag

struct Weights {
  double v[STEP_STRIDE];
};

template <int K>
__device__ void newton_step(const double* __restrict__ sums, const Weights wt, unsigned mask, int nfree, double l2,
                            double* __restrict__ tail, double* __restrict__ wnext) {
  constexpr int P = K + 1, NT = P * (P + 1) / 2;
  const double* w = wt.v;
  int idx[P];
  int p = 0;
  for (int j = 0; j < P; ++j)
    if ((mask >> j) & 1u) idx[p++] = j;
  double a[P][P], L[P][P], z[P];
  for (int i = 0; i < p; ++i) {
    z[i] = sums[NT + idx[i]];
    for (int j = 0; j <= i; ++j) {  // idx[j] <= idx[i]: the packed upper triangle's entry (idx[j], idx[i])
      const int r = idx[j], c = idx[i];
      a[i][j] = sums[r * P - r * (r - 1) / 2 + (c - r)];
    }
  }
  for (int i = 0; i < nfree && i < p; ++i) {
    z[i] -= l2 * w[idx[i]];
    a[i][i] += l2;
  }
  bool ok = true;
  for (int j = 0; j < p && ok; ++j) {
    double d = a[j][j];
    for (int q = 0; q < j; ++q) d -= L[j][q] * L[j][q];
    if (!(d > 0.0) || isinf(d)) {
      ok = false;
      break;
    }
    d = sqrt(d);
    L[j][j] = d;
    for (int i = j + 1; i < p; ++i) {
      double v = a[i][j];
      for (int q = 0; q < j; ++q) v -= L[i][q] * L[j][q];
      L[i][j] = v / d;
    }
  }
  double step[P];
  for (int j = 0; j < P; ++j) step[j] = 0.0;
  if (ok) {
    for (int i = 0; i < p; ++i) {
      double v = z[i];
      for (int q = 0; q < i; ++q) v -= L[i][q] * z[q];
      z[i] = v / L[i][i];
    }
    for (int i = p - 1; i >= 0; --i) {
      double v = z[i];
      for (int q = i + 1; q < p; ++q) v -= L[q][i] * z[q];
      z[i] = v / L[i][i];
    }
    for (int i = 0; i < p; ++i) {
      if (!isfinite(z[i])) ok = false;
      step[idx[i]] = z[i];
    }
  }
  for (int j = 0; j < P; ++j) {
    const double next = w[j] + step[j];
    tail[j] = step[j];
    tail[STEP_STRIDE + j] = next;
    wnext[j] = next;
  }
  tail[2 * STEP_STRIDE] = ok ? 1.0 : 0.0;
  wnext[STEP_STRIDE] = ok ? 1.0 : 0.0;
}

// A thread's share of the rows of one array (X, n rows, element strides rs/cs; y; weights sw where
// has_sw; vec: 1 where rows may be read with vector loads) at the weights wv, added to its sums acc and
// its minimum margin. logit_pass runs it over one array, logit_parts over each array of a list.
template <typename T, int K>
__device__ __forceinline__ void add_rows(const T* __restrict__ X, long long n, long long rs, long long cs,
                                         const unsigned char* __restrict__ y, const double* __restrict__ sw,
                                         int has_sw, int vec, double cw0, double cw1,
                                         const double (&wv)[Layout<K>::P], double (&acc)[Layout<K>::NS],
                                         double& min_margin) {
  using L = Layout<K>;
  constexpr int P = L::P, NT = L::NT, NS = L::NS;
  const long long stride = (long long)blockDim.x * gridDim.x;
  auto load = [&](long long base, T (&xv)[R_ROWS][K], unsigned char (&yv)[R_ROWS], double (&sv)[R_ROWS]) {
#pragma unroll
    for (int r = 0; r < R_ROWS; ++r) {
      const long long i = base + r * stride;
      if (i < n) {
        if (VecWidth<T, K>::bytes && vec) {
          load_row_vec<T, K>(X + i * K, xv[r]);
        } else {
#pragma unroll
          for (int j = 0; j < K; ++j) xv[r][j] = X[i * rs + j * cs];
        }
        yv[r] = y[i];
        sv[r] = LOGIT_WEIGHTED && has_sw ? sw[i] : 1.0;
      }
    }
  };
  auto sum = [&](long long base, const T (&xv)[R_ROWS][K], const unsigned char (&yv)[R_ROWS],
                 const double (&sv)[R_ROWS]) {
#pragma unroll
    for (int r = 0; r < R_ROWS; ++r) {
      const long long i = base + r * stride;
      if (i >= n) continue;
      double x[P];
#pragma unroll
      for (int j = 0; j < K; ++j) x[j] = (double)xv[r][j];
      x[K] = 1.0;
      double eta = wv[K];
#pragma unroll
      for (int j = 0; j < K; ++j) eta = fma(wv[j], x[j], eta);
      if (!isfinite(eta)) {
        acc[NS - 2] += 1.0;
        continue;
      }
      const int yi = yv[r] != 0;
      const double s = LOGIT_WEIGHTED ? sv[r] * (yi ? cw1 : cw0) : 1.0;
      if (s == 0.0) continue;
      double e, inv, l1p;  // one exp gives mu, mu (1 - mu) and log(1 + e^eta), stably
      RowMath<T>::eval(eta, e, inv, l1p);
      const double rw = s * e * inv * inv;
      // y - mu is +-(the probability of the class not observed), taken from e * inv where that is the
      // smaller one: 1 - inv would round it away (in float32 from a margin of ~17 on, which left the
      // separation diagnosis of float32 fits blind: issue 39)
      const double miss = (yi != 0) != (eta >= 0.0) ? inv : e * inv;
      const double resid = yi ? s * miss : -s * miss;
      int t = 0;
#pragma unroll
      for (int a = 0; a < P; ++a) {
        const double ra = rw * x[a];
#pragma unroll
        for (int b = a; b < P; ++b, ++t) acc[t] = fma(ra, x[b], acc[t]);
      }
#pragma unroll
      for (int a = 0; a < P; ++a) acc[NT + a] = fma(resid, x[a], acc[NT + a]);
      // max(eta, 0) from eta's sign bit and the least margin by a compare and a select: eta is finite here,
      // and fmax and fmin's care for NaN (and for which zero of a tie) cost ~10 instructions a row (sm_90)
      const double positive = __double2hiint(eta) < 0 ? 0.0 : eta;
      acc[NT + P] += s * ((double)yi * eta - (positive + l1p));
      acc[NT + P + 1] += s;
      acc[NT + P + 2] += s * (double)yi;
      const double margin = yi ? eta : -eta;
      if (margin > 20.0) acc[NS - 1] += 1.0;
      min_margin = margin < min_margin ? margin : min_margin;
    }
  };
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
#ifdef LOGIT_PREFETCH
  T xv[R_ROWS][K];
  unsigned char yv[R_ROWS];
  double sv[R_ROWS];
  if (first < n) load(first, xv, yv, sv);
  for (long long base = first; base < n; base += stride * R_ROWS) {
    T xn[R_ROWS][K];
    unsigned char yn[R_ROWS];
    double sn[R_ROWS];
    const long long next = base + stride * R_ROWS;
    if (next < n) load(next, xn, yn, sn);
    sum(base, xv, yv, sv);
#pragma unroll
    for (int r = 0; r < R_ROWS; ++r) {
#pragma unroll
      for (int j = 0; j < K; ++j) xv[r][j] = xn[r][j];
      yv[r] = yn[r];
      sv[r] = sn[r];
    }
  }
#else
  for (long long base = first; base < n; base += stride * R_ROWS) {
    T xv[R_ROWS][K];
    unsigned char yv[R_ROWS];
    double sv[R_ROWS];
    load(base, xv, yv, sv);
    sum(base, xv, yv, sv);
  }
#endif
}

// A thread's sums at the start of a pass: every sum 0, the minimum margin +inf.
template <int NS>
__device__ __forceinline__ void clear_sums(double (&acc)[NS], double& min_margin) {
#pragma unroll
  for (int j = 0; j < NS; ++j) acc[j] = 0.0;
  min_margin = __longlong_as_double(0x7ff0000000000000LL);
}

// The block's sums into its row of `partials`; the last block to finish reduces every block's row in a
// fixed order into `out` (and `sums`, where not null) and resets `done` for the next launch.
template <int K>
__device__ __forceinline__ void finish_pass(double (&acc)[Layout<K>::NS], double min_margin,
                                            double* __restrict__ partials, unsigned int* __restrict__ done,
                                            double* __restrict__ out, double* __restrict__ sums) {
  using L = Layout<K>;
  constexpr int NS = L::NS, M = L::M;
  __shared__ double shared[32][M];
  block_reduce<NS>(acc, min_margin, shared, partials + (long long)blockIdx.x * M);

  // The last block to get here reduces over all blocks (CUDA's threadFenceReduction pattern).
  __shared__ int is_last;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) is_last = (atomicAdd(done, 1u) == gridDim.x - 1);
  __syncthreads();
  if (is_last) {  // thread t sums the rows of blocks t, t + blockDim, ...; then the same block reduction
    clear_sums<NS>(acc, min_margin);
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
      const double* row = partials + (long long)b * M;
#pragma unroll
      for (int j = 0; j < NS; ++j) acc[j] += __ldcg(row + j);  // written by other SMs: read from L2
      min_margin = fmin(min_margin, __ldcg(row + NS));
    }
    block_reduce<NS>(acc, min_margin, shared, out, sums);  // sums: a copy in device memory for the step
    if (threadIdx.x == 0) *done = 0u;  // ready for the next launch (launches are stream-ordered)
  }
}

// A pass's weights into `wv`: the kernel parameters `w`, which the compiler reads from the constant bank
// as operands, or for a speculative pass (SPEC) the ones the step after the pass before it computed
// (newton_step), in registers; false where that step failed (wsrc's flag 0: the pass does nothing). A
// kernel of each kind: one kernel choosing at run time held them in registers for every pass, and where
// registers were short the sums spilled (float64 K = 4 on an H100: 310 -> 378 us).
template <int K, bool SPEC>
__device__ __forceinline__ bool pass_weights(const double (&w)[9], const double* __restrict__ wsrc,
                                             double (&wv)[Layout<K>::P]) {
  if constexpr (SPEC) {
    if (wsrc[STEP_STRIDE] == 0.0) return false;
#pragma unroll
    for (int j = 0; j < Layout<K>::P; ++j) wv[j] = wsrc[j];
  } else {
#pragma unroll
    for (int j = 0; j < Layout<K>::P; ++j) wv[j] = w[j];
  }
  return true;
}

template <typename T, int K, bool SPEC>
__device__ void logit_pass(const T* __restrict__ X, long long n, long long rs, long long cs,
                           const unsigned char* __restrict__ y, const double* __restrict__ sw, int has_sw,
                           int vec, double cw0, double cw1, const double (&w)[9], const double* __restrict__ wsrc,
                           double* __restrict__ sums, double* __restrict__ partials, unsigned int* __restrict__ done,
                           double* __restrict__ out) {
  using L = Layout<K>;
  constexpr int P = L::P, NS = L::NS;
  double wv[P];
  if (!pass_weights<K, SPEC>(w, wsrc, wv)) return;  // it took no step: nothing to do, nothing written
  double acc[NS], min_margin;
  clear_sums<NS>(acc, min_margin);
  add_rows<T, K>(X, n, rs, cs, y, sw, has_sw, vec, cw0, cw1, wv, acc, min_margin);
  finish_pass<K>(acc, min_margin, partials, done, out, sums);
}

// One pass over the rows of several arrays at once (a dask worker's partitions, ml/_narrow.py
// PartsPass): `parts` holds PART_FIELDS int64 per array (X's address, n, rs, cs, y's address, sw's
// address, has_sw, vec), and every thread takes its share of each array in turn into the same sums, so
// the arrays cost one launch and one reduction, not one each (16 partitions launched one by one from
// Python cost a dask worker's pass 0.8 ms where its GPU work was under 0.5: issue 35). The weights as
// logit_pass takes them (SPEC: from wsrc, the step after the pass before); `wout` (where not null) gets
// the weights the pass used, for the all-gather that follows a chained pass (dask/_chain.py).
constexpr int PART_FIELDS = 8;

template <typename T, int K, bool SPEC>
__device__ void logit_parts(const long long* __restrict__ parts, int nparts, double cw0, double cw1,
                            const double (&w)[9], const double* __restrict__ wsrc, double* __restrict__ wout,
                            double* __restrict__ partials, unsigned int* __restrict__ done, double* __restrict__ out) {
  using L = Layout<K>;
  constexpr int P = L::P, NS = L::NS;
  double wv[P];
  if (!pass_weights<K, SPEC>(w, wsrc, wv)) return;  // it took no step: nothing to do, nothing written
  if (wout != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < P; ++j) wout[j] = wv[j];
  }
  double acc[NS], min_margin;
  clear_sums<NS>(acc, min_margin);
  for (int q = 0; q < nparts; ++q) {
    const long long* d = parts + (long long)q * PART_FIELDS;
    add_rows<T, K>(reinterpret_cast<const T*>(d[0]), d[1], d[2], d[3], reinterpret_cast<const unsigned char*>(d[4]),
                   reinterpret_cast<const double*>(d[5]), (int)d[6], (int)d[7], cw0, cw1, wv, acc, min_margin);
  }
  finish_pass<K>(acc, min_margin, partials, done, out, nullptr);
}

// After a chained pass's all-gather (dask/_chain.py): `rows` holds `world` rows of `rowlen` values in
// rank order, each a rank's pass vector of `width` values (the M sums, then the rows counted, rows
// skipped for NULLs and the float32 flag), its weights and its flags. The block's threads copy the rows
// to `host_rows` (mapped host memory: the host checks them) and sum the pass vectors, thread j value j,
// in rank order as dask/_tasks.py sum_passes does (added one rank after another, the margin at M - 1 by
// min, the last value by max) into `totals` (device) and `host_totals`; then thread 0, where `step_on`,
// the Newton step from the totals as logit_step does (else the flag 0: no speculative pass after it).
// Every rank runs it on the same rows, so every rank has the same totals and step, bit for bit. (One
// thread summing every value waited on ~4 x 30 dependent loads from L2 a pass.) Launched with at
// least `width` threads.
template <int K>
__device__ void gather_step(const double* __restrict__ rows, int world, int rowlen, int width,
                            double* __restrict__ host_rows, double* __restrict__ totals,
                            double* __restrict__ host_totals, const Weights wt, const double* __restrict__ wsrc,
                            unsigned mask, int nfree, double l2, int step_on, double* __restrict__ tail,
                            double* __restrict__ wnext) {
  for (int i = threadIdx.x; i < world * rowlen; i += blockDim.x) host_rows[i] = rows[i];
  const bool ran = !(wsrc && wsrc[STEP_STRIDE] == 0.0) && width >= Layout<K>::M && (int)blockDim.x >= width;
  if (ran) {  // else the speculative pass did not run: nothing to sum
    const int j = threadIdx.x, margin = Layout<K>::M - 1;
    if (j < width) {
      double t = rows[j];
      for (int r = 1; r < world; ++r) {
        const double v = rows[(long long)r * rowlen + j];
        t = j == margin ? fmin(t, v) : j == width - 1 ? fmax(t, v) : t + v;
      }
      totals[j] = t;
      host_totals[j] = t;
    }
  }
  __syncthreads();  // the totals are written before thread 0 reads them
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (!ran || !step_on) {
    tail[2 * STEP_STRIDE] = 0.0;
    wnext[STEP_STRIDE] = 0.0;
    return;
  }
  Weights w = wt;
  if (wsrc)
    for (int j = 0; j < STEP_STRIDE; ++j) w.v[j] = wsrc[j];
  newton_step<K>(totals, w, mask, nfree, l2, tail, wnext);
}

// 128 threads a block; the bound caps registers so that 4 (K <= 4), 3 or 2 blocks stay resident per SM
// (ptxas for sm_90: K = 4 float32 fits in 128 registers without spilling; unbounded it took 136 and only
// one 256-thread block fitted). The host sizes the grid to the resident blocks (no tail wave).
// `vec`: 1 where rows may be read with vector loads (see the top of this file), else 0.
// The weights come as nine scalar arguments (P <= 9; the unused ones are 0), not as a device
// array: a pass then needs no host-to-device copy before its launch.
#define LOGIT_THREADS 128
#ifndef LOGIT_MIN_BLOCKS
#define LOGIT_MIN_BLOCKS(K) (K <= 4 ? 4 : (K <= 6 ? 3 : 2))
#endif
// logit_pass_<t>_k<K> takes its weights as the scalars w0..w8 (wsrc unused); logit_spec_<t>_k<K> from
// wsrc (a speculative pass). `sums`: where the last block also writes the M sums for the step kernel
// (0: nowhere).
#define LOGIT_PASS_KIND(NAME, SPEC, TNAME, T, K)                                                             \
  extern "C" __global__ void __launch_bounds__(LOGIT_THREADS, LOGIT_MIN_BLOCKS(K))                          \
      NAME##_##TNAME##_k##K(                                                                                \
      const T* __restrict__ X, long long n, long long rs, long long cs, const unsigned char* __restrict__ y, \
      const double* __restrict__ sw, int has_sw, int vec, double cw0, double cw1, double w0, double w1,    \
      double w2, double w3, double w4, double w5, double w6, double w7, double w8,                         \
      const double* __restrict__ wsrc, double* __restrict__ sums, double* __restrict__ partials,           \
      unsigned int* __restrict__ done, double* __restrict__ out) {                                          \
    const double w[9] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                             \
    logit_pass<T, K, SPEC>(X, n, rs, cs, y, sw, has_sw, vec, cw0, cw1, w, wsrc, sums, partials, done, out);  \
  }
// logit_parts_<t>_k<K>: one pass over the arrays `parts` describes (logit_parts), the weights as scalars;
// logit_parts_spec_<t>_k<K> from wsrc.
#define LOGIT_PARTS_KIND(NAME, SPEC, TNAME, T, K)                                                            \
  extern "C" __global__ void __launch_bounds__(LOGIT_THREADS, LOGIT_MIN_BLOCKS(K))                          \
      NAME##_##TNAME##_k##K(const long long* __restrict__ parts, int nparts, double cw0, double cw1,        \
                            double w0, double w1, double w2, double w3, double w4, double w5, double w6,     \
                            double w7, double w8, const double* __restrict__ wsrc, double* __restrict__ wout, \
                            double* __restrict__ partials, unsigned int* __restrict__ done,                  \
                            double* __restrict__ out) {                                                      \
    const double w[9] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                             \
    logit_parts<T, K, SPEC>(parts, nparts, cw0, cw1, w, wsrc, wout, partials, done, out);                  \
  }
// One array's pass kinds (KernelPass) and several arrays' (PartsPass, a dask worker's partitions)
#define LOGIT_ONE_ARRAY_KINDS(TNAME, T, K)       \
  LOGIT_PASS_KIND(logit_pass, false, TNAME, T, K) \
  LOGIT_PASS_KIND(logit_spec, true, TNAME, T, K)
#define LOGIT_MANY_ARRAYS_KINDS(TNAME, T, K)             \
  LOGIT_PARTS_KIND(logit_parts, false, TNAME, T, K)       \
  LOGIT_PARTS_KIND(logit_parts_spec, true, TNAME, T, K)

// The step after a pass (newton_step): `sums` its M sums, the weights it used (scalars, or wsrc when it
// was speculative: flag 0 there means it did not run, and neither does this step), the rule, and where
// the step goes: `tail` (mapped host memory, after the pass's M sums) and `wnext` (device).
#define LOGIT_STEP(K)                                                                                       \
  extern "C" __global__ void logit_step_k##K(                                                               \
      const double* __restrict__ sums, double w0, double w1, double w2, double w3, double w4, double w5,    \
      double w6, double w7, double w8, const double* __restrict__ wsrc, unsigned mask, int nfree, double l2, \
      double* __restrict__ tail, double* __restrict__ wnext) {                                              \
    if (threadIdx.x != 0 || blockIdx.x != 0) return;                                                        \
    if (wsrc && wsrc[STEP_STRIDE] == 0.0) {                                                                 \
      tail[2 * STEP_STRIDE] = 0.0;                                                                          \
      wnext[STEP_STRIDE] = 0.0;                                                                             \
      return;                                                                                               \
    }                                                                                                       \
    Weights wt = {{w0, w1, w2, w3, w4, w5, w6, w7, w8}};                                                    \
    if (wsrc)                                                                                               \
      for (int j = 0; j < STEP_STRIDE; ++j) wt.v[j] = wsrc[j];                                              \
    newton_step<K>(sums, wt, mask, nfree, l2, tail, wnext);                                                 \
  }
// logit_gather_step_k<K>: the totals and the step after a chained pass's all-gather (gather_step).
#define LOGIT_GATHER_STEP(K)                                                                                 \
  extern "C" __global__ void logit_gather_step_k##K(                                                        \
      const double* __restrict__ rows, int world, int rowlen, int width, double* __restrict__ host_rows,    \
      double* __restrict__ totals, double* __restrict__ host_totals, double w0, double w1, double w2,       \
      double w3, double w4, double w5, double w6, double w7, double w8, const double* __restrict__ wsrc,    \
      unsigned mask, int nfree, double l2, int step_on, double* __restrict__ tail, double* __restrict__ wnext) { \
    const Weights wt = {{w0, w1, w2, w3, w4, w5, w6, w7, w8}};                                              \
    gather_step<K>(rows, world, rowlen, width, host_rows, totals, host_totals, wt, wsrc, mask, nfree, l2,     \
                   step_on, tail, wnext);                                                                   \
  }

// What a build holds (ml/_narrow.py logit_kernel): NVRTC compiles every kernel of a source, and all 80
// of these took ~40 s on a cold cache. LOGIT_K: one width. LOGIT_F32_ONLY / LOGIT_F64_ONLY: one input
// type. LOGIT_ONE_ARRAY_ONLY: a fit's kinds (pass, speculative pass, step), LOGIT_MANY_ARRAYS_ONLY: a dask
// worker's (parts, speculative parts, the step after the all-gather).
#ifndef LOGIT_F64_ONLY
#define LOGIT_F32(KINDS, K) KINDS(f32, float, K)
#else
#define LOGIT_F32(KINDS, K)
#endif
#ifndef LOGIT_F32_ONLY
#define LOGIT_F64(KINDS, K) KINDS(f64, double, K)
#else
#define LOGIT_F64(KINDS, K)
#endif
#ifndef LOGIT_MANY_ARRAYS_ONLY
#define LOGIT_ONE_ARRAY(K)                                                   \
  LOGIT_F32(LOGIT_ONE_ARRAY_KINDS, K) LOGIT_F64(LOGIT_ONE_ARRAY_KINDS, K) \
  LOGIT_STEP(K)
#else
#define LOGIT_ONE_ARRAY(K)
#endif
#ifndef LOGIT_ONE_ARRAY_ONLY
#define LOGIT_MANY_ARRAYS(K)                                                     \
  LOGIT_F32(LOGIT_MANY_ARRAYS_KINDS, K) LOGIT_F64(LOGIT_MANY_ARRAYS_KINDS, K) \
  LOGIT_GATHER_STEP(K)
#else
#define LOGIT_MANY_ARRAYS(K)
#endif
#define LOGIT_PASS_BOTH(K) LOGIT_ONE_ARRAY(K) LOGIT_MANY_ARRAYS(K)

#ifdef LOGIT_K
LOGIT_PASS_BOTH(LOGIT_K)
#else
LOGIT_PASS_BOTH(1)
LOGIT_PASS_BOTH(2)
LOGIT_PASS_BOTH(3)
LOGIT_PASS_BOTH(4)
LOGIT_PASS_BOTH(5)
LOGIT_PASS_BOTH(6)
LOGIT_PASS_BOTH(7)
LOGIT_PASS_BOTH(8)
#endif
