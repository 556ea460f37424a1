// Checks of buffers another process wrote, before anything dereferences them.
// CPU twin: pystrom.ipc.validate.first_bad_offset (vectorised NumPy).

// Offsets o[0..n] of a string/binary column must satisfy o[0] >= 0, o[i] <= o[i + 1] and
// o[n] <= data_size. Position p in [0, n] fails when: p == 0 and o[0] < 0; p < n and
// o[p + 1] < o[p]; p == n and o[n] > data_size. The smallest failing position is folded into
// *first_bad with atomicMin (left untouched, at its initial ULLONG_MAX, when every position holds).
extern "C" __global__ void first_bad_offset(const int* __restrict__ offsets, long long n, long long data_size,
                                            unsigned long long* __restrict__ first_bad) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p <= n; p += stride) {
    const int here = offsets[p];
    bool bad;
    if (p < n) {
      bad = offsets[p + 1] < here;
    } else {
      bad = (long long)here > data_size;
    }
    if (p == 0 && here < 0) bad = true;
    if (bad) atomicMin(first_bad, (unsigned long long)p);
  }
}
