// ZSTD frames decoded by libzstd: the system's copy, loaded at run time (dlopen; never linked, so the
// package builds without its headers). The CPU inflate (io/arrow/codecs/host.py) decodes with it, a
// pool task's frames in one call and one decompression context a thread, where libzstd loads; else with
// pyarrow's codec, which makes a context and takes a Python call a frame (~12 us: 16,384 frames of 4 KiB,
// a 2048-batch file, ~200 ms of decoding work where libzstd itself needs ~60).
// Pure C++; binding in module.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom {

// Loads libzstd (libzstd.so.1, else libzstd.so) once; its ZSTD_versionNumber(), 0 where none loads.
unsigned zstd_load();

// Frames which[0..n) of src[offsets[i], + sizes[i]) (inside src: the binding checks) each decoded into
// caps[i] bytes at the address dst[i] (memory the caller owns: the CPU inflate checked it). produced[i]:
// caps[i] where frame i decodes to exactly that many bytes, -1 where it is corrupt or decodes to more or
// fewer (what pyarrow's codec path reports). Requires zstd_load() != 0.
void zstd_frames_decode(const uint8_t* src, const int64_t* offsets, const int64_t* sizes, const int64_t* dst,
                        const int64_t* caps, const int64_t* which, std::size_t n, int64_t* produced);

}  // namespace pystrom
