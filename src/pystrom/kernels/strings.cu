// Row gathers for string/binary columns (int32 offsets + bytes), and the offsets of many record batches
// placed at once. CPU twin: csrc/gather.cpp.

// One thread per gathered row copies that row's bytes. dst_offsets holds the prefix sums of the
// gathered lengths (computed beforehand), so rows write disjoint ranges. Every range is clamped to
// its buffer (src_size, dst_size bytes) and to the row's slot in dst: offsets another process
// rewrote after they were counted give wrong bytes in that row, never a read or write outside.
__device__ __forceinline__ long long clamped(long long v, long long lo, long long hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

extern "C" __global__ void gather_varbinary(const int* __restrict__ src_offsets,
                                            const unsigned char* __restrict__ src_data, long long src_size,
                                            const long long* __restrict__ rows, long long count,
                                            const int* __restrict__ dst_offsets,
                                            unsigned char* __restrict__ dst_data, long long dst_size) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    const long long row = rows[i];
    const long long start = clamped(src_offsets[row], 0, src_size);
    const long long end = clamped(src_offsets[row + 1], start, src_size);
    const long long dst = clamped(dst_offsets[i], 0, dst_size);
    const long long slot = clamped(dst_offsets[i + 1], dst, dst_size) - dst;
    const long long len = end - start < slot ? end - start : slot;
    for (long long k = 0; k < len; ++k) dst_data[dst + k] = src_data[start + k];
  }
}

// Offsets of many batches rebased in one launch (one launch, not one a batch). spans is a (4, n) int64
// table, rows at, count, shift, start: dst[start[s] + j] = src[at[s] + j] - shift[s] for j < count[s]. A
// batch's last entry and the next batch's first land on the same place with the same value. A block a
// span, grid-stride over the spans.
extern "C" __global__ void shift_spans(const int* __restrict__ src, const long long* __restrict__ spans, long long n,
                                       int* __restrict__ dst) {
  for (long long s = blockIdx.x; s < n; s += gridDim.x) {
    const long long at = spans[s], count = spans[n + s], shift = spans[2 * n + s], start = spans[3 * n + s];
    for (long long j = threadIdx.x; j < count; j += blockDim.x) dst[start + j] = (int)((long long)src[at + j] - shift);
  }
}
