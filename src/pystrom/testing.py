"""Helpers for testing code that uses pystrom on every device (the CPU and each visible GPU).

>>> from pystrom.testing import assert_same_on_all_devices
>>> assert_same_on_all_devices(lambda device: Table.from_arrays({"x": [1, 2]}, device=device)["x"].sum())

Results are compared after moving them to the host: pystrom Tables and pyarrow Tables by value and
schema, arrays by dtype, shape and content (exactly, or with ``rtol`` for floats).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._embedded_pg import EmbeddedPostgres
from .memory.backend import iter_devices

__all__ = ["available_devices", "to_host", "assert_tables_equal", "assert_same_on_all_devices", "EmbeddedPostgres"]


def available_devices() -> list[str]:
    """``["cpu", "cuda:0", ...]``: every device this process can use."""
    return list(iter_devices())


def to_host(value: Any) -> Any:
    """A host-side version of a result: pyarrow for tables, NumPy for arrays, as-is otherwise."""
    from .table import Table

    if isinstance(value, Table):
        return value.to_arrow()
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):
        return value.get()
    return value


def assert_tables_equal(actual: Any, expected: Any) -> None:
    """Schema and values equal (chunking ignored). Either side may be a pystrom or a pyarrow Table."""
    actual, expected = to_host(actual), to_host(expected)
    if not actual.schema.equals(expected.schema):
        raise AssertionError(f"schemas differ:\n{actual.schema}\n!=\n{expected.schema}")
    for name in expected.column_names:
        a, e = actual.column(name), expected.column(name)
        if not a.equals(e):  # NaN is not equal to NaN there: look value by value, NaN equal to NaN
            a_list, e_list = a.to_pylist(), e.to_pylist()
            differ = (i for i, (x, y) in enumerate(zip(a_list, e_list)) if x != y and not (_is_nan(x) and _is_nan(y)))
            where = next(differ, None if len(a_list) == len(e_list) else min(len(a_list), len(e_list)))
            if where is None:
                continue
            got, want = a_list[where : where + 3], e_list[where : where + 3]
            raise AssertionError(f"column {name!r} differs first at row {where}: {got} != {want}")


def _is_nan(x: Any) -> bool:
    return isinstance(x, float) and x != x


def _assert_equal(a: Any, b: Any, rtol: float, what: str) -> None:
    import pyarrow as pa

    if isinstance(b, pa.Table):
        assert_tables_equal(a, b)
    elif isinstance(b, np.ndarray):
        a = np.asarray(a)
        if a.dtype != b.dtype or a.shape != b.shape:
            raise AssertionError(f"{what}: {a.dtype}{a.shape} != {b.dtype}{b.shape}")
        if rtol and b.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=rtol, err_msg=what)
        else:
            np.testing.assert_array_equal(a, b, err_msg=what)
    elif isinstance(b, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"{what}: {len(a)} results != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, rtol, f"{what}[{i}]")
    elif a != b:
        raise AssertionError(f"{what}: {a!r} != {b!r}")


def assert_same_on_all_devices(fn: Callable[[str], Any], rtol: float = 0.0) -> Any:
    """Run ``fn(device)`` on every available device; the results must equal the CPU's. Returns the CPU's."""
    results = {device: to_host(fn(device)) for device in available_devices()}
    reference = results.pop("cpu")
    for device, result in results.items():
        _assert_equal(result, reference, rtol, f"{device} vs cpu")
    return reference
