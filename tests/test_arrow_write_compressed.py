"""write_arrow(compression="lz4" | "zstd"): Arrow BodyCompression files (pystrom.io.arrow.codecs.compress).

Every type write_arrow writes, with and without NULLs, many batches, empty tables and incompressible
columns, read back equal by pyarrow (ipc.open_file, feather.read_table), polars (where installed) and
pystrom.read_arrow; the layout checked from the file's own metadata: the BodyCompression table, every
buffer on a 64-byte file offset, length prefixes (-1 for a buffer stored raw), statistics as without
compression.
"""

from __future__ import annotations

import os
import struct
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pytest
from test_lists import _table as _list_table

import pystrom
from pystrom.io.arrow.codecs.compress import Deflater, check_compression, deflate
from pystrom.io.arrow.file import format as fmt
from pystrom.io.arrow.write.writer import write_ipc_file
from pystrom.testing import to_host

from datagen import TYPES, make_array

CODECS = ["lz4", "zstd"]


def _every_type(n: int, nulls: bool, seed: int = 0) -> pa.Table:
    cols = {name: make_array(t, n, nulls, seed + i) for i, (name, t) in enumerate(TYPES.items())}
    cols["large_string"] = make_array(pa.string(), n, nulls, seed).cast(pa.large_string())
    cols["large_binary"] = make_array(pa.binary(), n, nulls, seed).cast(pa.large_binary())
    lists = _list_table(n)  # list<float32, 3>, list<int64>, list<bool>, list<bool, 2>, month_day_nano, float64
    return pa.table({**cols, **{name: lists[name] for name in lists.column_names}})


def _layout(path) -> list[tuple[int | None, list[tuple[int, int]]]]:
    """(BodyCompression codec or None, [(file offset, length)] of each buffer) per record batch, parsed
    from the file's own footer and messages."""
    raw = open(path, "rb").read()
    (footer_len,) = struct.unpack_from("<i", raw, len(raw) - 10)
    blocks, _ = fmt.read_footer(raw[len(raw) - 10 - footer_len : len(raw) - 10])
    out = []
    for block in blocks:
        assert raw[block.offset : block.offset + 4] == b"\xff\xff\xff\xff"
        r = fmt._Reader(raw[block.offset + 8 : block.offset + block.metadata_length])
        message = r.table(r.deref(0))
        batch = r.table(r.deref(r.field(message, 2)))
        first, count = r.vector(r.field(batch, 2), 16)
        buffers = list(struct.iter_unpack("<qq", bytes(r.buf[first : first + 16 * count])))
        codec = None
        at = r.field(batch, 3)
        if at is not None:
            compression = r.table(r.deref(at))
            codec = r.buf[r.field(compression, 0)]
            method = r.field(compression, 1)
            assert method is None or r.buf[method] == 0, "BodyCompressionMethod BUFFER"
        body = block.offset + block.metadata_length
        assert body % 64 == 0
        out.append((codec, [(body + off, size) for off, size in buffers]))
    return out


def _prefixes(path) -> list[int]:
    """The int64 length prefix of every non-empty buffer of a compressed file."""
    raw = open(path, "rb").read()
    found = []
    for codec, buffers in _layout(path):
        assert codec is not None
        for start, size in buffers:
            assert start % 64 == 0, f"a buffer at file offset {start}"
            if size:
                assert size >= 8, "a compressed buffer holds its length prefix"
                found.append(struct.unpack_from("<q", raw, start)[0])
    return found


def _meta(path) -> list[dict]:
    with ipc.open_file(path) as r:
        return [dict(r.get_batch_with_custom_metadata(i).custom_metadata or {}) for i in range(r.num_record_batches)]


def _check_pystrom(path, device, expected: pa.Table, tmp_path) -> None:
    """read_arrow gives what it gives for the uncompressed file (large strings come back as strings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pystrom.PerformanceWarning)  # compressed bodies: the host path today
        got = to_host(pystrom.read_arrow(path, device=device))
    plain = tmp_path / "plain-for-read_arrow.arrow"
    pystrom.write_arrow(expected, plain)
    assert got.equals(to_host(pystrom.read_arrow(plain, device=device)))


def _check_polars(expected: pa.Table, tmp_path, **options) -> None:
    """polars reads our compressed file (written with ``options``) as it reads pyarrow's uncompressed file
    of the same data. polars (2.1) imports no month_day_nano interval (it panics on the schema), so those
    columns are left out."""
    pl = pytest.importorskip("polars")
    expected = expected.select([f.name for f in expected.schema if f.type != pa.month_day_nano_interval()])
    path, reference = tmp_path / "for-polars.arrow", tmp_path / "reference.feather"
    pystrom.write_arrow(expected, path, **options)
    feather.write_feather(expected, reference, compression="uncompressed")
    got, want = pl.read_ipc(path), pl.read_ipc(reference)
    assert got.schema == want.schema
    assert got.equals(want, null_equal=True)


# ---------------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("nulls", [False, True], ids=["dense", "nulls"])
@pytest.mark.parametrize("codec", CODECS)
def test_every_type_round_trips(tmp_path, device, codec, nulls):
    table = _every_type(200, nulls)
    path = tmp_path / f"{codec}.arrow"
    summary = pystrom.write_arrow(table, path, batch_rows=64, compression=codec)
    assert summary.num_batches == 4 and summary.bytes_written == os.path.getsize(path)
    with ipc.open_file(path) as r:
        back = r.read_all()
        assert r.num_record_batches == 4
    assert back.schema == table.schema
    assert back.equals(table)
    assert feather.read_table(path).equals(table)
    assert {codec for codec, _ in _layout(path)} == {0 if codec == "lz4" else 1}
    assert _prefixes(path)  # every buffer 64-byte aligned with a length prefix
    _check_pystrom(path, device, table, tmp_path)
    _check_polars(table, tmp_path, batch_rows=64, compression=codec)


@pytest.mark.parametrize("codec", CODECS)
def test_many_batches_sliced_inputs_and_stats(tmp_path, codec):
    table = pa.concat_tables([_every_type(n, nulls=n % 2 == 0, seed=n) for n in (13, 0, 1, 40, 7, 64)])
    plain, packed = tmp_path / "plain.arrow", tmp_path / "packed.arrow"
    pystrom.write_arrow(table, plain, batch_rows=9)
    summary = pystrom.write_arrow(table, packed, batch_rows=9, compression=codec, compression_level=3)
    assert summary.num_batches == pystrom.write_arrow(table, plain, batch_rows=9).num_batches
    assert ipc.open_file(packed).read_all().equals(table)
    stats = _meta(packed)
    assert stats == _meta(plain)  # the same min/max keys, computed on the uncompressed values
    assert any(k.startswith(b"min_max_stats.") for batch in stats for k in batch)
    _check_polars(table, tmp_path, batch_rows=9, compression=codec, compression_level=3)


@pytest.mark.parametrize("codec", CODECS)
def test_empty_tables_and_empty_batches(tmp_path, device, codec):
    empty = _every_type(0, nulls=False)
    path = tmp_path / "empty.arrow"
    pystrom.write_arrow(empty, path, compression=codec)
    assert ipc.open_file(path).read_all().equals(empty)
    _check_pystrom(path, device, empty, tmp_path)
    # empty record batches between full ones, written as they are
    full = _every_type(5, nulls=True).combine_chunks()
    (batch,) = full.to_batches()
    batches = [pa.RecordBatch.from_pylist([], schema=full.schema), batch, batch.slice(3, 0), batch]
    path = tmp_path / "mixed.arrow"
    write_ipc_file(path, full.schema, batches, compression=codec)
    expected = pa.Table.from_batches(batches, full.schema)
    with ipc.open_file(path) as r:
        assert [r.get_batch(i).num_rows for i in range(r.num_record_batches)] == [0, 5, 0, 5]
        assert r.read_all().equals(expected)
    _check_pystrom(path, device, expected, tmp_path)


@pytest.mark.parametrize("codec", CODECS)
def test_incompressible_buffers_are_stored_raw(tmp_path, device, codec):
    rng = np.random.default_rng(5)
    noise = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    table = pa.table(
        {
            "noise": pa.array(noise.view(np.int64)),  # random bytes: no codec makes them smaller
            "zeros": pa.array(np.zeros(1 << 13, dtype=np.int64)),
        }
    )
    path = tmp_path / "noise.arrow"
    pystrom.write_arrow(table, path, compression=codec)
    prefixes = _prefixes(path)
    assert prefixes == [-1, 8 << 13]  # (no validity buffers: no NULLs) noise raw, zeros compressed
    raw = open(path, "rb").read()
    assert struct.pack("<q", -1) + noise.tobytes() in raw  # -1 then the bytes themselves
    assert ipc.open_file(path).read_all().equals(table)
    _check_pystrom(path, device, table, tmp_path)
    _check_polars(table, tmp_path, compression=codec)


def test_compressible_data_shrinks(tmp_path):
    n = 1 << 18
    rng = np.random.default_rng(1)
    table = pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "code": pa.array(rng.integers(0, 16, n, dtype=np.int32)),
            "label": pa.array(np.array(["red", "green", "blue", "cyan"])[rng.integers(0, 4, n)]),
        }
    )
    sizes = {}
    for codec in (None, *CODECS):
        path = tmp_path / f"{codec}.arrow"
        sizes[codec] = pystrom.write_arrow(table, path, batch_rows=1 << 16, compression=codec).bytes_written
        assert ipc.open_file(path).read_all().equals(table)
    for codec in CODECS:  # about what pyarrow's writer makes of the same batches (ours pads to 64, not 8)
        feather.write_feather(table, tmp_path / "pa.arrow", compression=codec, chunksize=1 << 16)
        assert sizes[codec] < sizes[None] * 0.6 and sizes[codec] < os.path.getsize(tmp_path / "pa.arrow") + 4096, sizes
    assert (
        pystrom.write_arrow(table, tmp_path / "z19.arrow", compression="zstd", compression_level=19).bytes_written
        <= (sizes["zstd"])
    )


@pytest.mark.parametrize("codec", CODECS)
def test_one_thread_writes_the_same_file(tmp_path, codec):
    table = _every_type(300, nulls=True)
    files = []
    for threads in (1, 3):
        with pystrom.defaults.set(compress_threads=threads):
            path = tmp_path / f"{threads}.arrow"
            pystrom.write_arrow(table, path, batch_rows=50, compression=codec)
            files.append(open(path, "rb").read())
    assert files[0] == files[1]


def test_pystrom_tables_and_scans_compress_too(tmp_path, device):
    arrow = _every_type(50, nulls=True).drop_columns(["uuid"])
    table = pystrom.Table.from_arrow(arrow, device=device)
    path = tmp_path / "t.arrow"
    pystrom.write_arrow(table, path, compression="zstd", batch_rows=20)
    assert ipc.open_file(path).read_all().equals(table.to_arrow())
    again = tmp_path / "again.arrow"
    with warnings.catch_warnings():
        warnings.simplefilter("error", pystrom.PerformanceWarning)  # compressed bodies are read directly
        pystrom.write_arrow(pystrom.scan_arrow(path, batch_rows=15, device=device), again, compression="lz4")
    assert ipc.open_file(again).read_all().equals(table.to_arrow())


def test_batches_held_ahead_stay_bounded(tmp_path):
    # 40 batches of 4 MB from pyarrow's pool: the writer holds 64 MiB of them ahead (2 threads), not all,
    # and their frames (pyarrow's codec allocates each at its largest possible size, about the input's).
    schema = pa.schema([("x", pa.float64())])
    peak = []

    def gen():
        for i in range(40):
            arr = pa.compute.add(pa.array(np.arange(500_000, dtype=np.float64)), i)  # pool-allocated
            peak.append(pa.total_allocated_bytes())
            yield pa.RecordBatch.from_arrays([arr], schema=schema)

    start = pa.total_allocated_bytes()
    with pystrom.defaults.set(compress_threads=2):
        write_ipc_file(tmp_path / "s.arrow", schema, gen(), compression="lz4")
    assert max(peak) - start < 2 * (64 << 20) + 4 * 4_000_000
    assert ipc.open_file(tmp_path / "s.arrow").num_record_batches == 40


def test_a_failure_mid_stream_leaves_no_file(tmp_path):
    schema = pa.schema([("a", pa.int64())])
    path = tmp_path / "f.arrow"
    path.write_bytes(b"previous contents")

    def gen():
        for _ in range(5):
            yield pa.record_batch([pa.array(np.zeros(100_000, dtype=np.int64))], schema=schema)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        write_ipc_file(path, schema, gen(), compression="zstd")
    assert path.read_bytes() == b"previous contents"
    assert os.listdir(tmp_path) == ["f.arrow"]


# ---------------------------------------------------------------------------------------------------
# the deflate module and the arguments


def test_deflate_pairs():
    rng = np.random.default_rng(2)
    noise = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    offsets = np.tile(np.arange(0, 40, 4, dtype=np.int32), 100)  # a non-byte buffer
    plain = pa.py_buffer(b"abc" * 1000)
    for codec in CODECS:
        out = deflate(codec, None, [b"", noise, offsets, plain, memoryview(b"x")])
        assert out[0] == (0, b"")
        assert out[1][0] == -1 and bytes(out[1][1]) == noise
        assert out[4][0] == -1 and bytes(out[4][1]) == b"x"
        for (n, frame), original in ((out[2], offsets.tobytes()), (out[3], plain.to_pybytes())):
            assert n == len(original) and len(frame) < n
            assert pa.Codec(codec).decompress(frame, n).to_pybytes() == original


def test_deflater_threads_and_errors():
    with pystrom.defaults.set(compress_threads=2):
        with Deflater("lz4") as d:
            assert d.threads == 2
    with Deflater("zstd", 5, threads=1) as d:
        assert d.threads == 1 and d.submit([b"a" * 100]).result()[0][0] == 100
    with pytest.raises(pystrom.InvalidArgumentError, match="codec"):
        Deflater(None)
    with pytest.raises(pystrom.InvalidArgumentError, match="'lz4' at its one level only; got 'zstd'"):
        Deflater("zstd", device=object())
    with pytest.raises(pystrom.InvalidArgumentError, match="got 'lz4', level 9"):
        Deflater("lz4", 9, device=object())


def test_which_writes_compress_on_a_gpu():
    """Only LZ4 at its default level, of a Table or scan on a GPU, and only while gpu_compressor is
    "kernel" (tests/test_lz4_encode.py checks the GPU side)."""
    from pystrom.io.arrow.write.write import _gpu_compressor

    table = pystrom.Table.from_arrow(pa.table({"x": [1, 2, 3]}), device="cpu")
    assert _gpu_compressor(table, "lz4", None) is None  # on the CPU
    assert _gpu_compressor(pa.table({"x": [1]}), "lz4", None) is None  # host data
    with pytest.raises(ValueError, match="invalid value 'nvcomp' for setting 'gpu_compressor'"):
        pystrom.defaults.set(gpu_compressor="nvcomp")


@pytest.mark.parametrize(
    "compression,level,match",
    [
        ("gzip", None, r"compression must be None, 'lz4' or 'zstd'; got 'gzip'"),
        ("LZ4", None, r"compression .*got 'LZ4'"),
        (1, None, r"compression .*got int"),
        ("zstd", "3", r"compression_level must be an int or None; got str"),
        ("zstd", True, r"compression_level .*got bool"),
        ("zstd", 2.0, r"compression_level .*got float"),
        ("zstd", 23, r"compression_level for 'zstd' must be in -131072\.\.22; got 23"),
        ("lz4", 0, r"compression_level for 'lz4' must be in"),
        (None, 3, r"compression_level=3 given without compression"),
    ],
)
def test_bad_arguments_name_the_argument(tmp_path, compression, level, match):
    path = tmp_path / "never.arrow"
    with pytest.raises(pystrom.InvalidArgumentError, match=match):
        pystrom.write_arrow(pa.table({"x": [1]}), path, compression=compression, compression_level=level)
    with pytest.raises(ValueError, match=match):  # InvalidArgumentError is a ValueError
        check_compression(compression, level)
    assert not path.exists() and os.listdir(tmp_path) == []
    # checked before anything is read: the server is never contacted
    with pytest.raises(pystrom.InvalidArgumentError, match=match):
        pystrom.postgres_to_arrow(
            "host=/nonexistent", path, "SELECT 1", compression=compression, compression_level=level
        )
