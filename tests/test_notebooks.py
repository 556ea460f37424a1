"""The example notebooks run top to bottom (on the CPU backend here; on a GPU where there is one).

Each notebook runs in a fresh kernel whose TMPDIR is a scratch directory of its own, so the test also
checks that the notebook cleans up after itself: the PostgreSQL server's directory, the Arrow files,
the store daemon's socket directory, all gone once its kernel has shut down. Where nbclient is not
installed (possibly the GPU image), the cells run in a plain Python process instead
(examples/notebooks/run_plain.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

try:
    import nbclient
    import nbformat
except ImportError:
    nbclient = nbformat = None

NOTEBOOK_DIR = pathlib.Path(__file__).parent.parent / "examples" / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
PLAIN_RUNNER = NOTEBOOK_DIR / "run_plain.py"


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:4] == [
        "01_table_basics.ipynb",
        "02_postgres_to_gpu_model.ipynb",
        "03_arrow_larger_than_gpu_memory.ipynb",
        "04_share_with_pytorch.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_with_the_outputs_of_a_cpu_run(path):
    """A reader sees what the cells print before running anything (GitHub shows them): the outputs of
    one run top to bottom on the CPU backend, without errors. Timings, paths and pids in them are that
    run's; test_notebook_runs runs the notebook again and never compares its outputs with these.
    Refresh them with ``python examples/notebooks/run_plain.py --store`` (needs nbclient)."""
    notebook = json.loads(path.read_text())
    if nbformat is not None:
        nbformat.validate(nbformat.from_dict(notebook))
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), f"{path.name}: not one run in order"
    errors = [i for i, c in enumerate(code, 1) if any(o["output_type"] == "error" for o in c["outputs"])]
    assert not errors, f"{path.name}: code cells {errors} stored an error"
    assert sum(bool(c["outputs"]) for c in code) >= len(code) // 2, f"{path.name}: most cells show nothing"
    shown = json.dumps([c["outputs"] for c in code])
    assert "cuda:" not in shown, f"{path.name}: stored from a GPU run; store a CPU run (CI has no GPU)"


@pytest.fixture
def scratch_tmpdir(monkeypatch):
    """A TMPDIR for the kernel; enterable by others (the embedded PostgreSQL runs as another user under root)."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="pystrom-nbtest-"))
    scratch.chmod(0o755)
    monkeypatch.setenv("TMPDIR", str(scratch))
    yield scratch
    shutil.rmtree(scratch, ignore_errors=True)


def _run_plain(args, cwd):
    return subprocess.run([sys.executable, str(PLAIN_RUNNER), *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, scratch_tmpdir):
    if nbclient is not None:
        notebook = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3")
        client.execute(cwd=str(tmp_path))  # raises CellExecutionError, naming the cell, on any error
        assert all(c.execution_count for c in notebook.cells if c.cell_type == "code")
    else:
        done = _run_plain(["--one", str(path)], tmp_path)
        assert done.returncode == 0, f"{path.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    left = sorted(os.listdir(scratch_tmpdir))
    assert not left, f"{path.name} left these in its temporary directory: {left}"


def test_plain_runner_runs_a_notebook(tmp_path):
    done = _run_plain(["01_table_basics.ipynb"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 of 1 notebooks ran" in done.stdout
    assert "pystrom.Table: 100,000 rows" in done.stdout  # the first cell's last expression, shown as a notebook would


def test_plain_runner_names_the_failing_cell(tmp_path):
    bad = tmp_path / "bad.ipynb"
    cells = [
        {"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
        for source in ("x = 1", "x / 0")
    ]
    bad.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    done = _run_plain([str(bad)], tmp_path)
    assert done.returncode == 1
    assert "<bad.ipynb code cell 2>" in done.stderr and "ZeroDivisionError" in done.stderr
    assert "failed: ['bad.ipynb']" in done.stdout
