// Positional scatter reads of many file pieces into memory (io/arrow/file/ranges.py's CPU reads, the length
// prefixes of compressed buffers in io/arrow/read/compressed_layouts.py): the pieces grouped into runs and each run
// read with preadv, in C++ and without the GIL. In Python (a memoryview, a list entry and a loop step a
// piece) a file of 2048 record batches x 8 columns spent ~40 ms on it.
// Pure C++; binding in module.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom {

// Pieces (offsets[i] >= 0, sizes[i] > 0, offsets[i] + sizes[i] inside int64: the binding checks) sorted
// by file offset, cut into runs: run r is pieces
// [run_first[r], run_first[r + 1]); run_first holds n + 1 entries at most, the last one n. A piece starts
// a run of its own where it begins before the previous piece's end, more than max_gap bytes after it, or
// where the run would then span more than max_bytes (a larger piece is a run of its own). Returns the
// number of runs.
std::size_t plan_runs(const int64_t* offsets, const int64_t* sizes, std::size_t n, int64_t max_gap,
                      int64_t max_bytes, int64_t* run_first);

// Runs [0, nruns) as plan_runs made them: the pieces of each read by preadv from offsets[first] on, piece i
// into the address ptrs[i] (the caller keeps that memory alive and sizes[i] bytes long there), the gaps
// between pieces into scratch memory. got[r]: the bytes run r read, gaps included (fewer than its span at
// the end of the file), or -errno. max_call > 0 caps the bytes one preadv call asks for (tests: the
// short reads a file system may return are resumed).
void pread_runs(int fd, const int64_t* offsets, const int64_t* sizes, const int64_t* ptrs, const int64_t* run_first,
                std::size_t nruns, int64_t max_call, int64_t* got);

}  // namespace pystrom
