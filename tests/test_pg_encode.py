"""The binary COPY encoders: the C++ one (csrc/pg_encode.cpp) and its CUDA twin (kernels/pg_encode.cu).

Without a GPU the kernel source is compiled as plain C++ for the host (CUDA's keywords defined away,
a one-thread grid, the test_where_kernel_source.py scheme) and run through the argument list of the
GPU launch: its sizes and bytes must equal the C++ encoder's, and both must equal an encoding written
here in Python from PostgreSQL's documented binary formats (a reference neither encoder shares). The
`gpu` test runs the real kernels on a GPU and compares them with the C++ encoder byte for byte.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import decimal
import hashlib
import shutil
import struct
import subprocess
from importlib import resources

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pystrom
from pystrom.io.postgres.ddl import target_columns
from pystrom.io.postgres.encode import HostEncoder, descriptors
from pystrom.io.postgres.encode_device import failure_key

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

PRELUDE = r"""
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define extern_C extern "C"
struct pe_dim3 { long long x; };
static const pe_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
static inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  unsigned long long old = *p; if (v < old) *p = v; return old;
}
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory: pytest.TempPathFactory):
    if CXX is None:
        pytest.skip("no C++ compiler to build the kernel source for the host")
    text = PRELUDE + resources.files("pystrom.kernels").joinpath("pg_encode.cu").read_text(encoding="utf-8")
    tmp = tmp_path_factory.mktemp("pg_encode")
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    src, lib = tmp / f"pg_encode_{digest}.cpp", tmp / f"pg_encode_{digest}.so"
    src.write_text(text)
    done = subprocess.run(
        [CXX, "-std=c++17", "-O1", "-Wall", "-shared", "-fPIC", "-o", str(lib), str(src)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"kernels/pg_encode.cu does not compile as C++:\n{done.stderr}"
    return ctypes.CDLL(str(lib))


def _host_kernel_encode(lib, table: pystrom.Table) -> tuple[int, bytes]:
    """Run pg_encode_sizes, the scan and pg_encode_rows of the kernel source on the host: (first
    failure key or 0, the bytes)."""
    cols = target_columns(table, None)
    keep: list = []
    desc = descriptors(table, cols, keep)
    n = table.num_rows
    sizes = np.zeros(n + 1, dtype=np.int64)
    first = np.full(1, np.iinfo(np.uint64).max, dtype=np.uint64)
    p = ctypes.c_void_p
    lib.pg_encode_sizes(
        p(desc.ctypes.data), ctypes.c_int(len(cols)), ctypes.c_longlong(0), ctypes.c_longlong(n),
        p(sizes[1:].ctypes.data), p(first.ctypes.data),
    )  # fmt: skip
    if first[0] != np.iinfo(np.uint64).max:
        return int(first[0]), b""
    starts = np.cumsum(sizes)
    out = np.zeros(max(int(starts[-1]), 1), dtype=np.uint8)
    lib.pg_encode_rows(
        p(desc.ctypes.data), ctypes.c_int(len(cols)), ctypes.c_longlong(0), ctypes.c_longlong(n),
        p(starts.ctypes.data), p(out.ctypes.data),
    )  # fmt: skip
    return 0, out[: int(starts[-1])].tobytes()


def _cpp_encode(table: pystrom.Table) -> bytes:
    enc = HostEncoder(table, target_columns(table, None))
    starts = enc.starts()
    from pystrom.io.postgres.encode import Chunk

    out = np.zeros(int(starts[-1]), dtype=np.uint8)
    enc.encode(Chunk(0, table.num_rows, int(starts[-1])), out)
    return out.tobytes()


# -- a reference encoder in Python, from PostgreSQL's binary send functions ---------------------------


def _numeric(value: decimal.Decimal, scale: int) -> bytes:
    """numeric_send: ndigits, weight, sign, dscale, then base-10000 digits (no leading/trailing zero groups)."""
    sign, digits, exp = value.as_tuple()
    text = "".join(map(str, digits)).lstrip("0")
    if not text:
        return struct.pack(">hhHh", 0, 0, 0, scale)
    # the integer part and fraction as decimal strings, padded to groups of 4 around the point
    frac_len = -exp if exp < 0 else 0
    if exp > 0:
        text += "0" * exp
    text = text.rjust(frac_len + 1, "0")
    int_part, frac_part = (text[: len(text) - frac_len] or "0"), text[len(text) - frac_len :].rjust(frac_len, "0")
    int_part = int_part.lstrip("0")
    int_groups = [int(int_part[max(0, i - 4) : i]) for i in range(len(int_part), 0, -4)][::-1] if int_part else []
    frac_part += "0" * (-len(frac_part) % 4)
    frac_groups = [int(frac_part[i : i + 4]) for i in range(0, len(frac_part), 4)]
    groups = int_groups + frac_groups
    weight = len(int_groups) - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    return struct.pack(">hhHh", len(groups), weight, 0x4000 if sign else 0, scale) + b"".join(
        struct.pack(">H", g) for g in groups
    )


def _reference(data: pa.Table) -> bytes:
    out = []
    epoch = dt.date(2000, 1, 1)
    for row in data.to_pylist():
        out.append(struct.pack(">h", len(row)))
        for field in data.schema:
            v = row[field.name]
            t = field.type
            if v is None:
                out.append(struct.pack(">i", -1))
                continue
            if pa.types.is_boolean(t):
                b = struct.pack(">?", v)
            elif t in (pa.int8(), pa.int16(), pa.uint8()):
                b = struct.pack(">h", v)
            elif t in (pa.int32(), pa.uint16()):
                b = struct.pack(">i", v)
            elif t in (pa.int64(), pa.uint32()):
                b = struct.pack(">q", v)
            elif t == pa.uint64():
                b = _numeric(decimal.Decimal(v), 0)
            elif t in (pa.float16(), pa.float32()):
                b = struct.pack(">f", v)
            elif t == pa.float64():
                b = struct.pack(">d", v)
            elif pa.types.is_decimal(t):
                b = _numeric(v, t.scale)
            elif t == pa.date32():
                b = struct.pack(">i", (v - epoch).days)
            elif pa.types.is_timestamp(t):
                us = (v.replace(tzinfo=None) - dt.datetime(2000, 1, 1)) // dt.timedelta(microseconds=1)
                b = struct.pack(">q", us)
            elif pa.types.is_time(t):
                b = struct.pack(">q", ((v.hour * 60 + v.minute) * 60 + v.second) * 10**6 + v.microsecond)
            elif pa.types.is_duration(t):
                b = struct.pack(">qii", v // dt.timedelta(microseconds=1), 0, 0)
            elif pa.types.is_string(t):
                b = v.encode()
            else:
                b = bytes(v)
            out.append(struct.pack(">i", len(b)) + b)
    return b"".join(out)


def _to_millis(d: dt.datetime) -> dt.datetime:
    return d.replace(microsecond=d.microsecond // 1000 * 1000)


def _scaled(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(unscaled).scaleb(-scale, decimal.Context(prec=60))


_TYPES = [
    (pa.bool_(), st.booleans()),
    (pa.int8(), st.integers(-128, 127)),
    (pa.uint8(), st.integers(0, 255)),
    (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    (pa.uint16(), st.integers(0, 2**16 - 1)),
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.uint32(), st.integers(0, 2**32 - 1)),
    (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    (pa.uint64(), st.integers(0, 2**64 - 1)),
    (pa.float32(), st.floats(width=32, allow_nan=False)),
    (pa.float64(), st.floats(allow_nan=False)),
    (pa.decimal128(38, 0), st.integers(-(10**38) + 1, 10**38 - 1).map(decimal.Decimal)),
    (pa.decimal128(38, 7), st.integers(-(10**38) + 1, 10**38 - 1).map(lambda u: _scaled(u, 7))),
    (pa.decimal128(20, 20), st.integers(-(10**20) + 1, 10**20 - 1).map(lambda u: _scaled(u, 20))),
    (pa.date32(), st.dates()),
    (pa.timestamp("us"), st.datetimes()),
    (pa.timestamp("ms", tz="UTC"), st.datetimes(timezones=st.just(dt.timezone.utc)).map(_to_millis)),
    (pa.time64("us"), st.times()),
    (pa.duration("us"), st.timedeltas(min_value=dt.timedelta(days=-(10**7)), max_value=dt.timedelta(days=10**7))),
    (pa.utf8(), st.text()),
    (pa.binary(), st.binary()),
    (pa.binary(5), st.binary(min_size=5, max_size=5)),
]  # fmt: skip


@st.composite
def tables(draw) -> pa.Table:
    n = draw(st.integers(0, 12))
    picked = draw(st.lists(st.sampled_from(range(len(_TYPES))), min_size=1, max_size=6))
    cols = {}
    for k, i in enumerate(picked):
        typ, values = _TYPES[i]
        col = draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n))
        cols[f"c{k}"] = pa.array(col, typ)
    return pa.table(cols)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.integers(0, 3))
def test_cpp_and_kernel_source_equal_the_reference(host_kernels, data, offset):
    """Random tables of every type with NULLs, sliced at an offset (validity bits not byte-aligned):
    the C++ encoder, the kernel source run on the host and the Python reference agree byte for byte."""
    table = pystrom.Table.from_arrow(data, device="cpu")
    if offset and data.num_rows > offset:
        table, data = table.slice(offset), data.slice(offset)
    want = _reference(data)
    assert _cpp_encode(table) == want
    key, got = _host_kernel_encode(host_kernels, table)
    assert key == 0 and got == want


def test_float16_infinities_and_edges(host_kernels):
    h = np.array([0.0, -0.0, 6e-8, 6.1e-5, 65504, -np.inf, np.inf, 1.0], dtype=np.float16)
    data = pa.table({"h": pa.array(h, pa.float16())})
    t = pystrom.Table.from_arrow(data, device="cpu")
    want = b"".join(struct.pack(">hi", 1, 4) + struct.pack(">f", float(v)) for v in h)
    assert _cpp_encode(t) == want
    assert _host_kernel_encode(host_kernels, t) == (0, want)
    nan = pystrom.Table.from_arrow(
        pa.table({"h": pa.array(np.array([np.nan], np.float16), pa.float16())}), device="cpu"
    )
    (bits,) = struct.unpack(">I", _cpp_encode(nan)[6:])
    assert bits & 0x7F800000 == 0x7F800000 and bits & 0x7FFFFF  # still a NaN


def test_infinities_sentinels_and_failures_agree(host_kernels):
    """The loader's ±infinity (the types' extremes) go back as PostgreSQL's infinities; values out of
    PostgreSQL's range fail at the same (row, column) in both encoders."""
    i32, i64 = np.iinfo(np.int32), np.iinfo(np.int64)
    data = pa.table(
        {
            "d": pa.array([i32.max, i32.min, 0], pa.date32()),
            "ts": pa.array([i64.max, i64.min, 0], pa.timestamp("ns")),
            "d64": pa.array([i64.max, i64.min, -1], pa.date64()),
        }
    )
    t = pystrom.Table.from_arrow(data, device="cpu")
    row = lambda d, ts, d64: struct.pack(">hiiiqii", 3, 4, d, 8, ts, 4, d64)  # noqa: E731
    want = row(i32.max, i64.max, i32.max) + row(i32.min, i64.min, i32.min)
    want += row(-10957, -946684800000000, -10958)  # 1970-01-01 in days and microseconds since 2000; -1 ms floors
    assert _cpp_encode(t) == want
    assert _host_kernel_encode(host_kernels, t) == (0, want)
    bad = pa.table({"a": pa.array([1, 2, 3], pa.int32()), "t": pa.array([0, 0, 86_400_000_001], pa.time64("us"))})
    tb = pystrom.Table.from_arrow(bad, device="cpu")
    with pytest.raises(pystrom.DataError, match=r"column 't' \(time\), row 2"):
        HostEncoder(tb, target_columns(tb, None)).starts()
    key, _ = _host_kernel_encode(host_kernels, tb)
    assert failure_key(key) == (2, 2, 1)  # (code, row, column)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("conftest").HAVE_GPU, reason="no CUDA GPU with CuPy in this environment")
def test_gpu_encoder_matches_cpp_twin():
    """The CUDA kernels and the C++ encoder give the same bytes for every type, also for a sliced table
    and chunk by chunk (row starts inside a chunk rebased to its first row)."""
    from pystrom.io.postgres.encode import Chunk
    from pystrom.io.postgres.encode_device import DeviceEncoder

    rng = np.random.default_rng(7)
    n = 50_000
    cols = {}
    for k, (typ, _) in enumerate(_TYPES):
        if pa.types.is_decimal(typ):
            raw = rng.integers(-(2**62), 2**62, n).astype(object) * 10**12 + rng.integers(0, 10**12, n)
            vals = [_scaled(int(u) % 10**typ.precision, typ.scale) for u in raw]
            arr = pa.array(vals, typ)
        elif typ in (pa.utf8(), pa.binary()):
            arr = pa.array([("é" * int(m)) for m in rng.integers(0, 7, n)]).cast(typ)
        elif pa.types.is_fixed_size_binary(typ):
            arr = pa.array([bytes(rng.integers(0, 256, 5, dtype=np.uint8)) for _ in range(n)], typ)
        elif pa.types.is_boolean(typ):
            arr = pa.array(rng.random(n) < 0.5)
        elif pa.types.is_floating(typ):
            arr = pa.array(rng.standard_normal(n).astype(typ.to_pandas_dtype()))
        elif pa.types.is_integer(typ):
            info = np.iinfo(typ.to_pandas_dtype())
            arr = pa.array(rng.integers(info.min, info.max, n, dtype=typ.to_pandas_dtype(), endpoint=True))
        elif pa.types.is_date(typ):
            arr = pa.array(rng.integers(-700_000, 2_000_000, n).astype(np.int32), pa.int32()).cast(typ)
        elif pa.types.is_time(typ):
            arr = pa.array(rng.integers(0, 86_400_000_000, n), pa.int64()).cast(typ)
        else:  # timestamps, durations: +-31 years of microseconds (in the type's unit)
            per_us = {"s": 10**6, "ms": 10**3, "us": 1, "ns": 1}[typ.unit]
            arr = pa.array(rng.integers(-(10**15), 10**15, n) // per_us, pa.int64()).cast(typ)
        mask = pa.array(rng.random(n) < 0.1)
        cols[f"c{k}"] = pa.compute.if_else(mask, pa.scalar(None, typ), arr)
    data = pa.table(cols)
    for offset in (0, 5):
        cpu = pystrom.Table.from_arrow(data, device="cpu").slice(offset)
        gpu = pystrom.Table.from_arrow(data, device="cuda").slice(offset)
        want = _cpp_encode(cpu)
        enc = DeviceEncoder(gpu, target_columns(gpu, None))
        starts = enc.starts()
        assert int(starts[-1]) == len(want)
        got = bytearray()
        for chunk in enc.chunks(1 << 16):
            buf = enc.buffer(chunk.nbytes)
            enc.encode(chunk, buf)
            got += buf[: chunk.nbytes].tobytes()
        assert bytes(got) == want
        whole = enc.buffer(len(want))
        enc.encode(Chunk(0, gpu.num_rows, len(want)), whole)
        assert whole.tobytes() == want
    bad = pystrom.Table.from_arrow(pa.table({"t": pa.array([0, 5, 86_400_000_001], pa.time64("us"))}), device="cuda")
    with pytest.raises(pystrom.DataError, match=r"column 't' \(time\), row 2"):
        DeviceEncoder(bad, target_columns(bad, None)).starts()
