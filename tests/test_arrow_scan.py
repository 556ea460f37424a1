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
