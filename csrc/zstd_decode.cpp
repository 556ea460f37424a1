#include "zstd_decode.hpp"

#include <dlfcn.h>

#include <initializer_list>
#include <mutex>

namespace pystrom {

namespace {

// libzstd's stable API, with its own signatures (ZSTD_DCtx* opaque)
struct Zstd {
  unsigned (*versionNumber)();
  void* (*createDCtx)();
  std::size_t (*freeDCtx)(void*);
  std::size_t (*decompressDCtx)(void*, void*, std::size_t, const void*, std::size_t);
  unsigned (*isError)(std::size_t);
};

Zstd g_zstd{};
unsigned g_version = 0;
std::once_flag g_once;

template <typename F>
bool resolve(void* handle, const char* symbol, F& fn) {
  fn = reinterpret_cast<F>(dlsym(handle, symbol));
  return fn != nullptr;
}

void load() {
  for (const char* name : {"libzstd.so.1", "libzstd.so"}) {
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) continue;
    Zstd z{};
    if (resolve(handle, "ZSTD_versionNumber", z.versionNumber) && resolve(handle, "ZSTD_createDCtx", z.createDCtx) &&
        resolve(handle, "ZSTD_freeDCtx", z.freeDCtx) && resolve(handle, "ZSTD_decompressDCtx", z.decompressDCtx) &&
        resolve(handle, "ZSTD_isError", z.isError)) {
      g_zstd = z;
      g_version = z.versionNumber();
      return;  // the handle stays open for the life of the process
    }
    dlclose(handle);
  }
}

// One decompression context a thread, freed when the thread ends.
struct Context {
  void* dctx = nullptr;
  ~Context() {
    if (dctx != nullptr) g_zstd.freeDCtx(dctx);
  }
};
thread_local Context t_context;

}  // namespace

unsigned zstd_load() {
  std::call_once(g_once, load);
  return g_version;
}

void zstd_frames_decode(const uint8_t* src, const int64_t* offsets, const int64_t* sizes, const int64_t* dst,
                        const int64_t* caps, const int64_t* which, std::size_t n, int64_t* produced) {
  if (t_context.dctx == nullptr) t_context.dctx = g_zstd.createDCtx();
  uint8_t none = 0;  // the destination of a frame that claims 0 bytes
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t i = which ? static_cast<std::size_t>(which[j]) : j;
    if (t_context.dctx == nullptr) {
      produced[i] = -1;
      continue;
    }
    void* out = caps[i] > 0 ? reinterpret_cast<void*>(static_cast<uintptr_t>(dst[i])) : &none;
    const std::size_t got = g_zstd.decompressDCtx(t_context.dctx, out, static_cast<std::size_t>(caps[i]),
                                                  src + offsets[i], static_cast<std::size_t>(sizes[i]));
    produced[i] = (!g_zstd.isError(got) && got == static_cast<std::size_t>(caps[i])) ? caps[i] : -1;
  }
}

}  // namespace pystrom
