"""read_postgres refuses clearly (issue 15, case 7): cast hints that name a column the way SQL must
spell it, connection errors with no part of a password in them (message, cause and traceback), and a
string column past 2 GiB refused as soon as its bytes pass the limit, not after the last byte."""

from __future__ import annotations

import time
import traceback

import pytest

import pystrom
from pystrom import CapacityError, PostgresError, UnsupportedTypeError

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize(
    ("alias", "expr", "spelled"),
    [
        ("Weird Col", "'{[1,5)}'::int4multirange", '"Weird Col"'),
        ('we"ird', "point(1, 2)", '"we""ird"'),
        ("select", "'12:00+02'::timetz", '"select"'),
        ("Upper", "'a b'::tsvector", '"Upper"'),
        ("plain_name", "'x'::\"char\"", "plain_name"),
        ("Mixed", "ARRAY['a'::bytea]", '"Mixed"'),
    ],
)
def test_cast_hints_spell_the_column_as_sql_must(pg, alias, expr, spelled):
    query = sql.SQL("SELECT {} AS {}").format(sql.SQL(expr), sql.Identifier(alias)).as_string(pg.conn)
    with pytest.raises(UnsupportedTypeError) as info:
        pystrom.read_postgres(pg.conninfo, query)
    hint = str(info.value).split("e.g. ", 1)[1]
    assert spelled in hint
    # the hint works as written: the column read through it
    fixed = f"SELECT {hint} AS x FROM (SELECT {expr} AS {spelled}) AS q"
    assert pystrom.read_postgres(pg.conninfo, fixed, device="cpu").num_rows == 1


def test_text_cast_of_jsonb_spells_the_column_as_sql_must(pg):
    query = sql.SQL("SELECT '{{\"a\": 1}}'::jsonb AS {}, 2 AS {}").format(
        sql.Identifier('we"ird'), sql.Identifier("select")
    )
    got = pystrom.read_postgres(pg.conninfo, query.as_string(pg.conn), device="cpu").to_arrow()
    assert got.column_names == ['we"ird', "select"] and got.column(0).to_pylist() == ['{"a": 1}']


def test_decimal_hint_quotes_the_column(pg):
    with pytest.raises(UnsupportedTypeError, match=r'"Big N"::numeric\(18, 6\)'):
        pystrom.read_postgres(pg.conninfo, 'SELECT 1.5 AS "Big N"', numeric="decimal")


def _no_secret(exc: BaseException, secret: str) -> None:
    text = "".join(traceback.format_exception(exc))
    assert secret not in text, text
    assert exc.__cause__ is None or secret not in str(exc.__cause__)


def test_malformed_dsn_echoes_no_part_of_the_password():
    # libpq's own message quotes the word after the unquoted space: 'missing "=" after "words"'
    for dsn in ["host=127.0.0.1 password=two words", "host=127.0.0.1 password='unterminated words", "password"]:
        with pytest.raises(PostgresError, match="connection string is malformed") as info:
            pystrom.read_postgres(dsn, "SELECT 1")
        _no_secret(info.value, "words" if "words" in dsn else "password=")


def test_refused_connection_echoes_no_password(pg_cluster):
    free = pg_cluster.port + 1
    for dsn in [
        f"host=127.0.0.1 port={free} user=nobody password=s3cret-pw",
        f"postgresql://nobody:s3cret-pw@127.0.0.1:{free}/db",
    ]:
        with pytest.raises(PostgresError, match="cannot connect.*refused") as info:
            pystrom.read_postgres(dsn, "SELECT 1")
        _no_secret(info.value, "s3cret-pw")


def test_authentication_failure_echoes_no_password(pg):
    role = pg.name("nologin")
    pg.execute(sql.SQL("CREATE ROLE {} NOLOGIN PASSWORD 's3cret-pw'").format(sql.Identifier(role)))
    try:
        dsn = pg.conninfo.replace("user=postgres", f"user={role} password=s3cret-pw")
        with pytest.raises(PostgresError, match="not permitted to log in") as info:
            pystrom.read_postgres(dsn, "SELECT 1")
        _no_secret(info.value, "s3cret-pw")
        # a partition connection failing the same way mid-read (the first one connected as a superuser is
        # not possible here, so: a database that does not exist, with the password in the DSN)
        dsn = pg.conninfo.replace("dbname=postgres", "dbname=no_such_db password=s3cret-pw")
        with pytest.raises(PostgresError, match="does not exist") as info:
            pystrom.read_postgres(dsn, "SELECT 1")
        _no_secret(info.value, "s3cret-pw")
    finally:
        pg.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("partitions", [1, 4])
def test_string_column_past_the_limit_is_refused_while_streaming(pg, monkeypatch, device, partitions):
    """The limit lowered to 1 MiB (it is 2 GiB): a read of ~64 MB of strings stops within the first
    few MiB, naming the column, with nothing left running on the server."""
    from pystrom.io.postgres import stream

    name = pg.name("bigtext")
    pg.execute(
        sql.SQL("CREATE TABLE {} AS SELECT i, md5(i::text) AS s FROM generate_series(1, 2000000) i").format(
            sql.Identifier(name)
        )
    )
    monkeypatch.setattr(stream, "STRING_COLUMN_LIMIT", 1 << 20)
    seen = []
    start = time.monotonic()
    with pystrom.defaults.set(pg_staging_chunk=1 << 20):
        with pytest.raises(CapacityError, match=r"column 's' \(text\) holds more than 1,048,576 bytes") as info:
            pystrom.read_postgres(pg.conninfo, table=name, partitions=partitions, device=device, progress=seen.append)
    assert max(seen, default=0) < 400_000, seen[-3:]  # of 2M rows: stopped early
    assert time.monotonic() - start < 30
    assert "read it in parts" in str(info.value)
    deadline = time.monotonic() + 5
    active = "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'COPY %%bigtext%%'"
    while pg.fetch(active)[0][0]:
        assert time.monotonic() < deadline, "a cancelled COPY still runs"
        time.sleep(0.05)
    # under the limit the same column reads
    t = pystrom.read_postgres(pg.conninfo, table=name, where="i <= 20000", partitions=partitions, device=device)
    assert t.num_rows == 20000


def test_the_failure_that_ends_the_snapshot_is_reported_not_the_joins_it_broke(pg, monkeypatch, device):
    """The race CI met: the main stream's COPY fails (a string column past its limit) and is cancelled,
    which ends the transaction whose snapshot the other partitions import; a partition connecting just
    then fails with "could not import the requested snapshot". Forced here: the joins wait until the
    main stream's failure has left its COPY, and that failure waits until the joins have failed. The
    CapacityError is reported (it is noted before the cancel), not the broken import."""
    import threading

    from pystrom.io.postgres import session, stream

    name = pg.name("bigtext_race")
    pg.execute(
        sql.SQL("CREATE TABLE {} AS SELECT i, md5(i::text) AS s FROM generate_series(1, 400000) i").format(
            sql.Identifier(name)
        )
    )
    monkeypatch.setattr(stream, "STRING_COLUMN_LIMIT", 1 << 20)
    left_copy, joins_done = threading.Event(), threading.Semaphore(0)
    joins = []
    real_join, real_read = session.SnapshotJoiner.__call__, stream.CopyReader.read

    def join_late(self):
        left_copy.wait(30)
        try:
            return real_join(self)
        except BaseException as exc:
            joins.append(exc)
            raise
        finally:
            joins_done.release()

    def read_then_hold(self, conn, sql_text, size_hint=None):
        try:
            return real_read(self, conn, sql_text, size_hint)
        except BaseException:
            # The cancel ends the snapshot's transaction only while the COPY still runs on the server; on
            # a slow client the server may have sent the whole range already (CI, once), leaving the
            # transaction open and the joins able to import. End it as the cancel would have.
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                conn.rollback()
            left_copy.set()
            for _ in range(3):  # the other partitions' joins have run (and failed) before this goes on
                joins_done.acquire(timeout=30)
            raise

    monkeypatch.setattr(session.SnapshotJoiner, "__call__", join_late)
    monkeypatch.setattr(stream.CopyReader, "read", read_then_hold)
    with pystrom.defaults.set(pg_staging_chunk=1 << 20):
        with pytest.raises(CapacityError, match=r"column 's' \(text\) holds more than 1,048,576 bytes"):
            pystrom.read_postgres(pg.conninfo, table=name, partitions=4, device=device)
    # "could not import the requested snapshot" after a cancel, "invalid snapshot identifier" after the rollback
    assert joins and all("while importing the snapshot" in str(e) for e in joins), joins
