"""List columns in a Table (fixed_size_list<T>[d], list<T>) and month_day_nano_interval, on both backends:
round trips through pyarrow compared with pyarrow's own arrays, the 2-D views, to_array, gathers, the
buffer builder (interop.lists.list_column) and its refusals."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pystrom
from pystrom.interop.build import build_table
from pystrom.interop.lists import list_column

from conftest import needs_gpu

CHILD_TYPES = [pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64()]
CHILD_TYPES += [pa.float16(), pa.float32(), pa.float64()]


def _value(child: pa.DataType, i: int):
    if pa.types.is_boolean(child):
        return i % 3 == 0
    if pa.types.is_floating(child):
        return np.float16(i / 4) if child == pa.float16() else i / 4 - 3
    return i % 100 if pa.types.is_unsigned_integer(child) else i % 100 - 50


def _sample(child: pa.DataType, d: int | None, rows: int) -> pa.Array:
    """Rows of NULL lists, lists with NULL elements, empty lists (list<T>) and plain ones."""
    out = []
    for r in range(rows):
        if r % 5 == 3:
            out.append(None)
            continue
        size = d if d is not None else r % 4
        out.append([None if (r + j) % 7 == 6 else _value(child, r * 10 + j) for j in range(size)])
    return pa.array(out, pa.list_(child, d) if d is not None else pa.list_(child))


def _table(rows: int) -> pa.Table:
    return pa.table(
        {
            "emb": _sample(pa.float32(), 3, rows),
            "l": _sample(pa.int64(), None, rows),
            "b": _sample(pa.bool_(), None, rows),
            "fb": _sample(pa.bool_(), 2, rows),
            "iv": pa.array(
                [None if r % 4 == 1 else pa.MonthDayNano([r - 2, -r, r * 10**9 + 7]) for r in range(rows)],
                pa.month_day_nano_interval(),
            ),
            "x": pa.array(np.arange(rows, dtype=np.float64)),
        }
    )


@pytest.mark.parametrize("child", CHILD_TYPES, ids=str)
@pytest.mark.parametrize("d", [None, 0, 1, 4])
def test_round_trip_every_child_type(device, child, d):
    for rows in (0, 1, 17):
        arrow = pa.table({"c": _sample(child, d, rows), "k": pa.array(range(rows), pa.int32())})
        table = pystrom.Table.from_arrow(arrow, device=device)
        back = table.to_arrow()
        back.validate(full=True)
        assert back.equals(arrow), (rows, back, arrow)
        assert table.schema == arrow.schema


def test_slices_and_views_round_trip(device):
    arrow = _table(23)
    table = pystrom.Table.from_arrow(arrow, device=device)
    for start in (0, 1, 5, 9, 22, 23):
        for length in (0, 1, 3, 14):
            view = table.slice(start, length).to_arrow()
            view.validate(full=True)
            assert view.equals(arrow.slice(start, length)), (start, length)


def test_many_chunks_and_sliced_chunks(device):
    parts = [_table(n) for n in (5, 0, 1, 9)]
    arrow = pa.concat_tables(parts + [_table(12).slice(3, 7)])
    table = pystrom.Table.from_arrow(arrow, device=device)
    assert table.to_arrow().equals(arrow.combine_chunks())


def test_filter_and_copy_gather_lists(device):
    arrow = _table(31)
    table = pystrom.Table.from_arrow(arrow, device=device)
    mask = np.array([i % 3 != 1 for i in range(31)])
    assert table.filter(mask).to_arrow().equals(arrow.filter(pa.array(mask)))
    assert table.filter("x > 4 and x < 20").to_arrow().equals(arrow.slice(5, 15))
    assert table.slice(4, 11).to("cpu").to_arrow().equals(arrow.slice(4, 11))


def test_fixed_size_list_is_a_zero_copy_2d_array(device, xp):
    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    arrow = pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 4), "x": np.arange(10.0)})
    table = pystrom.Table.from_arrow(arrow, device=device)
    a = table["emb"]
    assert isinstance(a, xp.ndarray) and a.shape == (10, 4) and a.dtype == np.float32
    assert a.flags.c_contiguous
    values = table.column("emb").values
    assert a.data.ptr == values.data.ptr if device != "cpu" else np.shares_memory(a, values)
    np.testing.assert_array_equal(_host(a), emb)
    sliced = table.slice(3, 4)["emb"]
    np.testing.assert_array_equal(_host(sliced), emb[3:7])
    m = table.to_array(["emb"])
    assert (m.data.ptr == a.data.ptr) if device != "cpu" else np.shares_memory(m, a)
    both = table.to_array(["x", "emb", "x"])
    expected = np.column_stack([np.arange(10.0), emb, np.arange(10.0)])
    np.testing.assert_array_equal(_host(both), expected)
    assert both.dtype == np.float64
    via_dlpack = xp.from_dlpack(table.column("emb"))
    np.testing.assert_array_equal(_host(via_dlpack), emb)
    if device != "cpu":
        cai = table.column("emb").__cuda_array_interface__
        assert cai["shape"] == (10, 4) and cai["typestr"] == "<f4"
    else:
        np.testing.assert_array_equal(np.asarray(table.column("emb")), emb)


def test_to_array_null_rules_with_lists(device):
    arrow = _table(12)
    table = pystrom.Table.from_arrow(arrow, device=device)
    with pytest.raises(pystrom.NullValuesError, match="'emb'"):
        table.to_array(["emb", "x"])
    with pytest.raises(pystrom.NullValuesError, match="'emb'"):
        table["emb"]
    nan = _host(table.to_array(["emb", "x"], nulls="nan"))
    expected = np.array(
        [[np.nan] * 3 if v is None else [np.nan if e is None else e for e in v] for v in arrow["emb"].to_pylist()]
    )
    np.testing.assert_array_equal(nan[:, :3], expected)
    dropped = _host(table.to_array(["x", "emb"], nulls="drop"))
    keep = ~np.isnan(expected).any(axis=1)
    np.testing.assert_array_equal(dropped, np.column_stack([np.arange(12.0), expected])[keep])
    with pytest.raises(pystrom.UnsupportedTypeError, match="'l' has type list<item: int64>"):
        table.to_array(["l"])


def test_element_nulls_alone_refuse_the_2d_view(device):
    arrow = pa.table({"emb": pa.array([[1.0, None], [3.0, 4.0]], pa.list_(pa.float64(), 2))})
    table = pystrom.Table.from_arrow(arrow, device=device)
    with pytest.raises(pystrom.NullValuesError, match="1 NULL element"):
        table["emb"]
    # the NULL element is outside these rows
    np.testing.assert_array_equal(_host(table.slice(1)["emb"]), [[3.0, 4.0]])


def test_list_buffers(device):
    arrow = pa.table({"l": pa.array([[1, 2], [], None, [3, None, 4]], pa.list_(pa.int16()))})
    col = pystrom.Table.from_arrow(arrow, device=device).column("l")
    np.testing.assert_array_equal(_host(col.offsets), [0, 2, 2, 2, 5])
    values = _host(col.child_values)
    np.testing.assert_array_equal(values[[0, 1, 2, 4]], [1, 2, 3, 4])
    bits = np.unpackbits(_host(col.child_validity), bitorder="little")[:5]
    np.testing.assert_array_equal(bits, [1, 1, 1, 0, 1])
    with pytest.raises(pystrom.UnsupportedTypeError, match="offsets and column.child_values"):
        col.values
    with pytest.raises(pystrom.UnsupportedTypeError, match="no child values"):
        pystrom.Table.from_arrays({"x": [1]}, device=device).column("x").child_values


def test_interval_values_view(device):
    arrow = pa.table({"iv": pa.array([pa.MonthDayNano([1, -2, 3]), pa.MonthDayNano([-4, 5, -(2**40)])])})
    table = pystrom.Table.from_arrow(arrow, device=device)
    raw = _host(table["iv"])
    assert raw.shape == (2, 16) and raw.dtype == np.uint8
    np.testing.assert_array_equal(raw.view("<i4")[:, :2], [[1, -2], [-4, 5]])
    np.testing.assert_array_equal(raw.view("<i8")[:, 1], [3, -(2**40)])
    assert table.to_arrow().equals(arrow)


def test_repr_names_list_types(device):
    text = repr(pystrom.Table.from_arrow(_table(3), device=device))
    assert "fixed_size_list<item: float>[3]" in text and "list<item: int64>" in text
    assert "month_day_nano_interval" in text


@pytest.mark.parametrize(
    "arrow_type, fragment",
    [
        (pa.list_(pa.map_(pa.string(), pa.int32())), "nested"),  # list<string> and list<list<T>> are held
        (pa.list_(pa.timestamp("us"), 2), "elements pystrom cannot hold"),
        (pa.large_list(pa.int32()), "nested"),
    ],
    ids=str,
)
def test_unsupported_lists_are_refused_by_name(arrow_type, fragment):
    arrow = pa.table({"bad": pa.array([None], arrow_type)})
    with pytest.raises(pystrom.UnsupportedTypeError, match=f"column 'bad'.*{fragment}"):
        pystrom.Table.from_arrow(arrow, device="cpu")


def test_hostile_list_offsets_from_a_foreign_producer():
    child = pa.array(np.arange(4, dtype=np.int32))
    for offsets in ([0, 3, 2], [1, 4, 3]):  # decreasing: pyarrow's cheap validation lets them pass
        bad = pa.Array.from_buffers(
            pa.list_(pa.int32()), 2, [None, pa.py_buffer(np.array(offsets, np.int32))], children=[child]
        )
        with pytest.raises(pystrom.SchemaMismatchError, match="column 'l': invalid list offsets"):
            pystrom.Table.from_arrow(pa.table({"l": bad}), device="cpu")


# -- the buffer builder (what decoders use) ------------------------------------------------------


def test_list_column_builds_what_pyarrow_builds(device, xp):
    values = xp.asarray(np.arange(10, dtype=np.float32))
    fixed = list_column(
        "emb", values, list_size=2, validity=xp.asarray([True, False, True, True, True]),
        child_validity=xp.asarray(np.arange(10) != 3),
    )  # fmt: skip
    offsets = xp.asarray(np.array([0, 3, 3, 4, 4, 10], np.int32))
    varying = list_column("l", values, offsets=offsets, validity=xp.asarray(np.array([0b10101], np.uint8)))
    backend = pystrom.memory.backend.resolve_device(device)
    table = build_table(backend, [fixed, varying])
    expected_fixed = [[0.0, 1.0], None, [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]
    got = table.to_arrow()
    got.validate(full=True)
    assert got["emb"].to_pylist() == expected_fixed
    assert got["l"].to_pylist() == [[0.0, 1.0, 2.0], None, [3.0], None, [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]]
    assert table.column("emb").null_count == 1 and table.column("l").null_count == 2
    two_d = list_column("m", xp.asarray(np.ones((3, 4), np.int8)), list_size=4)
    assert build_table(backend, [two_d])["m"].shape == (3, 4)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"list_size": 3}, "do not form rows of 3"),
        ({"offsets": np.array([1, 4, 10], np.int32)}, "start at 0"),
        ({"offsets": np.array([0, 6, 4, 10], np.int32)}, "decrease"),
        ({"offsets": np.array([0, 4, 11], np.int32)}, "end at 10"),
        ({"offsets": np.array([0, 4, 10], np.int64)}, "int32"),
        ({"list_size": 2, "offsets": np.array([0, 10], np.int32)}, "exactly one"),
        ({"list_size": 2, "validity": np.ones(4, bool)}, "4 flags for 5 slots"),
        ({"list_size": 2, "child_validity": np.ones(1, np.uint8)}, "need 2"),
        ({"list_size": 2, "validity": np.ones(5, np.int32)}, "bool flags or a uint8 bitmap"),
        ({"list_size": 2, "arrow_type": pa.list_(pa.int64(), 2)}, "does not hold float32"),
    ],
)
def test_list_column_refuses_bad_buffers(kwargs, fragment):
    with pytest.raises(pystrom.InvalidArgumentError, match=f"column 'c'.*{fragment}"):
        list_column("c", np.arange(10, dtype=np.float32), **kwargs)


def test_list_column_refuses_non_numeric_values():
    with pytest.raises(pystrom.InvalidArgumentError, match="complex64"):
        list_column("c", np.zeros(4, np.complex64), list_size=2)


@st.composite
def _lists(draw):
    child = draw(st.sampled_from([pa.int32(), pa.float64(), pa.bool_(), pa.uint8()]))
    d = draw(st.one_of(st.none(), st.integers(0, 4)))
    rows = draw(st.integers(0, 12))
    elem = st.booleans() if child == pa.bool_() else st.integers(0, 200)
    item = st.one_of(st.none(), elem)
    row = st.lists(item, min_size=d, max_size=d) if d is not None else st.lists(item, max_size=5)
    data = draw(st.lists(st.one_of(st.none(), row), min_size=rows, max_size=rows))
    cuts = draw(st.lists(st.integers(0, rows), max_size=3))
    return pa.array(data, pa.list_(child, d) if d is not None else pa.list_(child)), sorted(cuts)


@given(_lists())
def test_property_round_trip_and_slices_equal_pyarrow(case):
    array, cuts = case
    bounds = [0, *cuts, len(array)]
    chunked = pa.chunked_array([array.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], array.type)
    arrow = pa.table({"c": chunked})
    table = pystrom.Table.from_arrow(arrow, device="cpu")
    assert table.to_arrow().equals(pa.table({"c": array}))
    if len(array) > 1:
        assert table.slice(1).to_arrow()["c"].equals(pa.chunked_array([array.slice(1)]))
        rows = np.arange(len(array)) % 2 == 0
        assert table.filter(rows).to_arrow()["c"].equals(pa.chunked_array([array.filter(pa.array(rows))]))


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


# -- Arrow C (device) interface ---------------------------------------------------------------------


def test_arrow_c_exports_of_lists_equal_pyarrow():
    arrow = _table(23)
    table = pystrom.Table.from_arrow(arrow, device="cpu")
    for view, expected in (
        (table, arrow),
        (table.slice(3, 11), arrow.slice(3, 11)),
        (table.slice(23), arrow.slice(23)),
    ):
        via_stream = pa.table(view)
        via_stream.validate(full=True)
        assert via_stream.equals(expected)
        batch = pa.RecordBatch._import_from_c_device_capsule(*view.__arrow_c_device_array__())
        batch.validate(full=True)
        assert pa.Table.from_batches([batch]).equals(expected)
        block = table._block
        emb = batch.column("emb").values.buffers()[1].address
        assert block.ptr <= emb < block.ptr + block.nbytes  # the elements are not copied


def _device_bytes(address: int, size: int) -> bytes:
    import cupy

    mem = cupy.cuda.UnownedMemory(address, size, None)
    return cupy.ndarray((size,), cupy.uint8, cupy.cuda.MemoryPointer(mem, 0)).get().tobytes()


@pytest.mark.gpu
@needs_gpu
def test_cuda_device_export_of_lists_matches_the_cpu_export():
    """Every buffer the GPU export points to holds the bytes the CPU export's (read by pyarrow above) does."""
    import ctypes

    from pystrom.interop import arrow_c

    arrow = _table(45)
    exports = []
    for device in ("cpu", "cuda"):
        t = pystrom.Table.from_arrow(arrow, device=device).slice(5, 33)
        _schema, capsule = t.__arrow_c_device_array__()
        address = arrow_c.capsule_pointer(capsule, b"arrow_device_array")
        exports.append((t, capsule, ctypes.cast(address, ctypes.POINTER(arrow_c.ArrowDeviceArray)).contents))
    (cpu_t, _c1, cpu), (gpu_t, _c2, gpu) = exports
    assert gpu.device_type == arrow_c.ARROW_DEVICE_CUDA
    for i, name in enumerate(arrow.column_names):
        c, g = cpu.array.children[i].contents, gpu.array.children[i].contents
        plan = cpu_t.column(name)._plan
        assert (c.length, c.offset, c.null_count, c.n_children) == (g.length, g.offset, g.null_count, g.n_children)
        sizes = [(plan.length + 7) // 8, plan.values.size]
        pairs = [(c, g, sizes)]
        if c.n_children:
            cc, gc = c.children[0].contents, g.children[0].contents
            count = cc.length
            width = 0 if plan.type.storage == np.bool_ else plan.type.storage.itemsize
            pairs.append((cc, gc, [(count + 7) // 8, (count + 7) // 8 if width == 0 else count * width]))
            assert cc.length == gc.length
        for cs, gs, byte_sizes in pairs:
            for k in range(cs.n_buffers):
                if not cs.buffers[k]:
                    assert not gs.buffers[k], (name, k)
                    continue
                size = byte_sizes[min(k, len(byte_sizes) - 1)]
                assert ctypes.string_at(cs.buffers[k], size) == _device_bytes(gs.buffers[k], size), (name, k)


def test_concat_of_list_tables(device):
    parts = [_table(n) for n in (9, 0, 1, 14)]
    tables = [pystrom.Table.from_arrow(p, device=device) for p in parts]
    tables[3] = tables[3].slice(3, 9)
    expected = pa.concat_tables(parts[:3] + [parts[3].slice(3, 9)]).combine_chunks()
    got = pystrom.concat(tables)
    got_arrow = got.to_arrow()
    got_arrow.validate(full=True)
    assert got_arrow.equals(expected)
    # without any NULL element the concatenation has no element bitmap
    dense = [pystrom.Table.from_arrow(pa.table({"e": pa.array([[1, 2]] * n, pa.list_(pa.int8(), 2))}), device=device)
             for n in (3, 5)]  # fmt: skip
    assert pystrom.concat(dense).column("e").child_validity is None


def test_from_arrays_takes_2d_arrays_as_fixed_size_lists(device, xp):
    emb = np.arange(24, dtype=np.float32).reshape(6, 4)
    table = pystrom.Table.from_arrays({"emb": xp.asarray(emb), "x": np.arange(6)}, device=device)
    assert table.schema.field("emb").type == pa.list_(pa.float32(), 4)
    np.testing.assert_array_equal(_host(table["emb"]), emb)
    np.testing.assert_array_equal(_host(table.to_array(["emb", "x"])), np.column_stack([emb, np.arange(6)]))
    f_order = np.asfortranarray(emb.astype(np.int16))
    assert pystrom.Table.from_arrays({"m": f_order}, device=device).to_arrow()["m"].to_pylist() == emb.tolist()
    with pytest.raises(pystrom.SchemaMismatchError, match="different lengths"):
        pystrom.Table.from_arrays({"emb": emb, "x": [1]}, device=device)
    with pytest.raises(pystrom.SchemaMismatchError, match="shape"):
        pystrom.Table.from_arrays({"emb": np.zeros((2, 2, 2))}, device=device)
    with pytest.raises(pystrom.UnsupportedTypeError, match="'c'.*complex"):
        pystrom.Table.from_arrays({"c": np.zeros((2, 2), np.complex64)}, device=device)
