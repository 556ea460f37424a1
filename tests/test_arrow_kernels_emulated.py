"""The Arrow read path's GPU kernels (bitmap.cu, strings.cu, copies.cu, arrow_checks.cu) run on the CPU
under tests/simt.py's emulation against their CPU twins (the C++ core and NumPy), with the arguments the
read path passes (io/arrow/read/direct.py, compressed_reads.py, offsets.py; memory/bitmap.py; _ops.py).
CI has no GPU: this is where a change to these kernels is first checked; the GPU machine runs the real ones
in the arrow tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import simt

from pystrom import _core
from pystrom.io.arrow.read.offsets import _check_host

pytestmark = pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    work = tmp_path_factory.mktemp("arrow_kernels")
    return {name: simt.Emulated(name, work) for name in ("bitmap", "strings", "copies", "arrow_checks")}


def test_unpack_bits_and_pack_bits(kernels):
    rng = np.random.default_rng(1)
    bitmap = rng.integers(0, 256, 300, dtype=np.uint8)
    for offset, count in ((0, 0), (0, 1), (3, 700), (13, 2387), (7, 1)):
        out = np.full(count, 7, dtype=bool)
        kernels["bitmap"].launch("unpack_bits", count, (bitmap, np.int64(offset), np.int64(count), out), max_blocks=3)
        want = np.unpackbits(bitmap, bitorder="little")[offset : offset + count].astype(bool)
        assert np.array_equal(out, want), (offset, count)
    for count, shift in ((1, 0), (9, 0), (700, 3), (2051, 7)):
        mask = rng.random(count) < 0.5
        nbytes = (shift + count + 7) // 8
        out = np.full(nbytes, 0xEE, dtype=np.uint8)
        kernels["bitmap"].launch("pack_bits", nbytes, (mask.view(np.uint8), np.int64(count), np.int32(shift), out,
                                                       np.int64(nbytes)), max_blocks=3)  # fmt: skip
        bits = np.concatenate([np.zeros(shift, dtype=bool), mask])
        assert np.array_equal(out, np.packbits(bits, bitorder="little")), (count, shift)


def test_unpack_bit_spans(kernels):
    """A block a batch: each batch's bitmap (or none: the fill byte) unpacked to its place."""
    rng = np.random.default_rng(2)
    scratch = rng.integers(0, 256, 4096, dtype=np.uint8)
    where = np.array([0, -1, 128, 1024, 3000], dtype=np.int64)
    first = np.array([0, 0, 5, 3, 7], dtype=np.int64)
    count = np.array([300, 40, 1, 2000, 77], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    table = np.ascontiguousarray(np.stack([where, first, count, start]))
    for fill in (0, 1):
        want = np.full(int(count.sum()) + 8, 0xEE, dtype=np.uint8)
        got = want.copy()
        _core.unpack_bit_spans(scratch, table, fill, want)
        kernels["bitmap"].launch("unpack_bit_spans", 5 * 256, (scratch, table, np.int64(5), np.int32(fill), got),
                                 max_blocks=5)  # fmt: skip
        assert np.array_equal(got, want), fill


def test_shift_spans(kernels):
    rng = np.random.default_rng(3)
    src = rng.integers(0, 1 << 30, 5000).astype(np.int32)
    at = np.array([0, 100, 2000, 4000], dtype=np.int64)
    count = np.array([50, 1, 1500, 1000], dtype=np.int64)
    shift = np.array([0, -5, 123456, 7], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    table = np.ascontiguousarray(np.stack([at, count, shift, start]))
    want = np.full(int(count.sum()) + 4, -1, dtype=np.int32)
    got = want.copy()
    _core.shift_spans(src, table, want)
    kernels["strings"].launch("shift_spans", 4 * 256, (src, table, np.int64(4), got), max_blocks=4)
    assert np.array_equal(got, want)


def test_copy_out(kernels):
    rng = np.random.default_rng(4)
    src = rng.integers(0, 256, 10_000, dtype=np.uint8)
    offsets = np.array([0, 17, 5000, 9999, 64], dtype=np.int64)
    sizes = np.array([16, 3000, 4999, 1, 0], dtype=np.int64)
    dst_cpu = np.full(9000, 0xEE, dtype=np.uint8)
    dst_gpu = dst_cpu.copy()
    places = np.array([0, 100, 3200, 8300, 8999], dtype=np.int64)
    for dst in (dst_cpu, dst_gpu):
        table = np.ascontiguousarray(np.stack([offsets, dst.ctypes.data + places, sizes]))
        if dst is dst_cpu:
            _core.copy_out(src, table)
        else:
            kernels["copies"].launch("copy_out", 5 * 256, (src, table, np.int64(5)), max_blocks=5)
    assert np.array_equal(dst_gpu, dst_cpu)


def test_check_offsets(kernels):
    """Per segment (first, last, bad): the kernel against the NumPy twin, with decreasing offsets, a
    negative start and an end past the data inside some segments and on their edges."""
    rng = np.random.default_rng(5)
    segs = []
    for k in range(40):
        n = int(rng.integers(1, 700))
        o = np.cumsum(rng.integers(0, 5, n)).astype(np.int64) + int(rng.integers(0, 3))
        size = int(o[-1]) + int(rng.integers(-1, 3))
        if k % 4 == 1:
            o[int(rng.integers(0, n))] -= 10
        if k % 7 == 3:
            o[0] = -1
        segs.append((o.astype(np.int32), size))
    counts = np.array([len(o) for o, _ in segs], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    scratch = np.concatenate([o for o, _ in segs])
    sizes = np.array([s for _, s in segs], dtype=np.int64)
    f, la, bad = _check_host(scratch, starts, counts, sizes)
    n = len(segs)
    meta = np.concatenate([starts, counts, sizes])
    out = np.zeros(3 * n, dtype=np.int64)
    # offsets.py's launch: a (grid_x, segments) grid of 256-thread blocks; emulated with one block per
    # segment row, grid_x 1: the kernel strides over a segment's entries
    kernels["arrow_checks"].launch_grid("check_offsets", (1, n), (scratch, meta[:n], meta[n : 2 * n], meta[2 * n :],
                                                                 np.int64(n), out))  # fmt: skip
    got = out.reshape(n, 3)
    assert np.array_equal(got[:, 0], f) and np.array_equal(got[:, 1], la)
    assert np.array_equal(got[:, 2] != 0, bad) and bad.any() and not bad.all()


def test_gather_varbinary(kernels):
    """A filter's string gather (_ops.py): the selected rows' bytes at the prefix sums of their lengths."""
    rng = np.random.default_rng(6)
    lengths = rng.integers(0, 30, 2000)
    src_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    src_data = rng.integers(0, 256, int(src_offsets[-1]), dtype=np.uint8)
    rows = np.sort(rng.choice(2000, 700, replace=False)).astype(np.int64)
    dst_offsets = np.concatenate([[0], np.cumsum(lengths[rows])]).astype(np.int32)
    want = np.full(int(dst_offsets[-1]) + 8, 0xEE, dtype=np.uint8)
    got = want.copy()
    _core.gather_varbinary(src_offsets, src_data, rows, dst_offsets, want)
    kernels["strings"].launch("gather_varbinary", len(rows), (src_offsets, src_data, np.int64(src_data.size), rows,
                                                               np.int64(len(rows)), dst_offsets, got,
                                                               np.int64(got.size - 8)), max_blocks=2)  # fmt: skip
    assert np.array_equal(got, want) and (want[-8:] == 0xEE).all()


def test_gather_varbinary_stays_inside_both_buffers_when_offsets_change(kernels):
    """Offsets rewritten by another process after the lengths were counted (issue 36): the GPU gather
    clamps every range to its buffers and its row's slot, so the bytes are wrong, never out of bounds."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 20, 500)
    src_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    src_data = rng.integers(0, 256, int(src_offsets[-1]), dtype=np.uint8)
    rows = np.arange(0, 500, 3, dtype=np.int64)
    dst_offsets = np.concatenate([[0], np.cumsum(lengths[rows])]).astype(np.int32)
    scribbled = src_offsets.copy()
    scribbled[[3, 30, 31, 300]] = [1 << 30, -(1 << 20), 7, 2**31 - 1]  # after dst_offsets were computed
    size = int(dst_offsets[-1])
    got = np.full(size + 64, 0xEE, dtype=np.uint8)
    kernels["strings"].launch("gather_varbinary", len(rows), (scribbled, src_data, np.int64(src_data.size), rows,
                                                               np.int64(len(rows)), dst_offsets, got,
                                                               np.int64(size)), max_blocks=2)  # fmt: skip
    assert (got[size:] == 0xEE).all()  # nothing written past the destination
    for i, r in enumerate(rows):  # every row: a prefix of its clamped source range, inside its own slot
        start = min(max(int(scribbled[r]), 0), src_data.size)
        end = min(max(int(scribbled[r + 1]), start), src_data.size)
        a, b = int(dst_offsets[i]), int(dst_offsets[i + 1])
        n = min(end - start, b - a)
        assert np.array_equal(got[a : a + n], src_data[start : start + n]), r
