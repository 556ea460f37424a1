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

// String or list offsets of many record batches placed at once (io/arrow/read/direct.py): for spans s < n,
// dst[start[s] + j] = src[at[s] + j] - shift[s] for j < count[s] (a batch's n + 1 offsets, rebased from
// its own data buffer to its place in the column's). Callers guarantee every span fits src and dst and
// every shift lies within 2^32 either way (the binding checks: the difference then never leaves int64).
// CPU twin of kernels/strings.cu's shift_spans.
void shift_spans(const int32_t* src, const int64_t* at, const int64_t* count, const int64_t* shift,
                 const int64_t* start, std::size_t n, int32_t* dst);

// Spans of src copied to addresses (the CPU inflate's partial reads out of its scratch,
// io/arrow/read/compressed_reads.py): size[s] bytes from src + offset[s] to the address dst[s], for s < n. Callers
// guarantee the spans lie inside src (the binding checks) and the addresses are theirs. CPU twin of
// kernels/copies.cu's copy_out.
void copy_out(const uint8_t* src, const int64_t* offset, const int64_t* dst, const int64_t* size, std::size_t n);

}  // namespace pystrom
