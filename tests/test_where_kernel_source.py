"""The generated CUDA source of where predicates, checked without a GPU.

The kernel text (kernels/where.cu + the generated part) is compiled as plain C++ for the host,
with CUDA's few keywords defined away and a one-thread grid, and run on CPU tables through the
same argument list the GPU launch uses. Its masks must equal the NumPy evaluator's: this checks
the code generator (precedence of the emitted C, Kleene logic, NULL flags, LIKE matching, int64
wrapping, literals) on every machine. The `device` tests run the real kernel on a GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from where_gen import data, expected_mask, predicates

import pystrom
from pystrom.expr import compile_where
from pystrom.expr._cuda import FUNCTION, OPTIONS

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the kernel source for the host")

PRELUDE = r"""
#include <math.h>
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
struct pw_dim3 { long long x; };
static const pw_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
static inline double __longlong_as_double(long long b) { double d; memcpy(&d, &b, 8); return d; }
"""


def host_kernel(source: str, tmp: Path):
    helpers = resources.files("pystrom.kernels").joinpath("where.cu").read_text(encoding="utf-8")
    text = PRELUDE + helpers + "\n" + source
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    lib = tmp / f"where_{digest}.so"
    if not lib.exists():
        src = tmp / f"where_{digest}.cpp"
        src.write_text(text)
        done = subprocess.run(
            [CXX, "-std=c++17", "-O0", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True, text=True
        )
        assert done.returncode == 0, f"the kernel source does not compile:\n{done.stderr}\n{text}"
    return getattr(ctypes.CDLL(str(lib)), FUNCTION)


def host_mask(text: str, arrow: pa.Table, tmp: Path, offset: int = 0) -> np.ndarray:
    table = pystrom.Table.from_arrow(arrow, device="cpu")
    if offset:
        table = table.slice(offset)
    program = compile_where(text, arrow.schema)._cuda()
    fn = host_kernel(program.source, tmp)
    out = np.full(table.num_rows, 7, dtype=np.uint8)
    keep = []  # keep every array alive until the call returns
    cargs = []
    for a in program.arguments(table, out):
        if isinstance(a, np.ndarray):
            a = np.ascontiguousarray(a)
            keep.append(a)
            cargs.append(ctypes.c_void_p(a.ctypes.data if a.size else 0))
        elif isinstance(a, np.uint64):
            cargs.append(ctypes.c_void_p(int(a) or None))
        else:
            cargs.append(ctypes.c_longlong(int(a)))
    fn(*cargs)
    assert set(np.unique(out)) <= {0, 1}
    return out.astype(bool)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("where_kernels")


def test_generated_source_shape() -> None:
    schema = pa.schema({"x": pa.float64(), "s": pa.string(), "h": pa.float16()})
    program = compile_where("x > 1 and s like '%ab_%' or h = 2", schema)._cuda()
    src = program.source
    assert src.count("__global__") == 1  # one fused kernel
    assert f'extern "C" __global__ void {FUNCTION}(' in src
    assert "pw_like(" in src and "pw_half(" in src and "i += stride" in src
    assert "pw_like(const" not in src  # the helpers stay in kernels/where.cu
    assert "--fmad=false" in OPTIONS  # a*b + c rounds twice, as on the CPU
    # built once per predicate: the same object gives the same program
    p = compile_where("x > 1 and s like '%ab_%' or h = 2", schema)
    assert p._cuda() is p._cuda()


def test_seed_queries_host(tmp: Path) -> None:
    rng = np.random.default_rng(3)
    n = 3000
    t = pa.table(
        {
            "x": pa.array(rng.uniform(185, 215, n), mask=rng.random(n) < 0.05),
            "y": rng.uniform(285, 315, n),
            "z": rng.uniform(385, 415, n),
            "memo": pa.array([None if k % 9 == 0 else f"{k % 13}abcd{k % 5}" if k % 4 else "abc" for k in range(n)]),
        }
    )
    for text in ("sqrt((x-200)^2 + (y-300)^2 + (z-400)^2) < 10", "memo like '%abcd%'", "memo like '_abcd%'"):
        cpu = compile_where(text, t.schema).evaluate(pystrom.Table.from_arrow(t, device="cpu"))
        host = host_mask(text, t, tmp)
        np.testing.assert_array_equal(host, cpu, err_msg=text)
        assert 0 < host.sum() < n


def test_fixed_cases_host(tmp: Path) -> None:
    t = pa.table(
        {
            "a": pa.array([7, -7, 2**63 - 1, -(2**63), 0, None, 5, -1], pa.int64()),
            "b": pa.array([2, -2, 1, -1, 0, 3, None, 0], pa.int64()),
            "u": pa.array([0, 2**64 - 1, 2**63, 5, None, 1, 2, 3], pa.uint64()),
            "h": pa.array([0.5, -2, None, 65504, 6e-8, 1, 2, 3], pa.float16()),
            "x": pa.array([float("nan"), float("inf"), -0.0, 1e-300, None, 2.5, -2.5, 1e300]),
            "s": pa.array(["aé", "AB", None, "a%b", "", "ab\\", "日本", "abc"]),
            "ok": pa.array([True, None, False, True, True, False, None, True]),
        }
    )
    texts = [
        "a % b = 1 or a % b = -1 or a % b is null",
        "a / b > 3 or a + b < 0 or a * b < 0 or -a = a or abs(a) < 0",
        "u > -1 and u != 18446744073709551615",
        "u > a or a >= u",
        "h > 1 or h < 1e-7 or h = 65504",
        "x = x or x > 1e299 or x / 0 is null and x < 0",
        "x % 2 > 0.1 or sqrt(x) > 1 or exp(x) > 2 or log(x) < -600 or floor(x) = -3 or ceil(x) = 3",
        "s like 'a_' or s ilike 'ab' or s like '%\\\\' or s like 'a\\%b' or s = '日本'",
        "s not like '%' or s in ('', 'abc', null)",
        "ok and not ok or ok is null",
        "not (ok or a > 0) and b is not null",
        "a in (7, -7, null) or a not in (0, 1)",
        "a between -7 and 7 and not (b not between 0 and 2)",
        "1 = 1 and null is null and 2 ^ 10 = 1024 and -2 ^ 2 = 4",
        "x ^ 2 > 4 or x ** 0.5 > 1",
    ]
    for off in (0, 1, 3):
        cpu_table = pystrom.Table.from_arrow(t, device="cpu").slice(off)
        for text in texts:
            cpu = compile_where(text, t.schema).evaluate(cpu_table)
            np.testing.assert_array_equal(host_mask(text, t, tmp, off), cpu, err_msg=text)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(table=data(max_rows=30), pred=predicates, offset=st.integers(0, 9))
def test_random_predicates_host(tmp: Path, table: pa.Table, pred, offset: int) -> None:
    text, ref = pred
    offset = min(offset, table.num_rows)
    got = host_mask(text, table, tmp, offset)
    np.testing.assert_array_equal(got, expected_mask(ref, table.slice(offset)), err_msg=text)


def test_deepest_accepted_expressions_run_everywhere(tmp: Path) -> None:
    # the parser's depth limit leaves room for every later pass (checker, NumPy, code generation,
    # pruning) under Python's default recursion limit
    schema = pa.schema({"i": pa.int32(), "f": pa.bool_()})
    t = pa.table({"i": pa.array([1, None, -2, 3], pa.int32()), "f": [True, False, None, True]})
    num = "i"
    for k in range(45):
        num = f"({num} + i) * 1.5" if k % 2 else f"-({num})"
    cond = "f"
    for k in range(60):
        cond = f"not ({cond})" if k % 2 else f"({cond} and i between -5 and 5)"
    for text in (num + " > 0", cond):
        p = compile_where(text, schema)
        cpu = p.evaluate(pystrom.Table.from_arrow(t, device="cpu"))
        np.testing.assert_array_equal(host_mask(text, t, tmp), cpu)
        assert p.may_match({"i": (-5, 5)}) in (True, False)
    # the numeric one by hand: x -> -x and x -> (x + i) * 1.5 alternately, from x = i
    x = 1.0
    for k in range(45):
        x = (x + 1) * 1.5 if k % 2 else -x
    assert bool(compile_where(num + " > 0", schema).evaluate(pystrom.Table.from_arrow(t, device="cpu"))[0]) == (x > 0)
