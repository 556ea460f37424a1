"""write_arrow's final step (:mod:`pystrom.io.arrow.write.replace`): an existing file is swapped atomically
for the new one, readers holding the old file keep it, and what is not a regular file is treated as
``os.replace`` treats it."""

from __future__ import annotations

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
