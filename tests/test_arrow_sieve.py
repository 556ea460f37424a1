"""The CPU scan's filtered read (io/arrow/scan/sieve.py): the filter's columns read whole, the other fixed-width
columns only in the slices that hold a matching row. Compared with pyarrow's own filter of the same
file, with slices small enough that every batch has several, matches on their edges and slices with none."""

from __future__ import annotations

import os
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pystrom
from pystrom.errors import FileFormatError
from pystrom.io.arrow.file import format as fmt
from pystrom.io.arrow.file.metadata import direct_types, open_arrow_file
from pystrom.io.arrow.read.batches import batch_layouts
from pystrom.io.arrow.scan import sieve
from pystrom.io.arrow.write.writer import write_ipc_file


def _table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    key = rng.integers(0, 100, n)
    return pa.table({
        "key": pa.array(key, pa.int64()),
        "f64": pa.array(rng.random(n)),
        "i8": pa.array(rng.integers(-100, 100, n), pa.int8()),
        "u16": pa.array(rng.integers(0, 60000, n), pa.uint16()),
        "f32": pa.array(rng.random(n).astype(np.float32)),
        "ts": pa.array(np.arange(n, dtype=np.int64) * 1000, pa.timestamp("us")),
        "d32": pa.array(np.arange(n, dtype=np.int32) % 20000, pa.date32()),
        "dec": pa.array([Decimal(int(k)) / 100 for k in key], pa.decimal128(12, 2)),
        "fsb": pa.array([int(k).to_bytes(3, "little") for k in key], pa.binary(3)),
        "nullable": pa.array(rng.random(n), mask=rng.random(n) < 0.1),
        "flag": pa.array(key % 3 == 0),
        "s": pa.array([f"r{k}" for k in range(n)], pa.string()),
    })  # fmt: skip


def _write(path, table: pa.Table, sizes) -> None:
    """One record batch per size (a 0 gives an empty batch)."""
    with ipc.new_file(path, table.schema) as w:
        at = 0
        for k in sizes:
            part = table.slice(at, k)
            w.write_batch(pa.RecordBatch.from_arrays([c.combine_chunks() for c in part.columns], schema=table.schema))
            at += k


def _write_claiming_nulls(monkeypatch, path, table, claim) -> None:
    """Our writer's file of ``table`` whose record batches say column 'v' holds ``claim`` NULLs."""
    encode = fmt.encode_batch_message
    v = table.column_names.index("v")

    def forged(length, nodes, buffers, body_length, custom_metadata=(), compression=None):
        nodes = list(nodes)
        nodes[v] = (nodes[v][0], claim)
        return encode(length, nodes, buffers, body_length, custom_metadata, compression)

    monkeypatch.setattr(fmt, "encode_batch_message", forged)
    write_ipc_file(path, table.schema, table.to_batches(max_chunksize=40), stats=False)
    monkeypatch.undo()


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(sieve, "SLICE_ROWS", 7)


def _sieved(path, where_columns, columns):
    with open_arrow_file(str(path)) as f:
        types = direct_types(f.schema, columns)
        layouts = batch_layouts(f, columns, types)
        return sieve.sieved_columns(f, layouts, columns, types, where_columns)


@pytest.mark.parametrize(
    "where, mask",
    [
        ("key < 10", lambda t: pc.less(t["key"], 10)),
        ("key >= 0", lambda t: pc.greater_equal(t["key"], 0)),  # every row
        ("key > 1000", lambda t: pc.greater(t["key"], 1000)),  # none
        ("key = 42 or key = 7", lambda t: pc.or_(pc.equal(t["key"], 42), pc.equal(t["key"], 7))),
    ],
)
def test_scan_equals_pyarrows_filter(tmp_path, small_slices, where, mask):
    table = _table(1000)
    path = tmp_path / "t.arrow"
    _write(path, table, [300, 0, 1, 14, 385, 300])
    sieved = ["f64", "i8", "u16", "f32", "ts", "d32", "dec", "fsb", "nullable"]
    assert _sieved(path, ["key"], table.column_names) == sieved
    scan = pystrom.scan_arrow(path, where=where, batch_rows=400, device="cpu")
    got = scan.collect().to_arrow()
    want = table.filter(mask(table))
    assert got.equals(want), where
    assert scan.stats.rows_read == 1000 and scan.stats.rows_matched == want.num_rows


def test_columns_asked_for_in_another_order(tmp_path, small_slices):
    table = _table(500, seed=3)
    path = tmp_path / "t.arrow"
    _write(path, table, [250, 250])
    got = pystrom.scan_arrow(path, columns=["dec", "s", "f32", "key"], where="f64 < 0.3", device="cpu").collect()
    want = table.filter(pc.less(table["f64"], 0.3)).select(["dec", "s", "f32", "key"])
    assert got.to_arrow().equals(want)


def test_matches_at_slice_edges_only(tmp_path, small_slices):
    """Rows 0, 6, 7, 13, 14 and the last of a batch: the first and last row of slices of 7."""
    n = 50
    table = pa.table({"k": pa.array(np.arange(n)), "v": pa.array(np.arange(n) * 1.5)})
    path = tmp_path / "t.arrow"
    _write(path, table, [n])
    where = "k = 0 or k = 6 or k = 7 or k = 13 or k = 14 or k = 49"
    got = pystrom.scan_arrow(path, where=where, device="cpu").collect().to_arrow()
    assert got.column("v").to_pylist() == [k * 1.5 for k in (0, 6, 7, 13, 14, 49)]


def test_what_is_not_sieved(tmp_path):
    """Booleans, strings, the filter's own columns and compressed bodies take the ordinary read."""
    table = _table(100)
    path = tmp_path / "t.arrow"
    _write(path, table, [100])
    assert _sieved(path, ["f64"], ["key", "f64", "nullable", "flag", "s"]) == ["key", "nullable"]
    packed = tmp_path / "lz4.arrow"
    with ipc.new_file(packed, table.schema, options=ipc.IpcWriteOptions(compression="lz4")) as w:
        w.write_table(table)
    assert _sieved(packed, ["key"], table.column_names) == []
    got = pystrom.scan_arrow(packed, where="key < 5", device="cpu").collect().to_arrow()
    assert got.equals(table.filter(pc.less(table["key"], 5)))


def test_a_bitmap_its_batch_says_holds_no_null_is_ignored_as_pyarrow_does(tmp_path, monkeypatch):
    """A bitmap holding NULLs in a batch that claims none: the format lets a reader ignore the bitmap, and
    pyarrow and read_arrow do; the sieved scan reads the same values."""
    n = 64
    v = pa.array(np.arange(n, dtype=np.float64), mask=np.arange(n) % 2 == 1)
    table = pa.table({"k": pa.array(np.arange(n)), "v": v})
    path = tmp_path / "t.arrow"
    _write_claiming_nulls(monkeypatch, path, table, 0)
    assert _sieved(path, ["k"], ["k", "v"]) == ["v"]
    theirs = ipc.open_file(path).read_all()
    assert theirs.column("v").null_count == 0
    assert pystrom.read_arrow(path, device="cpu").to_arrow().equals(theirs)
    got = pystrom.scan_arrow(path, where="k < 10", device="cpu").collect().to_arrow()
    assert got.equals(theirs.slice(0, 10))


def test_nulls_of_sieved_columns(tmp_path, small_slices):
    """NULLs in some batches and not others, the matching rows' bits packed at any position."""
    n = 300
    rng = np.random.default_rng(5)
    v = pa.array(rng.random(n), mask=(np.arange(n) // 100 == 1) & (rng.random(n) < 0.4))  # NULLs in batch 1 only
    w = pa.array(rng.integers(0, 9, n), pa.int16(), mask=rng.random(n) < 0.2)
    table = pa.table({"k": pa.array(np.arange(n) % 17), "v": v, "w": w})
    path = tmp_path / "t.arrow"
    _write(path, table, [100, 100, 100])
    assert _sieved(path, ["k"], ["k", "v", "w"]) == ["v", "w"]
    for where, mask in (("k < 5", pc.less(table["k"], 5)), ("k >= 0", pc.greater_equal(table["k"], 0))):
        scan = pystrom.scan_arrow(path, where=where, device="cpu")
        got = scan.collect().to_arrow()
        assert got.equals(table.filter(mask)), where
        assert got.column("v").null_count == table.filter(mask).column("v").null_count


def test_a_bitmap_holding_other_nulls_than_claimed_is_refused_as_read_arrow_refuses_it(tmp_path, monkeypatch):
    n = 80
    v = pa.array(np.arange(n, dtype=np.float64), mask=np.arange(n) % 10 == 3)  # 4 NULLs a batch of 40
    table = pa.table({"k": pa.array(np.arange(n)), "v": v})
    path = tmp_path / "t.arrow"
    _write_claiming_nulls(monkeypatch, path, table, 3)
    assert _sieved(path, ["k"], ["k", "v"]) == ["v"]
    match = r"t\.arrow.*column 'v': the record batches claim 6 NULLs, their validity bitmaps hold 8"
    with pytest.raises(FileFormatError, match=match):
        pystrom.read_arrow(path, device="cpu")
    with pytest.raises(FileFormatError, match=match):
        pystrom.scan_arrow(path, where="k < 10", device="cpu").collect()


def test_a_file_that_shrinks_while_read_is_refused_naming_it(tmp_path, small_slices):
    table = _table(400).select(["key", "f64", "i8"])
    path = tmp_path / "t.arrow"
    _write(path, table, [200, 200])
    columns = table.column_names
    scan = pystrom.scan_arrow(path, where="key >= 0", device="cpu")
    with open_arrow_file(str(path)) as f:
        types = direct_types(f.schema, columns)
        layouts = batch_layouts(f, columns, types)
        # cut the file inside the last batch's values of i8 (the keys, read first, stay whole)
        cut = int(layouts.chunks["i8"].values.offset[-1]) + 50
        assert cut > int(layouts.chunks["key"].values.offset[-1] + layouts.chunks["key"].values.size[-1])
        os.truncate(path, cut)
        with pytest.raises(FileFormatError, match=r"t\.arrow.*record batch 1, column 'i8'.*shrank"):
            sieve.read_filtered(f, layouts, columns, types, scan.backend, scan.predicate)


def test_bytes_read_count_only_the_slices_read(tmp_path, small_slices):
    """A match in one slice of one batch reads that slice of each sieved column, not the batches."""
    n = 70
    table = pa.table({"k": pa.array(np.arange(n)), "v": pa.array(np.arange(n, dtype=np.float64))})
    path = tmp_path / "t.arrow"
    _write(path, table, [n])
    scan = pystrom.scan_arrow(path, where="k = 30", device="cpu")
    assert scan.collect().to_arrow().column("v").to_pylist() == [30.0]
    assert scan.stats.bytes_read == n * 8 + 7 * 8  # k whole, one slice of 7 values of v


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=6),
    slice_rows=st.integers(1, 40),
    threshold=st.integers(-1, 100),
    seed=st.integers(0, 2**16),
)
def test_any_batches_slices_and_selectivity(tmp_path, monkeypatch, sizes, slice_rows, threshold, seed):
    monkeypatch.setattr(sieve, "SLICE_ROWS", slice_rows)
    table = _table(sum(sizes), seed=seed).select(["key", "f64", "i8", "dec", "fsb", "s", "nullable"])
    table = table.append_column("ns", pa.array([f"v{k}" * (k % 5) for k in range(sum(sizes))], pa.string(),
                                                mask=np.arange(sum(sizes)) % 4 == 1))  # fmt: skip
    path = tmp_path / f"h{seed}.arrow"
    _write(path, table, sizes)
    scan = pystrom.scan_arrow(path, where=f"key < {threshold}", batch_rows=50, device="cpu")
    got = scan.collect().to_arrow()
    assert got.equals(table.filter(pc.less(table["key"], threshold)))
    assert scan.stats.rows_read == sum(sizes)


def test_strings_of_every_size_and_nulls_beside_sieved_columns(tmp_path, small_slices):
    """Strings (read whole, then filtered) beside a sieved column: empty strings, NULLs, binary with zero
    bytes, a 3 MiB string."""
    n = 90
    rng = np.random.default_rng(11)
    words = [("x" * int(k)) if k % 5 else "" for k in rng.integers(0, 40, n)]
    words[33] = "L" * (3 << 20)
    s = pa.array(words, pa.string(), mask=rng.random(n) < 0.15)
    b = pa.array([bytes([0, k % 256, 0]) * (k % 4) for k in range(n)], pa.binary())
    table = pa.table({"k": pa.array(np.arange(n)), "s": s, "b": b, "v": pa.array(np.arange(n) * 0.5)})
    path = tmp_path / "t.arrow"
    _write(path, table, [30, 0, 45, 15])
    assert _sieved(path, ["k"], ["k", "s", "b", "v"]) == ["v"]
    for where, mask in (
        ("k < 40 and k > 20", pc.and_(pc.less(table["k"], 40), pc.greater(table["k"], 20))),
        ("k = 33", pc.equal(table["k"], 33)),
        ("k >= 0", pc.greater_equal(table["k"], 0)),
    ):
        got = pystrom.scan_arrow(path, where=where, device="cpu").collect().to_arrow()
        assert got.equals(table.filter(mask)), where


def _write_with_offsets(path, offsets: list[int]) -> None:
    """A file of 3 strings over 8 bytes whose offsets are then overwritten in place with ``offsets``."""
    table = pa.table({"k": pa.array(np.arange(3)), "s": pa.array(["abc", "de", "fgh"])})
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    with open_arrow_file(str(path)) as f:
        layouts = batch_layouts(f, ["s"], direct_types(f.schema, ["s"]))
        at = int(layouts.chunks["s"].values.offset[0])
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(np.array(offsets, np.int32).tobytes())


@pytest.mark.parametrize(
    "offsets", [[0, 5, 3, 8], [0, 2, 4, 1000], [-4, 0, 2, 8]], ids=["decrease", "past-data", "negative"]
)
def test_invalid_string_offsets_are_refused_as_read_arrow_refuses_them(tmp_path, offsets):
    path = tmp_path / "t.arrow"
    _write_with_offsets(path, offsets)
    match = r"t\.arrow.*record batch 0, column 's' has invalid string offsets"
    with pytest.raises(FileFormatError, match=match):
        pystrom.read_arrow(path, device="cpu")
    with pytest.raises(FileFormatError, match=match):
        pystrom.scan_arrow(path, where="k = 0", device="cpu").collect()


@pytest.mark.parametrize("where", [None, "k < 50"], ids=["read", "sieved scan"])
def test_a_file_replaced_after_its_metadata_was_read_is_read_from_the_file_it_was(tmp_path, where):
    """Reads go through the descriptor the metadata came from: a writer that replaces the path meanwhile
    (write_arrow over an existing file does) must not have its bytes read at the old file's offsets."""
    n = 100
    old = pa.table({"k": pa.array(np.arange(n)), "v": pa.array(np.arange(n, dtype=np.float64))})
    new = pa.table({"k": pa.array(np.arange(n)[::-1].copy()), "v": pa.array(-np.arange(n, dtype=np.float64))})
    path, other = tmp_path / "t.arrow", tmp_path / "other.arrow"
    _write(path, old, [40, 60])
    _write(other, new, [60, 40])
    columns = ["k", "v"]
    with open_arrow_file(str(path)) as f:
        types = direct_types(f.schema, columns)
        layouts = batch_layouts(f, columns, types)
        os.replace(other, path)
        backend = pystrom.memory.backend.resolve_device("cpu")
        if where is None:
            from pystrom.io.arrow.read.direct import read_batches

            got, _ = read_batches(f, layouts, columns, types, backend)
            want = old
        else:
            scan = pystrom.scan_arrow(tmp_path / "t.arrow", where=where, device="cpu")  # compiles the filter only
            got, _, _ = sieve.read_filtered(f, layouts, columns, types, backend, scan.predicate)
            want = old.filter(pc.less(old["k"], 50))
    assert got.to_arrow().equals(want)


def test_the_mapping_and_the_descriptor_are_of_one_file(tmp_path, monkeypatch):
    """A file replaced between ArrowFile's open and its memory mapping: both are of the file opened."""
    import pyarrow as pa_

    from pystrom.io.arrow.file import metadata as arrow_file

    n = 50
    old = pa.table({"k": pa.array(np.arange(n)), "v": pa.array(np.arange(n, dtype=np.float64))})
    new = pa.table({"k": pa.array(np.arange(n + 7)), "v": pa.array(-np.arange(n + 7, dtype=np.float64))})
    path, other = tmp_path / "t.arrow", tmp_path / "other.arrow"
    _write(path, old, [n])
    _write(other, new, [n + 7])
    real = pa_.memory_map

    def replaced_first(where, mode="r"):
        if other.exists():
            os.replace(other, path)
        return real(where, mode)

    monkeypatch.setattr(arrow_file.pa, "memory_map", replaced_first)
    with open_arrow_file(str(path)) as f:
        assert f.num_batches == 1 and int(f.read_pieces(np.array([0]), np.array([6]))[0]) == ord("A")
        columns = ["k", "v"]
        types = direct_types(f.schema, columns)
        layouts = batch_layouts(f, columns, types)
        assert int(layouts.num_rows.sum()) == n  # the metadata of the file opened, through the mapping
        from pystrom.io.arrow.read.direct import read_batches

        got, _ = read_batches(f, layouts, columns, types, pystrom.memory.backend.resolve_device("cpu"))
    assert got.to_arrow().equals(old)
