"""What ``fit`` accepts, turned into batches the pass can run over.

Three kinds of input: a 2-D array (NumPy or CuPy, C or Fortran order, float32 kept float32), a
pystrom Table with ``columns=``/``target=``, and a re-iterable of Tables (a scan: each pass iterates
it again). All become :class:`Batch` objects (features, target as 0/1 bytes, optional float64 weights)
on one backend. Scans stream through :func:`prefetch`, which fetches and moves batch k+1 on its own
thread and CUDA stream while batch k is computed.
"""

from __future__ import annotations

import queue
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError, SchemaMismatchError, UnsupportedTypeError
from ..memory.backend import Backend, backend_of_array, resolve_device
from ..memory.bitmap import all_true, count_true

__all__ = ["Batch", "is_scan", "prepare_array", "prepare_table", "prefetch", "encode_target", "locate_nonfinite"]


@dataclass
class Batch:
    X: Any  # (n, k) float32/float64 on `backend`, positive element strides
    y: Any  # (n,) uint8 0/1
    sw: Any | None  # (n,) float64 or None
    skipped: int  # rows left out because of NULLs
    names: list[str]
    backend: Backend


def is_table(x: Any) -> bool:
    from ..table import Table

    return isinstance(x, Table)


def is_scan(x: Any) -> bool:
    """A re-iterable of Tables (not an array, not a Table). One-shot iterators are refused."""
    if is_table(x) or isinstance(x, (str, bytes, dict)) or hasattr(x, "__array__") or hasattr(x, "shape"):
        return False
    if hasattr(x, "__cuda_array_interface__"):
        return False
    if isinstance(x, (list, tuple)):
        return len(x) > 0 and all(is_table(t) for t in x)
    if not isinstance(x, Iterable):
        return False
    if iter(x) is x:
        raise UnsupportedTypeError(
            f"{type(x).__name__} is a one-shot iterator, but IRLS passes over the data several times: pass a "
            "re-iterable (a list of Tables, pystrom.scan_arrow(...), or an object whose __iter__ starts a new scan)"
        )
    return True


def _float_dtype(dtype: np.dtype, what: str) -> np.dtype:
    if dtype in (np.float32, np.float64):
        return dtype
    if dtype.kind in "iub" or dtype == np.float16:
        return np.dtype(np.float64)
    if dtype.kind == "c":
        raise DataError(f"Complex data not supported: {what} has dtype {dtype}")
    raise UnsupportedTypeError(
        f"{what} has dtype {dtype}; logistic regression needs numeric (int, bool, float) features"
    )


def locate_nonfinite(xp: Any, X: Any, names: Sequence[str]) -> DataError:
    """The error for NaN/Inf in X, naming the first column that holds one."""
    bad = [names[j] for j in range(X.shape[1]) if not bool(xp.isfinite(X[:, j]).all())]
    which = ", ".join(map(repr, bad)) if bad else "(not found in any single column)"
    return DataError(f"features contain NaN or Inf in column(s) {which}; remove or impute those values")


def encode_target(xp: Any, y: Any, name: str, binary01: bool) -> tuple[Any, np.ndarray]:
    """(0/1 uint8 target on y's device, classes). ``binary01``: values must be bool or 0/1 (scans)."""
    if y.dtype == np.bool_:
        positives = count_true(y) if not binary01 else 1
        if not binary01 and positives in (0, y.shape[0]):
            raise DataError(_class_count_message(name, np.array([bool(positives)])))
        return y.view(np.uint8) if y.flags.c_contiguous else y.astype(np.uint8), np.array([False, True])
    if y.dtype.kind not in "iuf":
        if binary01 or xp is not np:
            raise UnsupportedTypeError(f"target {name} has dtype {y.dtype}; it must be bool or numeric 0/1")
        classes = np.unique(y)
        if len(classes) != 2:
            raise DataError(_class_count_message(name, classes))
        return (y == classes[1]).astype(np.uint8), classes
    if y.shape[0] == 0:
        raise DataError(f"target {name} is empty")
    if y.dtype.kind == "f" and not all_true(xp.isfinite(y)):
        raise DataError(f"target {name} contains NaN or Inf")
    lo, hi = (float(v) for v in (y.min(), y.max()))
    if binary01:  # a batch of a scan may hold one class; the whole scan is checked after the first pass
        lo, hi = 0.0, 1.0
    if lo == hi:
        raise DataError(_class_count_message(name, np.array([lo])))
    others = count_true((y != lo) & (y != hi))
    if others:
        what = "values other than 0 and 1" if binary01 else "more than two distinct values"
        if y.dtype.kind == "f" and bool((y != xp.floor(y)).any()):
            what = f"{what}, not whole numbers (Unknown label type: continuous)"
        which = "neither 0 nor 1" if binary01 else f"neither its smallest value ({lo:g}) nor its largest ({hi:g})"
        raise DataError(f"target {name} has {what}: {others:,} rows hold {which}. Only binary classification is "
                        "supported.")  # fmt: skip
    classes = np.array([lo, hi], dtype=y.dtype) if y.dtype.kind != "f" else np.array([lo, hi])
    return (y == hi).astype(np.uint8), classes


def _warn(message: str) -> None:
    """A data-conversion warning: scikit-learn's class when scikit-learn is loaded (its checks ask for it)."""
    sk = sys.modules.get("sklearn.exceptions")
    warnings.warn(message, sk.DataConversionWarning if sk is not None else UserWarning, stacklevel=4)


def not_2d_message(X: Any) -> str:
    hint = " Reshape your data: X.reshape(-1, 1) for one feature, X.reshape(1, -1) for one row." if X.ndim == 1 else ""
    return f"X must be 2-D (rows x features); got {X.ndim}-D shape {tuple(X.shape)}.{hint}"


def _class_count_message(name: str, classes: np.ndarray) -> str:
    if len(classes) < 2:
        shown = f"one class only ({np.asarray(classes[0]).item()!r})" if len(classes) else "no values"
        return f"target {name} has {shown}; logistic regression needs two classes"
    return f"target {name} has {len(classes)} classes. Only binary classification is supported."


def _normalise_strides(xp: Any, X: Any) -> Any:
    item = X.dtype.itemsize
    if all(s > 0 and s % item == 0 for s in X.strides):
        return X
    return xp.ascontiguousarray(X)


def prepare_weights(xp: Any, sample_weight: Any, n: int, where: str = "sample_weight") -> Any | None:
    if sample_weight is None:
        return None
    sw = xp.asarray(sample_weight, dtype=np.float64)
    if sw.ndim == 0:
        sw = xp.full(n, float(sw), dtype=np.float64)
    if sw.ndim != 1 or sw.shape[0] != n:
        raise SchemaMismatchError(f"{where} has shape {tuple(sw.shape)}; expected ({n},), one weight per row")
    if not all_true(xp.isfinite(sw)) or count_true(sw < 0):
        raise DataError(f"{where} must be finite and non-negative")
    return xp.ascontiguousarray(sw)  # the kernel reads one weight per row, contiguous


def prepare_array(X: Any, y: Any, sample_weight: Any, device: Any, binary01: bool = False) -> tuple[Batch, np.ndarray]:
    """A NumPy/CuPy 2-D array (or anything np.asarray takes) and its target into a Batch."""
    if type(X).__module__.startswith("scipy.sparse"):
        raise UnsupportedTypeError("sparse input is not supported: pass a dense array (X.toarray())")
    backend = backend_of_array(X)
    if backend is None:
        if hasattr(X, "__cuda_array_interface__"):
            import cupy

            X = cupy.asarray(X)
        else:
            try:
                X = np.asarray(X)
            except (ValueError, TypeError) as exc:
                raise UnsupportedTypeError(f"X cannot be read as a 2-D numeric array: {exc}") from None
        backend = backend_of_array(X)
    if X.dtype == object:  # numbers held as Python objects (pandas, lists of mixed types)
        try:
            X = X.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise UnsupportedTypeError(f"X has dtype object and holds non-numbers: {exc}") from None
    target = backend if device is None else resolve_device(device)
    if X.ndim != 2:
        raise SchemaMismatchError(not_2d_message(X))
    n, k = X.shape
    if n == 0 or k == 0:
        what = "sample(s)" if n == 0 else "feature(s)"
        raise DataError(f"X has 0 {what} (shape={tuple(X.shape)}) while a minimum of 1 is required.")
    dtype = _float_dtype(X.dtype, "X")
    with target.activate():
        xp = target.xp
        if target is not backend:
            X = target.from_host(backend.to_host(X)) if target.kind == "cuda" else backend.to_host(X)
        if X.dtype != dtype:
            X = X.astype(dtype)
        X = _normalise_strides(xp, X)
        if y is None:
            raise DataError(
                "LogisticRegression requires y to be passed, but the target y is None "
                "(for a Table, name the target column: target='...')"
            )
        yb = backend_of_array(y)
        if yb is not None and yb is not target:
            y = target.from_host(yb.to_host(y)) if target.kind == "cuda" else yb.to_host(y)
        if yb is None and not isinstance(y, np.ndarray):
            y = np.asarray(y)
        if y.dtype.kind in "iufb" or xp is np:
            y = xp.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            _warn(f"A column-vector y was passed when a 1d array was expected: shape {tuple(y.shape)} read as ({n},)")
            y = y[:, 0]
        if y.ndim != 1 or y.shape[0] != n:
            raise SchemaMismatchError(f"y has shape {tuple(y.shape)} but X has {n:,} rows; y needs one value per row")
        y01, classes = encode_target(xp, y, "y", binary01)
        sw = prepare_weights(xp, sample_weight, n)
    names = [f"x{j}" for j in range(k)]
    return Batch(X, y01, sw, 0, names, target), classes


def table_features(table: Any, columns: Sequence[str] | None, exclude: Sequence[str]) -> list[str]:
    import pyarrow.types as pt

    if isinstance(columns, str):
        columns = [columns]
    names = [n for n in table.column_names if n not in exclude] if columns is None else list(columns)
    if not names:
        raise DataError("no feature columns: pass columns=[...] naming at least one numeric column")
    for name in names:
        col = table.column(name)  # ColumnNotFoundError names the table's columns
        t = col.type
        if not (pt.is_integer(t) or pt.is_floating(t) or pt.is_boolean(t) or pt.is_decimal(t)):
            raise UnsupportedTypeError(f"column {name!r} has type {t}; logistic regression needs numeric features")
    return names


def prepare_table(
    table: Any,
    columns: Sequence[str] | None,
    target: str | None,
    weight: str | None,
    device: Any,
    binary01: bool,
) -> tuple[Batch, np.ndarray]:
    """One Table (or one batch of a scan) into a Batch: NULL rows skipped and counted (MADlib's rule)."""
    if target is None or not isinstance(target, str):
        raise DataError(f"fitting a Table needs target='column name'; got target={target!r}")
    if device is not None:
        table = table.to(device)
    backend = table._live().backend
    names = table_features(table, columns, [target] + ([weight] if weight else []))
    if target in names:
        raise SchemaMismatchError(f"column {target!r} is both the target and a feature")
    ycol = table.column(target)
    import pyarrow.types as pt

    if not (pt.is_integer(ycol.type) or pt.is_floating(ycol.type) or pt.is_boolean(ycol.type)):
        raise UnsupportedTypeError(f"target column {target!r} has type {ycol.type}; it must be bool or numeric")
    involved = [table.column(n) for n in names] + [ycol] + ([table.column(weight)] if weight else [])
    with backend.activate():
        xp = backend.xp
        keep = None
        for col in involved:
            if col.null_count:
                valid = col.is_valid()
                keep = valid if keep is None else keep & valid
        types = {str(table.column(n).type) for n in names}
        dtype = np.float32 if types == {"float"} else np.float64
        X = table.to_array(names, dtype=dtype, nulls="nan" if keep is not None else "raise")
        y = ycol.values
        sw = table.column(weight).values.astype(np.float64) if weight else None
        skipped = 0
        if keep is not None:
            kept = count_true(keep)
            skipped = table.num_rows - kept
            X, y = X[keep], y[keep]
            sw = sw[keep] if sw is not None else None
        X = _normalise_strides(xp, X)
        if X.shape[0] == 0:
            y01, classes = xp.zeros(0, dtype=np.uint8), np.array([0.0, 1.0])
        else:
            y01, classes = encode_target(xp, y, f"column {target!r}", binary01)
        sw = prepare_weights(xp, sw, X.shape[0], f"weight column {weight!r}") if sw is not None else None
    return Batch(X, y01, sw, skipped, names, backend), classes


_DONE = object()


def prefetch(items: Iterable[Any], prepare: Any, backend: Backend | None, depth: int = 2) -> Iterator[Any]:
    """``prepare(item)`` for each item, computed ``depth`` ahead on a worker thread.

    On a GPU the worker runs on its own non-blocking CUDA stream and waits for it before handing a
    batch over, so the host->device copy of batch k+1 overlaps the kernels of batch k. Errors in the
    worker are raised here; closing the generator stops the worker.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(value: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            if backend is not None and backend.kind == "cuda":
                cupy = backend.xp
                with backend.activate(), cupy.cuda.Stream(non_blocking=True) as stream:
                    for item in items:
                        batch = prepare(item)
                        stream.synchronize()
                        if not put(batch):
                            return
            else:
                for item in items:
                    if not put(prepare(item)):
                        return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)

    thread = threading.Thread(target=work, name="pystrom-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            value = q.get()
            if value is _DONE:
                return
            if isinstance(value, BaseException):
                raise value
            yield value
    finally:
        stop.set()
        thread.join()
