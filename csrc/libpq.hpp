// libpq, borrowed from the copy psycopg already loaded into the process: the one place that resolves
// its functions and knows the pieces of its protocol that the COPY OUT pump (pg_pump) and the COPY IN
// sender (pg_copy_in) share. libpq is never linked: psycopg-binary bundles its own libpq, and a second
// one would have different PGconn internals.
#pragma once
#include <stdexcept>
#include <string>

namespace pystrom::pg {

// A failure the server or libpq reported (SQL errors, lost connections); carries libpq's message.
struct ServerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The libpq entry points pystrom uses, with libpq's own signatures (PGconn*/PGresult* opaque).
struct Libpq {
  int (*PQsendQuery)(void*, const char*);
  void* (*PQgetResult)(void*);
  int (*PQresultStatus)(const void*);
  char* (*PQresultErrorMessage)(const void*);
  char* (*PQerrorMessage)(const void*);
  char* (*PQcmdStatus)(void*);
  void (*PQclear)(void*);
  int (*PQgetCopyData)(void*, char**, int);
  int (*PQputCopyData)(void*, const char*, int);
  int (*PQputCopyEnd)(void*, const char*);
  void (*PQfreemem)(void*);
  void* (*PQgetCancel)(void*);
  int (*PQcancel)(void*, char*, int);
  void (*PQfreeCancel)(void*);
  int (*PQstatus)(const void*);
  int (*PQtransactionStatus)(const void*);
  int (*PQconsumeInput)(void*);
  int (*PQsocket)(const void*);
  int (*PQsslInUse)(void*);
  void* (*PQgetgssctx)(void*);  // optional: absent from libpqs built before GSSAPI encryption existed
};

// ExecStatusType / ConnStatusType / PGTransactionStatusType values (stable parts of libpq's ABI).
constexpr int PGRES_COMMAND_OK = 1;
constexpr int PGRES_COPY_OUT = 3;
constexpr int PGRES_COPY_IN = 4;
constexpr int CONNECTION_OK = 0;
constexpr int PQTRANS_ACTIVE = 1;

// Resolve libpq's functions once per process. `path` names an already loaded libpq (ctypes
// implementation of psycopg); empty means "find the one loaded by psycopg's C extension".
// Returns the path of the library used.
std::string load_libpq(const std::string& path);

// The resolved functions; throws when load_libpq has not succeeded yet.
const Libpq& libpq();

// Send `sql` on an idle connection and wait for its first result: returns when that result has
// `expected` status (PGRES_COPY_OUT or PGRES_COPY_IN); otherwise drains the remaining results, so the
// connection is idle again, and throws ServerError with the server's message.
void start_copy(void* conn, const std::string& sql, int expected);

// Collect every remaining result of the current command: the command tag of its PGRES_COMMAND_OK
// result, or ServerError with the first error (also when the connection was lost meanwhile).
std::string finish_command(void* conn);

// Discard every remaining result (after an abort); never throws.
void drain_results(void* conn) noexcept;

}  // namespace pystrom::pg
