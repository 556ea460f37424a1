"""``pystrom.reduce``: a user reduction per batch, combined across batches and Dask partitions.

In order: the source is split into batches (a Table is one batch; a stream such as ``scan_arrow`` or
``scan_postgres`` yields them, out of core; a ``pystrom.dask`` collection gives one per partition,
reduced on the workers); for each batch ``init()`` makes a fresh state (NumPy
arrays), a generated ``njit`` loop calls ``row(state, *values)`` for every row where no column is
NULL, and ``combine(a, b)`` folds the batches' states in order.

The loop runs on the CPU: a batch on a GPU has its columns copied to the host first (the row
function updates one shared state, which a GPU would need atomics or a tree of partial states for).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..errors import ExpressionError, UnsupportedTypeError
from ..table import Table
from ._common import COMPILATIONS, column_arrays, first_line, numba_modules

__all__ = ["reduce"]

_LOOPS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def reduce(source: Any, columns: Any, *, init: Any, row: Any, combine: Any) -> Any:
    """Reduce ``columns`` of ``source`` with a user state machine.

    Parameters
    ----------
    source
        A Table, an iterable of Tables (``scan_arrow``, ``scan_postgres``), or a ``pystrom.dask``
        partitioned table.
    columns
        Names of the columns passed to ``row``, in order.
    init
        ``init()`` returns a fresh state: a NumPy array or a tuple of them.
    row
        ``row(state, *values)``, compiled with numba ``njit``: updates the state in place for one row
        (rows with a NULL in any of ``columns`` are skipped).
    combine
        ``combine(a, b)`` returns the state of two batches together (plain Python).

    Returns
    -------
    The combined state (``init()`` when there are no batches).
    """
    if isinstance(columns, str):
        columns = (columns,)
    columns = tuple(columns)
    if not columns or not all(isinstance(c, str) for c in columns):
        raise ExpressionError(f"reduce: columns are column names, got {columns!r}")
    for name, f in (("init", init), ("row", row), ("combine", combine)):
        if not callable(f):
            raise UnsupportedTypeError(f"reduce: {name} must be callable, got {type(f).__name__}")
    if isinstance(source, Table):
        return _batch(source, columns, init, row)
    if hasattr(source, "to_delayed") and hasattr(source, "npartitions"):  # pystrom.dask.PartitionedTable
        import dask

        parts = [dask.delayed(_batch)(p, columns, init, row) for p in source.to_delayed()]
        states = dask.compute(*parts)
        return _fold(states, init, combine)
    try:
        batches = iter(source)
    except TypeError:
        raise UnsupportedTypeError(
            "reduce: source must be a Table, an iterable of Tables or a pystrom.dask table, "
            f"got {type(source).__name__}"
        ) from None
    state = None
    for i, batch in enumerate(batches):
        if not isinstance(batch, Table):
            raise UnsupportedTypeError(f"reduce: batch {i} of the source is a {type(batch).__name__}, not a Table")
        s = _batch(batch, columns, init, row)
        state = s if state is None else combine(state, s)
    return init() if state is None else state


def _fold(states: Any, init: Any, combine: Any) -> Any:
    state = None
    for s in states:
        state = s if state is None else combine(state, s)
    return init() if state is None else state


def _batch(table: Table, columns: tuple[str, ...], init: Any, row: Any) -> Any:
    values, valid = column_arrays(table, columns, "reduce")
    backend = table._live().backend
    if backend.kind != "cpu":
        with backend.activate():
            values = [backend.to_host(v) for v in values]
            valid = [None if v is None else backend.to_host(v) for v in valid]
    state = init()
    n = table.num_rows
    if n == 0:
        return state
    loop = _loop(row, tuple(v is not None for v in valid))
    before = len(loop.overloads)
    try:
        loop(state, *[np.ascontiguousarray(v) for v in values], *[v for v in valid if v is not None], np.int64(n))
    except Exception as exc:
        if len(loop.overloads) != before or not _is_numba_error(exc):
            raise
        described = ", ".join(f"{c} {v.dtype}" for c, v in zip(columns, values))
        first = first_line(exc)
        raise UnsupportedTypeError(
            f"reduce: row function {getattr(row, '__name__', row)!r} does not compile for columns ({described}) "
            f"and state {type(state).__name__}: {first}"
        ) from None
    if len(loop.overloads) != before:
        COMPILATIONS["cpu"] += 1
    return state


def _is_numba_error(exc: Exception) -> bool:
    return type(exc).__module__.startswith("numba")


def _loop(row: Any, nullable: tuple[bool, ...]) -> Any:
    key = (row, nullable)
    with _LOCK:
        hit = _LOOPS.get(key)
        if hit is not None:
            return hit
        numba = numba_modules()
        k = len(nullable)
        params = [f"a{i}" for i in range(k)] + [f"v{i}" for i in range(k) if nullable[i]]
        call = f"row(state, {', '.join(f'a{i}[i]' for i in range(k))})"
        cond = " and ".join(f"v{i}[i]" for i in range(k) if nullable[i])
        body = [f"if {cond}:", f"    {call}"] if cond else [call]
        source = f"def loop(state, {', '.join(params)}, n):\n    for i in range(n):\n" + "".join(
            f"        {b}\n" for b in body
        )
        scope = {"row": row if hasattr(row, "py_func") else numba.njit(row)}
        exec(compile(source, "<pystrom reduce loop>", "exec"), scope)  # generated here, no user text
        loop = numba.njit(scope["loop"])
        _LOOPS[key] = loop
        return loop
