"""What the Arrow file writer can write, and the IPC buffers of each column of a record batch.

:func:`columns` checks a schema and says how each field is laid out; :func:`check_batch` refuses
batches that do not match it or are malformed; :func:`batch_buffers` gives a batch's field nodes and
its buffers in IPC pre-order, each from offset 0 (sliced bitmaps shifted, offsets rebased), ready for
:mod:`.write.writer` to lay out (and :mod:`.codecs.compress` to compress).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pt

from .... import _core
from ....errors import SchemaMismatchError, UnsupportedTypeError
from ..file import format as fmt
from ..file.stats import FOOTER_MAX_KEY, FOOTER_MIN_KEY

__all__ = ["Column", "columns", "check_batch", "batch_buffers"]

_EXTENSION_KEYS = (b"ARROW:extension:name", b"ARROW:extension:metadata")
# Footer statistics from an earlier file would describe other batches: never carried over.
_STALE_KEYS = (FOOTER_MIN_KEY.encode(), FOOTER_MAX_KEY.encode())
# C++ canonical extension types whose serialized metadata is empty (pyarrow does not expose it for them).
_EMPTY_METADATA_EXTENSIONS = {"arrow.uuid", "arrow.json", "arrow.bool8"}


@dataclass(frozen=True)
class Column:
    name: str
    storage: pa.DataType
    # "bool", "fixed" (width bytes per value), "var32" / "var64" (offsets + data), "list", "fixed_list" (of
    # numbers), and "struct", "list_of", "fixed_list_of" (of anything else: ``children`` say how)
    layout: str
    width: int  # for lists: the element's width in bytes (0: bit-packed booleans)
    spec: fmt.FieldSpec  # (name, storage type, nullable, field metadata) for the schema message
    children: tuple[Column, ...] = ()


def _unsupported(name: str, t: pa.DataType, whole: pa.DataType | None = None) -> UnsupportedTypeError:
    hint = ""
    if pt.is_dictionary(t):
        hint = " (decode it first: arr.dictionary_decode())"
    elif pt.is_nested(t):
        hint = " (nested types are not supported: flatten it into columns first)"
    elif pt.is_decimal(t):
        hint = " (only decimal128 is written: cast it to decimal128 with precision <= 38, or to float64)"
    elif pt.is_string_view(t) or pt.is_binary_view(t):
        hint = " (cast it to string/binary or large_string/large_binary)"
    return UnsupportedTypeError(
        f"cannot write column {name!r} of type {whole or t}"
        + (f", whose part {t} is not written" if whole is not None and whole != t else "")
        + f" to an Arrow file{hint}; supported: bool, int8..64, "
        "uint8..64, float16/32/64, date32/64, time32/64, timestamp, duration, decimal128, string, "
        "large_string, binary, large_binary, fixed_size_binary, month_day_nano_interval, list and "
        "fixed_size_list and struct of any of these, and extension types over them (uuid)"
    )


def _layout(name: str, t: pa.DataType, whole: pa.DataType | None = None) -> tuple[str, int]:
    if pt.is_boolean(t):
        return "bool", 0
    if pt.is_integer(t) or pt.is_floating(t):
        return "fixed", t.bit_width // 8
    if pt.is_date(t) or pt.is_time(t) or pt.is_timestamp(t) or pt.is_duration(t):
        return "fixed", t.bit_width // 8
    if pt.is_decimal128(t):
        return "fixed", 16
    if pt.is_fixed_size_binary(t):
        return "fixed", t.byte_width
    if t == pa.month_day_nano_interval():
        return "fixed", 16
    if pt.is_list(t) or pt.is_fixed_size_list(t):
        child = t.value_type
        if pt.is_boolean(child):
            width = 0
        elif pt.is_integer(child) or pt.is_floating(child):
            width = child.bit_width // 8
        else:
            return ("list_of" if pt.is_list(t) else "fixed_list_of"), 0
        return ("list" if pt.is_list(t) else "fixed_list"), width
    if pt.is_struct(t) and t.num_fields:
        return "struct", 0
    if t in (pa.string(), pa.binary()):
        return "var32", 4
    if t in (pa.large_string(), pa.large_binary()):
        return "var64", 8
    raise _unsupported(name, t, whole)


def columns(schema: pa.Schema) -> list[Column]:
    """Check every field is writable; describe how each one is laid out and encoded."""
    return [_column(field, field.name, field.type) for field in schema]


def _column(field: pa.Field, top: str, whole: pa.DataType) -> Column:
    """One field (``top``, ``whole``: the column it belongs to and its type, for messages), its children alike."""
    t = field.type
    meta = [(k, v) for k, v in (field.metadata or {}).items() if k not in _EXTENSION_KEYS + _STALE_KEYS]
    if isinstance(t, pa.BaseExtensionType):
        storage = t.storage_type
        if hasattr(t, "__arrow_ext_serialize__"):
            serialized = t.__arrow_ext_serialize__()
        elif t.extension_name in _EMPTY_METADATA_EXTENSIONS:
            serialized = b""
        else:
            raise UnsupportedTypeError(
                f"cannot write column {top!r}: extension type {t.extension_name} does not expose "
                "its serialized metadata to Python; write its storage type instead"
            )
        meta += [(_EXTENSION_KEYS[0], t.extension_name.encode()), (_EXTENSION_KEYS[1], serialized)]
    else:
        storage = t
    if isinstance(storage, pa.BaseExtensionType) or pt.is_dictionary(storage):
        raise _unsupported(top, t, whole)
    layout, width = _layout(top, storage, whole)
    children: tuple[Column, ...] = ()
    if layout in ("list_of", "fixed_list_of"):
        children = (_column(storage.value_field, top, whole),)
    elif layout == "struct":
        children = tuple(_column(storage.field(i), top, whole) for i in range(storage.num_fields))
    return Column(field.name, storage, layout, width, (field.name, storage, field.nullable, meta), children)


def _bits(buf: pa.Buffer, bit_offset: int, count: int) -> Any:
    """``count`` bits of an LSB bitmap starting at ``bit_offset``, moved to bit 0 (IPC arrays have offset 0)."""
    nbytes = (count + 7) // 8
    if bit_offset % 8 == 0:
        return memoryview(buf)[bit_offset // 8 : bit_offset // 8 + nbytes]
    out = np.zeros(nbytes, dtype=np.uint8)
    _core.copy_bits(buf, bit_offset, out, 0, count)
    return out


def _list_buffers(col: Column, arr: pa.Array, validity: Any) -> tuple[list[Any], list[tuple[int, int]]]:
    """A list column's IPC buffers in pre-order (validity, [offsets], element validity, elements) and
    its two field nodes (the list's, the elements')."""
    n = len(arr)
    if col.layout == "fixed_list":
        d = col.storage.list_size
        child = arr.values.slice(arr.offset * d, n * d)
        parent = [validity]
    else:
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4) if n else None
        first, last = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
        child = arr.values.slice(first, last - first)
        rebased = offsets - np.int32(first) if first else offsets  # IPC list offsets start at 0
        parent = [validity, rebased if n else np.zeros(1, dtype=np.int32)]
    m, cnulls, cbufs = len(child), child.null_count, child.buffers()
    child_validity = _bits(cbufs[0], child.offset, m) if cnulls and cbufs[0] is not None else b""
    if col.width == 0:
        values = _bits(cbufs[1], child.offset, m) if m else b""
    else:
        w = col.width
        values = memoryview(cbufs[1])[child.offset * w : (child.offset + m) * w] if m else b""
    return [*parent, child_validity, values], [(n, arr.null_count), (m, cnulls)]


def _column_buffers(col: Column, arr: pa.Array) -> tuple[list[Any], list[tuple[int, int]]]:
    """The IPC buffers of one column of one batch (validity, [offsets], values) and its field nodes."""
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    n, off, nulls = len(arr), arr.offset, arr.null_count
    bufs = arr.buffers()
    validity = _bits(bufs[0], off, n) if nulls and bufs[0] is not None else b""
    if col.layout in ("list", "fixed_list"):
        return _list_buffers(col, arr, validity)
    if col.layout in ("struct", "list_of", "fixed_list_of"):
        return _nested_buffers(col, arr, validity)
    pieces, node = _flat_buffers(col, arr, validity)
    return pieces, [node]


def _nested_buffers(col: Column, arr: pa.Array, validity: Any) -> tuple[list[Any], list[tuple[int, int]]]:
    """A struct's or a list of other types' buffers and field nodes in pre-order: its own, then its children's."""
    n = len(arr)
    pieces: list[Any] = [validity]
    nodes = [(n, arr.null_count)]
    if col.layout == "struct":
        parts = [arr.field(i) for i in range(len(col.children))]  # field() applies the struct's offset
    elif col.layout == "fixed_list_of":
        d = col.storage.list_size
        parts = [arr.values.slice(arr.offset * d, n * d)]
    else:
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4) if n else None
        first, last = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
        pieces.append(offsets - np.int32(first) if n else np.zeros(1, dtype=np.int32))  # IPC offsets start at 0
        parts = [arr.values.slice(first, last - first)]
    for child, part in zip(col.children, parts):
        child_pieces, child_nodes = _column_buffers(child, part)
        pieces += child_pieces
        nodes += child_nodes
    return pieces, nodes


def _flat_buffers(col: Column, arr: pa.Array, validity: Any) -> tuple[list[Any], tuple[int, int]]:
    n, off = len(arr), arr.offset
    bufs = arr.buffers()
    node = (n, arr.null_count)
    if col.layout == "bool":
        return [validity, _bits(bufs[1], off, n) if n else b""], node
    if col.layout == "fixed":
        w = col.width
        return [validity, memoryview(bufs[1])[off * w : (off + n) * w] if n else b""], node
    dtype = np.int32 if col.layout == "var32" else np.int64
    if n == 0:
        return [validity, np.zeros(1, dtype=dtype), b""], node
    offsets = np.frombuffer(bufs[1], dtype=dtype, count=n + 1, offset=off * col.width)
    first, last = int(offsets[0]), int(offsets[n])
    if first:
        offsets = offsets - offsets.dtype.type(first)  # IPC string offsets start at 0
    data = memoryview(bufs[2])[first:last] if bufs[2] is not None and last > first else b""
    return [validity, offsets, data], node


def check_batch(cols: list[Column], schema: pa.Schema, batch: Any, index: int) -> None:
    if not isinstance(batch, pa.RecordBatch):
        raise UnsupportedTypeError(f"batch {index} is a {type(batch).__name__}, not a pyarrow.RecordBatch")
    if batch.num_columns != len(cols):
        raise SchemaMismatchError(
            f"batch {index} has {batch.num_columns} columns, the schema {len(cols)}: {batch.schema.names} vs "
            f"{schema.names}"
        )
    for i, (col, field) in enumerate(zip(cols, batch.schema)):
        if field.name != col.name or field.type != schema.field(i).type:
            raise SchemaMismatchError(
                f"batch {index} column {i} is {field.name!r} of type {field.type}; the schema has "
                f"{col.name!r} of type {schema.field(i).type}"
            )
        arr = batch.column(i)
        try:
            # Cheap structural checks (buffer sizes); a malformed array would otherwise be cut short
            # silently by the slicing below and give a corrupt file. Nested columns: every offset inside too.
            (arr.storage if isinstance(arr, pa.ExtensionArray) else arr).validate(full=bool(col.children))
        except pa.ArrowException as e:
            raise SchemaMismatchError(f"batch {index} column {col.name!r} is not a valid Arrow array: {e}") from e
        if col.layout == "list" and len(arr):
            storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
            ends = np.frombuffer(storage.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=storage.offset * 4)
            first, last = int(ends[0]), int(ends[-1])
            if not 0 <= first <= last <= len(storage.values) or (ends[1:] < ends[:-1]).any():
                raise SchemaMismatchError(
                    f"batch {index} column {col.name!r}: its list offsets ({first}..{last}) decrease or fall outside "
                    "its elements"
                )
        if col.layout in ("var32", "var64") and len(arr):
            storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
            bufs = storage.buffers()
            dtype = np.int32 if col.layout == "var32" else np.int64
            ends = np.frombuffer(bufs[1], dtype=dtype, count=len(arr) + 1, offset=storage.offset * col.width)
            first, last = int(ends[0]), int(ends[-1])
            if not 0 <= first <= last <= (bufs[2].size if bufs[2] is not None else 0) or (ends[1:] < ends[:-1]).any():
                raise SchemaMismatchError(
                    f"batch {index} column {col.name!r}: its offsets ({first}..{last}) decrease or fall outside "
                    "its data buffer"
                )


def batch_buffers(cols: list[Column], batch: pa.RecordBatch) -> tuple[list[tuple[int, int]], list[Any]]:
    """A checked batch's field nodes and its body buffers in IPC pre-order (empty ones included)."""
    nodes, pieces = [], []
    for col, arr in zip(cols, batch.columns):
        column_pieces, column_nodes = _column_buffers(col, arr)
        nodes.extend(column_nodes)
        pieces.extend(column_pieces)
    return nodes, pieces
