"""Connections, snapshots and partition planning for the PostgreSQL loader (psycopg's public API only).

Partitions of one read all run in REPEATABLE READ READ ONLY on the snapshot the first connection
exports (``pg_export_snapshot()`` / ``SET TRANSACTION SNAPSHOT``), so together they equal a single
read whatever others write meanwhile. A ``table=`` read splits by ctid ranges over the relation's
pages (the last range open-ended); a ``query=`` read with ``partition_on=`` splits an integer
column's [min, max] into equal ranges (ConnectorX's scheme; NULL keys go to the first range).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from .._settings import defaults
from ..errors import PostgresError

__all__ = [
    "Plan",
    "SnapshotJoiner",
    "psycopg_module",
    "connect",
    "run_sql",
    "copy_sql",
    "table_range_jobs",
    "key_range_jobs",
]

_PAGES_PER_PARTITION = 1024  # 8 MiB of heap at least per connection: below that a connection costs more than it saves
# Ranges per connection: the connections take ranges from one queue, so the ones that run faster read
# more. With one range each, equal ranges of the seed's 10M-row table ended between 216 and 409 ms
# on the GPU machine (16 backends and 16 reader threads sharing 16 cores unevenly), while the server
# alone read it all in 300 ms.
_RANGES_PER_CONNECTION = 4
_MAX_AUTO_PARTITIONS = 16
_LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")


@dataclass
class Plan:
    select: Any  # psycopg.sql.Composable: the SELECT without partition predicates
    table: Any = None  # psycopg.sql.Identifier of the relation (table= reads)
    columns: Any = None  # composed column list
    where: Any = None  # composed user predicate or None


def psycopg_module() -> Any:
    try:
        import psycopg
    except ImportError:
        raise PostgresError("read_postgres needs psycopg: pip install 'psycopg[binary]'") from None
    return psycopg


def _masked(conninfo: str) -> str:
    """The conninfo without its password, for messages."""
    psycopg = psycopg_module()
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "<unparsable conninfo>"
    params.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in params.items()) or "<defaults>"


def connect(conninfo: str) -> Any:
    psycopg = psycopg_module()
    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.Error as exc:
        raise PostgresError(f"cannot connect to PostgreSQL ({_masked(conninfo)}): {_flat(exc)}") from exc


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


def _ranges(pages: int, n: int) -> list[tuple[int, int | None]]:
    """``n`` ctid page ranges covering the relation; the last is open-ended (pages added later)."""
    bounds = [pages * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] if i + 1 < n else None) for i in range(n)]


def _range_statements(conn: Any, plan: Plan, ranges: list[tuple[int, int | None]]) -> list[str]:
    """The COPY statement of each ctid range. The columns, the table and the user's predicate are
    composed once by psycopg.sql; only the page numbers, ints of our own, differ between ranges
    (composing all of every statement took ~2 ms for the 64 ranges of a 16-connection read)."""
    from psycopg import sql

    head = sql.SQL("COPY (SELECT {} FROM {} WHERE ").format(plan.columns, plan.table).as_string(conn)
    tail = ") TO STDOUT (FORMAT BINARY)"
    if plan.where is not None:
        tail = sql.SQL(" AND ({})").format(plan.where).as_string(conn) + tail
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
    """(connections, COPY statements of the ctid ranges): ``main`` and SnapshotJoiners that open the
    others on its snapshot, several ranges per connection; None when one stream is all it takes."""
    from psycopg import sql

    row = run_sql(
        main,
        "sizing the table",
        sql.SQL(
            "SELECT c.relkind, pg_relation_size(c.oid) / current_setting('block_size')::bigint, "
            "current_setting('block_size')::bigint "
            "FROM pg_class c WHERE c.oid = {}::regclass"
        ).format(sql.Literal(plan.table.as_string(main))),
    ).fetchone()
    relkind, pages, block = row[0], int(row[1]), int(row[2])
    if relkind not in ("r", "m"):  # views and foreign tables have no ctid to split on
        return None
    n = partitions if partitions is not None else auto_partitions(main, pages)
    n = max(1, min(n, max(pages, 1)))
    if n == 1:
        return None
    conns = _snapshot_joiners(conninfo, main, n, extra)
    ranges = _ranges(pages, min(pages, n * _RANGES_PER_CONNECTION))
    # A range's heap bytes: binary COPY of the same rows is usually smaller (no tuple headers, no
    # line pointers), so one staging buffer of that size mostly holds the range (TOASTed values,
    # stored apart from the heap, are the exception: their range fills a few buffers).
    hints = [((b if b is not None else pages) - a) * block for a, b in ranges]
    return conns, _range_statements(main, plan, ranges), hints


def key_range_jobs(
    conninfo: str, main: Any, plan: Plan, key: str, partitions: int | None, extra: list
) -> tuple[list, list[str], list[int | None]] | None:
    """Split a query on an integer column's [min, max] (ConnectorX's scheme), several ranges per
    connection: (``main`` and SnapshotJoiners, COPY statements); None when one stream is all it takes."""
    from psycopg import sql

    q = sql.SQL("({}) AS _pystrom_q").format(plan.select)
    col = sql.SQL("_pystrom_q.{}").format(sql.Identifier(key))
    lo, hi = run_sql(
        main, f"finding the range of {key!r}", sql.SQL("SELECT min({}), max({}) FROM {}").format(col, col, q)
    ).fetchone()
    if lo is None:  # no rows, or only NULL keys
        return None
    lo, hi = int(lo), int(hi)
    n = partitions if partitions is not None else auto_partitions(main, None)
    n = max(1, min(n, hi - lo + 1))
    if n == 1:
        return None
    r = min(hi - lo + 1, n * _RANGES_PER_CONNECTION)
    bounds = [lo + (hi - lo + 1) * i // r for i in range(r + 1)]
    conns = _snapshot_joiners(conninfo, main, n, extra)
    statements = []
    for i in range(r):
        preds = [sql.SQL("{} >= {}").format(col, sql.Literal(bounds[i]))]
        if i + 1 < r:
            preds.append(sql.SQL("{} < {}").format(col, sql.Literal(bounds[i + 1])))
        cond = sql.SQL(" AND ").join(preds)
        if i == 0:
            cond = sql.SQL("({}) OR {} IS NULL").format(cond, col)
        statements.append(copy_sql(main, sql.SQL("SELECT * FROM {} WHERE {}").format(q, cond)))
    return conns, statements, [None] * len(statements)


def _snapshot_joiners(conninfo: str, main: Any, n: int, extra: list) -> list:
    """``main`` and n - 1 SnapshotJoiners on the snapshot ``main`` exports now."""
    snapshot = run_sql(main, "exporting the snapshot", "SELECT pg_export_snapshot()").fetchone()[0]
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
        from psycopg import sql

        conn = connect(self._conninfo)
        with self._lock:
            self._extra.append(conn)
        run_sql(conn, "starting a partition transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        run_sql(
            conn, "importing the snapshot", sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(self._snapshot))
        )
        return conn
