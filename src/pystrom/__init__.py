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
    InvalidArgumentError,
    NullValuesError,
    OutOfMemoryError,
    PostgresError,
    SchemaMismatchError,
    UnsupportedTypeError,
)
from .io.postgres import read_postgres
from .table import Table

__version__ = "0.1.0"

__all__ = [
    "Table",
    "Column",
    "read_postgres",
    "defaults",
    "Error",
    "CapacityError",
    "ClosedError",
    "ColumnNotFoundError",
    "DeviceError",
    "InvalidArgumentError",
    "NullValuesError",
    "OutOfMemoryError",
    "PostgresError",
    "SchemaMismatchError",
    "UnsupportedTypeError",
    "__version__",
]
