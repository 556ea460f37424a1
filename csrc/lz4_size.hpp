// The size an LZ4 frame decompresses to, found by walking its blocks and sequences (nothing is written),
// and the frame decoded into memory of the caller's (lz4_frame_decode).
// Pure C++; binding in module.cpp.
//
// Why: pyarrow's Codec("lz4").decompress(frame, decompressed_size=n) returns n bytes whenever the frame
// produces at most n, so a frame that produces fewer (a file lying about a buffer's length) would leave
// the rest of the output undefined. Arrow's IPC reader compares the produced size with the claim; the
// CPU inflate (io/arrow/inflate_host.py) does the same with this walk.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom {

// Bytes the single LZ4 frame in src[0, size) decompresses to, or -1 when it is not exactly one
// well-formed frame (bad magic or header, a block running past the end, a block's output above its
// maximum, a sequence running past its block, a zero match offset, bytes after the frame, a dictionary
// id or a skippable frame, which Arrow writers never produce). Reads only inside src.
int64_t lz4_frame_size(const uint8_t* src, std::size_t size);

// The single LZ4 frame in src[0, size) decompressed into dst[0, cap): the bytes produced, or -1 when it
// is malformed as for lz4_frame_size, or a match reaches before the frame's first output byte, or its
// declared content size differs from what it produces; -2 when it would produce more than cap (nothing
// is written past dst + cap). Reads only inside src. The CPU twin of kernels/lz4.cu, and the CPU path's
// decoder: one pass straight into the table's memory, where pyarrow's codec decompresses into memory
// of its own that must then be copied, after this file's walk found the real size.
int64_t lz4_frame_decode(const uint8_t* src, std::size_t size, uint8_t* dst, std::size_t cap);

}  // namespace pystrom
