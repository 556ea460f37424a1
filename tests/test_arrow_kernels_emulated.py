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


def _count_bits(kernel, bitmap: np.ndarray, offset: int, count: int, max_blocks: int = 3) -> int:
    out = np.zeros(1, dtype=np.uint64)
    touched = (offset + count - 1) // 8 - offset // 8 + 1 if count else 0
    kernel.launch("count_bits", max(touched, 1), (bitmap, np.int64(offset), np.int64(count), out),
                  max_blocks=max_blocks)  # fmt: skip
    return int(out[0])


def _count_nonzero_bytes(kernel, data: np.ndarray, max_blocks: int = 3) -> int:
    out = np.zeros(1, dtype=np.uint64)
    kernel.launch("count_nonzero_bytes", max(16, data.shape[0] // 16), (data, np.int64(data.shape[0]), out),
                  max_blocks=max_blocks)  # fmt: skip
    return int(out[0])


_COUNTS = [(0, 0), (0, 1), (5, 1), (3, 5), (0, 8), (7, 9), (13, 2387), (0, 2400), (1, 2392)]


def _count_cases():
    """Byte masks misaligned by 0, 1, 7 and 15 bytes, lengths around the 16-byte words, every byte value."""
    rng = np.random.default_rng(5)
    raw = np.zeros(20_000, dtype=np.uint8)
    for misalign in (0, 1, 7, 15):
        for n in (0, 1, 15, 16, 17, 33, 4097, 12_345):
            data = raw[misalign : misalign + n]
            data[:] = rng.integers(0, 256, n) * (rng.random(n) < 0.6)
            yield misalign, data


def test_count_bits_and_count_nonzero_bytes(kernels):
    """memory/bitmap.py count_set and count_true on a GPU: the C++ core's count_bits and NumPy's
    count_nonzero are the twins, over bitmaps cut at every bit and masks at every alignment."""
    rng = np.random.default_rng(4)
    bitmap = rng.integers(0, 256, 300, dtype=np.uint8)
    for offset, count in _COUNTS:
        got = _count_bits(kernels["bitmap"], bitmap, offset, count)
        assert got == _core.count_bits(bitmap, offset, count), (offset, count)
    for misalign, data in _count_cases():
        assert _count_nonzero_bytes(kernels["bitmap"], data) == np.count_nonzero(data), (misalign, data.shape[0])


_COUNT_MUTANTS = {
    "the first byte's bits before the offset": ("if (b == first) v &= 0xFFu << (bit_offset & 7);", ""),
    "the last byte's bits past the count": ("if (b == last) v &= 0xFFu >> (7 - ((bit_offset + count - 1) & 7));",
                                            ""),
    "a lane's count not summed": ("c += __shfl_down_sync(0xffffffffu, c, o);", "(void)o;"),
    "the zero-byte test": ("return __popc(t);", "return __popc(t & 0x7F7F7F7Fu);"),
    "the unaligned head": ("if (tid < head) c += src[tid] != 0;", ""),
    "the tail": ("for (long long i = head + (words << 4) + tid; i < n; i += stride) c += src[i] != 0;", ""),
}  # fmt: skip


@pytest.mark.parametrize("mutant", sorted(_COUNT_MUTANTS))
def test_a_broken_counting_kernel_fails_the_comparison(tmp_path, mutant):
    """The mutation check of the test above: each planted bug makes a count disagree with its twin."""
    kernel = simt.Emulated("bitmap", tmp_path, mutant=_COUNT_MUTANTS[mutant])
    rng = np.random.default_rng(4)
    bitmap = rng.integers(0, 256, 300, dtype=np.uint8)
    wrong = [(o, c) for o, c in _COUNTS if _count_bits(kernel, bitmap, o, c) != _core.count_bits(bitmap, o, c)]
    wrong += [(m, d.shape[0]) for m, d in _count_cases() if _count_nonzero_bytes(kernel, d) != np.count_nonzero(d)]
    assert wrong, f"{mutant}: every count still agrees"


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


# -- UTF-8 (kernels/utf8.cu) ------------------------------------------------------------------------------


def _utf8_corpus() -> list[list[bytes]]:
    """String columns, most with one kind of fault: the faults Table 3-7 of Unicode rules out, each in a
    column of its own (so a loosened kernel differs from the twin somewhere), rows cut inside a character,
    long ASCII runs (the kernel's word path) and valid text of every sequence length."""
    rng = np.random.default_rng(11)
    text = ["a", "é", "€", "𝄞", "x" * 40, "", "日本語", "ÿ", "\U0010ffff", "\ud7ff", "\ue000"]

    def valid(k: int) -> list[bytes]:
        return [("".join(rng.choice(text, int(rng.integers(0, 5))))).encode() for _ in range(k)]

    faults = [b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
              b"\xf0\x80\x80\xaf", b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff",
              b"\x80", b"\xbf\xbf", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3", b"\xe2\x28\xa1", b"\xc3\x28",
              b"\xc3\xa9\xa9", b"\xf0\x9f\x98\x80\x80"]  # fmt: skip
    columns = [valid(50), valid(300), [b"x" * 100] * 20, []]
    for f in faults:
        for where in ("start", "middle", "end"):
            col = valid(int(rng.integers(3, 40)))
            at = {"start": 0, "middle": len(col) // 2, "end": len(col) - 1}[where]
            col[at] = col[at] + f if where != "start" else f + col[at]
            columns.append(col)
    for _ in range(6):  # a character cut by a string boundary: the bytes whole are valid
        col = valid(30)
        whole = "€𝄞é".encode()
        cut = int(rng.integers(1, 3))
        at = int(rng.integers(0, 29))
        col[at], col[at + 1] = col[at] + whole[:cut], whole[cut:] + col[at + 1]
        columns.append(col)
    columns.append([b"A" * 16 + b"\xe0\x80" + b"B" * 30])  # a fault inside a word of the fast path
    columns.append([b"A" * 7 + b"\xff" + b"B" * 16, b"C" * 9])  # in a word's last byte
    return columns


def _utf8_arrays(columns: list[list[bytes]], misalign: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for col in columns:
        offsets = np.zeros(len(col) + 1, dtype=np.int32)
        offsets[1:] = np.cumsum([len(s) for s in col])
        # continuation bytes past the data's end (the next buffer's bytes): a sequence cut by the end of
        # the data must be refused by its own end, not by the zeros after it
        raw = np.full(int(offsets[-1]) + 16, 0x80, dtype=np.uint8)
        data = raw[misalign : misalign + int(offsets[-1])]
        data[:] = np.frombuffer(b"".join(col), dtype=np.uint8)
        out.append((data, offsets))
    return out


def _utf8_truth(col: list[bytes]) -> int:
    for i, s in enumerate(col):
        try:
            s.decode("utf-8")  # Python's decoder refuses what Table 3-7 refuses (surrogates, overlongs...)
        except UnicodeDecodeError:
            return i
    return -1


def _utf8_launch(kernel, arrays: list[tuple[np.ndarray, np.ndarray]], grid_x: int) -> list[int]:
    table = np.array([[d.ctypes.data if d.shape[0] else o.ctypes.data, o.ctypes.data, o.shape[0] - 1]
                      for d, o in arrays], dtype=np.int64).reshape(-1)  # fmt: skip
    out = np.full(len(arrays), np.iinfo(np.uint64).max, dtype=np.uint64)
    kernel.launch_grid("utf8_check", (grid_x, len(arrays)), (table, np.int64(len(arrays)), out), threads=64)
    return [-1 if r == np.iinfo(np.uint64).max else int(r) for r in out]


@pytest.fixture(scope="module")
def utf8_kernel(tmp_path_factory):
    return simt.Emulated("utf8", tmp_path_factory.mktemp("utf8"))


@pytest.mark.parametrize("misalign", [0, 3])
def test_utf8_kernel_twin_and_core_find_the_first_bad_row(utf8_kernel, misalign):
    """kernels/utf8.cu against its NumPy twin, the C++ core's check and Python's decoder, row for row;
    data 8-byte aligned (the kernel's word path) or not (byte by byte)."""
    from pystrom.io.arrow.read.utf8 import first_bad_rows_twin

    columns = _utf8_corpus()
    arrays = _utf8_arrays(columns, misalign)
    truth = [_utf8_truth(c) for c in columns]
    assert sum(t >= 0 for t in truth) > 60 and sum(t < 0 for t in truth) >= 4
    assert first_bad_rows_twin(arrays) == truth
    assert [_core.utf8_first_bad_row(d, o, None, 0) for d, o in arrays] == truth
    assert _utf8_launch(utf8_kernel, arrays, grid_x=2) == truth


_LOOSENED = {
    "overlong E0": ("if (b == 0xE0) lo = 0xA0;", ""),
    "surrogates": ("if (b == 0xED) hi = 0x9F;", ""),
    "overlong F0": ("if (b == 0xF0) lo = 0x90;", ""),
    "above U+10FFFF": ("if (b == 0xF4) hi = 0x8F;", ""),
    "C0 and C1 leads": ("if (b < 0xC2) return 0;", "if (b < 0xC0) return 0;"),
    "F5 to F7 leads": ("if (b < 0xF5) return 4;", "if (b < 0xF8) return 4;"),
    "cut rows": ("utf8_continuation(d[s]) && utf8_covered(d, s)", "false"),
    "orphan continuations": ("return !utf8_covered(d, p);", "return false;"),
    "the word path's top byte": ("0x8080808080808080ULL", "0x0080808080808080ULL"),
    "truncated sequences": ("if (len == 0 || p + len > size) return true;", "if (len == 0) return true;"),
}  # fmt: skip


@pytest.mark.parametrize("loosened", sorted(_LOOSENED))
def test_a_loosened_utf8_kernel_fails_the_comparison(tmp_path, loosened):
    """The mutation check of the test above: each rule of the kernel loosened on its own makes the kernel
    disagree with its twin on the corpus (so that test would fail), on aligned data."""
    from pystrom.io.arrow.read.utf8 import first_bad_rows_twin

    old, new = _LOOSENED[loosened]
    mutant = simt.Emulated("utf8", tmp_path, mutant=(old, new))
    arrays = _utf8_arrays(_utf8_corpus(), 0)
    assert _utf8_launch(mutant, arrays, grid_x=1) != first_bad_rows_twin(arrays)
