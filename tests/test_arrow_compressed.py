"""Compressed Arrow IPC files (LZ4_FRAME / ZSTD bodies) read without pyarrow inflating them.

Real files written by pyarrow; the reference is pyarrow's own read. Hostile files are those files with
a prefix, a frame or the codec id rewritten in place: each must end in a FileFormatError naming the
record batch and the column (and the buffer), never a crash, a hang or wrong rows.
"""

from __future__ import annotations

import re
import struct
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pystrom
from pystrom.io.arrow.codecs.decompress import Frames, inflate
from pystrom.io.arrow.file.format import _Reader
from pystrom.io.arrow.file.metadata import Packed, Range, open_arrow_file
from pystrom.io.arrow.read import compressed_reads
from pystrom.io.arrow.read.batches import parse_batches
from pystrom.memory.backend import resolve_device
from pystrom.testing import to_host

from conftest import needs_gpu
from datagen import TYPES, make_array

CODECS = ["lz4", "zstd"]
BATCHES = [5, 0, 13, 8, 64, 1, 100, 0]


def _table(n: int, nulls: bool, seed: int = 1) -> pa.Table:
    cols = {name: make_array(t, n, nulls, seed=seed + i) for i, (name, t) in enumerate(TYPES.items())}
    rng = np.random.default_rng(seed)

    def null(i: int) -> bool:
        return nulls and i % 7 == 3

    cols["interval"] = pa.array([None if null(i) else pa.MonthDayNano([i, -i, i * 1000]) for i in range(n)],
                                pa.month_day_nano_interval())  # fmt: skip
    cols["list_i32"] = pa.array([None if null(i) else [int(x) if x % 5 else None for x in range(i % 6)]
                                 for i in range(n)], pa.list_(pa.int32()))  # fmt: skip
    cols["list_u8"] = pa.array([None if null(i) else [1, None, i % 200][: i % 4] for i in range(n)],
                               pa.list_(pa.uint8()))  # fmt: skip
    cols["fsl_f32"] = pa.array([None if null(i) else [float(i), None if i % 4 == 0 else -1.5, 2.0] for i in range(n)],
                               pa.list_(pa.float32(), 3))  # fmt: skip
    cols["dict"] = pa.array(rng.choice(["x", "yy", "zzz"], n)).dictionary_encode()  # the host path, in the same file
    return pa.table(cols)


def _write(path, table: pa.Table, codec: str, lengths=BATCHES) -> None:
    options = ipc.IpcWriteOptions(compression=codec)
    with ipc.new_file(path, table.schema, options=options) as w:
        pos = 0
        for n in lengths:
            w.write_batch(
                pa.record_batch([c.slice(pos, n).combine_chunks() for c in table.columns], schema=table.schema)
            )
            pos += n
        if pos < table.num_rows:
            w.write_table(table.slice(pos), max_chunksize=97)


def _reference(path, columns=None) -> pa.Table:
    with pa.memory_map(str(path)) as src:
        ref = ipc.open_file(src).read_all()
    return ref.select(columns) if columns is not None else ref


def _assert_same(got, ref: pa.Table) -> None:
    host = to_host(got)
    assert host.column_names == ref.column_names and host.num_rows == ref.num_rows
    for name in ref.column_names:
        want = ref.column(name)
        if pa.types.is_dictionary(want.type):
            want = pa.chunked_array([c.dictionary_decode() for c in want.chunks], want.type.value_type)
        got_c, want_c = host.column(name).combine_chunks(), want.combine_chunks()
        if pa.types.is_floating(want.type) and not got_c.equals(want_c):  # a NaN (flipped bytes) equals nothing
            same = np.array_equal(got_c.fill_null(0).to_numpy(), want_c.fill_null(0).to_numpy(), equal_nan=True)
            assert same and got_c.is_null().equals(want_c.is_null()), name
            continue
        assert got_c.equals(want_c), name


def _packed(path, columns=None) -> list[Packed]:
    """The compressed buffers pystrom's parser finds for ``columns`` (default: all)."""
    with open_arrow_file(path) as f:
        layouts = parse_batches(f, columns if columns is not None else f.schema.names)
    assert layouts is not None, "the compressed file was left to pyarrow"
    return layouts.packed_buffers()


def _read_quietly(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", pystrom.PerformanceWarning)  # this path must not warn
        return pystrom.read_arrow(path, **kw)


# -- exact reads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("nulls", [False, True])
def test_every_type_many_batches(tmp_path, device, codec, nulls):
    table = _table(sum(BATCHES) + 300, nulls)
    path = tmp_path / "c.arrow"
    _write(path, table, codec)
    assert len(_packed(path)) > 100
    _assert_same(_read_quietly(path, device=device), _reference(path))


@pytest.mark.parametrize("compression", ["lz4", "zstd", None])
def test_feather_defaults(tmp_path, device, compression):
    table = _table(5000, True).drop_columns(["dict"])
    path = tmp_path / "f.feather"
    if compression is None:
        feather.write_feather(table, path, chunksize=700)  # Feather's default: LZ4
    else:
        feather.write_feather(table, path, compression=compression, chunksize=700)
    _assert_same(_read_quietly(path, device=device), _reference(path))


@pytest.mark.parametrize("codec", CODECS)
def test_only_zero_row_batches(tmp_path, device, codec):
    table = _table(0, True)
    path = tmp_path / "e.arrow"
    _write(path, table, codec, lengths=[0, 0, 0])
    _assert_same(_read_quietly(path, device=device), _reference(path))


@pytest.mark.parametrize("codec", CODECS)
def test_buffers_stored_uncompressed(tmp_path, device, codec):
    # pyarrow's writer compresses every buffer; other writers store a buffer as-is (prefix -1) where
    # compression does not pay: rewrite every frame that is longer than its raw bytes that way
    rng = np.random.default_rng(5)
    n = 300
    table = pa.table({"r": rng.integers(0, 2**63, n, dtype=np.int64), "s": [bytes(rng.bytes(i % 7)) for i in range(n)],
                      "m": pa.array(rng.standard_normal(n), mask=rng.random(n) < 0.3)})  # fmt: skip
    path = tmp_path / "u.arrow"
    _write(path, table, codec, lengths=[3] * 100)
    assert _store_uncompressed(path, table) > 50
    assert len(_packed(path)) < 300 - 50
    _assert_same(_read_quietly(path, device=device), _reference(path))


def _store_uncompressed(path, table: pa.Table) -> int:
    """Rewrite every frame of ``path`` (written from ``table``, binary, int64 and float64 columns) no
    shorter than its raw bytes as stored uncompressed (prefix -1); how many."""
    raw = bytearray(path.read_bytes())
    with pa.memory_map(str(path)) as src:
        f = ipc.open_file(src)
        batches = [f.get_batch(i) for i in range(f.num_record_batches)]  # read_all drops empty ones
    stored = 0
    for p in _packed(path):
        batch, k = (int(x) for x in re.match(r"record batch (\d+), .*buffer (\d+)", p.what).groups())
        plain = batches[batch].column(_field_of(table, k)).buffers()[_slot_of(table, k)].to_pybytes()[: p.size]
        if len(plain) <= p.frame.size:
            raw[p.frame.offset - 8 : p.frame.offset + p.frame.size] = (
                struct.pack("<q", -1) + plain + bytes(p.frame.size - len(plain)))  # fmt: skip
            stored += 1
    path.write_bytes(bytes(raw))
    return stored


def _field_of(table: pa.Table, k: int) -> int:
    """The field of buffer ``k`` in a batch of ``table`` (int64 2 buffers, binary 3, float64 2)."""
    counts = [3 if pa.types.is_binary(f.type) else 2 for f in table.schema]
    return int(np.searchsorted(np.cumsum(counts), k, side="right"))


def _slot_of(table: pa.Table, k: int) -> int:
    counts = [3 if pa.types.is_binary(f.type) else 2 for f in table.schema]
    return k - int(np.cumsum([0, *counts])[_field_of(table, k)])


@pytest.mark.parametrize("codec", CODECS)
def test_columns_and_scan_with_where(tmp_path, device, codec):
    table = _table(4000, True)
    path = tmp_path / "w.arrow"
    _write(path, table, codec, lengths=[500] * 8)
    cols = ["string", "int64", "list_i32", "dict"]
    _assert_same(_read_quietly(path, columns=cols, device=device), _reference(path, cols))
    scan = pystrom.scan_arrow(path, columns=["int64", "string"], where="int32 > 0", batch_rows=1000, device=device)
    got = scan.collect()
    ref = _reference(path)
    want = ref.filter(pa.compute.greater(ref["int32"], 0)).select(["int64", "string"])
    _assert_same(got, want)
    assert scan.stats.rows_read == 4000
    parts = [scan.read_group(path, indices) for path, indices in scan.plan()]  # dask's path, group by group
    _assert_same(pystrom.concat(parts), want)


@pytest.mark.parametrize("codec", CODECS)
def test_small_scratch_inflates_in_many_slices(tmp_path, device, codec, monkeypatch):
    table = _table(3000, True)
    path = tmp_path / "s.arrow"
    _write(path, table, codec, lengths=[250] * 12)
    seen = _spy(monkeypatch)
    monkeypatch.setattr(compressed_reads, "scratch_bytes", lambda backend: 1)  # every frame a slice of its own
    _assert_same(_read_quietly(path, device=device), _reference(path))
    reader = seen[-1]
    assert reader.slices == reader.frames_inflated > 100


def _spy(monkeypatch) -> list:
    """The InflatingReaders read_arrow makes (to read their counters)."""
    seen = []
    original = compressed_reads.InflatingReader.wait

    def wait(self):
        seen.append(self)
        return original(self)

    monkeypatch.setattr(compressed_reads.InflatingReader, "wait", wait)
    return seen


@pytest.mark.parametrize("codec", CODECS)
def test_whole_buffers_inflate_in_place(tmp_path, device, codec, monkeypatch):
    # 512-row batches: every int64 / float64 column's batch starts 64-byte aligned in the table
    rng = np.random.default_rng(4)
    n = 4096
    table = pa.table({"i": rng.integers(0, 1000, n), "f": pa.array(rng.standard_normal(n), mask=rng.random(n) < 0.2),
                      "s": [f"s{i % 91}" for i in range(n)]})  # fmt: skip
    path = tmp_path / "p.arrow"
    _write(path, table, codec, lengths=[512] * 8)
    seen = _spy(monkeypatch)
    _assert_same(_read_quietly(path, device=device), _reference(path))
    reader = seen[-1]
    assert reader.frames_in_place >= 16  # the values of "i" and "f" in each of 8 batches at least
    assert reader.frames_in_place < reader.frames_inflated  # the string bytes at unaligned places: scratch
    if device == "cuda":  # CuPy's arrays start 256-byte aligned: offsets and bitmaps too (direct.py aligns them)
        assert reader.frames_in_place >= reader.frames_inflated - 8


def _aligned(xp, n: int, misalign: int = 0):
    """``n`` bytes at a 64-byte aligned address plus ``misalign``, filled with 0xEE."""
    buf = xp.full(n + 128, 0xEE, dtype=np.uint8)
    ptr = buf.ctypes.data if isinstance(buf, np.ndarray) else buf.data.ptr
    at = (-ptr) % 64 + misalign
    return buf[at : at + n]


def _plain(raw: bytes, p: Packed) -> bytes:
    c = pa.Codec("lz4" if p.codec == "lz4_frame" else "zstd")
    return c.decompress(raw[p.frame.offset : p.frame.offset + p.frame.size], decompressed_size=p.size, asbytes=True)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("scratch", [None, 1, 100_000])
def test_reader_in_place_partial_and_shared_reads(tmp_path, device, codec, scratch):
    from pystrom.io.arrow.file.ranges import RangeReader

    path, raw, packed = _hostile_file(tmp_path, codec)
    raw = bytes(raw)
    backend = resolve_device(device)
    xp = backend.xp
    big = [p for p in packed if p.size > 200]
    assert len(big) >= 8
    with RangeReader(str(path), backend) as files, backend.activate():
        reader = compressed_reads.InflatingReader(files, packed, scratch=scratch)
        whole = [(p, _aligned(xp, p.size)) for p in big[0::4]]  # in place
        skewed = [(p, _aligned(xp, p.size, 1)) for p in big[1::4]]  # unaligned: scratch
        parts = [(p, _aligned(xp, p.size // 2)) for p in big[2::4]]  # the second half of each
        halves = [(p, _aligned(xp, p.size // 2), _aligned(xp, p.size - p.size // 2)) for p in big[3::4]]
        for p, dst in whole + skewed:
            reader.read(p.offset, p.size, dst)
        for p, dst in parts:
            reader.read(p.offset + p.size - p.size // 2, p.size // 2, dst)
        for p, a, b in halves:  # one buffer, two reads: through scratch
            reader.read(p.offset + p.size // 2, p.size - p.size // 2, b)
            reader.read(p.offset, p.size // 2, a)
        reader.wait()
        host = backend.to_host
        for p, dst in whole + skewed:
            assert host(dst).tobytes() == _plain(raw, p), p.what
        for p, dst in parts:
            assert host(dst).tobytes() == _plain(raw, p)[p.size - p.size // 2 :], p.what
        for p, a, b in halves:
            assert host(a).tobytes() + host(b).tobytes() == _plain(raw, p), p.what
    assert reader.frames_inflated == len(whole) + len(skewed) + len(parts) + len(halves)
    assert reader.frames_in_place == len(whole)
    if scratch is None:
        assert reader.slices == 1
    elif scratch == 1:
        assert reader.slices == reader.frames_inflated
    else:
        assert 1 < reader.slices < reader.frames_inflated


@pytest.mark.parametrize("codec", CODECS)
def test_a_lie_in_a_later_slice_is_the_same_error(tmp_path, device, codec, monkeypatch):
    path, raw, packed = _hostile_file(tmp_path, codec)
    p = [q for q in packed if "(values)" in q.what][5]  # beyond the first slices when they are tiny
    raw[p.frame.offset - 8 : p.frame.offset] = struct.pack("<q", p.size + 8)
    path.write_bytes(bytes(raw))
    whole = _refused(path, device, p.what, f"its length prefix claims {p.size + 8:,}")
    seen = _spy(monkeypatch)
    monkeypatch.setattr(compressed_reads, "scratch_bytes", lambda backend: 1)  # every frame a slice of its own
    assert _refused(path, device) == whole
    assert seen[-1].slices > 5


# -- the inflate interface -------------------------------------------------------------------------------


def _frames(codec: str, pieces: list[bytes], claims: list[int], backend) -> Frames:
    c = pa.Codec("lz4" if codec == "lz4_frame" else "zstd")
    comp = [c.compress(p, asbytes=True) for p in pieces]
    src_off = np.cumsum([0, *[len(x) for x in comp]])[:-1].astype(np.int64)
    dst_off = np.cumsum([0, *[-(-n // 64) * 64 for n in claims]])[:-1].astype(np.int64)
    src = np.frombuffer(b"".join(comp), dtype=np.uint8).copy()
    dst_len = int(dst_off[-1] + claims[-1]) if claims else 0
    xp = backend.xp
    return Frames(codec, xp.asarray(src), src_off, np.array([len(x) for x in comp], np.int64),
                  xp.zeros(max(dst_len, 1), dtype=np.uint8), dst_off, np.array(claims, np.int64))  # fmt: skip


@pytest.mark.parametrize("codec", ["lz4_frame", "zstd"])
def test_inflate_reports_what_each_frame_produced(device, codec):
    backend = resolve_device(device)
    rng = np.random.default_rng(2)
    pieces = [rng.integers(0, 4, n, dtype=np.uint8).tobytes() for n in (1, 1000, 70_000, 5, 300_000)]
    claims = [len(p) for p in pieces]
    claims[1] += 1  # lies: one byte too many
    claims[3] -= 1  # one too few
    frames = _frames(codec, pieces, claims, backend)
    with backend.activate():
        produced = inflate(backend, frames)
        dst = backend.to_host(frames.dst)
    assert produced[0] == 1 and produced[2] == 70_000 and produced[4] == 300_000
    assert produced[1] != claims[1] and produced[3] != claims[3]
    for i in (0, 2, 4):
        assert dst[frames.dst_offsets[i] : frames.dst_offsets[i] + claims[i]].tobytes() == pieces[i]


@pytest.mark.parametrize("codec", ["lz4_frame", "zstd"])
def test_inflate_into_arrays_of_their_own(device, codec):
    backend = resolve_device(device)
    xp = backend.xp
    rng = np.random.default_rng(3)
    pieces = [rng.integers(0, 9, n, dtype=np.uint8).tobytes() for n in (100, 70_000, 64, 3000)]
    frames = _frames(codec, pieces, [len(p) for p in pieces], backend)
    table = xp.full(80_000, 0xEE, dtype=np.uint8)  # frames 0 and 2 go here, backwards; 1 and 3 to dst
    frames.dst_arrays = [table[70_016:], None, table[64:128], None]
    with backend.activate():
        produced = inflate(backend, frames)
        got, dst = backend.to_host(table), backend.to_host(frames.dst)
    assert produced.tolist() == [len(p) for p in pieces]
    assert got[70_016:70_116].tobytes() == pieces[0] and got[64:128].tobytes() == pieces[2]
    assert (got[:64] == 0xEE).all() and (got[128:70_016] == 0xEE).all() and (got[70_116:] == 0xEE).all()
    for i in (1, 3):
        assert dst[frames.dst_offsets[i] : frames.dst_offsets[i] + len(pieces[i])].tobytes() == pieces[i]
    with pytest.raises(ValueError, match="overlap"):
        frames.dst_arrays = [table[0:], None, table[64:], None]
        inflate(backend, frames)
    with pytest.raises(ValueError, match="frame 2"):
        frames.dst_arrays = [None, None, table[64:100], None]  # 36 bytes for 64
        inflate(backend, frames)


def test_inflate_corrupt_frames_and_fallback(device):
    backend = resolve_device(device)
    pieces = [bytes(range(256)) * 40, b"abc" * 999]
    for codec in ("lz4_frame", "zstd"):
        frames = _frames(codec, pieces, [len(p) for p in pieces], backend)
        src = backend.to_host(frames.src).copy()
        src[frames.src_offsets[0] + 1] ^= 0xFF  # the magic number (a flipped literal byte goes unseen: no checksum)
        src[frames.src_offsets[1] + 2] ^= 0x01
        with backend.activate():
            frames.src = backend.xp.asarray(src)
            produced = inflate(backend, frames)
        assert (produced != [len(p) for p in pieces]).all()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("codec", ["lz4_frame", "zstd"])
def test_inflate_device_matches_the_cpu(codec):
    rng = np.random.default_rng(9)
    pieces = [
        rng.integers(0, k, n, dtype=np.uint8).tobytes() for k, n in ((2, 10), (200, 1 << 20), (3, 4 << 20), (256, 77))
    ]
    claims = [len(p) for p in pieces]
    claims[3] += 13
    out = {}
    for device in ("cpu", "cuda"):
        backend = resolve_device(device)
        frames = _frames(codec, pieces, claims, backend)
        with backend.activate():
            produced = inflate(backend, frames)
            out[device] = (produced, backend.to_host(frames.dst))
    assert out["cpu"][0][:3].tolist() == out["cuda"][0][:3].tolist() == claims[:3]
    assert out["cuda"][0][3] != claims[3]
    for i in range(3):
        at = int(np.cumsum([0, *[-(-n // 64) * 64 for n in claims]])[i])
        assert out["cuda"][1][at : at + claims[i]].tobytes() == pieces[i]


# -- hostile files -----------------------------------------------------------------------------------


def _hostile_file(tmp_path, codec: str) -> tuple:
    table = pa.table({"x": np.arange(20_000, dtype=np.int64), "s": [f"v{i % 977}" for i in range(20_000)],
                      "f": pa.array(np.linspace(0, 1, 20_000), mask=np.arange(20_000) % 11 == 0)})  # fmt: skip
    path = tmp_path / f"h_{codec}.arrow"
    _write(path, table, codec, lengths=[5000] * 4)
    return path, bytearray(path.read_bytes()), _packed(path)


def _refused(path, device, *patterns: str) -> str:
    with pytest.raises(pystrom.FileFormatError) as info:
        pystrom.read_arrow(path, device=device)
    msg = str(info.value)
    for p in patterns:
        assert p in msg, msg
    return msg


@pytest.mark.parametrize("codec", CODECS)
def test_flipped_bytes_in_a_frame(tmp_path, device, codec):
    path, raw, packed = _hostile_file(tmp_path, codec)
    victims = [p for p in packed if p.frame.size > 40][:6]
    for p in victims:
        bad = bytearray(raw)
        for at in range(p.frame.offset + 8, p.frame.offset + p.frame.size - 4, max(1, p.frame.size // 7)):
            bad[at] ^= 0xA5
        path.write_bytes(bytes(bad))
        try:
            got = pystrom.read_arrow(path, device=device)
        except pystrom.FileFormatError as exc:
            assert "record batch" in str(exc) and "column" in str(exc), exc
        else:  # a flip the codec cannot see (literal bytes): then the rows are what pyarrow reads
            _assert_same(got, _reference(path))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("lie", ["plus_one", "minus_one", "negative", "huge", "zero", "double"])
def test_lying_uncompressed_lengths(tmp_path, device, codec, lie):
    path, raw, packed = _hostile_file(tmp_path, codec)
    for p in [q for q in packed if "(values)" in q.what or "(data)" in q.what][:4]:
        claim = {"plus_one": p.size + 1, "minus_one": p.size - 1, "negative": -7, "huge": 1 << 40, "zero": 0,
                 "double": 2 * p.size}[lie]  # fmt: skip
        bad = bytearray(raw)
        bad[p.frame.offset - 8 : p.frame.offset] = struct.pack("<q", claim)
        path.write_bytes(bytes(bad))
        batch, column = p.what.split(", buffer")[0].split(", ")
        _refused(path, device, batch, column)


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_frames(tmp_path, device, codec):
    path, raw, packed = _hostile_file(tmp_path, codec)
    for p in packed[:: max(1, len(packed) // 5)]:
        bad = bytearray(raw)
        keep = p.frame.size // 2
        bad[p.frame.offset + keep : p.frame.offset + p.frame.size] = bytes(p.frame.size - keep)
        path.write_bytes(bytes(bad))
        _refused(path, device, p.what.split(", buffer")[0])


def _compression_codec_position(raw: bytes, batch: int) -> int | None:
    """File position of BodyCompression.codec in record batch ``batch``'s message (None if defaulted)."""
    footer_len = struct.unpack_from("<i", raw, len(raw) - 10)[0]
    from pystrom.io.arrow.file.format import read_footer

    blocks, _ = read_footer(memoryview(raw)[len(raw) - 10 - footer_len : len(raw) - 10])
    blk = blocks[batch]
    fb = blk.offset + 8
    r = _Reader(memoryview(raw)[fb : blk.offset + blk.metadata_length])
    message = r.table(r.deref(0))
    rb = r.table(r.deref(r.field(message, 2)))
    body = r.table(r.deref(r.field(rb, 3)))
    at = r.field(body, 0)
    return None if at is None else fb + at


@pytest.mark.parametrize("codec_id", [2, 7, -1])
def test_unknown_codec_id(tmp_path, device, codec_id):
    path, raw, _ = _hostile_file(tmp_path, "zstd")  # ZSTD's id (1) is written; LZ4_FRAME's (0) may be left out
    at = _compression_codec_position(bytes(raw), 2)
    assert at is not None and raw[at] == 1
    raw[at] = codec_id & 0xFF
    path.write_bytes(bytes(raw))
    _refused(path, device, "record batch 2", f"unknown codec id {codec_id}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_byte_flips_in_bodies(tmp_path_factory, data):
    codec = data.draw(st.sampled_from(CODECS))
    path, raw, packed = _hostile_file(tmp_path_factory.mktemp("flip"), codec)
    first = min(p.frame.offset for p in packed) - 8
    last = max(p.frame.offset + p.frame.size for p in packed)
    flips = data.draw(st.lists(st.tuples(st.integers(first, last - 1), st.integers(1, 255)), min_size=1, max_size=8))
    for at, x in flips:
        raw[at] ^= x
    path.write_bytes(bytes(raw))
    try:
        got = pystrom.read_arrow(path, device="cpu")
    except pystrom.FileFormatError as exc:
        assert "record batch" in str(exc), exc
        return
    try:
        ref = _reference(path)
        ref.validate(full=True)
    except (pa.ArrowException, OSError, ValueError):
        return  # pyarrow cannot read it: pystrom read bytes the codec could not tell apart (e.g. string bytes)
    _assert_same(got, ref)


def test_inflated_ranges_are_never_file_offsets(tmp_path):
    path, _, packed = _hostile_file(tmp_path, "lz4")
    assert all(isinstance(p, Packed) and p.offset >= 1 << 56 and isinstance(p.frame, Range) for p in packed)
    offsets = [p.offset for p in packed]
    assert offsets == sorted(offsets) and all(b - a >= 64 for a, b in zip(offsets, offsets[1:]))


def test_copy_out_on_every_device():
    """InflatingReader's partial reads out of its scratch, all in one call (csrc/gather.cpp copy_out on
    the CPU, kernels/copies.cu on a GPU), against slice assignments; spans outside the scratch refused."""
    from pystrom.testing import assert_same_on_all_devices

    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 5000, dtype=np.uint8)
    sizes = rng.integers(0, 300, 40).astype(np.int64)
    offsets = rng.integers(0, 5000 - 300, 40).astype(np.int64)
    places = np.cumsum(sizes + 5) - sizes - 5  # each destination 5 bytes apart: untouched between

    def run(device):
        backend = resolve_device(device)
        out = backend.xp.full(int((sizes + 5).sum()), 7, dtype=np.uint8)
        base = out.ctypes.data if backend.kind == "cpu" else out.data.ptr
        compressed_reads.copy_out(backend, backend.from_host(src), offsets, base + places, sizes)
        return [out]

    got = assert_same_on_all_devices(run)[0]
    want = np.full(int((sizes + 5).sum()), 7, dtype=np.uint8)
    for o, n, p in zip(offsets.tolist(), sizes.tolist(), places.tolist()):
        want[p : p + n] = src[o : o + n]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(IndexError, match="outside src"):
        pystrom._core.copy_out(src, np.array([[4990], [want.ctypes.data], [11]], dtype=np.int64))
