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
};

// One column's destination, as 8 int64 slots:
//   kind, values (or int32 offsets) address, validity bitmap address (0: the column has no NULLs),
//   string data address, this chunk's first string byte, decimal scale, vector dimension, string data bytes.
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
};

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
