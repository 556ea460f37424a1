// Python objects kept alive by Arrow C data interface arrays that pystrom hands to consumers (pyarrow).
//
// A consumer may drop its last reference on any thread, pyarrow's pool threads included, and as late
// as interpreter shutdown. A release callback that takes the GIL there dies: during finalization a
// thread that asks for the GIL is ended by pthread_exit, whose unwinding through the consumer's
// noexcept destructor aborts the process ("terminate called without an active exception"). So the
// release callback here never takes the GIL: on a thread that holds it the owner is let go at once;
// elsewhere it is parked, and sweep() (called with the GIL, at the next export) lets go of it; once
// the interpreter is finalizing nothing is touched (the process is ending; the memory goes with it).
#pragma once
#include <cstdint>

namespace pystrom::arrow {

// The C data interface's ArrowArray (https://arrow.apache.org/docs/format/CDataInterface.html).
struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void** buffers;
  ArrowArray** children;
  ArrowArray* dictionary;
  void (*release)(ArrowArray*);
  void* private_data;
};

// A new private_data token holding a strong reference to `owner` (a PyObject*; call with the GIL).
void* keep(void* owner);

// The release callback for arrays whose private_data came from keep(): releases the children not
// moved out, then lets go of the owner without the GIL (see above). Any thread, any time.
void release(ArrowArray* array);

// A heap ArrowArray without children over `buffers` (copied), kept alive by `owner`; for a capsule.
ArrowArray* new_array(void* owner, int64_t length, int64_t null_count, const uint64_t* buffers, int64_t n_buffers);

// Let go of the owners parked by threads that did not hold the GIL; returns how many. With the GIL.
int64_t sweep();

}  // namespace pystrom::arrow
