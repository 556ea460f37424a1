"""Write an Arrow IPC file (Feather v2) whose every body buffer starts on a 64-byte file offset.

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
Which types are written and how a batch becomes buffers: :mod:`.write.columns`. With ``compression``
each buffer is compressed on its own (:mod:`.codecs.compress`) and the padding follows its compressed size.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import functools
import os
import struct
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ....errors import FileError, UnsupportedTypeError
from ..codecs.compress import CODECS, Deflater, check_compression
from ..file import format as fmt
from ..file.stats import (
    FINGERPRINT_KEY,
    FOOTER_MAX_KEY,
    FOOTER_MIN_KEY,
    STATS_KEY_PREFIX,
    BlocksFingerprint,
    column_stats,
    footer_lists,
)
from .columns import batch_buffers, check_batch, columns
from .replace import replace_file

__all__ = ["write_ipc_file", "WriteSummary", "ALIGNMENT"]

ALIGNMENT = 64
MAGIC = b"ARROW1"
_CONTINUATION = b"\xff\xff\xff\xff"
_ZEROS = bytes(ALIGNMENT)
_IOV_MAX = 512  # well under Linux's 1024 iovecs per writev
# Compressed writes hold batches ahead while they total under this (or the deflater's ahead_bytes, if more),
# their frames too: about twice as much memory at most
_AHEAD_BYTES = 64 << 20


@dataclass(frozen=True)
class WriteSummary:
    """What :func:`write_ipc_file` wrote."""

    path: str
    num_rows: int
    num_batches: int
    bytes_written: int


def _pad(n: int) -> int:
    return -n % ALIGNMENT


def _as_bytes(x: Any) -> bytes:
    return x if isinstance(x, bytes) else str(x).encode()


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


def _encode_batch(
    length: int,
    nodes: list[tuple[int, int]],
    pieces: list[Any],
    packed: list[tuple[int, Any]] | None,
    stats: dict[str, str],
    codec: int | None,
) -> tuple[bytes, list, int]:
    """A batch's flatbuffer and body: every buffer padded to 64; with ``packed`` (the buffers compressed,
    :mod:`.codecs.compress`) each non-empty one is its int64 length prefix and payload instead of its bytes."""
    buffers, body = [], []
    pos = 0
    for i, piece in enumerate(pieces):
        if packed is None:
            parts = [piece]
            size = memoryview(piece).nbytes
        else:
            length_prefix, payload = packed[i]
            size = memoryview(payload).nbytes
            parts = [struct.pack("<q", length_prefix), payload]
            size += 8 if size else 0  # empty buffers stay empty, without a prefix
        buffers.append((pos, size))
        if size:
            body.extend(parts)
            pad = _pad(size)
            if pad:
                body.append(_ZEROS[:pad])
            pos += size + pad
    meta = [(STATS_KEY_PREFIX + name, value) for name, value in stats.items()]
    return fmt.encode_batch_message(length, nodes, buffers, pos, meta, compression=codec), body, pos


class _Done:
    """A finished future holding None (no statistics asked for)."""

    def result(self) -> None:
        return None


_NONE = _Done()


@functools.cache
def _stats_pool() -> cf.ThreadPoolExecutor:
    """The statistics threads, one pool for the process: a pool a write started four threads and joined
    them at its end, which on a busy machine waits for each to be scheduled once more."""
    return cf.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="pystrom-stats")


if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads: a pool of its own
    os.register_at_fork(after_in_child=_stats_pool.cache_clear)


class _StatsTasks:
    """One write's statistics tasks on the shared pool; all finished when the write returns or raises (no
    task of it still reading the caller's arrays)."""

    def __init__(self) -> None:
        self.futures: list[cf.Future] = []

    def submit(self, fn: Any, *args: Any) -> cf.Future:
        if len(self.futures) >= 256:  # a file of thousands of batches: keep only those not finished
            self.futures = [f for f in self.futures if not f.done()]
        future = _stats_pool().submit(fn, *args)
        self.futures.append(future)
        return future


@contextlib.contextmanager
def _stats_threads(stats: bool) -> Iterator[_StatsTasks | None]:
    if not stats:
        yield None
        return
    tasks = _StatsTasks()
    try:
        yield tasks
    finally:
        cf.wait(tasks.futures)


def _deflater(compression: str | None, level: int | None, device: Any) -> Any:
    return contextlib.nullcontext(None) if compression is None else Deflater(compression, level, device=device)


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
    compression: str | None = None,
    compression_level: int | None = None,
    compress_on: Any = None,
) -> WriteSummary:
    """Write ``batches`` to an Arrow IPC file with every body buffer 64-byte aligned.

    Parameters
    ----------
    path : str or os.PathLike
        Destination. Written under a temporary name in the same directory and put in place at the end
        (:mod:`.write.replace`: an atomic exchange with an existing file, without ext4's flush), so a
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
    compression : None, "lz4" or "zstd"
        Compress every body buffer (Arrow's ``BodyCompression``: LZ4 frame or Zstandard, one frame per
        buffer; a buffer that does not shrink is stored raw, length prefix -1) on
        ``pystrom.defaults.compress_threads`` threads. Buffers still start on 64-byte offsets.
    compression_level : int, optional
        The codec's level (None: its default; zstd -131072..22, lz4 1..12 as pyarrow reports).
    compress_on : CUDA backend, optional
        Compress on this GPU instead (``compression="lz4"`` without a level only; :mod:`.codecs.device_deflate`).

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
    compression, compression_level = check_compression(compression, compression_level)
    codec = None if compression is None else CODECS[compression]
    cols = columns(schema)
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

        def write_batch(length: int, found: list[Any], nodes: list, pieces: list, packed: Any) -> None:
            per_batch: dict[str, str] = {}
            for j, (col, future) in enumerate(zip(cols, found)):
                st = future.result()
                if st is not None and col.name in keyed:
                    per_batch[col.name] = st.per_batch
                footer_entries[j].append(st.footer if st is not None else None)
            packed = None if packed is None else packed.result()
            flatbuffer, body, body_length = _encode_batch(length, nodes, pieces, packed, per_batch, codec)
            blocks.append(sink.message(flatbuffer, body, body_length))

        # Statistics (NumPy/pyarrow reductions, which release the GIL) of batch k run on the stats
        # threads, a column per task, while batch k-1 is written: one batch is held ahead. Compressed,
        # batches are held ahead (their buffers compressing on the deflater's threads, GIL released
        # too) while they total under ``ahead`` bytes, so that every thread has a buffer to work on.
        pending: collections.deque = collections.deque()
        held = 0
        with _stats_threads(stats) as pool, _deflater(compression, compression_level, compress_on) as deflater:
            ahead = 0 if deflater is None else max(_AHEAD_BYTES, deflater.ahead_bytes)
            for index, batch in enumerate(batches):
                check_batch(cols, schema, batch, index)
                found = [
                    pool.submit(column_stats, f.type, a) if stats else _NONE for f, a in zip(schema, batch.columns)
                ]
                nodes, pieces = batch_buffers(cols, batch)
                nbytes = sum(memoryview(p).nbytes for p in pieces)
                packed = None if deflater is None else deflater.submit(pieces)
                pending.append((nbytes, (batch.num_rows, found, nodes, pieces, packed)))
                held += nbytes
                num_rows += batch.num_rows
                del batch, found, nodes, pieces, packed
                while len(pending) > 1 and (deflater is None or held > ahead):
                    nbytes, args = pending.popleft()
                    held -= nbytes
                    write_batch(*args)
            while pending:  # stream: nothing of a written batch is kept
                write_batch(*pending.popleft()[1])
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
