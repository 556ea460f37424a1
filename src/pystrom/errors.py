"""pystrom's exceptions: one root, one class per kind of failure.

Every class also derives from the builtin a caller would naturally catch (``KeyError`` for a
missing column, ``TypeError`` for an unsupported type, ...), so ``except ValueError`` keeps working
for code that does not know pystrom. Messages always name the column, type, device or handle at fault.
"""

from __future__ import annotations

__all__ = [
    "Error",
    "ColumnNotFoundError",
    "UnsupportedTypeError",
    "SchemaMismatchError",
    "CapacityError",
    "NullValuesError",
    "DeviceError",
    "ClosedError",
    "OutOfMemoryError",
    "PostgresError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "IPCError",
    "ExporterGoneError",
    "StoreError",
    "StoreUnavailableError",
    "StorePermissionError",
    "StoreQuotaError",
    "TableNotFoundError",
    "TableExistsError",
    "FileFormatError",
    "PerformanceWarning",
    "FileError",
    "DataError",
    "NotFittedError",
    "ExpressionError",
    "ClusterError",
    "CollectiveTimeoutError",
    "UserFunctionError",
    "UserFunctionIndexError",
    "StaleGlobalWarning",
    "MissingDependencyError",
]


class Error(Exception):
    """Root of all pystrom errors."""

    def __reduce__(self):  # picklable across processes (the store daemon sends errors back)
        return (type(self), self.args)


class ColumnNotFoundError(Error, KeyError):
    """A column name that the table does not have."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class UnsupportedTypeError(Error, TypeError):
    """A data type pystrom cannot hold, or an operation a column's type does not allow."""


class SchemaMismatchError(Error, ValueError):
    """Columns that do not fit together: different lengths, mixed types where one is needed."""


class CapacityError(Error, ValueError):
    """Data that exceeds a limit of the layout, such as 2 GiB of string bytes in one column."""


class NullValuesError(Error, ValueError):
    """A column holds NULLs where the operation needs every value present."""


class DeviceError(Error, ValueError):
    """A device string that makes no sense, or a device that is not there."""


class ClosedError(Error, ValueError):
    """The table was closed with ``close()`` and can no longer be used."""


class OutOfMemoryError(Error, MemoryError):
    """The device (or host) could not provide an allocation."""


class PostgresError(Error, RuntimeError):
    """PostgreSQL refused or broke off a read: connection, SQL, permission, a lost server.

    The message carries the server's own text; ``__cause__`` holds psycopg's exception when there
    was one (with its ``sqlstate``).
    """


class InvalidArgumentError(Error, ValueError):
    """An argument of a public call that makes no sense (wrong type, conflicting options)."""


# -- sharing between processes (pystrom.ipc) ------------------------------------------------------


class InvalidHandleError(Error, ValueError):
    """Handle bytes that are not a valid pystrom handle: truncated, corrupted, another format
    version, or describing buffers that do not fit the allocation. Nothing was mapped."""


class IPCError(Error, OSError):
    """A valid handle whose memory cannot be mapped here (no GPU with its UUID, another machine,
    the driver refused)."""


class ExporterGoneError(IPCError):
    """The process that exported a handle has exited (or freed the memory): nothing left to map."""


class StoreError(Error, RuntimeError):
    """The store daemon refused or failed a request; the message says why."""


class StoreUnavailableError(StoreError, ConnectionError):
    """No store daemon answers at the socket (not started, exited, or the connection broke)."""


class StorePermissionError(StoreError, PermissionError):
    """The store daemon (or the socket's directory) does not serve this user, or this user lacks the right
    a request needs on a table (the message names the table and the right)."""


class StoreQuotaError(StoreError, MemoryError):
    """The store daemon refused to reserve memory: the request would pass this user's byte quota or the
    daemon's limit (the message names the sizes)."""


class TableNotFoundError(StoreError, KeyError):
    """No table of that name in the store."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class TableExistsError(StoreError, ValueError):
    """A table of that name is already in the store (pass ``replace=True`` to replace it)."""


class FileFormatError(Error, ValueError):
    """A file that is not what it should be: not Arrow IPC, truncated, or with inconsistent metadata."""


class PerformanceWarning(UserWarning):
    """The call works, but on a slower path than usual (the message says why and what to change)."""


class FileError(Error, OSError):
    """A file that cannot be created, written, read or renamed; the message names the path."""


class DataError(Error, ValueError):
    """Values an operation cannot use: an empty input, a target with one class, NaN or Inf in features."""


class ClusterError(Error, RuntimeError):
    """Work spread over a dask cluster lost a worker, or its workers could not agree or reach each other; the
    message names the worker (its address and rank) and says what was tried (a fit restarts a few times first)."""


class CollectiveTimeoutError(ClusterError, TimeoutError):
    """Workers of a fit waited for the others longer than ``pystrom.defaults.dask_fit_timeout`` at one exchange."""


class NotFittedError(Error, ValueError, AttributeError):
    """A model used before ``fit`` (like scikit-learn's, it is both a ValueError and an AttributeError)."""


class ExpressionError(Error, ValueError):
    """A ``where`` expression that does not parse or does not type-check against the schema.

    The message names the bad token or column and its position (``position`` holds the 0-based
    character offset into the expression text, or None when the problem is not at one place).
    """

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message, position)
        self.position = position

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MissingDependencyError(Error, ImportError):
    """An optional package that a feature needs is not installed, or does not import.

    The message names the feature, the package, and the ``pip install 'pystrom-gpu[...]'`` line
    that brings it; ``name`` is the module that failed to import (as for any ``ImportError``) and
    ``extras`` the extras that provide it. Every optional import of pystrom (dask, dask-cuda, pandas,
    psycopg, numba, numba-cuda, CuPy, KvikIO, nvCOMP) fails with this class.
    """

    def __init__(self, message: str, name: str | None = None, extras: tuple[str, ...] = ()):
        super().__init__(message)
        self.name = name
        self.extras = tuple(extras)

    def __reduce__(self):  # name and extras travel too (the store daemon and dask workers pickle errors)
        return (type(self), (str(self), self.name, self.extras))

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# -- user functions (pystrom.udf, pystrom.kernel, pystrom.reduce) ---------------------------------


class UserFunctionError(Error, RuntimeError):
    """A user function (``@pystrom.udf``, ``@pystrom.kernel``, ``pystrom.reduce``'s row function) failed
    while it ran: it raised, or (on a GPU) stopped without finishing a row.

    ``function`` names it, ``row`` is the first row that failed (of the table, or of the batch the
    message names; None where the device cannot say), ``device`` where it ran; ``__cause__`` is the
    function's own exception where one could be had (on a GPU: raised again by the CPU twin from the
    row's values).
    """

    def __init__(self, message: str, function: str | None = None, row: int | None = None, device: str | None = None):
        super().__init__(message, function, row, device)
        self.function = function
        self.row = row
        self.device = device

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UserFunctionIndexError(UserFunctionError, IndexError):
    """A user function indexed an array out of its bounds (the CPU twin of a kernel, and row and
    reduce functions on the CPU, check every index)."""


class StaleGlobalWarning(UserWarning):
    """A global that a compiled user function reads has changed since it was compiled: numba froze the
    value at compilation, so the function still uses the old one."""
