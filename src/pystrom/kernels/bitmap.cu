// LSB-order bitmaps: Arrow validity bitmaps and Arrow's bit-packed booleans.
// CPU twins: csrc/bits.cpp (unpack_bits) and numpy.packbits(bitorder="little") (pack_bits).

// dst[i] = bit (src_offset + i) of src, as a byte 0/1, for i < count.
extern "C" __global__ void unpack_bits(const unsigned char* __restrict__ src, long long src_offset,
                                       long long count, unsigned char* __restrict__ dst) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    const long long bit = src_offset + i;
    dst[i] = (src[bit >> 3] >> (bit & 7)) & 1;
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
