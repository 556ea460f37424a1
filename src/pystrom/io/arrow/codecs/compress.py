"""Compressing record batch body buffers for Arrow IPC's ``BodyCompression`` (LZ4 frame or Zstandard).

In a compressed record batch every non-empty body buffer is an int64 (little-endian) holding its
uncompressed length followed by one compressed frame, or -1 followed by the buffer's raw bytes when
the frame would not be smaller (random bytes, short buffers): what Arrow's own writer does when
compressing does not pay, and what every reader (pyarrow, polars, pystrom) accepts. Empty buffers stay
empty. The codec names the format: ``"lz4"`` is the LZ4 *frame* format (CompressionType LZ4_FRAME = 0),
``"zstd"`` Zstandard (ZSTD = 1).

:func:`deflate` and :class:`Deflater` are the one place buffers are compressed. Today they compress
host memory with pyarrow's codecs on a thread pool (``pa.Codec.compress`` releases the GIL, so
buffers of a batch, and of the batches held ahead by the writer, compress in parallel). Device
buffers (nvCOMP for Tables on a GPU) would be dispatched in :meth:`Deflater.submit`, returning the
same ``(length, payload)`` pairs.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ...._settings import defaults
from ....errors import InvalidArgumentError

__all__ = ["CODECS", "UNCOMPRESSED", "check_compression", "deflate", "Deflater"]

# CompressionType (Message.fbs) of each codec name write_arrow accepts
CODECS = {"lz4": 0, "zstd": 1}
UNCOMPRESSED = -1  # the length prefix of a buffer stored raw


def check_compression(compression: Any, level: Any) -> tuple[str | None, int | None]:
    """Validate ``write_arrow``'s ``compression`` and ``compression_level``: InvalidArgumentError (a
    ValueError) naming the argument."""
    if compression is not None and not isinstance(compression, str):
        raise InvalidArgumentError(f"compression must be None, 'lz4' or 'zstd'; got {type(compression).__name__}")
    if isinstance(compression, str) and compression not in CODECS:
        raise InvalidArgumentError(f"compression must be None, 'lz4' or 'zstd'; got {compression!r}")
    if level is None:
        return compression, None
    if isinstance(level, bool) or not isinstance(level, int):
        raise InvalidArgumentError(f"compression_level must be an int or None; got {type(level).__name__}")
    if compression is None:
        raise InvalidArgumentError(f"compression_level={level} given without compression ('lz4' or 'zstd')")
    lo, hi = pa.Codec.minimum_compression_level(compression), pa.Codec.maximum_compression_level(compression)
    if not lo <= level <= hi:
        raise InvalidArgumentError(f"compression_level for {compression!r} must be in {lo}..{hi}; got {level}")
    return compression, level


def _frame(codec: pa.Codec, buf: Any) -> tuple[int, Any]:
    """One non-empty host buffer -> (its length, one compressed frame), or (-1, the buffer) when no smaller."""
    n = memoryview(buf).nbytes
    out = codec.compress(buf)  # a pa.Buffer; the GIL is released while it runs
    if out.size >= n:
        return UNCOMPRESSED, buf
    return n, out


class _Done:
    def __init__(self, value: tuple[int, Any]) -> None:
        self.value = value

    def result(self) -> tuple[int, Any]:
        return self.value


_EMPTY = _Done((0, b""))


class Deflated:
    """The buffers of one :meth:`Deflater.submit`, compressing; :meth:`result` waits for them."""

    def __init__(self, futures: list[Any]) -> None:
        self._futures = futures

    def result(self) -> list[tuple[int, Any]]:
        """``(uncompressed length, frame)``, ``(-1, raw bytes)`` or ``(0, b"")`` (an empty buffer) each."""
        return [f.result() for f in self._futures]


class Deflater:
    """Compresses lists of buffers on ``threads`` threads (0: ``pystrom.defaults.compress_threads``,
    whose 0 is the CPU count). :meth:`submit` returns at once, so the caller can keep several batches
    compressing while it writes earlier ones. Use as a context manager."""

    def __init__(self, codec: str, level: int | None = None, threads: int = 0) -> None:
        codec, level = check_compression(codec, level)
        if codec is None:
            raise InvalidArgumentError("Deflater needs a codec: 'lz4' or 'zstd'")
        self.codec = codec
        self._codec = pa.Codec(codec, compression_level=level)
        self.threads = threads or defaults.compress_threads or os.cpu_count() or 1
        self._pool = cf.ThreadPoolExecutor(self.threads, thread_name_prefix="pystrom-deflate")

    def submit(self, buffers: Sequence[Any]) -> Deflated:
        """Start compressing ``buffers`` (host memory: anything with the buffer protocol, or pa.Buffer)."""
        futures: list[Any] = []
        for buf in buffers:
            if memoryview(buf).nbytes == 0:
                futures.append(_EMPTY)
            else:
                futures.append(self._pool.submit(_frame, self._codec, buf))
        return Deflated(futures)

    def close(self, cancel: bool = False) -> None:
        self._pool.shutdown(wait=True, cancel_futures=cancel)

    def __enter__(self) -> Deflater:
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.close(cancel=exc_type is not None)


def deflate(codec: str, level: int | None, buffers: Sequence[Any]) -> list[tuple[int, Any]]:
    """Compress ``buffers`` with ``codec`` ('lz4' or 'zstd') at ``level`` (None: the codec's default), in
    parallel: ``(uncompressed length, frame)`` each, ``(-1, raw bytes)`` where the frame would not be
    smaller, ``(0, b"")`` for an empty buffer."""
    with Deflater(codec, level) as d:
        return d.submit(buffers).result()
