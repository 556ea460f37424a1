#include "pg_arrays.hpp"

#include <cstring>

namespace pystrom::pg {

namespace {

inline uint32_t load_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

inline void store_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

inline bool bit_set(const uint8_t* bits, int64_t i) {
  const uint64_t b = static_cast<uint64_t>(i);
  return (bits[b >> 3] >> (b & 7)) & 1;
}

// Row i's bytes, its offsets read once (a buffer changed by another thread cannot make the range checked
// differ from the range read): false where they leave data.
inline bool row_range(const BinaryRows& rows, int64_t i, const uint8_t*& p, int32_t& len) {
  const int32_t b = rows.offsets[i], e = rows.offsets[i + 1];
  if (b < 0 || e < b || static_cast<uint64_t>(e) > rows.size) return false;
  p = rows.data + b;
  len = e - b;
  return true;
}

inline bool row_null(const BinaryRows& rows, int64_t i) {
  return rows.validity != nullptr && !bit_set(rows.validity, rows.bit_offset + i);
}

// One array's elements, each checked before on_element(ptr, len) sees it (ptr nullptr: NULL); the
// header through array_header, as the numeric arrays' decoder reads it. on_element returns false to
// stop (an output full). element_oid < 0: the element type is not checked. Returns a Failure, or -1
// where on_element stopped.
template <typename OnElement>
int64_t walk_array(const uint8_t* p, int32_t len, int64_t element_oid, int64_t& count, OnElement&& on_element) {
  const ArrayHeader h = array_header(p, len);
  count = h.count;
  if (h.failure != OK) return h.failure;
  if (element_oid >= 0 && h.element != static_cast<uint32_t>(element_oid)) return ARRAY_ELEMENT;
  int64_t at = h.body;
  for (int64_t k = 0; k < h.count; ++k) {
    if (len - at < 4) return ARRAY_BAD;
    const int32_t n = static_cast<int32_t>(load_be32(p + at));
    at += 4;
    if (n == -1) {
      if (!h.has_null) return ARRAY_BAD;  // array_recv would build a different array than the flag says
      if (!on_element(nullptr, 0)) return -1;
      continue;
    }
    if (n < 0 || n > len - at) return ARRAY_BAD;
    if (!on_element(p + at, n)) return -1;
    at += n;
  }
  return at == len ? OK : ARRAY_BAD;  // trailing bytes: not an array PostgreSQL sent
}

constexpr int64_t kInt32Max = INT32_MAX;

}  // namespace

TextArraysMeasure text_arrays_measure(const BinaryRows& rows, uint32_t element_oid) {
  TextArraysMeasure r;
  for (int64_t i = 0; i < rows.n; ++i) {
    if (row_null(rows, i)) continue;
    const uint8_t* p;
    int32_t len;
    int64_t count = 0, nulls = 0, bytes = 0;
    int64_t f = row_range(rows, i, p, len) ? walk_array(p, len, element_oid, count, [&](const uint8_t* q, int32_t n) {
      if (q == nullptr) ++nulls;
      bytes += n;
      return true;
    })
                                           : ARRAY_BAD;
    if (f == OK) {
      r.elements += count;
      r.nbytes += bytes;
      r.null_elements += nulls;
      // Arrow's int32 offsets index elements and bytes. While the rows' own offsets are int32 the input
      // bounds both sums below 2^31 and this never fires; it keeps the outputs' limit stated here, not
      // inherited from the input's type (the sums cannot wrap int64: each row adds less than 2^31)
      if (r.elements > kInt32Max || r.nbytes > kInt32Max) f = ARRAY_TOO_LARGE;
    }
    if (f != OK) {
      r.failure = f;
      r.bad_row = i;
      return r;
    }
  }
  return r;
}

TextArraysFill text_arrays_fill(const BinaryRows& rows, const ListStringsOut& out) {
  TextArraysFill r;
  if (out.str_cap < 1) {
    r.short_buffer = "str_offsets";
    return r;
  }
  int64_t m = 0, pos = 0;  // elements and bytes written
  out.list_offsets[0] = 0;
  out.str_offsets[0] = 0;
  for (int64_t i = 0; i < rows.n; ++i) {
    if (!row_null(rows, i)) {
      const uint8_t* p;
      int32_t len;
      int64_t count = 0;
      const char* full = nullptr;
      int64_t f = ARRAY_BAD;
      if (row_range(rows, i, p, len)) {
        f = walk_array(p, len, -1, count, [&](const uint8_t* q, int32_t n) {
          if (m + 1 > kInt32Max || pos + n > kInt32Max) {
            full = "";  // too large, not too small: told apart below
            return false;
          }
          if (static_cast<uint64_t>(m) + 1 >= out.str_cap) {
            full = "str_offsets";
            return false;
          }
          if (q == nullptr || out.elem_validity != nullptr) {
            if (out.elem_validity == nullptr || static_cast<uint64_t>(m >> 3) >= out.elem_cap) {
              full = "elem_validity";
              return false;
            }
            const uint8_t mask = static_cast<uint8_t>(1u << (m & 7));
            uint8_t& byte = out.elem_validity[m >> 3];
            byte = q == nullptr ? static_cast<uint8_t>(byte & ~mask) : static_cast<uint8_t>(byte | mask);
          }
          if (static_cast<uint64_t>(pos) + static_cast<uint64_t>(n) > out.data_cap) {
            full = "str_data";
            return false;
          }
          if (n > 0) std::memcpy(out.str_data + pos, q, static_cast<std::size_t>(n));
          pos += n;
          ++m;
          out.str_offsets[m] = static_cast<int32_t>(pos);
          return true;
        });
      }
      if (f != OK) {
        r.bad_row = i;
        if (f >= 0) {
          r.failure = f;
        } else if (*full == '\0') {
          r.failure = ARRAY_TOO_LARGE;
        } else {
          r.short_buffer = full;
        }
        return r;
      }
    }
    out.list_offsets[i + 1] = static_cast<int32_t>(m);
  }
  if (out.elem_validity != nullptr && (m & 7) != 0) {  // byte m >> 3 was written: it lies inside elem_cap
    out.elem_validity[m >> 3] &= static_cast<uint8_t>((1u << (m & 7)) - 1);
  }
  return r;
}

namespace {

// Row i's size as encode writes it, its elements [a, b) and their offsets checked; -1 with reason set
// where they are bad.
int64_t encoded_row_size(const ListStrings& in, int64_t i, int32_t a, int32_t b, bool& has_null, const char*& reason) {
  has_null = false;
  if (a < 0 || b < a) {
    reason = "its list offsets are negative or decrease";
    return -1;
  }
  if (b > a && b > in.str_count - 1) {
    reason = "its list offsets reach past the string offsets";
    return -1;
  }
  if (in.row_validity != nullptr && !bit_set(in.row_validity, in.row_bit_offset + i)) return 0;
  if (a == b) return 12;  // ndim 0, as array_send writes '{}'
  if (in.elem_validity != nullptr && b > in.elem_bits) {
    reason = "its elements reach past the element validity bitmap";
    return -1;
  }
  int64_t size = 20 + 4 * static_cast<int64_t>(b - a);
  for (int32_t j = a; j < b; ++j) {
    if (in.elem_validity != nullptr && !bit_set(in.elem_validity, j)) {
      has_null = true;
      continue;
    }
    const int32_t s = in.str_offsets[j], e = in.str_offsets[j + 1];
    if (s < 0 || e < s) {
      reason = "its string offsets are negative or decrease";
      return -1;
    }
    if (in.str_data != nullptr && static_cast<uint64_t>(e) > in.str_size) {
      reason = "its string offsets reach past the string data";
      return -1;
    }
    size += e - s;
  }
  return size;
}

// Row [a, b)'s array into p[0, size): the string offsets are read again here, so each is checked again
// against the row's room (the sizes pass read the same memory, but nothing stops it changing).
bool write_row(const ListStrings& in, int32_t a, int32_t b, bool has_null, uint32_t element_oid, uint8_t* p,
               int64_t size) {
  const uint8_t* end = p + size;
  store_be32(p, a == b ? 0 : 1);
  store_be32(p + 4, has_null ? 1 : 0);
  store_be32(p + 8, element_oid);
  p += 12;
  if (a == b) return p == end;
  store_be32(p, static_cast<uint32_t>(b - a));
  store_be32(p + 4, 1);  // lower bound
  p += 8;
  for (int32_t j = a; j < b; ++j) {
    if (end - p < 4) return false;
    if (in.elem_validity != nullptr && !bit_set(in.elem_validity, j)) {
      if (!has_null) return false;  // the flag written above would contradict it
      store_be32(p, 0xFFFFFFFFu);
      p += 4;
      continue;
    }
    const int32_t s = in.str_offsets[j], e = in.str_offsets[j + 1];
    if (s < 0 || e < s || static_cast<uint64_t>(e) > in.str_size || e - s > end - p - 4) return false;
    store_be32(p, static_cast<uint32_t>(e - s));
    if (e > s) std::memcpy(p + 4, in.str_data + s, static_cast<std::size_t>(e - s));
    p += 4 + (e - s);
  }
  return p == end;
}

}  // namespace

TextArraysEncode text_arrays_encode_sizes(const ListStrings& in) {
  TextArraysEncode r;
  for (int64_t i = 0; i < in.n; ++i) {
    bool has_null;
    const int32_t a = in.list_offsets[i], b = in.list_offsets[i + 1];  // read once: checked as used
    const int64_t size = encoded_row_size(in, i, a, b, has_null, r.reason);
    if (size < 0) {
      r.bad_row = i;
      return r;
    }
    r.total += size;  // at most 2^31 elements of at most 2^31 bytes each, plus 24 bytes a row: no overflow
  }
  return r;
}

TextArraysEncode text_arrays_encode(const ListStrings& in, uint32_t element_oid, int32_t* out_offsets, uint8_t* out,
                                    std::size_t out_size) {
  TextArraysEncode r;
  out_offsets[0] = 0;
  for (int64_t i = 0; i < in.n; ++i) {
    bool has_null;
    const int32_t a = in.list_offsets[i], b = in.list_offsets[i + 1];  // read once: checked as used
    const int64_t size = encoded_row_size(in, i, a, b, has_null, r.reason);
    if (size < 0) {
      r.bad_row = i;
      return r;
    }
    if (r.total + size > kInt32Max) {
      r.bad_row = i;
      r.reason = "the arrays up to it take more than 2^31 - 1 bytes (a varbinary column's int32 offsets)";
      return r;
    }
    if (static_cast<uint64_t>(r.total + size) > out_size) {
      r.bad_row = i;
      r.reason = "its array does not fit out_data (size it with pg_text_arrays_encode_sizes)";
      return r;
    }
    if (size > 0 && !write_row(in, a, b, has_null, element_oid, out + r.total, size)) {
      r.bad_row = i;
      r.reason = "its offsets or element validity changed while it was encoded";
      return r;
    }
    r.total += size;
    out_offsets[i + 1] = static_cast<int32_t>(r.total);
  }
  return r;
}

}  // namespace pystrom::pg
