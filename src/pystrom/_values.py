"""``Table.with_columns`` values that are data rather than expressions: arrays of any library,
pystrom Columns, and scalars broadcast to every row.

Each becomes a column on the table's device that the final gather of ``with_columns`` takes (a
:class:`~pystrom._ops.Take`): an array is copied once into a one-column table on that device, a
scalar becomes a one-row column gathered n times (nothing of size n crosses between host and GPU),
a Column of the same device is taken as it is.

Where the values live is found without copying them: NumPy, pyarrow, pandas, polars, lists and
objects with ``__array__`` are host memory; CuPy, ``__cuda_array_interface__`` (torch, numba, JAX)
and DLPack CUDA devices are a GPU; DLPack CPU tensors (torch, JAX) are viewed as NumPy. Values on
another device than the table are refused with the call that moves them: ``with_columns`` never
copies between host and GPU (or between GPUs) on its own, so that no PCIe transfer happens that
the code does not show.
"""

from __future__ import annotations

import datetime
import decimal
import sys
from typing import Any

import numpy as np

from ._ops import Take
from .column import Column
from .errors import DeviceError, SchemaMismatchError, UnsupportedTypeError
from .table import Table

__all__ = ["value_column"]

_PY_SCALARS = (bool, int, float, str, bytes, datetime.date, datetime.time, datetime.timedelta, decimal.Decimal)


def _is_scalar(value: Any) -> bool:
    import pyarrow as pa

    if value is None or isinstance(value, (*_PY_SCALARS, np.generic, pa.Scalar)):
        return True
    return getattr(value, "ndim", None) == 0 and hasattr(value, "shape") and hasattr(value, "item")


def _kind_name(value: Any) -> str:
    return f"{type(value).__module__.split('.')[0]}.{type(value).__qualname__}"


def _locate(value: Any) -> tuple[str, Any]:
    """(device of the values: "cpu", "cuda:N" or "cuda" when unknown, the values in a form
    ``columns_from_arrays`` takes), without copying them."""
    import pyarrow as pa

    if isinstance(value, (np.ndarray, pa.Array, pa.ChunkedArray, list, tuple)):
        return "cpu", value
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(value, cupy.ndarray):
        return f"cuda:{value.device.id}", value
    if type(value).__module__.startswith("pandas"):
        return "cpu", value
    if hasattr(value, "__arrow_c_stream__"):  # polars Series and other Arrow producers: host memory
        return "cpu", pa.chunked_array(value)
    if hasattr(value, "__arrow_c_array__"):
        return "cpu", pa.array(value)
    if hasattr(value, "__cuda_array_interface__"):
        return _on_gpu(value, lambda cp: cp.asarray(value))
    if hasattr(value, "__dlpack_device__") and hasattr(value, "__dlpack__"):
        device_type, _ = value.__dlpack_device__()
        if int(device_type) == 1:  # kDLCPU: torch and JAX CPU tensors, viewed as NumPy
            return "cpu", _from_dlpack(np, value)
        if int(device_type) in (2, 13):  # kDLCUDA, kDLCUDAManaged
            return _on_gpu(value, lambda cp: _from_dlpack(cp, value))
        raise UnsupportedTypeError(
            f"a {_kind_name(value)} on DLPack device type {int(device_type)} cannot become a column: pystrom "
            "takes host (CPU) and CUDA memory"
        )
    if hasattr(value, "__array__"):
        return "cpu", np.asarray(value)
    raise UnsupportedTypeError(
        f"a {_kind_name(value)} cannot become a column: pass an expression (str), an array (NumPy, CuPy, torch, "
        "JAX, pyarrow, pandas, polars, a list), a pystrom Column or a scalar"
    )


def _from_dlpack(xp: Any, value: Any) -> Any:
    try:
        return xp.from_dlpack(value)
    except (TypeError, RuntimeError, BufferError, ValueError) as exc:
        raise UnsupportedTypeError(f"a {_kind_name(value)} could not be read through DLPack: {exc}") from None


def _on_gpu(value: Any, convert: Any) -> tuple[str, Any]:
    try:
        import cupy
    except ImportError:  # a GPU array without CuPy: no pystrom GPU table can exist here
        return "cuda", value
    array = convert(cupy)
    return f"cuda:{array.device.id}", array


def _move_hint(name: str, value: Any, source: str, target: str) -> str:
    if target == "cpu":
        how = f"{name}.get() or cupy.asnumpy({name}) for CuPy, {name}.cpu() for torch, numpy.asarray(...) for JAX"
    elif source == "cpu":
        ordinal = target.partition(":")[2] or "0"
        how = (
            f"cupy.asarray({name}) inside `with cupy.cuda.Device({ordinal}):` for numbers, or "
            f"Table.from_arrays({{{name!r}: {name}}}, device={target!r}).column({name!r}) for any type"
        )
    else:
        ordinal = target.partition(":")[2] or "0"
        how = f"cupy.array({name}) inside `with cupy.cuda.Device({ordinal}):`"
    return (
        f"with_columns({name}=...): the values ({_kind_name(value)}) are on {source}, the table on {target}; "
        f"with_columns does not copy between devices on its own. Copy them first: {how}; "
        f"or move the table with table.to({source!r})"
    )


def _length(value: Any) -> int:
    shape = getattr(value, "shape", None)
    if shape is not None and not callable(shape) and len(shape) >= 1:
        return int(shape[0])
    return len(value)


def value_column(table: Table, name: str, value: Any) -> Take:
    """The column ``value`` gives ``table`` under ``name``, on the table's device (see the module)."""
    import pyarrow as pa

    from .interop.arrays import columns_from_arrays  # up: interop builds Tables
    from .interop.build import build_table  # up: as above

    backend = table._live().backend
    n = table.num_rows
    xp = backend.xp
    if isinstance(value, Column):
        if value.device != table.device:
            raise DeviceError(
                f"with_columns({name}=...): column {value.name!r} is on {value.device}, the table on {table.device}; "
                f"move one of their tables with .to(...) first"
            )
        _check_length(name, len(value), n)
        return Take(value)
    if _is_scalar(value):
        if value is None:
            raise UnsupportedTypeError(
                f"with_columns({name}=None): a bare None has no type; pass a typed NULL such as "
                "pyarrow.scalar(None, pyarrow.float64())"
            )
        arrow_type = None
        if not isinstance(value, (pa.Scalar, np.generic)) and hasattr(value, "item"):  # a 0-d array: its one value
            try:
                arrow_type = pa.from_numpy_dtype(np.dtype(value.dtype))
            except (TypeError, AttributeError, pa.ArrowNotImplementedError):
                arrow_type = None  # a dtype NumPy does not know (torch's): Arrow infers from the value
            value = value.item()
        try:
            scalar = value if isinstance(value, pa.Scalar) else pa.scalar(value, type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
            raise UnsupportedTypeError(
                f"with_columns({name}={value!r}): no Arrow type holds this value ({exc})"
            ) from None
        one = build_table(backend, columns_from_arrays({name: pa.repeat(scalar, 1)}, backend))
        with backend.activate():
            return Take(one.column(0), xp.zeros(n, dtype=np.int64))
    source, located = _locate(value)
    if source != table.device:
        raise DeviceError(_move_hint(name, value, source, table.device))
    _check_length(name, _length(located), n)
    return Take(build_table(backend, columns_from_arrays({name: located}, backend)).column(0))


def _check_length(name: str, got: int, rows: int) -> None:
    if got != rows:
        raise SchemaMismatchError(f"with_columns({name}=...): {got:,} values, but the table has {rows:,} rows")
