"""``scan_postgres``: a PostgreSQL result as a stream of Tables, one range of it at a time.

A result larger than device memory can be filtered and reduced batch by batch. At construction the
arguments are checked and the result's columns described and mapped (:mod:`.statement`,
:mod:`.types`) on a short-lived connection, and ``where`` compiled for the device (UDFs allowed,
:mod:`pystrom._udf._where`). Each pass (each ``iter()``) then, in order: opens a connection of its
own and begins a REPEATABLE READ READ ONLY transaction; splits the read into ranges as
``pystrom.dask.read_postgres`` does (:mod:`.session`: ctid ranges for ``table=``, ranges of an
integer column for ``partition_on=``, equal in size); opens the other connections on the snapshot
it exports, so every range of the pass reads one snapshot, and cuts each range into shares for them
as ``read_postgres`` cuts a read; reads each range with the COPY pump (:mod:`.stream`) and decodes it
into a Table (:mod:`.assemble`) on a reader thread, one range ahead of the caller; filters it with
``where`` on the device and yields it. When the pass ends, fails or is abandoned, the range in flight
is cancelled on the server and waited for (its staging and device memory go with it), and the
connections are closed.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..._concat import concat
from ..._progress import check_progress, reporter
from ..._udf._where import compile_where_udf
from ...errors import ExpressionError, InvalidArgumentError, PostgresError, SchemaMismatchError
from ...memory.backend import resolve_device, stream_group_bytes
from ...table import Table
from .arrays import array_columns
from .assemble import assemble
from .columns import PgColumn, field_of, leaf_columns
from .pump import Kind
from .session import (
    SnapshotJoiner,
    auto_partitions,
    connect,
    copy_sql,
    ctid_statements,
    equal_ranges,
    export_snapshot,
    key_bounds,
    key_statements,
    psycopg_module,
    queue_ranges,
    run_sql,
    table_pages,
)
from .statement import check_read_arguments, compose
from .stream import CopyReader
from .types import check_partition_key, describe, describe_read

__all__ = ["scan_postgres", "PostgresScan", "PostgresScanStats"]

_APPLICATION_NAME = "pystrom.scan_postgres"
_PAGE_BYTES = 8192  # a heap page, the unit of auto_partitions' size rule, for results that have no pages


@dataclass
class PostgresScanStats:
    """What the latest pass of a :class:`PostgresScan` read."""

    ranges: int = 0  # ranges (batches) the pass was split into
    connections: int = 0  # connections reading each range, on the pass's snapshot
    batches: int = 0  # batches yielded so far
    bytes_read: int = 0  # COPY bytes received
    rows_read: int = 0
    rows_matched: int = 0  # rows left after ``where``
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict (for logging or a DataFrame row)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __str__(self) -> str:
        return (
            f"{self.batches} of {self.ranges} range(s), {self.connections} connection(s): "
            f"read {self.bytes_read:,} bytes, {self.rows_read:,} rows, "
            f"{self.rows_matched:,} matched, in {self.seconds:.3f} s"
        )


@dataclass
class _Pass:
    """One pass, planned inside its transaction: the COPY statements of each batch's range (its
    shares for the connections) with their size hints, and the connections that read them."""

    batches: list[tuple[list[str], list[int | None]]]
    conns: list[Any]


class PostgresScan:
    """A re-iterable scan of a PostgreSQL result, yielding pystrom Tables (see :func:`scan_postgres`).

    Each ``iter()`` is a fresh pass on a fresh snapshot; :attr:`stats` describes the latest pass.
    """

    def __init__(
        self,
        conninfo: Any,
        query: Any,
        table: Any,
        columns: Any,
        where: Any,
        sql_where: Any,
        params: Any,
        partitions: Any,
        partition_on: Any,
        connections: Any,
        numeric: str,
        device: Any,
        progress: Any,
    ):
        psycopg = psycopg_module("scan_postgres")
        if isinstance(conninfo, psycopg.Connection):
            raise InvalidArgumentError(
                "scan_postgres needs a connection string or URI: each pass opens a connection of its own and "
                "holds one transaction open across its batches (use read_postgres to read on your connection)"
            )
        if not isinstance(conninfo, str):
            raise InvalidArgumentError(f"conninfo must be a connection string or URI; got {type(conninfo).__name__}")
        if query is not None and (columns is not None or sql_where is not None):
            raise InvalidArgumentError("columns= and sql_where= go with table=; put them in the query instead")
        check_read_arguments(query, table, None, sql_where, numeric, partition_on)
        if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)
                                       or partitions < 1):  # fmt: skip
            raise InvalidArgumentError(f"partitions must be a positive int or None; got {partitions!r}")
        if connections is not None and (isinstance(connections, bool) or not isinstance(connections, int)
                                        or connections < 1):  # fmt: skip
            raise InvalidArgumentError(f"connections must be a positive int or None; got {connections!r}")
        if where is not None and (not isinstance(where, str) or not where.strip()):
            raise InvalidArgumentError(
                f"where must be a pystrom expression (a non-empty string, docs/where.md); got {where!r}"
            )
        check_progress(progress)
        self.conninfo = _named(conninfo)
        self.connections = connections
        self.backend = resolve_device(device)
        self.progress = progress
        self.partitions = partitions
        self.partition_on = partition_on
        self._source = (query, table, sql_where, params)
        self._numeric = numeric
        self.group_bytes = stream_group_bytes(self.backend)
        self.stats = PostgresScanStats()

        conn = connect(self.conninfo)
        try:
            run_sql(conn, "starting the read transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._read_columns = None
            if table is not None and columns is not None:
                self._read_columns = _with_where_columns(conn, query, table, sql_where, params, columns, where)
            self._plan = compose(conn, query, table, self._read_columns, sql_where, params)
            # one schema for every batch: array columns are settled by asking the server now
            self._plan, self._cols = describe_read(conn, self._plan, numeric, run_sql, arrays="server")
        finally:
            conn.close()
        if partition_on is not None:
            check_partition_key(self._cols, partition_on)
        import pyarrow as pa

        self._schema = pa.schema([field_of(c) for c in self._cols])
        names = [c.name for c in self._cols]
        self.columns = list(columns) if columns is not None else names
        self.predicate = None
        if where is not None:
            try:
                self.predicate = compile_where_udf(where, self._schema)
            except ExpressionError as exc:
                if _looks_like_sql(where) or (params is not None and query is None and sql_where is None):
                    raise ExpressionError(
                        f"{exc} (scan_postgres's where= is pystrom's expression language, run on the device; a "
                        "SQL condition goes in sql_where=, with %s parameters from params=)"
                    ) from None
                raise

    @property
    def schema(self) -> Any:
        """The schema of the Tables the scan yields."""
        import pyarrow as pa

        return pa.schema([self._schema.field(c) for c in self.columns])

    def _plan_pass(self, conn: Any, extra: list) -> _Pass:
        """The batches' statements, planned inside the pass's transaction (the table's pages or the
        key's [min, max] as its snapshot sees them), and the connections that join its snapshot
        (appended to ``extra`` as they open, so the caller closes them whatever happens)."""
        plan = self._plan
        if plan.table is not None:
            pages, block = table_pages(conn, plan)
            if pages is not None:
                n = self.partitions or math.ceil(pages * block / self.group_bytes)
                ranges = equal_ranges(pages, max(1, min(n, pages))) or [(0, 0)]
                widest = max(b - a for a, b in ranges)
                conns = self._join(conn, extra, widest, True)
                batches = []
                for i, (a, b) in enumerate(ranges):
                    shares: list[tuple[int, int | None]] = list(queue_ranges(a, b, len(conns), pages=True))
                    if i + 1 == len(ranges):
                        shares[-1] = (shares[-1][0], None)  # open-ended; the snapshot decides what is in it
                    hints = [((y if y is not None else pages) - x) * block for x, y in shares]
                    batches.append((ctid_statements(conn, plan, shares), hints))
                return _Pass(batches, conns)
        elif self.partition_on is not None:
            bounds = key_bounds(conn, plan, self.partition_on)
            if bounds is not None:
                lo, hi = bounds
                estimate = _estimated_bytes(conn, plan)
                n = self.partitions or math.ceil(estimate / self.group_bytes)
                ranges = equal_ranges(hi - lo + 1, max(1, min(n, hi - lo + 1)))
                widest = max(b - a for a, b in ranges)
                conns = self._join(conn, extra, widest, False, estimate // len(ranges) // _PAGE_BYTES)
                batches = []
                for i, (a, b) in enumerate(ranges):
                    shares = queue_ranges(a, b, len(conns), pages=False)
                    statements = key_statements(
                        conn, plan, self.partition_on, lo, shares, nulls=i == 0, open_end=i + 1 == len(ranges)
                    )
                    batches.append((statements, [None] * len(statements)))
                return _Pass(batches, conns)
        return _Pass([([copy_sql(conn, plan.select)], [None])], [conn])

    def _join(self, conn: Any, extra: list, widest: int, heap: bool, pages: int | None = None) -> list[Any]:
        """``conn`` and the connections that read a range with it, on its exported snapshot: as many as
        ``connections=`` says (None: as read_postgres chooses for the widest range), never more than
        that range has shares (heap: of >= 1 MiB; else of one key value or more)."""
        n = self.connections or auto_partitions(conn, widest if pages is None else pages)
        n = max(1, min(n, len(queue_ranges(0, widest, n, pages=heap))))
        if n == 1:
            return [conn]
        snapshot = export_snapshot(conn)
        lock = threading.Lock()
        joiners = [SnapshotJoiner(self.conninfo, snapshot, extra, lock) for _ in range(n - 1)]
        with cf.ThreadPoolExecutor(n - 1, thread_name_prefix="pystrom-pg-join") as pool:
            futures = [pool.submit(j) for j in joiners]  # ~20 ms together, each alone as long
            return [conn, *(f.result() for f in futures)]

    def _open(self) -> Any:
        conn = connect(self.conninfo)
        try:
            run_sql(conn, "starting the read transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cols = describe(conn, self._plan.select, self._numeric, run_sql)
            if [_described(c) for c in cols] != [_described(c) for c in self._cols]:
                raise SchemaMismatchError(
                    f"the result's columns changed since the scan was made: {_names(self._cols)} then, "
                    f"{_names(cols)} now; make the scan again"
                )
        except BaseException:
            conn.close()
            raise
        return conn

    def _load(self, conns: list[Any], batch: tuple, report: Callable[[int], None] | None) -> Any:
        statements, hints = batch
        leaves = leaf_columns(self._cols)
        strings = {i: f"{c.name!r} ({c.pg_type})" for i, c in enumerate(leaves) if c.kind == Kind.VARLEN}
        with self.backend.activate():
            reader = CopyReader(self.backend, len(leaves), report, strings, array_columns(self._cols))
            chunks = reader.read_all(conns[: len(statements)], statements, hints)
            nbytes = sum(c.nbytes for part in chunks for c in part)
            table = assemble(self.backend, self._cols, chunks)
            if self.backend.kind == "cuda":
                # decoded on this thread's stream; the caller filters on its own
                self.backend.xp.cuda.get_current_stream().synchronize()
        return table, nbytes

    def __iter__(self) -> Iterator[Table]:
        stats = self.stats = PostgresScanStats()
        start = time.perf_counter()
        conn = self._open()
        extra: list[Any] = []
        future: cf.Future | None = None
        work = _Pass([], [conn])
        try:
            with (
                reporter(self.progress, unit="rows", desc="scan_postgres") as report,
                cf.ThreadPoolExecutor(1, thread_name_prefix="pystrom-pg-scan") as pool,
            ):
                done_rows = 0

                def rows(n: int) -> None:  # the reader counts one range's rows; the bar counts the pass
                    report(done_rows + n)

                counter = rows if report.active else None
                try:
                    work = self._plan_pass(conn, extra)
                    stats.ranges, stats.connections = len(work.batches), len(work.conns)
                    for i in range(len(work.batches)):
                        if future is None:
                            future = pool.submit(self._load, work.conns, work.batches[i], counter)
                        table, nbytes = future.result()
                        future = None
                        done_rows += table.num_rows  # before the next range reports its first rows
                        if i + 1 < len(work.batches):  # read the next range while the caller works
                            future = pool.submit(self._load, work.conns, work.batches[i + 1], counter)
                        stats.bytes_read += nbytes
                        stats.rows_read += table.num_rows
                        out = self._finish(table)
                        stats.rows_matched += out.num_rows
                        stats.batches += 1
                        stats.seconds = time.perf_counter() - start
                        yield out
                        del out, table
                finally:
                    if future is not None:
                        _abandon(work.conns, future)
                        future = None
        finally:
            for c in [*extra, conn]:
                c.close()  # read-only transactions: nothing to commit
            stats.seconds = time.perf_counter() - start

    def _finish(self, table: Table) -> Table:
        if self.predicate is not None:
            with self.backend.activate():
                mask = self.predicate.evaluate(table)
                filtered = table.filter(mask)
            table.close()
            table = filtered
        if table.column_names != self.columns:
            projected = table.select(self.columns)
            table = projected
        return table

    def collect(self) -> Table:
        """Every row of one pass as one Table (equal to ``read_postgres`` of the statement, filtered by ``where``)."""
        pieces = list(self)
        if len(pieces) == 1:
            return pieces[0]
        if not pieces:
            import pyarrow as pa

            return Table.from_arrow(pa.schema(self.schema).empty_table(), device=self.backend)
        return concat(pieces)

    def __repr__(self) -> str:
        query, table, _, _ = self._source
        source = f"table={table!r}" if table is not None else "query=..."
        where = f", where={self.predicate.text!r}" if self.predicate is not None else ""
        return f"<pystrom.PostgresScan {source}, columns={self.columns}{where}, device={self.backend.device}>"


def _named(conninfo: str) -> str:
    """``conninfo`` with application_name ``pystrom.scan_postgres`` unless it names one (in
    pg_stat_activity the scan's sessions are then told from others)."""
    psycopg = psycopg_module()
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return conninfo  # connect() says what is wrong, without repeating it
    if "application_name" in params or os.environ.get("PGAPPNAME"):
        return conninfo
    return psycopg.conninfo.make_conninfo(conninfo, application_name=_APPLICATION_NAME)


def _described(col: PgColumn) -> tuple:
    """A column as :func:`.types.describe` sees it: an array column by its kind (its list or
    fixed_size_list type was settled from the rows when the scan was made)."""
    return (col.name, col.kind) if col.kind in Kind.ARRAYS else (col.name, col.type.arrow)


def _names(cols: Sequence[PgColumn]) -> list[str]:
    return [f"{c.name} {c.pg_type}" for c in cols]


def _abandon(conns: list[Any], future: cf.Future) -> None:
    """The caller left the pass (break, an exception, the generator collected) or it failed while a
    range was in flight: stop that COPY on the server and wait for the reader, whose failure path
    frees the range's staging and device memory; a range already read is closed."""
    # Cancelled again until the reader ends: a cancel that lands before its COPY has reached the
    # server is lost (the server then had nothing to cancel), and the whole range would be read.
    while True:
        for conn in conns if not future.done() else ():
            try:
                conn.cancel()
            except Exception:
                pass  # the connection is broken: its read fails by itself
        try:
            table, _ = future.result(timeout=0.25)
        except cf.TimeoutError:
            continue
        except BaseException:
            return  # the cancelled read's error: the caller has left, nobody to tell
        table.close()
        return


# What only SQL writes: parameters, casts, and the operators pystrom's expression language does not have.
_SQL_ONLY = re.compile(r"%s|::|\b(i?like|between|similar\s+to|is\s+(not\s+)?(null|true|false|distinct))\b", re.I)


def _looks_like_sql(where: str) -> bool:
    return _SQL_ONLY.search(where) is not None


def _with_where_columns(conn: Any, query: Any, table: Any, sql_where: Any, params: Any, columns: Any,
                        where: Any) -> list[str]:  # fmt: skip
    """``columns`` and the relation's columns that ``where`` names (read for the filter, not returned)."""
    from ...expr._lexer import tokenize

    if isinstance(columns, str) or not columns or not all(isinstance(c, str) and c for c in columns):
        raise InvalidArgumentError(f"columns must be a non-empty list of column names; got {columns!r}")
    if where is None:
        return list(columns)
    plan = compose(conn, query, table, None, sql_where, params)
    from psycopg import sql

    cur = run_sql(conn, "listing the table's columns", sql.SQL("{} LIMIT 0").format(plan.select))
    names = [d.name for d in cur.description]
    mentioned = {str(t.value) for t in tokenize(where) if t.kind == "ident"}
    return list(columns) + [n for n in names if n in mentioned and n not in columns]


def _estimated_bytes(conn: Any, plan: Any) -> int:
    """The planner's estimate of a query's result size (rows x width), for the number of key ranges."""
    from psycopg import sql

    try:
        row = run_sql(conn, "estimating the result's size", sql.SQL("EXPLAIN (FORMAT JSON) {}").format(plan.select))
        top = row.fetchone()[0][0]["Plan"]
        return int(top["Plan Rows"]) * max(1, int(top["Plan Width"]))
    except (PostgresError, KeyError, IndexError, TypeError, ValueError):
        return 0  # no estimate: one range, unless partitions= says otherwise


def scan_postgres(
    conninfo: str,
    query: Any = None,
    *,
    table: str | Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    sql_where: str | None = None,
    params: Any = None,
    partitions: int | None = None,
    partition_on: str | None = None,
    connections: int | None = None,
    numeric: str = "float64",
    device: str | int | None = None,
    progress: bool | Callable[[int], None] | None = None,
) -> PostgresScan:
    """Scan a PostgreSQL query result or table a range at a time, filtering on the device.

    Together the batches of a pass equal :func:`read_postgres` of the same statement (then filtered
    by ``where``): every range is read in REPEATABLE READ READ ONLY transactions on one snapshot,
    taken when the pass starts, whatever others write meanwhile. While the caller works on one
    batch, the next range is read (one ahead), by ``connections`` COPY streams in parallel, so a
    pass holds about two batches in device memory. Leaving a pass early (``break``, an exception)
    cancels the range in flight and closes the connections.

    Parameters
    ----------
    conninfo
        A libpq connection string or URI (each pass opens its own connection; an open
        ``psycopg.Connection`` is refused: use :func:`read_postgres` on it).
    query, table, params, numeric
        As for :func:`read_postgres`.
    columns
        With ``table``: the columns of the Tables produced (default: all). Columns that only
        ``where`` names are read for the filter but not returned.
    where
        A pystrom predicate evaluated on the device for every batch, as in :func:`scan_arrow`
        (the language: docs/where.md), including calls of registered :func:`pystrom.udf` functions by
        name: ``"dist(x, y) < 10 and k > 0"``. Rows where it is not true (false or NULL) are dropped.
        This is not :func:`read_postgres`'s ``where=``, which is SQL run by the server: that one is
        ``sql_where`` here.
    sql_where
        With ``table``: a SQL condition run by the server, e.g. ``"x > %s"`` with ``params=(3,)``
        (``read_postgres``'s ``where=``).
    partitions
        Ranges (batches) to split the read into. None: ``table=`` reads are split into ranges of about
        1 GiB of heap (or 1/32 of the device's memory if less); ``partition_on`` reads by the planner's
        estimate of the result's size; other ``query=`` reads are one batch. At most one range per
        heap page (``table=``) or per key value (``partition_on``).
    partition_on
        With ``query``: an int2/int4/int8 result column whose [min, max] is split into ``partitions``
        equal ranges (NULL keys go to the first). Without it a ``query=`` read is one batch.
    connections
        Connections reading each range together, all on the pass's snapshot (each range cut further
        among them, largest share first, as :func:`read_postgres` cuts a read). None: as
        ``read_postgres`` chooses for one range of that size (the server's cores, at most 16, at least
        8 MiB each, within the free connection slots); 1: one stream. Never more than the widest
        range has shares (1 MiB of heap, or one key value, at least), so small ranges take fewer. A
        ``query=`` read without ``partition_on`` is one stream.
    device
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or None (``pystrom.defaults.device``, else a GPU if visible).
    progress
        None (default): a progress bar on stderr (rows received in the pass) when stderr is a
        terminal and the pass runs longer than ``pystrom.defaults.progress_delay`` seconds. True: a
        bar from the start. False: none. A callable: called with the rows received so far in the pass,
        from the reading thread (no bar).

    Returns
    -------
    PostgresScan
        Iterable (again and again, each pass on a fresh snapshot) of Tables, one per range;
        ``.stats`` reports the latest pass, ``.collect()`` returns one pass as one Table.

    Raises
    ------
    PostgresError
        Connection failures, SQL errors, a connection lost during a pass (raised where the batch
        would have been yielded; the batches before it have been yielded).

    Each pass's connections carry ``application_name`` ``pystrom.scan_postgres`` unless
    ``conninfo`` (or ``PGAPPNAME``) names one.
    """
    return PostgresScan(conninfo, query, table, columns, where, sql_where, params, partitions, partition_on,
                        connections, numeric, device, progress)  # fmt: skip
