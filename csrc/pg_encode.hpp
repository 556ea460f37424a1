// CPU encoder of a table's Arrow-layout columns into PostgreSQL binary COPY rows (COPY ... FROM STDIN
// (FORMAT BINARY)). Twin of the GPU kernels in src/pystrom/kernels/pg_encode.cu: same descriptors, same
// bytes, compared by the tests. Pure C++, no Python: module.cpp binds it.
//
// Two passes over a row range: row_sizes() checks every value (a date PostgreSQL cannot hold fails
// here, before a byte is sent) and gives each row's size, from which the caller lays the rows out;
// encode_rows() writes them: int16 field count, then per field an int32 length (-1: NULL) and the
// value in network byte order.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom::pg {

// Source kinds (kept in step with pystrom/io/postgres/ddl.py and kernels/pg_encode.cu); the arrow
// after each is the PostgreSQL type it is sent as.
enum EncodeKind : int64_t {
  E_BOOL = 0,       // 1 byte -> bool
  E_INT8 = 1,       // -> int2
  E_UINT8 = 2,      // -> int2
  E_INT16 = 3,      // -> int2
  E_UINT16 = 4,     // -> int4
  E_INT32 = 5,      // -> int4
  E_UINT32 = 6,     // -> int8
  E_INT64 = 7,      // -> int8
  E_UINT64 = 8,     // -> numeric (scale 0)
  E_FLOAT16 = 9,    // -> float4
  E_FLOAT32 = 10,   // -> float4
  E_FLOAT64 = 11,   // -> float8
  E_DECIMAL = 12,   // 16 bytes little endian two's complement, scale in slot 5 -> numeric
  E_DATE32 = 13,    // int32 days since 1970 -> date (INT32_MAX/MIN: +-infinity)
  E_DATE64 = 14,    // int64 ms since 1970 -> date (INT64_MAX/MIN: +-infinity)
  E_TIMESTAMP = 15, // int64 units since 1970, * slot 5 / slot 6 -> timestamp(tz) (INT64_MAX/MIN: +-infinity)
  E_TIME32 = 16,    // int32 units since midnight * slot 5 -> time
  E_TIME64 = 17,    // int64 units since midnight * slot 5 / slot 6 -> time
  E_INTERVAL = 18,  // int64 units * slot 5 / slot 6 -> interval (microseconds, 0 days, 0 months)
  E_VARLEN = 19,    // int32 offsets + bytes -> text / bytea
  E_FIXED = 20,     // slot 5 bytes per value -> bytea / uuid
  E_MDN_INTERVAL = 21,  // 16 bytes: int32 months, int32 days, int64 ns -> interval (microseconds, ns floored)
  E_ARRAY = 22,     // list<T> / fixed_size_list<T>[d] -> a one-dimensional T[]; slot 5 = T's kind (E_BOOL..E_FLOAT64)
  E_VECTOR = 23,    // fixed_size_list<float32|float16>[d] -> pgvector vector(d) | halfvec(d); slot 5 = E_FLOAT32|16
};

// One column's source, as 10 int64 slots:
//   0 kind, 1 values (or int32 offsets) address of row 0, 2 validity bitmap address (0: no NULLs),
//   3 bit of row 0 in the bitmap, 4 string data address, 5 parameter (scale, width, multiplier or
//   element kind), 6 divisor (sub-microsecond units) or d (fixed_size_list, vector), 7 element
//   validity bitmap address (0: no NULL elements), 8 element index of row 0 (fixed_size_list, vector), 9 unused.
// A list's elements are addressed by their index in the child buffer: offsets[row] + j for list<T>
// (slot 1: the offsets, absolute), slot 8 + row * d + j for fixed_size_list<T>[d] (slot 1: 0); element k's value is
// at slot 4 + k * sizeof(T) and its validity bit is bit k of slot 7's bitmap.
constexpr int kEncodeSlots = 10;

// Values PostgreSQL cannot take, reported with the first failing row and column.
enum EncodeFailure : int64_t {
  E_OK = 0,
  E_RANGE = 1,       // a date or timestamp outside PostgreSQL's range (4713 BC .. 5874897 AD / 294276 AD)
  E_TIME_RANGE = 2,  // a time of day outside [00:00, 24:00]
  E_OVERFLOW = 3,    // a duration or timestamp whose microseconds overflow int64
  E_VECTOR_NULL = 4,   // a NULL element in a row sent as a pgvector vector (pgvector has none)
  E_VECTOR_VALUE = 5,  // NaN or +-Infinity in a vector (pgvector refuses them)
  E_TOO_LONG = 6,      // a field past PostgreSQL's 1 GB limit
};

struct EncodeError {
  int64_t code;
  int64_t row;  // table row
  int64_t column;
};

// The encoded size of rows [begin, end) into sizes[0, end - begin); the first value that cannot be
// sent stops the pass and is reported.
EncodeError row_sizes(const int64_t* desc, int ncols, int64_t begin, int64_t end, int64_t* sizes);

// Encode rows [begin, end) into out[0, capacity); returns the bytes written, or -1 if they do not
// fit (the caller sized `out` with row_sizes, which also checked every value).
int64_t encode_rows(const int64_t* desc, int ncols, int64_t begin, int64_t end, uint8_t* out, std::size_t capacity);

}  // namespace pystrom::pg
