"""The bitmap helpers (C++ core on the CPU, CUDA kernels on a GPU) against a NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pystrom import _core
from pystrom.memory import bitmap as _bitmap
from pystrom.memory.backend import resolve_device


def reference_bits(buf: np.ndarray, offset: int, count: int) -> np.ndarray:
    return np.unpackbits(buf, bitorder="little")[offset : offset + count].astype(bool)


@st.composite
def bit_ranges(draw):
    size = draw(st.integers(1, 64))
    buf = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), dtype=np.uint8).copy()
    offset = draw(st.integers(0, size * 8))
    count = draw(st.integers(0, size * 8 - offset))
    return buf, offset, count


@given(src=bit_ranges(), dst_size=st.integers(1, 64), data=st.data())
def test_copy_bits_matches_reference(src, dst_size, data):
    buf, offset, count = src
    dst = np.frombuffer(data.draw(st.binary(min_size=dst_size, max_size=dst_size)), dtype=np.uint8).copy()
    if count > dst_size * 8:
        count = dst_size * 8
    dst_offset = data.draw(st.integers(0, dst_size * 8 - count))
    expected = np.unpackbits(dst, bitorder="little").astype(bool)
    expected[dst_offset : dst_offset + count] = reference_bits(buf, offset, count)
    _core.copy_bits(buf, offset, dst, dst_offset, count)
    np.testing.assert_array_equal(np.unpackbits(dst, bitorder="little").astype(bool), expected)


@given(src=bit_ranges())
def test_unpack_and_count_match_reference(src):
    buf, offset, count = src
    out = np.empty(count, dtype=np.uint8)
    _core.unpack_bits(buf, offset, out, count)
    np.testing.assert_array_equal(out.astype(bool), reference_bits(buf, offset, count))
    assert _core.count_bits(buf, offset, count) == int(reference_bits(buf, offset, count).sum())


def test_core_checks_ranges():
    buf = np.zeros(2, dtype=np.uint8)
    with pytest.raises(IndexError, match="exceed a buffer of 2 bytes"):
        _core.count_bits(buf, 10, 7)
    with pytest.raises(IndexError):
        _core.copy_bits(buf, 0, np.zeros(1, dtype=np.uint8), 0, 9)
    with pytest.raises(BufferError, match="writable"):
        _core.unpack_bits(buf, 0, bytes(16), 8)
    with pytest.raises(ValueError, match="contiguous"):
        _core.count_bits(np.zeros(8, dtype=np.uint8)[::2], 0, 8)


def test_gather_varbinary_checks_rows_and_offsets():
    offsets = np.array([0, 2, 5], dtype=np.int32)
    data = np.frombuffer(b"abcde", dtype=np.uint8)
    dst_offsets = np.array([0, 3, 5], dtype=np.int32)
    out = np.zeros(5, dtype=np.uint8)
    _core.gather_varbinary(offsets, data, np.array([1, 0], dtype=np.int64), dst_offsets, out)
    assert out.tobytes() == b"cdeab"
    with pytest.raises(IndexError, match="out of range"):
        _core.gather_varbinary(offsets, data, np.array([2, 0], dtype=np.int64), dst_offsets, out)
    with pytest.raises(IndexError, match="out of range"):
        _core.gather_varbinary(
            np.array([0, 9], dtype=np.int32), data, np.array([0], dtype=np.int64), np.array([0, 9], dtype=np.int32), out
        )


@given(src=bit_ranges(), shift=st.integers(0, 7))
def test_backend_bitmap_ops_agree(src, shift):
    from pystrom.testing import assert_same_on_all_devices, available_devices

    buf, offset, count = src

    def run(device):
        backend = resolve_device(device)
        bitmap = backend.from_host(buf)
        bits = _bitmap.unpack(backend, bitmap, offset, count)
        counts = [_bitmap.count_set(backend, bitmap, offset, count), _bitmap.count_true(bits)]
        return [bits, _bitmap.pack(backend, bits, shift), counts]

    cpu = assert_same_on_all_devices(run)
    np.testing.assert_array_equal(cpu[0], reference_bits(buf, offset, count))
    packed = np.packbits(np.concatenate([np.zeros(shift, bool), cpu[0]]), bitorder="little")
    np.testing.assert_array_equal(cpu[1], packed)
    assert cpu[2] == [int(cpu[0].sum())] * 2
    assert len(available_devices()) >= 1


@given(
    data=st.lists(st.sampled_from([0.0, 1.0, -0.0, 2.5, float("nan"), float("inf")]), max_size=200),
    misalign=st.integers(0, 17),
    dtype=st.sampled_from(["bool", "uint8", "int32", "float64"]),
)
def test_count_true_is_count_nonzero(data, misalign, dtype):
    """memory/bitmap.py count_true (kernels/bitmap.cu count_nonzero_bytes on a GPU) against NumPy's
    count_nonzero: any dtype (NaN counts as true, -0.0 not), views at any byte offset, strided and 2-D."""
    from pystrom.testing import assert_same_on_all_devices

    values = np.asarray(data, dtype=np.float64)
    if dtype in ("uint8", "int32"):  # NaN and inf have no integer value: 3 and 7 stand for them
        values = np.nan_to_num(values, nan=3.0, posinf=7.0)
    host = values.astype(dtype) if dtype != "bool" else values != 0
    padded = np.concatenate([np.zeros(misalign, dtype=host.dtype), host])

    def run(device):
        xp = resolve_device(device).xp
        a = xp.asarray(padded)[misalign:]
        shapes = [a, a[::3]] + ([a.reshape(2, -1)] if a.shape[0] % 2 == 0 else [])
        return [(_bitmap.count_true(v), _bitmap.all_true(v)) for v in shapes]

    got = assert_same_on_all_devices(run)
    views = [host, host[::3]] + ([host.reshape(2, -1)] if host.shape[0] % 2 == 0 else [])
    assert got == [(int(np.count_nonzero(v)), bool(np.all(v))) for v in views]


@st.composite
def bit_spans(draw):
    """A scratch of bitmaps and spans into it (some without a bitmap: at -1), their outputs back to back."""
    size = draw(st.integers(1, 64))
    buf = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), dtype=np.uint8).copy()
    spans = []
    for _ in range(draw(st.integers(0, 12))):
        at = draw(st.integers(-1, size - 1))
        room = (size - max(at, 0)) * 8
        bit = draw(st.integers(0, min(room, 20)))
        spans.append((at, bit, draw(st.integers(0, room - bit))))
    return buf, spans


@given(case=bit_spans(), missing=st.sampled_from([None, 1]))
def test_unpack_batches_on_every_device(case, missing):
    """io/arrow/read/direct.py's bitmaps of many batches in one call (csrc/bits.cpp unpack_bit_spans on the CPU,
    kernels/bitmap.cu on a GPU) against unpack_bits span by span."""
    from pystrom.io.arrow.read import direct
    from pystrom.testing import assert_same_on_all_devices

    buf, spans = case
    n = np.array([c for _, _, c in spans], dtype=np.int64)
    start = np.cumsum(n) - n
    where = np.array([a for a, _, _ in spans], dtype=np.int64)
    bit = np.array([b for _, b, _ in spans], dtype=np.int64)

    def run(device):
        backend = resolve_device(device)
        out = backend.xp.full(int(n.sum()) + 3, 7, dtype=np.uint8)
        direct._unpack_batches(backend, (backend.from_host(buf), where), (bit, n, start), out, missing)
        return [out]

    got = assert_same_on_all_devices(run)[0]
    want = np.full(int(n.sum()) + 3, 7, dtype=np.uint8)
    for (at, b, c), s in zip(spans, start.tolist()):
        want[s : s + c] = (missing or 0) if at < 0 else reference_bits(buf[at:], b, c)
    np.testing.assert_array_equal(got, want)


def test_unpack_bit_spans_checks_every_span():
    buf, out = np.zeros(2, dtype=np.uint8), np.zeros(8, dtype=np.uint8)
    for span in ([0, 9, 8, 0], [1, 0, 9, 0], [0, 0, 4, 5], [2, 1, 0, 0], [-1, 0, 9, 0], [0, -1, 1, 0]):
        with pytest.raises(IndexError, match="outside src or dst"):
            _core.unpack_bit_spans(buf, np.array(span, dtype=np.int64).reshape(4, 1), 0, out)
    _core.unpack_bit_spans(buf, np.array([[1, -1], [8, 0], [0, 8], [0, 0]], dtype=np.int64), 1, out)
    assert out.tolist() == [1] * 8


@given(data=st.data())
def test_shift_spans_on_every_device(data):
    """String offsets of many batches rebased in one call (csrc/gather.cpp shift_spans on the CPU,
    kernels/strings.cu on a GPU) against a loop; a batch's last entry and the next one's first coincide."""
    from pystrom.io.arrow.read import direct
    from pystrom.testing import assert_same_on_all_devices

    lengths = data.draw(st.lists(st.integers(0, 40), max_size=10))
    rng = np.random.default_rng(len(lengths))
    src, at, shift, start, pos, value = [], [], [], [], 0, 0
    for n in lengths:
        first = int(rng.integers(0, 1000))
        steps = np.cumsum(rng.integers(0, 5, n))
        at.append(len(src))
        src += [first, *(first + steps).tolist()]
        shift.append(first - value)
        start.append(pos)
        pos, value = pos + n, value + int(steps[-1] if n else 0)
    src = np.array(src + [0], dtype=np.int32)
    table = np.array([at, [n + 1 for n in lengths], shift, start], dtype=np.int64).reshape(4, -1)

    def run(device):
        backend = resolve_device(device)
        out = backend.xp.full(pos + 1, -7, dtype=np.int32)
        direct._shift_spans(backend, backend.from_host(src), table, out)
        return [out]

    got = assert_same_on_all_devices(run)[0]
    want = np.full(pos + 1, -7, dtype=np.int32)
    for a, n, sh, s in zip(*table.tolist()):
        want[s : s + n] = src[a : a + n] - sh
    np.testing.assert_array_equal(got, want)
    if lengths:
        assert (np.diff(got[: pos + 1]) >= 0).all() and got[0] == 0
    with pytest.raises(IndexError, match="outside src or dst"):
        _core.shift_spans(src, np.array([[0], [len(src) + 1], [0], [0]], dtype=np.int64), np.zeros(99, np.int32))
    # a shift no int32 offset minus it fits int64 for (signed overflow: undefined behaviour in C++)
    for bad in (-(2**63), 2**63 - 1, 2**33):
        with pytest.raises(IndexError, match="shift_spans: span 0's shift"):
            _core.shift_spans(src, np.array([[0], [1], [bad], [0]], dtype=np.int64), np.zeros(99, np.int32))
