// ZSTD frames (Arrow IPC's ZSTD body compression; RFC 8878) -> bytes, one warp per frame.
//
// Why by hand: on a GPU host the CPU codecs top out at the host's cores (9 GB/s of output on 16), and
// nvCOMP's batched decoder faulted (cudaErrorIllegalAddress) or hung on frames corrupt inside
// (io/arrow/codecs/device.py). Here every length, table description, bitstream and offset is checked
// before it is used, so a corrupt or hostile frame yields -1, never a read outside its input or a write
// outside its output. CPU twin: libzstd (io/arrow/codecs/host.py); tests/test_zstd_kernel_emulated.py
// compares the two on CI, tests/test_zstd_kernel.py on a GPU.
//
// The work of a frame: all 32 lanes parse the headers and decode the sequences redundantly (the same
// broadcast loads and shared-memory reads, so every lane holds the same values and no shuffle is
// needed); lanes 0-3 decode the four Huffman streams of a block's literals; the whole warp copies
// literals and matches. A block's literals are decoded into the tail of the frame's own output,
// [cap - L, cap), and the sequences then write the block front to back: a write never passes the
// literals not yet read (checked), so no scratch memory is needed.
//
// What it refuses as io/arrow/codecs/host.py's structure check (csrc/zstd_frame.cpp) does: anything but
// exactly one zstd frame, a dictionary, a reserved bit or block type, a window above 2 GiB, a content
// size other than the claim, a block above its maximum. A frame with a content checksum gives -2: the
// caller decodes it on the host, where libzstd verifies the checksum.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef short i16;

#define ZSTD_WARPS 4  // warps per block: io/arrow/codecs/device.py launches 128 threads
#define HUF_LOG_MAX 11
#define BLOCK_CAP (128 * 1024)

// Literals_Length and Match_Length codes: baseline and extra bits (RFC 8878 3.1.1.3.2.1.1)
__device__ const u32 LL_BASE[36] = {0,  1,  2,  3,  4,  5,  6,   7,   8,   9,   10,   11,   12,   13,   14,    15,    16,    18,
                                    20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
__device__ const u8 LL_BITS[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  1,  1,
                                   1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
__device__ const u32 ML_BASE[53] = {3,  4,  5,  6,  7,  8,  9,  10, 11, 12,  13,  14,  15,  16,   17,   18,   19,   20,
                                    21, 22, 23, 24, 25, 26, 27, 28, 29, 30,  31,  32,  33,  34,   35,   37,   39,   41,
                                    43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051, 4099, 8195, 16387, 32771, 65539};
__device__ const u8 ML_BITS[53] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                   0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
// the predefined distributions (RFC 8878 3.1.1.3.2.2)
__device__ const i16 LL_DEFAULT[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2,
                                       2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
__device__ const i16 ML_DEFAULT[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};
__device__ const i16 OF_DEFAULT[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};

// One warp's tables (shared memory). FSE entries: symbol | bits << 8 | next-state baseline << 16.
struct ZstdTables {
  u16 huf[1 << HUF_LOG_MAX];  // Huffman: symbol << 8 | code length, indexed by the next max-bits bits
  u32 ll[1 << 9], ml[1 << 9], of[1 << 8];
  u32 weights_fse[1 << 6];
  i16 norm[256];
  u8 weights[256];
};

__device__ __forceinline__ int high_bit(u32 v) { return 31 - __clz((int)v); }  // v > 0

__device__ __forceinline__ u32 byte_at(const u8* p, i64 n, i64 i) { return i >= 0 && i < n ? (u32)p[i] : 0u; }

__device__ __forceinline__ u64 le_bytes(const u8* p, int k) {
  u64 v = 0;
  for (int i = 0; i < k; ++i) v |= (u64)p[i] << (8 * i);
  return v;
}

// ---------------------------------------------------------------------------------------------------
// A backward bitstream (RFC 8878 4.1): read from its end towards its start, after the end mark (the
// last byte's highest set bit). Bits before the start read as zeros; pos < 0 means it read past it.
// Positions are 32-bit: a stream lies inside one block (at most 128 KiB).
struct BackBits {
  const u8* p;
  int n;
  int pos;    // the bits not yet read are [0, pos)
  u64 cache;  // bits [lo, lo + 64) of the stream
  int lo;
};

// The 8 bytes p[first, first + 8) as a little-endian number, bytes outside [0, n) as zeros.
__device__ __forceinline__ u64 load8(const u8* p, int n, int first) {
  u64 v = 0;
  if (first >= 0 && first + 8 <= n) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v |= (u64)p[first + i] << (8 * i);
  } else {
    for (int i = 0; i < 8; ++i) v |= (u64)byte_at(p, n, first + i) << (8 * i);
  }
  return v;
}

__device__ __forceinline__ bool back_init(BackBits& b, const u8* p, i64 n) {
  if (n < 1 || n > (1 << 24) || p[n - 1] == 0) return false;
  b.p = p;
  b.n = (int)n;
  b.pos = (int)(n - 1) * 8 + high_bit(p[n - 1]);
  b.lo = 1 << 30;  // nothing cached
  return true;
}

// The next k bits (k <= 32) as a number whose highest bit is the stream's bit pos - 1, not consumed.
__device__ __forceinline__ u32 back_peek(BackBits& b, int k) {
  const int from = b.pos - k;
  if (from < b.lo) {  // cache bytes [ceil(pos / 8) - 8, ceil(pos / 8)): covers [pos - 57, pos)
    const int first = ((b.pos + 7) >> 3) - 8;
    b.cache = load8(b.p, b.n, first);
    b.lo = first * 8;
  }
  return k == 0 ? 0u : (u32)(b.cache >> (from - b.lo)) & (u32)((1ull << k) - 1);
}

__device__ __forceinline__ u32 back_read(BackBits& b, int k) {
  const u32 v = back_peek(b, k);
  b.pos -= k;
  return v;
}

// ---------------------------------------------------------------------------------------------------
// FSE table descriptions (RFC 8878 4.1.1), read forwards: p[0, n). Returns the bytes used, or -1.
// norm[0, *symbols) get the probabilities (-1: "less than 1"), *log the accuracy log.
__device__ i64 read_ncount(const u8* p, i64 n, int max_symbol, int max_log, i16* norm, int* symbols, int* log) {
  if (n < 1) return -1;
  i64 bit = 0;
  auto peek = [&](void) -> u32 {
    const i64 b = bit >> 3;
    u64 v = 0;
    for (int i = 0; i < 5; ++i) v |= (u64)byte_at(p, n, b + i) << (8 * i);
    return (u32)(v >> (bit & 7));
  };
  const int acc = (int)(peek() & 15) + 5;
  if (acc > max_log) return -1;
  bit = 4;
  int remaining = (1 << acc) + 1, threshold = 1 << acc, bits = acc + 1, s = 0;
  bool previous0 = false;
  while (remaining > 1 && s <= max_symbol) {
    if (previous0) {
      int to = s;
      while (true) {  // 2-bit repeat flags: 3 means three more zeros and another flag
        const u32 r = peek() & 3;
        bit += 2;
        to += (int)r;
        if (r != 3) break;
        if (to > max_symbol) return -1;
      }
      if (to > max_symbol) return -1;
      while (s < to) norm[s++] = 0;
    }
    const int max = (2 * threshold - 1) - remaining;
    const u32 v = peek();
    int count;
    if ((int)(v & (threshold - 1)) < max) {
      count = (int)(v & (threshold - 1));
      bit += bits - 1;
    } else {
      count = (int)(v & (2 * threshold - 1));
      if (count >= threshold) count -= max;
      bit += bits;
    }
    --count;  // probability + 1 was stored
    remaining -= count < 0 ? -count : count;
    norm[s++] = (i16)count;
    previous0 = count == 0;
    if (remaining < threshold) {
      if (remaining <= 1) break;
      bits = high_bit((u32)remaining) + 1;
      threshold = 1 << (bits - 1);
    }
  }
  if (remaining != 1 || s > max_symbol + 1) return -1;
  const i64 used = (bit + 7) >> 3;
  if (used > n) return -1;
  *symbols = s;
  *log = acc;
  return used;
}

// The decoding table of a distribution (RFC 8878 4.1.1, "FSE table"). Lane 0 builds it; false: corrupt.
__device__ bool build_fse(const i16* norm, int symbols, int log, u32* table) {
  const int size = 1 << log;
  int high = size - 1;
  u16 next[256];
  for (int s = 0; s < symbols; ++s) {
    if (norm[s] == -1) {
      if (high < 0) return false;
      table[high--] = (u32)s;
      next[s] = 1;
    } else {
      next[s] = (u16)norm[s];
    }
  }
  const int step = (size >> 1) + (size >> 3) + 3, mask = size - 1;
  int position = 0;
  for (int s = 0; s < symbols; ++s) {
    for (int i = 0; i < norm[s]; ++i) {
      table[position] = (u32)s;
      do position = (position + step) & mask;
      while (position > high);
    }
  }
  if (position != 0) return false;
  for (int u = 0; u < size; ++u) {
    const u32 s = table[u] & 0xFF;
    const u32 state = next[s]++;
    if (state == 0) return false;
    const int bits = log - high_bit(state);
    if (bits < 0) return false;
    table[u] = s | ((u32)bits << 8) | (((state << bits) - (u32)size) << 16);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Huffman tree description (RFC 8878 4.2.1) at p[0, n) into t.huf; the bytes used, or -1. *max_bits.
__device__ i64 read_huffman(const u8* p, i64 n, ZstdTables& t, int* max_bits, int lane) {
  if (n < 1) return -1;
  const u32 header = p[0];
  int count = 0;
  i64 used;
  if (header >= 128) {  // 4-bit weights, two a byte
    count = (int)header - 127;
    used = 1 + (count + 1) / 2;
    if (used > n) return -1;
    for (int i = 0; i < count; ++i) {
      const u32 b = p[1 + i / 2];
      t.weights[i] = (u8)(i % 2 == 0 ? b >> 4 : b & 15);
    }
  } else {  // FSE-compressed weights: two interleaved states over one bitstream
    used = 1 + (i64)header;
    if (header == 0 || used > n) return -1;
    int symbols = 0, log = 0;
    const i64 head = read_ncount(p + 1, header, 255, 6, t.norm, &symbols, &log);
    if (head < 0 || head >= (i64)header) return -1;
    __syncwarp();
    bool ok = true;
    if (lane == 0) ok = build_fse(t.norm, symbols, log, t.weights_fse);
    ok = __shfl_sync(0xffffffffu, (int)ok, 0);
    __syncwarp();
    if (!ok) return -1;
    BackBits b;
    if (!back_init(b, p + 1 + head, (i64)header - head)) return -1;
    u32 s1 = back_read(b, log), s2 = back_read(b, log);
    while (true) {
      if (count > 253) return -1;
      u32 e = t.weights_fse[s1];
      t.weights[count++] = (u8)(e & 0xFF);
      s1 = (e >> 16) + back_read(b, (e >> 8) & 0xFF);
      if (b.pos < 0) {
        t.weights[count++] = (u8)(t.weights_fse[s2] & 0xFF);
        break;
      }
      if (count > 253) return -1;
      e = t.weights_fse[s2];
      t.weights[count++] = (u8)(e & 0xFF);
      s2 = (e >> 16) + back_read(b, (e >> 8) & 0xFF);
      if (b.pos < 0) {
        t.weights[count++] = (u8)(t.weights_fse[s1] & 0xFF);
        break;
      }
    }
  }
  __syncwarp();
  // the last symbol's weight is implied: it makes the sum of 2^(w-1) a power of two
  u32 sum = 0;
  int ones = 0;
  for (int i = 0; i < count; ++i) {
    const u32 w = t.weights[i];
    if (w > 12) return -1;
    if (w) sum += 1u << (w - 1);
    ones += w == 1;
  }
  if (sum == 0) return -1;
  const int bits = high_bit(sum) + 1;
  if (bits > HUF_LOG_MAX) return -1;
  const u32 rest = (1u << bits) - sum;
  if (rest & (rest - 1)) return -1;  // not a power of two
  const int last = high_bit(rest) + 1;
  ones += last == 1;
  if (ones < 2 || (ones & 1)) return -1;  // the two shortest codes come in pairs
  __syncwarp();
  if (lane == 0) t.weights[count] = (u8)last;
  __syncwarp();
  const int symbols = count + 1;
  // codes in order of increasing weight, then symbol: weight w covers 2^(w-1) slots of the table
  u32 start = 0;
  for (int w = 1; w <= bits; ++w) {
    for (int s = 0; s < symbols; ++s) {
      if (t.weights[s] != w) continue;
      const u32 len = 1u << (w - 1);
      const u16 entry = (u16)((s << 8) | (bits + 1 - w));
      for (u32 k = lane; k < len; k += 32) t.huf[start + k] = entry;
      start += len;
    }
  }
  __syncwarp();
  *max_bits = bits;
  return used;
}

// One Huffman stream p[0, n) decoded into out[0, count): false where it is corrupt or not consumed exactly.
// Four symbols a refill of 57 bits (codes are at most 11 bits long), no checks between them: this loop,
// four lanes of a warp, is most of the decoding time of incompressible columns.
__device__ bool huffman_stream(const u8* p, i64 n, const u16* huf, int bits, u8* out, i64 count) {
  if (n < 1 || n > (1 << 24) || p[n - 1] == 0) return false;
  int pos = (int)(n - 1) * 8 + high_bit(p[n - 1]);
  const u32 mask = (1u << bits) - 1;
  const int total = (int)count;  // at most 128 KiB
  int k = 0;
  while (k < total) {
    const int first = ((pos + 7) >> 3) - 8;
    const u64 cache = load8(p, (int)n, first);
    int rel = pos - first * 8;  // 57 to 64 bits cached above `first`
    if (total - k >= 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const u16 e = huf[(u32)(cache >> (rel - bits)) & mask];
        out[k + j] = (u8)(e >> 8);
        rel -= e & 0xFF;
      }
      k += 4;
    } else {
      for (; k < total; ++k) {
        const u16 e = huf[(u32)(cache >> (rel - bits)) & mask];
        out[k] = (u8)(e >> 8);
        rel -= e & 0xFF;
      }
    }
    pos = first * 8 + rel;
    if (pos < 0) return false;
  }
  return pos == 0;
}

// ---------------------------------------------------------------------------------------------------
// The warp's copies. out[0, n) = src[0, n) where out <= src may overlap: each round of 256 bytes is read
// by every lane before any lane writes it.
__device__ void warp_move(u8* out, const u8* src, i64 n, int lane) {
  for (i64 base = 0; base < n; base += 256) {
    u8 v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const i64 i = base + k * 32 + lane;
      if (i < n) v[k] = src[i];
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const i64 i = base + k * 32 + lane;
      if (i < n) out[i] = v[k];
    }
    __syncwarp();
  }
}

// out[o, o + n) = the n bytes that start `offset` back (a match; it may overlap what it writes, which
// repeats the last `offset` bytes); reads only [o - offset, o). A match is at most 128 KiB long, so
// the remainders are 32-bit (cheaper than 64-bit ones).
__device__ __forceinline__ void warp_match(u8* out, i64 o, i64 offset, i64 n, int lane) {
  const u8* from = out + o - offset;
  if (offset >= n) {
    for (i64 i = lane; i < n; i += 32) out[o + i] = from[i];
  } else {
    const u32 period = (u32)offset;  // < n
    for (u32 i = lane; i < (u32)n; i += 32) out[o + i] = from[i % period];
  }
  __syncwarp();
}

// out[0, n) = src[0, n) for a sequence's literals, out <= src: in one round (n <= 32, the common case)
// every lane reads before any writes; longer runs go through warp_move.
__device__ __forceinline__ void warp_literals(u8* out, const u8* src, i64 n, int lane) {
  if (n > 32) {
    warp_move(out, src, n, lane);
    return;
  }
  u8 v = 0;
  if (lane < n) v = src[lane];
  if ((u64)src - (u64)out < (u64)n) __syncwarp();  // the run overlaps what it writes (src >= out)
  if (lane < n) out[lane] = v;
  __syncwarp();
}

__device__ __forceinline__ void warp_fill(u8* out, u8 v, i64 n, int lane) {
  for (i64 i = lane; i < n; i += 32) out[i] = v;
  __syncwarp();
}

// ---------------------------------------------------------------------------------------------------
// A frame's state between blocks: the tables a later block may repeat, and the repeated offsets.
struct FrameState {
  int huf_bits;  // 0: no Huffman tree yet
  int ll_log, ml_log, of_log;  // -1: no table yet
  u64 rep[3];
};

// The sequences table of one kind (mode 0-3) at p[*at, n); false where corrupt.
__device__ bool sequence_table(int mode, const u8* p, i64 n, i64* at, int max_symbol, int max_log, const i16* fallback,
                               int fallback_symbols, int fallback_log, u32* table, int* log, ZstdTables& t, int lane) {
  if (mode == 3) return *log >= 0;  // Repeat: the previous block's
  int symbols = 0, acc = 0;
  bool ok = true;
  if (mode == 1) {  // RLE: one symbol, no bits
    if (*at >= n || p[*at] > max_symbol) return false;
    if (lane == 0) table[0] = p[*at];
    *at += 1;
    *log = 0;
    __syncwarp();
    return true;
  }
  const i16* norm = fallback;
  if (mode == 0) {
    symbols = fallback_symbols;
    acc = fallback_log;
  } else {
    const i64 used = read_ncount(p + *at, n - *at, max_symbol, max_log, t.norm, &symbols, &acc);
    if (used < 0) return false;
    *at += used;
    norm = t.norm;
  }
  __syncwarp();
  if (lane == 0) ok = build_fse(norm, symbols, acc, table);
  ok = __shfl_sync(0xffffffffu, (int)ok, 0);
  __syncwarp();
  *log = acc;
  return ok;
}

// A compressed block b[0, n) written at out[o, ...), the frame's output being out[0, cap). The new
// output position, or -1.
__device__ i64 compressed_block(const u8* b, i64 n, u8* out, i64 o, i64 cap, i64 block_max, FrameState& f,
                                ZstdTables& t, int lane) {
  // literals section (RFC 8878 3.1.1.3.1)
  if (n < 1) return -1;
  const u32 type = b[0] & 3, format = (b[0] >> 2) & 3;
  i64 at, regen;
  const u8* literals;  // where the block's literals are read from
  if (type < 2) {
    const int head = format == 1 ? 2 : format == 3 ? 3 : 1;
    if (n < head) return -1;
    const u64 v = le_bytes(b, head);
    regen = (i64)(head == 1 ? v >> 3 : v >> 4);
    if (regen > block_max) return -1;
    const i64 body = type == 0 ? regen : 1;
    if (body > n - head) return -1;
    at = head + body;
    if (type == 0) {
      literals = b + head;
    } else {
      if (regen > cap - o) return -1;
      literals = out + cap - regen;
      warp_fill(out + cap - regen, b[head], regen, lane);
    }
  } else {
    const bool four = format != 0;
    const int head = format < 2 ? 3 : format == 2 ? 4 : 5, bits = format < 2 ? 10 : format == 2 ? 14 : 18;
    if (n < head) return -1;
    const u64 v = le_bytes(b, head), mask = (1ull << bits) - 1;
    regen = (i64)((v >> 4) & mask);
    const i64 size = (i64)((v >> (4 + bits)) & mask);
    if (regen > block_max || size > n - head) return -1;
    if (four && (regen < 6 || size < 10)) return -1;
    const u8* q = b + head;
    i64 left = size;
    if (type == 2) {
      const i64 tree = read_huffman(q, left, t, &f.huf_bits, lane);
      if (tree < 0) return -1;
      q += tree;
      left -= tree;
    } else if (f.huf_bits == 0) {
      return -1;  // Treeless with no earlier tree in this frame
    }
    if (regen > cap - o) return -1;
    u8* lit = out + cap - regen;
    bool ok = true;
    if (!four) {
      if (lane == 0) ok = huffman_stream(q, left, t.huf, f.huf_bits, lit, regen);
    } else {
      if (left < 6) return -1;
      const i64 s1 = (i64)le_bytes(q, 2), s2 = (i64)le_bytes(q + 2, 2), s3 = (i64)le_bytes(q + 4, 2);
      q += 6;
      left -= 6;
      if (s1 + s2 + s3 >= left) return -1;
      const i64 seg = (regen + 3) / 4;
      if (lane < 4) {
        const i64 start[4] = {0, s1, s1 + s2, s1 + s2 + s3};
        const i64 len[4] = {s1, s2, s3, left - s1 - s2 - s3};
        const i64 count = lane < 3 ? seg : regen - 3 * seg;
        ok = count >= 0 && huffman_stream(q + start[lane], len[lane], t.huf, f.huf_bits, lit + lane * seg, count);
      }
    }
    ok = __all_sync(0xffffffffu, ok);
    __syncwarp();
    if (!ok) return -1;
    literals = lit;
    at = head + size;
  }
  const bool tail = type != 0;  // decoded (or filled) into the output's tail, not read from the input

  // sequences section (RFC 8878 3.1.1.3.2)
  if (at >= n) return -1;
  i64 count;
  {
    const u32 b0 = b[at];
    if (b0 < 128) {
      count = b0;
      at += 1;
    } else if (b0 < 255) {
      if (n - at < 2) return -1;
      count = ((i64)(b0 - 128) << 8) + b[at + 1];
      at += 2;
    } else {
      if (n - at < 3) return -1;
      count = (i64)le_bytes(b + at + 1, 2) + 0x7F00;
      at += 3;
    }
  }
  i64 used = 0;  // literals copied so far
  if (count > 0) {
    if (at >= n) return -1;
    const u32 modes = b[at++];
    if (modes & 3) return -1;
    if (!sequence_table((modes >> 6) & 3, b, n, &at, 35, 9, LL_DEFAULT, 36, 6, t.ll, &f.ll_log, t, lane)) return -1;
    if (!sequence_table((modes >> 4) & 3, b, n, &at, 31, 8, OF_DEFAULT, 29, 5, t.of, &f.of_log, t, lane)) return -1;
    if (!sequence_table((modes >> 2) & 3, b, n, &at, 52, 9, ML_DEFAULT, 53, 6, t.ml, &f.ml_log, t, lane)) return -1;
    BackBits bs;
    if (!back_init(bs, b + at, n - at)) return -1;
    u32 ll_state = back_read(bs, f.ll_log), of_state = back_read(bs, f.of_log), ml_state = back_read(bs, f.ml_log);
    // the repeated offsets in registers (f is in memory; an indexed array would be too)
    u64 r0 = f.rep[0], r1 = f.rep[1], r2 = f.rep[2];
    for (i64 k = 0; k < count; ++k) {
      const u32 le = t.ll[ll_state], me = t.ml[ml_state], oe = t.of[of_state];
      const u32 ll_code = le & 0xFF, ml_code = me & 0xFF, of_code = oe & 0xFF;
      if (ll_code > 35 || ml_code > 52 || of_code > 31) return -1;
      const bool more = k + 1 < count;
      const u32 ml_bits = ML_BITS[ml_code], ll_bits = LL_BITS[ll_code];
      const u32 ll_nb = (le >> 8) & 0xFF, ml_nb = (me >> 8) & 0xFF, of_nb = (oe >> 8) & 0xFF;
      const int need = (int)(of_code + ml_bits + ll_bits + (more ? ll_nb + ml_nb + of_nb : 0));
      u32 of_extra, ml_extra, ll_extra;
      if (need <= 56) {  // almost always: one refill at most, then the fields are shifts of one word
        if (bs.pos - need < bs.lo) {
          const int first = ((bs.pos + 7) >> 3) - 8;
          bs.cache = load8(bs.p, bs.n, first);
          bs.lo = first * 8;
        }
        int rel = bs.pos - bs.lo;  // >= need
        auto take = [&](u32 bits) -> u32 {
          rel -= (int)bits;
          return (u32)(bs.cache >> rel) & ((1u << bits) - 1u);
        };
        of_extra = take(of_code);
        ml_extra = take(ml_bits);
        ll_extra = take(ll_bits);
        if (more) {
          ll_state = (le >> 16) + take(ll_nb);
          ml_state = (me >> 16) + take(ml_nb);
          of_state = (oe >> 16) + take(of_nb);
        }
        bs.pos = bs.lo + rel;
      } else {
        of_extra = back_read(bs, (int)of_code);
        ml_extra = back_read(bs, (int)ml_bits);
        ll_extra = back_read(bs, (int)ll_bits);
        if (more) {
          ll_state = (le >> 16) + back_read(bs, (int)ll_nb);
          ml_state = (me >> 16) + back_read(bs, (int)ml_nb);
          of_state = (oe >> 16) + back_read(bs, (int)of_nb);
        }
      }
      u64 offset = ((u64)1 << of_code) + of_extra;  // Offset_Value
      const i64 match = ML_BASE[ml_code] + ml_extra;
      const i64 lits = LL_BASE[ll_code] + ll_extra;
      if (offset > 3) {
        offset -= 3;
        r2 = r1;
        r1 = r0;
        r0 = offset;
      } else {
        const u32 idx = (u32)offset - 1 + (lits == 0);
        if (idx == 0) {
          offset = r0;
        } else {
          const u64 v = idx == 1 ? r1 : idx == 2 ? r2 : r0 - 1;
          if (v == 0) return -1;
          if (idx != 1) r2 = r1;
          r1 = r0;
          r0 = v;
          offset = v;
        }
      }
      if (bs.pos < 0) return -1;
      // the copies: inside the output, never past the literals still to be read
      if (lits > regen - used) return -1;
      const i64 limit = tail ? cap - (regen - used - lits) : cap;
      if (match > limit - o - lits) return -1;
      warp_literals(out + o, literals + used, lits, lane);
      o += lits;
      used += lits;
      if (offset > (u64)o) return -1;  // before the frame's start (no dictionary)
      warp_match(out, o, (i64)offset, match, lane);
      o += match;
    }
    f.rep[0] = r0;
    f.rep[1] = r1;
    f.rep[2] = r2;
    if (bs.pos != 0) return -1;  // the bitstream consumed exactly
  } else if (at != n) {
    return -1;
  }
  // the literals after the last sequence
  const i64 rest = regen - used;
  if (rest > cap - o) return -1;
  warp_move(out + o, literals + used, rest, lane);
  return o + rest;
}

// One zstd frame in[0, n) into out[0, cap). The bytes produced, -1 (corrupt) or -2 (a content checksum:
// decode it on the host).
__device__ i64 zstd_frame(const u8* __restrict__ in, i64 n, u8* out, i64 cap, ZstdTables& t, int lane) {
  if (n < 5) return -1;
  if ((u32)le_bytes(in, 4) != 0xFD2FB528u) return -1;
  const u32 fhd = in[4];
  const u32 fcs_flag = fhd >> 6;
  const bool single = fhd & 0x20, checksum = fhd & 4;
  if ((fhd & 8) || (fhd & 3)) return -1;  // reserved bit; a dictionary id
  const int fcs_bytes = fcs_flag == 0 ? (single ? 1 : 0) : fcs_flag == 1 ? 2 : fcs_flag == 2 ? 4 : 8;
  i64 at = 5;
  u64 window = 0;
  if (!single) {
    if (n - at < 1) return -1;
    const u32 exponent = in[at] >> 3, mantissa = in[at] & 7;
    ++at;
    const u32 log = 10 + exponent;
    if (log > 31) return -1;
    window = ((u64)1 << log) + (((u64)1 << log) / 8) * mantissa;
  }
  u64 fcs = 0;
  if (fcs_bytes) {
    if (n - at < fcs_bytes) return -1;
    fcs = le_bytes(in + at, fcs_bytes) + (fcs_bytes == 2 ? 256 : 0);
    at += fcs_bytes;
    if (fcs != (u64)cap) return -1;
  }
  if (single) window = fcs;
  const i64 block_max = window < BLOCK_CAP ? (i64)window : BLOCK_CAP;
  if (checksum) return -2;
  FrameState f;
  f.huf_bits = 0;
  f.ll_log = f.ml_log = f.of_log = -1;
  f.rep[0] = 1;
  f.rep[1] = 4;
  f.rep[2] = 8;
  i64 o = 0;
  while (true) {
    if (n - at < 3) return -1;
    const u32 header = (u32)le_bytes(in + at, 3);
    at += 3;
    const bool last = header & 1;
    const u32 type = (header >> 1) & 3;
    const i64 size = header >> 3;
    if (type == 3) return -1;
    if (size > block_max) return -1;
    if (type == 0) {  // Raw
      if (size > n - at || size > cap - o) return -1;
      warp_move(out + o, in + at, size, lane);
      o += size;
      at += size;
    } else if (type == 1) {  // RLE: one byte, size times
      if (n - at < 1 || size > cap - o) return -1;
      warp_fill(out + o, in[at], size, lane);
      o += size;
      at += 1;
    } else {
      if (size > n - at) return -1;
      o = compressed_block(in + at, size, out, o, cap, block_max, f, t, lane);
      if (o < 0) return -1;
      at += size;
    }
    if (last) break;
  }
  if (at != n) return -1;  // anything after the frame
  if (fcs_bytes && (u64)o != fcs) return -1;
  return o;
}

// frames: 4 x nframes long longs: source offset, source size, output address, output capacity (as
// kernels/lz4.cu's). produced[f]: bytes written for frame f, -1 where it is corrupt, -2 where the host
// must decode it. Launched with ZSTD_WARPS warps a block.
extern "C" __global__ void zstd_frames(const u8* __restrict__ src, const i64* __restrict__ frames, int nframes,
                                       i64* __restrict__ produced) {
  __shared__ ZstdTables tables[ZSTD_WARPS];
  const int warp_in_block = threadIdx.x >> 5;
  if (warp_in_block >= ZSTD_WARPS) return;
  ZstdTables& t = tables[warp_in_block];
  const int lane = threadIdx.x & 31;
  const i64 warp = (i64)blockIdx.x * ZSTD_WARPS + warp_in_block;
  const i64 warps = (i64)gridDim.x * ZSTD_WARPS;
  for (i64 fr = warp; fr < nframes; fr += warps) {
    u8* out = (u8*)(unsigned long long)frames[2 * nframes + fr];
    const i64 r = zstd_frame(src + frames[fr], frames[nframes + fr], out, frames[3 * nframes + fr], t, lane);
    __syncwarp();
    if (lane == 0) produced[fr] = r;
  }
}
