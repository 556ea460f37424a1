"""Arrow IPC metadata as flatbuffers: the Schema, RecordBatch and Footer tables, built by hand.

We write our own IPC file (see :mod:`.write.writer`) because pyarrow pads body buffers to 8 bytes only and
its Python API cannot change that. The tables follow Arrow's ``format/Schema.fbs``,
``format/Message.fbs`` and ``format/File.fbs``; slot numbers below are the field positions in those
files (a flatbuffer table's slot i is its i-th declared field, union fields taking two slots: the
type tag first, then the value).

Only the types pystrom writes are encoded: primitive, temporal, decimal128 and (large) binary/string.
The caller has already refused every other type, so an unknown type here is a programming error.

One table is also *read* here, :func:`read_footer`: the Footer's record batch Blocks and its custom
metadata, which pyarrow does not expose (the statistics fingerprint lives there, see :mod:`.file.stats`).
The bytes come from a file anyone may have written, so every offset is checked against the buffer
before it is followed, and the sizes are capped.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import flatbuffers
import numpy as np
import pyarrow as pa
import pyarrow.types as pt

__all__ = ["Block", "encode_schema_message", "encode_batch_message", "encode_footer", "read_footer", "footer_blocks",
           "METADATA_V5"]  # fmt: skip

METADATA_V5 = 4  # MetadataVersion.V5: what every Arrow >= 1.0 writes and reads

# union Type (Schema.fbs): the tag of each type table
_TYPE_INT, _TYPE_FLOAT, _TYPE_BINARY, _TYPE_UTF8, _TYPE_BOOL, _TYPE_DECIMAL = 2, 3, 4, 5, 6, 7
_TYPE_DATE, _TYPE_TIME, _TYPE_TIMESTAMP = 8, 9, 10
_TYPE_FIXED_SIZE_BINARY, _TYPE_DURATION, _TYPE_LARGE_BINARY, _TYPE_LARGE_UTF8 = 15, 18, 19, 20
_TYPE_INTERVAL, _TYPE_LIST, _TYPE_STRUCT, _TYPE_FIXED_SIZE_LIST = 11, 12, 13, 16
_INTERVAL_MONTH_DAY_NANO = 2  # IntervalUnit: YEAR_MONTH = 0, DAY_TIME = 1, MONTH_DAY_NANO = 2
_BODY_COMPRESSION_BUFFER = 0  # BodyCompressionMethod: each buffer compressed on its own
# union MessageHeader (Message.fbs)
_HEADER_SCHEMA, _HEADER_RECORD_BATCH = 1, 3

_TIME_UNITS = {"s": 0, "ms": 1, "us": 2, "ns": 3}
_FLOAT_PRECISION = {16: 0, 32: 1, 64: 2}  # Precision: HALF, SINGLE, DOUBLE


@dataclass(frozen=True)
class Block:
    """File.fbs ``struct Block``: where one record batch message sits in the file."""

    offset: int  # file offset of the message (its continuation marker)
    metadata_length: int  # prefix + flatbuffer + padding; the body starts at offset + metadata_length
    body_length: int


def _builder(size: int = 1024) -> flatbuffers.Builder:
    b = flatbuffers.Builder(size)
    # Write every scalar even when it equals the schema default: readers built against older or newer
    # .fbs files (PG-Strom parses these tables itself) then never depend on which defaults they assume.
    b.ForceDefaults(True)
    return b


def _key_values(b: flatbuffers.Builder, pairs: Sequence[tuple[str | bytes, str | bytes]]) -> int | None:
    if not pairs:
        return None
    offsets = []
    for key, value in pairs:
        k = b.CreateString(key)
        v = b.CreateString(value)
        b.StartObject(2)  # table KeyValue { key: string; value: string; }
        b.PrependUOffsetTRelativeSlot(0, k, 0)
        b.PrependUOffsetTRelativeSlot(1, v, 0)
        offsets.append(b.EndObject())
    return _offset_vector(b, offsets)


def _offset_vector(b: flatbuffers.Builder, offsets: Sequence[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _encode_type(b: flatbuffers.Builder, t: pa.DataType) -> tuple[int, int]:
    """Write the type table of storage type ``t``; return (union tag, table offset)."""
    if pt.is_boolean(t):
        b.StartObject(0)
        return _TYPE_BOOL, b.EndObject()
    if pt.is_integer(t):
        b.StartObject(2)  # table Int { bitWidth: int; is_signed: bool; }
        b.PrependInt32Slot(0, t.bit_width, 0)
        b.PrependBoolSlot(1, pt.is_signed_integer(t), False)
        return _TYPE_INT, b.EndObject()
    if pt.is_floating(t):
        b.StartObject(1)  # table FloatingPoint { precision: Precision; }
        b.PrependInt16Slot(0, _FLOAT_PRECISION[t.bit_width], 0)
        return _TYPE_FLOAT, b.EndObject()
    if pt.is_decimal128(t):
        b.StartObject(3)  # table Decimal { precision: int; scale: int; bitWidth: int = 128; }
        b.PrependInt32Slot(0, t.precision, 0)
        b.PrependInt32Slot(1, t.scale, 0)
        b.PrependInt32Slot(2, 128, 128)
        return _TYPE_DECIMAL, b.EndObject()
    if pt.is_date32(t) or pt.is_date64(t):
        b.StartObject(1)  # table Date { unit: DateUnit = MILLISECOND; }  DAY = 0
        b.PrependInt16Slot(0, 0 if pt.is_date32(t) else 1, 1)
        return _TYPE_DATE, b.EndObject()
    if pt.is_time32(t) or pt.is_time64(t):
        b.StartObject(2)  # table Time { unit: TimeUnit = MILLISECOND; bitWidth: int = 32; }
        b.PrependInt16Slot(0, _TIME_UNITS[t.unit], 1)
        b.PrependInt32Slot(1, t.bit_width, 32)
        return _TYPE_TIME, b.EndObject()
    if pt.is_timestamp(t):
        tz = b.CreateString(t.tz) if t.tz else None
        b.StartObject(2)  # table Timestamp { unit: TimeUnit; timezone: string; }
        b.PrependInt16Slot(0, _TIME_UNITS[t.unit], 0)
        if tz is not None:
            b.PrependUOffsetTRelativeSlot(1, tz, 0)
        return _TYPE_TIMESTAMP, b.EndObject()
    if pt.is_duration(t):
        b.StartObject(1)  # table Duration { unit: TimeUnit = MILLISECOND; }
        b.PrependInt16Slot(0, _TIME_UNITS[t.unit], 1)
        return _TYPE_DURATION, b.EndObject()
    if t == pa.month_day_nano_interval():
        b.StartObject(1)  # table Interval { unit: IntervalUnit; }
        b.PrependInt16Slot(0, _INTERVAL_MONTH_DAY_NANO, 0)
        return _TYPE_INTERVAL, b.EndObject()
    if pt.is_list(t):
        b.StartObject(0)  # table List {}
        return _TYPE_LIST, b.EndObject()
    if pt.is_struct(t):
        b.StartObject(0)  # table Struct_ {}
        return _TYPE_STRUCT, b.EndObject()
    if pt.is_fixed_size_list(t):
        b.StartObject(1)  # table FixedSizeList { listSize: int; }
        b.PrependInt32Slot(0, t.list_size, 0)
        return _TYPE_FIXED_SIZE_LIST, b.EndObject()
    if pt.is_fixed_size_binary(t):
        b.StartObject(1)  # table FixedSizeBinary { byteWidth: int; }
        b.PrependInt32Slot(0, t.byte_width, 0)
        return _TYPE_FIXED_SIZE_BINARY, b.EndObject()
    tags = {
        pa.string(): _TYPE_UTF8,
        pa.binary(): _TYPE_BINARY,
        pa.large_string(): _TYPE_LARGE_UTF8,
        pa.large_binary(): _TYPE_LARGE_BINARY,
    }
    if t in tags:
        b.StartObject(0)
        return tags[t], b.EndObject()
    raise AssertionError(f"type {t} reached the IPC encoder; the writer should have refused it")


def _ext_metadata(t: pa.BaseExtensionType) -> bytes:
    serialize = getattr(t, "__arrow_ext_serialize__", None)
    return serialize() if serialize is not None else b""  # canonical types without it (uuid) have none


def _encode_field(
    b: flatbuffers.Builder,
    name: str,
    storage_type: pa.DataType,
    nullable: bool,
    field_meta: Sequence[tuple[str | bytes, str | bytes]],
) -> int:
    """One Field table, its children (a list's element field, a struct's fields) written first: flatbuffers
    builds bottom-up."""
    child_offsets = []
    if pt.is_list(storage_type) or pt.is_fixed_size_list(storage_type):
        items = [storage_type.value_field]
    elif pt.is_struct(storage_type):
        items = [storage_type.field(i) for i in range(storage_type.num_fields)]
    else:
        items = []
    for item in items:
        storage = item.type.storage_type if isinstance(item.type, pa.BaseExtensionType) else item.type
        meta = [(k, v) for k, v in (item.metadata or {}).items()]
        if isinstance(item.type, pa.BaseExtensionType):  # an extension type inside: its name and metadata, as Arrow
            meta += [(b"ARROW:extension:name", item.type.extension_name.encode()),
                     (b"ARROW:extension:metadata", _ext_metadata(item.type))]  # fmt: skip
        child_offsets.append(_encode_field(b, item.name, storage, item.nullable, meta))
    name_off = b.CreateString(name)
    type_tag, type_off = _encode_type(b, storage_type)
    children = _offset_vector(b, child_offsets)  # primitive fields: an empty children vector, as the spec says
    meta_off = _key_values(b, field_meta)
    b.StartObject(7)  # table Field: name, nullable, type_type, type, dictionary, children, custom_metadata
    b.PrependUOffsetTRelativeSlot(0, name_off, 0)
    b.PrependBoolSlot(1, nullable, False)
    b.PrependUint8Slot(2, type_tag, 0)
    b.PrependUOffsetTRelativeSlot(3, type_off, 0)
    b.PrependUOffsetTRelativeSlot(5, children, 0)
    if meta_off is not None:
        b.PrependUOffsetTRelativeSlot(6, meta_off, 0)
    return b.EndObject()


def _encode_schema(
    b: flatbuffers.Builder,
    fields: Sequence[tuple[str, pa.DataType, bool, Sequence[tuple[str | bytes, str | bytes]]]],
    metadata: Sequence[tuple[str | bytes, str | bytes]],
) -> int:
    """Schema table; ``fields`` holds (name, storage type, nullable, field metadata) per column."""
    field_offsets = [_encode_field(b, *f) for f in fields]
    fields_off = _offset_vector(b, field_offsets)
    meta_off = _key_values(b, metadata)
    b.StartObject(4)  # table Schema: endianness, fields, custom_metadata, features
    b.PrependInt16Slot(0, 0, 0)  # Little
    b.PrependUOffsetTRelativeSlot(1, fields_off, 0)
    if meta_off is not None:
        b.PrependUOffsetTRelativeSlot(2, meta_off, 0)
    return b.EndObject()


def _message(b: flatbuffers.Builder, header_tag: int, header: int, body_length: int, meta: int | None) -> bytes:
    b.StartObject(5)  # table Message: version, header_type, header, bodyLength, custom_metadata
    b.PrependInt16Slot(0, METADATA_V5, 0)
    b.PrependUint8Slot(1, header_tag, 0)
    b.PrependUOffsetTRelativeSlot(2, header, 0)
    b.PrependInt64Slot(3, body_length, 0)
    if meta is not None:
        b.PrependUOffsetTRelativeSlot(4, meta, 0)
    b.Finish(b.EndObject())
    return bytes(b.Output())


FieldSpec = tuple[str, pa.DataType, bool, Sequence[tuple[str | bytes, str | bytes]]]


def encode_schema_message(fields: Sequence[FieldSpec], metadata: Sequence[tuple[str | bytes, str | bytes]]) -> bytes:
    """The flatbuffer of a Schema message (no body)."""
    b = _builder()
    schema = _encode_schema(b, fields, metadata)
    return _message(b, _HEADER_SCHEMA, schema, 0, None)


def encode_batch_message(
    length: int,
    nodes: Sequence[tuple[int, int]],
    buffers: Sequence[tuple[int, int]],
    body_length: int,
    custom_metadata: Sequence[tuple[str | bytes, str | bytes]] | Mapping = (),
    compression: int | None = None,
) -> bytes:
    """The flatbuffer of a RecordBatch message: ``nodes`` (length, null_count) per column,
    ``buffers`` (body offset, length) in pre-order; ``compression`` the CompressionType of a
    compressed body (LZ4_FRAME = 0, ZSTD = 1; every buffer compressed on its own, method BUFFER)."""
    b = _builder(256 + 32 * len(buffers) + 64 * len(custom_metadata))
    pairs = list(custom_metadata.items()) if isinstance(custom_metadata, Mapping) else list(custom_metadata)
    meta = _key_values(b, pairs)
    b.StartVector(16, len(buffers), 8)  # struct Buffer { offset: long; length: long; }
    for offset, length_ in reversed(buffers):
        b.Prep(8, 16)
        b.PrependInt64(length_)
        b.PrependInt64(offset)
    buffers_off = b.EndVector()
    b.StartVector(16, len(nodes), 8)  # struct FieldNode { length: long; null_count: long; }
    for node_length, null_count in reversed(nodes):
        b.Prep(8, 16)
        b.PrependInt64(null_count)
        b.PrependInt64(node_length)
    nodes_off = b.EndVector()
    body_compression = None
    if compression is not None:
        b.StartObject(2)  # table BodyCompression { codec: CompressionType; method: BodyCompressionMethod; }
        b.PrependInt8Slot(0, compression, 0)
        b.PrependInt8Slot(1, _BODY_COMPRESSION_BUFFER, 0)
        body_compression = b.EndObject()
    b.StartObject(5)  # table RecordBatch: length, nodes, buffers, compression, variadicBufferCounts
    b.PrependInt64Slot(0, length, 0)
    b.PrependUOffsetTRelativeSlot(1, nodes_off, 0)
    b.PrependUOffsetTRelativeSlot(2, buffers_off, 0)
    if body_compression is not None:
        b.PrependUOffsetTRelativeSlot(3, body_compression, 0)
    batch = b.EndObject()
    return _message(b, _HEADER_RECORD_BATCH, batch, body_length, meta)


def encode_footer(
    fields: Sequence[FieldSpec],
    metadata: Sequence[tuple[str | bytes, str | bytes]],
    blocks: Sequence[Block],
    footer_metadata: Sequence[tuple[str | bytes, str | bytes]] = (),
) -> bytes:
    """The Footer flatbuffer (File.fbs): the schema again, no dictionaries, one Block per batch, and
    the footer's own custom metadata (``footer_metadata``; pyarrow's ``read_all`` does not carry it)."""
    b = _builder(1024 + 24 * len(blocks))
    schema = _encode_schema(b, fields, metadata)
    footer_meta = _key_values(b, list(footer_metadata))
    b.StartVector(24, 0, 8)
    dictionaries = b.EndVector()
    b.StartVector(24, len(blocks), 8)  # struct Block { offset: long; metaDataLength: int; bodyLength: long; }
    for blk in reversed(blocks):
        b.Prep(8, 24)
        b.PrependInt64(blk.body_length)
        b.Pad(4)  # metaDataLength is 4 bytes; bodyLength is 8-aligned
        b.PrependInt32(blk.metadata_length)
        b.PrependInt64(blk.offset)
    batches = b.EndVector()
    b.StartObject(5)  # table Footer: version, schema, dictionaries, recordBatches, custom_metadata
    b.PrependInt16Slot(0, METADATA_V5, 0)
    b.PrependUOffsetTRelativeSlot(1, schema, 0)
    b.PrependUOffsetTRelativeSlot(2, dictionaries, 0)
    b.PrependUOffsetTRelativeSlot(3, batches, 0)
    if footer_meta is not None:
        b.PrependUOffsetTRelativeSlot(4, footer_meta, 0)
    b.Finish(b.EndObject())
    return bytes(b.Output())


# ---------------------------------------------------------------------------------------------------
# reading the footer of a file someone else may have written

MAX_FOOTER_BYTES = 1 << 30  # far beyond any real footer (24 bytes a batch); a larger claim is corrupt
_MAX_KEY_VALUES = 1 << 16


class FooterError(ValueError):
    """The footer bytes are not a well-formed Footer table (the caller names the file)."""


_STRUCTS: dict[str, struct.Struct] = {}


class _Reader:
    """Bounds-checked access to a flatbuffer: every read is inside ``buf`` or raises FooterError."""

    def __init__(self, buf: bytes | memoryview):
        self.buf = memoryview(buf).cast("B")
        self.n = len(self.buf)

    def _get(self, fmt_: str, pos: int) -> int:
        st = _STRUCTS.get(fmt_) or _STRUCTS.setdefault(fmt_, struct.Struct(fmt_))
        if pos < 0 or pos + st.size > self.n:
            raise FooterError(f"a field at byte {pos} lies outside the {self.n}-byte footer")
        return st.unpack_from(self.buf, pos)[0]

    def table(self, pos: int) -> tuple[int, int, int]:
        """(table position, vtable position, vtable size) of the table at ``pos``."""
        vtable = pos - self._get("<i", pos)
        vsize = self._get("<H", vtable)
        if vsize < 4 or vsize % 2:
            raise FooterError(f"a vtable at byte {vtable} has an impossible size {vsize}")
        self._get("<H", vtable + vsize - 2)  # the whole vtable is inside
        return pos, vtable, vsize

    def field(self, table: tuple[int, int, int], slot: int) -> int | None:
        """Position of ``slot``'s value in ``table``, or None when the field is absent."""
        pos, vtable, vsize = table
        at = 4 + 2 * slot
        if at + 2 > vsize:
            return None
        off = self._get("<H", vtable + at)
        return pos + off if off else None

    def deref(self, pos: int) -> int:
        return pos + self._get("<I", pos)

    def vector(self, pos: int, item: int) -> tuple[int, int]:
        """(first element position, count) of the vector whose offset sits at ``pos``."""
        vec = self.deref(pos)
        count = self._get("<I", vec)
        if count * item > self.n - vec - 4:
            raise FooterError(f"a vector of {count} elements at byte {vec} runs past the footer")
        return vec + 4, count

    def string(self, pos: int) -> bytes:
        start, count = self.vector(pos, 1)
        return bytes(self.buf[start : start + count])


def read_footer(footer: bytes | memoryview) -> tuple[list[Block], dict[bytes, bytes]]:
    """The record batch Blocks and the custom metadata of a Footer flatbuffer.

    Raises FooterError on anything malformed (offsets outside the bytes, vectors running past them,
    too many key/value pairs); never reads outside ``footer``.
    """
    blocks, meta = footer_blocks(footer)
    return [Block(*b) for b in blocks.tolist()], meta


def footer_blocks(footer: bytes | memoryview) -> tuple[np.ndarray, dict[bytes, bytes]]:
    """:func:`read_footer` with the Blocks as one (n, 3) int64 array: offset, metadata length, body length."""
    r = _Reader(footer)
    if r.n > MAX_FOOTER_BYTES:
        raise FooterError(f"a footer of {r.n:,} bytes")
    root = r.table(r.deref(0))
    blocks = np.zeros((0, 3), dtype=np.int64)
    at = r.field(root, 3)
    first, count = r.vector(at, 24) if at is not None else (0, 0)  # the whole vector lies inside the footer
    if count:
        raw = np.frombuffer(r.buf, dtype=_BLOCK, count=count, offset=first)
        blocks = np.stack([raw["offset"], raw["meta"], raw["body"]], axis=1).astype(np.int64)
    return blocks, read_key_values(r, r.field(root, 4))


_BLOCK = np.dtype([("offset", "<i8"), ("meta", "<i4"), ("pad", "<i4"), ("body", "<i8")])  # struct Block


def read_key_values(r: _Reader, at: int | None) -> dict[bytes, bytes]:
    """The ``[KeyValue]`` vector whose offset sits at ``at`` (None: absent) of ``r``'s flatbuffer."""
    return dict(read_key_value_pairs(r, at))


def read_key_value_pairs(r: _Reader, at: int | None) -> list[tuple[bytes, bytes]]:
    """:func:`read_key_values` as pairs in the file's order, a key repeated as often as it is there."""
    pairs = []
    if at is not None:
        first, count = r.vector(at, 4)
        if count > _MAX_KEY_VALUES:
            raise FooterError(f"{count:,} custom metadata entries")
        for i in range(count):
            kv = r.table(r.deref(first + 4 * i))
            k, v = r.field(kv, 0), r.field(kv, 1)
            if k is not None and v is not None:
                pairs.append((r.string(k), r.string(v)))
    return pairs
