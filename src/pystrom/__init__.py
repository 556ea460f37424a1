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
    DeviceError,
    Error,
    ExpressionError,
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
    "DeviceError",
    "ExpressionError",
    "NullValuesError",
    "OutOfMemoryError",
    "SchemaMismatchError",
    "UnsupportedTypeError",
    "__version__",
]
