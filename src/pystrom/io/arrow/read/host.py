"""The host path: columns that cannot be read straight into the table go through pyarrow, validated.

Which columns: those whose file layout is not pystrom's (dictionary-encoded, large or view strings,
lists of booleans, month_interval and day_time_interval, widened by :mod:`.read.intervals`)
and every column of a file whose bodies pyarrow writes into fresh memory and pystrom does not lay out
itself (compressed IPC streams, big-endian bodies it byte-swaps; compressed *files* are inflated by
:mod:`.read.compressed_reads` for the direct path). In this order, per record batch:

1. pyarrow reads the batch (:meth:`.file.metadata.ArrowFile.host_batch`: inflating, byte-swapping);
2. each column is checked with ``validate(full=True)``: pyarrow's IPC reader checks only the
   structure, not the data (offsets, dictionary indices, UTF-8), and its compute functions trust
   their input, so an unvalidated corrupt dictionary crashes ``dictionary_decode`` (SIGSEGV/SIGBUS);
3. the columns are normalised (dictionaries decoded, strings narrowed) into
   :class:`~pystrom.interop.build.HostColumn` for the table builder.

Every error pyarrow raises on the way becomes a FileFormatError naming the file, the record batch and
the column. The full validation reads every byte of these columns once more on the host; next to
inflating a compressed body or decoding a dictionary that costs little.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ....errors import Error
from ....interop.arrow_import import host_column
from ....interop.build import HostColumn
from ..file.metadata import ARROW_ERRORS, LEGACY_INTERVALS, ArrowFile, corrupt
from .intervals import widen_interval
from .layouts import Layouts

__all__ = ["host_columns"]


def host_columns(file: ArrowFile, batches: Layouts, names: Sequence[str]) -> dict[str, HostColumn]:
    """``names`` of ``batches`` read, validated and normalised on the host."""
    if not names:
        return {}
    schema = file.schema
    pieces: dict[str, list[pa.Array]] = {name: [] for name in names}
    for index, num_rows in zip(batches.index.tolist(), batches.num_rows.tolist()):
        batch = file.host_batch(index, names)
        if batch.num_rows != num_rows:
            raise corrupt(file.path, f"record batch {index} ({batch.num_rows} rows, the plan said {num_rows})")
        for i, name in enumerate(names):
            try:
                if batch.schema.field(i).type.id in LEGACY_INTERVALS:  # pyarrow cannot wrap it: checked as a batch
                    batch.select([i]).validate(full=True)
                    arr = widen_interval(batch, i)
                else:
                    arr = batch.column(i)
                if len(arr) != batch.num_rows:
                    raise ValueError(f"{len(arr)} rows in a batch of {batch.num_rows}")
                arr.validate(full=True)
            except ARROW_ERRORS as exc:
                raise corrupt(file.path, f"record batch {index}, column {name!r}", exc) from None
            pieces[name].append(arr)
    out = {}
    for name in names:
        field = schema.field(name)
        if field.type.id in LEGACY_INTERVALS:
            field = pa.field(name, pa.month_day_nano_interval(), field.nullable, field.metadata)
        try:
            chunks = pa.chunked_array(pieces[name], type=field.type)
            out[name] = host_column(name, field, chunks)
        except Error:
            raise  # pystrom's own (a capacity limit, an unsupported extension type): already named
        except ARROW_ERRORS as exc:
            raise corrupt(file.path, f"column {name!r}", exc) from None
    return out
