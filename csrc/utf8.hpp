// UTF-8 validation of string columns read from Arrow files (the format requires every value of a
// string column to be UTF-8; io/arrow/read/utf8.py). Pure C++; bindings in module.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pystrom {

// Whether bytes [p, end) are well-formed UTF-8 (Unicode's Table 3-7: no overlong forms, no surrogates,
// nothing above U+10FFFF): sixteen bytes at a time by table lookups where the CPU has SSSE3 (x86-64),
// else byte by byte (utf8_valid_scalar, which also defines the rule: the tests hold the two equal).
bool utf8_valid(const uint8_t* p, const uint8_t* end);
bool utf8_valid_scalar(const uint8_t* p, const uint8_t* end);
// The paths by level (0: byte by byte, 1: SSSE3, 2: AVX2; the tests run each the CPU has against level 0)
// and the best this CPU runs.
int utf8_best_level();
bool utf8_valid_with(const uint8_t* p, const uint8_t* end, int level);

// The first row i < n that is not NULL (validity: a bitmap from bit bit_offset, or nullptr: no NULLs)
// and whose bytes data[offsets[i], offsets[i + 1]) are not well-formed UTF-8; -1 if there is none.
// The whole span offsets[0]..offsets[n] is checked first, the string starts walked in step with its
// blocks (where it is valid and no string starts inside a character, every row is: the common case is
// one pass over the bytes and the offsets); only otherwise row by row. Callers guarantee the offsets
// ascend inside data (the binding checks).
int64_t utf8_first_bad_row(const uint8_t* data, const int32_t* offsets, int64_t n, const uint8_t* validity,
                           int64_t bit_offset);

}  // namespace pystrom
