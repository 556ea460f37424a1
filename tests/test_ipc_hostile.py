"""Hostile peers of the sharing paths (issue 14, findings 4-8): forged handles, exporters that write
garbage into shared memory, store readers that try to change committed tables, a daemon run by another
user, descriptor exhaustion. Every case that could kill a process runs in a child process, so a
signal shows as a failed assertion instead of taking pytest down.

Tests that need a second user run as root (they create the user ``pystrom-peer`` with ``useradd``
when it is missing); elsewhere they are skipped with that reason.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pathlib
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pyarrow as pa
import pytest
from test_ipc import PRELUDE, child, ok
from test_store import Daemon

import pystrom
from pystrom.errors import InvalidHandleError, StoreError
from pystrom.ipc import handle as fmt
from pystrom.ipc import protocol

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes under other uids")


def run_child(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A child whose death by a signal is reported, not raised."""
    return child(code, timeout=timeout)


def survived(result: subprocess.CompletedProcess) -> str:
    assert result.returncode >= 0, (
        f"child killed by {signal.Signals(-result.returncode).name}:\n{result.stdout}\n{result.stderr[-3000:]}"
    )
    return ok(result)


# -- finding 4: offsets inside buffers ------------------------------------------------------------


def import_and_report(handle: str) -> str:
    """Child-script lines importing ``handle`` and printing what happened (the tests read the line)."""
    return (
        f"try:\n    v = pystrom.ipc_import({handle})\n    print('imported', len(v.to_pandas()))\n"
        "except pystrom.Error as e:\n    print(type(e).__name__, e)\n"
    )


def exporter_writes(table: str, column: str, row: int, value: int) -> str:
    """A child script that exports ``table``, then writes ``value`` into offset ``row`` of ``column`` in
    its own memory (after the handle was made) and imports the handle."""
    return (
        f"t = pystrom.Table.from_arrow({table}, device='cpu')\nh = t.export()\n"
        f"t.column({column!r}).offsets[{row}] = {value}  # the exporter's own memory, written after export\n"
        + import_and_report("h")
    )


FORGE = """
import copy, dataclasses
from pystrom.ipc import handle as fmt
n = 1000
src = pa.table({"i": pa.array([0] + [2**30] * (n - 1), pa.int32()), "s": pa.array([str(k) for k in range(n)])})
t = pystrom.Table.from_arrow(src, device="cpu")
h = fmt.decode(t.export())
cols = copy.deepcopy(h.layout.columns)
start = cols[0]["values"][0]
cols[1]["values"] = [start, (n + 1) * 4]  # the string column's offsets now read the int32 column
forged = fmt.encode(dataclasses.replace(h, layout=fmt.TableLayout(h.layout.nbytes, n, cols, h.layout.schema)))
""" + import_and_report("forged")


def test_forged_offsets_are_refused_at_import():
    out = survived(run_child(FORGE))
    assert out.startswith("InvalidHandleError") and "column 's'" in out and "offsets" in out, out


FORGE_CHILD = """
import copy, dataclasses
from pystrom.ipc import handle as fmt
n = 1000
big = pa.array([0] + [2**30] * (n - 1), pa.int64())  # 8n bytes: as long as the elements' 2n + 1 offsets, nearly
src = pa.table({"i": big, "tags": pa.array([[str(k), "x"] for k in range(n)])})
t = pystrom.Table.from_arrow(src, device="cpu")
h = fmt.decode(t.export())
cols = copy.deepcopy(h.layout.columns)
elements = cols[1]["children"][0]
elements["values"] = [cols[0]["values"][0], elements["values"][1]]  # the elements' string offsets read column i
forged = fmt.encode(dataclasses.replace(h, layout=fmt.TableLayout(h.layout.nbytes, n, cols, h.layout.schema)))
""" + import_and_report("forged")


def test_forged_child_offsets_are_refused_at_import():
    out = survived(run_child(FORGE_CHILD))
    assert out.startswith("InvalidHandleError") and "column 'tags' (elements)" in out and "offsets" in out, out


@pytest.mark.parametrize("row,value", [(1, 2**30), (7, -5), (0, -(2**24)), (3, 1), (1000, 2**20)])
def test_an_exporter_writing_a_bad_offset_after_export_does_not_crash_the_importer(row, value):
    out = survived(run_child(exporter_writes('pa.table({"s": ["a", "bb", "ccc", None] * 250})', "s", row, value)))
    assert out.startswith("InvalidHandleError") and "column 's'" in out, out


GARBAGE_COMMIT = """
from pystrom.ipc.handle import TableLayout
path = {path!r}
with pystrom.Store(path) as s:
    t = pystrom.Table.from_arrow(pa.table({{"s": ["x", "yy", "zzz"] * 100}}), device="cpu")
    res = s.reserve("bad", t._live().nbytes)
    from pystrom.ipc.client import _copy_block
    _copy_block(t._live(), res.block)
    import numpy as np
    off = t.column("s")._plan.values.offset
    res.block.array(off, np.int32, (301,))[5] = 2**30  # garbage offsets committed by a hostile writer
    try:
        res.commit(layout=TableLayout.of(t))
        print("committed")
    except pystrom.Error as e:
        print("commit refused:", type(e).__name__, e)
    res.abort()
"""

READER = """
with pystrom.Store({path!r}) as s:
    try:
        v = s.get("bad")
        print("read", len(v.to_pandas()))
    except pystrom.Error as e:
        print(type(e).__name__, e)
"""


def test_garbage_offsets_committed_to_the_store_crash_no_reader(tmp_path):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    try:
        out = survived(run_child(GARBAGE_COMMIT.format(path=d.path)))
        assert out.startswith("commit refused: InvalidHandleError") and "column 's'" in out, out
        out = survived(run_child(READER.format(path=d.path)))
        assert out.startswith("TableNotFoundError"), out
    finally:
        assert d.stop() == 0


# -- finding 5: committed tables are immutable -------------------------------------------------------

TAMPER = """
import fcntl, mmap
from pystrom.ipc import protocol
with pystrom.Store({path!r}) as s:
    s.put("t", pystrom.Table.from_arrow(pa.table({{"x": np.arange(1000)}}), device="cpu"))
raw = protocol.connect({path!r})
protocol.send(raw, {{"op": "get", "name": "t"}})
reply, fds = protocol.recv(raw)
fd = fds[0]
size = reply["memory"]["size"]
results = {{"mode": "O_RDONLY" if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY else "writable"}}
for what, attempt in [
    ("mmap-write", lambda: mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)),
    ("reopen-write", lambda: os.pwrite(os.open(f"/proc/self/fd/{{fd}}", os.O_RDWR), b"\\xff" * 8, 0)),
    ("truncate", lambda: os.ftruncate(os.open(f"/proc/self/fd/{{fd}}", os.O_RDWR), 0)),
]:
    try:
        attempt()
        results[what] = "done"
    except OSError as e:
        results[what] = "refused"
print(results)
with pystrom.Store({path!r}) as s:
    print("sum", int(s.get("t")["x"].sum()))
"""


def test_store_readers_cannot_change_or_shrink_a_committed_table(tmp_path):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    try:
        out = survived(run_child(TAMPER.format(path=d.path)))
        assert "'mode': 'O_RDONLY'" in out, out
        assert "'mmap-write': 'refused'" in out and "'reopen-write': 'refused'" in out, out
        assert "'truncate': 'refused'" in out, out
        assert f"sum {sum(range(1000))}" in out, out
    finally:
        assert d.stop() == 0


def test_the_writer_of_a_committed_table_cannot_change_it_either(tmp_path):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    code = """
        import mmap
        with pystrom.Store({path!r}) as s:
            t = pystrom.Table.from_arrow(pa.table({{"x": np.arange(100)}}), device="cpu")
            res = s.reserve("t", t._live().nbytes)
            from pystrom.ipc.client import _copy_block
            from pystrom.ipc.handle import TableLayout
            _copy_block(t._live(), res.block)
            res.commit(layout=TableLayout.of(t))
            print("writable after commit:", res.block.array(0, np.uint8, (8,)).flags.writeable)
            print("sum", int(s.get("t")["x"].sum()))
        """
    try:
        out = survived(run_child(code.format(path=d.path)))
        assert "writable after commit: False" in out and f"sum {sum(range(100))}" in out, out
    finally:
        assert d.stop() == 0


# -- finding 6: the client checks whom it talks to -------------------------------------------------------


def _as_user(uid: int) -> str:
    """Code that a root child runs to become ``uid`` (everything it needs is imported first)."""
    return f"""
import pystrom.ipc.server, pystrom.ipc.client, pystrom.ipc.export, pyarrow.ipc, json, socket, array
os.setgroups([]); os.setgid({uid}); os.setuid({uid})
"""


def _daemon_as(uid: int, path: str) -> subprocess.Popen:
    code = (
        PRELUDE
        + _as_user(uid)
        + textwrap.dedent(f"""
        from pystrom.ipc.server import serve, _announce
        serve({path!r}, "cpu", allow_uids=[0], ready=_announce)  # the attacker lets the victim in
        """)
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise AssertionError(f"daemon as uid {uid} did not start: {line}{proc.stderr.read()}")
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdout.close()
        proc.stderr.close()


PUT = """
try:
    with pystrom.Store({path!r}) as s:
        s.put("secret", pystrom.Table.from_arrow(pa.table({{"x": [42]}}), device="cpu"))
        print("put done")
except pystrom.Error as e:
    print(type(e).__name__, e)
"""


@needs_root
def test_the_client_refuses_a_socket_directory_of_another_user():
    top = pathlib.Path(tempfile.mkdtemp(prefix="pystrom-peer-"))
    top.chmod(0o755)
    run = top / "run"
    run.mkdir(mode=0o700)
    os.chown(run, NOBODY, NOBODY)  # another user made the directory first
    proc = _daemon_as(NOBODY, str(run / "store.sock"))
    try:
        out = survived(run_child(PUT.format(path=str(run / "store.sock"))))
        assert out.startswith("StorePermissionError") and f"uid {NOBODY}" in out and "directory" in out, out
    finally:
        _stop(proc)
        shutil.rmtree(top)


@needs_root
def test_the_client_refuses_a_daemon_of_another_user():
    top = pathlib.Path(tempfile.mkdtemp(prefix="pystrom-peer-"))
    top.chmod(0o755)
    run = top / "run"
    run.mkdir(mode=0o700)
    os.chown(run, NOBODY, NOBODY)
    proc = _daemon_as(NOBODY, str(run / "store.sock"))
    try:
        os.chown(run, 0, 0)  # the directory is ours now, but the daemon listening in it is not
        out = survived(run_child(PUT.format(path=str(run / "store.sock"))))
        assert out.startswith("StorePermissionError") and f"uid {NOBODY}" in out and "daemon" in out, out
        trusted = PUT.replace("pystrom.Store({path!r})", f"pystrom.Store({{path!r}}, trust_uids=[{NOBODY}])")
        out = survived(run_child(trusted.format(path=str(run / "store.sock"))))
        assert out.strip() == "put done", out
    finally:
        _stop(proc)
        shutil.rmtree(top)


@needs_root
def test_the_client_refuses_a_group_or_world_writable_socket_directory(tmp_path):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    try:
        (tmp_path / "run").chmod(0o777)
        out = survived(run_child(PUT.format(path=d.path)))
        assert out.startswith("StorePermissionError") and "mode 0777: other users may write it" in out, out
        (tmp_path / "run").chmod(0o700)
        assert survived(run_child(PUT.format(path=d.path))).strip() == "put done"
    finally:
        assert d.stop() == 0


def _peer_user() -> int:
    """The uid of ``pystrom-peer``, created when missing (root only)."""
    try:
        return pwd.getpwnam("pystrom-peer").pw_uid
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "pystrom-peer"], check=True, capture_output=True)
        return pwd.getpwnam("pystrom-peer").pw_uid


@needs_root
def test_a_user_without_runtime_dir_does_not_hand_tables_to_whoever_made_its_tmp_directory():
    victim = _peer_user()
    squatted = pathlib.Path(f"/tmp/pystrom-{victim}")
    if squatted.exists():
        shutil.rmtree(squatted)
    squatted.mkdir(mode=0o700)
    os.chown(squatted, NOBODY, NOBODY)  # the attacker made the victim's default directory first
    proc = _daemon_as(NOBODY, str(squatted / "store.sock"))
    try:
        code = _as_user(victim) + textwrap.dedent("""
            os.environ.pop("XDG_RUNTIME_DIR", None); os.environ.pop("PYSTROM_STORE_SOCKET", None)
            try:
                with pystrom.Store() as s:
                    s.put("secret", pystrom.Table.from_arrow(pa.table({"x": [42]}), device="cpu"))
                    print("put done")
            except pystrom.Error as e:
                print(type(e).__name__, e)
            """)
        out = survived(run_child(code))
        assert out.startswith("StorePermissionError") and str(squatted) in out, out
    finally:
        _stop(proc)
        shutil.rmtree(squatted, ignore_errors=True)


# -- finding 7: descriptor exhaustion --------------------------------------------------------------------


def store_when_free(d: Daemon, timeout: float = 20.0) -> pystrom.Store:
    """A new Store, once the daemon has seen closed connections go (it notices them asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return d.store()
        except StoreError as exc:
            assert "too many connections" in str(exc) and time.monotonic() < deadline, exc
            time.sleep(0.05)


def _low_limit_daemon(path: str, limit: int, *extra: str) -> Daemon:
    """A daemon whose hard descriptor limit is ``limit`` (set before it starts)."""
    d = Daemon.__new__(Daemon)
    prlimit = ["prlimit", f"--nofile={limit // 4}:{limit}", "--"]  # a low soft limit, which the daemon raises
    argv = [*prlimit, sys.executable, "-m", "pystrom", "serve", "--device", "cpu", "--socket", path, *extra]
    d.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = d.proc.stdout.readline()
    assert "serving" in line, line + d.proc.stderr.read()
    d.path, d.banner = path, line
    return d


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")
def test_a_flood_of_idle_connections_does_not_stop_the_daemon(tmp_path):
    d = _low_limit_daemon(str(tmp_path / "run" / "s.sock"), 256)
    socks = []
    try:
        with d.store() as s:
            s.put("kept", pystrom.Table.from_arrow(pa.table({"x": [1, 2, 3]}), device="cpu"))
            refused = 0
            for _ in range(400):  # more than the daemon's hard limit
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                socks.append(c)
                c.settimeout(10)
                for _ in range(200):  # a full backlog answers EAGAIN until the daemon accepts again
                    try:
                        c.connect(d.path)
                        break
                    except BlockingIOError:
                        time.sleep(0.01)
                else:
                    raise AssertionError("the daemon stopped accepting connections")
            for c in socks:  # every connection is either served or told why not
                try:
                    protocol.send(c, {"op": "hello"})
                except BrokenPipeError:  # refused and closed by the daemon: its error reply is still there
                    pass
                try:
                    reply, _ = protocol.recv(c)
                except (EOFError, ConnectionError, OSError):
                    reply = {"ok": False, "message": "(reset)"}
                if not reply.get("ok"):
                    refused += 1
                    assert "connections" in reply.get("message", ""), reply
            assert refused > 0
            assert d.proc.poll() is None, "the daemon exited"
            assert s.get("kept")["x"].tolist() == [1, 2, 3]  # an existing client is still served
        for c in socks:
            c.close()
        with store_when_free(d) as s:  # and new clients are once the flood is gone
            assert s.get("kept")["x"].tolist() == [1, 2, 3]
            s.drop("kept")
    finally:
        for c in socks:
            c.close()
        assert d.stop() == 0


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")
def test_a_store_of_more_tables_than_descriptors_refuses_the_put_and_keeps_the_others(tmp_path):
    d = _low_limit_daemon(str(tmp_path / "run" / "s.sock"), 128)
    try:
        with d.store() as s:
            t = pystrom.Table.from_arrow(pa.table({"x": [7]}), device="cpu")
            stored = 0
            with pytest.raises(StoreError, match="descriptor"):
                for k in range(200):
                    s.put(f"t{k}", t)
                    stored += 1
            assert 32 < stored < 128
            assert d.proc.poll() is None
        with d.store() as s:  # a new connection still works, and every table is there
            assert len(s.list()) == stored
            assert s.get(f"t{stored - 1}")["x"].tolist() == [7]
            for k in range(stored):
                s.drop(f"t{k}")
    finally:
        assert d.stop() == 0


# -- finding 8: the smaller ones ------------------------------------------------------------------------------


@pytest.fixture
def strings_handle():
    t = pystrom.Table.from_arrow(pa.table({"a": [1, 2, 3], "s": ["x", None, "zz"]}), device="cpu")
    yield t.export()
    t.close()


def _with_body(h: bytes, body: bytes) -> bytes:
    import struct
    import zlib

    d = fmt.decode(h)
    head = list(fmt._HEADER.unpack_from(h))
    head[4] = len(body)
    raw = fmt._HEADER.pack(*head) + d.memory + body + d.layout.schema
    return raw + struct.pack("<I", zlib.crc32(raw))


def _with_column(h: bytes, index: int, **changes) -> bytes:
    d = fmt.decode(h)
    cols = copy.deepcopy(d.layout.columns)
    cols[index].update(changes)
    layout = fmt.TableLayout(d.layout.nbytes, d.layout.num_rows, cols, d.layout.schema)
    return fmt.encode(dataclasses.replace(d, layout=layout))


def test_a_deeply_nested_layout_is_an_invalid_handle(strings_handle):
    for depth in (100, 100_000):
        body = b'{"nbytes":64,"num_rows":3,"columns":' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(InvalidHandleError, match="nest|layout"):
            pystrom.ipc_import(_with_body(strings_handle, body))


def test_an_uncounted_null_count_is_counted(strings_handle):
    h = _with_column(strings_handle, 0, nulls=-1)  # column 'a' has no bitmap
    assert pystrom.ipc_import(h).column("a").null_count == 0
    h = _with_column(strings_handle, 1, nulls=0)  # a lie: the bitmap says one NULL
    v = pystrom.ipc_import(h)
    assert v.column("s").null_count == 1
    assert v.to_arrow().column("s").to_pylist() == ["x", None, "zz"]


def test_the_memfd_name_must_match_exactly(strings_handle):
    d = fmt.decode(strings_handle)
    name = d.memory[4:]
    for forged in (name[:-3], name[:8]):  # a prefix of the real name
        h = fmt.encode(dataclasses.replace(d, memory=d.memory[:4] + forged))
        with pytest.raises(pystrom.Error, match="no longer holds|name"):
            pystrom.ipc_import(h)


def test_a_cached_mapping_does_not_skip_the_checks(strings_handle):
    d = fmt.decode(strings_handle)
    held = pystrom.ipc_import(strings_handle)  # the mapping is now cached
    with pytest.raises(pystrom.Error, match="holds .* bytes"):
        pystrom.ipc_import(fmt.encode(dataclasses.replace(d, alloc_size=d.alloc_size + 4096)))
    with pytest.raises(pystrom.ExporterGoneError):
        pystrom.ipc_import(fmt.encode(dataclasses.replace(d, pid_start=d.pid_start + 1)))
    other = os.open(os.devnull, os.O_RDONLY)  # a descriptor of the exporter that is not the table's memory
    try:
        with pytest.raises(pystrom.ExporterGoneError, match="no longer holds"):
            pystrom.ipc_import(fmt.encode(dataclasses.replace(d, memory=other.to_bytes(4, "little") + d.memory[4:])))
    finally:
        os.close(other)
    del held


@needs_root
def test_allow_uids_lets_the_user_in_without_changing_modes_by_hand():
    top = pathlib.Path(tempfile.mkdtemp(prefix="pystrom-allow-"))
    top.chmod(0o755)
    path = str(top / "run" / "s.sock")
    d = Daemon(path, "cpu", "--allow-uids", str(NOBODY))
    try:
        assert stat.S_IMODE(os.stat(top / "run").st_mode) & 0o022 == 0  # nobody can write the directory
        code = _as_user(NOBODY) + textwrap.dedent(f"""
            try:
                with pystrom.Store({path!r}, trust_uids=[0]) as s:
                    print(s.list())
            except pystrom.Error as e:
                print(type(e).__name__, e)
            """)
        out = survived(run_child(code))
        assert out.strip() == "[]", out
        code = _as_user(NOBODY + 1 if NOBODY + 1 < 65536 else 1) + textwrap.dedent(f"""
            try:
                with pystrom.Store({path!r}, trust_uids=[0]) as s:
                    print(s.list())
            except pystrom.Error as e:
                print(type(e).__name__, e)
            """)
        out = survived(run_child(code))
        assert out.startswith("StorePermissionError") and "not allowed" in out, out
    finally:
        assert d.stop() == 0
        shutil.rmtree(top)


def test_connections_beyond_the_per_user_cap_are_refused_and_the_others_served(tmp_path):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu", "--max-connections", "3")
    stores = []
    try:
        stores = [d.store() for _ in range(3)]
        stores[0].put("t", pystrom.Table.from_arrow(pa.table({"x": [5]}), device="cpu"))
        with pytest.raises(StoreError, match="too many connections from uid .*at most 3 per user"):
            d.store()
        assert [s.get("t")["x"].tolist() for s in stores] == [[5]] * 3
        stores.pop().close()
        with store_when_free(d) as s:  # a slot is free again
            assert s.stats()["max_connections_per_uid"] == 3
            s.drop("t")
    finally:
        for s in stores:
            s.close()
        assert d.stop() == 0
