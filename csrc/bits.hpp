// Bit-level helpers for Arrow validity bitmaps and boolean buffers (LSB bit order).
// Pure C++, no Python: the bindings in module.cpp convert arguments and release the GIL.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom {

// Copy `count` bits from bit position `src_offset` of `src` to bit position `dst_offset` of `dst`.
// Bits of `dst` outside the target range are left untouched. Callers guarantee both ranges fit.
void copy_bits(const uint8_t* src, std::size_t src_size, uint64_t src_offset,
               uint8_t* dst, std::size_t dst_size, uint64_t dst_offset, uint64_t count);

// Expand `count` bits starting at `src_offset` into one byte per bit (0 or 1).
void unpack_bits(const uint8_t* src, std::size_t src_size, uint64_t src_offset,
                 uint8_t* dst, uint64_t count);

// Many unpack_bits at once (a bitmap a record batch, io/arrow/read/direct.py): for spans s < n, dst[start[s] + i] =
// bit (bit[s] + i) of src + at[s], one byte 0/1, for i < count[s]; where at[s] < 0 (no bitmap) the byte
// `missing` instead. Callers guarantee every span fits src[0, src_size) and dst. CPU twin of
// kernels/bitmap.cu's unpack_bit_spans.
void unpack_bit_spans(const uint8_t* src, std::size_t src_size, const int64_t* at, const int64_t* bit,
                      const int64_t* count, const int64_t* start, std::size_t n, uint8_t missing, uint8_t* dst);

// Number of set bits among `count` bits starting at `src_offset`.
uint64_t count_bits(const uint8_t* src, std::size_t src_size, uint64_t src_offset, uint64_t count);

}  // namespace pystrom
