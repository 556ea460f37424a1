"""The string offsets of a direct read, checked where they were read to, before any of them is used.

The direct path reads each string column's int32 offsets (every record batch's n + 1 of them) into
one scratch array, all string columns of the read back to back. One check then covers them all: per
segment (a column of one batch) the offsets must not decrease, the first must be >= 0 and the last
must lie inside the batch's data buffer in the file. These are the only values the read follows:
the first and last offsets pick the byte range copied from the file, and the rest are rebased and
become the table's offsets, which every later string operation trusts.

On a GPU this is one kernel launch (``kernels/arrow_checks.cu``) and one small copy back of
(first, last, bad) per segment, which the read needs anyway for the byte counts: no host round trip
per column, and fixed-width columns pay nothing. On the CPU backend (and as the kernel's twin in the
tests) the same check in vectorised NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ....kernels import kernel, sm_count

__all__ = ["check_offsets"]

_THREADS = 256
_MAX_GRID_Y = 65535


def check_offsets(backend: Any, scratch: Any, starts: np.ndarray, counts: np.ndarray, data_sizes: np.ndarray):
    """(first, last, bad) per segment as host arrays; segment s is ``scratch[starts[s]:starts[s]+counts[s]]``
    (counts > 0) and may reach ``data_sizes[s]`` bytes of string data."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    data_sizes = np.ascontiguousarray(data_sizes, dtype=np.int64)
    if len(starts) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=bool)
    if backend.kind == "cpu":
        return _check_host(np.asarray(scratch), starts, counts, data_sizes)
    return _check_device(backend, scratch, starts, counts, data_sizes)


def _check_host(scratch: np.ndarray, starts: np.ndarray, counts: np.ndarray, data_sizes: np.ndarray):
    first = scratch[starts].astype(np.int64)
    last = scratch[starts + counts - 1].astype(np.int64)
    bad = (first < 0) | (last > data_sizes)
    # a decrease at position i + 1 of the scratch, unless i + 1 starts a segment (batches may jump)
    drops = np.flatnonzero(scratch[1:] < scratch[:-1]) + 1
    if len(drops):
        seg = np.searchsorted(starts, drops, side="right") - 1
        inside = (seg >= 0) & (drops > starts[np.maximum(seg, 0)]) & (drops < starts[np.maximum(seg, 0)] +
                                                                        counts[np.maximum(seg, 0)])  # fmt: skip
        bad[seg[inside]] = True
    return first, last, bad


def _check_device(backend: Any, scratch: Any, starts: np.ndarray, counts: np.ndarray, data_sizes: np.ndarray):
    import cupy

    n = len(starts)
    meta = backend.from_host(np.concatenate([starts, counts, data_sizes]))
    out = cupy.zeros(3 * n, dtype=cupy.int64)
    grid_y = min(n, _MAX_GRID_Y)
    per_segment = -(-int(counts.max()) // _THREADS)
    grid_x = max(1, min(per_segment, sm_count(backend.ordinal) * 32 // grid_y))
    fn = kernel("arrow_checks", "check_offsets", backend.ordinal)
    with cupy.cuda.Device(backend.ordinal):
        fn((grid_x, grid_y), (_THREADS,), (scratch, meta[:n], meta[n : 2 * n], meta[2 * n :], np.int64(n), out))
    host = backend.to_host(out).reshape(n, 3)  # the one copy back (it waits for the kernel)
    return host[:, 0].copy(), host[:, 1].copy(), host[:, 2] != 0
