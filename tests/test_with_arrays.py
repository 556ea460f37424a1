"""Table.with_columns with data: arrays of every library, Columns and scalars, beside expressions;
lengths checked; values on another device refused with the call that moves them. And
Table.from_arrays of a DataFrame."""

from __future__ import annotations

import datetime
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import pystrom
from pystrom import Table
from pystrom.errors import DeviceError, SchemaMismatchError, UnsupportedTypeError
from pystrom.testing import assert_tables_equal

from conftest import HAVE_GPU, needs_gpu

try:  # the reference of most tests here; the GPU machine has none, and the cross-device tests need none
    import polars as pl
except ImportError:
    pl = None
needs_polars = pytest.mark.skipif(pl is None, reason="polars is not installed (pip install polars)")


def _base(device: str) -> Table:
    return Table.from_arrays({"x": [1.0, 2.0, 3.0], "s": ["a", None, "c"]}, device=device)


class DLPackOnly:
    """A producer that offers nothing but DLPack (as torch and JAX CPU tensors do)."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class FakeDevice:
    """Claims device memory through one protocol; never read (the device check refuses it first)."""

    def __init__(self, protocol: str):
        if protocol == "cai":
            self.__cuda_array_interface__ = {"shape": (3,), "typestr": "<f8", "data": (0, False), "version": 3}
        else:
            self.__dlpack_device__ = lambda: (2, 0)
            self.__dlpack__ = lambda **kw: None


@needs_polars
def test_host_arrays_of_every_kind():
    t = Table.from_arrays({"x": [1.0, 2.0, 3.0]}, device="cpu")
    out = t.with_columns(
        np1=np.array([1, 2, 3], dtype=np.int16),
        masked=np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False]),
        matrix=np.arange(6, dtype=np.float32).reshape(3, 2),
        lst=["a", None, "c"],
        arr=pa.array([True, None, False]),
        chunked=pa.chunked_array([[1, 2], [3]], pa.int8()),
        series=pd.Series([0.5, None, 1.5]),
        polars=pl.Series([1, None, 3]),
        dlpack=DLPackOnly(np.array([7, 8, 9], dtype=np.uint32)),
    ).to_arrow()
    assert out.column_names[0] == "x" and out.num_columns == 10
    assert out.schema.field("np1").type == pa.int16() and out.column("np1").to_pylist() == [1, 2, 3]
    assert out.column("masked").to_pylist() == [1.0, None, 3.0]
    assert out.schema.field("matrix").type == pa.list_(pa.float32(), 2)
    assert out.column("lst").to_pylist() == ["a", None, "c"]
    assert out.column("arr").to_pylist() == [True, None, False]
    assert out.column("chunked").type == pa.int8()
    assert out.column("series").to_pylist() == [0.5, None, 1.5]
    assert out.column("polars").to_pylist() == [1, None, 3]
    assert out.schema.field("dlpack").type == pa.uint32() and out.column("dlpack").to_pylist() == [7, 8, 9]


def test_arrays_on_the_tables_device_and_expressions_in_call_order(device, xp):
    t = _base(device)
    p = xp.asarray([0.1, 0.2, 0.3])
    out = t.with_columns(a="x * 2", p=p, k=7, x=xp.asarray([9, 8, 7], dtype=xp.int32), c=t.column("s"), b="x > 1")
    assert out.column_names == ["x", "s", "a", "p", "k", "c", "b"]  # x replaced in place, new ones in call order
    assert out.device == t.device and out._block is not t._block
    got = out.to_arrow()
    assert got.column("x").type == pa.int32() and got.column("x").to_pylist() == [9, 8, 7]
    assert got.column("a").to_pylist() == [2.0, 4.0, 6.0]  # expressions see the table before the call
    assert got.column("p").to_pylist() == [0.1, 0.2, 0.3] and got.column("b").to_pylist() == [False, True, True]
    assert got.column("k").to_pylist() == [7, 7, 7] and got.column("c").to_pylist() == ["a", None, "c"]
    assert t.column_names == ["x", "s"]  # the input is unchanged
    # a name given as a mapping, arrays only, a column of another table of the same device
    other = Table.from_arrays({"z": ["p", "q", None]}, device=device)
    assert t.with_columns({"two words": p}, z=other.column("z")).column_names == ["x", "s", "two words", "z"]


def test_scalars_broadcast_with_their_arrow_type(device):
    t = _base(device)
    when = datetime.datetime(2024, 5, 6, 7, 8, 9)
    out = t.with_columns(
        i=3, f=2.5, b=True, txt=pa.scalar("hé"), by=b"\x00\x01", dt=when, d=datetime.date(2024, 1, 2),
        dec=Decimal("1.25"), n32=np.float32(0.5), zero_d=np.array(4, dtype=np.uint8),
        null=pa.scalar(None, pa.float64()), ts=pa.scalar(5, pa.timestamp("ms", tz="UTC")),
    ).to_arrow()  # fmt: skip
    types = {f.name: f.type for f in out.schema}
    assert types["i"] == pa.int64() and types["f"] == pa.float64() and types["b"] == pa.bool_()
    assert types["txt"] == pa.string() and types["by"] == pa.binary() and types["dt"] == pa.timestamp("us")
    assert types["d"] == pa.date32() and types["n32"] == pa.float32() and types["zero_d"] == pa.uint8()
    assert types["null"] == pa.float64() and types["ts"] == pa.timestamp("ms", tz="UTC")
    for name, value in [("i", 3), ("txt", "hé"), ("dt", when), ("dec", Decimal("1.25")), ("zero_d", 4), ("null", None)]:
        assert out.column(name).to_pylist() == [value] * 3, name
    assert out.column("null").null_count == 3
    empty = t.slice(3).with_columns(k=1)
    assert empty.num_rows == 0 and empty.column_names == ["x", "s", "k"]


def test_lengths_are_checked_naming_the_column_and_both_lengths(device, xp):
    t = _base(device)
    with pytest.raises(SchemaMismatchError, match=r"with_columns\(p=\.\.\.\): 2 values, but the table has 3 rows"):
        t.with_columns(p=xp.asarray([1.0, 2.0]))
    with pytest.raises(SchemaMismatchError, match=r"with_columns\(q=\.\.\.\): 4 values, but the table has 3 rows"):
        t.with_columns(q=xp.asarray([1, 2, 3, 4]))  # a list is host memory: a GPU table refuses it as such
    with pytest.raises(SchemaMismatchError, match=r"with_columns\(c=\.\.\.\): 2 values, but the table has 3 rows"):
        t.with_columns(c=t.slice(1).column("x"))
    with pytest.raises(UnsupportedTypeError, match=r"with_columns\(n=None\): a bare None has no type"):
        t.with_columns(n=None)
    with pytest.raises(UnsupportedTypeError, match=r"builtins.dict cannot become a column"):
        t.with_columns(n={"a": 1})


@pytest.mark.skipif(HAVE_GPU, reason="the stand-ins' device pointers are not real; the GPU test uses real ones")
def test_values_on_another_device_are_refused_with_the_way_to_move_them():
    cpu = _base("cpu")
    for protocol in ["cai", "dlpack"]:
        with pytest.raises(DeviceError, match=r"with_columns\(p=\.\.\.\).*are on cuda.*the table on cpu.*\.get\(\)"):
            cpu.with_columns(p=FakeDevice(protocol))


@pytest.mark.gpu
@needs_gpu
def test_gpu_values_and_host_values_cross_only_when_asked():
    import cupy

    gpu = _base("cuda")
    cpu = _base("cpu")
    host = np.array([1.0, 2.0, 3.0])
    with pytest.raises(DeviceError, match=r"numpy.ndarray\) are on cpu, the table on cuda:0.*cupy.asarray\(p\)"):
        gpu.with_columns(p=host)
    with pytest.raises(DeviceError, match=r"table on cuda:0.*Table.from_arrays"):
        gpu.with_columns(p=["a", "b", "c"])
    with pytest.raises(DeviceError, match=r"cupy.ndarray\) are on cuda:0, the table on cpu.*p.get\(\)"):
        cpu.with_columns(p=cupy.asarray(host))
    with pytest.raises(DeviceError, match=r"column 'x' is on cpu, the table on cuda:0"):
        gpu.with_columns(p=cpu.column("x"))
    # the explicit ways the messages name
    assert gpu.with_columns(p=cupy.asarray(host)).to_arrow().column("p").to_pylist() == [1.0, 2.0, 3.0]
    moved = Table.from_arrays({"p": ["a", "b", "c"]}, device="cuda:0").column("p")
    assert gpu.with_columns(p=moved).to_arrow().column("p").to_pylist() == ["a", "b", "c"]
    assert cpu.with_columns(p=cupy.asarray(host).get()).to_arrow().column("p").to_pylist() == [1.0, 2.0, 3.0]
    # scalars are no transfer of data: broadcast on the device
    assert gpu.with_columns(k=3, s2="x > 1").to_arrow().column("k").to_pylist() == [3, 3, 3]


@pytest.mark.gpu
@needs_gpu
def test_gpu_arrays_through_cuda_array_interface_and_dlpack():
    import cupy

    gpu = _base("cuda")
    values = cupy.asarray([4, 5, 6], dtype=cupy.int32)

    class CAIOnly:
        __cuda_array_interface__ = values.__cuda_array_interface__

    class DLPackCuda:
        def __dlpack__(self, **kwargs):
            return values.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return values.__dlpack_device__()

    out = gpu.with_columns(cai=CAIOnly(), dl=DLPackCuda()).to_arrow()
    assert out.column("cai").to_pylist() == [4, 5, 6] and out.column("dl").to_pylist() == [4, 5, 6]
    torch = pytest.importorskip("torch")
    on_gpu = torch.tensor([1.0, 2.0, 3.0], device="cuda")
    assert gpu.with_columns(t=on_gpu).to_arrow().column("t").to_pylist() == [1.0, 2.0, 3.0]
    with pytest.raises(DeviceError, match=r"torch.Tensor\) are on cuda:0, the table on cpu.*\.cpu\(\)"):
        _base("cpu").with_columns(t=on_gpu)


def test_with_columns_agrees_across_devices():
    def run(device):
        t = _base(device)
        return t.with_columns(k=1, e="x + 1", c=t.column("s"), f=pa.scalar(None, pa.string()))

    pystrom.testing.assert_same_on_all_devices(run)


@needs_polars
def test_from_arrays_takes_a_pandas_or_polars_data_frame(device):
    frame = pd.DataFrame({"a": [1.0, None, 3.0], "s": ["x", None, "z"]}, index=[10, 11, 12])
    t = Table.from_arrays(frame, device=device)
    assert t.column_names == ["a", "s"] and t.device == Table.from_arrow(frame, device=device).device
    assert_tables_equal(t, Table.from_arrow(frame, device=device))
    assert t.to_arrow().column("a").to_pylist() == [1.0, None, 3.0]
    polars_frame = pl.DataFrame({"a": [1, None], "b": ["p", "q"]})
    assert Table.from_arrays(polars_frame, device=device).to_arrow().to_pydict() == {"a": [1, None], "b": ["p", "q"]}
    with pytest.raises(UnsupportedTypeError, match="mapping of column names"):
        Table.from_arrays([1, 2, 3], device=device)
