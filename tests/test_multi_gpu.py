"""A table on the second GPU stays there, whichever GPU is current (runs where two GPUs are visible)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pystrom import Table
from pystrom.memory.backend import cuda_device_count
from pystrom.testing import assert_tables_equal

from datagen import TYPES, make_sliced

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_device_count() < 2, reason="needs two CUDA GPUs"),
]


@pytest.fixture
def source():
    return pa.table({k: make_sliced(t, 517, nulls=i % 2 == 0, seed=i) for i, (k, t) in enumerate(TYPES.items())})


def test_operations_on_the_second_gpu_while_the_first_is_current(source):
    import cupy

    mask = np.random.default_rng(1).random(517) < 0.5
    with cupy.cuda.Device(0):
        t = Table.from_arrow(source, device="cuda:1")
        assert t.device == "cuda:1" and t["float64"].device.id == 1
        assert_tables_equal(t, source)
        view = t.slice(3, 300)
        assert view.column("string").null_count == source.slice(3, 300).column("string").null_count
        assert_tables_equal(view.filter(mask[3:303]), source.slice(3, 300).filter(pa.array(mask[3:303])))
        assert_tables_equal(t.filter(cupy.asarray(mask)), source.filter(pa.array(mask)))  # mask on GPU 0
        arr = t.to_array(["int8", "int16"], dtype="float32", nulls="nan")
        assert arr.device.id == 1
        assert t.column("float32").is_valid().device.id == 1
        _, capsule = t.__arrow_c_device_array__()
        from pystrom.interop import arrow_c

        exported = arrow_c.ArrowDeviceArray.from_address(arrow_c.capsule_pointer(capsule, b"arrow_device_array"))
        assert exported.device_id == 1


def test_copies_between_gpus(source):
    import cupy

    t0 = Table.from_arrow(source, device="cuda:0")
    t1 = t0.to("cuda:1")
    assert t1.device == "cuda:1"
    assert_tables_equal(t1, source)
    assert_tables_equal(t1.slice(5, 100).to("cuda:0"), source.slice(5, 100))
    with cupy.cuda.Device(0):
        x = cupy.arange(10, dtype=cupy.float32)
    t = Table.from_arrays({"x": x}, device="cuda:1")
    assert t["x"].device.id == 1 and t.to_arrow().column("x").to_pylist() == list(range(10))
