"""ZSTD frames for tests/test_zstd_frames.py: good ones (pyarrow's zstd codec), hand-built ones for each
reason csrc/zstd_frame.cpp refuses a frame, and sweeps of damaged frames; plus the subprocess workers.

Workers (``python zstd_cases.py walk OUT.json``, ``python zstd_cases.py gpu OUT.json good|all``) run
every hostile frame through the host check or through ``_inflate_device`` and write what each
produced, so a signal or a hang fails the parent's test rather than killing pytest (nvCOMP's faults
poison the CUDA context of the process they happen in).
"""

from __future__ import annotations

import json
import sys

import numpy as np

MAGIC = bytes.fromhex("28b52ffd")
OK, TRUNCATED, BAD_MAGIC, SKIPPABLE, RESERVED_BIT, DICTIONARY, WINDOW = 0, 1, 2, 3, 4, 5, 6
CONTENT_SIZE, RESERVED_BLOCK, BLOCK_SIZE, TRAILING, UNREACHABLE, LITERALS, SEQUENCES = 7, 8, 9, 10, 11, 12, 13


def payloads() -> list[bytes]:
    """Empty, tiny, RLE-friendly, incompressible (raw blocks), multi-block compressible data."""
    rng = np.random.default_rng(23)
    return [
        b"",
        b"a",
        b"abcde",
        bytes(1000),
        bytes(300_000),  # RLE blocks across 128 KiB blocks
        rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes(),  # raw blocks
        rng.integers(0, 50, 300_000).astype(np.int64).tobytes(),  # compressed blocks, > 128 KiB
        np.repeat(rng.integers(0, 1000, 5000), 97).astype(np.int32).tobytes(),
        np.cumsum(rng.normal(size=40_000)).tobytes(),
        (b"the quick brown fox " * 9000)[:131_073],
    ]


def compress(data: bytes, level: int | None = None) -> bytes:
    import pyarrow as pa

    codec = pa.Codec("zstd") if level is None else pa.Codec("zstd", compression_level=level)
    return codec.compress(data, asbytes=True)


def _block(last: bool, kind: int, size: int) -> bytes:
    return (int(last) | kind << 1 | size << 3).to_bytes(3, "little")


def built() -> list[tuple[str, bytes, int, int]]:
    """(name, frame, claim, expected code) for frames written by hand, one per rule."""
    raw10 = _block(True, 0, 10) + b"0123456789"
    no_fcs = MAGIC + bytes([0x00, 0x00])  # window descriptor 0: 1 KiB window, no content size
    single = MAGIC + bytes([0x20, 10])  # single segment, 1-byte content size 10
    return [
        ("raw block, no content size", no_fcs + raw10, 10, OK),
        ("raw block, no content size, claim above", no_fcs + raw10, 11, UNREACHABLE),
        ("raw block, no content size, claim below", no_fcs + raw10, 9, UNREACHABLE),
        ("single segment raw", single + raw10, 10, OK),
        ("content size differs", single + raw10, 11, CONTENT_SIZE),
        ("rle block", MAGIC + bytes([0x20, 100]) + _block(True, 1, 100) + b"x", 100, OK),
        ("rle block, 2 blocks", no_fcs + _block(False, 1, 1000) + b"x" + _block(True, 1, 24) + b"y", 1024, OK),
        ("checksum present", MAGIC + bytes([0x24, 10]) + raw10 + b"\1\2\3\4", 10, OK),
        ("checksum missing", MAGIC + bytes([0x24, 10]) + raw10, 10, TRUNCATED),
        ("checksum short", MAGIC + bytes([0x24, 10]) + raw10 + b"\1\2", 10, TRUNCATED),
        ("dictionary id", MAGIC + bytes([0x21, 7, 10]) + raw10, 10, DICTIONARY),
        ("dictionary id 0", MAGIC + bytes([0x21, 0, 10]) + raw10, 10, DICTIONARY),
        ("reserved bit", MAGIC + bytes([0x28, 10]) + raw10, 10, RESERVED_BIT),
        ("window 2^41", MAGIC + bytes([0x00, 31 << 3]) + raw10, 10, WINDOW),
        ("block above window", no_fcs + _block(True, 0, 2000) + bytes(2000), 2000, BLOCK_SIZE),
        ("rle above window", no_fcs + _block(True, 1, 2000) + b"x", 2000, BLOCK_SIZE),
        (
            "block above 128 KiB",
            MAGIC + bytes([0x00, 10 << 3]) + _block(True, 0, 140_000) + bytes(140_000),
            140_000,
            BLOCK_SIZE,
        ),  # fmt: skip
        ("reserved block type", single + _block(True, 3, 10) + b"0123456789", 10, RESERVED_BLOCK),
        ("no last block", single + _block(False, 0, 10) + b"0123456789", 10, TRUNCATED),
        ("block past the end", no_fcs + _block(True, 0, 11) + b"0123456789", 10, TRUNCATED),
        ("trailing byte", single + raw10 + b"\0", 10, TRAILING),
        ("two frames", single + raw10 + single + raw10, 10, TRAILING),
        ("skippable frame", bytes.fromhex("502a4d18") + (4).to_bytes(4, "little") + b"abcd", 0, SKIPPABLE),
        ("skippable frame before a frame", bytes.fromhex("5a2a4d18") + bytes(4) + single + raw10, 10, SKIPPABLE),
        ("bad magic", bytes.fromhex("28b52ffe") + bytes([0x20, 10]) + raw10, 10, BAD_MAGIC),
        ("lz4 frame", bytes.fromhex("04224d18") + bytes(12), 10, BAD_MAGIC),
        ("empty", b"", 0, TRUNCATED),
        ("magic only", MAGIC, 0, TRUNCATED),
        ("header only", MAGIC + bytes([0x20, 0]), 0, TRUNCATED),
        (
            "treeless literals first",
            no_fcs + _block(True, 2, 6) + bytes([0x03 | 10 << 4, 0x40, 0, 0x80, 0, 1]),
            10,
            LITERALS,
        ),  # fmt: skip
        (
            "no sequences, extra byte",
            no_fcs + _block(True, 2, 13) + bytes([10 << 3]) + b"0123456789" + bytes([0, 0]),
            10,
            SEQUENCES,
        ),  # fmt: skip
        ("raw literals only", no_fcs + _block(True, 2, 12) + bytes([10 << 3]) + b"0123456789" + bytes([0]), 10, OK),
        (
            "repeat tables first",
            no_fcs + _block(True, 2, 11) + bytes([7 << 3]) + b"0123456" + bytes([1, 0xFC, 0x80]),
            10,
            SEQUENCES,
        ),  # fmt: skip
    ]


def damaged(seed: int = 5) -> list[tuple[str, bytes, int]]:
    """(name, frame, claim): every truncation and every header bit flip of small frames, random byte
    changes throughout, wrong claims, garbage after the frame."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 20, 3000).astype(np.int32).tobytes()
    out = []
    for level in (1, 19):
        good = compress(base, level)
        for k in range(len(good)):
            out.append((f"L{level} cut to {k}", good[:k], len(base)))
        for pos in range(min(len(good), 40)):
            for bit in range(8):
                bad = bytearray(good)
                bad[pos] ^= 1 << bit
                out.append((f"L{level} flip {pos}.{bit}", bytes(bad), len(base)))
        for i in range(300):
            bad = bytearray(good)
            for _ in range(int(rng.integers(1, 6))):
                bad[int(rng.integers(0, len(bad)))] = int(rng.integers(0, 256))
            out.append((f"L{level} bytes {i}", bytes(bad), len(base)))
        for claim in (0, 1, len(base) - 1, len(base) + 1, 2**40):
            out.append((f"L{level} claim {claim}", good, claim))
        out.append((f"L{level} trailing", good + b"\x00\x01", len(base)))
    return out


# ---------------------------------------------------------------------------------------------------
# workers (their own process)


def _all_cases() -> list[tuple[str, bytes, int]]:
    return [(n, f, c) for n, f, c, _ in built()] + damaged()


def walk_worker(out_path: str) -> None:
    """Every case through the host check, one at a time (a crash would name none: the parent sees it)."""
    from pystrom.io.arrow.codecs.host import check_zstd

    codes = []
    for _, frame, claim in _all_cases():
        src = np.frombuffer(frame, dtype=np.uint8)
        codes.append(int(check_zstd(src, np.zeros(1), np.array([len(frame)]), np.array([claim]))[0]))
    with open(out_path, "w") as f:
        json.dump(codes, f)


def gpu_worker(out_path: str, which: str) -> None:
    """The good frames (``which == "good"``) or every case plus the good frames (``"all"``) through
    ``_inflate_device`` in one batch; what each produced, whether its bytes equal libzstd's output, the
    claims of the frames the CPU codecs took, whether the padding between outputs kept its fill."""
    import pyarrow as pa

    from pystrom.io.arrow.codecs import device
    from pystrom.io.arrow.codecs.decompress import Frames
    from pystrom.io.arrow.codecs.device import _inflate_device
    from pystrom.memory.backend import resolve_device

    backend = resolve_device("cuda")
    cp = backend.xp
    good = [(f"good {i} L{lv}", compress(p, lv), len(p)) for i, p in enumerate(payloads()) for lv in (1, 19)]
    cases = good if which == "good" else _all_cases() + good
    cases = [c for c in cases if c[2] <= 1 << 22]  # the 2**40 claim would need that much dst
    frames = [f for _, f, _ in cases]
    claims = np.array([c for _, _, c in cases], dtype=np.int64)
    src_sizes = np.array([len(f) for f in frames], dtype=np.int64)
    src_offsets = np.concatenate([[0], np.cumsum((src_sizes + 63) // 64 * 64)[:-1]]).astype(np.int64)
    dst_offsets = np.concatenate([[0], np.cumsum((claims + 63) // 64 * 64)[:-1]]).astype(np.int64)
    src_host = np.zeros(int(src_offsets[-1] + src_sizes[-1]) + 64, dtype=np.uint8)
    for f, o in zip(frames, src_offsets.tolist()):
        src_host[o : o + len(f)] = np.frombuffer(f, dtype=np.uint8)
    results = []
    on_host = []  # frames the CPU codecs took (nvCOMP should take all good frames that claim bytes)
    real_on_host = device._on_host

    def spy(backend, frames, which):
        on_host.extend(int(frames.dst_sizes[i]) for i in which)
        return real_on_host(backend, frames, which)

    device._on_host = spy
    with backend.activate():
        src = cp.asarray(src_host)
        dst = cp.full(int(dst_offsets[-1] + claims[-1]) + 64, 0xEE, dtype=cp.uint8)
        frames = Frames("zstd", src, src_offsets, src_sizes, dst, dst_offsets, claims)
        produced = _inflate_device(backend, frames, dst.data.ptr + np.asarray(dst_offsets, dtype=np.int64))
        cp.cuda.Device().synchronize()
        host = dst.get()
    ends = (dst_offsets + claims).tolist()
    gaps = [*dst_offsets[1:].tolist(), len(host) - 64]
    untouched = all((host[e:g] == 0xEE).all() for e, g in zip(ends, gaps))
    for (name, frame, claim), p, o in zip(cases, produced.tolist(), dst_offsets.tolist()):
        try:
            ref = pa.Codec("zstd").decompress(frame, decompressed_size=claim, asbytes=True)
        except Exception:  # noqa: BLE001 - libzstd refuses it
            ref = None
        same = ref is not None and p == claim and host[o : o + claim].tobytes() == ref
        results.append({"name": name, "claim": claim, "produced": p, "libzstd": ref is not None, "same": same})
    with open(out_path, "w") as f:
        json.dump({"cases": results, "padding_untouched": bool(untouched), "on_host": on_host}, f)


if __name__ == "__main__":
    if sys.argv[1] == "walk":
        walk_worker(sys.argv[2])
    else:
        gpu_worker(sys.argv[2], sys.argv[3])
