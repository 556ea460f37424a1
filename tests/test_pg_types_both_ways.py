"""Every PostgreSQL type read_postgres reads is written back by write_postgres (issue 38), and the
types it reads since: time, money, bit/varbit; the ones still refused say which SQL reads them.

Round trips are judged by the server: the source and the written table, each seen through an
expression that gives both one type (``vc::text`` for a varchar that came back as text), are compared
with ``EXCEPT ALL`` both ways, which must return nothing (a missing, extra or changed row shows).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom import DataError, ExpressionError, InvalidArgumentError, UnsupportedTypeError
from pystrom.testing import to_host

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = pytest.mark.postgres


def assert_same_rows(pg, source: str, target: str, pairs: list[tuple[str, str]]) -> None:
    """``SELECT src exprs FROM source`` and ``SELECT dst exprs FROM target`` hold the same rows."""
    left = ", ".join(a for a, _ in pairs)
    right = ", ".join(b for _, b in pairs)
    src = f'SELECT {left} FROM "{source}"'  # the tests' own names: no quotes in them
    dst = f'SELECT {right} FROM "{target}"'
    assert pg.fetch(f"SELECT x::text FROM ({src} EXCEPT ALL {dst}) x") == []  # rows as text: any value shows
    assert pg.fetch(f"SELECT x::text FROM ({dst} EXCEPT ALL {src}) x") == []
    assert pg.fetch(f"SELECT count(*) FROM ({src}) s")[0][0] > 0


# The type matrix: (column, SQL type, values as SQL literals with NULLs and edge values, how the
# source column is compared with the written one: its expression, then the written column's).
MATRIX = [  # fmt: skip
    ("b", "bool", ["true", "false", "NULL"], "b", "b"),
    ("i2", "int2", ["-32768", "32767", "NULL"], "i2", "i2"),
    ("i4", "int4", ["-2147483648", "2147483647", "NULL"], "i4", "i4"),
    ("i8", "int8", ["-9223372036854775808", "9223372036854775807", "NULL"], "i8", "i8"),
    ("o", "oid", ["0", "4294967295", "NULL"], "o::int8", "o"),
    ("f4", "float4", ["'NaN'", "'-Infinity'", "'-0'"], "f4", "f4"),
    ("f8", "float8", ["'Infinity'", "1e-320", "NULL"], "f8", "f8"),
    ("n", "numeric(30, 4)", ["-12345678901234567890123456.7891", "0.0001", "NULL"], "n", "n"),
    ("d", "date", ["'infinity'", "'4713-01-01 BC'", "'5874897-12-31'"], "d", "d"),
    ("ts", "timestamp", ["'-infinity'", "'200000-12-31 23:59:59.999999'", "'2000-01-01'"], "ts", "ts"),
    ("tz", "timestamptz", ["'infinity'", "'1999-12-31 23:59:59.5+02'", "NULL"], "tz", "tz"),
    ("t", "time", ["'24:00'", "'00:00'", "'13:14:15.123456'"], "t", "t"),
    ("iv", "interval", ["'1 mon 2 days 3.000004 s'", "'-7 mon -1 us'", "NULL"], "iv::text", "iv::text"),
    ("s", "text", ["'é\"\\'''", "''", "NULL"], "s", "s"),
    ("vc", "varchar(10)", ["'abc'", "NULL", "''"], "vc::text", "vc"),
    ("bp", "char(5)", ["'ab'", "NULL", "'abcde'"], "rpad(bp::text, 5)", "bp"),
    ("nm", "name", ["'pg_class'", "NULL", "''"], "nm::text", "nm"),
    ("by", "bytea", ["'\\x00ff'", "''", "NULL"], "by", "by"),
    (
        "u",
        "uuid",
        ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "NULL", "'00000000-0000-0000-0000-000000000000'"],
        "u",
        "u",
    ),
    ("j", "json", ["'{\"a\": [1, 2]}'", "NULL", "'1'"], "j::text", "j"),
    ("jb", "jsonb", ["'{\"a\": [1, 2]}'", "NULL", "'[]'"], "jb::text", "jb"),
    ("ip", "inet", ["'10.1.2.3/8'", "'::1'", "NULL"], "ip", "ip::inet"),
    ("m", "money", ["'-92233720368547758.08'", "'92233720368547758.07'", "NULL"], "m::numeric", "m"),
    ("bt", "bit(5)", ["B'10110'", "NULL", "B'00000'"], "bit_send(bt)", "bt"),
    ("vb", "varbit", ["B'1'", "B''", "B'101100111'"], "varbit_send(vb)", "vb"),
    ("ai", "int4[]", ["'{1,NULL,3}'", "'{}'", "NULL"], "ai", "ai"),
    ("ab", "bool[]", ["'{t,NULL}'", "'{f}'", "'{}'"], "ab", "ab"),
    ("as2", "int2[]", ["'{-32768,32767}'", "NULL", "'{NULL}'"], "as2", "as2"),
    ("al", "int8[]", ["'[0:1]={1,2}'", "'{9223372036854775807}'", "NULL"], "al[array_lower(al, 1):]", "al"),
    ("af4", "float4[]", ["'{NaN,-Infinity}'", "'{1.5}'", "NULL"], "af4", "af4"),
    ("af8", "float8[]", ["'{1e308,NULL,-0}'", "NULL", "'{}'"], "af8", "af8"),
    ("fx", "float8[]", ["'{1,2,3}'", "NULL", "'{NULL,5,6}'"], "fx", "fx"),  # one length: fixed_size_list[3]
]


def _make_matrix(pg, name: str) -> None:
    cols = ", ".join(f"{c} {t}" for c, t, _v, _s, _d in MATRIX)
    pg.execute(f'CREATE TABLE "{name}" (id int4, {cols})')
    for row in range(3):
        values = ", ".join(f"({v[row]})::{t}" for _c, t, v, _s, _d in MATRIX)
        pg.execute(f'INSERT INTO "{name}" VALUES ({row}, {values})')


def test_every_type_of_the_matrix_round_trips(pg, device):
    src = pg.name("matrix")
    _make_matrix(pg, src)
    t = pystrom.read_postgres(pg.conninfo, table=src, numeric="decimal", device=device)
    assert t.schema.field("t").type == pa.time64("us")
    assert t.schema.field("m").type == pa.decimal128(19, 2)
    assert t.schema.field("fx").type == pa.list_(pa.float64(), 3) and t.schema.field("ai").type == pa.list_(pa.int32())
    dst = pg.name("matrix_back")
    assert pystrom.write_postgres(t, pg.conninfo, dst) == 3
    pairs = [("id", "id")] + [(s, d) for _c, _t, _v, s, d in MATRIX]
    assert_same_rows(pg, src, dst, pairs)
    # a slice (rows not starting at the buffers' first): list offsets, element bits and fixed rows from row 1
    part = pg.name("matrix_part")
    pystrom.write_postgres(t.slice(1), pg.conninfo, part)
    got = pg.fetch(f'SELECT id, ai, ab, fx, af8, iv::text FROM "{part}" ORDER BY id')
    want = pg.fetch(f'SELECT id, ai, ab, fx, af8, iv::text FROM "{src}" WHERE id >= 1 ORDER BY id')
    assert got == want


def test_new_reads_hold_the_values(pg, device):
    t = pystrom.read_postgres(
        pg.conninfo,
        "SELECT '13:14:15.123456'::time AS t, '-1.23'::money AS m, B'101' AS b, B'1011001110'::varbit AS vb, "
        "NULL::time AS tn",
        device=device,
    )
    got = to_host(t).to_pylist()[0]
    import datetime as dt
    from decimal import Decimal

    assert got["t"] == dt.time(13, 14, 15, 123456) and got["tn"] is None
    assert got["m"] == Decimal("-1.23")
    # bit strings: int32 bit count, then the bits from the high bit of the first byte on
    assert got["b"] == (3).to_bytes(4, "big") + bytes([0b10100000])
    assert got["vb"] == (10).to_bytes(4, "big") + bytes([0b10110011, 0b10000000])


def test_money_takes_the_sessions_fraction_digits(pg):
    """lc_monetary decides money's scale; a locale with no fraction digits (yen) gives decimal128(19, 0)."""
    locales = [r[0] for r in pg.fetch("SELECT collname FROM pg_collation WHERE collname ILIKE 'ja_JP%%'")]
    for loc in locales or ["C"]:
        with psycopg.connect(pg.conninfo) as conn:
            try:
                conn.execute(sql.SQL("SET lc_monetary TO {}").format(sql.Literal(loc)))
            except psycopg.Error:
                continue
            want = conn.execute("SELECT '1234'::money::numeric, scale('0'::money::numeric)").fetchone()
            t = pystrom.read_postgres(conn, "SELECT '1234'::money AS m", device="cpu")
            assert t.schema.field("m").type == pa.decimal128(19, want[1])
            assert t.to_arrow().column("m").to_pylist() == [want[0]]


def test_bits_go_back_into_a_bit_column(pg):
    src = pg.name("bits")
    pg.execute(sql.SQL("CREATE TABLE {} (id int, b varbit, f bit(4))").format(sql.Identifier(src)))
    pg.execute(sql.SQL("INSERT INTO {} VALUES (1, B'1', B'1010'), (2, NULL, B'0000'), (3, B'', NULL), "
                       "(4, B'1111000011', B'0101')").format(sql.Identifier(src)))  # fmt: skip
    t = pystrom.read_postgres(pg.conninfo, table=src, device="cpu")
    dst = pg.name("bits_back")
    pg.execute(sql.SQL("CREATE TABLE {} (id int, b varbit, f bit(4))").format(sql.Identifier(dst)))
    pystrom.write_postgres(t, pg.conninfo, dst, if_exists="append")  # into bit columns: sent as bits
    assert_same_rows(pg, src, dst, [("id", "id"), ("b", "b"), ("f", "f")])
    new = pg.name("bits_new")  # a new table: binary -> bytea, the same bytes
    pystrom.write_postgres(t, pg.conninfo, new)
    assert_same_rows(pg, src, new, [("id", "id"), ("varbit_send(b)", "b"), ("bit_send(f)", "f")])
    bad = pystrom.Table.from_arrays({"b": pa.array([b"\x00\x00\x00\x09\xff"])}, device="cpu")  # 9 bits, 1 byte
    with pytest.raises(pystrom.PostgresError, match="column b"):  # the server checks the bit count
        pystrom.write_postgres(bad, pg.conninfo, dst, if_exists="append", columns=["b"])


def _lists_table(device: str) -> pystrom.Table:
    return pystrom.Table.from_arrow(
        pa.table(
            {
                "id": pa.array([0, 1, 2, 3], pa.int32()),
                "u8": pa.array([[0, 255], None, [], [None]], pa.list_(pa.uint8())),
                "i8": pa.array([[-128], [127, None], None, []], pa.list_(pa.int8())),
                "u16": pa.array([[65535], None, [], [0]], pa.list_(pa.uint16())),
                "u32": pa.array([[4294967295], [None], None, []], pa.list_(pa.uint32())),
                "u64": pa.array([[2**64 - 1, None, 0], None, [], [10**19]], pa.list_(pa.uint64())),
                "h": pa.array([[1.5, None], [65504.0], None, []], pa.list_(pa.float16())),
                "z": pa.array([[], [], None, []], pa.list_(pa.int32(), 0)),
                "iv": pa.array([(1, 2, 3999), (-1, -2, -3001), None, (0, 0, 0)], pa.month_day_nano_interval()),
            }
        ),
        device=device,
    )


def test_lists_of_every_element_type_and_intervals_are_written(pg, device):
    t = _lists_table(device)
    out = pg.name("lists")
    pystrom.write_postgres(t, pg.conninfo, out)
    types = dict(pg.fetch(f"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                          f"WHERE attrelid = '{out}'::regclass AND attnum > 0"))  # fmt: skip
    assert types == {
        "id": "integer", "u8": "smallint[]", "i8": "smallint[]", "u16": "integer[]", "u32": "bigint[]",
        "u64": "numeric(20,0)[]", "h": "real[]", "z": "integer[]", "iv": "interval",
    }  # fmt: skip
    rows = pg.fetch(sql.SQL("SELECT u8, i8, u16, u32, u64::text[], h, z, iv::text FROM {} ORDER BY id").format(
        sql.Identifier(out)))  # fmt: skip
    assert rows[0] == ([0, 255], [-128], [65535], [4294967295], ["18446744073709551615", None, "0"], [1.5, None], [],
                       "1 mon 2 days 00:00:00.000003")  # fmt: skip
    assert rows[1] == (None, [127, None], None, [None], None, [65504.0], [], "-1 mons -2 days -00:00:00.000004")
    assert rows[2] == ([], None, [], None, [], None, None, None)
    assert rows[3] == ([None], [], [0], [], ["10000000000000000000"], [], [], "00:00:00")
    back = pystrom.read_postgres(pg.conninfo, f'SELECT i8, u32 FROM "{out}" ORDER BY id', device="cpu").to_arrow()
    assert back.column("i8").to_pylist() == [[-128], [127, None], None, []]


@pytest.fixture(scope="module")
def bundled_cluster():
    """As test_pg_vectors': a server from a wheel bundling pgvector, for when the tests' server lacks it."""
    from fix_pg import PgCluster
    from test_pg_vectors import _bundled_bindir

    bindir = _bundled_bindir()
    if bindir is None:
        yield None
        return
    cluster = PgCluster(bindir)
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def vpg(pg, bundled_cluster):
    """A Pg whose server has pgvector's vector and halfvec."""
    from test_pg_vectors import _server_with

    yield from _server_with(pg, bundled_cluster, "halfvec")


@pytest.mark.parametrize("half", [False, True])
def test_embeddings_go_into_pgvector_and_search_finds_the_true_top_ten(vpg, device, half):
    """The embeddings workflow: an (n, d) matrix computed on the device -> a vector(d) table -> the
    server's ``ORDER BY e <-> q LIMIT 10`` equals the brute-force top ten."""
    n, d = 3000, 48
    rng = np.random.default_rng(7)
    dtype = np.float16 if half else np.float32
    emb = rng.standard_normal((n, d)).astype(dtype)
    ids = np.arange(n, dtype=np.int64)
    if device != "cpu":
        import cupy

        emb, ids = cupy.asarray(emb), cupy.asarray(ids)
    t = pystrom.Table.from_arrays({"id": ids, "e": emb}, device=device)
    out = vpg.name("emb")
    assert pystrom.write_postgres(t, vpg.conninfo, out, vector=True) == n
    typ = "halfvec" if half else "vector"
    assert vpg.fetch(f"SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '{out}'::regclass "
                     "AND attname = 'e'") == [(f"{typ}({d})",)]  # fmt: skip
    host = np.asarray(emb.get() if hasattr(emb, "get") else emb, dtype=np.float64)
    q = rng.standard_normal(d).astype(dtype)
    qtext = "[" + ",".join(repr(float(x)) for x in q) + "]"
    got = [r[0] for r in vpg.fetch(f"SELECT id FROM {out} ORDER BY e <-> %s::{typ} LIMIT 10", (qtext,))]
    dist = np.linalg.norm(host - q.astype(np.float64), axis=1)
    want = np.argsort(dist, kind="stable")[:10].tolist()
    assert got == want
    # the values themselves come back exactly
    back = pystrom.read_postgres(vpg.conninfo, f"SELECT id, e FROM {out} ORDER BY id", device="cpu")
    np.testing.assert_array_equal(back.column("e").values, host.astype(dtype))


def test_vectors_into_an_existing_vector_column_and_their_refusals(vpg):
    out = vpg.name("vec")
    vpg.execute(f"CREATE TABLE {out} (id int, e vector(3), h halfvec(3))")
    m = np.array([[1, 2, 3], [0.5, -0.25, 1e30]], dtype=np.float32)
    h = np.array([[1, 2, 3], [0.5, -0.25, 1]], dtype=np.float16)
    t = pystrom.Table.from_arrays({"id": np.array([1, 2], np.int32), "e": m, "h": h}, device="cpu")
    # no vector= here: the target's types decide (a float16 matrix into halfvec, float32 into vector)
    pystrom.write_postgres(t, vpg.conninfo, out, if_exists="append")
    assert vpg.fetch(f"SELECT e::text, h::text FROM {out} ORDER BY id") == [
        ("[1,2,3]", "[1,2,3]"),
        (vpg.fetch("SELECT '[0.5,-0.25,1e30]'::vector::text")[0][0], "[0.5,-0.25,1]"),
    ]
    bad = m.copy()
    bad[1, 2] = np.nan
    with pytest.raises(DataError, match=r"column 'e' \(vector\(3\)\), row 1: NaN"):
        pystrom.write_postgres(pystrom.Table.from_arrays({"e": bad}, device="cpu"), vpg.conninfo, vpg.name("x"),
                               vector=True)  # fmt: skip
    nulls = pystrom.Table.from_arrow(pa.table({"e": pa.array([[1, 2], [3, None]], pa.list_(pa.float32(), 2))}))
    with pytest.raises(DataError, match=r"row 1: a NULL element in a vector"):
        pystrom.write_postgres(nulls, vpg.conninfo, vpg.name("x"), vector=True)
    wide = pystrom.Table.from_arrays({"e": np.zeros((2, 3))}, device="cpu")  # float64
    with pytest.raises(UnsupportedTypeError, match=r"column 'e'.*float32 first"):
        pystrom.write_postgres(wide, vpg.conninfo, vpg.name("x"), vector=["e"])
    with pytest.raises(pystrom.ColumnNotFoundError, match="'nope'"):
        pystrom.write_postgres(t, vpg.conninfo, vpg.name("x"), vector=["nope"])
    with pytest.raises(UnsupportedTypeError, match="1 to 16000 dimensions"):
        pystrom.write_postgres(pystrom.Table.from_arrays({"e": np.zeros((1, 16001), np.float32)}, device="cpu"),
                               vpg.conninfo, vpg.name("x"), vector=True)  # fmt: skip


def test_mixed_dimensions_hint_reads(vpg):
    """Rows of 2 and 3 dimensions: the hint is not a cast to one dimension (which fails on the other rows);
    the list form it suggests reads every row."""
    q = "SELECT '[1,2]'::vector AS e UNION ALL SELECT '[1,2,3]'::vector"
    with pytest.raises(pystrom.SchemaMismatchError) as info:
        pystrom.read_postgres(vpg.conninfo, q)
    msg = str(info.value)
    assert "::vector(3)" not in msg and "vector_dims(e) = 3" in msg and "e::real[]" in msg
    t = pystrom.read_postgres(vpg.conninfo, f"SELECT e::real[] AS e FROM ({q}) q", device="cpu")
    assert sorted(map(len, t.to_arrow().column("e").to_pylist())) == [2, 3]


def test_names_past_63_bytes_are_refused_not_truncated(pg):
    long = "t" * 64
    t = pystrom.Table.from_arrays({"x": np.arange(3)}, device="cpu")
    with pytest.raises(InvalidArgumentError, match=r"table name 't{64}' is 64 bytes.*63"):
        pystrom.write_postgres(t, pg.conninfo, long)
    with pytest.raises(InvalidArgumentError, match=r"column name 'é{32}' is 64 bytes"):
        pystrom.write_postgres(pystrom.Table.from_arrays({"é" * 32: np.arange(3)}, device="cpu"), pg.conninfo, "ok")
    with pytest.raises(InvalidArgumentError, match="schema name"):
        pystrom.write_postgres(t, pg.conninfo, ("s" * 70, "ok"))
    with pytest.raises(InvalidArgumentError, match=r"table name 't{64}'"):
        pystrom.read_postgres(pg.conninfo, table=long)
    with pytest.raises(InvalidArgumentError, match=r"column name 'c{70}'"):
        pystrom.read_postgres(pg.conninfo, table="pg_class", columns=["c" * 70])
    assert pg.fetch("SELECT count(*) FROM pg_class WHERE relname LIKE 'ttttttt%%'") == [(0,)]
    name = "t" * 63  # the longest name works
    pg._drops.append(name)
    pystrom.write_postgres(t, pg.conninfo, name)
    assert pystrom.read_postgres(pg.conninfo, table=name, device="cpu").num_rows == 3


@pytest.mark.parametrize("where", ["x::int > 3", "x > 3::int", "s::int BETWEEN 2 AND 4"])
def test_scan_where_in_sql_points_at_sql_where(pg, where):
    name = pg.name("scanw")
    pg.execute(sql.SQL("CREATE TABLE {} AS SELECT g AS x, g::text AS s FROM generate_series(1, 10) g").format(
        sql.Identifier(name)))  # fmt: skip
    with pytest.raises(ExpressionError, match="sql_where="):
        pystrom.scan_postgres(pg.conninfo, table=name, where=where)
    fixed = pystrom.scan_postgres(pg.conninfo, table=name, sql_where=where, device="cpu").collect()
    assert fixed.num_rows == pg.fetch(sql.SQL("SELECT count(*) FROM {} WHERE " + where.replace("%", "%%")).format(
        sql.Identifier(name)))[0][0]  # fmt: skip


@pytest.mark.parametrize(
    ("expr", "what"),
    [
        ("'{[1,2)}'::int4multirange", "a multirange"),  # text arrays, ranges, composites: test_pg_struct_types.py
        ("ROW(1, ARRAY[2])::{composite}", "field 'b' is an array"),
        ("'12:00+02'::timetz", "time zone offset"),
        ("'a b'::tsvector", "text search vector"),
    ],
)
def test_what_is_still_refused_says_how_to_read_it(pg, expr, what):
    composite = pg.name("pair")
    pg.execute(f'CREATE TYPE "{composite}" AS (a int, b int[])')
    try:
        _refused_and_read(pg, f"SELECT {expr.replace('{composite}', chr(34) + composite + chr(34))} AS c", expr, what)
    finally:
        pg.execute(f'DROP TYPE "{composite}" CASCADE')


def _refused_and_read(pg, q, expr, what):
    if "multirange" in expr and pg.fetch("SELECT to_regtype('int4multirange') IS NULL")[0][0]:
        pytest.skip("PostgreSQL < 14: no multiranges")
    with pytest.raises(UnsupportedTypeError, match=what) as info:
        pystrom.read_postgres(pg.conninfo, q, device="cpu")
    hint = str(info.value).split("e.g. ", 1)[1]
    if what.startswith("field"):  # (c).* expands into the fields' columns
        got = pystrom.read_postgres(pg.conninfo, f"SELECT (c).* FROM ({q}) q", device="cpu")
        assert got.num_columns == 2
        return
    got = pystrom.read_postgres(pg.conninfo, f"SELECT {hint} FROM ({q}) q", device="cpu")
    assert got.num_rows == 1
