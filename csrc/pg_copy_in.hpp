// The COPY FROM STDIN sender: streams binary COPY rows (encoded by pg_encode.cpp or the GPU kernels)
// into `COPY ... FROM STDIN (FORMAT BINARY)` on a libpq connection that psycopg opened. Pure C++, no
// Python: module.cpp binds it and releases the GIL around every call that touches the network.
//
// Like the COPY TO pump (pg_pump.cpp), it calls libpq through libpq.hpp (psycopg's own copy, resolved
// once by load_libpq).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace pystrom::pg {

class CopyInSender {
 public:
  explicit CopyInSender(uintptr_t pgconn);
  ~CopyInSender();
  CopyInSender(const CopyInSender&) = delete;
  CopyInSender& operator=(const CopyInSender&) = delete;

  // Send the COPY ... FROM STDIN (FORMAT BINARY) statement, wait for COPY IN, send the binary header.
  void start(const std::string& sql);

  // Send encoded rows (whole rows, any number). Blocks while the server catches up. Throws
  // ServerError with the server's message when the COPY failed on the server meanwhile.
  void put(const uint8_t* data, std::size_t size);

  // Send the trailer and end the COPY; returns the server's command tag ("COPY n").
  std::string finish();

  // End a COPY in progress with a failure (the server rolls back its statement), then drain the
  // results so the connection is idle again (or clearly broken). Never throws.
  void abort(const std::string& reason) noexcept;

  bool active() const { return active_; }

 private:
  std::string collect_error();  // the server's error from the pending results, the connection's otherwise

  void* conn_;
  bool active_ = false;
};

}  // namespace pystrom::pg
