"""Handles between real processes: export in one, import in another (fresh interpreters, never fork)."""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pyarrow as pa
import pytest

import pystrom
import pystrom.testing
from pystrom.errors import ExporterGoneError, InvalidHandleError, IPCError
from pystrom.ipc import handle as fmt
from pystrom.ipc.export import cuda_ordinal_for_uuid, mapping_count

from conftest import needs_gpu
from datagen import TYPES, make_array

PRELUDE = "import os, sys, gc, numpy as np, pyarrow as pa, pystrom\n"


def child(code: str, *, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a new Python interpreter (spawned, never forked)."""
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"child failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def all_types_table(n: int = 1000) -> pa.Table:
    cols = {name: make_array(t, n, nulls=i % 2 == 0, seed=i) for i, (name, t) in enumerate(TYPES.items())}
    return pa.table(cols)


def test_export_import_in_another_process(device, tmp_path):
    source = all_types_table()
    t = pystrom.Table.from_arrow(source, device=device)
    h = t.export()
    out = tmp_path / "imported.arrow"
    ok(
        child(
            f"""
            v = pystrom.ipc_import(bytes.fromhex({h.hex()!r}))
            assert v.device.startswith({device!r}), v.device
            with pa.OSFile({str(out)!r}, "wb") as f, pa.ipc.new_file(f, v.schema) as w:
                w.write_table(v.to_arrow())
            """
        )
    )
    back = pa.ipc.open_file(str(out)).read_all()
    assert back.equals(source)


def test_views_export_their_rows_and_columns(device, tmp_path):
    source = all_types_table(300)
    view = pystrom.Table.from_arrow(source, device=device).slice(13, 200).select(["string", "int64", "bool"])
    out = tmp_path / "view.arrow"
    ok(
        child(
            f"""
            v = pystrom.ipc_import(bytes.fromhex({view.export().hex()!r}))
            with pa.OSFile({str(out)!r}, "wb") as f, pa.ipc.new_file(f, v.schema) as w:
                w.write_table(v.to_arrow())
            """
        )
    )
    assert pa.ipc.open_file(str(out)).read_all().equals(source.slice(13, 200).select(["string", "int64", "bool"]))


def test_exporter_writes_are_visible_to_the_importer(device):
    """Same memory, not a copy: the importer sees what the exporter writes after the export."""
    t = pystrom.Table.from_arrays({"x": np.zeros(1000, dtype=np.int64)}, device=device)
    code = f"""
        v = pystrom.ipc_import(bytes.fromhex({t.export().hex()!r}))
        x = v["x"]
        print("before", int(x.sum()), flush=True)
        sys.stdin.readline()  # the exporter writes now
        print("after", int(x.sum()), flush=True)
        if v.device == "cpu":  # read-only on the CPU, enforced by the mapping
            try:
                x[0] = 5
            except ValueError:
                print("read-only", flush=True)
        """
    proc = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().split() == ["before", "0"]
        t["x"][:] = 7
        pystrom.memory.backend.resolve_device(device).synchronize()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    lines = out.split("\n")
    assert lines[0].split() == ["after", str(7 * 1000)]
    if device == "cpu":
        assert lines[1] == "read-only"


def test_import_columns_as_2d_array(device):
    t = pystrom.Table.from_arrays({"a": np.arange(64.0), "b": np.arange(64.0) * 2, "c": np.arange(64.0) * 3}, device)
    out = ok(
        child(
            f"""
            h = bytes.fromhex({t.export().hex()!r})
            X = pystrom.ipc_import(h, ["a", "b", "c"])
            v = pystrom.ipc_import(h)
            host = X.get() if hasattr(X, "get") else X
            ptr = X.data.ptr if hasattr(X.data, "ptr") else X.ctypes.data
            vptr = v["a"].data.ptr if hasattr(v["a"].data, "ptr") else v["a"].ctypes.data
            print(X.shape, float(host[:, 2].sum()), ptr == vptr)
            """
        )
    )
    assert out.split() == ["(64,", "3)", str(3 * 63 * 64 / 2), "True"]


def test_same_handle_twice_is_one_mapping_closed_with_the_last_view(device):
    t = pystrom.Table.from_arrays({"x": np.arange(10_000, dtype=np.float32)}, device=device)
    out = ok(
        child(
            f"""
            from pystrom.ipc.export import mapping_count
            h = bytes.fromhex({t.export().hex()!r})
            a, b = pystrom.ipc_import(h), pystrom.ipc_import(h)
            pa_ = a["x"].data.ptr if a.device != "cpu" else a["x"].ctypes.data
            pb_ = b["x"].data.ptr if b.device != "cpu" else b["x"].ctypes.data
            col = a["x"]
            print(mapping_count(), pa_ == pb_)
            del a, b
            gc.collect()
            print(mapping_count(), float(col.sum()))  # a column array keeps the mapping
            del col
            gc.collect()
            print(mapping_count())
            """
        )
    )
    assert out.split() == ["1", "True", "1", str(float(sum(range(10_000)))), "0"]


def test_import_in_the_exporting_process(device):
    t = pystrom.Table.from_arrays({"x": [1, 2, 3]}, device=device)
    v = pystrom.ipc_import(t.export())
    assert v.to_arrow().equals(t.to_arrow())
    del v
    gc.collect()
    assert mapping_count() == 0


def test_import_after_the_exporter_died(device):
    out = ok(child(f"t = pystrom.Table.from_arrays({{'x': [1, 2, 3]}}, device={device!r}); print(t.export().hex())"))
    with pytest.raises(ExporterGoneError, match="has exited"):
        pystrom.ipc_import(bytes.fromhex(out.strip()))


def test_imported_view_after_the_exporter_dies(device):
    """Mapped before the exporter exits, read after: never a crash. On the CPU the kernel keeps the
    memory while a mapping exists, so the data is still there; the GPU's behaviour is printed."""
    exporter = f"""
        t = pystrom.Table.from_arrays({{'x': np.arange(1000)}}, device={device!r})
        print(t.export().hex(), flush=True)
        sys.stdin.readline()
        """
    importer = """
        v = pystrom.ipc_import(bytes.fromhex(sys.argv[1]))
        print("mapped", flush=True)
        sys.stdin.readline()  # the exporter has exited now
        try:
            print("sum", int(v["x"].sum()), flush=True)
        except Exception as e:
            print("error", type(e).__name__, e, flush=True)
        """
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    a = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(exporter)], **pipes)
    b = None
    try:
        h = a.stdout.readline().strip()
        b = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(importer), h], **pipes)
        assert b.stdout.readline().strip() == "mapped"
        a.stdin.write("\n")
        a.stdin.flush()
        assert a.wait(timeout=60) == 0
        out, _ = b.communicate("\n", timeout=60)
    finally:
        a.kill()
        if b is not None:
            b.kill()
    print(f"\n{device}: reading a mapping after the exporter exited gives: {out.strip()}")
    assert b.returncode == 0, out  # no crash, whatever the driver does
    if device == "cpu":
        assert out.strip() == f"sum {999 * 1000 // 2}"
    else:
        assert out.startswith(("sum", "error"))


def test_edge_tables_and_the_device_argument(device):
    empty = pystrom.Table.from_arrays({"x": pa.array([], pa.int64()), "s": pa.array([], pa.string())}, device)
    assert pystrom.ipc_import(empty.export()).to_arrow().equals(empty.to_arrow())
    no_columns = pystrom.Table.from_arrow(pa.table({"a": [1, 2]}).select([]), device=device)
    v = pystrom.ipc_import(no_columns.export())
    assert (v.num_rows, v.num_columns) == (2, 0)
    t = pystrom.Table.from_arrays({"x": [1.0, None], "y": [2.0, 3.0]}, device=device)
    on_cpu = pystrom.ipc_import(t.export(), device="cpu")  # a copy when the handle is on a GPU
    assert on_cpu.device == "cpu" and on_cpu.to_arrow().equals(t.to_arrow())
    assert pystrom.testing.to_host(pystrom.ipc_import(t.export(), "y")).tolist() == [[2.0], [3.0]]
    with pytest.raises(pystrom.NullValuesError, match="'x'"):
        pystrom.ipc_import(t.export(), ["x", "y"])


def test_table_from_an_import_cannot_be_reexported_on_the_cpu():
    t = pystrom.Table.from_arrays({"x": [1, 2, 3]}, device="cpu")
    v = pystrom.ipc_import(t.export())
    with pytest.raises(IPCError, match="imported from another process"):
        v.export()


# -- hostile handles ---------------------------------------------------------------------------------


@pytest.fixture
def good_handle() -> bytes:
    t = pystrom.Table.from_arrow(all_types_table(50), device="cpu")
    good_handle.table = t  # keep the exporter's table alive for the test's duration
    return t.export()


def reseal(h: bytes, **changes) -> bytes:
    """A handle with fields changed and a valid checksum: reaches the checks behind the CRC."""
    return fmt.encode(dataclasses.replace(fmt.decode(h), **changes))


def with_column(h: bytes, index: int, **changes) -> bytes:
    decoded = fmt.decode(h)
    cols = copy.deepcopy(decoded.layout.columns)
    cols[index].update(changes)
    layout = fmt.TableLayout(decoded.layout.nbytes, decoded.layout.num_rows, cols, decoded.layout.schema)
    return fmt.encode(dataclasses.replace(decoded, layout=layout))


def test_every_flipped_byte_is_refused(good_handle):
    for pos in range(len(good_handle)):
        bad = bytearray(good_handle)
        bad[pos] ^= 0x5A
        with pytest.raises(InvalidHandleError):
            pystrom.ipc_import(bytes(bad))


def test_truncated_handles_are_refused(good_handle):
    for n in [0, 1, 8, 40, 83, len(good_handle) // 2, len(good_handle) - 1]:
        with pytest.raises(InvalidHandleError, match="too short|truncated"):
            pystrom.ipc_import(good_handle[:n])
    with pytest.raises(InvalidHandleError, match="truncated"):
        pystrom.ipc_import(good_handle + b"\0")


def test_wrong_version_and_magic(good_handle):
    with pytest.raises(InvalidHandleError, match="format version 99"):
        pystrom.ipc_import(reseal(good_handle, version=99))
    with pytest.raises(InvalidHandleError, match="not a pystrom handle"):
        pystrom.ipc_import(b"NOTMAGIC" + good_handle[8:])
    with pytest.raises(InvalidHandleError, match="handle is bytes"):
        pystrom.ipc_import("not bytes")


def test_offsets_past_the_end(good_handle):
    decoded = fmt.decode(good_handle)
    nbytes = decoded.layout.nbytes
    with pytest.raises(InvalidHandleError, match="past the end of the .*-byte block"):
        pystrom.ipc_import(with_column(good_handle, 0, values=[nbytes, 64]))
    with pytest.raises(InvalidHandleError, match="past the end of the .*allocation"):
        pystrom.ipc_import(reseal(good_handle, offset=decoded.alloc_size))
    with pytest.raises(InvalidHandleError, match="not 64-byte aligned"):
        pystrom.ipc_import(with_column(good_handle, 0, values=[8, 50]))
    with pytest.raises(InvalidHandleError, match="values buffer of 8 bytes"):
        pystrom.ipc_import(with_column(good_handle, 1, values=[0, 8]))
    with pytest.raises(InvalidHandleError, match="rows .* lie past"):
        pystrom.ipc_import(with_column(good_handle, 1, offset=10))
    with pytest.raises(InvalidHandleError, match="null count"):
        pystrom.ipc_import(with_column(good_handle, 1, null_count=10**6))
    with pytest.raises(InvalidHandleError, match="must be an integer"):
        pystrom.ipc_import(with_column(good_handle, 1, length=-1))
    with pytest.raises(InvalidHandleError, match="validity bitmap must be present"):
        pystrom.ipc_import(with_column(good_handle, 0, validity=None))


def test_unknown_types_and_garbage_schema(good_handle):
    decoded = fmt.decode(good_handle)
    rest = list(decoded.layout.arrow_schema("x"))[1:]
    forgeries = [(pa.map_(pa.utf8(), pa.int8()), "nested"), (pa.struct([("a", pa.int8())]), "take 0")]
    for forged, message in forgeries:
        schema = pa.schema([pa.field("bool", forged)] + rest)  # a struct over a bool's buffers: sizes disagree
        layout = fmt.TableLayout(decoded.layout.nbytes, decoded.layout.num_rows, decoded.layout.columns,
                                 schema.serialize())  # fmt: skip
        with pytest.raises(InvalidHandleError, match=f"column 'bool'.*{message}"):
            pystrom.ipc_import(fmt.encode(dataclasses.replace(decoded, layout=layout)))
    # a list type over a bool column's buffers: the sizes do not add up
    schema = pa.schema([pa.field("bool", pa.list_(pa.int8()))] + list(decoded.layout.arrow_schema("x"))[1:])
    layout = fmt.TableLayout(decoded.layout.nbytes, decoded.layout.num_rows, decoded.layout.columns, schema.serialize())
    with pytest.raises(InvalidHandleError, match="column 'bool': values buffer of"):
        pystrom.ipc_import(fmt.encode(dataclasses.replace(decoded, layout=layout)))
    garbage = fmt.TableLayout(decoded.layout.nbytes, decoded.layout.num_rows, decoded.layout.columns, b"\x01" * 40)
    with pytest.raises(InvalidHandleError, match="schema does not decode"):
        pystrom.ipc_import(fmt.encode(dataclasses.replace(decoded, layout=garbage)))


def test_another_machines_uuid(good_handle):
    with pytest.raises(IPCError, match="another machine"):
        pystrom.ipc_import(reseal(good_handle, device_uuid=uuid.uuid4().bytes))


def test_a_reused_descriptor_number_is_not_mistaken_for_the_table(good_handle):
    decoded = fmt.decode(good_handle)
    other = os.open(os.devnull, os.O_RDONLY)  # an fd of this process that is not the table's memfd
    try:
        forged = bytes(decoded.memory[:0]) + other.to_bytes(4, "little") + decoded.memory[4:]
        with pytest.raises(ExporterGoneError, match="no longer holds"):
            pystrom.ipc_import(reseal(good_handle, memory=forged))
    finally:
        os.close(other)


def test_gpu_handle_on_a_machine_without_that_gpu(good_handle):
    decoded = fmt.decode(good_handle)
    forged = reseal(good_handle, kind=fmt.CUDA_IPC, memory=b"\0" * 64, device_uuid=uuid.uuid4().bytes)
    with pytest.raises((IPCError, pystrom.DeviceError), match="no GPU here has UUID|sees no CUDA GPU"):
        pystrom.ipc_import(forged)
    assert decoded.kind == fmt.HOST_MEMFD


def test_uuid_to_ordinal_follows_the_uuid_not_the_position():
    a, b, c = (uuid.uuid4().bytes for _ in range(3))
    assert cuda_ordinal_for_uuid(b, [a, b, c]) == 1
    assert cuda_ordinal_for_uuid(b, [b, a]) == 0
    assert cuda_ordinal_for_uuid(c, [a, b]) is None


# -- GPU specifics -------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_a_table_inside_a_pool_chunk_exports_its_base_allocation_and_offset():
    """CuPy's pool hands out pieces of larger cudaMalloc blocks; CUDA IPC maps whole blocks."""
    import cupy

    # A fresh pool: the default one holds free chunks of every size from earlier tests, and its
    # best-fit search may hand the table a chunk of its own.
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.Device(0), cupy.cuda.using_allocator(pool.malloc):
        chunk = cupy.empty(64 << 20, dtype=cupy.uint8)
        del chunk  # back in the pool: the next allocations are carved out of it
        first = cupy.zeros(1 << 20, dtype=cupy.uint8)
        t = pystrom.Table.from_arrays({"x": cupy.arange(100_000, dtype=cupy.int64)}, device="cuda:0")
    h = t.export()
    decoded = fmt.decode(h)
    assert decoded.offset > 0 and decoded.alloc_size >= 64 << 20, (decoded.offset, decoded.alloc_size)
    out = ok(child(f"print(int(pystrom.ipc_import(bytes.fromhex({h.hex()!r}))['x'].sum()))"))
    assert int(out) == 99_999 * 100_000 // 2
    del first


@pytest.mark.gpu
@pytest.mark.skipif(pystrom.memory.backend.cuda_device_count() < 2, reason="needs two GPUs")
def test_import_maps_on_the_gpu_with_the_handles_uuid_whatever_its_ordinal():
    t = pystrom.Table.from_arrays({"x": np.arange(10)}, device="cuda:1")
    order = ",".join(str(i) for i in reversed(range(pystrom.memory.backend.cuda_device_count())))
    code = f"v = pystrom.ipc_import(bytes.fromhex({t.export().hex()!r})); print(v.device, int(v['x'].sum()))"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": order}
    r = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    expected = f"cuda:{pystrom.memory.backend.cuda_device_count() - 2}"  # GPU 1 is second to last once reversed
    assert r.stdout.split() == [expected, "45"]
