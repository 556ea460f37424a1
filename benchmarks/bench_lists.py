"""Embeddings from an Arrow file to a (rows, 768) float32 matrix on the device: read_arrow of a
``fixed_size_list<float32>[768]`` column (1M rows, 2.9 GiB; 64K rows with --quick) then ``table["emb"]``
(a zero-copy view), against the same baselines as bench_arrow.py, measured in the same run:

- a raw KvikIO read of the whole file into one device buffer (threaded preads on the CPU backend), with
  the settings pystrom uses: the ceiling for these bytes (issue 18's goal: read_arrow >= 0.85x of it);
- ``pyarrow.feather.read_table`` + the flattened values reshaped to (rows, 768) + ``cupy.asarray``;
- cold cache (pages dropped before each run) for both reads.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
from bench_arrow import _measure_cold, _raw_read

import pystrom

from _harness import Result, measure

DIM = 768


def _write(path: str, rows: int, batch_rows: int) -> None:
    def batches():
        rng = np.random.default_rng(0)
        for start in range(0, rows, batch_rows):
            n = min(batch_rows, rows - start)
            values = rng.standard_normal(n * DIM, dtype=np.float32)
            emb = pa.FixedSizeListArray.from_arrays(pa.array(values), DIM)
            yield pa.record_batch([emb, pa.array(np.arange(start, start + n))], names=["emb", "id"])

    pystrom.write_arrow(batches(), path)


def run(device: str, quick: bool) -> list[Result]:
    rows = (1 << 16) if quick else 1_000_000
    repeat = 3
    tmp = tempfile.mkdtemp(prefix="pystrom-bench-", dir=os.environ.get("PYSTROM_BENCH_DIR"))
    path = os.path.join(tmp, "emb.arrow")
    try:
        _write(path, rows, 1 << 16)
        size = os.path.getsize(path)
        backend = pystrom.memory.backend.resolve_device(device)
        xp, sync = backend.xp, backend.synchronize

        def ours():
            table = pystrom.read_arrow(path, columns=["emb"], device=device)
            return table["emb"]

        def baseline():
            t = feather.read_table(path, columns=["emb"], memory_map=False)
            flat = t.column("emb").combine_chunks().values.to_numpy().reshape(-1, DIM)
            return xp.asarray(flat) if backend.kind == "cuda" else np.array(flat)

        m = ours()
        assert m.shape == (rows, DIM) and m.dtype == np.float32
        del m
        label = f"read_arrow {rows:,} x fsl<f32>[{DIM}] ({size / 2**30:.2f} GiB)"
        mine = measure(ours, sync, repeat)
        results = [
            Result(f"{label}, warm", "raw read of the whole file", mine,
                   measure(lambda: _raw_read(path, size, backend), sync, repeat), size),
            Result(f"{label}, warm", "feather.read_table + reshape + asarray", mine,
                   measure(baseline, sync, repeat), size),
        ]  # fmt: skip
        cold = 1 if quick else 2
        raw_cold = _measure_cold(path, lambda: _raw_read(path, size, backend), sync, cold)
        results.append(Result(f"{label}, cold", "raw read of the whole file", _measure_cold(path, ours, sync, cold),
                              raw_cold, size))  # fmt: skip
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
