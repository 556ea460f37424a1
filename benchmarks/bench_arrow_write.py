"""Writing an Arrow IPC file: pystrom's 64-byte aligned writer (with and without statistics, uncompressed
and with LZ4/Zstandard bodies) against pyarrow's ``RecordBatchFileWriter`` (same compression, its
threads on) on the same batches, to the same directory. Host-only work: the device argument is ignored."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from pystrom.io.arrow.write.writer import write_ipc_file

from _harness import Result, measure


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    cols = {f"f{i}": rng.standard_normal(rows) for i in range(6)}
    cols["id"] = np.arange(rows, dtype=np.int64)
    cols["k"] = rng.integers(0, 1000, rows).astype(np.int32)
    return pa.table(cols)


def run(device: str, quick: bool) -> list[Result]:
    rows = 2_000_000 if quick else 16_000_000
    table = _table(rows)
    batches = table.to_batches(max_chunksize=1 << 16)
    tmp = tempfile.mkdtemp(prefix="pystrom-bench-")
    ours, theirs = os.path.join(tmp, "pystrom.arrow"), os.path.join(tmp, "pyarrow.arrow")

    def pyarrow_write() -> None:
        with ipc.new_file(theirs, table.schema) as w:
            for b in batches:
                w.write_batch(b)

    def nothing() -> None:
        pass

    try:
        repeat = 3 if quick else 5
        base = measure(pyarrow_write, nothing, repeat)
        plain = measure(lambda: write_ipc_file(ours, table.schema, batches, stats=False), nothing, repeat)
        with_stats = measure(lambda: write_ipc_file(ours, table.schema, batches), nothing, repeat)
        compressed = {}
        for codec in ("lz4", "zstd"):

            def pyarrow_compressed(codec: str = codec) -> None:
                with ipc.new_file(theirs, table.schema, options=ipc.IpcWriteOptions(compression=codec)) as w:
                    for b in batches:
                        w.write_batch(b)

            compressed[codec] = (
                measure(
                    lambda codec=codec: write_ipc_file(ours, table.schema, batches, compression=codec), nothing, repeat
                ),
                measure(pyarrow_compressed, nothing, repeat),
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    label = f"write {table.nbytes / 2**20:.0f} MiB, {len(batches)} batches"
    return [
        Result(f"{label}, no stats", "pyarrow ipc.new_file", plain, base, table.nbytes),
        Result(f"{label}, PG-Strom stats", "pyarrow ipc.new_file", with_stats, base, table.nbytes),
        *(
            Result(f"{label}, {codec}, PG-Strom stats", f"pyarrow ipc.new_file {codec}", ours_s, theirs_s, table.nbytes)
            for codec, (ours_s, theirs_s) in compressed.items()
        ),
    ]
