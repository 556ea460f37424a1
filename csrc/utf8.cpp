#include "utf8.hpp"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PYSTROM_UTF8_SSSE3 1
#include <immintrin.h>
#endif

namespace pystrom {

namespace {

inline bool continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

#ifdef PYSTROM_UTF8_SSSE3
// Sixteen (SSSE3) or 32 (AVX2) bytes at a time with three 16-entry lookups (Keiser and Lemire, "Validating UTF-8 in less than
// one instruction per byte", 2021): each byte and the one before it, by their nibbles, name the faults
// the pair can show (one bit each); a pair is at fault where all three lookups share a bit. A continuation
// after a continuation is a fault unless a lead two or three bytes back asks for it.
namespace simd {

constexpr uint8_t kTooShort = 1 << 0;    // a lead, then no continuation
constexpr uint8_t kTooLong = 1 << 1;     // ASCII, then a continuation
constexpr uint8_t kOverlong3 = 1 << 2;   // E0 80-9F
constexpr uint8_t kTooLarge = 1 << 3;    // F4 90-BF, F5-FF ...
constexpr uint8_t kSurrogate = 1 << 4;   // ED A0-BF
constexpr uint8_t kOverlong2 = 1 << 5;   // C0, C1 then a continuation
constexpr uint8_t kTooLarge1000 = 1 << 6;  // F5-FF 80-8F
constexpr uint8_t kOverlong4 = 1 << 6;   // F0 80-8F
constexpr uint8_t kTwoConts = 1 << 7;    // a continuation, then another
constexpr uint8_t kCarry = kTooShort | kTooLong | kTwoConts;

__attribute__((target("ssse3"))) inline __m128i lookup(__m128i nibbles, const uint8_t* table) {
  return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)), nibbles);
}

alignas(16) constexpr uint8_t kFirstHigh[16] = {
    kTooLong, kTooLong, kTooLong, kTooLong, kTooLong, kTooLong, kTooLong, kTooLong,  // 0_______
    kTwoConts, kTwoConts, kTwoConts, kTwoConts,                                      // 10______
    kTooShort | kOverlong2,                                                          // 1100____
    kTooShort,                                                                       // 1101____
    kTooShort | kOverlong3 | kSurrogate,                                             // 1110____
    kTooShort | kTooLarge | kTooLarge1000 | kOverlong4};                             // 1111____
alignas(16) constexpr uint8_t kFirstLow[16] = {
    kCarry | kOverlong3 | kOverlong2 | kOverlong4,  // ____0000
    kCarry | kOverlong2,                            // ____0001
    kCarry, kCarry,
    kCarry | kTooLarge,  // ____0100
    kCarry | kTooLarge | kTooLarge1000, kCarry | kTooLarge | kTooLarge1000, kCarry | kTooLarge | kTooLarge1000,
    kCarry | kTooLarge | kTooLarge1000, kCarry | kTooLarge | kTooLarge1000, kCarry | kTooLarge | kTooLarge1000,
    kCarry | kTooLarge | kTooLarge1000, kCarry | kTooLarge | kTooLarge1000,
    kCarry | kTooLarge | kTooLarge1000 | kSurrogate,  // ____1101
    kCarry | kTooLarge | kTooLarge1000, kCarry | kTooLarge | kTooLarge1000};
alignas(16) constexpr uint8_t kSecondHigh[16] = {
    kTooShort, kTooShort, kTooShort, kTooShort, kTooShort, kTooShort, kTooShort, kTooShort,  // 0_______
    kTooLong | kOverlong2 | kTwoConts | kOverlong3 | kTooLarge1000 | kOverlong4,              // 1000____
    kTooLong | kOverlong2 | kTwoConts | kOverlong3 | kTooLarge,                               // 1001____
    kTooLong | kOverlong2 | kTwoConts | kSurrogate | kTooLarge,                               // 1010____
    kTooLong | kOverlong2 | kTwoConts | kSurrogate | kTooLarge,                               // 1011____
    kTooShort, kTooShort, kTooShort, kTooShort};                                              // 11______

// the fault bits of every byte of `input` (`previous`: the 16 bytes before it)
__attribute__((target("ssse3"))) inline __m128i faults(__m128i input, __m128i previous) {
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i prev1 = _mm_alignr_epi8(input, previous, 15);
  const __m128i a = lookup(_mm_and_si128(_mm_srli_epi16(prev1, 4), low4), kFirstHigh);
  const __m128i b = lookup(_mm_and_si128(prev1, low4), kFirstLow);
  const __m128i c = lookup(_mm_and_si128(_mm_srli_epi16(input, 4), low4), kSecondHigh);
  const __m128i special = _mm_and_si128(_mm_and_si128(a, b), c);
  // the third byte of a 3- or 4-byte sequence, the fourth of a 4-byte one: there a second continuation is due
  const __m128i prev2 = _mm_alignr_epi8(input, previous, 14), prev3 = _mm_alignr_epi8(input, previous, 13);
  const __m128i due = _mm_or_si128(_mm_subs_epu8(prev2, _mm_set1_epi8(static_cast<char>(0xE0 - 0x80))),
                                   _mm_subs_epu8(prev3, _mm_set1_epi8(static_cast<char>(0xF0 - 0x80))));
  return _mm_xor_si128(_mm_and_si128(due, _mm_set1_epi8(static_cast<char>(0x80))), special);
}

// The same 32 bytes at a time (AVX2): a lane's bytes before it come from the other lane or `previous`.
__attribute__((target("avx2"))) inline __m256i lookup32(__m256i nibbles, const uint8_t* table) {
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table))),
                             nibbles);
}

__attribute__((target("avx2"))) inline __m256i faults32(__m256i input, __m256i previous) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i before = _mm256_permute2x128_si256(previous, input, 0x21);  // previous's high lane, input's low
  const __m256i prev1 = _mm256_alignr_epi8(input, before, 15);
  const __m256i a = lookup32(_mm256_and_si256(_mm256_srli_epi16(prev1, 4), low4), kFirstHigh);
  const __m256i b = lookup32(_mm256_and_si256(prev1, low4), kFirstLow);
  const __m256i c = lookup32(_mm256_and_si256(_mm256_srli_epi16(input, 4), low4), kSecondHigh);
  const __m256i special = _mm256_and_si256(_mm256_and_si256(a, b), c);
  const __m256i prev2 = _mm256_alignr_epi8(input, before, 14), prev3 = _mm256_alignr_epi8(input, before, 13);
  const __m256i due = _mm256_or_si256(_mm256_subs_epu8(prev2, _mm256_set1_epi8(static_cast<char>(0xE0 - 0x80))),
                                      _mm256_subs_epu8(prev3, _mm256_set1_epi8(static_cast<char>(0xF0 - 0x80))));
  return _mm256_xor_si256(_mm256_and_si256(due, _mm256_set1_epi8(static_cast<char>(0x80))), special);
}

__attribute__((target("avx2"))) bool valid32(const uint8_t* p, const uint8_t* end, bool* ascii) {
  __m256i previous = _mm256_setzero_si256(), error = _mm256_setzero_si256(), high = _mm256_setzero_si256();
  for (; end - p >= 32; p += 32) {
    const __m256i input = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if (_mm256_movemask_epi8(_mm256_or_si256(input, previous)) == 0) {  // ASCII here and in the bytes before
      previous = input;
      continue;
    }
    error = _mm256_or_si256(error, faults32(input, previous));
    high = _mm256_or_si256(high, input);
    previous = input;
  }
  alignas(32) uint8_t tail[32] = {};  // the rest, then zeros: a sequence cut by the end meets ASCII
  std::memcpy(tail, p, static_cast<std::size_t>(end - p));
  const __m256i last = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
  error = _mm256_or_si256(error, faults32(last, previous));
  error = _mm256_or_si256(error, faults32(_mm256_setzero_si256(), last));
  *ascii = _mm256_movemask_epi8(_mm256_or_si256(high, last)) == 0;
  return _mm256_testz_si256(error, error);
}

__attribute__((target("ssse3"))) bool valid(const uint8_t* p, const uint8_t* end, bool* ascii) {
  __m128i previous = _mm_setzero_si128(), error = _mm_setzero_si128(), high = _mm_setzero_si128();
  for (; end - p >= 16; p += 16) {
    const __m128i input = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (_mm_movemask_epi8(_mm_or_si128(input, previous)) == 0) {  // ASCII here and in the bytes before
      previous = input;
      continue;
    }
    error = _mm_or_si128(error, faults(input, previous));
    high = _mm_or_si128(high, input);
    previous = input;
  }
  alignas(16) uint8_t tail[16] = {};  // the rest, then zeros: a sequence cut by the end meets ASCII
  std::memcpy(tail, p, static_cast<std::size_t>(end - p));
  const __m128i last = _mm_load_si128(reinterpret_cast<const __m128i*>(tail));
  error = _mm_or_si128(error, faults(last, previous));
  error = _mm_or_si128(error, faults(_mm_setzero_si128(), last));
  *ascii = _mm_movemask_epi8(_mm_or_si128(high, last)) == 0;
  return _mm_movemask_epi8(_mm_cmpeq_epi8(error, _mm_setzero_si128())) == 0xFFFF;
}

}  // namespace simd
#endif

bool utf8_valid_scalar(const uint8_t* p, const uint8_t* end);

int utf8_best_level() {
#ifdef PYSTROM_UTF8_SSSE3
  static const int level = __builtin_cpu_supports("avx2") ? 2 : __builtin_cpu_supports("ssse3") ? 1 : 0;
  return level;
#else
  return 0;
#endif
}

namespace {

// Whether [p, end) is valid; `ascii` set where no byte is above 0x7F (false where not known)
bool valid_with(const uint8_t* p, const uint8_t* end, int level, bool* ascii) {
#ifdef PYSTROM_UTF8_SSSE3
  if (level >= 2) return simd::valid32(p, end, ascii);
  if (level == 1) return simd::valid(p, end, ascii);
#endif
  *ascii = false;
  return utf8_valid_scalar(p, end);
}

}  // namespace

bool utf8_valid_with(const uint8_t* p, const uint8_t* end, int level) {
  bool ascii;
  return valid_with(p, end, level, &ascii);
}

bool utf8_valid(const uint8_t* p, const uint8_t* end) { return utf8_valid_with(p, end, utf8_best_level()); }

bool utf8_valid_scalar(const uint8_t* p, const uint8_t* end) {
  constexpr uint64_t kHigh = 0x8080808080808080ULL;
  while (p < end) {
    if (end - p >= 16) {
      uint64_t a, b;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + 8, 8);
      if (((a | b) & kHigh) == 0) {
        p += 16;
        continue;
      }
    }
    const uint8_t c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int len;
    uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range (Table 3-7)
    if (c < 0xC2) {
      return false;  // a continuation byte where a character starts, or an overlong C0/C1 lead
    } else if (c < 0xE0) {
      len = 2;
    } else if (c < 0xF0) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c < 0xF5) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (end - p < len || p[1] < lo || p[1] > hi) return false;
    for (int k = 2; k < len; ++k) {
      if (!continuation(p[k])) return false;
    }
    p += len;
  }
  return true;
}

int64_t utf8_first_bad_row(const uint8_t* data, const int32_t* offsets, int64_t n, const uint8_t* validity,
                           int64_t bit_offset) {
  if (n <= 0) return -1;
  const int64_t begin = offsets[0], end = offsets[n];
  bool ascii;
  if (valid_with(data + begin, data + end, utf8_best_level(), &ascii)) {
    if (ascii) return -1;  // no continuation byte anywhere: no string can start inside a character
    // the concatenation is valid: a row is invalid only where a string starts inside a character (the
    // byte each start names, prefetched a few rows ahead: long strings put each in a cache line of its own)
    bool cut = false;
    for (int64_t i = 1; i < n; ++i) {
      if (i + 16 < n) __builtin_prefetch(data + offsets[i + 16]);
      cut |= offsets[i] < end && continuation(data[offsets[i]]);
    }
    if (!cut) return -1;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (validity != nullptr) {
      const uint64_t bit = static_cast<uint64_t>(bit_offset + i);
      if (!((validity[bit >> 3] >> (bit & 7)) & 1)) continue;  // NULL: its bytes are not a value
    }
    if (!utf8_valid(data + offsets[i], data + offsets[i + 1])) return i;
  }
  return -1;
}

}  // namespace pystrom
