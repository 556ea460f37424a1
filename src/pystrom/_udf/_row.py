"""``@pystrom.udf``: a scalar Python function applied to every row of some columns.

In order, when a UDF is applied to a table (``table.with_columns(d=f("x", "y"))``, a ``where`` string
naming it, or ``f.apply(table, "x", "y")``):

1. the columns' values and validity are taken (bool, integer and float columns; :mod:`._common`);
2. the function is typed for the columns' numba types with ``njit`` (an error naming the UDF, the
   columns and their types when it does not compile); its return type is the new column's type;
3. one loop is generated for (function, argument types, which arguments have NULLs, NULL mode,
   device) and compiled once (:data:`COMPILATIONS` counts it): an ``njit`` loop on the CPU, a CUDA
   kernel calling the function as a device function on a GPU (:mod:`._cuda`);
4. the loop writes values and, where some argument may be NULL, the result's validity.

Errors: a row where the function raises (or, on a GPU, stops without writing its result: numba-cuda
kernels carry no exceptions) makes the call raise :class:`~pystrom.errors.UserFunctionError` naming
the UDF, the first such row and its values, with the function's own exception as the cause: found by
a second compiled loop that stops at the first row that raises (compiled only then, so the loop
that succeeds pays nothing), and on a GPU raised again by the CPU function from that row's values.
A GPU loop marks each row it finished in a byte array; one reduction of it tells whether all did.

NULLs: by default (``nulls="propagate"``) a row where any argument is NULL is NULL and the function is
not called for it. With ``nulls="pass"`` the function is called for every row with each argument
followed by a bool (True: not NULL), and the result is never NULL.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..errors import Error, ExpressionError, UnsupportedTypeError
from ..memory.bitmap import all_true
from ..table import Table
from ._common import (
    COMPILATIONS,
    CPU_OPTIONS,
    SUPPORTED_DTYPES,
    column_arrays,
    failure,
    first_line,
    global_snapshot,
    numba_modules,
    warn_stale_globals,
)
from ._cuda import compile_kernel, launch

__all__ = ["udf", "UDF", "UDFCall", "registered", "generate_loop", "generate_probe", "run_cpu", "run_cuda"]

_REGISTRY: dict[str, UDF] = {}
_LOOPS: dict[tuple, tuple[Any, np.dtype, dict]] = {}  # the loop, its result dtype, the globals it froze
_PROBES: dict[tuple, Any] = {}
_LOCK = threading.Lock()
_MODES = ("propagate", "pass")


def udf(fn: Any = None, *, name: str | None = None, nulls: str = "propagate") -> Any:
    """Make ``fn`` (a scalar function numba can compile) a pystrom UDF, registered by name.

    ``@pystrom.udf`` or ``@pystrom.udf(name="dist", nulls="pass")``. The registered name (default:
    the function's name, case-insensitive) may be called in ``where`` strings of ``Table.filter``;
    a later UDF of the same name replaces the earlier one.
    """
    if nulls not in _MODES:
        raise ExpressionError(f"udf: nulls must be one of {_MODES}, got {nulls!r}")

    def wrap(f: Any) -> UDF:
        if not callable(f) or not hasattr(f, "__code__"):
            raise UnsupportedTypeError(f"udf decorates a Python function, got {type(f).__name__}")
        u = UDF(f, name or f.__name__, nulls)
        _REGISTRY[u.name] = u
        return u

    return wrap(fn) if fn is not None else wrap


def registered(name: str) -> UDF | None:
    """The UDF registered under ``name`` (case-insensitive), or None."""
    return _REGISTRY.get(name.lower())


class UDF:
    """A user row function; call it with column names to get a :class:`UDFCall` for ``with_columns``."""

    def __init__(self, fn: Any, name: str, nulls: str):
        if not isinstance(name, str) or not name.isidentifier():
            raise ExpressionError(f"udf: the name must be an identifier, got {name!r}")
        self.func = fn
        self.name = name.lower()
        self.nulls = nulls
        self._njit = None
        self._dtypes: dict[tuple, np.dtype] = {}  # argument dtypes -> result dtype, typed once

    def __call__(self, *columns: str) -> UDFCall:
        if not columns or not all(isinstance(c, str) for c in columns):
            raise ExpressionError(
                f"udf {self.name}: call it with column names, e.g. {self.name}('x', 'y'); got {columns!r}"
            )
        return UDFCall(self, tuple(columns))

    def apply(self, table: Table, *columns: str) -> tuple[Any, Any]:
        """(values, validity or None) of the UDF over ``columns`` of ``table``, on the table's device."""
        return UDFCall(self, tuple(columns)).evaluate(table)

    def __repr__(self) -> str:
        return f"<pystrom.udf {self.name} nulls={self.nulls!r}>"

    def result_dtype(self, dtypes: tuple[np.dtype, ...], columns: tuple[str, ...]) -> np.dtype:
        """The function's return dtype for arguments of ``dtypes`` (typed by numba on the CPU)."""
        hit = self._dtypes.get(dtypes)
        if hit is not None:
            return hit
        numba = numba_modules()
        if self._njit is None:
            self._njit = numba.njit(self.func, **CPU_OPTIONS)
        sig = _scalar_signature(numba, dtypes, self.nulls)
        described = ", ".join(f"{c} {d}" for c, d in zip(columns, dtypes))
        try:
            self._njit.compile(sig)
            rt = self._njit.overloads[sig].signature.return_type
        except Exception as exc:  # numba's TypingError/LoweringError/NumbaNotImplementedError
            first = first_line(exc)
            raise UnsupportedTypeError(f"udf {self.name} does not compile for columns ({described}): {first}") from None
        try:
            dtype = numba.np.numpy_support.as_dtype(rt)
        except Exception:  # a tuple, a record, an array: no column dtype
            dtype = None
        if dtype is None or dtype not in SUPPORTED_DTYPES:
            raise UnsupportedTypeError(
                f"udf {self.name} on columns ({described}) returns {rt}; a UDF returns a bool, integer or float"
            )
        self._dtypes[dtypes] = dtype
        return dtype


class UDFCall:
    """A UDF applied to named columns: a value of ``Table.with_columns``."""

    def __init__(self, udf: UDF, columns: tuple[str, ...]):
        self.udf = udf
        self.columns = columns

    def __repr__(self) -> str:
        return f"{self.udf.name}({', '.join(self.columns)})"

    def evaluate(self, table: Table) -> tuple[Any, Any]:
        u = self.udf
        what = f"udf {u.name}({', '.join(self.columns)})"
        values, valid = column_arrays(table, self.columns, what)
        backend = table._live().backend
        dtypes = tuple(np.dtype(v.dtype) for v in values)
        out_dtype = u.result_dtype(dtypes, self.columns)
        with backend.activate():
            if backend.kind == "cpu":
                return run_cpu(u, values, valid, out_dtype, self.columns)
            return run_cuda(u, values, valid, out_dtype, backend.ordinal, backend.xp, self.columns)


def _scalar_signature(numba: Any, dtypes: tuple[np.dtype, ...], nulls: str) -> tuple:
    out = []
    for d in dtypes:
        out.append(numba.from_dtype(d))
        if nulls == "pass":
            out.append(numba.types.boolean)
    return tuple(out)


def generate_loop(k: int, nullable: tuple[bool, ...], nulls: str, gpu: bool) -> tuple[str, bool]:
    """Python source of the loop over rows (``loop``), and whether it writes a validity array ``ok``."""
    params = [f"a{i}" for i in range(k)] + [f"v{i}" for i in range(k) if nullable[i]]
    writes_ok = nulls == "propagate" and any(nullable)
    params += ["out", "ok"] if writes_ok else ["out"]
    params += ["done", "n"] if gpu else ["n"]  # done: the rows a GPU thread finished (module docstring)
    if nulls == "pass":
        args = ", ".join(f"a{i}[i], {f'v{i}[i]' if nullable[i] else 'True'}" for i in range(k))
    else:
        args = ", ".join(f"a{i}[i]" for i in range(k))
    if writes_ok:
        cond = " and ".join(f"v{i}[i]" for i in range(k) if nullable[i])
        body = [f"if {cond}:", f"    out[i] = f({args})", "    ok[i] = True", "else:", "    ok[i] = False"]
    else:
        body = [f"out[i] = f({args})"]
    if gpu:
        head = ["i = cuda.grid(1)", "if i < n:"]
        body.append("done[i] = 1")
    else:
        head = ["for i in prange(n):"]
    lines = [f"def loop({', '.join(params)}):"] + ["    " + h for h in head] + ["        " + b for b in body]
    return "\n".join(lines) + "\n", writes_ok


def generate_probe(k: int, nullable: tuple[bool, ...], nulls: str) -> str:
    """Python source of ``probe``: the CPU loop's calls in order, returning the first row whose call
    raises (-1: none), for the error of a loop that raised."""
    params = [f"a{i}" for i in range(k)] + [f"v{i}" for i in range(k) if nullable[i]]
    if nulls == "pass":
        args = ", ".join(f"a{i}[i], {f'v{i}[i]' if nullable[i] else 'True'}" for i in range(k))
    else:
        args = ", ".join(f"a{i}[i]" for i in range(k))
    cond = " and ".join(f"v{i}[i]" for i in range(k) if nullable[i]) if nulls == "propagate" else ""
    call = [f"if {cond}:", f"    f({args})"] if cond else [f"f({args})"]
    lines = [f"def probe({', '.join(params + ['n'])}):", "    for i in range(n):", "        try:"]
    lines += ["            " + c for c in call]
    lines += ["        except Exception:", "            return i", "    return -1"]
    return "\n".join(lines) + "\n"


def compiled_loop(u: UDF, dtypes: tuple, nullable: tuple[bool, ...], out_dtype: np.dtype, device: str) -> Any:
    """The loop for these types on ``device`` ("cpu" or "cuda:N"), compiled on the first call only."""
    key = (u.func, dtypes, nullable, u.nulls, device)
    with _LOCK:
        hit = _LOOPS.get(key)
        if hit is not None:
            warn_stale_globals(f"udf {u.name}", u.func, hit[2])
            return hit[0]
        gpu = device != "cpu"
        numba = numba_modules()
        source, writes_ok = generate_loop(len(dtypes), nullable, u.nulls, gpu)
        arr = [numba.types.Array(numba.from_dtype(d), 1, "C", readonly=not gpu) for d in dtypes]
        flags = [numba.types.Array(numba.types.boolean, 1, "C", readonly=not gpu) for m in nullable if m]
        tail = [numba.types.Array(numba.from_dtype(out_dtype), 1, "C")]
        if writes_ok:
            tail.append(numba.types.Array(numba.types.boolean, 1, "C"))
        if gpu:
            tail.append(numba.types.Array(numba.types.uint8, 1, "C"))
        sig = numba.types.void(*arr, *flags, *tail, numba.types.int64)
        described = ", ".join(str(d) for d in dtypes)
        try:
            if gpu:
                fn = compile_kernel(u.func, source, sig, int(device.split(":")[1]))
            else:
                scope = {"f": u._njit, "prange": numba.prange}
                exec(compile(source, f"<pystrom udf {u.name}>", "exec"), scope)  # generated above, no user text
                fn = numba.njit(sig, parallel=_PARALLEL)(scope["loop"])
        except Exception as exc:
            first = first_line(exc)
            raise UnsupportedTypeError(
                f"udf {u.name} does not compile on {device} for ({described}): {first}"
            ) from None
        COMPILATIONS["cuda" if gpu else "cpu"] += 1
        _LOOPS[key] = (fn, out_dtype, global_snapshot(u.func))
        return fn


# Measured (benchmarks/bench_udf.py, cpu section): see docs/udf.md for the numbers behind the choice.
_PARALLEL = False


def run_cpu(u: UDF, values: list, valid: list, out_dtype: np.dtype, columns: tuple[str, ...] | None = None) -> tuple:
    n = int(values[0].shape[0]) if values else 0
    nullable = tuple(v is not None for v in valid)
    dtypes = tuple(np.dtype(v.dtype) for v in values)
    loop = compiled_loop(u, dtypes, nullable, out_dtype, "cpu")
    out = np.empty(n, dtype=out_dtype)
    flags = [np.ascontiguousarray(v) for v in valid if v is not None]
    args = [np.ascontiguousarray(v) for v in values] + flags + [out]
    ok = None
    if u.nulls == "propagate" and any(nullable):
        ok = np.empty(n, dtype=bool)
        args.append(ok)
    try:
        loop(*args, np.int64(n))
    except Error:
        raise
    except Exception as exc:
        err = row_failure(u, values, valid, columns, "cpu", exc)
        raise err from err.__cause__
    return out, ok


def run_cuda(
    u: Any,
    values: list,
    valid: list,
    out_dtype: np.dtype,
    ordinal: int,
    xp: Any,
    columns: tuple[str, ...] | None = None,
) -> tuple[Any, Any]:
    """The UDF's loop over the rows on GPU ``ordinal`` (CuPy arrays in, CuPy arrays out)."""

    n = int(values[0].shape[0])
    nullable = tuple(v is not None for v in valid)
    dtypes = tuple(np.dtype(v.dtype) for v in values)
    kernel = compiled_loop(u, dtypes, nullable, out_dtype, f"cuda:{ordinal}")
    out = xp.empty(n, dtype=out_dtype)
    args = [xp.ascontiguousarray(v) for v in values] + [xp.ascontiguousarray(v) for v in valid if v is not None]
    args.append(out)
    ok = None
    if u.nulls == "propagate" and any(nullable):
        ok = xp.empty(n, dtype=bool)
        args.append(ok)
    done = xp.zeros(n, dtype=np.uint8)
    device = f"cuda:{ordinal}"
    try:
        launch(kernel, n, [*args, done, np.int64(n)], xp, ordinal)
    except Error:
        raise
    except Exception as exc:  # numba's CUDA simulator runs the function in Python: its exception comes here
        host = [_host(xp, v) for v in values], [None if v is None else _host(xp, v) for v in valid]
        err = row_failure(u, *host, columns, device, exc)
        raise err from err.__cause__
    if n and not all_true(done):  # one launch and a wait: a thread that stopped left its byte 0
        host = [_host(xp, v) for v in values], [None if v is None else _host(xp, v) for v in valid]
        err = row_failure(u, *host, columns, device, None, int(xp.argmin(done)))
        raise err from err.__cause__
    return out, ok


def _host(xp: Any, a: Any) -> np.ndarray:
    return np.asarray(a.get() if xp is not np else a)


def row_failure(
    u: UDF,
    values: list,
    valid: list,
    columns: tuple[str, ...] | None,
    device: str,
    exc: BaseException | None,
    gpu_row: int | None = None,
) -> Error:
    """The error for a loop that raised ``exc`` (or whose GPU row ``gpu_row`` did not finish): the first
    row whose call raises on the CPU (host arrays), its values, and the function's own exception
    raised again from them."""
    k = len(values)
    names = columns or tuple(f"a{i}" for i in range(k))
    what = f"udf {u.name}({', '.join(names)})"
    nullable = tuple(v is not None for v in valid)
    key = (u.func, tuple(np.dtype(v.dtype) for v in values), nullable, u.nulls)
    numba = numba_modules()
    if u._njit is None:  # (typed by result_dtype before any loop runs; a direct call of run_* may skip it)
        u._njit = numba.njit(u.func, **CPU_OPTIONS)
    with _LOCK:
        probe = _PROBES.get(key)
        if probe is None:
            scope = {"f": u._njit}
            exec(compile(generate_probe(k, nullable, u.nulls), f"<pystrom udf probe {u.name}>", "exec"), scope)
            probe = _PROBES[key] = numba.njit(scope["probe"])
    flags = [np.ascontiguousarray(v) for v in valid if v is not None]
    row = int(probe(*[np.ascontiguousarray(v) for v in values], *flags, np.int64(len(values[0]) if k else 0)))
    if row < 0:  # the CPU computes every row: a failure of the GPU's code only
        row = gpu_row
        cause = exc
        how = "the same values raise nothing on the CPU" if exc is None else ""
    else:
        args = []
        for i, v in enumerate(values):
            args.append(v[row])
            if u.nulls == "pass":
                args.append(bool(valid[i][row]) if valid[i] is not None else True)
        cause = exc
        try:
            u._njit(*args)
        except Exception as again:  # the function's own exception, from this row's values
            cause = again
        how = "the GPU gives no exception: the CPU raised it from the row's values" if device != "cpu" else ""

    def show(i: int) -> str:
        return "NULL" if valid[i] is not None and not valid[i][row] else repr(values[i][row].item())

    shown = "" if row is None or not k else ", ".join(f"{c}={show(i)}" for i, c in enumerate(names))
    return failure(what, u.name, row, device, cause, "; ".join(p for p in (shown, how) if p))
