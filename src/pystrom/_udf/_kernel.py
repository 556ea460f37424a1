"""``@pystrom.kernel``: a numba CUDA kernel whose parameters are bound to columns by name.

In order, when a kernel is called on a table: each parameter is bound by name to a column of the
table (its values, read-only by contract; NULL slots hold unspecified values), to ``<column>_valid``
(the column's validity as bools), or to a new output column declared in the decorator (allocated
here, no NULLs); the kernel runs over the rows with a grid of ``ceil(rows / 256)`` blocks of 256
threads on CuPy's current stream; the outputs are added to a new table (``Table.with_columns``).

The CPU twin is the kernel body compiled with numba ``njit`` as a function of the row: the AST of
the function has ``cuda.grid(1)`` replaced by the row index and ``cuda.gridsize(1)`` by the row
count, and a generated loop calls it once per row. numba's CUDA simulator runs the same body too,
but about a thousand times slower (a Python thread per CUDA thread), so it serves tests only. Other
``cuda.*`` features (shared memory, atomics, synchronisation) have no CPU twin and are refused there.

Errors: the CPU twin checks every index (numba's ``boundscheck``) and divides as NumPy does (inf/NaN,
0 for integers; :data:`~pystrom._udf._common.CPU_OPTIONS`); where it raises, a second loop finds the
first row that raises and the kernel's error names it (:class:`~pystrom.errors.UserFunctionIndexError`
for an index out of bounds). On a GPU the kernel runs as a device function inside a generated kernel
that marks each thread that returned from it in a byte array: numba-cuda kernels carry no exceptions
(a thread that raises just stops), so one reduction of those bytes tells whether every thread
finished, and the CPU twin, where the kernel has one, finds the row and its exception from host
copies of the inputs. Writes out of bounds are not checked on a GPU.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
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

__all__ = ["kernel", "Kernel", "cpu_body_source"]

_LOCK = threading.RLock()  # compiled() builds the CPU twin's body through _body()
_ROW_NAMES = {"grid": "__pystrom_row", "gridsize": "__pystrom_rows"}


def kernel(fn: Any = None, *, outputs: dict[str, Any] | None = None) -> Any:
    """Make ``fn`` (written as a numba CUDA kernel over rows) a pystrom kernel.

    ``@pystrom.kernel(outputs={"d": "float64"})``: parameters named like columns get the columns,
    parameters named in ``outputs`` get new columns of those dtypes; calling the kernel on a table
    returns a new table with the outputs added.
    """

    def wrap(f: Any) -> Kernel:
        return Kernel(f, dict(outputs or {}))

    return wrap(fn) if fn is not None else wrap


class Kernel:
    def __init__(self, fn: Any, outputs: dict[str, Any]):
        if not callable(fn) or not hasattr(fn, "__code__"):
            raise UnsupportedTypeError(f"pystrom.kernel decorates a Python function, got {type(fn).__name__}")
        self.func = fn
        self.name = fn.__name__
        self.params = tuple(inspect.signature(fn).parameters)
        self.outputs = {}
        for name, dt in outputs.items():
            try:
                dtype = np.dtype(dt)
            except TypeError:
                dtype = None
            if dtype is None or dtype not in SUPPORTED_DTYPES:
                raise UnsupportedTypeError(
                    f"kernel {self.name}: output {name!r} has dtype {dt!r}; use bool, an integer or a float"
                )
            if name not in self.params:
                raise ExpressionError(f"kernel {self.name}: output {name!r} is not one of its parameters {self.params}")
            self.outputs[name] = dtype
        self._compiled: dict[tuple, Any] = {}  # (types, device) -> the loop or GPU kernel
        self._bodies: dict[tuple, Any] = {}  # types -> the CPU twin's body (njit), for the errors
        self._probes: dict[tuple, Any] = {}
        self._frozen: dict[tuple, dict] = {}  # (types, device) -> the globals the compilation froze

    def __repr__(self) -> str:
        return f"<pystrom.kernel {self.name} outputs={ {k: str(v) for k, v in self.outputs.items()} }>"

    def __call__(self, table: Table, **arrays: Any) -> Table:
        """Run over the rows of ``table``; ``arrays`` bind other parameters to arrays (copied to its device)."""
        what = f"kernel {self.name}"
        if not isinstance(table, Table):
            raise UnsupportedTypeError(f"{what} runs on a pystrom.Table, got {type(table).__name__}")
        names = table.schema.names
        for p in arrays:
            if p not in self.params or p in self.outputs or p in names:
                raise ExpressionError(f"{what}: {p!r} is not a parameter left to bind by keyword {self.params}")
        taken = set(arrays) | set(self.outputs)
        inputs = tuple(p for p in self.params if p not in taken and p in names)
        flags = tuple(p for p in self.params if p not in taken and p not in names)
        for p in flags:
            if not (p.endswith("_valid") and p[: -len("_valid")] in names):
                raise ExpressionError(
                    f"{what}: parameter {p!r} is neither a column of the table {names}, an output, nor <column>_valid"
                )
        values, _ = column_arrays(table, inputs, what)
        _, valid = column_arrays(table, tuple(p[: -len("_valid")] for p in flags), what)
        backend = table._live().backend
        n = table.num_rows
        with backend.activate():
            xp = backend.xp
            bound = dict(zip(inputs, values))
            for p, v in zip(flags, valid):
                bound[p] = xp.ones(n, dtype=bool) if v is None else v
            outs = {name: xp.zeros(n, dtype=dt) for name, dt in self.outputs.items()}
            bound.update(outs)
            for p, a in arrays.items():
                host = np.asarray(backend.to_host(a) if hasattr(a, "__cuda_array_interface__") else a)
                if host.dtype not in SUPPORTED_DTYPES:
                    raise UnsupportedTypeError(
                        f"{what}: array {p!r} has dtype {host.dtype}; use bool, integers or floats"
                    )
                bound[p] = backend.from_host(np.ascontiguousarray(host)) if backend.kind != "cpu" else host
            args = [xp.ascontiguousarray(bound[p]) for p in self.params]
            device = "cpu" if backend.kind == "cpu" else f"cuda:{backend.ordinal}"
            types = tuple((np.dtype(a.dtype), a.ndim) for a in args)
            fn = self.compiled(types, device)
            if device == "cpu":
                try:
                    fn(*args, np.int64(n))
                except Error:
                    raise
                except Exception as exc:
                    err = self._failure(types, [np.array(a) for a in args], n, device, exc)
                    raise err from err.__cause__
            else:
                self._run_cuda(fn, types, args, n, xp, backend.ordinal)
        from .._compute import with_arrays  # up: the table is built where with_columns builds tables

        return with_arrays(table, {name: (arr, None) for name, arr in outs.items()})

    def _run_cuda(self, fn: Any, types: tuple, args: list, n: int, xp: Any, ordinal: int) -> None:
        from ._cuda import THREADS, launch

        device = f"cuda:{ordinal}"
        done = xp.zeros(-(-n // THREADS) * THREADS, dtype=np.uint8)  # a byte per thread launched
        try:
            launch(fn, n, [*args, done], xp, ordinal)
        except Error:
            raise
        except Exception as exc:  # numba's CUDA simulator runs the kernel in Python: its exception comes here
            host = [np.array(a.get() if xp is not np else a) for a in args]
            err = self._failure(types, host, n, device, exc)
            raise err from err.__cause__
        if n and not all_true(done):  # one launch and a wait: a thread that stopped left its byte 0
            host = [np.array(a.get() if xp is not np else a) for a in args]
            err = self._failure(types, host, n, device, None, int(xp.argmin(done)))
            raise err from err.__cause__

    def _failure(
        self, types: tuple, args: list, n: int, device: str, exc: BaseException | None, thread: int | None = None
    ) -> Error:
        """The error for a run that raised ``exc`` (or whose GPU thread ``thread`` did not finish): the
        first row whose body raises in the CPU twin (on host copies ``args``), and the body's own
        exception raised again there; without a CPU twin, the first thread that stopped."""
        what = f"kernel {self.name}"
        try:
            body = self._body(types)
        except Error:  # no CPU twin (shared memory, atomics...): the GPU's word only
            where = f"thread {thread:,} is the first that did not finish" if thread is not None else ""
            return failure(what, self.name, None, device, exc, where)
        numba = numba_modules()
        with _LOCK:
            probe = self._probes.get(types)
            if probe is None:
                params = ", ".join(self.params)
                source = (  # names a parameter cannot have (the loop's, too)
                    f"def probe({params}, __n):\n    for __r in range(__n):\n        try:\n"
                    f"            __body(__r, __n, {params})\n        except Exception:\n            return __r\n"
                    "    return -1\n"
                )
                scope = {"__body": body}
                exec(compile(source, f"<pystrom kernel probe {self.name}>", "exec"), scope)  # generated here
                probe = self._probes[types] = numba.njit(scope["probe"])
        row = int(probe(*args, np.int64(n)))
        if row < 0:
            detail = "the CPU twin runs every row without an error" if device != "cpu" else ""
            if thread is not None:
                detail += f"; thread {thread:,} is the first that did not finish"
            return failure(what, self.name, None, device, exc, detail)
        cause = exc
        try:
            body(np.int64(row), np.int64(n), *args)
        except Exception as again:  # the body's own exception, from this row
            cause = again
        detail = "the GPU gives no exception: the CPU twin raised it" if device != "cpu" else ""
        return failure(what, self.name, row, device, cause, detail)

    def _body(self, types: tuple) -> Any:
        """The CPU twin's body for these parameter types: the kernel as a function of the row, njit."""
        with _LOCK:
            body = self._bodies.get(types)
            if body is None:
                numba = numba_modules()
                scope = dict(self.func.__globals__)
                exec(compile(cpu_body_source(self.func), f"<pystrom kernel {self.name}>", "exec"), scope)
                body = self._bodies[types] = numba.njit(**CPU_OPTIONS)(scope[self.name])
            return body

    def compiled(self, dtypes: tuple[tuple[np.dtype, int], ...], device: str) -> Any:
        """The kernel (a GPU) or its CPU twin's loop for these parameter (dtype, ndim)s, compiled once."""
        key = (dtypes, device)
        with _LOCK:
            hit = self._compiled.get(key)
            if hit is not None:
                warn_stale_globals(f"kernel {self.name}", self.func, self._frozen[key])
                return hit
            numba = numba_modules()
            arrays = [numba.types.Array(numba.from_dtype(d), ndim, "C") for d, ndim in dtypes]
            try:
                if device == "cpu":
                    fn = self._cpu_loop(numba, arrays, dtypes)
                else:
                    fn = self._gpu_kernel(numba, arrays, int(device.split(":")[1]))
            except Error:  # pystrom's own (no CPU twin, no source): already names the kernel
                raise
            except Exception as exc:
                first = first_line(exc)
                described = ", ".join(
                    f"{p} {d}" + (f"[{nd}-d]" if nd != 1 else "") for p, (d, nd) in zip(self.params, dtypes)
                )
                raise UnsupportedTypeError(
                    f"kernel {self.name} does not compile on {device} for ({described}): {first}"
                ) from None
            COMPILATIONS["cuda" if device != "cpu" else "cpu"] += 1
            self._compiled[key] = fn
            self._frozen[key] = global_snapshot(self.func)
            return fn

    def _gpu_kernel(self, numba: Any, arrays: list, ordinal: int) -> Any:
        """The kernel as a device function called by a generated kernel that marks each thread that
        returned from it (``done``, a byte per thread launched)."""
        from ._cuda import on_device

        _, cuda = numba_modules(cuda=True)
        params = ", ".join(self.params)
        source = f"def wrapper({params}, __done):\n    __kernel({params})\n    __done[__cuda.grid(1)] = 1\n"
        scope = {"__kernel": cuda.jit(device=True)(self.func), "__cuda": cuda}
        exec(compile(source, f"<pystrom kernel wrapper {self.name}>", "exec"), scope)  # generated here
        with on_device(cuda, ordinal):
            return cuda.jit(numba.types.void(*arrays, numba.types.Array(numba.types.uint8, 1, "C")))(scope["wrapper"])

    def _cpu_loop(self, numba: Any, arrays: list, dtypes: tuple) -> Any:
        body = self._body(dtypes)
        params = ", ".join(self.params)
        source = f"def loop({params}, __n):\n    for __r in __prange(__n):\n        __body(__r, __n, {params})\n"
        loop_scope = {"__body": body, "__prange": numba.prange}  # names a parameter cannot have
        exec(compile(source, f"<pystrom kernel loop {self.name}>", "exec"), loop_scope)  # generated here
        return numba.njit(numba.types.void(*arrays, numba.types.int64))(loop_scope["loop"])


class _RowIndex(ast.NodeTransformer):
    def __init__(self, name: str):
        self.name = name

    def visit_Call(self, node: ast.Call) -> Any:
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "cuda":
            if (
                f.attr in _ROW_NAMES
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == 1
            ):
                return ast.copy_location(ast.Name(_ROW_NAMES[f.attr], ast.Load()), node)
            raise UnsupportedTypeError(
                f"kernel {self.name}: cuda.{f.attr}(...) has no CPU twin; the CPU runs kernels that use "
                "cuda.grid(1) and cuda.gridsize(1) only"
            )
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        if isinstance(node.value, ast.Name) and node.value.id == "cuda":
            raise UnsupportedTypeError(f"kernel {self.name}: cuda.{node.attr} has no CPU twin")
        return self.generic_visit(node)


def cpu_body_source(func: Any) -> str:
    """Source of ``func`` as a function of (row, rows, *params): the kernel body for one row."""
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise UnsupportedTypeError(f"kernel {func.__name__}: its source is needed for the CPU twin ({exc})") from None
    tree = ast.parse(source)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise UnsupportedTypeError(f"kernel {func.__name__}: a kernel is a def function")
    fdef.decorator_list = []
    fdef.args.args[:0] = [ast.arg(_ROW_NAMES["grid"]), ast.arg(_ROW_NAMES["gridsize"])]
    fdef = _RowIndex(func.__name__).visit(fdef)
    module = ast.Module([fdef], type_ignores=[])
    return ast.unparse(ast.fix_missing_locations(module))
