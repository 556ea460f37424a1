"""Connections, snapshots and partition planning for the PostgreSQL loader (psycopg's public API only).

Partitions of one read all run in REPEATABLE READ READ ONLY on the snapshot the first connection
exports (``pg_export_snapshot()`` / ``SET TRANSACTION SNAPSHOT``), so together they equal a single
read whatever others write meanwhile. A ``table=`` read splits by ctid ranges over the relation's
pages (the last range open-ended), a ``query=`` read with ``partition_on=`` an integer column's
[min, max] (ConnectorX's scheme; NULL keys go to the first range); either way in decreasing ranges
that the connections take from one queue (_split).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..._settings import defaults
from ...errors import PostgresError
from .statement import Plan

__all__ = [
    "SnapshotJoiner",
    "equal_ranges",
    "queue_ranges",
    "psycopg_module",
    "connect",
    "utf8_session",
    "run_sql",
    "copy_sql",
    "table_range_jobs",
    "key_range_jobs",
    "export_snapshot",
    "join_snapshot",
    "table_pages",
    "ctid_statements",
    "key_bounds",
    "key_statements",
]

_PAGES_PER_PARTITION = 1024  # 8 MiB of heap at least per connection: below that a connection costs more than it saves
# How a read is cut into ranges (_split). With equal ranges, four per connection, the 16 connections
# of a 10M-row read on the GPU machine finished up to 70 ms apart (the last ranges, 1/64 of the
# table each, took ~60 ms). Decreasing ranges, each 1/(_SHARE n) of what is left, down to 1/(_TAIL n)
# of the table, finished within 10-20 ms of each other; against the server's own COPY (x16), in
# alternate runs: equal ranges 1.19-1.21x, _TAIL 16 1.15x, 32 1.13x, 64 1.11x (each range also
# costs a statement and an end of COPY, so the smallest is at least _LEAST_PAGES, 1 MiB of heap).
_SHARE = 1
_TAIL = 64
_LEAST_PAGES = 128
# A local server gets one connection per core up to _MAX_AUTO_PARTITIONS. 16 was the cap while the GPU
# machines had 16 cores; on 32 (2 x H200, 2026-11-28, alternate runs) 32 connections read the 10M-row
# logreg table into the GPU in 0.230-0.237 s against 0.298-0.316 s with 16, and 1M x vector(768) in
# 0.719-0.763 s against 0.949-0.993 s (the server's own COPY: x16 0.29-0.34 / 0.81-0.84 s, x32 0.18-0.19 /
# 0.52 s). More than 32 was not measured.
_MAX_AUTO_PARTITIONS = 32
_LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")


def psycopg_module(feature: str = "pystrom's PostgreSQL access") -> Any:
    """psycopg, or a MissingDependencyError naming ``feature`` (the public call) and the extra."""
    from ..._dist import require

    return require("psycopg", feature)


def _parsed(conninfo: str) -> dict | None:
    psycopg = psycopg_module()
    try:
        return psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return None


def _masked(conninfo: str) -> str:
    """The conninfo without its password, for messages."""
    params = _parsed(conninfo)
    if params is None:
        return "<unparsable conninfo>"
    params.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in params.items()) or "<defaults>"


def _connect_failure(conninfo: str, exc: BaseException) -> PostgresError:
    """The error for a failed connect, with no part of a password in it. libpq's parse errors quote
    the words of the string they stumble on (`password=two words` gives: missing "=" after "words"),
    so for a string libpq cannot parse only the kind of failure is told; otherwise libpq's message, with
    the password, should the server or libpq repeat it, blanked out."""
    params = _parsed(conninfo)
    if params is None:
        return PostgresError(
            "cannot connect to PostgreSQL: the connection string is malformed (libpq's message is not "
            "repeated, since it quotes the string, which may hold a password): check its key=value pairs "
            "and quoting, or use a postgresql:// URI"
        )
    message = _flat(exc)
    password = params.get("password")
    if password:
        message = message.replace(password, "***")
    return PostgresError(f"cannot connect to PostgreSQL ({_masked(conninfo)}): {message}")


def connect(conninfo: str) -> Any:
    """A connection of the loader's own. Its client encoding is UTF8 whatever the server's (or the
    DSN's, or PGCLIENTENCODING) is: the server converts text to UTF-8, which Arrow strings must be, and
    the query, ``where=`` and parameters are sent as UTF-8, which is how the pump sends them."""
    psycopg = psycopg_module()
    try:
        return psycopg.connect(conninfo, autocommit=True, client_encoding="UTF8")
    except psycopg.Error as exc:
        failure = _connect_failure(conninfo, exc)
    raise failure  # outside the handler: psycopg's error, which may quote the password, is not chained


@contextlib.contextmanager
def utf8_session(conn: Any) -> Iterator[None]:
    """A user's connection in client encoding UTF8 for the read (see :func:`connect`), set back
    afterwards. The SET runs in the user's transaction, if any: when the read fails it, the
    rollback the user must do anyway restores the encoding too."""
    psycopg = psycopg_module()
    old = conn.info.parameter_status("client_encoding")
    if old is None or old.upper() in ("UTF8", "UNICODE"):
        yield
        return
    run_sql(conn, "setting the client encoding to UTF8", "SET client_encoding TO 'UTF8'")
    try:
        yield
    finally:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR and not conn.closed:
            try:
                conn.execute("SELECT set_config('client_encoding', %s, false)", (old,))
            except psycopg.Error:
                pass  # the connection broke: there is nothing left to restore


def _flat(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def run_sql(conn: Any, what: str, statement: Any, args: Any = None) -> Any:
    psycopg = psycopg_module()
    try:
        return conn.execute(statement, args)
    except psycopg.Error as exc:
        raise PostgresError(f"PostgreSQL, while {what}: {_flat(exc)}") from exc


def copy_sql(conn: Any, select: Any) -> str:
    from psycopg import sql

    return sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(select).as_string(conn)


def auto_partitions(conn: Any, pages: int | None) -> int:
    """Connections for a read of ``pages`` heap pages (None: unknown, a query): the server's cores
    (this machine's for a local server, else max_worker_processes), at most 16, at least 8 MiB each,
    and no more than the free connection slots."""
    limit = defaults.pg_partitions
    if limit == 0:
        host = conn.info.host or ""
        if host in _LOCAL_HOSTS or host.startswith("/"):
            limit = min(os.cpu_count() or 1, _MAX_AUTO_PARTITIONS)  # the server shares this machine's cores
        else:
            row = run_sql(conn, "reading max_worker_processes", "SELECT current_setting('max_worker_processes')::int")
            limit = min(int(row.fetchone()[0]), _MAX_AUTO_PARTITIONS)
    row = run_sql(
        conn,
        "counting free connections",
        "SELECT current_setting('max_connections')::int - (SELECT count(*) FROM pg_stat_activity)",
    ).fetchone()
    free = int(row[0]) - 3  # leave a few for others (superuser slots are not ours to take)
    by_size = pages // _PAGES_PER_PARTITION if pages is not None else limit
    return max(1, min(limit, by_size, free))


def _split(total: int, n: int, least: int = 1) -> list[tuple[int, int]]:
    """[0, total) in consecutive ranges for n connections that take them from one queue, largest
    first: each range is a 1/(_SHARE n) share of what is left, down to total/(_TAIL n) or ``least``
    (guided self-scheduling). Connections that start late or run slow take fewer ranges, and the
    last ranges, being small, end close together."""
    smallest = max(1, least, total // (_TAIL * n))
    out, start = [], 0
    while start < total:
        size = max(smallest, -(-(total - start) // (_SHARE * n)))
        out.append((start, min(total, start + size)))
        start += size
    return out


def equal_ranges(total: int, n: int) -> list[tuple[int, int]]:
    """[0, total) in n ranges of (nearly) equal size, empty ones left out: the batches of a
    ``scan_postgres`` pass or the partitions of ``pystrom.dask.read_postgres``, one range each."""
    bounds = [total * i // n for i in range(n + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def queue_ranges(start: int, stop: int, n: int, pages: bool) -> list[tuple[int, int]]:
    """[start, stop) cut as :func:`_split` cuts a read for n connections (``pages``: heap pages, each
    range at least _LEAST_PAGES; else key values); [(start, start)] when it is empty."""
    return [(start + a, start + b) for a, b in _split(stop - start, n, _LEAST_PAGES if pages else 1)] or [
        (start, start)
    ]


def _ranges(pages: int, n: int) -> list[tuple[int, int | None]]:
    """ctid page ranges covering the relation for n connections; the last is open-ended (pages added later)."""
    out: list[tuple[int, int | None]] = list(_split(pages, n, _LEAST_PAGES))
    if out:
        out[-1] = (out[-1][0], None)
    return out


def ctid_statements(conn: Any, plan: Plan, ranges: list[tuple[int, int | None]]) -> list[str]:
    """The COPY statement of each ctid range. The columns, the table and the user's predicate are
    composed once by psycopg.sql; only the page numbers, ints of our own, differ between ranges
    (composing all of every statement took ~2 ms for the 64 ranges of a 16-connection read)."""
    from psycopg import sql

    head = sql.SQL("COPY (SELECT {} FROM {} WHERE ").format(plan.columns, plan.table).as_string(conn)
    tail = ") TO STDOUT (FORMAT BINARY)"
    if plan.where is not None:
        tail = sql.SQL(" AND ({}\n)").format(plan.where).as_string(conn) + tail  # \n: ends a -- comment
    out = []
    for start, stop in ranges:
        cond = f"ctid >= '({int(start)},0)'::tid"
        if stop is not None:
            cond += f" AND ctid < '({int(stop)},0)'::tid"
        out.append(head + cond + tail)
    return out


def table_range_jobs(
    conninfo: str, main: Any, plan: Plan, partitions: int | None, extra: list
) -> tuple[list, list[str], list[int | None]] | None:
    """(``main`` and SnapshotJoiners that open the others on its snapshot, the COPY statements of the
    ctid ranges, each range's heap bytes); None when one stream is all it takes."""
    pages, block = table_pages(main, plan)
    if pages is None:
        return None
    # how many: by every byte the read touches, the TOAST table's too (a vector(768) column lives
    # there: its heap is 2% of the table); where the ranges fall: by heap pages, the only ctids
    n = partitions if partitions is not None else auto_partitions(main, max(pages, toast_inclusive_pages(main, plan)))
    n = max(1, min(n, max(pages, 1)))
    if n == 1:
        return None
    conns = _snapshot_joiners(conninfo, main, n, extra)
    ranges = _ranges(pages, n)
    # A range's heap bytes: binary COPY of the same rows is usually smaller (no tuple headers, no
    # line pointers), so one staging buffer of that size mostly holds the range (TOASTed values,
    # stored apart from the heap, are the exception: their range fills a few buffers).
    hints = [((b if b is not None else pages) - a) * block for a, b in ranges]
    return conns, ctid_statements(main, plan, ranges), hints


def table_pages(main: Any, plan: Plan) -> tuple[int | None, int]:
    """(heap pages of a ``table=`` read's relation, the block size); pages None for relations without
    ctids to split on (views, foreign tables)."""
    from psycopg import sql

    row = run_sql(
        main,
        "sizing the table",
        sql.SQL(
            "SELECT c.relkind, pg_relation_size(c.oid), current_setting('block_size')::bigint "
            "FROM pg_class c WHERE c.oid = {}::regclass"
        ).format(sql.Literal(plan.table.as_string(main))),
    ).fetchone()
    relkind, block = row[0], int(row[2])
    if relkind not in ("r", "m"):  # views and foreign tables have no ctid to split on
        return None, block
    return int(row[1]) // block, block


def toast_inclusive_pages(main: Any, plan: Plan) -> int:
    """Pages of a ``table=`` read's relation with its TOAST table (pg_table_size, in blocks)."""
    from psycopg import sql

    row = run_sql(
        main,
        "sizing the table with its TOAST",
        sql.SQL("SELECT pg_table_size({}::regclass) / current_setting('block_size')::bigint").format(
            sql.Literal(plan.table.as_string(main))
        ),
    ).fetchone()
    return int(row[0])


def key_range_jobs(
    conninfo: str, main: Any, plan: Plan, key: str, partitions: int | None, extra: list
) -> tuple[list, list[str], list[int | None]] | None:
    """Split a query on an integer column's [min, max] (ConnectorX's scheme): (``main`` and
    SnapshotJoiners, the COPY statements of the key ranges, no size hints); None when one stream is all it takes."""
    bounds = key_bounds(main, plan, key)
    if bounds is None:  # no rows, or only NULL keys
        return None
    lo, hi = bounds
    n = partitions if partitions is not None else auto_partitions(main, None)
    n = max(1, min(n, hi - lo + 1))
    if n == 1:
        return None
    ranges = _split(hi - lo + 1, n)
    conns = _snapshot_joiners(conninfo, main, n, extra)
    statements = key_statements(main, plan, key, lo, ranges)
    return conns, statements, [None] * len(statements)


def _key_column(plan: Plan, key: str) -> tuple[Any, Any]:
    from psycopg import sql

    return sql.SQL("({}) AS _pystrom_q").format(plan.select), sql.SQL("_pystrom_q.{}").format(sql.Identifier(key))


def key_bounds(main: Any, plan: Plan, key: str) -> tuple[int, int] | None:
    """The [min, max] of a ``query=`` read's integer column ``key``; None when it has no non-NULL value."""
    from psycopg import sql

    q, col = _key_column(plan, key)
    lo, hi = run_sql(
        main, f"finding the range of {key!r}", sql.SQL("SELECT min({}), max({}) FROM {}").format(col, col, q)
    ).fetchone()
    return None if lo is None else (int(lo), int(hi))


def key_statements(
    main: Any, plan: Plan, key: str, lo: int, ranges: list[tuple[int, int]], nulls: bool = True, open_end: bool = True
) -> list[str]:
    """The COPY statement of each range of ``key`` (offsets from ``lo``); the first range also takes
    the NULL keys (unless ``nulls`` is false) and the last is open above (unless ``open_end`` is false:
    ranges that are a part of the whole, as a ``scan_postgres`` batch's are)."""
    from psycopg import sql

    q, col = _key_column(plan, key)
    r = len(ranges)
    statements = []
    for i, (a, b) in enumerate(ranges):
        preds = [sql.SQL("{} >= {}").format(col, sql.Literal(lo + a))]
        if i + 1 < r or not open_end:
            preds.append(sql.SQL("{} < {}").format(col, sql.Literal(lo + b)))
        cond = sql.SQL(" AND ").join(preds)
        if i == 0 and nulls:
            cond = sql.SQL("({}) OR {} IS NULL").format(cond, col)
        statements.append(copy_sql(main, sql.SQL("SELECT * FROM {} WHERE {}").format(q, cond)))
    return statements


def _snapshot_joiners(conninfo: str, main: Any, n: int, extra: list) -> list:
    """``main`` and n - 1 SnapshotJoiners on the snapshot ``main`` exports now."""
    snapshot = export_snapshot(main)
    lock = threading.Lock()
    return [main, *(SnapshotJoiner(conninfo, snapshot, extra, lock) for _ in range(n - 1))]


class SnapshotJoiner:
    """One more connection on an exported snapshot, opened when called: by the reader thread that
    will use it, so each connection starts reading as soon as it is ready, while the others still
    connect (joining 15 took ~20 ms on the GPU machine; the main connection reads meanwhile). The
    connection is appended to ``extra`` as soon as it exists, so the caller closes it even when the
    read fails."""

    def __init__(self, conninfo: str, snapshot: str, extra: list, lock: threading.Lock):
        self._conninfo = conninfo
        self._snapshot = snapshot
        self._extra = extra
        self._lock = lock

    def __call__(self) -> Any:
        conn = connect(self._conninfo)
        with self._lock:
            self._extra.append(conn)
        join_snapshot(conn, self._snapshot)
        return conn


def export_snapshot(main: Any) -> str:
    """The id of the snapshot of ``main``'s open REPEATABLE READ transaction: others can join it
    (:func:`join_snapshot`) for as long as that transaction stays open."""
    return run_sql(main, "exporting the snapshot", "SELECT pg_export_snapshot()").fetchone()[0]


def join_snapshot(conn: Any, snapshot: str) -> None:
    """Begin a REPEATABLE READ READ ONLY transaction on ``conn`` that sees the exported ``snapshot``."""
    from psycopg import sql

    run_sql(conn, "starting a partition transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    run_sql(conn, "importing the snapshot", sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
