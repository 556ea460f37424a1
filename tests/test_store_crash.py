"""The store daemon with a crowd at the door and a crash (issue 36, items 5-6).

A crowd: many clients connecting at once queue in the listen backlog (the system's largest), and a
client that still finds it full, or finds nobody listening yet, tries again with backoff before it
gives up with StoreUnavailableError. A crash: SIGKILL loses every table; each client learns it at its
next request (at once, not after a timeout), and views already mapped keep their bytes.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from test_ipc import PRELUDE
from test_store import Daemon

import pystrom
from pystrom.errors import StoreUnavailableError
from pystrom.ipc import protocol

CROWD = 500


def test_a_crowd_of_clients_connecting_at_once_all_get_in(tmp_path):
    """Finding 6 of issue 36: of 500 threads calling pystrom.Store(sock) at once, 20-226 got
    "cannot connect ... [Errno 11]" (listen backlog 128, no retry in the client)."""
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    code = f"""
        import threading
        start = threading.Barrier({CROWD})
        stores, failures, lock = [], [], threading.Lock()

        def connect():
            start.wait()
            try:
                s = pystrom.Store({d.path!r})
                with lock:
                    stores.append(s)
            except Exception as e:
                with lock:
                    failures.append(f"{{type(e).__name__}}: {{e}}")

        threads = [threading.Thread(target=connect) for _ in range({CROWD})]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(stores), len(failures), failures[:3])
        """
    try:
        r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[:2] == [str(CROWD), "0"], r.stdout
        with d.store() as s:  # and the daemon is intact
            s.put("t", pystrom.Table.from_arrays({"x": [1, 2]}, device="cpu"))
            assert s.get("t")["x"].tolist() == [1, 2]
            s.drop("t")
    finally:
        assert d.stop() == 0


def test_the_daemon_listens_with_the_systems_largest_backlog():
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            system = int(f.read())
    except OSError:
        pytest.skip("no /proc/sys/net/core/somaxconn")
    assert protocol.listen_backlog() == max(system, socket.SOMAXCONN)


@contextlib.contextmanager
def _full_listener(path: str):
    """A socket listening at ``path`` whose backlog is full (nothing accepts): connects get EAGAIN.
    Yields (listener, the connections that fill its backlog); closes them all on exit."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    queued = []
    try:
        while True:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(path)
            except BlockingIOError:
                c.close()
                break
            queued.append(c)
        yield listener, queued
    finally:
        for c in queued:
            c.close()
        listener.close()


def test_a_full_backlog_is_tried_again_until_there_is_room(tmp_path):
    path = str(tmp_path / "s.sock")
    got: list = []
    with _full_listener(path) as (listener, queued):
        thread = threading.Thread(target=lambda: got.append(protocol.connect(path, timeout=10, retry=10)))
        thread.start()
        time.sleep(0.5)  # the client is refused with EAGAIN meanwhile, and tries again
        assert not got and thread.is_alive()
        accepted = [listener.accept()[0] for _ in range(len(queued) + 1)]  # room again: the client gets in
        thread.join(timeout=10)
        assert len(got) == 1 and got[0].fileno() >= 0
        got[0].close()
        for c in accepted:
            c.close()


def test_a_full_backlog_that_stays_full_is_store_unavailable(tmp_path):
    path = str(tmp_path / "s.sock")
    with _full_listener(path):
        start = time.monotonic()
        with pystrom.defaults.set(store_connect_retry=0.5):
            with pytest.raises(StoreUnavailableError, match="listen backlog stayed full for 0.[45] s"):
                pystrom.Store(path)
        assert 0.4 < time.monotonic() - start < 5


def test_nobody_listening_is_tried_again_then_store_unavailable(tmp_path):
    path = str(tmp_path / "s.sock")
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(path)  # the socket file of a daemon that is starting (or died): connect gets ECONNREFUSED
    try:
        with pystrom.defaults.set(store_connect_retry=0.3):
            with pytest.raises(StoreUnavailableError, match="connection refused for 0.[23] s"):
                pystrom.Store(path)
        got: list = []
        thread = threading.Thread(target=lambda: got.append(protocol.connect(path, timeout=10, retry=10)))
        thread.start()
        time.sleep(0.3)
        bound.listen(16)  # the daemon is up: the waiting client gets in
        thread.join(timeout=10)
        assert len(got) == 1
        got[0].close()
    finally:
        bound.close()


# -- item 6: a crash --------------------------------------------------------------------------------------

CLIENT = """
import sys, time
s = pystrom.Store({path!r})
v = s.get("t")
expected = int(v["x"].sum())
print("ready", flush=True)
sys.stdin.readline()  # the daemon is killed meanwhile
start = time.monotonic()
try:
    s.list()
    print("no error")
except pystrom.StoreUnavailableError as e:
    print(f"unavailable {{time.monotonic() - start:.3f}} {{e}}")
print("view", int(v["x"].sum()) == expected, v.to_arrow().column("x").to_pylist()[:3], flush=True)
"""


def test_a_killed_daemon_is_unavailable_to_every_client_at_once_and_views_keep_their_bytes(tmp_path, device):
    d = Daemon(str(tmp_path / "run" / "s.sock"), device)
    clients: list[subprocess.Popen] = []
    try:
        x = np.arange(100_000, dtype=np.int64)
        with d.store() as s:
            s.put("t", pystrom.Table.from_arrays({"x": x}, device=device))
        clients = [
            subprocess.Popen([sys.executable, "-c", PRELUDE + CLIENT.format(path=d.path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(3)
        ]  # fmt: skip
        for c in clients:
            assert c.stdout.readline().strip() == "ready", c.stderr.read()
        waiting = pystrom.Store(d.path)  # a client in the middle of a request when the daemon dies
        view = waiting.get("t")
        d.proc.send_signal(signal.SIGSTOP)
        blocked: list = []

        def request() -> None:
            start = time.monotonic()
            try:
                waiting.stats()
            except StoreUnavailableError as e:
                blocked.append((time.monotonic() - start, str(e)))

        thread = threading.Thread(target=request)
        thread.start()
        time.sleep(0.3)  # the request is sent; the stopped daemon cannot answer
        killed = time.monotonic()
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=30)
        thread.join(timeout=10)
        assert blocked and time.monotonic() - killed < 5, blocked
        assert "went away" in blocked[0][1]
        assert int(view["x"].sum()) == int(x.sum())  # mapped before the crash: still readable
        for c in clients:
            c.stdin.write("\n")
            c.stdin.flush()
        for c in clients:
            out, err = c.communicate(timeout=60)
            assert c.returncode == 0, err
            first, second = out.strip().splitlines()
            word, seconds, message = first.split(" ", 2)
            assert word == "unavailable" and float(seconds) < 1.0 and "went away" in message, out
            assert second == "view True [0, 1, 2]", out
        with pystrom.defaults.set(store_connect_retry=0.2):  # its socket is left behind, nobody listens
            with pytest.raises(StoreUnavailableError, match="connection refused"):
                pystrom.Store(d.path)
        d2 = Daemon(d.path, device)  # a restart comes back empty
        try:
            with d2.store() as s:
                assert s.list() == [] and s.stats()["allocations"] == 0
        finally:
            assert d2.stop() == 0
    finally:
        for c in clients:
            c.kill()
            c.wait()
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGCONT)
            d.stop()
        for pipe in (d.proc.stdout, d.proc.stderr):
            pipe.close()
