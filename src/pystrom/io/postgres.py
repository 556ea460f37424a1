"""PostgreSQL straight into a Table: planning, snapshots, type mapping. The bytes move in ``_pq``.

A read is planned here: the statement is composed with :mod:`psycopg.sql` (identifiers are never
formatted into strings), its result columns are described (``LIMIT 0``) and mapped to pystrom
types, and a ``table=`` read (or a ``query=`` read with ``partition_on=``) is split into ranges, one
connection each, all on one snapshot (:mod:`pystrom.io._pg_session`). Each connection streams
``COPY ... TO STDOUT (FORMAT BINARY)`` through the native pump into staging buffers; once all
are in, the table is allocated once (row counts, NULL counts and string sizes are known by then)
and every chunk is decoded straight into its row range (:mod:`pystrom.io._pg_types`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from .._backend import resolve_device
from .._progress import check_progress, reporter
from .._settings import defaults
from ..errors import InvalidArgumentError, PostgresError
from ..table import Table
from . import _pg_types
from ._pg_session import Plan, connect, copy_sql, key_range_jobs, psycopg_module, run_sql, table_range_jobs
from ._pq import CopyStream, Staged

__all__ = ["read_postgres", "postgres_to_arrow"]


def _identifier(table: Any) -> Any:
    from psycopg import sql

    if isinstance(table, str):
        if not table:
            raise InvalidArgumentError("table must be a non-empty name")
        return sql.Identifier(table)
    if isinstance(table, (tuple, list)) and 1 <= len(table) <= 3 and all(isinstance(p, str) and p for p in table):
        return sql.Identifier(*table)
    raise InvalidArgumentError(
        f"table must be a name (taken literally, quotes and dots included) or a tuple such as "
        f"('schema', 'name'); got {table!r}"
    )


def _plan(conn: Any, query: Any, table: Any, columns: Any, where: Any, params: Any) -> Plan:
    from psycopg import ClientCursor, sql

    if table is not None:
        ident = _identifier(table)
        if columns is None:
            cols = sql.SQL("*")
        else:
            if isinstance(columns, str) or not all(isinstance(c, str) and c for c in columns) or not columns:
                raise InvalidArgumentError(f"columns must be a non-empty list of column names; got {columns!r}")
            cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        pred = None
        if where is not None:
            if not isinstance(where, str) or not where.strip():
                raise InvalidArgumentError(f"where must be a SQL condition (a non-empty string); got {where!r}")
            pred = sql.SQL(where)
            if params is not None:  # bound on the client: COPY takes no server-side parameters
                pred = sql.SQL(ClientCursor(conn).mogrify(where, params))
        select = sql.SQL("SELECT {} FROM {}").format(cols, ident)
        if pred is not None:
            select = sql.SQL("{} WHERE ({})").format(select, pred)
        return Plan(select, ident, cols, pred)
    if not isinstance(query, (str, sql.Composable)):
        raise InvalidArgumentError(f"query must be a SQL string or a psycopg.sql object; got {type(query).__name__}")
    text = query if isinstance(query, str) else query.as_string(conn)
    if params is not None:
        text = ClientCursor(conn).mogrify(text, params)
    text = text.strip().rstrip(";").strip()
    if not text:
        raise InvalidArgumentError("query is empty")
    return Plan(sql.SQL(text))


class _Reader:
    """Runs the COPY streams of one read and cancels them all when one fails or the caller is interrupted."""

    def __init__(self, backend: Any, ncols: int, progress: Callable[[int], None] | None):
        self._allocate = _staging_allocator(backend)
        self._upload: Any = None  # on a GPU: _pg_gpu.Uploader
        if backend.kind == "cuda":
            from ._pg_gpu import Uploader

            self._upload = Uploader(backend)
        self._ncols = ncols
        self._progress = progress
        self._rows = 0
        self._lock = threading.Lock()

    def _on_chunk(self, chunk: Staged) -> None:
        if self._upload is not None:
            self._upload(chunk)
        if self._progress is not None:
            with self._lock:
                self._rows += chunk.nrows
                self._progress(self._rows)

    def read(self, conn: Any, sql_text: str, size_hint: int | None = None) -> list[Staged]:
        stream = CopyStream(conn, self._ncols, self._allocate, defaults.pg_staging_chunk)
        lock = getattr(conn, "lock", None)  # psycopg's own lock: nobody else uses the connection meanwhile
        if lock is None:
            return stream.read(sql_text, self._on_chunk, size_hint)
        with lock:
            return stream.read(sql_text, self._on_chunk, size_hint)

    def read_all(self, sources: Sequence[Any], statements: Sequence[str], hints: Sequence[int | None]) -> list:
        """Run the COPY statements, each connection taking the next statement from one queue as it
        finishes its last; the chunks come back in statement order. ``sources`` are connections or
        callables that open one (SnapshotJoiner), called by the thread that then reads on it.
        ``hints``: each statement's expected size in bytes (None: unknown), its first buffer's size."""
        try:
            return self._read_all(sources, statements, hints)
        except BaseException:
            if self._upload is not None:
                self._upload.release()
            raise

    def _read_all(self, sources: Sequence[Any], statements: Sequence[str], hints: Sequence[int | None]) -> list:
        if len(sources) == 1:
            return [self.read(sources[0], text, hint) for text, hint in zip(statements, hints)]
        results: list[list[Staged]] = [[] for _ in statements]
        queue = iter(range(len(statements)))
        failed = threading.Event()
        opened: list[Any] = []  # the connections reading now, for cancelling them

        def work(source: Any) -> None:
            try:
                conn = source() if callable(source) else source
                with self._lock:
                    opened.append(conn)
                while not failed.is_set():
                    with self._lock:
                        i = next(queue, None)
                    if i is None:
                        return
                    results[i] = self.read(conn, statements[i], hints[i])
            except BaseException:
                failed.set()  # the others take no further range
                raise

        with ThreadPoolExecutor(max_workers=len(sources), thread_name_prefix="pystrom-pg") as pool:
            futures = [pool.submit(work, source) for source in sources]
            try:
                # React to the first failure at once (a refused connection while the others read),
                # not when the connections before it in the list have finished.
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                for f in futures:
                    if f in done and f.exception() is not None:
                        f.result()
                return results
            except BaseException:
                # One stream failed (or Ctrl-C): ask the server to stop the others, then let them drain.
                failed.set()
                with self._lock:
                    live = list(opened)
                for conn in live:
                    try:
                        conn.cancel()
                    except Exception:
                        pass
                for f in futures:
                    f.exception()
                raise


def _read_all(backend: Any, ncols: int, jobs: tuple, progress: Any) -> list:
    """jobs: (connections or SnapshotJoiners, COPY statements, their size hints)."""
    with reporter(progress, unit="rows", desc="read_postgres") as report:
        return _Reader(backend, ncols, report if report.active else None).read_all(*jobs)


def _staging_allocator(backend: Any) -> Callable[[int], Any]:
    import numpy as np

    if backend.kind != "cuda":
        return lambda n: np.empty(n, dtype=np.uint8)
    cp = backend.xp

    def pinned(n: int) -> Any:  # page-locked, so the copy to the GPU runs at full PCIe speed
        with backend.activate():
            mem = cp.cuda.alloc_pinned_memory(n)
        return np.frombuffer(mem, dtype=np.uint8, count=n)  # keeps `mem` alive

    return pinned


def read_postgres(
    conninfo: Any,
    query: Any = None,
    *,
    table: str | Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    params: Any = None,
    partitions: int | None = None,
    partition_on: str | None = None,
    numeric: str = "float64",
    device: str | int | None = None,
    progress: bool | Callable[[int], None] | None = None,
) -> Table:
    """Read a PostgreSQL query result or table into a new Table on ``device``.

    Parameters
    ----------
    conninfo
        A libpq connection string or URI, or an open ``psycopg.Connection``. With a connection the
        read runs on it, inside its current transaction, as one stream; it is left open (after a
        server error its transaction is failed, as with any failed statement: roll it back).
    query
        A SELECT (or anything ``COPY (query) TO STDOUT`` accepts), a string or a ``psycopg.sql``
        object. ``params`` are bound on the client (COPY takes no server-side parameters).
    table
        Instead of ``query``: a table or materialized view. A string is one identifier taken
        literally (``'we"ird name'`` works); a tuple ``('schema', 'name')`` qualifies it.
    columns
        With ``table``: the columns to read (default: all).
    where
        With ``table``: a SQL condition, e.g. ``"x > %s"`` with ``params=(3,)``.
    partitions
        Connections reading one ``table`` in parallel, all on one exported snapshot (REPEATABLE
        READ READ ONLY); the table's pages are split into ranges, largest first, which the
        connections take from one queue (so a slower one reads less, and all end together): the
        result equals a single read even while others write. None picks from the table size and
        the server's cores (``pystrom.defaults.pg_partitions`` caps it); 1 reads one stream.
        ``query`` reads are one stream unless ``partition_on`` is given.
    partition_on
        With ``query``: an integer (int2/4/8) result column whose [min, max] is split into
        ranges the same way, read by ``partitions`` connections on one snapshot (NULL keys go to
        the first range). Reads on a user's connection stay one stream.
    numeric
        ``"float64"`` (default) or ``"decimal"``: numeric columns as decimal128 with the column's
        declared precision and scale (unconstrained numeric must then be cast, e.g. ``x::numeric(18,4)``);
        values that do not fit raise instead of wrapping.
    device
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or None (``pystrom.defaults.device``, else a GPU if visible).
        On a GPU the raw COPY bytes are staged in pinned memory and decoded by a CUDA kernel.
    progress
        None (default): a progress bar on stderr (rows received) when stderr is a terminal and the
        read runs longer than ``pystrom.defaults.progress_delay`` seconds (2). True: a bar from the
        start, wherever stderr goes. False: none. A callable: called with the number of rows
        received so far, from the reading threads (no bar).

    Returns
    -------
    Table
        Column types: bool, int2/4/8 -> int16/32/64, oid -> uint32, float4/8, numeric -> float64 or
        decimal128, date -> date32, timestamp -> timestamp[us], timestamptz -> timestamp[us, UTC],
        text/varchar/bpchar/name -> string, bytea -> binary, uuid -> uuid. PostgreSQL's +-infinity
        dates and timestamps become the type's largest and smallest values. Other types raise
        :class:`~pystrom.errors.UnsupportedTypeError` naming the column and the cast to add.

    Raises
    ------
    PostgresError
        Connection failures, SQL errors, permissions, a connection lost during the read. No partial
        table is returned.
    """
    psycopg = psycopg_module()
    if (query is None) == (table is None):
        raise InvalidArgumentError("read_postgres needs exactly one of query= or table=")
    if query is not None and (columns is not None or where is not None):
        raise InvalidArgumentError("columns= and where= go with table=; put them in the query instead")
    if numeric not in ("float64", "decimal"):
        raise InvalidArgumentError(f"numeric must be 'float64' or 'decimal'; got {numeric!r}")
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise InvalidArgumentError(f"partitions must be a positive int or None; got {partitions!r}")
    if partition_on is not None and (query is None or not isinstance(partition_on, str) or not partition_on):
        raise InvalidArgumentError(f"partition_on must name an integer column of a query= read; got {partition_on!r}")
    check_progress(progress)
    backend = resolve_device(device)

    if isinstance(conninfo, psycopg.Connection):
        if conninfo.closed:
            raise PostgresError("the psycopg connection passed to read_postgres is closed")
        plan = _plan(conninfo, query, table, columns, where, params)
        cols = _pg_types.describe(conninfo, plan.select, numeric, run_sql)
        chunks = _read_all(backend, len(cols), ([conninfo], [copy_sql(conninfo, plan.select)], [None]), progress)
        return _pg_types.assemble(backend, cols, chunks)
    if not isinstance(conninfo, str):
        raise InvalidArgumentError(
            f"conninfo must be a connection string/URI or a psycopg.Connection; got {type(conninfo).__name__}"
        )

    main = connect(conninfo)
    extra: list[Any] = []
    try:
        run_sql(main, "starting the read transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        plan = _plan(main, query, table, columns, where, params)
        cols = _pg_types.describe(main, plan.select, numeric, run_sql)
        if partition_on is not None:
            _pg_types.check_partition_key(cols, partition_on)
        jobs = [main], [copy_sql(main, plan.select)], [None]
        if partitions != 1 and plan.table is not None:
            jobs = table_range_jobs(conninfo, main, plan, partitions, extra) or jobs
        elif partitions != 1 and partition_on is not None:
            jobs = key_range_jobs(conninfo, main, plan, partition_on, partitions, extra) or jobs
        chunks = _read_all(backend, len(cols), jobs, progress)
        return _pg_types.assemble(backend, cols, chunks)
    finally:
        for conn in [*extra, main]:
            conn.close()  # read-only transactions: nothing to commit


def postgres_to_arrow(
    conninfo: Any,
    path: Any,
    query: Any = None,
    *,
    table: str | Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    params: Any = None,
    batch_rows: int = 1 << 20,
    partitions: int | None = None,
    partition_on: str | None = None,
    numeric: str = "float64",
    stats: bool = True,
    progress: bool | Callable[[int], None] | None = None,
) -> Any:
    """Write a PostgreSQL query result or table to an Arrow IPC file (PG-Strom's ``pg2arrow``).

    The rows are read exactly as :func:`read_postgres` reads them (same types, partitions on one
    snapshot) into host memory, then written by :func:`pystrom.write_arrow`: record batches of
    ``batch_rows`` rows, each with min/max statistics in PG-Strom's ``min_max_stats.<column>`` keys,
    so ``scan_arrow(where=...)`` (and PG-Strom's Arrow_Fdw) can skip batches. The whole result is
    held in host memory once while it is written.

    Parameters
    ----------
    conninfo, query, table, columns, where, params, partitions, partition_on, numeric, progress
        As for :func:`read_postgres`.
    path
        The file to write; it is replaced only once complete.
    batch_rows
        Rows per record batch (the granularity of the statistics).
    stats
        Write the per-batch min/max statistics.

    Returns
    -------
    WriteSummary
        path, num_rows, num_batches, bytes_written.
    """
    from .arrow import write_arrow

    result = read_postgres(
        conninfo,
        query,
        table=table,
        columns=columns,
        where=where,
        params=params,
        partitions=partitions,
        partition_on=partition_on,
        numeric=numeric,
        device="cpu",
        progress=progress,
    )
    with result:
        return write_arrow(result, path, batch_rows=batch_rows, stats=stats)
