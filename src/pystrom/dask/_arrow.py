"""``pystrom.dask.scan_arrow``: Arrow IPC files as a partitioned collection, one task per group of record batches.

The client plans as ``pystrom.scan_arrow`` would (:meth:`pystrom.ArrowScan.plan`): it reads the
files' metadata, skips the record batches whose min/max statistics rule out ``where``, and groups
the rest; each group becomes one task (:func:`~pystrom.dask._tasks.read_arrow_group`) that reads
those batches on its worker (KvikIO onto its GPU, or pread on the CPU) and filters them there.
A skipped batch has no task. Every worker must see the files at the same paths.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ._collection import PartitionedTable, Partitions, check_device
from ._tasks import read_arrow_group

__all__ = ["scan_arrow"]


def scan_arrow(
    paths: Any,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    *,
    batch_rows: int | None = None,
    device: str | int | None = None,
) -> PartitionedTable:
    """Arrow IPC files as a lazy collection of Tables read by the dask workers.

    Parameters
    ----------
    paths, columns, where, batch_rows
        As for :func:`pystrom.scan_arrow`: a partition is one group of whole record batches of at
        least ``batch_rows`` rows (default 1,048,576) within one file; batches whose statistics
        cannot match ``where`` are dropped while planning, on the client, and get no task.
    device
        Where each worker puts its partitions (None: its default, its GPU under dask-cuda).

    Returns
    -------
    PartitionedTable
        ``.stats`` holds the plan's counts (batches and bytes skipped by statistics).
    """
    from ..io.arrow.scan.scan import ArrowScan

    check_device(device)
    scan = ArrowScan(paths, columns, where, batch_rows, "cpu", False)  # the client only reads metadata
    groups = scan.plan()
    tasks = [(read_arrow_group, path, indices, list(scan.columns), where, device) for path, indices in groups]
    versions = []
    for path in scan.paths:  # a file rewritten since makes other keys (the scheduler would reuse equal ones)
        st = os.stat(path)
        versions.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    parts = Partitions.from_tasks("pystrom-scan-arrow", tasks, token=versions)
    result = PartitionedTable(parts, scan.schema, device)
    result.stats = scan.stats
    return result
