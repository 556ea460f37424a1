// Arrow's format/Message.fbs: table Message { version: MetadataVersion (short); header: MessageHeader (union:
// type byte in slot 1, offset in slot 2); bodyLength: long; custom_metadata: [KeyValue]; } and table
// RecordBatch { length: long; nodes: [FieldNode]; buffers: [Buffer]; compression: BodyCompression;
// variadicBufferCounts: [long]; }, FieldNode and Buffer structs of two longs, table BodyCompression
// { codec: byte; method: byte; }.
#include "arrow_meta.hpp"

#include <cstring>

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

  bool sub_table(const Table& t, unsigned slot, bool* present, Table* out) const {
    const uint64_t at = field(t, slot);
    *present = at != 0;
    if (!at) return true;
    uint64_t pos;
    return follow(at, &pos) && table(pos, out);
  }
};

int32_t one_batch(const uint8_t* src, std::size_t size, int64_t footer_start, int64_t offset, int64_t msg_at,
                  int64_t meta_length, int64_t body_length, std::size_t num_fields, std::size_t num_buffers,
                  int64_t* rows, int64_t* body, int64_t* nodes, int64_t* buffers, int64_t* codec) {
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
  if (fb.field(message, 4)) return kMetaCustom;  // verified and read by Python (pyarrow's verifier first)
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
                      int64_t* bodies, int64_t* nodes, int64_t* buffers, int64_t* codecs, int32_t* status) {
  if (footer_start < 0) footer_start = 0;  // every Block refused
  for (std::size_t i = 0; i < count; ++i) {
    status[i] = one_batch(src, size, footer_start, offsets[i], msg_at[i], meta_lengths[i], body_lengths[i],
                          num_fields, num_buffers, rows + i, bodies + 2 * i, nodes + 2 * num_fields * i,
                          buffers + 2 * num_buffers * i, codecs + i);
  }
}

}  // namespace pystrom
