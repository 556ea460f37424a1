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

// Offsets another process may rewrite at any time (an imported table): copy src[0..count) to dst and check
// the copy, in cache-sized chunks, so the check reads what was copied from the cache and the caller follows
// exactly what was checked. Returns the first position p that breaks the rules of offsets o[0..n] (n + 1 =
// count): p == 0 when o[0] < 0, p < n when o[p + 1] < o[p], p == n when o[n] > limit; -1 when none does.
// The smallest failing position wins (the copy stops there). CPU twin of memory/offsets.py's
// first_bad_offset on a copy (and of kernels/validate.cu).
int64_t copy_offsets_checked(const int32_t* src, std::size_t count, int32_t* dst, int64_t limit);

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
