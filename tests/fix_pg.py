"""pytest plugin: a throwaway real PostgreSQL cluster (no mocks), started once per session.

The server binaries come from, in order: ``PYSTROM_PG_BINDIR``, ``initdb`` on PATH, Debian's
``/usr/lib/postgresql/*/bin`` (newest first), or the ones bundled in the ``pgserver`` wheel (the
GPU machine). ``initdb`` refuses to run as root, so as root the cluster runs as an unprivileged
system user (``postgres`` where it exists, else one made for the purpose). The server listens on
127.0.0.1 on a free port with trust authentication; it is stopped and deleted at the end.

Fixtures: ``pg_cluster`` (session: start/stop/restart, conninfo) and ``pg`` (per test: a helper
that runs SQL as the superuser and drops what the test created).
"""

from __future__ import annotations

import itertools
import os

import pytest

from pystrom._embedded_pg import EmbeddedPostgres as PgCluster
from pystrom._embedded_pg import find_server_binaries as _find_bindir

__all__ = ["PgCluster", "_find_bindir", "pg_cluster", "pg"]


@pytest.fixture(scope="session")
def pg_cluster():
    pytest.importorskip("psycopg")
    bindir = _find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb) and no pgserver: install Debian's postgresql package")
    cluster = PgCluster(bindir)
    try:
        yield cluster
    finally:
        cluster.destroy()


_names = itertools.count()


class Pg:
    """Per-test helper: SQL as the superuser (autocommit), unique names, cleanup."""

    def __init__(self, cluster: PgCluster):
        self.cluster = cluster
        self.conninfo = cluster.conninfo
        self.conn = cluster.connect(autocommit=True)
        self._drops: list[str] = []

    def name(self, stem: str = "t") -> str:
        name = f"{stem}_{os.getpid()}_{next(_names)}"
        self._drops.append(name)
        return name

    def execute(self, query, params=None):
        return self.conn.execute(query, params)

    def fetch(self, query, params=None) -> list[tuple]:
        return self.conn.execute(query, params).fetchall()

    def close(self) -> None:
        import psycopg
        from psycopg import sql

        try:
            if self.conn.closed or self.conn.broken:
                self.conn = self.cluster.connect(autocommit=True)
            for name in self._drops:
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        except psycopg.Error:
            pass
        self.conn.close()


@pytest.fixture
def pg(pg_cluster: PgCluster):
    helper = Pg(pg_cluster)
    try:
        yield helper
    finally:
        helper.close()
