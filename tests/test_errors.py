"""Bad input meets a clear error naming the bad thing, and a pystrom error class that is also the builtin."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom import Table


def test_error_hierarchy_and_pickling():
    assert issubclass(pystrom.ColumnNotFoundError, KeyError)
    assert issubclass(pystrom.UnsupportedTypeError, TypeError)
    assert issubclass(pystrom.DeviceError, ValueError)
    assert issubclass(pystrom.OutOfMemoryError, MemoryError)
    err = pickle.loads(pickle.dumps(pystrom.ColumnNotFoundError("no column named 'x'")))
    assert isinstance(err, pystrom.Error) and str(err) == "no column named 'x'"


def test_unknown_column(device):
    t = Table.from_arrays({"a": [1], "b": [2]}, device=device)
    with pytest.raises(pystrom.ColumnNotFoundError, match="no column named 'c'; the table has: 'a', 'b'"):
        t["c"]
    with pytest.raises(KeyError):
        t.column("c")
    with pytest.raises(pystrom.ColumnNotFoundError, match="'zz'"):
        t.select(["a", "zz"])
    with pytest.raises(pystrom.ColumnNotFoundError, match="out of range"):
        t.column(5)
    with pytest.raises(pystrom.ColumnNotFoundError, match="by column name"):
        t[0]
    with pytest.raises(pystrom.ColumnNotFoundError, match="'q'"):
        t.to_array(["a", "q"])


@pytest.mark.parametrize(
    "arrow_type,fragment",
    [
        (pa.list_(pa.map_(pa.string(), pa.int32())), "nested"),  # a list of a type not held
        (pa.struct([("a", pa.int32()), ("m", pa.map_(pa.string(), pa.int32()))]), "nested"),
        (pa.decimal256(50, 2), "decimal128"),
        (pa.null(), "only NULLs"),
        (pa.map_(pa.string(), pa.int32()), "nested"),
    ],
)
def test_unsupported_type_names_column_and_type(device, arrow_type, fragment):
    source = pa.table({"ok": pa.array([1, 2], pa.int8()), "bad": pa.array([None, None], arrow_type)})
    with pytest.raises(pystrom.UnsupportedTypeError, match=f"column 'bad' has type {str(arrow_type)[:8]}.*{fragment}"):
        Table.from_arrow(source, device=device)


def test_unsupported_type_inside_dictionary(device):
    values = pa.array([[("k", 1)], [("j", 2)]], pa.map_(pa.string(), pa.int32()))
    source = pa.table({"d": pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int8()), values)})
    with pytest.raises(pystrom.UnsupportedTypeError, match="column 'd'"):
        Table.from_arrow(source, device=device)
    held = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int8()), pa.array([["a"], ["b"]]))
    assert Table.from_arrow(pa.table({"d": held}), device=device).to_arrow().column("d").to_pylist() == [
        ["a"],
        ["b"],
        ["a"],
    ]  # a dictionary of list<string>: decoded


def test_mismatched_lengths(device):
    with pytest.raises(pystrom.SchemaMismatchError, match="different lengths \\(a: 3, b: 2\\)"):
        Table.from_arrays({"a": [1, 2, 3], "b": np.array([1.0, 2.0])}, device=device)


def test_bad_from_arrays_inputs(device):
    with pytest.raises(pystrom.SchemaMismatchError, match="'m' must be one-dimensional"):
        Table.from_arrays({"m": np.zeros((3, 2, 2))}, device=device)
    with pytest.raises(pystrom.SchemaMismatchError, match="'s' must be an array or a list"):
        Table.from_arrays({"s": 3.0}, device=device)
    with pytest.raises(pystrom.UnsupportedTypeError, match="'o'"):
        Table.from_arrays({"o": [1, "x", 2.0]}, device=device)
    with pytest.raises(pystrom.UnsupportedTypeError, match="'c'.*complex128"):
        Table.from_arrays({"c": np.array([1 + 2j])}, device=device)
    with pytest.raises(pystrom.SchemaMismatchError, match="must be strings"):
        Table.from_arrays({1: [1]}, device=device)
    with pytest.raises(pystrom.UnsupportedTypeError, match="mapping"):
        Table.from_arrays([[1, 2]], device=device)


def test_bad_from_arrow_inputs(device):
    with pytest.raises(pystrom.UnsupportedTypeError, match="got builtins.dict"):
        Table.from_arrow({"a": [1]}, device=device)
    dup = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    with pytest.raises(pystrom.SchemaMismatchError, match="'a' appears more than once"):
        Table.from_arrow(dup, device=device)


def test_hostile_string_offsets_are_refused(device):
    offsets = np.array([0, 5, 3, 6], dtype=np.int32)  # decreasing: pyarrow's cheap validation lets it pass
    bad = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(offsets), pa.py_buffer(b"abcdef")])
    with pytest.raises(pystrom.SchemaMismatchError, match="column 's': invalid string offsets"):
        Table.from_arrow(pa.table({"s": bad}), device=device)


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "cuda:-1", "cpu:3", "", "cuda:0:1", 1.5, True, ["cpu"]])
def test_device_strings_that_make_no_sense(bad):
    with pytest.raises(pystrom.DeviceError, match="device"):
        Table.from_arrays({"a": [1]}, device=bad)


def test_missing_gpu_is_explained():
    from pystrom.memory.backend import cuda_device_count

    if cuda_device_count() > 0:
        with pytest.raises(pystrom.DeviceError, match="does not exist: .* visible"):
            Table.from_arrays({"a": [1]}, device="cuda:64")
    else:
        with pytest.raises(pystrom.DeviceError, match="'cuda' .*device='cpu'"):
            Table.from_arrays({"a": [1]}, device="cuda")
    with pytest.raises(pystrom.DeviceError):
        Table.from_arrays({"a": [1]}, device=-1)


def test_to_array_errors(device):
    t = Table.from_arrays(
        {"x": [1.0, 2.0], "i": [1, 2], "s": ["a", "b"], "u": pa.array([b"0" * 16] * 2, pa.binary(16))}, device=device
    )
    assert t.to_array(["x", "i"]).dtype == "float64"  # mixed types promote as NumPy does (issue 17)
    with pytest.raises(pystrom.UnsupportedTypeError, match="column 's' has type string"):
        t.to_array(["x", "s"], dtype="float64")
    with pytest.raises(pystrom.UnsupportedTypeError, match="column 'u'"):
        t.to_array(["u"], dtype="float64")
    with pytest.raises(ValueError, match="nulls='zero'"):
        t.to_array(["x"], nulls="zero")
    with pytest.raises(ValueError, match="at least one column"):
        t.to_array([])


def test_string_column_has_no_values_array(device):
    t = Table.from_arrays({"s": ["a", "bc"], "x": [1, 2]}, device=device)
    with pytest.raises(pystrom.UnsupportedTypeError, match="'s' has type string.*offsets"):
        t["s"]
    with pytest.raises(pystrom.UnsupportedTypeError, match="'x' has type int64, which has no offsets"):
        t.column("x").offsets


def test_filter_errors(device):
    t = Table.from_arrays({"a": [1, 2, 3], "i": [1, 0, 1]}, device=device)
    with pytest.raises(pystrom.SchemaMismatchError, match="3 entries, the table 3 rows|2 entries, the table 3 rows"):
        t.filter(np.array([True, False]))
    with pytest.raises(pystrom.UnsupportedTypeError, match="1-D bool"):
        t.filter(np.array([1, 0, 1]))
    with pytest.raises(pystrom.UnsupportedTypeError, match="filter column 'i' has type int64"):
        t.filter("i")


def test_slice_and_select_errors(device):
    t = Table.from_arrays({"a": [1, 2, 3]}, device=device)
    with pytest.raises(ValueError, match="offset"):
        t.slice(-1)
    with pytest.raises(ValueError, match="length"):
        t.slice(0, -2)
    with pytest.raises(pystrom.SchemaMismatchError, match="more than once: 'a'"):
        t.select(["a", "a"])


def test_tables_are_not_built_directly():
    with pytest.raises(TypeError, match="from_arrow"):
        Table()
    with pytest.raises(TypeError, match="Table.column"):
        pystrom.Column()


def test_settings_validate():
    with pytest.raises(ValueError, match="no setting 'nope'"):
        pystrom.defaults.set(nope=1)
    with pytest.raises(ValueError, match="repr_rows"):
        pystrom.defaults.set(repr_rows=-1)
    with pytest.raises(AttributeError, match="no setting"):
        pystrom.defaults.nope
