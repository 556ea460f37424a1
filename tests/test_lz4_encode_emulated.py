"""The GPU LZ4 compressor (kernels/lz4_encode.cu) run on the CPU under the SIMT emulation (tests/simt.py),
its blocks framed as io/arrow/codecs/device_deflate.py frames them: liblz4 (pyarrow's codec, the CPU
twin) must read every frame back to the same bytes, and the frames must keep the block format's end
rules (tests/lz4_blocks.py reads them by the book). CI has no GPU: this is where a change to the
kernel's parse is first checked. Small payloads: under emulation every warp vote is a barrier of 32 OS
threads. tests/test_lz4_encode.py runs the real kernel on a GPU with larger data.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import simt
from lz4_blocks import check_frame

from pystrom.io.arrow.codecs.device_deflate import FrameLayout, chunk_table

pytestmark = pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return simt.Emulated("lz4_encode", tmp_path_factory.mktemp("lz4_encode"))


def _payloads() -> dict[str, bytes]:
    rng = np.random.default_rng(11)
    noise = rng.integers(0, 256, 600, dtype=np.uint8).tobytes()
    return {
        "one byte": b"a",
        "12 bytes, too short for a match": b"abcabcabcabc",
        "13 bytes": b"abcdabcdabcda",
        "zeros, one whole chunk": bytes(1 << 16),
        "zeros, a chunk and one byte": bytes((1 << 16) + 1),
        "random, stored raw": rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        "small int64s": rng.integers(0, 50, 1500).astype(np.int64).tobytes(),
        "runs of int32": np.repeat(rng.integers(0, 1000, 60), 37).astype(np.int32).tobytes(),
        "period 16 over two chunks": (b"0123456789abcdef" * 4400)[:70_000],
        "sorted int64": np.arange(9000, dtype=np.int64).tobytes(),
        "literals then a long match": noise + noise + b"tail of it",
        "a repeat to the very end": b"xyz" + b"abcd" * 300,
        "a hash shared within a round": (b"ABCDEFGH" + bytes(24)) * 40,
    }


def _compress(encoder, buffers: list[bytes], blocks: int = 2) -> tuple[list, np.ndarray]:
    """The kernel over the buffers laid back to back, then framed as lz4_frames_device frames them (the
    gather done here with NumPy: copy_out's CPU twin)."""
    sizes = np.array([len(b) for b in buffers], dtype=np.int64)
    offsets = np.cumsum(sizes) - sizes
    src = np.frombuffer(b"".join(buffers) + bytes(8), dtype=np.uint8).copy()
    owner, chunk_src, chunk_size, chunk_dst = chunk_table(offsets, sizes)
    n = len(owner)
    scratch = np.full(int(chunk_dst[-1] + chunk_size[-1] + 4) + 64, 0xEE, dtype=np.uint8)
    table = np.concatenate([chunk_src, chunk_size, chunk_dst]).astype(np.int64)
    block = np.full(n, -7, dtype=np.int64)
    encoder.launch_grid("lz4_encode", (blocks, 1), (src, scratch, table, np.int32(n), block), threads=128)
    assert (block >= 5).all() and (block <= chunk_size + 4).all()
    assert (scratch[-64:] == 0xEE).all(), "nothing written past the scratch"
    layout = FrameLayout.of(owner, block, sizes)
    host = np.zeros(layout.total, dtype=np.uint8)
    for c in np.flatnonzero(layout.kept[owner]).tolist():
        at, size = int(layout.block_at[c]), int(block[c])
        host[at : at + size] = scratch[chunk_dst[c] : chunk_dst[c] + size]
    spans = layout.finish(host)
    return [None if s is None else host[s[0] : s[0] + s[1]].tobytes() for s in spans], block


def _check_round_trips(encoder) -> None:
    payloads = _payloads()
    frames, _ = _compress(encoder, list(payloads.values()))
    for (name, payload), frame in zip(payloads.items(), frames):
        if frame is None:
            assert name in ("one byte", "12 bytes, too short for a match", "13 bytes", "random, stored raw"), name
            continue
        assert len(frame) < len(payload), name
        got = pa.decompress(frame, decompressed_size=len(payload), codec="lz4", asbytes=True)
        assert got == payload, name
        assert check_frame(frame) == payload, name


def _check_worked_blocks(encoder) -> None:
    """Blocks as a one-position-at-a-time scan makes them, worked out by hand from the block format:

    - 1,000 zero bytes: a literal, a match of offset 1 up to the last 5 bytes (994 bytes: 4 + 15 +
      255 + 255 + 255 + 210), and the 5 literals;
    - ``ABCDEFGH`` four times and 12 other bytes: 8 literals, a match of offset 8 (found within the first
      round of 32 positions) and length 24 (4 + 15 + 5), 12 literals."""
    cases = {
        bytes(1000): bytes([0x1F, 0, 1, 0, 255, 255, 255, 210, 0x50, 0, 0, 0, 0, 0]),
        b"ABCDEFGH" * 4 + b"ijklmnopqrst": b"\x8fABCDEFGH\x08\x00\x05\xc0ijklmnopqrst",
    }
    frames, _ = _compress(encoder, list(cases))
    for frame, block in zip(frames, cases.values()):
        assert frame is not None and frame[7:] == len(block).to_bytes(4, "little") + block + bytes(4)


def test_liblz4_reads_every_frame_back(encoder):
    _check_round_trips(encoder)


def test_blocks_worked_out_by_hand(encoder):
    _check_worked_blocks(encoder)


def test_compressible_payloads_shrink_about_as_much_as_liblz4(encoder):
    payloads = {k: v for k, v in _payloads().items() if len(v) > 1000 and not k.startswith("random")}
    frames, _ = _compress(encoder, list(payloads.values()))
    codec = pa.Codec("lz4")
    for (name, payload), frame in zip(payloads.items(), frames):
        theirs = len(codec.compress(payload, asbytes=True))
        assert frame is not None and len(frame) <= 1.25 * theirs + 16, (name, len(frame), theirs)


def test_the_output_does_not_depend_on_the_grid(encoder):
    payloads = list(_payloads().values())
    one, _ = _compress(encoder, payloads, blocks=1)
    three, _ = _compress(encoder, payloads, blocks=3)
    assert one == three


def test_a_chunk_that_does_not_shrink_is_stored_raw_inside_a_frame_that_does(encoder):
    rng = np.random.default_rng(5)
    payload = rng.integers(0, 256, 1 << 16, dtype=np.uint8).tobytes() + bytes(1 << 16)
    (frame,), block = _compress(encoder, [payload])
    assert block.tolist()[0] == 4 + (1 << 16)  # the random chunk as it is
    assert frame[7:11] == ((1 << 16) | 0x80000000).to_bytes(4, "little")
    assert pa.decompress(frame, decompressed_size=len(payload), codec="lz4", asbytes=True) == payload
    assert check_frame(frame) == payload


# Planted bugs, each of which the tests above must notice (the end rules are what liblz4 is lenient about).
MUTANTS = {
    "a match into the last 5 bytes": ("q < match_end &&", "q < n &&"),
    "a match starting too near the end": ("const i64 last_start = n - MFLIMIT;", "const i64 last_start = n - 8;"),
    "a hash collision taken for a match": ("cand < p && load32(in + cand) == seq", "cand < p"),
    "the round's lower lanes ignored": ("const u32 lower = same_hash", "const u32 lower = 0 & same_hash"),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_planted_bug_is_caught(name, tmp_path):
    mutant = simt.Emulated("lz4_encode", tmp_path, mutant=MUTANTS[name])
    with pytest.raises((AssertionError, OSError)):  # OSError: liblz4 refused a frame
        _check_round_trips(mutant)
        _check_worked_blocks(mutant)
