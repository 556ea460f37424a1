"""The C++ core built with AddressSanitizer and UndefinedBehaviorSanitizer (a separate cmake build of
csrc/ into a temporary folder), then tests/sanitized_workload.py run against it: the sieve's reads, the
UTF-8 checks, and mutated plain and compressed Arrow files through every read entry point. Any report
(a read or write outside a buffer, a use after free, undefined behaviour) ends the run and fails here.
Skipped, saying why, where cmake, pybind11, or the compiler's sanitizer runtimes are missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _tools() -> tuple[str, str, str] | str:
    """(cmake, pybind11's cmake folder, libasan path), or why not."""
    cmake = shutil.which("cmake")
    if cmake is None:
        return "no cmake"
    try:
        import pybind11
    except ImportError:
        return "no pybind11"
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return "no C++ compiler"
    asan = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not asan or not os.path.isabs(asan) or not os.path.exists(asan):
        return "the compiler has no libasan"
    return cmake, pybind11.get_cmake_dir(), asan


@pytest.fixture(scope="module")
def sanitized_package(tmp_path_factory):
    tools = _tools()
    if isinstance(tools, str):
        pytest.skip(f"no sanitizer build: {tools}")
    cmake, pybind11_dir, asan = tools
    build = tmp_path_factory.mktemp("asan-build")
    flags = "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
    configure = [cmake, "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug", f"-DCMAKE_CXX_FLAGS={flags}",
                 f"-DCMAKE_MODULE_LINKER_FLAGS={flags}", f"-DPython_EXECUTABLE={sys.executable}",
                 f"-Dpybind11_DIR={pybind11_dir}"]  # fmt: skip
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    for cmd in (configure, [cmake, "--build", str(build), "-j", "2"]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, f"{cmd[:3]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (core,) = build.glob("_core*.so")
    # the package's sources beside the sanitized extension (links to the checkout's files)
    package = tmp_path_factory.mktemp("asan-src")
    source = ROOT / "src" / "pystrom"
    for path in source.rglob("*"):
        target = package / "pystrom" / path.relative_to(source)
        if path.is_dir() or path.suffix == ".so" or "__pycache__" in path.parts:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(path)
    shutil.copy(core, package / "pystrom" / core.name)
    return package, asan


def test_the_read_paths_under_address_and_undefined_behavior_sanitizers(sanitized_package, tmp_path):
    package, asan = sanitized_package
    env = {
        **os.environ,
        "LD_PRELOAD": asan,
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "PYTHONPATH": os.pathsep.join([str(package), str(ROOT / "tests")]),
    }
    check = subprocess.run([sys.executable, "-c", "import pystrom._core as c; print(c.__file__)"], env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0 and str(package) in check.stdout, check.stderr[-2000:]
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "sanitized_workload.py"), str(tmp_path), "40"],
                         env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    report = run.stderr[-6000:]
    assert run.returncode == 0 and "Sanitizer" not in run.stderr and "runtime error" not in run.stderr, report
    assert "sanitized workload done" in run.stdout, run.stdout[-2000:]
    print(run.stdout.strip())
