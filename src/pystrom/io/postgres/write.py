"""``write_postgres``: a Table into a PostgreSQL table at COPY FROM speed, all or nothing.

In order:

1. Arguments; the columns written and the PostgreSQL type of each (:mod:`.ddl`).
2. The encoder's sizes pass over every row (:mod:`.encode` on the CPU, :mod:`.encode_device` on a
   GPU): a value PostgreSQL cannot take raises here, before anything is sent; the row starts cut the
   rows into chunks.
3. The target: which schema it is (or will be) in, whether it exists; ``if_exists`` decides.
4. On a DSN: a staging table ``_pystrom_w_<backend pid>_<hex>`` in the target's schema (a plain table
   for a new or replaced target, UNLOGGED for an append), filled by ``partitions`` connections (the
   first one among them), each running one ``COPY ... FROM STDIN (FORMAT BINARY)`` and taking chunks
   from one queue, the GIL released while they encode and send. Then one transaction on the first
   connection puts the rows in place: ``DROP TABLE IF EXISTS target`` (replace) and ``ALTER TABLE
   staging RENAME TO target``, or ``INSERT INTO target SELECT ... FROM staging`` (append). The staging
   table is dropped in a ``finally`` whatever happened (from a new connection if the first one died).
   On a user's psycopg Connection: one stream inside ``conn.transaction()`` (a savepoint when their
   transaction is open), DDL and COPY in it, an append through a temporary table.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from ..._progress import check_progress, reporter
from ..._settings import defaults
from ...errors import InvalidArgumentError, PostgresError
from ...table import Table
from .ddl import (
    PRE_ENCODED,
    EncodeKind,
    WriteColumn,
    check_write_order,
    copy_in_sql,
    create_table,
    insert_select,
    retarget,
    target_columns,
    target_name,
)
from .encode import Chunk, HostEncoder
from .encode_composed import pre_encode
from .pump import CopyInStream
from .session import auto_partitions, connect, psycopg_module, run_sql

__all__ = ["write_postgres", "STAGING_PREFIX"]

STAGING_PREFIX = "_pystrom_w_"  # staging tables: _pystrom_w_<pid of the writing backend>_<8 hex digits>
_MODES = ("fail", "append", "replace")
_LEAST_CHUNK = 256 << 10


def write_postgres(
    table: Any,
    conninfo: Any,
    name: str | Sequence[str],
    *,
    if_exists: str = "fail",
    columns: Sequence[str] | None = None,
    partitions: int | None = None,
    progress: bool | Callable[[int], None] | None = None,
    vector: bool | Sequence[str] = False,
) -> int:
    """Write a Table (on a GPU or the CPU), a pandas DataFrame or a pyarrow Table into a PostgreSQL
    table, all or nothing.

    The rows are encoded into PostgreSQL's binary COPY format (by a CUDA kernel for a table on a
    GPU, by C++ on the CPU) and sent by ``COPY ... FROM STDIN (FORMAT BINARY)`` over ``partitions``
    connections in parallel into a staging table, which one transaction then puts in place; a
    failure anywhere (a constraint violation, a lost connection, Ctrl-C) leaves the target as it
    was and no staging table behind. See "Writing to PostgreSQL" in ``docs/postgres.md``.

    Parameters
    ----------
    table
        The :class:`~pystrom.Table` to write, or a pandas DataFrame or pyarrow Table (taken through
        Arrow as :meth:`pystrom.Table.from_arrow` takes it, onto the CPU: the index is not written, and
        NaN in a float column of a DataFrame is NULL, as pandas means it). Every pystrom type has a
        PostgreSQL type: bool, int8/16 -> smallint, uint16/int32 -> integer, uint32/int64 -> bigint, uint64 ->
        numeric(20, 0), float16/32 -> real, float64 -> double precision, decimal128(p, s) ->
        numeric(p, s), date32/64 -> date, timestamp -> timestamp (timestamptz with a time zone),
        time -> time, duration -> interval, string -> text, binary and fixed_size_binary -> bytea,
        uuid -> uuid, month_day_nano_interval -> interval, list<T> and fixed_size_list<T>[d] ->
        one-dimensional T[] (T as above; NULL elements kept). The largest and smallest dates and
        timestamps (how ``read_postgres`` reads ±infinity) are written as ±infinity. Into an existing
        table (``"append"``, ``"replace"``) a fixed_size_list<float32|float16> column whose target
        column is a pgvector ``vector``/``halfvec`` is sent as one, and a binary column whose target
        is ``bit``/``varbit`` as PostgreSQL's binary form of the bits (as ``read_postgres`` reads them).
    conninfo
        A libpq connection string or URI, or an open ``psycopg.Connection``. With a connection the
        write runs on it as one stream inside ``conn.transaction()``: a savepoint within the
        transaction it has open (commit it as after any statement), or a transaction of its own on
        an autocommit connection. On failure that savepoint or transaction is rolled back and the
        connection is usable.
    name
        The target table: a string is one identifier taken literally (``'we"ird name'`` works); a
        tuple ``('schema', 'name')`` qualifies it. An unqualified name that does not exist is created
        in ``current_schema()``.
    if_exists
        What to do when the target exists: ``"fail"`` (default: raise before anything is written),
        ``"append"`` (insert the rows; the target's column types may differ: values are assigned
        with PostgreSQL's assignment casts, and its constraints, defaults and triggers apply),
        ``"replace"`` (drop it and put a new table of the written columns in its place). A target
        that does not exist is created in every mode.
    columns
        The table's columns to write, in this order (default: all).
    partitions
        Connections sending in parallel (a DSN only). None picks from the encoded size and the
        server's cores (``pystrom.defaults.pg_partitions`` caps it), like ``read_postgres``.
    progress
        As for :func:`read_postgres` (rows sent).
    vector
        True: send every fixed_size_list<float32> (float16) column, e.g. a 2-D (n, d) float32 array
        given to ``Table.from_arrays``, as a pgvector ``vector(d)`` (``halfvec(d)``) column; a list of
        column names: those columns (each must be one). NaN, infinities and NULL elements raise
        :class:`DataError` naming the row (pgvector refuses them). The server needs pgvector.

    Returns
    -------
    int
        The number of rows written.

    Raises
    ------
    InvalidArgumentError
        Bad arguments, or the target exists and ``if_exists="fail"``.
    DataError
        A value PostgreSQL cannot take (a date after 5874897 AD...), naming column and row; raised
        before anything is sent.
    PostgresError
        Connection failures, SQL errors, constraint violations, a connection lost during the write.
        The target is unchanged.
    """
    psycopg = psycopg_module("write_postgres")
    check_write_order(table, conninfo, name, psycopg)
    if if_exists not in _MODES:
        raise InvalidArgumentError(f"if_exists must be 'fail', 'append' or 'replace'; got {if_exists!r}")
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise InvalidArgumentError(f"partitions must be a positive int or None; got {partitions!r}")
    check_progress(progress)
    schema, rel = target_name(name)
    user_conn = isinstance(conninfo, psycopg.Connection)
    if not user_conn and not isinstance(conninfo, str):
        raise InvalidArgumentError(
            f"conninfo must be a connection string/URI or a psycopg.Connection; got {type(conninfo).__name__}"
        )
    if user_conn and conninfo.closed:
        raise PostgresError("the psycopg connection passed to write_postgres is closed")
    if not isinstance(table, Table):  # a DataFrame or pyarrow table: through Arrow onto the CPU, freed after
        with Table.from_arrow(table, device="cpu") as converted:
            return write_postgres(converted, conninfo, name, if_exists=if_exists, columns=columns,
                                  partitions=partitions, progress=progress, vector=vector)  # fmt: skip
    cols = target_columns(table, columns, vector)
    encoded = None
    if any(c.kind == EncodeKind.VARLEN and c.param == PRE_ENCODED for c in cols):
        # text arrays, ranges and composites in their binary form (a copy of the table), as the server's types say
        from psycopg import sql

        ident = sql.Identifier(rel) if schema is None else sql.Identifier(schema, rel)
        if user_conn:  # the lookups in a transaction (or savepoint) of their own: the user's state stays as it was
            with conninfo.transaction():
                cols, encoded = pre_encode(table, cols, conninfo, ident)
        else:
            with connect(conninfo) as conn:
                cols, encoded = pre_encode(table, cols, conn, ident)
    if encoded is not None:
        with encoded:
            return _write_encoded(encoded, conninfo, schema, rel, cols, if_exists, partitions, progress, user_conn)
    return _write_encoded(table, conninfo, schema, rel, cols, if_exists, partitions, progress, user_conn)


def _write_encoded(
    table: Any, conninfo: Any, schema: Any, rel: str, cols: list[WriteColumn], if_exists: str, partitions: Any,
    progress: Any, user_conn: bool,
) -> int:  # fmt: skip
    if table._backend.kind == "cuda":
        from .encode_device import DeviceEncoder

        encoder: Any = DeviceEncoder(table, cols)
    else:
        encoder = HostEncoder(table, cols)
    try:
        # Every value checked before a connection opens; the row starts stay with the encoder (on a
        # GPU: device memory that close() gives back, which no frame of a traceback may hold).
        total = int(encoder.starts()[table.num_rows])
        nrows = table.num_rows
        with reporter(progress, unit="rows", desc="write_postgres", total=nrows) as report:
            sent = _Progress(report if report.active else None)
            if user_conn:
                return _write_on_connection(conninfo, schema, rel, cols, if_exists, encoder, total, sent)
            return _write_on_dsn(conninfo, schema, rel, cols, if_exists, partitions, encoder, total, sent)
    finally:
        encoder.close()


class _Progress:
    """Running total of rows sent, from any writer thread."""

    def __init__(self, report: Callable[[int], None] | None):
        self._report = report
        self._rows = 0
        self._lock = threading.Lock()

    def __call__(self, rows: int) -> None:
        if self._report is not None:
            with self._lock:
                self._rows += rows
                self._report(self._rows)


def _locate(conn: Any, schema: str | None, rel: str) -> tuple[str, bool]:
    """(the target's schema, whether it exists): an unqualified name is looked up on the search path,
    and created in current_schema() when it is not there."""
    from psycopg import sql

    ident = sql.Identifier(rel) if schema is None else sql.Identifier(schema, rel)
    row = run_sql(
        conn,
        "looking up the target table",
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
        (ident.as_string(conn),),
    ).fetchone()
    if row is not None:
        return row[0], True
    if schema is not None:
        return schema, False
    current = run_sql(conn, "finding the current schema", "SELECT current_schema()").fetchone()[0]
    if current is None:
        raise PostgresError(
            f"no schema to create {rel!r} in: the search_path names no existing schema; pass name=('schema', {rel!r})"
        )
    return current, False


def _retarget(
    conn: Any, schema: str, rel: str, cols: list[WriteColumn], encoder: Any, total: int
) -> tuple[list[WriteColumn], int]:
    """The columns as sent into the existing target (:func:`.ddl.retarget`): when a column's target type
    changes how it is sent (vector, varbit), the encoder is reset and its sizes pass runs again."""
    from psycopg import sql

    table = encoder.table
    candidates = [c.name for c in cols if c.kind in (EncodeKind.ARRAY, EncodeKind.VARLEN)]
    if not candidates:
        return cols, total
    rows = run_sql(
        conn,
        "looking up the target's column types",
        "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY(%s)",
        (sql.Identifier(schema, rel).as_string(conn), candidates),
    ).fetchall()
    new = retarget(cols, table, dict(rows))
    if new == cols:
        return cols, total
    encoder.reset(new)
    return new, int(encoder.starts()[table.num_rows])


def _check_mode(schema: str, rel: str, exists: bool, if_exists: str) -> None:
    if exists and if_exists == "fail":
        raise InvalidArgumentError(
            f"table {schema}.{rel} already exists (if_exists='fail'): pass if_exists='append' or 'replace'"
        )


def _chunks(encoder: Any, total: int, n: int) -> list[Chunk]:
    """Chunks small enough that each connection takes several (they end together), at most
    ``defaults.pg_write_chunk`` bytes."""
    size = max(_LEAST_CHUNK, min(defaults.pg_write_chunk, -(-total // (4 * n))))
    return encoder.chunks(size)


def _send(
    conn: Any, copy_text: str, take: Callable[[], Chunk | None], encoder: Any, stop: threading.Event, sent: Any
) -> int:
    """One COPY FROM STDIN on ``conn``: encode and send chunks from ``take`` until none are left;
    the rows the server took. ``stop`` set by another writer (or the caller) ends it with a failure."""
    stream = CopyInStream(conn)
    buf = None
    lock = getattr(conn, "lock", None)  # psycopg's own lock: nobody else uses the connection meanwhile
    if lock is not None:
        lock.acquire()
    try:
        stream.start(copy_text)
        while not stop.is_set():
            chunk = take()
            if chunk is None:
                return stream.finish()
            if buf is None or buf.size < chunk.nbytes:  # the first chunk is the largest but for single big rows
                buf = encoder.buffer(chunk.nbytes)
            encoder.encode(chunk, buf)
            stream.put(buf, chunk.nbytes)
            sent(chunk.end - chunk.begin)
        raise _Stopped
    finally:
        if stream.active:  # a failure here or elsewhere, or Ctrl-C: the server rolls the COPY back
            stream.abort("pystrom: write_postgres stopped before the end of its rows")
        if lock is not None:
            lock.release()


class _Stopped(Exception):
    """A writer stopped because another one failed (the other's error is the one reported)."""


def _set_utf8(conn: Any) -> str | None:
    """Send text as UTF-8 (the table's strings are); the encoding to restore, or None if it already was."""
    old = conn.pgconn.parameter_status(b"client_encoding")
    if old is not None and old.decode().upper().replace("-", "") in ("UTF8", "UNICODE"):
        return None
    run_sql(conn, "setting client_encoding", "SET client_encoding TO 'UTF8'")
    return old.decode() if old is not None else "SQL_ASCII"


def _write_on_dsn(
    conninfo: str,
    schema: str | None,
    rel: str,
    cols: list[WriteColumn],
    if_exists: str,
    partitions: int | None,
    encoder: Any,
    total: int,
    sent: Any,
) -> int:
    from psycopg import sql

    main = connect(conninfo)
    extra: list[Any] = []
    staging = None
    try:
        schema, exists = _locate(main, schema, rel)
        _check_mode(schema, rel, exists, if_exists)
        if exists:
            cols, total = _retarget(main, schema, rel, cols, encoder, total)
        _set_utf8(main)
        n = partitions if partitions is not None else auto_partitions(main, total // 8192)
        chunks = _chunks(encoder, total, n)
        n = max(1, min(n, len(chunks)))
        pid = main.info.backend_pid
        staging = sql.Identifier(schema, f"{STAGING_PREFIX}{pid}_{secrets.token_hex(4)}")
        append = exists and if_exists == "append"
        # A new or replacing table is loaded where it will stay (renamed into place: one write of the
        # rows, WAL-logged like the target); an append loads an UNLOGGED table (no WAL) and copies it.
        run_sql(main, "creating the staging table", create_table(staging, cols, unlogged=append))
        rows = _parallel_copy(conninfo, main, extra, copy_in_sql(main, staging, cols), chunks, n, encoder, sent)
        target = sql.Identifier(schema, rel)
        psycopg = psycopg_module()
        try:
            with main.transaction():
                if append:
                    run_sql(main, f"appending the rows to {schema}.{rel}", insert_select(target, staging, cols))
                else:
                    if if_exists == "replace":
                        run_sql(
                            main, f"dropping the old {schema}.{rel}", sql.SQL("DROP TABLE IF EXISTS {}").format(target)
                        )
                    run_sql(
                        main,
                        f"renaming the staging table to {schema}.{rel}",
                        sql.SQL("ALTER TABLE {} RENAME TO {}").format(staging, sql.Identifier(rel)),
                    )
                    staging = None  # it is the target now
        except psycopg.Error as exc:  # the ROLLBACK itself failed: the connection is gone
            raise PostgresError(f"PostgreSQL, while finishing the write: {' '.join(str(exc).split())}") from exc
        return rows
    finally:
        for conn in extra:
            conn.close()
        if staging is not None:
            _drop(conninfo, main, staging)
        main.close()


def _drop(conninfo: str, main: Any, staging: Any) -> None:
    """Drop the staging table: on the first connection, or a new one if that one is gone. Best effort:
    the error being raised is the one the caller needs; a table left behind keeps its telling name."""
    from psycopg import sql

    psycopg = psycopg_module()
    stmt = sql.SQL("DROP TABLE IF EXISTS {}").format(staging)
    conn = main
    try:
        if conn.closed or conn.broken:
            conn = psycopg.connect(conninfo, autocommit=True)
        try:
            conn.execute(stmt)
        finally:
            if conn is not main:
                conn.close()
    except (psycopg.Error, PostgresError):
        pass


def _parallel_copy(
    conninfo: str,
    main: Any,
    extra: list[Any],
    copy_text: str,
    chunks: list[Chunk],
    n: int,
    encoder: Any,
    sent: Any,
) -> int:
    """``n`` connections (``main`` and n - 1 new ones, opened by the threads that use them) each run one
    COPY, taking chunks from one queue; a failure or Ctrl-C stops and rolls back them all. No cancel
    request is sent: one that lands while the server reads a CopyData message can leave client and
    server each waiting for the other (seen here: the backend idle in ClientRead, libpq in PQgetResult)."""
    queue = iter(chunks)
    lock = threading.Lock()
    stop = threading.Event()

    def take() -> Chunk | None:
        with lock:
            return next(queue, None)

    def work(first: bool) -> int:
        try:
            if first:
                conn = main
            else:
                conn = connect(conninfo)
                with lock:
                    extra.append(conn)
                _set_utf8(conn)
            return _send(conn, copy_text, take, encoder, stop, sent)
        except BaseException:
            stop.set()  # the others send no further chunk
            raise

    if n == 1:
        return work(True)
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="pystrom-pg-write") as pool:
        futures = [pool.submit(work, i == 0) for i in range(n)]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:
            # A writer failed, or Ctrl-C here: the others stop before their next chunk (a few MiB at
            # most: the server reads a COPY as fast as it comes) and end their COPY with CopyFail.
            if any(f.done() and f.exception() is not None for f in futures) or not all(f.done() for f in futures):
                stop.set()
                for f in futures:
                    f.exception()
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:  # the failure itself, not a writer that stopped because of it
            raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])
        return sum(f.result() for f in futures)


def _write_on_connection(
    conn: Any,
    schema: str | None,
    rel: str,
    cols: list[WriteColumn],
    if_exists: str,
    encoder: Any,
    total: int,
    sent: Any,
) -> int:
    """One stream on the user's connection, inside ``conn.transaction()``."""
    from psycopg import pq, sql

    if conn.info.transaction_status == pq.TransactionStatus.INERROR:
        raise PostgresError("the psycopg connection passed to write_postgres is in a failed transaction: roll it back")
    schema, exists = _locate(conn, schema, rel)
    _check_mode(schema, rel, exists, if_exists)
    if exists:
        cols, total = _retarget(conn, schema, rel, cols, encoder, total)
    target = sql.Identifier(schema, rel)
    chunks = _chunks(encoder, total, 1)
    queue = iter(chunks)
    stop = threading.Event()
    psycopg = psycopg_module()
    try:
        with conn.transaction():
            restore = _set_utf8(conn)  # undone by the rollback on failure
            if exists and if_exists == "append":
                # A temporary table, then INSERT ... SELECT: the same assignment casts as a DSN append.
                dest = sql.Identifier("pg_temp", f"{STAGING_PREFIX}{conn.info.backend_pid}_{secrets.token_hex(4)}")
                run_sql(conn, "creating the staging table", create_table(dest, cols))
            else:
                if exists:
                    run_sql(conn, f"dropping the old {schema}.{rel}", sql.SQL("DROP TABLE {}").format(target))
                run_sql(conn, f"creating {schema}.{rel}", create_table(target, cols))
                dest = target
            rows = _send(conn, copy_in_sql(conn, dest, cols), lambda: next(queue, None), encoder, stop, sent)
            if dest is not target:
                run_sql(conn, f"appending the rows to {schema}.{rel}", insert_select(target, dest, cols))
                run_sql(conn, "dropping the staging table", sql.SQL("DROP TABLE {}").format(dest))
            if restore is not None:
                run_sql(
                    conn, "restoring client_encoding", sql.SQL("SET client_encoding TO {}").format(sql.Literal(restore))
                )
    except psycopg.Error as exc:  # the ROLLBACK itself failed: the connection is gone
        raise PostgresError(f"PostgreSQL, while writing: {' '.join(str(exc).split())}") from exc
    return rows
