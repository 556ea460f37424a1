// Spans copied to their places in one launch: an InflatingReader's partial reads out of its scratch
// (io/arrow/read/compressed_reads.py), one launch a slice rather than a copy a read (2048 batches: ~15,000 of them,
// bitmaps and string offsets). CPU twin: csrc/gather.cpp copy_out.

// spans is a (3, n) int64 table, rows offset, dst, size: size[s] bytes from src + offset[s] to the device
// address dst[s]. A block a span, grid-stride over the spans.
extern "C" __global__ void copy_out(const unsigned char* __restrict__ src, const long long* __restrict__ spans,
                                    long long n) {
  for (long long s = blockIdx.x; s < n; s += gridDim.x) {
    const unsigned char* from = src + spans[s];
    unsigned char* to = (unsigned char*)spans[n + s];
    const long long size = spans[2 * n + s];
    for (long long i = threadIdx.x; i < size; i += blockDim.x) to[i] = from[i];
  }
}
