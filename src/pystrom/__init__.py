"""pystrom: PostgreSQL and Arrow data straight into GPU memory, shared between processes, analysed there.

The public API is what this module exports; everything in underscored modules is internal.
CuPy is imported only when a GPU is used, so ``import pystrom`` is fast on machines without one.
"""

from __future__ import annotations

from ._settings import defaults
from .column import Column
from .errors import (
    CapacityError,
    ClosedError,
    ColumnNotFoundError,
    DataError,
    DeviceError,
    Error,
    NotFittedError,
    NullValuesError,
    OutOfMemoryError,
    SchemaMismatchError,
    UnsupportedTypeError,
)
from .table import Table

__version__ = "0.1.0"

__all__ = [
    "Table",
    "Column",
    "defaults",
    "Error",
    "CapacityError",
    "ClosedError",
    "ColumnNotFoundError",
    "DataError",
    "DeviceError",
    "NotFittedError",
    "NullValuesError",
    "OutOfMemoryError",
    "SchemaMismatchError",
    "UnsupportedTypeError",
    "__version__",
    "ml",
]


def __getattr__(name: str):
    # pystrom.ml on first use, so `import pystrom` stays fast
    if name == "ml":
        import importlib

        return importlib.import_module(".ml", __name__)
    raise AttributeError(f"module 'pystrom' has no attribute {name!r}")
