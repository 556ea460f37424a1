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
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import threading
from typing import Any

import numpy as np

from ..errors import Error, ExpressionError, UnsupportedTypeError
from ..table import Table
from ._common import COMPILATIONS, SUPPORTED_DTYPES, column_arrays, first_line, numba_modules

__all__ = ["kernel", "Kernel", "cpu_body_source"]

_LOCK = threading.Lock()
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
        self._compiled: dict[tuple, Any] = {}

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
            fn = self.compiled(tuple((np.dtype(a.dtype), a.ndim) for a in args), device)
            if device == "cpu":
                fn(*args, np.int64(n))
            else:
                from ._cuda import launch

                launch(fn, n, args, xp, backend.ordinal)
        from .._compute import with_arrays  # up: the table is built where with_columns builds tables

        return with_arrays(table, {name: (arr, None) for name, arr in outs.items()})

    def compiled(self, dtypes: tuple[tuple[np.dtype, int], ...], device: str) -> Any:
        """The kernel (a GPU) or its CPU twin's loop for these parameter (dtype, ndim)s, compiled once."""
        key = (dtypes, device)
        with _LOCK:
            hit = self._compiled.get(key)
            if hit is not None:
                return hit
            numba = numba_modules()
            arrays = [numba.types.Array(numba.from_dtype(d), ndim, "C") for d, ndim in dtypes]
            try:
                if device == "cpu":
                    fn = self._cpu_loop(numba, arrays)
                else:
                    from ._cuda import on_device

                    _, cuda = numba_modules(cuda=True)
                    with on_device(cuda, int(device.split(":")[1])):
                        fn = cuda.jit(numba.types.void(*arrays))(self.func)
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
            return fn

    def _cpu_loop(self, numba: Any, arrays: list) -> Any:
        scope = dict(self.func.__globals__)
        exec(compile(cpu_body_source(self.func), f"<pystrom kernel {self.name}>", "exec"), scope)
        body = numba.njit(scope[self.name])
        params = ", ".join(self.params)
        source = f"def loop({params}, n):\n    for r in prange(n):\n        body(r, n, {params})\n"
        loop_scope = {"body": body, "prange": numba.prange}
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
