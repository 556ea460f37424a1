"""The public PostgreSQL readers: ``read_postgres`` (into a Table) and ``postgres_to_arrow`` (into a file).

Arguments are checked here, then each stage of the path runs once, in order: the statement is
composed (:mod:`.statement`) and its columns mapped (:mod:`.types`); the connections open on one
snapshot and the read is split into ranges (:mod:`.session`); the COPY streams run (:mod:`.stream`);
the Table is allocated and the chunks decoded into it (:mod:`.assemble`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..._progress import check_progress
from ...errors import InvalidArgumentError, PostgresError
from ...memory.backend import resolve_device
from ...table import Table
from ..arrow.codecs.compress import check_compression
from ..arrow.write.write import write_arrow
from .arrays import array_columns
from .assemble import assemble
from .columns import PgColumn, leaf_columns
from .pump import Kind
from .session import connect, copy_sql, key_range_jobs, psycopg_module, run_sql, table_range_jobs, utf8_session
from .statement import check_read_arguments, compose
from .stream import read_all
from .types import check_partition_key, describe_read

__all__ = ["read_postgres", "postgres_to_arrow"]


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
        server error its transaction is failed, as with any failed statement: roll it back). Its
        client encoding is set to UTF8 for the read and back afterwards (the loader's own
        connections always use UTF8), so text from a database in any encoding arrives as UTF-8.
    query
        A SELECT (or anything ``COPY (query) TO STDOUT`` accepts), a string or a ``psycopg.sql``
        object, written as for psql (trailing semicolons and comments are fine). ``params`` are
        bound on the client (COPY takes no server-side parameters).
    table
        Instead of ``query``: a table or materialized view. A string is one identifier taken
        literally (``'we"ird name'`` works); a tuple ``('schema', 'name')`` qualifies it. A string
        with a dot that no relation has as its name is read as SQL reads a qualified name
        (``'public.orders'``, ``'"My Schema".orders'``) when that relation exists.
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
        text/varchar/bpchar/name -> string, bytea -> binary, uuid -> uuid; one-dimensional arrays
        of bool/int2/int4/int8/float4/float8 -> fixed_size_list<T>[d] when every non-NULL array has
        the same length d >= 1, else list<T> (decided from counts taken while streaming; lower bounds
        ignored; multi-dimensional arrays raise naming the row). PostgreSQL's +-infinity dates and
        timestamps become the type's largest and smallest values. Other types raise
        :class:`~pystrom.errors.UnsupportedTypeError` naming the column and the cast to add.

    Raises
    ------
    PostgresError
        Connection failures, SQL errors, permissions, a connection lost during the read. No partial
        table is returned.
    """
    psycopg = psycopg_module("read_postgres")
    check_read_arguments(query, table, columns, where, numeric, partition_on)
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise InvalidArgumentError(f"partitions must be a positive int or None; got {partitions!r}")
    check_progress(progress)
    backend = resolve_device(device)

    if isinstance(conninfo, psycopg.Connection):
        if conninfo.closed:
            raise PostgresError("the psycopg connection passed to read_postgres is closed")

        def on_connection(arrays: str) -> Table:
            with utf8_session(conninfo):
                plan = compose(conninfo, query, table, columns, where, params)
                plan, cols = describe_read(conninfo, plan, numeric, run_sql, arrays)
                jobs = [conninfo], [copy_sql(conninfo, plan.select)], [None]
                chunks = read_all(backend, len(leaf_columns(cols)), jobs, progress, _strings(cols), array_columns(cols))
            return assemble(backend, cols, chunks)

        return _with_shapes(on_connection)
    if not isinstance(conninfo, str):
        raise InvalidArgumentError(
            f"conninfo must be a connection string/URI or a psycopg.Connection; got {type(conninfo).__name__}"
        )

    main = connect(conninfo)
    extra: list[Any] = []
    try:
        run_sql(main, "starting the read transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

        def on_snapshot(arrays: str) -> Table:
            plan = compose(main, query, table, columns, where, params)
            plan, cols = describe_read(main, plan, numeric, run_sql, arrays)
            if partition_on is not None:
                check_partition_key(cols, partition_on)
            jobs = [main], [copy_sql(main, plan.select)], [None]
            if partitions != 1 and plan.table is not None:
                jobs = table_range_jobs(conninfo, main, plan, partitions, extra) or jobs
            elif partitions != 1 and partition_on is not None:
                jobs = key_range_jobs(conninfo, main, plan, partition_on, partitions, extra) or jobs
            chunks = read_all(backend, len(leaf_columns(cols)), jobs, progress, _strings(cols), array_columns(cols))
            return assemble(backend, cols, chunks)

        return _with_shapes(on_snapshot)
    finally:
        for conn in [*extra, main]:
            conn.close()  # read-only transactions: nothing to commit


def _with_shapes(read: Callable[[str], Table]) -> Table:
    """``read("rows")``, the array columns settled by the rows read; where an array column holds
    multi-dimensional arrays (found only while decoding), ``read("server")``: the server is asked the
    arrays' shape first (one scan of the result) and they are read flattened, as nested fixed_size_lists."""
    try:
        return read("rows")
    except PostgresError as exc:
        if not getattr(exc, "multi_dimensional", False):
            raise
    return read("server")


def _strings(cols: Sequence[PgColumn]) -> dict[int, str]:
    """The string columns by index, named for messages (the streams count their bytes)."""
    return {i: f"{c.name!r} ({c.pg_type})" for i, c in enumerate(leaf_columns(cols)) if c.kind == Kind.VARLEN}


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
    compression: str | None = None,
    compression_level: int | None = None,
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
    compression, compression_level
        As for :func:`pystrom.write_arrow`: None, ``"lz4"`` or ``"zstd"`` record batch bodies.

    Returns
    -------
    WriteSummary
        path, num_rows, num_batches, bytes_written.
    """

    psycopg_module("postgres_to_arrow")
    check_compression(compression, compression_level)  # before the read, not after it
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
        return write_arrow(
            result,
            path,
            batch_rows=batch_rows,
            stats=stats,
            compression=compression,
            compression_level=compression_level,
        )
