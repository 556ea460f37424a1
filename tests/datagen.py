"""Arrow test data for every type a Table holds, with or without NULLs, sliced or chunked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# The list first; the other fixed-width types pystrom also holds follow.
TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "date32": pa.date32(),
    "timestamp_us": pa.timestamp("us"),
    "timestamp_us_tz": pa.timestamp("us", tz="UTC"),
    "timestamp_us_berlin": pa.timestamp("us", tz="Europe/Berlin"),
    "decimal_38_10": pa.decimal128(38, 10),
    "decimal_9_2": pa.decimal128(9, 2),
    "string": pa.string(),
    "binary": pa.binary(),
    "fixed_binary_16": pa.binary(16),
    "uuid": pa.uuid(),
    # also held:
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "date64": pa.date64(),
    "timestamp_ns": pa.timestamp("ns"),
    "timestamp_s": pa.timestamp("s", tz="UTC"),
    "duration_ms": pa.duration("ms"),
    "time32_ms": pa.time32("ms"),
    "time64_us": pa.time64("us"),
}

SIZES = [0, 1, 7, 8, 9, 1_000_003]


def _storage(arrow: pa.DataType, n: int, rng: np.random.Generator) -> pa.Array:
    if isinstance(arrow, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(arrow, _storage(arrow.storage_type, n, rng))
    t = arrow
    if pa.types.is_boolean(t):
        return pa.array(rng.random(n) < 0.5)
    if pa.types.is_floating(t):
        return pa.array(rng.standard_normal(n).astype(t.to_pandas_dtype()))
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        return pa.array(rng.integers(info.min, info.max, n, endpoint=True, dtype=t.to_pandas_dtype()))
    if pa.types.is_date32(t):
        return pa.array(rng.integers(-20000, 40000, n, dtype=np.int32), pa.int32()).cast(t)
    if pa.types.is_date64(t):
        days = rng.integers(-20000, 40000, n, dtype=np.int64)
        return pa.array(days * 86_400_000, pa.int64()).cast(t)
    if pa.types.is_time32(t):
        return pa.array(rng.integers(0, 86_400_000, n, dtype=np.int32), pa.int32()).cast(t)
    if pa.types.is_time64(t):
        return pa.array(rng.integers(0, 86_400_000_000, n, dtype=np.int64), pa.int64()).cast(t)
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return pa.array(rng.integers(-(2**50), 2**50, n, dtype=np.int64), pa.int64()).cast(t)
    if pa.types.is_decimal(t):
        if t.precision >= 19:  # |value| < 2**126 < 10**38: valid for precision 38
            words = np.empty((n, 2), dtype=np.int64)
            words[:, 0] = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
            words[:, 1] = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
        else:
            low = rng.integers(-(10**t.precision) + 1, 10**t.precision, n, dtype=np.int64)
            words = np.stack([low, np.where(low < 0, -1, 0)], axis=1).astype(np.int64)
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(np.ascontiguousarray(words))])
    if pa.types.is_fixed_size_binary(t):
        raw = rng.integers(0, 256, n * t.byte_width, dtype=np.uint8)
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(raw)])
    if pa.types.is_string(t) or pa.types.is_binary(t):
        lengths = rng.integers(0, 12, n, dtype=np.int32)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        alphabet = np.frombuffer("abcdefghijklmnopqrstuvwxyzäöü€".encode(), dtype=np.uint8)
        if pa.types.is_string(t):  # ASCII letters only keeps every cut valid UTF-8
            data = rng.choice(alphabet[:26], int(offsets[-1]))
        else:
            data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    raise AssertionError(t)


def make_array(arrow: pa.DataType, n: int, nulls: bool, seed: int = 0) -> pa.Array:
    rng = np.random.default_rng(seed)
    arr = _storage(arrow, n, rng)
    if not nulls or n == 0:
        return arr
    mask = rng.random(n) < 0.3
    mask[0] = True  # at least one NULL
    validity = pa.py_buffer(np.packbits(~mask, bitorder="little"))
    storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
    bufs = storage.buffers()
    with_nulls = pa.Array.from_buffers(storage.type, n, [validity] + bufs[1:], null_count=int(mask.sum()))
    if isinstance(arr, pa.ExtensionArray):
        return pa.ExtensionArray.from_storage(arrow, with_nulls)
    return with_nulls


def make_sliced(arrow: pa.DataType, n: int, nulls: bool, seed: int = 0, offset: int = 3) -> pa.Array:
    """An array of n rows that starts at element `offset` (not a multiple of 8) of its buffers."""
    return make_array(arrow, n + offset + 5, nulls, seed).slice(offset, n)


def make_chunked(arrow: pa.DataType, sizes: list[int], nulls: bool, seed: int = 0) -> pa.ChunkedArray:
    chunks = [make_sliced(arrow, s, nulls and i % 2 == 0, seed + i, offset=1 + i % 7) for i, s in enumerate(sizes)]
    return pa.chunked_array(chunks, type=arrow)
