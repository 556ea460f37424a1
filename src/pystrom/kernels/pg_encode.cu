// Arrow-layout columns -> PostgreSQL binary COPY rows, one thread per row. CPU twin: csrc/pg_encode.cpp
// (same descriptors, kinds and failure codes; the tests compare the two byte for byte).
//
// Descriptor: 10 long longs per column: kind, values/offsets address of row 0, validity address (0: none),
// bit of row 0 in the validity bitmap, string data (or list element) address, parameter (decimal scale,
// fixed width, unit multiplier or element kind), divisor (sub-microsecond units) or d (fixed_size_list,
// vector), element validity address (0: none), element index of row 0 (fixed_size_list, vector), unused.
// pg_encode_sizes writes each row's encoded size and the first failure (atomicMin over a key of row,
// column and code); the host scans the sizes into row starts; pg_encode_rows writes every row at its start.

enum Kind { E_BOOL = 0, E_INT8, E_UINT8, E_INT16, E_UINT16, E_INT32, E_UINT32, E_INT64, E_UINT64, E_FLOAT16,
            E_FLOAT32, E_FLOAT64, E_DECIMAL, E_DATE32, E_DATE64, E_TIMESTAMP, E_TIME32, E_TIME64, E_INTERVAL,
            E_VARLEN, E_FIXED, E_MDN_INTERVAL, E_ARRAY, E_VECTOR };
enum Failure { E_OK = 0, E_RANGE = 1, E_TIME_RANGE = 2, E_OVERFLOW = 3, E_VECTOR_NULL = 4, E_VECTOR_VALUE = 5,
               E_TOO_LONG = 6 };

#define SLOTS 10
#define MAX_FIELD 0x3FFFFFFFLL
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
__device__ __forceinline__ unsigned long long load_u64_bytes4(const unsigned char* p) {
  return (unsigned long long)p[0] | ((unsigned long long)p[1] << 8) | ((unsigned long long)p[2] << 16) |
         ((unsigned long long)p[3] << 24);  // little endian, 4 bytes
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

// One value of a scalar kind (E_BOOL .. E_INTERVAL, E_MDN_INTERVAL): value `row` of the buffer at `values`.
__device__ long long encode_scalar(long long kind, const unsigned char* values, long long row, long long param,
                                   long long div, unsigned char* out, int* failure) {
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
    case E_MDN_INTERVAL: {
      if (out) {
        const unsigned char* p = values + row * 16;
        const unsigned int months = (unsigned int)load_u64_bytes4(p), days = (unsigned int)load_u64_bytes4(p + 4);
        const long long ns = (long long)load_u64_bytes(p + 8);
        const long long us = ns / 1000 - ((ns % 1000 != 0 && ns < 0) ? 1 : 0);  // floored, as timestamps
        put64(out, (unsigned long long)us);
        put32(out + 8, days);
        put32(out + 12, months);
      }
      return 16;
    }
    default:
      *failure = E_RANGE;
      return 0;
  }
}

// A list element's bytes on the wire (fixed-width element kinds) and the element type OID it is sent as.
__device__ __forceinline__ long long wire_width(long long kind) {
  switch (kind) {
    case E_BOOL: return 1;
    case E_INT8: case E_UINT8: case E_INT16: return 2;
    case E_UINT16: case E_INT32: case E_FLOAT16: case E_FLOAT32: return 4;
    default: return 8;
  }
}
__device__ __forceinline__ unsigned int element_oid(long long kind) {
  switch (kind) {
    case E_BOOL: return 16;
    case E_INT8: case E_UINT8: case E_INT16: return 21;
    case E_UINT16: case E_INT32: return 23;
    case E_UINT32: case E_INT64: return 20;
    case E_UINT64: return 1700;
    case E_FLOAT16: case E_FLOAT32: return 700;
    default: return 701;
  }
}
__device__ __forceinline__ bool bit_set(const long long bitmap, long long k) {
  const unsigned long long b = (unsigned long long)k;
  return ((((const unsigned char*)bitmap)[b >> 3] >> (b & 7)) & 1) != 0;
}

// A list row as a one-dimensional array (array_send's layout; an empty array has ndim 0).
__device__ long long encode_array(const long long* d, long long row, unsigned char* out, int* failure) {
  const long long ekind = d[5], dim = d[6], child_bits = d[7];
  const unsigned char* elements = (const unsigned char*)d[4];
  long long first, count;
  if (d[1] == 0) {  // a fixed_size_list (d may be 0)
    first = d[8] + row * dim;
    count = dim;
  } else {
    const int* offsets = (const int*)d[1];
    first = offsets[row];
    count = (long long)offsets[row + 1] - first;
  }
  long long nulls = 0;
  if (child_bits != 0) {
    for (long long j = 0; j < count; ++j) nulls += bit_set(child_bits, first + j) ? 0 : 1;
  }
  long long size = count == 0 ? 12 : 20;
  if (ekind == E_UINT64) {
    for (long long j = 0; j < count; ++j) {
      if (child_bits == 0 || bit_set(child_bits, first + j)) {
        size += encode_scalar(ekind, elements, first + j, 0, 1, 0, failure);
      }
    }
    size += 4 * count;
  } else {
    size += 4 * count + (count - nulls) * wire_width(ekind);
  }
  if (size > MAX_FIELD) {
    *failure = E_TOO_LONG;
    return 0;
  }
  if (out) {
    put32(out, count == 0 ? 0u : 1u);
    put32(out + 4, nulls != 0 ? 1u : 0u);
    put32(out + 8, element_oid(ekind));
    unsigned char* p = out + 12;
    if (count != 0) {
      put32(p, (unsigned int)count);
      put32(p + 4, 1u);
      p += 8;
    }
    for (long long j = 0; j < count; ++j) {
      if (child_bits != 0 && !bit_set(child_bits, first + j)) {
        put32(p, 0xFFFFFFFFu);
        p += 4;
        continue;
      }
      const long long len = encode_scalar(ekind, elements, first + j, 0, 1, p + 4, failure);
      put32(p, (unsigned int)len);
      p += 4 + len;
    }
  }
  return size;
}

// A fixed_size_list<float32|float16>[d] row as pgvector's vector(d) | halfvec(d): int16 dimension, int16 0,
// the values big-endian. The sizes pass refuses NULL elements and NaN / infinities, as pgvector does.
__device__ long long encode_vector(const long long* d, long long row, unsigned char* out, int* failure) {
  const bool half = d[5] == E_FLOAT16;
  const long long dim = d[6], first = d[8] + row * dim, child_bits = d[7];
  const long long width = half ? 2 : 4;
  if (out == 0) {
    for (long long j = 0; j < dim; ++j) {
      if (child_bits != 0 && !bit_set(child_bits, first + j)) {
        *failure = E_VECTOR_NULL;
        return 0;
      }
      const bool finite = half ? (((const unsigned short*)d[4])[first + j] & 0x7C00u) != 0x7C00u
                               : (((const unsigned int*)d[4])[first + j] & 0x7F800000u) != 0x7F800000u;
      if (!finite) {
        *failure = E_VECTOR_VALUE;
        return 0;
      }
    }
    return 4 + dim * width;
  }
  put16(out, (unsigned int)dim);
  put16(out + 2, 0u);
  for (long long j = 0; j < dim; ++j) {
    if (half) {
      put16(out + 4 + 2 * j, ((const unsigned short*)d[4])[first + j]);
    } else {
      put32(out + 4 + 4 * j, ((const unsigned int*)d[4])[first + j]);
    }
  }
  return 4 + dim * width;
}

// One field: its length (-1: NULL) and, when out is not null, its bytes at out.
__device__ long long encode_field(const long long* d, long long row, unsigned char* out, int* failure) {
  const long long kind = d[0];
  const unsigned char* values = (const unsigned char*)d[1];
  if (d[2] != 0 && !bit_set(d[2], d[3] + row)) return -1;
  switch (kind) {
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
      const long long param = d[5];
      if (out) {
        const unsigned char* src = values + row * param;
        for (long long i = 0; i < param; ++i) out[i] = src[i];
      }
      return param;
    }
    case E_ARRAY:
      return encode_array(d, row, out, failure);
    case E_VECTOR:
      return encode_vector(d, row, out, failure);
    default:
      return encode_scalar(kind, values, row, d[5], d[6], out, failure);
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
        atomicMin(first_failure, ((unsigned long long)row << 14) | ((unsigned long long)c << 3) | failure);
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
