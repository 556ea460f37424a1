"""Struct columns and lists of strings or structs (Layout.STRUCT, Layout.LIST_OF): held, sliced, gathered,
concatenated and exported the way pyarrow does the same to the same data (pyarrow is the reference).
"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import UnsupportedTypeError
from pystrom._types import Layout, column_type


def _sample() -> pa.Table:
    s = pa.array([{"a": 1, "b": "x"}, None, {"a": 3, "b": None}, {"a": None, "b": "yy"}, {"a": 5, "b": ""}])
    lst = pa.array([["a", "bb"], None, [], ["c", None, "dd"], ["é"]])
    nested = pa.array(
        [[{"p": 1.5, "q": [1, 2]}], [{"p": None, "q": None}], None, [], [{"p": 2.0, "q": []}, None]],
        pa.list_(pa.struct([("p", pa.float64()), ("q", pa.list_(pa.int64()))])),
    )
    rng = pa.array(
        [{"lower": 1, "upper": 5, "lower_inc": True, "upper_inc": False, "empty": False}, None] * 2
        + [{"lower": None, "upper": None, "lower_inc": False, "upper_inc": False, "empty": True}],
        pa.struct([("lower", pa.timestamp("us", "UTC")), ("upper", pa.timestamp("us", "UTC")),
                   ("lower_inc", pa.bool_()), ("upper_inc", pa.bool_()), ("empty", pa.bool_())]),
    )  # fmt: skip
    return pa.table({"s": s, "l": lst, "ll": nested, "r": rng, "i": pa.array([1, 2, 3, 4, 5], pa.int32())})


def test_column_types_of_structs_and_lists_of_strings():
    t = column_type(pa.struct([("a", pa.int32()), ("b", pa.utf8())]), "c")
    assert t.layout == Layout.STRUCT and [c.layout for c in t.children] == [Layout.FIXED, Layout.VARBINARY]
    assert t.child_names == ("a", "b")
    t = column_type(pa.list_(pa.utf8()), "c")
    assert t.layout == Layout.LIST_OF and t.children[0].layout == Layout.VARBINARY
    assert column_type(pa.list_(pa.int32()), "c").layout == Layout.LIST  # numbers keep their own layout
    with pytest.raises(UnsupportedTypeError, match="column 'c'.*map"):
        column_type(pa.struct([("m", pa.map_(pa.utf8(), pa.int32()))]), "c")
    with pytest.raises(UnsupportedTypeError, match="struct without fields"):
        column_type(pa.struct([]), "c")


def test_round_trip_slices_and_views(device):
    t = _sample()
    pt = pystrom.Table.from_arrow(t, device=device)
    assert pt.to_arrow().equals(t)
    for start, length in [(0, 5), (1, 3), (3, 2), (4, 1), (2, 0)]:
        assert pt.slice(start, length).to_arrow().equals(t.slice(start, length)), (start, length)
    if device == "cpu":
        assert pa.table(pt.slice(1, 3)).equals(t.slice(1, 3))  # the Arrow C interface, offset included
    else:  # the device interface: children are the base child columns, the parent's offset picks the rows
        _check_device_export(pt.slice(1, 3))
    s = pt.column("s")
    assert s.field("b").to_arrow().to_pylist() == ["x", "", None, "yy", ""]  # a NULL struct row's field: unspecified
    assert pt.slice(3).column("s").field("a").to_arrow().to_pylist() == [None, 5]
    assert pt.column("l").elements.to_arrow().to_pylist() == ["a", "bb", "c", None, "dd", "é"]
    assert pt.column("l").offsets.tolist() == [0, 2, 2, 2, 5, 6]
    with pytest.raises(UnsupportedTypeError, match="column 's'.*fields: \\['a', 'b'\\]"):
        _ = s.values
    with pytest.raises(UnsupportedTypeError, match="column 'l'.*column.elements"):
        _ = pt.column("l").values
    with pytest.raises(pystrom.ColumnNotFoundError, match="no field 'z'"):
        s.field("z")
    assert pt.nbytes > 0 and pt.slice(0, 0).nbytes < pt.nbytes


def _check_device_export(view) -> None:
    import ctypes

    from pystrom.interop import arrow_c

    schema_capsule, array_capsule = view.__arrow_c_device_array__()
    pointer = arrow_c.capsule_pointer(array_capsule, b"arrow_device_array")
    array = ctypes.cast(pointer, ctypes.POINTER(arrow_c.ArrowDeviceArray)).contents.array
    assert pa.Schema._import_from_c_capsule(schema_capsule).equals(view.schema)
    block = view._block
    struct = array.children[0].contents
    assert (struct.length, struct.offset, struct.n_children, struct.n_buffers) == (3, 1, 2, 1)
    assert struct.children[0].contents.length == 5 and struct.children[1].contents.n_buffers == 3
    strings = struct.children[1].contents
    assert all(block.ptr <= strings.buffers[i] < block.ptr + block.nbytes for i in (1, 2))
    listed = array.children[1].contents
    assert (listed.offset, listed.n_children) == (1, 1) and listed.children[0].contents.length == 6


def test_gather_filter_sort_and_concat(device):
    t = _sample()
    pt = pystrom.Table.from_arrow(t, device=device)
    mask = [True, False, True, True, False]
    assert pt.filter(np.array(mask)).to_arrow().equals(t.filter(pa.array(mask)))
    assert pt.slice(1, 4).sort_by([("i", "descending")]).to_arrow().equals(t.slice(1, 4).sort_by([("i", "descending")]))
    assert pt.drop_nulls().to_arrow().equals(t.drop_null())
    parts = [pt.slice(3), pt.filter(np.zeros(5, bool)), pt.slice(0, 3), pt.slice(1, 1)]
    expected = pa.concat_tables([t.slice(3), t.slice(0, 0), t.slice(0, 3), t.slice(1, 1)]).combine_chunks()
    assert pystrom.concat(parts).to_arrow().equals(expected)
    moved = pt.with_columns(s2=pt.column("s")).rename({"l": "L"}).select(["L", "s2", "i"])
    assert moved.to_arrow().column("s2").equals(t.column("s"))
    assert moved.column("L").to_arrow().equals(t.column("l").combine_chunks())


def test_chunked_input_and_normalised_children(device):
    d = pa.array(["a", "b", "a"]).dictionary_encode()
    s = pa.StructArray.from_arrays([d, pa.array(["x", None, "z"], pa.large_string())], names=["d", "ls"])
    u = pa.ExtensionArray.from_storage(pa.uuid(), pa.array([uuid.uuid4().bytes for _ in range(3)], pa.binary(16)))
    lu = pa.ListArray.from_arrays(pa.array([0, 2, 2, 3], pa.int32()), u)
    chunked = pa.chunked_array([s.slice(0, 1), s.slice(1, 0), s.slice(1)])
    t = pa.table({"s": chunked, "lu": pa.chunked_array([lu.slice(0, 2), lu.slice(2)])})
    pt = pystrom.Table.from_arrow(t, device=device)
    assert pt.schema.field("s").type == pa.struct([("d", pa.utf8()), ("ls", pa.utf8())])  # decoded, narrowed
    assert pt.to_arrow().column("s").to_pylist() == t.column("s").to_pylist()
    assert pt.to_arrow().column("lu").equals(t.column("lu"))


def test_what_does_not_apply_is_refused_naming_the_column(tmp_path):
    pt = pystrom.Table.from_arrow(_sample(), device="cpu")
    with pytest.raises(UnsupportedTypeError, match="column 's'.*2-D numeric array"):
        pt.to_array(["s"])
    with pytest.raises(UnsupportedTypeError, match="column 's'.*no order"):
        pt.sort("s")
    with pytest.raises(UnsupportedTypeError, match="column 'l'.*no order"):
        pt.unique("l")
    assert pt.fill_null(0).to_arrow().equals(pt.to_arrow())  # nothing to fill in a struct: left as is


def test_arrow_files_with_structs_and_lists_of_strings(tmp_path, device):
    t = _sample()
    t = t.append_column("m", pa.array([[[1, 2], [3, 4]], None, [[5, None], [7, 8]], [[0] * 2] * 2, [[9] * 2] * 2],
                                      pa.list_(pa.list_(pa.int16(), 2), 2)))  # fmt: skip
    path = tmp_path / "nested.arrow"
    with pa.ipc.new_file(path, t.schema) as w:
        w.write_table(t.slice(0, 2))
        w.write_table(t.slice(2))
    assert pystrom.read_arrow(path, device=device).to_arrow().equals(t)
    assert pystrom.read_arrow(path, device=device, columns=["l", "i"]).to_arrow().equals(t.select(["l", "i"]))
    # written by write_arrow (views, batches, every codec): pyarrow and read_arrow read them back
    pt = pystrom.Table.from_arrow(t, device=device)
    for compression in (None, "lz4", "zstd"):
        out = tmp_path / f"w_{compression}.arrow"
        pystrom.write_arrow(pt.slice(1), out, batch_rows=2, compression=compression)
        assert pa.ipc.open_file(out).read_all().equals(t.slice(1)), compression
        assert pystrom.read_arrow(out, device=device).to_arrow().equals(t.slice(1)), compression
    with pytest.raises(UnsupportedTypeError, match="column 'x'.*map"):
        maps = pa.array([{"m": [("k", 1)]}], pa.struct([("m", pa.map_(pa.utf8(), pa.int8()))]))
        pystrom.write_arrow(pa.table({"x": maps}), tmp_path / "map.arrow")


_strings = st.one_of(st.none(), st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=4))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.one_of(st.none(), st.fixed_dictionaries({"k": st.one_of(st.none(), st.integers(-5, 5)), "v": _strings})),
        max_size=12,
    ),
    cut=st.integers(0, 12),
    picks=st.lists(st.integers(0, 11), max_size=15),
)  # fmt: skip
def test_property_struct_of_list_of_strings_matches_pyarrow(rows, cut, picks):
    typ = pa.struct([("k", pa.int64()), ("v", pa.list_(pa.utf8()))])
    arr = pa.array(rows, typ)
    t = pa.table({"c": arr, "n": pa.array(range(len(rows)), pa.int64())})
    pt = pystrom.Table.from_arrow(t, device="cpu")
    assert pt.to_arrow().equals(t)
    cut = min(cut, len(rows))
    assert pt.slice(cut).to_arrow().equals(t.slice(cut))
    picks = [p for p in picks if p < len(rows) - cut]
    mask = np.zeros(len(rows) - cut, bool)
    mask[picks] = True
    assert pt.slice(cut).filter(mask).to_arrow().equals(t.slice(cut).filter(pa.array(mask)))
    both = pystrom.concat([pt.slice(cut), pt.slice(0, cut)])
    assert both.to_arrow().equals(pa.concat_tables([t.slice(cut), t.slice(0, cut)]).combine_chunks())


def test_nested_fixed_size_lists_are_one_block_of_values(device, tmp_path):
    typ = pa.list_(pa.list_(pa.int32(), 3), 2)
    t = pa.table({"m": pa.array([[[1, 2, 3], [4, 5, 6]], None, [[7, None, 9], [10, 11, 12]]], typ), "i": [1, 2, 3]})
    pt = pystrom.Table.from_arrow(t, device=device)
    assert pt.column("m").values.shape == (3, 2, 3) and pt.column("m").column_type.row_shape == (2, 3)
    assert pt.to_arrow().equals(t) and pt.slice(1).to_arrow().equals(t.slice(1))
    assert pystrom.concat([pt.slice(2), pt]).to_arrow().equals(pa.concat_tables([t.slice(2), t]).combine_chunks())
    assert pt.filter(np.array([True, False, True])).to_arrow().equals(t.filter(pa.array([True, False, True])))
    assert pt.to_array(["m"], dtype="float64", nulls="drop").shape == (1, 6)  # row 0: row 2 has a NULL value
    if device == "cpu":
        assert pa.table(pt.slice(1)).equals(t.slice(1))
        assert pystrom.ipc_import(pt.export()).to_arrow().equals(t)  # sizes as a flat fixed_size_list: shareable
    bad = pa.array([[[1, 2, 3], None]], typ)
    with pytest.raises(UnsupportedTypeError, match="column 'm': an inner list of a nested fixed_size_list is NULL"):
        pystrom.Table.from_arrow(pa.table({"m": bad}), device=device)


def test_shared_by_handle_with_every_child_buffer_checked(device):
    import copy
    import dataclasses

    from pystrom.ipc import handle as fmt

    t = _sample()
    pt = pystrom.Table.from_arrow(t, device=device)
    for view, expected in [(pt, t), (pt.slice(1, 3), t.slice(1, 3))]:
        got = pystrom.ipc_import(view.export())
        assert got.to_arrow().equals(expected)
        assert got.column("s").field("b").name == "s.b" and got.column("ll").elements.name == "ll.item"
    h = fmt.decode(pt.export())

    def forged(edit) -> bytes:
        cols = copy.deepcopy(h.layout.columns)
        edit(cols)
        layout = fmt.TableLayout(h.layout.nbytes, h.layout.num_rows, cols, h.layout.schema)
        return fmt.encode(dataclasses.replace(h, layout=layout))

    def drop_children(cols):
        del cols[0]["children"]

    def short_field(cols):
        cols[0]["children"][0]["length"] = 4

    def strings_over_ints(cols):  # the elements' string offsets now read the struct's int64 field
        cols[1]["children"][0]["values"] = [cols[0]["children"][0]["values"][0], 7 * 4]

    for edit, message in [
        (drop_children, "column 's': 2 child column record.*got 0"),
        (short_field, "column 's', field 'a'.*4 rows, but its struct has 5"),
        (strings_over_ints, "column 'l'.*elements"),
    ]:
        with pytest.raises(pystrom.InvalidHandleError, match=message):
            pystrom.ipc_import(forged(edit))


@pytest.mark.parametrize("typ", [pa.list_(pa.list_(pa.int32(), 0), 2), pa.list_(pa.list_(pa.int32(), 2), 0)], ids=str)
def test_nested_fixed_size_lists_with_a_dimension_of_zero(device, typ):
    """Found by the Arrow fuzzer (a mutated list size): the inner lists are counted from the shape, never by
    dividing by a dimension."""
    rows = [[[]] * 2, None, [[]] * 2] if typ.list_size == 2 else [[], None, []]
    t = pa.table({"g": pa.array(rows, typ)})
    pt = pystrom.Table.from_arrow(t, device=device)
    assert pt.column("g").values.shape == (3, *pt.column("g").column_type.row_shape)
    assert pt.to_arrow().equals(t) and pt.slice(1).to_arrow().equals(t.slice(1))
    assert pt.to_array(["g"], nulls="drop").shape == (2, 0) and pt.slice(0, 0).to_array(["g"]).shape == (0, 0)
    if device == "cpu":
        assert pa.table(pt.slice(1)).equals(t.slice(1))
