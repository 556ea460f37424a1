"""One way to say an extra is missing: every optional import fails with ``pystrom.MissingDependencyError``
(an ``ImportError`` and a ``pystrom.Error``) naming the feature, the package and the exact
``pip install 'pystrom-gpu[...]'`` line.

Missing packages are simulated the two ways Python knows: ``sys.modules[name] = None`` in this process
(an import of it then fails as if it were not installed), and, for what happens at import time, a fresh
interpreter whose meta path finder refuses every optional package.
"""

from __future__ import annotations

import importlib.abc
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pystrom
from pystrom._dist import OPTIONAL, install_hint, missing, require
from pystrom.errors import DeviceError, MissingDependencyError, UnsupportedTypeError

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# What each optional module is called on the package index, as pyproject.toml's extras list it.
DISTRIBUTIONS = {
    "dask": "dask",
    "distributed": "dask[distributed]",
    "dask.dataframe": "pandas",
    "dask_cuda": "dask-cuda",
    "pandas": "pandas",
    "psycopg": "psycopg",
    "numba": "numba",
    "numba.cuda": "numba-cuda",
    "cupy": "cupy-cuda",
    "kvikio": "kvikio-cu",
    "nvidia.nvcomp": "nvidia-nvcomp-cu",
}


def test_every_optional_module_names_extras_that_bring_it():
    section = PYPROJECT.read_text().split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    extras = {name: re.findall(r'"([^"]+)"', deps) for name, deps in re.findall(r"^([\w-]+) = (\[.*\])", section, re.M)}
    assert set(OPTIONAL) == set(DISTRIBUTIONS)
    for module, (_, alternatives) in OPTIONAL.items():
        for alternative in alternatives:
            requirements = [r for extra in alternative.split(",") for r in extras[extra]]  # KeyError: no such extra
            assert any(r.startswith(DISTRIBUTIONS[module]) for r in requirements), (module, alternative, requirements)


def test_the_error_is_an_import_error_and_a_pystrom_error_and_pickles():
    err = missing("pandas", "Table.to_pandas()")
    assert isinstance(err, ImportError) and isinstance(err, pystrom.Error)
    assert pystrom.MissingDependencyError is MissingDependencyError and "MissingDependencyError" in pystrom.__all__
    assert str(err) == "Table.to_pandas() needs pandas, which is not installed: pip install 'pystrom-gpu[pandas]'"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is MissingDependencyError and str(back) == str(err)
    assert back.name == "pandas" and back.extras == ("pandas",)
    assert install_hint("cuda13", "cuda12") == "pip install 'pystrom-gpu[cuda13]' or 'pystrom-gpu[cuda12]'"


@pytest.fixture
def without(monkeypatch):
    """``without("pandas")``: importing pandas now fails as if it were not installed."""

    def block(*names: str) -> None:
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)

    return block


def test_to_pandas_without_pandas(without):
    t = pystrom.Table.from_arrays({"x": [1, 2]}, device="cpu")
    without("pandas")
    with pytest.raises(MissingDependencyError) as info:
        t.to_pandas()
    assert str(info.value) == (
        "Table.to_pandas() needs pandas, which is not installed: pip install 'pystrom-gpu[pandas]'"
    )


@pytest.mark.parametrize(
    "call,feature",
    [
        (lambda: pystrom.read_postgres("dbname=shop", "SELECT 1"), "read_postgres"),
        (
            lambda: pystrom.write_postgres(pystrom.Table.from_arrays({"x": [1]}, device="cpu"), "dbname=shop", "t"),
            "write_postgres",
        ),  # fmt: skip
        (lambda: pystrom.scan_postgres("dbname=shop", "SELECT 1"), "scan_postgres"),
        (lambda: pystrom.postgres_to_arrow("dbname=shop", "/nonexistent/x.arrow", "SELECT 1"), "postgres_to_arrow"),
    ],
    ids=["read_postgres", "write_postgres", "scan_postgres", "postgres_to_arrow"],
)
def test_postgres_calls_without_psycopg(without, call, feature):
    without("psycopg")
    with pytest.raises(MissingDependencyError) as info:
        call()
    assert not isinstance(info.value, pystrom.PostgresError)  # it used to be one, saying "read_postgres" for writes
    assert str(info.value) == (f"{feature} needs psycopg, which is not installed: pip install 'pystrom-gpu[postgres]'")


class _Broken(importlib.abc.MetaPathFinder):
    """Finds ``name`` and fails to load it, as a psycopg without a usable libpq does."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname, path, target=None):
        if fullname == self.name:
            raise ImportError("no pq wrapper available: libpq.so.5: cannot open shared object file")
        return None


def test_a_package_that_is_there_but_does_not_import_says_why(monkeypatch):
    monkeypatch.delitem(sys.modules, "psycopg", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Broken("psycopg"), *sys.meta_path])
    want = (
        r"read_postgres needs psycopg, which is installed but does not import \(no pq wrapper available: "
        r"libpq.so.5.*\): pip install 'pystrom-gpu\[postgres\]'"
    )
    with pytest.raises(MissingDependencyError, match=want):
        pystrom.read_postgres("dbname=shop", "SELECT 1")


def test_user_functions_without_numba(without):
    @pystrom.udf
    def double(x):
        return 2 * x

    t = pystrom.Table.from_arrays({"x": [1.0, 2.0]}, device="cpu")
    without("numba")
    with pytest.raises(MissingDependencyError, match=r"user functions .* needs numba, which is not installed: "
                       r"pip install 'pystrom-gpu\[udf\]'") as info:  # fmt: skip
        t.with_columns(y=double("x"))
    assert isinstance(info.value, UnsupportedTypeError)  # what it was before, still


def test_gpu_user_functions_without_numba_cuda(without):
    from pystrom._udf._common import numba_modules

    pytest.importorskip("numba")
    without("numba.cuda")
    with pytest.raises(MissingDependencyError, match=r"on a GPU needs numba-cuda, which is not installed: "
                       r"pip install 'pystrom-gpu\[udf\]'"):  # fmt: skip
        numba_modules(cuda=True)


def test_a_gpu_without_cupy(without, monkeypatch):
    from pystrom.memory import backend

    without("cupy")
    monkeypatch.setattr(backend, "cuda_device_count", lambda: 0)  # what it finds without CuPy
    with pytest.raises(MissingDependencyError) as info:
        pystrom.Table.from_arrays({"a": [1]}, device="cuda")
    assert str(info.value) == (
        "device 'cuda' needs CuPy, which is not installed: pip install 'pystrom-gpu[cuda13]' or "
        "'pystrom-gpu[cuda12]'; or use device='cpu'"
    )
    assert isinstance(info.value, DeviceError)  # code that falls back to the CPU on a DeviceError still does


def test_reading_files_onto_a_gpu_without_kvikio(without):
    from pystrom.io.arrow.file.ranges import _configure_kvikio

    without("kvikio")
    with pytest.raises(MissingDependencyError, match=r"reading Arrow files onto a GPU needs KvikIO, which is not "
                       r"installed: pip install 'pystrom-gpu\[cuda13\]' or 'pystrom-gpu\[cuda12\]'"):  # fmt: skip
        _configure_kvikio()


def test_nvcomp_asked_for_but_missing(without, monkeypatch):
    from pystrom.io.arrow.codecs import device

    without("nvidia", "nvidia.nvcomp")
    device._nvcomp.cache_clear()
    try:
        monkeypatch.setenv("PYSTROM_NVCOMP", "0")
        assert not device.decodes_on_host("zstd") and not device.decodes_on_host("lz4_frame")  # not asked: no error
        with pystrom.defaults.set(gpu_zstd_decoder="host"):
            assert device.decodes_on_host("zstd")
        monkeypatch.setenv("PYSTROM_NVCOMP", "1")
        assert not device.decodes_on_host("lz4_frame")
        want = (
            r"PYSTROM_NVCOMP=1 .* needs nvCOMP, which is not installed: "
            r"pip install 'pystrom-gpu\[nvcomp-cu13\]' or 'pystrom-gpu\[nvcomp-cu12\]'; or unset"
        )
        with pytest.raises(MissingDependencyError, match=want):
            device.decodes_on_host("zstd")
    finally:
        device._nvcomp.cache_clear()


def test_dask_dataframes_without_pandas(without, tmp_path):
    pdask = pytest.importorskip("pystrom.dask")
    pytest.importorskip("dask.dataframe")
    path = tmp_path / "t.arrow"
    pystrom.write_arrow(pystrom.Table.from_arrays({"x": np.arange(4.0)}, device="cpu"), path)
    parts = pdask.scan_arrow(str(path), device="cpu")
    without("dask.dataframe")
    with pytest.raises(MissingDependencyError, match=r"to_dask_dataframe\(\) needs dask's DataFrame support "
                       r"\(pandas\), which is not installed: pip install 'pystrom-gpu\[dask,pandas\]'"):  # fmt: skip
        parts.to_dask_dataframe()


def test_require_returns_the_module():
    import numpy

    assert require("pandas", "anything") is sys.modules["pandas"]
    assert numpy is sys.modules["numpy"]


_BLOCK_ALL = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Absent(importlib.abc.MetaPathFinder):  # an import of pandas fails as for a package not installed
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
sys.meta_path.insert(0, Absent())
for name in BLOCKED:  # the rest: None in sys.modules, so importlib.util.find_spec finds nothing either
    if name != "pandas":  # (pyarrow's pandas shim takes None there for a module, and fails on it)
        sys.modules[name] = None
"""


def test_a_fresh_interpreter_without_any_extra():
    """``import pystrom`` and the CPU backend work with no optional package at all; ``import pystrom.dask``
    and the calls above name their extras instead of a bare ModuleNotFoundError."""
    blocked = {"dask", "distributed", "dask_cuda", "pandas", "psycopg", "numba", "cupy", "kvikio", "nvidia"}
    code = _BLOCK_ALL.format(blocked=sorted(blocked)) + textwrap.dedent(
        """
        import pystrom
        t = pystrom.Table.from_arrays({"x": [1.0, 2.0, None]}, device="cpu")
        assert t.filter("x > 1").num_rows == 1 and t.to_arrow().num_rows == 3
        for what, call in [("import pystrom.dask", lambda: __import__("pystrom.dask")),
                           ("to_pandas", t.to_pandas),
                           ("read_postgres", lambda: pystrom.read_postgres("dbname=x", "SELECT 1")),
                           ("device", lambda: pystrom.Table.from_arrays({"x": [1]}, device="cuda"))]:
            try:
                call()
            except pystrom.MissingDependencyError as e:
                print(what, "->", e)
            else:
                print(what, "-> no error")
        print(sorted(m for m, v in sys.modules.items() if m.split(".")[0] in BLOCKED and v is not None))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == [
        "import pystrom.dask -> pystrom.dask needs dask, which is not installed: pip install 'pystrom-gpu[dask]'",
        "to_pandas -> Table.to_pandas() needs pandas, which is not installed: pip install 'pystrom-gpu[pandas]'",
        "read_postgres -> read_postgres needs psycopg, which is not installed: pip install 'pystrom-gpu[postgres]'",
        "device -> device 'cuda' needs CuPy, which is not installed: pip install 'pystrom-gpu[cuda13]' or "
        "'pystrom-gpu[cuda12]'; or use device='cpu'",
        "[]",
    ]
