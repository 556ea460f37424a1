#include "pg_pump.hpp"

#include "pg_decode.hpp"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace pystrom::pg {

namespace {

const Libpq& pq() { return libpq(); }

uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
int32_t be32(const uint8_t* p) {
  return static_cast<int32_t>((uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3]);
}

// Batched reads on TCP (CopyPump::next_message): once the socket is drained the pump sleeps
// kBatchWaitUs, so a batch queues up (~256 KiB at a stream's 250 MB/s) with no wake-up per packet,
// and reads it in one go; the receive buffer is sized to hold kBatchBytes. Measured with
// benchmarks/pg_pump_cpu.py (issue 4) and on 768-float pgvector rows (issue 18).
constexpr int kBatchBytes = 256 << 10;
constexpr long kBatchWaitUs = 1000;
constexpr int kIdleWaitMs = 100;  // a poll's timeout, while a slow query sends nothing (it wakes at the first byte)

const uint8_t kSignature[11] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xFF, '\r', '\n', 0};

// The binary COPY header at the start of the first message: checked, and its size returned.
std::size_t header_size(const uint8_t* msg, std::size_t len) {
  if (len < 19 || std::memcmp(msg, kSignature, 11) != 0) throw ProtocolError("missing binary COPY header");
  if (be32(msg + 11) & (1 << 16)) throw ProtocolError("binary COPY with OIDs is not supported");
  const int32_t ext = be32(msg + 15);
  if (ext < 0 || std::size_t(ext) > len - 19) throw ProtocolError("bad binary COPY header extension");
  return 19 + static_cast<std::size_t>(ext);
}

// An array field's elements, NULL elements and length into the counts (CopyPump::fill). Its header is
// read as the decoder reads it, so both agree on every array the decoder accepts.
void count_array(const uint8_t* a, int32_t len, int64_t* elements, int64_t* shape) {
  const ArrayHeader h = array_header(a, len);
  if (h.failure != OK) return;  // the decoder refuses it, naming the row
  *elements += h.count;
  shape[1] = std::min(shape[1], h.count);
  shape[2] = std::max(shape[2], h.count);
  if (!h.has_null) return;
  const uint8_t* e = a + h.body;
  const uint8_t* end = a + len;
  for (int64_t i = 0; i < h.count && end - e >= 4; ++i) {
    const int32_t elen = be32(e);
    e += 4;
    if (elen == -1) {
      ++shape[0];
    } else if (elen < 0 || elen > end - e) {
      return;  // malformed: the decoder refuses it
    } else {
      e += elen;
    }
  }
}

struct Parsed {
  std::size_t rows;
  bool trailer;  // the bytes ended with the trailer (its 2 bytes are the last ones)
};

// Walk the rows in m[0, n): write each row's start (base + its offset in m) to offsets[0, ...),
// add each column's NULLs and field bytes to nulls/bytes, and check every length against n.
Parsed parse_rows(const uint8_t* __restrict__ m, std::size_t n, int ncols, int64_t base, int64_t* __restrict__ offsets,
                  int64_t* __restrict__ nulls, int64_t* __restrict__ bytes, const uint8_t* arrays,
                  int64_t* __restrict__ shape) {
  Parsed r{0, false};
  std::size_t p = 0;
  while (p < n) {
    if (n - p < 2) throw ProtocolError("truncated row header");
    const int16_t nf = static_cast<int16_t>(be16(m + p));
    if (nf == -1) {
      if (p + 2 != n) throw ProtocolError("data after the binary COPY trailer");
      r.trailer = true;
      return r;
    }
    if (nf != ncols) {
      throw ProtocolError("a row has " + std::to_string(nf) + " fields, expected " + std::to_string(ncols));
    }
    offsets[r.rows++] = base + static_cast<int64_t>(p);
    p += 2;
    for (int c = 0; c < ncols; ++c) {
      if (n - p < 4) throw ProtocolError("truncated field length");
      const int32_t flen = be32(m + p);
      p += 4;
      if (flen == -1) {
        ++nulls[c];
      } else if (flen < 0 || std::size_t(flen) > n - p) {
        throw ProtocolError("field length out of range");
      } else {
        if (arrays != nullptr && arrays[c]) {
          count_array(m + p, flen, bytes + c, shape + 3 * c);
        } else {
          bytes[c] += flen;
        }
        p += static_cast<std::size_t>(flen);
      }
    }
  }
  return r;
}

}  // namespace

CopyPump::CopyPump(uintptr_t pgconn, int ncols, std::vector<uint8_t> arrays)
    : conn_(reinterpret_cast<void*>(pgconn)), ncols_(ncols), arrays_(std::move(arrays)) {
  libpq();  // throws when not resolved yet
  if (conn_ == nullptr) throw std::invalid_argument("null PGconn pointer");
  if (ncols < 0 || ncols > 1664) throw std::invalid_argument("column count out of range");
  if (!arrays_.empty() && arrays_.size() != static_cast<std::size_t>(ncols)) {
    throw std::invalid_argument("one array flag per column");
  }
  if (std::find(arrays_.begin(), arrays_.end(), 1) == arrays_.end()) arrays_.clear();
}

CopyPump::~CopyPump() {
  abort();
}

void CopyPump::start(const std::string& sql) {
  start_copy(conn_, sql, PGRES_COPY_OUT);
  active_ = true;
  begin_batched_reads();
}

void CopyPump::begin_batched_reads() {
  // Only a plain TCP socket: with TLS or GSSAPI encryption libpq may hold decrypted bytes that the
  // socket does not show, and a Unix socket's small buffers would stall the server while we sleep.
  // Those keep libpq's blocking reads.
  if (pq().PQsslInUse(conn_) || (pq().PQgetgssctx != nullptr && pq().PQgetgssctx(conn_) != nullptr)) return;
  const int sock = pq().PQsocket(conn_);
  if (sock < 0) return;
  sockaddr_storage addr{};
  socklen_t alen = sizeof addr;
  if (getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) return;
  if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) return;
  int old = 1;
  socklen_t olen = sizeof old;
  if (getsockopt(sock, SOL_SOCKET, SO_RCVLOWAT, &old, &olen) != 0) return;
  // Raising SO_RCVLOWAT makes Linux grow the receive buffer to hold that many bytes (the window a
  // sleeping reader needs); it is set back at once. Left raised, it would make the kernel ACK every
  // other packet while fewer bytes are queued (36,000 ACKs per 600 MB of vectors, each one a pass
  // through the sending backend's TCP stack: 5% more server CPU than the batched sleeps).
  if (setsockopt(sock, SOL_SOCKET, SO_RCVLOWAT, &kBatchBytes, sizeof kBatchBytes) != 0) return;
  setsockopt(sock, SOL_SOCKET, SO_RCVLOWAT, &old, sizeof old);
  sock_ = sock;
  batched_ = true;
}

void CopyPump::end_batched_reads() noexcept {
  batched_ = false;
  sock_ = -1;
}

int CopyPump::next_message(char** data) {
  if (!batched_) return pq().PQgetCopyData(conn_, data, 0);
  // libpq's blocking PQgetCopyData polls and wakes up for every packet the server flushes (8 KiB);
  // with the server's backends on the same cores those wake-ups cost both sides. Here the bytes
  // queued are read (PQconsumeInput) until libpq holds a whole message; when the socket is drained
  // the pump sleeps kBatchWaitUs, and only when a sleep found nothing queued (a slow query, the
  // server planning) does it poll, which wakes at the first byte.
  bool slept = false;
  for (;;) {
    int len = pq().PQgetCopyData(conn_, data, 1);
    if (len != 0) return len;
    if (!pq().PQconsumeInput(conn_)) return -2;
    len = pq().PQgetCopyData(conn_, data, 1);
    if (len != 0) return len;
    int queued = 0;
    if (slept && ioctl(sock_, FIONREAD, &queued) == 0 && queued == 0) {
      pollfd p{sock_, POLLIN, 0};
      poll(&p, 1, kIdleWaitMs);  // a timeout or EINTR just reads again; PQconsumeInput reports a dead socket
      slept = false;
    } else {
      const timespec pause{0, kBatchWaitUs * 1000};
      nanosleep(&pause, nullptr);  // EINTR: reads early, harmless
      slept = true;
    }
  }
}

void CopyPump::release_pending() noexcept {
  if (pending_ != nullptr) pq().PQfreemem(pending_);
  pending_ = nullptr;
  pending_len_ = 0;
}

FillResult CopyPump::fill(uint8_t* buf, std::size_t capacity, int64_t* offsets, std::size_t max_rows, int64_t* nulls,
                          int64_t* bytes, int64_t* shape) {
  if (!arrays_.empty() && shape == nullptr) throw std::invalid_argument("array columns need the shape counts");
  FillResult out{0, 0, false, 0};
  if (!active_) {
    out.done = true;
    return out;
  }
  // Every row holds at least its field count and one length word per field, so a message of n
  // bytes starts at most ceil(n / min_row) rows: that bounds the offsets it may write before it
  // is parsed, and nothing ever has to be rolled back.
  const std::size_t min_row = 2 + 4 * static_cast<std::size_t>(ncols_);
  for (;;) {
    if (pending_ == nullptr) {
      char* data = nullptr;
      const int len = next_message(&data);
      if (len == -1) {  // end of COPY: collect the final result (the server's error, if any)
        finish();
        out.done = true;
        return out;
      }
      if (len < 0) {  // -2: the connection failed
        std::string message = pq().PQerrorMessage(conn_);
        abort();
        throw ServerError(message.empty() ? "COPY failed" : message);
      }
      pending_ = data;
      pending_len_ = len;
    }
    // The first message starts with the header; the last one is the trailer (int16 -1).
    const uint8_t* msg = reinterpret_cast<const uint8_t*>(pending_);
    const std::size_t len = static_cast<std::size_t>(pending_len_);
    std::size_t body = 0;
    if (!header_seen_) body = header_size(msg, len);
    const bool trailer_only = len - body == 2 && be16(msg + body) == 0xFFFF;
    const std::size_t size = trailer_only ? 0 : len - body;  // the trailer alone fits any buffer
    // size <= (max_rows - nrows) * min_row: the row bound without a division per message.
    if (out.nbytes + size > capacity || size > (max_rows - out.nrows) * min_row) {
      if (out.nbytes == 0 && out.nrows == 0) out.need = size;  // even an empty buffer is too small
      return out;                                             // keep the message for the next buffer
    }
    bool trailer = trailer_only;
    if (size != 0) {
      // Copy first, then parse the copy where it lies: one pass over bytes already in cache,
      // writing row starts and column counts straight into the caller's arrays. A malformed
      // message throws, and the caller discards the whole read.
      uint8_t* dst = buf + out.nbytes;
      std::memcpy(dst, msg + body, size);
      const Parsed r =
          parse_rows(dst, size, ncols_, static_cast<int64_t>(out.nbytes), offsets + out.nrows, nulls, bytes,
                     arrays_.empty() ? nullptr : arrays_.data(), shape);
      out.nrows += r.rows;
      out.nbytes += r.trailer ? size - 2 : size;  // the trailer is not kept
      trailer = r.trailer;
    }
    header_seen_ = true;
    trailer_seen_ = trailer_seen_ || trailer;
    release_pending();
  }
}

void CopyPump::finish() {
  active_ = false;
  end_batched_reads();
  release_pending();
  status_ = finish_command(conn_);
  if (!trailer_seen_) throw ProtocolError("the COPY ended without its trailer");
}

void CopyPump::abort() noexcept {
  release_pending();
  if (!active_) return;
  active_ = false;
  end_batched_reads();
  if (pq().PQstatus(conn_) == CONNECTION_OK) {
    if (void* cancel = pq().PQgetCancel(conn_)) {
      char err[256];
      pq().PQcancel(cancel, err, sizeof err);
      pq().PQfreeCancel(cancel);
    }
  }
  // Read what the server still sends until it acknowledges the end (or the connection fails).
  char* data = nullptr;
  int len;
  while ((len = pq().PQgetCopyData(conn_, &data, 0)) > 0) pq().PQfreemem(data);
  drain_results(conn_);
}

}  // namespace pystrom::pg
