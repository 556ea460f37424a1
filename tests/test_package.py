"""The package as a user meets it: import cost, the public API, the command line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pystrom

from conftest import needs_gpu


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_import_is_fast_and_does_not_load_cupy_or_pyarrow():
    code = (
        "import time, sys; t = time.perf_counter(); import pystrom; "
        "print(time.perf_counter() - t, 'cupy' in sys.modules, 'pyarrow' in sys.modules)"
    )
    best = min(float(_python(code).stdout.split()[0]) for _ in range(3))
    out = _python(code).stdout.split()
    assert best < 1.0, f"import pystrom took {best:.2f} s"
    assert out[1:] == ["False", "False"], "CuPy and pyarrow must load only when used"


def test_cpu_work_never_imports_cupy():
    code = (
        "import sys, pystrom; t = pystrom.Table.from_arrays({'x': [1.0, 2.0]}, device='cpu'); "
        "t.filter([True, False]); t.to_array(); t.to_arrow(); print('cupy' in sys.modules)"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_public_api():
    for name in pystrom.__all__:
        assert hasattr(pystrom, name), name
    assert pystrom.Table.__module__ == "pystrom.table"


def test_default_device_from_environment():
    result = _python("import pystrom; print(pystrom.Table.from_arrays({'x': [1]}).device)", PYSTROM_DEVICE="cpu")
    assert result.stdout.strip() == "cpu", result.stderr
    bad = _python("import pystrom", PYSTROM_REPR_ROWS="many")
    assert bad.returncode != 0 and "PYSTROM_REPR_ROWS='many'" in bad.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pystrom", *args], capture_output=True, text=True, timeout=300)


def test_demo_runs():
    result = _cli("demo", "--rows", "50000", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "50,000 rows x 5 columns on cpu" in out
    assert "to_array x1..x4 (zero copy)" in out
    assert "Table -> Arrow (host)" in out


def test_info_runs():
    result = _cli("info")
    assert result.returncode == 0, result.stderr
    assert f"pystrom {pystrom.__version__}" in result.stdout and "default device" in result.stdout


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["demo", "--rows", "0"], "positive integer"),
        (["demo", "--rows", "many"], "positive integer"),
        (["demo", "--device", "tpu"], "device 'tpu' makes no sense"),
        (["demo", "--bogus"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_cli_mistakes_are_one_line_and_exit_2(args, fragment):
    result = _cli(*args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2  # argparse: usage line + the error


@pytest.mark.gpu
@needs_gpu
def test_demo_uses_the_gpu_when_present():
    result = _cli("demo", "--rows", "200000")
    assert result.returncode == 0, result.stderr
    assert "device: cuda:0" in result.stdout and "on cuda:0" in result.stdout
