"""A forked child reads Arrow files whatever the parent's threads held at the fork (src/pystrom/_pools.py):
the CPU reads' pool, the host copies' pool and the table memory pool's lock are made again in the child.
Before, a child forked while another thread was inside the shared pool's ``submit`` (its lock held) or
the memory pool waited forever, and a pool inherited without its threads never ran what it was given."""

from __future__ import annotations

import os
import select
import time
import warnings

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom.io.arrow.codecs import host as codecs_host
from pystrom.io.arrow.file import ranges
from pystrom.memory import hostmem, transfer

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")


def _in_child(work, timeout: float = 60.0) -> str:
    """Run ``work()`` in a forked child; what it returned (a str), or "HANG" / "SIGNAL:n" / "EXIT:n"."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork() with threads running
        pid = os.fork()
    if pid == 0:  # never returns into pytest
        code = 3
        try:
            os.close(r)
            os.write(w, str(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    out = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([r], [], [], 0.1)
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            out += chunk
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)
        return "HANG"
    os.close(r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return out.decode() if code == 0 else (f"SIGNAL:{-code}" if code < 0 else f"EXIT:{code}")


@pytest.fixture
def arrow_file(tmp_path):
    rng = np.random.default_rng(1)
    n = 50_000
    table = pa.table({"x": rng.random(n), "k": rng.integers(0, 100, n), "s": [f"r{i % 77}" for i in range(n)]})
    path = tmp_path / "f.arrow"
    pystrom.write_arrow(table, path, batch_rows=997)
    return path, table


def _read(path) -> str:
    t = pystrom.read_arrow(path, where="k < 50", columns=["x", "s"], device="cpu")
    big = pystrom.read_arrow(path, device="cpu").to("cpu")  # a table copy: the host copies' pool
    return f"{t.num_rows} {big.num_rows}"


def test_a_child_forked_while_the_parent_holds_every_pool_lock_reads(arrow_file):
    path, table = arrow_file
    want = f"{int((table.column('k').to_numpy() < 50).sum())} {table.num_rows}"
    assert _read(path) == want  # the parent's pools exist, with threads, before the fork
    held = [ranges._reads.get()._shutdown_lock, codecs_host._inflaters.get()._shutdown_lock,
            transfer._copiers.get()._shutdown_lock, hostmem._pool.lock, hostmem._share_lock]  # fmt: skip
    for lock in held:  # as a parent's thread inside submit() or an allocation holds them at the fork
        lock.acquire()
    try:
        got = _in_child(lambda: _read(path))
    finally:
        for lock in held:
            lock.release()
    assert got == want


def test_without_the_renewal_the_child_hangs(arrow_file, monkeypatch):
    """The test above would catch the fault: with the pools and locks inherited as they were (the fix
    undone in the child), the same child waits forever on the first lock."""
    from pystrom import _pools

    path, _ = arrow_file
    _read(path)
    monkeypatch.setattr(_pools.SharedPool, "_after_fork", lambda self: None)
    monkeypatch.setattr(_pools.ForkSafeLock, "_after_fork", lambda self: None)
    lock = ranges._reads.get()._shutdown_lock
    lock.acquire()
    try:
        assert _in_child(lambda: _read(path), timeout=5) == "HANG"
    finally:
        lock.release()


def test_a_child_runs_what_it_hands_a_pool(arrow_file):
    """The parent's pool has no threads in the child: what the child hands a pool must still run (3,000
    pieces read as separate runs go to the reads' pool in two tasks, and the caller waits for them)."""
    path, _ = arrow_file
    _read(path)  # the parent's pool has its threads

    def many_pieces() -> str:
        offsets = np.arange(0, 3000 * 16, 16, dtype=np.int64)
        with open(path, "rb") as f:
            got = ranges.read_pieces(f.fileno(), offsets, np.full(3000, 8, dtype=np.int64), str(path), max_gap=0)
        return str(got.shape[0])

    assert _in_child(many_pieces) == str(3000 * 8)


def test_a_failing_task_returns_only_after_the_others(monkeypatch, tmp_path):
    """read_pieces' tasks write through raw addresses into its output: when one raises, the call must not
    return (and free the output) while another still writes (Executor.map raised at once)."""
    from pystrom import _core

    path = tmp_path / "p.bin"
    path.write_bytes(bytes(range(256)) * 200)
    real = _core.pread_runs
    finished = []

    def pread_runs(fd, offsets, sizes, addresses, first, max_call, got):
        if int(first[0]) == 0:
            raise OSError("the first task fails at once")
        time.sleep(0.5)
        real(fd, offsets, sizes, addresses, first, max_call, got)
        finished.append(True)

    monkeypatch.setattr(_core, "pread_runs", pread_runs)
    offsets = np.arange(0, 3000 * 16, 16, dtype=np.int64)
    with open(path, "rb") as f, pytest.raises(OSError, match="fails at once"):
        ranges.read_pieces(f.fileno(), offsets, np.full(3000, 8, dtype=np.int64), str(path), max_gap=0)
    assert finished  # the other task had finished before the error came out
