"""Where the bytes of each column sit in an Arrow IPC file, worked out from its metadata alone.

pyarrow parses the footer and the record batch messages of a memory-mapped file; for an uncompressed
body, the buffers it hands back are slices of the mapping, so ``buffer.address - base`` is the
buffer's file offset. Only the metadata pages are touched on the host: the data pages are later read
by KvikIO (or threaded ``pread`` on the CPU backend) straight to their place in the table.

A compressed (or big-endian: pyarrow swaps it) body cannot be sliced like that (pyarrow writes it
into fresh memory): where this path meets one, the file is marked ``compressed`` and read on the host
(:mod:`.read.host`). Compressed files normally never get here: :mod:`.read.batches` and
:mod:`.read.compressed_layouts` lay them out from the raw messages (:class:`Packed` ranges). IPC
stream files (no footer), also the pre-0.15 "legacy" streams without the continuation marker, are
walked message by message in the same way.

What is checked here, before anything reads a data page (the file may come from anyone): every
requested column's type is one pystrom can hold (else UnsupportedTypeError naming it); each column's
row count equals its batch's; null counts lie in [0, rows]; every buffer lies inside the file and is
as long as its row count needs. pyarrow's own parser checks the flatbuffers (its verifier bounds
their depth and size) and that buffers lie inside their body; every error it raises becomes a
FileFormatError naming the file, the record batch and the column. String offsets are data, checked
once read (:mod:`.read.offsets`); the footer statistics are trusted only with their fingerprint
(:attr:`ArrowFile.footer_stats_trusted`, :mod:`.file.stats`).
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from ...._types import ColumnType, Layout, column_type
from ....errors import ColumnNotFoundError, FileFormatError, SchemaMismatchError, UnsupportedTypeError
from .boundary import check_columns_argument, path_name
from .format import MAX_FOOTER_BYTES, FooterError, read_footer
from .ranges import read_pieces
from .stats import FINGERPRINT_KEY, FOOTER_MAX_KEY, FOOTER_MIN_KEY, BlocksFingerprint

__all__ = [
    "Range",
    "Packed",
    "PACKED_BASE",
    "ChunkLayout",
    "BatchLayout",
    "ArrowFile",
    "open_arrow_file",
    "ARROW_ERRORS",
    "check_types",
    "direct_type",
]

_FILE_MAGIC = b"ARROW1"
_CONTINUATION = b"\xff\xff\xff\xff"

# What pyarrow raises on a corrupt file: its own classes (ArrowInvalid, ArrowIndexError,
# ArrowNotImplementedError, ArrowMemoryError, ... all ArrowException), and plain IndexError, KeyError
# (an unknown type id), UnicodeDecodeError/ValueError, OverflowError from its Python layer.
ARROW_ERRORS = (pa.ArrowException, OSError, ValueError, IndexError, KeyError, OverflowError, MemoryError)


def _decode_every_name(schema: pa.Schema) -> None:
    """pyarrow decodes names and metadata from the file lazily, so a name that is not UTF-8 (a corrupt
    file) raises wherever it is first read: for a struct's field inside a list, the type check of a
    scan, as a bare UnicodeDecodeError (fuzzing found it). Read every one, nested too, while the schema
    is parsed and its errors are the file's."""
    _ = schema.metadata
    fields = list(schema)
    while fields:  # no recursion: the nesting depth is the file's
        field = fields.pop()
        _ = field.name, field.metadata
        t = field.type
        while isinstance(t, (pa.DictionaryType, pa.BaseExtensionType)):  # they wrap the type with the fields
            t = t.value_type if isinstance(t, pa.DictionaryType) else t.storage_type
        fields.extend(t.field(i) for i in range(t.num_fields))


def corrupt(path: str, what: str, exc: BaseException | None = None) -> FileFormatError:
    """The FileFormatError for a corrupt ``path``; ``what`` names the record batch and column."""
    why = f": {type(exc).__name__}: {exc}" if exc is not None else ""
    return FileFormatError(f"{path!r}: {what} is corrupt{why}")


@dataclass(frozen=True)
class Range:
    """A byte range of the file."""

    offset: int
    size: int


@dataclass(frozen=True)
class Packed(Range):
    """A buffer stored compressed: ``offset`` is not a file offset but its place among the file's
    decompressed buffers (at or above :data:`PACKED_BASE`, beyond any file), ``size`` its decompressed
    length as the file claims it (checked against the column, and against what the frame produces,
    by :mod:`.read.compressed_reads`)."""

    frame: Range  # the compressed bytes in the file (after the 8-byte length prefix)
    codec: str  # "lz4_frame" or "zstd"
    what: str  # "record batch i, column 'x', buffer k (values)", for errors


PACKED_BASE = 1 << 56  # Packed offsets start here; file offsets stay below (no file is 64 PiB)


@dataclass(frozen=True)
class ChunkLayout:
    """One column of one record batch: its buffers' file ranges (IPC arrays start at offset 0)."""

    length: int
    null_count: int
    validity: Range | None  # None when the batch stores no bitmap (no NULLs)
    values: Range  # values; int32 offsets for strings and lists; the bit-packed values for booleans;
    # a fixed_size_list's elements
    data: Range | None  # string/binary bytes; a list's elements
    child_length: int = 0  # elements of a list column's child array
    child_null_count: int = 0
    child_validity: Range | None = None  # the elements' bitmap, only when child_null_count > 0

    @property
    def nbytes(self) -> int:
        n = self.values.size  # spelled out: summed over every chunk of a file (read_arrow's total)
        if self.validity is not None:
            n += self.validity.size
        if self.data is not None:
            n += self.data.size
        if self.child_validity is not None:
            n += self.child_validity.size
        return n


@dataclass
class BatchLayout:
    """A record batch: its position, row count, the selected columns' chunks and min/max statistics."""

    index: int
    num_rows: int
    chunks: dict[str, ChunkLayout]
    stats: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks.values())


def direct_type(arrow_type: pa.DataType, name: str) -> ColumnType | None:
    """The column type when the file's buffers are already in pystrom's layout, else None."""
    if arrow_type.id in LEGACY_INTERVALS:
        return None  # widened on the host
    try:
        ctype = column_type(arrow_type, name)
    except UnsupportedTypeError:
        return None  # dictionary, large/view strings...: normalised on the host
    storage = arrow_type.storage_type if isinstance(arrow_type, pa.BaseExtensionType) else arrow_type
    if ctype.layout == Layout.VARBINARY and not (pa.types.is_string(storage) or pa.types.is_binary(storage)):
        return None
    if ctype.layout in Layout.NESTED and ctype.storage.kind == "b":
        return None  # bit-packed elements: read on the host (validated there)
    if ctype.layout in Layout.COMPOSED or ctype.shape:
        return None  # structs, lists of strings or structs, nested fixed_size_lists: assembled on the host
    return ctype


class ArrowFile:
    """An open Arrow IPC file (or stream): schema, batch metadata, and host access for the slow paths."""

    def __init__(self, path: str):
        self.path = path
        self._mmap = None
        self._raw: Any = None
        # scan_arrow reads several groups at once: pyarrow's file reader is not documented as safe
        # for concurrent calls, so its batches are taken one at a time.
        self._reader_lock = threading.Lock()
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path!r} is a directory, not an Arrow file")
        if not os.path.exists(path):
            raise FileNotFoundError(f"Arrow file {path!r} does not exist")
        if not os.access(path, os.R_OK):
            raise PermissionError(f"Arrow file {path!r} cannot be read: permission denied")
        if os.path.getsize(path) < 8:
            raise FileFormatError(f"{path!r} is not an Arrow IPC file or stream: it holds fewer than 8 bytes")
        # small reads (read_pieces) by pread: through the mapping each page touched costs a fault and an unmap
        self._raw = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        # map the file just opened, not whatever the path names a moment later (a writer may replace it)
        same = f"/proc/self/fd/{self._raw.fileno()}"
        try:
            self._mmap = pa.memory_map(same if os.path.exists(same) else path, "r")
        except BaseException:
            self._raw.close()
            raise
        self.size = self._mmap.size()
        # The whole mapping as one buffer, without asking pyarrow to read it: its reads madvise(WILLNEED)
        # what they return, which for the whole file cost ~130 us a call (64 MB cached) and starts readahead
        # of every page of a file not cached. A buffer of the first 8 bytes holds the mapping (as pyarrow's
        # own slices do), and the whole-file buffer holds that one.
        first = self._mmap.read_buffer(8)
        self._mmap.seek(0)
        self._whole = pa.foreign_buffer(first.address, self.size, base=first)
        self._base = self._whole.address
        head = self._whole[:8].to_pybytes()
        self.is_stream = not head.startswith(_FILE_MAGIC)
        # A stream written before Arrow 0.15 has no continuation marker: it starts with the int32
        # length of the schema flatbuffer (pyarrow still reads those).
        legacy_length = struct.unpack("<i", head[:4])[0]
        self.legacy_stream = self.is_stream and not head.startswith(_CONTINUATION)
        if self.legacy_stream and not 8 <= legacy_length <= self.size - 4:
            self.close()
            raise FileFormatError(
                f"{path!r} is not an Arrow IPC file or stream (it starts with {head!r}: neither the file magic "
                "'ARROW1', nor a stream's continuation marker, nor the schema length of a pre-0.15 legacy stream)"
            )
        self._file_reader: Any = None
        self._footer_trusted: bool | None = None
        self._stream_batches: list[tuple[pa.RecordBatch, Any]] | None = None
        try:
            if self.is_stream:
                reader = ipc.open_stream(self._whole)
                self.schema = reader.schema
                self._stream_batches = []
                while True:
                    try:
                        self._stream_batches.append(reader.read_next_batch_with_custom_metadata())
                    except StopIteration:
                        break
                self.num_batches = len(self._stream_batches)
            else:
                # The footer (and the schema in it) parsed over the whole-file buffer rather than the mapping:
                # pyarrow's reads of a mapping lock it and madvise(WILLNEED) each range they return, ~50 us a
                # file after a 64 MB read. One posix_fadvise(WILLNEED) of the footer (as pyarrow's madvise did)
                # brings those pages in first, so touching them through the mapping reads nothing ahead (a
                # fault on a page not cached reads megabytes around it). Batches, if asked for, are read
                # through the mapping (record_batch).
                self._advise_footer()
                footer = ipc.open_file(self._whole)
                self.schema = footer.schema
                self.num_batches = footer.num_record_batches
            _decode_every_name(self.schema)
            self.raw_schema = self.schema  # with any footer statistics, for the statistics reader
            self.schema = _without_footer_stats(self.schema)
        except ARROW_ERRORS as exc:
            # A file's footer ends with the magic too: a file read while its writer is still at it, or cut short
            # by a full disk or an interrupted copy, starts as one and does not end as one.
            cut = not self.is_stream and self.size >= 6 and self._whole.slice(self.size - 6).to_pybytes() != b"ARROW1"
            self.close()
            kind = "pre-0.15 legacy IPC stream" if self.legacy_stream else "Arrow IPC file"
            why = (" (it starts with the file magic 'ARROW1' but does not end with it: cut short, or still being"
                   " written)") if cut else ""  # fmt: skip
            raise FileFormatError(f"{path!r} is not a readable {kind}{why}: {type(exc).__name__}: {exc}") from None
        self.compressed = False  # pyarrow inflated (or byte-swapped) a body: every column goes through the host
        # each record batch's custom metadata where :mod:`.read.batches` parsed the messages itself (asking
        # pyarrow parses the batch again, and inflates a compressed one whole): KeyValueMetadata, {} for none
        self.batch_metadata: list[Any] | None = None

    def _advise_footer(self) -> None:
        """Start reading the footer's pages (the tail's length as written, at most MAX_FOOTER_BYTES; what
        pyarrow then reads is its own business)."""
        if not hasattr(os, "posix_fadvise"):
            return
        fd = self._raw.fileno()
        try:
            tail = os.pread(fd, 10, self.size - 10)
            n = struct.unpack("<i", tail[:4])[0] if len(tail) == 10 else 0
            n = n if 0 < n <= min(MAX_FOOTER_BYTES, self.size - 10) else 0
            os.posix_fadvise(fd, self.size - 10 - n, n + 10, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # only a hint

    # -- batches ---------------------------------------------------------------------------------

    def record_batch(self, index: int) -> tuple[pa.RecordBatch, Any]:
        """Batch ``index`` with its custom metadata (zero-copy over the mapping when uncompressed)."""
        if self._stream_batches is not None:
            return self._stream_batches[index]
        try:
            with self._reader_lock:
                if self._file_reader is None:
                    self._file_reader = ipc.open_file(self._mmap)
                return self._file_reader.get_batch_with_custom_metadata(index)
        except ARROW_ERRORS as exc:
            raise corrupt(self.path, f"record batch {index}", exc) from None

    @property
    def footer_stats_trusted(self) -> bool:
        """Whether the footer's min/max lists describe this file's batches (the rule in :mod:`.file.stats`):
        the footer's custom metadata holds the fingerprint of the record batch messages, and it matches."""
        if self._footer_trusted is None:
            self._footer_trusted = not self.is_stream and self._fingerprint_matches()
        return self._footer_trusted

    def _fingerprint_matches(self) -> bool:
        whole = self._whole
        tail = whole[self.size - 10 :].to_pybytes()
        length = struct.unpack("<i", tail[:4])[0]
        if tail[4:] != _FILE_MAGIC or not 0 < length <= min(MAX_FOOTER_BYTES, self.size - 18):
            return False
        try:
            blocks, meta = read_footer(memoryview(whole)[self.size - 10 - length : self.size - 10])
        except FooterError:
            return False  # pyarrow read the footer, we could not: no trust, nothing worse
        want = meta.get(FINGERPRINT_KEY.encode())
        if want is None or len(blocks) != self.num_batches:
            return False
        fp = BlocksFingerprint()
        view = memoryview(whole)
        for b in blocks:
            if b.offset < 0 or b.metadata_length <= 0 or b.offset + b.metadata_length > self.size:
                return False
            fp.add(b.offset, b.metadata_length, b.body_length, view[b.offset : b.offset + b.metadata_length])
        return fp.hexdigest().encode() == want

    def _range(self, buf: pa.Buffer | None, what: str) -> Range | None:
        if buf is None:
            return None
        offset = buf.address - self._base
        if buf.size == 0:
            return Range(0, 0)
        if offset < 0 or offset + buf.size > self.size:
            # pyarrow inflated the buffer somewhere else: the body is compressed
            self.compressed = True
            return None
        return Range(offset, buf.size)

    def layout(self, index: int, columns: Sequence[str], types: dict[str, ColumnType | None]) -> BatchLayout:
        """The file ranges of ``columns`` in batch ``index`` (``types``: None where not direct)."""
        batch, _ = self.record_batch(index)
        chunks: dict[str, ChunkLayout] = {}
        num_rows = batch.num_rows
        if num_rows < 0:
            raise corrupt(self.path, f"record batch {index} (it claims {num_rows} rows)")
        for name in columns:
            ctype = types[name]
            if ctype is None:
                continue
            try:
                arr = batch.column(name)
                if isinstance(arr, pa.ExtensionArray):
                    arr = arr.storage
                bufs = arr.buffers()
                n, null_count = len(arr), arr.null_count
            except ARROW_ERRORS as exc:
                raise corrupt(self.path, f"record batch {index}, column {name!r}", exc) from None
            if n != num_rows or not 0 <= null_count <= n or len(bufs) < 2:
                raise corrupt(
                    self.path,
                    f"record batch {index}, column {name!r} ({n} rows and {null_count} NULLs in a batch of "
                    f"{num_rows} rows)",
                )
            validity = self._range(bufs[0], "validity") if null_count else None
            values = self._range(bufs[1], "values") if ctype.layout != Layout.FIXED_LIST else None
            data = self._range(bufs[2], "data") if ctype.layout == Layout.VARBINARY else None
            child = (0, 0, None)
            if ctype.layout in Layout.NESTED:
                try:
                    elements = arr.values
                    cbufs = elements.buffers()
                    child = (len(elements), elements.null_count, None)
                except ARROW_ERRORS as exc:
                    raise corrupt(self.path, f"record batch {index}, column {name!r} (its elements)", exc) from None
                if len(cbufs) != 2 or elements.offset != 0 or not 0 <= child[1] <= child[0]:
                    raise corrupt(self.path, f"record batch {index}, column {name!r} (its elements)")
                items = self._range(cbufs[1], "elements")
                child = (child[0], child[1], self._range(cbufs[0], "element validity") if child[1] else None)
                if ctype.layout == Layout.FIXED_LIST:
                    values = items
                else:
                    data = items if items is not None else Range(0, 0)
            if self.compressed:
                continue
            if values is None:
                values = Range(0, 0)
            _check_sizes(self.path, index, name, ctype, n, validity, values, data, *child)
            chunks[name] = ChunkLayout(n, null_count, validity, values, data, *child)
        return BatchLayout(index, num_rows, chunks)

    def custom_metadata(self, index: int) -> Any:
        if self.batch_metadata is not None:
            return self.batch_metadata[index] or None
        return self.record_batch(index)[1]

    def host_batch(self, index: int, columns: Sequence[str]) -> pa.RecordBatch:
        """Batch ``index`` restricted to ``columns``, in host memory (decompressed if need be), not
        yet validated: :mod:`.read.host` does that before anything reads its data."""
        try:
            return self.record_batch(index)[0].select(list(columns))
        except ARROW_ERRORS as exc:
            raise corrupt(self.path, f"record batch {index}", exc) from None

    def fileno(self) -> int:
        """The descriptor of the file the metadata was read from (for preads: the path may name another
        file by now)."""
        return self._raw.fileno()

    def read_pieces(self, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Pieces of the file (offsets, sizes: int64 arrays) back to back in one uint8 array, read now
        (:func:`.file.ranges.read_pieces`)."""
        return read_pieces(self._raw.fileno(), offsets, sizes, self.path)

    def close(self) -> None:
        self._file_reader = None
        self._stream_batches = None
        self._whole = None
        mm, self._mmap = getattr(self, "_mmap", None), None
        if mm is not None:
            mm.close()
        raw, self._raw = getattr(self, "_raw", None), None
        if raw is not None:
            raw.close()

    def __enter__(self) -> ArrowFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_sizes(
    path: str, index: int, name: str, ctype: ColumnType, n: int, validity, values, data,
    child_length: int = 0, child_nulls: int = 0, child_validity: Range | None = None,
) -> None:  # fmt: skip
    """Buffers shorter than their row count needs would make the read run past them."""
    if ctype.layout == Layout.BOOL:
        need = (n + 7) // 8
    elif ctype.layout in (Layout.VARBINARY, Layout.LIST):
        need = (n + 1) * 4 if n else 0
    else:
        need = n * ctype.width
    short = values.size < need or (validity is not None and n and validity.size < (n + 7) // 8)
    if ctype.layout == Layout.VARBINARY and n and data is None:
        short = True
    if ctype.layout == Layout.FIXED_LIST and child_length < n * ctype.list_size:
        raise FileFormatError(
            f"{path!r}: record batch {index}, column {name!r}: {child_length} elements for {n} lists of "
            f"{ctype.list_size} (corrupt file)"
        )
    if ctype.layout == Layout.LIST and (data is None or data.size < child_length * ctype.storage.itemsize):
        short = True
    if child_nulls and (child_validity is None or child_validity.size < (child_length + 7) // 8):
        short = True
    if short:
        raise FileFormatError(
            f"{path!r}: record batch {index}, column {name!r}: buffers are shorter than its {n} rows need "
            "(corrupt file)"
        )


def _without_footer_stats(schema: pa.Schema) -> pa.Schema:
    """The schema without PG-Strom's footer min/max lists (file metadata, not the data's)."""
    stale = {FOOTER_MIN_KEY.encode(), FOOTER_MAX_KEY.encode()}
    fields = []
    for f in schema:
        if f.metadata and stale & set(f.metadata):
            kept = {k: v for k, v in f.metadata.items() if k not in stale}
            f = f.with_metadata(kept) if kept else f.remove_metadata()
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def resolve_columns(schema: pa.Schema, columns: Sequence[str] | None, path: str) -> list[str]:
    names = schema.names
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise SchemaMismatchError(f"{path!r}: column name {dup!r} appears more than once; pystrom needs unique names")
    columns = check_columns_argument(columns)
    if columns is None:
        return list(names)
    out = []
    for c in columns:
        if c not in names:
            raise ColumnNotFoundError(f"column {c!r} is not in {path!r}; it has {names}")
        if c in out:
            raise SchemaMismatchError(f"column {c!r} is asked for twice")
        out.append(c)
    return out


def direct_types(schema: pa.Schema, columns: Sequence[str]) -> dict[str, ColumnType | None]:
    return {name: direct_type(schema.field(name).type, name) for name in columns}


_NARROWED = {"large_string": pa.string(), "string_view": pa.string(), "large_binary": pa.binary(),
             "binary_view": pa.binary()}  # fmt: skip


# Arrow's older interval types, which pyarrow can describe but not wrap as arrays: read as
# month_day_nano_interval by :mod:`.read.intervals`.
LEGACY_INTERVALS = (pa.lib.Type_INTERVAL_MONTHS, pa.lib.Type_INTERVAL_DAY_TIME)


def _held_type(t: pa.DataType) -> pa.DataType:
    """The type a column of Arrow type ``t`` has in a Table (dictionaries decoded, strings narrowed,
    month_interval and day_time_interval widened to month_day_nano_interval)."""
    if t.id in LEGACY_INTERVALS:
        return pa.month_day_nano_interval()
    if pa.types.is_dictionary(t):
        return _held_type(t.value_type)
    if isinstance(t, pa.BaseExtensionType):
        return t  # its storage type is checked by column_type
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_held_type(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_held_type(t.value_type)))
    return _NARROWED.get(str(t), t)


def check_types(schema: pa.Schema, columns: Sequence[str], path: str) -> None:
    """Refuse, before any batch is read, a requested column whose type pystrom cannot hold (structs,
    maps, decimal256...), naming it."""
    for name in columns:
        t = schema.field(name).type
        try:
            column_type(_held_type(t), name)
        except UnsupportedTypeError as exc:
            raise UnsupportedTypeError(f"{path!r}: {exc}") from None


def open_arrow_file(path: Any) -> ArrowFile:
    return ArrowFile(path_name(path))
