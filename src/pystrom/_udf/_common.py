"""What the UDF modules share: importing numba (or a clear error), the compile counter, column typing."""

from __future__ import annotations

import collections
import re
from typing import Any

import numpy as np

from ..errors import ColumnNotFoundError, UnsupportedTypeError
from ..table import Table

__all__ = ["COMPILATIONS", "numba_modules", "column_arrays", "SUPPORTED_DTYPES", "MissingNumbaError", "first_line"]

# One count per compiled loop or kernel, keyed by "cpu" / "cuda": a second call on the same types
# must not add to it (tests check this; timing would be noisy).
COMPILATIONS: collections.Counter = collections.Counter()

SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
)


class MissingNumbaError(UnsupportedTypeError, ImportError):
    """numba (the ``udf`` extra) is not installed."""


def numba_modules(cuda: bool = False) -> Any:
    """``numba`` (and ``numba.cuda`` with ``cuda=True``), or a pystrom error naming the extra."""
    try:
        import numba

        if cuda:
            from numba import cuda as numba_cuda

            _load_cuda_array_overloads()
            return numba, numba_cuda
    except ImportError as exc:
        raise MissingNumbaError(f"pystrom's user functions need numba: pip install 'pystrom-gpu[udf]' ({exc})") from exc
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
