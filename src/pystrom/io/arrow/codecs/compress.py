"""Compressing record batch body buffers for Arrow IPC's ``BodyCompression`` (LZ4 frame or Zstandard).

In a compressed record batch every non-empty body buffer is an int64 (little-endian) holding its
uncompressed length followed by one compressed frame, or -1 followed by the buffer's raw bytes when
the frame would not be smaller (random bytes, short buffers): what Arrow's own writer does when
compressing does not pay, and what every reader (pyarrow, polars, pystrom) accepts. Empty buffers stay
empty. The codec names the format: ``"lz4"`` is the LZ4 *frame* format (CompressionType LZ4_FRAME = 0),
``"zstd"`` Zstandard (ZSTD = 1).

:func:`deflate` and :class:`Deflater` are the one place buffers are compressed. Today they compress
host memory with pyarrow's codecs on a thread pool (``pa.Codec.compress`` releases the GIL, so
buffers of a batch, and of the batches held ahead by the writer, compress in parallel). Given a GPU
(``device``, LZ4 only), a batch's buffers go up and are compressed there
(:mod:`.codecs.device_deflate`), a few batches at once on streams of their own, returning the same
``(length, payload)`` pairs.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
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
    whose 0 is the CPU count), or, given ``device`` (a CUDA backend; LZ4 at its one level only), on that
    GPU. :meth:`submit` returns at once, so the caller can keep several batches compressing while it
    writes earlier ones. Use as a context manager."""

    def __init__(self, codec: str, level: int | None = None, threads: int = 0, device: Any = None) -> None:
        codec, level = check_compression(codec, level)
        if codec is None:
            raise InvalidArgumentError("Deflater needs a codec: 'lz4' or 'zstd'")
        if device is not None and (codec != "lz4" or level is not None):
            raise InvalidArgumentError(f"a GPU compresses 'lz4' at its one level only; got {codec!r}, level {level}")
        self.codec = codec
        self.device = device
        self._codec = None if device is not None else pa.Codec(codec, compression_level=level)
        # on a GPU a few threads, each on a stream of its own: batches' copies and host work while others'
        # kernels run
        self.threads = (
            _DEVICE_THREADS if device is not None else threads or defaults.compress_threads or os.cpu_count() or 1
        )
        self._pool = cf.ThreadPoolExecutor(self.threads, thread_name_prefix="pystrom-deflate")
        # what a writer should keep compressing ahead of its writes so that no thread waits: a buffer or two
        # a CPU thread; several whole batches for a GPU, whose every batch waits on copies and a launch
        self.ahead_bytes = self.threads * (_DEVICE_AHEAD_PER_THREAD if device is not None else _AHEAD_PER_THREAD)

    def submit(self, buffers: Sequence[Any]) -> Deflated | cf.Future:
        """Start compressing ``buffers`` (host memory: anything with the buffer protocol, or pa.Buffer).
        On a GPU the batch is one task, whose future gives all its pairs as :meth:`Deflated.result` does."""
        if self.device is not None:
            return self._pool.submit(_on_device, self.device, list(buffers))
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


_DEVICE_THREADS = 8  # 8 MiB pieces on an H200 host: 1 thread 2.9-4.9 GB/s, 4 6.2-15.6, 8 9.1-23.4
_AHEAD_PER_THREAD = 16 << 20
_DEVICE_AHEAD_PER_THREAD = 64 << 20
_streams = threading.local()


def _thread_stream(cp: Any) -> Any:
    """This compressing thread's own non-blocking stream on the current GPU."""
    key = cp.cuda.Device().id
    streams = getattr(_streams, "by_device", None)
    if streams is None:
        streams = _streams.by_device = {}
    if key not in streams:
        streams[key] = cp.cuda.Stream(non_blocking=True)
    return streams[key]


def _on_device(backend: Any, buffers: list[Any]) -> list[tuple[int, Any]]:
    """``buffers`` (host) up to ``backend``'s GPU in one copy, compressed there to LZ4 frames, the frames back
    in one copy: the pairs :meth:`Deflated.result` gives."""
    from .device_deflate import lz4_frames_device

    views = [memoryview(b).cast("B") for b in buffers]
    sizes = np.array([v.nbytes for v in views], dtype=np.int64)
    full = np.flatnonzero(sizes)
    out: list[tuple[int, Any]] = [(0, b"")] * len(views)
    if not len(full):
        return out
    offsets = np.cumsum(sizes[full]) - sizes[full]
    cp = backend.xp
    total = int(sizes.sum())
    with backend.activate(), _thread_stream(cp) as stream:
        # through pinned memory: copies from pageable memory are serialised by the driver (~7 GB/s from any
        # number of threads on an H200 host), NumPy's copies into pinned memory run on every thread
        stage = np.frombuffer(cp.cuda.alloc_pinned_memory(total), dtype=np.uint8, count=total)
        for i, at in zip(full.tolist(), offsets.tolist()):
            stage[at : at + sizes[i]] = np.frombuffer(views[i], dtype=np.uint8)
        src = cp.empty(total, dtype=cp.uint8)
        src.set(stage, stream=stream)
        host, spans = lz4_frames_device(backend, src, offsets, sizes[full])
    for i, span in zip(full.tolist(), spans):
        out[i] = (UNCOMPRESSED, buffers[i]) if span is None else (int(sizes[i]), host[span[0] : span[0] + span[1]])
    return out


def deflate(codec: str, level: int | None, buffers: Sequence[Any]) -> list[tuple[int, Any]]:
    """Compress ``buffers`` with ``codec`` ('lz4' or 'zstd') at ``level`` (None: the codec's default), in
    parallel: ``(uncompressed length, frame)`` each, ``(-1, raw bytes)`` where the frame would not be
    smaller, ``(0, b"")`` for an empty buffer."""
    with Deflater(codec, level) as d:
        return d.submit(buffers).result()
