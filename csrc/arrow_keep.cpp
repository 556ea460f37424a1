#include "arrow_keep.hpp"

#include <Python.h>
#include <pthread.h>

#include <mutex>
#include <vector>

namespace pystrom::arrow {

namespace {

struct Kept {
  PyObject* owner;
  std::vector<const void*> buffers;  // new_array's buffer pointers (keep()'s arrays bring their own)
};

void fork_prepare();
void fork_after();

// Never destroyed: a pool thread may release an array while static destructors run at exit. Held
// across fork() (pthread_atfork), so that a child never inherits it locked by a thread it does not have.
std::mutex& parked_mutex() {
  static auto* m = [] {
    auto* made = new std::mutex;
    pthread_atfork(fork_prepare, fork_after, fork_after);
    return made;
  }();
  return *m;
}

void fork_prepare() { parked_mutex().lock(); }
void fork_after() { parked_mutex().unlock(); }
std::vector<PyObject*>& parked() {
  static auto* v = new std::vector<PyObject*>;
  return *v;
}

PyThreadState* attached() {
#if PY_VERSION_HEX >= 0x030D0000
  return PyThreadState_GetUnchecked();
#else
  return _PyThreadState_UncheckedGet();
#endif
}

// This thread holds the GIL with its own thread state: true for Python's threads running Python
// code, never for a thread Python has not seen (pyarrow's pool) nor for one that released the GIL.
bool holds_gil() {
  PyThreadState* mine = PyGILState_GetThisThreadState();
  return mine != nullptr && mine == attached();
}

void let_go(PyObject* owner) {
  if (!Py_IsInitialized()) return;  // finalizing: the process is ending, the memory goes with it
  if (holds_gil()) {
    Py_DECREF(owner);
    return;
  }
  std::lock_guard<std::mutex> lock(parked_mutex());
  parked().push_back(owner);
}

}  // namespace

void* keep(void* owner) {
  auto* k = new Kept{static_cast<PyObject*>(owner), {}};
  Py_INCREF(k->owner);
  return k;
}

void release(ArrowArray* array) {
  if (array == nullptr || array->release == nullptr) return;
  for (int64_t i = 0; i < array->n_children; ++i) {
    ArrowArray* child = array->children[i];
    if (child != nullptr && child->release != nullptr) child->release(child);
  }
  auto* k = static_cast<Kept*>(array->private_data);
  array->release = nullptr;
  if (k != nullptr) {
    let_go(k->owner);
    delete k;
  }
}

ArrowArray* new_array(void* owner, int64_t length, int64_t null_count, const uint64_t* buffers, int64_t n_buffers) {
  auto* k = static_cast<Kept*>(keep(owner));
  for (int64_t i = 0; i < n_buffers; ++i) k->buffers.push_back(reinterpret_cast<const void*>(buffers[i]));
  auto* a = new ArrowArray{};
  a->length = length;
  a->null_count = null_count;
  a->offset = 0;
  a->n_buffers = n_buffers;
  a->n_children = 0;
  a->buffers = k->buffers.data();
  a->children = nullptr;
  a->dictionary = nullptr;
  a->release = release;
  a->private_data = k;
  return a;
}

int64_t sweep() {
  std::vector<PyObject*> owners;
  {
    std::lock_guard<std::mutex> lock(parked_mutex());
    owners.swap(parked());
  }
  for (PyObject* o : owners) Py_DECREF(o);
  return static_cast<int64_t>(owners.size());
}

}  // namespace pystrom::arrow
