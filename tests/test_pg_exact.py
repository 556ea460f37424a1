"""read_postgres is exact where the first loader fell short (issue 15): databases in LATIN1, WIN1252 and
EUC_JP (text, where= literals, parameters and query text, on the loader's connections and on a user's
connection in that encoding), numeric(p, s) as decimal128 over every precision and scale, numeric as
float64 at the ends of the double range, statements as users write them (comments, semicolons, CTEs),
and Ctrl-C during a read, acted on within a second while the server is still busy. References: psycopg's
own answers, Python's ``decimal`` and ``float(Decimal)``, the server's ``::float8``."""

from __future__ import annotations

import decimal
import math
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import PostgresError

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = pytest.mark.postgres

# -- encodings ------------------------------------------------------------------------------------

ENCODINGS = {  # server encoding: text that needs it (every character exists in that encoding)
    "LATIN1": "café ÿ Ærø ½",
    "WIN1252": "café € “quoted” ÿ",
    "EUC_JP": "日本語のテキスト café",
}


@pytest.fixture(scope="module")
def encoded_dbs(pg_cluster):
    """One database per server encoding (C locale, from template0), each with a table t(id, s) holding
    its text, dropped at the end."""
    dsns = {}
    with pg_cluster.connect(autocommit=True) as admin:
        for enc, text in ENCODINGS.items():
            db = f"pystrom_enc_{enc.lower()}"
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(db)))
            admin.execute(
                sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                    sql.Identifier(db), sql.Literal(enc)
                )
            )
            dsn = pg_cluster.conninfo.replace("dbname=postgres", f"dbname={db}")
            with psycopg.connect(dsn, autocommit=True) as conn:
                assert conn.execute("SHOW server_encoding").fetchone() == (enc,)
                conn.execute("CREATE TABLE t (id int, s text, v varchar(40), c char(30))")
                conn.execute("INSERT INTO t VALUES (1, %s, %s, %s), (2, 'plain', NULL, 'x')", (text, text[::-1], text))
                conn.execute("INSERT INTO t SELECT i, %s || i, NULL, NULL FROM generate_series(3, 3000) i", (text[:4],))
            dsns[enc] = dsn
        try:
            yield dsns
        finally:
            for enc in ENCODINGS:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(f"pystrom_enc_{enc.lower()}")
                    )
                )


def _psycopg_rows(dsn: str, enc: str, query: str, params=None) -> list[dict]:
    """psycopg's answer, on a connection in the database's own encoding (psycopg decodes it)."""
    with psycopg.connect(dsn, client_encoding=enc) as conn:
        cur = conn.execute(query, params)
        names = [d.name for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


@pytest.mark.parametrize("enc", list(ENCODINGS))
def test_text_from_non_utf8_databases_equals_psycopg(encoded_dbs, enc, device):
    dsn, text = encoded_dbs[enc], ENCODINGS[enc]
    want = _psycopg_rows(dsn, enc, "SELECT * FROM t ORDER BY id")
    for partitions in (1, 3):  # the snapshot joiners' connections too
        got = pystrom.read_postgres(dsn, table="t", partitions=partitions, device=device).to_arrow()
        got.validate(full=True)  # valid UTF-8 in every string
        assert got.sort_by("id").to_pylist() == want
    assert want[0]["s"] == text


@pytest.mark.parametrize("enc", list(ENCODINGS))
def test_where_literals_params_and_query_text_in_non_utf8_databases(encoded_dbs, enc, device):
    dsn, text = encoded_dbs[enc], ENCODINGS[enc]
    want = _psycopg_rows(dsn, enc, "SELECT id, s FROM t WHERE s = %s", (text,))
    assert len(want) == 1
    literal = "s = '" + text.replace("'", "''") + "'"
    reads = [
        pystrom.read_postgres(dsn, table="t", columns=["id", "s"], where=literal, device=device),
        pystrom.read_postgres(dsn, table="t", columns=["id", "s"], where="s = %s", params=(text,), device=device),
        pystrom.read_postgres(dsn, f"SELECT id, s FROM t WHERE {literal}", device=device),
        pystrom.read_postgres(dsn, "SELECT id, s FROM t WHERE s = %s", params=(text,), device=device),
        pystrom.read_postgres(dsn, f'SELECT id, s AS "{text[:4]}" FROM t WHERE {literal}', device=device),
        pystrom.read_postgres(dsn, table="t", columns=["id", "s"], where="s LIKE %s", params=(text[:4] + "1%",)),
    ]
    for got in reads[:4]:
        assert got.to_arrow().to_pylist() == want
    assert reads[4].column_names == ["id", text[:4]] and reads[4].num_rows == 1
    like = _psycopg_rows(dsn, enc, "SELECT id, s FROM t WHERE s LIKE %s", (text[:4] + "1%",))
    assert sorted(reads[5].to_arrow().to_pylist(), key=lambda r: r["id"]) == sorted(like, key=lambda r: r["id"])


@pytest.mark.parametrize("enc", list(ENCODINGS))
def test_user_connection_in_its_own_encoding(encoded_dbs, enc, device):
    """A user's connection whose client encoding is not UTF8: the read switches it to UTF8 and back,
    inside the user's transaction; after a failed read the rollback restores it as well."""
    dsn, text = encoded_dbs[enc], ENCODINGS[enc]
    want = _psycopg_rows(dsn, enc, "SELECT id, s FROM t WHERE s = %s", (text,))
    for autocommit in (True, False):
        with psycopg.connect(dsn, client_encoding=enc, autocommit=autocommit) as conn:
            got = pystrom.read_postgres(conn, "SELECT id, s FROM t WHERE s = %s", params=(text,), device=device)
            assert got.to_arrow().to_pylist() == want
            got = pystrom.read_postgres(conn, table="t", columns=["id", "s"], where="id = 1", device=device)
            assert got.to_arrow().to_pylist() == want
            assert conn.execute("SHOW client_encoding").fetchone() == (enc,)
            assert conn.execute("SELECT s FROM t WHERE id = 1").fetchone() == (text,)  # psycopg decodes as before
            with pytest.raises(PostgresError, match="division by zero"):
                pystrom.read_postgres(conn, "SELECT s, 1 / (id - 2) AS q FROM t", device=device)
            if not autocommit:
                conn.rollback()
            assert conn.execute("SHOW client_encoding").fetchone() == (enc,)
            assert conn.execute("SELECT s FROM t WHERE id = 1").fetchone() == (text,)


# -- numeric -> decimal128 -------------------------------------------------------------------------


@st.composite
def _decimal_columns(draw):
    precision = draw(st.integers(1, 38))
    scale = draw(st.integers(0, precision))
    top = 10**precision - 1
    unscaled = draw(st.lists(st.integers(-top, top), min_size=1, max_size=40))
    zeros = 10 ** draw(st.integers(0, precision))  # trailing zero digits: groups PostgreSQL strips
    some = draw(st.integers(-top, top))
    unscaled += [top, -top, 0, abs(some) // zeros * zeros * (1 if some >= 0 else -1)]
    exact = decimal.Context(prec=80)  # the default 28 digits would round 29-38 digit values
    return precision, scale, [decimal.Decimal(u).scaleb(-scale, context=exact) for u in unscaled]


_NUMERIC_ROWS = "SELECT x::numeric({p}, {s}) AS x FROM unnest(%s::text[]) WITH ORDINALITY AS t(x, i) ORDER BY i"


@given(column=_decimal_columns())
@example(column=(38, 10, [decimal.Decimal("9999999999999999999999999999.9999999999")]))
@example(column=(38, 2, [decimal.Decimal("-999999999999999999999999999999999999.99")]))
@example(column=(37, 1, [decimal.Decimal("999999999999999999999999999999999999.9")]))
@example(column=(38, 38, [decimal.Decimal("0.99999999999999999999999999999999999999")]))
@example(column=(38, 0, [decimal.Decimal(10**38 - 1), decimal.Decimal(-(10**38) + 1)]))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_decimal128_exact_for_every_precision_and_scale(pg_cluster, device, column):
    """Every value of numeric(p, s), p <= 38, reads as exactly that decimal128(p, s) (the decoder
    once summed the last digit group's zero padding first and refused (38, 10) values)."""
    precision, scale, values = column
    query = _NUMERIC_ROWS.format(p=precision, s=scale)
    got = pystrom.read_postgres(
        pg_cluster.conninfo, query, params=([str(v) for v in values],), numeric="decimal", device=device
    ).to_arrow()
    assert str(got.schema.field("x").type) == f"decimal128({precision}, {scale})"
    got.validate(full=True)
    with decimal.localcontext(prec=80):
        want = [v.quantize(decimal.Decimal(1).scaleb(-scale)) for v in values]
    assert got.column("x").to_pylist() == want


def _numeric(groups: list[int], weight: int, negative: bool = False, dscale: int = 0) -> bytes:
    """A numeric value in PostgreSQL's binary format: base-10000 digit groups, the first one's weight."""
    head = struct.pack("!hhHh", len(groups), weight, 0x4000 if negative else 0, dscale)
    return head + struct.pack(f"!{len(groups)}H", *groups)


@pytest.mark.parametrize(
    ("value", "failure"),
    [
        (_numeric([123, 4560], 0, dscale=3), "more fractional digits than the column's scale"),  # 123.456
        (_numeric([1], 10), "needs more than 38 digits"),  # 10^40
        (_numeric([9999] * 10, 9, negative=True), "needs more than 38 digits"),  # -(10^40 - 1)
        (_numeric([1], -1, dscale=4), "more fractional digits"),  # 0.0001 -> 0.00 would lose a digit
    ],
    ids=["scale", "overflow", "negative-overflow", "tiny"],
)
def test_decimal_that_does_not_fit_names_column_and_row(pg, device, value, failure):
    """Values a numeric(5, 2) column cannot hold (the server never sends them: a proxy swaps them into
    the COPY): refused naming the column and the row, never wrapped or rounded."""
    from test_pg_pump import HEADER, TRAILER, _hostile, _row

    ok = _numeric([1, 5000], 0, dscale=2)  # 1.50
    with _hostile(pg, HEADER + _row(b"\0\0\0\1", ok) + _row(b"\0\0\0\2", value) + TRAILER) as conn:
        with pytest.raises(PostgresError, match=r"column 'y' \(numeric\(5,2\)\), row 1: (.*)") as info:
            pystrom.read_postgres(conn, "SELECT 1 AS x, 1.5::numeric(5, 2) AS y", numeric="decimal", device=device)
    assert failure is None or failure in str(info.value)


# -- numeric -> float64 ----------------------------------------------------------------------------

DBL_MAX = "1.7976931348623157e308"
EXTREMES = [  # text -> float(Decimal(text)), each must read exactly so
    DBL_MAX,
    "-" + DBL_MAX,
    "1.7976931348623157081452742373170435679807056752584499659891747680315726078e308",  # DBL_MAX exactly
    "1.7976931348623158e308",  # below DBL_MAX + half an ulp: still DBL_MAX
    "1.7976931348623159e308",  # beyond: inf
    "-1.8e308",
    "1e309",
    "9" * 40 + "e290",
    "2.2250738585072014e-308",  # DBL_MIN
    "4.9406564584124654e-324",  # the smallest subnormal
    "2.4703282292062328e-324",  # just above half of it: rounds up (a tie in the first 53 bits)
    "2.4703282292062327e-324",  # just below: zero
    "2.2250738585072011e-308",  # between the largest subnormal and DBL_MIN, nearer the former
    "2.2250738585072012e-308",  # nearer DBL_MIN
    "5e-324",
    "1e-330",
    "-1e-400",
    "1e308",
    "1e-307",
    "123456789012345678901234567890e-330",
]


def _read_numeric(conninfo: str, texts: list[str], device: str) -> list[float]:
    query = "SELECT x::numeric AS x FROM unnest(%s::text[]) WITH ORDINALITY AS t(x, i) ORDER BY i"
    return pystrom.read_postgres(conninfo, query, params=(texts,), device=device).to_arrow()["x"].to_pylist()


def test_float64_at_the_ends_of_the_double_range(pg, device):
    got = _read_numeric(pg.conninfo, EXTREMES, device)
    assert got == [float(decimal.Decimal(t)) for t in EXTREMES]
    assert got == _read_numeric(pg.conninfo, EXTREMES, "cpu")
    assert got[0] == sys.float_info.max and got[1] == -sys.float_info.max and got[4] == math.inf
    for text, value in zip(EXTREMES, got):  # the server's own cast, where it answers (it refuses overflow)
        try:
            server = pg.fetch("SELECT %s::numeric::float8", (text,))[0][0]
        except psycopg.errors.NumericValueOutOfRange:
            assert math.isinf(value) or value == 0.0, text
            continue
        assert value == server, text


_finite = st.builds(
    lambda digits, exp, sign: decimal.Decimal(digits).scaleb(exp) * sign,
    st.integers(1, 10**40),
    st.integers(-380, 330),
    st.sampled_from([1, -1]),
)


@given(values=st.lists(_finite, min_size=1, max_size=60))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_float64_within_one_ulp_of_the_correctly_rounded_value(pg_cluster, device, values):
    """Any numeric reads within one unit in the last place of float(Decimal(text)) (correctly
    rounded), subnormals included; finite stays finite and only values beyond DBL_MAX become inf."""
    texts = [str(v) for v in values]
    got = _read_numeric(pg_cluster.conninfo, texts, device)
    for text, g in zip(texts, got):
        want = float(decimal.Decimal(text))
        if math.isinf(want) or math.isinf(g):
            assert g == want, text
        else:
            assert abs(g - want) <= math.ulp(want), text
    if device != "cpu":  # the CUDA kernel and its C++ twin round alike, bit for bit
        assert got == _read_numeric(pg_cluster.conninfo, texts, "cpu")


# -- statements as users write them ----------------------------------------------------------------

STATEMENTS = [
    "SELECT 1 AS x -- a trailing comment",
    "SELECT 1 AS x;",
    "SELECT 1 AS x ;; \n -- done\n",
    "SELECT 1 AS x; -- done",
    "SELECT 1 AS x /* a block comment; with ) in it */",
    "/* leading */ SELECT /* nested /* comment */ ; */ 1 AS x",
    "WITH a AS (SELECT 1 AS x) -- the CTE\nSELECT x FROM a;",
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 1) SELECT x FROM r",
    "SELECT x FROM (VALUES (1)) AS v(x)\n-- comment\n;",
]


@pytest.mark.parametrize("query", STATEMENTS)
def test_statements_as_users_write_them(pg, query):
    t = pystrom.read_postgres(pg.conninfo, query, device="cpu")
    assert t.to_arrow().to_pylist() == [{"x": 1}]
    assert t.to_arrow().to_pylist() == [dict(zip(["x"], r)) for r in pg.fetch(query.rstrip().rstrip(";"))]


@pytest.mark.parametrize(
    "query, value",
    [
        ("SELECT ';--' AS x; -- done", ";--"),
        ("SELECT $q$;--)$q$ AS x;", ";--)"),
        ("SELECT $$a;b$$ AS x", "a;b"),
        ("SELECT E'\\';--' AS x;", "';--"),
        ("SELECT 'it''s;' AS x -- c", "it's;"),
        ('SELECT 1 AS "x;--"', None),
    ],
)
def test_semicolons_and_dashes_inside_strings_are_kept(pg, query, value):
    t = pystrom.read_postgres(pg.conninfo, query, device="cpu").to_arrow()
    if value is None:
        assert t.column_names == ["x;--"]
    else:
        assert t.column("x").to_pylist() == [value]


def test_where_and_partitions_with_a_trailing_comment(pg):
    name = pg.name("cmt")
    pg.execute(sql.SQL("CREATE TABLE {} AS SELECT i FROM generate_series(1, 5000) i").format(sql.Identifier(name)))
    for partitions in (1, 3):
        t = pystrom.read_postgres(pg.conninfo, table=name, where="i > 4990 -- the last ten", partitions=partitions)
        assert sorted(t.to_arrow().column("i").to_pylist()) == list(range(4991, 5001))
    t = pystrom.read_postgres(
        pg.conninfo, f"SELECT i FROM {name} -- all\n", partition_on="i", partitions=3, device="cpu"
    )
    assert t.num_rows == 5000


def test_two_statements_are_refused_by_the_server(pg):
    with pytest.raises(PostgresError, match="syntax error"):
        pystrom.read_postgres(pg.conninfo, "SELECT 1 AS x; SELECT 2 AS y")


# -- Ctrl-C ----------------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys, time
    import pystrom
    dsn, table = sys.argv[1], sys.argv[2]
    print("ready", flush=True)
    try:
        if table == "-":
            pystrom.read_postgres(dsn, "SELECT 1 AS x FROM pg_sleep(20)", device="cpu")
        else:
            pystrom.read_postgres(dsn, table=table, where="pg_sleep(20) IS NOT NULL", partitions=4, device="cpu")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(0)
    sys.exit(3)
    """
)


def _sleeping(pg) -> int:
    return pg.fetch(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'COPY %%pg_sleep(20)%%'"
    )[0][0]


@pytest.mark.parametrize("streams", [1, 4])
def test_ctrl_c_while_the_server_has_sent_nothing(pg, streams):
    """SIGINT to a process whose read waits for a server that sends no row for 20 s: KeyboardInterrupt
    within a second (it took 19.5 s on one stream), and the query is cancelled on the server."""
    table = "-"
    if streams > 1:
        table = pg.name("sleepy")
        pg.execute(
            sql.SQL("CREATE TABLE {} AS SELECT i, repeat('x', 500) AS pad FROM generate_series(1, 20000) i").format(
                sql.Identifier(table)
            )
        )
    child = subprocess.Popen([sys.executable, "-c", _CHILD, pg.conninfo, table], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        while _sleeping(pg) < streams:
            assert time.monotonic() < deadline, "the COPY statements never started"
            time.sleep(0.02)
        time.sleep(0.3)  # well inside the server's sleep
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().strip()
        reacted = time.monotonic() - sent
        assert line == "interrupted"
        assert reacted < 1.5, f"KeyboardInterrupt after {reacted:.2f} s"
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    deadline = time.monotonic() + 5
    while _sleeping(pg):  # cancelled, not left running
        assert time.monotonic() < deadline, "the server still runs the cancelled COPY"
        time.sleep(0.05)
