#include "pg_copy_in.hpp"

#include <algorithm>
#include <stdexcept>

#include "pg_pump.hpp"

namespace pystrom::pg {

namespace {

// libpq copies each message into its output buffer: pieces of 256 KiB keep that buffer small
// (one 64 MiB put would grow it to 64 MiB) and each write to the socket large.
constexpr std::size_t kPiece = 256 << 10;

const uint8_t kHeader[19] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xFF, '\r', '\n', 0, 0, 0, 0, 0, 0, 0, 0, 0};
const uint8_t kTrailer[2] = {0xFF, 0xFF};

const Libpq& pq() { return libpq(); }

}  // namespace

CopyInSender::CopyInSender(uintptr_t pgconn) : conn_(reinterpret_cast<void*>(pgconn)) {
  libpq();  // throws when not resolved yet
  if (conn_ == nullptr) throw std::invalid_argument("null PGconn pointer");
}

CopyInSender::~CopyInSender() { abort("pystrom: the writer was destroyed mid-COPY"); }

std::string CopyInSender::collect_error() {
  std::string message;
  bool ended = false;
  void* res;
  while ((res = pq().PQgetResult(conn_)) != nullptr) {
    const int status = pq().PQresultStatus(res);
    if (status == PGRES_COPY_IN) {  // still in COPY IN (a local failure): end it so results can end
      pq().PQclear(res);
      if (ended || pq().PQputCopyEnd(conn_, "pystrom: send failed") != 1) break;
      ended = true;
      continue;
    }
    if (status != PGRES_COMMAND_OK && message.empty()) message = pq().PQresultErrorMessage(res);
    pq().PQclear(res);
  }
  if (message.empty()) message = pq().PQerrorMessage(conn_);
  if (message.empty()) message = "COPY FROM STDIN failed";
  return message;
}

void CopyInSender::start(const std::string& sql) {
  start_copy(conn_, sql, PGRES_COPY_IN);
  active_ = true;
  put(kHeader, sizeof kHeader);
}

void CopyInSender::put(const uint8_t* data, std::size_t size) {
  if (!active_) throw std::runtime_error("no COPY FROM STDIN in progress");
  while (size > 0) {
    const std::size_t n = std::min(size, kPiece);
    if (pq().PQputCopyData(conn_, reinterpret_cast<const char*>(data), static_cast<int>(n)) != 1) {
      // The server ended the COPY (an error, a terminated backend) or the connection failed.
      active_ = false;
      throw ServerError(collect_error());
    }
    data += n;
    size -= n;
  }
}

std::string CopyInSender::finish() {
  put(kTrailer, sizeof kTrailer);
  active_ = false;
  if (pq().PQputCopyEnd(conn_, nullptr) != 1) throw ServerError(collect_error());
  return finish_command(conn_);
}

void CopyInSender::abort(const std::string& reason) noexcept {
  if (!active_) return;
  active_ = false;
  if (pq().PQstatus(conn_) == CONNECTION_OK) pq().PQputCopyEnd(conn_, reason.c_str());
  drain_results(conn_);
}

}  // namespace pystrom::pg
