"""The GPU ZSTD decoder (kernels/zstd.cu) on a GPU: read_arrow of ZSTD files through it against pyarrow,
many frames against libzstd, a frame with a content checksum left to the host, and the host path
(``gpu_zstd_decoder="host"``) still there. tests/test_zstd_kernel_emulated.py checks the kernel's
parsing of hostile frames on CI; tests/test_zstd_frames.py runs those frames on a GPU too."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest
import zstd_cases as zc

import pystrom

from conftest import needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]

# `zstd --check` of b"checksum me " * 100: a content checksum, which pyarrow's writer never sets
CHECKSUMMED = bytes.fromhex("28b52ffd64b0039d000060636865636b73756d206d65200100a1fc2f49b5817e9b")


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(4)
    return pa.table({
        "i": np.arange(rows, dtype=np.int64),
        "f": rng.random(rows),
        "n": pa.array(np.where(rng.random(rows) < 0.1, None, rng.integers(0, 100, rows)).tolist(), pa.int32()),
        "b": rng.random(rows) < 0.5,
        "s": [f"value {i % 1013}" for i in range(rows)],
    })  # fmt: skip


@pytest.fixture
def spied(monkeypatch):
    from pystrom.io.arrow.codecs import device

    calls = []
    real = device._zstd_kernel
    monkeypatch.setattr(device, "_zstd_kernel", lambda *a: calls.append(a[2]) or real(*a))
    return calls


@pytest.mark.parametrize("level", [1, 19])
def test_read_arrow_through_the_kernel(tmp_path, spied, level):
    table = _table(200_000)
    path = tmp_path / "z.arrow"
    feather.write_feather(table, path, compression="zstd", compression_level=level, chunksize=30_000)
    got = pystrom.read_arrow(path, device="cuda")
    assert got.to_arrow().equals(table)
    assert sum(spied) >= 7 * 5  # every body buffer of the 7 batches went through the kernel
    part = pystrom.read_arrow(path, columns=["s", "f"], device="cuda").to_arrow()
    assert part.equals(table.select(["s", "f"]))


def test_the_host_path_stays(tmp_path, spied):
    table = _table(50_000)
    path = tmp_path / "z.arrow"
    feather.write_feather(table, path, compression="zstd", chunksize=9_000)
    with pystrom.defaults.set(gpu_zstd_decoder="host"):
        assert pystrom.read_arrow(path, device="cuda").to_arrow().equals(table)
    assert not spied


def _inflate(frames_claims: list[tuple[bytes, int]]) -> tuple[np.ndarray, list[bytes]]:
    import cupy as cp

    from pystrom.io.arrow.codecs.decompress import Frames, inflate
    from pystrom.memory.backend import resolve_device

    backend = resolve_device("cuda")
    sizes = np.array([len(f) for f, _ in frames_claims], dtype=np.int64)
    claims = np.array([c for _, c in frames_claims], dtype=np.int64)
    room = (claims + 63) // 64 * 64 + 64
    at = np.concatenate([[0], np.cumsum(room)[:-1]]).astype(np.int64)
    src = cp.asarray(np.frombuffer(b"".join(f for f, _ in frames_claims), dtype=np.uint8))
    dst = cp.full(int(room.sum()), 0xEE, dtype=cp.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    with backend.activate():
        produced = inflate(backend, Frames("zstd", src, offsets, sizes, dst, at, claims))
    host = dst.get()
    for a, c, r in zip(at.tolist(), claims.tolist(), room.tolist()):
        assert (host[a + c : a + r] == 0xEE).all(), "nothing written past a frame's claim"
    return produced, [host[a : a + c].tobytes() for a, c in zip(at.tolist(), claims.tolist())]


def test_many_frames_equal_libzstd():
    rng = np.random.default_rng(9)
    payloads = zc.payloads() + [
        rng.random(65_536).tobytes(),
        np.arange(65_536, dtype=np.int64).tobytes(),
        rng.integers(0, 1 << 40, 65_536).tobytes(),
        rng.integers(0, 3, 1 << 20, dtype=np.uint8).tobytes(),
    ]
    cases = [(zc.compress(p, level), p) for level in (1, 3, 9, 19) for p in payloads]
    produced, out = _inflate([(f, len(p)) for f, p in cases])
    assert produced.tolist() == [len(p) for _, p in cases]
    assert all(o == p for o, (_, p) in zip(out, cases))


def test_a_checksummed_frame_goes_to_the_host(spied):
    produced, out = _inflate([(CHECKSUMMED, 1200), (zc.compress(b"x" * 5000, 3), 5000)])
    assert produced.tolist() == [1200, 5000]
    assert out == [b"checksum me " * 100, b"x" * 5000]
    assert spied == [2]
