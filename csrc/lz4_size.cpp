// LZ4 frame format (lz4_Frame_format.md) and block format (lz4_Block_format.md): one walk of a frame's
// blocks and sequences, which either only counts the bytes they produce (lz4_frame_size) or also writes
// them (lz4_frame_decode), so both refuse exactly the same frames.
#include "lz4_size.hpp"

#include <cstring>

namespace pystrom {

namespace {

uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// Counting only, the walk stops at this many bytes: far above any block's maximum.
constexpr std::size_t kCountLimit = std::size_t{1} << 40;

// A match of `match` bytes, `offset` back from out (offset <= what is written before out).
void copy_match(uint8_t* out, std::size_t offset, std::size_t match) {
  const uint8_t* from = out - offset;
  if (offset >= match) {
    std::memcpy(out, from, match);  // apart: one copy
  } else if (offset >= 8) {
    // overlapping by at least 8: forward 8-byte steps only read bytes already written
    std::size_t k = 0;
    for (; k + 8 <= match; k += 8) std::memcpy(out + k, from + k, 8);
    for (; k < match; ++k) out[k] = from[k];
  } else {
    for (std::size_t k = 0; k < match; ++k) out[k] = from[k];  // a short period repeated
  }
}

// One compressed block src[0, n) appended at output position o; matches may reach back to the frame's
// first byte (its blocks are linked). Writes into dst when kWrite. Returns the new output position,
// -1 when malformed, -2 past cap.
template <bool kWrite>
int64_t walk_block(const uint8_t* src, std::size_t n, uint8_t* dst, std::size_t o, std::size_t cap) {
  std::size_t at = 0;
  while (true) {
    if (at >= n) return -1;
    const uint8_t token = src[at++];
    std::size_t literals = token >> 4;
    if (literals == 15) {
      uint8_t more;
      do {
        if (at >= n) return -1;
        more = src[at++];
        literals += more;
      } while (more == 255);
    }
    if (literals > n - at) return -1;
    if (literals > cap - o) return -2;
    if (kWrite) std::memcpy(dst + o, src + at, literals);
    at += literals;
    o += literals;
    if (at == n) return static_cast<int64_t>(o);  // the last sequence holds literals only
    if (n - at < 2) return -1;
    const std::size_t offset = static_cast<std::size_t>(src[at]) | static_cast<std::size_t>(src[at + 1]) << 8;
    at += 2;
    if (offset == 0 || offset > o) return -1;
    std::size_t match = (token & 15) + 4;
    if ((token & 15) == 15) {
      uint8_t more;
      do {
        if (at >= n) return -1;
        more = src[at++];
        match += more;
      } while (more == 255);
    }
    if (match > cap - o) return -2;
    if (kWrite) copy_match(dst + o, offset, match);
    o += match;
  }
}

template <bool kWrite>
int64_t walk_frame(const uint8_t* src, std::size_t size, uint8_t* dst, std::size_t cap) {
  if (size < 7 || le32(src) != 0x184D2204u) return -1;
  const uint8_t flg = src[4], bd = src[5];
  if ((flg >> 6) != 1 || (flg & 0x02) || (flg & 0x01)) return -1;  // version 01, reserved bit, dictionary id
  if ((bd & 0x8F) != 0) return -1;
  const unsigned block_id = (bd >> 4) & 7;
  if (block_id < 4) return -1;
  const std::size_t block_max = std::size_t{1} << (8 + 2 * block_id);  // 4: 64 KiB ... 7: 4 MiB
  const bool block_checksum = flg & 0x10, content_size = flg & 0x08, content_checksum = flg & 0x04;
  if (size < 7 + (content_size ? 8u : 0u)) return -1;
  int64_t declared = -1;
  if (content_size) {
    const uint64_t v = static_cast<uint64_t>(le32(src + 6)) | static_cast<uint64_t>(le32(src + 10)) << 32;
    if (v > (uint64_t{1} << 62)) return -1;
    declared = static_cast<int64_t>(v);
  }
  std::size_t at = 6 + (content_size ? 8 : 0) + 1;  // FLG BD [content size] HC
  std::size_t o = 0;
  while (true) {
    if (size - at < 4) return -1;
    const uint32_t word = le32(src + at);
    at += 4;
    if (word == 0) break;  // EndMark
    const std::size_t n = word & 0x7FFFFFFFu;
    if (n > block_max || n > size - at) return -1;
    if (word & 0x80000000u) {  // stored uncompressed
      if (n > cap - o) return -2;
      if (kWrite) std::memcpy(dst + o, src + at, n);
      o += n;
    } else {
      const int64_t next = walk_block<kWrite>(src + at, n, dst, o, cap);
      if (next < 0) return next;
      if (static_cast<std::size_t>(next) - o > block_max) return -1;
      o = static_cast<std::size_t>(next);
    }
    at += n;
    if (block_checksum) {
      if (size - at < 4) return -1;
      at += 4;
    }
  }
  if (content_checksum) {
    if (size - at < 4) return -1;
    at += 4;
  }
  if (at != size || (declared >= 0 && declared != static_cast<int64_t>(o))) return -1;
  return static_cast<int64_t>(o);
}

}  // namespace

int64_t lz4_frame_decode(const uint8_t* src, std::size_t size, uint8_t* dst, std::size_t cap) {
  return walk_frame<true>(src, size, dst, cap);
}

int64_t lz4_frame_size(const uint8_t* src, std::size_t size) {
  const int64_t got = walk_frame<false>(src, size, nullptr, kCountLimit);
  return got == -2 ? -1 : got;
}

void lz4_frames_decode(const uint8_t* src, const int64_t* offsets, const int64_t* sizes, const int64_t* dst,
                       const int64_t* caps, const int64_t* which, std::size_t n, int64_t* produced) {
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t i = which ? static_cast<std::size_t>(which[j]) : j;
    const uint8_t* frame = src + offsets[i];
    const std::size_t size = static_cast<std::size_t>(sizes[i]);
    int64_t got = -2;
    if (caps[i] > 0) {
      got = lz4_frame_decode(frame, size, reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(dst[i])),
                             static_cast<std::size_t>(caps[i]));
    }
    produced[i] = got == -2 ? lz4_frame_size(frame, size) : got;  // more than the claim: how much, for the error
  }
}

}  // namespace pystrom
