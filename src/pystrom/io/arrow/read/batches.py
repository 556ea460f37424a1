"""Every record batch's layout at once: the footer's Blocks and the batch messages parsed here, checked
over all batches at once, pyarrow's per-batch path (:meth:`.file.metadata.ArrowFile.layout`) as the fallback.

pyarrow parses one record batch per call and builds an Array for every column of it (about 140 us a
batch on the 2-core test machine): for a file written by pyarrow (64K-row batches, 153 at 10M rows)
that was a fifth of read_arrow. Here, in order:

1. decline (None: the caller takes pyarrow's path, which raises the errors it always raised) unless
   the file is a file, not a stream, little-endian, and every field's FieldNodes and Buffers follow
   from its type (:func:`.read.compressed_layouts.field_counts`: not view or run-end encoded types); an
   uncompressed batch is taken only when the footer lists no dictionaries and every field of the
   schema is a flat column type whose file layout is pystrom's;
2. the footer's Blocks (:func:`.file.format.read_footer`, bounds-checked) and, per Block, the message
   prefix (continuation marker, a flatbuffer length that fills the Block's metadata length), the
   Message and RecordBatch tables: a record batch header, metadata version V5, the Block's body
   length, the FieldNodes and Buffers the schema implies, the compression (a codec id other than
   LZ4_FRAME/ZSTD or a method other than BUFFER is a FileFormatError) and the batch's custom metadata
   (pystrom's statistics). All batches at once in C++ (csrc/arrow_meta.cpp, one call: ~1 ms for 2048
   batches), which verifies the tables it reads at least as strictly as pyarrow's flatbuffer verifier
   does. The batches it does not accept (anything unusual) go through :func:`_parse_one`, the Python definition:
   pyarrow's verifier (``ipc.read_message``: no arrays built, the body untouched), then bounds-checked
   reads (:class:`.file.format._Reader`); it declines or raises as this path always did;
   a file whose batches are all compressed continues in :func:`.read.compressed_layouts.compressed_layouts` (its
   own checks, raising FileFormatError: pyarrow's path would inflate the whole file on the host);
3. over all batches and fields at once (one C++ call with step 4, csrc/arrow_meta.cpp): the body inside
   the file, each buffer inside its body and 8-byte aligned, row counts equal to the batch's, NULL counts
   in [0, rows], a validity bitmap wherever there are NULLs, every buffer as long as its row count needs
   (the checks of :meth:`.file.metadata.ArrowFile.layout`, over every field rather than only the selected
   ones);
4. the :class:`.read.layouts.Layouts` of the selected columns: per column and buffer, arrays over the batches
   of what pyarrow's path builds batch by batch.

Anything unexpected in 1-3 declines rather than raises: the fast path never accepts a file pyarrow's
path would refuse, and the error a corrupt file gets stays the one pyarrow's path gives.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from .... import _core
from ...._types import ColumnType, Layout
from ....errors import FileFormatError
from ..codecs.decompress import CODECS
from ..file.format import (
    MAX_FOOTER_BYTES,
    METADATA_V5,
    Block,
    FooterError,
    _Reader,
    footer_blocks,
    read_key_value_pairs,
)
from ..file.metadata import ARROW_ERRORS, ArrowFile, direct_type
from .compressed_layouts import compressed_layouts, field_counts
from .layouts import Buffers, Chunks, Layouts

__all__ = ["batch_layouts", "parse_batches"]

_CONTINUATION = 0xFFFFFFFF
_HEADER_RECORD_BATCH = 3


class _Decline(Exception):
    """The fast path does not apply to this file; pyarrow's path decides."""


def batch_layouts(file: ArrowFile, columns: Sequence[str], types: dict[str, ColumnType | None]) -> Layouts:
    """The layout of every record batch of ``file`` for ``columns`` (``types``: :func:`.file.metadata.direct_types`)."""
    fast = parse_batches(file, columns, types)
    if fast is not None:
        return fast
    slow = [file.layout(i, columns, types) for i in range(file.num_batches)]
    return Layouts.of(slow, [] if file.compressed else [c for c in columns if types[c] is not None])


def parse_batches(
    file: ArrowFile, columns: Sequence[str], types: Mapping[str, ColumnType | None] | None = None
) -> Layouts | None:
    """Every batch's layout from the raw metadata (steps 1-4 above), or None where pyarrow's path must decide;
    ``types``: :func:`.file.metadata.direct_types` of some fields already (the caller's columns), not asked again."""
    try:
        return _parse(file, columns, types or {})
    except FileFormatError:
        raise  # a compressed body's buffers, refused by compressed_layouts (pyarrow's path would inflate them)
    except (_Decline, FooterError, struct.error, *ARROW_ERRORS):
        return None


def _parse(file: ArrowFile, columns: Sequence[str], known: Mapping[str, ColumnType | None]) -> Layouts:
    if file.is_stream or file.compressed:
        raise _Decline
    names = file.schema.names
    if len(set(names)) != len(names) or not set(columns) <= set(names):
        raise _Decline
    fields = list(file.schema)
    types = {f.name: known[f.name] if f.name in known else direct_type(f.type, f.name) for f in fields}
    counts = [field_counts(f.type) for f in fields]
    if any(c is None for c in counts):
        raise _Decline
    # uncompressed batches are taken here only when every field is flat and direct; compressed ones
    # whenever the fields' nodes and buffers can be counted (:mod:`.read.compressed_layouts`)
    flat = all(t is not None and t.layout not in Layout.NESTED for t in types.values())
    layouts = [types[n].layout if flat else None for n in names]
    per_field = [c[1] for c in counts]
    num_fields, num_buffers = sum(c[0] for c in counts), sum(per_field)

    whole = memoryview(file._whole)
    size = file.size
    tail = bytes(whole[size - 10 :])
    footer_len = struct.unpack("<i", tail[:4])[0]
    if tail[4:] != b"ARROW1" or not 0 < footer_len <= min(MAX_FOOTER_BYTES, size - 18):
        raise _Decline
    footer_start = size - 10 - footer_len
    footer = whole[footer_start : size - 10]
    block, _ = footer_blocks(footer)
    if len(block) != file.num_batches:
        raise _Decline
    flat = _check_footer(footer) and flat
    if not len(block):
        return Layouts.of([], [c for c in columns if types[c] is not None])

    count = len(block)
    rows = np.empty(count, dtype=np.int64)
    bodies = np.empty((count, 2), dtype=np.int64)  # file offset, length
    nodes = np.empty((count, num_fields, 2), dtype=np.int64)  # length, null count
    buffers = np.empty((count, num_buffers, 2), dtype=np.int64)  # body offset, length
    codecs = np.empty(count, dtype=np.int64)  # index into CODECS, -1: uncompressed
    status = np.empty(count, dtype=np.int32)
    custom = np.empty((count, 2), dtype=np.int64)  # first pair, pairs
    offset, meta_length, body_length = (block[:, j].copy() for j in range(3))
    src, msg_at = _messages(file, offset, meta_length, footer_start)
    pairs = _core.arrow_batch_meta(src, footer_start, offset, meta_length, body_length, msg_at, num_fields,
                                   num_buffers, rows, bodies, nodes, buffers, codecs, status, custom)  # fmt: skip
    metadata = _BatchMetadata(src, custom, pairs)
    # the batches the C++ parser left to this one (custom metadata it could not verify, or anything
    # unusual: declined or refused here, with the errors this path always raised), in order: the first to fail decides
    for i in np.flatnonzero((status != 0) | ((codecs < 0) & (not flat))).tolist():
        blk = Block(*block[i].tolist())
        rows[i], bodies[i], nodes[i], buffers[i], codecs[i], metadata[i] = _parse_one(
            file, whole, blk, footer_start, i, flat, num_fields, num_buffers
        )

    if (codecs >= 0).any():
        if (codecs < 0).any():
            raise _Decline  # compressed and uncompressed batches in one file: pyarrow's path decides
        out = compressed_layouts(file, columns, types, counts, rows, bodies, nodes, buffers, codecs)
        file.batch_metadata = metadata  # pyarrow would inflate a whole batch to hand out its metadata
        return out
    out = _flat_layouts(file.size, rows, bodies, nodes, buffers, layouts, per_field, [types[n] for n in names],
                        names, columns)  # fmt: skip
    file.batch_metadata = metadata  # a scan's statistics: pyarrow would parse each batch again to hand it out
    return out


def _messages(file: ArrowFile, offset: np.ndarray, meta_length: np.ndarray, footer_start: int) -> tuple:
    """(src, msg_at) for csrc/arrow_meta.cpp: the messages read by ``pread`` one after the other (through the
    mapping each costs a page fault, and one more page to unmap: ~3 ms for 2048 batches), those of Blocks
    outside [8, footer_start) left out (refused there); the whole mapping if they would add up to more
    than the file (overlapping Blocks: a hostile footer)."""
    inside = (offset >= 8) & (meta_length >= 8) & (offset <= footer_start - meta_length)
    sizes = np.where(inside, meta_length, 0)
    if int(sizes.sum()) > file.size:
        return np.frombuffer(file._whole, dtype=np.uint8), offset
    return file.read_pieces(offset, sizes), np.where(inside, np.cumsum(sizes) - sizes, -1)


class _BatchMetadata(Sequence):
    """Each batch's custom metadata (``file.batch_metadata``) as :func:`_parse_one` hands it out: a
    KeyValueMetadata in the file's order (a key written twice stays twice), {} without pairs. Built from the
    C++ parser's pairs (positions in ``src``) when a batch's is first asked for: read_arrow never asks, a
    scan once a batch; building all of them took ~6 us a batch (0.9 ms of a 153-batch file's read)."""

    def __init__(self, src: np.ndarray, custom: np.ndarray, pairs: bytes):
        self._count = len(custom)
        self._built: dict[int, Mapping[bytes, bytes]] = {}
        self._src, self._custom, self._pairs = src, custom, np.frombuffer(pairs, dtype=np.int64).reshape(-1, 4)
        if src.base is not None:  # the file's mapping (overlapping Blocks: a hostile footer), not held past its close
            for i in range(self._count):
                self[i]
            self._src = None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        i = range(self._count)[index]  # an IndexError past the end, as a list's
        if i not in self._built:
            first, n = self._custom[i].tolist()
            raw = memoryview(self._src) if n else None
            at = self._pairs[first : first + n].tolist()
            pairs = [(bytes(raw[k : k + kn]), bytes(raw[v : v + vn])) for k, kn, v, vn in at]
            self._built[i] = pa.KeyValueMetadata(pairs) if pairs else {}
        return self._built[i]

    def __setitem__(self, index: int, value: Mapping[bytes, bytes]) -> None:
        """The metadata of a batch the Python parser read (:func:`_parse_one`)."""
        self._built[range(self._count)[index]] = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def _parse_one(file, whole, blk, footer_start, i, flat, num_fields, num_buffers) -> tuple:
    """Batch ``i``'s (rows, body, nodes, buffers, codec, custom metadata), parsed in Python (step 2 of the
    module docstring): the definition csrc/arrow_meta.cpp follows, and the path of the batches it leaves."""
    if blk.offset < 8 or blk.metadata_length < 8 or blk.offset + blk.metadata_length > footer_start:
        raise _Decline
    marker, fb_len = struct.unpack_from("<Ii", whole, blk.offset)
    if marker != _CONTINUATION or fb_len <= 0 or fb_len != blk.metadata_length - 8:  # pyarrow: "too long by"
        raise _Decline
    if blk.body_length < 0 or blk.offset + blk.metadata_length + blk.body_length > footer_start:
        raise _Decline
    # pyarrow's flatbuffer verifier (no arrays built, the body not touched: ~10 us): what it
    # refuses, pyarrow's path refuses too, with its own message
    ipc.read_message(file._whole.slice(blk.offset, blk.metadata_length + blk.body_length))
    r = _Reader(whole[blk.offset + 8 : blk.offset + 8 + fb_len])
    message = r.table(r.deref(0))
    if _scalar(r, message, 0, "<h", 0) != METADATA_V5 or _scalar(r, message, 1, "<B", 0) != _HEADER_RECORD_BATCH:
        raise _Decline
    body_length = _scalar(r, message, 3, "<q", 0)
    at = r.field(message, 2)
    if at is None or body_length != blk.body_length:
        raise _Decline
    batch = r.table(r.deref(at))
    codec = _compression(file, r, batch, i)
    if codec < 0 and not flat:
        raise _Decline
    pairs = read_key_value_pairs(r, r.field(message, 4))
    # as pyarrow hands it out: a key written twice stays twice (the statistics of such a column are not trusted)
    metadata = pa.KeyValueMetadata(pairs) if pairs else {}
    body = (blk.offset + blk.metadata_length, body_length)
    nodes, buffers = _structs(r, batch, 1, num_fields), _structs(r, batch, 2, num_buffers)
    return _scalar(r, batch, 0, "<q", 0), body, nodes, buffers, codec, metadata


def _compression(file: ArrowFile, r: _Reader, batch: tuple[int, int, int], index: int) -> int:
    """The batch's codec (an index into CODECS), -1 when its body is not compressed."""
    at = r.field(batch, 3)
    if at is None:
        return -1
    body = r.table(r.deref(at))  # table BodyCompression { codec: CompressionType; method: BodyCompressionMethod; }
    codec, method = _scalar(r, body, 0, "<b", 0), _scalar(r, body, 1, "<b", 0)
    if not 0 <= codec < len(CODECS):
        raise FileFormatError(f"{file.path!r}: record batch {index} is compressed with unknown codec id {codec} "
                              "(Arrow knows 0: LZ4_FRAME, 1: ZSTD; corrupt file?)")  # fmt: skip
    if method != 0:
        raise FileFormatError(f"{file.path!r}: record batch {index} uses body compression method {method}; "
                              "Arrow defines only 0 (BUFFER, each buffer compressed on its own)")  # fmt: skip
    return codec


def _scalar(r: _Reader, table: tuple[int, int, int], slot: int, fmt: str, default: int) -> int:
    at = r.field(table, slot)
    return default if at is None else r._get(fmt, at)


def _structs(r: _Reader, table: tuple[int, int, int], slot: int, count: int) -> np.ndarray:
    """The vector of 16-byte structs (two int64) in ``slot``; exactly ``count`` of them."""
    at = r.field(table, slot)
    if at is None:
        raise _Decline
    first, n = r.vector(at, 16)  # bounds-checked: the whole vector lies inside the flatbuffer
    if n != count:
        raise _Decline
    return np.frombuffer(r.buf, dtype="<i8", count=2 * n, offset=first).reshape(n, 2)


def _check_footer(footer: memoryview) -> bool:
    """A little-endian schema (else decline); whether the footer lists no dictionary Blocks (the flat
    path leaves those to pyarrow, which reads them before the first batch)."""
    r = _Reader(footer)
    root = r.table(r.deref(0))
    at = r.field(root, 2)
    no_dictionaries = at is None or r.vector(at, 24)[1] == 0
    at = r.field(root, 1)
    if at is None:
        raise _Decline
    if _scalar(r, r.table(r.deref(at)), 0, "<h", 0) != 0:  # Schema.endianness: 0 is Little
        raise _Decline
    return no_dictionaries


# csrc/arrow_meta.hpp's FlatLayout of a flat field's layout (every other flat layout: fixed-width values)
_FLAT_CODES = {Layout.BOOL: 1, Layout.VARBINARY: 2}


def _flat_layouts(file_size, rows, bodies, nodes, buffers, layouts, per_field, types, names, columns) -> Layouts:
    """Steps 3 and 4 of the module docstring: every batch and field checked (declines on any failure), and the
    selected columns' chunks of every batch (file offsets; empty buffers at 0, as pyarrow's path), in one
    C++ call (csrc/arrow_meta.cpp; its NumPy twin is in tests/test_arrow_meta.py): as some 80 NumPy calls for
    8 columns they cost more than the rest of the parse."""
    count = len(rows)
    codes = np.array([_FLAT_CODES.get(layout, 0) for layout in layouts], dtype=np.int32)
    widths = np.array([t.width for t in types], dtype=np.int64)
    first = np.cumsum([0, *per_field[:-1]], dtype=np.int64)
    selected = np.array([names.index(c) for c in columns], dtype=np.int64)
    out = np.empty((len(columns), 8, count), dtype=np.int64)
    if _core.arrow_flat_layouts(rows, bodies, nodes, buffers, file_size, codes, widths, first, selected, out):
        raise _Decline
    zeros = np.zeros(count, dtype=np.int64)
    chunks = {}
    for name, j, o in zip(columns, selected.tolist(), out):  # o: rows, NULLs, validity, values, data
        data = Buffers(o[6], o[7]) if codes[j] == _FLAT_CODES[Layout.VARBINARY] else None
        chunks[name] = Chunks(o[0], o[1], Buffers(o[2], o[3]), Buffers(o[4], o[5]), data, zeros, zeros)
    return Layouts(np.arange(count, dtype=np.int64), rows.copy(), chunks)
