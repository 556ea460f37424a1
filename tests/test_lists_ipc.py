"""List columns shared between processes: IPC handles and the store daemon carry fixed_size_list, list
and interval columns (real child processes, a real daemon), and hostile peers (forged layouts, list
offsets written after export, garbage committed to the store) are refused by name, never followed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from test_ipc import child, ok
from test_ipc_hostile import exporter_writes, import_and_report, run_child, survived
from test_lists import _table
from test_store import Daemon

import pystrom

from conftest import needs_gpu

IMPORT = """
v = pystrom.ipc_import(bytes.fromhex({handle!r}))
import pyarrow.ipc as ipc, sys
sink = pa.BufferOutputStream()
with ipc.new_stream(sink, v.schema) as w:
    w.write_table(v.to_arrow())
print(sink.getvalue().to_pybytes().hex())
print(v["emb"].shape if v.column("emb").null_count == 0 else "nulls")
"""


def _from_hex(text: str) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(bytes.fromhex(text))).read_all()


@pytest.mark.parametrize("rows", [0, 1, 40])
def test_a_handle_carries_list_columns_to_another_process(device, rows):
    arrow = _table(rows)
    table = pystrom.Table.from_arrow(arrow, device=device)
    for view, expected in ((table, arrow), (table.slice(min(rows, 3), 20), arrow.slice(min(rows, 3), 20))):
        out = ok(child(IMPORT.format(handle=view.export().hex()))).split()
        assert _from_hex(out[0]).equals(expected)


def test_dense_fixed_size_list_imports_as_a_matrix(device):
    arrow = pa.table({"emb": pa.array([[float(i), i + 0.5] for i in range(9)], pa.list_(pa.float32(), 2))})
    table = pystrom.Table.from_arrow(arrow, device=device)
    out = ok(child(IMPORT.format(handle=table.export().hex()))).split("\n")
    assert out[1] == "(9, 2)"


def test_the_store_daemon_carries_list_columns(tmp_path, device):
    d = Daemon(str(tmp_path / "run" / "s.sock"), device)
    try:
        arrow = _table(33)
        with d.store() as s:
            s.put("t", pystrom.Table.from_arrow(arrow, device=device))
        with d.store() as s:
            got = s.get("t")
            assert got.to_arrow().equals(arrow)
            assert got.column("emb").values.shape == (33, 3)
            s.drop("t")
    finally:
        assert d.stop() == 0


LISTS = 'pa.table({"l": pa.array([[1, 2], [], None, [3]] * 250, pa.list_(pa.int64()))})'


@pytest.mark.parametrize("row,value", [(1, 2**30), (7, -5), (0, -1), (1000, 751)])
def test_list_offsets_written_after_export_are_refused_at_import(row, value):
    out = survived(run_child(exporter_writes(LISTS, "l", row, value)))
    assert out.startswith("InvalidHandleError") and "column 'l': list offsets" in out, out


FORGE = """
import copy, dataclasses
from pystrom.ipc import handle as fmt
src = pa.table({{"l": pa.array([[1, None], [], [3]] * 30, pa.list_(pa.int32())), "x": list(range(90))}})
t = pystrom.Table.from_arrow(src, device="cpu")
h = fmt.decode(t.export())
cols = copy.deepcopy(h.layout.columns)
{change}
forged = fmt.encode(dataclasses.replace(h, layout=fmt.TableLayout(h.layout.nbytes, 90, cols, h.layout.schema)))
""" + import_and_report("forged")


@pytest.mark.parametrize(
    "change, fragment",
    [
        ('cols[0]["child_validity"] = None', "imported"),  # dropping the element bitmap is legal: no NULLs then
        ('cols[0]["child_validity"][1] += 1', "child validity bitmap of"),
        ('cols[1]["child_validity"] = cols[0]["child_validity"]', "child validity bitmap of"),
        ('cols[0]["data"][1] -= 2', "not a whole number"),
        ('cols[0]["data"] = None', "data buffer must be present"),
        ('cols[0]["data"][1] -= 8\ncols[0]["child_validity"] = None', "list offsets would read outside"),
    ],
)
def test_forged_list_layouts_are_refused(change, fragment):
    out = survived(run_child(FORGE.format(change=change)))
    assert fragment in out, out
    if fragment != "imported":
        assert out.startswith("InvalidHandleError") and "column 'l'" in out or "column 'x'" in out, out


GARBAGE_COMMIT = """
from pystrom.ipc.handle import TableLayout
from pystrom.ipc.client import _copy_block
import numpy as np
with pystrom.Store({path!r}) as s:
    t = pystrom.Table.from_arrow(pa.table({{"l": pa.array([[1.5], [2.5, 3.5]] * 50, pa.list_(pa.float64()))}}),
                                 device={device!r})
    res = s.reserve("bad", t._live().nbytes)
    _copy_block(t._live(), res.block)
    res.block.array(t.column("l")._plan.values.offset, np.int32, (101,))[5] = 2**30
    try:
        res.commit(layout=TableLayout.of(t))
        print("committed")
    except pystrom.Error as e:
        print("commit refused:", type(e).__name__, e)
        res.abort()
with pystrom.Store({path!r}) as s:
    try:
        v = s.get("bad")
        print("read", len(v.to_pandas()))
    except pystrom.Error as e:
        print(type(e).__name__, e)
"""


def test_garbage_list_offsets_committed_to_the_store_are_refused():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(tmp + "/run/s.sock", "cpu")
        try:
            out = survived(run_child(GARBAGE_COMMIT.format(path=d.path, device="cpu")))
            assert "commit refused: InvalidHandleError" in out and "column 'l': list offsets" in out, out
            assert "TableNotFoundError" in out, out
        finally:
            assert d.stop() == 0


@pytest.mark.gpu
@needs_gpu
def test_garbage_list_offsets_in_a_gpu_store_are_refused_by_readers(tmp_path):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cuda")
    try:
        out = survived(run_child(GARBAGE_COMMIT.format(path=d.path, device="cuda")))
        assert "committed" in out and "InvalidHandleError" in out and "column 'l': list offsets" in out, out
    finally:
        assert d.stop() == 0
