// PostgreSQL binary COPY rows -> Arrow-layout buffers, one thread per row. CPU twin: csrc/pg_decode.cpp
// (same descriptors and failure codes; the tests compare the two on the same staged bytes).
//
// Descriptor: 8 long longs per column: kind, values/offsets address, validity address (0: none),
// string data address, this chunk's first string byte (CPU decoder only), decimal scale, vector
// dimension, string data bytes. Array columns: kind, int32 offsets address (list; 0 for
// fixed_size_list), validity address, element values address, (CPU only), element validity address
// (0: none), d (fixed_size_list; 0 for list), the column's element count.
// Chunk table: 3 long longs per staged chunk: its bytes' address, its row starts' address, its first
// table row (ascending). One launch decodes the table rows [first row of chunk 0, + nrows) of any
// number of chunks (a read of 16 connections leaves ~100), so the decode after the last byte costs
// one launch instead of one per chunk; each thread finds its row's chunk by binary search.
// Strings take two launches: pg_decode_rows writes each row's length at offsets[row + 1], the host
// scans them into offsets, then pg_copy_strings copies the bytes. Arrays read as list<T> do the same
// with element counts (pg_decode_rows checks the whole array first, pg_copy_strings writes its
// elements); fixed_size_list<T>[d] rows are checked and written by pg_decode_rows alone. pgvector
// columns are checked by pg_decode_rows and copied by pg_copy_vectors, one warp per row with 16-byte
// loads and stores (see there).

enum Kind { BOOL = 0, INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC_F64, NUMERIC_DEC128, DATE, TIMESTAMP, VARLEN, UUID,
            OID, VECTOR_F4, VECTOR_F2, ARRAY_BOOL, ARRAY_INT2, ARRAY_INT4, ARRAY_INT8, ARRAY_FLOAT4, ARRAY_FLOAT8, MONEY };
enum Failure { OK = 0, BAD_LENGTH, DECIMAL_OVERFLOW, DECIMAL_SPECIAL, DECIMAL_SCALE, UNEXPECTED_NULL, TIMESTAMP_RANGE,
               VECTOR_DIM, ARRAY_NDIM, ARRAY_ELEMENT, ARRAY_LENGTH, ARRAY_BAD };

__device__ __forceinline__ unsigned int be16(const unsigned char* p) { return (p[0] << 8) | p[1]; }
__device__ __forceinline__ unsigned int be32(const unsigned char* p) {
  return ((unsigned int)p[0] << 24) | ((unsigned int)p[1] << 16) | ((unsigned int)p[2] << 8) | p[3];
}
__device__ __forceinline__ unsigned long long be64(const unsigned char* p) {
  return ((unsigned long long)be32(p) << 32) | be32(p + 4);
}

#define DATE_SHIFT 10957
#define TIMESTAMP_SHIFT 946684800000000LL
#define INT32_MAXV 2147483647
#define INT32_MINV (-2147483647 - 1)
#define INT64_MAXV 9223372036854775807LL
#define INT64_MINV (-9223372036854775807LL - 1)
#define GUARD 128  // kGuard in csrc/pg_decode.cpp

__device__ const double kPow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                      1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

__device__ double scale10(double hi, double lo, int e, double* lo_out) {
  while (e != 0) {
    const int k = e > 0 ? (e > 22 ? 22 : e) : (e < -22 ? 22 : -e);
    const double pw = kPow10[k];
    // Explicitly rounded operations: NVRTC would otherwise contract a * b + c into an FMA, and the
    // C++ twin (csrc/pg_decode.cpp) rounds each one.
    if (e > 0) {
      const double p = __dmul_rn(hi, pw);
      lo = __dadd_rn(fma(hi, pw, -p), __dmul_rn(lo, pw));
      hi = p;
      e -= k;
    } else {
      const double q = __ddiv_rn(hi, pw);
      lo = __ddiv_rn(__dadd_rn(fma(-q, pw, hi), lo), pw);
      hi = q;
      e += k;
    }
    if (!isfinite(hi)) {
      *lo_out = 0.0;
      return hi;
    }
    const double s = __dadd_rn(hi, lo);
    lo = __dsub_rn(lo, __dsub_rn(s, hi));
    hi = s;
  }
  const double s = __dadd_rn(hi, lo);
  *lo_out = __dsub_rn(lo, __dsub_rn(s, hi));
  return s;
}

// As scale_down_once in the C++ twin: hi + lo times 2^-guard rounded once where it is subnormal.
__device__ double scale_down_once(double hi, double lo, int guard) {
  double r = ldexp(hi, -guard);
  const double dropped = __dsub_rn(hi, ldexp(r, guard));
  const double half = ldexp(1.0, guard - 1075);
  if (dropped == half && lo > 0) r = nextafter(r, __longlong_as_double(0x7ff0000000000000LL));
  if (dropped == -half && lo < 0) r = nextafter(r, __longlong_as_double(0xfff0000000000000LL));
  return r;
}

__device__ int numeric_f64(const unsigned char* p, int len, double* out) {
  if (len < 8) return BAD_LENGTH;
  const int ndigits = (short)be16(p);
  const int weight = (short)be16(p + 2);
  const unsigned int sign = be16(p + 4);
  if (sign == 0xC000) { *out = __longlong_as_double(0x7ff8000000000000LL); return OK; }
  if (sign == 0xD000) { *out = __longlong_as_double(0x7ff0000000000000LL); return OK; }
  if (sign == 0xF000) { *out = __longlong_as_double(0xfff0000000000000LL); return OK; }
  if (ndigits < 0 || len != 8 + 2 * ndigits) return BAD_LENGTH;
  if (ndigits == 0) { *out = 0.0; return OK; }
  unsigned long long m = 0;
  int e = 0;
  for (int i = 0; i < ndigits; ++i) {
    const unsigned int g = be16(p + 8 + 2 * i);
    if (m < 1000000000000000ULL) {
      m = m * 10000 + g;
      e = 4 * (weight - i);
      continue;
    }
    const unsigned int div[4] = {1000, 100, 10, 1};
    for (int j = 0; j < 4 && m < 1000000000000000000ULL; ++j) {
      m = m * 10 + (g / div[j]) % 10;
      e = 4 * (weight - i) + 3 - j;
    }
    break;
  }
  // As in the C++ twin: past the double range at once, near its ends scaled on m * 2^-+GUARD.
  int digits = 19;
  if (e > 250 || e < -250) {
    digits = 0;
    for (unsigned long long t = m; t != 0; t /= 10) ++digits;
  }
  double v;
  if (e + digits > 310) {
    v = m == 0 ? 0.0 : __longlong_as_double(0x7ff0000000000000LL);
  } else if (e + digits < -330) {
    v = 0.0;
  } else {
    const double hi = (double)m;
    const double lo = (double)(long long)(m - (unsigned long long)hi);
    const int guard = e + digits > 280 ? -GUARD : (e + digits < -280 ? GUARD : 0);
    double rest;
    if (guard == 0) {
      v = scale10(hi, lo, e, &rest);
    } else {
      const double top = scale10(ldexp(hi, guard), ldexp(lo, guard), e, &rest);
      v = guard < 0 ? ldexp(top, -guard) : scale_down_once(top, rest, guard);
    }
  }
  *out = sign == 0x4000 ? -v : v;
  return OK;
}

struct U128 {
  unsigned int w[4];
};

__device__ __forceinline__ bool below_limit(const U128& a) {  // a < 10^38
  const unsigned int lim[4] = {0x00000000u, 0x098A2240u, 0x5A86C47Au, 0x4B3B4CA8u};
  for (int i = 3; i >= 0; --i) {
    if (a.w[i] != lim[i]) return a.w[i] < lim[i];
  }
  return false;
}
__device__ __forceinline__ bool mul_add(U128& a, unsigned int k, unsigned int add) {
  unsigned long long carry = add;
  for (int i = 0; i < 4; ++i) {
    const unsigned long long t = (unsigned long long)a.w[i] * k + carry;
    a.w[i] = (unsigned int)t;
    carry = t >> 32;
  }
  return carry == 0;
}

__device__ int numeric_dec128(const unsigned char* p, int len, int scale, unsigned char* out) {
  if (len < 8) return BAD_LENGTH;
  const int ndigits = (short)be16(p);
  const int weight = (short)be16(p + 2);
  const unsigned int sign = be16(p + 4);
  if (sign == 0xC000 || sign == 0xD000 || sign == 0xF000) return DECIMAL_SPECIAL;
  if (ndigits < 0 || len != 8 + 2 * ndigits) return BAD_LENGTH;
  // Horner's rule over the groups, stopping at the scale (see the C++ twin).
  const unsigned int pow10[5] = {1, 10, 100, 1000, 10000};
  const int last = 4 * (weight - ndigits + 1) + scale;
  U128 v = {{0, 0, 0, 0}};
  for (int i = 0; i < ndigits; ++i) {
    const unsigned int g = be16(p + 8 + 2 * i);
    const int e = last + 4 * (ndigits - 1 - i);
    if (e >= 0) {
      if (!mul_add(v, 10000, g) || !below_limit(v)) return DECIMAL_OVERFLOW;
    } else if (e > -4) {
      const unsigned int drop = pow10[-e];
      if (g % drop != 0) return DECIMAL_SCALE;
      if (!mul_add(v, pow10[4 + e], g / drop) || !below_limit(v)) return DECIMAL_OVERFLOW;
    } else if (g != 0) {
      return DECIMAL_SCALE;
    }
  }
  for (int e = last; e > 0; --e) {
    if (!mul_add(v, 10, 0) || !below_limit(v)) return DECIMAL_OVERFLOW;
  }
  if (sign == 0x4000) {
    unsigned long long carry = 1;
    for (int i = 0; i < 4; ++i) {
      const unsigned long long t = (unsigned long long)(unsigned int)(~v.w[i]) + carry;
      v.w[i] = (unsigned int)t;
      carry = t >> 32;
    }
  }
  unsigned int* o = (unsigned int*)out;  // 16-byte values at 16-byte strides of a 64-byte aligned buffer
  o[0] = v.w[0];
  o[1] = v.w[1];
  o[2] = v.w[2];
  o[3] = v.w[3];
  return OK;
}

__device__ __forceinline__ void clear_bit(unsigned char* bitmap, long long row) {
  // 32-bit atomics on the bitmap's words (it starts on a 64-byte boundary).
  unsigned int* word = (unsigned int*)(bitmap) + (row >> 5);
  atomicAnd(word, ~(1u << (row & 31)));
}

__device__ __forceinline__ void fail(long long* error, int code, long long row, int column) {
  if (atomicCAS((unsigned long long*)error, 0ULL, (unsigned long long)code) == 0ULL) {
    error[1] = row;
    error[2] = column;
  }
}

template <typename T>
__device__ __forceinline__ T* at(long long address) {
  return (T*)address;
}

// -- arrays (csrc/pg_decode.hpp: array_header; csrc/pg_decode.cpp: decode_array) ---------------------

__device__ __forceinline__ bool is_array(long long kind) { return kind >= ARRAY_BOOL && kind <= ARRAY_FLOAT8; }
__device__ __forceinline__ int array_width(long long kind) {
  const int w[6] = {1, 2, 4, 8, 4, 8};
  return w[kind - ARRAY_BOOL];
}
__device__ __forceinline__ unsigned int array_oid(long long kind) {
  const unsigned int o[6] = {16, 21, 23, 20, 700, 701};
  return o[kind - ARRAY_BOOL];
}

// An array's header (as array_header in the C++ twin): failure, element count, first element's offset.
struct ArrayHeader {
  int failure;
  long long count;
  int body;
  unsigned int element;
  bool has_null;
};

__device__ __forceinline__ ArrayHeader array_header(const unsigned char* p, int len) {
  ArrayHeader h = {ARRAY_BAD, 0, 12, 0, false};
  if (len < 12) return h;
  const int ndim = (int)be32(p);
  const unsigned int flag = be32(p + 4);
  h.element = be32(p + 8);
  h.has_null = flag != 0;
  if (ndim < 0 || flag > 1) return h;
  if (ndim > 1) {
    h.failure = ARRAY_NDIM;
    return h;
  }
  if (ndim == 1) {
    if (len < 20) return h;
    const int size = (int)be32(p + 12);
    if (size < 0 || size > (len - 20) / 4) return h;
    h.count = size;
    h.body = 20;
  }
  h.failure = OK;
  return h;
}

// Element `index` of an array column from its big-endian bytes (0: zero, for a NULL).
__device__ __forceinline__ void put_element(const long long* d, int width, long long index, const unsigned char* e) {
  switch (width) {
    case 1: at<unsigned char>(d[3])[index] = e != 0 && e[0] != 0; break;
    case 2: at<unsigned short>(d[3])[index] = e ? (unsigned short)be16(e) : 0; break;
    case 4: at<unsigned int>(d[3])[index] = e ? be32(e) : 0u; break;
    default: at<unsigned long long>(d[3])[index] = e ? be64(e) : 0ULL; break;
  }
}

// Check one array value (len bytes at p) whose header is h and, with `write`, put its elements at
// [first, first + h.count) (the caller has checked that range); stops at the first fault.
__device__ int walk_array(const unsigned char* p, int len, const ArrayHeader& h, const long long* d, long long first,
                          bool write) {
  const int width = array_width(d[0]);
  const unsigned char* e = p + h.body;
  const unsigned char* end = p + len;
  for (long long i = 0; i < h.count; ++i) {
    if (end - e < 4) return ARRAY_BAD;
    const int elen = (int)be32(e);
    e += 4;
    if (elen == -1) {
      if (!h.has_null) return ARRAY_BAD;
      if (d[5] == 0) return UNEXPECTED_NULL;
      if (write) {
        clear_bit(at<unsigned char>(d[5]), first + i);
        put_element(d, width, first + i, 0);
      }
      continue;
    }
    if (elen != width) return BAD_LENGTH;
    if (end - e < width) return ARRAY_BAD;
    if (write) put_element(d, width, first + i, e);
    e += width;
  }
  return e == end ? OK : ARRAY_BAD;
}

// Where table row `row` starts (its first field): k, its chunk, is found by binary search unless the
// previous answer still holds (usually, since a thread's rows ascend); r becomes its index in the chunk.
__device__ __forceinline__ const unsigned char* locate(const long long* __restrict__ chunks, int nchunks, long long row,
                                                       int& k, long long& r) {
  if (!(chunks[3 * k + 2] <= row && (k + 1 == nchunks || chunks[3 * k + 5] > row))) {
    int lo = 0, hi = nchunks - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (chunks[3 * mid + 2] <= row) lo = mid; else hi = mid - 1;
    }
    k = lo;
  }
  r = row - chunks[3 * k + 2];
  const long long* offsets = at<const long long>(chunks[3 * k + 1]);
  return at<const unsigned char>(chunks[3 * k]) + offsets[r] + 2;  // past the field count
}

// Decode row r of a chunk (table row `row`) from p, its first field; a failure goes to the chunk's error words.
__device__ __forceinline__ void decode_row(const unsigned char* p, long long r, long long row,
                                           const long long* __restrict__ desc, int ncols, long long* error) {
  for (int c = 0; c < ncols; ++c) {
    const long long* d = desc + c * 8;
    const int len = (int)be32(p);
    p += 4;
    const int kind = (int)d[0];
    if (len < 0) {
      if (d[2] == 0) { fail(error, UNEXPECTED_NULL, r, c); return; }
      clear_bit(at<unsigned char>(d[2]), row);
      switch (kind) {
        case BOOL: at<unsigned char>(d[1])[row] = 0; break;
        case INT2: at<short>(d[1])[row] = 0; break;
        case INT4: case FLOAT4: case DATE: case OID: at<int>(d[1])[row] = 0; break;
        case INT8: case FLOAT8: case NUMERIC_F64: case TIMESTAMP: at<long long>(d[1])[row] = 0; break;
        case NUMERIC_DEC128: case UUID: case MONEY: {
          unsigned int* o = at<unsigned int>(d[1]) + row * 4;
          o[0] = o[1] = o[2] = o[3] = 0;
          break;
        }
        case VARLEN: at<int>(d[1])[row + 1] = 0; break;  // a NULL string is empty
        case VECTOR_F4: { unsigned int* o = at<unsigned int>(d[1]) + row * d[6]; for (long long j = 0; j < d[6]; ++j) o[j] = 0; break; }
        case VECTOR_F2: { unsigned short* o = at<unsigned short>(d[1]) + row * d[6]; for (long long j = 0; j < d[6]; ++j) o[j] = 0; break; }
        default:
          if (!is_array(kind)) break;
          if (d[6] == 0) {
            at<int>(d[1])[row + 1] = 0;  // a NULL list is empty
          } else {
            const int width = array_width(kind);
            for (long long j = 0; j < d[6]; ++j) put_element(d, width, row * d[6] + j, 0);
          }
      }
      continue;
    }
    int failure = OK;
    switch (kind) {
      case BOOL:
        if (len != 1) failure = BAD_LENGTH; else at<unsigned char>(d[1])[row] = p[0] != 0;
        break;
      case INT2:
        if (len != 2) failure = BAD_LENGTH; else at<short>(d[1])[row] = (short)be16(p);
        break;
      case INT4: case FLOAT4: case OID:
        if (len != 4) failure = BAD_LENGTH; else at<unsigned int>(d[1])[row] = be32(p);
        break;
      case INT8: case FLOAT8:
        if (len != 8) failure = BAD_LENGTH; else at<unsigned long long>(d[1])[row] = be64(p);
        break;
      case DATE:
        if (len != 4) {
          failure = BAD_LENGTH;
        } else {
          const int v = (int)be32(p);
          at<int>(d[1])[row] = (v == INT32_MAXV || v == INT32_MINV) ? v : v + DATE_SHIFT;
        }
        break;
      case TIMESTAMP:
        if (len != 8) {
          failure = BAD_LENGTH;
        } else {
          const long long v = (long long)be64(p);
          const bool inf = v == INT64_MAXV || v == INT64_MINV;
          if (!inf && v > INT64_MAXV - TIMESTAMP_SHIFT) {
            failure = TIMESTAMP_RANGE;
          } else {
            at<long long>(d[1])[row] = inf ? v : v + TIMESTAMP_SHIFT;
          }
        }
        break;
      case NUMERIC_F64:
        failure = numeric_f64(p, len, at<double>(d[1]) + row);
        break;
      case NUMERIC_DEC128:
        failure = numeric_dec128(p, len, (int)d[5], at<unsigned char>(d[1]) + row * 16);
        break;
      case UUID:
        if (len != 16) {
          failure = BAD_LENGTH;
        } else {
          unsigned char* o = at<unsigned char>(d[1]) + row * 16;
          for (int k = 0; k < 16; ++k) o[k] = p[k];
        }
        break;
      case MONEY:  // int64 in the currency's smallest unit -> decimal128 (sign-extended, little endian)
        if (len != 8) {
          failure = BAD_LENGTH;
        } else {
          const unsigned long long v = be64(p);
          unsigned long long* o = at<unsigned long long>(d[1]) + row * 2;
          o[0] = v;
          o[1] = (long long)v < 0 ? ~0ULL : 0ULL;
        }
        break;
      case VARLEN:
        at<int>(d[1])[row + 1] = len;  // lengths first; the host turns them into offsets
        break;
      case VECTOR_F4: case VECTOR_F2: {  // checked here, copied by pg_copy_vectors (a warp per row)
        const long long dim = d[6];
        const long long width = kind == VECTOR_F4 ? 4 : 2;
        if (len < 4 || len != 4 + dim * width) {
          failure = len >= 4 && (len - 4) % width == 0 ? VECTOR_DIM : BAD_LENGTH;
        } else if ((long long)be16(p) != dim) {
          failure = VECTOR_DIM;
        }
        break;
      }
      default: {
        if (!is_array(kind)) {
          failure = BAD_LENGTH;
          break;
        }
        const ArrayHeader h = array_header(p, len);
        if (h.failure != OK) {
          failure = h.failure;
        } else if (h.element != array_oid(kind)) {
          failure = ARRAY_ELEMENT;
        } else if (d[6] != 0) {  // fixed_size_list: d elements, checked as they are written
          failure = h.count != d[6] ? ARRAY_LENGTH : walk_array(p, len, h, d, row * d[6], true);
        } else {  // list: checked now, its count at offsets[row + 1]; pg_copy_strings writes it
          failure = h.count > d[7] ? ARRAY_LENGTH : walk_array(p, len, h, d, 0, false);
          if (failure == OK) at<int>(d[1])[row + 1] = (int)h.count;
        }
        break;
      }
    }
    if (failure != OK) { fail(error, failure, r, c); return; }
    p += len;
  }
}

// errors: 3 long longs per chunk (code, row within the chunk, column); the first failure of a chunk wins.
extern "C" __global__ void pg_decode_rows(const long long* __restrict__ chunks, int nchunks, long long nrows,
                                          const long long* __restrict__ desc, int ncols, long long* errors) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  const long long first = chunks[2];
  int k = 0;
  long long r;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nrows; i += stride) {
    const long long row = first + i;
    const unsigned char* p = locate(chunks, nchunks, row, k, r);
    decode_row(p, r, row, desc, ncols, errors + 3 * k);
  }
}

// errors: as for pg_decode_rows (a list whose elements run past the column's counted elements, which
// only a failure already reported there, or bytes the pump did not count, can cause).
extern "C" __global__ void pg_copy_strings(const long long* __restrict__ chunks, int nchunks, long long nrows,
                                           const long long* __restrict__ desc, int ncols, long long* errors) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  const long long first = chunks[2];
  int k = 0;
  long long r;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nrows; i += stride) {
    const long long row = first + i;
    const unsigned char* p = locate(chunks, nchunks, row, k, r);
    for (int c = 0; c < ncols; ++c) {
      const long long* d = desc + c * 8;
      const int len = (int)be32(p);
      p += 4;
      if (len < 0) continue;
      if (d[0] == VARLEN) {
        // Inside the column's bytes (slot 7) or not at all: after a row that pg_decode_rows refused
        // (reported from its error words, read after this kernel), later lengths of that row were
        // never written, so the scanned offsets may point anywhere.
        const long long off = at<int>(d[1])[row];
        if (off >= 0 && off + len <= d[7]) {
          unsigned char* dst = at<unsigned char>(d[3]) + off;
          for (int b = 0; b < len; ++b) dst[b] = p[b];
        }
      } else if (is_array(d[0]) && d[6] == 0) {
        // A list's elements, inside the column's elements (slot 7) for the same reason; walk_array
        // stops at the first fault, writing only elements [off, off + count).
        const long long off = at<int>(d[1])[row];
        const ArrayHeader h = array_header(p, len);
        if (h.failure == OK && h.element == array_oid(d[0])) {
          if (off >= 0 && off + h.count <= d[7]) {
            walk_array(p, len, h, d, off, true);
          } else {
            fail(errors + 3 * k, ARRAY_LENGTH, r, c);
          }
        }
      }
      p += len;
    }
  }
}

// pgvector values (dim big-endian float4 or float2 after int16 dim, int16 unused) -> row x dim, one warp
// per row, each lane moving 16 bytes of the output at a time: the row's bytes sit at any alignment in the
// COPY stream (a vector(768) row is 3082 bytes), so each lane loads the aligned 16-byte chunks holding its
// 16 bytes and shifts them into place (the shift is the row's, the same for every lane), swaps the bytes of
// each value and stores 16 aligned bytes. A thread per row with byte loads left each load instruction
// touching 32 rows' cache lines, and a lane per 4-byte value spent ~10 instructions a value. The elements
// before the output row's first 16-byte boundary and after its last are copied one per lane.
// Rows whose vectors pg_decode_rows refused are skipped (it reports them); so is anything whose length and
// dimension do not match, so the copy never leaves the row's bytes or its output row.

// The 16 bytes at p (any alignment), as four little-endian words of p[0..15]. Only aligned 16-byte chunks
// that hold a byte of [p, p + 16) are read: never past the allocation the bytes lie in (16-byte granular).
__device__ __forceinline__ uint4 load16(const unsigned char* p) {
  const unsigned long long a = (unsigned long long)p;
  const uint4* w = (const uint4*)(a & ~15ULL);
  const unsigned int s = (unsigned int)(a & 15);
  const uint4 lo = w[0];
  if (s == 0) return lo;
  const uint4 hi = w[1];
  // words q .. q + 4 of lo:hi, then shifted right by r bits (selects, not an indexed array: registers)
  const unsigned int q = s >> 2, r = (s & 3) * 8;
  const unsigned int a0 = q == 0 ? lo.x : q == 1 ? lo.y : q == 2 ? lo.z : lo.w;
  const unsigned int a1 = q == 0 ? lo.y : q == 1 ? lo.z : q == 2 ? lo.w : hi.x;
  const unsigned int a2 = q == 0 ? lo.z : q == 1 ? lo.w : q == 2 ? hi.x : hi.y;
  const unsigned int a3 = q == 0 ? lo.w : q == 1 ? hi.x : q == 2 ? hi.y : hi.z;
  const unsigned int a4 = q == 0 ? hi.x : q == 1 ? hi.y : q == 2 ? hi.z : hi.w;
  return make_uint4(__funnelshift_r(a0, a1, r), __funnelshift_r(a1, a2, r), __funnelshift_r(a2, a3, r),
                    __funnelshift_r(a3, a4, r));
}

// One row's values: `per` values of `width` bytes make 16 bytes; `swap` is the byte_perm selector that
// turns each word's big-endian values into little-endian ones (0x0123: one float4, 0x2301: two float2).
template <typename T>
__device__ __forceinline__ void copy_vector(const unsigned char* e, T* o, long long dim, int lane, unsigned int swap) {
  const long long per = 16 / sizeof(T);
  // the output row starts sizeof(T)-aligned (a 64-byte aligned column of T): values before its first
  // 16-byte boundary, then whole 16-byte pieces, then the rest
  long long head = (per - (long long)(((unsigned long long)o / sizeof(T)) & (per - 1))) & (per - 1);
  if (head > dim) head = dim;
  const long long pieces = (dim - head) / per;
  const long long rest = head + pieces * per;
  if (lane < head) o[lane] = sizeof(T) == 4 ? (T)be32(e + 4 * lane) : (T)be16(e + 2 * lane);
  for (long long k = lane; k < pieces; k += 32) {
    const long long j = head + k * per;
    uint4 v = load16(e + j * (long long)sizeof(T));
    v.x = __byte_perm(v.x, 0, swap);
    v.y = __byte_perm(v.y, 0, swap);
    v.z = __byte_perm(v.z, 0, swap);
    v.w = __byte_perm(v.w, 0, swap);
    *(uint4*)(o + j) = v;
  }
  const long long j = rest + lane;
  if (j < dim) o[j] = sizeof(T) == 4 ? (T)be32(e + 4 * j) : (T)be16(e + 2 * j);
}

extern "C" __global__ void pg_copy_vectors(const long long* __restrict__ chunks, int nchunks, long long nrows,
                                           const long long* __restrict__ desc, int ncols) {
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)blockDim.x * gridDim.x) >> 5;
  const long long first = chunks[2];
  int k = 0;
  long long r;
  for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < nrows; i += warps) {
    const long long row = first + i;
    const unsigned char* p = locate(chunks, nchunks, row, k, r);
    for (int c = 0; c < ncols; ++c) {
      const long long* d = desc + c * 8;
      const int len = (int)be32(p);
      p += 4;
      if (len < 0) continue;
      const int kind = (int)d[0];
      if (kind == VECTOR_F4 || kind == VECTOR_F2) {
        const long long dim = d[6];
        const long long width = kind == VECTOR_F4 ? 4 : 2;
        if (len == 4 + dim * width && (long long)be16(p) == dim) {
          if (kind == VECTOR_F4) {
            copy_vector(p + 4, at<unsigned int>(d[1]) + row * dim, dim, lane, 0x0123);
          } else {
            copy_vector(p + 4, at<unsigned short>(d[1]) + row * dim, dim, lane, 0x2301);
          }
        }
      }
      p += len;
    }
  }
}
