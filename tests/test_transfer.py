"""Bulk copies: threads and pinned staging must move every byte exactly, whatever the piece sizes."""

from __future__ import annotations

import numpy as np
import pytest

from pystrom import defaults
from pystrom.memory.backend import resolve_device
from pystrom.memory.transfer import host_copy

from conftest import needs_gpu

SIZES = [0, 1, 4095, 4096, 4097, 1_000_001, 2_500_000]


def _random(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


@pytest.mark.parametrize("threads", [1, 3])
def test_host_copy_moves_every_byte(threads):
    sources = [_random(n, i) for i, n in enumerate(SIZES)]
    targets = [np.zeros(n, dtype=np.uint8) for n in SIZES]
    with defaults.set(staging_chunk=4096, copy_threads=threads):
        host_copy(list(zip(targets, sources)))
    for t, s in zip(targets, sources):
        np.testing.assert_array_equal(t, s)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("threads", [1, 3, 8])
def test_device_transfer_round_trip(threads):
    import cupy

    backend = resolve_device("cuda")
    sources = [_random(n, i) for i, n in enumerate(SIZES)]
    device = [cupy.full(n, 7, dtype=cupy.uint8) for n in SIZES]
    with defaults.set(staging_chunk=4096, copy_threads=threads):
        backend.transfer.to_device([(int(d.data.ptr), s) for d, s in zip(device, sources)])
        for d, s in zip(device, sources):
            np.testing.assert_array_equal(d.get(), s)
        back = [np.zeros(n, dtype=np.uint8) for n in SIZES]
        backend.transfer.to_host([(b, int(d.data.ptr)) for b, d in zip(back, device)])
    for b, s in zip(back, sources):
        np.testing.assert_array_equal(b, s)


@pytest.mark.gpu
@needs_gpu
def test_device_transfer_waits_for_work_on_the_current_stream():
    import cupy

    backend = resolve_device("cuda")
    with cupy.cuda.Stream(non_blocking=True):
        data = cupy.arange(3_000_000, dtype=cupy.int64) * 3  # queued on the user's stream
        host = np.empty(data.nbytes, dtype=np.uint8)
        backend.transfer.to_host([(host, int(data.data.ptr))])
    np.testing.assert_array_equal(host.view(np.int64), np.arange(3_000_000, dtype=np.int64) * 3)
