"""read_postgres against a real PostgreSQL (tests/fix_pg.py): values equal psycopg's, partitions on one
snapshot, identifiers, and every failure leaves no table, no device memory and a usable connection."""

from __future__ import annotations

import decimal
import math
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import InvalidArgumentError, PostgresError, UnsupportedTypeError
from pystrom.testing import to_host

from conftest import device_memory_in_use

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = pytest.mark.postgres


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(b, decimal.Decimal) and isinstance(a, float):
        return a == float(b) or (math.isnan(a) and b.is_nan())
    return a == b


TYPES_DDL = """(id int4, b bool, i2 int2, i4 int4, i8 int8, f4 float4, f8 float8, n numeric, d date, ts timestamp,
 tz timestamptz, s text, vc varchar(10), bp char(4), nm name, u uuid, o oid, by bytea)"""

TYPES_ROWS = """
(1, true, -32768, -2147483648, -9223372036854775808, 'NaN', 'NaN', 'NaN', '4713-01-01 BC', '4713-01-01 00:00:00 BC',
 '1970-01-01 00:00:00+00', '', '', '', '', '00000000-0000-0000-0000-000000000000', 0, ''),
(2, false, 32767, 2147483647, 9223372036854775807, 'Infinity', 'Infinity', 'Infinity', '5874897-12-31',
 '294246-12-31 23:59:59.999999', '2024-02-29 23:59:59.999999+05:30', 'héllo wörld 日本語 😀', 'ünïcødé', 'ab',
 'a_name', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 4294967295, '\\x00ff10'),
(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
(4, true, 0, 0, 0, '-Infinity', '-Infinity', '-Infinity', '1999-12-31', '2000-01-01 00:00:00',
 '1969-12-31 23:59:59.5-08', 'x', 'y', 'zzzz', 'n', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 1, '\\x'),
(5, false, -1, -1, -1, -0.0, 1e-310, '-123456789012.345', '2000-01-01', '1900-06-15 12:34:56.789',
 '2262-04-11 23:47:16+00', repeat('long ', 200), 'tenletters', 'a', 'x', gen_random_uuid(), 42, '\\xdeadbeef'),
(6, true, 1, 1, 1, 3.4028235e38, 1.7976931348623157e308, '0.000000000000000000001234', '2000-01-02',
 '2000-01-01 00:00:00.000001', '2000-01-01 00:00:00+00', 'tab\there', 'nul?', 'b', 'y', gen_random_uuid(), 7, '\\x01'),
(7, false, 2, 2, 2, 1.5, 0.1, '12345678901234567890123456789012345678.5', '1970-01-01', '1970-01-01', NULL, 'z',
 NULL, NULL, NULL, NULL, NULL, NULL)
"""


@pytest.fixture
def types_table(pg):
    name = pg.name("types")
    pg.execute(sql.SQL("CREATE TABLE {} " + TYPES_DDL).format(_ident(name)))
    pg.execute(sql.SQL("INSERT INTO {} VALUES " + TYPES_ROWS).format(_ident(name)))
    return name


def _compare_with_psycopg(pg, query: str, device: str) -> int:
    table = pystrom.read_postgres(pg.conninfo, query, device=device)
    assert table.device.startswith(device)
    got = table.to_arrow().to_pylist()
    cur = pg.conn.execute(query)
    names = [d.name for d in cur.description]
    want = cur.fetchall()
    assert table.column_names == names
    assert len(got) == len(want)
    for grow, wrow in zip(got, want):
        for name, w in zip(names, wrow):
            g = grow[name]
            if name == "f4" and g is not None:  # psycopg reads float4 from text: compare as float32
                g, w = np.float32(g).item(), np.float32(w).item()
            assert _same(g, w), (name, grow.get("id"), g, w)
    return len(got)


def test_types_with_nulls_and_edges_equal_psycopg(pg, types_table, device):
    before = device_memory_in_use(device)
    # Rows 1 and 2 hold dates Python cannot represent (psycopg refuses them): checked in the next tests.
    everything = sql.SQL("SELECT * FROM {} WHERE id NOT IN (1, 2) ORDER BY id").format(_ident(types_table))
    assert _compare_with_psycopg(pg, everything.as_string(pg.conn), device) == 5
    no_dates = sql.SQL("SELECT id, b, i2, i4, i8, f4, f8, n, s, vc, bp, nm, u, o, by FROM {} ORDER BY id")
    assert _compare_with_psycopg(pg, no_dates.format(_ident(types_table)).as_string(pg.conn), device) == 7
    assert device_memory_in_use(device) == before


def test_schema_of_each_type(pg, types_table):
    import pyarrow as pa

    table = pystrom.read_postgres(pg.conninfo, table=types_table, device="cpu")
    types = dict(zip(table.column_names, table.schema.types))
    assert types["b"] == pa.bool_() and types["i2"] == pa.int16() and types["i8"] == pa.int64()
    assert types["o"] == pa.uint32() and types["f4"] == pa.float32() and types["n"] == pa.float64()
    assert types["d"] == pa.date32() and types["ts"] == pa.timestamp("us")
    assert types["tz"] == pa.timestamp("us", tz="UTC")
    assert types["s"] == pa.utf8() and types["bp"] == pa.utf8() and types["by"] == pa.binary()
    assert getattr(types["u"], "storage_type", types["u"]) == pa.binary(16)


def test_wide_result_types_named_in_order(pg):
    """150 columns of three types with modifiers: every column keeps its own type (the type names
    come from one batched query, in column order), and the last column's error names it."""
    import pyarrow as pa

    cols = []
    for k in range(150):
        expr = ("i + {k}", "(i + {k})::numeric(12, 3)", "(i + {k})::text::varchar(9)")[k % 3].format(k=k)
        cols.append(f"{expr} AS c{k}")
    query = f"SELECT {', '.join(cols)} FROM generate_series(1, 3) i"
    t = pystrom.read_postgres(pg.conninfo, query, numeric="decimal", device="cpu")
    assert t.num_columns == 150
    for k, typ in enumerate(t.schema.types):
        assert typ == (pa.int32(), pa.decimal128(12, 3), pa.utf8())[k % 3], k
    assert t.to_arrow().column("c149").to_pylist() == ["150", "151", "152"]
    assert t.to_arrow().column("c148").to_pylist() == [decimal.Decimal(v) for v in ("149.000", "150.000", "151.000")]
    with pytest.raises(UnsupportedTypeError, match=r"'c150' has PostgreSQL type point"):
        pystrom.read_postgres(pg.conninfo, query.replace(" FROM", ", point(1, 2) AS c150 FROM"))


def test_infinities_and_far_dates(pg, types_table, device):
    t = pystrom.read_postgres(pg.conninfo, table=types_table, where="id in (1, 2, 4)", device=device)
    t = t.to_arrow().sort_by("id")
    days = t["d"].cast("int32").to_pylist()
    micros = t["ts"].cast("int64").to_pylist()
    # 4713-01-01 BC (Julian day 0), 5874897-12-31 (the last date, Julian day 2147483494), 1999-12-31
    want = pg.fetch(
        sql.SQL(
            "SELECT d - '1970-01-01'::date, extract(epoch from ts)::numeric * 1000000 FROM {} "
            "WHERE id IN (1, 2, 4) ORDER BY id"
        ).format(_ident(types_table))
    )
    assert days == [w[0] for w in want]
    assert micros == [int(w[1]) for w in want]
    assert micros[2] == 946684800000000
    f8 = t["f8"].to_pylist()
    assert math.isnan(f8[0]) and f8[1] == math.inf and f8[2] == -math.inf
    n = t["n"].to_pylist()
    assert math.isnan(n[0]) and n[1] == math.inf and n[2] == -math.inf
    pg.execute("SET TIME ZONE 'UTC'")
    inf = pystrom.read_postgres(
        pg.conninfo,
        "SELECT 'infinity'::date AS d, '-infinity'::date AS nd, 'infinity'::timestamp AS ts, "
        "'-infinity'::timestamptz AS nts",
        device=device,
    )
    assert inf.column("d").values.tolist() == [2**31 - 1]
    assert inf.column("nd").values.tolist() == [-(2**31)]
    assert inf.column("ts").values.tolist() == [2**63 - 1]
    assert inf.column("nts").values.tolist() == [-(2**63)]


def test_timestamp_beyond_int64_raises(pg, device):
    with pytest.raises(PostgresError, match=r"column 'late'.*row 1: a timestamp after 294247 AD"):
        pystrom.read_postgres(
            pg.conninfo,
            "SELECT '2000-01-01'::timestamp AS late UNION ALL SELECT '294276-12-31'::timestamp",
            device=device,
        )


def test_dates_and_timestamps_vs_epoch(pg, device):
    t = pystrom.read_postgres(
        pg.conninfo,
        "SELECT '1970-01-01'::date AS a, '4714-11-24 BC'::date AS b, "
        "'1970-01-01 00:00:01.5+00'::timestamptz AS c, '1960-01-01'::timestamp AS e",
        device=device,
    )
    assert int(t.column("a").values[0]) == 0
    assert int(t.column("b").values[0]) == -2440588  # Julian day 0
    assert int(t.column("c").values[0]) == 1_500_000
    assert int(t.column("e").values[0]) == -315619200 * 1_000_000


def test_numeric_float64_random_values_match_psycopg(pg, device):
    import random

    rnd = random.Random(7)
    vals = []
    for _ in range(3000):
        digits = rnd.randint(1, 38)
        vals.append(decimal.Decimal(rnd.randrange(10**digits)).scaleb(rnd.randint(-40, 40)) * rnd.choice([1, -1]))
    vals += [decimal.Decimal(1) / 3, decimal.Decimal("0.1"), decimal.Decimal("1e-300"), decimal.Decimal("9e300")]
    name = pg.name("num")
    pg.execute(sql.SQL("CREATE TABLE {} (k serial, x numeric)").format(_ident(name)))
    with pg.conn.cursor().copy(sql.SQL("COPY {} (x) FROM STDIN").format(_ident(name))) as copy:
        for v in vals:
            copy.write_row((v,))
    query = sql.SQL("SELECT x FROM {} ORDER BY k").format(_ident(name)).as_string(pg.conn)
    got = np.asarray(
        pystrom.read_postgres(pg.conninfo, query, device="cpu" if device == "cpu" else device)
        .to_arrow()["x"]
        .to_numpy()
    )
    want = np.array([float(r[0]) for r in pg.fetch(query)])
    exact = np.array([len(v.as_tuple().digits) <= 15 and -22 <= v.as_tuple().exponent <= 22 for v in vals])
    np.testing.assert_array_equal(got[exact], want[exact])
    np.testing.assert_allclose(got, want, rtol=4.5e-16, atol=0)  # within one unit in the last place


def test_numeric_as_decimal128(pg, device):
    name = pg.name("dec")
    pg.execute(sql.SQL("CREATE TABLE {} (k int, x numeric(38, 4), y numeric(5, 0))").format(_ident(name)))
    vals = ["0", "-0.0001", "12345678901234567890123456789012.3456", "-99999999999999999999999999999999.9999", "1.5"]
    for k, v in enumerate(vals):
        pg.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(_ident(name)), (k, v, k * -7))
    pg.execute(sql.SQL("INSERT INTO {} VALUES (99, NULL, NULL)").format(_ident(name)))
    t = pystrom.read_postgres(pg.conninfo, table=name, numeric="decimal", device=device).to_arrow().sort_by("k")
    assert str(t.schema.field("x").type) == "decimal128(38, 4)"
    with decimal.localcontext(prec=60):
        want = [decimal.Decimal(v).quantize(decimal.Decimal("0.0001")) for v in vals] + [None]
    assert t["x"].to_pylist() == want
    assert t["y"].to_pylist() == [decimal.Decimal(k * -7) for k in range(5)] + [None]


def test_decimal_refuses_nan_and_unconstrained(pg, device):
    name = pg.name("decnan")
    pg.execute(sql.SQL("CREATE TABLE {} (x numeric(10, 2), free numeric)").format(_ident(name)))
    pg.execute(sql.SQL("INSERT INTO {} VALUES (1.5, 1), ('NaN', 2)").format(_ident(name)))
    before = device_memory_in_use(device)
    with pytest.raises(PostgresError, match=r"column 'x'.*NaN"):
        pystrom.read_postgres(pg.conninfo, table=name, columns=["x"], numeric="decimal", device=device)
    with pytest.raises(UnsupportedTypeError, match=r"'free'.*numeric\(18, 6\)"):
        pystrom.read_postgres(pg.conninfo, table=name, numeric="decimal", device=device)
    assert device_memory_in_use(device) == before


def test_decode_failure_names_its_row_across_chunks_and_partitions(pg, device):
    """A bad value deep in a read of many chunks over 4 connections: the error names the table row
    (ctid order, as the rows come back), not the row within its chunk."""
    name = pg.name("deeperr")
    pg.execute(sql.SQL("CREATE TABLE {} (id int8, x numeric(10, 2))").format(_ident(name)))
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT i, CASE WHEN i = 30001 THEN 'NaN' ELSE i / 4.0 END FROM generate_series(1, 40000) i"
        ).format(_ident(name))
    )
    before = device_memory_in_use(device)
    with pystrom.defaults.set(pg_staging_chunk=65536):
        with pytest.raises(PostgresError, match=r"column 'x' \(numeric\(10,2\)\), row 30000: NaN"):
            pystrom.read_postgres(pg.conninfo, table=name, partitions=4, numeric="decimal", device=device)
        ok = pystrom.read_postgres(pg.conninfo, table=name, partitions=4, where="id <> 30001", device=device)
    assert ok.num_rows == 39999
    del ok
    assert device_memory_in_use(device) == before


@pytest.mark.parametrize("rows", [0, 1])
def test_zero_and_one_row(pg, types_table, rows, device):
    t = pystrom.read_postgres(pg.conninfo, table=types_table, where=f"id <= {rows}", device=device)
    assert t.num_rows == rows and t.num_columns == 18
    assert t.to_arrow().num_rows == rows
    if rows:
        assert t.to_arrow()["i4"].to_pylist() == [-2147483648]
    empty = pystrom.read_postgres(pg.conninfo, "SELECT 1 AS a, 'x'::text AS b WHERE false", device=device)
    assert empty.num_rows == 0 and empty.column_names == ["a", "b"]


def _rows(table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_arrow().to_pylist())


@pytest.fixture
def wide_table(pg):
    name = pg.name("wide")
    pg.execute(sql.SQL("CREATE TABLE {} (id int, v float8, s text)").format(_ident(name)))
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT i, i * 0.25, CASE WHEN i % 7 = 0 THEN NULL ELSE md5(i::text) END "
            "FROM generate_series(1, 30000) i"
        ).format(_ident(name))
    )
    return name


def test_partitions_equal_one_stream(pg, wide_table, device):
    one = pystrom.read_postgres(pg.conninfo, table=wide_table, partitions=1, device=device)
    eight = pystrom.read_postgres(pg.conninfo, table=wide_table, partitions=8, device=device)
    auto = pystrom.read_postgres(pg.conninfo, table=wide_table, device=device)
    assert one.num_rows == eight.num_rows == auto.num_rows == 30000
    assert _rows(one) == _rows(eight) == _rows(auto)
    assert eight.column("s").null_count == 30000 // 7
    # rows come back in ctid order whatever connection read a range: the same order as one stream
    assert one.to_arrow().column("id").to_pylist() == eight.to_arrow().column("id").to_pylist()


def test_partitions_take_several_ranges_each(pg, wide_table, monkeypatch):
    """Each connection reads several ctid ranges from one queue, largest first; together they cover the table once."""
    from pystrom.io.postgres import session as _pg_session
    from pystrom.io.postgres.statement import compose

    monkeypatch.setattr(_pg_session, "_LEAST_PAGES", 1)  # the small test table still splits finely
    extra = []
    with psycopg.connect(pg.conninfo, autocommit=True) as main:
        main.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            plan = compose(main, None, wide_table, None, None, None)
            sources, statements, hints = _pg_session.table_range_jobs(pg.conninfo, main, plan, 3, extra)
            assert len(sources) == 3 and len(statements) == len(hints) > 3
            assert "ctid >= '(0,0)'::tid" in statements[0] and "ctid <" not in statements[-1]  # the last is open
            # the main connection reads at once; the others are opened by their reader threads, on its snapshot
            assert sources[0] is main and all(isinstance(s, _pg_session.SnapshotJoiner) for s in sources[1:])
            assert extra == []
            joined = [open_() for open_ in sources[1:]]
            assert extra == joined and all(
                c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS for c in joined
            )
            # each range's first buffer is sized from its heap pages; together they are the table's heap
            pages = main.execute(
                sql.SQL("SELECT pg_relation_size({}) / 8192").format(sql.Literal(wide_table))
            ).fetchone()[0]
            assert sum(hints) == pages * 8192 and min(hints) >= 8192
            assert hints[0] >= hints[1] >= hints[-2]  # largest first
            counts = []
            for text in statements:  # in text format: one message per row, no header or trailer
                with main.cursor().copy(text.replace(" (FORMAT BINARY)", "")) as copy:
                    counts.append(sum(1 for _ in copy))
            assert sum(counts) == 30000 and min(counts) > 0
        finally:
            for conn in extra:
                conn.close()


@given(total=st.integers(1, 10**7), n=st.integers(1, 64), least=st.integers(1, 500))
@settings(max_examples=300, deadline=None)
def test_split_covers_once_largest_first(total, n, least):
    """The ranges a read is cut into: consecutive, covering [0, total) once, never growing, none but
    the very last under the floor, and not many more than needed."""
    from pystrom.io.postgres.session import _SHARE, _TAIL, _split

    ranges = _split(total, n, least)
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    assert all(a < b for a, b in ranges) and all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))
    sizes = [b - a for a, b in ranges]
    assert all(x >= y for x, y in zip(sizes, sizes[1:-1]))
    floor = max(least, total // (_TAIL * n))
    assert all(x >= floor for x in sizes[:-1])
    assert sizes[0] == min(total, max(floor, -(-total // (_SHARE * n))))
    assert len(ranges) <= _TAIL * n + 1


def test_partitions_on_one_snapshot_under_concurrent_writes(pg, pg_cluster, device):
    # Every writer transaction deletes 50 rows and inserts 50 with the same total: any consistent
    # snapshot sees exactly N rows summing to S; partitions on different snapshots would not.
    name = pg.name("busy")
    pg.execute(sql.SQL("CREATE TABLE {} (id bigserial, grp int, v int, pad text)").format(_ident(name)))
    pg.execute(
        sql.SQL(
            "INSERT INTO {} (grp, v, pad) SELECT i % 100, 1, repeat('p', 100) FROM generate_series(1, 20000) i"
        ).format(_ident(name))
    )
    stop = threading.Event()
    writes = [0]

    def writer():
        with pg_cluster.connect() as conn:
            while not stop.is_set():
                with conn.transaction():
                    conn.execute(
                        sql.SQL("DELETE FROM {} WHERE id IN (SELECT id FROM {} ORDER BY random() LIMIT 50)").format(
                            _ident(name), _ident(name)
                        )
                    )
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} (grp, v, pad) SELECT i % 100, 1, repeat('q', 100) "
                            "FROM generate_series(1, 50) i"
                        ).format(_ident(name))
                    )
                writes[0] += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        query = sql.SQL("SELECT id, v FROM {}").format(_ident(name)).as_string(pg.conn)
        for parts in (8, 8, 1, 8, "key"):
            if parts == "key":  # a query split on a key column shares the snapshot the same way
                t = pystrom.read_postgres(pg.conninfo, query, partition_on="id", partitions=8, device=device)
            else:
                t = pystrom.read_postgres(pg.conninfo, table=name, columns=["id", "v"], partitions=parts, device=device)
            arrow = t.to_arrow()
            assert arrow.num_rows == 20000
            assert sum(arrow["v"].to_pylist()) == 20000
            assert len(set(arrow["id"].to_pylist())) == 20000
    finally:
        stop.set()
        thread.join()
    assert writes[0] > 0


def test_partitions_on_empty_and_one_page_tables(pg, device):
    empty = pg.name("empty")
    pg.execute(sql.SQL("CREATE TABLE {} (a int, s text)").format(_ident(empty)))
    t = pystrom.read_postgres(pg.conninfo, table=empty, partitions=8, device=device)
    assert t.num_rows == 0 and t.column_names == ["a", "s"]
    small = pg.name("small")
    pg.execute(sql.SQL("CREATE TABLE {} (a int, s text)").format(_ident(small)))
    pg.execute(sql.SQL("INSERT INTO {} SELECT i, i::text FROM generate_series(1, 10) i").format(_ident(small)))
    t8 = pystrom.read_postgres(pg.conninfo, table=small, partitions=8, device=device)
    t1 = pystrom.read_postgres(pg.conninfo, table=small, partitions=1, device=device)
    assert _rows(t8) == _rows(t1) == [(i, str(i)) for i in range(1, 11)]


def test_identifiers_weird_qualified_unicode(pg, device):
    weird = pg.name('we"ird name')
    pg.execute(sql.SQL('CREATE TABLE {} ("a""b" int, "größe" text)').format(_ident(weird)))
    pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 'ü'), (2, NULL)").format(_ident(weird)))
    t = pystrom.read_postgres(
        pg.conninfo, table=weird, columns=["größe", 'a"b'], where='"a""b" > %s', params=(1,), device=device
    )
    assert t.column_names == ["größe", 'a"b'] and t.to_arrow().to_pylist() == [{"größe": None, 'a"b': 2}]
    schema = pg.name("sch")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(_ident(schema)))
    try:
        pg.execute(sql.SQL("CREATE TABLE {}.{} (x int)").format(_ident(schema), _ident("données")))
        pg.execute(sql.SQL("INSERT INTO {}.{} VALUES (5)").format(_ident(schema), _ident("données")))
        t = pystrom.read_postgres(pg.conninfo, table=(schema, "données"), device=device)
        assert t.to_arrow().to_pylist() == [{"x": 5}]
        # a dotted name that no table has is read as SQL reads a qualified name (docs/postgres.md)
        t = pystrom.read_postgres(pg.conninfo, table=f"{schema}.données", device=device)
        assert t.to_arrow().to_pylist() == [{"x": 5}]
        with pytest.raises(PostgresError, match=rf"does not exist.*pass table=\('{schema}', 'autres'\)"):
            pystrom.read_postgres(pg.conninfo, table=f"{schema}.autres", device=device)
    finally:
        pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(_ident(schema)))


def test_injection_attempts_fail_as_errors(pg, wide_table):
    victim = pg.name("victim")
    pg.execute(sql.SQL("CREATE TABLE {} (a int)").format(_ident(victim)))
    for bad in [f"{wide_table}; DROP TABLE {victim}", f'{wide_table}"; DROP TABLE {victim}; --']:
        with pytest.raises(PostgresError, match="does not exist"):
            pystrom.read_postgres(pg.conninfo, table=bad, device="cpu")
    with pytest.raises(PostgresError, match="does not exist"):
        pystrom.read_postgres(pg.conninfo, table=wide_table, columns=[f'id" FROM x; DROP TABLE {victim}; --'])
    t = pystrom.read_postgres(pg.conninfo, "SELECT %s::text AS v", params=(f"'; DROP TABLE {victim}; --",))
    assert t.to_arrow()["v"].to_pylist() == [f"'; DROP TABLE {victim}; --"]
    assert pg.fetch(sql.SQL("SELECT count(*) FROM {}").format(_ident(victim))) == [(0,)]


def test_user_connection_is_used_and_left_usable(pg, wide_table, device):
    with psycopg.connect(pg.conninfo) as conn:
        conn.execute("CREATE TEMP TABLE only_here AS SELECT 1 AS x")  # visible only in this session
        t = pystrom.read_postgres(conn, table="only_here", device=device)
        assert t.to_arrow().to_pylist() == [{"x": 1}]
        assert conn.execute("SELECT 2").fetchone() == (2,)
        with pytest.raises(PostgresError, match="division by zero"):
            pystrom.read_postgres(conn, "SELECT 1 / (i - 20000) AS q FROM generate_series(1, 30000) i", device=device)
        conn.rollback()
        assert conn.execute("SELECT 3").fetchone() == (3,)
        t = pystrom.read_postgres(conn, table=wide_table, partitions=4, device=device)  # one stream on a user conn
        assert t.num_rows == 30000


def test_bad_dsn(pg_cluster):
    with pytest.raises(PostgresError, match="cannot connect") as info:
        pystrom.read_postgres(f"host=127.0.0.1 port={pg_cluster.port + 1} user=nobody password=s3cret", "SELECT 1")
    assert "s3cret" not in str(info.value)
    with pytest.raises(PostgresError, match="cannot connect"):
        pystrom.read_postgres("this is = not a dsn", "SELECT 1")


def test_missing_table_column_and_permission(pg, wide_table):
    with pytest.raises(PostgresError, match="does not exist"):
        pystrom.read_postgres(pg.conninfo, table="no_such_table")
    with pytest.raises(PostgresError, match='column "nope" does not exist'):
        pystrom.read_postgres(pg.conninfo, table=wide_table, columns=["id", "nope"])
    role = pg.name("reader")
    pg.execute(sql.SQL("CREATE ROLE {} LOGIN").format(_ident(role)))
    try:
        conninfo = pg.conninfo.replace("user=postgres", f"user={role}")
        with pytest.raises(PostgresError, match="permission denied"):
            pystrom.read_postgres(conninfo, table=wide_table)
    finally:
        pg.execute(sql.SQL("DROP ROLE {}").format(_ident(role)))


def test_partition_connection_refused_mid_read(pg, wide_table, device):
    """A partition connection that cannot be opened (the role's connection limit) while the first one
    already streams: a clear error, no table, no device memory kept, no connection left open."""
    before = device_memory_in_use(device)
    role = pg.name("limited")
    pg.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 2").format(_ident(role)))
    pg.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(_ident(wide_table), _ident(role)))
    try:
        conninfo = pg.conninfo.replace("user=postgres", f"user={role}")
        with pytest.raises(PostgresError, match="too many connections"):
            pystrom.read_postgres(conninfo, table=wide_table, partitions=4, device=device)
        assert device_memory_in_use(device) == before
        for _ in range(50):  # closed sessions leave pg_stat_activity a moment after the client closes
            left = pg.fetch("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,))
            if left == [(0,)]:
                break
            time.sleep(0.05)
        assert left == [(0,)]
        # within the limit the same read works
        assert pystrom.read_postgres(conninfo, table=wide_table, partitions=2, device=device).num_rows == 30000
    finally:
        pg.execute(sql.SQL("DROP OWNED BY {}").format(_ident(role)))
        pg.execute(sql.SQL("DROP ROLE {}").format(_ident(role)))


def test_json_xml_and_enums_arrive_as_their_text(pg, device):
    """json, xml and enum values travel in binary COPY as their text: strings equal to what psycopg
    returns as text, with NULLs and non-ASCII, in several partitions; pg2arrow keeps them as strings."""
    mood, name = pg.name("mood"), pg.name("docs")
    pg.execute(f"CREATE TYPE {mood} AS ENUM ('sad', 'ok', 'très heureux')")
    try:
        xml_ok = True
        try:
            pg.fetch("SELECT '<a/>'::xml")
        except Exception:  # a server built without libxml: its xml type cannot be made, nothing to read
            xml_ok = False
        xml = "CASE WHEN g % 4 = 0 THEN NULL ELSE xmlelement(name v, g, 'ü')::xml END" if xml_ok else "NULL::text"
        pg.execute(
            f"CREATE TABLE {name} AS SELECT g AS id, "
            "CASE WHEN g % 3 = 0 THEN NULL ELSE json_build_object('g', g, 's', repeat('é', g % 5)) END AS j, "
            f"{xml} AS x, "
            f"CASE WHEN g % 5 = 0 THEN NULL ELSE (ARRAY['sad', 'ok', 'très heureux'])[1 + g % 3]::{mood} END AS m "
            "FROM generate_series(1, 3000) g"
        )
        want = pg.fetch(f"SELECT id, j::text, x::text, m::text FROM {name} ORDER BY id")
        for partitions in (1, 3):
            t = pystrom.read_postgres(pg.conninfo, table=name, partitions=partitions, device=device)
            assert [str(ty) for ty in t.schema.types] == ["int32", "string", "string", "string"]
            got = to_host(t).sort_by("id")
            assert list(zip(*(got.column(c).to_pylist() for c in ["id", "j", "x", "m"]))) == want
        empty = pystrom.read_postgres(pg.conninfo, f"SELECT j, m FROM {name} WHERE false", device=device)
        assert empty.num_rows == 0 and [str(ty) for ty in empty.schema.types] == ["string", "string"]
    finally:
        pg.execute(f"DROP TABLE IF EXISTS {name}")
        pg.execute(f"DROP TYPE {mood}")


def test_jsonb_and_network_types_are_read_as_text(pg, device):
    """jsonb, inet, cidr, macaddr and macaddr8 are read through ``::text`` added to the SELECT: equal to
    psycopg's text of them, with NULLs, for table= (with and without columns=/where=, in ctid ranges)
    and query= reads (also in key ranges, the key itself not cast)."""
    name = pg.name("net")
    pg.execute(
        f"CREATE TABLE {name} AS SELECT g AS id, "
        "CASE WHEN g % 3 = 0 THEN NULL ELSE jsonb_build_object('g', g, 'é', repeat('x', g % 4)) END AS \"Doc\", "
        "CASE WHEN g % 4 = 0 THEN NULL "
        "ELSE ('10.0.' || (g % 256) || '.' || (g % 7) || '/' || (24 + g % 9))::inet END AS ip, "
        "('192.168.' || (g % 256) || '.0/24')::cidr AS net, "
        "CASE WHEN g % 5 = 0 THEN NULL ELSE ('08:00:2b:01:02:' || lpad(to_hex(g % 256), 2, '0'))::macaddr END AS mac, "
        "('08:00:2b:01:02:03:04:' || lpad(to_hex(g % 256), 2, '0'))::macaddr8 AS mac8, "
        "('2001:db8::' || to_hex(g))::inet AS v6 "
        "FROM generate_series(1, 4000) g"
    )
    try:
        text_cols = ['"Doc"', "ip", "net", "mac", "mac8", "v6"]
        # the server's output function (what psql shows): an inet host address without /32, unlike ::text
        outs = ", ".join(f"CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END" for c in text_cols)
        want = pg.fetch(f"SELECT id, {outs} FROM {name} ORDER BY id")
        assert any(r[2] is not None and "/" not in r[2] for r in want)  # host addresses are in the data
        names = ["id", "Doc", "ip", "net", "mac", "mac8", "v6"]

        def rows(t):
            got = to_host(t).sort_by("id")
            return list(zip(*(got.column(c).to_pylist() for c in names)))

        reads = [
            pystrom.read_postgres(pg.conninfo, table=name, columns=names, partitions=3, device=device),
            pystrom.read_postgres(
                pg.conninfo,
                f"SELECT {', '.join(names[:1] + text_cols)} FROM {name}",
                partition_on="id",
                partitions=3,
                device=device,
            ),  # fmt: skip
            pystrom.scan_postgres(pg.conninfo, table=name, columns=names, partitions=2, device=device).collect(),
        ]
        for t in reads:
            assert [str(ty) for ty in t.schema.types] == ["int32"] + ["string"] * 6
            assert rows(t) == want
        every = pystrom.read_postgres(pg.conninfo, table=name, where="id <= 10", device=device)
        assert every.column_names[:3] == ["id", "Doc", "ip"] and every.num_rows == 10
        assert rows(every) == want[:10]
    finally:
        pg.execute(f"DROP TABLE IF EXISTS {name}")


def test_intervals_arrive_as_month_day_nano(pg, device):
    """interval -> month_day_nano_interval (months, days, nanoseconds), the parts kept apart as
    PostgreSQL keeps them (negative ones too), NULLs, several partitions; a time part past int64
    nanoseconds raises naming the column and row."""
    name = pg.name("spans")
    pg.execute(
        f"CREATE TABLE {name} AS SELECT g AS id, CASE WHEN g % 6 = 0 THEN NULL ELSE make_interval("
        "months => (g % 25) - 12, days => (g % 61) - 30, secs => ((g % 2001) - 1000) * 1000003 / 1000000.0) END AS v "
        "FROM generate_series(1, 3000) g"
    )
    try:
        want = [
            None if g % 6 == 0 else ((g % 25) - 12, (g % 61) - 30, ((g % 2001) - 1000) * 1000003 * 1000)
            for g in range(1, 3001)
        ]
        for partitions in (1, 3):
            t = pystrom.read_postgres(pg.conninfo, table=name, partitions=partitions, device=device)
            assert t.schema.field("v").type == pa.month_day_nano_interval()
            got = to_host(t).sort_by("id").column("v").to_pylist()
            assert [None if v is None else (v.months, v.days, v.nanoseconds) for v in got] == want
        edge = pystrom.read_postgres(
            pg.conninfo, "SELECT interval '2000000 hours' AS a, interval '-178000000 years' AS b", device=device
        )
        a, b = to_host(edge).to_pylist()[0].values()
        assert (a.months, a.days, a.nanoseconds) == (0, 0, 2_000_000 * 3600 * 10**9)
        assert (b.months, b.days, b.nanoseconds) == (-178_000_000 * 12, 0, 0)
        with pytest.raises(PostgresError, match=r"column 'v' \(interval\), row 1: .*int64 nanoseconds"):
            pystrom.read_postgres(pg.conninfo, "SELECT * FROM (VALUES (interval '1 day'), (interval '3000000 hours')) "
                                  "AS q(v)", device=device)  # fmt: skip
    finally:
        pg.execute(f"DROP TABLE IF EXISTS {name}")


def test_unsupported_type_names_column_and_cast(pg):
    with pytest.raises(UnsupportedTypeError, match=r"'p'.*point.*p::text"):
        pystrom.read_postgres(pg.conninfo, "SELECT point(1, 2) AS p")


def test_bad_arguments(pg, wide_table):
    for kwargs in [
        {"query": "SELECT 1", "table": wide_table},
        {},
        {"table": wide_table, "partitions": 0},
        {"table": wide_table, "numeric": "text"},
        {"table": 42},
        {"table": wide_table, "columns": "id"},
        {"query": "SELECT 1", "where": "true"},
        {"query": "   ;"},
    ]:
        with pytest.raises(InvalidArgumentError):
            pystrom.read_postgres(pg.conninfo, **kwargs)
    with pytest.raises(InvalidArgumentError):
        pystrom.read_postgres(12345, "SELECT 1")
    with pytest.raises(pystrom.SchemaMismatchError, match="two columns named 'a'"):
        pystrom.read_postgres(pg.conninfo, "SELECT 1 AS a, 2 AS a")


def _big_query() -> str:
    return "SELECT i, md5(i::text) AS s FROM generate_series(1, 50000000) i"


def test_backend_terminated_mid_copy(pg, device):
    before = device_memory_in_use(device)
    killed = []

    def kill(rows: int) -> None:
        if not killed:
            pids = pg.fetch(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'COPY (SELECT i, md5%%' AND pid <> pg_backend_pid()"
            )
            for (pid,) in pids:
                pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
            killed.append(len(pids))

    with psycopg.connect(pg.conninfo) as conn:
        with pytest.raises(PostgresError, match="terminat|closed|lost"):
            pystrom.read_postgres(conn, _big_query(), device=device, progress=kill)
        assert killed == [1]
        with pytest.raises(psycopg.OperationalError):  # clearly failed, not silently half-usable
            conn.execute("SELECT 1")
    with pytest.raises(PostgresError, match="terminat|closed|lost"):
        killed.clear()
        pystrom.read_postgres(pg.conninfo, _big_query(), device=device, progress=kill)
    assert device_memory_in_use(device) == before


def test_interrupt_cancels_on_the_server(pg, device):
    def interrupt(rows: int) -> None:
        raise KeyboardInterrupt

    with psycopg.connect(pg.conninfo, autocommit=True) as conn:
        with pytest.raises(KeyboardInterrupt):
            pystrom.read_postgres(conn, _big_query(), device=device, progress=interrupt)
        assert conn.execute("SELECT 42").fetchone() == (42,)  # the COPY was cancelled and drained
    active = pg.fetch(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY (SELECT i, md5%%' "
        "AND state = 'active' AND pid <> pg_backend_pid()"
    )
    assert active == [(0,)]


def test_server_stopped_mid_read(pg, pg_cluster, device):
    before = device_memory_in_use(device)
    stopped = []

    def stop(rows: int) -> None:
        if not stopped:
            stopped.append(rows)
            pg_cluster.stop("fast")

    try:
        with pytest.raises(PostgresError):
            pystrom.read_postgres(pg_cluster.conninfo, _big_query(), device=device, progress=stop)
        assert stopped
    finally:
        pg_cluster.start()
        pg.conn = pg_cluster.connect(autocommit=True)
    assert device_memory_in_use(device) == before
    assert pystrom.read_postgres(pg_cluster.conninfo, "SELECT 1 AS x", device=device).num_rows == 1


def test_uuid_values_and_progress(pg, device):
    seen = []
    t = pystrom.read_postgres(
        pg.conninfo,
        "SELECT i, ('00000000-0000-0000-0000-' || lpad(to_hex(i), 12, '0'))::uuid AS u FROM generate_series(1, 5) i",
        device=device,
        progress=seen.append,
    )
    assert seen and seen[-1] == 5
    assert t.to_arrow()["u"].to_pylist() == [uuid.UUID(int=i) for i in range(1, 6)]


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("conftest").HAVE_GPU, reason="no CUDA GPU with CuPy in this environment")
def test_gpu_decoder_matches_cpu_twin(pg):
    # Many small chunks over 4 partitions: chunk boundaries, string scans and bitmaps across chunks.
    name = pg.name("twin")
    pg.execute(
        sql.SQL(
            "CREATE TABLE {} (i int8, f float4, n numeric, dn numeric(30, 6), d date, ts timestamptz, "
            "s text, u uuid, b bool)"
        ).format(_ident(name))
    )
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT CASE WHEN i % 11 = 0 THEN NULL ELSE i * 7919 END, i / 3.0, "
            "(random() * 10 ^ (i % 40 - 20))::numeric, round((random() * 1e12)::numeric, 6) * (1 - 2 * (i % 2)), "
            "'2000-01-01'::date + (i % 100000 - 50000), now() - i * interval '1 second', "
            "CASE WHEN i % 5 = 0 THEN NULL ELSE repeat(chr(945 + i % 20), i % 17) END, "
            "CASE WHEN i % 3 = 0 THEN NULL ELSE gen_random_uuid() END, i % 2 = 0 "
            "FROM generate_series(1, 40000) i"
        ).format(_ident(name))
    )
    with pystrom.defaults.set(pg_staging_chunk=65536):
        for numeric, columns in [("float64", None), ("decimal", ["i", "dn", "s", "b"])]:
            kw = {"table": name, "columns": columns, "partitions": 4, "numeric": numeric}
            cpu = pystrom.read_postgres(pg.conninfo, device="cpu", **kw)
            gpu = pystrom.read_postgres(pg.conninfo, device="cuda", **kw)
            assert gpu.device.startswith("cuda")
            assert gpu.to_arrow().equals(cpu.to_arrow())
            for column in cpu.column_names:
                assert gpu.column(column).null_count == cpu.column(column).null_count


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("conftest").HAVE_GPU, reason="no CUDA GPU with CuPy in this environment")
def test_gpu_decode_of_chunks_left_on_the_host(pg, wide_table, monkeypatch):
    """Chunks the reader threads could not copy to the device (no room for scratch) are copied and
    decoded one at a time; mixed with copied ones, the table equals the CPU read."""
    from pystrom.io.postgres.stream import Uploader

    upload = Uploader.__call__
    calls = [0]

    def every_other(self, chunk):
        calls[0] += 1
        if calls[0] % 2:
            upload(self, chunk)

    cpu = pystrom.read_postgres(pg.conninfo, table=wide_table, partitions=3, device="cpu")
    monkeypatch.setattr(Uploader, "__call__", every_other)
    with pystrom.defaults.set(pg_staging_chunk=65536):
        gpu = pystrom.read_postgres(pg.conninfo, table=wide_table, partitions=3, device="cuda")
    assert calls[0] > 4
    assert gpu.to_arrow().equals(cpu.to_arrow())


def test_query_partition_on_equals_one_stream(pg, wide_table, device):
    query = sql.SQL("SELECT id % 1000 - 300 AS k, v, s FROM {} UNION ALL SELECT NULL, 0, 'null key'").format(
        _ident(wide_table)
    )
    text = query.as_string(pg.conn)
    one = pystrom.read_postgres(pg.conninfo, text, device=device)
    split = pystrom.read_postgres(pg.conninfo, text, partition_on="k", partitions=6, device=device)
    auto = pystrom.read_postgres(pg.conninfo, text, partition_on="k", device=device)
    assert one.num_rows == split.num_rows == auto.num_rows == 30001
    key = lambda r: tuple((x is None, x) for x in r)  # noqa: E731 (NULL keys sort first)
    rows = sorted((tuple(r.values()) for r in one.to_arrow().to_pylist()), key=key)
    assert rows == sorted((tuple(r.values()) for r in split.to_arrow().to_pylist()), key=key)
    assert rows == sorted((tuple(r.values()) for r in auto.to_arrow().to_pylist()), key=key)
    tiny = pystrom.read_postgres(pg.conninfo, "SELECT 5 AS k", partition_on="k", partitions=8, device=device)
    assert tiny.to_arrow().to_pylist() == [{"k": 5}]
    empty = pystrom.read_postgres(pg.conninfo, "SELECT 1 AS k WHERE false", partition_on="k", partitions=8)
    assert empty.num_rows == 0


def test_partition_on_errors(pg, wide_table):
    with pytest.raises(pystrom.UnsupportedTypeError, match="partition_on column 's' has type text"):
        pystrom.read_postgres(pg.conninfo, f"SELECT * FROM {wide_table}", partition_on="s")
    with pytest.raises(pystrom.ColumnNotFoundError, match="'nope' is not in the result"):
        pystrom.read_postgres(pg.conninfo, f"SELECT * FROM {wide_table}", partition_on="nope")
    with pytest.raises(InvalidArgumentError, match="partition_on"):
        pystrom.read_postgres(pg.conninfo, table=wide_table, partition_on="id")
