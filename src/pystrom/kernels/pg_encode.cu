// Arrow-layout columns -> PostgreSQL binary COPY rows, one thread per row. CPU twin: csrc/pg_encode.cpp
// (same descriptors, kinds and failure codes; the tests compare the two byte for byte).
//
// Descriptor: 8 long longs per column: kind, values/offsets address of row 0, validity address (0: none),
// bit of row 0 in the validity bitmap, string data address, parameter (decimal scale, fixed width or
// unit multiplier), divisor (sub-microsecond units), unused.
// pg_encode_sizes writes each row's encoded size and the first failure (atomicMin over a key of row,
// column and code); the host scans the sizes into row starts; pg_encode_rows writes every row at its start.

enum Kind { E_BOOL = 0, E_INT8, E_UINT8, E_INT16, E_UINT16, E_INT32, E_UINT32, E_INT64, E_UINT64, E_FLOAT16,
            E_FLOAT32, E_FLOAT64, E_DECIMAL, E_DATE32, E_DATE64, E_TIMESTAMP, E_TIME32, E_TIME64, E_INTERVAL,
            E_VARLEN, E_FIXED };
enum Failure { E_OK = 0, E_RANGE = 1, E_TIME_RANGE = 2, E_OVERFLOW = 3 };

#define SLOTS 8
#define DATE_SHIFT 10957LL
#define TIMESTAMP_SHIFT 946684800000000LL
#define DATE_MIN (-2451545LL)
#define DATE_END (2147483494LL - 2451545LL)
#define TIMESTAMP_MIN (-211813488000000000LL)
#define TIMESTAMP_END 9223371331200000000LL
#define DAY_MICROS 86400000000LL
#define I32_MAX 2147483647
#define I32_MIN (-2147483647 - 1)
#define I64_MAX 9223372036854775807LL
#define I64_MIN (-9223372036854775807LL - 1)

__device__ __forceinline__ void put16(unsigned char* p, unsigned int v) {
  p[0] = (unsigned char)(v >> 8);
  p[1] = (unsigned char)v;
}
__device__ __forceinline__ void put32(unsigned char* p, unsigned int v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}
__device__ __forceinline__ void put64(unsigned char* p, unsigned long long v) {
  put32(p, (unsigned int)(v >> 32));
  put32(p + 4, (unsigned int)v);
}
__device__ __forceinline__ unsigned long long load_u64_bytes(const unsigned char* p) {
  unsigned long long v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // little endian
  return v;
}

__device__ unsigned int half_to_float_bits(unsigned int h) {
  const unsigned int sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu;
  unsigned int mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return sign << 31;
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return (sign << 31) | ((unsigned int)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  if (exp == 31) return (sign << 31) | 0x7f800000u | (mant << 13);
  return (sign << 31) | ((exp - 15 + 127) << 23) | (mant << 13);
}

__device__ bool to_micros(long long v, long long mul, long long div, long long* out) {
  if (mul > 1 && (v > I64_MAX / mul || v < I64_MIN / mul)) return false;
  v *= mul;
  if (div > 1) {
    long long q = v / div;
    if ((v % div != 0) && (v < 0)) --q;
    v = q;
  }
  *out = v;
  return true;
}

__device__ unsigned int divmod_small(unsigned int limbs[4], unsigned int d) {
  unsigned long long rem = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned long long cur = (rem << 32) | limbs[i];
    limbs[i] = (unsigned int)(cur / d);
    rem = cur % d;
  }
  return (unsigned int)rem;
}

__device__ int numeric_digits(unsigned int limbs[4], int scale, unsigned short digits[12], int* weight) {
  const unsigned int pow10[5] = {1, 10, 100, 1000, 10000};
  unsigned short g[12];
  int n = 0;
  const int r = scale % 4;
  if (r != 0) g[n++] = (unsigned short)(divmod_small(limbs, pow10[r]) * pow10[4 - r]);
  while ((limbs[0] | limbs[1] | limbs[2] | limbs[3]) != 0 && n < 12) g[n++] = (unsigned short)divmod_small(limbs, 10000);
  int k = 0;
  while (k < n && g[k] == 0) ++k;
  if (k == n) {
    *weight = 0;
    return 0;
  }
  *weight = -((scale + 3) / 4) + n - 1;
  int nd = 0;
  for (int i = n - 1; i >= k; --i) digits[nd++] = g[i];
  return nd;
}

// One field: its length (-1: NULL) and, when out is not null, its bytes at out.
__device__ long long encode_field(const long long* d, long long row, unsigned char* out, int* failure) {
  const long long kind = d[0];
  const unsigned char* values = (const unsigned char*)d[1];
  const unsigned char* validity = (const unsigned char*)d[2];
  if (validity != 0) {
    const unsigned long long bit = (unsigned long long)d[3] + (unsigned long long)row;
    if (((validity[bit >> 3] >> (bit & 7)) & 1) == 0) return -1;
  }
  const long long param = d[5], div = d[6];
  switch (kind) {
    case E_BOOL:
      if (out) out[0] = values[row] ? 1 : 0;
      return 1;
    case E_INT8:
      if (out) put16(out, (unsigned short)(short)((const signed char*)values)[row]);
      return 2;
    case E_UINT8:
      if (out) put16(out, values[row]);
      return 2;
    case E_INT16:
      if (out) put16(out, (unsigned short)((const short*)values)[row]);
      return 2;
    case E_UINT16:
      if (out) put32(out, ((const unsigned short*)values)[row]);
      return 4;
    case E_INT32:
      if (out) put32(out, (unsigned int)((const int*)values)[row]);
      return 4;
    case E_UINT32:
      if (out) put64(out, ((const unsigned int*)values)[row]);
      return 8;
    case E_INT64:
      if (out) put64(out, (unsigned long long)((const long long*)values)[row]);
      return 8;
    case E_FLOAT16:
      if (out) put32(out, half_to_float_bits(((const unsigned short*)values)[row]));
      return 4;
    case E_FLOAT32:
      if (out) put32(out, ((const unsigned int*)values)[row]);
      return 4;
    case E_FLOAT64:
      if (out) put64(out, ((const unsigned long long*)values)[row]);
      return 8;
    case E_UINT64:
    case E_DECIMAL: {
      unsigned int limbs[4];
      bool negative = false;
      int scale = 0;
      if (kind == E_UINT64) {
        const unsigned long long v = ((const unsigned long long*)values)[row];
        limbs[0] = limbs[1] = 0;
        limbs[2] = (unsigned int)(v >> 32);
        limbs[3] = (unsigned int)v;
      } else {
        const unsigned char* p = values + row * 16;
        unsigned long long lo = load_u64_bytes(p), hi = load_u64_bytes(p + 8);
        negative = (hi >> 63) != 0;
        if (negative) {
          lo = ~lo + 1;
          hi = ~hi + (lo == 0 ? 1 : 0);
        }
        limbs[0] = (unsigned int)(hi >> 32);
        limbs[1] = (unsigned int)hi;
        limbs[2] = (unsigned int)(lo >> 32);
        limbs[3] = (unsigned int)lo;
        scale = (int)param;
      }
      unsigned short digits[12];
      int weight = 0;
      const int nd = numeric_digits(limbs, scale, digits, &weight);
      if (out) {
        put16(out, (unsigned int)nd);
        put16(out + 2, (unsigned short)(short)weight);
        put16(out + 4, (negative && nd > 0) ? 0x4000u : 0u);
        put16(out + 6, (unsigned int)scale);
        for (int i = 0; i < nd; ++i) put16(out + 8 + 2 * i, digits[i]);
      }
      return 8 + 2 * (long long)nd;
    }
    case E_DATE32:
    case E_DATE64: {
      long long days;
      int pg;
      bool special;
      if (kind == E_DATE32) {
        const int v = ((const int*)values)[row];
        special = v == I32_MAX || v == I32_MIN;
        pg = v == I32_MAX ? I32_MAX : I32_MIN;
        days = v;
      } else {
        const long long v = ((const long long*)values)[row];
        special = v == I64_MAX || v == I64_MIN;
        pg = v == I64_MAX ? I32_MAX : I32_MIN;
        days = v / 86400000LL - ((v % 86400000LL != 0 && v < 0) ? 1 : 0);
      }
      if (!special) {
        const long long shifted = days - DATE_SHIFT;
        if (shifted < DATE_MIN || shifted >= DATE_END) {
          *failure = E_RANGE;
          return 0;
        }
        pg = (int)shifted;
      }
      if (out) put32(out, (unsigned int)pg);
      return 4;
    }
    case E_TIMESTAMP: {
      const long long v = ((const long long*)values)[row];
      long long pg;
      if (v == I64_MAX || v == I64_MIN) {
        pg = v;
      } else {
        long long us;
        if (!to_micros(v, param, div, &us) || us < TIMESTAMP_MIN + TIMESTAMP_SHIFT) {
          *failure = E_RANGE;
          return 0;
        }
        pg = us - TIMESTAMP_SHIFT;
        if (pg >= TIMESTAMP_END) {
          *failure = E_RANGE;
          return 0;
        }
      }
      if (out) put64(out, (unsigned long long)pg);
      return 8;
    }
    case E_TIME32:
    case E_TIME64: {
      const long long v = kind == E_TIME32 ? (long long)((const int*)values)[row] : ((const long long*)values)[row];
      long long us;
      if (!to_micros(v, param, div, &us) || us < 0 || us > DAY_MICROS) {
        *failure = E_TIME_RANGE;
        return 0;
      }
      if (out) put64(out, (unsigned long long)us);
      return 8;
    }
    case E_INTERVAL: {
      long long us;
      if (!to_micros(((const long long*)values)[row], param, div, &us)) {
        *failure = E_OVERFLOW;
        return 0;
      }
      if (out) {
        put64(out, (unsigned long long)us);
        put32(out + 8, 0);
        put32(out + 12, 0);
      }
      return 16;
    }
    case E_VARLEN: {
      const int a = ((const int*)values)[row], b = ((const int*)values)[row + 1];
      const long long len = (long long)b - a;
      if (out) {
        const unsigned char* src = (const unsigned char*)d[4] + a;
        for (long long i = 0; i < len; ++i) out[i] = src[i];
      }
      return len;
    }
    case E_FIXED: {
      if (out) {
        const unsigned char* src = values + row * param;
        for (long long i = 0; i < param; ++i) out[i] = src[i];
      }
      return param;
    }
    default:
      *failure = E_RANGE;
      return 0;
  }
}

extern "C" __global__ void pg_encode_sizes(const long long* desc, int ncols, long long begin, long long nrows,
                                           long long* sizes, unsigned long long* first_failure) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nrows;
       i += (long long)blockDim.x * gridDim.x) {
    const long long row = begin + i;
    long long size = 2;
    for (int c = 0; c < ncols; ++c) {
      int failure = E_OK;
      const long long len = encode_field(desc + c * SLOTS, row, 0, &failure);
      if (failure != E_OK) {
        // The first failing (row, column) wins, as in the CPU twin's sequential pass.
        atomicMin(first_failure, ((unsigned long long)row << 13) | ((unsigned long long)c << 2) | failure);
        break;
      }
      size += 4 + (len > 0 ? len : 0);
    }
    sizes[i] = size;
  }
}

extern "C" __global__ void pg_encode_rows(const long long* desc, int ncols, long long begin, long long nrows,
                                          const long long* starts, unsigned char* out) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nrows;
       i += (long long)blockDim.x * gridDim.x) {
    const long long row = begin + i;
    unsigned char* p = out + starts[i];
    put16(p, (unsigned int)ncols);
    p += 2;
    for (int c = 0; c < ncols; ++c) {
      const long long* d = desc + c * SLOTS;
      int failure = E_OK;
      const long long len = encode_field(d, row, 0, &failure);
      put32(p, (unsigned int)(int)len);
      p += 4;
      if (len > 0) {
        encode_field(d, row, p, &failure);
        p += len;
      }
    }
  }
}
