"""Arrow arrays over a Table's memory, handed to pyarrow, outlive every Python reference and are let go
of on whichever thread pyarrow drops them, also while the interpreter shuts down (issue 15, finding 6:
exit 134, "terminate called without an active exception", after to_pandas() raised).

The subprocess below makes the race deterministic: a thread Python never saw (as pyarrow's pool threads
are) drops pyarrow's last reference while the interpreter still holds the GIL just before finalizing; the
interpreter then lets go of the GIL during module teardown, and a release that asks for the GIL there is
ended by pthread_exit inside pyarrow's noexcept destructor. A NumPy-backed pyarrow array (pa.py_buffer,
how to_arrow() used to build its arrays) aborts this way; pystrom's arrays must not."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom.memory import shm

_SCRIPT = textwrap.dedent(
    """
    import atexit, ctypes, sys, time
    import numpy as np, pyarrow as pa
    import pystrom

    n = 1000
    source = pa.table({"x": np.arange(n * 1.0), "s": [str(i) for i in range(n)], "b": [i % 2 == 0 for i in range(n)]})
    how = sys.argv[1]
    if how == "numpy":  # the control: pyarrow over a NumPy array
        arr = pa.Array.from_buffers(pa.float64(), 1000, [None, pa.py_buffer(np.arange(1000.0))])
    else:
        table = pystrom.Table.from_arrow(source, device="cpu")
        column = sys.argv[2]
        arr = (table.to_arrow() if how == "to_arrow" else pa.table(table)).column(column).chunk(0)
        del table
    struct = ctypes.create_string_buffer(80)  # struct ArrowArray, exported by pyarrow: it holds the only reference
    arr._export_to_c(ctypes.addressof(struct))
    del arr
    release = ctypes.c_void_p.from_buffer(struct, 64).value
    held = ctypes.PyDLL(None)  # calls that keep the GIL
    held.pthread_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    sys.setswitchinterval(60)  # a thread waiting for the GIL does not make this one hand it over

    def drop_on_a_foreign_thread():
        tid = ctypes.c_ulong()
        held.pthread_create(ctypes.byref(tid), None, release, ctypes.addressof(struct))
        held.usleep(100000)

    atexit.register(drop_on_a_foreign_thread)

    class SlowTeardown:  # module teardown that lets go of the GIL for a moment, as finalizers may
        def __del__(self):
            time.sleep(0.2)

    slow = SlowTeardown()
    """
)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_the_harness_aborts_with_a_buffer_that_needs_the_gil():
    res = _run("numpy")
    assert res.returncode == -6 and "terminate called without an active exception" in res.stderr


@pytest.mark.parametrize("how", ["to_arrow", "c_stream"])
@pytest.mark.parametrize("column", ["x", "s", "b"])
def test_table_memory_released_by_a_foreign_thread_at_exit(how, column):
    res = _run(how, column)
    assert res.returncode == 0, res.stderr


def _exported(arr: pa.Array) -> ctypes.Array:
    """``arr`` exported by pyarrow through the C data interface (a reference Python does not see)."""
    struct = ctypes.create_string_buffer(80)
    arr._export_to_c(ctypes.addressof(struct))
    return struct


def _release_on_a_foreign_thread(struct: ctypes.Array) -> None:
    """Release the exported array on a thread without the GIL (a raw pthread, joined)."""
    release = ctypes.c_void_p.from_buffer(struct, 64).value
    libc = ctypes.CDLL(None)  # releases the GIL around each call
    libc.pthread_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    tid = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(tid), None, release, ctypes.addressof(struct)) == 0
    assert libc.pthread_join(tid.value, None) == 0
    assert ctypes.c_void_p.from_buffer(struct, 64).value is None  # released


def _owner(values: np.ndarray) -> object:
    """The object that owns a CPU table's memory (the root of its NumPy views): it goes when the memory does."""
    base = values
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


@pytest.mark.skipif(not shm.HAVE_MEMFD, reason="CPU tables are in shared memory only where memfd exists")
def test_memory_a_foreign_thread_let_go_of_is_freed_by_the_next_export():
    table = pystrom.Table.from_arrow(pa.table({"x": np.arange(100_000.0)}), device="cpu")
    mapping = weakref.ref(_owner(table.column("x").values))
    struct = _exported(table.to_arrow().column("x").chunk(0))
    del table
    assert mapping() is not None
    _release_on_a_foreign_thread(struct)  # pyarrow's last reference
    assert mapping() is not None  # parked: that thread could not let go of a Python object
    pystrom.Table.from_arrow(pa.table({"y": [1]}), device="cpu").to_arrow()
    assert mapping() is None  # the next export let go of it


@pytest.mark.skipif(not shm.HAVE_MEMFD, reason="CPU tables are in shared memory only where memfd exists")
def test_memory_lives_while_pyarrow_holds_it_and_goes_with_it():
    table = pystrom.Table.from_arrow(pa.table({"x": np.arange(1000.0), "s": ["a"] * 1000}), device="cpu")
    mapping = weakref.ref(_owner(table.column("x").values))
    arrow = table.to_arrow()
    del table
    assert mapping() is not None and arrow.column("x").to_pylist()[-1] == 999.0
    streamed = pa.table(pystrom.Table.from_arrow(arrow, device="cpu"))
    del arrow
    assert mapping() is None  # the Python thread let go of it at once
    assert streamed.column("s").to_pylist() == ["a"] * 1000
