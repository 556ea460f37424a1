"""The host path: columns that cannot be read straight into the table go through pyarrow, validated.

Which columns: those whose file layout is not pystrom's (dictionary-encoded, large or view strings,
lists of booleans, month_interval and day_time_interval, widened by :mod:`.read.intervals`)
and every column of a file whose bodies pyarrow writes into fresh memory and pystrom does not lay out
itself (compressed IPC streams, big-endian bodies it byte-swaps; compressed *files* are inflated by
:mod:`.read.compressed_reads` for the direct path). In this order, per record batch:

1. pyarrow reads the batch (:meth:`.file.metadata.ArrowFile.host_batch`: inflating, byte-swapping);
2. each column is checked with ``validate(full=True)``: pyarrow's IPC reader checks only the
   structure, not the data (offsets, dictionary indices, UTF-8), and its compute functions trust
   their input, so an unvalidated corrupt dictionary crashes ``dictionary_decode`` (SIGSEGV/SIGBUS).
   The full validation also judges values no read depends on (a date64 that is not a whole day, a
   time of day past midnight, a decimal wider than its precision): pyarrow's reader accepts those,
   and so does the direct path (a little-endian file), so they are validated as their storage
   (:func:`value_blind`): the big-endian twin of a file reads as the file does;
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

__all__ = ["host_columns", "value_blind"]


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
                _validate(arr)
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


def value_blind(t: pa.DataType) -> pa.DataType:
    """``t`` with every type whose values pyarrow's full validation judges (date64, time32/64, decimals)
    replaced by its storage (int64, int32/64, fixed_size_binary), nested types and dictionaries
    rebuilt around them: the layout, and so every structural check, stays the same."""
    if pa.types.is_date64(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_decimal(t):
        return pa.binary(t.byte_width)
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, value_blind(t.value_type), t.ordered)
    if isinstance(t, pa.BaseExtensionType):
        return value_blind(t.storage_type)
    if pa.types.is_map(t):
        return pa.map_(_blind_field(t.key_field), _blind_field(t.item_field), t.keys_sorted)
    if pa.types.is_list(t):
        return pa.list_(_blind_field(t.value_field))
    if pa.types.is_large_list(t):
        return pa.large_list(_blind_field(t.value_field))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_blind_field(t.value_field), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([_blind_field(t.field(i)) for i in range(t.num_fields)])
    return t  # unions, views, run-end encoded...: validated as they are


def _blind_field(f: pa.Field) -> pa.Field:
    return f.with_type(value_blind(f.type))


def _validate(arr: pa.Array) -> None:
    """pyarrow's full validation of ``arr``'s structure (offsets, dictionary indices, UTF-8), on the values
    as the reader produced them (byte-swapped from a big-endian body), not of value domains (module docstring)."""
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    blind = value_blind(arr.type)
    (arr if blind == arr.type else arr.view(blind)).validate(full=True)
