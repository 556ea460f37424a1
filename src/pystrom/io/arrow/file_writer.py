"""Write an uncompressed Arrow IPC file (Feather v2) whose every body buffer starts on a 64-byte file offset.

Why our own writer: the reader (``read_arrow``) preads each buffer straight into device memory, and
GPUDirect Storage and O_DIRECT-style reads are fastest on aligned offsets; pyarrow's writer pads to 8
bytes and cannot be told otherwise from Python.

File layout (Arrow columnar format, "IPC File Format")::

    "ARROW1" 00 00
    schema message                       (metadata only)
    record batch message, body           (one per batch; body at a multiple of 64)
    ...
    FF FF FF FF 00 00 00 00              (end-of-stream marker, for stream readers)
    footer flatbuffer, int32 length, "ARROW1"

Every message is encapsulated: ``FF FF FF FF``, int32 metadata length, flatbuffer, padding. We pad the
metadata so that the body that follows starts on a multiple of 64, and pad every body buffer to 64, so
all buffers land on 64-byte file offsets. Statistics are written per batch and in the footer (``_stats``).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import struct
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pt

from ... import _core
from ...errors import FileError, SchemaMismatchError, UnsupportedTypeError
from . import format as fmt
from .replace import replace_file
from .stats import (
    FINGERPRINT_KEY,
    FOOTER_MAX_KEY,
    FOOTER_MIN_KEY,
    STATS_KEY_PREFIX,
    BlocksFingerprint,
    column_stats,
    footer_lists,
)

__all__ = ["write_ipc_file", "WriteSummary", "ALIGNMENT"]

ALIGNMENT = 64
MAGIC = b"ARROW1"
_CONTINUATION = b"\xff\xff\xff\xff"
_ZEROS = bytes(ALIGNMENT)
_IOV_MAX = 512  # well under Linux's 1024 iovecs per writev
_EXTENSION_KEYS = (b"ARROW:extension:name", b"ARROW:extension:metadata")
# Footer statistics from an earlier file would describe other batches: never carried over.
_STALE_KEYS = (FOOTER_MIN_KEY.encode(), FOOTER_MAX_KEY.encode())
# C++ canonical extension types whose serialized metadata is empty (pyarrow does not expose it for them).
_EMPTY_METADATA_EXTENSIONS = {"arrow.uuid", "arrow.json", "arrow.bool8"}


@dataclass(frozen=True)
class WriteSummary:
    """What :func:`write_ipc_file` wrote."""

    path: str
    num_rows: int
    num_batches: int
    bytes_written: int


@dataclass(frozen=True)
class _Column:
    name: str
    storage: pa.DataType
    layout: str  # "bool", "fixed" (width bytes per value), "var32" / "var64" (offsets + data), "list", "fixed_list"
    width: int  # for lists: the element's width in bytes (0: bit-packed booleans)
    spec: fmt.FieldSpec  # (name, storage type, nullable, field metadata) for the schema message


def _pad(n: int) -> int:
    return -n % ALIGNMENT


def _as_bytes(x: Any) -> bytes:
    return x if isinstance(x, bytes) else str(x).encode()


def _unsupported(name: str, t: pa.DataType) -> UnsupportedTypeError:
    hint = ""
    if pt.is_dictionary(t):
        hint = " (decode it first: arr.dictionary_decode())"
    elif pt.is_list(t) or pt.is_fixed_size_list(t):
        hint = " (lists are written with elements of bool, int8..64, uint8..64 or float16/32/64)"
    elif pt.is_nested(t):
        hint = " (nested types are not supported: flatten it into columns first)"
    elif pt.is_decimal(t):
        hint = " (only decimal128 is written: cast it to decimal128 with precision <= 38, or to float64)"
    elif pt.is_string_view(t) or pt.is_binary_view(t):
        hint = " (cast it to string/binary or large_string/large_binary)"
    return UnsupportedTypeError(
        f"cannot write column {name!r} of type {t} to an Arrow file{hint}; supported: bool, int8..64, "
        "uint8..64, float16/32/64, date32/64, time32/64, timestamp, duration, decimal128, string, "
        "large_string, binary, large_binary, fixed_size_binary, month_day_nano_interval, list and "
        "fixed_size_list of bool/int/uint/float, and extension types over them (uuid)"
    )


def _layout(name: str, t: pa.DataType) -> tuple[str, int]:
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
            raise _unsupported(name, t)
        return ("list" if pt.is_list(t) else "fixed_list"), width
    if t in (pa.string(), pa.binary()):
        return "var32", 4
    if t in (pa.large_string(), pa.large_binary()):
        return "var64", 8
    raise _unsupported(name, t)


def _columns(schema: pa.Schema) -> list[_Column]:
    """Check every field is writable; describe how each one is laid out and encoded."""
    cols = []
    for field in schema:
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
                    f"cannot write column {field.name!r}: extension type {t.extension_name} does not expose "
                    "its serialized metadata to Python; write its storage type instead"
                )
            meta += [(_EXTENSION_KEYS[0], t.extension_name.encode()), (_EXTENSION_KEYS[1], serialized)]
        else:
            storage = t
        if isinstance(storage, pa.BaseExtensionType) or pt.is_dictionary(storage):
            raise _unsupported(field.name, t)
        layout, width = _layout(field.name, storage)
        cols.append(_Column(field.name, storage, layout, width, (field.name, storage, field.nullable, meta)))
    return cols


class _Sink:
    """Sequential writes to one file descriptor: each message goes out in one ``writev``."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path, self.pos = fd, path, 0
        self.fingerprint = BlocksFingerprint()  # of the batches, for the footer statistics (stats.py)

    def write(self, pieces: list[Any]) -> None:
        views = []
        for p in pieces:
            v = memoryview(p)
            if v.nbytes:
                views.append(v.cast("B") if v.format != "B" or v.ndim != 1 else v)
        i = 0
        try:
            while i < len(views):
                if hasattr(os, "writev"):
                    n = os.writev(self.fd, views[i : i + _IOV_MAX])
                else:  # pragma: no cover - Windows
                    n = os.write(self.fd, views[i])
                self.pos += n
                while n > 0:  # a short write: move past what went out
                    if n >= views[i].nbytes:
                        n -= views[i].nbytes
                        i += 1
                    else:
                        views[i] = views[i][n:]
                        n = 0
        except OSError as e:
            raise FileError(e.errno, f"cannot write Arrow file {self.path!r}: {e.strerror or e}", self.path) from e

    def message(self, flatbuffer: bytes, body: list[Any], body_length: int, batch: bool = True) -> fmt.Block:
        """Write one encapsulated message with its body; the body starts on a multiple of 64."""
        start = self.pos
        prefix = 8 + len(flatbuffer)
        meta_len = prefix + _pad(start + prefix)  # a multiple of 8 as well, since start is
        header = _CONTINUATION + struct.pack("<i", meta_len - 8)
        padding = _ZEROS[: meta_len - prefix]
        self.write([header, flatbuffer, padding, *body])
        if batch:
            self.fingerprint.add(start, meta_len, body_length, header + flatbuffer + padding)
        return fmt.Block(start, meta_len, body_length)


def _bits(buf: pa.Buffer, bit_offset: int, count: int) -> Any:
    """``count`` bits of an LSB bitmap starting at ``bit_offset``, moved to bit 0 (IPC arrays have offset 0)."""
    nbytes = (count + 7) // 8
    if bit_offset % 8 == 0:
        return memoryview(buf)[bit_offset // 8 : bit_offset // 8 + nbytes]
    out = np.zeros(nbytes, dtype=np.uint8)
    _core.copy_bits(buf, bit_offset, out, 0, count)
    return out


def _list_buffers(col: _Column, arr: pa.Array, validity: Any) -> tuple[list[Any], list[tuple[int, int]]]:
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


def _column_buffers(col: _Column, arr: pa.Array) -> tuple[list[Any], list[tuple[int, int]]]:
    """The IPC buffers of one column of one batch (validity, [offsets], values) and its field nodes."""
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    n, off, nulls = len(arr), arr.offset, arr.null_count
    bufs = arr.buffers()
    validity = _bits(bufs[0], off, n) if nulls and bufs[0] is not None else b""
    if col.layout in ("list", "fixed_list"):
        return _list_buffers(col, arr, validity)
    pieces, node = _flat_buffers(col, arr, validity)
    return pieces, [node]


def _flat_buffers(col: _Column, arr: pa.Array, validity: Any) -> tuple[list[Any], tuple[int, int]]:
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


def _check_batch(cols: list[_Column], schema: pa.Schema, batch: Any, index: int) -> None:
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
            # silently by the slicing below and give a corrupt file.
            (arr.storage if isinstance(arr, pa.ExtensionArray) else arr).validate()
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


def _encode_batch(cols: list[_Column], batch: pa.RecordBatch, stats: dict[str, str]) -> tuple[bytes, list, int]:
    nodes, buffers, body = [], [], []
    pos = 0
    for col, arr in zip(cols, batch.columns):
        pieces, column_nodes = _column_buffers(col, arr)
        nodes.extend(column_nodes)
        for piece in pieces:
            size = memoryview(piece).nbytes
            buffers.append((pos, size))
            if size:
                body.append(piece)
                pad = _pad(size)
                if pad:
                    body.append(_ZEROS[:pad])
                pos += size + pad
    meta = [(STATS_KEY_PREFIX + name, value) for name, value in stats.items()]
    return fmt.encode_batch_message(batch.num_rows, nodes, buffers, pos, meta), body, pos


class _Done:
    """A finished future holding None (no statistics asked for)."""

    def result(self) -> None:
        return None


_NONE = _Done()


def _stats_threads(stats: bool) -> Any:
    if not stats:
        return contextlib.nullcontext(None)
    return cf.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="pystrom-stats")


def _temp_name(path: str) -> str:
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.{uuid.uuid4().hex[:12]}.pystrom-tmp")


def write_ipc_file(
    path: str | os.PathLike,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    *,
    stats: bool = True,
    metadata: Mapping[str, str] | None = None,
    footer_stats: bool = True,
) -> WriteSummary:
    """Write ``batches`` to an uncompressed Arrow IPC file with every body buffer 64-byte aligned.

    Parameters
    ----------
    path : str or os.PathLike
        Destination. Written under a temporary name in the same directory and put in place at the end
        (:mod:`.replace`: an atomic exchange with an existing file, without ext4's flush), so a
        failed write never leaves a file at ``path`` (an existing one is replaced only on success),
        and a reader opening ``path`` sees the old file or the new one, whole.
    schema : pyarrow.Schema
        The batches' schema; schema-level and field-level metadata are written (field-level
        ``min_values``/``max_values`` keys are dropped: they described someone else's batches).
    batches : iterable of pyarrow.RecordBatch
        Consumed one at a time and never held; any number, including none or empty ones. Sliced
        arrays are fine (IPC arrays start at offset 0; the writer rebases bitmaps and offsets).
    stats : bool
        Write per-batch min/max statistics in PG-Strom's format (see ``_stats``).
    metadata : Mapping[str, str], optional
        Extra schema-level metadata, merged over ``schema.metadata``.
    footer_stats : bool
        With ``stats``, also write the older per-file ``min_values``/``max_values`` field metadata.
        PG-Strom (master of 2026-08-21, d54af89) reads only these when a file has them and then ignores
        the per-batch keys, so string ranges (which that format cannot hold) reach PG-Strom only with
        ``footer_stats=False``.

    Returns
    -------
    WriteSummary

    Raises
    ------
    UnsupportedTypeError
        A column type the writer cannot write (named with its column), or a batch that is not a
        RecordBatch.
    SchemaMismatchError
        A batch whose columns differ from ``schema``.
    FileError
        The file cannot be created, written or renamed (an ``OSError``; the message names the path).
    """
    if not isinstance(schema, pa.Schema):
        raise UnsupportedTypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise UnsupportedTypeError(f"metadata must be a mapping of str to str, got {type(metadata).__name__}")
    try:
        dest = os.fspath(path)
    except TypeError:
        raise UnsupportedTypeError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
    if isinstance(dest, bytes):
        dest = os.fsdecode(dest)
    cols = _columns(schema)
    schema_meta = dict(schema.metadata or {})
    for k, v in (metadata or {}).items():
        schema_meta[_as_bytes(k)] = _as_bytes(v)
    schema_meta_pairs = list(schema_meta.items())
    specs = [c.spec for c in cols]
    # Per-batch keys find their column by name (PG-Strom: the first field of that name, compared as C
    # strings), so columns whose names repeat or hold a NUL get none; the footer lists are positional.
    names = [c.name for c in cols]
    keyed = {n for n in names if names.count(n) == 1 and "\0" not in n}

    tmp = _temp_name(dest)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        raise FileError(e.errno, f"cannot create Arrow file {dest!r}: {e.strerror or e}", dest) from e
    sink = _Sink(fd, dest)
    closed = False
    try:
        sink.write([MAGIC, b"\0\0"])
        sink.message(fmt.encode_schema_message(specs, schema_meta_pairs), [], 0, batch=False)
        blocks: list[fmt.Block] = []
        footer_entries: list[list] = [[] for _ in cols]  # by position: names may repeat
        num_rows = 0

        def write_batch(batch: pa.RecordBatch, found: list[Any]) -> None:
            per_batch: dict[str, str] = {}
            for j, (col, future) in enumerate(zip(cols, found)):
                st = future.result()
                if st is not None and col.name in keyed:
                    per_batch[col.name] = st.per_batch
                footer_entries[j].append(st.footer if st is not None else None)
            flatbuffer, body, body_length = _encode_batch(cols, batch, per_batch)
            blocks.append(sink.message(flatbuffer, body, body_length))

        # Statistics (NumPy/pyarrow reductions, which release the GIL) of batch k run on the stats
        # threads, a column per task, while batch k-1 is written: one batch is held ahead, no more.
        pending = None
        with _stats_threads(stats) as pool:
            for index, batch in enumerate(batches):
                _check_batch(cols, schema, batch, index)
                found = [
                    pool.submit(column_stats, f.type, a) if stats else _NONE for f, a in zip(schema, batch.columns)
                ]
                if pending is not None:
                    write_batch(*pending)
                pending = (batch, found)
                num_rows += batch.num_rows
                del batch
            if pending is not None:
                write_batch(*pending)
                pending = None  # stream: nothing of a written batch is kept
        sink.write([_CONTINUATION, b"\0\0\0\0"])
        footer_specs = []
        for spec, entries in zip(specs, footer_entries):
            if footer_stats and any(e is not None for e in entries):  # only types the footer format holds have entries
                mins, maxs = footer_lists(entries)
                spec = (*spec[:3], [*spec[3], (FOOTER_MIN_KEY, mins), (FOOTER_MAX_KEY, maxs)])
            footer_specs.append(spec)
        footer_meta = []
        if footer_specs != specs:  # the lists hold only for these very batches: say which (stats.py)
            footer_meta.append((FINGERPRINT_KEY, sink.fingerprint.hexdigest()))
        footer = fmt.encode_footer(footer_specs, schema_meta_pairs, blocks, footer_meta)
        sink.write([footer, struct.pack("<i", len(footer)), MAGIC])
        size = sink.pos
        closed = True
        os.close(fd)
        try:
            replace_file(tmp, dest)
        except OSError as e:
            raise FileError(e.errno, f"cannot create Arrow file {dest!r}: {e.strerror or e}", dest) from e
    except BaseException:
        if not closed:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return WriteSummary(dest, num_rows, len(blocks), size)
