// CPU decoder of PostgreSQL binary COPY rows into a table's Arrow-layout buffers. Twin of the GPU
// kernels in src/pystrom/kernels/pg_decode.cu: same descriptors, same results, compared by the tests.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom::pg {

// Column kinds (kept in step with pystrom/io/_pq.py and kernels/pg_decode.cu).
enum Kind : int64_t {
  BOOL = 0,
  INT2 = 1,
  INT4 = 2,
  INT8 = 3,
  FLOAT4 = 4,
  FLOAT8 = 5,
  NUMERIC_F64 = 6,
  NUMERIC_DEC128 = 7,
  DATE = 8,
  TIMESTAMP = 9,
  VARLEN = 10,  // text, varchar, bpchar, name, bytea: int32 offsets + bytes
  UUID = 11,
  OID = 12,
  VECTOR_F4 = 13,  // pgvector vector(n): int16 dim, int16 unused, n big-endian float4 -> n float32
  VECTOR_F2 = 14,  // pgvector halfvec(n): int16 dim, int16 unused, n big-endian float2 -> n float16
  // One-dimensional arrays (bool[] .. float8[]) -> list<T> (slot 6 = 0) or fixed_size_list<T>[d] (slot 6 = d)
  ARRAY_BOOL = 15,
  ARRAY_INT2 = 16,
  ARRAY_INT4 = 17,
  ARRAY_INT8 = 18,
  ARRAY_FLOAT4 = 19,
  ARRAY_FLOAT8 = 20,
  MONEY = 21,  // money: int64 in the currency's smallest unit -> decimal128 (scale: lc_monetary's digits)
};

// An array's binary form: int32 ndim, int32 has-NULL flag, int32 element OID, per dimension int32 size and
// int32 lower bound (ignored), then per element int32 length (-1: NULL) and its bytes. ndim 0: empty.

// One column's destination, as 8 int64 slots:
//   kind, values (or int32 offsets) address, validity bitmap address (0: the column has no NULLs),
//   string data address, this chunk's first string byte, decimal scale, vector dimension, string data bytes.
// Array columns use them as: kind, int32 offsets address (list; 0 for fixed_size_list), validity address,
//   element values address, this chunk's first element (list), element validity bitmap address (0: no
//   NULL elements), d (fixed_size_list; 0 for list), the column's element count (no write goes past it).
constexpr int kDescSlots = 8;

// Decode failures, reported with the first failing row and column.
enum Failure : int64_t {
  OK = 0,
  BAD_LENGTH = 1,        // a field's length does not fit its type
  DECIMAL_OVERFLOW = 2,  // a numeric that needs more than 38 digits at the column's scale
  DECIMAL_SPECIAL = 3,   // NaN or +-Infinity where a decimal is asked for
  DECIMAL_SCALE = 4,     // more fractional digits than the column's scale
  UNEXPECTED_NULL = 5,   // a NULL in a column planned without validity
  TIMESTAMP_RANGE = 6,   // a timestamp after 294247 AD: int64 microseconds since 1970 cannot hold it
  VECTOR_DIM = 7,        // a vector whose dimension is not the column's
  ARRAY_NDIM = 8,        // a multi-dimensional array
  ARRAY_ELEMENT = 9,     // an array whose element type is not the column's
  ARRAY_LENGTH = 10,     // an array whose length is not the fixed_size_list's d, or past the counted elements
  ARRAY_BAD = 11,        // an array whose dimensions, NULL flag or element lengths do not match its bytes
  ARRAY_TOO_LARGE = 12,  // text arrays (pg_arrays.hpp): more elements or bytes than int32 Arrow offsets hold
};

// What an array's header says (array_header): its element count and first element, or a failure.
struct ArrayHeader {
  int64_t failure;   // OK, ARRAY_NDIM or ARRAY_BAD
  int64_t count;     // elements
  int64_t body;      // bytes before the first element's length word
  uint32_t element;  // element type OID
  bool has_null;     // the has-NULL flag
};

// The header of the array in p[0, len): shared by the pump (which counts elements while streaming) and
// the decoder, so both see the same count. The count is bounded by the bytes (each element has at
// least its length word); the elements themselves are checked by the decoder.
inline ArrayHeader array_header(const uint8_t* p, int32_t len) {
  auto word = [](const uint8_t* q) {
    return (uint32_t(q[0]) << 24) | (uint32_t(q[1]) << 16) | (uint32_t(q[2]) << 8) | uint32_t(q[3]);
  };
  ArrayHeader h{ARRAY_BAD, 0, 12, 0, false};
  if (len < 12) return h;
  const int32_t ndim = static_cast<int32_t>(word(p));
  const uint32_t flag = word(p + 4);
  h.element = word(p + 8);
  h.has_null = flag != 0;
  if (ndim < 0 || flag > 1) return h;
  if (ndim > 1) {
    h.failure = ARRAY_NDIM;
    return h;
  }
  if (ndim == 1) {
    if (len < 20) return h;
    const int32_t size = static_cast<int32_t>(word(p + 12));  // then the lower bound, ignored
    if (size < 0 || size > (len - 20) / 4) return h;
    h.count = size;
    h.body = 20;
  }
  h.failure = OK;
  return h;
}

struct DecodeError {
  int64_t code;
  int64_t row;  // relative to the chunk
  int64_t column;
};

// Decode `nrows` rows of `buf` (row starts in `offsets`) into rows [row_base, row_base + nrows).
// Bitmaps must be preset to all-valid: NULLs clear their bit (atomically: chunks run in parallel).
DecodeError decode_rows(const uint8_t* buf, const int64_t* offsets, int64_t nrows, int64_t row_base,
                        const int64_t* desc, int ncols);

}  // namespace pystrom::pg
