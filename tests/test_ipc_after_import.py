"""Shared memory after the import (issue 36, items 3-4): who can write an exported table, and what an
importer sees when its exporter writes bad offsets after the import.

Every importer runs in a spawned child whose death by a signal is reported as a failed assertion
(``survived``), so a crash cannot take pytest down.
"""

from __future__ import annotations

import ast
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest
from test_ipc import PRELUDE, child
from test_ipc_hostile import survived

import pystrom
from pystrom.ipc import handle as fmt
from pystrom.memory import shm

from conftest import needs_gpu

pytestmark = pytest.mark.skipif(not shm.HAVE_MEMFD, reason="host tables are shared through Linux memfds")


# -- item 3: write-sealed exports -------------------------------------------------------------------------

ATTACK = """
import mmap
h = bytes.fromhex({handle!r})
pid, fd, size, offset = {pid}, {fd}, {size}, {offset}
v = pystrom.ipc_import(h)  # a legitimate import first: the attacker is a consumer of the same user
results = {{}}
for what, attempt in [
    ("reopen-write", lambda: os.pwrite(os.open(f"/proc/{{pid}}/fd/{{fd}}", os.O_RDWR), b"\\xff" * 8, offset)),
    ("mmap-write", lambda: mmap.mmap(os.open(f"/proc/{{pid}}/fd/{{fd}}", os.O_RDWR), size, mmap.MAP_SHARED,
                                     mmap.PROT_READ | mmap.PROT_WRITE)),
]:
    try:
        m = attempt()
        if isinstance(m, mmap.mmap):
            np.frombuffer(m, np.int64)[offset // 8 + 3] = -4242  # what issue 36 saw another importer read
        results[what] = "done"
    except OSError as e:
        results[what] = f"refused ({{e.strerror}})"
print(results)
"""

READ_X = "v = pystrom.ipc_import(bytes.fromhex({handle!r})); print(v['x'].tolist())"


def _handle_fields(h: bytes) -> dict:
    d = fmt.decode(h)
    (fd,) = struct.unpack_from("<i", d.memory)
    return {"handle": h.hex(), "pid": d.pid, "fd": fd, "size": d.alloc_size, "offset": d.offset}


def test_a_consumer_cannot_reopen_an_exported_table_writable():
    """Finding 3 of issue 36: a consumer reopened /proc/<exporter>/fd/<n> read-write, mapped it writable and
    changed what another importer read (-4242). The exporter here is this process, the rest are children."""
    t = pystrom.Table.from_arrays({"x": np.arange(10, dtype=np.int64)}, device="cpu")
    h = t.export()
    fields = _handle_fields(h)
    out = survived(child(ATTACK.format(**fields)))
    assert "'reopen-write': 'refused" in out and "'mmap-write': 'refused" in out, out
    assert survived(child(READ_X.format(**fields))).strip() == str(list(range(10)))
    assert t["x"].tolist() == list(range(10))
    # the exporter's own mapping stays writable, and importers see its writes (the zero-copy contract)
    t.column("x").values[5] = 77
    assert survived(child(READ_X.format(**fields))).strip() == str([0, 1, 2, 3, 4, 77, 6, 7, 8, 9])
    assert shm.seals(fields["fd"]) & shm.F_SEAL_FUTURE_WRITE


def test_without_the_future_write_seal_an_export_is_a_sealed_copy():
    """Kernels before Linux 5.1 have no F_SEAL_FUTURE_WRITE: the export then hands out a copy sealed against
    every write (importers see the table as exported, not the exporter's later writes)."""
    exporter = """
        import sys
        from pystrom.memory import shm
        shm.future_write_sealing = lambda: False  # as on a kernel without the seal
        t = pystrom.Table.from_arrays({"x": np.arange(10, dtype=np.int64)}, device="cpu")
        h = t.export()
        t.column("x").values[5] = 77  # after the export: not in the copy
        print(h.hex(), flush=True)
        sys.stdin.readline()
        """
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(exporter)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        h = bytes.fromhex(proc.stdout.readline().strip())
        fields = _handle_fields(h)
        out = survived(child(ATTACK.format(**fields)))
        assert "'reopen-write': 'refused" in out and "'mmap-write': 'refused" in out, out
        assert survived(child(READ_X.format(**fields))).strip() == str(list(range(10)))
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()


# -- item 4: offsets written after the import ---------------------------------------------------------

# The importer: maps the table, passes the import-time check, then waits while the exporter scribbles;
# then every path that follows offsets, each reported on its own line (a signal would end the output).
IMPORTER = """
import sys, traceback
import pyarrow.compute
v = pystrom.ipc_import(bytes.fromhex(sys.stdin.readline().strip()))
print("imported", flush=True)
sys.stdin.readline()  # the exporter writes meanwhile
col = {column!r}
steps = {{
    "to_arrow + to_pylist": lambda: v.to_arrow().column(col).to_pylist(),
    "column to_pylist": lambda: v.column(col).to_arrow().to_pylist(),
    "to_pandas": lambda: v.to_pandas(),
    "repr": lambda: repr(v),
    "filter by mask": lambda: v.filter(np.arange(v.num_rows) % 2 == 0).to_arrow(),
    "slice then copy": lambda: pystrom.concat([v.slice(0, 5), v.slice(5)]).to_arrow(),
    "Arrow C export": lambda: pa.table(v).column(col).to_pylist(),
    "to_numpy": lambda: v.column(col).to_numpy(),
    {extra}
}}
for name, step in steps.items():
    print("start", name, flush=True)
    try:
        step()
        print(name, "->", "ran", flush=True)
    except pystrom.Error as e:
        print(name, "->", type(e).__name__, str(e).splitlines()[0], flush=True)
    except Exception as e:
        print(name, "->", "RAW", type(e).__name__, e, flush=True)
"""

STRING_STEPS = """
    "where on strings": lambda: v.filter("s = 'bb'").to_arrow(),
    "like": lambda: v.filter("s like 'c%'").to_arrow(),
    "sort": lambda: v.sort("s").to_arrow(),
    "unique": lambda: v.unique("s").to_arrow(),
    "fill_null": lambda: v.fill_null("x").to_arrow(),
    "drop_nulls": lambda: v.drop_nulls().to_arrow(),
"""


def _scribbled(table: pystrom.Table, column: str, row: int, value: int, extra: str, write=None) -> list[str]:
    h = table.export()
    code = IMPORTER.format(column=column, extra=extra)
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        proc.stdin.write(h.hex() + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "imported", proc.stderr.read()
        if write is None:
            table.column(column).offsets[row] = value  # the exporter's own memory, after the import
        else:
            write(table)
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return survived(result).splitlines()


@pytest.mark.parametrize("row,value", [(1, 1 << 30), (3, -5), (0, -(1 << 20)), (1000, 1 << 20), (2, 2**31 - 1)])
def test_offsets_written_after_the_import_give_data_error_never_a_signal(row, value):
    """Finding 4 of issue 36: the exporter's `t.column('s').offsets[1] = 1 << 30` after an import made the
    importer die with SIGSEGV in to_pylist()."""
    t = pystrom.Table.from_arrow(pa.table({"s": ["a", "bb", "ccc", None] * 250, "k": range(1000)}), device="cpu")
    lines = _scribbled(t, "s", row, value, STRING_STEPS)
    results = [line for line in lines if " -> " in line]
    assert len(results) == 14, lines  # every step reported (none died)
    # Steps that never follow the broken offsets may run: repr shows the first rows; when only the last
    # offset is broken, its row (999) is NULL and odd, so the even rows and the non-NULL ones are intact.
    may_run = {"repr"} if row >= pystrom.defaults.repr_rows else set()
    if row == 1000:
        may_run |= {"filter by mask", "drop_nulls", "fill_null"}
    for line in results:
        step, outcome = line.split(" -> ", 1)
        if step in may_run and outcome == "ran":
            continue
        assert outcome.startswith("DataError column 's': its string offsets"), line
        first = 5 if step == "slice then copy" and row >= 5 else 0  # rows are counted in the view: slice(5)'s
        assert f"(row {row - first})" in outcome or f"(row {row - first - 1})" in outcome, (
            line
        )  # a drop: the row before


def test_list_offsets_written_after_the_import_give_data_error_never_a_signal():
    t = pystrom.Table.from_arrow(pa.table({"l": [[1, 2], [3], [], [4, 5, 6]] * 100}), device="cpu")
    lines = _scribbled(t, "l", 2, 1 << 28, "")
    results = [line for line in lines if " -> " in line]
    assert len(results) == 8, lines
    for line in results:
        assert " -> DataError column 'l': its list offsets" in line, line


@pytest.mark.parametrize("target", ["list offsets", "element string offsets", "struct field string offsets"])
def test_child_offsets_written_after_the_import_give_data_error_never_a_signal(target):
    """Lists of strings and structs: the offsets of their child columns steer reads too."""
    tags = pa.array([["a", "bb"], None, [], ["ccc", None]] * 100, pa.list_(pa.utf8()))
    pairs = pa.array([{"k": i, "s": "x" * (i % 5)} for i in range(400)])
    t = pystrom.Table.from_arrow(pa.table({"c": tags if target != "struct field string offsets" else pairs}), "cpu")
    writes = {
        "list offsets": lambda t: t.column("c").offsets.__setitem__(3, 1 << 28),
        "element string offsets": lambda t: t.column("c").elements.offsets.__setitem__(2, -7),
        "struct field string offsets": lambda t: t.column("c").field("s").offsets.__setitem__(9, 1 << 29),
    }
    lines = _scribbled(t, "c", 0, 0, "", write=writes[target])
    results = [line for line in lines if " -> " in line]
    assert len(results) == 8, lines  # every step reported (none died)
    for line in results:
        step, outcome = line.split(" -> ", 1)
        if step == "repr" and outcome == "ran":
            continue  # the first rows may be intact
        assert outcome.startswith("DataError column 'c"), line


GPU_IMPORTER = """
import sys
import cupy
v = pystrom.ipc_import(bytes.fromhex(sys.stdin.readline().strip()))
assert v.device.startswith("cuda"), v.device
print("imported", flush=True)
sys.stdin.readline()  # the exporter writes meanwhile
steps = {
    "to_arrow + to_pylist": lambda: v.to_arrow().column("s").to_pylist(),
    "filter by mask": lambda: v.filter(cupy.arange(v.num_rows) % 2 == 0).to_arrow(),
    "where on strings": lambda: v.filter("s = 'bb'").to_arrow(),
    "slice then copy": lambda: pystrom.concat([v.slice(0, 5), v.slice(5)]).to_arrow(),
    "to the host": lambda: v.to("cpu").to_arrow(),
    "Arrow C device export": lambda: v.__arrow_c_device_array__(),
}
for name, step in steps.items():
    try:
        step()
        cupy.cuda.runtime.deviceSynchronize()  # a kernel that read out of bounds shows here
        print(name, "->", "ran", flush=True)
    except pystrom.Error as e:
        print(name, "->", type(e).__name__, str(e).splitlines()[0], flush=True)
    except Exception as e:
        print(name, "->", "RAW", type(e).__name__, e, flush=True)
"""


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("row,value", [(1, 1 << 30), (3, -5)])
def test_gpu_offsets_written_after_the_import_give_data_error(row, value):
    """The GPU twin of the test above: the importer's checks run on device copies (one kernel launch each)."""
    import cupy

    t = pystrom.Table.from_arrow(pa.table({"s": ["a", "bb", "ccc", None] * 250}), device="cuda")
    h = t.export()
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + GPU_IMPORTER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        proc.stdin.write(h.hex() + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "imported", proc.stderr.read()
        t.column("s").offsets[row] = value  # the exporter's own memory, after the import
        cupy.cuda.runtime.deviceSynchronize()
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    results = [line for line in survived(subprocess.CompletedProcess(proc.args, proc.returncode, out, err)).splitlines()
               if " -> " in line]  # fmt: skip
    assert len(results) == 6, out + err
    for line in results:
        assert " -> DataError column 's': its string offsets" in line, line
        assert "(row " in line, line


def test_an_exporter_rewriting_offsets_all_the_time_never_crashes_an_importer():
    """Writes racing the reads: what is checked is a private copy, so no interleaving gets past the check."""
    t = pystrom.Table.from_arrow(pa.table({"s": ["a", "bb", "ccc", None] * 2500}), device="cpu")
    offsets = t.column("s").offsets
    good = offsets.copy()
    code = f"""
        import time
        v = pystrom.ipc_import(bytes.fromhex({t.export().hex()!r}))
        print("imported", flush=True)
        counts = {{"ok": 0, "DataError": 0}}
        end = time.monotonic() + 3
        while time.monotonic() < end:
            try:
                values = v.to_arrow().column("s").to_pylist()
                assert len(values) == 10000
                v.filter(np.arange(10000) % 3 == 0)
                counts["ok"] += 1
            except pystrom.DataError:
                counts["DataError"] += 1
        print(counts)
        """
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "imported"
    rng = np.random.default_rng(0)
    while proc.poll() is None:  # flip offsets between good and absurd values as fast as Python goes
        rows = rng.integers(0, offsets.size, 8)
        offsets[rows] = rng.integers(-(2**31), 2**31 - 1, 8, dtype=np.int64).astype(np.int32)
        time.sleep(0.0005)
        offsets[:] = good
    out, err = proc.communicate()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    counts = ast.literal_eval(survived(result).strip())  # {'ok': n, 'DataError': m}
    assert counts["ok"] + counts["DataError"] > 0, counts


def test_tables_only_this_process_writes_are_followed_without_a_copy():
    """The check at use costs nothing where nobody else writes: the view's own offsets are followed."""
    t = pystrom.Table.from_arrow(pa.table({"s": ["a", "bb"]}), device="cpu")
    col = t.column("s")
    assert np.shares_memory(col._offsets_in_bounds(), col.offsets)
    t.export()  # host exports stay trusted: the seal leaves the writing to this process
    assert not t._live().others_may_write
    v = pystrom.ipc_import(t.export())
    assert v._live().others_may_write and not np.shares_memory(v.column("s")._offsets_in_bounds(), col.offsets)


def test_gathers_turn_an_inconsistent_string_range_into_data_error():
    """Past the O(rows) check, the C++ gather still checks each range against both buffers (DataError);
    its GPU twin clamps (test_arrow_kernels_emulated.py)."""
    from pystrom import _ops

    t = pystrom.Table.from_arrow(pa.table({"s": ["a", "bb", "ccc"]}), device="cpu")
    t._live().others_may_write = True  # as if imported: the gather follows the ranges it is given
    col = t.column("s")
    ranges = (np.array([0, 1, 3], np.int32), np.array([1, 3, 1 << 20], np.int32))  # row 2 past the data
    dst_offsets = np.array([0, 1, 3, 6], dtype=np.int32)
    with pytest.raises(pystrom.DataError, match="column 's'.*out of range"):
        _ops._gather_varbinary(t._live().backend, col, ranges, np.arange(3), dst_offsets, np.zeros(6, np.uint8))
    col.offsets[3] = 1 << 20  # what the O(rows) check of a gather catches first
    with pytest.raises(pystrom.DataError, match=r"column 's': its string offsets .* row 2 spans \[3, 1048576\)"):
        _ops.gather(t, np.arange(3, dtype=np.int64))
