"""The GPU LZ4-frame decoder (kernels/lz4.cu) against liblz4 (pyarrow's codec), on frames liblz4 made.

Arrow's LZ4_FRAME bodies link their 64 KiB blocks (a match may reach into the previous block), which
is why the kernel exists; the data below makes such matches, overlapping matches (runs, short
periods), stored (incompressible) blocks, and every size around the block boundaries. Corrupt frames
must give -1 or some size, never a fault or a write outside the frame's output.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from conftest import needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]


@pytest.fixture
def gpu_backend():
    from pystrom.memory.backend import resolve_device

    return resolve_device("cuda")


def _payloads() -> list[bytes]:
    rng = np.random.default_rng(7)
    out = [b"", b"a", b"ab" * 3, bytes(70_000)]
    out.append(rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes())  # stored blocks
    out.append(rng.integers(0, 50, 300_000).astype(np.int64).tobytes())  # literals and short matches
    out.append(np.repeat(rng.integers(0, 1000, 5000), 97).astype(np.int32).tobytes())  # long runs
    out.append((b"0123456789abcdef" * 9000)[:131_073])  # period 16 across the 64 KiB block boundary
    text = rng.choice(np.frombuffer(b"the quick brown fox jumps over a lazy dog ", dtype=np.uint8), 400_000)
    out.append(text.tobytes())
    for n in (65_535, 65_536, 65_537, 1 << 20):
        out.append(np.arange(n, dtype=np.uint8).tobytes())
    out.append(np.cumsum(rng.normal(size=250_000)).astype(np.float64).tobytes())  # compresses barely
    return out


def _frames(cp, payloads, compressed):
    from pystrom.io.arrow.codecs.decompress import Frames

    src_sizes = np.array([len(c) for c in compressed], dtype=np.int64)
    src_offsets = np.concatenate([[0], np.cumsum(src_sizes)[:-1]]).astype(np.int64)
    dst_sizes = np.array([len(p) for p in payloads], dtype=np.int64)
    dst_offsets = np.concatenate([[0], np.cumsum((dst_sizes + 63) // 64 * 64)[:-1]]).astype(np.int64)
    src = cp.asarray(np.frombuffer(b"".join(compressed), dtype=np.uint8).copy())
    dst = cp.full(int(dst_offsets[-1] + dst_sizes[-1]) + 64, 0xEE, dtype=cp.uint8)
    return Frames("lz4_frame", src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes)


def test_kernel_matches_liblz4(gpu_backend):
    from pystrom.io.arrow.codecs.decompress import inflate

    cp = gpu_backend.xp
    codec = pa.Codec("lz4")
    payloads = _payloads()
    compressed = [codec.compress(p, asbytes=True) for p in payloads]
    frames = _frames(cp, payloads, compressed)
    with gpu_backend.activate():
        produced = inflate(gpu_backend, frames)
        dst = frames.dst.get()
    assert produced.tolist() == [len(p) for p in payloads]
    for p, off in zip(payloads, frames.dst_offsets.tolist()):
        assert dst[off : off + len(p)].tobytes() == p
    # nothing written past a frame's output: the padding keeps its fill
    ends = frames.dst_offsets + frames.dst_sizes
    for end, nxt in zip(ends.tolist(), [*frames.dst_offsets[1:].tolist(), len(dst) - 64]):
        assert (dst[end:nxt] == 0xEE).all()


def test_output_capacity_is_never_exceeded(gpu_backend):
    from pystrom.io.arrow.codecs.decompress import inflate

    cp = gpu_backend.xp
    payload = bytes(range(256)) * 2000
    compressed = [pa.Codec("lz4").compress(payload, asbytes=True)]
    frames = _frames(cp, [payload[:1000]], compressed)  # the claimed size is too small
    with gpu_backend.activate():
        produced = inflate(gpu_backend, frames)
        assert produced.tolist() == [-1]
        assert (frames.dst[1000:].get() == 0xEE).all()


def test_corrupt_frames_never_fault(gpu_backend):
    from pystrom.io.arrow.codecs.decompress import inflate

    cp = gpu_backend.xp
    rng = np.random.default_rng(11)
    base = rng.integers(0, 20, 200_000).astype(np.int32).tobytes()
    good = pa.Codec("lz4").compress(base, asbytes=True)
    payloads, compressed = [], []
    for _ in range(300):
        bad = bytearray(good)
        for _ in range(int(rng.integers(1, 8))):
            bad[int(rng.integers(0, len(bad)))] = int(rng.integers(0, 256))
        cut = int(rng.integers(len(bad) // 2, len(bad) + 1))
        compressed.append(bytes(bad[:cut]))
        payloads.append(base)
    frames = _frames(cp, payloads, compressed)
    with gpu_backend.activate():
        produced = inflate(gpu_backend, frames)
        cp.cuda.get_current_stream().synchronize()
    assert ((produced == -1) | ((produced >= 0) & (produced <= len(base)))).all()
    assert (produced == -1).any()


def test_zstd_batch_matches_libzstd(gpu_backend):
    from pystrom.io.arrow.codecs.decompress import inflate

    cp = gpu_backend.xp
    codec = pa.Codec("zstd")
    payloads = _payloads()
    compressed = [codec.compress(p, asbytes=True) for p in payloads]
    frames = _frames(cp, payloads, compressed)
    frames.codec = "zstd"
    with gpu_backend.activate():
        produced = inflate(gpu_backend, frames)
        dst = frames.dst.get()
    assert produced.tolist() == [len(p) for p in payloads]
    for p, off in zip(payloads, frames.dst_offsets.tolist()):
        assert dst[off : off + len(p)].tobytes() == p
    # one flipped frame: reported as that frame, the others still right
    bad = bytearray(compressed[5])
    bad[len(bad) // 2] ^= 0xFF
    bad[len(bad) // 3] ^= 0x55
    compressed[5] = bytes(bad[: len(bad) // 2])
    frames = _frames(cp, payloads, compressed)
    frames.codec = "zstd"
    with gpu_backend.activate():
        produced = inflate(gpu_backend, frames)
    assert produced[5] != len(payloads[5])
    assert [int(x) for i, x in enumerate(produced) if i != 5] == [len(p) for i, p in enumerate(payloads) if i != 5]


def test_frames_into_arrays_of_their_own(gpu_backend):
    """Each frame to its own address (dst_arrays: how a column is inflated in place), in reverse
    order through one buffer; nothing written between them; the sizes left on the device (wait=False)."""
    from pystrom.io.arrow.codecs.decompress import inflate

    cp = gpu_backend.xp
    codec = pa.Codec("lz4")
    payloads = _payloads()
    compressed = [codec.compress(p, asbytes=True) for p in payloads]
    frames = _frames(cp, payloads, compressed)
    places = np.cumsum([0, *[(len(p) + 63) // 64 * 64 + 64 for p in payloads[::-1]]])[:-1][::-1]
    table = cp.full(int(places[0]) + len(payloads[0]) + 64, 0xEE, dtype=cp.uint8)
    frames.dst_arrays = [table[int(at) : int(at) + len(p)] for at, p in zip(places, payloads)]
    frames.dst_arrays[1] = None  # one frame still to its place in dst
    with gpu_backend.activate():
        produced = inflate(gpu_backend, frames, wait=False)
        assert isinstance(produced, cp.ndarray)
        produced = produced.get()
        got, dst = table.get(), frames.dst.get()
    assert produced.tolist() == [len(p) for p in payloads]
    written = np.zeros(len(got), dtype=bool)
    for i, (p, at) in enumerate(zip(payloads, places.tolist())):
        if i == 1:
            off = int(frames.dst_offsets[1])
            assert dst[off : off + len(p)].tobytes() == p
            continue
        assert got[at : at + len(p)].tobytes() == p
        written[at : at + len(p)] = True
    assert (got[~written] == 0xEE).all()
