"""Shared fixtures. Markers are registered in pyproject.toml (gpu, slow)."""

from __future__ import annotations

import pytest

from pystrom.memory.backend import cuda_device_count

pytest_plugins = ["fix_pg"]  # a throwaway real PostgreSQL cluster (fixtures pg_cluster, pg)

HAVE_GPU = cuda_device_count() > 0
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU with CuPy in this environment")


def pytest_configure(config: pytest.Config) -> None:
    import hypothesis

    hypothesis.settings.register_profile("ci", deadline=None, max_examples=60, print_blob=True)
    hypothesis.settings.register_profile("gpu", deadline=None, max_examples=40, print_blob=True)
    hypothesis.settings.load_profile("ci")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Skips as a few lines, not one per test location: every GPU test skipped here on one line (a
    machine without a GPU skips hundreds), the other skips one line per reason."""
    import collections

    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return

    def reason(report) -> str:
        text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return text.removeprefix("Skipped: ")

    def gpu_test(report) -> bool:  # a module skipped as a whole (importorskip) is a CollectReport: no keywords
        return "gpu" in getattr(report, "keywords", ())

    gpu = collections.Counter(reason(r) for r in skipped if gpu_test(r))
    other = collections.Counter(reason(r) for r in skipped if not gpu_test(r))
    if gpu:
        why = next(iter(gpu)) if len(gpu) == 1 else "; ".join(f"{n}: {text}" for text, n in gpu.most_common())
        terminalreporter.write_line(f"SKIPPED {sum(gpu.values())} GPU tests (-m gpu on a GPU machine): {why}")
    for text, n in other.most_common():
        terminalreporter.write_line(f"SKIPPED {n}: {text}")


# Every test that takes `device` runs on the CPU and on a GPU; the GPU run is marked `gpu` and skipped
# (reported as skipped) where there is none.
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_gpu])]


def device_memory_in_use(device: str) -> int:
    """Bytes of CuPy's device pool in use (0 on the CPU), after a collection: device arrays of earlier
    tests that only the collector frees would otherwise count as the current test's."""
    if device == "cpu":
        return 0
    import gc

    import cupy

    gc.collect()
    cupy.cuda.Device().synchronize()
    return cupy.get_default_memory_pool().used_bytes()


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def xp(device: str):
    if device == "cpu":
        import numpy

        return numpy
    import cupy

    return cupy
