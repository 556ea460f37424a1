"""Compressed frames a GPU read decodes on the host: read into host memory, decoded by the CPU thread
pool into pinned staging, copied to their destinations on the reader's stream.

ZSTD on a GPU goes this way unless nvCOMP is enabled (:func:`.codecs.decompress.staged` says which codecs). It
replaced a round trip through the device (KvikIO read the frames into device memory, each frame was
copied back to the host, inflated into a fresh host array, and copied up again by a synchronous copy of
its own: 8 GiB of ZSTD at 1.72 GB/s on an H100, slower than ``feather.read_table`` + ``cupy.asarray``).
Now, per slice of frames (:func:`.codecs.plan.cut`; at most ``STAGE`` bytes of compressed input plus
output):

1. the frames' file bytes are read by a CPU :class:`.file.ranges.RangeReader` (``os.preadv`` on a thread pool,
   coalesced) into one of two host ``src`` arrays, slice i + 1's while slice i is decoded;
2. the frames are decoded by :func:`.codecs.decompress.inflate` on the CPU (:mod:`.codecs.host`: the thread pool;
   every ZSTD frame checked by :func:`.codecs.host.check_zstd` first, as on the CPU backend) into one
   of two pinned staging buffers, after the event that ends the copies out of it (slice i - 2's);
3. each read's bytes are copied to its destination with ``cudaMemcpyAsync`` on the current stream (the
   reader's side stream), while the host decodes slice i + 1. A frame read whole by one read is laid out
   in staging in the order of the destinations, back to back where the destinations are, so a column's
   values of many batches go up in one copy (2048 batches x 8 columns: 8 copies per slice, not 16,384).

The bytes each frame produced are returned for :meth:`.read.compressed_reads.InflatingReader._check`, which refuses
a frame whose size differs from its claim exactly as for the other frames. Before this returns, even on
an error, the copies out of staging have finished (the pinned memory goes back to CuPy's pool, which
does not know about streams) and the reads into ``src`` have too.

Nothing here is ZSTD's own: a slice may hold frames of any codec :func:`.codecs.decompress.inflate` decodes on the
CPU (LZ4 too), each group of one codec decoded by one call. The copies go through :class:`DeviceCopies`
on a GPU and :class:`HostCopies`, its CPU twin (``memmove``), elsewhere: the tests run this whole path on
the CPU backend through the twin.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ....errors import FileFormatError
from ....memory import hostmem
from ....memory.backend import resolve_device
from ..file.ranges import RangeReader
from .decompress import CODECS, Frames, inflate
from .plan import Catalog, Needed, Reads, cut, up

__all__ = ["STAGE", "DeviceCopies", "HostCopies", "StagedInflater", "staging_layout", "merge_copies", "check_copies"]

STAGE = 256 << 20  # bytes of one slice (compressed input plus output): two of each are in use at a time


class DeviceCopies:
    """Pinned staging and host-to-device copies on the current CUDA stream."""

    def __init__(self, backend: Any):
        self._cp = backend.xp

    def staging(self, nbytes: int) -> np.ndarray:
        # CuPy's pinned pool keeps freed blocks by size: a size class makes the next read's a hit
        memory = self._cp.cuda.alloc_pinned_memory(hostmem.size_class(nbytes))
        return np.frombuffer(memory, dtype=np.uint8, count=nbytes)  # keeps ``memory`` alive

    def copy(self, dst: np.ndarray, src: np.ndarray, size: np.ndarray) -> None:
        rt = self._cp.cuda.runtime
        stream = self._cp.cuda.get_current_stream().ptr
        for d, s, n in zip(dst.tolist(), src.tolist(), size.tolist()):
            rt.memcpyAsync(d, s, n, rt.memcpyHostToDevice, stream)

    def mark(self) -> Any:
        """An event after the copies issued so far."""
        event = self._cp.cuda.Event(disable_timing=True)
        event.record()
        return event

    def wait(self, mark: Any) -> None:
        mark.synchronize()


class HostCopies:
    """:class:`DeviceCopies`' CPU twin: the copies are ``memmove``, done when issued."""

    def staging(self, nbytes: int) -> np.ndarray:
        return hostmem.allocate(nbytes)

    def copy(self, dst: np.ndarray, src: np.ndarray, size: np.ndarray) -> None:
        for d, s, n in zip(dst.tolist(), src.tolist(), size.tolist()):
            ctypes.memmove(d, s, n)

    def mark(self) -> Any:
        return None

    def wait(self, mark: Any) -> None:
        pass


def staging_layout(first_ptr: np.ndarray, size: np.ndarray, whole: np.ndarray) -> np.ndarray:
    """Each frame's place in staging (step 3 of the module docstring): frames read whole by one read
    (``whole``; ``first_ptr`` its destination) in the order of their destinations, back to back where the
    destinations are, each run of them 64-byte aligned; then the other frames, 64-byte aligned each."""
    at = np.empty(len(size), dtype=np.int64)
    direct = np.flatnonzero(whole)
    direct = direct[np.argsort(first_ptr[direct], kind="stable")]
    used = 0
    if len(direct):
        d, n = first_ptr[direct], size[direct]
        new = np.ones(len(direct), dtype=bool)
        new[1:] = d[1:] != d[:-1] + n[:-1]  # not right after the previous destination: a run of its own
        run = np.cumsum(new) - 1
        firsts = np.flatnonzero(new)
        ends = np.cumsum(n)
        run_size = np.add.reduceat(n, firsts)
        padded = up(run_size)
        run_at = np.cumsum(padded) - padded
        at[direct] = run_at[run] + (ends - n) - (ends - n)[firsts][run]
        used = int(padded.sum())
    rest = np.flatnonzero(~whole)
    padded = up(size[rest])
    at[rest] = used + np.cumsum(padded) - padded
    return at


def merge_copies(
    dst: np.ndarray, src: np.ndarray, size: np.ndarray, region: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Copies ``(dst, src, size)`` (addresses) ordered by destination, each run that is contiguous at both
    ends and inside one destination ``region`` (an id per copy: its destination array) made one copy;
    empty copies dropped.

    Two arrays may lie back to back in device memory (CuPy's pool puts small allocations next to each
    other) while being two allocations: one ``cudaMemcpyAsync`` across both is refused with
    ``cudaErrorInvalidValue``. A file whose record batches are listed out of file order laid two
    destinations' frames back to back in staging, and the copy crossed from one array into the next."""
    keep = size > 0
    dst, src, size = dst[keep], src[keep], size[keep]
    region = np.zeros(len(dst), dtype=np.int64) if region is None else np.asarray(region)[keep]
    order = np.argsort(dst, kind="stable")
    dst, src, size, region = dst[order], src[order], size[order], region[order]
    if len(dst) < 2:
        return dst, src, size
    new = np.ones(len(dst), dtype=bool)
    new[1:] = (dst[1:] != dst[:-1] + size[:-1]) | (src[1:] != src[:-1] + size[:-1]) | (region[1:] != region[:-1])
    firsts = np.flatnonzero(new)
    return dst[firsts], src[firsts], np.add.reduceat(size, firsts)


def check_copies(path: str, dst: np.ndarray, size: np.ndarray, dst_lo: np.ndarray, dst_hi: np.ndarray,
                 src: np.ndarray, src_lo: int, src_hi: int) -> None:  # fmt: skip
    """Before any copy is issued: each copy ``size[i] > 0`` bytes from ``src[i]`` inside ``[src_lo, src_hi)``
    (staging) to ``dst[i]`` inside its own destination ``[dst_lo[i], dst_hi[i])``. A copy outside is a
    pystrom bug (the reads were checked against their arrays when queued); on a GPU it would fail with
    ``cudaErrorInvalidValue`` or write past an allocation, so it is refused as the read's error instead."""
    bad = (size <= 0) | (dst < dst_lo) | (size > dst_hi - dst) | (src < src_lo) | (size > src_hi - src)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FileFormatError(
            f"{path!r}: a copy of {int(size[i])} decompressed bytes would leave its destination (offset "
            f"{int(dst[i] - dst_lo[i])} of {int(dst_hi[i] - dst_lo[i])} bytes) or the staging buffer: refused "
            "before it was issued (a pystrom bug: please report it with the file)"
        )


class StagedInflater:
    """Step 1 to 3 of the module docstring for the frames of one reader (``path``) on ``backend``."""

    def __init__(self, path: str, backend: Any, budget: int, progress: Any = None):
        self.path = path
        self.backend = backend
        self.budget = max(1, min(STAGE, budget))
        self.copies = HostCopies() if backend.kind == "cpu" else DeviceCopies(backend)
        self._progress = progress  # called with the bytes this inflater has read, in total
        self.bytes_read = 0
        self.slices = 0
        self._cpu = resolve_device("cpu")

    def run(self, catalog: Catalog, reads: Reads, needed: Needed) -> list[tuple[np.ndarray, np.ndarray]]:
        """Read, decode and copy out the frames ``needed`` (their ``reads``); [(catalog indices, bytes
        each produced)], for the size check."""
        sizes = catalog.size[needed.k]
        slices = cut(catalog.frame_offset[needed.k], catalog.frame_size[needed.k], up(sizes), self.budget)
        if not slices:
            return []
        done = []
        base = self.bytes_read
        report = None if self._progress is None else (lambda n: self._progress(base + n))
        depth = min(2, len(slices))
        srcs = [hostmem.allocate(max(1, *(s.src_bytes for s in slices[j::depth]))) for j in range(depth)]
        stages: list[Any] = [None] * depth
        copied: list[Any] = [None] * depth  # per staging buffer: the mark after the copies out of it
        files = RangeReader(self.path, self._cpu, report)
        try:
            with files:
                ticket = self._issue(files, slices[0], srcs[0])
                for j, s in enumerate(slices):
                    files.wait(ticket)
                    if j + 1 < len(slices):  # into the src slice j - 1 was decoded from (synchronously)
                        ticket = self._issue(files, slices[j + 1], srcs[(j + 1) % depth])
                    slot = j % depth
                    if copied[slot] is not None:
                        self.copies.wait(copied[slot])  # slice j - 2's copies out of this staging buffer
                    done.append(self._slice(catalog, reads, needed, s, srcs[slot], stages, slot))
                    copied[slot] = self.copies.mark()
                    self.slices += 1
        finally:
            for mark in copied:  # staging goes back to its pool only after the copies out of it
                if mark is not None:
                    self.copies.wait(mark)
            self.bytes_read = base + files.bytes_read
        return done

    def _issue(self, files: RangeReader, s: Any, src: np.ndarray) -> int:
        for offset, size, at in s.runs.tolist():
            files.read(offset, size, src[at : at + size])
        return files.submit()

    def _slice(self, catalog, reads, needed, s, src, stages, slot) -> tuple[np.ndarray, np.ndarray]:
        """One slice's frames decoded into staging and their reads' copies issued; (frames, produced)."""
        ks = needed.k[s.lo : s.hi]
        size = catalog.size[ks]
        part = needed.take(slice(s.lo, s.hi))
        first = part.first()
        at = staging_layout(reads.ptr[first], size, part.whole)
        need = int((at + size).max())
        if stages[slot] is None or stages[slot].shape[0] < need:
            stages[slot] = None  # the old one back first (its copies are done: see run)
            stages[slot] = self.copies.staging(max(need, 1))
        stage = stages[slot]
        produced = np.empty(len(ks), dtype=np.int64)
        codecs = catalog.codec[ks]
        for c in np.unique(codecs).tolist():
            mine = np.flatnonzero(codecs == c)
            frames = Frames(CODECS[c], src, s.src_at[mine], catalog.frame_size[ks[mine]], stage, at[mine], size[mine])
            produced[mine] = inflate(self._cpu, frames)
        idx, of = part.reads()
        ok = reads.usable[idx]
        base = stage.ctypes.data
        dst, size, group = reads.ptr[idx[ok]], reads.size[idx[ok]], reads.group[idx[ok]]
        src = base + at[of[ok]] + reads.rel[idx[ok]]
        lo, hi = _extents(self.backend, reads.dsts)
        check_copies(self.path, dst, size, lo[group], hi[group], src, base, base + stage.nbytes)
        self.copies.copy(*merge_copies(dst, src, size, group))
        xp = self.backend.xp
        for r, f in zip(idx[~ok].tolist(), of[~ok].tolist()):  # not contiguous uint8 (RangeReader's contract)
            lo, n = int(at[f] + reads.rel[r]), int(reads.size[r])
            reads.dst(r)[:n] = xp.asarray(stage[lo : lo + n].copy())  # synchronous: staging is reused
        return ks, produced


def _extents(backend: Any, arrays: list) -> tuple[np.ndarray, np.ndarray]:
    """Each destination array's first and past-the-end address."""
    lo = np.fromiter((backend.array_ptr(a) for a in arrays), np.int64, len(arrays))
    return lo, lo + np.fromiter((a.nbytes for a in arrays), np.int64, len(arrays))
