"""The Arrow read path's edges: what a caller passes, checked before a file is opened (a caller's mistake is
a TypeError, never the file's), and what leaves the path, every error naming the file."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ....errors import Error, FileFormatError

__all__ = ["check_columns_argument", "named_errors", "path_name"]


def path_name(path: Any) -> str:
    """``path`` as a str; a TypeError for what is not a file name."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file name; got {type(path).__name__}")
    return os.fspath(path)


def check_columns_argument(columns: Any) -> list[str] | None:
    """``columns=`` as given, checked before any file is opened (a TypeError is the caller's, never the file's)."""
    if columns is None:
        return None
    if isinstance(columns, str):
        raise TypeError(f"columns must be a list of names, not the string {columns!r}")
    try:
        columns = list(columns)
    except TypeError:
        raise TypeError(f"columns must be a list of names; got {type(columns).__name__}") from None
    for c in columns:
        if not isinstance(c, str):
            raise TypeError(f"column names must be strings; got {c!r}")
    return columns


# what passes the read path's boundary unchanged: pystrom's errors (they name what they are about), the
# operating system's (a missing or unreadable file, a failed read: they name the file), memory running
# out, and warnings raised as errors (-W error)
_OWN = (Error, OSError, MemoryError, Warning)


@contextlib.contextmanager
def named_errors(path: str) -> Iterator[None]:
    """The boundary of the Arrow read path (read_arrow, scan_arrow, a Dask task's group): any other
    exception raised while reading ``path`` (a pyarrow error no check caught, a raw ValueError or
    IndexError of a step a corrupt file led astray, a CUDA error) surfaces as a FileFormatError naming
    the file, the original chained. A check of its own names the record batch and column where it
    can; this net cannot, and says so."""
    try:
        yield
    except _OWN:
        raise
    except Exception as exc:
        raise FileFormatError(
            f"{path!r} could not be read: {type(exc).__name__}: {exc} (a corrupt file that no check of pystrom "
            "recognised, or a pystrom bug: please report it with the file)"
        ) from exc
