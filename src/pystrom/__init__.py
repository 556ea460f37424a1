"""pystrom: PostgreSQL and Arrow data straight into GPU memory, shared between processes, analysed there.

The public API is what this module exports; everything in underscored modules is internal.
CuPy is imported only when a GPU is used, so ``import pystrom`` is fast on machines without one.
"""

from ._settings import defaults
from .column import Column
from .errors import (
    CapacityError,
    ClosedError,
    ClusterError,
    CollectiveTimeoutError,
    ColumnNotFoundError,
    DataError,
    DeviceError,
    Error,
    ExporterGoneError,
    ExpressionError,
    FileError,
    FileFormatError,
    InvalidArgumentError,
    InvalidHandleError,
    IPCError,
    MissingDependencyError,
    NotFittedError,
    NullValuesError,
    OutOfMemoryError,
    PerformanceWarning,
    PostgresError,
    SchemaMismatchError,
    StaleGlobalWarning,
    StoreError,
    StorePermissionError,
    StoreQuotaError,
    StoreUnavailableError,
    TableExistsError,
    TableNotFoundError,
    UnsupportedTypeError,
    UserFunctionError,
    UserFunctionIndexError,
)
from .table import Table

__version__ = "0.1.0"

__all__ = [
    "Table",
    "Column",
    "read_postgres",
    "postgres_to_arrow",
    "write_postgres",
    "scan_postgres",
    "PostgresScan",
    "PostgresScanStats",
    "defaults",
    "concat",
    "read_arrow",
    "scan_arrow",
    "write_arrow",
    "ArrowScan",
    "ScanStats",
    "Error",
    "CapacityError",
    "ClosedError",
    "ClusterError",
    "CollectiveTimeoutError",
    "ColumnNotFoundError",
    "DataError",
    "DeviceError",
    "FileFormatError",
    "PerformanceWarning",
    "FileError",
    "InvalidArgumentError",
    "NotFittedError",
    "ExpressionError",
    "MissingDependencyError",
    "NullValuesError",
    "OutOfMemoryError",
    "PostgresError",
    "SchemaMismatchError",
    "UnsupportedTypeError",
    "UserFunctionError",
    "UserFunctionIndexError",
    "StaleGlobalWarning",
    "Store",
    "ipc_import",
    "serve",
    "ExporterGoneError",
    "InvalidHandleError",
    "IPCError",
    "StoreError",
    "StorePermissionError",
    "StoreQuotaError",
    "StoreUnavailableError",
    "TableExistsError",
    "TableNotFoundError",
    "__version__",
    "ml",
    "udf",
    "kernel",
    "reduce",
]

# Loaders pull in pyarrow (and KvikIO/CuPy when used); they are imported on first use.
_LAZY = {
    "concat": "._concat",
    "read_arrow": ".io.arrow",
    "scan_arrow": ".io.arrow",
    "write_arrow": ".io.arrow",
    "ArrowScan": ".io.arrow",
    "ScanStats": ".io.arrow",
    "read_postgres": ".io.postgres",
    "postgres_to_arrow": ".io.postgres",
    "write_postgres": ".io.postgres",
    "scan_postgres": ".io.postgres",
    "PostgresScan": ".io.postgres",
    "PostgresScanStats": ".io.postgres",
    "Store": ".ipc.client",
    "ipc_import": ".ipc.export",
    "serve": ".ipc.server",
    "udf": "._udf",
    "kernel": "._udf",
    "reduce": "._udf",
}


def __getattr__(name: str):
    if name == "ml":  # the subpackage pystrom.ml, imported on first use
        import importlib

        return importlib.import_module(".ml", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pystrom' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"ml"})
