"""pystrom: PostgreSQL and Arrow data straight into GPU memory, shared between processes, analysed there.

Quick start (it runs as it is; tables go to the GPU when CuPy sees one, else to host memory)::

    import numpy as np
    import pystrom

    t = pystrom.Table.from_arrays({"x": np.arange(5.0), "y": [1, None, 3, 4, 5]})
    print(t)                                     # the schema, NULL counts, the first rows; t.device
    t2 = t.filter("x > 1 and y is not null")     # the where language: one fused kernel on a GPU
    t3 = t2.with_columns(z="x * y")              # computed columns, in a new table
    print(t3.to_arrow())                         # pyarrow; also to_pandas(), DLPack, __cuda_array_interface__
    pystrom.write_arrow(t3, "t3.arrow")          # an Arrow IPC file with min/max statistics
    print(pystrom.read_arrow("t3.arrow", where="z > 10").num_rows)

    # PostgreSQL ('pystrom-gpu[postgres]'): read_postgres(dsn, table=...), write_postgres(t, dsn, name)
    # Logistic regression with MADlib's statistics: pystrom.ml.LogisticRegression, pystrom.ml.logregr_train
    # User functions ('pystrom-gpu[udf]'): @pystrom.udf, @pystrom.kernel, pystrom.reduce
    # Dask ('pystrom-gpu[dask]'): pystrom.dask.read_postgres, pystrom.dask.scan_arrow
    # Sharing: t.export() -> pystrom.ipc_import(handle); the store daemon: pystrom serve, pystrom.Store()

The guides: docs/ in the source (https://github.com/pystrom/pystrom/tree/main/docs); ``pystrom demo``
runs the whole data path. The public API is what this module exports; underscored modules are
internal. CuPy is imported only when a GPU is used, so ``import pystrom`` is fast without one.
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
