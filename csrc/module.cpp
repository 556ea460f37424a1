// pystrom._core: declarations and conversions only. Each binding checks its buffers, releases the GIL
// and calls plain C++ (bits.cpp). Defaults and documentation live in the Python modules that wrap these.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "arrow_keep.hpp"
#include "arrow_meta.hpp"
#include "bits.hpp"
#include "gather.hpp"
#include "lz4_size.hpp"
#include "pg_arrays.hpp"
#include "pg_copy_in.hpp"
#include "pg_encode.hpp"
#include "pg_decode.hpp"
#include "pg_pump.hpp"
#include "pread_runs.hpp"
#include "utf8.hpp"
#include "zstd_decode.hpp"
#include "zstd_frame.hpp"

namespace py = pybind11;

namespace {

struct Bytes {
  uint8_t* ptr;
  std::size_t size;
};

Bytes checked(const py::buffer_info& info, bool writable, const char* what) {
  if (writable && info.readonly) throw std::invalid_argument(std::string(what) + " is read-only");
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != expected) {
      throw std::invalid_argument(std::string(what) + " must be a C-contiguous buffer");
    }
    expected *= info.shape[i];
  }
  return {static_cast<uint8_t*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize)};
}

Bytes request(const py::buffer& obj, bool writable, const char* what) {
  return checked(obj.request(writable), writable, what);
}

// The arrays of int64 (int32) the newer bindings read as such: a buffer of another item type (an int32
// array where int64 is meant, a byte view at an odd address) would pass request's byte-length checks and
// be read as other numbers, or misaligned.
template <typename T>
Bytes request_typed(const py::buffer& obj, bool writable, const char* what, const char* type) {
  py::buffer_info info = obj.request(writable);
  if (!info.item_type_is_equivalent_to<T>() || reinterpret_cast<uintptr_t>(info.ptr) % alignof(T)) {
    throw std::invalid_argument(std::string(what) + " must be an aligned array of " + type);
  }
  return checked(info, writable, what);
}

Bytes request_i64(const py::buffer& obj, bool writable, const char* what) {
  return request_typed<int64_t>(obj, writable, what, "int64");
}

Bytes request_i32(const py::buffer& obj, bool writable, const char* what) {
  return request_typed<int32_t>(obj, writable, what, "int32");
}

void check_range(const Bytes& b, uint64_t bit_offset, uint64_t count, const char* what) {
  const uint64_t nbits = static_cast<uint64_t>(b.size) * 8;
  if (bit_offset > nbits || count > nbits - bit_offset) {
    throw std::out_of_range(std::string(what) + ": bits [" + std::to_string(bit_offset) + ", " +
                            std::to_string(bit_offset + count) + ") exceed a buffer of " +
                            std::to_string(b.size) + " bytes");
  }
}

struct FramesArgs {
  const uint8_t* src;
  const int64_t *offsets, *sizes, *dst, *caps, *which;
  std::size_t count;
  int64_t* produced;
};

// The arguments of lz4_frames_decode / zstd_frames_decode: int64 arrays of one length (which: indices
// into them), every frame's span inside src.
FramesArgs frames_args(const py::buffer& src, const py::buffer& offsets, const py::buffer& sizes, const py::buffer& dst,
                       const py::buffer& caps, const py::buffer& which, const py::buffer& produced, const char* name) {
  Bytes s = request(src, false, "src");
  Bytes o = request_i64(offsets, false, "offsets");
  Bytes z = request_i64(sizes, false, "sizes");
  Bytes d = request_i64(dst, false, "dst");
  Bytes c = request_i64(caps, false, "caps");
  Bytes w = request_i64(which, false, "which");
  Bytes p = request_i64(produced, true, "produced");
  const std::size_t n = o.size / sizeof(int64_t);
  if (z.size != o.size || d.size != o.size || c.size != o.size || p.size != o.size) {
    throw std::invalid_argument(std::string(name) + ": offsets, sizes, dst, caps and produced (int64) differ in length");
  }
  const int64_t* off = reinterpret_cast<const int64_t*>(o.ptr);
  const int64_t* len = reinterpret_cast<const int64_t*>(z.ptr);
  const int64_t* cap = reinterpret_cast<const int64_t*>(c.ptr);
  const int64_t* idx = reinterpret_cast<const int64_t*>(w.ptr);
  const std::size_t count = w.size / sizeof(int64_t);
  for (std::size_t j = 0; j < count; ++j) {
    if (idx[j] < 0 || static_cast<std::size_t>(idx[j]) >= n) throw std::out_of_range(std::string(name) + ": which");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (off[i] < 0 || len[i] < 0 || cap[i] < 0 ||
        static_cast<uint64_t>(off[i]) + static_cast<uint64_t>(len[i]) > s.size) {
      throw std::out_of_range(std::string(name) + ": a frame's span lies outside src, or a size is negative");
    }
  }
  return {s.ptr, off, len, reinterpret_cast<const int64_t*>(d.ptr), cap, idx, count,
          reinterpret_cast<int64_t*>(p.ptr)};
}

// Pieces (offsets[i], sizes[i]) of a file for plan_runs / pread_runs: both >= 0 and the end inside int64,
// so that the C++ computes ends and gaps without overflow (ranges.py only asks for such pieces).
void check_pieces(const int64_t* offsets, const int64_t* sizes, std::size_t n, const char* name) {
  for (std::size_t i = 0; i < n; ++i) {
    if (offsets[i] < 0 || sizes[i] < 0 || sizes[i] > INT64_MAX - offsets[i]) {
      throw std::out_of_range(std::string(name) + ": piece " + std::to_string(i) + " (offset " +
                              std::to_string(offsets[i]) + ", size " + std::to_string(sizes[i]) +
                              ") is negative or ends past int64");
    }
  }
}

// An optional LSB bitmap (None: no NULLs) that must hold bits [bit_offset, bit_offset + count).
Bytes optional_bits(const py::object& obj, bool writable, int64_t bit_offset, int64_t count, const char* what) {
  if (obj.is_none()) return {nullptr, 0};
  Bytes b = request(obj.cast<py::buffer>(), writable, what);
  if (bit_offset < 0) throw std::invalid_argument(std::string(what) + ": negative bit offset");
  check_range(b, static_cast<uint64_t>(bit_offset), static_cast<uint64_t>(count), what);
  return b;
}

// The decode passes' rows: offsets (int32, n + 1) ascending inside data, checked here (O(n)) so that a
// caller's bad offsets raise instead of reading as a malformed array; the C++ checks each row again.
pystrom::pg::BinaryRows binary_rows(const py::buffer& offsets, const py::buffer& data, const py::object& validity,
                                    int64_t bit_offset, const char* name) {
  Bytes o = request_i32(offsets, false, "offsets");
  Bytes d = request(data, false, "data");
  const int64_t n = static_cast<int64_t>(o.size / sizeof(int32_t)) - 1;
  if (n < 0) throw std::invalid_argument(std::string(name) + ": offsets must hold n + 1 entries");
  const int32_t* off = reinterpret_cast<const int32_t*>(o.ptr);
  for (int64_t i = 0; i < n; ++i) {
    if (off[i] < 0 || off[i + 1] < off[i] || static_cast<uint64_t>(off[i + 1]) > d.size) {
      throw std::invalid_argument(std::string(name) + ": row " + std::to_string(i) +
                                  "'s offsets are negative, decrease or reach past data");
    }
  }
  Bytes v = optional_bits(validity, false, bit_offset, n, "validity");
  return {off, n, d.ptr, d.size, v.ptr, bit_offset};
}

// The encoder's list<string> input (str_data: None for the sizes pass).
pystrom::pg::ListStrings list_strings(const py::buffer& list_offsets, const py::object& row_validity,
                                      int64_t row_bit_offset, const py::buffer& str_offsets, const py::object& str_data,
                                      const py::object& elem_validity, int64_t n, const char* name) {
  Bytes lo = request_i32(list_offsets, false, "list_offsets");
  Bytes so = request_i32(str_offsets, false, "str_offsets");
  if (n < 0 || static_cast<uint64_t>(n) + 1 > lo.size / sizeof(int32_t)) {
    throw std::invalid_argument(std::string(name) + ": list_offsets must hold n + 1 entries");
  }
  Bytes rv = optional_bits(row_validity, false, row_bit_offset, n, "row_validity");
  Bytes ev = optional_bits(elem_validity, false, 0, 0, "elem_validity");
  Bytes sd{nullptr, 0};
  if (!str_data.is_none()) sd = request(str_data.cast<py::buffer>(), false, "str_data");
  return {reinterpret_cast<const int32_t*>(lo.ptr),
          n,
          rv.ptr,
          row_bit_offset,
          reinterpret_cast<const int32_t*>(so.ptr),
          static_cast<int64_t>(so.size / sizeof(int32_t)),
          sd.ptr,
          sd.size,
          ev.ptr,
          static_cast<int64_t>(std::min<std::size_t>(ev.size, std::size_t{1} << 40) * 8)};
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "pystrom native core (see the Python wrappers for documentation)";

  m.def("copy_bits", [](py::buffer src, uint64_t src_offset, py::buffer dst, uint64_t dst_offset, uint64_t count) {
    Bytes s = request(src, false, "src");
    Bytes d = request(dst, true, "dst");
    check_range(s, src_offset, count, "src");
    check_range(d, dst_offset, count, "dst");
    py::gil_scoped_release nogil;
    pystrom::copy_bits(s.ptr, s.size, src_offset, d.ptr, d.size, dst_offset, count);
  });

  m.def("unpack_bits", [](py::buffer src, uint64_t src_offset, py::buffer dst, uint64_t count) {
    Bytes s = request(src, false, "src");
    Bytes d = request(dst, true, "dst");
    check_range(s, src_offset, count, "src");
    if (count > d.size) throw std::out_of_range("dst: fewer bytes than bits to unpack");
    py::gil_scoped_release nogil;
    pystrom::unpack_bits(s.ptr, s.size, src_offset, d.ptr, count);
  });

  m.def("count_bits", [](py::buffer src, uint64_t src_offset, uint64_t count) {
    Bytes s = request(src, false, "src");
    check_range(s, src_offset, count, "src");
    py::gil_scoped_release nogil;
    return pystrom::count_bits(s.ptr, s.size, src_offset, count);
  });

  // spans: (4, n) int64, rows at, bit, count, start (unpack_bit_spans) or at, count, shift, start (shift_spans)
  m.def("unpack_bit_spans", [](py::buffer src, py::buffer spans, int missing, py::buffer dst) {
    Bytes s = request(src, false, "src");
    Bytes t = request_i64(spans, false, "spans");
    Bytes d = request(dst, true, "dst");
    const std::size_t n = t.size / (4 * sizeof(int64_t));
    if (t.size != 4 * n * sizeof(int64_t)) throw std::invalid_argument("unpack_bit_spans: spans must be (4, n) int64");
    const int64_t* at = reinterpret_cast<const int64_t*>(t.ptr);
    const int64_t *bit = at + n, *count = at + 2 * n, *start = at + 3 * n;
    for (std::size_t k = 0; k < n; ++k) {
      const bool fits_dst = count[k] >= 0 && start[k] >= 0 && static_cast<uint64_t>(start[k]) <= d.size &&
                            static_cast<uint64_t>(count[k]) <= d.size - static_cast<uint64_t>(start[k]);
      const uint64_t bits = at[k] >= 0 && static_cast<uint64_t>(at[k]) <= s.size ? (s.size - at[k]) * 8 : 0;
      const bool fits_src = at[k] < 0 || (bit[k] >= 0 && static_cast<uint64_t>(at[k]) <= s.size &&
                                          static_cast<uint64_t>(bit[k]) <= bits &&
                                          static_cast<uint64_t>(count[k]) <= bits - static_cast<uint64_t>(bit[k]));
      if (!fits_dst || !fits_src) {
        throw std::out_of_range("unpack_bit_spans: span " + std::to_string(k) + " lies outside src or dst");
      }
    }
    py::gil_scoped_release nogil;
    pystrom::unpack_bit_spans(s.ptr, s.size, at, bit, count, start, n, static_cast<uint8_t>(missing), d.ptr);
  });

  m.def("shift_spans", [](py::buffer src, py::buffer spans, py::buffer dst) {
    Bytes s = request_i32(src, false, "src");
    Bytes t = request_i64(spans, false, "spans");
    Bytes d = request_i32(dst, true, "dst");
    const std::size_t n = t.size / (4 * sizeof(int64_t));
    if (t.size != 4 * n * sizeof(int64_t)) throw std::invalid_argument("shift_spans: spans must be (4, n) int64");
    const uint64_t src_n = s.size / sizeof(int32_t), dst_n = d.size / sizeof(int32_t);
    const int64_t* at = reinterpret_cast<const int64_t*>(t.ptr);
    const int64_t *count = at + n, *shift = at + 2 * n, *start = at + 3 * n;
    for (std::size_t k = 0; k < n; ++k) {
      if (at[k] < 0 || count[k] < 0 || start[k] < 0 || static_cast<uint64_t>(at[k]) > src_n ||
          static_cast<uint64_t>(count[k]) > src_n - at[k] || static_cast<uint64_t>(start[k]) > dst_n ||
          static_cast<uint64_t>(count[k]) > dst_n - start[k]) {
        throw std::out_of_range("shift_spans: span " + std::to_string(k) + " lies outside src or dst");
      }
      // int32 offsets rebased by a shift of at most 2^32 either way: src[j] - shift never leaves int64
      if (shift[k] < -(int64_t{1} << 32) || shift[k] > (int64_t{1} << 32)) {
        throw std::out_of_range("shift_spans: span " + std::to_string(k) + "'s shift " + std::to_string(shift[k]) +
                                " is beyond 2^32 either way");
      }
    }
    py::gil_scoped_release nogil;
    pystrom::shift_spans(reinterpret_cast<const int32_t*>(s.ptr), at, count, shift, start, n,
                         reinterpret_cast<int32_t*>(d.ptr));
  });

  // dst addresses: memory the caller owns (InflatingReader: the places read_many checked); the spans in src
  // are checked here
  m.def("copy_out", [](py::buffer src, py::buffer spans) {
    Bytes s = request(src, false, "src");
    Bytes t = request_i64(spans, false, "spans");
    const std::size_t n = t.size / (3 * sizeof(int64_t));
    if (t.size != 3 * n * sizeof(int64_t)) throw std::invalid_argument("copy_out: spans must be (3, n) int64");
    const int64_t* offset = reinterpret_cast<const int64_t*>(t.ptr);
    const int64_t *dst = offset + n, *size = offset + 2 * n;
    for (std::size_t k = 0; k < n; ++k) {
      if (offset[k] < 0 || size[k] < 0 || static_cast<uint64_t>(offset[k]) > s.size ||
          static_cast<uint64_t>(size[k]) > s.size - offset[k]) {
        throw std::out_of_range("copy_out: span " + std::to_string(k) + " lies outside src");
      }
    }
    py::gil_scoped_release nogil;
    pystrom::copy_out(s.ptr, offset, dst, size, n);
  });

  m.def("lz4_frame_size", [](py::buffer src) {
    Bytes s = request(src, false, "src");
    py::gil_scoped_release nogil;
    return pystrom::lz4_frame_size(s.ptr, s.size);
  });

  m.def("lz4_frame_decode", [](py::buffer src, py::buffer dst) {
    Bytes s = request(src, false, "src");
    Bytes d = request(dst, true, "dst");
    py::gil_scoped_release nogil;
    return pystrom::lz4_frame_decode(s.ptr, s.size, d.ptr, d.size);
  });

  // lz4_frames_decode / zstd_frames_decode: dst holds addresses of memory the caller owns, caps[i] bytes
  // each (io/arrow/codecs/decompress.py checks or vouches for them); the frames' spans in src and the indices are
  // checked here.
  m.def("lz4_frames_decode", [](py::buffer src, py::buffer offsets, py::buffer sizes, py::buffer dst, py::buffer caps,
                                py::buffer which, py::buffer produced) {
    FramesArgs a = frames_args(src, offsets, sizes, dst, caps, which, produced, "lz4_frames_decode");
    py::gil_scoped_release nogil;
    pystrom::lz4_frames_decode(a.src, a.offsets, a.sizes, a.dst, a.caps, a.which, a.count, a.produced);
  });

  m.def("zstd_load", []() { return pystrom::zstd_load(); });

  m.def("zstd_frames_decode", [](py::buffer src, py::buffer offsets, py::buffer sizes, py::buffer dst,
                                 py::buffer caps, py::buffer which, py::buffer produced) {
    if (pystrom::zstd_load() == 0) throw std::runtime_error("zstd_frames_decode: no libzstd could be loaded");
    FramesArgs a = frames_args(src, offsets, sizes, dst, caps, which, produced, "zstd_frames_decode");
    py::gil_scoped_release nogil;
    pystrom::zstd_frames_decode(a.src, a.offsets, a.sizes, a.dst, a.caps, a.which, a.count, a.produced);
  });

  m.def("zstd_frames_check", [](py::buffer src, py::buffer offsets, py::buffer sizes, py::buffer claims,
                                py::buffer out) {
    Bytes s = request(src, false, "src");
    Bytes o = request_i64(offsets, false, "offsets");
    Bytes z = request_i64(sizes, false, "sizes");
    Bytes c = request_i64(claims, false, "claims");
    Bytes r = request_i32(out, true, "out");
    const std::size_t n = o.size / sizeof(int64_t);
    if (z.size / sizeof(int64_t) != n || c.size / sizeof(int64_t) != n || r.size / sizeof(int32_t) != n) {
      throw std::invalid_argument("zstd_frames_check: offsets, sizes, claims (int64) and out (int32) differ in length");
    }
    bool ok;
    {
      py::gil_scoped_release nogil;
      ok = pystrom::zstd_frames_check(s.ptr, s.size, reinterpret_cast<const int64_t*>(o.ptr),
                                      reinterpret_cast<const int64_t*>(z.ptr), reinterpret_cast<const int64_t*>(c.ptr),
                                      n, reinterpret_cast<int32_t*>(r.ptr));
    }
    if (!ok) throw std::out_of_range("zstd_frames_check: a frame's span lies outside src, or a size is negative");
  });

  m.def("arrow_batch_meta", [](py::buffer src, int64_t footer_start, py::buffer offsets, py::buffer meta_lengths,
                               py::buffer body_lengths, py::buffer msg_at, std::size_t num_fields,
                               std::size_t num_buffers, py::buffer rows, py::buffer bodies, py::buffer nodes,
                               py::buffer buffers, py::buffer codecs, py::buffer status, py::buffer custom) {
    Bytes s = request(src, false, "src");
    Bytes o = request_i64(offsets, false, "offsets");
    Bytes ml = request_i64(meta_lengths, false, "meta_lengths");
    Bytes bl = request_i64(body_lengths, false, "body_lengths");
    Bytes ma = request_i64(msg_at, false, "msg_at");
    Bytes r = request_i64(rows, true, "rows");
    Bytes b = request_i64(bodies, true, "bodies");
    Bytes nd = request_i64(nodes, true, "nodes");
    Bytes bf = request_i64(buffers, true, "buffers");
    Bytes c = request_i64(codecs, true, "codecs");
    Bytes st = request_i32(status, true, "status");
    Bytes cm = request_i64(custom, true, "custom");
    const std::size_t n = o.size / sizeof(int64_t);
    const std::size_t w = sizeof(int64_t);
    if (ml.size != n * w || bl.size != n * w || ma.size != n * w || r.size != n * w || b.size != 2 * n * w ||
        nd.size != 2 * num_fields * n * w || bf.size != 2 * num_buffers * n * w || c.size != n * w ||
        st.size != n * sizeof(int32_t) || cm.size != 2 * n * w) {
      throw std::invalid_argument("arrow_batch_meta: the arrays' lengths do not match the Blocks' count");
    }
    std::vector<int64_t> pairs;
    {
      py::gil_scoped_release nogil;
      pystrom::arrow_batch_meta(s.ptr, s.size, footer_start, reinterpret_cast<const int64_t*>(o.ptr),
                                reinterpret_cast<const int64_t*>(ml.ptr), reinterpret_cast<const int64_t*>(bl.ptr),
                                reinterpret_cast<const int64_t*>(ma.ptr), n, num_fields, num_buffers,
                                reinterpret_cast<int64_t*>(r.ptr), reinterpret_cast<int64_t*>(b.ptr),
                                reinterpret_cast<int64_t*>(nd.ptr), reinterpret_cast<int64_t*>(bf.ptr),
                                reinterpret_cast<int64_t*>(c.ptr), reinterpret_cast<int32_t*>(st.ptr),
                                reinterpret_cast<int64_t*>(cm.ptr), &pairs);
    }
    // the custom metadata's (key at, key length, value at, value length) in src, as int64 bytes
    return py::bytes(reinterpret_cast<const char*>(pairs.data()), pairs.size() * sizeof(int64_t));
  });

  m.def("arrow_flat_layouts", [](py::buffer rows, py::buffer bodies, py::buffer nodes, py::buffer buffers,
                                 int64_t file_size, py::buffer layouts, py::buffer widths, py::buffer first_buffer,
                                 py::buffer selected, py::buffer out) {
    Bytes r = request_i64(rows, false, "rows");
    Bytes b = request_i64(bodies, false, "bodies");
    Bytes nd = request_i64(nodes, false, "nodes");
    Bytes bf = request_i64(buffers, false, "buffers");
    Bytes l = request_i32(layouts, false, "layouts");
    Bytes w = request_i64(widths, false, "widths");
    Bytes f = request_i64(first_buffer, false, "first_buffer");
    Bytes s = request_i64(selected, false, "selected");
    Bytes o = request_i64(out, true, "out");
    const std::size_t i8 = sizeof(int64_t);
    const std::size_t n = r.size / i8, num_fields = l.size / sizeof(int32_t), num_selected = s.size / i8;
    const std::size_t num_buffers = n ? bf.size / (2 * n * i8) : 0;
    if (b.size != 2 * n * i8 || nd.size != 2 * num_fields * n * i8 || bf.size != 2 * num_buffers * n * i8 ||
        w.size != num_fields * i8 || f.size != num_fields * i8 || o.size != 8 * num_selected * n * i8) {
      throw std::invalid_argument("arrow_flat_layouts: the arrays' lengths do not match the batches and fields");
    }
    py::gil_scoped_release nogil;
    return pystrom::arrow_flat_layouts(n, reinterpret_cast<const int64_t*>(r.ptr), reinterpret_cast<const int64_t*>(b.ptr),
                                       reinterpret_cast<const int64_t*>(nd.ptr), reinterpret_cast<const int64_t*>(bf.ptr),
                                       num_fields, num_buffers, file_size, reinterpret_cast<const int32_t*>(l.ptr),
                                       reinterpret_cast<const int64_t*>(w.ptr), reinterpret_cast<const int64_t*>(f.ptr),
                                       num_selected, reinterpret_cast<const int64_t*>(s.ptr),
                                       reinterpret_cast<int64_t*>(o.ptr));
  });

  m.def("plan_runs", [](py::buffer offsets, py::buffer sizes, int64_t max_gap, int64_t max_bytes,
                        py::buffer run_first) {
    Bytes o = request_i64(offsets, false, "offsets");
    Bytes z = request_i64(sizes, false, "sizes");
    Bytes r = request_i64(run_first, true, "run_first");
    const std::size_t n = o.size / sizeof(int64_t);
    if (z.size != o.size || r.size != (n + 1) * sizeof(int64_t)) {
      throw std::invalid_argument("plan_runs: offsets and sizes (int64) differ in length, or run_first is not one longer");
    }
    check_pieces(reinterpret_cast<const int64_t*>(o.ptr), reinterpret_cast<const int64_t*>(z.ptr), n, "plan_runs");
    py::gil_scoped_release nogil;
    return pystrom::plan_runs(reinterpret_cast<const int64_t*>(o.ptr), reinterpret_cast<const int64_t*>(z.ptr), n,
                              max_gap, max_bytes, reinterpret_cast<int64_t*>(r.ptr));
  });

  // ptrs are addresses of memory the caller owns and keeps alive (io/arrow/file/ranges.py checks each piece
  // lies inside its destination array); the runs' bounds are checked here.
  m.def("pread_runs", [](int fd, py::buffer offsets, py::buffer sizes, py::buffer ptrs, py::buffer run_first,
                         int64_t max_call, py::buffer got) {
    Bytes o = request_i64(offsets, false, "offsets");
    Bytes z = request_i64(sizes, false, "sizes");
    Bytes p = request_i64(ptrs, false, "ptrs");
    Bytes r = request_i64(run_first, false, "run_first");
    Bytes g = request_i64(got, true, "got");
    const std::size_t n = o.size / sizeof(int64_t);
    const std::size_t runs = g.size / sizeof(int64_t);
    if (z.size != o.size || p.size != o.size || r.size != (runs + 1) * sizeof(int64_t)) {
      throw std::invalid_argument("pread_runs: offsets, sizes, ptrs (int64) differ in length, or run_first is not "
                                  "one longer than got");
    }
    const int64_t* first = reinterpret_cast<const int64_t*>(r.ptr);
    for (std::size_t k = 0; k < runs; ++k) {
      if (first[k] < 0 || first[k] > first[k + 1] || static_cast<std::size_t>(first[k + 1]) > n) {
        throw std::out_of_range("pread_runs: run_first is not ascending inside the pieces");
      }
    }
    check_pieces(reinterpret_cast<const int64_t*>(o.ptr), reinterpret_cast<const int64_t*>(z.ptr), n, "pread_runs");
    py::gil_scoped_release nogil;
    pystrom::pread_runs(fd, reinterpret_cast<const int64_t*>(o.ptr), reinterpret_cast<const int64_t*>(z.ptr),
                        reinterpret_cast<const int64_t*>(p.ptr), first, runs, max_call,
                        reinterpret_cast<int64_t*>(g.ptr));
  });

  m.def("gather_varbinary", [](py::buffer src_offsets, py::buffer src_data, py::buffer rows, py::buffer dst_offsets,
                               py::buffer dst_data) {
    Bytes so = request_i32(src_offsets, false, "src_offsets");
    Bytes sd = request(src_data, false, "src_data");
    Bytes r = request_i64(rows, false, "rows");
    Bytes dofs = request_i32(dst_offsets, false, "dst_offsets");
    Bytes dd = request(dst_data, true, "dst_data");
    const std::size_t count = r.size / sizeof(int64_t);
    if (so.size < sizeof(int32_t) || dofs.size / sizeof(int32_t) < count) {
      throw std::invalid_argument("gather_varbinary: offsets shorter than the rows gathered");
    }
    bool ok;
    {
      py::gil_scoped_release nogil;
      ok = pystrom::gather_varbinary(reinterpret_cast<const int32_t*>(so.ptr), so.size / sizeof(int32_t) - 1, sd.ptr,
                                     sd.size, reinterpret_cast<const int64_t*>(r.ptr), count,
                                     reinterpret_cast<const int32_t*>(dofs.ptr), dd.ptr, dd.size);
    }
    if (!ok) throw std::out_of_range("gather_varbinary: a row index or string offset lies out of range");
  });

  m.def("copy_offsets_checked", [](py::buffer src, py::buffer dst, int64_t limit) {
    Bytes s = request_i32(src, false, "src");
    Bytes d = request_i32(dst, true, "dst");
    if (d.size < s.size) throw std::invalid_argument("copy_offsets_checked: dst is shorter than src");
    py::gil_scoped_release nogil;
    return pystrom::copy_offsets_checked(reinterpret_cast<const int32_t*>(s.ptr), s.size / sizeof(int32_t),
                                         reinterpret_cast<int32_t*>(d.ptr), limit);
  });

  m.def("utf8_best_level", &pystrom::utf8_best_level);
  m.def("utf8_valid", [](py::buffer data, int level) {
    Bytes d = request(data, false, "data");
    if (level < 0 || level > pystrom::utf8_best_level()) {
      throw std::invalid_argument("utf8_valid: level " + std::to_string(level) + " is not one this CPU runs");
    }
    py::gil_scoped_release nogil;
    return pystrom::utf8_valid_with(d.ptr, d.ptr + d.size, level);
  });

  // offsets: int32, n + 1 of them, ascending inside data (checked here: O(n), against the bytes' O(size));
  // validity: a bitmap holding bits [bit_offset, bit_offset + n), or None
  m.def("utf8_first_bad_row", [](py::buffer data, py::buffer offsets, py::object validity, int64_t bit_offset) {
    Bytes d = request(data, false, "data");
    Bytes o = request_i32(offsets, false, "offsets");
    const int64_t n = static_cast<int64_t>(o.size / sizeof(int32_t)) - 1;
    if (n < 0) throw std::invalid_argument("utf8_first_bad_row: offsets must hold n + 1 entries");
    const int32_t* off = reinterpret_cast<const int32_t*>(o.ptr);
    if (off[0] < 0 || static_cast<uint64_t>(off[n]) > d.size) {
      throw std::out_of_range("utf8_first_bad_row: the offsets reach outside data");
    }
    bool ascending = true;  // without a branch a row: the loop vectorises (1M rows: 0.05 ms, not 0.3)
    for (int64_t i = 0; i < n; ++i) ascending &= off[i + 1] >= off[i];
    if (!ascending) throw std::out_of_range("utf8_first_bad_row: the offsets decrease");
    const uint8_t* bits = nullptr;
    py::buffer_info vinfo;
    if (!validity.is_none()) {
      vinfo = validity.cast<py::buffer>().request();
      Bytes v = checked(vinfo, false, "validity");
      if (bit_offset < 0 || static_cast<uint64_t>(bit_offset + n + 7) / 8 > v.size) {
        throw std::out_of_range("utf8_first_bad_row: the validity bitmap is shorter than the rows");
      }
      bits = v.ptr;
    }
    py::gil_scoped_release nogil;
    return pystrom::utf8_first_bad_row(d.ptr, off, n, bits, bit_offset);
  });

  // -- Arrow arrays handed to consumers: owners let go of without the GIL (arrow_keep.hpp) -------------
  m.def("arrow_keep", [](py::object owner) {
    return reinterpret_cast<uintptr_t>(pystrom::arrow::keep(owner.ptr()));
  });
  m.def("arrow_release_address", []() { return reinterpret_cast<uintptr_t>(&pystrom::arrow::release); });
  m.def("arrow_release", [](uintptr_t address) {  // with the GIL held, so the owner goes at once
    auto* array = reinterpret_cast<pystrom::arrow::ArrowArray*>(address);
    if (array != nullptr && array->release != nullptr) array->release(array);
  });
  m.def("arrow_array_capsule",
        [](py::object owner, int64_t length, int64_t null_count, const std::vector<uint64_t>& buffers) {
          auto* array = pystrom::arrow::new_array(owner.ptr(), length, null_count, buffers.data(),
                                                  static_cast<int64_t>(buffers.size()));
          PyObject* capsule = PyCapsule_New(array, "arrow_array", [](PyObject* self) {
            auto* a = static_cast<pystrom::arrow::ArrowArray*>(PyCapsule_GetPointer(self, "arrow_array"));
            if (a == nullptr) return;
            if (a->release != nullptr) a->release(a);  // not consumed (an import moves it out)
            delete a;
          });
          if (capsule == nullptr) {
            pystrom::arrow::release(array);
            delete array;
            throw py::error_already_set();
          }
          return py::reinterpret_steal<py::object>(capsule);
        });
  m.def("arrow_sweep", &pystrom::arrow::sweep);

  // -- PostgreSQL: the COPY pump and the CPU decoder (pystrom/io/_pq.py wraps these) ------------------
  py::register_exception<pystrom::pg::ServerError>(m, "PgServerError", PyExc_RuntimeError);
  py::register_exception<pystrom::pg::ProtocolError>(m, "PgProtocolError", PyExc_RuntimeError);

  m.def("pg_load_libpq", [](const std::string& path) { return pystrom::pg::load_libpq(path); });

  py::class_<pystrom::pg::CopyPump>(m, "CopyPump")
      .def(py::init<uintptr_t, int, std::vector<uint8_t>>(), py::arg("pgconn"), py::arg("ncols"),
           py::arg("arrays") = std::vector<uint8_t>{})
      .def("start",
           [](pystrom::pg::CopyPump& self, const std::string& sql) {
             py::gil_scoped_release nogil;
             self.start(sql);
           })
      .def("fill",
           [](pystrom::pg::CopyPump& self, py::buffer buf, py::buffer offsets, py::buffer nulls, py::buffer bytes,
              std::optional<py::buffer> shape) {
             Bytes b = request(buf, true, "buf");
             Bytes o = request_i64(offsets, true, "offsets");
             Bytes n = request_i64(nulls, true, "nulls");
             Bytes s = request_i64(bytes, true, "bytes");
             Bytes a{nullptr, 0};
             if (shape) a = request_i64(*shape, true, "shape");
             if (n.size != s.size || (a.ptr != nullptr && a.size != 3 * s.size)) {
               throw std::invalid_argument("fill: nulls and bytes need one int64 per column, shape three");
             }
             pystrom::pg::FillResult r;
             {
               py::gil_scoped_release nogil;
               r = self.fill(b.ptr, b.size, reinterpret_cast<int64_t*>(o.ptr), o.size / sizeof(int64_t),
                             reinterpret_cast<int64_t*>(n.ptr), reinterpret_cast<int64_t*>(s.ptr),
                             reinterpret_cast<int64_t*>(a.ptr));
             }
             return py::make_tuple(r.nbytes, r.nrows, r.done, r.need);
           },
           py::arg("buf"), py::arg("offsets"), py::arg("nulls"), py::arg("bytes"), py::arg("shape") = py::none())
      .def("abort",
           [](pystrom::pg::CopyPump& self) {
             py::gil_scoped_release nogil;
             self.abort();
           })
      .def_property_readonly("active", &pystrom::pg::CopyPump::active)
      .def_property_readonly("command_status", &pystrom::pg::CopyPump::command_status);

  m.def("pg_decode", [](py::buffer buf, py::buffer offsets, int64_t nrows, int64_t row_base, py::buffer desc) {
    Bytes b = request(buf, false, "buf");
    Bytes o = request_i64(offsets, false, "offsets");
    Bytes d = request_i64(desc, false, "desc");
    const int ncols = static_cast<int>(d.size / (sizeof(int64_t) * pystrom::pg::kDescSlots));
    if (nrows < 0 || static_cast<std::size_t>(nrows) > o.size / sizeof(int64_t)) {
      throw std::out_of_range("pg_decode: more rows than offsets");
    }
    if (ncols > 1664) throw std::out_of_range("pg_decode: too many columns");
    pystrom::pg::DecodeError e;
    {
      py::gil_scoped_release nogil;
      e = pystrom::pg::decode_rows(b.ptr, reinterpret_cast<const int64_t*>(o.ptr), nrows, row_base,
                                   reinterpret_cast<const int64_t*>(d.ptr), ncols);
    }
    return py::make_tuple(e.code, e.row, e.column);
  });

  // -- PostgreSQL writes: the CPU encoder and the COPY FROM STDIN sender (io/postgres/pump.py wraps these) --

  m.def("pg_encode_sizes", [](py::buffer desc, int64_t begin, int64_t end, py::buffer sizes) {
    Bytes d = request_i64(desc, false, "desc");
    Bytes s = request_i64(sizes, true, "sizes");
    const int ncols = static_cast<int>(d.size / (sizeof(int64_t) * pystrom::pg::kEncodeSlots));
    if (begin < 0 || end < begin || static_cast<std::size_t>(end - begin) > s.size / sizeof(int64_t)) {
      throw std::out_of_range("pg_encode_sizes: more rows than sizes");
    }
    pystrom::pg::EncodeError e;
    {
      py::gil_scoped_release nogil;
      e = pystrom::pg::row_sizes(reinterpret_cast<const int64_t*>(d.ptr), ncols, begin, end,
                                 reinterpret_cast<int64_t*>(s.ptr));
    }
    return py::make_tuple(e.code, e.row, e.column);
  });

  m.def("pg_encode_rows", [](py::buffer desc, int64_t begin, int64_t end, py::buffer out) {
    Bytes d = request_i64(desc, false, "desc");
    Bytes o = request(out, true, "out");
    const int ncols = static_cast<int>(d.size / (sizeof(int64_t) * pystrom::pg::kEncodeSlots));
    if (begin < 0 || end < begin) throw std::out_of_range("pg_encode_rows: bad row range");
    int64_t n;
    {
      py::gil_scoped_release nogil;
      n = pystrom::pg::encode_rows(reinterpret_cast<const int64_t*>(d.ptr), ncols, begin, end, o.ptr, o.size);
    }
    if (n < 0) throw std::out_of_range("pg_encode_rows: the rows do not fit the buffer (size it with pg_encode_sizes)");
    return n;
  });

  // -- PostgreSQL text-like arrays <-> list<string> (csrc/pg_arrays.hpp; io/postgres/text_arrays.py wraps
  // these). Malformed arrays are results (failure, row), not exceptions: they come from the server.
  m.def("pg_text_arrays_measure", [](py::buffer offsets, py::buffer data, py::object validity, int64_t bit_offset,
                                     uint32_t element_oid) {
    const pystrom::pg::BinaryRows rows = binary_rows(offsets, data, validity, bit_offset, "pg_text_arrays_measure");
    pystrom::pg::TextArraysMeasure r;
    {
      py::gil_scoped_release nogil;
      r = pystrom::pg::text_arrays_measure(rows, element_oid);
    }
    return py::make_tuple(r.elements, r.nbytes, r.null_elements, r.bad_row, r.failure);
  });

  m.def("pg_text_arrays_fill", [](py::buffer offsets, py::buffer data, py::object validity, int64_t bit_offset,
                                  py::buffer list_offsets, py::buffer str_offsets, py::buffer str_data,
                                  py::object elem_validity) {
    const pystrom::pg::BinaryRows rows = binary_rows(offsets, data, validity, bit_offset, "pg_text_arrays_fill");
    Bytes lo = request_i32(list_offsets, true, "list_offsets");
    Bytes so = request_i32(str_offsets, true, "str_offsets");
    Bytes sd = request(str_data, true, "str_data");
    Bytes ev = optional_bits(elem_validity, true, 0, 0, "elem_validity");
    if (lo.size / sizeof(int32_t) < static_cast<uint64_t>(rows.n) + 1) {
      throw std::invalid_argument("pg_text_arrays_fill: list_offsets holds fewer than n + 1 entries");
    }
    if (so.size < sizeof(int32_t)) throw std::invalid_argument("pg_text_arrays_fill: str_offsets is empty");
    const pystrom::pg::ListStringsOut out{reinterpret_cast<int32_t*>(lo.ptr), reinterpret_cast<int32_t*>(so.ptr),
                                          so.size / sizeof(int32_t), sd.ptr, sd.size, ev.ptr, ev.size};
    pystrom::pg::TextArraysFill r;
    {
      py::gil_scoped_release nogil;
      r = pystrom::pg::text_arrays_fill(rows, out);
    }
    if (r.short_buffer != nullptr) {
      const std::string buffer(r.short_buffer), row = std::to_string(r.bad_row);
      throw std::invalid_argument(
          "pg_text_arrays_fill: " +
          (buffer == "elem_validity" && ev.ptr == nullptr ? "row " + row + " holds a NULL element but elem_validity is None"
                                                          : "row " + row + " needs more than " + buffer + " holds") +
          " (size the outputs with pg_text_arrays_measure, over the same bytes)");
    }
    return py::make_tuple(r.failure, r.bad_row);
  });

  m.def("pg_text_arrays_encode_sizes", [](py::buffer list_offsets, py::object row_validity, int64_t row_bit_offset,
                                          py::buffer str_offsets, py::object elem_validity, int64_t n) {
    const pystrom::pg::ListStrings in = list_strings(list_offsets, row_validity, row_bit_offset, str_offsets,
                                                     py::none(), elem_validity, n, "pg_text_arrays_encode_sizes");
    pystrom::pg::TextArraysEncode r;
    {
      py::gil_scoped_release nogil;
      r = pystrom::pg::text_arrays_encode_sizes(in);
    }
    if (r.reason != nullptr) {
      throw std::invalid_argument("pg_text_arrays_encode_sizes: row " + std::to_string(r.bad_row) + ": " + r.reason);
    }
    return r.total;
  });

  m.def("pg_text_arrays_encode", [](py::buffer list_offsets, py::object row_validity, int64_t row_bit_offset,
                                    py::buffer str_offsets, py::buffer str_data, py::object elem_validity, int64_t n,
                                    uint32_t element_oid, py::buffer out_offsets, py::buffer out_data) {
    const pystrom::pg::ListStrings in = list_strings(list_offsets, row_validity, row_bit_offset, str_offsets,
                                                     str_data, elem_validity, n, "pg_text_arrays_encode");
    Bytes oo = request_i32(out_offsets, true, "out_offsets");
    Bytes od = request(out_data, true, "out_data");
    if (oo.size / sizeof(int32_t) < static_cast<uint64_t>(n) + 1) {
      throw std::invalid_argument("pg_text_arrays_encode: out_offsets holds fewer than n + 1 entries");
    }
    pystrom::pg::TextArraysEncode r;
    {
      py::gil_scoped_release nogil;
      r = pystrom::pg::text_arrays_encode(in, element_oid, reinterpret_cast<int32_t*>(oo.ptr), od.ptr, od.size);
    }
    if (r.reason != nullptr) {
      throw std::invalid_argument("pg_text_arrays_encode: row " + std::to_string(r.bad_row) + ": " + r.reason);
    }
    return r.total;
  });

  py::class_<pystrom::pg::CopyInSender>(m, "CopyInSender")
      .def(py::init<uintptr_t>())
      .def("start",
           [](pystrom::pg::CopyInSender& self, const std::string& sql) {
             py::gil_scoped_release nogil;
             self.start(sql);
           })
      .def("put",
           [](pystrom::pg::CopyInSender& self, py::buffer data, std::size_t size) {
             Bytes b = request(data, false, "data");
             if (size > b.size) throw std::out_of_range("put: size exceeds the buffer");
             py::gil_scoped_release nogil;
             self.put(b.ptr, size);
           })
      .def("finish",
           [](pystrom::pg::CopyInSender& self) {
             py::gil_scoped_release nogil;
             return self.finish();
           })
      .def("abort",
           [](pystrom::pg::CopyInSender& self, const std::string& reason) {
             py::gil_scoped_release nogil;
             self.abort(reason);
           })
      .def_property_readonly("active", &pystrom::pg::CopyInSender::active);
}
