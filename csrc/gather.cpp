#include "gather.hpp"

#include <cstring>

namespace pystrom {

bool gather_varbinary(const int32_t* src_offsets, std::size_t n, const uint8_t* src_data, std::size_t src_size,
                      const int64_t* rows, std::size_t count, const int32_t* dst_offsets, uint8_t* dst_data,
                      std::size_t dst_size) {
  for (std::size_t i = 0; i < count; ++i) {
    const int64_t row = rows[i];
    if (row < 0 || static_cast<uint64_t>(row) >= n) return false;
    const int64_t start = src_offsets[row];
    const int64_t len = static_cast<int64_t>(src_offsets[row + 1]) - start;
    const int64_t dst = dst_offsets[i];
    if (start < 0 || len < 0 || static_cast<uint64_t>(start + len) > src_size || dst < 0 ||
        static_cast<uint64_t>(dst + len) > dst_size) {
      return false;
    }
    std::memcpy(dst_data + dst, src_data + start, static_cast<std::size_t>(len));
  }
  return true;
}

int64_t copy_offsets_checked(const int32_t* src, std::size_t count, int32_t* dst, int64_t limit) {
  constexpr std::size_t kChunk = 4096;  // 16 KiB: copied, then checked while still in L1
  if (count == 0) return 0;
  for (std::size_t start = 0; start < count; start += kChunk) {
    const std::size_t m = count - start < kChunk ? count - start : kChunk;
    std::memcpy(dst + start, src + start, m * sizeof(int32_t));
    const int32_t* d = dst + start;
    unsigned bad = start == 0 ? d[0] < 0 : d[0] < dst[start - 1];
    for (std::size_t i = 1; i < m; ++i) bad |= static_cast<unsigned>(d[i] < d[i - 1]);  // no early exit: vectorises
    if (bad) {
      if (start == 0 && d[0] < 0) return 0;
      for (std::size_t i = start == 0 ? 1 : start; i < start + m; ++i) {
        if (dst[i] < dst[i - 1]) return static_cast<int64_t>(i - 1);
      }
    }
  }
  return dst[count - 1] > limit ? static_cast<int64_t>(count - 1) : -1;
}

void shift_spans(const int32_t* src, const int64_t* at, const int64_t* count, const int64_t* shift,
                 const int64_t* start, std::size_t n, int32_t* dst) {
  for (std::size_t s = 0; s < n; ++s) {
    const int32_t* in = src + at[s];
    int32_t* out = dst + start[s];
    for (int64_t j = 0; j < count[s]; ++j) out[j] = static_cast<int32_t>(static_cast<int64_t>(in[j]) - shift[s]);
  }
}

void copy_out(const uint8_t* src, const int64_t* offset, const int64_t* dst, const int64_t* size, std::size_t n) {
  for (std::size_t s = 0; s < n; ++s) {
    std::memcpy(reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(dst[s])), src + offset[s],
                static_cast<std::size_t>(size[s]));
  }
}

}  // namespace pystrom
