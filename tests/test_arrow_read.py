"""read_arrow: exact equality with pyarrow's reader for every type, batch shape and file flavour."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pystrom
from pystrom.testing import to_host

from datagen import TYPES, make_array, make_sliced

# Batch lengths chosen so that batch boundaries fall on and off multiples of 8 rows.
BATCHES = [5, 0, 13, 8, 64, 1, 100]


def _write(path, table: pa.Table, lengths=BATCHES, stream=False, compression=None) -> None:
    options = ipc.IpcWriteOptions(compression=compression)
    opener = ipc.new_stream if stream else ipc.new_file
    with opener(path, table.schema, options=options) as w:
        pos = 0
        for n in lengths:
            columns = [c.slice(pos, n).combine_chunks() for c in table.columns]
            w.write_batch(pa.record_batch(columns, schema=table.schema))
            pos += n
        if pos < table.num_rows:
            w.write_table(table.slice(pos))


def _expected(path, columns=None) -> pa.Table:
    with pa.memory_map(str(path)) as src:
        try:
            ref = ipc.open_file(src).read_all()
        except pa.ArrowInvalid:
            ref = ipc.open_stream(src).read_all()
    if columns is not None:
        ref = ref.select(columns)
    return ref


def _assert_same(got: pystrom.Table, ref: pa.Table) -> None:
    host = to_host(got)
    assert host.column_names == ref.column_names
    assert host.num_rows == ref.num_rows
    for name in ref.column_names:
        want = ref.column(name)
        if pa.types.is_dictionary(want.type):
            want = pa.chunked_array([c.dictionary_decode() for c in want.chunks], want.type.value_type)
        if pa.types.is_large_string(want.type):
            want = want.cast(pa.string())
        assert host.column(name).combine_chunks().equals(want.combine_chunks()), name


def _mixed_table(nulls: bool, n: int = sum(BATCHES) + 37, seed: int = 1) -> pa.Table:
    return pa.table({name: make_array(t, n, nulls, seed=seed + i) for i, (name, t) in enumerate(TYPES.items())})


@pytest.mark.parametrize("nulls", [False, True])
def test_every_type_many_odd_batches(tmp_path, device, nulls):
    table = _mixed_table(nulls)
    path = tmp_path / "all.arrow"
    _write(path, table)
    got = pystrom.read_arrow(path, device=device)
    assert got.device.startswith(device)
    _assert_same(got, _expected(path))


def test_column_projection_reads_only_those_columns(tmp_path, device):
    table = _mixed_table(True)
    path = tmp_path / "p.arrow"
    _write(path, table)
    cols = ["string", "float64", "bool", "decimal_38_10"]
    got = pystrom.read_arrow(str(path), columns=cols, device=device)
    _assert_same(got, _expected(path, cols))
    scan = pystrom.scan_arrow(path, columns=cols, device=device)
    pieces = list(scan)
    assert scan.stats.bytes_read < os.path.getsize(path) / 2  # the other 24 columns were not read
    assert sum(p.num_rows for p in pieces) == table.num_rows


def test_sliced_inputs_written_by_pyarrow(tmp_path, device):
    # pyarrow writes sliced arrays with shifted bitmaps and string offsets that may not start at 0
    cols = {name: make_sliced(t, 300, True, seed=i, offset=5) for i, (name, t) in enumerate(TYPES.items())}
    table = pa.table(cols)
    path = tmp_path / "sliced.arrow"
    with ipc.new_file(path, table.schema) as w:
        for b in table.to_batches(max_chunksize=29):  # slices sharing the parents' buffers
            w.write_batch(b)
    _assert_same(pystrom.read_arrow(path, device=device), _expected(path))


def test_stream_format_is_read_sequentially(tmp_path, device):
    table = _mixed_table(True)
    path = tmp_path / "s.arrows"
    _write(path, table, stream=True)
    _assert_same(pystrom.read_arrow(path, device=device), _expected(path))


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_file_is_exact_without_warning(tmp_path, device, codec, recwarn):
    table = _mixed_table(True)
    path = tmp_path / f"{codec}.arrow"
    _write(path, table, compression=codec)
    got = pystrom.read_arrow(path, device=device)  # inflated by pystrom (io/arrow/read/compressed_reads.py), no warning
    assert not [w for w in recwarn if issubclass(w.category, pystrom.PerformanceWarning)]
    _assert_same(got, _expected(path))


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_stream_is_exact_and_warns(tmp_path, device, codec):
    table = _mixed_table(True)
    path = tmp_path / f"{codec}.arrows"
    _write(path, table, stream=True, compression=codec)
    with pytest.warns(pystrom.PerformanceWarning, match="compressed"):
        got = pystrom.read_arrow(path, device=device)
    _assert_same(got, _expected(path))


def test_dictionary_and_large_strings_take_the_host_path(tmp_path, device):
    rng = np.random.default_rng(3)
    n = 1000
    table = pa.table({
        "d": pa.array(rng.integers(0, 7, n)).cast(pa.string()).dictionary_encode(),
        "ls": pa.array([("x" * int(k)) if k % 5 else None for k in rng.integers(0, 9, n)], pa.large_string()),
        "v": pa.array(rng.standard_normal(n)),
    })  # fmt: skip
    path = tmp_path / "dict.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table, max_chunksize=333)
    _assert_same(pystrom.read_arrow(path, device=device), _expected(path))


def test_zero_batches_and_empty_batches(tmp_path, device):
    table = _mixed_table(True, n=0)
    path = tmp_path / "empty.arrow"
    with ipc.new_file(path, table.schema):
        pass
    got = pystrom.read_arrow(path, device=device)
    assert got.num_rows == 0 and got.column_names == table.column_names
    path2 = tmp_path / "empty2.arrow"
    _write(path2, table, lengths=[0, 0])
    _assert_same(pystrom.read_arrow(path2, device=device), _expected(path2))


def test_large_column_many_batches(tmp_path, device):
    n = 1_000_003
    table = pa.table({
        "x": make_array(pa.float64(), n, True, seed=5),
        "s": make_array(pa.string(), n, True, seed=6),
        "b": make_array(pa.bool_(), n, True, seed=7),
    })  # fmt: skip
    path = tmp_path / "big.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table, max_chunksize=65_531)
    _assert_same(pystrom.read_arrow(path, device=device), _expected(path))


# -- bad input ---------------------------------------------------------------------------------


def _pool_used(device):
    if device == "cpu":
        return 0
    import cupy

    cupy.cuda.Device().synchronize()
    return cupy.get_default_memory_pool().used_bytes()


def _resident_pages(fd: int, size: int) -> int:
    """How many of the file's pages are in the page cache (mincore over a mapping of it)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    view = np.frombuffer(m, np.uint8)
    vec = np.zeros(-(-size // mmap.PAGESIZE), np.uint8)
    assert libc.mincore(view.ctypes.data, size, vec.ctypes.data) == 0, os.strerror(ctypes.get_errno())
    del view
    m.close()
    return int((vec & 1).sum())


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise and mincore (Linux)")
def test_opening_a_file_reads_its_metadata_not_its_data(tmp_path):
    """The data pages are read by the column reads alone: opening the file (pyarrow's mapping of it) used to
    madvise(WILLNEED) the whole mapping, which read ahead megabytes of an uncached file."""
    from pystrom.io.arrow.file.metadata import open_arrow_file

    path = tmp_path / "cold.arrow"
    rows = 1 << 21
    _write(path, pa.table({"a": np.arange(rows), "b": np.ones(rows)}), lengths=[rows])
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        size = os.fstat(fd).st_size
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if _resident_pages(fd, size):
            pytest.skip("this file system keeps the file's pages (tmpfs?)")
        with open_arrow_file(path) as f:
            assert f.num_batches == 1
            assert _resident_pages(fd, size) <= 8  # the footer and the schema
    finally:
        os.close(fd)


def test_missing_file_and_directory(tmp_path, device):
    with pytest.raises(FileNotFoundError, match="nope.arrow"):
        pystrom.read_arrow(tmp_path / "nope.arrow", device=device)
    with pytest.raises(IsADirectoryError, match="directory"):
        pystrom.read_arrow(tmp_path, device=device)


def test_not_arrow(tmp_path, device):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(pystrom.FileFormatError, match="x.csv"):
        pystrom.read_arrow(path, device=device)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(pystrom.FileFormatError, match="empty"):
        pystrom.read_arrow(empty, device=device)


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95, 0.999])
def test_truncated_file(tmp_path, device, keep):
    table = _mixed_table(True)
    path = tmp_path / "t.arrow"
    _write(path, table)
    data = path.read_bytes()
    bad = tmp_path / "trunc.arrow"
    bad.write_bytes(data[: int(len(data) * keep)])
    before = _pool_used(device)
    with pytest.raises(pystrom.FileFormatError, match="trunc.arrow.*does not end with it: cut short, or still being"):
        pystrom.read_arrow(bad, device=device)
    assert _pool_used(device) == before


def test_corrupt_string_offsets_are_caught(tmp_path, device):
    table = pa.table({"s": pa.array(["abc", "de", "", "fghij"] * 50)})
    path = tmp_path / "s.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    # find the offsets buffer through the same mapping trick the reader uses, and scramble it
    with pa.memory_map(str(path)) as src:
        base = src.read_buffer(src.size()).address
        src.seek(0)
        batch = ipc.open_file(src).get_batch(0)
        offsets_at = batch.column(0).buffers()[1].address - base
    raw = bytearray(path.read_bytes())
    raw[offsets_at + 8 : offsets_at + 12] = (10**6).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    before = _pool_used(device)
    with pytest.raises(pystrom.FileFormatError, match="string offsets"):
        pystrom.read_arrow(path, device=device)
    assert _pool_used(device) == before


def test_bad_columns(tmp_path, device):
    table = _mixed_table(False, n=10)
    path = tmp_path / "c.arrow"
    _write(path, table, lengths=[10])
    with pytest.raises(pystrom.ColumnNotFoundError, match="'nope'"):
        pystrom.read_arrow(path, columns=["int8", "nope"], device=device)
    with pytest.raises(TypeError, match="list of names"):
        pystrom.read_arrow(path, columns="int8", device=device)
    with pytest.raises(pystrom.SchemaMismatchError, match="twice"):
        pystrom.read_arrow(path, columns=["int8", "int8"], device=device)
    with pytest.raises(TypeError, match="path"):
        pystrom.read_arrow(42, device=device)


def test_unsupported_type_names_the_column(tmp_path, device):
    table = pa.table({"ok": [1, 2], "nested": pa.array([[("a", 1)], [("b", 2)]], pa.map_(pa.string(), pa.int64()))})
    path = tmp_path / "n.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    with pytest.raises(pystrom.UnsupportedTypeError, match="nested"):
        pystrom.read_arrow(path, device=device)
    assert pystrom.read_arrow(path, columns=["ok"], device=device).num_rows == 2


def test_scan_files_of_different_schemas(tmp_path, device):
    a, b = tmp_path / "a.arrow", tmp_path / "b.arrow"
    for path, col in ((a, pa.array([1, 2])), (b, pa.array([1.0, 2.0]))):
        with ipc.new_file(path, pa.schema([("x", col.type)])) as w:
            w.write_table(pa.table({"x": col}))
    with pytest.raises(pystrom.SchemaMismatchError, match="b.arrow"):
        list(pystrom.scan_arrow([a, b], device=device))
    with pytest.raises(FileNotFoundError, match="zzz"):
        pystrom.scan_arrow(tmp_path / "zzz*.arrow", device=device)


# -- write_arrow -> read_arrow ---------------------------------------------------------------------


@pytest.mark.parametrize("nulls", [False, True])
def test_write_arrow_then_read_arrow_roundtrip(tmp_path, device, nulls):
    source = _mixed_table(nulls, n=1003)
    table = pystrom.Table.from_arrow(source, device=device)
    path = tmp_path / "rt.arrow"
    summary = pystrom.write_arrow(table, path, batch_rows=97)
    assert summary.num_rows == 1003 and summary.num_batches == 11
    got = pystrom.read_arrow(path, device=device)
    assert got.schema.equals(table.schema, check_metadata=True)
    _assert_same(got, source)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    null_share=st.sampled_from([0.0, 0.3, 1.0]),
    columns=st.lists(st.sampled_from(["bool", "int16", "float64", "string", "timestamp_us", "decimal_9_2"]),
                     min_size=1, max_size=4, unique=True),
)  # fmt: skip
def test_roundtrip_property_cpu(tmp_path_factory, lengths, null_share, columns):
    n = sum(lengths)
    rng = np.random.default_rng(n)
    cols = {}
    for i, name in enumerate(columns):
        arr = make_array(TYPES[name], n, False, seed=i)
        mask = rng.random(n) < null_share
        cols[name] = pa.array(arr.to_pylist(), arr.type, mask=mask) if n else arr
    table = pa.table(cols)
    path = tmp_path_factory.mktemp("rt") / "p.arrow"
    _write(path, table, lengths=lengths)
    _assert_same(pystrom.read_arrow(path, device="cpu"), _expected(path))
    selected = columns[::-1][:2]
    _assert_same(pystrom.read_arrow(path, columns=selected, device="cpu"), _expected(path, selected))
