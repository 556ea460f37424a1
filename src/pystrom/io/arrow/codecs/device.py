"""Compressed Arrow body buffers inflated on the GPU, all frames of a group in one or two launches.

- LZ4_FRAME: :file:`kernels/lz4.cu`, one warp per frame. nvCOMP's LZ4 decodes independent raw
  blocks, and Arrow's writer links the blocks of a frame (LZ4F's default), so nvCOMP cannot take them.
- ZSTD: :file:`kernels/zstd.cu`, one warp per frame (``pystrom.defaults.gpu_zstd_decoder = "kernel"``,
  the default): every table, bitstream and offset checked, so a corrupt frame gives -1; a frame with a
  content checksum (Arrow's writers set none) goes through the CPU codecs, which verify it. With
  ``"host"`` the CPU codecs decode them (a compressed file's reader then does not come here:
  :mod:`.codecs.staged` reads, decodes and copies them up). ``PYSTROM_NVCOMP=1`` in the environment
  (read at each call) hands them to nVCOMP's batched decoder instead (RAW bitstreams are standard zstd
  frames; 1 GiB of 512 KiB frames at 28 GB/s on an H100), only frames that pass
  :func:`.codecs.host.check_zstd` on the host (one device-to-host copy of the group's frames; it reads
  headers only). That is opt-in for files one trusts: a truncated frame made nvCOMP fault
  (cudaErrorIllegalAddress, which poisons the CUDA context), and the check stops those, but on an
  H100 (2026-11-26, tests/test_arrow_fuzz.py's compressed mutants) frames whose structure is sound and
  whose entropy-coded contents are corrupt still made it fault or hang, and no check short of
  decoding finds them. Frames claiming 0 bytes (nvCOMP wants room to write) go through the CPU codecs.

The CPU twin for both is :func:`.codecs.host.inflate_host` (pystrom's LZ4 decoder, libzstd);
tests/test_lz4_kernel.py and tests/test_arrow_compressed.py compare them. The contract of
:func:`.codecs.decompress.inflate` holds: every frame's output at its place (in ``dst`` or its own array), the
bytes each produced returned (-1 for a corrupt frame), nothing written outside its
``dst_sizes[i]`` bytes, and the work finished (LZ4: on the current stream, waited for by reading the
sizes unless ``wait=False``; nVCOMP: on its own stream, waited for) before this returns.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import numpy as np

from ...._dist import missing
from ...._settings import defaults
from ....kernels import kernel, launch_function
from .host import check_zstd, inflate_host

__all__ = ["_inflate_device", "decodes_on_host", "nvcomp_available"]


def _nvcomp_zstd() -> bool:
    """ZSTD through nvCOMP only with ``PYSTROM_NVCOMP=1`` (module docstring)."""
    return os.environ.get("PYSTROM_NVCOMP", "0").strip() == "1"


@functools.cache
def _nvcomp() -> Any:
    try:
        from nvidia import nvcomp
    except Exception:  # noqa: BLE001 - missing wheel or a libnvcomp that does not load: the CPU codecs then
        return None
    return nvcomp


def nvcomp_available() -> bool:
    return _nvcomp() is not None


def decodes_on_host(codec: str) -> bool:
    """Whether a GPU leaves ``codec``'s frames to the CPU codecs: ZSTD with ``gpu_zstd_decoder="host"``
    and nvCOMP not enabled. Enabled (``PYSTROM_NVCOMP=1``) where nvCOMP does not import is an error naming
    the extra, not a quiet fallback: whoever set it expects nvCOMP's decoder."""
    if codec != "zstd":
        return False
    if not _nvcomp_zstd():
        return defaults.gpu_zstd_decoder == "host"
    if not nvcomp_available():
        try:
            from nvidia import nvcomp  # noqa: F401  (again, for the reason it fails)
        except Exception as exc:  # noqa: BLE001 - a libnvcomp that does not load counts too
            raise missing(
                "nvidia.nvcomp",
                "PYSTROM_NVCOMP=1 (ZSTD frames decoded on the GPU)",
                exc,
                advice="or unset PYSTROM_NVCOMP to decode them with the CPU codecs",
            ) from exc
    return False


def _inflate_device(backend: Any, frames: Any, addresses: np.ndarray, wait: bool = True) -> Any:
    """Inflate ``frames`` (see :class:`.codecs.decompress.Frames`; device arrays; ``addresses``: where each frame's
    output starts) on the current stream; the bytes produced per frame, -1 where a frame is corrupt
    (``wait=False``: LZ4's as a device array, ready when the stream gets there)."""
    n = len(frames.src_offsets)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if frames.codec == "lz4_frame":
        return _lz4(backend, frames, n, addresses, wait)
    if frames.codec == "zstd":
        if not _nvcomp_zstd() and defaults.gpu_zstd_decoder == "kernel":
            return _zstd_kernel(backend, frames, n, addresses)
        return _zstd(backend, frames, n)
    raise ValueError(f"unknown codec {frames.codec!r}")


def _launch_frames(backend: Any, frames: Any, n: int, addresses: np.ndarray, codec: str, threads: int) -> Any:
    """``<codec>_frames`` of kernels/<codec>.cu over the ``n`` frames, a warp a frame, in blocks of
    ``threads``: the bytes each produced, a device array (ready when the current stream gets there)."""
    cp = backend.xp
    # the kernels take each frame's output address: int64 holds a device pointer
    table = np.concatenate([frames.src_offsets, frames.src_sizes, addresses, frames.dst_sizes])
    dtable = cp.asarray(table.astype(np.int64, copy=False))
    produced = cp.empty(n, dtype=cp.int64)
    function = kernel(codec, f"{codec}_frames", backend.ordinal)
    launch_function(function, backend.ordinal, n * 32, (frames.src, dtable, np.int32(n), produced), threads)
    return produced


def _lz4(backend: Any, frames: Any, n: int, addresses: np.ndarray, wait: bool) -> Any:
    if (addresses % 64).any():
        raise ValueError("LZ4 frames are inflated to 64-byte aligned outputs")
    produced = _launch_frames(backend, frames, n, addresses, "lz4", _LZ4_THREADS)
    return produced.get() if wait else produced


_LZ4_THREADS = 256  # kernels/lz4.cu's WARPS_PER_BLOCK warps a block (its rings are sized for them)
_ZSTD_THREADS = 128  # kernels/zstd.cu's ZSTD_WARPS warps a block (its shared tables are sized for them)


def _zstd_kernel(backend: Any, frames: Any, n: int, addresses: np.ndarray) -> np.ndarray:
    """ZSTD frames through kernels/zstd.cu on the current stream (waited for); the frames with a content
    checksum (-2) through the CPU codecs."""
    got = _launch_frames(backend, frames, n, addresses, "zstd", _ZSTD_THREADS).get()
    host = np.flatnonzero(got == -2)
    if len(host):
        got[host] = _on_host(backend, frames, host)
    return got


def _zstd(backend: Any, frames: Any, n: int) -> np.ndarray:
    nvcomp = _nvcomp() if _nvcomp_zstd() else None
    if nvcomp is None:
        return _on_host(backend, frames, np.arange(n))
    sizes = np.asarray(frames.dst_sizes, dtype=np.int64)
    produced = np.full(n, -1, dtype=np.int64)
    passed = _check_on_host(frames) == 0  # the rest stay -1: nvCOMP never sees them
    usable = np.flatnonzero(passed & (sizes > 0))
    rest = np.flatnonzero(passed & (sizes == 0))  # nvCOMP wants room to write: a few bytes for the CPU
    if len(usable):
        got = _nvcomp_decode(backend, nvcomp, frames, usable)
        if got is None:  # refused as a batch: the CPU codecs find which frame is bad
            rest = np.flatnonzero(passed)
        else:
            produced[usable] = got
    if len(rest):
        produced[rest] = _on_host(backend, frames, rest)
    return produced


def _check_on_host(frames: Any) -> np.ndarray:
    """:func:`.codecs.host.check_zstd` of every frame, the span of ``src`` they cover copied to host."""
    offsets = np.asarray(frames.src_offsets, dtype=np.int64)
    sizes = np.asarray(frames.src_sizes, dtype=np.int64)
    lo, hi = int(offsets.min()), int((offsets + sizes).max())
    host = frames.src[lo:hi].get() if hi > lo else np.zeros(0, dtype=np.uint8)
    return check_zstd(host, offsets - lo, sizes, frames.dst_sizes)


def _nvcomp_decode(backend: Any, nvcomp: Any, frames: Any, which: np.ndarray) -> np.ndarray | None:
    cp = backend.xp
    stream = cp.cuda.get_current_stream()
    stream.synchronize()  # nvCOMP runs on its own stream: the compressed bytes must have landed
    try:
        codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW, device_id=backend.ordinal)
        srcs = nvcomp.as_arrays(
            frames.src, [int(x) for x in frames.src_offsets[which]], [int(x) for x in frames.src_sizes[which]]
        )
        outs = nvcomp.as_arrays([frames.out(int(i)) for i in which])  # in dst or a frame's own array
        result = codec.decode(srcs, out=outs)
        got = np.asarray(result.buffer_sizes, dtype=np.int64)  # waits for the decode
    except Exception:  # noqa: BLE001 - nvCOMP reports a bad frame in a batch by raising
        return None
    return got


def _on_host(backend: Any, frames: Any, which: np.ndarray) -> np.ndarray:
    """Frames ``which`` through the CPU codecs: their bytes copied to host, inflated, copied back."""
    src_off = np.asarray(frames.src_offsets, dtype=np.int64)[which]
    src_len = np.asarray(frames.src_sizes, dtype=np.int64)[which]
    dst_len = np.asarray(frames.dst_sizes, dtype=np.int64)[which]
    pieces = [frames.src[o : o + s].get() for o, s in zip(src_off.tolist(), src_len.tolist())]
    src = np.ascontiguousarray(np.concatenate(pieces) if pieces else np.zeros(0), dtype=np.uint8)
    new_src = np.concatenate([[0], np.cumsum(src_len)[:-1]]).astype(np.int64)
    new_dst = np.concatenate([[0], np.cumsum((dst_len + 63) // 64 * 64)[:-1]]).astype(np.int64)
    dst = np.empty(int(new_dst[-1] + dst_len[-1]) if len(which) else 0, dtype=np.uint8)
    host = dataclasses.replace(frames, src=src, src_offsets=new_src, src_sizes=src_len, dst=dst,
                               dst_offsets=new_dst, dst_sizes=dst_len, dst_arrays=None, dst_addresses=None)  # fmt: skip
    produced = inflate_host(host)
    for k, i in enumerate(which.tolist()):
        if produced[k] > 0:
            frames.out(i)[: int(produced[k])].set(dst[new_dst[k] : new_dst[k] + int(produced[k])])
    return produced
