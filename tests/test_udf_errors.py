"""User functions that fail (issue 39, item 6): an exception in a row function, a kernel or a reduce
row function raises one ``UserFunctionError`` naming the function, the first row that failed and its
values; division by zero gives NumPy's values on both devices; a kernel's CPU twin writing out of
bounds raises ``UserFunctionIndexError`` instead of ending the process; a changed global warns.

Tests taking ``device`` run on the CPU and (marked gpu) on a GPU; the GPU paths' error handling also
runs here under numba's CUDA simulator, with a raising thread that just stops as numba-cuda's do.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom import StaleGlobalWarning, UserFunctionError, UserFunctionIndexError

numba = pytest.importorskip("numba")
from numba import cuda  # noqa: E402 - the kernels' bodies name it (the CPU twin rewrites cuda.grid)


def _table(device: str, **cols) -> pystrom.Table:
    return pystrom.Table.from_arrays({k: np.asarray(v) for k, v in cols.items()}, device=device)


@pystrom.udf
def picky(x, y):
    if y == 0:
        raise ValueError("y must not be 0")
    return x + y


@pystrom.udf(nulls="pass")
def null_refusing(x, x_ok, y, y_ok):
    if not y_ok:
        raise ValueError("y is NULL")
    return x + y


def test_error_classes():
    assert issubclass(UserFunctionError, pystrom.Error) and issubclass(UserFunctionError, RuntimeError)
    assert issubclass(UserFunctionIndexError, UserFunctionError) and issubclass(UserFunctionIndexError, IndexError)
    err = pickle.loads(pickle.dumps(UserFunctionIndexError("kernel k raised IndexError at row 3", "k", 3, "cpu")))
    assert (type(err), str(err), err.function, err.row, err.device) == (
        UserFunctionIndexError, "kernel k raised IndexError at row 3", "k", 3, "cpu"
    )  # fmt: skip


def test_row_function_exception_names_function_row_and_values(device):
    t = _table(device, x=[1.0, 2.0, 3.0, 4.0], y=[1.0, 1.0, 0.0, 0.0])
    with pytest.raises(UserFunctionError) as info:  # was: a bare ValueError, no function, no row
        t.with_columns(r=picky("x", "y"))
    err = info.value
    assert (err.function, err.row, err.device) == ("picky", 2, device if device == "cpu" else "cuda:0")
    # on a GPU the message adds, inside the parentheses, that the CPU raised it from the row's values
    assert "udf picky(x, y) raised ValueError: y must not be 0 at row 2 (x=3.0, y=0.0" in str(err)
    assert isinstance(err.__cause__, ValueError) and str(err.__cause__) == "y must not be 0"
    with pytest.raises(UserFunctionError, match=r"udf picky\(x, y\) raised ValueError.* at row 2"):
        t.filter("picky(x, y) > 0")  # in a where string too
    with pytest.raises(UserFunctionError, match=r"raised ValueError: y is NULL at row 1 \(x=2.0, y=NULL[;)]"):
        pystrom.Table.from_arrow(pa.table({"x": [1.0, 2.0], "y": [1.0, None]}), device=device).with_columns(
            r=null_refusing("x", "y")
        )
    # a NULL row is never called (propagate): no error there
    nulls = pystrom.Table.from_arrow(pa.table({"x": [1.0, 2.0], "y": [1.0, None]}), device=device)
    assert nulls.with_columns(r=picky("x", "y")).column("r").to_arrow().to_pylist() == [2.0, None]


@pystrom.udf
def fdiv(x, y):
    return x / y


@pystrom.udf
def ifloor(x, y):
    return x // y


@pystrom.udf
def imod(x, y):
    return x % y


def test_division_by_zero_gives_numpys_values(device):
    # was, on the CPU: ZeroDivisionError; numba-cuda's kernels give these values on a GPU
    t = _table(device, x=[1.0, -1.0, 0.0, 6.0], y=[0.0, 0.0, 0.0, 4.0], i=[7, -7, 0, 6], j=[0, 0, 0, 4])
    got = t.with_columns(q=fdiv("x", "y"), iq=fdiv("i", "j"), f=ifloor("i", "j"), m=imod("i", "j"))
    assert got.column("q").to_arrow().to_pylist()[:2] == [np.inf, -np.inf]
    assert np.isnan(got.column("q").to_arrow().to_pylist()[2]) and got.column("q").to_arrow()[3].as_py() == 1.5
    assert got.column("iq").to_arrow().to_pylist()[:2] == [np.inf, -np.inf]  # int / int is a float
    assert got.column("f").to_arrow().to_pylist() == [0, 0, 0, 1]  # integers: 0, as NumPy's arrays give
    assert got.column("m").to_arrow().to_pylist() == [0, 0, 0, 2]


@pystrom.kernel(outputs={"d": "float64"})
def raises_at_42(y, d):
    i = cuda.grid(1)
    if i < y.size:
        if y[i] > 41:
            raise ValueError("too big")
        d[i] = y[i] / 0.0


def test_kernel_exception_names_kernel_and_row(device):
    t = _table(device, y=np.arange(100.0))
    with pytest.raises(UserFunctionError, match="kernel raises_at_42 raised ValueError: too big at row 42") as info:
        raises_at_42(t)
    assert info.value.function == "raises_at_42" and isinstance(info.value.__cause__, ValueError)
    d = raises_at_42(_table(device, y=np.arange(3.0))).column("d").to_arrow().to_pylist()
    assert np.isnan(d[0]) and d[1:] == [np.inf, np.inf]  # 0 / 0.0, 1 / 0.0: NumPy's values


_OUT_OF_BOUNDS = """
import numpy as np, pystrom
from numba import cuda

@pystrom.kernel(outputs={"d": "float64"})
def write_past(y, d):
    i = cuda.grid(1)
    if i < y.size:
        d[i + 100] = y[i]

@pystrom.kernel(outputs={"d": "float64"})
def read_past(y, d):
    i = cuda.grid(1)
    if i < y.size:
        d[i] = y[i + 1000000]

t = pystrom.Table.from_arrays({"y": np.arange(100.0)}, device="cpu")
for k in (write_past, read_past):
    for _ in range(3):
        try:
            k(t)
        except pystrom.UserFunctionIndexError as e:
            assert isinstance(e, IndexError) and e.row == 0, e
            print(e)
print("survived")
"""


def test_kernel_cpu_twin_out_of_bounds_raises_instead_of_crashing(tmp_path):
    # was: the process ended with SIGSEGV or SIGABRT, or memory was corrupted silently
    script = tmp_path / "out_of_bounds.py"  # a file: the CPU twin is made from the kernel's source
    script.write_text(_OUT_OF_BOUNDS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "survived" and len(lines) == 7
    assert lines[0] == "kernel write_past raised IndexError: index is out of bounds at row 0 on cpu"
    assert lines[3].startswith("kernel read_past raised IndexError")


def _init() -> np.ndarray:
    return np.zeros(3)


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


def _row_past_the_state(state, x, k):
    state[k] += x  # the state has 3 slots


def _row_refusing(state, x, k):
    if x > 5:
        raise ValueError("x too big")
    state[0] += x / (k - 2.0)


def test_reduce_row_function_errors(device):
    t = _table(device, x=np.arange(10.0), k=np.arange(10))
    with pytest.raises(
        UserFunctionIndexError, match=r"row function '_row_past_the_state' raised IndexError.* at row 3 "
    ):
        pystrom.reduce(t, ["x", "k"], init=_init, row=_row_past_the_state, combine=_add)  # was: memory written past
    small = _table(device, x=np.arange(4.0), k=np.arange(4))
    with pytest.raises(UserFunctionError, match=r"raised ValueError: x too big at row 6 of batch 1 \(x=6.0, k=6\)"):
        pystrom.reduce([small, t], ["x", "k"], init=_init, row=_row_refusing, combine=_add)
    got = pystrom.reduce(small, ["x", "k"], init=_init, row=_row_refusing, combine=_add)
    assert got[0] == np.inf  # 2 / (2 - 2.0): NumPy's division, no error


SCALE = 2.0
OFFSETS = np.array([1.0, 2.0])


@pystrom.udf
def scaled(x):
    return x * SCALE + OFFSETS[1]


@pystrom.kernel(outputs={"d": "float64"})
def scaled_kernel(x, d):
    i = cuda.grid(1)
    if i < x.size:
        d[i] = x[i] * SCALE


def _row_scaled(state, x):
    state[0] += x * SCALE


def test_changed_globals_warn_and_the_frozen_value_stays(device):
    global SCALE
    t = _table(device, x=[1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing changed: no warning
        assert t.with_columns(r=scaled("x")).column("r").to_arrow().to_pylist() == [4.0, 6.0]
        assert scaled_kernel(t).column("d").to_arrow().to_pylist() == [2.0, 4.0]
        assert pystrom.reduce(t, ["x"], init=_init, row=_row_scaled, combine=_add)[0] == 6.0
        assert t.with_columns(r=scaled("x")).column("r").to_arrow().to_pylist() == [4.0, 6.0]
    SCALE = 3.0
    try:
        with pytest.warns(StaleGlobalWarning, match=r"udf scaled: global 'SCALE' changed .*\(2\.0\)"):
            assert t.with_columns(r=scaled("x")).column("r").to_arrow().to_pylist() == [4.0, 6.0]  # numba's rule
        with pytest.warns(StaleGlobalWarning, match="kernel scaled_kernel: global 'SCALE'"):
            scaled_kernel(t)
        with pytest.warns(StaleGlobalWarning, match="row function '_row_scaled': global 'SCALE'"):
            pystrom.reduce(t, ["x"], init=_init, row=_row_scaled, combine=_add)
        SCALE = 2.0
        OFFSETS[1] = 5.0  # an array changed in place: numba froze its old contents too
        with pytest.warns(StaleGlobalWarning, match="global 'OFFSETS'"):
            t.with_columns(r=scaled("x"))
    finally:
        SCALE = 2.0
        OFFSETS[1] = 2.0


# -- the GPU paths' error handling, under numba's CUDA simulator -------------------------------------

_SIM = """
import numpy as np
from numba import cuda
import pystrom
from pystrom._udf import _cuda, _row

@pystrom.udf
def picky(x, y):
    if y == 0:
        raise ValueError("y must not be 0")
    return x + y

@pystrom.kernel(outputs={"d": "float64"})
def raises_at_42(y, d):
    i = cuda.grid(1)
    if i < y.size:
        if y[i] > 41:
            raise ValueError("too big")
        d[i] = y[i]

x = np.arange(300.0)
y = np.ones(300)
y[250] = 0.0
simulated = _cuda.launch


def stopping_launch(kernel, n, args, xp, ordinal=0):
    # numba-cuda without debug: a thread that raises stops, the launch returns, nothing is reported
    try:
        simulated(kernel, n, args, xp, ordinal)
    except Exception:
        pass


for mode in ("raising", "stopping"):
    _row.launch = _cuda.launch = simulated if mode == "raising" else stopping_launch
    try:
        _row.run_cuda(picky, [x, y], [None, None], np.dtype("f8"), 0, np, ("x", "y"))
        raise SystemExit("no error")
    except pystrom.UserFunctionError as e:
        assert (e.function, e.row, e.device) == ("picky", 250, "cuda:0"), (mode, e)
        assert isinstance(e.__cause__, ValueError) and "x=250.0, y=0.0" in str(e), (mode, e)
    k = raises_at_42.compiled(((np.dtype("f8"), 1), (np.dtype("f8"), 1)), "cuda:0")
    try:
        raises_at_42._run_cuda(k, ((np.dtype("f8"), 1), (np.dtype("f8"), 1)), [x, np.zeros(300)], 300, np, 0)
        raise SystemExit("no error")
    except pystrom.UserFunctionError as e:
        assert (e.function, e.row) == ("raises_at_42", 42) and isinstance(e.__cause__, ValueError), (mode, e)
print("OK")
"""


def test_gpu_error_paths_under_the_simulator(tmp_path):
    pytest.importorskip("numba.cuda")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    script = tmp_path / "simulated.py"  # a file: the kernel's CPU twin is made from its source
    script.write_text(textwrap.dedent(_SIM))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "OK"
