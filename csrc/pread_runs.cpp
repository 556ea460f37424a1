#include "pread_runs.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <vector>

namespace pystrom {

namespace {

#ifdef IOV_MAX
constexpr std::size_t kMaxIov = IOV_MAX;
#else
constexpr std::size_t kMaxIov = 1024;
#endif

// One run: pieces [lo, hi), consecutive in the file but for gaps >= 0 (plan_runs).
int64_t read_run(int fd, const int64_t* offsets, const int64_t* sizes, const int64_t* ptrs, std::size_t lo,
                 std::size_t hi, int64_t max_call, std::vector<uint8_t>& scratch, std::vector<iovec>& iov) {
  if (lo == hi) return 0;  // an empty run (run_first may repeat an entry): offsets[lo] may lie past the end
  iov.clear();
  int64_t widest = 0;
  // the pieces' ends fit int64 (the binding checks), so the gaps do too
  for (std::size_t i = lo + 1; i < hi; ++i) widest = std::max(widest, offsets[i] - (offsets[i - 1] + sizes[i - 1]));
  if (scratch.size() < static_cast<std::size_t>(widest)) scratch.resize(static_cast<std::size_t>(widest));
  for (std::size_t i = lo; i < hi; ++i) {
    if (i > lo) {
      const int64_t gap = offsets[i] - (offsets[i - 1] + sizes[i - 1]);
      if (gap < 0) return -EINVAL;  // overlapping pieces: plan_runs never puts them in one run
      if (gap > 0) iov.push_back({scratch.data(), static_cast<std::size_t>(gap)});
    }
    if (sizes[i] < 0) return -EINVAL;
    iov.push_back({reinterpret_cast<void*>(static_cast<uintptr_t>(ptrs[i])), static_cast<std::size_t>(sizes[i])});
  }
  int64_t done = 0;
  off_t pos = static_cast<off_t>(offsets[lo]);
  std::size_t at = 0;
  std::vector<iovec> window;
  while (at < iov.size()) {
    if (iov[at].iov_len == 0) {
      ++at;
      continue;
    }
    const std::size_t count = std::min(kMaxIov, iov.size() - at);
    ssize_t n;
    if (max_call > 0) {  // at most max_call bytes: a trimmed copy of the window
      window.clear();
      std::size_t left = static_cast<std::size_t>(max_call);
      for (std::size_t j = at; j < at + count && left > 0; ++j) {
        iovec v = iov[j];
        v.iov_len = std::min(v.iov_len, left);
        left -= v.iov_len;
        window.push_back(v);
      }
      n = preadv(fd, window.data(), static_cast<int>(window.size()), pos);
    } else {
      n = preadv(fd, iov.data() + at, static_cast<int>(count), pos);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;  // end of file: the caller sees a short read
    done += n;
    pos += n;
    std::size_t left = static_cast<std::size_t>(n);
    while (at < iov.size() && left >= iov[at].iov_len) {  // what is filled
      left -= iov[at].iov_len;
      ++at;
    }
    if (left) {  // stopped inside this piece: the rest of it next
      iov[at].iov_base = static_cast<uint8_t*>(iov[at].iov_base) + left;
      iov[at].iov_len -= left;
    }
  }
  return done;
}

}  // namespace

std::size_t plan_runs(const int64_t* offsets, const int64_t* sizes, std::size_t n, int64_t max_gap,
                      int64_t max_bytes, int64_t* run_first) {
  std::size_t runs = 0;
  int64_t start = 0, end = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t gap = offsets[i] - end;
    if (i == 0 || gap < 0 || gap > max_gap || offsets[i] + sizes[i] - start > max_bytes) {
      run_first[runs++] = static_cast<int64_t>(i);
      start = offsets[i];
    }
    end = offsets[i] + sizes[i];
  }
  run_first[runs] = static_cast<int64_t>(n);
  return runs;
}

void pread_runs(int fd, const int64_t* offsets, const int64_t* sizes, const int64_t* ptrs, const int64_t* run_first,
                std::size_t nruns, int64_t max_call, int64_t* got) {
  std::vector<uint8_t> scratch;
  std::vector<iovec> iov;
  for (std::size_t r = 0; r < nruns; ++r) {
    got[r] = read_run(fd, offsets, sizes, ptrs, static_cast<std::size_t>(run_first[r]),
                      static_cast<std::size_t>(run_first[r + 1]), max_call, scratch, iov);
  }
}

}  // namespace pystrom
