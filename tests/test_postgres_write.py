"""write_postgres against a real PostgreSQL (tests/fix_pg.py): PostgreSQL -> Table -> PostgreSQL equal for
every type, NULLs and edge values (psycopg reads both tables); every pystrom type against pyarrow's own
values; the if_exists rules; and failures injected late in a write (a terminated writer, a unique
violation in the last rows, Ctrl-C) leave the target as it was and no staging table behind."""

from __future__ import annotations

import datetime as dt
import decimal
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import DataError, InvalidArgumentError, PostgresError, UnsupportedTypeError

from conftest import device_memory_in_use

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = pytest.mark.postgres

# Every type read_postgres reads, with the loader tests' edge values (tests/test_postgres.py) and large
# decimals (36 digits where the scale is not a multiple of 4: read_postgres refuses 37 and 38 there, a
# reader limit; test_decimals_equal_pyarrow writes every precision up to 38 at every scale).
SOURCE_DDL = """(id int4, b bool, i2 int2, i4 int4, i8 int8, f4 float4, f8 float8, n numeric(38, 6),
 nbig numeric(38, 0), nfrac numeric(38, 38), d date, ts timestamp, tz timestamptz, s text, vc varchar(10),
 bp char(4), nm name, u uuid, o oid, by bytea)"""

SOURCE_ROWS = """
(1, true, -32768, -2147483648, -9223372036854775808, 'NaN', 'NaN', '-999999999999999999999999999999.999999',
 '-99999999999999999999999999999999999999', '-0.999999999999999999999999999999999999', '4713-01-01 BC',
 '4713-01-01 00:00:00 BC', '4713-01-01 00:00:00+00 BC', '', '', '', '', '00000000-0000-0000-0000-000000000000', 0, ''),
(2, false, 32767, 2147483647, 9223372036854775807, 'Infinity', 'Infinity', '999999999999999999999999999999.999999',
 '99999999999999999999999999999999999999', '0.999999999999999999999999999999999999', '5874897-12-31',
 '294246-12-31 23:59:59.999999', '2024-02-29 23:59:59.999999+05:30', 'héllo wörld 日本語 😀', 'ünïcødé', 'ab',
 'a_name', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 4294967295, '\\\\x00ff10'),
(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
(4, true, 0, 0, 0, '-Infinity', '-Infinity', 0, 0, 0, 'infinity', 'infinity', 'infinity', 'x', 'y', 'zzzz', 'n',
 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 1, '\\\\x'),
(5, false, -1, -1, -1, -0.0, 1e-310, '0.000001', '1', '0.00000000000000000000000000000000000001', '-infinity',
 '-infinity', '-infinity', repeat('long ', 200), 'tenletters', 'a', 'x', gen_random_uuid(), 42, '\\\\xdeadbeef'),
(6, true, 1, 1, 1, 3.4028235e38, 1.7976931348623157e308, '-1.5', '10000', '0.5', '2000-01-02',
 '2000-01-01 00:00:00.000001', '1969-12-31 23:59:59.5-08', 'tab\there', 'nul?', 'b', 'y', gen_random_uuid(), 7,
 '\\\\x01'),
(7, false, 2, 2, 2, 1.5, 0.1, '12345678.000100', '-10000', '0.0001', '1970-01-01', '1900-06-15 12:34:56.789',
 NULL, 'z', NULL, NULL, NULL, NULL, NULL, NULL)
"""

COLUMNS = ["id", "b", "i2", "i4", "i8", "f4", "f8", "n", "nbig", "nfrac", "d", "ts", "tz", "s", "vc", "bp", "nm", "u"]
COLUMNS += ["o", "by"]


def _ident(*names: str) -> sql.Identifier:
    return sql.Identifier(*names)


def _text_rows(pg, name: str) -> list[tuple]:
    """Every value as PostgreSQL prints it (psycopg cannot hold dates before 1 AD or infinities). bpchar
    becomes text with its padding (as read_postgres reads it), which ::text would strip from the source."""
    cast = {"bp": "::char(4)::text"}
    cols = sql.SQL(", ").join(sql.SQL("{}" + cast.get(c, "::text")).format(_ident(c)) for c in COLUMNS)
    return pg.fetch(sql.SQL("SELECT {} FROM {} ORDER BY id").format(cols, _ident(name)))


def _value_rows(pg, name: str, where: str = "TRUE") -> list[tuple]:
    return pg.fetch(sql.SQL("SELECT * FROM {} WHERE " + where + " ORDER BY id").format(_ident(name)))


def _staging_tables(pg) -> list[str]:
    return [r[0] for r in pg.fetch("SELECT relname FROM pg_class WHERE relname LIKE '\\_pystrom\\_w\\_%%'")]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, decimal.Decimal) and isinstance(b, decimal.Decimal) and a.is_nan() and b.is_nan():
        return True
    return a == b


@pytest.fixture
def source(pg):
    name = pg.name("src")
    pg.execute(sql.SQL("CREATE TABLE {} " + SOURCE_DDL).format(_ident(name)))
    pg.execute(sql.SQL("INSERT INTO {} VALUES " + SOURCE_ROWS).format(_ident(name)))
    return name


def test_round_trip_every_type_equal(pg, source, device):
    """PostgreSQL -> Table -> PostgreSQL: the copy equals the source in PostgreSQL's own text of every
    value and in psycopg's Python values (rows whose dates Python can hold)."""
    t = pystrom.read_postgres(pg.conninfo, table=source, numeric="decimal", device=device)
    for partitions in (1, 3):
        out = pg.name("out")
        assert pystrom.write_postgres(t, pg.conninfo, out, partitions=partitions) == 7
        assert _text_rows(pg, out) == _text_rows(pg, source)
        python_dates = "id NOT IN (1, 2, 4, 5)"
        got, want = _value_rows(pg, out, python_dates), _value_rows(pg, source, python_dates)
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            assert all(_same(a, b) for a, b in zip(g, w)), (g, w)
    types = dict(
        pg.fetch(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0",
            (out,),
        )
    )
    assert types == {
        "id": "integer", "b": "boolean", "i2": "smallint", "i4": "integer", "i8": "bigint", "f4": "real",
        "f8": "double precision", "n": "numeric(38,6)", "nbig": "numeric(38,0)", "nfrac": "numeric(38,38)",
        "d": "date", "ts": "timestamp without time zone", "tz": "timestamp with time zone", "s": "text",
        "vc": "text", "bp": "text", "nm": "text", "u": "uuid", "o": "bigint", "by": "bytea",
    }  # fmt: skip
    # And back again: the copy reads into the same table.
    again = pystrom.read_postgres(pg.conninfo, table=out, numeric="decimal", device="cpu")
    a, b = again.to_arrow().sort_by("id"), t.to_arrow().sort_by("id")
    for c in COLUMNS:
        if c in ("f4", "f8"):  # NaN: compare the values, not Arrow's equality
            assert all(_same(x, y) for x, y in zip(a[c].to_pylist(), b[c].to_pylist())), c
        elif c != "o":  # oid -> bigint: read back as int64
            assert a[c].equals(b[c]), c
    assert a["o"].to_pylist() == b["o"].to_pylist()


def test_float64_numeric_and_user_connection(pg, source, device):
    """The default numeric='float64' read writes double precision; on a user's connection the write runs
    inside its transaction (a savepoint) and is theirs to commit."""
    t = pystrom.read_postgres(pg.conninfo, table=source, columns=["id", "f8", "n", "s"], device=device)
    out = pg.name("out")
    with psycopg.connect(pg.conninfo) as conn:
        conn.execute("SELECT 1")  # a transaction is open
        assert pystrom.write_postgres(t, conn, out) == 7
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert pg.fetch("SELECT to_regclass(%s)", (out,)) == [(None,)]  # not committed yet
        conn.commit()
    rows = pg.fetch(sql.SQL("SELECT id, f8, n, s FROM {} ORDER BY id").format(_ident(out)))
    want = t.to_arrow().sort_by("id").to_pylist()
    for r, w in zip(rows, want):
        assert all(_same(a, b) for a, b in zip(r, w.values())), (r, w)


def _arrow_table() -> pa.Table:
    """Every pystrom type, including those PostgreSQL never hands to read_postgres."""
    ts = [dt.datetime(1970, 1, 1), dt.datetime(1899, 12, 31, 23, 59, 59), None, dt.datetime(2262, 4, 11, 23, 47, 16)]
    return pa.table(
        {
            "id": pa.array([0, 1, 2, 3], pa.int32()),
            "i8": pa.array([-128, 127, None, 0], pa.int8()),
            "u8": pa.array([0, 255, None, 1], pa.uint8()),
            "u16": pa.array([0, 65535, None, 1], pa.uint16()),
            "u32": pa.array([0, 4294967295, None, 1], pa.uint32()),
            "u64": pa.array([0, 18446744073709551615, None, 9223372036854775808], pa.uint64()),
            "f16": pa.array(np.array([1.5, -65504.0, np.nan, 5.96e-08], dtype=np.float16), pa.float16()),
            "f32": pa.array([float("inf"), -0.0, None, 1e-45], pa.float32()),
            "dec": pa.array(
                [decimal.Decimal("-1.05"), decimal.Decimal("999999.99"), None, decimal.Decimal("0.01")],
                pa.decimal128(8, 2),
            ),  # fmt: skip
            "dec0": pa.array(
                [decimal.Decimal(10**37), decimal.Decimal(-7), None, decimal.Decimal(0)], pa.decimal128(38, 0)
            ),
            "d64": pa.array([0, -86400000 * 365, None, 86400000 * 20000], pa.date64()),
            "t_s": pa.array(ts, pa.timestamp("s")),
            "t_ms": pa.array(ts, pa.timestamp("ms", tz="Europe/Paris")),
            "t_ns": pa.array([0, -1, None, 1_700_000_000_123_456_789], pa.timestamp("ns")),
            "tm32": pa.array([0, 86399, None, 3600], pa.time32("s")),
            "tm64": pa.array([0, 86_399_999_999_999, None, 1_000], pa.time64("ns")),
            "dur": pa.array([0, -1_500_000, None, 86_400_000_000 * 40], pa.duration("us")),
            "dur_s": pa.array([1, -1, None, 10**9], pa.duration("s")),
            "fsb": pa.array([b"abc", b"\x00\x00\x00", None, b"\xff\xfe\xfd"], pa.binary(3)),
            "bin": pa.array([b"", b"\x00", None, b"x" * 1000], pa.binary()),
            "s": pa.array(["", "NULL", None, "é\u2603"], pa.utf8()),
        }
    )


def test_every_pystrom_type_against_pyarrow(pg, device):
    """Types PostgreSQL cannot produce (unsigned ints, float16, date64, times, durations, other units):
    psycopg's reading of the written table equals pyarrow's own Python values."""
    data = _arrow_table()
    t = pystrom.Table.from_arrow(data, device=device)
    out = pg.name("out")
    pystrom.write_postgres(t, pg.conninfo, out)
    rows = pg.fetch(sql.SQL("SELECT * FROM {} ORDER BY id").format(_ident(out)))
    types = dict(pg.fetch("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                          "WHERE attrelid = %s::regclass AND attnum > 0", (out,)))  # fmt: skip
    assert types["u32"] == "bigint" and types["u64"] == "numeric(20,0)" and types["f16"] == "real"
    assert types["tm32"] == "time without time zone" and types["dur"] == "interval" and types["fsb"] == "bytea"
    assert types["t_ms"] == "timestamp with time zone" and types["d64"] == "date"
    want = data.to_pylist()
    utc = dt.timezone.utc
    for row, w in zip(rows, want):
        got = dict(zip(data.column_names, row))
        for name, value in w.items():
            g = got[name]
            if value is None:
                assert g is None, name
            elif name in ("f16", "f32"):  # psycopg reads real from its text: compare as float32
                a, b = np.float32(g), np.float32(value)
                assert (a == b and np.signbit(a) == np.signbit(b)) or (np.isnan(a) and np.isnan(b)), (name, g, value)
            elif name in ("u64", "dec", "dec0"):
                assert g == decimal.Decimal(value), (name, g, value)
            elif name == "t_ms":
                assert g == value.astimezone(utc), (name, g, value)
            elif name == "t_ns":
                assert g == dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=math.floor(value.value / 1000)), name
            elif name == "tm64":
                assert g == value.replace(microsecond=value.microsecond), (name, g, value)
            elif name in ("fsb", "bin"):
                assert bytes(g) == value, name
            else:
                assert g == value, (name, g, value)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 38).flatmap(
        lambda p: st.tuples(
            st.just(p),
            st.integers(0, p),
            st.lists(st.integers(-(10**p) + 1, 10**p - 1), min_size=1, max_size=40),
        )
    )
)
def test_decimals_equal_pyarrow(pg_cluster, case):
    """Any decimal128(p, s) value arrives as the Decimal pyarrow holds (base-10000 digits, weight, sign
    and dscale encoded right for every scale alignment)."""
    precision, scale, unscaled = case
    exact = decimal.Context(prec=60)
    values = [decimal.Decimal(u).scaleb(-scale, exact) for u in unscaled]
    t = pystrom.Table.from_arrow(pa.table({"x": pa.array(values, pa.decimal128(precision, scale))}), device="cpu")
    with pg_cluster.connect() as conn:
        pystrom.write_postgres(t, conn, "dec_prop", if_exists="replace")
        got = [r[0] for r in conn.execute('SELECT x FROM "dec_prop"').fetchall()]
        conn.rollback()
    assert got == values
    assert all(g.as_tuple().exponent == -scale for g in got if g != 0 or scale)


def test_zero_and_one_row_and_nulls_only(pg, source, device):
    for where in ("FALSE", "id = 3", "id = 2"):
        t = pystrom.read_postgres(pg.conninfo, table=source, where=where, numeric="decimal", device=device)
        out = pg.name("out")
        assert pystrom.write_postgres(t, pg.conninfo, out, partitions=2) == t.num_rows
        want = [
            r
            for r in _text_rows(pg, source)
            if (where == "id = 3" and r[0] == "3") or (where == "id = 2" and r[0] == "2")
        ]
        assert _text_rows(pg, out) == want
    assert _staging_tables(pg) == []


def test_if_exists_rules(pg, device):
    out = pg.name("out")
    t = pystrom.Table.from_arrays({"k": np.arange(5, dtype=np.int64), "v": np.arange(5) * 0.5}, device=device)
    assert pystrom.write_postgres(t, pg.conninfo, out) == 5
    with pytest.raises(InvalidArgumentError, match="already exists.*if_exists"):
        pystrom.write_postgres(t, pg.conninfo, out)
    # append keeps the target (its types, constraints, extra columns with defaults) and adds the rows
    pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN k TYPE int4, ADD COLUMN note text DEFAULT 'd'").format(_ident(out)))
    assert pystrom.write_postgres(t, pg.conninfo, out, if_exists="append", partitions=2) == 5
    assert pg.fetch(sql.SQL("SELECT count(*), sum(k), min(note) FROM {}").format(_ident(out))) == [(10, 20, "d")]
    assert pg.fetch("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
                    "AND attname = 'k'", (out,)) == [("integer",)]  # fmt: skip
    # replace puts a new table of the written columns in place
    assert pystrom.write_postgres(t.select(["v"]), pg.conninfo, out, if_exists="replace") == 5
    assert pg.fetch(sql.SQL("SELECT count(*), sum(v) FROM {}").format(_ident(out))) == [(5, 5.0)]
    assert [r[0] for r in pg.fetch("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0",
                                   (out,))] == ["v"]  # fmt: skip
    # append to a missing table creates it; columns= picks and orders
    fresh = pg.name("fresh")
    assert pystrom.write_postgres(t, pg.conninfo, fresh, if_exists="append", columns=["v", "k"]) == 5
    assert [r[0] for r in pg.fetch("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                                   "ORDER BY attnum", (fresh,))] == ["v", "k"]  # fmt: skip
    assert _staging_tables(pg) == []


def test_names_schemas_and_search_path(pg):
    weird = pg.name('we"ird name.x')
    t = pystrom.Table.from_arrays({"Mixed Case": np.arange(3), 'q"uote': np.arange(3.0)}, device="cpu")
    pystrom.write_postgres(t, pg.conninfo, weird)
    assert pg.fetch(sql.SQL('SELECT sum("Mixed Case"), sum({}) FROM {}').format(_ident('q"uote'), _ident(weird))) == [
        (3, 3.0)
    ]
    pg.execute("CREATE SCHEMA IF NOT EXISTS wschema")
    try:
        pystrom.write_postgres(t, pg.conninfo, ("wschema", "tt"))
        pystrom.write_postgres(t, pg.conninfo, ("wschema", "tt"), if_exists="replace", partitions=2)
        assert pg.fetch("SELECT count(*) FROM wschema.tt") == [(3,)]
        # an unqualified name found on the search path is replaced where it is
        conninfo = pg.conninfo + " options='-c search_path=wschema,public'"
        pystrom.write_postgres(t.slice(0, 1), conninfo, "tt", if_exists="replace")
        assert pg.fetch("SELECT count(*) FROM wschema.tt") == [(1,)]
        assert pg.fetch("SELECT to_regclass('public.tt')") == [(None,)]
    finally:
        pg.execute("DROP SCHEMA wschema CASCADE")


def test_bad_arguments_and_values(pg):
    t = pystrom.Table.from_arrays({"x": np.arange(3)}, device="cpu")
    with pytest.raises(InvalidArgumentError, match="if_exists"):
        pystrom.write_postgres(t, pg.conninfo, "x", if_exists="truncate")
    with pytest.raises(InvalidArgumentError, match="partitions"):
        pystrom.write_postgres(t, pg.conninfo, "x", partitions=0)
    with pytest.raises(InvalidArgumentError, match="name"):
        pystrom.write_postgres(t, pg.conninfo, ("a", "b", "c"))
    with pytest.raises(InvalidArgumentError, match=r"write_postgres\(table, conninfo, name, .*got builtins.dict"):
        pystrom.write_postgres({"x": [1]}, pg.conninfo, "x")  # pyarrow and pandas tables are taken (test_pg_hints)
    with pytest.raises(pystrom.ColumnNotFoundError, match="'nope'"):
        pystrom.write_postgres(t, pg.conninfo, "x", columns=["nope"])
    with pytest.raises(PostgresError, match="cannot connect"):
        pystrom.write_postgres(t, "host=127.0.0.1 port=1 connect_timeout=2", "x")
    with pytest.raises(UnsupportedTypeError, match="'d'.*negative scale"):
        neg = pa.table({"d": pa.array([decimal.Decimal("1E+3")], pa.decimal128(5, -2))})
        pystrom.write_postgres(pystrom.Table.from_arrow(neg, device="cpu"), pg.conninfo, "x")
    out = pg.name("bad")
    far = pa.table({"d": pa.array([0, 2_146_000_000], pa.date32())})  # not INT32_MAX (infinity): out of range
    with pytest.raises(DataError, match=r"column 'd' \(date\), row 1: a date or timestamp outside"):
        pystrom.write_postgres(pystrom.Table.from_arrow(far, device="cpu"), pg.conninfo, out)
    late = pa.table({"t": pa.array([0, 86_400_000_001], pa.time64("us"))})
    with pytest.raises(DataError, match=r"column 't' \(time\), row 1: a time of day"):
        pystrom.write_postgres(pystrom.Table.from_arrow(late, device="cpu"), pg.conninfo, out)
    with pytest.raises(DataError, match=r"column 't'.*row 0"):
        ts = pa.table({"t": pa.array([-(2**62)], pa.timestamp("s"))})
        pystrom.write_postgres(pystrom.Table.from_arrow(ts, device="cpu"), pg.conninfo, out)
    assert pg.fetch("SELECT to_regclass(%s)", (out,)) == [(None,)]  # refused before anything was created
    bad_text = pa.table({"s": pa.array([b"ok", b"\xff\xfe"], pa.binary())}).cast(pa.schema([("s", pa.binary())]))
    tb = pystrom.Table.from_arrow(bad_text, device="cpu")
    pystrom.write_postgres(tb, pg.conninfo, out)  # bytea takes any bytes
    assert [bytes(r[0]) for r in pg.fetch(sql.SQL("SELECT s FROM {}").format(_ident(out)))] == [b"ok", b"\xff\xfe"]


# -- failures late in a write leave the target as it was and no staging table -------------------------


def _big(device: str, n: int = 400_000) -> pystrom.Table:
    k = np.arange(n, dtype=np.int64) + 1000
    return pystrom.Table.from_arrays(
        {"k": k, "x": k * 0.25, "s": np.array([f"row {i}" for i in range(n)])}, device=device
    )


def _target(pg, rows: int = 10) -> str:
    out = pg.name("target")
    pg.execute(sql.SQL("CREATE TABLE {} (k bigint PRIMARY KEY, x float8, s text)").format(_ident(out)))
    pg.execute(
        sql.SQL("INSERT INTO {} SELECT i, i, 'old' FROM generate_series(0, %s) i").format(_ident(out)), (rows - 1,)
    )
    return out


def _snapshot(pg, name: str) -> list[tuple]:
    return pg.fetch(sql.SQL("SELECT * FROM {} ORDER BY k").format(_ident(name)))


def _copies(pg) -> list[tuple]:
    return pg.fetch(
        "SELECT pid, query FROM pg_stat_activity WHERE query LIKE 'COPY %%_pystrom_w_%%' AND state = 'active' "
        "AND pid <> pg_backend_pid()"
    )


@pytest.mark.parametrize("mode", ["replace", "append"])
@pytest.mark.parametrize("victim", ["first", "other"])
def test_writer_terminated_late_leaves_target_unchanged(pg, device, mode, victim):
    """pg_terminate_backend on one writer after ~70% of the rows were sent: the first connection (the
    one that would finish the write) or another one."""
    out = _target(pg)
    before = _snapshot(pg, out)
    t = _big(device)
    memory = device_memory_in_use(device)
    killed = []

    def kill(rows: int) -> None:
        if killed or rows < 0.7 * t.num_rows:
            return
        copies = _copies(pg)
        staging = [r[0] for r in pg.fetch("SELECT relname FROM pg_class WHERE relname LIKE '\\_pystrom\\_w\\_%%'")]
        first = int(staging[0].split("_")[3])
        pids = [p for p, _ in copies if (p == first) == (victim == "first")]
        if not pids:  # no such writer in its COPY at this report (another may have finished its rows): the next
            return  # report tries again, and `assert killed` below still fails a run where none came
        pg.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        killed.append(pids[0])

    with pystrom.defaults.set(pg_write_chunk=1 << 16):  # many chunks: the kill lands mid-COPY
        with pytest.raises(PostgresError, match="terminat|closed|lost|connection"):
            pystrom.write_postgres(t, pg.conninfo, out, if_exists=mode, partitions=3, progress=kill)
    assert killed
    assert _snapshot(pg, out) == before
    assert _staging_tables(pg) == []
    assert _copies(pg) == []
    assert device_memory_in_use(device) == memory  # the encoder's device memory is back in the pool


@pytest.mark.parametrize("partitions", [1, 3])
def test_unique_violation_in_the_last_rows(pg, device, partitions):
    out = _target(pg)
    before = _snapshot(pg, out)
    n = 200_000
    k = np.arange(n, dtype=np.int64) + 1000
    k[-1] = 5  # the last row collides with a row the target holds
    t = pystrom.Table.from_arrays({"k": k, "x": k * 0.5, "s": np.array(["new"] * n)}, device=device)
    with pytest.raises(PostgresError, match="duplicate key value violates unique constraint"):
        pystrom.write_postgres(t, pg.conninfo, out, if_exists="append", partitions=partitions)
    assert _snapshot(pg, out) == before
    assert _staging_tables(pg) == []
    # On a user's connection: its savepoint is rolled back, its transaction goes on.
    with psycopg.connect(pg.conninfo) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (-1, 0, 'mine')").format(_ident(out)))
        with pytest.raises(PostgresError, match="duplicate key"):
            pystrom.write_postgres(t, conn, out, if_exists="append")
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_ident(out))).fetchone() == (11,)
        conn.commit()
    assert len(_snapshot(pg, out)) == 11
    assert _staging_tables(pg) == []


@pytest.mark.parametrize("partitions", [1, 3])
def test_interrupt_rolls_everything_back(pg, device, partitions):
    out = _target(pg)
    before = _snapshot(pg, out)
    t = _big(device)

    def interrupt(rows: int) -> None:
        if rows > t.num_rows // 2:
            raise KeyboardInterrupt

    with pystrom.defaults.set(pg_write_chunk=1 << 16):
        with pytest.raises(KeyboardInterrupt):
            pystrom.write_postgres(t, pg.conninfo, out, if_exists="replace", partitions=partitions, progress=interrupt)
        assert _snapshot(pg, out) == before
        assert _staging_tables(pg) == [] and _copies(pg) == []
        with psycopg.connect(pg.conninfo, autocommit=True) as conn:
            with pytest.raises(KeyboardInterrupt):
                pystrom.write_postgres(t, conn, out, if_exists="replace", progress=interrupt)
            assert conn.execute("SELECT 42").fetchone() == (42,)  # the COPY was ended, the connection idle
    assert _snapshot(pg, out) == before


def test_user_connection_terminated_mid_write(pg, device):
    out = _target(pg)
    before = _snapshot(pg, out)
    t = _big(device)
    with psycopg.connect(pg.conninfo) as conn:
        pid = conn.info.backend_pid

        def kill(rows: int) -> None:
            if rows > t.num_rows // 2 and _copies(pg):
                pg.execute("SELECT pg_terminate_backend(%s)", (pid,))

        with pystrom.defaults.set(pg_write_chunk=1 << 16):
            with pytest.raises(PostgresError):
                pystrom.write_postgres(t, conn, out, if_exists="append", progress=kill)
        with pytest.raises(psycopg.OperationalError):  # clearly failed, not silently half-usable
            conn.execute("SELECT 1")
    assert _snapshot(pg, out) == before


def test_concurrent_readers_see_old_or_new(pg, device):
    """While a replace runs, other sessions read the old table; afterwards the new one, never a mix."""
    out = _target(pg)
    t = _big(device, 100_000)
    seen = []

    def look(rows: int) -> None:
        seen.append(pg.fetch(sql.SQL("SELECT count(*) FROM {}").format(_ident(out)))[0][0])

    with pystrom.defaults.set(pg_write_chunk=1 << 16):
        pystrom.write_postgres(t, pg.conninfo, out, if_exists="replace", partitions=2, progress=look)
    assert seen and set(seen) == {10}
    assert pg.fetch(sql.SQL("SELECT count(*), min(k) FROM {}").format(_ident(out))) == [(100_000, 1000)]


def test_predictions_as_a_column(pg, device):
    """The docs' workflow: train on a table read from PostgreSQL, write the predicted probabilities
    back beside the keys, and compare them with the same model evaluated by PostgreSQL itself."""
    from pystrom.ml import logregr_predict_prob, logregr_train

    src = pg.name("logreg")
    pg.execute(sql.SQL("CREATE TABLE {} AS SELECT i AS id, x1, x2, 1 + 2 * x1 - 3 * x2 + sin(i) > 0 AS t FROM "
                       "(SELECT i, sin(i * 1.7) AS x1, cos(i * 0.3) AS x2 FROM generate_series(1, 5000) i) s"
                       ).format(_ident(src)))  # fmt: skip
    t = pystrom.read_postgres(pg.conninfo, table=src, device=device)
    model = logregr_train(t, "t", ["1", "x1", "x2"])
    p = logregr_predict_prob(model, t)
    scores = pystrom.Table.from_arrays({"id": t["id"], "p": p}, device=device)
    out = pg.name("scores")
    assert pystrom.write_postgres(scores, pg.conninfo, out) == 5000
    b0, b1, b2 = (float(c) for c in model.coefficients_)
    worst = pg.fetch(
        sql.SQL(
            "SELECT max(abs(s.p - 1 / (1 + exp(-(%s + %s * l.x1 + %s * l.x2))))) FROM {} s JOIN {} l USING (id)"
        ).format(_ident(out), _ident(src)),
        (b0, b1, b2),
    )[0][0]
    assert worst < 1e-12
