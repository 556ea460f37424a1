// An LZ4 frame decoded into memory of the caller's (lz4_frame_decode), or only the size it decompresses
// to (lz4_frame_size): one walk of its blocks and sequences serves both, so they refuse the same frames.
// Pure C++; binding in module.cpp. The CPU inflate (io/arrow/codecs/host.py) decodes with it, and with
// the size names what a frame that produces more than its buffer's claim really produces.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom {

// Bytes the single LZ4 frame in src[0, size) decompresses to, or -1 when it is not exactly one
// well-formed frame (bad magic or header, a block running past the end, a block's output above its
// maximum, a sequence running past its block, a zero match offset or one reaching before the frame's
// first byte, a declared content size it does not produce, bytes after the frame, a dictionary id or a
// skippable frame, which Arrow writers never produce). Nothing is written. Reads only inside src.
int64_t lz4_frame_size(const uint8_t* src, std::size_t size);

// The single LZ4 frame in src[0, size) decompressed into dst[0, cap): the bytes produced, -1 when it is
// malformed as for lz4_frame_size, -2 when it would produce more than cap (nothing is written past
// dst + cap). Reads only inside src. The CPU twin of kernels/lz4.cu, and the CPU path's
// decoder: one pass straight into the table's memory, where pyarrow's codec decompresses into memory
// of its own that must then be copied, after this file's walk found the real size.
int64_t lz4_frame_decode(const uint8_t* src, std::size_t size, uint8_t* dst, std::size_t cap);

// Frames i < n (src[offsets[i], + sizes[i]), inside src: the binding checks) each decoded as
// lz4_frame_decode does into caps[i] bytes at the address dst[i] (memory the caller owns: the CPU inflate
// checked it), which=nullptr, or frames which[0..n) of those arrays. produced[i]: the bytes frame i produces
// (its lz4_frame_size where it produces more than its cap, or where the cap is 0), -1 where it is malformed.
// One call for many frames: a call a frame from Python cost more than decoding a small frame.
void lz4_frames_decode(const uint8_t* src, const int64_t* offsets, const int64_t* sizes, const int64_t* dst,
                       const int64_t* caps, const int64_t* which, std::size_t n, int64_t* produced);

}  // namespace pystrom
