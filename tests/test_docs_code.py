"""Every Python code block of the README and docs/*.md runs, each as a script of its own in a fresh
interpreter (``python block.py``: a block that starts a dask cluster without an
``if __name__ == "__main__":`` guard fails, as it would for a reader).

The blocks run in "the docs' world", what a reader of them has: a PostgreSQL database ``shop`` reached as
``service=shop`` (and ``dbname=shop``, the server's host and port in ``PGHOST``/``PGPORT``) holding the
demo's ``logreg`` table and the other tables the pages name; the Arrow files they name in the working
directory; a store daemon at ``PYSTROM_STORE_SOCKET``. Names a block uses are defined in it (or in the
blocks it continues).

A comment line right before a block's fence tells this test what the block needs, and nothing else may:

- ``<!-- docs-test: continues -->``: the block goes on from the page's previous Python block (the
  script is that block's script, then this one);
- ``<!-- docs-test: gpu -->``: it needs a GPU (it runs where there is one; counted, and skipped as a GPU
  test elsewhere).

getting-started.md's blocks run together, with their printed output compared with the page, in
tests/test_docs.py (which also builds the site).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import pystrom

from conftest import HAVE_GPU, needs_gpu

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "_build" not in p.parts]
ELSEWHERE = {"getting-started.md": "tests/test_docs.py::test_getting_started_runs_and_prints_what_the_page_says"}
MARKS = {"continues", "gpu"}
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int
    code: str
    marks: set[str] = field(default_factory=set)
    before: Block | None = None  # the block this one continues

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def script(self) -> str:
        return (self.before.script() + "\n" if self.before else "") + self.code


def _blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found: list[Block] = []
    for m in _FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        line = text.count("\n", 0, m.start()) + 1
        above = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(above)
        marks = {w.strip() for w in mark.group(1).split(",")} if mark else set()
        block = Block(page, line, m.group(2), marks)
        if "continues" in marks:
            block.before = found[-1] if found else None
        found.append(block)
    return found


ALL = [b for page in PAGES for b in _blocks(page)]
RUN_HERE = [b for b in ALL if b.page.name not in ELSEWHERE]


def test_every_block_is_run_and_its_marks_are_known():
    unknown = [(b.id, b.marks - MARKS) for b in ALL if b.marks - MARKS]
    assert not unknown, f"marks this test does not read: {unknown} (known: {sorted(MARKS)})"
    orphans = [b.id for b in ALL if "continues" in b.marks and b.before is None]
    assert not orphans, f"blocks that continue nothing: {orphans}"
    gpu = [b.id for b in RUN_HERE if "gpu" in b.marks]
    elsewhere = [b.id for b in ALL if b.page.name in ELSEWHERE]
    print(f"\n{len(ALL)} Python blocks: {len(RUN_HERE) - len(gpu)} run here, {len(gpu)} GPU-only {gpu}, "
          f"{len(elsewhere)} in {sorted(set(ELSEWHERE.values()))}")  # fmt: skip
    assert len(RUN_HERE) >= 15 and len(gpu) <= 3  # GPU-only blocks are the exception, and each says so


# -- the docs' world ----------------------------------------------------------------------------------

SHOP = """
ALTER TABLE logreg ADD COLUMN id int8 GENERATED ALWAYS AS IDENTITY;
CREATE SCHEMA analytics;
CREATE TABLE orders AS
  SELECT i::int8 AS id, (i % 997) * 0.75 AS total, (i % 101)::float8 AS amount, i % 3 <> 0 AS paid,
         'customer ' || (i % 50) AS customer, date '2024-01-01' + (i % 60) AS day
  FROM generate_series(1, 20000) i;
CREATE TABLE events AS
  SELECT i::int8 AS id, date '2023-12-01' + (i % 90) AS day, sin(i) * 20 AS x, cos(i * 0.7) * 20 AS y,
         (i % 5)::int4 AS kind
  FROM generate_series(1, 20000) i;
CREATE TABLE points AS
  SELECT sin(i) * 300 + 200 AS x, cos(i) * 300 + 300 AS y, (i % 800)::float8 AS z FROM generate_series(1, 20000) i;
CREATE TABLE big AS SELECT (i % 1000) * 0.01 AS x, (i % 7)::float8 AS y FROM generate_series(1, 50000) i;
ANALYZE;
"""


def _arrow_files(where: Path) -> None:
    """The files the pages read, made the way a reader's would be."""
    rng = np.random.default_rng(34)
    n = 20_000
    pts = {"x": rng.uniform(0, 400, n), "y": rng.uniform(0, 600, n), "z": rng.uniform(0, 800, n)}
    pystrom.write_arrow(pa.table(pts), where / "points.arrow", batch_rows=5_000)
    (where / "logs").mkdir()
    for i in range(3):
        memo = [f"request {j} {'abcd' if j % 97 == 0 else 'xyz'}" for j in range(i * 5000, (i + 1) * 5000)]
        pystrom.write_arrow(pa.table({"id": np.arange(i * 5000, (i + 1) * 5000), "memo": memo}),
                            where / "logs" / f"part-{i}.arrow", batch_rows=2_500)  # fmt: skip
    patients = {"weight": rng.uniform(45, 130, n), "height": rng.uniform(150, 200, n), "age": rng.integers(18, 95, n)}
    pystrom.write_arrow(pa.table(patients), where / "patients.arrow")
    pystrom.write_arrow(pa.table({"x": rng.normal(size=n), "y": rng.normal(size=n)}), where / "big.arrow")
    for i in range(2):
        x1, x2 = rng.normal(size=n), rng.normal(size=n)
        trips = {"x1": x1 * 100, "x2": x2, "t": (x1 - x2 + rng.logistic(size=n)) > 0}
        pystrom.write_arrow(pa.table(trips), where / f"trips-{i}.arrow", batch_rows=5_000)


@pytest.fixture(scope="module")
def world(pg_cluster, tmp_path_factory):
    from test_store import Daemon

    from pystrom.demo import _create_logreg

    home = tmp_path_factory.mktemp("docs-world")
    home.chmod(0o755)
    with pg_cluster.connect(autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS shop")
        conn.execute("CREATE DATABASE shop")
    shop = pg_cluster.conninfo.replace("dbname=postgres", "dbname=shop")
    _create_logreg(shop, "logreg", 20_000, 2)  # the demo's table, and an id as a reader's table would have
    with pg_cluster.connect(autocommit=True, dbname="shop") as conn:
        conn.execute(SHOP)
    (home / "pg_service.conf").write_text(
        f"[shop]\nhost=127.0.0.1\nport={pg_cluster.port}\nuser=postgres\ndbname=shop\n"
    )
    work = home / "cwd"
    work.mkdir()
    _arrow_files(work)
    daemon = Daemon(str(home / "store" / "s.sock"), "cuda" if HAVE_GPU else "cpu")
    env = {
        **os.environ,
        "PGSERVICEFILE": str(home / "pg_service.conf"),
        "PGHOST": "127.0.0.1",
        "PGPORT": str(pg_cluster.port),
        "PGUSER": "postgres",
        "PYSTROM_STORE_SOCKET": daemon.path,
    }  # PYTHONPATH as it is: the checkout's src under tools that set it, else the installed pystrom
    try:
        yield work, env
    finally:
        daemon.stop()


def _params():
    for b in RUN_HERE:
        marks = [pytest.mark.gpu, needs_gpu] if "gpu" in b.marks else []
        yield pytest.param(b, id=b.id, marks=marks)


@pytest.mark.postgres
@pytest.mark.parametrize("block", list(_params()))
def test_block_runs_as_a_script(block: Block, world, tmp_path):
    work, env = world
    script = tmp_path / "block.py"
    script.write_text(block.script())
    done = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"{block.id} failed (exit {done.returncode}):\n{block.script()}\n--- stdout\n{done.stdout[-3000:]}\n"
        f"--- stderr\n{done.stderr[-5000:]}"
    )
