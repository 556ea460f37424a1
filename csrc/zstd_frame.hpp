// Structural check of ZSTD frames (RFC 8878) against the size each is claimed to decompress to; nothing is
// decompressed. Pure C++; binding in module.cpp, reason messages in io/arrow/codecs/host.py.
//
// Why: nvCOMP's batched ZSTD decoder faults (cudaErrorIllegalAddress, which poisons the CUDA context) or
// hangs on a truncated or corrupt frame, so inflate_device.py hands it only frames that pass this walk;
// the CPU inflate runs the same walk so that a file is refused alike on either device.
//
// What is checked: one zstd frame exactly (magic, header descriptor, no dictionary, a sane window), every
// block header (type, size within the block maximum, inside the frame), the optional checksum, nothing
// after the frame; inside compressed blocks the literals and sequences section headers, the Huffman
// streams' sizes and the end-mark bytes of the bitstreams; and whether the blocks can produce the claim
// (exactly, where the frame states its content size). Entropy-coded contents are not decoded.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom {

// Reasons a frame is refused (0: none). The numbers are part of the binding: io/arrow/codecs/host.py names them.
enum ZstdCheck : int32_t {
  kZstdOk = 0,
  kZstdTruncated = 1,          // a header, block or checksum runs past the end of the bytes
  kZstdBadMagic = 2,           // not a zstd frame
  kZstdSkippable = 3,          // a skippable frame (Arrow writers write one zstd frame per buffer)
  kZstdReservedBit = 4,        // the header descriptor's reserved bit is set
  kZstdDictionary = 5,         // the frame names a dictionary
  kZstdWindow = 6,             // window size above 2^31 (zstd's own limit)
  kZstdContentSize = 7,        // the frame's content size differs from the claim
  kZstdReservedBlock = 8,      // block type 3
  kZstdBlockSize = 9,          // a block above min(window, 128 KiB)
  kZstdTrailing = 10,          // bytes after the frame's end
  kZstdUnreachable = 11,       // the blocks cannot produce the claimed size
  kZstdLiterals = 12,          // a malformed literals section
  kZstdSequences = 13,         // a malformed sequences section
};

// The check of the single frame src[0, size) claimed to decompress to `claim` bytes. Reads only inside src.
int32_t zstd_frame_check(const uint8_t* src, std::size_t size, uint64_t claim);

// zstd_frame_check of frames i < n: src[offsets[i], + sizes[i]) claimed to decompress to claims[i] bytes,
// results in out[i]. False (nothing checked) when a span is negative or lies outside src.
bool zstd_frames_check(const uint8_t* src, std::size_t src_size, const int64_t* offsets, const int64_t* sizes,
                       const int64_t* claims, std::size_t n, int32_t* out);

}  // namespace pystrom
