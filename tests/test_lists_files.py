"""List and interval columns in Arrow files: read_arrow (direct path and host path) and write_arrow on
both backends, compared with pyarrow's reader and writer; hostile files (list offsets out of bounds or
decreasing, elements too short) refused with a FileFormatError naming the file, batch and column."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from test_lists import _sample, _table

import pystrom
from pystrom.testing import to_host


def _pyarrow_file(path, table: pa.Table, **options) -> None:
    with ipc.new_file(path, table.schema, options=ipc.IpcWriteOptions(**options)) as w:
        w.write_table(table, max_chunksize=5)


@pytest.mark.parametrize("rows", [0, 1, 4, 23])
def test_read_files_pyarrow_wrote(tmp_path, device, rows):
    arrow = _table(rows)
    path = tmp_path / "t.arrow"
    _pyarrow_file(path, arrow)
    got = to_host(pystrom.read_arrow(path, device=device))
    got.validate(full=True)
    assert got.equals(arrow.combine_chunks())
    assert to_host(pystrom.read_arrow(path, columns=["x", "l"], device=device)).equals(
        arrow.select(["x", "l"]).combine_chunks()
    )


def test_numeric_lists_take_the_direct_path(tmp_path, device, monkeypatch):
    from pystrom.io.arrow.read import direct

    arrow = _table(29).drop_columns(["b", "fb"])  # lists of booleans (bit-packed) go through the host
    path = tmp_path / "d.arrow"
    _pyarrow_file(path, arrow)
    real = direct.host_columns

    def no_host(file, batches, names):
        assert not names, f"{names} went through the host path"
        return real(file, batches, names)

    monkeypatch.setattr(direct, "host_columns", no_host)
    assert to_host(pystrom.read_arrow(path, device=device)).equals(arrow.combine_chunks())
    pieces = [to_host(t) for t in pystrom.scan_arrow(path, batch_rows=7, device=device)]
    assert pa.concat_tables(pieces).equals(arrow)
    assert to_host(pystrom.read_arrow(path, device=device, where="x > 6")).equals(arrow.slice(7).combine_chunks())


def test_many_batches_and_a_where(tmp_path, device):
    arrow = pa.concat_tables([_table(n) for n in (7, 0, 1, 30, 5)])
    path = tmp_path / "m.arrow"
    _pyarrow_file(path, arrow)
    got = pystrom.read_arrow(path, device=device, where="x >= 3")
    expected = arrow.filter(pa.compute.greater_equal(arrow["x"], 3)).combine_chunks()
    assert to_host(got).equals(expected)


def test_compressed_files_are_inflated_by_pystrom(tmp_path, device, recwarn):
    arrow = _table(40)
    path = tmp_path / "z.arrow"
    _pyarrow_file(path, arrow, compression="zstd")
    got = pystrom.read_arrow(path, device=device)
    assert not [w for w in recwarn if issubclass(w.category, pystrom.PerformanceWarning)]
    assert to_host(got).equals(arrow.combine_chunks())


@pytest.mark.parametrize("rows", [0, 1, 23])
def test_write_arrow_then_read_back_equals_pyarrow(tmp_path, device, rows):
    arrow = _table(rows)
    table = pystrom.Table.from_arrow(arrow, device=device)
    path = tmp_path / "w.arrow"
    pystrom.write_arrow(table, path, batch_rows=4)
    with ipc.open_file(path) as f:
        by_pyarrow = f.read_all()
        assert f.num_record_batches == -(-rows // 4)
    by_pyarrow.validate(full=True)
    assert by_pyarrow.equals(arrow)
    assert to_host(pystrom.read_arrow(path, device=device)).equals(arrow)


def test_write_sliced_pyarrow_input(tmp_path):
    arrow = pa.concat_tables([_table(9).slice(2, 5), _table(13).slice(1)])
    path = tmp_path / "s.arrow"
    pystrom.write_arrow(arrow, path, batch_rows=3)
    assert ipc.open_file(path).read_all().equals(arrow.combine_chunks())


def test_every_element_type_through_a_file(tmp_path, device):
    cols = {}
    for i, child in enumerate(
        [pa.bool_(), pa.int8(), pa.uint16(), pa.int32(), pa.uint64(), pa.float16(), pa.float64()]
    ):
        cols[f"f{i}"] = _sample(child, 3, 11)
        cols[f"l{i}"] = _sample(child, None, 11)
    arrow = pa.table(cols)
    path = tmp_path / "e.arrow"
    pystrom.write_arrow(pystrom.Table.from_arrow(arrow, device=device), path)
    assert ipc.open_file(path).read_all().equals(arrow)
    assert to_host(pystrom.read_arrow(path, device=device)).equals(arrow)


def test_embeddings_file_reads_as_a_matrix(tmp_path, device, xp):
    emb = np.random.default_rng(0).standard_normal((1000, 16)).astype(np.float32)
    arrow = pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 16)})
    path = tmp_path / "emb.arrow"
    pystrom.write_arrow(arrow, path, batch_rows=300)
    m = pystrom.read_arrow(path, device=device)["emb"]
    assert isinstance(m, xp.ndarray) and m.shape == (1000, 16)
    np.testing.assert_array_equal(m.get() if device != "cpu" else m, emb)


def test_lists_the_writer_refuses_are_named(tmp_path):
    bad = pa.list_(pa.map_(pa.string(), pa.int8()))
    arrow = pa.table({"ok": [1], "bad": pa.array([[[("a", 1)]]], bad)})
    with pytest.raises(
        pystrom.UnsupportedTypeError, match="column 'bad' of type list<item: map<string, int8>>, whose part map"
    ):
        pystrom.write_arrow(arrow, tmp_path / "b.arrow")


# -- hostile files ---------------------------------------------------------------------------------


def _patch_buffer(path, batch_index: int, column: str, which: int, child: bool, values: np.ndarray) -> None:
    """Overwrite the start of one buffer of a batch in ``path`` (found through pyarrow's zero-copy mapping)."""
    source = pa.memory_map(str(path), "r")
    base = source.read_buffer(source.size()).address
    arr = ipc.open_file(source).get_batch(batch_index).column(column)
    buf = (arr.values if child else arr).buffers()[which]
    offset = buf.address - base
    source.close()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(values.tobytes())


def _hostile(tmp_path, name: str) -> str:
    arrow = pa.table({"k": np.arange(12), "l": pa.array([[1, 2], [], [3, 4, 5], None] * 3, pa.list_(pa.int32()))})
    path = tmp_path / name
    pystrom.write_arrow(arrow, path, batch_rows=4)
    return path


@pytest.mark.parametrize(
    "offsets, why",
    [
        ([0, 2, 2, 50, 50], "out of bounds"),
        ([0, 3, 2, 5, 5], "decreasing"),
        ([-4, 2, 2, 5, 5], "negative"),
    ],
)
def test_hostile_list_offsets_are_refused_by_name(tmp_path, device, offsets, why):
    path = _hostile(tmp_path, f"{why}.arrow")
    _patch_buffer(path, 1, "l", 1, False, np.array(offsets, np.int32))
    with pytest.raises(pystrom.FileFormatError, match=r"record batch 1, column 'l'") as info:
        pystrom.read_arrow(path, device=device)
    assert str(path) in str(info.value)
    # the other column still reads
    assert to_host(pystrom.read_arrow(path, columns=["k"], device=device)).num_rows == 12


def test_elements_shorter_than_the_offsets_are_refused(tmp_path, device):
    path = _hostile(tmp_path, "short.arrow")
    # the last offset of batch 2 points past its 5 elements
    _patch_buffer(path, 2, "l", 1, False, np.array([0, 2, 2, 6, 6], np.int32))
    with pytest.raises(pystrom.FileFormatError, match=r"record batch 2, column 'l'"):
        pystrom.read_arrow(path, device=device)


def test_fixed_size_list_with_too_few_elements_is_refused(tmp_path, device):
    arrow = pa.table({"emb": pa.array([[1.0, 2.0]] * 8, pa.list_(pa.float32(), 2))})
    path = tmp_path / "fsl.arrow"
    pystrom.write_arrow(arrow, path)
    data = bytearray(path.read_bytes())
    # the elements' field node says 16: make it 10 (FieldNode structs are (length, null_count) int64 pairs)
    needle = np.array([16, 0], np.int64).tobytes()
    at = data.find(needle)
    assert at > 0
    data[at : at + 8] = np.array([10], np.int64).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(pystrom.FileFormatError, match=r"record batch 0, column 'emb'"):
        pystrom.read_arrow(path, device=device)
