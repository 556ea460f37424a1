// LZ4 frames (Arrow IPC's LZ4_FRAME body compression) -> bytes, one warp per frame.
//
// Why by hand: nvCOMP decodes raw LZ4 blocks that stand alone, but Arrow's writer compresses each
// buffer with LZ4F's default preferences, which link the blocks of a frame (a match may reach back
// into the previous block's output, up to 64 KiB), so a frame's blocks cannot be decoded apart. A
// warp walks one frame's blocks in order; all 32 lanes read the same header bytes (uniform control
// flow, broadcast loads) and share the copies of literals and matches. CPU twin: liblz4 through
// pyarrow's codec (io/arrow/codecs/host.py); tests/test_lz4_kernel.py compares the two.
//
// Every length is checked against the frame's input and the output's capacity before it is used,
// so a corrupt or hostile frame yields -1 (or a short output), never a read or write outside them.

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

__device__ __forceinline__ u32 le32(const u8* p) {
  return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// The last RING output bytes of each warp's frame, in shared memory: most matches reach back a few
// bytes (a column of sorted int64 makes one 8-byte sequence after another), and reading them from
// the output just written would cost an L2 round trip per sequence. Position p of the output lives at
// ring[p & (RING - 1)].
#define RING 2048
#define WARPS_PER_BLOCK 8  // kernels/__init__.py launches 256 threads
#define COPY_UNROLL 8  // words each lane of warp_copy moves per round (warp_copy says why)

// out[o, o + n) = src[0, n) by the warp, also into the ring: 4-byte stores on the output's alignment
// (a funnel shift of two aligned source words; out + o and o agree mod 4, the caller aligns outputs),
// bytes at both ends. Reads stay inside src[0, n) (and the aligned words that hold it).
__device__ __forceinline__ void warp_copy(u8* out, i64 o, const u8* __restrict__ src, i64 n, u8* ring, int lane) {
  u8* dst = out + o;
  const i64 head = min((i64)((4 - ((unsigned long long)dst & 3)) & 3), n);
  const i64 keep = n - RING;  // only the last RING bytes go to the ring: one writer per slot
  // (a word that straddles `keep` is left out; lz4_block reads the ring only RING - 4 back)
  if (lane < head) {
    const u8 v = src[lane];
    dst[lane] = v;
    if (lane >= keep) ring[(o + lane) & (RING - 1)] = v;
  }
  const i64 rest = n - head;
  const i64 words = rest >= 8 ? (rest - 4) / 4 : 0;
  const u8* s = src + head;
  u32* d = (u32*)(dst + head);
  const unsigned long long sa = (unsigned long long)s & ~3ULL;
  const u32 shift = (u32)(((unsigned long long)s & 3) * 8);
  const u32* sw = (const u32*)sa;
  // COPY_UNROLL words a lane, all loaded before any is stored: a warp keeps 32 x COPY_UNROLL x 8 bytes
  // of loads in flight instead of 256, and a literal run or a stored block copies at that many bytes
  // per memory latency (one warp per frame: this is the kernel's speed on incompressible data)
  for (i64 w0 = lane; w0 < words; w0 += 32 * COPY_UNROLL) {
    u32 v[COPY_UNROLL];
#pragma unroll
    for (int u = 0; u < COPY_UNROLL; ++u) {
      const i64 w = w0 + 32 * u;
      if (w < words) {
        const u32 lo = __ldg(sw + w), hi = __ldg(sw + w + 1);  // sa + 4w + 8 <= s + 4w + 8 <= src + n
        v[u] = shift ? __funnelshift_r(lo, hi, shift) : lo;
      }
    }
#pragma unroll
    for (int u = 0; u < COPY_UNROLL; ++u) {
      const i64 w = w0 + 32 * u;
      if (w < words) {
        d[w] = v[u];
        if (head + 4 * w >= keep) *(u32*)(ring + ((o + head + 4 * w) & (RING - 1))) = v[u];
      }
    }
  }
  for (i64 k = head + 4 * words + lane; k < n; k += 32) {
    const u8 v = src[k];
    dst[k] = v;
    if (k >= keep) ring[(o + k) & (RING - 1)] = v;
  }
}

// One LZ4 block (in[0, n)) appended at out[o]; matches may reach back to out[window]. Returns the
// new output position, or -1.
__device__ i64 lz4_block(const u8* __restrict__ in, i64 n, u8* out, i64 o, i64 cap, i64 window, u8* ring, int lane) {
  i64 i = 0;
  while (true) {
    if (i >= n) return -1;
    const u32 token = in[i++];
    i64 lit = token >> 4;
    if (lit == 15) {
      u32 b;
      do {
        if (i >= n) return -1;
        b = in[i++];
        lit += b;
      } while (b == 255);
    }
    if (lit > n - i || lit > cap - o) return -1;
    warp_copy(out, o, in + i, lit, ring, lane);
    i += lit;
    o += lit;
    if (i == n) {  // the last sequence of a block has literals only
      __syncwarp();
      return o;
    }
    if (n - i < 2) return -1;
    const i64 off = (i64)in[i] | ((i64)in[i + 1] << 8);
    i += 2;
    i64 len = token & 15;
    if (len == 15) {
      u32 b;
      do {
        if (i >= n) return -1;
        b = in[i++];
        len += b;
      } while (b == 255);
    }
    len += 4;
    if (off == 0 || off > o - window || len > cap - o) return -1;
    __syncwarp();  // the literals (and earlier matches) other lanes wrote are visible to the match
    const u32 period = (u32)off;  // < 2^16
    // From the ring when it holds [o - off, o): writes cannot hit what is still to be read, and
    // warp_copy may leave the 3 bytes just before its last RING out of the ring.
    if (off + len <= RING - 4) {
      for (i64 k = lane; k < len; k += 32) {
        const u8 v = ring[(o - off + (off >= len ? k : (i64)((u32)k % period))) & (RING - 1)];
        out[o + k] = v;
        ring[(o + k) & (RING - 1)] = v;
      }
    } else {  // far or long: from the output (read before o only, so overlap repeats the period)
      const u8* from = out + o - off;
      for (i64 k = lane; k < len; k += 32) {
        const u8 v = from[off >= len ? k : (i64)((u32)k % period)];
        out[o + k] = v;
        if (k >= len - RING) ring[(o + k) & (RING - 1)] = v;
      }
    }
    o += len;
    __syncwarp();
  }
}

// One or more concatenated LZ4 frames (skippable frames skipped) into out[0, cap). Returns the bytes
// produced, or -1.
__device__ i64 lz4_frames_one(const u8* __restrict__ in, i64 n, u8* out, i64 cap, u8* ring, int lane) {
  i64 pos = 0, o = 0;
  while (pos < n) {
    if (n - pos < 4) return -1;
    const u32 magic = le32(in + pos);
    if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) {  // skippable frame: magic, size, data
      if (n - pos < 8) return -1;
      const i64 size = le32(in + pos + 4);
      if (size > n - pos - 8) return -1;
      pos += 8 + size;
      continue;
    }
    if (magic != 0x184D2204u || n - pos < 7) return -1;
    const u32 flg = in[pos + 4], bd = in[pos + 5];
    if ((unsigned long long)out & 3) return -1;  // outputs start 4-byte aligned (the ring's word stores)
    if ((flg >> 6) != 1 || (flg & 2) || (flg & 1)) return -1;  // version 01, reserved bit, no dictionary
    const u32 size_id = (bd >> 4) & 7;
    if ((bd & 0x8F) || size_id < 4) return -1;
    const i64 block_max = 1LL << (2 * size_id + 8);  // 64 KiB, 256 KiB, 1 MiB, 4 MiB
    const bool block_sum = flg & 0x10, content_size = flg & 8, content_sum = flg & 4;
    const i64 header = 7 + (content_size ? 8 : 0);
    if (n - pos < header) return -1;
    i64 declared = -1;
    if (content_size) {
      declared = (i64)le32(in + pos + 6) | ((i64)le32(in + pos + 10) << 32);
      if (declared < 0) return -1;
    }
    pos += header;  // the header checksum byte is not verified: every length below is
    const i64 frame_start = o;
    while (true) {
      if (n - pos < 4) return -1;
      u32 word = le32(in + pos);
      pos += 4;
      if (word == 0) break;  // end mark
      const bool stored = word & 0x80000000u;
      const i64 size = word & 0x7FFFFFFFu;
      if (size > block_max || size > n - pos) return -1;
      if (stored) {
        if (size > cap - o) return -1;
        warp_copy(out, o, in + pos, size, ring, lane);
        o += size;
        __syncwarp();
      } else {
        const i64 next = lz4_block(in + pos, size, out, o, cap, frame_start, ring, lane);
        if (next < 0 || next - o > block_max) return -1;
        o = next;
      }
      pos += size;
      if (block_sum) {
        if (n - pos < 4) return -1;
        pos += 4;
      }
    }
    if (content_sum) {
      if (n - pos < 4) return -1;
      pos += 4;
    }
    if (declared >= 0 && declared != o - frame_start) return -1;
  }
  return o;
}

// frames: 4 x nframes long longs: source offset, source size, output address, output capacity. Each
// frame has its own output address (a column's place in the table, or a place in a scratch array), so
// frames of one launch may go anywhere; the frame writes only [address, address + capacity).
// produced[f]: bytes written for frame f, or -1 where it is corrupt.
extern "C" __global__ void lz4_frames(const u8* __restrict__ src, const i64* __restrict__ frames, int nframes,
                                      i64* __restrict__ produced) {
  __shared__ __align__(16) u8 rings[WARPS_PER_BLOCK][RING];
  u8* ring = rings[threadIdx.x >> 5];
  const int lane = threadIdx.x & 31;
  const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
  for (i64 f = warp; f < nframes; f += warps) {
    u8* out = (u8*)(unsigned long long)frames[2 * nframes + f];
    const i64 r = lz4_frames_one(src + frames[f], frames[nframes + f], out, frames[3 * nframes + f], ring, lane);
    if (lane == 0) produced[f] = r;
  }
}
