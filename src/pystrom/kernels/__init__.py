"""CUDA kernels: sources live beside this file (``*.cu``) and are compiled at run time by NVRTC through CuPy.

One loader for all of them: :func:`kernel` compiles a source once per device (CuPy also caches the
binary on disk) and returns the named function. Each kernel has a CPU twin (the C++ core or NumPy)
that the tests compare it against. Nothing here imports CuPy until a kernel is first asked for.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

__all__ = ["kernel", "launch", "sm_count"]

_THREADS = 256


@functools.cache
def _module(source_name: str, ordinal: int) -> Any:
    import cupy

    code = resources.files(__package__).joinpath(f"{source_name}.cu").read_text(encoding="utf-8")
    with cupy.cuda.Device(ordinal):
        return cupy.RawModule(code=code, options=("--std=c++17",))


@functools.cache
def kernel(source_name: str, function: str, ordinal: int) -> Any:
    """The compiled ``function`` from ``<source_name>.cu`` for GPU ``ordinal``."""
    return _module(source_name, ordinal).get_function(function)


@functools.cache
def sm_count(ordinal: int) -> int:
    """Streaming multiprocessors of GPU ``ordinal`` (sizes grids of kernels that keep per-thread sums)."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(ordinal)["multiProcessorCount"])


def _max_blocks(ordinal: int) -> int:
    return sm_count(ordinal) * 32


def launch(source_name: str, function: str, ordinal: int, work_items: int, args: tuple) -> None:
    """Launch a grid-stride kernel over ``work_items`` items on the current stream of GPU ``ordinal``."""
    if work_items <= 0:
        return
    import cupy

    blocks = min((work_items + _THREADS - 1) // _THREADS, _max_blocks(ordinal))
    with cupy.cuda.Device(ordinal):
        kernel(source_name, function, ordinal)((blocks,), (_THREADS,), args)
