"""``Table.from_arrays``: named NumPy / CuPy / pyarrow arrays or Python lists into one Table.

A 2-D NumPy or CuPy array (n, d) of bool or numbers becomes a ``fixed_size_list<T>[d]`` column
(:func:`.lists.list_column`), the layout ``table[name]`` gives back as the same (n, d) matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from .._types import column_type
from ..errors import SchemaMismatchError, UnsupportedTypeError
from ..memory.backend import Backend, backend_of_array
from .arrow_import import host_column
from .build import DeviceColumn, HostColumn
from .lists import BufferColumn, list_column

__all__ = ["columns_from_arrays"]


def _device_array(value: Any) -> Any | None:
    """A CuPy array for GPU inputs (CuPy itself, or anything with __cuda_array_interface__); else None."""
    backend = backend_of_array(value)
    if backend is not None:
        return value if backend.kind == "cuda" else None
    if hasattr(value, "__cuda_array_interface__"):
        import cupy

        return cupy.asarray(value)
    return None


def _device_column(name: str, array: Any) -> DeviceColumn:
    if array.ndim != 1:
        raise SchemaMismatchError(
            f"column {name!r} must be one-dimensional (or two-dimensional: a fixed_size_list column); "
            f"got an array of shape {array.shape}"
        )
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "biuf":
        raise UnsupportedTypeError(
            f"column {name!r}: a GPU array of dtype {dtype} cannot be held; GPU inputs must be bool, integer or float"
        )
    arrow = pa.from_numpy_dtype(dtype)
    import cupy

    return DeviceColumn(pa.field(name, arrow), column_type(arrow, name), cupy.ascontiguousarray(array))


def _host_array(name: str, value: Any) -> pa.Array | pa.ChunkedArray:
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value
    if type(value).__module__.startswith("pandas"):
        return pa.array(value, from_pandas=True)
    if not isinstance(value, (np.ndarray, list, tuple)) and hasattr(value, "__array__"):
        value = np.asarray(value)  # torch CPU tensors, xarray, ...
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise SchemaMismatchError(
                f"column {name!r} must be one-dimensional (or two-dimensional: a fixed_size_list column); "
                f"got an array of shape {value.shape}"
            )
        mask = None
        if isinstance(value, np.ma.MaskedArray):
            mask = np.ma.getmaskarray(value)
            value = np.ma.getdata(value)
        if not value.dtype.isnative:
            value = value.astype(value.dtype.newbyteorder("="))
        value = np.ascontiguousarray(value)
        try:
            return pa.array(value, mask=mask)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise UnsupportedTypeError(
                f"column {name!r}: a NumPy array of dtype {value.dtype} cannot be held ({exc})"
            ) from None
    if isinstance(value, (str, bytes)) or np.isscalar(value) or value is None:
        raise SchemaMismatchError(f"column {name!r} must be an array or a list, not a scalar {type(value).__name__}")
    try:
        return pa.array(value)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise UnsupportedTypeError(
            f"column {name!r}: cannot convert a {type(value).__name__} into a column ({exc})"
        ) from None


def columns_from_arrays(arrays: Mapping[str, Any], backend: Backend) -> list[HostColumn | DeviceColumn | BufferColumn]:
    if not isinstance(arrays, Mapping):
        raise UnsupportedTypeError(
            f"from_arrays expects a mapping of column names to arrays, not {type(arrays).__name__}"
        )
    columns: list[HostColumn | DeviceColumn | BufferColumn] = []
    for name, value in arrays.items():
        if not isinstance(name, str):
            raise SchemaMismatchError(f"column names must be strings; got {name!r}")
        device = _device_array(value)
        matrix = device if device is not None else value
        if (
            (isinstance(matrix, np.ndarray) or device is not None)
            and matrix.ndim == 2
            and not isinstance(matrix, np.ma.MaskedArray)
        ):
            if np.dtype(matrix.dtype).kind not in "biuf":
                raise UnsupportedTypeError(f"column {name!r}: a 2-D array of dtype {matrix.dtype} cannot be held")
            xp = backend_of_array(matrix).xp
            columns.append(list_column(name, xp.ascontiguousarray(matrix), list_size=int(matrix.shape[1]),
                                       length=int(matrix.shape[0])))  # fmt: skip
            continue
        if device is not None:
            columns.append(_device_column(name, device))
            continue
        arr = _host_array(name, value)
        chunked = arr if isinstance(arr, pa.ChunkedArray) else pa.chunked_array([arr], type=arr.type)
        columns.append(host_column(name, pa.field(name, chunked.type), chunked))
    lengths = {c.field.name: (int(c.array.shape[0]) if isinstance(c, DeviceColumn) else c.length) for c in columns}
    if len(set(lengths.values())) > 1:
        listing = ", ".join(f"{k}: {v:,}" for k, v in lengths.items())
        raise SchemaMismatchError(f"columns have different lengths ({listing})")
    return columns
