"""``write_arrow``: whatever the caller holds -> record batches -> one Arrow IPC file.

Tables, pyarrow data, scans and iterables of them are turned into a stream of record batches here;
:mod:`.write.writer` lays each batch's buffers out 64-byte aligned with its min/max statistics
(:mod:`.file.stats`), compressed by :mod:`.codecs.compress` when asked, and writes the file.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import os
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from ...._settings import defaults
from ....errors import SchemaMismatchError
from ....interop.arrow_import import as_arrow_table
from ....table import Table
from ..codecs.compress import check_compression
from ..scan.scan import ArrowScan
from .writer import write_ipc_file

__all__ = ["write_arrow"]


def _device_batches(table: Table, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """A GPU table's record batches, each brought to the host when the writer gets near it: the next two
    copying down on a thread while the writer writes this one, and never the whole table on the host
    (a whole ``to_arrow`` first held a copy of it all and made the writer wait for it)."""
    starts = range(0, table.num_rows, batch_rows)

    def fetch(start: int) -> list[pa.RecordBatch]:
        return table.slice(start, batch_rows).to_arrow().to_batches()

    with cf.ThreadPoolExecutor(1, thread_name_prefix="pystrom-to-host") as pool:
        pending = collections.deque(pool.submit(fetch, start) for start in starts[:_BATCHES_AHEAD])
        try:
            for start in starts[_BATCHES_AHEAD:]:
                batches = pending.popleft().result()
                pending.append(pool.submit(fetch, start))
                yield from batches
            while pending:
                yield from pending.popleft().result()
        finally:  # the writer stopped early (an error): nothing left copying for it
            for future in pending:
                future.cancel()


_BATCHES_AHEAD = 2


def _record_batches(data: Any, batch_rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    if isinstance(data, Table):
        if data.num_rows and data._live().backend.kind == "cuda":
            return data.schema, _device_batches(data, batch_rows)
        return data.schema, iter(data.to_arrow().to_batches(max_chunksize=batch_rows))
    if isinstance(data, ArrowScan):
        scan = data
        return scan.schema, (b for t in scan for b in t.to_arrow().to_batches(max_chunksize=batch_rows))
    if isinstance(data, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)) or hasattr(data, "__arrow_c_stream__"):
        table = as_arrow_table(data)
        return table.schema, iter(table.to_batches(max_chunksize=batch_rows))
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        items = iter(data)
        try:
            head = next(items)
        except StopIteration:
            raise ValueError("write_arrow got an empty iterable: there is no schema to write") from None
        schema, first = _record_batches(head, batch_rows)

        def rest() -> Iterator[pa.RecordBatch]:
            yield from first
            for item in items:
                s, batches = _record_batches(item, batch_rows)
                if s != schema:
                    raise SchemaMismatchError(f"write_arrow: a later item has schema {s}, the first had {schema}")
                yield from batches

        return schema, rest()
    raise TypeError(
        "write_arrow writes a pystrom Table, a pyarrow Table/RecordBatch/reader, a scan, or an iterable of those; "
        f"got {type(data).__name__}"
    )


def write_arrow(
    data: Any,
    path: Any,
    batch_rows: int = 1 << 20,
    stats: bool = True,
    footer_stats: bool = False,
    compression: str | None = None,
    compression_level: int | None = None,
) -> Any:
    """Write an Arrow IPC file (Feather v2) that read_arrow/scan_arrow read at full speed.

    Every buffer starts on a 64-byte boundary of the file, and with ``stats=True`` each record batch
    carries min/max statistics of its columns in the key PG-Strom's pg2arrow writes and Arrow_Fdw
    reads (``min_max_stats.<column>`` in the batch's custom metadata), which lets scans with a
    ``where`` skip batches without reading them.

    Parameters
    ----------
    data : Table, pyarrow Table/RecordBatch/RecordBatchReader, ArrowScan, or an iterable of those
        Streamed batch by batch (an iterable is never held in memory at once).
    path : str or path
        The file to write, under a temporary name first and put in place when complete: a reader
        opening ``path`` meanwhile sees the old file or the new one, whole, never a part. An existing
        file is swapped atomically with the new one (``renameat2(RENAME_EXCHANGE)`` on Linux) and
        then removed, which spares ext4's flush of a file renamed over another. Not durable: like
        ``write_feather``, nothing is fsynced, so after a power loss the new file may be incomplete.
    batch_rows : int
        Rows per record batch for inputs that are not already batches (the statistics' granularity).
    stats : bool
        Write min/max statistics.
    footer_stats : bool
        Also write PG-Strom's older per-field ``min_values``/``max_values`` lists in the footer.
        PG-Strom then reads only those (they cannot hold strings), so they are off by default. The
        footer also gets the fingerprint of the batches they describe: pystrom trusts the lists only
        while it matches (docs/arrow-files.md), so copies of them in rewritten files are ignored.
    compression : None, "lz4" or "zstd"
        Compress the record batch bodies the way Arrow does (``BodyCompression``: every buffer one LZ4
        frame or Zstandard frame after its int64 uncompressed length; a buffer that would not shrink is
        stored raw after -1), readable by pyarrow, polars and ``read_arrow``. Buffers are compressed in
        parallel on ``pystrom.defaults.compress_threads`` threads (0: the CPU count), or, for a Table or
        scan on a GPU with ``"lz4"`` and no level, on that GPU (``pystrom.defaults.gpu_compressor``;
        independent 64 KiB blocks, about liblz4's ratio), and still start on 64-byte file offsets; the
        statistics are written as without compression. None writes uncompressed, which ``read_arrow``
        reads fastest.
    compression_level : int, optional
        The codec's level: zstd -131072..22 (default 1), lz4 1..12 (pyarrow's ranges); None picks the
        codec's default.

    Returns
    -------
    WriteSummary
        path, num_rows, num_batches, bytes_written.
    """
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows <= 0:
        raise ValueError(f"batch_rows must be a positive int; got {batch_rows!r}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file name; got {type(path).__name__}")
    compression, compression_level = check_compression(compression, compression_level)
    schema, batches = _record_batches(data, batch_rows)
    return write_ipc_file(
        os.fspath(path),
        schema,
        batches,
        stats=stats,
        footer_stats=footer_stats,
        compression=compression,
        compression_level=compression_level,
        compress_on=_gpu_compressor(data, compression, compression_level),
    )


def _gpu_compressor(data: Any, compression: str | None, level: int | None) -> Any:
    """The GPU that compresses: the one a Table (or a scan) is on, for LZ4 at its default level, unless
    ``pystrom.defaults.gpu_compressor`` is ``"host"``."""
    if compression != "lz4" or level is not None or defaults.gpu_compressor != "kernel":
        return None
    backend = data._live().backend if isinstance(data, Table) else data.backend if isinstance(data, ArrowScan) else None
    return backend if backend is not None and backend.kind == "cuda" else None
