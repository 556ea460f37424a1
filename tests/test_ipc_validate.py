"""The offsets check of shared string columns: the NumPy twin against a plain reference, the GPU
kernel against the twin, and the GPU paths end to end (forged handles, exporters writing after
export, garbage committed to a GPU store, read-only VMM mappings of store readers)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_ipc import child
from test_ipc_hostile import survived
from test_store import Daemon

import pystrom
from pystrom.ipc.validate import first_bad_offset, first_bad_offsets_gpu

from conftest import needs_gpu


def reference(offsets: list[int], data_size: int) -> int | None:
    """The rule spelled out one position at a time."""
    n = len(offsets) - 1
    for p in range(n + 1):
        if p == 0 and offsets[0] < 0:
            return 0
        if p < n and offsets[p + 1] < offsets[p]:
            return p
        if p == n and offsets[n] > data_size:
            return n
    return None


def offsets_cases(seed: int, count: int) -> list[tuple[np.ndarray, int]]:
    """Valid offsets with 0-3 faults of every kind injected, and edge sizes."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        n = int(rng.choice([0, 1, 2, 7, 64, 1000, 100_003]))
        lengths = rng.integers(0, 9, n)
        o = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=o[1:])
        o += int(rng.choice([0, 0, 5]))
        data_size = int(o[-1]) + int(rng.choice([0, 0, 3]))
        for _ in range(int(rng.integers(0, 4))):
            i = int(rng.integers(0, n + 1))
            o[i] = int(rng.choice([-1, -(2**31), 2**31 - 1, o[i] + 1, o[i] - 1, data_size + 1]))
        cases.append((np.clip(o, -(2**31), 2**31 - 1).astype(np.int32), data_size))
    return cases


@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=40), st.integers(0, 2**31))
def test_the_numpy_twin_follows_the_rule(offsets, data_size):
    assert first_bad_offset(np.array(offsets, dtype=np.int32), data_size) == reference(offsets, data_size)


@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=40), st.integers(0, 2**31))
def test_the_fused_copy_and_check_follows_the_rule(offsets, data_size):
    """The C++ copy-and-check that imported tables use wherever their offsets are followed (issue 36)."""
    from pystrom import _core

    src = np.array(offsets, dtype=np.int32)
    dst = np.full_like(src, 7)
    bad = _core.copy_offsets_checked(src, dst, data_size)
    assert (None if bad < 0 else bad) == reference(offsets, data_size)
    if bad < 0:
        assert np.array_equal(dst, src)


def test_the_fused_copy_and_check_on_injected_faults_across_its_chunks():
    from pystrom import _core

    for o, size in offsets_cases(3, 200):  # up to 100,003 offsets: many 4096-entry chunks
        dst = np.empty_like(o)
        bad = _core.copy_offsets_checked(o, dst, size)
        assert (None if bad < 0 else bad) == first_bad_offset(o, size)


def test_the_numpy_twin_on_injected_faults():
    for o, size in offsets_cases(1, 200):
        if o.size < 2000:
            assert first_bad_offset(o, size) == reference(o.tolist(), size)


@pytest.mark.gpu
@needs_gpu
def test_the_offsets_kernel_matches_its_numpy_twin():
    import cupy

    from pystrom.memory.backend import resolve_device

    backend = resolve_device("cuda")
    cases = offsets_cases(2, 300)
    got = first_bad_offsets_gpu(backend, [(cupy.asarray(o), size) for o, size in cases])
    want = [first_bad_offset(o, size) for o, size in cases]
    assert got == want
    assert sum(w is None for w in want) > 20 and sum(w is not None for w in want) > 20  # both kinds tested


GPU_EXPORT_BAD = """
import cupy
t = pystrom.Table.from_arrow(pa.table({{"s": ["a", "bb", "ccc", None] * 250, "x": np.arange(1000)}}), device="cuda")
h = t.export()
t.column("s").offsets[{row}] = {value}  # written after export, on the device
cupy.cuda.runtime.deviceSynchronize()
try:
    v = pystrom.ipc_import(h)
    print("imported", len(v.to_pandas()))
except pystrom.Error as e:
    print(type(e).__name__, e)
"""


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("row,value", [(1, 2**30), (7, -5), (0, -(2**24)), (1000, 2**20)])
def test_gpu_exporter_writing_a_bad_offset_is_caught_at_import(row, value):
    out = survived(child(GPU_EXPORT_BAD.format(row=row, value=value)))
    assert out.startswith("InvalidHandleError") and "column 's'" in out, out


GPU_GARBAGE_COMMIT = """
import cupy
from pystrom.ipc.client import _copy_block
from pystrom.ipc.handle import TableLayout
with pystrom.Store({path!r}) as s:
    t = pystrom.Table.from_arrow(pa.table({{"s": ["x", "yy", "zzz"] * 100}}), device="cuda")
    res = s.reserve("bad", t._live().nbytes)
    _copy_block(t._live(), res.block)
    off = t.column("s")._plan.values.offset
    res.block.array(off, np.int32, (301,))[5] = 2**30
    res.commit(layout=TableLayout.of(t))  # GPU memory cannot be sealed: readers check it
    print("committed")
with pystrom.Store({path!r}) as s:
    try:
        v = s.get("bad")
        print("read", len(v.to_pandas()))
    except pystrom.Error as e:
        print(type(e).__name__, e)
    s.drop("bad")
"""


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("memory", ["vmm", "legacy"])
def test_garbage_committed_to_a_gpu_store_is_refused_by_readers(tmp_path, memory):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cuda", "--memory", memory)
    try:
        out = survived(child(GPU_GARBAGE_COMMIT.format(path=d.path)))
        assert "committed" in out and "InvalidHandleError" in out and "column 's'" in out, out
    finally:
        assert d.stop() == 0


READ_ONLY_GET = """
import cupy
with pystrom.Store({path!r}) as s:
    v = s.get("t")
    owner = s._maps[next(iter(s._maps.keys()))]
    print("read_only", owner.read_only, flush=True)
    x = v["x"]
    assert int(x.sum()) == {total}
    try:
        x[:] = 7  # a reader writing the daemon's memory
        cupy.cuda.runtime.deviceSynchronize()
        print("write went through", flush=True)
    except Exception as e:
        print("write faulted:", type(e).__name__, flush=True)
        os._exit(0)  # the context is unusable after a fault
"""


@pytest.mark.gpu
@needs_gpu
def test_store_readers_map_gpu_tables_read_only_where_the_driver_allows(tmp_path):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cuda", "--memory", "vmm")
    n = 1 << 20
    try:
        with d.store() as s:
            s.put("t", pystrom.Table.from_arrow(pa.table({"x": np.arange(n)}), device="cuda"))
        out = child(READ_ONLY_GET.format(path=d.path, total=n * (n - 1) // 2))
        print(out.stdout, out.stderr[-2000:])
        assert "read_only" in out.stdout, out.stderr
        with d.store() as s:
            now = int(s.get("t")["x"].sum())
            if "read_only True" in out.stdout:  # the driver took PROT_READ: the write must not land
                assert "write went through" not in out.stdout and now == n * (n - 1) // 2
            else:  # documented in docs/ipc.md: the driver refused read-only access, the mapping is read-write
                print("this driver refused CU_MEM_ACCESS_FLAGS_PROT_READ; readers map read-write")
            s.drop("t")
    finally:
        assert d.stop() == 0


def test_the_offsets_kernel_under_emulation_matches_its_numpy_twin(tmp_path):
    """The same kernel (kernels/validate.cu) run on the CPU under tests/simt.py's emulation, on CI:
    two blocks striding over the offsets, the first bad position folded in by atomicMin."""
    import simt

    if simt.CXX is None:
        pytest.skip("no C++ compiler")
    kernel = simt.Emulated("validate", tmp_path)
    cases = offsets_cases(3, 60)
    want = [first_bad_offset(o, size) for o, size in cases]
    got = []
    for o, size in cases:
        out = np.full(1, 2**64 - 1, dtype=np.uint64)
        n = o.size - 1
        kernel.launch("first_bad_offset", n + 1, (o, np.int64(n), np.int64(size), out), max_blocks=2)
        got.append(None if int(out[0]) == 2**64 - 1 else int(out[0]))
    assert got == want
    assert sum(w is None for w in want) > 5 and sum(w is not None for w in want) > 5
