"""Arrow's month_interval and day_time_interval columns, read as month_day_nano_interval.

pyarrow parses these types but cannot wrap their arrays in Python (``batch.column`` raises KeyError),
so the host path takes their buffers through the Arrow C data interface instead, after pyarrow's full
validation of the record batch has checked their sizes. In this order, per column of a batch:

1. the one-column batch is exported (``__arrow_c_array__``) and its child's length, null count, offset
   and buffer addresses are read from the ArrowArray struct;
2. the values are copied out and widened: month_interval (int32 months) -> (months, 0, 0);
   day_time_interval (int32 days, int32 milliseconds) -> (0, days, milliseconds * 1_000_000);
3. the validity bitmap is copied, moved to bit 0.

The capsules release the exported batch when they go.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pyarrow as pa

from .... import _core
from ....interop.arrow_c import ArrowArray, capsule_pointer
from ..file.metadata import LEGACY_INTERVALS

__all__ = ["widen_interval"]

MONTH_DAY_NANO = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanoseconds", "<i8")])


def widen_interval(batch: pa.RecordBatch, index: int) -> pa.Array:
    """Column ``index`` of ``batch`` (a month_interval or day_time_interval column, already validated
    by pyarrow) as a host month_day_nano_interval array."""
    kind = batch.schema.field(index).type.id
    assert kind in LEGACY_INTERVALS
    one = batch.select([index])
    _schema, capsule = one.__arrow_c_array__()
    struct = ctypes.cast(capsule_pointer(capsule, b"arrow_array"), ctypes.POINTER(ArrowArray)).contents
    if struct.n_children != 1:
        raise ValueError("the exported batch has no column")
    child = struct.children[0].contents
    n, offset, nulls = int(child.length), int(child.offset), int(child.null_count)
    if n != one.num_rows or offset < 0 or child.n_buffers != 2:
        raise ValueError(f"interval column of {n} rows at offset {offset} in a batch of {one.num_rows}")
    width = 4 if kind == pa.lib.Type_INTERVAL_MONTHS else 8
    out = np.zeros(n, dtype=MONTH_DAY_NANO)
    if n:
        raw = np.frombuffer(ctypes.string_at(child.buffers[1] + offset * width, n * width), dtype="<i4")
        if width == 4:
            out["months"] = raw
        else:
            pairs = raw.reshape(n, 2)
            out["days"] = pairs[:, 0]
            out["nanoseconds"] = pairs[:, 1].astype(np.int64) * 1_000_000
    bitmap = None
    if nulls and child.buffers[0]:
        src = np.frombuffer(ctypes.string_at(child.buffers[0], (offset + n + 7) // 8), dtype=np.uint8)
        bits = np.zeros((n + 7) // 8, dtype=np.uint8)
        _core.copy_bits(src, offset, bits, 0, n)
        bitmap = pa.py_buffer(bits)
    del struct, child, capsule, _schema
    return pa.Array.from_buffers(
        pa.month_day_nano_interval(), n, [bitmap, pa.py_buffer(out.view(np.uint8))], null_count=nulls if bitmap else 0
    )
