"""A range reader for record batches whose buffers are compressed: the column readers of :mod:`.read.direct`
ask it for byte ranges exactly as they ask :class:`.file.ranges.RangeReader`, and get decompressed bytes.

Offsets below :data:`.file.metadata.PACKED_BASE` are file offsets (uncompressed buffers, also those a writer
stored uncompressed inside a compressed body): passed to the file reader. Offsets above it fall in a
:class:`.file.metadata.Packed` buffer: the reads are queued, and :meth:`InflatingReader.wait` serves them as a
pipeline of slices:

1. the frames the queued reads touch (each once), in file order, cut into slices of at most
   ``scratch_bytes`` of scratch: the compressed frames (frames at most ``GAP`` apart in the file are
   one read, the gap read and dropped) plus the outputs of the frames that are not inflated in place
   (a larger frame makes a slice of its own); planned in NumPy arrays (:mod:`.codecs.plan`);
2. a frame read whole by one queued read whose destination is contiguous and 64-byte aligned (the
   common case: a column's values in the table) is inflated in place, straight into that destination;
   any other (a part of a buffer, an unaligned destination, a buffer two reads share) is inflated into
   a scratch ``dst`` and its reads copied out of it, all of a slice's at once (:func:`copy_out`: one
   launch on a GPU, C++ memcpy on the CPU), queued behind the inflation;
3. the reads of slice i + 1 are issued before slice i is inflated (one batched
   :func:`.codecs.decompress.inflate` call per codec), so the file and the decoder work at once. They go into the
   ``src`` array slice i - 2 was inflated from (three of them), after the kernel that read it is waited
   for (a CUDA event: kernels run behind the host, and the file reader does not write in stream order):
   with two, the host would wait for slice i - 1's kernel before launching slice i's, and the GPU idle
   while the host prepares a launch;
4. the sizes the frames produced are checked once, after the last slice (on a GPU: one synchronisation
   per wait, not per slice): a frame whose size differs from its claim is refused with a FileFormatError
   naming the record batch, the column and the buffer (the first such frame in file order). Its
   destination may hold garbage then; the read fails;
5. on a GPU, the frames of codecs the GPU would decode on the host anyway (ZSTD unless nvCOMP is enabled:
   :func:`.codecs.decompress.staged`) skip steps 1 to 3: :mod:`.codecs.staged` reads them into host memory, decodes
   them there into pinned staging and copies each read's bytes up, its own pipeline of slices;
6. on a GPU all of it runs on a non-blocking stream of the reader's own, after the caller's stream's
   work and before the caller's next: CuPy's default is the legacy stream, with which every blocking
   stream synchronises, KvikIO's copies among them, so slice i + 1's reads waited for slice i's kernel
   (8 GiB LZ4 on an H100: 410 ms in the reads' waits for 7.5 GB, against 43 GB/s read uncompressed).

The slice size: a slice's frames are the LZ4 kernel's parallelism (one warp per frame, and a frame's
sequences are decoded one after another), so a launch takes as long as its slowest frame whatever
its count: on an H100 the bench data's 512 KiB frames of sequential int64 (65,000 sequences of 8
bytes each) take 42 ms while the stored frames of random floats beside them take a few, so a 512 MiB
file reads at 7 GB/s warm in one slice, and a file of many slices at about slices x 42 ms. Slices
on a GPU are therefore large: twice :func:`pystrom.memory.backend.stream_group_bytes` (1/16 of the device's
memory), 2 GiB at most (on the CPU, where a thread pool decodes, an eighth of it, 128 MiB at most);
the three in flight stay beside the table, never the whole compressed file plus its inflated copy
(an 8 GiB file on an 80 GB GPU: 6 GiB of scratch).
The column readers wait twice (string offsets first, then the rest), so a frame is inflated when it is
first needed, and the offsets of strings and lists are checked (:mod:`.read.offsets`) before their data is
touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .... import _core
from ....errors import FileFormatError
from ....kernels import launch
from ....memory.backend import stream_group_bytes
from ..codecs.decompress import CODECS, Frames, inflate, staged
from ..codecs.host import check_zstd, zstd_reason
from ..codecs.plan import Catalog, Needed, Reads, Slice, cut, frames_of, gather, up
from ..codecs.staged import StagedInflater
from ..file.metadata import PACKED_BASE, Packed
from ..file.ranges import check_pieces

__all__ = ["InflatingReader", "scratch_bytes"]

_DEPTH = 3  # src arrays: slice i + 1 is read into the one slice i - 2 was inflated from (module docstring)


def scratch_bytes(backend: Any) -> int:
    """Scratch one slice of frames may take (module docstring); three slices are in use at a time."""
    if backend.kind == "cpu":  # a thread pool's parallelism needs no more than a few frames a thread
        return max(16 << 20, min(128 << 20, stream_group_bytes(backend) // 8))
    return max(16 << 20, min(2 << 30, 2 * stream_group_bytes(backend)))


class InflatingReader:
    """:class:`.file.ranges.RangeReader`'s interface over ``reader`` (the file's), serving the compressed
    buffers of ``packed`` (a layouts' catalog, or :class:`.file.metadata.Packed` objects)."""

    def __init__(self, reader: Any, packed: Catalog | Sequence[Packed], scratch: int | None = None):
        self._reader = reader
        self.backend = reader.backend
        self.path = reader.path
        if not isinstance(packed, Catalog):
            packed = Catalog.of(sorted(packed, key=lambda p: p.offset))
        self._catalog = packed
        self._scratch = scratch_bytes(self.backend) if scratch is None else scratch
        self._queued: list[tuple[Any, ...]] = []  # groups of reads (codecs.plan.gather)
        self._side: Any = None  # the GPU stream inflation runs on (_on_side_stream)
        self._staged = StagedInflater(self.path, self.backend, self._scratch, self._report)
        self.frames_inflated = 0  # frames decompressed so far (one frame twice if read in two waits)
        self.frames_in_place = 0  # of which straight into their read's destination
        self.slices = 0  # slices served so far

    @property
    def bytes_read(self) -> int:
        return self._reader.bytes_read + self._staged.bytes_read

    def _report(self, staged_bytes: int) -> None:
        """Progress of the host reads of :mod:`.codecs.staged`, with the file reader's (a reporter drops
        totals lower than the last: the file reader's own reports then wait for the host reads' count)."""
        progress = getattr(self._reader, "progress", None)
        if progress is not None:
            progress(self._reader.bytes_read + staged_bytes)

    def read_many(self, offsets: np.ndarray, sizes: np.ndarray, dst: Any, at: np.ndarray) -> None:
        """:meth:`.file.ranges.RangeReader.read_many`: file offsets or places in the catalog's buffers."""
        keep = sizes > 0
        offsets, sizes, at = offsets[keep], sizes[keep], at[keep]
        check_pieces(dst, sizes, at)
        packed = offsets >= PACKED_BASE
        if not packed.all():
            self._reader.read_many(offsets[~packed], sizes[~packed], dst, at[~packed])
        if packed.any():
            self._queued.append((offsets[packed], sizes[packed], dst, at[packed], True))

    def read(self, offset: int, size: int, dst: Any) -> None:
        if size <= 0:
            return
        if offset < PACKED_BASE:
            self._reader.read(offset, size, dst)
        else:
            one = np.ones(1, dtype=np.int64)
            self._queued.append((one * offset, one * size, dst, one * 0, None))

    def wait(self) -> None:
        queued, self._queued = self._queued, []
        self._reader.wait()
        if not queued:
            return
        catalog = self._catalog
        reads = gather(queued, catalog, self.backend, self.path)
        needed = frames_of(reads, catalog)
        host_codecs = np.array([staged(self.backend, c) for c in CODECS])  # per wait: PYSTROM_NVCOMP may change
        on_host = host_codecs[catalog.codec[needed.k]]
        self.frames_inflated += len(needed)
        self.frames_in_place += int(needed.in_place.sum())
        try:
            with self._on_side_stream():
                done = []
                if not on_host.all():
                    done += self._pipeline(reads, needed.take(~on_host))
                if on_host.any():
                    before = self._staged.slices
                    done += self._staged.run(catalog, reads, needed.take(on_host))
                    self.slices += self._staged.slices - before
                self._check(done)
        except BaseException:
            with contextlib.suppress(Exception):
                self._reader.wait()  # no read may outlive the scratch it writes into
            with contextlib.suppress(Exception):
                self.backend.synchronize()  # nor a kernel the scratch it reads
            raise

    @contextlib.contextmanager
    def _on_side_stream(self) -> Any:
        """On a GPU, the inflation's kernels and copies run on a stream of their own (step 6 of the
        module docstring), ordered after the caller's stream and before what it queues next."""
        if self.backend.kind == "cpu":
            yield
            return
        cuda = self.backend.xp.cuda
        caller = cuda.get_current_stream()
        if self._side is None:
            self._side = cuda.Stream(non_blocking=True)
        self._side.wait_event(caller.record())
        try:
            with self._side:
                yield
        finally:
            caller.wait_event(self._side.record())

    def _pipeline(self, reads: Reads, needed: Needed) -> list[tuple]:
        """Steps 1 to 3: every slice read and inflated; [(catalog indices, produced sizes)] per slice and codec."""
        catalog = self._catalog
        sizes = catalog.size[needed.k]
        dst_cost = np.where(needed.in_place, 0, up(sizes))
        slices = cut(catalog.frame_offset[needed.k], catalog.frame_size[needed.k], dst_cost, self._scratch)
        xp, depth = self.backend.xp, min(_DEPTH, len(slices))
        srcs = [xp.empty(max([1, *(s.src_bytes for s in slices[j::depth])]), dtype=np.uint8) for j in range(depth)]
        read_by: list[Any] = [None] * depth  # per src array: the event after the inflation that read it (GPU)
        ticket = self._issue(slices[0], srcs[0])
        done = []
        for j, s in enumerate(slices):
            self._reader.wait(ticket)
            if j + 1 < len(slices):
                k = (j + 1) % depth
                if read_by[k] is not None:
                    read_by[k].synchronize()  # slice j + 1 - depth's kernel: long done, slice j - 1's may run on
                ticket = self._issue(slices[j + 1], srcs[k])
            done += self._inflate(s, srcs[j % depth], reads, needed)
            if self.backend.kind != "cpu":
                read_by[j % depth] = xp.cuda.Event(disable_timing=True)
                read_by[j % depth].record()
        return done

    def _issue(self, s: Slice, src: Any) -> int:
        for offset, size, at in s.runs.tolist():
            self._reader.read(offset, size, src[at : at + size])
        return self._reader.submit()

    def _inflate(self, s: Slice, src: Any, reads: Reads, needed: Needed) -> list[tuple]:
        """One slice's frames inflated, its partial reads copied out of the scratch dst (queued behind)."""
        catalog = self._catalog
        ks = needed.k[s.lo : s.hi]
        in_place = needed.in_place[s.lo : s.hi]
        first = needed.first()[s.lo : s.hi]
        dst = self.backend.xp.empty(s.dst_bytes, dtype=np.uint8) if s.dst_bytes else None
        addresses = np.where(in_place, reads.ptr[first], 0)
        codecs = catalog.codec[ks]
        parts = []
        for c in np.unique(codecs).tolist():
            mine = np.flatnonzero(codecs == c)
            frames = Frames(CODECS[c], src, s.src_at[mine], catalog.frame_size[ks[mine]], dst,
                            np.maximum(s.dst_at[mine], 0), catalog.size[ks[mine]],
                            _Outputs(reads, first[mine], in_place[mine]), addresses[mine])  # fmt: skip
            parts.append((ks[mine], inflate(self.backend, frames, wait=False)))
        self.slices += 1
        idx, of = needed.reads(np.flatnonzero(~in_place) + s.lo)
        at = s.dst_at[of - s.lo] + reads.rel[idx]
        ok = reads.usable[idx]  # read_many's pieces: all at once; another read's array: a copy of its own
        copy_out(self.backend, dst, at[ok], reads.ptr[idx[ok]], reads.size[idx[ok]])
        for r, a, size in zip(idx[~ok].tolist(), at[~ok].tolist(), reads.size[idx[~ok]].tolist()):
            reads.dst(r)[:size] = dst[a : a + size]
        return parts

    def _check(self, done: list[tuple]) -> None:
        """Step 4: the first frame in file order whose size differs from its claim is refused."""
        if not done:
            return
        catalog = self._catalog
        ks = np.concatenate([k for k, _ in done])
        # on a GPU, LZ4's counts are on the device: this is the wait's one synchronisation per slice
        got = np.concatenate([p if isinstance(p, np.ndarray) else p.get() for _, p in done])
        wrong = np.flatnonzero(got != catalog.size[ks])
        if not len(wrong):
            return
        i = int(wrong[np.argmin(catalog.frame_offset[ks[wrong]])])
        k, n = int(ks[i]), int(got[i])
        codec, claim = CODECS[int(catalog.codec[k])], int(catalog.size[k])
        why = "its frame is corrupt" if n < 0 else f"its frame decompresses to {n:,} bytes"
        if n < 0 and codec == "zstd":
            why += self._zstd_why(k)
        raise FileFormatError(
            f"{self.path!r}: {catalog.what(k)}: {why}, its length prefix claims {claim:,} ({codec}; corrupt file)"
        )

    def _zstd_why(self, k: int) -> str:
        """The structural fault of the refused ZSTD frame ``k``, if it has one (its bytes read again on
        the host: the scratch they were read into may hold another slice by now)."""
        offset, size = int(self._catalog.frame_offset[k]), int(self._catalog.frame_size[k])
        with open(self.path, "rb") as f:
            f.seek(offset)
            frame = np.frombuffer(f.read(size), dtype=np.uint8)
        if frame.shape[0] != size:
            return ""
        code = int(check_zstd(frame, np.zeros(1, np.int64), np.array([size]), np.array([self._catalog.size[k]]))[0])
        return f" ({zstd_reason(code)})" if code else ""


class _Outputs(Sequence):
    """Each frame's own output array (its one read's destination where it is inflated in place, else
    None), built only when a codec asks for it (:attr:`.codecs.decompress.Frames.dst_arrays`): LZ4 on the CPU and
    the GPU's kernel take the addresses alone."""

    def __init__(self, reads: Reads, first: np.ndarray, in_place: np.ndarray):
        self._reads, self._first, self._in_place = reads, first, in_place

    def __len__(self) -> int:
        return len(self._first)

    def __getitem__(self, i: Any) -> Any:
        return self._reads.dst(int(self._first[i])) if self._in_place[i] else None


def copy_out(backend: Any, src: Any, offsets: np.ndarray, addresses: np.ndarray, sizes: np.ndarray) -> None:
    """``sizes[i]`` bytes from ``src[offsets[i]:]`` to the address ``addresses[i]`` (destinations read_many
    checked), queued on the current stream: one C++ call on the CPU, one launch on a GPU (kernels/copies.cu)."""
    table = np.ascontiguousarray(np.stack([offsets, addresses, sizes]).astype(np.int64, copy=False))
    count = table.shape[1]
    if count == 0:
        return
    if backend.kind == "cpu":
        _core.copy_out(src, table)
    else:
        launch("copies", "copy_out", backend.ordinal, count * 256, (src, backend.xp.asarray(table), np.int64(count)))
