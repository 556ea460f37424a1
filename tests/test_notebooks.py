"""The example notebooks run top to bottom (on the CPU backend here; on a GPU where there is one)."""

from __future__ import annotations

import pathlib

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "examples" / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3")
    client.execute(cwd=str(tmp_path))  # raises CellExecutionError, naming the cell, on any error
    assert all(c.execution_count for c in notebook.cells if c.cell_type == "code")
