"""The C++ bindings that read int64 (int32) arrays as such refuse a buffer of another item type or one
at a misaligned address: their checks count bytes, so an int32 array where int64 is meant would pass them
and be read as other numbers (csrc/module.cpp request_typed)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pystrom import _core

I64, I32 = np.int64, np.int32


def _misaligned(n: int, dtype) -> np.ndarray:
    raw = np.zeros(n * np.dtype(dtype).itemsize + 1, np.uint8)
    return np.frombuffer(raw.data, dtype=dtype, count=n, offset=1)  # a view one byte off


def _calls(fd: int, wrong):
    """Each binding with one argument swapped for ``wrong(n, dtype)``; (name, call, the argument's name)."""
    buf = np.zeros(64, np.uint8)
    one = np.zeros(1, I64)
    yield "plan_runs", lambda: _core.plan_runs(wrong(1, I64), one, 64, 1 << 20, np.zeros(2, I64)), "offsets"
    yield "pread_runs", lambda: _core.pread_runs(fd, one, one, one, np.array([0, 1], I64), 0, wrong(1, I64)), "got"
    yield "copy_out", lambda: _core.copy_out(buf, wrong(3, I64)), "spans"
    yield "unpack_bit_spans", lambda: _core.unpack_bit_spans(buf, wrong(4, I64), 0, buf), "spans"
    yield "shift_spans", lambda: _core.shift_spans(wrong(4, I32), np.zeros((4, 1), I64), np.zeros(4, I32)), "src"
    yield "lz4_frames_decode", lambda: _core.lz4_frames_decode(buf, one, one, one, one, wrong(1, I64), one), "which"
    yield "zstd_frames_check", lambda: _core.zstd_frames_check(buf, one, one, one, wrong(1, I32)), "out"
    offsets32 = np.zeros(2, I32)
    yield (
        "gather_varbinary",
        lambda: _core.gather_varbinary(offsets32, buf, wrong(1, I64), offsets32, buf),
        "rows",
    )
    yield "copy_offsets_checked", lambda: _core.copy_offsets_checked(wrong(3, I32), np.zeros(8, I32), 9), "src"
    yield "pg_decode", lambda: _core.pg_decode(buf, one, 0, 0, wrong(8, I64)), "desc"
    yield "pg_encode_sizes", lambda: _core.pg_encode_sizes(wrong(8, I64), 0, 0, one), "desc"
    yield "pg_encode_rows", lambda: _core.pg_encode_rows(wrong(8, I64), 0, 0, buf), "desc"
    meta = [np.zeros(k, I64) for k in (1, 1, 1, 1)]
    outs = [np.zeros(k, I64) for k in (1, 2, 0, 0, 1)]
    yield (
        "arrow_batch_meta",
        lambda: _core.arrow_batch_meta(buf, 0, *meta, 0, 0, *outs, wrong(1, I32), np.zeros(2, I64)),
        "status",
    )
    yield (
        "arrow_batch_meta",
        lambda: _core.arrow_batch_meta(buf, 0, *meta, 0, 0, *outs, np.zeros(1, I32), wrong(2, I64)),
        "custom",
    )


def _narrower(n: int, dtype) -> np.ndarray:
    """The same bytes as n items of dtype, in items of another width (int64 -> int32, int32 -> int16)."""
    other = {np.dtype(I64): I32, np.dtype(I32): np.int16}[np.dtype(dtype)]
    return np.zeros(n * np.dtype(dtype).itemsize // np.dtype(other).itemsize, other)


@pytest.mark.parametrize("wrong", [_narrower, _misaligned], ids=["other-type", "misaligned"])
def test_typed_bindings_refuse_other_arrays(tmp_path, wrong):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(64))
    fd = os.open(path, os.O_RDONLY)
    try:
        for _name, call, arg in _calls(fd, wrong):
            with pytest.raises(ValueError, match=f"{arg} must be an aligned array of int"):
                call()
    finally:
        os.close(fd)


def test_uint64_is_not_int64():
    with pytest.raises(ValueError, match="spans must be an aligned array of int64"):
        _core.copy_out(np.zeros(8, np.uint8), np.zeros((3, 1), np.uint64))
