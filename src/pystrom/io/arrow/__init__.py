"""Arrow IPC files <-> Tables, in five stages; each subpackage imports only the ones listed before it:

1. :mod:`.file` - the file itself: its flatbuffer metadata (:mod:`.file.format`), the schema and where
   each requested column's buffers sit, checked (:mod:`.file.metadata`), byte ranges read by KvikIO on a
   GPU or threaded ``pread`` on the CPU (:mod:`.file.ranges`), and PG-Strom's min/max statistics
   (:mod:`.file.stats`).
2. :mod:`.codecs` - LZ4_FRAME and ZSTD bodies: what a group of compressed frames needs
   (:mod:`.codecs.plan`), decoded on the CPU (:mod:`.codecs.host`, with the ZSTD structure check) or the
   GPU (:mod:`.codecs.device`), or on the host into pinned staging for a GPU read
   (:mod:`.codecs.staged`); compression for writing (:mod:`.codecs.compress`).
3. :mod:`.read` - record batches into one Table allocation: the batches' layouts (:mod:`.read.batches`,
   :mod:`.read.compressed_layouts`), their byte ranges read straight into place (:mod:`.read.direct`,
   through :mod:`.read.compressed_reads` for compressed bodies), string offsets checked before use
   (:mod:`.read.offsets`), and the columns pyarrow reads on the host, validated first (:mod:`.read.host`).
4. :mod:`.scan` - ``read_arrow`` / ``scan_arrow``: which files, columns and record batches; batches
   whose statistics rule out ``where`` are skipped unread; ``where`` runs on the device, or sieves
   the rows on the CPU (:mod:`.scan.sieve`).
5. :mod:`.write` - ``write_arrow``: what the caller holds (Tables, Arrow data, scans) as record batches
   in a 64-byte aligned file with statistics, replaced atomically.

Nothing from the file is followed unchecked: docs/arrow-files.md ("Corrupt and hostile files") lists
every check and where it happens. tests/test_layering.py holds the stages to this order.
"""

from .scan import ArrowScan, ScanStats, read_arrow, scan_arrow
from .write import write_arrow

__all__ = ["read_arrow", "scan_arrow", "write_arrow", "ArrowScan", "ScanStats"]
