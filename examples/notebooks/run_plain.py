"""Run the example notebooks without Jupyter: each code cell in order, in one namespace, in a fresh process.

For machines that have pystrom but no nbclient/ipykernel (a GPU server's image, say);
tests/test_notebooks.py runs the notebooks in real kernels
where nbclient is installed. Like a notebook, the value of a cell's last bare expression is printed.

    python examples/notebooks/run_plain.py                # every notebook next to this file
    python examples/notebooks/run_plain.py 02_postgres_to_gpu_model.ipynb ...
    python examples/notebooks/run_plain.py --store [NAMES]  # run in Jupyter kernels on the CPU, keep the outputs

The notebooks are stored with the outputs of a CPU run (``--store``, which needs nbclient): that is
what a reader sees before running them, and what CI (no GPU) can reproduce.

Exit status 0 when every notebook ran to the end; a failing cell's traceback names the notebook and cell.
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_cells(path: Path) -> None:
    """Execute the code cells of ``path`` in this process, in a temporary working directory."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    namespace: dict = {"__name__": "__main__"}
    home = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="pystrom-nb-") as cwd:
        os.chdir(cwd)
        try:
            for i, cell in enumerate(cells, 1):
                source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
                name = f"<{path.name} code cell {i}>"
                # As in IPython, a cell's source is findable by inspect.getsource (pystrom.kernel's CPU twin reads it).
                linecache.cache[name] = (len(source), None, source.splitlines(True), name)
                tree = ast.parse(source, name)
                last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
                exec(compile(tree, name, "exec"), namespace)
                if last is not None:
                    value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
                    if value is not None:
                        print(repr(value))
        finally:
            os.chdir(home)


def store_outputs(paths: list[Path]) -> None:
    """Run each notebook top to bottom in a Jupyter kernel on the CPU backend and save it with its outputs."""
    import nbclient
    import nbformat

    os.environ["PYSTROM_DEVICE"] = "cpu"  # the kernel inherits it: a CPU run, as CI makes
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="pystrom-nb-") as cwd:
            nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3").execute(cwd=cwd)
        nbformat.write(notebook, path)
        print(f"=== {path.name}: stored with its outputs ({time.perf_counter() - start:.1f} s)", flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:  # the child: one notebook
        run_cells(Path(argv[1]))
        return 0
    if argv[:1] == ["--store"]:
        store_outputs([Path(a) if Path(a).exists() else HERE / a for a in argv[1:]] or sorted(HERE.glob("*.ipynb")))
        return 0
    paths = [Path(a) if Path(a).exists() else HERE / a for a in argv] or sorted(HERE.glob("*.ipynb"))
    failed = []
    for path in paths:
        print(f"=== {path.name}", flush=True)
        start = time.perf_counter()
        code = subprocess.run([sys.executable, __file__, "--one", str(path)]).returncode
        print(
            f"=== {path.name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {time.perf_counter() - start:.1f} s"
        )
        if code:
            failed.append(path.name)
    print(f"{len(paths) - len(failed)} of {len(paths)} notebooks ran" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
