"""The GPU ZSTD decoder (kernels/zstd.cu) run on the CPU under the SIMT emulation (tests/simt.py): against
libzstd (pyarrow's codec, its CPU twin) on the frames it made at several levels, and on the hand-built and
damaged frames of tests/zstd_cases.py against the host structure check and libzstd. CI has no GPU: this
is where a change to the kernel's parsing of hostile frames is first checked, each guard with a planted
bug (a mutant) that the comparison must catch. tests/test_zstd_kernel.py runs the real kernel on a GPU.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
import simt
import zstd_cases as zc

from pystrom.io.arrow.codecs.host import check_zstd

pytestmark = pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")

FILL = 0xEE


@pytest.fixture(scope="module")
def zstd(tmp_path_factory):
    return simt.Emulated("zstd", tmp_path_factory.mktemp("zstd"))


def _run(emulated, cases: list[tuple[bytes, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """io/arrow/codecs/device.py's launch of ``cases`` (frame, claim), host addresses for the outputs, each
    output between 64 bytes of FILL: (produced, dst, where each output starts, whether the fill held)."""
    src_sizes = np.array([len(f) for f, _ in cases], dtype=np.int64)
    src_offsets = np.concatenate([[0], np.cumsum(src_sizes)[:-1]]).astype(np.int64)
    claims = np.array([c for _, c in cases], dtype=np.int64)
    room = (claims + 63) // 64 * 64 + 64
    at = (64 + np.concatenate([[0], np.cumsum(room)[:-1]])).astype(np.int64)
    src = np.frombuffer(b"".join(f for f, _ in cases) + bytes(8), dtype=np.uint8).copy()
    dst = np.full(int(at[-1] + room[-1]), FILL, dtype=np.uint8)
    table = np.concatenate([src_offsets, src_sizes, dst.ctypes.data + at, claims]).astype(np.int64)
    produced = np.full(len(cases), -7, dtype=np.int64)
    emulated.launch_grid("zstd_frames", (2, 1), (src, table, np.int32(len(cases)), produced), threads=128)
    starts, ends = [0, *(at + claims).tolist()], [*at.tolist(), len(dst)]
    held = all((dst[s:e] == FILL).all() for s, e in zip(starts, ends))
    return produced, dst, at, held


def _libzstd(frame: bytes, claim: int) -> bytes | None:
    try:
        return pa.Codec("zstd").decompress(frame, decompressed_size=claim, asbytes=True)
    except (pa.ArrowException, OSError, ValueError):
        return None


def _payloads() -> list[bytes]:
    rng = np.random.default_rng(5)
    return [
        b"",
        b"a",
        b"hello hello hello hello",
        bytes(1000),
        rng.integers(0, 256, 3000, dtype=np.uint8).tobytes(),  # raw blocks
        np.arange(2000, dtype=np.int64).tobytes(),  # many short matches
        rng.random(3000).tobytes(),  # Huffman-coded literals, four streams
        rng.integers(0, 20, 4000).astype(np.int32).tobytes(),
        b"The quick brown fox jumps over the lazy dog. " * 50,
        rng.random(40_000).tobytes(),  # 320 KB: three blocks
        np.repeat(rng.integers(0, 1000, 600), 97).astype(np.int32).tobytes(),  # long overlapping matches
        rng.integers(0, 4, 150_000, dtype=np.uint8).tobytes(),  # a Huffman tree of few symbols, two blocks
    ]


@pytest.mark.parametrize("level", [1, 3, 19])
def test_kernel_matches_libzstd(zstd, level):
    payloads = _payloads()
    codec = pa.Codec("zstd", compression_level=level)
    produced, dst, at, held = _run(zstd, [(codec.compress(p, asbytes=True), len(p)) for p in payloads])
    assert produced.tolist() == [len(p) for p in payloads]
    for p, a in zip(payloads, at.tolist()):
        assert dst[a : a + len(p)].tobytes() == p
    assert held, "nothing written outside a frame's output"


def _one_sequence(literals: bytes, ll_code: int, of_code: int, of_bits: int, ml_code: int, claim: int,
                  spare: int = 0) -> tuple:  # fmt: skip
    """A frame of one compressed block: raw literals, one sequence whose three codes have RLE tables (so
    its bitstream holds only the offset's ``of_code`` extra bits, ``of_bits``, under the end mark, and
    ``spare`` bits that nothing reads above them)."""
    stream = bytes([(1 << (of_code + spare)) | of_bits])
    body = bytes([len(literals) << 3]) + literals + bytes([1, 0x54, ll_code, of_code, ml_code]) + stream
    # no content size, a 1 KiB window (a single-segment frame's blocks may not exceed its content size)
    header = zc.MAGIC + bytes([0x00, 0x00]) + (1 | 2 << 1 | len(body) << 3).to_bytes(3, "little")
    return header + body, claim


# (name, frame, claim): "abcdef", 4 literals, a match of 4 at Offset_Value 4 + bits (offset = value - 3)
SEQUENCES = [
    ("match 4 back", *_one_sequence(b"abcdef", 4, 2, 3, 1, 10)),  # abcd + abcd + ef
    ("match 1 back, overlapping", *_one_sequence(b"abcdef", 4, 2, 0, 1, 10)),  # abcd + dddd + ef
    ("match 5 back, 4 written", *_one_sequence(b"abcdef", 4, 3, 0, 1, 10)),  # before the output: refused
    ("more literals than the block has", *_one_sequence(b"abc", 4, 2, 0, 1, 7)),
    ("claim below the output", *_one_sequence(b"abcdef", 4, 2, 3, 1, 9)),
    ("a match past the claim", *_one_sequence(b"abcdef", 4, 2, 3, 1, 7)),
    ("a bit left in the bitstream", *_one_sequence(b"abcdef", 4, 2, 3, 1, 10, spare=1)),
]


def test_hand_built_sequences_decode_as_libzstd_decodes_them(zstd):
    """The sequences above (the kernel's reading of offsets, lengths and repeats at their simplest) against
    libzstd: the same bytes where it decodes them, a refusal where it refuses."""
    want = [b"abcdabcdef", b"abcddddde" + b"f", None, None, None, None, None]
    assert [_libzstd(f, c) for _, f, c in SEQUENCES] == want
    produced, dst, at, held = _run(zstd, [(f, c) for _, f, c in SEQUENCES])
    assert produced.tolist()[:2] == [10, 10] and (produced[2:] == -1).all()
    assert [dst[a : a + 10].tobytes() for a in at[:2].tolist()] == want[:2]
    assert held


def _hostile(emulated) -> tuple[dict[str, list], list[int]]:
    """Every hand-built frame and 500 damaged ones (seeded) through the kernel; what went wrong, by kind,
    and what each produced."""
    damaged = [c for c in zc.damaged() if c[2] <= 1 << 22]
    cases = [(n, f, c) for n, f, c, _ in zc.built() if c <= 1 << 22] + SEQUENCES
    cases += random.Random(7).sample(damaged, 500)
    produced, dst, at, held = _run(emulated, [(f, c) for _, f, c in cases])
    wrong: dict[str, list] = {"outside": [] if held else ["the fill around the outputs changed"], "value": [],
                              "check refuses, kernel decodes": [], "kernel decodes, libzstd refuses": [],
                              "kernel and libzstd differ": [], "stricter": []}  # fmt: skip
    for (name, frame, claim), got, a in zip(cases, produced.tolist(), at.tolist()):
        code = int(check_zstd(np.frombuffer(frame, np.uint8), np.zeros(1, np.int64), np.array([len(frame)]),
                              np.array([claim]))[0])  # fmt: skip
        ref = _libzstd(frame, claim)
        if got not in (-1, -2) and not 0 <= got <= claim:
            wrong["value"].append((name, got))
        if code and got == claim:
            wrong["check refuses, kernel decodes"].append(name)
        if got == claim and not code:
            if ref is None:
                wrong["kernel decodes, libzstd refuses"].append(name)
            elif dst[a : a + claim].tobytes() != ref:
                wrong["kernel and libzstd differ"].append(name)
        if ref is not None and not code and got != claim:
            wrong["stricter"].append(name)  # allowed: corrupt inside, and refused here (see the next test)
    return wrong, produced.tolist()


def test_hostile_frames_are_refused_or_decoded_as_libzstd_decodes_them(zstd):
    """Every frame the structure check refuses, the kernel refuses; a damaged frame it decodes, libzstd
    decodes to the same bytes; nothing lands outside a frame's output. The kernel refuses some damaged
    frames libzstd decodes (to garbage: Arrow's frames carry no checksum), e.g. a Huffman stream not
    consumed exactly, which libzstd's two-symbol decoder lets pass at a stream's last symbol."""
    wrong, _ = _hostile(zstd)
    stricter = wrong.pop("stricter")
    assert not any(wrong.values()), wrong
    assert len(stricter) < 40, stricter


# each guard of the kernel, removed: the comparison above must notice, or (the two exactness checks,
# which refuse only frames libzstd decodes to garbage) more frames must decode than with it
_MUTANTS = [
    ("if (offset > (u64)o) return -1;", ";"),  # a match from before the frame's output
    ("if (match > limit - o - lits) return -1;", ";"),  # a write past the literals not yet read, or the claim
    ("  return pos == 0;\n}", "  return true;\n}"),  # a Huffman stream not consumed exactly
    ("if (bs.pos != 0) return -1;", ";"),  # the sequences' bitstream not consumed exactly
    ("if (lits > regen - used) return -1;", ";"),  # more literals than the block has
]


@pytest.fixture(scope="module")
def refused(zstd):
    return _hostile(zstd)[1]


@pytest.mark.parametrize("mutant", _MUTANTS, ids=[m[0][:40] for m in _MUTANTS])
def test_each_guard_is_needed(mutant, tmp_path, refused):
    wrong, produced = _hostile(simt.Emulated("zstd", tmp_path, mutant))
    wrong.pop("stricter")
    assert any(wrong.values()) or produced != refused, f"removing {mutant[0]!r} went unnoticed"


def test_a_frame_with_a_checksum_is_left_to_the_host(zstd):
    """The content checksum flag: -2 before anything is written (the host's libzstd verifies it)."""
    frame = bytearray(zc.compress(b"checksum me " * 100, 3))
    frame[4] |= 4
    produced, dst, _, held = _run(zstd, [(bytes(frame) + bytes(4), 1200)])
    assert produced.tolist() == [-2] and held
    assert (dst == FILL).all()
