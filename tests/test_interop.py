"""DLPack, __cuda_array_interface__, NumPy's protocol and the Arrow C (device) interfaces."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom import Table
from pystrom.interop import arrow_c
from pystrom.testing import assert_tables_equal

from conftest import needs_gpu
from datagen import TYPES, make_sliced


def _source(n=257):
    return pa.table({k: make_sliced(t, n, nulls=i % 2 == 1, seed=i) for i, (k, t) in enumerate(TYPES.items())})


_capsule_pointer = arrow_c.capsule_pointer


def _live_records() -> int:
    gc.collect()
    return len(arrow_c._live)


# -- CPU: pyarrow is a real consumer of our C structs ----------------------------------------------


def test_pyarrow_imports_the_c_array_and_device_array():
    source = _source()
    t = Table.from_arrow(source, device="cpu")
    before = _live_records()
    batch = pa.record_batch(t)
    assert_tables_equal(pa.Table.from_batches([batch]), source)
    batch2 = pa.RecordBatch._import_from_c_device_capsule(*t.__arrow_c_device_array__())
    assert_tables_equal(pa.Table.from_batches([batch2]), source)
    del batch, batch2
    assert _live_records() == before


def test_c_array_export_is_zero_copy_except_booleans():
    t = Table.from_arrow(_source(), device="cpu")
    batch = pa.record_batch(t)
    block = t._block
    for name in ["float64", "string", "decimal_38_10", "uuid"]:
        arr = batch.column(name)
        storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
        address = storage.buffers()[1].address
        assert block.ptr <= address < block.ptr + block.nbytes, name


def test_c_stream_export():
    source = _source()
    t = Table.from_arrow(source, device="cpu")
    reader = pa.RecordBatchReader.from_stream(t)
    assert_tables_equal(reader.read_all(), source)
    assert_tables_equal(pa.table(t), source)


def _drain_device_stream(capsule):
    stream = ctypes.cast(
        _capsule_pointer(capsule, b"arrow_device_array_stream"), ctypes.POINTER(arrow_c.ArrowDeviceArrayStream)
    ).contents
    schema_struct = arrow_c.ArrowSchema()
    assert stream.get_schema(ctypes.addressof(stream), ctypes.pointer(schema_struct)) == 0
    schema = pa.Schema._import_from_c(ctypes.addressof(schema_struct))
    arrays = []
    while True:
        out = arrow_c.ArrowDeviceArray()
        assert stream.get_next(ctypes.addressof(stream), ctypes.addressof(out)) == 0
        if not out.array.release:
            break
        arrays.append(out)
    return stream, schema, arrays


def test_device_stream_on_cpu():
    source = _source()
    t = Table.from_arrow(source, device="cpu")
    before = _live_records()
    capsule = t.__arrow_c_device_stream__()
    stream, schema, arrays = _drain_device_stream(capsule)
    assert schema.equals(source.schema) and len(arrays) == 1
    assert arrays[0].device_type == arrow_c.ARROW_DEVICE_CPU
    batch = pa.RecordBatch._import_from_c_device(ctypes.addressof(arrays[0]), schema)
    assert_tables_equal(pa.Table.from_batches([batch]), source)
    del batch, arrays, stream, capsule
    assert _live_records() == before


def test_unconsumed_capsules_release_everything():
    t = Table.from_arrow(_source(), device="cpu")
    before = _live_records()
    caps = [t.__arrow_c_array__(), t.__arrow_c_device_array__(), t.__arrow_c_stream__(), t.__arrow_c_device_stream__()]
    assert _live_records() > before
    del caps
    assert _live_records() == before
    assert not arrow_c._capsule_storage


def test_exported_array_outlives_the_table():
    source = _source()
    t = Table.from_arrow(source, device="cpu")
    capsules = t.__arrow_c_device_array__()
    t.close()
    del t
    gc.collect()
    batch = pa.RecordBatch._import_from_c_device_capsule(*capsules)
    assert_tables_equal(pa.Table.from_batches([batch]), source)


def test_sliced_and_selected_tables_export():
    source = _source(300)
    t = Table.from_arrow(source, device="cpu").select(["bool", "string", "int32", "uuid"]).slice(13, 200)
    batch = pa.record_batch(t)
    assert_tables_equal(
        pa.Table.from_batches([batch]), source.select(["bool", "string", "int32", "uuid"]).slice(13, 200)
    )


def test_unknown_capsule_keywords_are_refused():
    t = Table.from_arrays({"x": [1]}, device="cpu")
    with pytest.raises(NotImplementedError, match="bogus"):
        t.__arrow_c_device_array__(bogus=1)


def test_dlpack_and_numpy_protocols_on_cpu():
    t = Table.from_arrays({"x": np.arange(5.0), "n": pa.array([1.0, None, 3.0, 4.0, 5.0])}, device="cpu")
    x = np.from_dlpack(t.column("x"))
    assert x.ctypes.data == t["x"].ctypes.data
    assert t.column("x").__dlpack_device__() == (1, 0)
    assert np.asarray(t.column("x")).ctypes.data == t["x"].ctypes.data
    assert not hasattr(t.column("x"), "__cuda_array_interface__")
    with pytest.raises(pystrom.NullValuesError, match="'n' has 1 NULL"):
        np.from_dlpack(t.column("n"))
    with pytest.raises(pystrom.NullValuesError, match="'n'"):
        t["n"]
    assert t.column("n").values.shape == (5,)  # raw access stays possible


# -- GPU ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_cuda_array_interface_and_dlpack_are_zero_copy():
    import cupy

    t = Table.from_arrays({"x": np.arange(1000.0), "b": np.arange(1000) % 2 == 0}, device="cuda")
    col = t.column("x")
    cai = col.__cuda_array_interface__
    assert cai["data"][0] == int(t["x"].data.ptr) and cai["shape"] == (1000,) and cai["typestr"] == "<f8"
    assert int(cupy.asarray(col).data.ptr) == int(t["x"].data.ptr)
    assert int(cupy.from_dlpack(col).data.ptr) == int(t["x"].data.ptr)
    assert col.__dlpack_device__() == (2, 0)
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(col)
    torch = pytest.importorskip("torch")
    tensor = torch.from_dlpack(col)
    assert tensor.data_ptr() == int(t["x"].data.ptr) and tensor.device.type == "cuda"
    assert torch.from_dlpack(t.column("b")).dtype == torch.bool


@pytest.mark.gpu
@needs_gpu
def test_cuda_device_array_points_into_the_allocation():
    import cupy

    source = _source(301)
    t = Table.from_arrow(source, device="cuda")
    schema_capsule, array_capsule = t.__arrow_c_device_array__()
    device_array = ctypes.cast(
        _capsule_pointer(array_capsule, b"arrow_device_array"), ctypes.POINTER(arrow_c.ArrowDeviceArray)
    ).contents
    assert device_array.device_type == arrow_c.ARROW_DEVICE_CUDA and device_array.device_id == 0
    assert device_array.array.length == 301 and device_array.array.n_children == len(TYPES)
    block = t._block
    names = list(TYPES)
    for i in range(device_array.array.n_children):
        child = device_array.array.children[i].contents
        col = t.column(names[i])
        assert child.length == 301 and child.null_count == col.null_count
        values = child.buffers[1]
        if names[i] == "bool":  # packed copy on the device, readable as Arrow bits
            packed = cupy.ndarray(
                (38,), cupy.uint8, cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(values, 38, None), 0)
            ).get()
            bits = np.unpackbits(packed, bitorder="little")[:301].astype(bool)
            np.testing.assert_array_equal(bits, t["bool"].get() if not col.null_count else col.values.get())
        else:
            assert block.ptr <= values < block.ptr + block.nbytes, names[i]
    schema = pa.Schema._import_from_c_capsule(schema_capsule)
    assert schema.equals(source.schema)


@pytest.mark.gpu
@needs_gpu
def test_cuda_device_stream():
    t = Table.from_arrow(_source(), device="cuda")
    capsule = t.__arrow_c_device_stream__()
    stream, schema, arrays = _drain_device_stream(capsule)
    assert stream.device_type == arrow_c.ARROW_DEVICE_CUDA
    assert len(arrays) == 1 and arrays[0].device_type == arrow_c.ARROW_DEVICE_CUDA
    arrays[0].array.release(ctypes.pointer(arrays[0].array))
    assert not arrays[0].array.release


@pytest.mark.gpu
@needs_gpu
def test_gpu_table_refuses_host_capsules():
    t = Table.from_arrays({"x": [1.0]}, device="cuda")
    with pytest.raises(TypeError, match="to_arrow"):
        pa.table(t)


def test_nanoarrow_consumes_the_device_array(device):
    na = pytest.importorskip("nanoarrow")
    nd = pytest.importorskip("nanoarrow.device")
    source = _source()
    t = Table.from_arrow(source, device=device)
    exported = nd.c_device_array(t)
    assert exported.device_type_id == (arrow_c.ARROW_DEVICE_CPU if device == "cpu" else arrow_c.ARROW_DEVICE_CUDA)
    assert exported.device_id == (-1 if device == "cpu" else 0)
    array = exported.array
    assert array.length == source.num_rows and array.n_children == source.num_columns
    for i, col in enumerate(t.columns):
        child = array.child(i)
        assert child.length == len(col) and child.null_count == col.null_count and child.offset == col.offset
        if col.type != pa.bool_():  # booleans travel as a packed copy; everything else points into the table
            assert t._block.ptr <= child.buffers[1] < t._block.ptr + t._block.nbytes
    if device == "cpu":
        assert pa.table(na.Array(t)).equals(source)
