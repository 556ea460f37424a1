// Arrow's format/Message.fbs: table Message { version: MetadataVersion (short); header: MessageHeader (union:
// type byte in slot 1, offset in slot 2); bodyLength: long; custom_metadata: [KeyValue]; } and table
// RecordBatch { length: long; nodes: [FieldNode]; buffers: [Buffer]; compression: BodyCompression;
// variadicBufferCounts: [long]; }, FieldNode and Buffer structs of two longs, table BodyCompression
// { codec: byte; method: byte; }.
#include "arrow_meta.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

namespace pystrom {

namespace {

constexpr uint32_t kContinuation = 0xFFFFFFFFu;
constexpr int16_t kV5 = 4;
constexpr uint8_t kRecordBatch = 3;
constexpr uint64_t kMaxBuffer = (uint64_t{1} << 31) - 1;  // flatbuffers' FLATBUFFERS_MAX_BUFFER_SIZE

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // little-endian hosts only (x86-64, aarch64), as the rest of pystrom
  return v;
}

// A flatbuffer p[0, n): every accessor checks before it reads and returns false on anything the
// flatbuffers Verifier would refuse (and some things it would not: stricter only means the Python path).
struct Fb {
  const uint8_t* p;
  uint64_t n;

  bool inside(uint64_t pos, uint64_t len) const { return len < n && pos <= n - len; }

  template <typename T>
  bool scalar(uint64_t pos, T* out) const {
    if (pos % sizeof(T) || !inside(pos, sizeof(T))) return false;
    *out = load<T>(p + pos);
    return true;
  }

  // The uoffset at `pos`, followed: non-zero, forward, landing inside.
  bool follow(uint64_t pos, uint64_t* target) const {
    uint32_t o;
    if (!scalar(pos, &o) || o == 0 || o > kMaxBuffer || !inside(pos + o, 1)) return false;
    *target = pos + o;
    return true;
  }

  struct Table {
    uint64_t pos, vtable, vsize;
  };

  bool table(uint64_t pos, Table* t) const {
    int32_t so;
    if (!scalar(pos, &so)) return false;
    const int64_t vt = static_cast<int64_t>(pos) - so;
    uint16_t vsize;
    if (vt < 0 || !scalar(static_cast<uint64_t>(vt), &vsize)) return false;
    if (vsize < 4 || vsize % 2 || !inside(static_cast<uint64_t>(vt), vsize)) return false;
    // the table's inline size (the vtable's second entry) inside too, as the Verifier's VerifyTableStart
    const uint16_t tsize = load<uint16_t>(p + vt + 2);
    if (!inside(pos, tsize)) return false;
    *t = {pos, static_cast<uint64_t>(vt), vsize};
    return true;
  }

  // Position of slot's value, 0 when absent (a value never sits at 0: the root offset does).
  uint64_t field(const Table& t, unsigned slot) const {
    const uint64_t at = 4 + 2 * uint64_t{slot};
    if (at + 2 > t.vsize) return 0;
    const uint16_t off = load<uint16_t>(p + t.vtable + at);
    return off ? t.pos + off : 0;
  }

  template <typename T>
  bool get(const Table& t, unsigned slot, T dflt, T* out) const {
    const uint64_t at = field(t, slot);
    if (!at) {
      *out = dflt;
      return true;
    }
    return scalar(at, out);
  }

  // The vector whose offset is in slot (absent: *present = false); elements `item` bytes, aligned to `align`.
  bool vector(const Table& t, unsigned slot, uint64_t item, uint64_t align, bool* present, uint64_t* first,
              uint64_t* count) const {
    const uint64_t at = field(t, slot);
    *present = at != 0;
    if (!at) return true;
    uint64_t vec;
    uint32_t c;
    if (!follow(at, &vec) || !scalar(vec, &c)) return false;
    if (c >= kMaxBuffer / item || (vec + 4) % align || !inside(vec + 4, c * item)) return false;
    *first = vec + 4;
    *count = c;
    return true;
  }

  // The string whose offset is in slot (absent: *present = false): a uint32 length, the bytes and a NUL
  // after them, all inside (the Verifier's VerifyString).
  bool string(const Table& t, unsigned slot, bool* present, uint64_t* first, uint64_t* length) const {
    const uint64_t at = field(t, slot);
    *present = at != 0;
    if (!at) return true;
    uint64_t vec;
    uint32_t c;
    if (!follow(at, &vec) || !scalar(vec, &c) || c >= kMaxBuffer || !inside(vec + 4, uint64_t{c} + 1)) return false;
    if (p[vec + 4 + c] != 0) return false;
    *first = vec + 4;
    *length = c;
    return true;
  }

  bool sub_table(const Table& t, unsigned slot, bool* present, Table* out) const {
    const uint64_t at = field(t, slot);
    *present = at != 0;
    if (!at) return true;
    uint64_t pos;
    return follow(at, &pos) && table(pos, out);
  }
};

constexpr uint64_t kMaxKeyValues = 1 << 16;  // io/arrow/file/format.py's _MAX_KEY_VALUES (more: Python declines)

// Message.custom_metadata ([KeyValue], table KeyValue { key: string; value: string; }): every table and
// string verified, the pairs with both a key and a value appended to `pairs` as (key at, key length,
// value at, value length), positions in the flatbuffer plus `base`. False when anything fails verification.
bool key_values(const Fb& fb, const Fb::Table& message, int64_t base, std::vector<int64_t>* pairs) {
  bool present;
  uint64_t first, count;
  if (!fb.vector(message, 4, 4, 4, &present, &first, &count)) return false;
  if (!present) return true;
  if (count > kMaxKeyValues) return false;
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t at, key_at, key_len, value_at, value_len;
    Fb::Table kv;
    bool has_key, has_value;
    if (!fb.follow(first + 4 * k, &at) || !fb.table(at, &kv) || !fb.string(kv, 0, &has_key, &key_at, &key_len) ||
        !fb.string(kv, 1, &has_value, &value_at, &value_len)) {
      return false;
    }
    if (has_key && has_value) {  // as the Python parser: a pair without either is skipped
      pairs->insert(pairs->end(), {base + static_cast<int64_t>(key_at), static_cast<int64_t>(key_len),
                                   base + static_cast<int64_t>(value_at), static_cast<int64_t>(value_len)});
    }
  }
  return true;
}

int32_t one_batch(const uint8_t* src, std::size_t size, int64_t footer_start, int64_t offset, int64_t msg_at,
                  int64_t meta_length, int64_t body_length, std::size_t num_fields, std::size_t num_buffers,
                  int64_t* rows, int64_t* body, int64_t* nodes, int64_t* buffers, int64_t* codec,
                  std::vector<int64_t>* pairs) {
  if (offset < 8 || meta_length < 8 || body_length < 0 || offset > footer_start - meta_length ||
      body_length > footer_start - offset - meta_length) {
    return kMetaBlock;
  }
  if (msg_at < 0 || static_cast<uint64_t>(msg_at) > size || static_cast<uint64_t>(meta_length) > size - msg_at) {
    return kMetaBlock;  // the message's bytes are not in src
  }
  const uint8_t* msg = src + msg_at;
  const uint32_t marker = load<uint32_t>(msg);
  const int32_t fb_len = load<int32_t>(msg + 4);
  if (marker != kContinuation || fb_len <= 0 || fb_len != meta_length - 8) return kMetaPrefix;
  const Fb fb{msg + 8, static_cast<uint64_t>(fb_len)};

  Fb::Table message, batch, compression;
  uint64_t root;
  int16_t version;
  uint8_t header_type;
  int64_t message_body;
  if (!fb.follow(0, &root) || !fb.table(root, &message)) return kMetaVerify;
  if (!fb.get<int16_t>(message, 0, 0, &version) || !fb.get<uint8_t>(message, 1, 0, &header_type) ||
      !fb.get<int64_t>(message, 3, 0, &message_body)) {
    return kMetaVerify;
  }
  bool present;
  if (!fb.sub_table(message, 2, &present, &batch)) return kMetaVerify;
  if (version != kV5 || header_type != kRecordBatch || !present) return kMetaHeader;
  // custom metadata beyond what is verified here (or too many pairs): left to Python, pyarrow's verifier first
  if (!key_values(fb, message, msg_at + 8, pairs)) return kMetaCustom;
  if (message_body != body_length) return kMetaBodyLength;

  int64_t length;
  uint64_t nodes_at, nodes_n, buffers_at, buffers_n, variadic_at, variadic_n;
  bool has_nodes, has_buffers, has_variadic, has_compression;
  if (!fb.get<int64_t>(batch, 0, 0, &length) ||
      !fb.vector(batch, 1, 16, 8, &has_nodes, &nodes_at, &nodes_n) ||
      !fb.vector(batch, 2, 16, 8, &has_buffers, &buffers_at, &buffers_n) ||
      !fb.sub_table(batch, 3, &has_compression, &compression) ||
      !fb.vector(batch, 4, 8, 8, &has_variadic, &variadic_at, &variadic_n)) {
    return kMetaVerify;
  }
  int8_t codec_id = 0, method = 0;
  if (has_compression && (!fb.get<int8_t>(compression, 0, 0, &codec_id) || !fb.get<int8_t>(compression, 1, 0, &method))) {
    return kMetaVerify;
  }
  if (has_compression && (codec_id < 0 || codec_id > 1 || method != 0)) return kMetaCompression;
  if (!has_nodes || !has_buffers || nodes_n != num_fields || buffers_n != num_buffers) return kMetaCounts;

  *rows = length;
  body[0] = offset + meta_length;
  body[1] = body_length;
  std::memcpy(nodes, fb.p + nodes_at, 16 * nodes_n);
  std::memcpy(buffers, fb.p + buffers_at, 16 * buffers_n);
  *codec = has_compression ? codec_id : -1;
  return kMetaOk;
}

}  // namespace

void arrow_batch_meta(const uint8_t* src, std::size_t size, int64_t footer_start, const int64_t* offsets,
                      const int64_t* meta_lengths, const int64_t* body_lengths, const int64_t* msg_at,
                      std::size_t count, std::size_t num_fields, std::size_t num_buffers, int64_t* rows,
                      int64_t* bodies, int64_t* nodes, int64_t* buffers, int64_t* codecs, int32_t* status,
                      int64_t* custom, std::vector<int64_t>* pairs) {
  if (footer_start < 0) footer_start = 0;  // every Block refused
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t before = pairs->size();
    status[i] = one_batch(src, size, footer_start, offsets[i], msg_at[i], meta_lengths[i], body_lengths[i],
                          num_fields, num_buffers, rows + i, bodies + 2 * i, nodes + 2 * num_fields * i,
                          buffers + 2 * num_buffers * i, codecs + i, pairs);
    if (status[i] != kMetaOk) pairs->resize(before);  // a refused batch hands out no pairs
    custom[2 * i] = static_cast<int64_t>(before / 4);
    custom[2 * i + 1] = static_cast<int64_t>((pairs->size() - before) / 4);
  }
}

namespace {

// Why a file is declined (arrow_flat_layouts' return value; any non-zero means the same to the caller).
enum FlatCheck : int32_t {
  kFlatOk = 0,
  kFlatBody = 1,      // a body outside the file, or a negative row count
  kFlatBuffer = 2,    // a buffer outside its body, negative, or not 8-byte aligned
  kFlatNode = 3,      // a FieldNode whose length is not the batch's, or NULLs outside [0, rows]
  kFlatBitmap = 4,    // NULLs without a bitmap that long
  kFlatShort = 5,     // a values buffer shorter than its rows need, or rows of bytes without a data buffer
  kFlatArgs = 6,      // a field index or layout out of range (the caller's bug)
};

int32_t check_flat(std::size_t count, const int64_t* rows, const int64_t* bodies, const int64_t* nodes,
                   const int64_t* buffers, std::size_t num_fields, std::size_t num_buffers, int64_t file_size,
                   const int32_t* layouts, const int64_t* widths, const int64_t* first_buffer) {
  for (std::size_t j = 0; j < num_fields; ++j) {
    const std::size_t need_buffers = layouts[j] == kFlatVarbinary ? 3 : 2;
    if (layouts[j] < kFlatFixed || layouts[j] > kFlatVarbinary || first_buffer[j] < 0 ||
        static_cast<uint64_t>(first_buffer[j]) + need_buffers > num_buffers || widths[j] < 0) {
      return kFlatArgs;
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    const int64_t n_rows = rows[i], body_at = bodies[2 * i], body_len = bodies[2 * i + 1];
    int64_t body_end;
    if (n_rows < 0 || body_at < 0 || body_len < 0 || __builtin_add_overflow(body_at, body_len, &body_end) ||
        body_end > file_size) {
      return kFlatBody;
    }
    const int64_t* buf = buffers + 2 * num_buffers * i;
    for (std::size_t k = 0; k < num_buffers; ++k) {
      const int64_t off = buf[2 * k], len = buf[2 * k + 1];
      if (off < 0 || len < 0 || off % 8 != 0 || off > body_len || len > body_len - off) return kFlatBuffer;
    }
    const int64_t* node = nodes + 2 * num_fields * i;
    for (std::size_t j = 0; j < num_fields; ++j) {
      const int64_t n = node[2 * j], nulls = node[2 * j + 1];
      if (n != n_rows || nulls < 0 || nulls > n) return kFlatNode;
      const int64_t bits = n / 8 + (n % 8 != 0);
      const int64_t* b = buf + 2 * first_buffer[j];  // validity, values, data
      if (nulls > 0 && b[1] < bits) return kFlatBitmap;
      int64_t need;
      if (layouts[j] == kFlatBool) {
        need = bits;
      } else if (layouts[j] == kFlatVarbinary) {
        need = 0;
        if (n > 0) {  // n + 1 int32 offsets; an empty data buffer: pyarrow's path decides what it means
          if (b[5] == 0 || n > INT64_MAX / 4 - 1) return kFlatShort;
          need = (n + 1) * 4;
        }
      } else if (__builtin_mul_overflow(n, widths[j], &need)) {
        return kFlatShort;
      }
      if (b[3] < need) return kFlatShort;
    }
  }
  return kFlatOk;
}

}  // namespace

int32_t arrow_flat_layouts(std::size_t count, const int64_t* rows, const int64_t* bodies, const int64_t* nodes,
                           const int64_t* buffers, std::size_t num_fields, std::size_t num_buffers,
                           int64_t file_size, const int32_t* layouts, const int64_t* widths,
                           const int64_t* first_buffer, std::size_t num_selected, const int64_t* selected,
                           int64_t* out) {
  for (std::size_t s = 0; s < num_selected; ++s) {
    if (selected[s] < 0 || static_cast<uint64_t>(selected[s]) >= num_fields) return kFlatArgs;
  }
  const int32_t failed = check_flat(count, rows, bodies, nodes, buffers, num_fields, num_buffers, file_size,
                                    layouts, widths, first_buffer);
  if (failed != kFlatOk) return failed;
  for (std::size_t s = 0; s < num_selected; ++s) {
    const std::size_t j = static_cast<std::size_t>(selected[s]);
    int64_t* o = out + 8 * count * s;  // rows, NULLs, validity (offset, size), values (..), data (..)
    for (std::size_t i = 0; i < count; ++i) {
      const int64_t base = bodies[2 * i];
      const int64_t* b = buffers + 2 * num_buffers * i + 2 * first_buffer[j];
      const int64_t nulls = nodes[2 * num_fields * i + 2 * j + 1];
      // checked above: base + offset + size lies inside the file, so none of these overflows
      o[i] = nodes[2 * num_fields * i + 2 * j];
      o[count + i] = nulls;
      o[2 * count + i] = nulls > 0 ? (b[1] > 0 ? base + b[0] : 0) : -1;
      o[3 * count + i] = nulls > 0 ? b[1] : 0;
      o[4 * count + i] = b[3] > 0 ? base + b[2] : 0;
      o[5 * count + i] = b[3];
      const bool data = layouts[j] == kFlatVarbinary;
      o[6 * count + i] = data ? (b[5] > 0 ? base + b[4] : 0) : -1;
      o[7 * count + i] = data ? b[5] : 0;
    }
  }
  return kFlatOk;
}

}  // namespace pystrom
