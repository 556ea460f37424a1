"""Compressed Arrow IPC files (LZ4_FRAME, ZSTD) to the device, and the filtered scan at the read rate.

The data is bench_arrow's (6 float64 + 2 int64 columns, 8 GiB uncompressed; 512 MiB with --quick),
written as ``pyarrow.feather.write_feather`` writes it by default: LZ4_FRAME bodies in record batches
of 64Ki rows (written batch by batch through ``pa.ipc.new_file`` with the same options, so the 8 GiB
table is never held whole), and the same with ZSTD. Measured in the same run:

- warm: pystrom ``read_arrow`` against ``feather.read_table`` + ``cupy.asarray`` per column (goal:
  >= 20 GB/s of decompressed output on a GPU);
- cold (pages dropped before every run): against the disk's own rate for the compressed bytes
  (``dd iflag=direct``), the goal being >= 0.9x that rate times the compression ratio, i.e. pystrom's
  time <= dd's time on the compressed file / 0.9;
- ``scan_arrow(where="f5 < 0.1")`` against ``read_arrow`` of the uncompressed file (goal >= 0.85x).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
from bench_arrow import FLOATS, _dd_direct, _measure_cold

import pystrom

from _harness import Result, measure

_FEATHER_CHUNK = 64 * 1024  # write_feather's default chunksize


def _batches(rows: int, batch_rows: int):
    rng = np.random.default_rng(0)
    for start in range(0, rows, batch_rows):
        n = min(batch_rows, rows - start)
        cols = {name: rng.random(n) for name in FLOATS}
        cols["i0"] = rng.integers(0, 1 << 40, n)
        cols["ts"] = np.arange(start, start + n, dtype=np.int64)
        yield pa.RecordBatch.from_pydict(cols)


def _write_compressed(path: str, rows: int, codec: str) -> None:
    options = pa.ipc.IpcWriteOptions(compression=codec, use_threads=True)
    schema = next(_batches(1, 1)).schema
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema, options=options) as writer:
        for batch in _batches(rows, _FEATHER_CHUNK):
            writer.write_batch(batch)


def run(device: str, quick: bool) -> list[Result]:
    rows = (512 << 20) // 64 if quick else (8 << 30) // 64
    raw_bytes = rows * 64
    repeat = 3
    tmp = tempfile.mkdtemp(prefix="pystrom-bench-", dir=os.environ.get("PYSTROM_BENCH_DIR"))
    backend = pystrom.memory.backend.resolve_device(device)
    xp, sync = backend.xp, backend.synchronize
    gpu = backend.kind == "cuda"
    results: list[Result] = []
    try:
        for codec in ("lz4", "zstd"):
            path = os.path.join(tmp, f"data.{codec}.arrow")
            _write_compressed(path, rows, codec)
            size = os.path.getsize(path)
            ratio = size / raw_bytes
            label = f"{codec.upper()} {raw_bytes / 2**30:.1f} GiB ({ratio:.2f} of it)"

            def ours(path=path):
                return pystrom.read_arrow(path, device=device)

            def baseline(path=path):
                t = feather.read_table(path, memory_map=False)
                return {n: (xp.asarray(t.column(n).to_numpy()) if gpu else np.array(t.column(n).to_numpy()))
                        for n in t.column_names}  # fmt: skip

            t = ours()
            want = feather.read_table(path)
            assert t.to_arrow().equals(want), f"read_arrow of the {codec} file differs from pyarrow's"
            del t, want
            warm = measure(ours, sync, repeat)
            results.append(Result(f"read_arrow {label}, warm", "feather.read_table + asarray", warm,
                                  measure(baseline, sync, repeat), raw_bytes))  # fmt: skip
            print(f"  {codec} warm: {raw_bytes / warm / 1e9:.1f} GB/s of decompressed output (goal >= 20 on a GPU)")
            cold = _measure_cold(path, ours, sync, 1 if quick else 2)
            results.append(Result(f"read_arrow {label}, cold", "feather.read_table + asarray", cold,
                                  _measure_cold(path, baseline, sync, 1), raw_bytes))  # fmt: skip
            dd = _dd_direct(path)
            if dd is not None:
                results.append(Result(f"read_arrow {label}, cold", "dd iflag=direct of the file / 0.9 (goal >= 1x)",
                                      cold, dd / 0.9, raw_bytes))  # fmt: skip
                print(f"  {codec} cold: {raw_bytes / cold / 1e9:.2f} GB/s out; disk {size / dd / 1e9:.2f} GB/s x "
                      f"ratio {1 / ratio:.2f} = {raw_bytes / dd / 1e9:.2f} GB/s")  # fmt: skip
            os.unlink(path)

        path = os.path.join(tmp, "data.arrow")
        pystrom.write_arrow(_batches(rows, 1 << 20), path)
        scan = pystrom.scan_arrow(path, where="f5 < 0.1", device=device)
        results.append(Result("scan_arrow where f5 < 0.1 (10%), warm", "read_arrow, warm (goal >= 0.85x)",
                              measure(scan.collect, sync, repeat),
                              measure(lambda: pystrom.read_arrow(path, device=device), sync, repeat),
                              os.path.getsize(path)))  # fmt: skip
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
