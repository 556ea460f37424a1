"""CUDA kernels: sources live beside this file (``*.cu``) and are compiled at run time by NVRTC through CuPy.

One loader for all of them: :func:`kernel` compiles a source once per device (CuPy also caches the
binary on disk) and returns the named function. Each kernel has a CPU twin (the C++ core or NumPy)
that the tests compare it against. Nothing here imports CuPy until a kernel is first asked for.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

__all__ = ["kernel", "launch", "sm_count", "generated", "launch_function"]

_THREADS = 256


@functools.cache
def _module(source_name: str, ordinal: int, defines: tuple[str, ...]) -> Any:
    import cupy

    code = resources.files(__package__).joinpath(f"{source_name}.cu").read_text(encoding="utf-8")
    with cupy.cuda.Device(ordinal):
        return cupy.RawModule(code=code, options=("--std=c++17", *(f"-D{d}" for d in defines)))


@functools.cache
def kernel(source_name: str, function: str, ordinal: int, defines: tuple[str, ...] = ()) -> Any:
    """The compiled ``function`` from ``<source_name>.cu`` for GPU ``ordinal``. ``defines`` (``"NAME=value"``)
    are preprocessor definitions a source reads to build only part of itself: NVRTC compiles a whole
    source at once, and ``logistic.cu``'s 80 kernels took ~40 s on a cold cache (ml/_narrow.py
    logit_kernel builds the 3 a fit uses)."""
    return _module(source_name, ordinal, defines).get_function(function)


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
    launch_function(kernel(source_name, function, ordinal), ordinal, work_items, args)


def launch_function(function: Any, ordinal: int, work_items: int, args: tuple, threads: int = _THREADS) -> None:
    """Launch a compiled grid-stride kernel (from :func:`kernel` or :func:`generated`) over ``work_items``,
    in blocks of ``threads`` (a kernel whose shared memory is sized for fewer than 256 says so)."""
    if work_items <= 0:
        return
    import cupy

    blocks = min((work_items + threads - 1) // threads, max(1, _max_blocks(ordinal) * _THREADS // threads))
    with cupy.cuda.Device(ordinal):
        function((blocks,), (threads,), args)


# Generated sources (one per predicate and schema) are many but each is asked for again on every
# batch of a scan: keep the most recent ones compiled, keyed by the source text itself.
@functools.lru_cache(maxsize=256)
def generated(
    source: str, function: str, ordinal: int, helpers: tuple[str, ...] = (), options: tuple[str, ...] = ("--std=c++17",)
) -> Any:
    """Compile generated CUDA ``source`` for GPU ``ordinal``, after the hand-written ``<helpers>.cu`` files.

    Memoised per (source text, function, device, helpers, NVRTC options): callers build the source
    once (per predicate and schema), never in a hot path, and may then ask for the kernel on every call.
    """
    import cupy

    parts = [resources.files(__package__).joinpath(f"{name}.cu").read_text(encoding="utf-8") for name in helpers]
    with cupy.cuda.Device(ordinal):
        module = cupy.RawModule(code="\n".join([*parts, source]), options=options)
        return module.get_function(function)
