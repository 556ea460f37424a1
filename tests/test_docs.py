"""The documentation builds without a warning, documents the whole public API, and its first session is true.

CI runs only ``./dev test``, so the Sphinx build (warnings as errors) lives here. The getting-started
page's Python snippets run top to bottom in a fresh interpreter, and each output block on the page
must be what the snippet before it prints.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import pystrom
import pystrom.ml
import pystrom.testing

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    cache = tmp_path_factory.mktemp("doctrees")
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-q",
        "-b",
        "html",
        "-d",
        str(cache),
        str(DOCS),
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"sphinx-build failed ({res.returncode}):\n{res.stderr[-6000:]}"
    return out


def _inventory(path: Path) -> dict[str, str]:
    """{object name: role} from Sphinx's objects.inv (4 header lines, then zlib-compressed text)."""
    raw = path.read_bytes()
    lines = raw.split(b"\n", 4)
    assert lines[0].startswith(b"# Sphinx inventory version 2"), lines[0]
    body = zlib.decompress(lines[4]).decode()
    names = {}
    for line in body.splitlines():
        m = re.match(r"(.+?)\s+(\S+):(\S+)\s+(-?\d+)\s+(\S*)\s+(.*)", line)
        if m:
            names[m.group(1)] = f"{m.group(2)}:{m.group(3)}"
    return names


def test_the_site_builds_with_warnings_as_errors(built):
    for page in ["index", "getting-started", "concepts", "performance", "table", "ipc", "api/index", "api/io"]:
        assert (built / f"{page}.html").is_file(), page
    # the landing page's toctree reaches every page: Sphinx warns about orphans, and -W made that fatal


def test_every_public_name_is_in_the_api_reference(built):
    inv = _inventory(built / "objects.inv")
    expected = [f"pystrom.{name}" for name in pystrom.__all__ if name not in ("__version__", "ml")]
    expected += [f"pystrom.ml.{name}" for name in pystrom.ml.__all__]
    expected += [f"pystrom.testing.{name}" for name in pystrom.testing.__all__]
    try:
        from pystrom import dask as pystrom_dask
    except ImportError:  # without the dask extra its page documents nothing
        pass
    else:
        expected += [f"pystrom.dask.{name}" for name in pystrom_dask.__all__]
    expected += ["pystrom._settings.Settings"]
    missing = [name for name in expected if name not in inv]
    assert not missing, f"public names without an API entry: {missing}"
    assert inv.get("pystrom.ml") == "py:module" and inv.get("pystrom.testing") == "py:module"
    assert inv["pystrom.defaults"] == "py:data"
    # the docstrings were really rendered, not just the names
    io_page = (built / "api" / "io.html").read_text()
    assert "Every buffer starts on a 64-byte boundary" in io_page  # write_arrow's docstring
    assert "partition_on" in io_page and "Parameters" in io_page  # read_postgres's, with its sections


def _snippets(page: Path) -> list[tuple[str, str | None]]:
    """(python code, the text block right after it or None) for each ```python block of a page."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```\s*$", page.read_text(), flags=re.M | re.S)
    pairs = []
    for i, (lang, body) in enumerate(blocks):
        if lang == "python":
            follows = blocks[i + 1] if i + 1 < len(blocks) else None
            pairs.append((body, follows[1] if follows and follows[0] == "text" else None))
    return pairs


def _blocks(page: Path, lang: str) -> list[str]:
    return [body for kind, body in re.findall(r"^```(\w*)\n(.*?)^```\s*$", page.read_text(), flags=re.M | re.S)
            if kind == lang]  # fmt: skip


def _your_own_database(pg, home: Path) -> dict[str, str]:
    """The page's "your own PostgreSQL", made real on a throwaway server: a database shop with a table
    orders, the role of the page's SQL block (logging in with a password, scram-sha-256), and the
    page's service and password files with the server's host and port (and no TLS: the server has
    none). Returns the environment that points libpq at those files."""
    page = DOCS / "getting-started.md"
    with pg.connect(autocommit=True) as conn:
        conn.execute("CREATE DATABASE shop")
    with pg.connect(autocommit=True, dbname="shop") as conn:
        conn.execute(
            "CREATE TABLE orders AS SELECT i::int8 AS id, ((i * 37) % 1000 / 4.0)::float8 AS total,"
            " 'customer ' || (i % 500) AS customer FROM generate_series(1, 100000) AS i"
        )
        (grants,) = _blocks(page, "sql")
        conn.execute(grants)
        conn.execute("ANALYZE orders")
    hba = pg.datadir / "pg_hba.conf"  # the role must log in with its password, as on a real server
    hba.write_text("host all analyst 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    with pg.connect(autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")

    (service,) = _blocks(page, "ini")
    lines = [line for line in service.splitlines() if not line.startswith("ssl")]
    lines = [f"host={'127.0.0.1'}" if x.startswith("host=") else f"port={pg.port}" if x.startswith("port=") else x
             for x in lines]  # fmt: skip
    (home / "pg_service.conf").write_text("\n".join(lines) + "\n")
    (passline,) = [b.strip() for b in _blocks(page, "text") if re.fullmatch(r"[^:\s]+:\d+:\w+:\w+:\S+", b.strip())]
    _, _, dbname, user, password = passline.split(":")
    (home / "pgpass").write_text(f"127.0.0.1:{pg.port}:{dbname}:{user}:{password}\n")
    (home / "pgpass").chmod(0o600)  # libpq ignores a password file that others can read
    return {"PGSERVICEFILE": str(home / "pg_service.conf"), "PGPASSFILE": str(home / "pgpass")}


@pytest.mark.postgres
def test_getting_started_runs_and_prints_what_the_page_says(tmp_path, monkeypatch):
    import psycopg

    from pystrom._embedded_pg import find_server_binaries
    from pystrom.testing import EmbeddedPostgres

    if find_server_binaries() is None:
        pytest.skip("no PostgreSQL server binaries (initdb) and no pgserver: install Debian's postgresql package")
    snippets = _snippets(DOCS / "getting-started.md")
    assert len(snippets) >= 8
    marker = "----- pystrom docs snippet {} -----"
    script = "\n".join(f"print({marker.format(i)!r}, flush=True)\n{code}" for i, (code, _) in enumerate(snippets))
    with EmbeddedPostgres() as pg:
        for name, value in _your_own_database(pg, tmp_path).items():
            monkeypatch.setenv(name, value)  # for this process's checks and the page's interpreter alike
        with pytest.raises(psycopg.OperationalError, match="password"):  # the password file is what lets it in
            psycopg.connect(f"service=shop passfile={tmp_path / 'none'}").close()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # and the role is read-only
            with psycopg.connect("service=shop", autocommit=True) as conn:
                conn.execute("DELETE FROM orders")
        res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"a getting-started snippet failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    outputs = re.split(r"^----- pystrom docs snippet \d+ -----\n", res.stdout, flags=re.M)[1:]
    assert len(outputs) == len(snippets)
    for (code, shown), printed in zip(snippets, outputs):
        if shown is not None:
            assert printed.strip() == shown.strip(), f"the page shows\n{shown}\nbut this prints\n{printed}\nfor\n{code}"
