"""String and list offsets that another process may write: where they break the rules, and checked copies.

A string column's offsets say which bytes of its data buffer each row takes, a list column's which
of its child elements: they steer reads. Offsets ``o[0..n]`` of a view's rows must hold
``o[0] >= 0``, ``o[i] <= o[i + 1]`` and ``o[n] <= limit`` (data bytes for strings, child elements
for lists). :mod:`pystrom.ipc.validate` checks them when a table arrives from another process;
:func:`checked_copy` is what code that follows them uses when the memory may still change under it
(``Block.others_may_write``): the copy is private, so what was checked is what is followed.

On a GPU one kernel launch per column folds the first failing position into one result array,
read back with a single copy; the CPU twin is vectorised NumPy (:func:`first_bad_offset`), and the
GPU tests compare the two.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core

__all__ = ["first_bad_offset", "first_bad_offsets_gpu", "first_bad", "checked_copy", "describe"]

_NONE = np.uint64(np.iinfo(np.uint64).max)


def first_bad_offset(offsets: np.ndarray, data_size: int) -> int | None:
    """The first position p in [0, n] of int32 offsets ``o[0..n]`` that breaks the rules, or None.

    p == 0: ``o[0] < 0``; p < n: ``o[p + 1] < o[p]``; p == n: ``o[n] > data_size`` (the smallest
    failing position wins, as in the kernel).
    """
    o = np.asarray(offsets)
    n = o.size - 1
    if n < 0:
        return 0
    if o[0] < 0:
        return 0
    down = np.flatnonzero(o[1:] < o[:-1])
    if down.size:
        return int(down[0])
    if int(o[n]) > data_size:
        return n
    return None


def first_bad_offsets_gpu(backend: Any, columns: list[tuple[Any, int]]) -> list[int | None]:
    """The GPU twin of :func:`first_bad_offset` for many (offsets CuPy array, data size) at once.

    One launch per column on the current stream, one copy back for all of them.
    """
    from .. import kernels

    if not columns:
        return []
    xp = backend.xp
    with backend.activate():
        out = xp.full(len(columns), _NONE, dtype=xp.uint64)
        for k, (offsets, data_size) in enumerate(columns):
            n = int(offsets.size) - 1
            kernels.launch(
                "validate",
                "first_bad_offset",
                backend.ordinal,
                n + 1,
                (offsets, np.int64(n), np.int64(data_size), out[k:]),
            )
        host = backend.to_host(out)
    return [None if v == _NONE else int(v) for v in host]


def checked_copy(backend: Any, offsets: Any, limit: int) -> tuple[Any, int | None]:
    """A copy of ``offsets`` on their device that no other process can write, and the first position of
    the copy that breaks the rules (None: safe to follow). On the CPU one pass (the C++ core copies and
    checks in cache-sized chunks); on a GPU a device copy, one kernel launch and one 8-byte copy back."""
    if backend.kind == "cpu":
        copy = np.empty(offsets.shape, dtype=np.int32)
        bad = _core.copy_offsets_checked(np.ascontiguousarray(offsets), copy, limit)
        return copy, None if bad < 0 else int(bad)
    with backend.activate():
        copy = offsets.copy()
    return copy, first_bad_offsets_gpu(backend, [(copy, limit)])[0]


def first_bad(backend: Any, offsets: Any, limit: int) -> int | None:
    """:func:`first_bad_offset` on either device (one kernel launch and one small copy back on a GPU)."""
    if backend.kind == "cpu":
        return first_bad_offset(offsets, limit)
    return first_bad_offsets_gpu(backend, [(offsets, limit)])[0]


def describe(window: np.ndarray, p: int, base: int, n: int, limit: int, what: str) -> str:
    """Why position ``p`` of offsets ``o[0..n]`` fails, from the host offsets ``window`` = ``o[base:p + 2]``."""
    here = int(window[p - base])
    if p == 0 and here < 0:
        return f"offsets[0] is {here} (negative)"
    if p < n:
        return f"offsets[{p}] = {here} > offsets[{p + 1}] = {int(window[p + 1 - base])} (not monotone)"
    return f"offsets[{n}] = {here} lies past the end of the {limit}-{what} buffer"
