"""A throwaway PostgreSQL server for the demo, the notebooks and the tests (no mocks anywhere).

The server binaries come from, in order: ``PYSTROM_PG_BINDIR``, ``initdb`` on PATH, Debian's
``/usr/lib/postgresql/*/bin`` (newest first), or the ones bundled in the ``pgserver`` wheel. ``initdb``
refuses to run as root, so as root the cluster runs as an unprivileged system user (``postgres``
where it exists, else one made for the purpose). The server listens on 127.0.0.1 on a free port
(and a Unix socket in its directory) with trust authentication; ``destroy()`` stops it and deletes
everything.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from .errors import FileError, PostgresError

__all__ = ["EmbeddedPostgres", "find_server_binaries", "describe_binaries"]


def find_server_binaries() -> Path | None:
    """The directory holding ``initdb``/``pg_ctl``, or None when none is installed."""
    env = os.environ.get("PYSTROM_PG_BINDIR")
    if env:
        return Path(env)
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[-3]), reverse=True)
    if debian:
        return Path(debian[0]).parent
    import importlib.util

    spec = importlib.util.find_spec("pgserver")  # found, not imported: only its bundled binaries are used
    if spec is None or spec.origin is None:
        return None
    bindir = Path(spec.origin).parent / "pginstall" / "bin"
    return bindir if (bindir / "initdb").exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _system_user() -> str | None:
    """None when not root; else an unprivileged user to run the server as."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pystrom-pg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    subprocess.run(["useradd", "--system", "--no-create-home", "pystrom-pg"], check=True, capture_output=True)
    return "pystrom-pg"


class EmbeddedPostgres:
    """One PostgreSQL server in a temporary directory; a context manager that destroys it on exit.

    The constructor runs ``initdb`` and starts the server; ``with EmbeddedPostgres() as pg:`` destroys
    it when the block ends.

    Parameters
    ----------
    bindir
        The directory holding ``initdb`` and ``pg_ctl``; None finds one as the module says
        (``PYSTROM_PG_BINDIR``, PATH, Debian's packages, the ``pgserver`` wheel).

    Attributes
    ----------
    conninfo : str
        A libpq connection string for the superuser ``postgres`` on database ``postgres``
        (127.0.0.1, trust authentication), for ``read_postgres`` or ``psycopg.connect``.
    port : int
        The TCP port the server listens on.
    root : pathlib.Path
        The temporary directory holding the data directory, the socket and the log.

    Raises
    ------
    FileNotFoundError
        No server binaries were found.
    """

    def __init__(self, bindir: Path | None = None):
        bindir = bindir if bindir is not None else find_server_binaries()
        if bindir is None:
            from ._dist import install_hint

            raise FileError(
                "no PostgreSQL server binaries: install Debian's postgresql package (apt-get install postgresql), "
                f"or {install_hint('demo')} (it brings the pgserver wheel), or set PYSTROM_PG_BINDIR"
            )
        self.bindir = bindir
        self.user = _system_user()
        self.root = Path(tempfile.mkdtemp(prefix="pystrom-pg-"))
        self.datadir = self.root / "data"
        self.port = _free_port()
        self.conninfo = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        if self.user is not None:
            self.root.chmod(0o777)  # the server's user writes its socket, log and data here
            if not str(bindir).startswith("/usr/"):  # e.g. pgserver's tree, unpacked by root: let the user in
                for parent in bindir.parents:
                    if parent != Path("/") and parent.is_dir():
                        parent.chmod(parent.stat().st_mode | 0o055)
                for dirpath, _, files in os.walk(bindir.parent):
                    os.chmod(dirpath, os.stat(dirpath).st_mode | 0o055)
                    for f in files:
                        path = os.path.join(dirpath, f)
                        mode = os.stat(path).st_mode
                        os.chmod(path, mode | 0o044 | (0o011 if mode & 0o100 else 0))
        try:
            self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            self.start()
        except subprocess.CalledProcessError as exc:
            shutil.rmtree(self.root, ignore_errors=True)
            raise PostgresError(f"initdb failed for a throwaway server from {bindir}: {exc.stderr.strip()}") from None
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    @property
    def source(self) -> str:
        """Where the server binaries come from, in words."""
        return describe_binaries(self.bindir)

    def _run(self, exe: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.bindir / exe), *args], user=self.user, check=check, capture_output=True, text=True, timeout=120
        )

    def start(self) -> None:
        """Start the server (``pg_ctl start``); the constructor already did, so only after :meth:`stop`."""
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=120 -c shared_buffers=128MB"
        )
        res = self._run(
            "pg_ctl", "-D", str(self.datadir), "-o", opts, "-l", str(self.root / "log"), "-w", "start", check=False
        )
        if res.returncode != 0:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise PostgresError(f"pg_ctl start failed: {res.stderr}\n{log[-2000:]}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``), keeping its data directory."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop", check=False)

    def destroy(self) -> None:
        """Stop the server at once and delete its directory (leaving the ``with`` block does this)."""
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def connect(self, **kwargs):
        """A psycopg connection to the server's ``postgres`` database (keyword arguments go to ``psycopg.connect``)."""
        import psycopg

        return psycopg.connect(self.conninfo, **kwargs)

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def describe_binaries(bindir: Path) -> str:
    """Where a server's binaries come from, in words (the demo says which it used)."""
    text = str(bindir)
    if "pginstall" in text:
        return f"pgserver's bundled PostgreSQL ({bindir})"
    if text.startswith("/usr/lib/postgresql/"):
        return f"Debian's PostgreSQL {text.split('/')[4]} ({bindir})"
    return f"PostgreSQL from {bindir}"
