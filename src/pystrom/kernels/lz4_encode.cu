// Bytes -> LZ4 blocks (the blocks of an LZ4 frame: Arrow IPC's LZ4_FRAME body compression), one warp per
// chunk of at most 64 KiB. io/arrow/codecs/device_deflate.py cuts buffers into chunks, frames the blocks
// (independent blocks, so each chunk stands alone) and gathers them.
//
// Why by hand: nvCOMP's compressor would serve, but its library does not load on our GPU image
// (docs/arrow-files.md), and a warp-per-chunk greedy parse is short. The parse is LZ4's fast one, made
// warp-wide: each round the 32 lanes hash the 4 bytes at ip + lane and look for the latest earlier
// position with the same hash (a lower lane of the round with an equal hash, else the warp's table);
// the first lane whose candidate really matches starts the next match, which the warp extends back
// (LZ4's catch-up) and forward, 32 bytes a step. Positions up to that lane are entered in the table,
// the highest lane winning a shared hash, so the table holds what a one-position-at-a-time scan would
// hold and the output does not depend on timing. No skipping ahead on incompressible data (LZ4's
// acceleration): every position is looked at.
//
// A chunk whose block would not be smaller than the chunk is stored raw (the block size's high bit).
// CPU twin: liblz4 (pyarrow's codec) reads what this writes; tests/test_lz4_encode*.py check the round
// trip, and the format's end rules (no match in the last 5 bytes, none starting in the last 12), which
// liblz4's decoder does not all enforce, through tests/lz4_blocks.py.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define ENCODE_WARPS 4  // warps a block: io/arrow/codecs/device_deflate.py launches 128 threads
#define HASH_LOG 12
#define HASH_SIZE (1 << HASH_LOG)
#define NO_POSITION 0xFFFF  // never below a position that may start a match (at most 65536 - 12)
#define MIN_MATCH 4
#define MFLIMIT 12  // LZ4: the last match starts at least 12 bytes before the block's end
#define LAST_LITERALS 5  // LZ4: the last 5 bytes are literals
#define FULL 0xffffffffu

__device__ __forceinline__ u32 load32(const u8* p) {
  return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ u32 hash4(u32 v) { return (v * 2654435761u) >> (32 - HASH_LOG); }

// Bytes of a length's extension after the token's 15: 255s and one remainder byte.
__device__ __forceinline__ i64 extension_bytes(i64 rest) { return rest >= 15 ? (rest - 15) / 255 + 1 : 0; }

__device__ __forceinline__ void put_extension(u8* out, i64 rest, i64 count, int lane) {
  for (i64 k = lane; k < count; k += 32) out[k] = k < count - 1 ? 255 : (u8)((rest - 15) % 255);
}

// One sequence at out[o]: lit literals from lits, then (mlen >= MIN_MATCH) a match of mlen bytes offset
// back, or (mlen == 0) none: the block's last sequence. Returns the new output position.
__device__ i64 put_sequence(u8* out, i64 o, const u8* lits, i64 lit, i64 mlen, u32 offset, int lane) {
  const i64 mrest = mlen ? mlen - MIN_MATCH : 0;
  if (lane == 0) out[o] = (u8)((min(lit, (i64)15) << 4) | min(mrest, (i64)15));
  o += 1;
  const i64 le = extension_bytes(lit);
  put_extension(out + o, lit, le, lane);
  o += le;
  for (i64 k = lane; k < lit; k += 32) out[o + k] = lits[k];
  o += lit;
  if (mlen) {
    if (lane == 0) {
      out[o] = (u8)(offset & 0xff);
      out[o + 1] = (u8)(offset >> 8);
    }
    o += 2;
    const i64 me = extension_bytes(mrest);
    put_extension(out + o, mrest, me, lane);
    o += me;
  }
  return o;
}

__device__ __forceinline__ i64 sequence_bytes(i64 lit, i64 mlen) {
  return 1 + extension_bytes(lit) + lit + (mlen ? 2 + extension_bytes(mlen - MIN_MATCH) : 0);
}

// in[0, n) (0 < n <= 65536) -> its block at out: the 4-byte little-endian size, then the sequences, or the
// bytes as they are (size | 0x80000000) where the sequences would not be shorter. out has room for 4 + n.
// Returns the block's bytes with its size field.
__device__ i64 lz4_encode_chunk(const u8* __restrict__ in, i64 n, u8* __restrict__ out, u16* table, int lane) {
  for (int k = lane; k < HASH_SIZE; k += 32) table[k] = NO_POSITION;
  __syncwarp();
  u8* body = out + 4;
  i64 o = 0, anchor = 0, ip = 0;
  bool stored = false;
  const i64 last_start = n - MFLIMIT;  // a match starts at or before this
  const i64 match_end = n - LAST_LITERALS;  // and ends at or before this
  while (n > MFLIMIT && ip <= last_start) {
    const i64 p = ip + lane;
    const bool valid = p <= last_start;
    const u32 seq = valid ? load32(in + p) : 0;
    const u32 h = hash4(seq);
    const u32 same_hash = __match_any_sync(FULL, h) & __ballot_sync(FULL, valid);
    const u32 lower = same_hash & ((1u << lane) - 1);
    const i64 cand = lower ? ip + (31 - __clz((int)lower)) : (i64)table[h];
    const bool found = valid && cand < p && load32(in + cand) == seq;
    const u32 hits = __ballot_sync(FULL, found);
    const int first = hits ? __ffs((int)hits) - 1 : 31;
    __syncwarp();  // every lookup of the round before the table changes
    if (valid && lane <= first && (same_hash & ~((2u << lane) - 1) & ((2u << first) - 1)) == 0) table[h] = (u16)p;
    __syncwarp();
    if (!hits) {
      ip += 32;
      continue;
    }
    i64 mp = ip + first;
    const i64 offset = mp - __shfl_sync(FULL, cand, first);
    i64 mlen = MIN_MATCH;
    // back over bytes before the match that match too (LZ4's catch-up): a column of small integers
    // repeats its zero high bytes, so a value's match starts inside the one before it
    for (;;) {
      const i64 q = mp - 1 - lane;
      const bool same = q >= anchor && q >= offset && in[q] == in[q - offset];
      const u32 differ = __ballot_sync(FULL, !same);
      const int back = differ ? __ffs((int)differ) - 1 : 32;
      mp -= back;
      mlen += back;
      if (differ) break;
    }
    for (;;) {  // and forward, 32 bytes a step
      const i64 q = mp + mlen + lane;
      const bool same = q < match_end && in[q] == in[q - offset];
      const u32 differ = __ballot_sync(FULL, !same);
      if (differ) {
        mlen += __ffs((int)differ) - 1;
        break;
      }
      mlen += 32;
    }
    if (o + sequence_bytes(mp - anchor, mlen) >= n) {
      stored = true;
      break;
    }
    o = put_sequence(body, o, in + anchor, mp - anchor, mlen, (u32)offset, lane);
    anchor = ip = mp + mlen;
  }
  if (!stored && o + sequence_bytes(n - anchor, 0) >= n) stored = true;
  if (stored) {
    for (i64 k = lane; k < n; k += 32) body[k] = in[k];
    o = n;
  } else {
    o = put_sequence(body, o, in + anchor, n - anchor, 0, 0, lane);
  }
  if (lane == 0) {
    const u32 size = (u32)o | (stored ? 0x80000000u : 0u);
    out[0] = (u8)size;
    out[1] = (u8)(size >> 8);
    out[2] = (u8)(size >> 16);
    out[3] = (u8)(size >> 24);
  }
  __syncwarp();  // the table is the next chunk's
  return 4 + o;
}

// chunks: 3 x n long longs: the chunk's offset in src, its size (1..65536), its block's offset in dst (room
// for 4 + size bytes). sizes[c]: the bytes of chunk c's block, its size field included.
extern "C" __global__ void lz4_encode(const u8* __restrict__ src, u8* __restrict__ dst, const i64* __restrict__ chunks,
                                      int n, i64* __restrict__ sizes) {
  __shared__ u16 tables[ENCODE_WARPS][HASH_SIZE];
  const int warp_in_block = threadIdx.x >> 5;
  if (warp_in_block >= ENCODE_WARPS) return;
  const int lane = threadIdx.x & 31;
  const i64 warps = (i64)gridDim.x * ENCODE_WARPS;
  for (i64 c = (i64)blockIdx.x * ENCODE_WARPS + warp_in_block; c < n; c += warps) {
    const i64 r = lz4_encode_chunk(src + chunks[c], chunks[n + c], dst + chunks[2 * n + c], tables[warp_in_block], lane);
    if (lane == 0) sizes[c] = r;
  }
}
