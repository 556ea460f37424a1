// PostgreSQL's binary arrays of text-like elements (text[], varchar[], bpchar[], name[]) <-> Arrow's
// list<string> buffers. Pure C++, no Python: module.cpp binds it, io/postgres/text_arrays.py wraps it.
//
// An array's binary form (array_send, binary COPY) is described in pg_decode.hpp. Decoding takes two
// passes: measure() checks every row and counts what the Arrow buffers need; the caller allocates them;
// fill() writes them. fill() checks every byte again and every write against the buffers it was given,
// so a measure of other bytes (a buffer reused between the passes) can fail but never write out of bounds.
// Encoding is the other way round: encode_sizes() checks the Arrow offsets and gives the total, encode()
// writes one binary array per row (a varbinary column, sent as-is as a binary COPY field).
#pragma once
#include <cstddef>
#include <cstdint>

#include "pg_decode.hpp"

namespace pystrom::pg {

// The binary arrays of rows [0, n): row i is data[offsets[i], offsets[i + 1]) unless bit
// bit_offset + i of validity is clear (validity nullptr: no NULL rows). Offsets are read once per row and
// checked against size before any byte is: rows that reach outside data fail with ARRAY_BAD.
struct BinaryRows {
  const int32_t* offsets;  // n + 1 of them
  int64_t n;
  const uint8_t* data;
  std::size_t size;
  const uint8_t* validity;
  int64_t bit_offset;
};

struct TextArraysMeasure {
  int64_t elements = 0;       // list elements over all rows, NULL elements included
  int64_t nbytes = 0;         // string bytes
  int64_t null_elements = 0;  // NULL elements
  int64_t bad_row = -1;       // the first row that failed, -1 if none
  int64_t failure = OK;       // OK, ARRAY_NDIM, ARRAY_ELEMENT, ARRAY_BAD or ARRAY_TOO_LARGE
};

// Check every row's array (one dimension or none, elements of type element_oid, lengths that match its
// bytes) and count elements and bytes; stops at the first failure.
TextArraysMeasure text_arrays_measure(const BinaryRows& rows, uint32_t element_oid);

// Where fill() writes: list_offsets n + 1 int32, str_offsets up to str_cap int32 (elements + 1 are
// written), str_data up to data_cap bytes, elem_validity up to elem_cap bytes (nullptr: the rows may hold
// no NULL element).
struct ListStringsOut {
  int32_t* list_offsets;
  int32_t* str_offsets;
  std::size_t str_cap;
  uint8_t* str_data;
  std::size_t data_cap;
  uint8_t* elem_validity;
  std::size_t elem_cap;
};

struct TextArraysFill {
  int64_t failure = OK;  // as measure's (the element type is not checked again: measure did)
  int64_t bad_row = -1;
  const char* short_buffer = nullptr;  // the output that cannot hold what row bad_row needs, else nullptr
};

// Decode the rows into out. NULL rows become empty lists; bits of elem_validity [0, elements) are set
// for valid elements and cleared for NULL ones, and the last byte's bits past them cleared.
TextArraysFill text_arrays_fill(const BinaryRows& rows, const ListStringsOut& out);

// An Arrow list<string> column as the encoder reads it. Row i's elements are [list_offsets[i],
// list_offsets[i + 1]) (a sliced column's need not start at 0); element j's bytes are
// str_data[str_offsets[j], str_offsets[j + 1]); elem_validity's bit j is element j (nullptr: no NULL
// elements), elem_bits the bits it holds. row_validity (nullptr: no NULL rows) must hold bits
// [row_bit_offset, row_bit_offset + n): the binding checks it.
struct ListStrings {
  const int32_t* list_offsets;  // n + 1 of them
  int64_t n;
  const uint8_t* row_validity;
  int64_t row_bit_offset;
  const int32_t* str_offsets;
  int64_t str_count;       // entries of str_offsets
  const uint8_t* str_data; // nullptr: not known (encode_sizes), the string ends are not checked
  std::size_t str_size;
  const uint8_t* elem_validity;
  int64_t elem_bits;
};

struct TextArraysEncode {
  int64_t total = 0;           // bytes of all rows' arrays
  int64_t bad_row = -1;        // the first row whose offsets are bad, or past which the total overflows
  const char* reason = nullptr;  // what is wrong with it, nullptr if nothing
};

// The checks and the total of encode(); the total may exceed INT32_MAX (the caller refuses it).
TextArraysEncode text_arrays_encode_sizes(const ListStrings& in);

// Write row i's array to out[out_offsets[i], out_offsets[i + 1]) (NULL rows: empty), checking the
// offsets again and every write against out_size; out_offsets holds n + 1 entries. A total past
// INT32_MAX fails (reason set).
TextArraysEncode text_arrays_encode(const ListStrings& in, uint32_t element_oid, int32_t* out_offsets, uint8_t* out,
                                    std::size_t out_size);

}  // namespace pystrom::pg
