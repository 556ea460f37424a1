"""Errors that point at the fix, against a real PostgreSQL (tests/fix_pg.py): a table's name where a query
goes, a dotted ``table=`` name, the arguments of ``write_postgres`` out of order, a statement the server
refuses (placed in the user's statement, not in pystrom's wrapping one); and pandas DataFrames and pyarrow
tables written by ``write_postgres`` as a Table would be."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom import InvalidArgumentError, PostgresError

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = pytest.mark.postgres


@pytest.fixture
def breast_cancer(pg):
    name = pg.name("breast_cancer")
    pg.execute(
        sql.SQL("CREATE TABLE {} AS SELECT i AS id, i * 0.5 AS radius FROM generate_series(1, 50) i").format(
            sql.Identifier(name)
        )
    )
    return name


def test_a_table_name_as_the_query_points_at_table(pg, breast_cancer):
    with pytest.raises(InvalidArgumentError) as info:
        pystrom.read_postgres(pg.conninfo, breast_cancer)
    message = str(info.value)
    assert f"did you mean table={breast_cancer!r}?" in message
    assert "_pystrom_q" not in message and "LIMIT 0" not in message  # nothing of pystrom's own SQL
    # the same for the other readers, and for a qualified name (as SQL reads it: folded, quotes honoured)
    with pytest.raises(InvalidArgumentError, match=r"did you mean table=\('public', 'breast_cancer'\)\?"):
        pystrom.postgres_to_arrow(pg.conninfo, "/nonexistent.arrow", "Public.breast_cancer;")
    with pytest.raises(InvalidArgumentError, match=r"did you mean table=\('My Schema', 't'\)\?"):
        pystrom.scan_postgres(pg.conninfo, ' "My Schema" . t ')
    # a real query, a single statement word and a function call still go to the server
    assert pystrom.read_postgres(pg.conninfo, f"SELECT * FROM {breast_cancer}", device="cpu").num_rows == 50
    with pytest.raises(PostgresError, match="syntax error"):
        pystrom.read_postgres(pg.conninfo, "VALUES")
    assert pystrom.read_postgres(pg.conninfo, "SELECT now()", device="cpu").num_rows == 1


def test_a_dotted_table_name_reads_the_schemas_table_unless_a_table_has_that_name(pg, breast_cancer):
    t = pystrom.read_postgres(pg.conninfo, table=f"public.{breast_cancer}", device="cpu")
    assert t.num_rows == 50
    t = pystrom.read_postgres(pg.conninfo, table=f'"public"."{breast_cancer}"', columns=["id"], device="cpu")
    assert t.column_names == ["id"] and t.num_rows == 50
    # a table whose own name has the dot wins (a name is taken literally first)
    dotted = pg.name("public.x")
    pg.execute(sql.SQL("CREATE TABLE {} AS SELECT 7 AS seven").format(sql.Identifier(dotted)))
    assert pystrom.read_postgres(pg.conninfo, table=dotted, device="cpu").to_arrow().to_pylist() == [{"seven": 7}]
    # neither: the message names what was tried and the tuple form
    with pytest.raises(PostgresError) as info:
        pystrom.read_postgres(pg.conninfo, table="public.no_such_table")
    assert "does not exist" in str(info.value) and "pass table=('public', 'no_such_table')" in str(info.value)
    with pytest.raises(PostgresError, match=r"table=\('schema', 'name'\)"):
        pystrom.read_postgres(pg.conninfo, table="1.2")  # not a name SQL would read
    # partitioned reads take the qualified name too (ctid ranges of the schema's table)
    t = pystrom.read_postgres(pg.conninfo, table=f"public.{breast_cancer}", partitions=3, device="cpu")
    assert sorted(t.to_arrow()["id"].to_pylist()) == list(range(1, 51))


def test_inside_a_transaction_the_lookup_leaves_it_usable(pg, breast_cancer):
    with psycopg.connect(pg.conninfo) as conn:  # not autocommit: the read runs in the user's transaction
        assert pystrom.read_postgres(conn, table=f"public.{breast_cancer}", device="cpu").num_rows == 50
        with pytest.raises(PostgresError, match="does not exist"):
            pystrom.read_postgres(conn, table="public.nope", device="cpu")
        assert conn.execute("SELECT 1").fetchone() == (1,)  # no statement of the lookup failed in it


def test_a_refused_statement_is_shown_as_written(pg, breast_cancer):
    with pytest.raises(PostgresError) as info:
        pystrom.read_postgres(pg.conninfo, f"SELECT * FRM {breast_cancer}")
    message = str(info.value)
    assert 'syntax error at or near "FRM", at character 10 of the statement' in message
    assert "_pystrom_q" not in message and "LIMIT 0" not in message
    with pytest.raises(PostgresError, match='column "nope" does not exist, at character 8 of the statement'):
        pystrom.read_postgres(pg.conninfo, f"SELECT nope FROM {breast_cancer}")
    with pytest.raises(PostgresError, match="at the end of the statement .it stops short."):
        pystrom.read_postgres(pg.conninfo, f"SELECT * FROM {breast_cancer} WHERE")
    assert "psycopg" not in message  # a typo inside a query gets no hint about other statements


@pytest.mark.parametrize(
    "statement,keyword",
    [("DROP TABLE {t}", "DROP"), ("delete from {t} returning *", "DELETE"), ("VACUUM {t}", "VACUUM"),
     ("  -- a comment\n /* another */ (INSERT INTO {t} DEFAULT VALUES RETURNING 1)", "INSERT"),
     ("/* comments /* nest */ in PostgreSQL */ DROP TABLE {t}", "DROP")],
)  # fmt: skip
def test_a_statement_that_is_not_a_query_is_named(pg, breast_cancer, statement, keyword):
    """read_postgres reads SELECT * FROM (the statement); another statement there is a syntax error, and the
    message says what read_postgres reads and where the statement goes instead. Nothing runs."""
    before = pg.fetch(f"SELECT count(*) FROM {breast_cancer}")[0][0]
    with pytest.raises(
        PostgresError, match=f"syntax error.*reads the rows of a query .*run a {keyword} statement with psycopg"
    ):
        pystrom.read_postgres(pg.conninfo, statement.format(t=breast_cancer))
    assert pg.fetch(f"SELECT count(*) FROM {breast_cancer}")[0][0] == before


def test_write_postgres_arguments_out_of_order_show_the_signature(pg):
    t = pystrom.Table.from_arrays({"x": [1, 2]}, device="cpu")
    dsn = pg.conninfo + " password=s3cret"
    signature = r"write_postgres\(table, conninfo, name, \*, if_exists='fail'"
    with pytest.raises(InvalidArgumentError, match=signature + r".*look swapped") as info:
        pystrom.write_postgres(t, "out", dsn)
    assert "s3cret" not in str(info.value)  # a connection string is described, never shown
    with pytest.raises(InvalidArgumentError, match=signature + r".*the table to write comes first") as info:
        pystrom.write_postgres(dsn, t, "out")
    assert "s3cret" not in str(info.value)
    with pytest.raises(InvalidArgumentError, match=signature + r".*comes first.*a pandas.*DataFrame"):
        pystrom.write_postgres("out", dsn, pytest.importorskip("pandas").DataFrame({"x": [1]}))
    with pytest.raises(InvalidArgumentError, match=signature + r".*look swapped: name is a psycopg.Connection"):
        with psycopg.connect(pg.conninfo) as conn:
            pystrom.write_postgres(t, "out", conn)
    with pytest.raises(InvalidArgumentError, match=signature + r".*table must be a pystrom.Table, a pandas"):
        pystrom.write_postgres([1, 2], dsn, "out")
    out = pg.name("out")
    assert pystrom.write_postgres(t, pg.conninfo, out) == 2  # the right order still writes


def test_pandas_and_pyarrow_tables_are_written_as_tables_are(pg):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {"i": np.arange(5, dtype=np.int64), "f": [0.5, math.nan, 2.5, 3.5, 4.5], "s": ["a", None, "c", "d", "é"]},
        index=[10, 11, 12, 13, 14],
    )
    out = pg.name("frame")
    assert pystrom.write_postgres(frame, pg.conninfo, out) == 5
    got = pg.fetch(sql.SQL("SELECT i, f, s FROM {} ORDER BY i").format(sql.Identifier(out)))
    assert got == [(0, 0.5, "a"), (1, None, None), (2, 2.5, "c"), (3, 3.5, "d"), (4, 4.5, "é")]  # NaN is NULL
    cols = pg.fetch("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0", (f'"{out}"',))
    assert [c for (c,) in cols] == ["i", "f", "s"]  # the index is not written
    arrow = pa.table({"k": pa.array([1, None, 3], pa.int32())})
    out2 = pg.name("arrow")
    assert pystrom.write_postgres(arrow, pg.conninfo, out2, columns=["k"]) == 3
    assert pg.fetch(sql.SQL("SELECT k FROM {} ORDER BY k NULLS LAST").format(sql.Identifier(out2))) == [
        (1,),
        (3,),
        (None,),
    ]
    # append through a user's connection, same rules
    with psycopg.connect(pg.conninfo, autocommit=True) as conn:
        assert pystrom.write_postgres(frame.iloc[:2], conn, out, if_exists="append") == 2
    assert pg.fetch(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(out))) == [(7,)]
