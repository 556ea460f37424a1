// Row gathers for variable-length (string/binary) columns. Pure C++; bindings in module.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom {

// Copy the bytes of rows `rows[0..count)` of a string column (src_offsets has n + 1 entries indexing
// src_data) into dst_data at dst_offsets[i] (precomputed prefix sums of the gathered lengths).
// Returns false, copying nothing more, when a row index or an offset lies out of range.
bool gather_varbinary(const int32_t* src_offsets, std::size_t n, const uint8_t* src_data, std::size_t src_size,
                      const int64_t* rows, std::size_t count, const int32_t* dst_offsets, uint8_t* dst_data,
                      std::size_t dst_size);

}  // namespace pystrom
