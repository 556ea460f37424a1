"""String columns are UTF-8, as the Arrow format requires: a file whose string column holds other bytes
is refused by read_arrow and scan_arrow with a FileFormatError naming the file, the column, the record
batch and the row (io/arrow/read/utf8.py), exactly where pyarrow's full validation refuses it: NULL rows'
bytes are not values, a binary column's bytes may be anything."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import _core

from outside_data import unpack_repro

_STRING = pa.string()


def _strings(values: list[bytes | None], kind: pa.DataType = _STRING) -> pa.Array:
    """A string (or binary) array holding these bytes as they are (pyarrow's builders would check them)."""
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum([0 if v is None else len(v) for v in values])
    valid = np.array([v is not None for v in values])
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    data = b"".join(v for v in values if v is not None)
    return pa.Array.from_buffers(kind, len(values), [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=int((~valid).sum()))  # fmt: skip


def _write(path, columns: dict[str, list], batch_rows: int, compression=None) -> None:
    n = len(next(iter(columns.values()))[0])
    arrays = {name: _strings(v, kind) if kind is not None else pa.array(v) for name, (v, kind) in columns.items()}
    table = pa.table(arrays)
    assert table.num_rows == n
    options = ipc.IpcWriteOptions(compression=compression)
    with ipc.new_file(str(path), table.schema, options=options) as w:
        w.write_table(table, max_chunksize=batch_rows)


def _values(n: int, bad_at: int | None, bad: bytes = b"\xc3\x28", nulls_at=()) -> list:
    out = [f"row {i} é€𝄞".encode() for i in range(n)]
    if bad_at is not None:
        out[bad_at] = b"ok" + bad
    for i in nulls_at:
        out[i] = None
    return out


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_a_row_that_is_not_utf8_is_refused_naming_file_column_batch_and_row(tmp_path, device, compression):
    path = tmp_path / "bad.arrow"
    _write(path, {"s": (_values(250, 173), pa.string()), "i": (list(range(250)), None)}, 100, compression)
    message = r"bad\.arrow'.*record batch 1, column 's': row 73 \(row 173 of the read\) is not valid UTF-8"
    with pytest.raises(pystrom.FileFormatError, match=message):
        pystrom.read_arrow(path, device=device)
    with pytest.raises(pystrom.FileFormatError, match=message):
        pystrom.scan_arrow(path, columns=["s"], where="i >= 0", device=device).collect()
    assert pystrom.read_arrow(path, columns=["i"], device=device).num_rows == 250  # not asked for: not read
    with pytest.raises(pa.ArrowInvalid):
        pa.ipc.open_file(str(path)).read_all().validate(full=True)


def test_the_outside_testers_file(tmp_path, device):
    path = unpack_repro(tmp_path)["strings-not-utf8.arrow"]
    with pytest.raises(pystrom.FileFormatError, match=r"record batch 4, column 's': row 611 \(row 16995 of the"):
        pystrom.read_arrow(path, device=device)
    assert pystrom.read_arrow(path, columns=["i64", "f64"], device=device).num_rows == 20_000


@pytest.mark.parametrize(
    "bad",
    [
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe0\x80\xaf",
        b"\xff",
        b"\x80",
        b"\xe2\x82",
        b"\xf0\x9f\x98",
    ],
)
def test_every_kind_of_fault(tmp_path, bad):
    path = tmp_path / "f.arrow"
    _write(path, {"s": (_values(40, 39, bad), pa.string())}, 40)
    with pytest.raises(pystrom.FileFormatError, match="row 39"):
        pystrom.read_arrow(path, device="cpu")


def test_a_character_cut_by_a_row_boundary_is_refused(tmp_path, device):
    euro = "€".encode()
    values = _values(30, None)
    values[10], values[11] = values[10] + euro[:1], euro[1:] + values[11]  # the bytes whole are valid
    path = tmp_path / "cut.arrow"
    _write(path, {"s": (values, pa.string())}, 30)
    with pytest.raises(pystrom.FileFormatError, match=r"row 10 \(row 10"):
        pystrom.read_arrow(path, device=device)


def test_null_rows_bytes_and_binary_columns_are_not_judged(tmp_path, device):
    """pyarrow's validation passes these; so does the read, and the rows are pyarrow's."""
    path = tmp_path / "ok.arrow"
    values = _values(120, 50, nulls_at=(50, 7))  # the bad bytes sit in a NULL row
    _write(path, {"s": (values, pa.string()), "b": (_values(120, 3), pa.binary())}, 32)
    expected = pa.ipc.open_file(str(path)).read_all()
    expected.validate(full=True)
    got = pystrom.read_arrow(path, device=device)
    host = got.to_arrow()
    assert host.column("s").to_pylist() == expected.column("s").to_pylist()
    assert host.column("b").to_pylist() == expected.column("b").to_pylist()


def test_every_valid_string_reads(tmp_path, device):
    chars = ["a", "é", "€", "𝄞", "\U0010ffff", "\ud7ff", "\ue000", "日本", "x" * 33]
    rng = np.random.default_rng(2)
    values = ["".join(rng.choice(chars, int(rng.integers(0, 6)))) for _ in range(3000)]
    path = tmp_path / "good.arrow"
    pystrom.write_arrow(pa.table({"s": values}), path, batch_rows=777)
    assert pystrom.read_arrow(path, device=device).to_arrow().column("s").to_pylist() == values


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=12)), min_size=1, max_size=40), st.integers(0, 3))
def test_the_core_check_refuses_what_pyarrow_refuses(values, lo):
    """The C++ check against pyarrow's full validation on arbitrary bytes, NULLs and a window of rows."""
    arr = _strings(values)
    lo = min(lo, len(values) - 1)
    part = arr.slice(lo)
    try:
        part.validate(full=True)
        refused = False
    except pa.ArrowInvalid:
        refused = True
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[: len(values) + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2].size else np.zeros(0, np.uint8)
    validity = None if arr.buffers()[0] is None else np.frombuffer(arr.buffers()[0], dtype=np.uint8)
    row = _core.utf8_first_bad_row(data, offsets[lo:], validity, lo)
    assert (row >= 0) == refused
    if refused:
        want = next(i for i in range(len(part)) if part[i].is_valid and not _decodes(part[i].as_buffer()))
        assert row == want


_PIECES = [b"a", b"\x00", b"\x7f", "é".encode(), "€".encode(), "𝄞".encode(), "\U0010ffff".encode(), b"\x80", b"\xbf",
           b"\xc0", b"\xc1", b"\xc2", b"\xdf", b"\xe0", b"\xe0\xa0", b"\xed", b"\xed\x9f", b"\xed\xa0", b"\xef",
           b"\xf0", b"\xf0\x90", b"\xf4", b"\xf4\x8f", b"\xf4\x90", b"\xf5", b"\xff", b"x" * 17]  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=60), st.integers(0, 31))
def test_the_vectorised_check_is_the_byte_by_byte_one(pieces, shift):
    """16 and 32 bytes at a time (SSSE3 and AVX2 lookups) against byte by byte and Python's decoder, at
    every position of a 16-byte block (``shift`` ASCII bytes first)."""
    data = b"q" * shift + b"".join(pieces)
    arr = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, np.uint8)
    want = _decodes(data)
    for level in range(_core.utf8_best_level() + 1):  # byte by byte, SSSE3, AVX2: those this CPU runs
        assert _core.utf8_valid(arr, level) == want, level


def _decodes(buf) -> bool:
    try:
        bytes(buf).decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_the_core_check_refuses_offsets_it_cannot_follow():
    data = np.frombuffer(b"abc", dtype=np.uint8)
    for offsets in ([0, 4], [-1, 2], [0, 2, 1]):
        with pytest.raises(IndexError):
            _core.utf8_first_bad_row(data, np.array(offsets, dtype=np.int32), None, 0)
    with pytest.raises(IndexError):
        _core.utf8_first_bad_row(data, np.array([0, 1, 2], dtype=np.int32), np.zeros(0, np.uint8), 0)
