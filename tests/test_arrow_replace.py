"""write_arrow's final step (:mod:`pystrom.io.arrow.write.replace`): an existing file is swapped atomically
for the new one, readers holding the old file keep it, and what is not a regular file is treated as
``os.replace`` treats it. The old file is closed (freed) on a thread of its own, and a forked child never
keeps one alive; write_arrow in a forked child works (the statistics threads are the child's own)."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pyarrow as pa
import pyarrow.feather as feather
import pytest

import pystrom
from pystrom.io.arrow.write import replace


def test_over_an_existing_file_no_temporary_is_left_and_old_readers_keep_theirs(tmp_path):
    path = tmp_path / "t.arrow"
    pystrom.write_arrow(pa.table({"x": [1, 2, 3]}), path)
    held = open(path, "rb")  # a reader that opened the old file
    old = held.read()
    held.seek(0)
    pystrom.write_arrow(pa.table({"x": [4, 5]}), path)
    assert held.read() == old
    held.close()
    assert feather.read_table(path).column("x").to_pylist() == [4, 5]
    assert sorted(os.listdir(tmp_path)) == ["t.arrow"]


def test_the_exchange_is_used_where_the_kernel_has_it(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"new")
    b.write_bytes(b"old")
    err = replace._exchange(str(a), str(b))
    if err:
        pytest.skip(f"no RENAME_EXCHANGE here (errno {err}): os.replace is used")
    assert (a.read_bytes(), b.read_bytes()) == (b"old", b"new")


def test_a_reader_always_sees_a_whole_file(tmp_path):
    """Rewrite one path again and again while another thread reads it: never missing, never partial."""
    path = tmp_path / "t.arrow"
    tables = [pa.table({"x": list(range(n * 1000, n * 1000 + 5000))}) for n in range(2)]
    pystrom.write_arrow(tables[0], path)
    stop, seen, errors = threading.Event(), set(), []

    def read() -> None:
        while not stop.is_set():
            try:
                seen.add(pystrom.read_arrow(path, device="cpu").to_arrow().column("x")[0].as_py())
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for k in range(40):
            pystrom.write_arrow(tables[k % 2], path)
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[0]
    assert seen <= {0, 1000}


@pytest.mark.parametrize("kind", ["missing", "symlink", "directory"])
def test_what_is_not_a_regular_file_goes_through_os_replace(tmp_path, kind):
    dest = tmp_path / "dest"
    target = tmp_path / "target"
    target.write_bytes(b"target")
    if kind == "symlink":
        dest.symlink_to(target)
    elif kind == "directory":
        dest.mkdir()
    tmp = tmp_path / "tmp"
    tmp.write_bytes(b"new")
    if kind == "directory":
        with pytest.raises(IsADirectoryError):
            replace.replace_file(str(tmp), str(dest))
        assert dest.is_dir() and tmp.read_bytes() == b"new"
        return
    replace.replace_file(str(tmp), str(dest))
    assert dest.read_bytes() == b"new" and not dest.is_symlink()
    assert target.read_bytes() == b"target"  # a symlink is replaced, not written through


def _open_deleted(path) -> list[str]:
    """Descriptors of this process on a deleted file once named ``path``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(" (deleted)") and os.path.basename(str(path)) in target:
            found.append(target)
    return found


pytestmark_linux = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")


@pytestmark_linux
def test_the_old_file_is_closed_by_the_time_settle_returns(tmp_path):
    path = tmp_path / "t.arrow"
    for k in range(3):
        pystrom.write_arrow(pa.table({"x": list(range(k, 1000))}), path)
    replace.settle()
    assert _open_deleted(path) == []
    assert sorted(os.listdir(tmp_path)) == ["t.arrow"]


def _child_after_fork(path: str, out) -> None:
    """In the forked child: what it holds of old files, and whether write_arrow works there."""
    held = _open_deleted(path)
    pystrom.write_arrow(pa.table({"x": [7, 8, 9]}), path + ".child")
    out.put((held, feather.read_table(path + ".child").column("x").to_pylist()))


@pytestmark_linux
@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs fork")
def test_a_forked_child_keeps_no_old_file_and_writes(tmp_path, monkeypatch):
    """The old file is still open (its close held back) when the process forks: the child closes its copy.
    And the statistics threads of the parent's write are not the child's: a write there must not wait for them."""
    path = tmp_path / "t.arrow"
    pystrom.write_arrow(pa.table({"x": [1]}), path)  # the statistics pool now exists in this process
    gate = threading.Event()
    real = replace._close

    def held_back(fd: int) -> None:
        gate.wait(30)
        real(fd)

    monkeypatch.setattr(replace, "_close", held_back)
    pystrom.write_arrow(pa.table({"x": [2]}), path)
    assert len(_open_deleted(path)) == 1
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_after_fork, args=(str(path), out), daemon=True)
    fork = threading.Thread(target=child.start)
    fork.start()
    fork.join(0.5)
    gate.set()  # the fork waits for closes in progress: let this one go (the close is not taken yet, or is)
    fork.join(30)
    try:
        held, written = out.get(timeout=60)
        child.join(30)
    finally:
        if child.is_alive():  # a child that hangs (waiting for threads it does not have) fails, not stays
            child.kill()
    assert child.exitcode == 0
    assert held == [] and written == [7, 8, 9]
    replace.settle()
    assert _open_deleted(path) == []
