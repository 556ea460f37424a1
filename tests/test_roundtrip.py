"""pyarrow -> Table -> pyarrow is exact for every type, size, NULL pattern, slice and chunking, on every device."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pystrom import Table
from pystrom.testing import assert_tables_equal

from datagen import SIZES, TYPES, make_array, make_chunked, make_sliced

TYPE_IDS = list(TYPES)


@pytest.mark.parametrize("type_id", TYPE_IDS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("nulls", [False, True], ids=["dense", "nulls"])
@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
def test_round_trip(device, type_id, n, nulls, sliced):
    make = make_sliced if sliced else make_array
    arr = make(TYPES[type_id], n, nulls, seed=n)
    expected = pa.table({"before": pa.array(np.arange(n, dtype=np.int16)), "x": arr})
    table = Table.from_arrow(expected, device=device)
    assert table.num_rows == n
    assert table.column("x").null_count == arr.null_count
    assert_tables_equal(table, expected)
    assert table.to_arrow().schema == expected.schema


@pytest.mark.parametrize("type_id", TYPE_IDS)
def test_round_trip_chunked(device, type_id):
    chunked = make_chunked(TYPES[type_id], [5, 0, 13, 1, 64, 9], nulls=True)
    expected = pa.table({"x": chunked})
    table = Table.from_arrow(expected, device=device)
    assert_tables_equal(table, expected)
    assert table.column("x").null_count == chunked.null_count


@pytest.mark.parametrize("type_id", TYPE_IDS)
@pytest.mark.parametrize("start,length", [(0, 0), (3, 10), (8, 16), (13, 50), (1, 99)])
def test_slice_of_table_round_trips(device, type_id, start, length):
    arr = make_sliced(TYPES[type_id], 100, nulls=True, seed=start)
    source = pa.table({"x": arr})
    table = Table.from_arrow(source, device=device)
    view = table.slice(start, length)
    assert_tables_equal(view, source.slice(start, length))
    assert view.column("x").null_count == source.slice(start, length).column("x").null_count
    # a slice of a slice keeps composing offsets
    assert_tables_equal(view.slice(2, 5), source.slice(start, length).slice(2, 5))


def test_dictionary_columns_are_decoded(device):
    arr = pa.array(["a", "b", None, "a", "c"]).dictionary_encode()
    table = Table.from_arrow(pa.table({"d": arr}), device=device)
    assert table.schema.field("d").type == pa.string()
    assert table.to_arrow().column("d").to_pylist() == ["a", "b", None, "a", "c"]


@pytest.mark.parametrize(
    "source,target",
    [
        (pa.large_string(), pa.string()),
        (pa.large_binary(), pa.binary()),
        (pa.string_view(), pa.string()),
        (pa.binary_view(), pa.binary()),
    ],
)
def test_large_and_view_strings_are_narrowed(device, source, target):
    values = ["x", None, "yz", ""] if "string" in str(source) else [b"x", None, b"yz", b""]
    table = Table.from_arrow(pa.table({"s": pa.array(values, source)}), device=device)
    assert table.schema.field("s").type == target
    assert table.to_arrow().column("s").to_pylist() == values


def test_metadata_and_nullability_survive(device):
    schema = pa.schema(
        [pa.field("a", pa.int32(), nullable=False, metadata={b"unit": b"m"})], metadata={b"origin": b"test"}
    )
    source = pa.table({"a": pa.array([1, 2, 3], pa.int32())}, schema=schema)
    table = Table.from_arrow(source, device=device)
    assert table.schema.equals(schema, check_metadata=True)
    assert table.to_arrow().schema.equals(schema, check_metadata=True)


def test_all_types_in_one_table(device):
    source = pa.table({k: make_sliced(t, 1000, nulls=i % 2 == 0, seed=i) for i, (k, t) in enumerate(TYPES.items())})
    table = Table.from_arrow(source, device=device)
    assert_tables_equal(table, source)
    assert_tables_equal(table.select(["string", "bool"]), source.select(["string", "bool"]))


def test_record_batch_reader_and_pandas_inputs(device):
    import pandas as pd

    batch = pa.record_batch({"a": [1, 2, 3], "b": ["x", None, "z"]})
    reader = pa.RecordBatchReader.from_batches(batch.schema, [batch, batch])
    assert Table.from_arrow(reader, device=device).num_rows == 6
    assert Table.from_arrow(batch, device=device).to_arrow().equals(pa.Table.from_batches([batch]))
    assert Table.from_arrow([batch, batch], device=device).num_rows == 6
    frame = pd.DataFrame({"a": [1.0, 2.0], "b": ["u", "v"]})
    assert Table.from_arrow(frame, device=device).to_pandas().equals(frame)


# -- properties (hypothesis) ----------------------------------------------------------------------------

_type_ids = st.sampled_from(TYPE_IDS)


@st.composite
def arrow_tables(draw):
    ncols = draw(st.integers(1, 4))
    n = draw(st.integers(0, 70))
    columns = {}
    for i in range(ncols):
        type_id = draw(_type_ids)
        nulls = draw(st.booleans())
        seed = draw(st.integers(0, 2**16))
        if draw(st.booleans()):
            sizes = draw(st.lists(st.integers(0, 20), min_size=1, max_size=4))
            total = sum(sizes)
            sizes[-1] += n - total if n >= total else 0
            if sum(sizes) != n:
                sizes = [n]
            columns[f"c{i}_{type_id}"] = make_chunked(TYPES[type_id], sizes, nulls, seed)
        else:
            columns[f"c{i}_{type_id}"] = make_sliced(TYPES[type_id], n, nulls, seed, offset=draw(st.integers(0, 9)))
    return pa.table(columns)


@given(source=arrow_tables(), start=st.integers(0, 80), length=st.integers(0, 80))
def test_property_round_trip(source, start, length):
    from pystrom.testing import available_devices

    for dev in available_devices():
        table = Table.from_arrow(source, device=dev)
        assert_tables_equal(table, source)
        assert_tables_equal(table.slice(start, length), source.slice(start, length))
