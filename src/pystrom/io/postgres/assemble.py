"""One Table from every partition's staged COPY chunks.

By the time the last stream ends the pump has counted every column's rows, NULLs and string bytes,
so the Table is allocated once at its final size (:func:`pystrom.interop.build.build_table_in_place`)
and each chunk is decoded straight into its own row range (:mod:`.decode`). On a GPU the chunks'
device copies made during streaming may take the room the table needs: they are dropped and the
allocation tried once more, the decoder then copying from the pinned host buffers instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..._layout import ColumnSpec, TablePlan
from ..._types import Layout
from ...errors import CapacityError, OutOfMemoryError
from ...interop.build import build_table_in_place
from .chunks import ChunkLayout, layout_chunks
from .decode import decode_into
from .pump import Staged, drop_device_copies
from .types import PgColumn

__all__ = ["assemble"]

_INT32_MAX = 2**31 - 1


def assemble(backend: Any, cols: Sequence[PgColumn], parts: Sequence[list[Staged]]) -> Any:
    """One Table from all partitions' staged chunks, decoded in place."""
    lay = layout_chunks(parts, len(cols))
    try:
        try:
            return _build(backend, cols, lay)
        except OutOfMemoryError:
            if not drop_device_copies(lay.chunks):
                raise
            return _build(backend, cols, lay)
    finally:  # the decoder has dropped them on success; after a failure they go back now
        drop_device_copies(lay.chunks)


def _build(backend: Any, cols: Sequence[PgColumn], lay: ChunkLayout) -> Any:
    import pyarrow as pa

    specs = []
    for i, col in enumerate(cols):
        size = int(lay.nbytes[i]) if col.type.layout == Layout.VARBINARY else 0
        if size > _INT32_MAX:
            raise CapacityError(
                f"column {col.name!r} ({col.pg_type}) holds {size:,} bytes of strings, more than the 2 GiB "
                f"that 32-bit offsets address: read it in parts (where=) or leave it out"
            )
        specs.append(ColumnSpec(col.name, col.type, lay.nrows, int(lay.nulls[i]), size))
    fields = [pa.field(c.name, c.type.arrow, nullable=True) for c in cols]

    def fill(block: Any, plan: TablePlan) -> None:
        for cp in plan.columns:  # NULLs clear their bit; a column of strings starts at byte 0
            if cp.validity is not None:
                block.array(cp.validity.offset, np.uint8, (cp.validity.size,)).fill(0xFF)
            if cp.type.layout == Layout.VARBINARY:
                block.array(cp.values.offset, np.int32, (1,)).fill(0)
        decode_into(backend, block, plan, cols, lay)

    return build_table_in_place(backend, fields, specs, fill, lay.nrows)
