"""Who may do what in the store daemon, and how much (issue 36, items 1-2): owners and grants per table,
readers and writers, a per-user connection cap that keeps the daemon's own user in, byte quotas.

The daemon runs as root (the test process's user); two extra Unix users act as a writer and a reader.
They are created with ``useradd`` when missing (root only; elsewhere these tests are skipped with that
reason), as test_ipc_hostile.py does. Their clients run in spawned children that import everything
first, then drop to the user's uid.
"""

from __future__ import annotations

import gc
import os
import pathlib
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from test_ipc import PRELUDE, child
from test_ipc_hostile import _low_limit_daemon, survived
from test_store import Daemon, wait_for

import pystrom
from pystrom.errors import StoreError, StorePermissionError, StoreQuotaError, TableExistsError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run clients under other uids")
MB = 1 << 20


def _user(name: str) -> int:
    """The uid of ``name``, created when missing (root only)."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True)
        return pwd.getpwnam(name).pw_uid


@pytest.fixture(scope="module")
def users() -> tuple[int, int]:
    """(writer, reader): two users besides root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run clients under other uids")
    return _user("pystrom-peer"), _user("pystrom-peer2")


@pytest.fixture
def top():
    """A directory other users can pass through (pytest's own tmp_path is 0700)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="pystrom-roles-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(uid: int, path: str, body: str, timeout: float = 120) -> str:
    """Run ``body`` (with ``s``, a Store of the daemon at ``path``) as ``uid``; each step prints one line.

    ``attempt(label, fn)`` prints ``label: ok <result>`` or ``label: <ErrorClass> <message>``.
    """
    code = f"""
        import pystrom.ipc.server, pystrom.ipc.client, pystrom.ipc.export, pyarrow.ipc, json, socket, array
        import pystrom.interop.arrow_export, pystrom.interop.build, pystrom.interop.arrow_import
        os.setgroups([]); os.setgid({uid}); os.setuid({uid})

        def attempt(label, fn):
            try:
                print(f"{{label}}: ok {{fn()}}", flush=True)
            except pystrom.Error as e:
                print(f"{{label}}: {{type(e).__name__}} {{e}}", flush=True)

        s = pystrom.Store({path!r}, trust_uids=[0])
        """
    return survived(child(textwrap.dedent(code) + textwrap.dedent(body), timeout=timeout))


def lines(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def _table(values: list[int]) -> pystrom.Table:
    return pystrom.Table.from_arrow(pa.table({"x": values}), device="cpu")


@needs_root
def test_writers_own_their_tables_and_readers_read_only_what_is_shared(users, top):
    writer, reader = users
    path = str(top / "run" / "s.sock")
    d = Daemon(path, "cpu", "--writers", str(writer), "--readers", str(reader))
    try:
        with d.store() as s:  # the daemon's own user
            s.put("private", _table([1]))
            s.put("t1", _table([2]), share_with=[writer])
            s.put("t2", _table([3]), share_with="all")
        out = lines(
            as_user(
                writer,
                path,
                """
                attempt("list", lambda: sorted(t["name"] for t in s.list()))
                attempt("get private", lambda: s.get("private"))
                attempt("get t1", lambda: s.get("t1")["x"].tolist())
                attempt("drop t1", lambda: s.drop("t1"))
                attempt("replace t2", lambda: s.put("t2", pystrom.Table.from_arrays({"x": [9]}, device="cpu"),
                                                    replace=True))
                attempt("put t2", lambda: s.put("t2", pystrom.Table.from_arrays({"x": [9]}, device="cpu")))
                attempt("put mine", lambda: s.put("mine", pystrom.Table.from_arrays({"x": [4, 5]}, device="cpu"),
                                                  share_with=[READER]))
                attempt("replace mine", lambda: s.put("mine", pystrom.Table.from_arrays({"x": [6]}, device="cpu"),
                                                      replace=True, share_with=[READER]))
                attempt("rights", lambda: s.info["rights"])
                """.replace("READER", str(reader)),
            )
        )
        # finding 1 of issue 36: an allowed uid dropped t1, replaced t2, listed and read 'private'
        assert out["list"] == "ok ['t1', 't2']", out
        assert out["get private"].startswith("StorePermissionError") and "'private'" in out["get private"], out
        assert "missing right: read" in out["get private"]
        assert out["get t1"] == "ok [2]"
        for step, name in (("drop t1", "'t1'"), ("replace t2", "'t2'")):
            assert out[step].startswith("StorePermissionError") and name in out[step], out
            assert "missing right: owner" in out[step] and "uid 0" in out[step], out
        assert out["put t2"].startswith("TableExistsError"), out
        assert out["put mine"] == "ok None" and out["replace mine"] == "ok None", out
        assert out["rights"] == "ok write"

        out = lines(
            as_user(
                reader,
                path,
                """
                attempt("list", lambda: sorted(t["name"] for t in s.list()))
                attempt("get mine", lambda: s.get("mine")["x"].tolist())
                attempt("get t1", lambda: s.get("t1"))
                attempt("put", lambda: s.put("r", pystrom.Table.from_arrays({"x": [1]}, device="cpu")))
                attempt("drop mine", lambda: s.drop("mine"))
                attempt("drop t2", lambda: s.drop("t2"))
                attempt("owner of mine", lambda: [t["owner"] for t in s.list() if t["name"] == "mine"][0])
                """,
            )
        )
        assert out["list"] == "ok ['mine', 't2']", out
        assert out["get mine"] == "ok [6]", out
        assert out["get t1"].startswith("StorePermissionError") and "missing right: read" in out["get t1"], out
        assert out["put"].startswith("StorePermissionError") and "missing right: write" in out["put"], out
        assert "'r'" in out["put"] and "--writers" in out["put"], out
        for step in ("drop mine", "drop t2"):
            assert out[step].startswith("StorePermissionError") and "missing right: owner" in out[step], out
        assert out["owner of mine"] == f"ok {writer}", out

        with d.store() as s:  # the daemon's own user sees, replaces and drops everyone's tables
            names = {t["name"]: t for t in s.list()}
            assert set(names) == {"private", "t1", "t2", "mine"}
            assert names["mine"]["owner"] == writer and names["mine"]["shared_with"] == [reader]
            assert names["t2"]["shared_with"] == "all" and names["private"]["shared_with"] == []
            assert s.get("private")["x"].tolist() == [1] and s.get("t2")["x"].tolist() == [3]
            s.put("mine", _table([7]), replace=True)
            assert {t["name"]: t["owner"] for t in s.list()}["mine"] == os.getuid()
            for name in ("private", "t1", "t2", "mine"):
                s.drop(name)
    finally:
        assert d.stop() == 0


@needs_root
def test_allow_uids_still_works_and_now_means_writers(users, top):
    writer, _ = users
    path = str(top / "run" / "s.sock")
    d = Daemon(path, "cpu", "--allow-uids", str(writer))
    try:
        assert "--allow-uids is deprecated and now means --writers" in d.proc.stderr.readline()  # said before it serves
        with d.store() as s:
            s.put("t1", _table([1]))
        out = lines(
            as_user(
                writer,
                path,
                """
                attempt("put", lambda: s.put("own", pystrom.Table.from_arrays({"x": [1]}, device="cpu")))
                attempt("drop t1", lambda: s.drop("t1"))
                attempt("drop own", lambda: s.drop("own"))
                """,
            )
        )
        assert out == {"put": "ok None", "drop own": "ok None", "drop t1": out["drop t1"]}, out
        assert out["drop t1"].startswith("StorePermissionError"), out
        with d.store() as s:
            s.drop("t1")
    finally:
        assert d.stop() == 0


@needs_root
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")
def test_one_user_cannot_take_every_connection(users, top):
    """Finding 2 of issue 36: with nofile=512 one allowed uid held 240/240 connections and the daemon's
    own user was refused. Now each other user gets its share and the owner always gets in."""
    writer, reader = users
    path = str(top / "run" / "s.sock")
    d = _low_limit_daemon(path, 512, "--writers", str(writer), "--readers", str(reader))
    hog = None
    try:
        with d.store() as s:
            stats = s.stats()
        cap, total = stats["max_connections_per_uid"], stats["max_connections"]
        assert cap < total - stats["connections_kept_for_owner"], stats
        body = f"""
            import sys
            held, refusal = [s], None
            for _ in range({total}):
                try:
                    held.append(pystrom.Store({path!r}, trust_uids=[0]))
                except pystrom.StoreError as e:
                    refusal = str(e)
                    break
            print(f"held: {{len(held)}}", flush=True)
            print(f"refusal: {{refusal}}", flush=True)
            sys.stdin.readline()  # holds them while the others try
            """
        code = textwrap.dedent(f"""
            import pystrom.ipc.server, pystrom.ipc.client
            os.setgroups([]); os.setgid({writer}); os.setuid({writer})
            s = pystrom.Store({path!r}, trust_uids=[0])
            """) + textwrap.dedent(body)
        hog = subprocess.Popen([sys.executable, "-c", PRELUDE + code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
        held = hog.stdout.readline()
        refusal = hog.stdout.readline()
        assert held.strip() == f"held: {cap}", held + refusal
        assert f"at most {cap} per user" in refusal, refusal
        with d.store() as s:  # the daemon's own user is not locked out
            assert s.stats()["clients"] >= cap + 1
        out = lines(as_user(reader, path, 'attempt("list", lambda: s.list())'))  # nor is another user
        assert out["list"] == "ok []", out
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        assert d.stop() == 0


@needs_root
def test_each_user_has_a_byte_quota_and_the_daemon_a_total(users, top):
    writer, _ = users
    path = str(top / "run" / "s.sock")
    d = Daemon(path, "cpu", "--writers", str(writer), "--max-bytes", "64M", "--max-bytes-per-uid", "16M")
    try:
        out = lines(
            as_user(
                writer,
                path,
                """
                big = s.reserve("a", 8 << 20)
                big2 = s.reserve("b", 8 << 20)
                attempt("third", lambda: s.reserve("c", 1))
                attempt("TiB", lambda: s.reserve("huge", 1 << 40))
                big.abort()
                del big  # its mapping goes, and with the next request its hold (the memory is mapped until then)
                gc.collect()
                s.stats()
                attempt("after abort", lambda: s.reserve("c", 4 << 20).nbytes)
                attempt("stats", lambda: (s.stats()["uid_bytes"], s.stats()["uid_max_bytes"]))
                """,
            )
        )
        assert out["third"].startswith("StoreQuotaError"), out
        assert f"uid {writer}" in out["third"] and "16,777,216 of 16,777,216" in out["third"], out
        assert out["TiB"].startswith("StoreQuotaError") and "1,099,511,627,776 bytes" in out["TiB"], out
        assert out["after abort"] == f"ok {4 << 20}", out
        assert out["stats"] == f"ok ({12 << 20}, {16 << 20})", out  # b and c held; the aborted a given back
        with d.store() as s:  # the daemon's own user: bounded by the total only
            r = s.reserve("owner", 48 * MB)
            with pytest.raises(StoreQuotaError, match="past its limit: it holds 50,331,648 of 67,108,864"):
                s.reserve("more", 17 * MB)
            r.abort()
            del r
            gc.collect()
            wait_for(s, lambda st: st["allocations"] == 0 and st["uid_bytes"] == 0)
    finally:
        assert d.stop() == 0


# -- without other users ---------------------------------------------------------------------------------


def test_quotas_count_the_pages_a_table_takes_not_the_bytes_asked(tmp_path):
    """Many tiny tables each hold a whole page of the daemon's memory: counting the bytes asked let a
    quota of 3 pages hold thousands of them."""
    import mmap

    page = mmap.PAGESIZE
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu", "--max-bytes", str(3 * page))
    try:
        with d.store() as s:
            held = [s.reserve(f"t{i}", 1) for i in range(3)]
            assert s.stats()["uid_bytes"] == 3 * page
            over = rf"1 bytes \({page:,} in whole pages\) would take the store daemon past its limit"
            with pytest.raises(StoreQuotaError, match=over):
                s.reserve("t3", 1)
            held[0].abort()
            del held[0]
            gc.collect()
            wait_for(s, lambda st: st["uid_bytes"] == 2 * page)
            with pytest.raises(StoreQuotaError, match=rf"{page + 1:,} bytes \({2 * page:,} in whole pages\)"):
                s.reserve("t3", page + 1)  # two pages, one left
            with s.reserve("t3", page) as r:  # one page: fits
                assert r.nbytes == page
    finally:
        assert d.stop() == 0


def test_absurd_reservations_are_refused_by_default(tmp_path):
    """Finding 5 of issue 36: reserves of 1 TiB, 32 TiB and 2**50 - 1 bytes were accepted on a 23 GB machine."""
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    try:
        with d.store() as s:
            limit = s.stats()["max_bytes"]
            for nbytes in (1 << 40, 32 << 40, (1 << 50) - 1):
                with pytest.raises(StoreQuotaError, match=f"{nbytes:,} bytes .* of {limit:,} bytes"):
                    s.reserve("huge", nbytes)
            assert s.stats()["allocations"] == 0
            with s.reserve("fits", MB) as r:  # a reasonable one still goes through
                assert r.nbytes == MB
    finally:
        assert d.stop() == 0


def test_put_share_with_is_checked():
    with pytest.raises(pystrom.InvalidArgumentError, match="share_with"):
        pystrom.ipc.client._sharing("everyone")
    with pytest.raises(pystrom.InvalidArgumentError, match="uid"):
        pystrom.ipc.client._sharing([1, -2])
    assert pystrom.ipc.client._sharing([]) is None and pystrom.ipc.client._sharing(np.array([3])) == [3]


def test_the_daemon_refuses_malformed_share_with(tmp_path):
    from pystrom.ipc import protocol

    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    try:
        raw = protocol.connect(d.path)
        for bad in ("some", [True], [-1], [1.5], list(range(5000))):
            protocol.send(raw, {"op": "reserve", "name": "x", "nbytes": 64, "share_with": bad})
            reply, fds = protocol.recv(raw)
            assert not reply["ok"] and "share_with" in reply["message"] and not fds, reply
        raw.close()
        with d.store() as s:
            assert s.stats()["allocations"] == 0
    finally:
        assert d.stop() == 0


def test_serve_options_on_the_command_line(tmp_path):
    for argv, message in (
        (["--readers", "alice"], "expected comma-separated numeric ids"),
        (["--max-bytes", "lots"], "expected a size in bytes"),
        (["--max-bytes-per-uid", "0"], "expected a positive size"),
    ):
        r = subprocess.run([sys.executable, "-m", "pystrom", "serve", *argv], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
        assert r.returncode == 2 and message in r.stderr, r.stderr
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu", "--max-bytes", "1.5G", "--max-bytes-per-uid", "256M")
    try:
        with d.store() as s:
            stats = s.stats()
            assert stats["max_bytes"] == 3 << 29 and stats["max_bytes_per_uid"] == 256 * MB
            assert stats["rights"] == "admin" and stats["uid_max_bytes"] == 3 << 29
            with pytest.raises(TableExistsError):
                s.put("t", _table([1]))
                s.put("t", _table([1]))
            with pytest.raises(StoreError, match="share_with"):
                s._request({"op": "reserve", "name": "u", "nbytes": 8, "share_with": "some"})
            s.drop("t")
    finally:
        assert d.stop() == 0


def test_load_share_with_on_the_command_line(tmp_path):
    source = tmp_path / "t.arrow"
    with pa.OSFile(str(source), "wb") as f, pa.ipc.new_file(f, pa.schema([("x", pa.int64())])) as w:
        w.write_table(pa.table({"x": [1, 2]}))
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    try:
        cli = [sys.executable, "-m", "pystrom", "load", "--socket", d.path, "--arrow", str(source)]
        r = subprocess.run([*cli, "--name", "t", "--share-with", "1001,1002"], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr
        r = subprocess.run([*cli, "--name", "u", "--share-with", "nobody"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "numeric uids or 'all'" in r.stderr
        ls = subprocess.run([sys.executable, "-m", "pystrom", "ls", "--socket", d.path], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
        assert ls.returncode == 0 and "1001,1002" in ls.stdout, ls.stdout + ls.stderr
        with d.store() as s:
            assert [t["shared_with"] for t in s.list()] == [[1001, 1002]]
            s.drop("t")
    finally:
        assert d.stop() == 0


def test_a_reader_is_refused_a_put_before_anything_is_allocated():
    from pystrom.ipc.admission import READ, Grants

    g = Grants(readers=[12345])
    assert g.rights(12345, 12345, os.getpid()) == READ and g.rights(54321, 54321, os.getpid()) is None
    with pytest.raises(StorePermissionError, match="may not put table 'x' .missing right: write"):
        g.check_put(12345, READ, "x")
