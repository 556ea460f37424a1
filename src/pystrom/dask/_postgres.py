"""``pystrom.dask.read_postgres``: the plan of a partitioned read, made on the client, and its snapshot.

In order: the client opens one connection, begins a REPEATABLE READ READ ONLY transaction and
exports its snapshot (:class:`Snapshot`, which keeps that transaction open); the statement is composed
and its columns mapped exactly as ``pystrom.read_postgres`` does (:mod:`pystrom.io.postgres`); the
table is split into ctid ranges (``table=``) or key ranges (``partition_on=``) of equal size; each range
becomes one task (:func:`~pystrom.dask._tasks.read_pg_range`) that joins the snapshot on its worker.
The Snapshot object sits in every read task of the graph, so the transaction stays open while any
collection or dask array built on the read is alive; it pickles as its id alone, so no worker holds it.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgumentError
from ._collection import PartitionedTable, Partitions, check_device
from ._tasks import read_pg_range

__all__ = ["read_postgres", "Snapshot"]

# dask-cudf's guidance: partitions of a few hundred MB keep the per-task overhead small and the GPU busy.
_TARGET_PARTITION_BYTES = 256 << 20


class Snapshot:
    """The client's connection whose open transaction keeps an exported snapshot valid.

    Released by :meth:`close` (idempotent, thread-safe), when the last object referring to it is
    garbage collected, or at interpreter exit. Partitions being persisted hold it (:meth:`hold`):
    while any of them is still reading, ``close()`` only marks it released (nothing new may read it)
    and the transaction ends when the last of them has finished, so that leaving a ``with`` block
    right after ``persist()`` does not pull the snapshot from under the reads it started.
    """

    def __init__(self, conninfo: str):
        from ..io.postgres.session import connect, export_snapshot, run_sql

        self._lock = threading.Lock()
        self._pending = 0  # persisted partitions still reading
        self._released = False  # close() was called, or the persisted reads are all done
        conn = connect(conninfo)
        self._finalizer = weakref.finalize(self, conn.close)
        self.conn = conn
        try:
            run_sql(conn, "naming the session", "SET application_name = 'pystrom.dask snapshot'")
            run_sql(conn, "starting the read transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self.id: str = export_snapshot(conn)
        except BaseException:
            self._release_now()
            raise
        self.backend_pid: int = conn.info.backend_pid

    @property
    def closed(self) -> bool:
        """True once released: no new read may start on it (reads already persisting may still finish)."""
        return self._released or not self._finalizer.alive

    @property
    def holding(self) -> bool:
        """True while the client's transaction is open (until the last persisted read has finished)."""
        return self._finalizer.alive

    def close(self) -> None:
        """Release the snapshot: at once, or when the persisted partitions still reading have finished."""
        with self._lock:
            self._released = True
            if self._pending:
                return
        self._finalizer()  # runs conn.close() once

    def hold(self, futures: Sequence[Any]) -> None:
        """Keep the transaction open until every one of ``futures`` (persisted partitions being read)
        has finished, failed or been cancelled; then release it, as a persisted collection needs it no more."""
        if not futures:
            self.close()
            return
        with self._lock:
            self._pending += len(futures)

        def done(_: Any) -> None:
            with self._lock:
                self._pending -= 1
                last = self._pending == 0
                if last:
                    self._released = True
            if last:
                self._finalizer()

        for f in futures:
            f.add_done_callback(done)

    def _release_now(self) -> None:
        with self._lock:
            self._released = True
        self._finalizer()

    def __reduce__(self) -> Any:
        return (str, (self.id,))  # a worker needs the id only; the connection stays with the client

    def __dask_tokenize__(self) -> Any:
        return ("pystrom.dask.Snapshot", self.id)

    def __repr__(self) -> str:
        state = "held" if not self.closed else "released, held by persisted reads" if self.holding else "released"
        return f"<pystrom.dask.Snapshot {self.id} {state}>"


def _check_npartitions(npartitions: Any) -> None:
    if npartitions is not None and (
        isinstance(npartitions, bool) or not isinstance(npartitions, int) or npartitions < 1
    ):
        raise InvalidArgumentError(f"npartitions must be a positive int or None; got {npartitions!r}")


def _cluster_threads() -> int:
    """Worker threads of the current dask.distributed client (1 without one): partitions enough for
    every thread to read at once."""
    try:
        from distributed import default_client

        workers = default_client().scheduler_info(n_workers=-1).get("workers", {})
    except (ImportError, ValueError):  # no distributed, or no client
        return 1
    return max(1, sum(int(w.get("nthreads", 1)) for w in workers.values()))


def default_partitions(threads: int, heap_bytes: int) -> int:
    """Partitions of a ``table=`` read: at most 256 MB of heap each, in whole waves of the workers'
    threads. Each thread reads one partition at a time, so a count just past a multiple of the threads
    (40 on 32 threads) left most threads idle in the last wave while the server's COPY over as many
    backends ends together (issue 35: 160M rows on 2 GPUs read 1.47x their COPY)."""
    waves = max(1, math.ceil(heap_bytes / _TARGET_PARTITION_BYTES / max(1, threads)))
    return waves * max(1, threads)


def read_postgres(
    conninfo: str,
    query: Any = None,
    *,
    table: str | Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    params: Any = None,
    npartitions: int | None = None,
    partition_on: str | None = None,
    numeric: str = "float64",
    device: str | int | None = None,
) -> PartitionedTable:
    """A PostgreSQL table or query as a lazy partitioned collection, read by the dask workers.

    Each partition is one task reading one ctid range (``table=``) or one range of an integer
    column (``query=`` with ``partition_on=``) with pystrom's COPY pump, on whichever worker runs it,
    onto that worker's device. All partitions read ONE snapshot, exported now by a connection of
    the client that holds its transaction open while the collection (or anything built on it) is
    alive: the partitions together equal ``pystrom.read_postgres`` of the same statement at this
    moment, whatever others write meanwhile. The snapshot is released by ``close()``, at the end of
    a ``with`` block, when the collection is garbage collected, and once a ``persist()`` has read
    every partition.

    Parameters
    ----------
    conninfo
        A libpq connection string or URI; every worker connects with it (the workers must reach the
        server). Open ``psycopg`` connections cannot be shared between processes and are refused.
    query, table, columns, where, params, numeric
        As for :func:`pystrom.read_postgres`.
    npartitions
        Partitions (tasks). None: the table's heap size over 256 MB, rounded up to a multiple of the
        worker threads of the current ``dask.distributed`` client (so that all read at once, in
        waves that keep every thread busy), at most one per heap page; with ``partition_on``, one per
        worker thread. A ``query=`` without ``partition_on`` is read as one partition.
    partition_on
        With ``query=``: an int2/int4/int8 result column whose [min, max] is split into
        ``npartitions`` equal ranges (NULL keys go to the first).
    device
        Where each worker puts its partitions: ``"cpu"``, ``"cuda"`` or None (each worker's
        default: its GPU under dask-cuda, else the CPU). Resolved on the worker.

    Returns
    -------
    PartitionedTable
        Lazy: nothing is read before ``compute()``, ``persist()`` or a computation that needs it.
    """
    from ..io.postgres.session import (
        copy_sql,
        ctid_statements,
        equal_ranges,
        key_bounds,
        key_statements,
        psycopg_module,
        run_sql,
        table_pages,
    )
    from ..io.postgres.statement import check_read_arguments, compose
    from ..io.postgres.types import check_partition_key, describe_read

    psycopg = psycopg_module("pystrom.dask.read_postgres")
    if isinstance(conninfo, psycopg.Connection):
        raise InvalidArgumentError(
            "pystrom.dask.read_postgres needs a connection string or URI: every worker opens its own "
            "connection (an open psycopg.Connection cannot travel to other processes)"
        )
    if not isinstance(conninfo, str):
        raise InvalidArgumentError(f"conninfo must be a connection string or URI; got {type(conninfo).__name__}")
    check_read_arguments(query, table, columns, where, numeric, partition_on)
    _check_npartitions(npartitions)
    check_device(device)

    snapshot = Snapshot(conninfo)
    try:
        main = snapshot.conn
        plan = compose(main, query, table, columns, where, params)
        # one schema for every partition: array columns are settled by asking the server, on the snapshot
        plan, cols = describe_read(main, plan, numeric, run_sql, arrays="server")
        if partition_on is not None:
            check_partition_key(cols, partition_on)
            if not any(c.name == partition_on for c in cols):
                raise InvalidArgumentError(f"partition_on column {partition_on!r} is not a column of the query")
        statements, hints, labels = [copy_sql(main, plan.select)], [None], ["the whole result"]
        if plan.table is not None:
            pages, block = table_pages(main, plan)
            if pages is not None:
                n = npartitions or default_partitions(_cluster_threads(), pages * block)
                ranges: list[tuple[int, int | None]] = list(equal_ranges(pages, max(1, min(n, pages)))) or [(0, 0)]
                ranges[-1] = (ranges[-1][0], None)  # open-ended: pages added since the size was read
                statements = ctid_statements(main, plan, ranges)
                hints = [((b if b is not None else pages) - a) * block for a, b in ranges]
                labels = [f"heap pages {a}.." + (str(b) if b is not None else "end") for a, b in ranges]
        elif partition_on is not None:
            bounds = key_bounds(main, plan, partition_on)
            if bounds is not None:
                lo, hi = bounds
                n = npartitions or _cluster_threads()
                key_ranges = equal_ranges(hi - lo + 1, max(1, min(n, hi - lo + 1)))
                statements = key_statements(main, plan, partition_on, lo, key_ranges)
                hints = [None] * len(statements)
                labels = [f"{partition_on} in [{lo + a}, {lo + b})" for a, b in key_ranges]
                labels[-1] = f"{partition_on} >= {lo + key_ranges[-1][0]}"
                labels[0] += " or NULL"
    except BaseException:
        snapshot._release_now()
        raise

    import pyarrow as pa

    schema = pa.schema([pa.field(c.name, c.type.arrow) for c in cols])
    source = f"read_postgres({_describe_source(query, table)})"
    tasks = [
        (read_pg_range, conninfo, snapshot, text, cols, hint, device, f"partition {i} of {source} ({label})")
        for i, (text, hint, label) in enumerate(zip(statements, hints, labels))
    ]
    return PartitionedTable(Partitions.from_tasks("pystrom-read-postgres", tasks, snapshot), schema, device)


def _describe_source(query: Any, table: Any) -> str:
    if table is not None:
        return f"table={table!r}"
    text = query if isinstance(query, str) else repr(query)
    text = " ".join(text.split())
    return f"query={text[:60] + '...' if len(text) > 60 else text!r}"
