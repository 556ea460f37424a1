"""Decode every staged chunk of a read into the Table's allocation: one entry point, two decoders.

:func:`decode_into` runs once the Table is allocated (by :mod:`.assemble`): on a GPU the CUDA kernels
of :mod:`.decode_device`; on the CPU the C++ decoder (``_core.pg_decode``, the kernels' twin), one
chunk per thread without the GIL. Either way a bad value raises naming its column and table row.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...memory.layout import TablePlan
from ...memory.transfer import worker_threads
from .chunks import ChunkLayout, decode_failure, descriptors
from .columns import PgColumn
from .decode_device import decode_chunks
from .pump import decode_cpu

__all__ = ["decode_into"]


def decode_into(backend: Any, block: Any, plan: TablePlan, cols: Sequence[PgColumn], lay: ChunkLayout) -> None:
    """Write every chunk's rows into ``block`` (laid out by ``plan``), on the backend's device."""
    if backend.kind == "cuda":
        decode_chunks(backend, block, plan, cols, lay)
    else:
        _decode_host(block, plan, cols, lay)


def _decode_host(block: Any, plan: TablePlan, cols: Sequence[PgColumn], lay: ChunkLayout) -> None:
    descs = [descriptors(cols, plan, block.ptr, lay, i) for i in range(len(lay.chunks))]
    jobs = list(zip(lay.chunks, lay.row_bases, descs))
    if len(jobs) <= 1:
        results = [decode_cpu(*job) for job in jobs]
    else:
        with ThreadPoolExecutor(max_workers=worker_threads()) as pool:  # the decoder runs without the GIL
            results = list(pool.map(lambda job: decode_cpu(*job), jobs))
    for i, (code, row, column) in enumerate(results):
        if code:
            raise decode_failure(cols, lay, i, code, row, column)
