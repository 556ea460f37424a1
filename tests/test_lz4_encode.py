"""The GPU LZ4 compressor (kernels/lz4_encode.cu, io/arrow/codecs/device_deflate.py) on a GPU: liblz4
(pyarrow's codec, the CPU twin) reads every frame back to the same bytes, the frames keep the block
format's end rules (tests/lz4_blocks.py), compressible data shrinks about as much as liblz4 makes it,
and ``write_arrow(compression="lz4")`` of a GPU table compresses there and reads back everywhere.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest
from lz4_blocks import check_frame

import pystrom
from pystrom.io.arrow.codecs import device_deflate

from conftest import needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]


@pytest.fixture
def gpu_backend():
    from pystrom.memory.backend import resolve_device

    return resolve_device("cuda")


def _payloads() -> dict[str, bytes]:
    rng = np.random.default_rng(3)
    out = {
        "one byte": b"a",
        "13 bytes": b"abcdabcdabcda",
        "zeros over two chunks": bytes(70_000),
        "random bytes": rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes(),
        "small int64s": rng.integers(0, 50, 300_000).astype(np.int64).tobytes(),
        "runs of int32": np.repeat(rng.integers(0, 1000, 5000), 97).astype(np.int32).tobytes(),
        "period 16": (b"0123456789abcdef" * 9000)[:131_073],
        "text": rng.choice(
            np.frombuffer(b"the quick brown fox jumps over a lazy dog ", dtype=np.uint8), 400_000
        ).tobytes(),
        "sorted int64": np.arange(500_000, dtype=np.int64).tobytes(),
        "random walk float64": np.cumsum(rng.normal(size=250_000)).astype(np.float64).tobytes(),
        "uniform float64": rng.random(300_000).tobytes(),
    }
    for n in (65_535, 65_536, 65_537, 1 << 20):
        out[f"counting bytes, {n}"] = np.arange(n, dtype=np.uint8).tobytes()
    return out


def _compress(backend, buffers: list[bytes]) -> list[bytes | None]:
    cp = backend.xp
    sizes = np.array([len(b) for b in buffers], dtype=np.int64)
    offsets = np.cumsum(sizes) - sizes
    src = cp.asarray(np.frombuffer(b"".join(buffers), dtype=np.uint8))
    host, spans = device_deflate.lz4_frames_device(backend, src, offsets, sizes)
    return [None if s is None else host[s[0] : s[0] + s[1]].tobytes() for s in spans]


def test_liblz4_reads_every_frame_back(gpu_backend):
    payloads = _payloads()
    frames = _compress(gpu_backend, list(payloads.values()))
    codec = pa.Codec("lz4")
    assert sum(f is not None for f in frames) >= 10
    for (name, payload), frame in zip(payloads.items(), frames):
        if frame is None:  # stored raw: where liblz4 cannot shrink it either
            assert len(codec.compress(payload, asbytes=True)) >= 0.99 * len(payload), name
            continue
        assert len(frame) < len(payload), name
        assert pa.decompress(frame, decompressed_size=len(payload), codec="lz4", asbytes=True) == payload, name
        if len(payload) <= 300_000:  # the by-the-book reading is Python, byte by byte
            assert check_frame(frame) == payload, name
        # liblz4 on the same independent 64 KiB blocks (on a larger buffer it links them, which a warp a
        # block cannot): its frames' blocks and one frame's overhead
        chunks = [payload[i : i + device_deflate.CHUNK] for i in range(0, len(payload), device_deflate.CHUNK)]
        theirs = sum(len(codec.compress(c, asbytes=True)) - 11 for c in chunks) + 11
        assert len(frame) <= 1.1 * theirs + 16, (name, len(frame), theirs)


def test_the_same_bytes_every_time(gpu_backend):
    payloads = list(_payloads().values())
    assert _compress(gpu_backend, payloads) == _compress(gpu_backend, payloads[::-1])[::-1]


def _table() -> pa.Table:
    rng = np.random.default_rng(9)
    n = 300_001
    ints = pa.array(rng.integers(0, 1000, n), mask=rng.random(n) < 0.1)
    words = pa.array([None if i % 7 == 0 else f"w{i % 1000}" for i in range(n)])
    return pa.table(
        {
            "f": rng.random(n),
            "i": ints,
            "ts": np.arange(n, dtype=np.int64),
            "s": words,
            "b": rng.random(n) < 0.5,
            "l": pa.array([[i, i + 1] if i % 5 else None for i in range(n)], pa.list_(pa.int32())),
        }
    )


def test_write_arrow_of_a_gpu_table_compresses_there(tmp_path, monkeypatch):
    calls = []
    real = device_deflate.lz4_frames_device

    def counted(*args, **kwargs):
        calls.append(len(args[3]))
        return real(*args, **kwargs)

    monkeypatch.setattr(device_deflate, "lz4_frames_device", counted)
    want = _table()
    table = pystrom.Table.from_arrow(want, device="cuda")
    path = tmp_path / "gpu.arrow"
    pystrom.write_arrow(table, path, compression="lz4", batch_rows=100_000)
    assert len(calls) == 4, "one GPU compression a batch"
    assert feather.read_table(path).equals(want)
    assert pystrom.read_arrow(path, device="cuda").to_arrow().equals(want)
    assert pystrom.read_arrow(path, device="cpu").to_arrow().equals(want)

    calls.clear()
    with pystrom.defaults.set(gpu_compressor="host"):
        pystrom.write_arrow(table, tmp_path / "host.arrow", compression="lz4", batch_rows=100_000)
    assert path.stat().st_size <= 1.1 * (tmp_path / "host.arrow").stat().st_size, "about liblz4's ratio"
    assert path.stat().st_size < 0.8 * want.nbytes
    pystrom.write_arrow(table, tmp_path / "level.arrow", compression="lz4", compression_level=9)
    pystrom.write_arrow(table, tmp_path / "zstd.arrow", compression="zstd")
    pystrom.write_arrow(want, tmp_path / "pyarrow.arrow", compression="lz4")
    assert calls == [], "the CPU codec for a level, for zstd, for host data and when asked"
    for name in ("host", "level", "zstd", "pyarrow"):
        assert feather.read_table(tmp_path / f"{name}.arrow").equals(want), name


def test_empty_and_all_null_batches(tmp_path):
    want = pa.table({"x": pa.array([None] * 1000, pa.float64()), "y": pa.array(np.zeros(1000))})
    for table in (want, want.slice(0, 0)):
        path = tmp_path / f"t{table.num_rows}.arrow"
        pystrom.write_arrow(pystrom.Table.from_arrow(table, device="cuda"), path, compression="lz4")
        assert feather.read_table(path).equals(table)


def test_a_gpu_compresses_lz4_at_its_one_level_only(gpu_backend):
    from pystrom.errors import InvalidArgumentError
    from pystrom.io.arrow.codecs.compress import Deflater

    with pytest.raises(InvalidArgumentError, match="zstd"):
        Deflater("zstd", device=gpu_backend)
    with pytest.raises(InvalidArgumentError, match="level 3"):
        Deflater("lz4", 3, device=gpu_backend)


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_every_type_of_a_gpu_table_in_odd_batches(tmp_path, compression):
    """A GPU table's batches come down one by one (write.py's _device_batches), sliced at rows that are no
    multiple of 8 (bitmaps and offsets rebased), and compress on the GPU: the file is pyarrow's table."""
    from test_arrow_write_compressed import _every_type

    table = pystrom.Table.from_arrow(_every_type(200, nulls=True).drop_columns(["uuid"]), device="cuda")
    want = table.to_arrow()  # large strings and binaries come back as string and binary
    path = tmp_path / "t.arrow"
    summary = pystrom.write_arrow(table, path, batch_rows=7, compression=compression)
    assert summary.num_batches == 29
    assert feather.read_table(path).equals(want)
    reference = tmp_path / "reference.arrow"
    pystrom.write_arrow(want, reference, batch_rows=7)
    with pa.ipc.open_file(path) as ours, pa.ipc.open_file(reference) as theirs:
        for i in range(summary.num_batches):  # the same batches, statistics included
            a, b = ours.get_batch_with_custom_metadata(i), theirs.get_batch_with_custom_metadata(i)
            assert a.batch.equals(b.batch) and a.custom_metadata == b.custom_metadata, i
