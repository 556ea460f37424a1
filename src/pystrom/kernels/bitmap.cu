// LSB-order bitmaps: Arrow validity bitmaps and Arrow's bit-packed booleans.
// CPU twins: csrc/bits.cpp (unpack_bits, unpack_bit_spans) and numpy.packbits(bitorder="little") (pack_bits).

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
