"""``read_arrow`` and ``scan_arrow``: Arrow IPC files into Tables, only the bytes that are needed.

The file's metadata says where every buffer of the requested columns sits (:mod:`.file.metadata`); record
batches whose min/max statistics cannot satisfy ``where`` are skipped unread (:mod:`.file.stats`); the rest
is read by KvikIO straight into one table allocation on the GPU (threaded ``pread`` on the CPU backend;
:mod:`.read.direct`); ``where`` runs there as one fused kernel. ``scan_arrow`` does this a group of record
batches at a time, reading group k+1 while the caller works on group k.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import glob as _glob
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ...._concat import concat
from ...._progress import check_progress, reporter
from ...._udf._where import compile_where_udf
from ....errors import FileFormatError, PerformanceWarning, SchemaMismatchError
from ....memory.backend import resolve_device, stream_group_bytes
from ....table import Table
from ..file.boundary import check_columns_argument, named_errors, path_name
from ..file.metadata import ArrowFile, check_types, direct_types, open_arrow_file, resolve_columns
from ..file.stats import StatsReader
from ..read.batches import batch_layouts
from ..read.direct import read_batches
from ..read.layouts import Layouts
from .sieve import read_filtered

__all__ = ["read_arrow", "scan_arrow", "ArrowScan", "ScanStats"]

_DEFAULT_GROUP_ROWS = 1 << 20
# Without batch_rows, a group also holds at least stream_group_bytes() of the selected columns, and
# _READ_AHEAD groups are read ahead of the caller: each group's reads wait for their slowest pread, so
# several groups must be in flight to keep KvikIO's threads busy. Measured on an H100 (4 GiB file,
# 8 columns, where="f5 < 0.1", collect() against read_arrow's 45.2 GB/s in the same run):
#   read ahead   128 MiB groups   256 MiB   512 MiB   1 GiB
#   1            0.46             0.60      0.69      0.74
#   2            0.60             0.70      0.77      0.80
#   3            0.63             0.70      0.77      0.82
#   4            0.63             0.73      0.79      0.81
# (before: 1 MiB-row groups of 64 MiB, one ahead: 12.0 GB/s.)
_READ_AHEAD = 3
# On the CPU a group is filtered by the pool thread that read it (NumPy releases the GIL), overlapping
# the other groups' reads, and groups are smaller: a 1 GiB group filtered by the caller overlapped
# nothing. Measured on the 2-core development VM (2 GiB file, 8 columns, where="f5 < 0.1", warm,
# best of 5; pyarrow.dataset's filtered to_table 224 ms, read_arrow 101 ms):
#   group            64 MiB   128 MiB   256 MiB   1 GiB   (1 GiB filtered by the caller: 301 ms)
#   ms               208      211       214       254
_CPU_GROUP_BYTES = 64 << 20


class _Loaded(NamedTuple):
    """A group as a pool thread hands it back: filtered already or not, and the rows it read."""

    table: Any
    nbytes: int
    rows_read: int
    filtered: bool


@dataclass
class ScanStats:
    """What a scan read and what its statistics let it skip (counts over the selected columns)."""

    files: int = 0
    batches: int = 0
    batches_skipped: int = 0
    bytes: int = 0  # bytes of the selected columns in every batch
    bytes_skipped: int = 0
    bytes_read: int = 0
    rows_read: int = 0
    rows_matched: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict (for logging or a DataFrame row)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __str__(self) -> str:
        share = self.bytes_skipped / self.bytes if self.bytes else 0.0
        return (
            f"{self.files} file(s), {self.batches} record batch(es): {self.batches_skipped} skipped by statistics "
            f"({self.bytes_skipped:,} of {self.bytes:,} bytes, {share:.1%}); read {self.bytes_read:,} bytes, "
            f"{self.rows_read:,} rows, {self.rows_matched:,} matched, in {self.seconds:.3f} s"
        )


def _expand_paths(paths: Any) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        text = os.fspath(paths)
        if _glob.has_magic(text):
            found = sorted(_glob.glob(text))
            if not found:
                raise FileNotFoundError(f"no file matches {text!r}")
            return found
        return [text]
    try:
        items = list(paths)
    except TypeError:
        raise TypeError(
            f"paths must be a file name, a glob or a list of file names; got {type(paths).__name__}"
        ) from None
    if not items:
        raise ValueError("scan_arrow needs at least one file")
    out = []
    for p in items:
        out.extend(_expand_paths(p))
    return out


class ArrowScan:
    """A re-iterable scan over Arrow IPC files, yielding pystrom Tables (see :func:`scan_arrow`).

    Each ``iter()`` starts a fresh pass over the files; :attr:`stats` describes the latest pass.
    """

    def __init__(self, paths: Any, columns=None, where=None, batch_rows=None, device=None, progress=None):
        check_progress(progress)
        self.progress = progress
        self.paths = _expand_paths(paths)
        self.backend = resolve_device(device)
        if batch_rows is not None and (isinstance(batch_rows, bool) or not isinstance(batch_rows, int)
                                       or batch_rows <= 0):  # fmt: skip
            raise ValueError(f"batch_rows must be a positive int or None; got {batch_rows!r}")
        self.batch_rows = batch_rows or _DEFAULT_GROUP_ROWS
        self.group_bytes = (
            0 if batch_rows else _CPU_GROUP_BYTES if self.backend.kind == "cpu" else stream_group_bytes(self.backend)
        )
        columns = check_columns_argument(columns)
        with named_errors(self.paths[0]), open_arrow_file(self.paths[0]) as first:
            self.file_schema = first.schema
        self.columns = resolve_columns(self.file_schema, columns, self.paths[0])
        self.predicate = None
        needed = list(self.columns)
        if where is not None:
            self.predicate = compile_where_udf(where, self.file_schema)
            needed += [c for c in self.predicate.columns if c not in needed]
        self._read_columns = [c for c in self.file_schema.names if c in needed]
        check_types(self.file_schema, self._read_columns, self.paths[0])
        self.stats = ScanStats()

    @property
    def schema(self) -> pa.Schema:
        """The schema of the Tables the scan yields (the selected columns, in the order asked for)."""
        return pa.schema([self.file_schema.field(c) for c in self.columns], metadata=self.file_schema.metadata)

    def _check_schema(self, file: ArrowFile) -> None:
        for name in self._read_columns:
            if name not in file.schema.names:
                raise SchemaMismatchError(f"{file.path!r} has no column {name!r} (the first file has it)")
            got, want = file.schema.field(name).type, self.file_schema.field(name).type
            if got != want:
                raise SchemaMismatchError(f"{file.path!r}: column {name!r} is {got}, in {self.paths[0]!r} it is {want}")

    def _groups(self, file: ArrowFile, stats: ScanStats) -> Iterator[Layouts]:
        types = direct_types(file.schema, self._read_columns)
        layouts = batch_layouts(file, self._read_columns, types)
        nbytes = layouts.nbytes()
        stats.batches += len(layouts)
        stats.bytes += int(nbytes.sum())
        kept = np.ones(len(layouts), dtype=bool)
        if self.predicate is not None:
            stats_of = _stats_reader(file, self.predicate.columns)
            unknown = None  # the answer for a batch without statistics, asked once (files of 2048 batches: 9 ms)
            for i, index in enumerate(layouts.index.tolist()):
                found = stats_of(index, file.custom_metadata(index))
                if found:
                    kept[i] = self.predicate.may_match(found)
                else:
                    unknown = self.predicate.may_match(found) if unknown is None else unknown
                    kept[i] = unknown
            stats.batches_skipped += int((~kept).sum())
            stats.bytes_skipped += int(nbytes[~kept].sum())
        group: list[int] = []
        rows = size = 0
        for i, n, b in zip(np.flatnonzero(kept).tolist(), layouts.num_rows[kept].tolist(), nbytes[kept].tolist()):
            group.append(i)
            rows += n
            size += b
            if rows >= self.batch_rows and size >= self.group_bytes:
                yield layouts.take(np.array(group, dtype=np.int64))
                group, rows, size = [], 0, 0
        if group:
            yield layouts.take(np.array(group, dtype=np.int64))

    def _tasks(self, stats: ScanStats, opened: list[ArrowFile]) -> Iterator[tuple[ArrowFile, Layouts, bool]]:
        """(file, group, last group of that file?), files opened one at a time; the caller closes each
        file once its last group is loaded (a read of the previous file may still run meanwhile)."""
        for path in self.paths:
            with named_errors(path):
                file = open_arrow_file(path)
                opened.append(file)
                self._check_schema(file)
                stats.files += 1
                groups = list(self._groups(file, stats))  # metadata only
                _warn_if_slow(file, self._read_columns, parsed=bool(self._read_columns))
            if not groups:
                opened.remove(file)
                file.close()
            for i, group in enumerate(groups):
                yield file, group, i == len(groups) - 1

    def _load(self, file: ArrowFile, group: Layouts, filter_here: bool) -> _Loaded:
        """A group read; filtered too where ``filter_here`` (the CPU's pool threads: see _CPU_GROUP_BYTES)."""
        types = direct_types(file.schema, self._read_columns)
        with named_errors(file.path), self.backend.activate():
            if filter_here and self.predicate is not None and self.backend.kind == "cpu":
                return _Loaded(
                    *read_filtered(file, group, self._read_columns, types, self.backend, self.predicate), True
                )
            table, nbytes = read_batches(file, group, self._read_columns, types, self.backend)
            rows = table.num_rows
            if filter_here and self.predicate is not None:
                table = table.filter(self.predicate.evaluate(table))
        return _Loaded(table, nbytes, rows, filter_here)

    def _finish(self, loaded: _Loaded, stats: ScanStats) -> Any:
        table = loaded.table
        stats.rows_read += loaded.rows_read
        if self.predicate is not None and not loaded.filtered:
            with self.backend.activate():
                table = table.filter(self.predicate.evaluate(table))
        stats.rows_matched += table.num_rows
        if table.column_names != self.columns:
            table = table.select(self.columns)
        return table

    def __iter__(self) -> Iterator[Any]:
        stats = self.stats = ScanStats()
        start = time.perf_counter()
        opened: list[ArrowFile] = []
        tasks = self._tasks(stats, opened)
        report = reporter(self.progress, unit="B", desc="scan_arrow")  # bytes read, per group of batches
        filter_here = self.backend.kind == "cpu"  # on a GPU the caller's thread queues the filter's kernels
        with report, cf.ThreadPoolExecutor(_READ_AHEAD, thread_name_prefix="pystrom-scan") as pool:
            pending: collections.deque = collections.deque()  # reads in flight, oldest first
            try:
                for file, group, last in tasks:
                    pending.append((pool.submit(self._load, file, group, filter_here), file, last))
                    if len(pending) > _READ_AHEAD:
                        yield self._collect_one(pending.popleft(), opened, stats, start, report)
                while pending:
                    yield self._collect_one(pending.popleft(), opened, stats, start, report)
            finally:
                for future, _, _ in pending:
                    future.cancel()
                for future, _, _ in pending:
                    try:
                        future.result()  # a read must finish before its buffers and file can go
                    except Exception:
                        pass
                tasks.close()
                for file in opened:
                    file.close()
                stats.seconds = time.perf_counter() - start

    def _collect_one(self, pending: tuple, opened: list[ArrowFile], stats: ScanStats, start: float, report: Any) -> Any:
        future, file, last = pending
        loaded = future.result()
        if last:
            opened.remove(file)
            file.close()
        stats.bytes_read += loaded.nbytes
        report(stats.bytes_read)
        out = self._finish(loaded, stats)
        stats.seconds = time.perf_counter() - start
        return out

    def plan(self) -> list[tuple[str, list[int]]]:
        """The groups of record batches a pass reads, as (path, batch indices), after statistics
        skipping (metadata only: nothing is read); :attr:`stats` counts the batches and bytes skipped.
        :meth:`read_group` reads one of them, on this process or another (pystrom.dask's tasks)."""
        stats = self.stats = ScanStats()
        out = []
        for path in self.paths:
            with named_errors(path), open_arrow_file(path) as file:
                self._check_schema(file)
                stats.files += 1
                out.extend((path, group.index.tolist()) for group in self._groups(file, stats))
        return out

    def read_group(self, path: str, indices: Sequence[int]) -> Any:
        """One group of :meth:`plan`: those record batches of ``path``, filtered and projected as a pass yields them."""
        with named_errors(path_name(path)), open_arrow_file(path) as file:
            self._check_schema(file)
            types = direct_types(file.schema, self._read_columns)
            for i in indices:
                if not 0 <= i < file.num_batches:
                    raise FileFormatError(f"{path!r} has {file.num_batches} record batches; batch {i} was asked for")
            layouts = batch_layouts(file, self._read_columns, types)  # metadata only; compressed bodies too
            group = layouts.take(np.array(indices, dtype=np.int64).reshape(-1))
            loaded = self._load(file, group, filter_here=True)
        return self._finish(loaded, ScanStats())

    def collect(self) -> Any:
        """Every matching row of the scan as one Table."""
        pieces = list(self)
        if not pieces:
            return _empty_table(self.schema, self.backend)
        return concat(pieces)

    def __repr__(self) -> str:
        where = f", where={self.predicate.text!r}" if self.predicate is not None else ""
        files = f"{len(self.paths)} file(s)"
        return f"<pystrom.ArrowScan {files}, columns={self.columns}{where}, device={self.backend.device}>"


def _stats_reader(file: ArrowFile, columns: Sequence[str]) -> StatsReader:
    # Footer lists count only where their fingerprint says they describe these batches (stats.py).
    schema = file.raw_schema if file.footer_stats_trusted else file.schema
    return StatsReader(schema, num_batches=file.num_batches, columns=columns)


def _warn_if_slow(file: ArrowFile, columns: Sequence[str], parsed: bool = False) -> None:
    """``parsed``: the caller has laid out every batch of ``columns`` already, so ``file.compressed`` is known."""
    if file.num_batches and file.compressed is False and not parsed:
        # the first batch tells whether bodies are compressed (pyarrow inflates them elsewhere)
        file.layout(0, columns, direct_types(file.schema, columns))
    if file.compressed:
        warnings.warn(
            f"{file.path!r} has record batch bodies pyarrow must rewrite on the host (LZ4/ZSTD-compressed IPC "
            "streams, compressed files mixing compressed and uncompressed batches or holding view or run-end "
            "encoded columns, big-endian bodies): they are inflated or byte-swapped by pyarrow and then copied, "
            "which is much slower than reading straight into GPU memory; write an IPC file (pystrom.write_arrow "
            "does) for the fast path",
            PerformanceWarning,
            stacklevel=4,
        )


def _empty_table(schema: pa.Schema, backend: Any) -> Any:
    return Table.from_arrow(schema.empty_table(), device=backend)


def scan_arrow(paths: Any, columns: Sequence[str] | None = None, where: str | None = None,
               batch_rows: int | None = None, device: Any = None, progress: Any = None) -> ArrowScan:  # fmt: skip
    """Scan Arrow IPC files a group of record batches at a time, filtering on the device.

    Parameters
    ----------
    paths : str, path, glob pattern or list of them
        The files, read in order. All must have the same types for the columns used.
    columns : list of str, optional
        Columns of the Tables produced (default: all). Columns used only by ``where`` are read for
        the filter but not returned.
    where : str, optional
        A predicate over column names, e.g. ``"sqrt((x-200)^2 + (y-300)^2 + (z-400)^2) < 10"`` or
        ``"memo like '%abcd%'"`` (the language: docs/where.md). Rows where it is not true (false or
        NULL) are dropped; record batches whose min/max statistics show that no row can match are
        not read at all.
    batch_rows : int, optional
        Whole record batches are grouped until a group holds at least this many rows (default:
        1,048,576 rows and 1 GiB of the selected columns, or 1/32 of the device's memory if that is
        less); up to three groups are read ahead of the one being used, so a pass needs memory for
        about four groups.
    device : str or int, optional
        Where the Tables live: "cpu", "cuda", "cuda:N" (default: a GPU if one is visible).
    progress : None, bool or callable, optional
        None (default): a progress bar on stderr (bytes read) when stderr is a terminal and a pass
        runs longer than ``pystrom.defaults.progress_delay`` seconds (2). True: a bar from the
        start, wherever stderr goes. False: none. A callable: called with the bytes read so far in
        this pass, after each group of batches (no bar).

    Returns
    -------
    ArrowScan
        Iterable (again and again) of Tables; ``.stats`` reports batches and bytes read and skipped,
        ``.collect()`` returns all matching rows as one Table.
    """
    return ArrowScan(paths, columns, where, batch_rows, device, progress)


def read_arrow(
    path: Any, columns: Sequence[str] | None = None, where: str | None = None, device: Any = None, progress: Any = None
) -> Any:
    """Read an Arrow IPC file (Feather v2) or stream into one Table, straight into device memory.

    Parameters
    ----------
    path : str or path
        The file. Uncompressed files are read by KvikIO directly into the table (GPUDirect Storage
        where available); LZ4/ZSTD-compressed files are read the same way and decompressed in
        batches before the same checks; compressed IPC streams and big-endian files are rewritten by
        pyarrow on the host, with a ``PerformanceWarning``.
    columns : list of str, optional
        Read only these columns (only their bytes are read from the file).
    where : str, optional
        A predicate (see :func:`scan_arrow`); the result holds the rows where it is true.
    device : str or int, optional
        "cpu", "cuda", "cuda:N" (default: a GPU if one is visible).
    progress : None, bool or callable, optional
        None (default): a progress bar on stderr (bytes read) when stderr is a terminal and the
        read runs longer than ``pystrom.defaults.progress_delay`` seconds (2). True: a bar from
        the start, wherever stderr goes. False: none. A callable: called with the bytes read so
        far as reads complete (no bar).
    """
    if where is not None:
        if isinstance(path, (list, tuple)) or (isinstance(path, str) and _glob.has_magic(path)):
            raise TypeError("read_arrow reads one file; use scan_arrow for several")
        return ArrowScan(path, columns, where, None, device, progress).collect()
    check_progress(progress)
    backend = resolve_device(device)
    columns = check_columns_argument(columns)
    with named_errors(path_name(path)), open_arrow_file(path) as file:
        names = resolve_columns(file.schema, columns, file.path)
        check_types(file.schema, names, file.path)
        types = direct_types(file.schema, names)
        layouts = batch_layouts(file, names, types)
        _warn_if_slow(file, names, parsed=bool(names))  # the layouts found compressed bodies already
        total = int(layouts.nbytes().sum())
        with reporter(progress, unit="B", desc="read_arrow", total=total) as report, backend.activate():
            table, nbytes = read_batches(file, layouts, names, types, backend, report if report.active else None)
            report(max(total, nbytes))  # columns inflated on the host (compressed files) are not counted as read
        return table
