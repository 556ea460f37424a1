// The COPY pump: drains `COPY ... TO STDOUT (FORMAT BINARY)` from a libpq connection that psycopg opened,
// into caller-provided staging buffers, recording where each row starts and what the decoder will need
// to size the table (NULLs and bytes per column). Pure C++, no Python: module.cpp binds it.
//
// libpq is reached through libpq.hpp: the copy psycopg already loaded into the process.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "libpq.hpp"

namespace pystrom::pg {

// Bytes that do not follow the binary COPY format (or a row with the wrong number of fields).
struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where one fill() stopped.
struct FillResult {
  std::size_t nbytes;  // bytes written into the buffer
  std::size_t nrows;   // rows whose start offsets were written
  bool done;           // the COPY finished (and the connection is idle again)
  std::size_t need;    // when not done and nothing fit: the buffer size the next message needs
};

class CopyPump {
 public:
  // `arrays`: one flag per column, set for array columns (empty: none), whose elements the pump counts.
  CopyPump(uintptr_t pgconn, int ncols, std::vector<uint8_t> arrays = {});
  ~CopyPump();
  CopyPump(const CopyPump&) = delete;
  CopyPump& operator=(const CopyPump&) = delete;

  // Send the COPY statement and wait for the server to enter COPY OUT.
  void start(const std::string& sql);

  // Append whole rows to buf[0, capacity) and their start offsets (relative to buf) to offsets,
  // adding per-column NULL counts and field bytes to nulls[ncols] / bytes[ncols]. For array columns
  // bytes counts elements instead, and shape[3 c .. 3 c + 2] (may be null without array columns) gets
  // their NULL elements added and the least / greatest element count of a non-NULL array folded in
  // (the caller starts them at INT64_MAX / -1); arrays the decoder will refuse count nothing. Stops before a
  // message that might not fit: more bytes than are left, or more than (max_rows - rows written)
  // * (2 + 4 ncols) bytes (the smallest row). Blocks on the network; call without the GIL.
  // On TCP a drained socket is waited on by short sleeps (batched reads); its receive buffer is grown once.
  FillResult fill(uint8_t* buf, std::size_t capacity, int64_t* offsets, std::size_t max_rows, int64_t* nulls,
                  int64_t* bytes, int64_t* shape = nullptr);

  // Ask the server to cancel, then drain what is left so the connection is usable (or clearly
  // failed) afterwards. Never throws.
  void abort() noexcept;

  bool active() const { return active_; }
  const std::string& command_status() const { return status_; }

 private:
  void finish();              // after COPY's end: consume results, throw the server's error if any
  void release_pending() noexcept;
  void begin_batched_reads();         // after COPY OUT started: batched socket reads where possible
  void end_batched_reads() noexcept;   // back to libpq's blocking reads
  int next_message(char** data);       // PQgetCopyData's contract: length, -1 at the end, -2 failed

  void* conn_;
  int ncols_;
  std::vector<uint8_t> arrays_;  // per column (empty: no array column)
  bool active_ = false;
  bool header_seen_ = false;
  bool trailer_seen_ = false;
  char* pending_ = nullptr;  // a message that did not fit the last buffer
  int pending_len_ = 0;
  std::string status_;
  bool batched_ = false;  // batched reads of sock_ (TCP)
  int sock_ = -1;
};

}  // namespace pystrom::pg
