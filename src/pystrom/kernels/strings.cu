// Row gathers for string/binary columns (int32 offsets + bytes). CPU twin: csrc/gather.cpp.

// One thread per gathered row copies that row's bytes. dst_offsets holds the prefix sums of the
// gathered lengths (computed beforehand), so rows write disjoint ranges.
extern "C" __global__ void gather_varbinary(const int* __restrict__ src_offsets,
                                            const unsigned char* __restrict__ src_data,
                                            const long long* __restrict__ rows, long long count,
                                            const int* __restrict__ dst_offsets,
                                            unsigned char* __restrict__ dst_data) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    const long long row = rows[i];
    const int start = src_offsets[row];
    const int len = src_offsets[row + 1] - start;
    const int dst = dst_offsets[i];
    for (int k = 0; k < len; ++k) dst_data[dst + k] = src_data[start + k];
  }
}
