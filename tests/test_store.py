"""The store daemon with real processes: a daemon started as `python -m pystrom serve`, clients spawned."""

from __future__ import annotations

import gc
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest
from test_ipc import PRELUDE, all_types_table, child, ok

import pystrom
from pystrom.errors import (
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
    TableExistsError,
    TableNotFoundError,
)
from pystrom.ipc import protocol


class Daemon:
    """``pystrom serve`` in a subprocess (on ``path``, or the default socket when empty), stopped with SIGTERM."""

    def __init__(self, path: str, device: str, *extra: str, env: dict | None = None):
        self.path = path
        argv = [sys.executable, "-m", "pystrom", "serve", "--device", device, *extra]
        if path:
            argv += ["--socket", path]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )
        line = self.proc.stdout.readline()
        if "serving" not in line:
            self.proc.kill()
            raise AssertionError(f"daemon did not start: {line}{self.proc.stderr.read()}")
        self.banner = line
        self.path = line.rsplit(" on ", 1)[1].strip()

    def store(self) -> pystrom.Store:
        return pystrom.Store(self.path)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.proc.kill()
            self.proc.stdout.close()
            self.proc.stderr.close()


@pytest.fixture
def daemon(device, tmp_path):
    d = Daemon(str(tmp_path / "run" / "store.sock"), device)
    yield d
    with d.store() as s:  # every test leaves the daemon without allocations once its clients are gone
        for t in s.list():
            s.drop(t["name"])
        gc.collect()
        s.stats()  # flushes releases of views collected just now
        stats = wait_for(s, lambda st: st["allocations"] == 0)
        assert stats["allocated_bytes"] == 0, stats
    assert d.stop() == 0


def wait_for(store: pystrom.Store, predicate, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = store.stats()
        if predicate(stats) or time.monotonic() > deadline:
            assert predicate(stats), stats
            return stats
        time.sleep(0.05)


def test_put_get_list_drop_stats(daemon, device):
    source = all_types_table(500)
    t = pystrom.Table.from_arrow(source, device=device)
    with daemon.store() as s:
        assert s.device == pystrom.memory.backend.resolve_device(device).device
        s.put("all", t)
        s.put("view", t.slice(7, 100).select(["string", "float64"]))
        names = {x["name"]: x for x in s.list()}
        assert set(names) == {"all", "view"}
        assert names["all"]["num_rows"] == 500 and names["all"]["schema"].equals(source.schema)
        g = s.get("all")
        assert g.to_arrow().equals(source)
        assert s.get("view").to_arrow().equals(source.slice(7, 100).select(["string", "float64"]))
        stats = s.stats()
        assert stats["tables"] == 2 and stats["pending_puts"] == 0 and stats["clients"] >= 1
        with pytest.raises(TableExistsError, match="'all'"):
            s.put("all", t)
        s.put("all", t.slice(0, 3), replace=True)
        assert s.get("all").num_rows == 3
        assert g.to_arrow().equals(source)  # the replaced table stays valid for its reader
        s.drop("view")
        with pytest.raises(TableNotFoundError, match="'view'"):
            s.get("view")
        with pytest.raises(TableNotFoundError):
            s.drop("view")
        with pytest.raises(StoreError, match="table name"):
            s.put("", t)


def test_put_arrow_loads_straight_into_daemon_memory(daemon):
    source = all_types_table(200)
    with daemon.store() as s:
        s.put_arrow("arrow", source)
        assert s.get("arrow").to_arrow().equals(source)
        before = s.stats()["allocations"]
        with pytest.raises(pystrom.UnsupportedTypeError):
            s.put_arrow("bad", pa.table({"m": pa.array([[("k", 1)]], pa.map_(pa.utf8(), pa.int8()))}))
        assert s.stats()["allocations"] == before  # nothing reserved by the failed load
        nested = pa.table({"l": pa.array([["a"], None, ["b", None]]), "s": pa.array([{"x": 1, "y": "z"}, None, {}])})
        s.put_arrow("nested", nested)  # structs and lists of strings: their child columns committed and checked
        assert s.get("nested").to_arrow().equals(nested)


def test_get_in_another_process_and_deferred_free_on_drop(daemon, device):
    t = pystrom.Table.from_arrays({"x": np.arange(100_000, dtype=np.int64)}, device=device)
    expected = int(np.arange(100_000).sum())
    code = f"""
        s = pystrom.Store({daemon.path!r})
        v = s.get("t")
        print(int(v["x"].sum()), flush=True)
        sys.stdin.readline()  # the table is dropped meanwhile
        print(int(v["x"].sum()), flush=True)
        """
    with daemon.store() as s:
        s.put("t", t)
        proc = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert int(proc.stdout.readline()) == expected
            s.drop("t")
            assert "t" not in {x["name"] for x in s.list()}
            stats = s.stats()
            assert stats["dropped_in_use"] == 1 and stats["tables"] == 0, stats
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert int(proc.stdout.readline()) == expected  # still the same bytes after the drop
            proc.wait(timeout=60)
        finally:
            proc.kill()
        stats = wait_for(s, lambda st: st["allocations"] == 0)
        assert stats["dropped_in_use"] == 0


def test_views_going_away_give_the_hold_back(daemon, device):
    with daemon.store() as s:
        s.put("t", pystrom.Table.from_arrays({"x": [1.0, 2.0]}, device=device))
        a, b = s.get("t"), s.get("t")  # one mapping, two holds
        s.drop("t")
        del a
        gc.collect()
        assert s.stats()["dropped_in_use"] == 1  # b still uses it
        assert b.to_arrow().column("x").to_pylist() == [1.0, 2.0]
        del b
        gc.collect()
        assert s.stats()["allocations"] == 0


def test_a_client_killed_mid_put_leaves_nothing(daemon, device):
    code = f"""
        s = pystrom.Store({daemon.path!r})
        r = s.reserve("half", 1 << 20)
        r.block.write_host(0, np.ones(1 << 19, dtype=np.uint8))  # half written
        print("reserved", flush=True)
        import time; time.sleep(600)
        """
    with daemon.store() as s:
        proc = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout.readline().strip() == "reserved"
            stats = s.stats()
            assert stats["pending_puts"] == 1 and stats["allocated_bytes"] >= 1 << 20
            assert s.list() == []
            with pytest.raises(TableNotFoundError):
                s.get("half")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            proc.kill()
        stats = wait_for(s, lambda st: st["allocations"] == 0 and st["pending_puts"] == 0)
        assert s.list() == []
        s.put("after", pystrom.Table.from_arrays({"x": [1]}, device=device))  # the daemon lives on
        assert s.get("after").num_rows == 1


def test_uncommitted_reservation_is_given_back(daemon, device):
    with daemon.store() as s:
        with s.reserve("r", 4096) as r:
            assert r.nbytes == 4096
        assert s.stats()["pending_puts"] == 0
        with pytest.raises(StoreError, match="built in this reservation"):
            with s.reserve("r", 4096) as r:
                r.commit(pystrom.Table.from_arrays({"x": [1]}, device=device))
        assert s.list() == []


def test_clear_error_when_the_daemon_is_gone(device, tmp_path):
    d = Daemon(str(tmp_path / "s.sock"), device)
    s = d.store()
    s.put("t", pystrom.Table.from_arrays({"x": [1]}, device=device))
    assert d.stop() == 0
    with pytest.raises(StoreUnavailableError, match="went away"):
        s.list()
    with pytest.raises(StoreUnavailableError, match="is closed"):
        s.stats()
    with pytest.raises(StoreUnavailableError, match="no pystrom store daemon answers"):
        pystrom.Store(d.path)
    assert not os.path.exists(d.path)


def test_default_socket_is_in_a_private_directory(tmp_path):
    runtime = tmp_path / "xdg"
    runtime.mkdir()
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    d = Daemon("", "cpu", env=env)
    try:
        assert d.path == str(runtime / "pystrom" / "store.sock")
        assert stat.S_IMODE(os.stat(runtime / "pystrom").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(d.path).st_mode) & 0o077 == 0
        ok(child(f"os.environ['XDG_RUNTIME_DIR'] = {str(runtime)!r}; print(pystrom.Store().list())"))
    finally:
        assert d.stop() == 0
    (runtime / "pystrom").chmod(0o755)
    with pytest.raises(StorePermissionError, match="must be 0700"):
        protocol.secure_dir(str(runtime / "pystrom"))


def test_second_daemon_on_the_same_socket_is_refused(tmp_path):
    d = Daemon(str(tmp_path / "s.sock"), "cpu")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pystrom", "serve", "--device", "cpu", "--socket", d.path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and "already serves" in r.stderr and r.stderr.count("\n") == 1
    finally:
        assert d.stop() == 0


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client under another uid")
def test_another_users_process_is_refused(tmp_path_factory):
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="pystrom-uid-test-"))  # outside pytest's 0700 directory
    run = tmp_path / "run"
    d = Daemon(str(run / "s.sock"), "cpu")
    allowed = Daemon(str(tmp_path / "run2" / "s.sock"), "cpu", "--allow-uids", str(NOBODY))
    code = """
        from pystrom.ipc.client import Store
        os.setgid({uid}); os.setuid({uid})
        try:
            print(Store({path!r}, trust_uids=[0]).list())
        except pystrom.Error as e:
            print(type(e).__name__, e)
        """
    try:
        # the default layout: the 0700 directory stops the other user before the socket
        out = ok(child(code.format(uid=NOBODY, path=d.path)))
        assert out.startswith("StorePermissionError") and "another user" in out
        # reachable socket: the daemon itself refuses after checking SO_PEERCRED
        for p in (tmp_path, run, tmp_path / "run2"):
            p.chmod(0o755)
        os.chmod(d.path, 0o666)
        os.chmod(allowed.path, 0o666)
        out = ok(child(code.format(uid=NOBODY, path=d.path)))
        assert out.startswith("StorePermissionError") and f"uid {NOBODY} is not allowed" in out
        out = ok(child(code.format(uid=NOBODY, path=allowed.path)))
        assert out.strip() == "[]"  # on the allow-list
    finally:
        assert d.stop() == 0 and allowed.stop() == 0
        shutil.rmtree(tmp_path)


def test_serve_command_line_errors():
    r = subprocess.run(
        [sys.executable, "-m", "pystrom", "serve", "--device", "nonsense"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "nonsense" in r.stderr and r.stderr.count("\n") == 1
    r = subprocess.run(
        [sys.executable, "-m", "pystrom", "serve", "--memory", "magic"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "magic" in r.stderr


def test_a_hostile_client_cannot_break_the_daemon(daemon):
    import socket as so

    with daemon.store() as s:
        raw = so.socket(so.AF_UNIX, so.SOCK_STREAM)
        raw.connect(daemon.path)
        raw.sendall(b"\xff\xff\xff\x7f garbage")  # absurd length
        raw.close()
        raw = so.socket(so.AF_UNIX, so.SOCK_STREAM)
        raw.connect(daemon.path)
        protocol.send(raw, {"op": "commit", "id": 1, "layout": {"columns": "x"}, "schema": "!!"})
        reply, _ = protocol.recv(raw)
        assert not reply["ok"] and reply["error"] == "StoreError"
        protocol.send(raw, {"op": "reserve", "name": "x", "nbytes": -5})
        reply, _ = protocol.recv(raw)
        assert not reply["ok"] and "positive integer" in reply["message"]
        protocol.send(raw, {"op": "reserve", "name": "x", "nbytes": 128})
        reply, fds = protocol.recv(raw)
        for fd in fds:
            os.close(fd)
        protocol.send(raw, {"op": "commit", "id": reply["id"], "layout": {"nbytes": 1 << 30, "num_rows": 0,
                                                                          "columns": []}, "schema": ""})  # fmt: skip
        reply, _ = protocol.recv(raw)
        assert not reply["ok"] and reply["error"] in ("InvalidHandleError", "StoreError")
        protocol.send(raw, {"op": "launch_missiles"})
        reply, _ = protocol.recv(raw)
        assert not reply["ok"] and "unknown request" in reply["message"]
        raw.close()
        assert s.list() == []
