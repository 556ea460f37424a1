"""pystrom's LZ4 frame decoder (``_core.lz4_frame_decode``, csrc/lz4_size.cpp), which the CPU backend uses
for LZ4_FRAME bodies, against pyarrow's codec (liblz4) as the reference, and against hostile frames.

Hostile frames run in a subprocess: every truncation and every single-byte change of small frames must
give -1, -2 or a size, never a crash, and wherever the decoder accepts a frame the size-only walk
(``_core.lz4_frame_size``, the same walk writing nothing) must agree with it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from pystrom import _core


def _inputs() -> list[bytes]:
    rng = np.random.default_rng(7)
    out = [b"", b"x", b"abcd" * 3]
    out += [rng.random(n).tobytes() for n in (1, 100, 9000, 70_000)]  # stored blocks
    out += [np.arange(n, dtype=np.int64).tobytes() for n in (10, 70_000, 300_000)]  # 8-byte sequences
    out += [bytes(n) for n in (5, 65_536, 65_537, 1_000_000)]  # long matches, period 1
    out += [(bytes(range(p)) * (200_000 // p + 1))[:200_000] for p in (1, 2, 3, 5, 7, 8, 9, 16, 255)]
    out += [rng.integers(0, 4, 300_000, dtype=np.uint8).tobytes()]  # short literals and matches mixed
    text = b" ".join(rng.choice([b"alpha", b"beta", b"gamma", b"delta"], 100_000))
    out += [text]
    return out


@pytest.mark.parametrize("level", [None, 1, 9])
def test_decode_equals_liblz4(level):
    codec = pa.Codec("lz4") if level is None else pa.Codec("lz4", compression_level=level)
    for data in _inputs():
        frame = codec.compress(data, asbytes=True)
        dst = np.full(len(data) + 64, 0xEE, dtype=np.uint8)
        got = _core.lz4_frame_decode(frame, dst[: len(data)])
        assert got == len(data) == _core.lz4_frame_size(frame)
        assert dst[:got].tobytes() == data
        assert (dst[len(data) :] == 0xEE).all()  # nothing past the place given
        if data:  # a place one byte short: -2, nothing written past it, and the walk says how much
            short = np.full(len(data) + 63, 0xEE, dtype=np.uint8)
            assert _core.lz4_frame_decode(frame, short[: len(data) - 1]) == -2
            assert (short[len(data) - 1 :] == 0xEE).all()


def test_declared_content_size_is_checked():
    data = np.arange(5000, dtype=np.int64).tobytes()
    frame = pa.Codec("lz4").compress(data, asbytes=True)
    assert not frame[4] & 0x08  # pyarrow's frames declare no content size: add one (the header checksum is not read)

    def declaring(size: int) -> bytes:
        return frame[:4] + bytes([frame[4] | 0x08, frame[5]]) + size.to_bytes(8, "little") + frame[6:]

    dst = np.empty(len(data), dtype=np.uint8)
    assert _core.lz4_frame_decode(declaring(len(data)), dst) == len(data) and dst.tobytes() == data
    assert _core.lz4_frame_decode(declaring(len(data) - 8), dst) == -1
    assert _core.lz4_frame_decode(declaring(len(data) + 8), np.empty(len(data) + 8, np.uint8)) == -1


def test_refusals():
    data = bytes(range(256)) * 40
    frame = bytearray(pa.Codec("lz4").compress(data, asbytes=True))
    dst = np.empty(len(data), dtype=np.uint8)
    bad_magic = bytes([0]) + bytes(frame[1:])
    assert _core.lz4_frame_decode(bad_magic, dst) == -1
    assert _core.lz4_frame_decode(bytes(frame) + b"\x00", dst) == -1  # bytes after the frame
    assert _core.lz4_frame_decode(bytes(frame[:-1]), dst) == -1  # no end mark
    with pytest.raises((ValueError, BufferError)):
        _core.lz4_frame_decode(bytes(frame), bytes(len(data)))  # a read-only place


_HOSTILE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import pyarrow as pa
    from pystrom import _core

    rng = np.random.default_rng(int(sys.argv[1]))
    seeds = [np.arange(3000, dtype=np.int64).tobytes(), bytes(range(7)) * 900, rng.random(500).tobytes(),
             rng.integers(0, 3, 5000, dtype=np.uint8).tobytes()]
    cases = 0
    for data in seeds:
        frame = pa.Codec("lz4").compress(data, asbytes=True)
        mutants = [frame[:k] for k in range(len(frame))]
        for at in range(len(frame)):
            for v in (0, 0xFF, frame[at] ^ 0x80, int(rng.integers(256))):
                mutants.append(frame[:at] + bytes([v]) + frame[at + 1 :])
        for m in mutants:
            for cap in (len(data), len(data) // 2, 0):
                dst = np.empty(cap, dtype=np.uint8)
                got = _core.lz4_frame_decode(m, dst)
                walk = _core.lz4_frame_size(m)
                assert got >= -2, got
                assert got < 0 or (got <= cap and walk == got), (got, walk, cap)
                cases += 1
    print(cases)
    """
)


def test_hostile_frames_never_crash():
    proc = subprocess.run([sys.executable, "-c", _HOSTILE, "3"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the decoder died or disagreed (code {proc.returncode}): {proc.stderr[-2000:]}"
    assert int(proc.stdout.split()[-1]) > 50_000


def test_many_frames_in_one_call_as_one_at_a_time():
    """``lz4_frames_decode`` (the CPU inflate's call for a task's frames) gives what ``lz4_frame_decode``
    gives frame by frame: the bytes produced, the real size where a cap is too small or 0, -1 where a frame
    is malformed; only the frames asked for, each into its own place."""
    codec = pa.Codec("lz4")
    data = _inputs()
    frames = [codec.compress(d, asbytes=True) for d in data] + [b"", b"\x04\x22\x4d\x18garbage"]
    wants = [len(d) for d in data] + [0, 10]
    caps = [w if k % 3 else max(0, w - 1) for k, w in enumerate(wants)]  # every third one short a byte
    src = np.frombuffer(b"".join(frames), dtype=np.uint8)
    sizes = np.array([len(f) for f in frames], dtype=np.int64)
    offsets = np.cumsum(sizes) - sizes
    outs = [np.full(c + 8, 0xEE, dtype=np.uint8) for c in caps]
    which = np.arange(len(frames), dtype=np.int64)[::-1].copy()
    produced = np.full(len(frames), -9, dtype=np.int64)
    _core.lz4_frames_decode(src, offsets, sizes, np.array([o.ctypes.data for o in outs], dtype=np.int64),
                            np.array(caps, dtype=np.int64), which, produced)  # fmt: skip
    for f, cap, out, got in zip(frames, caps, outs, produced.tolist()):
        alone = np.full(cap + 8, 0xEE, dtype=np.uint8)
        want = _core.lz4_frame_decode(f, alone[:cap]) if cap else -2
        assert got == (_core.lz4_frame_size(f) if want == -2 else want)
        assert out.tobytes() == alone.tobytes()
    with pytest.raises(IndexError):
        _core.lz4_frames_decode(src, offsets, sizes + 10**9, offsets, sizes, which, produced)
