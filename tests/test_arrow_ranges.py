"""The CPU range reader: queued reads coalesced into scatter preadv calls must land every byte where
it was asked for, whatever the order, gaps, overlaps and task size, and a read past the end of the
file must fail naming the file."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import _core
from pystrom.io.arrow.file import ranges
from pystrom.io.arrow.file.ranges import RangeReader
from pystrom.memory.backend import resolve_device


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    data = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    path = tmp_path_factory.mktemp("ranges") / "blob.bin"
    path.write_bytes(data)
    return str(path), data


_reads = st.lists(st.tuples(st.integers(0, 299_000), st.integers(0, 70_000)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(reads=_reads, task=st.sampled_from([4096, 10_000, 1 << 20]))
def test_coalesced_reads_land_in_place(blob, reads, task):
    path, data = blob
    reads = [(off, min(size, len(data) - off)) for off, size in reads]
    dsts = [np.full(size, 7, dtype=np.uint8) for _, size in reads]
    with pystrom.defaults.set(io_task_size=task):
        with RangeReader(path, resolve_device("cpu")) as reader:
            for (off, size), dst in zip(reads, dsts):
                reader.read(off, size, dst)
            reader.wait()
            assert reader.bytes_read == sum(size for _, size in reads)
    for (off, size), dst in zip(reads, dsts):
        assert dst.tobytes() == data[off : off + size]


def test_a_read_past_the_end_names_the_file(blob):
    path, data = blob
    ok, past = np.zeros(100, np.uint8), np.zeros(100, np.uint8)
    with pytest.raises(pystrom.FileFormatError, match="blob.bin.*truncated"):
        with RangeReader(path, resolve_device("cpu")) as reader:
            reader.read(0, 100, ok)
            reader.read(len(data) - 50, 100, past)  # coalesced or not, the file ends 50 bytes in
            reader.wait()


def test_pread_runs_resumes_inside_a_piece(tmp_path):
    """preadv may return fewer bytes than asked (signals, some file systems): the rest is read on
    (``max_call`` makes every call a short one), gaps between pieces included."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(200)))
    dsts = [np.zeros(n, np.uint8) for n in (3, 10, 0, 50, 5)]
    offsets = np.array([20, 23, 33, 33, 90], dtype=np.int64)  # a 7-byte gap before the last piece
    sizes = np.array([len(d) for d in dsts], dtype=np.int64)
    addresses = np.array([d.ctypes.data for d in dsts], dtype=np.int64)
    first = np.empty(len(dsts) + 1, dtype=np.int64)
    assert _core.plan_runs(offsets, sizes, 64, 1 << 20, first) == 1 and first.tolist()[:2] == [0, 5]
    fd = os.open(path, os.O_RDONLY)
    try:
        for cap in (7, 1, 0):
            for d in dsts:
                d[:] = 0
            got = np.zeros(1, np.int64)
            _core.pread_runs(fd, offsets, sizes, addresses, first[:2], cap, got)
            assert got[0] == 75, cap
            assert b"".join(d.tobytes() for d in dsts) == bytes(range(20, 83)) + bytes(range(90, 95)), cap
    finally:
        os.close(fd)


def test_plan_runs_breaks_at_overlaps_gaps_and_the_task_size():
    offsets = np.array([0, 10, 15, 100_000, 100_010, 100_020], dtype=np.int64)
    sizes = np.array([10, 10, 5, 10, 10, 10], dtype=np.int64)  # 15 overlaps the piece before it
    first = np.empty(7, dtype=np.int64)
    runs = _core.plan_runs(offsets, sizes, 1000, 25, first)
    assert first[: runs + 1].tolist() == [0, 2, 3, 5, 6]  # [0, 20) | 15 overlaps | gap > 1000 | span > 25


def test_reads_queued_when_the_caller_fails_are_dropped_not_run(blob):
    path, data = blob
    dst = np.zeros(1000, np.uint8)
    with pytest.raises(KeyError):
        with RangeReader(path, resolve_device("cpu")) as reader:
            reader.read(0, 1000, dst)
            raise KeyError("the caller failed before wait()")
    assert not dst.any() and reader._fd == -1
    with RangeReader(path, resolve_device("cpu")) as reader:  # closing without wait() still reads
        reader.read(0, 1000, dst)
    assert dst.tobytes() == data[:1000]


def test_a_ticket_waits_for_the_reads_before_it(blob):
    path, data = blob
    first, second = np.zeros(200_000, np.uint8), np.zeros(90_000, np.uint8)
    with pystrom.defaults.set(io_task_size=4096):
        with RangeReader(path, resolve_device("cpu")) as reader:
            reader.read(0, 200_000, first)
            ticket = reader.submit()
            reader.read(200_000, 90_000, second)
            later = reader.submit()
            reader.wait(ticket)
            assert first.tobytes() == data[:200_000] and reader.bytes_read == 200_000
            reader.wait(ticket)  # nothing left before it
            reader.wait(later)
            assert second.tobytes() == data[200_000:290_000] and reader.bytes_read == 290_000
            reader.wait()


@pytest.mark.parametrize("count", [5, 5000])  # 5000: read by several pool tasks
def test_read_pieces_in_the_order_given(blob, count):
    path, data = blob
    rng = np.random.default_rng(count)
    offsets = rng.integers(0, len(data) - 64, count).astype(np.int64)
    sizes = rng.integers(0, 64, count).astype(np.int64)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = ranges.read_pieces(fd, offsets, sizes, path, max_gap=100).tobytes()
        with pytest.raises(pystrom.FileFormatError, match="blob.bin.*truncated"):
            ranges.read_pieces(fd, np.array([0, len(data) - 4]), np.array([8, 8]), path)
    finally:
        os.close(fd)
    assert got[: int(sizes.sum())] == b"".join(data[o : o + n] for o, n in zip(offsets.tolist(), sizes.tolist()))


@pytest.mark.parametrize(
    "offsets, sizes",
    [
        ([2**63 - 4], [10]),  # the piece's end past int64
        ([-(2**63) + 1, 5], [1, 1]),  # a negative offset: the gap to the next piece past int64
        ([0, 10], [-5, 1]),  # a negative size
    ],
)
def test_plan_runs_and_pread_runs_refuse_pieces_outside_int64(tmp_path, offsets, sizes):
    """The pieces' ends are computed in int64 (signed overflow is undefined behaviour in C++: the ASan/UBSan
    build stopped on these): both bindings refuse them before any arithmetic."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(64))
    offsets, sizes = np.array(offsets, dtype=np.int64), np.array(sizes, dtype=np.int64)
    dst = np.zeros(64, np.uint8)
    addresses = np.full(len(offsets), dst.ctypes.data, dtype=np.int64)
    with pytest.raises(IndexError, match="plan_runs: piece"):
        _core.plan_runs(offsets, sizes, 64, 1 << 20, np.empty(len(offsets) + 1, dtype=np.int64))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(IndexError, match="pread_runs: piece"):
            _core.pread_runs(fd, offsets, sizes, addresses, np.array([0, len(offsets)], np.int64), 0,
                             np.zeros(1, np.int64))  # fmt: skip
    finally:
        os.close(fd)
    assert not dst.any()


def test_pread_runs_an_empty_run_reads_nothing(tmp_path):
    """run_first may repeat an entry (an empty run), also the last one: nothing is read, not even the
    offset one past the pieces (the ASan build caught that read)."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(16)))
    dst = np.zeros(4, np.uint8)
    offsets, sizes = np.array([2], np.int64), np.array([4], np.int64)
    addresses = np.array([dst.ctypes.data], np.int64)
    got = np.full(3, -7, np.int64)
    fd = os.open(path, os.O_RDONLY)
    try:
        _core.pread_runs(fd, offsets, sizes, addresses, np.array([0, 0, 1, 1], np.int64), 0, got)
    finally:
        os.close(fd)
    assert got.tolist() == [0, 4, 0] and dst.tolist() == [2, 3, 4, 5]
