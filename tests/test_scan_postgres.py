"""scan_postgres: a PostgreSQL result as a stream of Tables, against read_postgres on a real server."""

from __future__ import annotations

import gc
import math
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import ExpressionError, InvalidArgumentError, PostgresError, SchemaMismatchError
from pystrom.testing import to_host

from conftest import device_memory_in_use

psycopg = pytest.importorskip("psycopg")


@pystrom.udf
def pg_near(x, y):
    return math.sqrt(x * x + y * y) < 50.0


def _mixed(pg, rows: int) -> str:
    """A table of ints, floats with NULLs, strings with NULLs and empty strings, dates and numerics."""
    name = pg.name("scanpg")
    pg.execute(
        f"create table {name} as select g as id, (g % 97)::float8 / 3 as x, "
        "case when g % 5 = 0 then null else (g % 61)::int4 end as y, "
        "case when g % 7 = 0 then null when g % 7 = 1 then '' else repeat(chr(65 + g % 26), g % 9) || 'é' end as s, "
        "date '2020-01-01' + (g % 400) as d, (g % 1000)::numeric(10, 2) / 7 as n "
        f"from generate_series(1, {rows}) g"
    )
    return name


def _host(tables) -> pa.Table:
    parts = [to_host(t) for t in tables]
    return pa.concat_tables(parts).combine_chunks() if parts else None


def _sessions(pg) -> int:
    """The scan's server sessions left, once those whose client has gone have had up to 5 s to exit
    (a backend leaves pg_stat_activity a moment after its client disconnects)."""
    deadline = time.monotonic() + 5
    while True:
        n = pg.fetch("select count(*) from pg_stat_activity where application_name = 'pystrom.scan_postgres'")[0][0]
        if n == 0 or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def _reader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("pystrom-pg-scan", "pystrom-pg"))]


@pytest.mark.parametrize("partitions", [1, 4, 37])
def test_table_batches_equal_read_postgres(pg, device, partitions):
    name = _mixed(pg, 20_000)
    want = to_host(pystrom.read_postgres(pg.conninfo, table=name, device="cpu"))
    scan = pystrom.scan_postgres(pg.conninfo, table=name, partitions=partitions, connections=1, device=device)
    batches = list(scan)
    assert len(batches) == min(partitions, scan.stats.ranges) == scan.stats.ranges
    assert scan.stats.rows_read == scan.stats.rows_matched == 20_000
    got = _host(batches)
    # ctid ranges cover the heap in page order, as the single stream reads it
    assert got.sort_by("id").equals(want.sort_by("id"))
    assert to_host(scan.collect()).sort_by("id").equals(want.sort_by("id"))
    assert scan.schema == want.schema


def test_ranges_read_by_several_connections_equal_read_postgres(pg, device):
    name = _mixed(pg, 120_000)  # ~1000 heap pages: two ranges of ~500, each cut in shares of >= 128 pages
    want = to_host(pystrom.read_postgres(pg.conninfo, table=name, device="cpu")).sort_by("id")
    scan = pystrom.scan_postgres(pg.conninfo, table=name, partitions=2, connections=3, device=device)
    batches = list(scan)
    assert scan.stats.ranges == len(batches) == 2 and scan.stats.connections == 3
    small = pystrom.scan_postgres(pg.conninfo, table=name, partitions=20, connections=3, device=device)
    assert len(list(small)) == 20 and small.stats.connections == 1  # ~50 pages a range: one share each
    # equal page ranges, not equal rows: rows per page follow the string widths (PostgreSQL 16: 62,706 / 57,294)
    assert abs(batches[0].num_rows - batches[1].num_rows) < 0.1 * 120_000
    assert _host(batches).sort_by("id").equals(want)


@pytest.mark.parametrize("connections", [1, 3])
def test_query_with_partition_on_equals_read_postgres(pg, device, connections):
    name = _mixed(pg, 5000)
    pg.execute(f"insert into {name} (id, x) values (null, 1.5), (null, 2.5)")  # NULL keys: the first range
    query = f"select id, s, x * 2 as x2 from {name} where id is null or id % 3 <> 0"
    want = to_host(pystrom.read_postgres(pg.conninfo, query, device="cpu"))
    counts: list[int] = []
    scan = pystrom.scan_postgres(pg.conninfo, query, partition_on="id", partitions=6, connections=connections,
                                 device=device, progress=counts.append)  # fmt: skip
    batches = list(scan)
    assert len(batches) == 6 and scan.stats.connections == connections
    assert counts == sorted(counts) and counts[-1] == want.num_rows == scan.stats.rows_read
    assert to_host(batches[0]).column("id").null_count == 2
    for b in batches[1:]:
        assert to_host(b).column("id").null_count == 0
    assert _host(batches).sort_by("id").equals(want.sort_by("id"))


@given(
    keys=st.lists(st.one_of(st.none(), st.integers(-(2**62), 2**62), st.integers(-5, 5)), max_size=60),
    partitions=st.integers(1, 12),
    connections=st.integers(1, 4),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_key_ranges_cover_every_row_once(pg, keys, partitions, connections):
    """Any int8 keys (NULLs, duplicates, the extremes of the range) in any number of ranges and shares:
    the batches together are read_postgres's rows, NULL keys in the first batch only."""
    values = ", ".join(f"({'null' if k is None else k}::int8, {i})" for i, k in enumerate(keys)) or "(0::int8, 0)"
    query = f"select k, i from (values {values}) v(k, i)" + ("" if keys else " where false")
    want = to_host(pystrom.read_postgres(pg.conninfo, query, device="cpu")).sort_by("i")
    scan = pystrom.scan_postgres(pg.conninfo, query, partition_on="k", partitions=partitions,
                                 connections=connections, device="cpu")  # fmt: skip
    batches = [to_host(b) for b in scan]
    assert pa.concat_tables(batches).sort_by("i").equals(want)
    assert all(b.column("k").null_count == 0 for b in batches[1:])
    distinct = len({k for k in keys if k is not None})
    assert len(batches) <= max(1, partitions)
    assert distinct == 0 or len(batches) == min(partitions, max(k for k in keys if k is not None)
                                                 - min(k for k in keys if k is not None) + 1)  # fmt: skip


def test_zero_rows_and_fewer_rows_than_partitions(pg, device):
    empty = pg.name("scanpg_empty")
    pg.execute(f"create table {empty} (id int8, s text, x float8)")
    scan = pystrom.scan_postgres(pg.conninfo, table=empty, partitions=8, device=device)
    batches = list(scan)
    assert [b.num_rows for b in batches] == [0]
    got = scan.collect()
    assert got.num_rows == 0 and got.column_names == ["id", "s", "x"]
    assert to_host(got).schema == to_host(pystrom.read_postgres(pg.conninfo, table=empty, device="cpu")).schema

    small = _mixed(pg, 3)  # one heap page: one range, however many are asked for
    scan = pystrom.scan_postgres(pg.conninfo, table=small, partitions=50, device=device)
    assert len(list(scan)) == 1
    want = to_host(pystrom.read_postgres(pg.conninfo, table=small, device="cpu"))
    assert to_host(scan.collect()).equals(want)

    # 3 distinct keys, 10 ranges asked for: at most one range per key value
    query = f"select * from {small}"
    scan = pystrom.scan_postgres(pg.conninfo, query, partition_on="id", partitions=10, device=device)
    batches = list(scan)
    assert len(batches) == 3 and [b.num_rows for b in batches] == [1, 1, 1]
    assert _host(batches).equals(want.sort_by("id"))

    # a query with no rows at all (no key bounds): one empty batch
    scan = pystrom.scan_postgres(pg.conninfo, f"{query} where false", partition_on="id", partitions=4, device=device)
    assert [b.num_rows for b in scan] == [0]


def test_device_where_with_a_udf_across_batches(pg, device):
    name = _mixed(pg, 12_000)
    scan = pystrom.scan_postgres(
        pg.conninfo, table=name, columns=["id", "s"], where="pg_near(x, y) and id % 4 <> 1", partitions=5,
        device=device,
    )  # fmt: skip
    batches = list(scan)
    assert len(batches) == 5 and all(b.column_names == ["id", "s"] for b in batches)
    got = sorted(_host(batches).column("id").to_pylist())
    want = sorted(g for g in range(1, 12_001) if g % 5 and g % 4 != 1 and math.hypot((g % 97) / 3, g % 61) < 50)
    assert got == want and 0 < len(want) < 12_000
    assert scan.stats.rows_read == 12_000 and scan.stats.rows_matched == len(want)
    # the same, in the query/partition_on form, against the device filter of read_postgres's Table
    whole = pystrom.read_postgres(pg.conninfo, table=name, device=device)
    want_t = to_host(whole.filter("pg_near(x, y) and id % 4 <> 1").select(["id", "s"]))
    scan = pystrom.scan_postgres(
        pg.conninfo, f"select id, s, x, y from {name}", partition_on="id", partitions=3,
        where="pg_near(x, y) and id % 4 <> 1", device=device,
    )  # fmt: skip
    assert _host(scan).select(["id", "s"]).sort_by("id").equals(want_t.sort_by("id"))


def test_sql_where_is_read_postgres_where(pg, device):
    name = _mixed(pg, 4000)
    want = to_host(pystrom.read_postgres(pg.conninfo, table=name, where="id > %s and s <> ''", params=(1000,),
                                         device="cpu"))  # fmt: skip
    scan = pystrom.scan_postgres(pg.conninfo, table=name, sql_where="id > %s and s <> ''", params=(1000,),
                                 partitions=3, where="y is not null", device=device)  # fmt: skip
    got = _host(scan)
    assert got.sort_by("id").equals(want.filter(want.column("y").is_valid()).sort_by("id"))


def test_reduce_over_the_stream_equals_reduce_over_the_table(pg, device):
    name = _mixed(pg, 30_000)

    def init():
        return np.zeros(3)

    def row(state, x, y):
        state[0] += 1
        state[1] += x * y
        state[2] = max(state[2], x + y)

    def combine(a, b):
        return np.array([a[0] + b[0], a[1] + b[1], max(a[2], b[2])])

    whole = pystrom.reduce(pystrom.read_postgres(pg.conninfo, table=name, device=device), ["x", "y"], init=init,
                           row=row, combine=combine)  # fmt: skip
    scan = pystrom.scan_postgres(pg.conninfo, table=name, partitions=7, device=device)
    streamed = pystrom.reduce(scan, ["x", "y"], init=init, row=row, combine=combine)
    assert scan.stats.batches == 7
    assert whole[0] == streamed[0] == 24_000  # the rows with y NULL are skipped
    assert streamed[1] == pytest.approx(whole[1], rel=1e-12) and streamed[2] == whole[2]
    # the reference, computed by PostgreSQL
    n, s, m = pg.fetch(f"select count(*), sum(x * y), max(x + y) from {name} where y is not null")[0]
    assert streamed[0] == n and streamed[1] == pytest.approx(s, rel=1e-12) and streamed[2] == pytest.approx(m)


@pytest.mark.parametrize("connections", [1, 3])
def test_a_pass_reads_one_snapshot(pg, device, connections):
    name = _mixed(pg, 20_000)
    want = to_host(pystrom.read_postgres(pg.conninfo, table=name, device="cpu")).sort_by("id")
    scan = pystrom.scan_postgres(pg.conninfo, table=name, partitions=6, connections=connections, device=device)
    batches = []
    for i, batch in enumerate(scan):
        batches.append(batch)
        if i == 0:  # others write meanwhile: new rows (in new pages, the open-ended last range), deletes, updates
            pg.execute(f"insert into {name} (id, x, y) select g, 0, 0 from generate_series(20001, 40000) g")
            pg.execute(f"delete from {name} where id > 19000 and id <= 20000")
            pg.execute(f"update {name} set x = -1 where id <= 100")
    assert _host(batches).sort_by("id").equals(want)
    # the key-range form too: keys inserted into every range's span after the first batch
    query = f"select id, x from {name} where id <= 50000"
    before = to_host(pystrom.read_postgres(pg.conninfo, query, device="cpu")).sort_by("id")
    scan = pystrom.scan_postgres(pg.conninfo, query, partition_on="id", partitions=4, connections=connections,
                                 device=device)  # fmt: skip
    batches = []
    for i, batch in enumerate(scan):
        batches.append(batch)
        if i == 0:
            pg.execute(f"insert into {name} (id, x) select g, 7 from generate_series(40001, 45000) g")
            pg.execute(f"delete from {name} where id % 2 = 0")
    assert _host(batches).sort_by("id").equals(before)
    # a new pass sees the new state
    assert scan.collect().num_rows == pg.fetch(f"select count(*) from {name}")[0][0]


@pytest.mark.parametrize("connections", [1, 3])
def test_abandoning_a_pass_closes_its_connections_and_threads(pg, device, connections):
    name = _mixed(pg, 200_000)  # ~1700 heap pages
    scan = pystrom.scan_postgres(pg.conninfo, table=name, partitions=4, connections=connections, device=device)
    base_threads = _reader_threads()
    base_mem = device_memory_in_use(device)
    for batch in scan:  # break after the first batch, with the second in flight
        assert pg.fetch("select count(*) from pg_stat_activity where application_name = 'pystrom.scan_postgres'") == [
            (scan.stats.connections,)
        ]
        del batch
        break
    gc.collect()
    assert _sessions(pg) == 0
    assert _reader_threads() == base_threads
    assert device_memory_in_use(device) <= base_mem

    class Stop(Exception):
        pass

    with pytest.raises(Stop):
        for i, _batch in enumerate(scan):
            if i == 2:
                raise Stop
    del _batch  # the loop variable holds the third batch (1.8 MB on the GPU): not the scan's to free
    assert _sessions(pg) == 0 and _reader_threads() == base_threads
    assert scan.stats.batches == 3

    # an iterator dropped halfway without being closed
    it = iter(scan)
    next(it)
    del it
    gc.collect()
    assert _sessions(pg) == 0 and _reader_threads() == base_threads
    assert device_memory_in_use(device) <= base_mem

    # abandoned while a slow range is still being read: the server is asked to stop, not waited out.
    # The sleep is in a function declared immutable so that each range's id condition reaches the scan
    # below it: a volatile call in the select list keeps the condition above it, and then every range
    # (the first one too) would evaluate id 75000 and sleep.
    slow_fn = pg.name("slow")
    pg.execute(f"create function {slow_fn}(i int8) returns boolean language plpgsql immutable as $$ begin "
               f"perform pg_sleep(case when i = 75000 then 30 else 0 end); return true; end $$")  # fmt: skip
    slow = f"select id, x, {slow_fn}(id) as z from {name}"
    scan = pystrom.scan_postgres(pg.conninfo, slow, partition_on="id", partitions=4, connections=connections,
                                 device=device)  # fmt: skip
    it = iter(scan)
    start = time.monotonic()
    assert next(it).num_rows == 50_000  # ids 1..50000; the range of 75000 is in flight, sleeping
    assert time.monotonic() - start < 10  # the first range did not wait for the sleep
    time.sleep(0.5)
    assert pg.fetch("select count(*) from pg_stat_activity where wait_event = 'PgSleep'")[0][0] >= 1
    start = time.monotonic()
    it.close()
    assert time.monotonic() - start < 10
    assert _sessions(pg) == 0 and _reader_threads() == base_threads


@pytest.mark.parametrize("connections", [1, 3])
def test_a_server_error_mid_stream(pg, device, connections):
    query = "select k, 100 / (k - 700) as q, repeat('x', k % 50) as s from generate_series(1, 1000) k"
    scan = pystrom.scan_postgres(pg.conninfo, query, partition_on="k", partitions=4, connections=connections,
                                 device=device)  # fmt: skip
    seen = []
    with pytest.raises(PostgresError, match="division by zero"):
        for batch in scan:
            seen.append(batch.num_rows)
    assert seen == [250, 250]  # the ranges before the failing one were yielded
    assert _sessions(pg) == 0 and not _reader_threads()

    # the connection killed by the server between two batches
    name = _mixed(pg, 20_000)
    scan = pystrom.scan_postgres(pg.conninfo, table=name, partitions=5, connections=connections, device=device)
    with pytest.raises(PostgresError):
        for i, _ in enumerate(scan):
            if i == 1:
                pg.execute("select pg_terminate_backend(pid) from pg_stat_activity "
                           "where application_name = 'pystrom.scan_postgres'")  # fmt: skip
    assert _sessions(pg) == 0 and not _reader_threads()
    assert scan.collect().num_rows == 20_000  # the next pass starts afresh


def test_schema_change_between_passes(pg):
    name = _mixed(pg, 100)
    scan = pystrom.scan_postgres(pg.conninfo, table=name, device="cpu")
    assert scan.collect().num_rows == 100
    pg.execute(f"alter table {name} alter column y type float8")
    with pytest.raises(SchemaMismatchError, match="changed since the scan was made"):
        list(scan)
    assert _sessions(pg) == 0


def test_bad_arguments(pg):
    name = _mixed(pg, 10)
    c = pg.conninfo
    with pytest.raises(InvalidArgumentError, match="exactly one of query= or table="):
        pystrom.scan_postgres(c)
    with pytest.raises(InvalidArgumentError, match="columns= and sql_where= go with table="):
        pystrom.scan_postgres(c, f"select * from {name}", columns=["id"])
    with pytest.raises(InvalidArgumentError, match="columns= and sql_where= go with table="):
        pystrom.scan_postgres(c, f"select * from {name}", sql_where="id > 3")
    with pytest.raises(InvalidArgumentError, match="partitions must be a positive int"):
        pystrom.scan_postgres(c, table=name, partitions=0)
    with pytest.raises(InvalidArgumentError, match="partitions must be a positive int"):
        pystrom.scan_postgres(c, table=name, partitions=True)
    with pytest.raises(InvalidArgumentError, match="connections must be a positive int"):
        pystrom.scan_postgres(c, table=name, connections=0)
    with pytest.raises(InvalidArgumentError, match="connections must be a positive int"):
        pystrom.scan_postgres(c, table=name, connections=2.0)
    with pytest.raises(InvalidArgumentError, match="partition_on must name an integer column of a query= read"):
        pystrom.scan_postgres(c, table=name, partition_on="id")
    with pytest.raises(pystrom.UnsupportedTypeError, match="partition_on column 's'"):
        pystrom.scan_postgres(c, f"select * from {name}", partition_on="s")
    with pytest.raises(pystrom.ColumnNotFoundError, match="partition_on column 'nope'"):
        pystrom.scan_postgres(c, f"select * from {name}", partition_on="nope")
    with pytest.raises(InvalidArgumentError, match="where must be a pystrom expression"):
        pystrom.scan_postgres(c, table=name, where="  ")
    with pytest.raises(InvalidArgumentError, match="numeric must be"):
        pystrom.scan_postgres(c, table=name, numeric="int")
    with pytest.raises(InvalidArgumentError, match="columns must be a non-empty list"):
        pystrom.scan_postgres(c, table=name, columns="id")
    with pytest.raises(InvalidArgumentError, match="connection string or URI"):
        pystrom.scan_postgres(42, table=name)
    with pytest.raises(ExpressionError, match="unknown column 'nope'"):
        pystrom.scan_postgres(c, table=name, where="nope > 1")
    # read_postgres's SQL where, passed to where=: told where it goes
    with pytest.raises(ExpressionError, match="sql_where="):
        pystrom.scan_postgres(c, table=name, where="id > %s", params=(3,))
    with pytest.raises(PostgresError, match="does not exist"):
        pystrom.scan_postgres(c, table="no_such_table_anywhere")
    with pytest.raises(PostgresError, match="cannot connect"):
        pystrom.scan_postgres("host=127.0.0.1 port=1 connect_timeout=2", table=name)
    with psycopg.connect(c) as conn, pytest.raises(InvalidArgumentError, match="use read_postgres"):
        pystrom.scan_postgres(conn, table=name)
    assert _sessions(pg) == 0
