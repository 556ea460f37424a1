"""Big-endian Arrow files (apache/arrow-testing's 1.0.0-bigendian integration files, tests/data/README.md)
read as pyarrow reads them and as their little-endian twins: pyarrow byte-swaps the bodies, pystrom
validates what it validates for a little-endian file (the structure, not value domains pyarrow's
reader leaves alone: a date64 that is not a whole day, a time of day past midnight, a decimal wider
than its precision). Types pystrom cannot hold are refused the same way in both byte orders."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import pystrom
from pystrom.io.arrow.read.host import value_blind

from outside_data import unpack_arrow_testing


@pytest.fixture(scope="module")
def integration(tmp_path_factory):
    return unpack_arrow_testing(tmp_path_factory.mktemp("arrow-testing"))


def _names(kind: str) -> list[str]:
    import tarfile

    from outside_data import DATA

    with tarfile.open(DATA / "arrow-testing" / "integration-1.0.0-endianness.tar.xz") as tar:
        return sorted(m.name.split("/")[1] for m in tar.getmembers() if m.name.startswith(kind + "/") and m.isfile())


BIG = _names("1.0.0-bigendian")


def _pystrom(path, device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pystrom.PerformanceWarning)  # big-endian bodies go through pyarrow
        try:
            return pystrom.read_arrow(str(path), device=device).to_arrow()
        except pystrom.Error as exc:
            return exc


def _pyarrow(path) -> pa.Table:
    with pa.memory_map(str(path)) as src:
        return (ipc.open_stream(src) if path.suffix == ".stream" else ipc.open_file(src)).read_all()


def _as_read(expected: pa.ChunkedArray, got_type: pa.DataType) -> pa.ChunkedArray | None:
    """pyarrow's column in the form pystrom holds it (dictionaries decoded, large strings narrowed); None
    where pyarrow's Python layer cannot hold the type (the pre-V5 interval types pystrom widens)."""
    if expected.type == got_type:
        return expected
    try:
        return expected.cast(got_type)
    except (pa.ArrowNotImplementedError, KeyError):
        pass
    try:  # dictionaries inside lists and structs (pyarrow casts none of them): decoded through Python values
        return pa.chunked_array([pa.array(expected.to_pylist(), type=got_type)])
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
        return None


def test_the_archive_holds_every_big_endian_file_and_its_twin(integration):
    assert len(BIG) == 44 and "generated_decimal.arrow_file" in BIG and "generated_datetime.stream" in BIG
    assert all((integration / "1.0.0-littleendian" / name).exists() for name in BIG)


@pytest.mark.parametrize("name", BIG)
def test_a_big_endian_file_reads_as_pyarrow_and_its_little_endian_twin(integration, name, device):
    big = integration / "1.0.0-bigendian" / name
    got, twin = _pystrom(big, device), _pystrom(integration / "1.0.0-littleendian" / name, device)
    if isinstance(got, Exception) or isinstance(twin, Exception):  # a type pystrom cannot hold: refused alike
        assert type(got) is type(twin) and isinstance(got, (pystrom.UnsupportedTypeError, pystrom.SchemaMismatchError))
        assert str(got).replace("bigendian", "") == str(twin).replace("littleendian", "")
        return
    assert got.equals(twin)
    expected = _pyarrow(big)
    assert got.column_names == expected.column_names and got.num_rows == expected.num_rows
    compared = 0
    for name_ in expected.column_names:
        want = _as_read(expected.column(name_), got.column(name_).type)
        if want is not None:
            assert got.column(name_).combine_chunks().equals(want.combine_chunks()), name_
            compared += 1
    assert compared or not expected.num_columns


@pytest.mark.parametrize("name", ["generated_datetime", "generated_decimal"])
def test_values_pyarrows_reader_accepts_are_read_not_refused(integration, name):
    """The regression: these two were refused for a date64 of 213620221665533 ms (not a whole day) and a
    decimal128(3, 2) holding 12810, values pyarrow's full validation judges and its reader does not."""
    for suffix in (".arrow_file", ".stream"):
        path = integration / "1.0.0-bigendian" / (name + suffix)
        with pytest.raises(pa.ArrowInvalid):
            _pyarrow(path).validate(full=True)
        got = _pystrom(path, "cpu")
        assert not isinstance(got, Exception), got
        assert got.equals(_pyarrow(path))


def test_value_blind_keeps_every_layout():
    t = pa.struct(
        [("d", pa.date64()), ("l", pa.list_(pa.decimal128(5, 2))), ("m", pa.map_(pa.string(), pa.time32("s")))]
    )
    assert value_blind(t) == pa.struct(
        [("d", pa.int64()), ("l", pa.list_(pa.binary(16))), ("m", pa.map_(pa.string(), pa.int32()))]
    )
    assert value_blind(pa.dictionary(pa.int8(), pa.time64("ns"))) == pa.dictionary(pa.int8(), pa.int64())
    assert value_blind(pa.string()) == pa.string() and value_blind(pa.timestamp("s")) == pa.timestamp("s")


def test_structural_faults_of_a_big_endian_file_are_still_refused(integration, tmp_path):
    """Only value domains are left alone: invalid UTF-8 in a big-endian string column is still refused."""
    src = integration / "1.0.0-bigendian" / "generated_primitive.arrow_file"
    data = bytearray(src.read_bytes())
    table = _pyarrow(src)
    strings = [c for c in table.column_names if pa.types.is_string(table.column(c).type)]
    assert strings
    # the first non-empty string's first byte, found in the file, made an invalid UTF-8 start byte
    col = table.column(strings[0])
    word = next(v.as_py() for v in col if v.is_valid and v.as_py())
    at = data.find(word.encode())
    assert at > 0
    data[at] = 0xFF
    bad = tmp_path / "bad.arrow_file"
    bad.write_bytes(bytes(data))
    with pytest.raises(pystrom.FileFormatError, match="bad.arrow_file"):
        _pystrom_strict(bad)


def _pystrom_strict(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pystrom.PerformanceWarning)
        return pystrom.read_arrow(str(path), device="cpu")
