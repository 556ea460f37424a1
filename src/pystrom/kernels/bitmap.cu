// LSB-order bitmaps: Arrow validity bitmaps and Arrow's bit-packed booleans; and counting the true bytes of a
// bool mask.
// CPU twins: csrc/bits.cpp (unpack_bits, unpack_bit_spans, count_bits), numpy.packbits(bitorder="little")
// (pack_bits) and numpy.count_nonzero (count_nonzero_bytes).

// dst[i] = bit (src_offset + i) of src, as a byte 0/1, for i < count.
extern "C" __global__ void unpack_bits(const unsigned char* __restrict__ src, long long src_offset,
                                       long long count, unsigned char* __restrict__ dst) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    const long long bit = src_offset + i;
    dst[i] = (src[bit >> 3] >> (bit & 7)) & 1;
  }
}

// Many unpack_bits in one launch (a bitmap a record batch: one launch, not one a batch). spans is a (4, n)
// int64 table, rows at, bit, count, start: dst[start[s] + i] = bit (bit[s] + i) of src + at[s] as a byte
// 0/1 for i < count[s], the byte `missing` where at[s] < 0. A block a span, grid-stride over the spans.
extern "C" __global__ void unpack_bit_spans(const unsigned char* __restrict__ src, const long long* __restrict__ spans,
                                            long long n, int missing, unsigned char* __restrict__ dst) {
  for (long long s = blockIdx.x; s < n; s += gridDim.x) {
    const long long at = spans[s], bit = spans[n + s], count = spans[2 * n + s], start = spans[3 * n + s];
    for (long long i = threadIdx.x; i < count; i += blockDim.x) {
      const long long b = bit + i;
      dst[start + i] = at < 0 ? (unsigned char)missing : (unsigned char)((src[at + (b >> 3)] >> (b & 7)) & 1);
    }
  }
}

// Pack `count` bytes (nonzero means 1) into bits, the first landing on bit `dst_shift` (0..7) of dst[0].
// One thread writes one whole output byte, so there are no write races; bits outside the range are 0.
extern "C" __global__ void pack_bits(const unsigned char* __restrict__ src, long long count, int dst_shift,
                                     unsigned char* __restrict__ dst, long long dst_bytes) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < dst_bytes; j += stride) {
    unsigned int byte = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const long long i = j * 8 + k - dst_shift;
      if (i >= 0 && i < count && src[i] != 0) byte |= 1u << k;
    }
    dst[j] = (unsigned char)byte;
  }
}

// The counts below are summed over a warp by shuffles and added to *out by one lane: every thread of a
// block reaches the sum (no early return).
__device__ __forceinline__ void add_warp_count(unsigned long long c, unsigned long long* __restrict__ out) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(out, c);
}

// The set bits among bits [bit_offset, bit_offset + count) of src, added to *out (0 before the launch): a
// bitmap's valid rows without unpacking it to bytes (memory/bitmap.py count_set).
extern "C" __global__ void count_bits(const unsigned char* __restrict__ src, long long bit_offset, long long count,
                                      unsigned long long* __restrict__ out) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  const long long first = bit_offset >> 3, last = (bit_offset + count - 1) >> 3;  // the bytes touched
  unsigned long long c = 0;
  for (long long b = first + (long long)blockIdx.x * blockDim.x + threadIdx.x; count > 0 && b <= last; b += stride) {
    unsigned v = src[b];
    if (b == first) v &= 0xFFu << (bit_offset & 7);
    if (b == last) v &= 0xFFu >> (7 - ((bit_offset + count - 1) & 7));
    c += __popc(v);
  }
  add_warp_count(c, out);
}

// The zero bytes of w: a byte's high bit of t is set where the byte is 0.
__device__ __forceinline__ unsigned zero_bytes(unsigned w) {
  const unsigned t = ~(((w & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) | w | 0x7F7F7F7Fu);
  return __popc(t);
}

// The bytes of src[0, n) that are not 0, added to *out (0 before the launch): the true rows of a bool mask
// (memory/bitmap.py count_true). The body is read 16 bytes a thread, the unaligned head and the tail a byte.
// Instead of CuPy's count_nonzero, whose CUB kernels NVRTC compiles in ~5 s on a machine's first call.
extern "C" __global__ void count_nonzero_bytes(const unsigned char* __restrict__ src, long long n,
                                               unsigned long long* __restrict__ out) {
  const long long stride = (long long)blockDim.x * gridDim.x, tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long misaligned = (long long)((16 - ((unsigned long long)src & 15)) & 15);
  const long long head = n < misaligned ? n : misaligned, words = (n - head) >> 4;
  unsigned long long c = 0;
  if (tid < head) c += src[tid] != 0;
  const uint4* __restrict__ body = reinterpret_cast<const uint4*>(src + head);
  for (long long i = tid; i < words; i += stride) {
    const uint4 v = body[i];
    c += 16 - zero_bytes(v.x) - zero_bytes(v.y) - zero_bytes(v.z) - zero_bytes(v.w);
  }
  for (long long i = head + (words << 4) + tid; i < n; i += stride) c += src[i] != 0;
  add_warp_count(c, out);
}
