#include "bits.hpp"

#include <cstring>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pystrom's bit helpers assume a little-endian host"
#endif

namespace pystrom {
namespace {

// Windows of 56 bits: shifted by up to 7 they still fit a 64-bit word read from 8 bytes.
constexpr uint64_t kWindow = 56;

inline uint64_t low_mask(uint64_t n) { return n >= 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1); }

// Read the bytes covering bits [pos, pos + n) into a word, never touching memory past `size`.
inline uint64_t load_bits(const uint8_t* p, std::size_t size, uint64_t pos, uint64_t n) {
  const std::size_t byte = static_cast<std::size_t>(pos >> 3);
  const unsigned shift = static_cast<unsigned>(pos & 7);
  std::size_t nbytes = static_cast<std::size_t>((shift + n + 7) >> 3);
  if (nbytes > size - byte) nbytes = size - byte;
  uint64_t word = 0;
  std::memcpy(&word, p + byte, nbytes);
  return (word >> shift) & low_mask(n);
}

}  // namespace

void copy_bits(const uint8_t* src, std::size_t src_size, uint64_t src_offset,
               uint8_t* dst, std::size_t dst_size, uint64_t dst_offset, uint64_t count) {
  if ((src_offset & 7) == 0 && (dst_offset & 7) == 0) {
    // Byte-aligned on both sides: whole bytes move with memcpy, only the tail needs masking.
    const uint64_t whole = count >> 3;
    std::memmove(dst + (dst_offset >> 3), src + (src_offset >> 3), static_cast<std::size_t>(whole));
    src_offset += whole << 3;
    dst_offset += whole << 3;
    count -= whole << 3;
  }
  while (count > 0) {
    const uint64_t n = count < kWindow ? count : kWindow;
    const uint64_t bits = load_bits(src, src_size, src_offset, n);
    const std::size_t byte = static_cast<std::size_t>(dst_offset >> 3);
    const unsigned shift = static_cast<unsigned>(dst_offset & 7);
    std::size_t nbytes = static_cast<std::size_t>((shift + n + 7) >> 3);
    if (nbytes > dst_size - byte) nbytes = dst_size - byte;
    uint64_t word = 0;
    std::memcpy(&word, dst + byte, nbytes);
    const uint64_t mask = low_mask(n) << shift;
    word = (word & ~mask) | (bits << shift);
    std::memcpy(dst + byte, &word, nbytes);
    src_offset += n;
    dst_offset += n;
    count -= n;
  }
}

void unpack_bits(const uint8_t* src, std::size_t src_size, uint64_t src_offset,
                 uint8_t* dst, uint64_t count) {
  uint64_t i = 0;
  while (i < count) {
    const uint64_t n = (count - i) < kWindow ? (count - i) : kWindow;
    uint64_t bits = load_bits(src, src_size, src_offset + i, n);
    for (uint64_t k = 0; k < n; ++k) {
      dst[i + k] = static_cast<uint8_t>(bits & 1);
      bits >>= 1;
    }
    i += n;
  }
}

uint64_t count_bits(const uint8_t* src, std::size_t src_size, uint64_t src_offset, uint64_t count) {
  uint64_t total = 0;
  while (count > 0) {
    const uint64_t n = count < kWindow ? count : kWindow;
    total += static_cast<uint64_t>(__builtin_popcountll(load_bits(src, src_size, src_offset, n)));
    src_offset += n;
    count -= n;
  }
  return total;
}

}  // namespace pystrom
