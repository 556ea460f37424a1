#include "libpq.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace pystrom::pg {

namespace {

Libpq g_pq{};
std::string g_path;
std::mutex g_mutex;

int find_loaded(dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (name == nullptr || *name == '\0') return 0;
  const char* base = std::strrchr(name, '/');
  base = base ? base + 1 : name;
  if (std::strncmp(base, "libpq", 5) == 0 && (base[5] == '.' || base[5] == '-')) {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
  }
  return 0;
}

template <typename F>
void resolve(void* handle, const char* symbol, F& fn, const std::string& path) {
  fn = reinterpret_cast<F>(dlsym(handle, symbol));
  if (fn == nullptr) throw std::runtime_error("libpq at " + path + " has no symbol " + symbol);
}

}  // namespace

std::string load_libpq(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_path.empty()) return g_path;
  std::vector<std::string> candidates;
  if (!path.empty()) {
    candidates.push_back(path);
  } else {
    dl_iterate_phdr(find_loaded, &candidates);
  }
  if (candidates.empty()) {
    throw std::runtime_error("no libpq is loaded in this process (psycopg must be imported and connected first)");
  }
  for (const std::string& candidate : candidates) {
    // RTLD_NOLOAD: only take a library that is already mapped, never load a second libpq.
    void* handle = dlopen(candidate.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr || dlsym(handle, "PQgetCopyData") == nullptr) continue;
    Libpq pq{};
    resolve(handle, "PQsendQuery", pq.PQsendQuery, candidate);
    resolve(handle, "PQgetResult", pq.PQgetResult, candidate);
    resolve(handle, "PQresultStatus", pq.PQresultStatus, candidate);
    resolve(handle, "PQresultErrorMessage", pq.PQresultErrorMessage, candidate);
    resolve(handle, "PQerrorMessage", pq.PQerrorMessage, candidate);
    resolve(handle, "PQcmdStatus", pq.PQcmdStatus, candidate);
    resolve(handle, "PQclear", pq.PQclear, candidate);
    resolve(handle, "PQgetCopyData", pq.PQgetCopyData, candidate);
    resolve(handle, "PQputCopyData", pq.PQputCopyData, candidate);
    resolve(handle, "PQputCopyEnd", pq.PQputCopyEnd, candidate);
    resolve(handle, "PQfreemem", pq.PQfreemem, candidate);
    resolve(handle, "PQgetCancel", pq.PQgetCancel, candidate);
    resolve(handle, "PQcancel", pq.PQcancel, candidate);
    resolve(handle, "PQfreeCancel", pq.PQfreeCancel, candidate);
    resolve(handle, "PQstatus", pq.PQstatus, candidate);
    resolve(handle, "PQtransactionStatus", pq.PQtransactionStatus, candidate);
    resolve(handle, "PQconsumeInput", pq.PQconsumeInput, candidate);
    resolve(handle, "PQsocket", pq.PQsocket, candidate);
    resolve(handle, "PQsslInUse", pq.PQsslInUse, candidate);
    pq.PQgetgssctx = reinterpret_cast<void* (*)(void*)>(dlsym(handle, "PQgetgssctx"));
    g_pq = pq;
    g_path = candidate;
    return g_path;  // the handle stays open for the life of the process, like psycopg's own
  }
  throw std::runtime_error("none of the loaded libraries named libpq* exports PQgetCopyData");
}

const Libpq& libpq() {
  if (g_path.empty()) throw std::runtime_error("libpq is not resolved: call load_libpq first");
  return g_pq;
}

void start_copy(void* conn, const std::string& sql, int expected) {
  const Libpq& pq = libpq();
  if (pq.PQstatus(conn) != CONNECTION_OK) throw ServerError(pq.PQerrorMessage(conn));
  if (pq.PQtransactionStatus(conn) == PQTRANS_ACTIVE) {
    throw std::runtime_error("the connection is busy with another command");
  }
  if (!pq.PQsendQuery(conn, sql.c_str())) throw ServerError(pq.PQerrorMessage(conn));
  void* res = pq.PQgetResult(conn);
  if (res == nullptr) throw ServerError(pq.PQerrorMessage(conn));
  const int status = pq.PQresultStatus(res);
  if (status == expected) {
    pq.PQclear(res);
    return;
  }
  std::string message = pq.PQresultErrorMessage(res);
  pq.PQclear(res);
  drain_results(conn);  // the connection is idle again before reporting
  if (message.empty()) {
    message = std::string("the server did not start ") + (expected == PGRES_COPY_IN ? "COPY IN" : "COPY OUT") +
              " (status " + std::to_string(status) + ")";
  }
  throw ServerError(message);
}

std::string finish_command(void* conn) {
  const Libpq& pq = libpq();
  std::string message, tag;
  void* res;
  while ((res = pq.PQgetResult(conn)) != nullptr) {
    const int status = pq.PQresultStatus(res);
    if (status == PGRES_COMMAND_OK) {
      tag = pq.PQcmdStatus(res);
    } else if (message.empty()) {
      message = pq.PQresultErrorMessage(res);
      if (message.empty()) message = "COPY ended with status " + std::to_string(status);
    }
    pq.PQclear(res);
  }
  if (!message.empty()) throw ServerError(message);
  if (pq.PQstatus(conn) != CONNECTION_OK) throw ServerError(pq.PQerrorMessage(conn));
  return tag;
}

void drain_results(void* conn) noexcept {
  if (g_path.empty()) return;
  void* res;
  while ((res = g_pq.PQgetResult(conn)) != nullptr) g_pq.PQclear(res);
}

}  // namespace pystrom::pg
