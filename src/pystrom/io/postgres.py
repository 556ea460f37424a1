"""PostgreSQL straight into a Table: planning, snapshots, type mapping. The bytes move in ``_pq``.

A read is planned here: the statement is composed with :mod:`psycopg.sql` (identifiers are never
formatted into strings), its result columns are described (``LIMIT 0``) and mapped to pystrom
types, a ``table=`` read is split into ctid ranges over the relation's pages, one connection per
range, all in REPEATABLE READ READ ONLY on one snapshot exported by the first connection (so the
partitions together equal one read, whatever others write meanwhile). Each connection streams
``COPY ... TO STDOUT (FORMAT BINARY)`` through the native pump into staging buffers; once all
are in, the table is allocated once (row counts, NULL counts and string sizes are known by then)
and every chunk is decoded straight into its row range (:mod:`pystrom.io._pg_decode`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .._backend import resolve_device
from .._settings import defaults
from ..errors import InvalidArgumentError, PostgresError
from ..table import Table
from . import _pg_types
from ._pq import CopyStream, Staged

__all__ = ["read_postgres", "postgres_to_arrow"]

_PAGES_PER_PARTITION = 1024  # 8 MiB of heap at least per connection: below that a connection costs more than it saves
_MAX_AUTO_PARTITIONS = 16
_LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise PostgresError("read_postgres needs psycopg: pip install 'psycopg[binary]'") from None
    return psycopg


def _masked(conninfo: str) -> str:
    """The conninfo without its password, for messages."""
    psycopg = _psycopg()
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "<unparsable conninfo>"
    params.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in params.items()) or "<defaults>"


def _connect(conninfo: str) -> Any:
    psycopg = _psycopg()
    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.Error as exc:
        raise PostgresError(f"cannot connect to PostgreSQL ({_masked(conninfo)}): {_flat(exc)}") from exc


def _flat(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@dataclass
class _Plan:
    select: Any  # psycopg.sql.Composable: the SELECT without partition predicates
    table: Any = None  # psycopg.sql.Identifier of the relation (table= reads)
    columns: Any = None  # composed column list
    where: Any = None  # composed user predicate or None


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


def _plan(conn: Any, query: Any, table: Any, columns: Any, where: Any, params: Any) -> _Plan:
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
        return _Plan(select, ident, cols, pred)
    if not isinstance(query, (str, sql.Composable)):
        raise InvalidArgumentError(f"query must be a SQL string or a psycopg.sql object; got {type(query).__name__}")
    text = query if isinstance(query, str) else query.as_string(conn)
    if params is not None:
        text = ClientCursor(conn).mogrify(text, params)
    text = text.strip().rstrip(";").strip()
    if not text:
        raise InvalidArgumentError("query is empty")
    return _Plan(sql.SQL(text))


def _run(conn: Any, what: str, statement: Any, args: Any = None) -> Any:
    psycopg = _psycopg()
    try:
        return conn.execute(statement, args)
    except psycopg.Error as exc:
        raise PostgresError(f"PostgreSQL, while {what}: {_flat(exc)}") from exc


def _auto_partitions(conn: Any, pages: int) -> int:
    limit = defaults.pg_partitions
    if limit == 0:
        host = conn.info.host or ""
        if host in _LOCAL_HOSTS or host.startswith("/"):
            limit = min(os.cpu_count() or 1, _MAX_AUTO_PARTITIONS)  # the server shares this machine's cores
        else:
            row = _run(conn, "reading max_worker_processes", "SELECT current_setting('max_worker_processes')::int")
            limit = min(int(row.fetchone()[0]), _MAX_AUTO_PARTITIONS)
    row = _run(
        conn,
        "counting free connections",
        "SELECT current_setting('max_connections')::int - (SELECT count(*) FROM pg_stat_activity)",
    ).fetchone()
    free = int(row[0]) - 3  # leave a few for others (superuser slots are not ours to take)
    return max(1, min(limit, pages // _PAGES_PER_PARTITION, free))


def _ranges(pages: int, n: int) -> list[tuple[int, int | None]]:
    """``n`` ctid page ranges covering the relation; the last is open-ended (pages added later)."""
    bounds = [pages * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] if i + 1 < n else None) for i in range(n)]


def _partition_select(plan: _Plan, start: int, stop: int | None) -> Any:
    from psycopg import sql

    preds = [sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({start},0)"))]
    if stop is not None:
        preds.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({stop},0)")))
    if plan.where is not None:
        preds.append(sql.SQL("({})").format(plan.where))
    return sql.SQL("SELECT {} FROM {} WHERE {}").format(plan.columns, plan.table, sql.SQL(" AND ").join(preds))


def _copy_sql(conn: Any, select: Any) -> str:
    from psycopg import sql

    return sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(select).as_string(conn)


class _Reader:
    """Runs the COPY streams of one read and cancels them all when one fails or the caller is interrupted."""

    def __init__(self, backend: Any, ncols: int, progress: Callable[[int], None] | None):
        self._allocate = _staging_allocator(backend)
        self._ncols = ncols
        self._progress = progress
        self._rows = 0
        self._lock = threading.Lock()
        self._conns: list[Any] = []

    def _on_chunk(self, chunk: Staged) -> None:
        if self._progress is not None:
            with self._lock:
                self._rows += chunk.nrows
                self._progress(self._rows)

    def read(self, conn: Any, sql_text: str) -> list[Staged]:
        stream = CopyStream(conn, self._ncols, self._allocate, defaults.pg_staging_chunk)
        lock = getattr(conn, "lock", None)  # psycopg's own lock: nobody else uses the connection meanwhile
        if lock is None:
            return stream.read(sql_text, self._on_chunk)
        with lock:
            return stream.read(sql_text, self._on_chunk)

    def read_all(self, jobs: Sequence[tuple[Any, str]]) -> list[list[Staged]]:
        if len(jobs) == 1:
            return [self.read(*jobs[0])]
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="pystrom-pg") as pool:
            futures = [pool.submit(self.read, conn, text) for conn, text in jobs]
            try:
                return [f.result() for f in futures]
            except BaseException:
                # One stream failed (or Ctrl-C): ask the server to stop the others, then let them drain.
                for conn, _ in jobs:
                    try:
                        conn.cancel()
                    except Exception:
                        pass
                for f in futures:
                    f.exception()
                raise


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
    numeric: str = "float64",
    device: str | int | None = None,
    progress: Callable[[int], None] | None = None,
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
        Connections reading one ``table`` in parallel, each a range of the table's pages, all on
        one exported snapshot (REPEATABLE READ READ ONLY): the result equals a single read even
        while others write. None picks from the table size and the server's cores
        (``pystrom.defaults.pg_partitions`` caps it); 1 reads one stream. ``query`` reads are one stream.
    numeric
        ``"float64"`` (default) or ``"decimal"``: numeric columns as decimal128 with the column's
        declared precision and scale (unconstrained numeric must then be cast, e.g. ``x::numeric(18,4)``);
        values that do not fit raise instead of wrapping.
    device
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or None (``pystrom.defaults.device``, else a GPU if visible).
        On a GPU the raw COPY bytes are staged in pinned memory and decoded by a CUDA kernel.
    progress
        Called with the number of rows received so far, from the reading threads.

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
    psycopg = _psycopg()
    if (query is None) == (table is None):
        raise InvalidArgumentError("read_postgres needs exactly one of query= or table=")
    if query is not None and (columns is not None or where is not None):
        raise InvalidArgumentError("columns= and where= go with table=; put them in the query instead")
    if numeric not in ("float64", "decimal"):
        raise InvalidArgumentError(f"numeric must be 'float64' or 'decimal'; got {numeric!r}")
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise InvalidArgumentError(f"partitions must be a positive int or None; got {partitions!r}")
    if progress is not None and not callable(progress):
        raise InvalidArgumentError("progress must be callable")
    backend = resolve_device(device)

    if isinstance(conninfo, psycopg.Connection):
        if conninfo.closed:
            raise PostgresError("the psycopg connection passed to read_postgres is closed")
        plan = _plan(conninfo, query, table, columns, where, params)
        cols = _pg_types.describe(conninfo, plan.select, numeric, _run)
        chunks = _Reader(backend, len(cols), progress).read_all([(conninfo, _copy_sql(conninfo, plan.select))])
        return _pg_types.assemble(backend, cols, chunks)
    if not isinstance(conninfo, str):
        raise InvalidArgumentError(
            f"conninfo must be a connection string/URI or a psycopg.Connection; got {type(conninfo).__name__}"
        )

    main = _connect(conninfo)
    extra: list[Any] = []
    try:
        _run(main, "starting the read transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        plan = _plan(main, query, table, columns, where, params)
        cols = _pg_types.describe(main, plan.select, numeric, _run)
        jobs = [(main, _copy_sql(main, plan.select))]
        if plan.table is not None and partitions != 1:
            jobs = _partition_jobs(conninfo, main, plan, partitions, extra) or jobs
        chunks = _Reader(backend, len(cols), progress).read_all(jobs)
        return _pg_types.assemble(backend, cols, chunks)
    finally:
        for conn in [*extra, main]:
            conn.close()  # read-only transactions: nothing to commit


def _partition_jobs(conninfo: str, main: Any, plan: _Plan, partitions: int | None, extra: list) -> list | None:
    """Open the extra connections on the main one's snapshot; None when one stream is all it takes."""
    from psycopg import sql

    row = _run(
        main,
        "sizing the table",
        sql.SQL(
            "SELECT c.relkind, pg_relation_size(c.oid) / current_setting('block_size')::bigint "
            "FROM pg_class c WHERE c.oid = {}::regclass"
        ).format(sql.Literal(plan.table.as_string(main))),
    ).fetchone()
    relkind, pages = row[0], int(row[1])
    if relkind not in ("r", "m"):  # views and foreign tables have no ctid to split on
        return None
    n = partitions if partitions is not None else _auto_partitions(main, pages)
    n = max(1, min(n, max(pages, 1)))
    if n == 1:
        return None
    snapshot = _run(main, "exporting the snapshot", "SELECT pg_export_snapshot()").fetchone()[0]

    def join(_: int) -> Any:
        conn = _connect(conninfo)
        try:
            _run(conn, "starting a partition transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            _run(conn, "importing the snapshot", sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        except BaseException:
            conn.close()
            raise
        return conn

    with ThreadPoolExecutor(max_workers=n - 1) as pool:
        futures = [pool.submit(join, i) for i in range(n - 1)]
        for f in futures:  # keep every connection that opened, so the caller closes them all
            if f.exception() is None:
                extra.append(f.result())
        for f in futures:
            f.result()
    conns = [main, *extra]
    return [(c, _copy_sql(main, _partition_select(plan, a, b))) for c, (a, b) in zip(conns, _ranges(pages, n))]


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
    numeric: str = "float64",
    stats: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Any:
    """Write a PostgreSQL query result or table to an Arrow IPC file (PG-Strom's ``pg2arrow``).

    The rows are read exactly as :func:`read_postgres` reads them (same types, partitions on one
    snapshot) into host memory, then written by :func:`pystrom.write_arrow`: record batches of
    ``batch_rows`` rows, each with min/max statistics in PG-Strom's ``min_max_stats.<column>`` keys,
    so ``scan_arrow(where=...)`` (and PG-Strom's Arrow_Fdw) can skip batches. The whole result is
    held in host memory once while it is written.

    Parameters
    ----------
    conninfo, query, table, columns, where, params, partitions, numeric, progress
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
        numeric=numeric,
        device="cpu",
        progress=progress,
    )
    with result:
        return write_arrow(result, path, batch_rows=batch_rows, stats=stats)
