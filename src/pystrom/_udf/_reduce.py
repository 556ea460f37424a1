"""``pystrom.reduce``: a user reduction per batch, combined across batches and Dask partitions.

In order: the source is split into batches (a Table is one batch; a stream such as ``scan_arrow`` or
``scan_postgres`` yields them, out of core; a ``pystrom.dask`` collection gives one per partition,
reduced on the workers); for each batch ``init()`` makes a fresh state (NumPy
arrays), a generated ``njit`` loop calls ``row(state, *values)`` for every row where no column is
NULL, and ``combine(a, b)`` folds the batches' states in order.

The loop runs on the CPU: a batch on a GPU has its columns copied to the host first (the row
function updates one shared state, which a GPU would need atomics or a tree of partial states for).
The row function is compiled with :data:`~pystrom._udf._common.CPU_OPTIONS` (every index checked,
NumPy's division); where it raises, a second loop from a fresh state finds the first row that raises
and :class:`~pystrom.errors.UserFunctionError` names it, with the batch or partition.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..errors import Error, ExpressionError, UnsupportedTypeError
from ..table import Table
from ._common import (
    COMPILATIONS,
    CPU_OPTIONS,
    column_arrays,
    failure,
    first_line,
    global_snapshot,
    numba_modules,
    warn_stale_globals,
)

__all__ = ["reduce"]

_LOOPS: dict[tuple, tuple[Any, Any, Any, dict]] = {}  # (row, nulls) -> loop, probe, compiled row, frozen globals
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

        parts = [
            dask.delayed(_batch)(p, columns, init, row, f"partition {i}") for i, p in enumerate(source.to_delayed())
        ]
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
        s = _batch(batch, columns, init, row, f"batch {i}")
        state = s if state is None else combine(state, s)
    return init() if state is None else state


def _fold(states: Any, init: Any, combine: Any) -> Any:
    state = None
    for s in states:
        state = s if state is None else combine(state, s)
    return init() if state is None else state


def _batch(table: Table, columns: tuple[str, ...], init: Any, row: Any, where: str = "") -> Any:
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
    loop, probe, compiled, frozen = _loop(row, tuple(v is not None for v in valid))
    name = getattr(row, "__name__", repr(row))
    warn_stale_globals(f"reduce: row function {name!r}", row, frozen)
    before = len(loop.overloads)
    arrays = [np.ascontiguousarray(v) for v in values] + [v for v in valid if v is not None]
    try:
        loop(state, *arrays, np.int64(n))
    except Error:
        raise
    except Exception as exc:
        if len(loop.overloads) == before and _is_numba_error(exc):  # it did not compile
            described = ", ".join(f"{c} {v.dtype}" for c, v in zip(columns, values))
            first = first_line(exc)
            raise UnsupportedTypeError(
                f"reduce: row function {name!r} does not compile for columns ({described}) "
                f"and state {type(state).__name__}: {first}"
            ) from None
        err = _row_failure(probe, compiled, init, arrays, values, columns, n, name, where, exc)
        raise err from err.__cause__
    if len(loop.overloads) != before:
        COMPILATIONS["cpu"] += 1
    return state


def _row_failure(
    probe: Any,
    compiled: Any,
    init: Any,
    arrays: list,
    values: list,
    columns: tuple,
    n: int,
    name: str,
    where: str,
    exc: Exception,
) -> Error:
    """The first row whose call raises, from a fresh state (the rows before it applied as the loop did),
    and the row function's own exception raised again there."""
    state = init()
    at = int(probe(state, *arrays, np.int64(n)))
    if at < 0:
        return failure(f"reduce: row function {name!r}", name, None, "cpu", exc, of=where)
    cause: BaseException = exc
    try:
        compiled(state, *[v[at] for v in values])
    except Exception as again:  # the function's own exception, from this row and the state before it
        cause = again
    shown = ", ".join(f"{c}={np.asarray(v)[at].item()!r}" for c, v in zip(columns, values))
    return failure(f"reduce: row function {name!r}", name, at, "cpu", cause, shown, of=where)


def _is_numba_error(exc: Exception) -> bool:
    return type(exc).__module__.startswith("numba")


def _loop(row: Any, nullable: tuple[bool, ...]) -> tuple[Any, Any, Any, dict]:
    """The loop over a batch's rows, the probe that finds the first row that raises, the row function
    compiled (:data:`CPU_OPTIONS` added to an ``njit`` function's own), and the globals it froze."""
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
        head = f"(state, {', '.join(params)}, n):\n    for i in range(n):\n"
        source = f"def loop{head}" + "".join(f"        {b}\n" for b in body)
        source += f"def probe{head}        try:\n" + "".join(f"            {b}\n" for b in body)
        source += "        except Exception:\n            return i\n    return -1\n"
        if hasattr(row, "py_func"):  # an njit function: its options, with the checks added
            options = {k: v for k, v in row.targetoptions.items() if k != "nopython"}
            compiled = numba.njit(**{**options, **CPU_OPTIONS})(row.py_func)
        else:
            compiled = numba.njit(**CPU_OPTIONS)(row)
        scope = {"row": compiled}
        exec(compile(source, "<pystrom reduce loop>", "exec"), scope)  # generated here, no user text
        hit = (numba.njit(scope["loop"]), numba.njit(scope["probe"]), compiled, global_snapshot(row))
        _LOOPS[key] = hit
        return hit
