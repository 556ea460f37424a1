"""What the UDF modules share: importing numba (or a clear error), the compile counter, column typing."""

from __future__ import annotations

import collections
import re
import types
import warnings
from typing import Any

import numpy as np

from .._dist import require
from ..errors import (
    ColumnNotFoundError,
    MissingDependencyError,
    StaleGlobalWarning,
    UnsupportedTypeError,
    UserFunctionError,
    UserFunctionIndexError,
)
from ..table import Table

__all__ = [
    "COMPILATIONS",
    "CPU_OPTIONS",
    "numba_modules",
    "column_arrays",
    "SUPPORTED_DTYPES",
    "MissingNumbaError",
    "first_line",
    "failure",
    "global_snapshot",
    "warn_stale_globals",
]

# numba options for user code compiled for the CPU. error_model="numpy": division by zero gives inf or
# NaN for floats and 0 for integers, as NumPy's arrays do and as numba-cuda's kernels always do (its
# "python" model, which raises ZeroDivisionError, exists only with debug=True), so the CPU and the GPU
# give the same values. boundscheck: an index out of an array's bounds raises IndexError instead of
# reading or writing past it (a kernel's CPU twin writing d[i + 100] over 100 rows ended the process
# with SIGSEGV or SIGABRT, or corrupted memory, before; issue 39).
CPU_OPTIONS = {"error_model": "numpy", "boundscheck": True}

# One count per compiled loop or kernel, keyed by "cpu" / "cuda": a second call on the same types
# must not add to it (tests check this; timing would be noisy).
COMPILATIONS: collections.Counter = collections.Counter()

SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
)


class MissingNumbaError(MissingDependencyError, UnsupportedTypeError):
    """numba or numba-cuda (the ``udf`` extra) is not installed (an UnsupportedTypeError as it always was)."""


def numba_modules(cuda: bool = False) -> Any:
    """``numba`` (and ``numba.cuda`` with ``cuda=True``), or a MissingDependencyError naming the extra."""
    feature = "pystrom's user functions (@pystrom.udf, @pystrom.kernel, pystrom.reduce)"
    numba = require("numba", feature, MissingNumbaError)
    if cuda:
        numba_cuda = require("numba.cuda", feature + " on a GPU", MissingNumbaError)
        _load_cuda_array_overloads()
        return numba, numba_cuda
    return numba


def _load_cuda_array_overloads() -> None:
    """numba-cuda (0.30) registers ``np.row_stack`` among its array overloads when a kernel first
    compiles, and NumPy 2.5 removed that alias of ``np.vstack``: every CUDA compile then failed with
    "module 'numpy' has no attribute 'row_stack'" (seen on the GPU machine: numba-cuda 0.30.4, NumPy
    2.5.2). Its module is imported here with the alias present for that moment only."""
    import importlib

    import numpy as np

    if hasattr(np, "row_stack"):
        return
    np.row_stack = np.vstack
    try:
        importlib.import_module("numba.cuda.np.arrayobj")
    except ImportError:
        pass
    finally:
        del np.row_stack


def column_arrays(table: Table, names: tuple[str, ...], what: str) -> tuple[list[Any], list[Any]]:
    """Values and validity (bool arrays, None when the column has no NULLs) of ``names``, typed for numba."""
    if not isinstance(table, Table):
        raise UnsupportedTypeError(f"{what} applies to a pystrom.Table, got {type(table).__name__}")
    import pyarrow as pa

    values, valid = [], []
    for name in names:
        if name not in table.schema.names:
            raise ColumnNotFoundError(f"{what}: no column {name!r}; the table has {table.schema.names}")
        col = table.column(name)
        t = col.type
        plain = pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_float32(t) or pa.types.is_float64(t)
        if not plain or col.dtype not in SUPPORTED_DTYPES:
            raise UnsupportedTypeError(
                f"{what}: column {name!r} has type {col.type}; user functions take bool, integer and "
                "float32/float64 columns"
            )
        values.append(col.values)  # bool columns are one byte per value: a numba bool array
        valid.append(col.is_valid() if col.null_count else None)
    return values, valid


def first_line(exc: BaseException) -> str:
    """The first line of a numba error, without its terminal colour codes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def failure(
    what: str, function: str, row: int | None, device: str, exc: BaseException | None, detail: str = "", of: str = ""
) -> UserFunctionError:
    """The error for user function ``function`` (``what``: as the message names it, with its columns)
    that failed at ``row`` (None: unknown) on ``device``, raised by ``exc`` (its own exception, or None
    where the device gave none); ``detail``: the row's values, how the exception was had; ``of``: the
    batch or partition the row is counted in."""
    at = f" at row {row:,}{f' of {of}' if of else ''}" if row is not None else (f" in {of}" if of else "")
    raised = " failed"
    if exc is not None:
        raised = f" raised {type(exc).__name__}" + (f": {first_line(exc)}" if str(exc).strip() else "")
    message = f"{what}{raised}{at}{f' ({detail})' if detail else ''} on {device}"
    kind = UserFunctionIndexError if isinstance(exc, IndexError) else UserFunctionError
    err = kind(message, function, row, device)
    err.__cause__ = exc
    return err


_FROZEN_SCALARS = (bool, int, float, complex, str, bytes, type(None), np.generic)
_MAX_SNAPSHOT = 1 << 16  # elements of a global array compared at each call (larger ones: by identity)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions and comprehensions
            names |= _global_names(const)
    return names


def _freeze(value: Any) -> Any:
    if isinstance(value, _FROZEN_SCALARS) or (
        isinstance(value, tuple) and all(isinstance(v, _FROZEN_SCALARS) for v in value)
    ):
        return ("value", value)
    if isinstance(value, np.ndarray):
        return ("array", value.copy()) if value.size <= _MAX_SNAPSHOT else ("id", id(value), value.shape, value.dtype)
    return None  # modules, functions, numba dispatchers: not values numba freezes


def global_snapshot(func: Any) -> dict[str, Any]:
    """The globals ``func`` reads that numba freezes at compilation (numbers, strings, tuples of them,
    NumPy arrays), as they are now."""
    func = getattr(func, "py_func", func)
    code, scope = getattr(func, "__code__", None), getattr(func, "__globals__", {})
    if code is None:
        return {}
    out = {}
    for name in sorted(_global_names(code)):
        if name in scope:
            frozen = _freeze(scope[name])
            if frozen is not None:
                out[name] = frozen
    return out


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None or a[0] != b[0]:
        return a is b
    if a[0] == "array":
        return (
            a[1].shape == b[1].shape and a[1].dtype == b[1].dtype and bool(np.array_equal(a[1], b[1], equal_nan=True))
        )
    if a[0] == "value":
        try:
            return type(a[1]) is type(b[1]) and bool(a[1] == b[1] or (a[1] != a[1] and b[1] != b[1]))
        except Exception:
            return False
    return a == b


def warn_stale_globals(what: str, func: Any, snapshot: dict[str, Any]) -> None:
    """Warn (:class:`~pystrom.errors.StaleGlobalWarning`) for each global of ``snapshot`` that changed
    since: numba compiled the old value into the function, which keeps using it."""
    if not snapshot:
        return
    now = global_snapshot(func)
    for name, then in snapshot.items():
        if not _same(then, now.get(name)):
            old = then[1] if then[0] == "value" else "the array it held then"
            warnings.warn(
                f"{what}: global {name!r} changed since the function was compiled; numba froze its value at "
                f"compilation ({old!r}), which the function still uses. Pass the value as a column or an array "
                "argument, or define the function again to compile the new value in",
                StaleGlobalWarning,
                stacklevel=4,
            )
