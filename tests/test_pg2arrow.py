"""postgres_to_arrow / `pystrom pg2arrow`: a real PostgreSQL result written through write_arrow, with
per-batch min/max statistics, read back equal to read_postgres."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

import pystrom
from pystrom import PostgresError

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = pytest.mark.postgres


def _meta(batch_with_meta) -> dict[str, str]:
    md = batch_with_meta.custom_metadata
    return {k.decode(): v.decode() for k, v in md.items()} if md else {}


@pytest.fixture
def source(pg):
    name = pg.name("src")
    pg.execute(
        sql.SQL("CREATE TABLE {} (id int8, x float8, s text, d date, m numeric(12, 2))").format(sql.Identifier(name))
    )
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT i, i * 0.5, CASE WHEN i % 4 = 0 THEN NULL ELSE 'v' || i END, "
            "'2020-01-01'::date + i, i / 4.0 FROM generate_series(1, 2500) i"
        ).format(sql.Identifier(name))
    )
    return name


def test_postgres_to_arrow_writes_batches_with_stats(pg, source, tmp_path):
    path = tmp_path / "out.arrow"
    summary = pystrom.postgres_to_arrow(
        pg.conninfo, path, table=source, batch_rows=1000, partitions=3, numeric="decimal"
    )
    assert summary.num_rows == 2500 and summary.num_batches == 3
    expected = pystrom.read_postgres(pg.conninfo, table=source, partitions=3, numeric="decimal", device="cpu")
    with pa.ipc.open_file(path) as reader:
        written = reader.read_all()
        first = _meta(reader.get_batch_with_custom_metadata(0))
        batches = [reader.get_batch_with_custom_metadata(i).batch.num_rows for i in range(reader.num_record_batches)]
    assert batches == [1000, 1000, 500]
    assert written.equals(expected.to_arrow())
    ids = written["id"].to_pylist()[:1000]
    assert first["min_max_stats.id"] == f"{min(ids)},{max(ids)}"
    assert "min_max_stats.m" in first and "min_max_stats.d" in first
    back = pystrom.read_arrow(path, device="cpu")
    assert back.to_arrow().equals(expected.to_arrow())


def test_postgres_to_arrow_query_and_errors(pg, source, tmp_path):
    path = tmp_path / "q.arrow"
    query = sql.SQL("SELECT id, s FROM {} WHERE id <= %s").format(sql.Identifier(source)).as_string(pg.conn)
    summary = pystrom.postgres_to_arrow(pg.conninfo, path, query, params=(10,), stats=False)
    assert summary.num_rows == 10
    with pa.ipc.open_file(path) as reader:
        assert _meta(reader.get_batch_with_custom_metadata(0)) == {}
        assert reader.read_all()["id"].to_pylist() == list(range(1, 11))
    missing = tmp_path / "never.arrow"
    with pytest.raises(PostgresError, match="does not exist"):
        pystrom.postgres_to_arrow(pg.conninfo, missing, table="no_such_table")
    assert not missing.exists()


def test_cli_pg2arrow(pg, source, tmp_path):
    path = tmp_path / "cli.arrow"
    run = [sys.executable, "-m", "pystrom", "pg2arrow", "-d", pg.conninfo, "-o", str(path)]
    done = subprocess.run([*run, "-t", source, "--batch-rows", "1000"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "2,500 rows in 3 record batch(es)" in done.stdout
    assert pa.ipc.open_file(path).read_all().num_rows == 2500
    bad = subprocess.run([*run, "-c", "SELECT nope FROM nowhere"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "pystrom pg2arrow: error:" in bad.stderr and "nowhere" in bad.stderr


def test_compressed_pg2arrow(pg, source, tmp_path):
    expected = pystrom.read_postgres(pg.conninfo, table=source, device="cpu").to_arrow()
    plain = tmp_path / "plain.arrow"
    pystrom.postgres_to_arrow(pg.conninfo, plain, table=source, batch_rows=1000)
    path = tmp_path / "zstd.arrow"
    summary = pystrom.postgres_to_arrow(pg.conninfo, path, table=source, batch_rows=1000, compression="zstd")
    assert summary.num_batches == 3 and summary.bytes_written < plain.stat().st_size
    with pa.ipc.open_file(path) as reader:
        assert reader.read_all().sort_by("id").equals(expected.sort_by("id"))
        assert "min_max_stats.id" in _meta(reader.get_batch_with_custom_metadata(0))
    # the command line: --compression and --compression-level, refused levels in one line
    path = tmp_path / "cli.arrow"
    run = [sys.executable, "-m", "pystrom", "pg2arrow", "-d", pg.conninfo, "-t", source, "-o", str(path)]
    done = subprocess.run([*run, "--compression", "lz4", "--compression-level", "9"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with pa.ipc.open_file(path) as reader:
        assert reader.read_all().sort_by("id").equals(expected.sort_by("id"))
    with open(path, "rb") as f:
        assert b"min_max_stats.id" in f.read()
    bad = subprocess.run([*run, "--compression", "zstd", "--compression-level", "99"], capture_output=True, text=True)
    assert bad.returncode == 2 and "pystrom pg2arrow: error: compression_level for 'zstd' must be in" in bad.stderr
    bad = subprocess.run([*run, "--compression", "gzip"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'gzip'" in bad.stderr
