"""Arrow IPC files <-> Tables. Reading runs in this order, each module importing only those after it:

1. :mod:`.scan` - ``read_arrow`` / ``scan_arrow``: which files, columns and record batches; batches
   whose statistics (:mod:`.stats`) rule out ``where`` are skipped unread; ``where`` runs on the device.
2. :mod:`.file` - the file's metadata: the schema and where each requested column's buffers sit.
3. :mod:`.direct` - those byte ranges read straight into one Table allocation, through :mod:`.ranges`
   (KvikIO on a GPU, threaded ``pread`` on the CPU), string offsets checked by :mod:`.offsets` before
   use; compressed bodies are laid out by :mod:`.compressed` and inflated a bounded slice at a time by
   :mod:`.inflating` (:mod:`.inflate`), under the same column readers; columns that cannot be read
   that way (dictionary-encoded, large strings, big-endian bodies, compressed streams) go through
   pyarrow on the host, validated first, in :mod:`.host`.

Nothing from the file is followed unchecked: docs/arrow-files.md ("Corrupt and hostile files") lists
every check and where it happens.

Writing: :mod:`.write` (``write_arrow``) turns what the caller holds into record batches, and
:mod:`.file_writer` writes them 64-byte aligned with their statistics, using the flatbuffer messages of
:mod:`.format`, the buffers :mod:`.write_columns` gives for each batch, compressed by :mod:`.deflate`
when asked.
"""

from .scan import ArrowScan, ScanStats, read_arrow, scan_arrow
from .write import write_arrow

__all__ = ["read_arrow", "scan_arrow", "write_arrow", "ArrowScan", "ScanStats"]
