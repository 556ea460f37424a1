#include "pg_copy_in.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "pg_pump.hpp"

namespace pystrom::pg {

namespace {

struct LibpqIn {
  int (*PQsendQuery)(void*, const char*);
  void* (*PQgetResult)(void*);
  int (*PQresultStatus)(const void*);
  char* (*PQresultErrorMessage)(const void*);
  char* (*PQerrorMessage)(const void*);
  char* (*PQcmdStatus)(void*);
  void (*PQclear)(void*);
  int (*PQputCopyData)(void*, const char*, int);
  int (*PQputCopyEnd)(void*, const char*);
  int (*PQstatus)(const void*);
  int (*PQtransactionStatus)(const void*);
};

constexpr int PGRES_COMMAND_OK = 1;
constexpr int PGRES_COPY_IN = 4;
constexpr int CONNECTION_OK = 0;
constexpr int PQTRANS_ACTIVE = 1;

// libpq copies each message into its output buffer: pieces of 256 KiB keep that buffer small
// (one 64 MiB put would grow it to 64 MiB) and each write to the socket large.
constexpr std::size_t kPiece = 256 << 10;

const uint8_t kHeader[19] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xFF, '\r', '\n', 0, 0, 0, 0, 0, 0, 0, 0, 0};
const uint8_t kTrailer[2] = {0xFF, 0xFF};

LibpqIn g_in{};
bool g_loaded = false;
std::mutex g_mutex;

template <typename F>
void resolve(void* handle, const char* symbol, F& fn, const std::string& path) {
  fn = reinterpret_cast<F>(dlsym(handle, symbol));
  if (fn == nullptr) throw std::runtime_error("libpq at " + path + " has no symbol " + symbol);
}

}  // namespace

void load_libpq_copy_in(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_loaded) return;
  // RTLD_NOLOAD: the library psycopg loaded, never a second copy.
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) throw std::runtime_error("libpq at " + path + " is not loaded in this process");
  LibpqIn pq{};
  resolve(handle, "PQsendQuery", pq.PQsendQuery, path);
  resolve(handle, "PQgetResult", pq.PQgetResult, path);
  resolve(handle, "PQresultStatus", pq.PQresultStatus, path);
  resolve(handle, "PQresultErrorMessage", pq.PQresultErrorMessage, path);
  resolve(handle, "PQerrorMessage", pq.PQerrorMessage, path);
  resolve(handle, "PQcmdStatus", pq.PQcmdStatus, path);
  resolve(handle, "PQclear", pq.PQclear, path);
  resolve(handle, "PQputCopyData", pq.PQputCopyData, path);
  resolve(handle, "PQputCopyEnd", pq.PQputCopyEnd, path);
  resolve(handle, "PQstatus", pq.PQstatus, path);
  resolve(handle, "PQtransactionStatus", pq.PQtransactionStatus, path);
  g_in = pq;
  g_loaded = true;
}

CopyInSender::CopyInSender(uintptr_t pgconn) : conn_(reinterpret_cast<void*>(pgconn)) {
  if (!g_loaded) throw std::runtime_error("libpq is not resolved: call load_libpq_copy_in first");
  if (conn_ == nullptr) throw std::invalid_argument("null PGconn pointer");
}

CopyInSender::~CopyInSender() { abort("pystrom: the writer was destroyed mid-COPY"); }

std::string CopyInSender::collect_error() {
  std::string message;
  bool ended = false;
  void* res;
  while ((res = g_in.PQgetResult(conn_)) != nullptr) {
    const int status = g_in.PQresultStatus(res);
    if (status == PGRES_COPY_IN) {  // still in COPY IN (a local failure): end it so results can end
      g_in.PQclear(res);
      if (ended || g_in.PQputCopyEnd(conn_, "pystrom: send failed") != 1) break;
      ended = true;
      continue;
    }
    if (status != PGRES_COMMAND_OK && message.empty()) message = g_in.PQresultErrorMessage(res);
    g_in.PQclear(res);
  }
  if (message.empty()) message = g_in.PQerrorMessage(conn_);
  if (message.empty()) message = "COPY FROM STDIN failed";
  return message;
}

void CopyInSender::start(const std::string& sql) {
  if (g_in.PQstatus(conn_) != CONNECTION_OK) throw ServerError(g_in.PQerrorMessage(conn_));
  if (g_in.PQtransactionStatus(conn_) == PQTRANS_ACTIVE) {
    throw std::runtime_error("the connection is busy with another command");
  }
  if (!g_in.PQsendQuery(conn_, sql.c_str())) throw ServerError(g_in.PQerrorMessage(conn_));
  void* res = g_in.PQgetResult(conn_);
  if (res == nullptr) throw ServerError(g_in.PQerrorMessage(conn_));
  const int status = g_in.PQresultStatus(res);
  if (status != PGRES_COPY_IN) {
    std::string message = g_in.PQresultErrorMessage(res);
    g_in.PQclear(res);
    while ((res = g_in.PQgetResult(conn_)) != nullptr) g_in.PQclear(res);
    if (message.empty()) message = "the server did not start COPY IN (status " + std::to_string(status) + ")";
    throw ServerError(message);
  }
  g_in.PQclear(res);
  active_ = true;
  put(kHeader, sizeof kHeader);
}

void CopyInSender::put(const uint8_t* data, std::size_t size) {
  if (!active_) throw std::runtime_error("no COPY FROM STDIN in progress");
  while (size > 0) {
    const std::size_t n = std::min(size, kPiece);
    if (g_in.PQputCopyData(conn_, reinterpret_cast<const char*>(data), static_cast<int>(n)) != 1) {
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
  if (g_in.PQputCopyEnd(conn_, nullptr) != 1) throw ServerError(collect_error());
  std::string message, status_text;
  void* res;
  while ((res = g_in.PQgetResult(conn_)) != nullptr) {
    const int status = g_in.PQresultStatus(res);
    if (status == PGRES_COMMAND_OK) {
      status_text = g_in.PQcmdStatus(res);
    } else if (message.empty()) {
      message = g_in.PQresultErrorMessage(res);
      if (message.empty()) message = "COPY ended with status " + std::to_string(status);
    }
    g_in.PQclear(res);
  }
  if (!message.empty()) throw ServerError(message);
  if (g_in.PQstatus(conn_) != CONNECTION_OK) throw ServerError(g_in.PQerrorMessage(conn_));
  return status_text;
}

void CopyInSender::abort(const std::string& reason) noexcept {
  if (!active_) return;
  active_ = false;
  if (g_in.PQstatus(conn_) == CONNECTION_OK) g_in.PQputCopyEnd(conn_, reason.c_str());
  void* res;
  while ((res = g_in.PQgetResult(conn_)) != nullptr) g_in.PQclear(res);
}

}  // namespace pystrom::pg
