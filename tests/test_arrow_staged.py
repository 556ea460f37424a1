"""Compressed frames a GPU read decodes on the host (io/arrow/codecs/staged.py) and the planning of a
compressed read (io/arrow/codecs/plan.py).

On a GPU, ZSTD takes the staged path by itself (nvCOMP off); these tests also force it for LZ4 there.
On the CPU the staged path is forced (``compressed_reads.staged``), its copies going through ``HostCopies``,
the CPU twin of ``DeviceCopies``: the same files, compared exactly with pyarrow, run both ways.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from test_arrow_compressed import (
    _assert_same,
    _hostile_file,
    _plain,
    _read_quietly,
    _reference,
    _spy,
    _store_uncompressed,
    _table,
    _write,
)

import pystrom
from pystrom.io.arrow.codecs import staged as inflate_staged
from pystrom.io.arrow.codecs.decompress import staged
from pystrom.io.arrow.codecs.plan import ALIGN, GAP, cut, up
from pystrom.io.arrow.codecs.staged import HostCopies, merge_copies, staging_layout
from pystrom.io.arrow.read import compressed_reads
from pystrom.memory.backend import resolve_device

from conftest import device_memory_in_use, needs_gpu

CODECS = ["lz4", "zstd"]


@pytest.fixture
def staged_reads(device, monkeypatch):
    """Every codec through the staged path (the CPU twin on the CPU); the readers made, to read counters."""
    monkeypatch.setattr(compressed_reads, "staged", lambda backend, codec: True)
    return _spy(monkeypatch)


def _used_staged(seen) -> None:
    assert seen and all(r._staged.slices > 0 for r in seen if r.frames_inflated)


# -- whole files, exactly as pyarrow reads them --------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("nulls", [False, True])
def test_every_type_many_batches(tmp_path, device, codec, nulls, staged_reads):
    table = _table(3000, nulls)
    path = tmp_path / "c.arrow"
    _write(path, table, codec, lengths=[5, 0, 13, 8, 64, 1, 100, 0] + [7] * 300)  # zero-row batches too
    _assert_same(_read_quietly(path, device=device), _reference(path))
    _used_staged(staged_reads)


@pytest.mark.parametrize("codec", CODECS)
def test_many_slices_reuse_the_staging(tmp_path, device, codec, staged_reads, monkeypatch):
    table = _table(4000, True)
    path = tmp_path / "m.arrow"
    _write(path, table, codec, lengths=[50] * 80)
    monkeypatch.setattr(compressed_reads, "scratch_bytes", lambda backend: 20_000)  # many slices, both buffers reused
    _assert_same(_read_quietly(path, device=device), _reference(path))
    reader = staged_reads[-1]
    assert reader._staged.slices > 10 and reader.slices == reader._staged.slices


@pytest.mark.parametrize("codec", CODECS)
def test_buffers_stored_uncompressed_and_empty(tmp_path, device, codec, staged_reads):
    rng = np.random.default_rng(7)
    n = 400
    table = pa.table({"r": rng.integers(0, 2**63, n, dtype=np.int64), "s": [b"" if i % 3 else bytes(rng.bytes(i % 5))
                      for i in range(n)], "m": pa.array(rng.standard_normal(n), mask=rng.random(n) < 0.3)})  # fmt: skip
    path = tmp_path / "u.arrow"
    _write(path, table, codec, lengths=[4, 0] * 100)
    assert _store_uncompressed(path, table) > 50
    _assert_same(_read_quietly(path, device=device), _reference(path))


@pytest.mark.parametrize("codec", CODECS)
def test_columns_and_scan(tmp_path, device, codec, staged_reads):
    table = _table(2000, True)
    path = tmp_path / "w.arrow"
    _write(path, table, codec, lengths=[250] * 8)
    cols = ["string", "int64", "list_i32", "dict"]
    _assert_same(_read_quietly(path, columns=cols, device=device), _reference(path, cols))
    scan = pystrom.scan_arrow(path, columns=["int64", "string"], batch_rows=500, device=device)
    _assert_same(scan.collect(), _reference(path, ["int64", "string"]))


@pytest.mark.parametrize("codec", CODECS)
def test_reader_partial_shared_and_unaligned_reads(tmp_path, device, codec, monkeypatch):
    from pystrom.io.arrow.file.ranges import RangeReader

    monkeypatch.setattr(compressed_reads, "staged", lambda backend, codec: True)
    path, raw, packed = _hostile_file(tmp_path, codec)
    raw = bytes(raw)
    backend = resolve_device(device)
    xp = backend.xp
    big = [p for p in packed if p.size > 200]
    plain = {p.offset: _plain(raw, p) for p in big}
    with RangeReader(str(path), backend) as files, backend.activate():
        reader = compressed_reads.InflatingReader(files, packed, scratch=100_000)
        table = xp.full(sum(p.size for p in big) + 64, 0xEE, dtype=np.uint8)  # whole reads, back to back
        at, whole = 0, []
        for p in big[0::3]:
            whole.append((p, table[at : at + p.size]))
            at += p.size
        skewed = [(p, xp.zeros(p.size + 1, dtype=np.uint8)[1:]) for p in big[1::3]]
        halves = [(p, xp.zeros(p.size // 2, dtype=np.uint8), xp.zeros(p.size - p.size // 2, dtype=np.uint8))
                  for p in big[2::3]]  # fmt: skip
        for p, dst in reversed(whole + skewed):
            reader.read(p.offset, p.size, dst)
        for p, a, b in halves:
            reader.read(p.offset + p.size // 2, p.size - p.size // 2, b)
            reader.read(p.offset, p.size // 2, a)
        reader.wait()
        host = backend.to_host
        for p, dst in whole + skewed:
            assert host(dst).tobytes() == plain[p.offset], p.what
        for p, a, b in halves:
            assert host(a).tobytes() + host(b).tobytes() == plain[p.offset], p.what
        assert (host(table)[at:] == 0xEE).all()  # nothing past the last whole read
    assert reader.frames_inflated == len(whole) + len(skewed) + len(halves)


# -- corrupt frames: the same error as the other path, nothing left behind -----------------------------


def _refusal(path, device) -> str:
    """The FileFormatError's message (the exception itself not kept: its frames hold the read's memory)."""
    try:
        pystrom.read_arrow(path, device=device)
    except pystrom.FileFormatError as exc:
        return str(exc)
    pytest.fail(f"{path} was read")


@pytest.mark.parametrize("codec", CODECS)
def test_a_corrupt_frame_in_the_middle(tmp_path, device, codec, monkeypatch):
    path, raw, packed = _hostile_file(tmp_path, codec)
    p = [q for q in packed if "(values)" in q.what][len(packed) // 6]
    raw[p.frame.offset + 1] ^= 0xFF  # its magic number: refused by both codecs' decoders, the same way
    path.write_bytes(bytes(raw))
    good = tmp_path / "good.arrow"
    _write(good, _table(500, True), codec, lengths=[100] * 5)
    _read_quietly(good, device=device)  # CuPy's and the pinned pools warm
    before = device_memory_in_use(device)
    direct = _refusal(path, device)
    monkeypatch.setattr(compressed_reads, "staged", lambda backend, codec: True)
    monkeypatch.setattr(compressed_reads, "scratch_bytes", lambda backend: 30_000)  # the bad frame in a later slice
    staged_msg = _refusal(path, device)
    assert p.what in staged_msg and "corrupt file" in staged_msg and p.what in direct
    if codec == "zstd" or device == "cpu":  # (LZ4 on a GPU: its kernel gave the first message)
        assert staged_msg == direct
    assert device_memory_in_use(device) == before
    _assert_same(_read_quietly(good, device=device), _reference(good))  # the reader's state is sound after


@pytest.mark.parametrize("codec", CODECS)
def test_a_lying_length_prefix(tmp_path, device, codec, monkeypatch):
    path, raw, packed = _hostile_file(tmp_path, codec)
    p = [q for q in packed if "(values)" in q.what][5]
    raw[p.frame.offset - 8 : p.frame.offset] = struct.pack("<q", p.size + 8)
    path.write_bytes(bytes(raw))
    monkeypatch.setattr(compressed_reads, "staged", lambda backend, codec: True)
    with pytest.raises(pystrom.FileFormatError, match=f"its length prefix claims {p.size + 8:,}") as info:
        pystrom.read_arrow(path, device=device)
    assert p.what in str(info.value)


# -- the pieces, on the host -----------------------------------------------------------------------------


def test_which_codecs_are_staged(monkeypatch):
    class Gpu:
        kind = "cuda"

    assert not staged(resolve_device("cpu"), "zstd") and not staged(resolve_device("cpu"), "lz4_frame")
    monkeypatch.delenv("PYSTROM_NVCOMP", raising=False)
    # ZSTD: kernels/zstd.cu by default, the CPU codecs (staged) with gpu_zstd_decoder="host"
    assert not staged(Gpu(), "zstd") and not staged(Gpu(), "lz4_frame")
    with pystrom.defaults.set(gpu_zstd_decoder="host"):
        assert staged(Gpu(), "zstd") and not staged(Gpu(), "lz4_frame")
    monkeypatch.setenv("PYSTROM_NVCOMP", "1")
    from pystrom.io.arrow.codecs.device import nvcomp_available

    if nvcomp_available():
        assert not staged(Gpu(), "zstd")
    else:  # asked for and not there: said, not a quiet fallback to the CPU codecs (tests/test_missing_extras.py)
        with pytest.raises(pystrom.MissingDependencyError, match="nvcomp-cu13"):
            staged(Gpu(), "zstd")


def test_staging_layout_follows_the_destinations():
    size = np.array([100, 64, 30, 50, 7, 200], dtype=np.int64)
    # frames 3, 0, 1 land back to back (in that order); 2 alone; 4 partial (not whole); 5 back to back after 2
    ptr = np.array([1000, 1100, 5000, 950, 0, 5030], dtype=np.int64)
    whole = np.array([True, True, True, True, False, True])
    at = staging_layout(ptr, size, whole)
    assert at[0] == at[3] + 50 and at[1] == at[0] + 100  # a run: one copy
    assert at[5] == at[2] + 30
    runs = sorted([(at[3], 214), (at[2], 230)])
    assert all(a % ALIGN == 0 for a, _ in runs) and runs[0][0] + up(runs[0][1]) <= runs[1][0]
    assert at[4] % ALIGN == 0 and at[4] >= runs[1][0] + runs[1][1]
    dst, src, n = merge_copies(ptr[whole], at[whole], size[whole])
    assert dst.tolist() == [950, 5000] and n.tolist() == [214, 230] and src.tolist() == [at[3], at[2]]


def test_merge_copies():
    dst = np.array([300, 100, 110, 200, 120, 500], dtype=np.int64)
    src = np.array([30, 0, 10, 90, 25, 40], dtype=np.int64)
    size = np.array([5, 10, 10, 0, 4, 1], dtype=np.int64)
    got = [a.tolist() for a in merge_copies(dst, src, size)]
    # 100 and 110 merge (contiguous at both ends); 120 follows in dst but not in src; 200 is empty
    assert got == [[100, 120, 300, 500], [0, 25, 30, 40], [20, 4, 5, 1]]
    assert [a.tolist() for a in merge_copies(dst[:0], src[:0], size[:0])] == [[], [], []]


def test_copies_into_two_arrays_are_never_merged():
    """Two destination arrays back to back in memory (CuPy's pool places small ones so) stay two copies:
    one cudaMemcpyAsync across two allocations fails with cudaErrorInvalidValue."""
    dst = np.array([100, 110, 120], dtype=np.int64)
    src = np.array([0, 10, 20], dtype=np.int64)
    size = np.array([10, 10, 10], dtype=np.int64)
    region = np.array([0, 0, 1], dtype=np.int64)
    got = [a.tolist() for a in merge_copies(dst, src, size, region)]
    assert got == [[100, 120], [0, 20], [20, 10]]


def test_check_copies_refuses_a_copy_out_of_its_destination():
    lo, hi = np.array([100, 200]), np.array([150, 300])
    ok = (np.array([100, 250]), np.array([50, 50]))
    inflate_staged.check_copies("f", *ok, lo, hi, np.array([0, 50]), 0, 100)
    for dst, size, src in (
        ([100, 260], [50, 50], [0, 50]),  # past its array's end
        ([90, 250], [10, 50], [0, 50]),  # before its start
        ([100, 250], [50, 60], [0, 50]),  # past staging
        ([100, 250], [50, 0], [0, 50]),
    ):  # empty: merge_copies drops those
        with pytest.raises(pystrom.errors.FileFormatError, match="'f': a copy of .* pystrom bug"):
            inflate_staged.check_copies("f", np.array(dst), np.array(size), lo, hi, np.array(src), 0, 100)


class _AllocationCopies(HostCopies):
    """The copies' CPU twin with CUDA's rule: one copy stays inside one allocation (``allocations``: the
    destination arrays), else cudaMemcpyAsync answers cudaErrorInvalidValue."""

    def __init__(self, allocations):
        self.extents = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in allocations]

    def copy(self, dst, src, size):
        for d, n in zip(dst.tolist(), size.tolist()):
            if not any(lo <= d and d + n <= hi for lo, hi in self.extents):
                raise RuntimeError("cudaErrorInvalidValue: invalid argument (a copy across two allocations)")
        super().copy(dst, src, size)


@pytest.mark.parametrize("codec", CODECS)
def test_frames_for_arrays_back_to_back_are_copied_array_by_array(tmp_path, codec, monkeypatch):
    """The cause of gpu-zstd-invalid-value-*.arrow's cudaErrorInvalidValue on an H100: two reads' arrays
    adjacent in memory got one merged copy; here two views of one buffer stand for two pool allocations."""
    from pystrom.io.arrow.file.metadata import direct_types, open_arrow_file
    from pystrom.io.arrow.file.ranges import RangeReader
    from pystrom.io.arrow.read.batches import batch_layouts

    monkeypatch.setattr(compressed_reads, "staged", lambda backend, codec: True)
    table = pa.table({"x": np.arange(128, dtype=np.int64)})
    path = tmp_path / "two.arrow"
    _write(path, table, codec, lengths=[64, 64])  # 512 bytes a batch: whole frames, 64-byte multiples
    cpu = resolve_device("cpu")
    with open_arrow_file(str(path)) as f:
        layouts = batch_layouts(f, ["x"], direct_types(f.schema, ["x"]))
        values = layouts.chunks["x"].values
        assert (values.offset >= compressed_reads.PACKED_BASE).all()  # stored compressed
        whole = np.zeros(1024 + 64, dtype=np.uint8)
        start = (-whole.ctypes.data) % 64
        a, b = whole[start : start + 512], whole[start + 512 : start + 1024]
        with RangeReader(f.path, cpu, fd=f.fileno()) as files:
            reader = compressed_reads.InflatingReader(files, layouts.packed)
            reader._staged.copies = _AllocationCopies([a, b])
            reader.read_many(values.offset[:1], values.size[:1], a, np.zeros(1, np.int64))
            reader.read_many(values.offset[1:], values.size[1:], b, np.zeros(1, np.int64))
            reader.wait()
    assert (a.view(np.int64) == np.arange(64)).all() and (b.view(np.int64) == np.arange(64, 128)).all()


def test_cut_budgets_runs_and_places():
    rng = np.random.default_rng(1)
    n = 300
    frame_size = rng.integers(1, 5000, n)
    gaps = rng.choice([0, 8, 100, GAP, GAP + 1, 1 << 20], n)
    offset = np.cumsum(gaps + np.concatenate([[0], frame_size[:-1]]))
    dst_cost = np.where(rng.random(n) < 0.5, 0, up(rng.integers(1, 9000, n)))
    file = rng.integers(0, 256, int(offset[-1] + frame_size[-1]), dtype=np.uint8)
    for budget in (1, 10_000, 200_000, 1 << 40):
        slices = cut(offset, frame_size, dst_cost, budget)
        assert [s.lo for s in slices] == [0, *[s.hi for s in slices[:-1]]] and slices[-1].hi == n
        if budget == 1:
            assert len(slices) == n
        if budget == 1 << 40:
            assert len(slices) == 1
        for s in slices:
            assert s.hi - s.lo == 1 or s.src_bytes + s.dst_bytes <= budget
            src = np.zeros(s.src_bytes, dtype=np.uint8)
            for off, size, at in s.runs.tolist():
                assert at % ALIGN == 0
                src[at : at + size] = file[off : off + size]
            for i in range(s.lo, s.hi):  # every frame's bytes where the plan says
                a = int(s.src_at[i - s.lo])
                assert (src[a : a + frame_size[i]] == file[offset[i] : offset[i] + frame_size[i]]).all()
            cost = dst_cost[s.lo : s.hi]
            assert ((s.dst_at < 0) == (cost == 0)).all() and s.dst_bytes == cost.sum()
            used = s.dst_at >= 0
            ends = np.sort(s.dst_at[used])
            assert (np.diff(ends) >= 0).all() and (s.dst_at[used] % ALIGN == 0).all()
        joined = [s for s in slices if len(s.runs) < s.hi - s.lo]
        assert budget == 1 or joined  # frames at most GAP apart are one read


def test_host_copies_twin():
    src = np.arange(256, dtype=np.uint8)
    dst = np.zeros(256, dtype=np.uint8)
    c = HostCopies()
    base_d, base_s = dst.ctypes.data, src.ctypes.data
    c.copy(*merge_copies(np.array([base_d + 10, base_d + 100]), np.array([base_s + 0, base_s + 50]), np.array([5, 20])))
    c.wait(c.mark())
    assert dst[10:15].tolist() == list(range(5)) and dst[100:120].tolist() == list(range(50, 70))
    assert dst[:10].sum() == 0 and dst[15:100].sum() == 0 and dst[120:].sum() == 0
    assert c.staging(1000).shape == (1000,)


# -- GPU only ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_zstd_on_a_gpu_is_staged_by_itself(tmp_path, monkeypatch):
    """With gpu_zstd_decoder="host" every ZSTD frame takes the staged path; by default (kernels/zstd.cu) none."""
    monkeypatch.delenv("PYSTROM_NVCOMP", raising=False)
    seen = _spy(monkeypatch)
    table = _table(20_000, True)
    path = tmp_path / "z.arrow"
    _write(path, table, "zstd", lengths=[37] * 500)
    with pystrom.defaults.set(gpu_zstd_decoder="host"):
        _assert_same(_read_quietly(path, device="cuda"), _reference(path))
    reader = seen[-1]
    assert reader._staged.slices > 0 and reader.slices == reader._staged.slices  # no frame on the device path
    assert reader.bytes_read > 0
    _assert_same(_read_quietly(path, device="cuda"), _reference(path))
    reader = seen[-1]
    assert reader._staged.slices == 0 and reader.slices > 0


@pytest.mark.gpu
@needs_gpu
def test_device_copies_match_the_twin():
    import cupy as cp

    backend = resolve_device("cuda")
    rng = np.random.default_rng(3)
    copies = inflate_staged.DeviceCopies(backend)
    with backend.activate():
        stage = copies.staging(1 << 20)
        stage[:] = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
        out = cp.zeros(1 << 20, dtype=np.uint8)
        cp.cuda.Device().synchronize()  # the zeros are written on the legacy stream, the copies on another
        host = np.zeros(1 << 20, dtype=np.uint8)
        starts = np.sort(rng.choice(np.arange(0, (1 << 20) - 5000, 5000), 100, replace=False))
        sizes = rng.integers(0, 5000, 100)
        srcs = rng.integers(0, (1 << 20) - 5000, 100)
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            copies.copy(*merge_copies(out.data.ptr + starts, stage.ctypes.data + srcs, sizes))
            mark = copies.mark()
        copies.wait(mark)
        HostCopies().copy(*merge_copies(host.ctypes.data + starts, stage.ctypes.data + srcs, sizes))
        assert (out.get() == host).all()
