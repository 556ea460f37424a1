// Checks of string offsets read from an Arrow file, before anything follows them.
// CPU twin: pystrom/io/arrow/read/offsets.py (_check_host); tests/test_arrow_offsets.py compares the two.
//
// `offsets` holds segments back to back: one segment is one string column of one record batch, its
// n + 1 int32 offsets (n > 0). For segment s, out[3 s + 0] = its first offset, out[3 s + 1] = its
// last, out[3 s + 2] = 1 when an offset is below the one before it, the first is negative or the
// last exceeds data_size[s] (the batch's data buffer). `out` must be zero on entry. blockIdx.y walks
// the segments, blockIdx.x/threadIdx.x the offsets of one: a whole read is one launch.
extern "C" __global__ void check_offsets(const int* __restrict__ offsets, const long long* __restrict__ seg_start,
                                         const long long* __restrict__ seg_count,
                                         const long long* __restrict__ data_size, long long num_segments,
                                         long long* __restrict__ out) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long s = blockIdx.y; s < num_segments; s += gridDim.y) {
    const int* o = offsets + seg_start[s];
    const long long count = seg_count[s];
    bool bad = false;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride) {
      const int v = o[k];
      if (k == 0) {
        out[3 * s] = v;
        bad |= v < 0;
      } else {
        bad |= v < o[k - 1];
      }
      if (k == count - 1) {
        out[3 * s + 1] = v;
        bad |= (long long)v > data_size[s];
      }
    }
    if (bad) out[3 * s + 2] = 1;  // every writer writes the same value: no atomics needed
  }
}
