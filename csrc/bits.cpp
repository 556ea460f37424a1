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

// The bytes that hold bits [pos, pos + n) of a buffer of `size` bytes, clipped to the buffer.
struct Window {
  std::size_t byte;
  unsigned shift;
  std::size_t nbytes;
};

inline Window window(std::size_t size, uint64_t pos, uint64_t n) {
  const std::size_t byte = static_cast<std::size_t>(pos >> 3);
  const unsigned shift = static_cast<unsigned>(pos & 7);
  std::size_t nbytes = static_cast<std::size_t>((shift + n + 7) >> 3);
  if (nbytes > size - byte) nbytes = size - byte;
  return {byte, shift, nbytes};
}

// Bits [pos, pos + n) of `p` as the low bits of a word (n <= 56), never touching memory past `size`.
inline uint64_t load_bits(const uint8_t* p, std::size_t size, uint64_t pos, uint64_t n) {
  const Window w = window(size, pos, n);
  uint64_t word = 0;
  std::memcpy(&word, p + w.byte, w.nbytes);
  return (word >> w.shift) & low_mask(n);
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
    const Window w = window(dst_size, dst_offset, n);
    uint64_t word = 0;
    std::memcpy(&word, dst + w.byte, w.nbytes);
    const uint64_t mask = low_mask(n) << w.shift;
    word = (word & ~mask) | (bits << w.shift);
    std::memcpy(dst + w.byte, &word, w.nbytes);
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

void unpack_bit_spans(const uint8_t* src, std::size_t src_size, const int64_t* at, const int64_t* bit,
                      const int64_t* count, const int64_t* start, std::size_t n, uint8_t missing, uint8_t* dst) {
  for (std::size_t s = 0; s < n; ++s) {
    uint8_t* out = dst + start[s];
    const uint64_t k = static_cast<uint64_t>(count[s]);
    if (at[s] < 0) {
      std::memset(out, missing, k);
    } else {
      const std::size_t from = static_cast<std::size_t>(at[s]);
      unpack_bits(src + from, src_size - from, static_cast<uint64_t>(bit[s]), out, k);
    }
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
