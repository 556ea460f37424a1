"""The string-offset check of the direct Arrow read: NumPy twin against a plain loop, kernel against twin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pystrom.io.arrow.read.offsets import _check_host, check_offsets
from pystrom.memory.backend import resolve_device

from conftest import needs_gpu


def _reference(scratch, starts, counts, data_sizes):
    first, last, bad = [], [], []
    for s, c, d in zip(starts, counts, data_sizes):
        seg = [int(v) for v in scratch[s : s + c]]
        first.append(seg[0])
        last.append(seg[-1])
        bad.append(seg[0] < 0 or seg[-1] > d or any(b < a for a, b in zip(seg, seg[1:])))
    return np.array(first, dtype=np.int64), np.array(last, dtype=np.int64), np.array(bad, dtype=bool)


def _segments(rng, num, max_len, corrupt_share):
    """Segments of n + 1 offsets each (good ones monotone from a random start), some corrupted."""
    parts, counts, sizes = [], [], []
    for _ in range(num):
        n = int(rng.integers(1, max_len + 1))
        start = int(rng.integers(0, 50))
        offs = start + np.cumsum(np.concatenate([[0], rng.integers(0, 9, n)])).astype(np.int64)
        size = int(offs[-1]) + int(rng.integers(0, 5))
        if rng.random() < corrupt_share:
            kind = rng.integers(4)
            if kind == 0:
                offs[0] = -int(rng.integers(1, 2**31 - 1))
            elif kind == 1:
                offs[-1] = size + int(rng.integers(1, 1000))
            elif kind == 2 and n > 1:
                k = int(rng.integers(1, n + 1))
                offs[k] = offs[k - 1] - int(rng.integers(1, 100))
            else:
                offs[int(rng.integers(0, n + 1))] = int(rng.integers(-(2**31), 2**31 - 1))
        parts.append(offs.astype(np.int32))
        counts.append(n + 1)
        sizes.append(size)
    scratch = np.concatenate(parts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return scratch, starts, np.array(counts, dtype=np.int64), np.array(sizes, dtype=np.int64)


@given(seed=st.integers(0, 2**32 - 1), num=st.integers(1, 40), max_len=st.integers(1, 30))
def test_numpy_twin_matches_a_plain_loop(seed, num, max_len):
    scratch, starts, counts, sizes = _segments(np.random.default_rng(seed), num, max_len, 0.4)
    got = _check_host(scratch, starts, counts, sizes)
    want = _reference(scratch, starts, counts, sizes)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_batch_boundaries_may_jump_down():
    # every batch's offsets restart at its own position in its own data buffer
    scratch = np.array([5, 7, 9, 0, 1, 100, 101], dtype=np.int32)
    first, last, bad = check_offsets(resolve_device("cpu"), scratch, np.array([0, 3, 5]), np.array([3, 2, 2]),
                                     np.array([9, 1, 200]))  # fmt: skip
    assert first.tolist() == [5, 0, 100] and last.tolist() == [9, 1, 101] and not bad.any()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("num,max_len", [(1, 1), (7, 3), (300, 50), (5, 300_000), (70_000, 3)])
def test_kernel_matches_numpy_twin(num, max_len):
    """One launch over many segments (also more than a grid's 65,535 rows) and long ones."""
    import cupy

    backend = resolve_device("cuda")
    scratch, starts, counts, sizes = _segments(np.random.default_rng(num * 1000 + max_len), num, max_len, 0.3)
    want = _check_host(scratch, starts, counts, sizes)
    with backend.activate():
        got = check_offsets(backend, cupy.asarray(scratch), starts, counts, sizes)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    if num > 1:  # one segment is either good or bad
        assert want[2].any() and not want[2].all()
