"""scan_arrow: grouping, re-iteration, several files, where filters and statistics skipping."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest

import pystrom
from pystrom.testing import to_host


def _file(path, table: pa.Table, chunk: int) -> None:
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table, max_chunksize=chunk)


def _points(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    memo = [("xabcdx" if k % 7 == 0 else "zz") * int(k % 3) for k in range(n)]
    return pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "x": pa.array(rng.uniform(150, 250, n), mask=rng.random(n) < 0.05),
        "y": pa.array(rng.uniform(250, 350, n)),
        "z": pa.array(rng.uniform(350, 450, n)),
        "memo": pa.array(memo, pa.string(), mask=rng.random(n) < 0.05),
    })  # fmt: skip


def test_groups_are_whole_batches_and_scan_is_reiterable(tmp_path, device):
    table = _points(10_000)
    path = tmp_path / "p.arrow"
    _file(path, table, 1000)
    scan = pystrom.scan_arrow(path, batch_rows=2500, device=device)
    sizes = [t.num_rows for t in scan]
    assert sizes == [3000, 3000, 3000, 1000]
    assert scan.stats.batches == 10 and scan.stats.rows_read == 10_000 and scan.stats.batches_skipped == 0
    again = pa.concat_tables([to_host(t) for t in scan])  # a second pass starts over
    assert again.equals(table)
    assert scan.stats.rows_read == 10_000


def test_several_files_and_globs(tmp_path, device):
    parts = [_points(1234, seed=s) for s in range(3)]
    for i, p in enumerate(parts):
        _file(tmp_path / f"part-{i}.arrow", p, 500)
    scan = pystrom.scan_arrow(str(tmp_path / "part-*.arrow"), columns=["id", "memo"], device=device)
    got = to_host(scan.collect())
    want = pa.concat_tables([p.select(["id", "memo"]) for p in parts])
    assert got.equals(want)
    assert scan.stats.files == 3


def test_collect_of_nothing_keeps_the_schema(tmp_path, device):
    table = _points(100)
    path = tmp_path / "p.arrow"
    _file(path, table, 30)
    got = pystrom.scan_arrow(path, columns=["x", "memo"], where="id < 0", device=device).collect()
    assert got.num_rows == 0 and got.column_names == ["x", "memo"]


def test_concat_matches_pyarrow(device):
    parts = [_points(n, seed=n) for n in (0, 1, 7, 9, 100)]
    tables = [pystrom.Table.from_arrow(p, device=device) for p in parts]
    tables.append(tables[-1].slice(3, 50))
    got = to_host(pystrom.concat(tables))
    want = pa.concat_tables(parts + [parts[-1].slice(3, 50)]).combine_chunks()
    assert got.equals(want)
    with pytest.raises(pystrom.SchemaMismatchError):
        pystrom.concat([tables[0], tables[0].select(["x"])])
    with pytest.raises(ValueError, match="at least one"):
        pystrom.concat([])


# -- where ---------------------------------------------------------------------------------------

SEED_QUERIES = [
    "sqrt((x-200)^2 + (y-300)^2 + (z-400)^2) < 10",
    "memo like '%abcd%'",
]


def _pyarrow_mask(table: pa.Table, query: str) -> pa.ChunkedArray:
    if query == SEED_QUERIES[0]:
        d = pc.sqrt(pc.add(pc.add(pc.power(pc.subtract(table["x"], 200), 2), pc.power(pc.subtract(table["y"], 300), 2)),
                           pc.power(pc.subtract(table["z"], 400), 2)))  # fmt: skip
        return pc.less(d, 10)
    return pc.match_like(table["memo"], "%abcd%")


@pytest.mark.parametrize("query", SEED_QUERIES)
def test_seed_queries_equal_pyarrow_compute(tmp_path, device, query):
    table = _points(50_000)
    path = tmp_path / "p.arrow"
    _file(path, table, 4096)
    want = table.filter(_pyarrow_mask(table, query))  # NULL in the mask drops the row
    got = pystrom.read_arrow(path, where=query, device=device)
    assert to_host(got).equals(want.combine_chunks())
    assert 0 < got.num_rows < table.num_rows


def test_where_columns_need_not_be_returned(tmp_path, device):
    table = _points(5000)
    path = tmp_path / "p.arrow"
    _file(path, table, 999)
    got = pystrom.read_arrow(path, columns=["id"], where=SEED_QUERIES[0], device=device)
    want = table.filter(_pyarrow_mask(table, SEED_QUERIES[0])).select(["id"])
    assert got.column_names == ["id"] and to_host(got).equals(want.combine_chunks())


def test_bad_where_is_a_clear_error(tmp_path, device):
    table = _points(10)
    path = tmp_path / "p.arrow"
    _file(path, table, 10)
    with pytest.raises(pystrom.Error, match="nope"):
        pystrom.read_arrow(path, where="nope > 1", device=device)
    with pytest.raises(pystrom.Error):
        pystrom.read_arrow(path, where="__import__('os').system('true')", device=device)


# -- statistics ------------------------------------------------------------------------------------


def _utc(text: str) -> pa.Scalar:
    return pa.array([np.datetime64(text, "us")]).cast(pa.timestamp("us", tz="UTC"))[0]


def _events(n: int) -> pa.Table:
    rng = np.random.default_rng(11)
    start = np.datetime64("2024-01-01T00:00:00", "us")
    ts = start + np.sort(rng.integers(0, 365 * 86_400_000_000, n)).astype("timedelta64[us]")
    return pa.table({
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "v": pa.array(rng.standard_normal(n), mask=rng.random(n) < 0.1),
        "tag": pa.array([f"t{k % 13}" for k in range(n)]),
    })  # fmt: skip


@pytest.mark.parametrize("footer_stats", [False, True])
def test_sorted_timestamps_skip_batches_and_stay_exact(tmp_path, device, footer_stats):
    table = _events(200_000)
    path = tmp_path / "events.arrow"
    pystrom.write_arrow(table, path, batch_rows=5000, footer_stats=footer_stats)
    where = "ts between '2024-03-01' and '2024-03-03 12:00' and v > 0"
    scan = pystrom.scan_arrow(path, where=where, device=device)
    got = to_host(scan.collect())
    lo, hi = _utc("2024-03-01T00:00:00"), _utc("2024-03-03T12:00:00")
    mask = pc.and_(
        pc.and_(pc.greater_equal(table["ts"], lo), pc.less_equal(table["ts"], hi)), pc.greater(table["v"], 0)
    )
    want = table.filter(mask).combine_chunks()
    assert got.equals(want) and want.num_rows > 0
    s = scan.stats
    assert s.batches == 40
    assert s.batches_skipped >= 36  # 2.5 days of 365 lie in one or two batches
    assert s.bytes_read <= 0.1 * s.bytes
    assert s.rows_matched == want.num_rows
    assert "skipped by statistics" in str(s)


def test_files_without_statistics_are_read_whole(tmp_path, device):
    table = _events(20_000)
    path = tmp_path / "plain.arrow"
    pystrom.write_arrow(table, path, batch_rows=1000, stats=False)
    scan = pystrom.scan_arrow(path, where="ts < '2024-01-02'", device=device)
    got = to_host(scan.collect())
    lo = _utc("2024-01-02T00:00:00")
    assert got.equals(table.filter(pc.less(table["ts"], lo)).combine_chunks())
    assert scan.stats.batches_skipped == 0 and scan.stats.batches == 20


def test_string_statistics_skip_batches(tmp_path, device):
    n = 30_000
    table = pa.table({"name": pa.array([f"k{k:06d}" for k in range(n)]), "x": np.arange(n, dtype=np.int32)})
    path = tmp_path / "names.arrow"
    pystrom.write_arrow(table, path, batch_rows=1000)
    scan = pystrom.scan_arrow(path, where="name = 'k012345'", device=device)
    got = to_host(scan.collect())
    assert got.column("x").to_pylist() == [12345]
    assert scan.stats.batches_skipped == 29


def test_several_files_with_host_path_columns(tmp_path, device):
    # dictionary columns are read through pyarrow on the host, from the reading thread: each file must
    # stay open until its last group is read, while the next file is already being planned
    parts = []
    for i in range(4):
        t = pa.table({
            "k": pa.array([f"v{j % 5}" for j in range(3000)]).dictionary_encode(),
            "x": pa.array(np.arange(3000, dtype=np.int64) + 3000 * i),
        })  # fmt: skip
        with ipc.new_file(tmp_path / f"d{i}.arrow", t.schema) as w:
            w.write_table(t, max_chunksize=700)
        parts.append(t)
    scan = pystrom.scan_arrow(sorted(tmp_path.glob("d*.arrow")), batch_rows=1000, where="x % 2 = 0", device=device)
    got = to_host(scan.collect())
    want = pa.concat_tables(parts)
    want = want.filter(pc.equal(pc.bit_wise_and(want["x"], 1), 0))
    assert got.column("x").to_pylist() == want.column("x").to_pylist()
    assert got.column("k").to_pylist() == want.column("k").to_pylist()


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_a_statistics_key_written_twice_is_not_trusted(tmp_path, compression):
    """pystrom parses the batch messages itself (the custom metadata included): a key a message holds twice
    stays twice, as pyarrow hands it out, so the column's statistics are doubtful and the batch is read
    (the last entry alone would skip rows that match)."""
    path = tmp_path / "dup.arrow"
    table = pa.table({"x": np.arange(100, dtype=np.int64)})
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(path, table.schema, options=options) as w:
        twice = pa.KeyValueMetadata([(b"min_max_stats.x", b"0,49"), (b"min_max_stats.x", b"1000,2000")])
        w.write_batch(table.slice(0, 50).to_batches()[0], custom_metadata=twice)
        w.write_batch(table.slice(50).to_batches()[0], custom_metadata={b"min_max_stats.x": b"50,99"})
    scan = pystrom.scan_arrow(path, where="x < 10", device="cpu")
    got = scan.collect()
    assert to_host(got).column("x").to_pylist() == list(range(10))
    assert scan.stats.batches_skipped == 1  # the second batch, by its one entry
