"""What runs on the workers: every function a pystrom.dask graph calls, and how a Table travels.

Task functions are pickled by reference, so a worker imports this module before its first task
runs; importing it registers, for dask, a Table's size (memory accounting and spilling decisions)
and its serialisation (an Arrow IPC stream of its host copy, rebuilt on the receiver's default device:
only ``compute()`` and a user's own cross-partition work ever move a Table). In order of use:
the readers (a ctid/key range of a PostgreSQL read on the shared snapshot; a group of record
batches of an Arrow scan), then what a partition becomes (rows, an array, a DataFrame, a filtered
Table), then one partition's IRLS pass and the sum of passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import PostgresError
from ..memory.backend import resolve_device
from ..memory.bitmap import all_true
from ..table import Table

__all__ = [
    "read_pg_range",
    "read_arrow_group",
    "row_count",
    "to_array",
    "to_frame",
    "filter_rows",
    "concat_tables",
    "table_pass",
    "table_batch",
    "array_pass",
    "array_batch",
    "sum_passes",
    "PartitionMoved",
    "local_passes",
]

_EXTRA = 3  # a pass vector's tail: rows used, rows skipped for NULLs, float32 seen (0/1)


# -- readers ---------------------------------------------------------------------------------------


def read_pg_range(
    conninfo: str, snapshot: Any, statement: str, cols: Sequence[Any], hint: int | None, device: Any, what: str
) -> Table:
    """One range of a PostgreSQL read, on the client's exported snapshot, onto this worker's device.

    ``snapshot`` is the snapshot id (the client's holder object under a local scheduler); the
    connection is this task's own and is closed before the task ends, whatever happens.
    """
    from ..io.postgres.arrays import array_columns
    from ..io.postgres.assemble import assemble
    from ..io.postgres.columns import leaf_columns
    from ..io.postgres.session import connect, join_snapshot, run_sql
    from ..io.postgres.stream import read_all

    snapshot_id = getattr(snapshot, "id", snapshot)
    backend = resolve_device(device)
    conn = connect(conninfo)
    try:
        run_sql(conn, "naming the session", "SET application_name = 'pystrom.dask partition'")
        try:
            join_snapshot(conn, snapshot_id)
        except PostgresError as exc:
            raise PostgresError(
                f"{what}: cannot join the read's snapshot {snapshot_id!r}: the client holds it only while the "
                f"collection lives (until close() or its with block ends, with no persisted partition left to read, "
                f"or garbage collection, or every persisted partition is read); a persisted partition lost with its "
                f"worker cannot be read again on it: read the table again ({exc})"
            ) from exc
        try:
            leaves = len(leaf_columns(cols))
            chunks = read_all(backend, leaves, ([conn], [statement], [hint]), False, arrays=array_columns(cols))
        except PostgresError as exc:
            raise PostgresError(f"{what}: {exc}") from exc
        with backend.activate():
            return assemble(backend, cols, chunks)
    finally:
        conn.close()  # read only: nothing to commit


def read_arrow_group(
    path: str, indices: Sequence[int], columns: Sequence[str], where: str | None, device: Any
) -> Table:
    """Record batches ``indices`` of one Arrow file, filtered by ``where``, onto this worker's device."""
    from ..io.arrow.scan.scan import ArrowScan

    scan = ArrowScan(path, columns, where, None, device, False)
    return scan.read_group(path, indices)


# -- what a partition becomes ----------------------------------------------------------------------


def row_count(table: Table) -> int:
    return table.num_rows


def to_array(table: Table, columns: Sequence[str], dtype: Any) -> Any:
    """The partition's columns as one 2-D array on its device (zero copy where the layout allows)."""
    with table._live().backend.activate():
        return table.to_array(list(columns), dtype=dtype)


def to_frame(table: Table, use_cudf: bool) -> Any:
    """A pandas DataFrame, or with ``use_cudf`` a cuDF one. cuDF's ``from_arrow`` takes a host
    pyarrow Table in every version we know of, so the columns go through host memory (cuDF's import
    of Arrow C device arrays differs between its versions and is not used yet)."""
    if use_cudf and table.device != "cpu":
        import cudf

        return cudf.DataFrame.from_arrow(table.to_arrow())
    return table.to_pandas()


def filter_rows(table: Table, where: str) -> Table:
    """The rows of ``table`` where the ``where`` expression is true (a new Table on its device)."""
    from ..expr import compile_where

    predicate = compile_where(where, table.schema)
    with table._live().backend.activate():
        return table.filter(predicate.evaluate(table))


def concat_tables(tables: Sequence[Table], device: Any, schema: Any) -> Table:
    """``compute()``'s result: the partitions in order as one Table on ``device`` (the client's)."""
    from .._concat import concat

    backend = resolve_device(device)
    parts = [t.to(backend) for t in tables]
    if not parts:
        return Table.from_arrow(schema.empty_table(), device=backend)
    return parts[0] if len(parts) == 1 else concat(parts)


# -- logistic regression ---------------------------------------------------------------------------


def _empty_pass(k: int) -> np.ndarray:
    from ..ml._pass import layout_size

    out = np.zeros(layout_size(k) + _EXTRA)
    out[layout_size(k) - 1] = np.inf  # the margin's minimum over no rows
    return out


def _run_pass(batch: Any, cw: tuple[float, float], w: np.ndarray) -> np.ndarray:
    from ..ml._pass import batch_pass

    k = batch.X.shape[1]
    n = batch.X.shape[0]
    out = _empty_pass(k)
    if n:
        with batch.backend.activate():
            vec = batch_pass(batch.backend, batch.X, batch.y, batch.sw, cw, w)
            out[: len(out) - _EXTRA] = batch.backend.to_host(vec)
    out[-3:] = (n, batch.skipped, float(batch.X.dtype == np.float32))
    return out


def _check_finite(batch: Any) -> None:
    from ..ml._data import locate_nonfinite

    with batch.backend.activate():
        if batch.X.shape[0] and not all_true(batch.backend.xp.isfinite(batch.X)):
            raise locate_nonfinite(batch.backend.xp, batch.X, batch.names)


def table_pass(
    table: Table,
    columns: Sequence[str],
    target: str,
    weight: str | None,
    cw: tuple[float, float],
    w: np.ndarray,
    check: bool = False,
) -> np.ndarray:
    """One partition's IRLS sums at ``w`` (the fused kernel on a GPU): the pass vector, then rows
    used, rows skipped for NULLs and whether the features were float32. ``check``: raise naming the
    column when the features hold NaN/Inf (asked for only once a pass has counted such rows)."""
    batch = table_batch(table, columns, target, weight)
    if check:
        _check_finite(batch)
    return _run_pass(batch, cw, w)


def table_batch(table: Table, columns: Sequence[str], target: str, weight: str | None) -> Any:
    """One partition's features, 0/1 target and weights as the pass reads them (rows with NULLs left out)."""
    from ..ml._data import prepare_table

    return prepare_table(table, columns, target, weight, None, binary01=True)[0]


def array_batch(X: Any, y: Any, sw: Any) -> Any | None:
    """As :func:`table_batch` for one block of dask arrays (None: a block without rows)."""
    from ..ml._data import prepare_array

    if X.ndim != 2:
        from ..errors import SchemaMismatchError

        raise SchemaMismatchError(f"a block of X is {X.ndim}-D; X must be a 2-D dask array (rows x features)")
    if X.shape[0] == 0:
        return None
    return prepare_array(X, y, sw, None, binary01=True)[0]


def array_pass(X: Any, y: Any, sw: Any, cw: tuple[float, float], w: np.ndarray, check: bool = False) -> np.ndarray:
    """As :func:`table_pass` for one block of dask arrays (NumPy or CuPy chunks)."""
    batch = array_batch(X, y, sw)
    if batch is None:
        return _empty_pass(X.shape[1])
    if check:
        _check_finite(batch)
    return _run_pass(batch, cw, w)


def sum_passes(*vecs: np.ndarray) -> np.ndarray:
    """Several partitions' pass vectors as one: sums add, the margin (before the tail) takes the minimum."""
    out = np.sum(vecs, axis=0)
    margin = len(out) - _EXTRA - 1
    out[margin] = min(v[margin] for v in vecs)
    out[-1] = max(v[-1] for v in vecs)
    return out


class PartitionMoved(LookupError):
    """A partition the client placed on this worker is no longer in its memory (lost, moved, spilled
    away by another path): the client falls back to a scheduled pass."""


def local_passes(
    plan: dict, task: Any, args: tuple, cw: tuple[float, float], w: np.ndarray, check: bool, dask_worker: Any = None
) -> tuple[int, np.ndarray] | None:
    """This worker's share of one IRLS pass, run by ``Client.run``: ``task`` on every partition that
    ``plan[this worker's address]`` names (tuples of keys of its in-memory inputs), summed here;
    returns (partitions summed, the sum).

    Why not a task graph: a scheduled pass costs two to three batched-send intervals of the client,
    the scheduler and the worker (measured: 47 ms a pass with 16 partitions on an H200 machine, 15 ms
    for one trivial task here), while the sums themselves take about a millisecond. The partitions
    are already where they will be summed, so the client asks each worker directly."""
    mine = plan.get(dask_worker.address, [])
    if not mine:
        return None
    try:
        inputs = [[None if k is None else dask_worker.data[k] for k in keys] for keys in mine]
    except KeyError as exc:
        raise PartitionMoved(f"partition {exc.args[0]!r} is not in {dask_worker.address}'s memory") from None

    def one(values: list) -> np.ndarray:
        return task(*values, *args, cw, w, check)

    executor = getattr(dask_worker, "executors", {}).get("default")
    on_cpu = all(getattr(v, "device", "cpu") == "cpu" for values in inputs for v in values if v is not None)
    if executor is not None and on_cpu and len(inputs) > 1:
        vecs = list(executor.map(one, inputs))  # NumPy releases the GIL: every worker thread sums at once
    else:
        vecs = [one(values) for values in inputs]  # on a GPU, launches from one thread; each pass syncs once
    return len(vecs), sum_passes(*vecs)


# -- dask's hooks for Tables -----------------------------------------------------------------------


def _register() -> None:
    from dask.sizeof import sizeof

    @sizeof.register(Table)
    def _sizeof_table(table: Table) -> int:
        return 0 if table.closed else int(table.nbytes)

    try:
        from distributed.protocol import dask_deserialize, dask_serialize
    except ImportError:  # dask without distributed: local schedulers never serialise
        return

    @dask_serialize.register(Table)
    def _serialize(table: Table) -> tuple[dict, list]:
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        data = table.to_arrow()
        with pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write_table(data)
        return {"cpu": table.device == "cpu"}, [sink.getvalue()]

    @dask_deserialize.register(Table)
    def _deserialize(header: dict, frames: list) -> Table:
        import pyarrow as pa

        frame = frames[0] if len(frames) == 1 else b"".join(bytes(f) for f in frames)
        data = pa.ipc.open_stream(pa.py_buffer(frame)).read_all()
        return Table.from_arrow(data, device="cpu" if header.get("cpu") else None)


_register()
