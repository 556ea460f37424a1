"""User functions with numba: ``@pystrom.udf``, ``@pystrom.kernel``, ``pystrom.reduce``.

Each test that takes ``device`` runs on the CPU and (marked gpu) on a GPU against the same reference,
computed here in plain Python from the input data, so the GPU kernel and its CPU twin are equal
wherever both pass. The GPU code path's logic also runs here under numba's CUDA simulator
(``test_gpu_path_under_the_simulator``), in a subprocess of its own since the simulator replaces
``numba.cuda`` process-wide.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom._udf import COMPILATIONS
from pystrom.errors import ColumnNotFoundError, ExpressionError, UnsupportedTypeError

from conftest import needs_gpu  # noqa: E402

numba = pytest.importorskip("numba")
from numba import cuda  # noqa: E402 - the kernels' bodies name it (the CPU twin rewrites cuda.grid)

TYPES = [pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
         pa.uint64(), pa.float32(), pa.float64()]  # fmt: skip


def _values(t: pa.DataType, n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    if pa.types.is_boolean(t):
        vals = [bool(v) for v in rng.integers(0, 2, n)]
    elif pa.types.is_floating(t):
        vals = [float(np.float32(v)) for v in rng.uniform(-100, 100, n)]
    elif pa.types.is_unsigned_integer(t):
        vals = [int(v) for v in rng.integers(0, 100, n)]
    else:
        vals = [int(v) for v in rng.integers(-100, 100, n)]
    return [None if i % 5 == 3 else v for i, v in enumerate(vals)]


@pystrom.udf
def twice_plus(x, y):
    return x * 2 + y


@pystrom.udf(nulls="pass")
def or_default(x, x_ok, y, y_ok):
    if x_ok:
        return x * 1.0
    if y_ok:
        return y * 1.0
    return -1.0


@pystrom.udf
def near(x, y):
    return math.sqrt(x * x + y * y) < 50.0


@pytest.mark.parametrize("t", TYPES, ids=str)
@pytest.mark.parametrize("n", [0, 1, 37])
def test_row_function_on_every_type_with_nulls(device, t, n):
    xs, ys = _values(t, n, 1), _values(pa.float64(), n, 2)
    table = pystrom.Table.from_arrow(pa.table({"x": pa.array(xs, t), "y": pa.array(ys, pa.float64())}), device=device)
    got = table.with_columns(d=twice_plus("x", "y")).to_arrow()
    assert got.column_names == ["x", "y", "d"]
    want = [None if x is None or y is None else x * 2 + y for x, y in zip(xs, ys)]
    out = got.column("d").to_pylist()
    assert [v is None for v in out] == [v is None for v in want]
    assert np.allclose([v for v in out if v is not None], [v for v in want if v is not None])
    assert got.column("d").null_count == sum(v is None for v in want)


def test_result_has_no_bitmap_without_nulls(device):
    table = pystrom.Table.from_arrow(pa.table({"x": [1, 2, 3], "y": [0.5, 1.5, 2.5]}), device=device)
    got = table.with_columns(d=twice_plus("x", "y"), e="x + 1")
    assert got.column("d").validity is None
    assert got.to_arrow().column("d").to_pylist() == [2.5, 5.5, 8.5]
    assert got.to_arrow().column("e").to_pylist() == [2, 3, 4]


def test_nulls_pass_gives_the_function_validity_flags(device):
    xs, ys = [1, None, None, 4], [10.0, 20.0, None, None]
    table = pystrom.Table.from_arrow(pa.table({"x": pa.array(xs, pa.int32()), "y": ys}), device=device)
    got = table.with_columns(z=or_default("x", "y")).to_arrow().column("z")
    assert got.to_pylist() == [1.0, 20.0, -1.0, 4.0]
    assert got.null_count == 0


def test_second_call_on_the_same_types_compiles_nothing(device):
    @pystrom.udf
    def cube(x):
        return x * x * x

    table = pystrom.Table.from_arrow(pa.table({"x": pa.array([1.0, None, 3.0])}), device=device)
    before = sum(COMPILATIONS.values())
    first = table.with_columns(c=cube("x")).to_arrow()
    once = sum(COMPILATIONS.values())
    assert once == before + 1
    second = table.with_columns(c=cube("x")).to_arrow()
    assert sum(COMPILATIONS.values()) == once  # same function, types, NULL mode, device: nothing compiled
    assert first.equals(second)
    table.with_columns(c=cube("x"))  # and again through where
    table.filter("cube(x) > 2")
    assert sum(COMPILATIONS.values()) == once
    ints = pystrom.Table.from_arrow(pa.table({"x": pa.array([1, 2], pa.int16())}), device=device)
    ints.with_columns(c=cube("x"))
    assert sum(COMPILATIONS.values()) == once + 1  # other types: one more


def test_udf_in_filter_where(device):
    xs = [3.0, None, 40.0, 10.0, 60.0]
    ys = [4.0, 1.0, 30.0, None, 0.0]
    table = pystrom.Table.from_arrow(pa.table({"x": xs, "y": ys, "k": [1, 2, 3, 4, 5]}), device=device)
    got = table.filter("near(x, y) and k > 1").to_arrow()
    want = [
        k for x, y, k in zip(xs, ys, range(1, 6)) if x is not None and y is not None and math.hypot(x, y) < 50 and k > 1
    ]
    assert got.column("k").to_pylist() == want
    assert got.column_names == ["x", "y", "k"]
    got = table.filter("not near(x, y) or twice_plus(k, x) > 100").to_arrow()
    assert got.column("k").to_pylist() == [3, 5]  # hypot(40, 30) is 50, not near; NULL rows drop


def test_udf_in_scan_where_across_batch_boundaries(device, tmp_path):
    rng = np.random.default_rng(5)
    n = 2000
    xs = rng.uniform(0, 80, n)
    ys = rng.uniform(0, 80, n)
    x_arr = pa.array([None if i % 7 == 0 else v for i, v in enumerate(xs)], pa.float64())
    data = pa.table({"i": np.arange(n), "x": x_arr, "y": ys})
    path = tmp_path / "points.arrow"
    pystrom.write_arrow(data, path, batch_rows=300)
    scan = pystrom.scan_arrow(str(path), where="near(x, y) and i < 1500", batch_rows=450, device=device)
    batches = list(scan)
    assert len(batches) > 2
    got = [v for b in batches for v in b.to_arrow().column("i").to_pylist()]
    want = [i for i in range(n) if i % 7 and math.hypot(xs[i], ys[i]) < 50 and i < 1500]
    assert got == want
    assert scan.stats.batches_skipped > 0  # "i < 1500" still skips; the UDF conjunct never does


def test_udf_on_a_postgres_read_in_partitions(device, pg):
    name = pg.name("udf_pts")
    pg.execute(
        f"create table {name} as select g as id, (g % 90)::float8 as x, "
        "case when g % 11 = 0 then null else (g % 13)::int4 end as y from generate_series(1, 5000) g"
    )
    table = pystrom.read_postgres(pg.conninfo, table=name, partitions=3, device=device)
    got = table.with_columns(d=twice_plus("x", "y")).to_arrow()
    want = {g: None if g % 11 == 0 else (g % 90) * 2 + g % 13 for g in range(1, 5001)}
    assert dict(zip(got.column("id").to_pylist(), got.column("d").to_pylist())) == want


def test_errors_name_the_udf_the_column_and_the_type(device):
    @pystrom.udf
    def bad(x):
        return x.upper()

    table = pystrom.Table.from_arrow(
        pa.table({"x": [1.5], "s": ["a"], "t": pa.array([1], pa.timestamp("us"))}), device=device
    )
    with pytest.raises(UnsupportedTypeError, match=r"udf bad does not compile for columns \(x float64\)"):
        table.with_columns(y=bad("x"))
    with pytest.raises(UnsupportedTypeError, match=r"column 's' has type string"):
        table.with_columns(y=twice_plus("s", "x"))
    with pytest.raises(UnsupportedTypeError, match=r"column 't' has type timestamp"):
        table.with_columns(y=twice_plus("t", "x"))
    with pytest.raises(ColumnNotFoundError, match="no column 'nope'"):
        table.with_columns(y=twice_plus("nope", "x"))
    with pytest.raises(ExpressionError, match="takes column names as arguments"):
        table.filter("near(x + 1, x)")
    with pytest.raises(UnsupportedTypeError, match="column 's' has type string"):
        table.filter("near(s, x)")
    with pytest.raises(ExpressionError, match="nulls must be one of"):
        pystrom.udf(nulls="maybe")
    with pytest.raises(ExpressionError, match="call it with column names"):
        twice_plus(1, 2)

    @pystrom.udf
    def pair(x):
        return (x, x)

    with pytest.raises(UnsupportedTypeError, match="returns"):
        table.with_columns(y=pair("x"))


def test_missing_numba_is_a_pystrom_error_naming_the_extra():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["numba"] = None
        import pyarrow as pa, pystrom
        @pystrom.udf
        def f(x):
            return x
        t = pystrom.Table.from_arrow(pa.table({"x": [1.0]}), device="cpu")
        try:
            t.with_columns(y=f("x"))
        except ImportError as e:
            assert isinstance(e, pystrom.Error), type(e)
            print("ERR", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pystrom-gpu[udf]" in out.stdout


# -- kernels ----------------------------------------------------------------------------------------


@pystrom.kernel(outputs={"d": "float64", "seen": "bool"})
def scaled(x, y, x_valid, w, d, seen):
    i = cuda.grid(1)
    if i < d.size:
        d[i] = x[i] * w[0] + y[i]
        seen[i] = x_valid[i]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("nullable", [False, True])
def test_row_loops_launch_through_cupy_as_numba_would(nullable):
    """The loop numba compiled, launched by CuPy with numba's argument layout, writes what numba's own
    launch writes (rows across several blocks), with and without validity flags."""
    import cupy

    from pystrom._udf import _cuda, _row

    n = 100_003
    rng = np.random.default_rng(4)
    x, y = (cupy.asarray(rng.uniform(-60, 60, n)) for _ in range(2))
    valid = [cupy.asarray(rng.random(n) > 0.2), None] if nullable else [None, None]
    nulls = (nullable, False)
    f8 = np.dtype("f8")
    kernel = _row.compiled_loop(near, (f8, f8), nulls, np.dtype(bool), "cuda:0")
    arrays = 2 + int(nullable) + 1 + int(nullable) + 1  # values, flags, out, ok, done
    assert _cuda.cupy_function(kernel, 0, 7 * arrays + 1) is not None  # the fast path is taken
    fast = _row.run_cuda(near, [x, y], valid, np.dtype(bool), 0, cupy)
    out = cupy.empty(n, dtype=bool)
    ok = cupy.empty(n, dtype=bool)
    done = cupy.zeros(n, dtype=np.uint8)
    args = [x, y] + [v for v in valid if v is not None] + [out] + ([ok] if nullable else []) + [done]
    kernel[(n + 255) // 256, 256](*[_cuda.device_array(a) for a in args], np.int64(n))  # numba's launch
    cupy.cuda.Device().synchronize()
    assert bool(done.all())  # every row marked finished
    assert bool((fast[0] == out).all()) if not nullable else bool((fast[0][ok] == out[ok]).all())
    if nullable:
        assert bool((fast[1] == ok).all())
    assert int(out.sum()) > 0


@pystrom.kernel(outputs={"total": "int64"})
def strided(a, total):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, a.size, stride):
        total[i] = a[i] + i


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_kernel_binds_columns_flags_arrays_and_outputs(device, n):
    xs = _values(pa.int32(), n, 3)
    ys = [float(v) for v in range(n)]
    table = pystrom.Table.from_arrow(
        pa.table({"x": pa.array(xs, pa.int32()), "y": pa.array(ys, pa.float64())}), device=device
    )
    got = scaled(table, w=np.array([3.0])).to_arrow()
    assert got.column_names == ["x", "y", "d", "seen"]
    d, seen = got.column("d").to_pylist(), got.column("seen").to_pylist()
    assert seen == [x is not None for x in xs]
    assert [v for v, x in zip(d, xs) if x is not None] == [x * 3.0 + y for x, y in zip(xs, ys) if x is not None]
    t2 = strided(pystrom.Table.from_arrow(pa.table({"a": pa.array(range(n), pa.int64())}), device=device))
    assert t2.to_arrow().column("total").to_pylist() == [2 * i for i in range(n)]


def test_kernel_errors(device):
    table = pystrom.Table.from_arrow(pa.table({"x": [1.0]}), device=device)

    @pystrom.kernel(outputs={"o": "float64"})
    def needs_q(x, q, o):
        i = cuda.grid(1)
        if i < o.size:
            o[i] = x[i] + q[0]

    with pytest.raises(ExpressionError, match="parameter 'q' is neither a column"):
        needs_q(table)
    with pytest.raises(ExpressionError, match="'zz' is not a parameter"):
        needs_q(table, q=np.zeros(1), zz=np.zeros(1))
    with pytest.raises(UnsupportedTypeError, match="output 'o' has dtype"):
        pystrom.kernel(outputs={"o": "U5"})(needs_q.func)
    with pytest.raises(ExpressionError, match="output 'p' is not one of its parameters"):
        pystrom.kernel(outputs={"p": "f8"})(needs_q.func)


def test_kernel_with_shared_memory_has_no_cpu_twin():
    @pystrom.kernel(outputs={"o": "float64"})
    def sync(x, o):
        i = cuda.grid(1)
        cuda.syncthreads()
        if i < o.size:
            o[i] = x[i]

    table = pystrom.Table.from_arrow(pa.table({"x": [1.0]}), device="cpu")
    with pytest.raises(UnsupportedTypeError, match=r"cuda.syncthreads\(\.\.\.\) has no CPU twin"):
        sync(table)


# -- reductions -------------------------------------------------------------------------------------


def _init():
    return np.zeros(3)


@numba.njit
def _row_sums(state, x, y):
    state[0] += 1
    state[1] += x
    state[2] += x * y


def _combine(a, b):
    return a + b


def _want(xs, ys):
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    return np.array([len(pairs), sum(x for x, _ in pairs), sum(x * y for x, y in pairs)])


def test_reduce_over_a_table_a_stream_and_nothing(device, tmp_path):
    n = 3000
    xs = _values(pa.float64(), n, 8)
    ys = _values(pa.int64(), n, 9)
    data = pa.table({"x": pa.array(xs, pa.float64()), "y": pa.array(ys, pa.int64())})
    table = pystrom.Table.from_arrow(data, device=device)
    want = _want(xs, ys)
    assert np.allclose(pystrom.reduce(table, ["x", "y"], init=_init, row=_row_sums, combine=_combine), want)
    path = tmp_path / "r.arrow"
    pystrom.write_arrow(data, path, batch_rows=256)
    scan = pystrom.scan_arrow(str(path), batch_rows=700, device=device)
    got = pystrom.reduce(scan, ["x", "y"], init=_init, row=_row_sums, combine=_combine)
    assert np.allclose(got, want)
    assert (pystrom.reduce([], ["x", "y"], init=_init, row=_row_sums, combine=_combine) == 0).all()
    assert (pystrom.reduce(table.slice(0, 0), ["x", "y"], init=_init, row=_row_sums, combine=_combine) == 0).all()


def test_reduce_across_dask_partitions(tmp_path):
    distributed = pytest.importorskip("distributed")
    from pystrom import dask as pdask

    n = 4000
    xs = _values(pa.float64(), n, 10)
    ys = _values(pa.int64(), n, 11)
    paths = []
    for i in range(2):
        path = tmp_path / f"p{i}.arrow"
        part = pa.table({"x": pa.array(xs[i * 2000 : (i + 1) * 2000]), "y": pa.array(ys[i * 2000 : (i + 1) * 2000])})
        pystrom.write_arrow(part, path, batch_rows=500)
        paths.append(str(path))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as c:
        with distributed.Client(c):
            parts = pdask.scan_arrow(paths, batch_rows=1000, device="cpu")
            assert parts.npartitions >= 2
            got = pystrom.reduce(parts, ["x", "y"], init=_init, row=_row_sums, combine=_combine)
            parts.close()
    assert np.allclose(got, _want(xs, ys))


def test_reduce_errors():
    table = pystrom.Table.from_arrow(pa.table({"x": [1.0], "s": ["a"]}), device="cpu")
    with pytest.raises(UnsupportedTypeError, match="column 's' has type string"):
        pystrom.reduce(table, ["s"], init=_init, row=_row_sums, combine=_combine)
    with pytest.raises(ExpressionError, match="columns are column names"):
        pystrom.reduce(table, [], init=_init, row=_row_sums, combine=_combine)
    with pytest.raises(UnsupportedTypeError, match="does not compile"):
        pystrom.reduce(table, ["x"], init=_init, row=_row_sums, combine=_combine)  # row takes two values
    with pytest.raises(UnsupportedTypeError, match="batch 0 of the source is a int"):
        pystrom.reduce([1], ["x"], init=_init, row=_row_sums, combine=_combine)


# -- the GPU path's logic on the CPU ----------------------------------------------------------------

_SIM = """
import numpy as np
from numba import cuda
import pystrom
from pystrom._udf._row import run_cpu, run_cuda
from pystrom._udf._cuda import launch

@pystrom.udf
def f(x, y):
    return x * 2 + y

rng = np.random.default_rng(0)
for dt in ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"]:
    for n in (1, 300):
        x = rng.integers(0, 50, n).astype(dt)
        y = rng.uniform(-5, 5, n)
        vx = rng.integers(0, 2, n).astype(bool)
        out_dt = f.result_dtype((x.dtype, y.dtype), ("x", "y"))
        for valid in ([vx, None], [None, None]):
            g, gok = run_cuda(f, [x, y], valid, out_dt, 0, np)
            c, cok = run_cpu(f, [x, y], valid, out_dt)
            if gok is None:
                assert cok is None and np.array_equal(g, c), dt
            else:
                assert np.array_equal(gok, cok) and np.array_equal(g[gok], c[cok]), dt

@pystrom.kernel(outputs={"d": "float64"})
def k(x, d):
    i = cuda.grid(1)
    if i < d.size:
        d[i] = x[i] + 0.5

x = np.arange(300, dtype=np.int32)
d = np.zeros(300)
done = np.zeros(512, dtype=np.uint8)  # a byte per thread launched, set by each that finished
launch(k.compiled(((x.dtype, 1), (d.dtype, 1)), "cuda:0"), 300, [x, d, done], np)
assert np.array_equal(d, x + 0.5) and done.all()
print("OK")
"""


def test_gpu_path_under_the_simulator():
    pytest.importorskip("numba.cuda")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, "-c", _SIM], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "OK"
