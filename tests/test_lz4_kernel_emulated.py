"""The GPU LZ4-frame decoder (kernels/lz4.cu) run on the CPU under the SIMT emulation (tests/simt.py):
against liblz4 (pyarrow's codec) on the frames it made, and against the CPU decoder (csrc/lz4_size.cpp,
its twin) on corrupt frames, byte for byte. CI has no GPU: this is where a change to the kernel's
parsing of hostile frames is first checked. Small payloads: under emulation every __syncwarp is a
barrier of 32 OS threads. tests/test_lz4_kernel.py runs the real kernel on a GPU with larger data.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import simt

from pystrom.io.arrow.codecs.decompress import Frames
from pystrom.io.arrow.codecs.host import inflate_host

pytestmark = pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")

FILL = 0xEE


@pytest.fixture(scope="module")
def lz4(tmp_path_factory):
    return simt.Emulated("lz4", tmp_path_factory.mktemp("lz4"))


def _payloads() -> list[bytes]:
    rng = np.random.default_rng(7)
    return [
        b"",
        b"a",
        b"ab" * 3,
        bytes(70_000),  # a match reaching into the previous 64 KiB block
        rng.integers(0, 256, 3_000, dtype=np.uint8).tobytes(),  # a stored (incompressible) block
        rng.integers(0, 50, 1_500).astype(np.int64).tobytes(),  # literals and short matches
        np.repeat(rng.integers(0, 1000, 60), 37).astype(np.int32).tobytes(),  # runs: overlapping matches
        (b"0123456789abcdef" * 4200)[:65_541],  # period 16 across the block boundary
    ]


def _frames(payloads: list[bytes], compressed: list[bytes]) -> Frames:
    src_sizes = np.array([len(c) for c in compressed], dtype=np.int64)
    src_offsets = np.concatenate([[0], np.cumsum(src_sizes)[:-1]]).astype(np.int64)
    dst_sizes = np.array([len(p) for p in payloads], dtype=np.int64)
    dst_offsets = np.concatenate([[0], np.cumsum((dst_sizes + 63) // 64 * 64)[:-1]]).astype(np.int64)
    src = np.frombuffer(b"".join(compressed) + bytes(8), dtype=np.uint8).copy()
    dst = np.full(int(dst_offsets[-1] + dst_sizes[-1]) + 64, FILL, dtype=np.uint8)
    return Frames("lz4_frame", src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes)


def _run_kernel(lz4, frames: Frames) -> np.ndarray:
    """inflate_device's launch (io/arrow/codecs/device.py), with host addresses for the outputs."""
    n = len(frames.src_offsets)
    base = frames.dst.ctypes.data
    addresses = base + frames.dst_offsets
    table = np.concatenate([frames.src_offsets, frames.src_sizes, addresses, frames.dst_sizes]).astype(np.int64)
    produced = np.full(n, -7, dtype=np.int64)
    lz4.launch("lz4_frames", n * 32, (frames.src, table, np.int32(n), produced))
    return produced


def test_kernel_matches_liblz4(lz4):
    codec = pa.Codec("lz4")
    payloads = _payloads()
    frames = _frames(payloads, [codec.compress(p, asbytes=True) for p in payloads])
    produced = _run_kernel(lz4, frames)
    assert produced.tolist() == [len(p) for p in payloads]
    for p, off in zip(payloads, frames.dst_offsets.tolist()):
        assert frames.dst[off : off + len(p)].tobytes() == p
    ends = frames.dst_offsets + frames.dst_sizes
    for end, nxt in zip(ends.tolist(), [*frames.dst_offsets[1:].tolist(), len(frames.dst) - 64]):
        assert (frames.dst[end:nxt] == FILL).all(), "nothing written past a frame's output"


def test_a_claim_too_small_is_refused_without_writing_past_it(lz4):
    payload = bytes(range(256)) * 40
    frames = _frames([payload[:1000]], [pa.Codec("lz4").compress(payload, asbytes=True)])
    assert _run_kernel(lz4, frames).tolist() == [-1]
    assert (frames.dst[1000:] == FILL).all()


def test_corrupt_frames_decode_as_the_cpu_twin_decodes_them(lz4):
    """Mutated frames (bytes overwritten, cut short): the kernel's size or -1, and its bytes, equal the CPU
    decoder's (the one that reads LZ4 files on device="cpu"), and nothing lands outside a frame's output."""
    rng = np.random.default_rng(11)
    base = rng.integers(0, 20, 2_000).astype(np.int32).tobytes()
    good = pa.Codec("lz4").compress(base, asbytes=True)
    compressed = [good]
    for i in range(60):
        bad = bytearray(good)
        for _ in range(1 if i % 2 else int(rng.integers(1, 8))):
            bad[int(rng.integers(7, len(bad)))] = int(rng.integers(0, 256))
        compressed.append(bytes(bad if i % 2 else bad[: int(rng.integers(len(bad) // 2, len(bad) + 1))]))
    payloads = [base] * len(compressed)
    gpu, cpu = _frames(payloads, compressed), _frames(payloads, compressed)
    got = _run_kernel(lz4, gpu)
    want = inflate_host(cpu)
    assert got.tolist() == want.tolist()
    assert (got == -1).any() and (got == len(base)).sum() > 1  # the good frame, and some with a flipped byte
    for f in np.flatnonzero(got >= 0).tolist():
        lo = int(gpu.dst_offsets[f])
        assert gpu.dst[lo : lo + int(got[f])].tobytes() == cpu.dst[lo : lo + int(got[f])].tobytes()
    ends = gpu.dst_offsets + gpu.dst_sizes
    for end, nxt in zip(ends.tolist(), [*gpu.dst_offsets[1:].tolist(), len(gpu.dst) - 64]):
        assert (gpu.dst[end:nxt] == FILL).all()


_HEADER = bytes.fromhex("04224d18604082")  # magic, FLG (independent blocks, no sizes or checksums), BD, HC


def _frame(block: bytes) -> bytes:
    return _HEADER + len(block).to_bytes(4, "little") + block + bytes(4)


# (block, claimed output size, what a decoder must produce): sequences made by hand (token, literals,
# little-endian offset, length bytes); each breaks one rule at its edge, beside one that keeps it
_HOSTILE = [
    (bytes([0x13]) + b"a" + bytes([1, 0]) + bytes([0x50]) + b"aaxyz", 13, 13),  # valid: lit 1, match 7, lit 5
    (bytes([0x13]) + b"a" + bytes([2, 0]) + bytes([0x50]) + b"aaxyz", 13, -1),  # match from before the output
    (bytes([0x13]) + b"a" + bytes([0, 0]) + bytes([0x50]) + b"aaxyz", 13, -1),  # offset 0
    (bytes([0x13]) + b"a" + bytes([1, 0]) + bytes([0x50]) + b"aaxyz", 12, -1),  # the last literals past the claim
    (bytes([0x13]) + b"a" + bytes([1, 0]) + bytes([0x50]) + b"aaxyz", 7, -1),  # the match past the claim
    (bytes([0x50]) + b"aaxyz", 4, -1),  # literals past the claim
    (bytes([0x50]) + b"aaxy", 5, -1),  # literals past the block
    (bytes([0xF0, 255, 255]), 600, -1),  # a literal length running off the block
    (bytes([0x1F]) + b"a" + bytes([1, 0, 255]), 600, -1),  # a match length running off the block
    (bytes([0x13]) + b"a" + bytes([1]), 13, -1),  # an offset cut in half
]


def test_hand_made_hostile_blocks(lz4):
    """Each rule of the block format broken at its edge: the kernel gives the expected answer, the CPU
    decoder refuses the same frames, and nothing is written past a frame's claimed size."""
    payloads = [bytes(claim) for _, claim, _ in _HOSTILE]  # only the sizes matter
    compressed = [_frame(block) for block, _, _ in _HOSTILE]
    gpu, cpu = _frames(payloads, compressed), _frames(payloads, compressed)
    got = _run_kernel(lz4, gpu)
    assert got.tolist() == [want for _, _, want in _HOSTILE]
    # the CPU decoder refuses the same frames (a frame past its claim reports its real size there, for
    # the error message; the caller refuses any size but the claim)
    claims = np.array([claim for _, claim, _ in _HOSTILE])
    assert ((inflate_host(cpu) == claims) == (got == claims)).all()
    assert gpu.dst[: int(got[0])].tobytes() == cpu.dst[: int(got[0])].tobytes() == b"a" * 8 + b"aaxyz"
    ends = gpu.dst_offsets + gpu.dst_sizes
    for end, nxt in zip(ends.tolist(), [*gpu.dst_offsets[1:].tolist(), len(gpu.dst) - 64]):
        assert (gpu.dst[end:nxt] == FILL).all()
