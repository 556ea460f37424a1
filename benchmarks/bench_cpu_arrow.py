"""The CPU backend against pyarrow on Arrow IPC files: read_arrow against ``pyarrow.feather.read_table``
(uncompressed files, and the LZ4 file ``write_feather`` writes by default), a 10%-selective
scan_arrow against ``pyarrow.dataset``'s filtered ``to_table``, and write_arrow against
``feather.write_feather(compression="uncompressed")``, at 1M and 10M rows (1M only with --quick).
Always the CPU backend (``device="cpu"``), whatever --device says.

The goal (issue 17): read >= 0.9x and write >= 0.8x pyarrow (the speedup column); scans and
compressed reads at least as fast as pyarrow (>= 1x). One table of 6 float64 + 2 int64 columns (64
bytes a row). Reads: the same file for both readers, written by write_arrow (1M-row record batches; a
second line reads a file written by pyarrow, 64K-row batches), page cache warm. Writes: the same table
(a pystrom Table for write_arrow, its pyarrow twin for write_feather), each time to a new file (the
previous one is removed first, for both), and each time over the previous file (write_arrow swaps its
finished temporary file with it, write_feather truncates and rewrites it in place), write_arrow with
its default min/max statistics. Each pair runs alternately (``measure_pair``); medians.

Writes over a file leave work running after they return, each its own: ext4 starts writing back a
file truncated and rewritten (``auto_da_alloc``: write_feather's), and write_arrow closes the file it
replaced on a thread of its own (freeing its pages and blocks). Untimed after every write of either,
both are waited for (``fsync`` of write_feather's file, ``replace.settle``), so neither lands in the
other's time: before, pyarrow's writeback of 640 MB ran during write_arrow's timed writes.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.feather as feather

import pystrom

from _harness import Result, measure_pair


def _arrow_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    cols = {f"f{i}": rng.random(rows) for i in range(6)}
    cols["i0"] = rng.integers(0, 1 << 40, rows)
    cols["ts"] = np.arange(rows, dtype=np.int64)
    return pa.table(cols)


def _fresh(path: str, write) -> None:
    if os.path.exists(path):
        os.unlink(path)
    write(path)


def _settle_writes(theirs: str) -> None:
    """Wait for what both writers left running (module docstring)."""
    from pystrom.io.arrow.write import replace

    getattr(replace, "settle", lambda: None)()  # older pystrom closed the file it replaced at once
    if os.path.exists(theirs):
        fd = os.open(theirs, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _one_size(rows: int, tmp: str, repeat: int) -> list[Result]:
    arrow = _arrow_table(rows)
    nbytes = arrow.nbytes
    ours_file, theirs_file = os.path.join(tmp, "pystrom.arrow"), os.path.join(tmp, "pyarrow.arrow")
    pystrom.write_arrow(arrow, ours_file)
    feather.write_feather(arrow, theirs_file, compression="uncompressed")
    label = f"{rows / 1e6:g}M rows"
    out = []

    def nothing() -> None:
        pass

    for path, what in ((ours_file, "written by write_arrow"), (theirs_file, "written by pyarrow")):
        ours, base = measure_pair(
            lambda p=path: pystrom.read_arrow(p, device="cpu"),
            lambda p=path: feather.read_table(p, memory_map=False),
            nothing,
            repeat,
        )
        out.append(Result(f"read_arrow {label}, {what}", "feather.read_table", ours, base, nbytes))

    # A 10%-selective scan, against pyarrow's dataset scan with the same filter (the same file).
    ours, base = measure_pair(
        lambda: pystrom.scan_arrow(ours_file, where="f5 < 0.1", device="cpu").collect(),
        lambda: ds.dataset(ours_file, format="arrow").to_table(filter=ds.field("f5") < 0.1),
        nothing,
        repeat,
    )
    out.append(Result(f"scan_arrow {label} where f5 < 0.1", "dataset.to_table(filter=)", ours, base, nbytes))
    # What write_feather writes by default: LZ4-compressed bodies.
    lz4_file = os.path.join(tmp, "pyarrow.lz4.arrow")
    feather.write_feather(arrow, lz4_file)
    ours, base = measure_pair(
        lambda: pystrom.read_arrow(lz4_file, device="cpu"),
        lambda: feather.read_table(lz4_file, memory_map=False),
        nothing,
        repeat,
    )
    out.append(Result(f"read_arrow {label}, write_feather's LZ4", "feather.read_table", ours, base, nbytes))

    table = pystrom.Table.from_arrow(arrow, device="cpu")
    a, b = os.path.join(tmp, "w_pystrom.arrow"), os.path.join(tmp, "w_pyarrow.arrow")
    ours, base = measure_pair(
        lambda: _fresh(a, lambda p: pystrom.write_arrow(table, p)),
        lambda: _fresh(b, lambda p: feather.write_feather(arrow, p, compression="uncompressed")),
        nothing,
        repeat,
    )
    out.append(Result(f"write_arrow {label}, new file", "write_feather(uncompressed)", ours, base, nbytes))
    ours, base = measure_pair(
        lambda: pystrom.write_arrow(table, a),
        lambda: feather.write_feather(arrow, b, compression="uncompressed"),
        nothing,
        max(3, repeat // 3),
        settle=lambda: _settle_writes(b),
    )
    out.append(Result(f"write_arrow {label}, over a file", "write_feather(uncompressed)", ours, base, nbytes))
    return out


def run(device: str, quick: bool) -> list[Result]:
    tmp = tempfile.mkdtemp(prefix="pystrom-bench-", dir=os.environ.get("PYSTROM_BENCH_DIR"))
    try:
        results = _one_size(1_000_000, tmp, 15)
        if not quick:
            results += _one_size(10_000_000, tmp, 5)
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
