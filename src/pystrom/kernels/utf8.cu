// UTF-8 validation of the string columns of a read (the Arrow format requires every string to be UTF-8).
// CPU twin: pystrom/io/arrow/read/utf8.py (first_bad_rows_twin, NumPy, the same rule position by position);
// tests/test_arrow_kernels_emulated.py compares them under tests/simt.py, and checks that a loosened rule
// here fails that comparison.
//
// One launch for every string column of a read: blockIdx.y walks the columns, blockIdx.x/threadIdx.x the
// bytes and then the string starts of one. Column c is columns[3 c .. 3 c + 2] = (address of its data,
// address of its n + 1 int32 offsets, n): the table's own, rebased (offsets[0] = 0), ascending inside
// the data (checked before the data was read). Every byte is judged on its own, so the whole launch
// streams the data once (memory speed), reading at most three bytes on either side of each:
//   - a byte that starts a sequence (Unicode's Table 3-7) needs its continuation bytes in range: no
//     overlong form (C0, C1, E0 80-9F, F0 80-8F), no surrogate (ED A0-BF), nothing above U+10FFFF
//     (F4 90-BF, F5-FF);
//   - a continuation byte needs the nearest byte before it that is not one to start a sequence that
//     reaches it (at most three bytes back);
//   - a string start offsets[i] (0 < i < n) inside a character (a continuation byte that a lead before it
//     covers: the bytes are fine as a whole, the row before is cut) makes the row holding byte
//     offsets[i] - 1 invalid.
// out[c] = the lowest row of column c holding a bad byte or cut so (atomicMin; ULLONG_MAX on entry and
// when every row is valid). NULL rows are not told apart (their bytes may be anything): the caller
// re-checks a column whose reported row is NULL on the host, skipping NULLs, as pyarrow's validation does.

__device__ __forceinline__ bool utf8_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// bytes in the sequence a byte starts (1 to 4); 0 for a byte that starts none (a continuation, C0, C1, F5-FF)
__device__ __forceinline__ int utf8_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF5) return 4;
  return 0;
}

// whether the continuation byte at p is covered by a sequence started within three bytes before it
__device__ __forceinline__ bool utf8_covered(const unsigned char* d, long long p) {
  for (int j = 1; j <= 3; ++j) {
    if (p - j < 0) return false;
    const unsigned char q = d[p - j];
    if (!utf8_continuation(q)) return utf8_length(q) > j;
  }
  return false;  // four continuation bytes in a row
}

__device__ __forceinline__ bool utf8_bad_byte(const unsigned char* d, long long size, long long p) {
  const unsigned char b = d[p];
  if (b < 0x80) return false;
  if (utf8_continuation(b)) return !utf8_covered(d, p);
  const int len = utf8_length(b);
  if (len == 0 || p + len > size) return true;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b == 0xE0) lo = 0xA0;
  if (b == 0xED) hi = 0x9F;
  if (b == 0xF0) lo = 0x90;
  if (b == 0xF4) hi = 0x8F;
  const unsigned char b1 = d[p + 1];
  if (b1 < lo || b1 > hi) return true;
  for (int k = 2; k < len; ++k) {
    if (!utf8_continuation(d[p + k])) return true;
  }
  return false;
}

// the row holding byte p: the last i with offsets[i] <= p (offsets[n] > p)
__device__ __forceinline__ long long utf8_row_of(const int* o, long long n, long long p) {
  long long lo = 0, hi = n;  // o[lo] <= p < o[hi]
  while (hi - lo > 1) {
    const long long mid = lo + (hi - lo) / 2;
    if ((long long)o[mid] <= p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

extern "C" __global__ void utf8_check(const long long* __restrict__ columns, long long num_columns,
                                      unsigned long long* __restrict__ out) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (long long c = blockIdx.y; c < num_columns; c += gridDim.y) {
    const unsigned char* d = (const unsigned char*)columns[3 * c];
    const int* o = (const int*)columns[3 * c + 1];
    const long long n = columns[3 * c + 2];
    if (n <= 0) continue;
    const long long size = o[n];
    unsigned long long worst = ~0ULL;  // this thread's lowest bad row
    // eight bytes a thread at a time where the data is 8-byte aligned (a warp reads 256 contiguous
    // bytes); a word of ASCII needs nothing more, the others are judged byte by byte
    const long long words = ((unsigned long long)d & 7) == 0 ? size / 8 : 0;
    for (long long w = first; w < words; w += stride) {
      const unsigned long long v = ((const unsigned long long*)d)[w];
      if ((v & 0x8080808080808080ULL) == 0) continue;
      for (long long p = 8 * w; p < 8 * w + 8; ++p) {
        if (utf8_bad_byte(d, size, p)) {
          const unsigned long long row = (unsigned long long)utf8_row_of(o, n, p);
          worst = row < worst ? row : worst;
        }
      }
    }
    for (long long p = 8 * words + first; p < size; p += stride) {
      if (utf8_bad_byte(d, size, p)) {
        const unsigned long long row = (unsigned long long)utf8_row_of(o, n, p);
        worst = row < worst ? row : worst;
      }
    }
    for (long long i = 1 + first; i < n; i += stride) {
      const long long s = o[i];
      if (s > 0 && s < size && utf8_continuation(d[s]) && utf8_covered(d, s)) {
        const unsigned long long row = (unsigned long long)utf8_row_of(o, n, s - 1);
        worst = row < worst ? row : worst;
      }
    }
    if (worst != ~0ULL) atomicMin(out + c, worst);
  }
}
