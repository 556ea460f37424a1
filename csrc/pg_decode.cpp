#include "pg_decode.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace pystrom::pg {

namespace {

inline uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
inline uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
inline uint64_t be64(const uint8_t* p) { return (uint64_t(be32(p)) << 32) | be32(p + 4); }

// PostgreSQL counts days and microseconds from 2000-01-01, Arrow from 1970-01-01.
constexpr int32_t kDateShift = 10957;
constexpr int64_t kTimestampShift = 946684800000000LL;

constexpr uint16_t kNumericNeg = 0x4000, kNumericNaN = 0xC000, kNumericPInf = 0xD000, kNumericNInf = 0xF000;

// Binary exponent the scaling of values near the ends of the double range is shifted by (numeric_f64).
constexpr int kGuard = 128;

// Exact powers of ten representable in a double.
constexpr double kPow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

// m * 10^e for an exact integer m held as m_hi + m_lo: one exact power of ten at a time with an
// FMA-corrected product/quotient, so a value with up to 19 significant digits and |e| <= 22 comes out
// correctly rounded but for near-ties; beyond, each further step may add half an ulp.
inline double scale10(double hi, double lo, int e, double* lo_out) {
  while (e != 0) {
    const int k = e > 0 ? (e > 22 ? 22 : e) : (e < -22 ? 22 : -e);
    const double pw = kPow10[k];
    if (e > 0) {
      const double p = hi * pw;
      lo = std::fma(hi, pw, -p) + lo * pw;
      hi = p;
      e -= k;
    } else {
      const double q = hi / pw;
      lo = (std::fma(-q, pw, hi) + lo) / pw;
      hi = q;
      e += k;
    }
    if (!std::isfinite(hi)) {
      *lo_out = 0.0;
      return hi;
    }
    const double s = hi + lo;  // renormalise the pair
    lo = lo - (s - hi);
    hi = s;
  }
  const double s = hi + lo;
  *lo_out = lo - (s - hi);
  return s;
}

// hi + lo (a normalised pair) times 2^-guard, guard > 0, rounded once. Where the result is subnormal,
// ldexp rounds hi alone (ties to even); when hi lies exactly halfway between two subnormals, lo
// says on which side hi + lo lies. (Off a tie hi decides: the part of hi that ldexp dropped is a
// multiple of hi's last bit, and |lo| is at most half of one.)
inline double scale_down_once(double hi, double lo, int guard) {
  double r = std::ldexp(hi, -guard);
  const double dropped = hi - std::ldexp(r, guard);  // exact; 0 where the result is normal
  const double half = std::ldexp(1.0, guard - 1075);  // half a subnormal step, at hi's scale
  if (dropped == half && lo > 0) r = std::nextafter(r, std::numeric_limits<double>::infinity());
  if (dropped == -half && lo < 0) r = std::nextafter(r, -std::numeric_limits<double>::infinity());
  return r;
}

// numeric -> float64 from its first 19 significant digits (exact in a uint64).
int64_t numeric_f64(const uint8_t* p, int32_t len, double* out) {
  if (len < 8) return BAD_LENGTH;
  const int ndigits = static_cast<int16_t>(be16(p));
  const int weight = static_cast<int16_t>(be16(p + 2));
  const uint16_t sign = be16(p + 4);
  if (sign == kNumericNaN) { *out = std::numeric_limits<double>::quiet_NaN(); return OK; }
  if (sign == kNumericPInf) { *out = std::numeric_limits<double>::infinity(); return OK; }
  if (sign == kNumericNInf) { *out = -std::numeric_limits<double>::infinity(); return OK; }
  if (ndigits < 0 || len != 8 + 2 * ndigits) return BAD_LENGTH;
  if (ndigits == 0) { *out = 0.0; return OK; }
  // Whole groups while they fit, then single digits up to 19 (the rest is below the last bit).
  uint64_t m = 0;
  int e = 0;
  for (int i = 0; i < ndigits; ++i) {
    const uint32_t g = be16(p + 8 + 2 * i);
    if (m < 1000000000000000ULL) {
      m = m * 10000 + g;
      e = 4 * (weight - i);
      continue;
    }
    const uint32_t div[4] = {1000, 100, 10, 1};
    for (int j = 0; j < 4 && m < 1000000000000000000ULL; ++j) {
      m = m * 10 + (g / div[j]) % 10;
      e = 4 * (weight - i) + 3 - j;
    }
    break;
  }
  // m * 10^e with m < 10^19 of `digits` digits: past the double range at once (the value is at least
  // 10^(e + digits - 1)); near its ends the scaling runs on m * 2^-+kGuard, so that no step overflows
  // or sinks into subnormals, and one exact (or, below DBL_MIN, one rounding) power of two ends it.
  int digits = 19;  // m's digit count matters only near the ends of the range
  if (e > 250 || e < -250) {
    digits = 0;
    for (uint64_t t = m; t != 0; t /= 10) ++digits;
  }
  double v;
  if (e + digits > 310) {
    v = m == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  } else if (e + digits < -330) {
    v = 0.0;  // below 10^-330: under half the smallest subnormal
  } else {
    const double hi = static_cast<double>(m);
    const double lo = static_cast<double>(static_cast<int64_t>(m - static_cast<uint64_t>(hi)));
    const int guard = e + digits > 280 ? -kGuard : (e + digits < -280 ? kGuard : 0);
    double rest;
    if (guard == 0) {
      v = scale10(hi, lo, e, &rest);
    } else {
      const double top = scale10(std::ldexp(hi, guard), std::ldexp(lo, guard), e, &rest);
      v = guard < 0 ? std::ldexp(top, -guard) : scale_down_once(top, rest, guard);  // up: exact or inf
    }
  }
  *out = sign == kNumericNeg ? -v : v;
  return OK;
}

// 128-bit unsigned magnitude as four 32-bit limbs, least significant first.
struct U128 {
  uint32_t w[4];
};
// 10^38: decimal128's largest precision is 38 digits.
constexpr U128 kDecimalLimit = {{0x00000000u, 0x098A2240u, 0x5A86C47Au, 0x4B3B4CA8u}};

inline bool less(const U128& a, const U128& b) {
  for (int i = 3; i >= 0; --i) {
    if (a.w[i] != b.w[i]) return a.w[i] < b.w[i];
  }
  return false;
}
// a = a * k + add; false when the result leaves 128 bits.
inline bool mul_add(U128& a, uint32_t k, uint32_t add) {
  uint64_t carry = add;
  for (int i = 0; i < 4; ++i) {
    const uint64_t t = uint64_t(a.w[i]) * k + carry;
    a.w[i] = static_cast<uint32_t>(t);
    carry = t >> 32;
  }
  return carry == 0;
}
constexpr uint32_t kPow10Small[5] = {1, 10, 100, 1000, 10000};

// numeric -> decimal128 at `scale`: exact, or a failure code (never a wrapped value).
int64_t numeric_dec128(const uint8_t* p, int32_t len, int scale, uint8_t* out) {
  if (len < 8) return BAD_LENGTH;
  const int ndigits = static_cast<int16_t>(be16(p));
  const int weight = static_cast<int16_t>(be16(p + 2));
  const uint16_t sign = be16(p + 4);
  if (sign == kNumericNaN || sign == kNumericPInf || sign == kNumericNInf) return DECIMAL_SPECIAL;
  if (ndigits < 0 || len != 8 + 2 * ndigits) return BAD_LENGTH;
  // The unscaled value is the sum of group i * 10^(last + 4 (ndigits - 1 - i)), `last` being the last
  // group's power of ten at this scale. Horner's rule over the groups, stopping at the scale: a group
  // straddling it contributes only its digits above (those below must be zeros), later groups nothing.
  // Only digits that belong to the value ever enter v, so every value below 10^38 fits (summing the
  // last group's zero padding first overflowed numeric(38, 10) values with 28 integer digits).
  const int last = 4 * (weight - ndigits + 1) + scale;
  U128 v = {{0, 0, 0, 0}};
  for (int i = 0; i < ndigits; ++i) {
    const uint32_t g = be16(p + 8 + 2 * i);
    const int e = last + 4 * (ndigits - 1 - i);
    if (e >= 0) {
      if (!mul_add(v, 10000, g) || !less(v, kDecimalLimit)) return DECIMAL_OVERFLOW;
    } else if (e > -4) {
      const uint32_t drop = kPow10Small[-e];
      if (g % drop != 0) return DECIMAL_SCALE;
      if (!mul_add(v, kPow10Small[4 + e], g / drop) || !less(v, kDecimalLimit)) return DECIMAL_OVERFLOW;
    } else if (g != 0) {
      return DECIMAL_SCALE;
    }
  }
  for (int e = last; e > 0; --e) {  // the groups end above the scale: append zeros
    if (!mul_add(v, 10, 0) || !less(v, kDecimalLimit)) return DECIMAL_OVERFLOW;
  }
  if (sign == kNumericNeg) {  // two's complement
    uint64_t carry = 1;
    for (int i = 0; i < 4; ++i) {
      const uint64_t t = uint64_t(static_cast<uint32_t>(~v.w[i])) + carry;
      v.w[i] = static_cast<uint32_t>(t);
      carry = t >> 32;
    }
  }
  std::memcpy(out, v.w, 16);  // little-endian limbs, as Arrow stores decimal128
  return OK;
}

inline void clear_bit(uint8_t* bitmap, int64_t row) {
  __atomic_fetch_and(bitmap + (row >> 3), static_cast<uint8_t>(~(1u << (row & 7))), __ATOMIC_RELAXED);
}

template <typename T>
inline T* at(int64_t address) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(address));
}

// Array kinds: element width in the table and element type OID (bool, int2, int4, int8, float4, float8).
constexpr int kArrayWidth[6] = {1, 2, 4, 8, 4, 8};
constexpr uint32_t kArrayOid[6] = {16, 21, 23, 20, 700, 701};
inline bool is_array(int64_t kind) { return kind >= ARRAY_BOOL && kind <= ARRAY_FLOAT8; }

// Element `index` of an array column from its big-endian bytes (nullptr: zero, for a NULL).
inline void put_element(const int64_t* d, int width, int64_t index, const uint8_t* e) {
  uint8_t* out = at<uint8_t>(d[3]) + index * width;
  switch (width) {
    case 1: out[0] = e != nullptr && e[0] != 0; break;
    case 2: { const uint16_t v = e ? be16(e) : 0; std::memcpy(out, &v, 2); break; }
    case 4: { const uint32_t v = e ? be32(e) : 0; std::memcpy(out, &v, 4); break; }
    default: { const uint64_t v = e ? be64(e) : 0; std::memcpy(out, &v, 8); break; }
  }
}

// One array value (len bytes at p) into elements [first, first + count) of its column, checking everything
// before it writes there: its header, element type and count (d of a fixed_size_list; within the
// column's counted elements for a list), each element's length and the bytes' end.
int64_t decode_array(const uint8_t* p, int32_t len, const int64_t* d, int64_t first, int64_t* count) {
  const ArrayHeader h = array_header(p, len);
  if (h.failure != OK) return h.failure;
  const int k = static_cast<int>(d[0] - ARRAY_BOOL);
  if (h.element != kArrayOid[k]) return ARRAY_ELEMENT;
  if (d[6] != 0 ? h.count != d[6] : h.count > d[7] - first) return ARRAY_LENGTH;
  const int width = kArrayWidth[k];
  const uint8_t* e = p + h.body;
  const uint8_t* end = p + len;
  for (int64_t i = 0; i < h.count; ++i) {
    if (end - e < 4) return ARRAY_BAD;
    const int32_t elen = static_cast<int32_t>(be32(e));
    e += 4;
    if (elen == -1) {
      if (!h.has_null) return ARRAY_BAD;
      if (d[5] == 0) return UNEXPECTED_NULL;
      clear_bit(at<uint8_t>(d[5]), first + i);
      put_element(d, width, first + i, nullptr);
      continue;
    }
    if (elen != width) return BAD_LENGTH;
    if (end - e < width) return ARRAY_BAD;
    put_element(d, width, first + i, e);
    e += width;
  }
  if (e != end) return ARRAY_BAD;
  *count = h.count;
  return OK;
}

}  // namespace

DecodeError decode_rows(const uint8_t* buf, const int64_t* offsets, int64_t nrows, int64_t row_base,
                        const int64_t* desc, int ncols) {
  // String columns: bytes written so far in this chunk, per column (list columns: elements).
  int64_t written[1664] = {0};
  for (int64_t r = 0; r < nrows; ++r) {
    const uint8_t* p = buf + offsets[r] + 2;  // skip the field count (checked by the pump)
    const int64_t row = row_base + r;
    for (int c = 0; c < ncols; ++c) {
      const int64_t* d = desc + c * kDescSlots;
      const int32_t len = static_cast<int32_t>(be32(p));
      p += 4;
      const int64_t kind = d[0];
      if (len < 0) {  // NULL
        if (d[2] == 0) return {UNEXPECTED_NULL, r, c};
        clear_bit(at<uint8_t>(d[2]), row);
        switch (kind) {
          case BOOL: at<uint8_t>(d[1])[row] = 0; break;
          case INT2: at<int16_t>(d[1])[row] = 0; break;
          case INT4: case FLOAT4: case DATE: case OID: at<int32_t>(d[1])[row] = 0; break;
          case INT8: case FLOAT8: case NUMERIC_F64: case TIMESTAMP: at<int64_t>(d[1])[row] = 0; break;
          case NUMERIC_DEC128: case UUID: case MONEY: std::memset(at<uint8_t>(d[1]) + row * 16, 0, 16); break;
          case VARLEN: at<int32_t>(d[1])[row] = static_cast<int32_t>(d[4] + written[c]); break;
          case VECTOR_F4: std::memset(at<uint8_t>(d[1]) + row * d[6] * 4, 0, static_cast<std::size_t>(d[6] * 4)); break;
          case VECTOR_F2: std::memset(at<uint8_t>(d[1]) + row * d[6] * 2, 0, static_cast<std::size_t>(d[6] * 2)); break;
          default:
            if (!is_array(kind)) break;
            if (d[6] == 0) {  // a list: empty
              at<int32_t>(d[1])[row] = static_cast<int32_t>(d[4] + written[c]);
            } else {  // a fixed_size_list row keeps its d slots: zeros
              const int width = kArrayWidth[kind - ARRAY_BOOL];
              std::memset(at<uint8_t>(d[3]) + row * d[6] * width, 0, static_cast<std::size_t>(d[6] * width));
            }
        }
        continue;
      }
      int64_t failure = OK;
      switch (kind) {
        case BOOL:
          if (len != 1) failure = BAD_LENGTH; else at<uint8_t>(d[1])[row] = p[0] != 0;
          break;
        case INT2:
          if (len != 2) failure = BAD_LENGTH; else at<int16_t>(d[1])[row] = static_cast<int16_t>(be16(p));
          break;
        case INT4: case FLOAT4: case OID:
          if (len != 4) failure = BAD_LENGTH; else at<uint32_t>(d[1])[row] = be32(p);
          break;
        case INT8: case FLOAT8:
          if (len != 8) failure = BAD_LENGTH; else at<uint64_t>(d[1])[row] = be64(p);
          break;
        case DATE:
          if (len != 4) {
            failure = BAD_LENGTH;
          } else {
            const int32_t v = static_cast<int32_t>(be32(p));
            // +-infinity are INT32_MAX/MIN in PostgreSQL: kept as the same sentinels.
            const bool inf = v == std::numeric_limits<int32_t>::max() || v == std::numeric_limits<int32_t>::min();
            at<int32_t>(d[1])[row] = inf ? v : v + kDateShift;
          }
          break;
        case TIMESTAMP:
          if (len != 8) {
            failure = BAD_LENGTH;
          } else {
            const int64_t v = static_cast<int64_t>(be64(p));
            const bool inf = v == std::numeric_limits<int64_t>::max() || v == std::numeric_limits<int64_t>::min();
            if (!inf && v > std::numeric_limits<int64_t>::max() - kTimestampShift) {
              failure = TIMESTAMP_RANGE;  // after 294247 AD: past int64 microseconds since 1970
            } else {
              at<int64_t>(d[1])[row] = inf ? v : v + kTimestampShift;
            }
          }
          break;
        case NUMERIC_F64:
          failure = numeric_f64(p, len, at<double>(d[1]) + row);
          break;
        case NUMERIC_DEC128:
          failure = numeric_dec128(p, len, static_cast<int>(d[5]), at<uint8_t>(d[1]) + row * 16);
          break;
        case UUID:
          if (len != 16) failure = BAD_LENGTH; else std::memcpy(at<uint8_t>(d[1]) + row * 16, p, 16);
          break;
        case MONEY:
          if (len != 8) {
            failure = BAD_LENGTH;
          } else {  // sign-extended into decimal128's two little-endian 64-bit halves
            const uint64_t v[2] = {be64(p), static_cast<int64_t>(be64(p)) < 0 ? ~uint64_t(0) : 0};
            std::memcpy(at<uint8_t>(d[1]) + row * 16, v, 16);
          }
          break;
        case VECTOR_F4: case VECTOR_F2: {
          const int64_t dim = d[6];
          const int64_t width = kind == VECTOR_F4 ? 4 : 2;
          if (len < 4 || len != 4 + dim * width) {
            failure = len >= 4 && (len - 4) % width == 0 ? VECTOR_DIM : BAD_LENGTH;
          } else if (static_cast<int64_t>(be16(p)) != dim) {
            failure = VECTOR_DIM;
          } else if (kind == VECTOR_F4) {
            uint32_t* o = at<uint32_t>(d[1]) + row * dim;
            for (int64_t j = 0; j < dim; ++j) o[j] = be32(p + 4 + 4 * j);
          } else {
            uint16_t* o = at<uint16_t>(d[1]) + row * dim;
            for (int64_t j = 0; j < dim; ++j) o[j] = be16(p + 4 + 2 * j);
          }
          break;
        }
        case VARLEN: {
          const int64_t dst = d[4] + written[c];
          at<int32_t>(d[1])[row] = static_cast<int32_t>(dst);
          std::memcpy(at<uint8_t>(d[3]) + dst, p, static_cast<std::size_t>(len));
          written[c] += len;
          break;
        }
        default: {
          if (!is_array(kind)) {
            failure = BAD_LENGTH;
            break;
          }
          const int64_t first = d[6] == 0 ? d[4] + written[c] : row * d[6];
          int64_t count = 0;
          failure = decode_array(p, len, d, first, &count);
          if (failure == OK && d[6] == 0) {
            at<int32_t>(d[1])[row] = static_cast<int32_t>(first);
            written[c] += count;
          }
        }
      }
      if (failure != OK) return {failure, r, c};
      p += len;
    }
  }
  // Close each string (and list) column's offsets: the row after this chunk starts where this chunk ended.
  for (int c = 0; c < ncols; ++c) {
    const int64_t* d = desc + c * kDescSlots;
    if (d[0] == VARLEN || (is_array(d[0]) && d[6] == 0)) {
      at<int32_t>(d[1])[row_base + nrows] = static_cast<int32_t>(d[4] + written[c]);
    }
  }
  return {OK, 0, 0};
}

}  // namespace pystrom::pg
