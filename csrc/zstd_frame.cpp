// ZSTD frames (RFC 8878, "Zstandard Compression and the application/zstd Media Type") walked for structure.
#include "zstd_frame.hpp"

#include <initializer_list>

namespace pystrom {

namespace {

constexpr uint32_t kMagic = 0xFD2FB528u;
constexpr uint64_t kBlockMax = 128 * 1024;  // Block_Maximum_Size's upper limit
constexpr unsigned kWindowLogMax = 31;      // zstd refuses larger windows (ZSTD_WINDOWLOG_MAX, 64-bit)

uint64_t le(const uint8_t* p, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// What the frame's earlier blocks left for later ones to repeat (no dictionary: nothing at its start).
struct Tables {
  bool huffman = false;    // a Compressed literals section described a Huffman tree
  bool sequences = false;  // a sequences section with sequences chose its three tables
};

// A bitstream of n bytes at p: non-empty, and its last byte holds the end mark (a set bit).
bool bitstream_ok(const uint8_t* p, std::size_t n) { return n > 0 && p[n - 1] != 0; }

// The literals section of a compressed block b[0, n): its length, or 0 when malformed; *regen gets the
// number of literals it regenerates.
std::size_t literals_section(const uint8_t* b, std::size_t n, uint64_t block_max, Tables& t, uint64_t* regen) {
  if (n < 1) return 0;
  const unsigned type = b[0] & 3, format = (b[0] >> 2) & 3;
  if (type < 2) {  // Raw or RLE literals: no compressed size
    const unsigned head = format == 1 ? 2 : format == 3 ? 3 : 1;
    if (n < head) return 0;
    const uint64_t v = le(b, head);
    *regen = head == 1 ? v >> 3 : v >> 4;
    if (*regen > block_max) return 0;
    const uint64_t body = type == 0 ? *regen : 1;
    if (body > n - head) return 0;
    return static_cast<std::size_t>(head + body);
  }
  // Compressed (2, with a Huffman tree) or Treeless (3, the previous tree): 1 or 4 Huffman streams
  const bool four = format != 0;
  const unsigned head = format < 2 ? 3 : format == 2 ? 4 : 5, bits = format < 2 ? 10 : format == 2 ? 14 : 18;
  if (n < head) return 0;
  const uint64_t v = le(b, head), mask = (uint64_t{1} << bits) - 1;
  *regen = (v >> 4) & mask;
  const uint64_t size = (v >> (4 + bits)) & mask;
  if (*regen > block_max || size > n - head) return 0;
  const uint8_t* p = b + head;
  std::size_t left = static_cast<std::size_t>(size);
  if (type == 2) {  // Huffman tree description: FSE-compressed weights (header < 128) or 4-bit weights
    if (left < 1 || p[0] == 0) return 0;
    const std::size_t tree = 1 + (p[0] < 128 ? p[0] : (p[0] - 127 + 1) / 2);
    if (tree > left) return 0;
    p += tree;
    left -= tree;
    t.huffman = true;
  } else if (!t.huffman) {
    return 0;  // Treeless with no earlier tree in this frame
  }
  if (!four) {
    if (!bitstream_ok(p, left)) return 0;
  } else {
    if (left < 6) return 0;  // the jump table: sizes of streams 1-3
    const std::size_t s1 = le(p, 2), s2 = le(p + 2, 2), s3 = le(p + 4, 2);
    p += 6;
    left -= 6;
    if (s1 + s2 + s3 >= left) return 0;  // stream 4 needs a byte too
    const std::size_t s4 = left - s1 - s2 - s3;
    if (!bitstream_ok(p, s1) || !bitstream_ok(p + s1, s2) || !bitstream_ok(p + s1 + s2, s3) ||
        !bitstream_ok(p + s1 + s2 + s3, s4)) {
      return 0;
    }
  }
  return static_cast<std::size_t>(head + size);
}

// The sequences section b[0, n) (the rest of the block): false when malformed; *count gets its sequences.
bool sequences_section(const uint8_t* b, std::size_t n, Tables& t, uint64_t* count) {
  if (n < 1) return false;
  std::size_t at;
  if (b[0] < 128) {
    *count = b[0];
    at = 1;
  } else if (b[0] < 255) {
    if (n < 2) return false;
    *count = (static_cast<uint64_t>(b[0] - 128) << 8) + b[1];
    at = 2;
  } else {
    if (n < 3) return false;
    *count = le(b + 1, 2) + 0x7F00;
    at = 3;
  }
  if (*count == 0) return at == n;  // no sequences: the section (and the block) ends here
  if (at >= n) return false;
  const uint8_t modes = b[at++];
  if (modes & 3) return false;  // reserved bits
  bool fse = false;
  for (const unsigned shift : {6u, 4u, 2u}) {
    const unsigned mode = (modes >> shift) & 3;
    if (mode == 1) {
      ++at;  // RLE: one symbol byte
    } else if (mode == 2) {
      fse = true;  // an FSE table description: its length is known only by decoding it
    } else if (mode == 3 && !t.sequences) {
      return false;  // Repeat with nothing to repeat
    }
  }
  t.sequences = true;
  if (at > n) return false;
  if (!fse && at == n) return false;  // no bitstream left
  return bitstream_ok(b + at, n - at);  // the bitstream ends at the block's end
}

}  // namespace

int32_t zstd_frame_check(const uint8_t* src, std::size_t size, uint64_t claim) {
  if (size < 4) return kZstdTruncated;
  const uint32_t magic = static_cast<uint32_t>(le(src, 4));
  if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) return kZstdSkippable;
  if (magic != kMagic) return kZstdBadMagic;
  if (size < 5) return kZstdTruncated;
  const uint8_t fhd = src[4];
  const unsigned fcs_flag = fhd >> 6, did_flag = fhd & 3;
  const bool single = fhd & 0x20, checksum = fhd & 0x04;
  if (fhd & 0x08) return kZstdReservedBit;
  if (did_flag != 0) return kZstdDictionary;  // even an id of 0: Arrow writers never write the field
  const unsigned fcs_bytes = fcs_flag == 0 ? (single ? 1 : 0) : fcs_flag == 1 ? 2 : fcs_flag == 2 ? 4 : 8;
  std::size_t at = 5;
  uint64_t window = 0;
  if (!single) {
    if (size - at < 1) return kZstdTruncated;
    const unsigned exponent = src[at] >> 3, mantissa = src[at] & 7;
    ++at;
    const unsigned log = 10 + exponent;
    if (log > kWindowLogMax) return kZstdWindow;
    window = (uint64_t{1} << log) + ((uint64_t{1} << log) / 8) * mantissa;
  }
  const bool has_fcs = fcs_bytes > 0;
  uint64_t fcs = 0;
  if (has_fcs) {
    if (size - at < fcs_bytes) return kZstdTruncated;
    fcs = le(src + at, fcs_bytes) + (fcs_bytes == 2 ? 256 : 0);
    at += fcs_bytes;
    if (fcs != claim) return kZstdContentSize;
  }
  if (single) window = fcs;
  const uint64_t block_max = window < kBlockMax ? window : kBlockMax;

  Tables tables;
  uint64_t low = 0, high = 0;  // what the blocks must, and may at most, produce
  while (true) {
    if (size - at < 3) return kZstdTruncated;
    const uint32_t header = static_cast<uint32_t>(le(src + at, 3));
    at += 3;
    const bool last = header & 1;
    const unsigned type = (header >> 1) & 3;
    const uint64_t block = header >> 3;
    if (type == 3) return kZstdReservedBlock;
    if (block > block_max) return kZstdBlockSize;
    const uint64_t body = type == 1 ? 1 : block;  // RLE: one byte repeated block times
    if (body > size - at) return kZstdTruncated;
    if (type == 2) {
      const uint8_t* b = src + at;
      const std::size_t n = static_cast<std::size_t>(block);
      uint64_t literals = 0, count = 0;
      const std::size_t lit = literals_section(b, n, block_max, tables, &literals);
      if (lit == 0) return kZstdLiterals;
      if (!sequences_section(b + lit, n - lit, tables, &count)) return kZstdSequences;
      if (count > (block_max - literals) / 3) return kZstdSequences;  // each sequence copies >= 3 bytes
      low += literals + 3 * count;
      high += block_max;
    } else {
      low += block;
      high += block;
    }
    at += static_cast<std::size_t>(body);
    if (last) break;
  }
  if (checksum) {
    if (size - at < 4) return kZstdTruncated;
    at += 4;
  }
  if (at != size) return kZstdTrailing;
  if (claim < low || claim > high) return kZstdUnreachable;
  return kZstdOk;
}

bool zstd_frames_check(const uint8_t* src, std::size_t src_size, const int64_t* offsets, const int64_t* sizes,
                       const int64_t* claims, std::size_t n, int32_t* out) {
  for (std::size_t i = 0; i < n; ++i) {
    if (offsets[i] < 0 || sizes[i] < 0 || claims[i] < 0 || static_cast<uint64_t>(offsets[i]) > src_size ||
        static_cast<uint64_t>(sizes[i]) > src_size - static_cast<uint64_t>(offsets[i])) {
      return false;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = zstd_frame_check(src + offsets[i], static_cast<std::size_t>(sizes[i]), static_cast<uint64_t>(claims[i]));
  }
  return true;
}

}  // namespace pystrom
