"""Compressed Arrow buffers decompressed on the CPU, on a thread pool: ``io_threads`` frames at once,
the largest first (the C++ decoders, and pyarrow's codec, release the GIL).

- LZ4_FRAME: pystrom's own decoder (``_core.lz4_frame_decode``, csrc/lz4_size.cpp, the CPU twin of
  kernels/lz4.cu), one pass straight into the frame's place (:meth:`.codecs.decompress.Frames.out`). It replaced
  pyarrow's codec, which decompresses into memory of its own (a second copy of every byte) and returns
  the claimed size whatever the frame produced (so each frame was first walked for its real size):
  on the 2-core VM, a 240 MiB LZ4 file of 64Ki-row batches read in 66.6 ms that way against
  ``feather.read_table``'s 44.9, and in 49.3 against 49.0 decoded here. Its tests compare it with
  pyarrow's codec (tests/test_lz4_decode.py). A pool task decodes its frames in one call
  (``_core.lz4_frames_decode``, to the addresses :func:`.codecs.decompress.inflate` worked out): a Python call
  and an output array a frame cost more than decoding the frames of a many-batch file (16,384 of 4 KiB).
- ZSTD: the system's libzstd (loaded at run time: csrc/zstd_decode.cpp), a task's frames in one call
  straight into their places, one decompression context a thread; or pyarrow's codec
  (``pa.Codec("zstd")``), its output copied to its place: a Python call, a context and an output buffer
  a frame, ~12 us (16,384 frames of 4 KiB: 0.2 s of work where the decoding takes 0.06). Which one is
  ``pystrom.defaults.zstd_decoder``: 'auto' (the default) takes libzstd where it is 1.5.7 or later
  (``_AUTO_LIBZSTD``, the version pyarrow bundles), else pyarrow's codec. The two are different libzstd
  versions: every valid frame decodes to the same bytes, but a frame corrupt inside (Arrow's carry no
  checksum) that one notices and the other not, or neither, may decode to other bytes, and the older
  ones notice less (the fuzz tests compare pystrom's rows with pyarrow's, and a difference with
  pyarrow's codec's read again). On an H200 host (16 cores), 2 GiB of 64Ki-row batches read into the
  GPU at 7.50 GB/s through libzstd 1.5.5 against 6.05 through pyarrow's codec; decoding alone, 9.0 GB/s
  against 7.5 on 16 threads. Either refuses a frame that does not fill the claimed size exactly, and
  every ZSTD frame is first checked for structure (:func:`check_zstd`, below) so that both devices
  refuse the same frames (e.g. a skippable or a second frame, which libzstd would accept).

The ZSTD structure check (``_core.zstd_frames_check``): nvCOMP's batched ZSTD decoder faults
(cudaErrorIllegalAddress, which poisons the CUDA context) on a truncated or corrupt frame, so
:mod:`.codecs.device` hands it only frames that pass, and the CPU codecs run the same check so that a
file is refused alike on either device. The walk (csrc/zstd_frame.cpp,
RFC 8878) reads headers only, a few bytes per 128 KiB block: exactly one zstd frame (no skippable frame,
no dictionary, nothing after it), every block header inside the frame and within the block maximum,
the literals and sequences section headers of compressed blocks, and whether the blocks can produce
the claimed size (the frame's content size, where present, must equal it). Entropy-coded contents are
not decoded: the decoder still has to cope with a frame that passes and is corrupt inside.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
from typing import Any

import numpy as np
import pyarrow as pa

from .... import _core
from ...._pools import SharedPool, run_all
from ...._settings import defaults
from ..file.ranges import io_threads

__all__ = ["inflate_host", "check_zstd", "zstd_reason"]

_PYARROW_NAMES = {"lz4_frame": "lz4", "zstd": "zstd"}


_inflaters = SharedPool("pystrom-inflate", io_threads)


def _pool() -> cf.ThreadPoolExecutor:
    return _inflaters.get()


@functools.cache
def _codec(name: str) -> pa.Codec:
    return pa.Codec(_PYARROW_NAMES[name])


# 'auto' takes the system's libzstd from this version on: pyarrow 26 bundles 1.5.7, and the 1.5.4 and 1.5.5
# of Debian 12 and Ubuntu 24.04 refuse fewer corrupt frames (of 6,392 damaged ones in tests/zstd_cases.py,
# 1.5.4 decoded 15 that 1.5.7 refuses and 35 of the 358 both decode to other bytes)
_AUTO_LIBZSTD = 10507


def native_zstd() -> bool:
    """Whether ZSTD frames are decoded by the system's libzstd in C++ (module docstring), not by pyarrow's
    codec: ``pystrom.defaults.zstd_decoder`` is 'libzstd' and it loads, or 'auto' and it is 1.5.7 or later."""
    if defaults.zstd_decoder == "pyarrow":
        return False
    version = _libzstd_version()
    return version >= _AUTO_LIBZSTD if defaults.zstd_decoder == "auto" else version > 0


@functools.cache
def _libzstd_version() -> int:
    return _core.zstd_load()


def _libzstd_loads() -> bool:
    return _libzstd_version() > 0


def inflate_host(frames: Any, at: np.ndarray | None = None) -> np.ndarray:
    """:func:`.codecs.decompress.inflate` for NumPy ``src``/``dst`` (an :class:`.codecs.decompress.Frames`);
    ``at``: where each frame's output starts (addresses :func:`.codecs.decompress.inflate` checked or was
    vouched for; None: from ``frames``' arrays)."""
    n = len(frames.src_offsets)
    produced = np.empty(n, dtype=np.int64)
    order = np.argsort(-np.asarray(frames.dst_sizes, dtype=np.int64), kind="stable")  # largest first (module docstring)
    lz4 = frames.codec == "lz4_frame"
    # ZSTD: the structure checked first, on both devices (module docstring); a refused frame is not decoded
    refused = None if lz4 else check_zstd(frames.src, frames.src_offsets, frames.src_sizes, frames.dst_sizes)
    if refused is not None:
        produced[refused != 0] = -1
        order = order[refused[order] == 0]
    # Frames dealt round-robin (largest first) into a few tasks a thread: a task a frame cost ~15 us of
    # the pool's Python each (2048 batches x 8 columns: 0.25 s of a 0.65 s read on the 2-core VM)
    tasks = min(len(order), 4 * io_threads())
    if lz4 or native_zstd():  # a task's frames in one C++ call (module docstring)
        decode = _core.lz4_frames_decode if lz4 else _core.zstd_frames_decode
        if at is None:
            at = np.array([frames.out(i).ctypes.data for i in range(n)], dtype=np.int64)
        ints = (frames.src_offsets, frames.src_sizes, at, frames.dst_sizes)
        args = (frames.src, *(np.ascontiguousarray(a, dtype=np.int64) for a in ints))

        def run(t: int) -> None:
            decode(*args, order[t::tasks].copy(), produced)

        run_all(_pool(), run, range(tasks)) if tasks > 1 else [run(t) for t in range(tasks)]
        return produced
    codec = _codec(frames.codec)
    src = frames.src
    so, ss = frames.src_offsets.tolist(), frames.src_sizes.tolist()
    ds = frames.dst_sizes.tolist()

    def one(i: int) -> int:
        try:
            out = codec.decompress(src[so[i] : so[i] + ss[i]], decompressed_size=ds[i])
        except (pa.ArrowException, OSError, ValueError):
            return -1
        if out.size != ds[i]:
            return -1
        if ds[i]:
            frames.out(i)[:] = np.frombuffer(out, dtype=np.uint8)
        return ds[i]

    def some(t: int) -> list[int]:
        return [one(i) for i in order[t::tasks].tolist()]

    for t, got in enumerate(run_all(_pool(), some, range(tasks)) if tasks > 1 else map(some, range(tasks))):
        produced[order[t::tasks]] = got
    return produced


# the codes of csrc/zstd_frame.hpp's ZstdCheck
_REASONS = {
    1: "the frame runs past the end of its buffer",
    2: "not a zstd frame (bad magic number)",
    3: "a skippable frame instead of a zstd frame",
    4: "the frame header's reserved bit is set",
    5: "the frame needs a dictionary",
    6: "the frame's window is above 2 GiB",
    7: "the frame's content size differs from the claimed length",
    8: "a block of the reserved type",
    9: "a block above the block maximum size",
    10: "bytes after the frame's end",
    11: "the frame's blocks cannot produce the claimed length",
    12: "a compressed block's literals section is malformed",
    13: "a compressed block's sequences section is malformed",
}


def check_zstd(src: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, claims: np.ndarray) -> np.ndarray:
    """Per frame ``src[offsets[i], + sizes[i])`` claimed to decompress to ``claims[i]`` bytes: 0 where it is
    one well-formed zstd frame that can, else a reason code (:func:`zstd_reason`). ``src`` host bytes."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    out = np.empty(len(offsets), dtype=np.int32)
    _core.zstd_frames_check(
        np.ascontiguousarray(src, dtype=np.uint8),
        offsets,
        np.ascontiguousarray(sizes, dtype=np.int64),
        np.ascontiguousarray(claims, dtype=np.int64),
        out,
    )
    return out


def zstd_reason(code: int) -> str:
    """What a code of :func:`check_zstd` means."""
    return "well-formed" if code == 0 else _REASONS.get(int(code), f"refused (code {int(code)})")
