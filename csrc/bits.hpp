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

// Number of set bits among `count` bits starting at `src_offset`.
uint64_t count_bits(const uint8_t* src, std::size_t src_size, uint64_t src_offset, uint64_t count);

}  // namespace pystrom
