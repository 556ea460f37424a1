#include "pg_encode.hpp"

#include <cstring>

namespace pystrom::pg {

namespace {

constexpr int32_t kDateShift = 10957;                      // days from 1970-01-01 to 2000-01-01
constexpr int64_t kTimestampShift = 946684800000000LL;     // microseconds from 1970 to 2000
constexpr int64_t kDateMin = -2451545;                     // PostgreSQL's first date (4713-11-24 BC) - 2000
constexpr int64_t kDateEnd = 2147483494LL - 2451545;       // one past its last (5874897-12-31)
constexpr int64_t kTimestampMin = -211813488000000000LL;  // MIN_TIMESTAMP (since 2000)
constexpr int64_t kTimestampEnd = 9223371331200000000LL;  // END_TIMESTAMP (294277-01-01, since 2000)
constexpr int64_t kDayMicros = 86400000000LL;
constexpr int64_t kInt64Max = INT64_MAX;
constexpr int64_t kInt64Min = INT64_MIN;

inline void put16(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
inline void put32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}
inline void put64(uint8_t* p, uint64_t v) {
  put32(p, uint32_t(v >> 32));
  put32(p + 4, uint32_t(v));
}

template <typename T>
inline T load(int64_t base, int64_t row) {
  T v;
  std::memcpy(&v, reinterpret_cast<const uint8_t*>(base) + row * int64_t(sizeof(T)), sizeof(T));
  return v;
}

inline uint32_t half_to_float_bits(uint32_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return sign << 31;
    int e = -1;  // subnormal: shift the mantissa up to its implicit bit
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return (sign << 31) | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  if (exp == 31) return (sign << 31) | 0x7f800000u | (mant << 13);
  return (sign << 31) | ((exp - 15 + 127) << 23) | (mant << 13);
}

// v * mul / div in microseconds (floor division), false when it overflows int64.
inline bool to_micros(int64_t v, int64_t mul, int64_t div, int64_t* out) {
  if (mul > 1 && (v > kInt64Max / mul || v < kInt64Min / mul)) return false;
  v *= mul;
  if (div > 1) {
    int64_t q = v / div;
    if ((v % div != 0) && (v < 0)) --q;
    v = q;
  }
  *out = v;
  return true;
}

// |value| as four 32-bit limbs (most significant first) and its base-10000 digits, PostgreSQL's
// numeric layout: returns ndigits; digits[0..ndigits) from the most significant, *weight the power
// of 10000 of the first. `scale` >= 0 fractional decimal digits sit at the bottom of the magnitude.
inline uint32_t divmod_small(uint32_t limbs[4], uint32_t d) {
  uint64_t rem = 0;
  for (int i = 0; i < 4; ++i) {
    const uint64_t cur = (rem << 32) | limbs[i];
    limbs[i] = uint32_t(cur / d);
    rem = cur % d;
  }
  return uint32_t(rem);
}

inline bool limbs_zero(const uint32_t l[4]) { return (l[0] | l[1] | l[2] | l[3]) == 0; }

int numeric_digits(uint32_t limbs[4], int scale, uint16_t digits[12], int* weight) {
  static const uint32_t kPow10[5] = {1, 10, 100, 1000, 10000};
  uint16_t g[12];  // base-10000 groups, least significant first
  int n = 0;
  const int r = scale % 4;
  if (r != 0) g[n++] = uint16_t(divmod_small(limbs, kPow10[r]) * kPow10[4 - r]);
  while (!limbs_zero(limbs) && n < 12) g[n++] = uint16_t(divmod_small(limbs, 10000));
  int k = 0;
  while (k < n && g[k] == 0) ++k;  // trailing zero groups carry nothing (dscale keeps the scale)
  if (k == n) {
    *weight = 0;
    return 0;
  }
  *weight = -((scale + 3) / 4) + n - 1;
  int nd = 0;
  for (int i = n - 1; i >= k; --i) digits[nd++] = g[i];
  return nd;
}

// One value of a scalar kind (E_BOOL .. E_INTERVAL, E_MDN_INTERVAL): value `index` of the buffer at
// `values`; its length and, when out is not null, its bytes at out. Sets *failure for a value
// PostgreSQL cannot take.
int64_t encode_scalar(int64_t kind, int64_t values, int64_t row, int64_t param, int64_t div, uint8_t* out,
                      int64_t* failure) {
  switch (kind) {
    case E_BOOL:
      if (out) out[0] = load<uint8_t>(values, row) ? 1 : 0;
      return 1;
    case E_INT8:
      if (out) put16(out, uint16_t(int16_t(load<int8_t>(values, row))));
      return 2;
    case E_UINT8:
      if (out) put16(out, load<uint8_t>(values, row));
      return 2;
    case E_INT16:
      if (out) put16(out, uint16_t(load<int16_t>(values, row)));
      return 2;
    case E_UINT16:
      if (out) put32(out, load<uint16_t>(values, row));
      return 4;
    case E_INT32:
      if (out) put32(out, uint32_t(load<int32_t>(values, row)));
      return 4;
    case E_UINT32:
      if (out) put64(out, load<uint32_t>(values, row));
      return 8;
    case E_INT64:
      if (out) put64(out, uint64_t(load<int64_t>(values, row)));
      return 8;
    case E_FLOAT16:
      if (out) put32(out, half_to_float_bits(load<uint16_t>(values, row)));
      return 4;
    case E_FLOAT32:
      if (out) put32(out, load<uint32_t>(values, row));
      return 4;
    case E_FLOAT64:
      if (out) put64(out, load<uint64_t>(values, row));
      return 8;
    case E_UINT64:
    case E_DECIMAL: {
      uint32_t limbs[4];
      bool negative = false;
      int scale = 0;
      if (kind == E_UINT64) {
        const uint64_t v = load<uint64_t>(values, row);
        limbs[0] = limbs[1] = 0;
        limbs[2] = uint32_t(v >> 32);
        limbs[3] = uint32_t(v);
      } else {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(values) + row * 16;
        uint64_t lo, hi;
        std::memcpy(&lo, p, 8);
        std::memcpy(&hi, p + 8, 8);
        negative = (hi >> 63) != 0;
        if (negative) {  // two's complement negation over 128 bits
          lo = ~lo + 1;
          hi = ~hi + (lo == 0 ? 1 : 0);
        }
        limbs[0] = uint32_t(hi >> 32);
        limbs[1] = uint32_t(hi);
        limbs[2] = uint32_t(lo >> 32);
        limbs[3] = uint32_t(lo);
        scale = int(param);
      }
      uint16_t digits[12];
      int weight = 0;
      const int nd = numeric_digits(limbs, scale, digits, &weight);
      if (out) {
        put16(out, uint16_t(nd));
        put16(out + 2, uint16_t(int16_t(weight)));
        put16(out + 4, (negative && nd > 0) ? 0x4000u : 0u);
        put16(out + 6, uint16_t(scale));
        for (int i = 0; i < nd; ++i) put16(out + 8 + 2 * i, digits[i]);
      }
      return 8 + 2 * int64_t(nd);
    }
    case E_DATE32:
    case E_DATE64: {
      int64_t days;
      int32_t pg;
      bool special = false;
      if (kind == E_DATE32) {
        const int32_t v = load<int32_t>(values, row);
        special = v == INT32_MAX || v == INT32_MIN;
        pg = v == INT32_MAX ? INT32_MAX : INT32_MIN;
        days = v;
      } else {
        const int64_t v = load<int64_t>(values, row);
        special = v == kInt64Max || v == kInt64Min;
        pg = v == kInt64Max ? INT32_MAX : INT32_MIN;
        days = v / 86400000LL - ((v % 86400000LL != 0 && v < 0) ? 1 : 0);
      }
      if (!special) {
        const int64_t shifted = days - kDateShift;
        if (shifted < kDateMin || shifted >= kDateEnd) {
          *failure = E_RANGE;
          return 0;
        }
        pg = int32_t(shifted);
      }
      if (out) put32(out, uint32_t(pg));
      return 4;
    }
    case E_TIMESTAMP: {
      const int64_t v = load<int64_t>(values, row);
      int64_t pg;
      if (v == kInt64Max || v == kInt64Min) {
        pg = v;  // PostgreSQL's infinity and -infinity are the same int64 extremes
      } else {
        int64_t us;
        if (!to_micros(v, param, div, &us)) {
          *failure = E_RANGE;
          return 0;
        }
        if (us < kTimestampMin + kTimestampShift) {
          *failure = E_RANGE;
          return 0;
        }
        pg = us - kTimestampShift;
        if (pg >= kTimestampEnd) {
          *failure = E_RANGE;
          return 0;
        }
      }
      if (out) put64(out, uint64_t(pg));
      return 8;
    }
    case E_TIME32:
    case E_TIME64: {
      const int64_t v = kind == E_TIME32 ? int64_t(load<int32_t>(values, row)) : load<int64_t>(values, row);
      int64_t us;
      if (!to_micros(v, param, div, &us) || us < 0 || us > kDayMicros) {
        *failure = E_TIME_RANGE;
        return 0;
      }
      if (out) put64(out, uint64_t(us));
      return 8;
    }
    case E_INTERVAL: {
      int64_t us;
      if (!to_micros(load<int64_t>(values, row), param, div, &us)) {
        *failure = E_OVERFLOW;
        return 0;
      }
      if (out) {
        put64(out, uint64_t(us));
        put32(out + 8, 0);
        put32(out + 12, 0);
      }
      return 16;
    }
    case E_MDN_INTERVAL: {
      if (out) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(values) + row * 16;
        uint32_t months, days;
        int64_t ns;
        std::memcpy(&months, p, 4);
        std::memcpy(&days, p + 4, 4);
        std::memcpy(&ns, p + 8, 8);
        const int64_t us = ns / 1000 - ((ns % 1000 != 0 && ns < 0) ? 1 : 0);  // floored, as timestamps
        put64(out, uint64_t(us));
        put32(out + 8, days);
        put32(out + 12, months);
      }
      return 16;
    }
    default:
      *failure = E_RANGE;  // unreachable: the Python side only builds the kinds above
      return 0;
  }
}

// An element's bytes on the wire (fixed-width element kinds) and the element type OID it is sent as.
inline int64_t wire_width(int64_t kind) {
  switch (kind) {
    case E_BOOL: return 1;
    case E_INT8: case E_UINT8: case E_INT16: return 2;
    case E_UINT16: case E_INT32: case E_FLOAT16: case E_FLOAT32: return 4;
    default: return 8;  // E_UINT32, E_INT64, E_FLOAT64 (E_UINT64 is a numeric of its own length)
  }
}
inline uint32_t element_oid(int64_t kind) {
  switch (kind) {
    case E_BOOL: return 16;                                 // bool
    case E_INT8: case E_UINT8: case E_INT16: return 21;     // int2
    case E_UINT16: case E_INT32: return 23;                 // int4
    case E_UINT32: case E_INT64: return 20;                 // int8
    case E_UINT64: return 1700;                             // numeric
    case E_FLOAT16: case E_FLOAT32: return 700;             // float4
    default: return 701;                                    // float8
  }
}

inline bool bit_set(int64_t bitmap, int64_t k) {
  return ((reinterpret_cast<const uint8_t*>(bitmap)[uint64_t(k) >> 3] >> (uint64_t(k) & 7)) & 1) != 0;
}

constexpr int64_t kMaxField = 0x3FFFFFFF;  // PostgreSQL's largest field (MaxAllocSize - 1)

// A list row as a one-dimensional array (array_send's layout: ndim, has-NULL flag, element OID, then
// for one dimension its size and lower bound 1; an empty array is ndim 0 and nothing after the OID),
// each element as its length (-1: NULL) and bytes.
int64_t encode_array(const int64_t* d, int64_t row, uint8_t* out, int64_t* failure) {
  const int64_t ekind = d[5], dim = d[6], child_bits = d[7];
  int64_t first, count;
  if (d[1] == 0) {  // a fixed_size_list (d may be 0: every row empty)
    first = d[8] + row * dim;
    count = dim;
  } else {
    first = load<int32_t>(d[1], row);
    count = int64_t(load<int32_t>(d[1], row + 1)) - first;
  }
  int64_t nulls = 0;
  if (child_bits != 0) {
    for (int64_t j = 0; j < count; ++j) nulls += bit_set(child_bits, first + j) ? 0 : 1;
  }
  int64_t size = count == 0 ? 12 : 20;
  if (ekind == E_UINT64) {
    for (int64_t j = 0; j < count; ++j) {
      if (child_bits == 0 || bit_set(child_bits, first + j)) {
        size += encode_scalar(ekind, d[4], first + j, 0, 1, nullptr, failure);
      }
    }
    size += 4 * count;
  } else {
    size += 4 * count + (count - nulls) * wire_width(ekind);
  }
  if (size > kMaxField) {
    *failure = E_TOO_LONG;
    return 0;
  }
  if (out) {
    put32(out, count == 0 ? 0 : 1);
    put32(out + 4, nulls != 0 ? 1 : 0);
    put32(out + 8, element_oid(ekind));
    uint8_t* p = out + 12;
    if (count != 0) {
      put32(p, uint32_t(count));
      put32(p + 4, 1);
      p += 8;
    }
    for (int64_t j = 0; j < count; ++j) {
      if (child_bits != 0 && !bit_set(child_bits, first + j)) {
        put32(p, 0xFFFFFFFFu);
        p += 4;
        continue;
      }
      const int64_t len = encode_scalar(ekind, d[4], first + j, 0, 1, p + 4, failure);
      put32(p, uint32_t(len));
      p += 4 + len;
    }
  }
  return size;
}

// A fixed_size_list<float32|float16>[d] row as pgvector's vector(d) | halfvec(d): int16 dimension,
// int16 unused (0), the d values big-endian (float4 | float2). pgvector refuses NULL elements, NaN
// and infinities: so do we, naming the row, before anything is sent.
int64_t encode_vector(const int64_t* d, int64_t row, uint8_t* out, int64_t* failure) {
  const bool half = d[5] == E_FLOAT16;
  const int64_t dim = d[6], first = d[8] + row * dim, child_bits = d[7];
  const int64_t width = half ? 2 : 4;
  if (out == nullptr) {  // the sizes pass checks every element
    for (int64_t j = 0; j < dim; ++j) {
      if (child_bits != 0 && !bit_set(child_bits, first + j)) {
        *failure = E_VECTOR_NULL;
        return 0;
      }
      const bool finite = half ? (load<uint16_t>(d[4], first + j) & 0x7C00u) != 0x7C00u
                                : (load<uint32_t>(d[4], first + j) & 0x7F800000u) != 0x7F800000u;
      if (!finite) {
        *failure = E_VECTOR_VALUE;
        return 0;
      }
    }
    return 4 + dim * width;
  }
  put16(out, uint32_t(dim));
  put16(out + 2, 0);
  for (int64_t j = 0; j < dim; ++j) {
    if (half) {
      put16(out + 4 + 2 * j, load<uint16_t>(d[4], first + j));
    } else {
      put32(out + 4 + 4 * j, load<uint32_t>(d[4], first + j));
    }
  }
  return 4 + dim * width;
}

// One field of a row: its length (-1: NULL) and, when out is not null, its bytes at out. Sets
// *failure for a value PostgreSQL cannot take.
int64_t encode_field(const int64_t* d, int64_t row, uint8_t* out, int64_t* failure) {
  const int64_t kind = d[0], values = d[1], validity = d[2];
  if (validity != 0 && !bit_set(validity, d[3] + row)) return -1;
  switch (kind) {
    case E_VARLEN: {
      const int32_t a = load<int32_t>(values, row), b = load<int32_t>(values, row + 1);
      const int64_t len = int64_t(b) - a;
      if (out && len > 0) std::memcpy(out, reinterpret_cast<const uint8_t*>(d[4]) + a, std::size_t(len));
      return len;
    }
    case E_FIXED: {
      const int64_t param = d[5];
      if (out) std::memcpy(out, reinterpret_cast<const uint8_t*>(values) + row * param, std::size_t(param));
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

}  // namespace

EncodeError row_sizes(const int64_t* desc, int ncols, int64_t begin, int64_t end, int64_t* sizes) {
  for (int64_t row = begin; row < end; ++row) {
    int64_t size = 2;
    for (int c = 0; c < ncols; ++c) {
      int64_t failure = E_OK;
      const int64_t len = encode_field(desc + c * kEncodeSlots, row, nullptr, &failure);
      if (failure != E_OK) return {failure, row, c};
      size += 4 + (len > 0 ? len : 0);
    }
    sizes[row - begin] = size;
  }
  return {E_OK, 0, 0};
}

int64_t encode_rows(const int64_t* desc, int ncols, int64_t begin, int64_t end, uint8_t* out, std::size_t capacity) {
  std::size_t pos = 0;
  for (int64_t row = begin; row < end; ++row) {
    if (capacity - pos < 2) return -1;
    put16(out + pos, uint16_t(ncols));
    pos += 2;
    for (int c = 0; c < ncols; ++c) {
      const int64_t* d = desc + c * kEncodeSlots;
      int64_t failure = E_OK;
      const int64_t len = encode_field(d, row, nullptr, &failure);
      if (failure != E_OK) return -1;
      if (capacity - pos < 4 + std::size_t(len > 0 ? len : 0)) return -1;
      put32(out + pos, uint32_t(int32_t(len)));
      pos += 4;
      if (len > 0) {
        encode_field(d, row, out + pos, &failure);
        pos += std::size_t(len);
      }
    }
  }
  return int64_t(pos);
}

}  // namespace pystrom::pg
