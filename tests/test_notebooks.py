"""The example notebooks run top to bottom (on the CPU backend here; on a GPU where there is one).

Each notebook runs in a fresh kernel whose TMPDIR is a scratch directory of its own, so the test also
checks that the notebook cleans up after itself: the PostgreSQL server's directory, the Arrow files,
the store daemon's socket directory, all gone once its kernel has shut down.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "examples" / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:4] == [
        "01_table_basics.ipynb",
        "02_postgres_to_gpu_model.ipynb",
        "03_arrow_larger_than_gpu_memory.ipynb",
        "04_share_with_pytorch.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    # Outputs would be one machine's run (CPU or GPU, timings, pids); readers run the notebook themselves.
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    stored = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not stored, f"{path.name}: cells {stored} have stored outputs or execution counts"


@pytest.fixture
def scratch_tmpdir(monkeypatch):
    """A TMPDIR for the kernel; enterable by others (the embedded PostgreSQL runs as another user under root)."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="pystrom-nbtest-"))
    scratch.chmod(0o755)
    monkeypatch.setenv("TMPDIR", str(scratch))
    yield scratch
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, scratch_tmpdir):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3")
    client.execute(cwd=str(tmp_path))  # raises CellExecutionError, naming the cell, on any error
    assert all(c.execution_count for c in notebook.cells if c.cell_type == "code")
    left = sorted(os.listdir(scratch_tmpdir))
    assert not left, f"{path.name} left these in its temporary directory: {left}"
