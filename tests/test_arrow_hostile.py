"""Hostile and corrupt Arrow files (issue 14): clear pystrom errors, never a crash or a wrong answer.

Reads that crashed the process before run in a subprocess, so a regression fails the test instead of
killing the run.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import pystrom
from pystrom.io.arrow.file import format as fmt
from pystrom.io.arrow.file.metadata import open_arrow_file
from pystrom.io.arrow.write.writer import write_ipc_file
from pystrom.testing import to_host

# -- finding 1: corrupt dictionaries and the host path --------------------------------------------


def _dictionary_file(path, stream: bool) -> None:
    table = pa.table({"d": pa.array(["aa", "bbb", "c", "dddd"] * 4).dictionary_encode(), "i": pa.array(range(16))})
    with (ipc.new_stream if stream else ipc.new_file)(path, table.schema) as w:
        w.write_table(table)


def _patch_int32s(path, old: tuple[int, ...], slot: int, value: int) -> None:
    raw = bytearray(path.read_bytes())
    at = raw.find(struct.pack(f"<{len(old)}i", *old))
    assert at > 0
    struct.pack_into("<i", raw, at + 4 * slot, value)
    path.write_bytes(bytes(raw))


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("slot,value", [(1, -(2**24)), (4, 2**30), (2, 1)])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("call", ["read_arrow", "scan_arrow"])
def test_corrupt_dictionary_offsets_raise_naming_file_column_batch(tmp_path, device, slot, value, stream, call):
    # Before: SIGSEGV (offsets[1] = -2**24) or SIGBUS (offsets[4] = 2**30) in dictionary_decode.
    path = tmp_path / ("d.arrows" if stream else "d.arrow")
    _dictionary_file(path, stream)
    _patch_int32s(path, (0, 2, 5, 6, 10), slot, value)  # the dictionary's string offsets
    with pa.memory_map(str(path)) as src:
        opened = ipc.open_stream(src) if stream else ipc.open_file(src)
        with pytest.raises(pa.ArrowInvalid):
            opened.read_all().validate(full=True)
    read = f"pystrom.read_arrow({str(path)!r}, device={device!r})"
    if call == "scan_arrow":
        read = f"pystrom.scan_arrow({str(path)!r}, where='i >= 0', device={device!r}).collect()"
    result = _run(f"""
        import pystrom
        try:
            {read}
        except pystrom.FileFormatError as exc:
            print("ERROR", exc)
        """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERROR" in result.stdout
    assert path.name in result.stdout and "column 'd'" in result.stdout and "record batch 0" in result.stdout


def test_dictionary_index_out_of_range(tmp_path, device):
    table = pa.table({"d": pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 1], pa.int32()), ["x", "y", "z"])})
    path = tmp_path / "ix.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    _patch_int32s(path, (0, 1, 2, 1), 2, 1000)
    with pytest.raises(pystrom.FileFormatError, match=r"record batch 0, column 'd'.*(index|bounds)"):
        pystrom.read_arrow(path, device=device)


def test_invalid_utf8_dictionary_is_refused(tmp_path, device):
    table = pa.table({"d": pa.array(["abc", "xyz", "abc"]).dictionary_encode()})
    path = tmp_path / "u.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    raw = bytearray(path.read_bytes())
    at = raw.find(b"abcxyz")
    raw[at + 1] = 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(pystrom.FileFormatError, match="column 'd'.*UTF8|column 'd'.*utf-?8"):
        pystrom.read_arrow(path, device=device)


@pytest.mark.filterwarnings("ignore::pystrom.PerformanceWarning")
@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_corrupt_compressed_body(tmp_path, device, codec):
    table = pa.table({"x": np.arange(10_000, dtype=np.int64), "s": [str(i) for i in range(10_000)]})
    path = tmp_path / "c.arrow"
    with ipc.new_file(path, table.schema, options=ipc.IpcWriteOptions(compression=codec)) as w:
        w.write_table(table)
    raw = bytearray(path.read_bytes())
    for at in range(600, len(raw) - 600, 97):  # scramble the compressed bodies, not the footer
        raw[at] ^= 0x5A
    path.write_bytes(bytes(raw))
    with pytest.raises(pystrom.FileFormatError, match="c.arrow"):
        pystrom.read_arrow(path, device=device)


# -- the direct path: metadata that disagrees with itself ----------------------------------------------


def _write_with_nodes(monkeypatch, path, table, nodes_fn) -> None:
    """A file by our writer whose record batch nodes ((length, null_count) per column) are rewritten."""
    encode = fmt.encode_batch_message

    def forged(length, nodes, buffers, body_length, custom_metadata=(), compression=None):
        return encode(length, nodes_fn(list(nodes)), buffers, body_length, custom_metadata, compression)

    monkeypatch.setattr(fmt, "encode_batch_message", forged)
    write_ipc_file(path, table.schema, table.to_batches(), stats=False)
    monkeypatch.undo()


@pytest.mark.parametrize(
    "nodes_fn,match",
    [
        # a column longer than its batch (pyarrow's reader refuses the whole batch)
        (lambda nodes: [(nodes[0][0] + 1000, nodes[0][1])] + nodes[1:], "record batch 0.*length"),
        (lambda nodes: [(nodes[0][0], nodes[0][0] + 1)] + nodes[1:], "'x'.*NULLs"),  # more NULLs than rows
        (lambda nodes: [(nodes[0][0], 2)] + nodes[1:], "'x'.*NULLs"),  # its bitmap holds 3
        (lambda nodes: [(nodes[0][0], -5)] + nodes[1:], "record batch 0.*'x'|record batch 0.*null"),
    ],
)
def test_inconsistent_nodes_are_refused(tmp_path, device, monkeypatch, nodes_fn, match):
    x = pa.array([1, None, 3, None, 5, 6, 7, 8, None, 10], pa.int64())
    table = pa.table({"x": x, "y": pa.array(range(10), pa.float64())})
    path = tmp_path / "n.arrow"
    _write_with_nodes(monkeypatch, path, table, nodes_fn)
    with pytest.raises(pystrom.FileFormatError, match=rf"n.arrow.*{match}"):
        pystrom.read_arrow(path, device=device)
    if "length" in match:
        return
    assert to_host(pystrom.read_arrow(path, columns=["y"], device=device)).column("y").to_pylist() == list(
        map(float, range(10))
    )


# -- finding 2: intervals and legacy streams -------------------------------------------------------------


def _interval_file(monkeypatch, path, unit: int, values: pa.Array | None = None) -> None:
    """A file whose first column is an Interval (unit 0 = YEAR_MONTH, 1 = DAY_TIME) over int32/int64
    values; pyarrow has no factory for these types, so our encoder writes the type table."""
    encode_type = fmt._encode_type

    def with_interval(b, t):
        if t == (pa.int32() if unit == 0 else pa.int64()):
            b.StartObject(1)  # table Interval { unit: IntervalUnit (short); }
            b.PrependInt16Slot(0, unit, 0)
            return 11, b.EndObject()  # union Type: Interval = 11
        return encode_type(b, t)

    monkeypatch.setattr(fmt, "_encode_type", with_interval)
    if values is None:
        values = pa.array([1, 2, 3], pa.int32() if unit == 0 else pa.int64())
    k = pa.array(np.arange(1.0, len(values) + 1), pa.float32())
    write_ipc_file(path, pa.schema([("iv", values.type), ("k", pa.float32())]),
                   [pa.record_batch([values, k], names=["iv", "k"])], stats=False)  # fmt: skip
    monkeypatch.undo()


def _day_time(days: int, ms: int) -> int:
    """A day_time_interval value as the int64 the file holds: int32 days, then int32 milliseconds."""
    return int(np.array([days, ms], "<i4").view("<i8")[0])


@pytest.mark.parametrize("unit,name", [(0, "month_interval"), (1, "day_time_interval")])
def test_interval_columns_are_read_as_month_day_nano(tmp_path, device, monkeypatch, unit, name):
    # Before: UnsupportedTypeError "column 'iv' has type month_interval" (and earlier a bare KeyError: 21).
    path = tmp_path / "iv.arrow"
    if unit == 0:
        values = pa.array([1, None, -14, 2**31 - 1, 0], pa.int32())
        expected = [(1, 0, 0), None, (-14, 0, 0), (2**31 - 1, 0, 0), (0, 0, 0)]
    else:
        values = pa.array([_day_time(1, 0), None, _day_time(-3, 1500), _day_time(0, -(2**31)), 0], pa.int64())
        expected = [(0, 1, 0), None, (0, -3, 1_500_000_000), (0, 0, -(2**31) * 1_000_000), (0, 0, 0)]
    _interval_file(monkeypatch, path, unit, values)
    assert str(ipc.open_file(path).schema.field("iv").type) == name
    want = pa.array([None if e is None else pa.MonthDayNano(e) for e in expected], pa.month_day_nano_interval())
    for table in (pystrom.read_arrow(path, device=device), pystrom.scan_arrow(path, device=device).collect()):
        got = to_host(table)
        assert got.schema.field("iv").type == pa.month_day_nano_interval()
        assert got.column("iv").combine_chunks().equals(want)
    assert (
        to_host(pystrom.read_arrow(path, device=device).slice(1, 3))
        .column("iv")
        .combine_chunks()
        .equals(want.slice(1, 3))
    )
    with pytest.raises(pystrom.ExpressionError, match=f"column 'iv' has type {name}"):
        pystrom.scan_arrow(path, columns=["k"], where="iv = 1", device=device)
    got = to_host(pystrom.read_arrow(path, columns=["k"], device=device))
    assert got.column("k").to_pylist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_month_day_nano_interval_is_read(tmp_path, device):
    # Before: UnsupportedTypeError "column 'm' has type month_day_nano_interval".
    table = pa.table(
        {"m": pa.array([(1, 2, 3), None, (-4, 0, -(2**40))], pa.month_day_nano_interval()), "k": [1, 2, 3]}
    )
    path = tmp_path / "mdn.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    assert to_host(pystrom.read_arrow(path, device=device)).equals(table)


def test_legacy_stream_is_read(tmp_path, device):
    # Before: FileFormatError "not an Arrow IPC file or stream" although pyarrow reads it.
    table = pa.table(
        {"x": pa.array([1, None, 3] * 50), "s": pa.array(["a", None, "ccc"] * 50), "d": pa.array(["u", "v", "u"] * 50)}
    )
    table = table.set_column(2, "d", table.column("d").dictionary_encode())
    path = tmp_path / "legacy.arrows"
    with ipc.new_stream(path, table.schema, options=ipc.IpcWriteOptions(use_legacy_format=True)) as w:
        w.write_table(table, max_chunksize=40)
    assert path.read_bytes()[:4] != b"\xff\xff\xff\xff"
    want = ipc.open_stream(path).read_all()
    got = to_host(pystrom.read_arrow(path, device=device))
    assert got.column("x").equals(want.column("x"))
    assert got.column("s").equals(want.column("s"))
    assert got.column("d").to_pylist() == want.column("d").to_pylist()
    scanned = to_host(pystrom.scan_arrow(path, where="x > 1", device=device).collect())
    assert scanned.column("x").to_pylist() == [3] * 50


def test_garbage_that_is_no_legacy_stream_says_what_was_expected(tmp_path, device):
    path = tmp_path / "g.bin"
    path.write_bytes(struct.pack("<i", 2**30) + b"\0" * 100)
    with pytest.raises(pystrom.FileFormatError, match="legacy stream"):
        pystrom.read_arrow(path, device=device)


# -- finding 3: statistics another writer copied along -------------------------------------------------


def test_stale_footer_statistics_after_a_pyarrow_rewrite(tmp_path, device):
    # The reproducer. Before: 0 rows where the answer has 99.
    n = 100_000
    path, rewritten = tmp_path / "s.arrow", tmp_path / "s2.arrow"
    pystrom.write_arrow(pa.table({"x": np.arange(n, dtype=np.int64)}), path, batch_rows=10_000, footer_stats=True)
    ref = ipc.open_file(path).read_all()
    assert ref.schema.field("x").metadata[b"min_values"]  # read_all keeps the footer lists
    reordered = ref.take(pa.array(np.arange(n)[::-1].copy()))
    with ipc.new_file(rewritten, reordered.schema) as w:
        w.write_table(reordered, max_chunksize=10_000)
    got = to_host(pystrom.read_arrow(rewritten, where="x < 99", device=device))
    assert sorted(got.column("x").to_pylist()) == list(range(99))
    scan = pystrom.scan_arrow(rewritten, where="x < 99", device=device)
    assert scan.collect().num_rows == 99 and scan.stats.batches_skipped == 0
    # our own file keeps skipping, by its per-batch entries and by its fingerprinted footer lists
    scan = pystrom.scan_arrow(path, where="x < 99", device=device)
    assert scan.collect().num_rows == 99 and scan.stats.batches_skipped == 9
    with open_arrow_file(path) as f, open_arrow_file(rewritten) as g:
        assert f.footer_stats_trusted and not g.footer_stats_trusted


def test_copied_footer_metadata_and_fingerprint_do_not_help(tmp_path, device):
    """A writer that copies the footer's custom metadata too (pyarrow's new_file(metadata=)) still
    writes other record batch messages: the fingerprint no longer matches."""
    n = 20_000
    path, copy = tmp_path / "a.arrow", tmp_path / "b.arrow"
    pystrom.write_arrow(pa.table({"x": np.arange(n, dtype=np.int64)}), path, batch_rows=5_000, footer_stats=True)
    footer_meta = _footer_metadata(path)
    assert b"pystrom.footer_stats.v1" in footer_meta
    ref = ipc.open_file(path).read_all()
    reordered = ref.take(pa.array(np.arange(n)[::-1].copy()))
    with ipc.new_file(copy, reordered.schema, metadata=footer_meta) as w:
        w.write_table(reordered, max_chunksize=5_000)
    assert _footer_metadata(copy) == footer_meta
    with open_arrow_file(copy) as f:
        assert not f.footer_stats_trusted
    assert to_host(pystrom.read_arrow(copy, where="x < 10", device=device)).num_rows == 10


def _footer_metadata(path) -> dict:
    raw = path.read_bytes()
    length = struct.unpack("<i", raw[-10:-6])[0]
    return fmt.read_footer(raw[-10 - length : -10])[1]


def test_footer_lists_alone_skip_only_with_their_fingerprint(tmp_path, device):
    """Our writer's footer lists (per-batch keys left out) skip batches; the same lists in a file
    without the fingerprint, as older PG-Strom versions write them, are not used: read in full."""
    n = 40_000
    table = pa.table({"x": np.arange(n, dtype=np.int64)})
    ours, legacy = tmp_path / "ours.arrow", tmp_path / "pgstrom_old.arrow"
    write_ipc_file(ours, table.schema, table.to_batches(max_chunksize=10_000), stats=True, footer_stats=True)
    with open_arrow_file(ours) as f:
        assert f.footer_stats_trusted
    scan = pystrom.scan_arrow(ours, where="x >= 35000", device=device)
    assert scan.collect().num_rows == 5000 and scan.stats.batches_skipped == 3
    with ipc.new_file(legacy, ipc.open_file(ours).schema) as w:  # footer lists, no fingerprint
        w.write_table(table, max_chunksize=10_000)
    scan = pystrom.scan_arrow(legacy, where="x >= 35000", device=device)
    assert scan.collect().num_rows == 5000 and scan.stats.batches_skipped == 0


def test_per_batch_statistics_as_pg_strom_writes_them_still_skip(tmp_path, device):
    path = tmp_path / "pg.arrow"
    schema = pa.schema([("x", pa.int64())])
    with ipc.new_file(path, schema) as w:
        for i in range(3):
            lo = i * 10_000
            batch = pa.record_batch([pa.array(np.arange(lo, lo + 10_000, dtype=np.int64))], schema=schema)
            w.write_batch(batch, custom_metadata={"min_max_stats.x": f"{lo},{lo + 9_999}"})
    scan = pystrom.scan_arrow(path, where="x < 5", device=device)
    assert scan.collect().num_rows == 5 and scan.stats.batches_skipped == 2


@pytest.mark.parametrize("garbage", [b"", b"\x00" * 7, b"\xff" * 64])
def test_malformed_footer_bytes_never_crash_the_fingerprint_check(garbage):
    with pytest.raises(fmt.FooterError):
        fmt.read_footer(garbage)


def test_footer_reader_stays_inside_its_bytes():
    """Every prefix and every single-byte change of a real footer is read or refused, never past its end."""
    blocks = [fmt.Block(8, 128, 64), fmt.Block(200, 136, 8)]
    specs = [("x", pa.int64(), True, [])]
    footer = fmt.encode_footer(specs, [(b"k", b"v")], blocks, [(b"pystrom.footer_stats.v1", b"ab")])
    assert fmt.read_footer(footer) == (blocks, {b"pystrom.footer_stats.v1": b"ab"})
    for cut in range(len(footer)):
        try:
            fmt.read_footer(footer[:cut])
        except fmt.FooterError:
            pass
    rng = np.random.default_rng(0)
    for _ in range(2000):
        bad = bytearray(footer)
        bad[int(rng.integers(len(bad)))] = int(rng.integers(256))
        try:
            fmt.read_footer(bytes(bad))
        except fmt.FooterError:
            pass


@pytest.mark.parametrize("stream", [False, True])
def test_a_nested_field_name_that_is_not_utf8_is_a_corrupt_file(tmp_path, device, stream):
    """pyarrow decodes names lazily: a struct field's name inside a list that is not UTF-8 escaped a scan's
    type check as a bare UnicodeDecodeError (the fuzzing campaign of 2026-11-29, seed 9302 case 58367),
    while read_arrow reported it only through its catch-all. Both now refuse the file where its schema is
    parsed, as a FileFormatError naming it."""
    pairs = pa.array([[{"pqxyz": 1}], [{"pqxyz": 2}, {"pqxyz": 3}]], type=pa.list_(pa.struct([("pqxyz", pa.int64())])))
    path = tmp_path / ("bad.arrows" if stream else "bad.arrow")
    with (ipc.new_stream if stream else ipc.new_file)(path, pa.schema([("pairs", pairs.type)])) as w:
        w.write_table(pa.table({"pairs": pairs}))
    raw = path.read_bytes()
    assert raw.count(b"pqxyz") == (1 if stream else 2)  # the schema message, and the footer's copy
    path.write_bytes(raw.replace(b"pqxyz", b"\xf1qxyz"))  # a lead byte with no continuation
    for read in (
        lambda: pystrom.read_arrow(path, device=device),
        lambda: pystrom.scan_arrow(path, device=device).collect(),
        lambda: pystrom.scan_arrow(path, columns=["pairs"], device=device).collect(),
    ):
        with pytest.raises(pystrom.FileFormatError, match=r"bad\.arrows?.*not a readable.*UnicodeDecodeError"):
            read()
