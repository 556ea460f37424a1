// Device helpers for the `where` kernels that pystrom.expr generates (src/pystrom/expr/_cuda.py).
// This file has no kernels of its own: the generator's source is appended to it and compiled as one.
// CPU twin: src/pystrom/expr/_numpy.py (the same rules, column at a time).

// Row `bit` of an Arrow LSB validity bitmap; a null bitmap pointer means "no NULLs".
__device__ __forceinline__ bool pw_valid(const unsigned char* bits, long long bit) {
  return bits == nullptr || ((bits[bit >> 3] >> (bit & 7)) & 1);
}

// int64 arithmetic wraps (two's complement) like NumPy's; signed overflow is undefined in C++,
// so it is done on unsigned values.
__device__ __forceinline__ long long pw_add(long long a, long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}
__device__ __forceinline__ long long pw_sub(long long a, long long b) {
  return (long long)((unsigned long long)a - (unsigned long long)b);
}
__device__ __forceinline__ long long pw_mul(long long a, long long b) {
  return (long long)((unsigned long long)a * (unsigned long long)b);
}
__device__ __forceinline__ long long pw_neg(long long a) { return (long long)(0ULL - (unsigned long long)a); }
__device__ __forceinline__ long long pw_abs(long long a) { return a < 0 ? pw_neg(a) : a; }
// Remainder with the dividend's sign (C and SQL); the caller has made b != 0. INT64_MIN % -1 traps in
// hardware, and its value is 0.
__device__ __forceinline__ long long pw_mod(long long a, long long b) { return b == -1 ? 0 : a % b; }

// Exact three-way comparison of a uint64 with an int64: a negative int64 is below every uint64.
__device__ __forceinline__ int pw_cmp_ui(unsigned long long a, long long b) {
  if (b < 0) return 1;
  const unsigned long long ub = (unsigned long long)b;
  return a < ub ? -1 : (a > ub ? 1 : 0);
}

// IEEE half (float16 storage bits) to double, exactly.
__device__ __forceinline__ double pw_half(unsigned short h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = ldexp((double)frac, -24);  // subnormal
  } else if (exp == 31) {
    v = frac ? __longlong_as_double(0x7ff8000000000000LL) : __longlong_as_double(0x7ff0000000000000LL);
  } else {
    v = ldexp((double)(frac | 0x400), exp - 25);
  }
  return sign ? -v : v;
}

__device__ __forceinline__ bool pw_str_eq(const unsigned char* a, int alen, const unsigned char* b, int blen) {
  if (alen != blen) return false;
  for (int k = 0; k < alen; ++k)
    if (a[k] != b[k]) return false;
  return true;
}

// Bytes in the UTF-8 sequence that `lead` starts (1 for ASCII, continuation or invalid bytes).
__device__ __forceinline__ int pw_utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 1;
}

__device__ __forceinline__ unsigned char pw_fold(unsigned char c, bool icase) {
  return (icase && c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

// SQL LIKE. The pattern comes compiled: element k is kind[k] = 0 (the literal byte lit[k]; escapes
// already resolved, ASCII-lowered when icase), 1 ('_': one UTF-8 character) or 2 ('%': any run).
// Greedy matching that backtracks only to the last '%', one character further each time: O(n*m) at
// worst, no recursion, no allocation.
__device__ bool pw_like(const unsigned char* s, int n, const unsigned char* kind, const unsigned char* lit, int plen,
                        bool icase) {
  int si = 0, pi = 0, star = -1, mark = 0;
  while (si < n) {
    if (pi < plen && kind[pi] == 0 && pw_fold(s[si], icase) == lit[pi]) {
      ++si;
      ++pi;
    } else if (pi < plen && kind[pi] == 1) {
      si += pw_utf8_len(s[si]);
      ++pi;
    } else if (pi < plen && kind[pi] == 2) {
      star = pi++;
      mark = si;
    } else if (star >= 0) {
      pi = star + 1;
      mark += pw_utf8_len(s[mark]);
      si = mark;
    } else {
      return false;
    }
  }
  if (si > n) return false;  // a '_' ran over a truncated character at the end
  while (pi < plen && kind[pi] == 2) ++pi;
  return pi == plen;
}

// Bit `i - base` of the validity word `words[base / 32]` of a with_columns output. On the GPU the 32
// lanes of a warp hold rows base..base+31 (base a multiple of 32; every lane calls this, also those
// past the last row, with ok = false) and one vote gives the word. Elsewhere (the tests compile this
// source for the host with a one-thread grid, so i == base) the bit is set on its own.
__device__ __forceinline__ void pw_store_valid(unsigned int* words, long long base, int lane, long long i, bool ok) {
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
  const unsigned int word = __ballot_sync(0xffffffffu, ok);
  if (lane == 0) words[base >> 5] = word;
#else
  if (ok) {
    words[i >> 5] |= 1u << (i & 31);
  } else {
    words[i >> 5] &= ~(1u << (i & 31));
  }
#endif
}
