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


def _write_rows(table, tmp: str, raw_bytes: int) -> list[Result]:
    """``write_arrow(compression="lz4")`` of 2 GiB on the GPU (128 MiB with --quick), LZ4 compressed on the
    GPU (kernels/lz4_encode.cu) against the CPU codec on every core (``gpu_compressor="host"``) and against
    pyarrow (``to_arrow`` + ``feather.write_feather``, LZ4): a quarter of the read table (random floats,
    barely compressible), and as many rows of small and sorted integers (compressible to about a third)."""
    if table is None:
        return []
    import cupy

    rows = table.num_rows // 4
    rng = cupy.random.default_rng(1)
    ints = {f"k{i}": rng.integers(0, 1000, rows) for i in range(6)}
    ints["ts"] = cupy.arange(rows, dtype=cupy.int64)
    ints["day"] = ints["ts"] // 100_000
    parts = {"floats": table.slice(0, rows), "small ints": pystrom.Table.from_arrays(ints, device=table.device)}
    results = []
    for kind, part in parts.items():
        results.extend(_write_one(kind, part, tmp, raw_bytes // 4))
    return results


def _write_one(kind: str, part, tmp: str, nbytes: int) -> list[Result]:
    out = os.path.join(tmp, "written.arrow")
    theirs = os.path.join(tmp, "written.feather")

    def ours() -> None:
        pystrom.write_arrow(part, out, compression="lz4")

    def host() -> None:
        with pystrom.defaults.set(gpu_compressor="host"):
            pystrom.write_arrow(part, out, compression="lz4")

    def pyarrow_write() -> None:
        feather.write_feather(part.to_arrow(), theirs, compression="lz4")

    def nothing() -> None:
        pass

    ours()
    assert feather.read_table(out).equals(part.to_arrow()), "the GPU-compressed file reads back differently"
    ratio = os.path.getsize(out) / nbytes
    host()
    ratio_host = os.path.getsize(out) / nbytes
    gpu_s, host_s, theirs_s = (measure(f, nothing, 2) for f in (ours, host, pyarrow_write))
    print(f"  write lz4 {kind}: GPU {nbytes / gpu_s / 1e9:.2f} GB/s ({ratio:.3f} of it), "
          f"CPU codec {nbytes / host_s / 1e9:.2f} GB/s ({ratio_host:.3f}), "
          f"pyarrow {nbytes / theirs_s / 1e9:.2f} GB/s")  # fmt: skip
    label = f"write_arrow LZ4 {nbytes / 2**30:.1f} GiB {kind} from the GPU, GPU compressor"
    for path in (out, theirs):
        os.unlink(path)
    return [
        Result(label, "gpu_compressor='host' (CPU codec, every core)", gpu_s, host_s, nbytes),
        Result(label, "to_arrow + feather.write_feather lz4", gpu_s, theirs_s, nbytes),
    ]


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
            del want
            warm = measure(ours, sync, repeat)
            results.append(Result(f"read_arrow {label}, warm", "feather.read_table + asarray", warm,
                                  measure(baseline, sync, repeat), raw_bytes))  # fmt: skip
            print(f"  {codec} warm: {raw_bytes / warm / 1e9:.1f} GB/s of decompressed output (goal >= 20 on a GPU)")
            if codec == "lz4":
                results.extend(_write_rows(t if gpu else None, tmp, raw_bytes))
            cold = _measure_cold(path, ours, sync, 1 if quick else 2)
            results.append(Result(f"read_arrow {label}, cold", "feather.read_table + asarray", cold,
                                  _measure_cold(path, baseline, sync, 1), raw_bytes))  # fmt: skip
            dd = _dd_direct(path)
            if dd is not None:
                results.append(Result(f"read_arrow {label}, cold", "dd iflag=direct of the file / 0.9 (goal >= 1x)",
                                      cold, dd / 0.9, raw_bytes))  # fmt: skip
                print(f"  {codec} cold: {raw_bytes / cold / 1e9:.2f} GB/s out; disk {size / dd / 1e9:.2f} GB/s x "
                      f"ratio {1 / ratio:.2f} = {raw_bytes / dd / 1e9:.2f} GB/s")  # fmt: skip
            del t
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
