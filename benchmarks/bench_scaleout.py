"""pystrom.dask across GPUs: one dask-cuda worker per GPU, the logreg table from PostgreSQL, then a fit.

Runs only where two or more GPUs are visible (skipped otherwise, also in a full ``benchmarks/run.py``).
For each table size (``PYSTROM_BENCH_SCALE_ROWS``, default ``40000000,160000000``; quick 2M) and each
GPU count N (1, 2, 4, ... up to the GPUs visible): a LocalCUDACluster of N workers with T threads each
(T = min(16, cores / N), so N x T backends read at once), ``pystrom.dask.read_postgres`` persisted on
the workers, then a 20-iteration logistic regression (tol=0) on the persisted partitions. Beside it,
in the same run, the server's own COPY of the table to /dev/null over the same N x T backends: the
floor of the read. Scaling efficiency = time on 1 GPU / (N x time on N GPUs).

Then a table larger than one GPU's memory (``PYSTROM_BENCH_SCALE_BIG_GB``, default 1.07x the largest
GPU's memory, 0 to skip): one Arrow file of logreg record batches written once and hard-linked under
K names (the same bytes K times: the page cache holds one copy, so the read is not a disk test), read
by ``pystrom.dask.scan_arrow`` onto every GPU, persisted, and fitted without a gather. Because the rows
are the block's rows repeated K x B times, the fit must give the block's own coefficients (checked),
and the per-GPU memory in use is printed to show where the table lives.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from typing import Any

import numpy as np
from bench_postgres import _load, _server_copy

from _harness import Result, measure_pair

_FEATURES = ["x1", "x2", "x3", "x4"]
_ROW_BYTES = 1 + 4 * 8  # t bool + four float8, as the fit reads them


def run(device: str, quick: bool) -> list[Result]:
    from pystrom.memory.backend import cuda_device_count

    gpus = cuda_device_count() if device.startswith("cuda") else 0
    if gpus < 2:
        print(f"bench_scaleout: skipped ({gpus} GPU(s) visible; needs two or more)")
        return []
    try:
        import dask_cuda  # noqa: F401
        import distributed  # noqa: F401
        from fix_pg import PgCluster, _find_bindir
    except ImportError as exc:
        print(f"bench_scaleout: skipped ({exc}); pip install 'pystrom-gpu[dask-cuda]'")
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: the fits stop at 20 iterations on purpose
        results = []
        default = "2000000" if quick else "40000000,160000000"
        sizes = [int(r) for r in os.environ.get("PYSTROM_BENCH_SCALE_ROWS", default).split(",") if r]
        counts = sorted({n for n in (1, 2, 4, 8) if n <= gpus} | {gpus})
        bindir = _find_bindir()
        if bindir is None:
            print("bench_scaleout: PostgreSQL part skipped (no PostgreSQL binaries and no pgserver)")
        elif sizes:
            pg = PgCluster(bindir)
            try:
                for rows in sizes:
                    results += _postgres_scaling(pg.conninfo, rows, counts, quick)
            finally:
                pg.destroy()
        results += _bigger_than_one_gpu(gpus, quick)
        return results


def _cluster(n: int, threads: int, **kwargs: Any):
    import distributed
    from dask_cuda import LocalCUDACluster

    cluster = LocalCUDACluster(
        CUDA_VISIBLE_DEVICES=",".join(map(str, range(n))),
        n_workers=n,
        threads_per_worker=threads,
        dashboard_address=":0",
        **kwargs,
    )
    return cluster, distributed.Client(cluster)


def _postgres_scaling(conninfo: str, rows: int, counts: list[int], quick: bool) -> list[Result]:
    import distributed

    import pystrom.dask
    from pystrom.ml import LogisticRegression

    cores = os.cpu_count() or 1
    name = f"logreg_{rows}"
    start = time.perf_counter()
    _load(conninfo, rows, max(1, min(32, cores)), name, with_id=True, noise=0.1)
    label = f"{rows / 1e6:g}M"
    print(f"  {name}: {rows:,} rows loaded in {time.perf_counter() - start:.1f} s")
    repeat = 2 if rows <= 40_000_000 or quick else 1
    table: dict[int, dict[str, float]] = {}
    results = []
    coefs = {}
    for n in counts:
        threads = max(1, min(16, cores // n))
        cluster, client = _cluster(n, threads)
        try:
            seen: dict[str, list[float]] = {"read": [], "fit": [], "parts": [], "passes": []}
            holder: dict[str, Any] = {}

            def read(seen=seen, holder=holder):
                holder.pop("parts", None)
                t0 = time.perf_counter()
                with pystrom.dask.read_postgres(conninfo, table=name, columns=["t", *_FEATURES]) as parts:
                    parts = parts.persist()
                    distributed.wait(parts)
                seen["read"].append(time.perf_counter() - t0)
                seen["parts"].append(parts.npartitions)
                holder["parts"] = parts

            t_read, t_copy = measure_pair(read, lambda: _server_copy(conninfo, n * threads, name), lambda: None,  # noqa: B023
                                          repeat)  # fmt: skip
            parts = holder["parts"]

            def fit(seen=seen, parts=parts):
                t0 = time.perf_counter()
                model = LogisticRegression(max_iter=20, tol=0.0).fit(parts, columns=_FEATURES, target="t")
                seen["fit"].append(time.perf_counter() - t0)
                seen["passes"].append(model.n_passes_)
                return model

            model = fit()
            for _ in range(repeat):
                fit()
            t_fit = float(np.median(seen["fit"][1:]))
            coefs[n] = model.coefficients_
            per_gpu = _per_gpu_bytes(client)
            table[n] = {"read": t_read, "copy": t_copy, "fit": t_fit}
            print(
                f"  {label} on {n} GPU(s), {threads} threads each ({n * threads} backends), "
                f"{int(seen['parts'][-1])} partitions: read+persist {t_read:.3f} s, server COPY x{n * threads} "
                f"{t_copy:.3f} s (read/COPY {t_read / t_copy:.2f}); fit 20 it {t_fit:.3f} s "
                f"({int(seen['passes'][-1])} passes); GPU memory in use per GPU (GB): "
                f"{', '.join(f'{b / 1e9:.1f}' for b in per_gpu)}",
                flush=True,
            )
            results.append(
                Result(
                    f"dask pg {label} -> {n} GPU(s) persisted",
                    f"server COPY x{n * threads} to /dev/null",
                    t_read,
                    t_copy,
                    rows * _ROW_BYTES,
                )  # fmt: skip
            )
            del parts, holder
        finally:
            client.close()
            cluster.close()
    one = table[counts[0]]
    for n in counts:
        t = table[n]
        diff = float(np.max(np.abs(coefs[n] - coefs[counts[0]])))
        print(
            f"  scaling {label}, {n} GPU(s): read efficiency {one['read'] / (n * t['read']):.2f} "
            f"(COPY's own {one['copy'] / (n * t['copy']):.2f}), fit efficiency {one['fit'] / (n * t['fit']):.2f}; "
            f"coefficients differ from 1 GPU's by {diff:.1e}"
        )
    return results


def _per_gpu_bytes(client: Any) -> list[int]:
    """Device memory in use on each worker's GPU (the driver's view, so every pool counts)."""

    def used() -> int:
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        return total - free

    return list(client.run(used).values())


def _write_block(path: str, rows: int, batches: int) -> Any:
    """One logreg block of ``rows`` rows written ``batches`` times into one Arrow file; returns the
    block as a pyarrow table (the fit's reference)."""
    import pyarrow as pa

    rng = np.random.default_rng(5)
    X = rng.standard_normal((rows, 4))
    t = (1 + X @ np.array([2.0, -3.0, 1.0, 0.5]) > 0) != (rng.random(rows) < 0.1)
    block = pa.table({"t": t, **{f"x{i + 1}": X[:, i] for i in range(4)}})
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, block.schema) as writer:
        for _ in range(batches):
            for batch in block.to_batches():
                writer.write_batch(batch)
    return block


def _bigger_than_one_gpu(gpus: int, quick: bool) -> list[Result]:
    import cupy
    import distributed

    import pystrom
    import pystrom.dask
    from pystrom.ml import LogisticRegression

    largest = max(cupy.cuda.runtime.getDeviceProperties(i)["totalGlobalMem"] for i in range(gpus))
    default = 0.0 if quick else 1.07 * largest / 1e9
    target = float(os.environ.get("PYSTROM_BENCH_SCALE_BIG_GB", default)) * 1e9
    if target <= 0:
        return []
    block_rows = 1 << 26  # 64M rows, 2.2 GB in the file
    per_block = block_rows * (4 * 8) + block_rows // 8
    batches = 8  # the block 8 times in each file: 17.7 GB a file
    links = max(1, int(np.ceil(target / (per_block * batches))))
    tmp = tempfile.mkdtemp(prefix="pystrom-scaleout-", dir=os.environ.get("PYSTROM_BENCH_TMP"))
    first = os.path.join(tmp, "big-0.arrow")
    t0 = time.perf_counter()
    block = _write_block(first, block_rows, batches)
    for i in range(1, links):
        os.link(first, os.path.join(tmp, f"big-{i}.arrow"))
    paths = [os.path.join(tmp, f"big-{i}.arrow") for i in range(links)]
    total_rows = block_rows * batches * links
    print(
        f"  big: {links} names of one {os.path.getsize(first) / 1e9:.1f} GB file, {total_rows:,} rows, "
        f"{total_rows * 33 / 1e9:.0f} GB as a Table (largest GPU: {largest / 1e9:.0f} GB); written in "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    want = LogisticRegression(max_iter=20, tol=0.0).fit(
        pystrom.Table.from_arrow(block, device="cuda"), columns=_FEATURES, target="t"
    )
    cupy.get_default_memory_pool().free_all_blocks()  # the client's GPU 0 holds nothing during the big read
    cluster, client = _cluster(gpus, 4, device_memory_limit=0.95)
    try:
        t0 = time.perf_counter()
        parts = pystrom.dask.scan_arrow(paths, columns=["t", *_FEATURES])
        parts = parts.persist()
        distributed.wait(parts)
        t_read = time.perf_counter() - t0
        per_gpu = _per_gpu_bytes(client)
        t0 = time.perf_counter()
        model = LogisticRegression(max_iter=20, tol=0.0).fit(parts, columns=_FEATURES, target="t")
        t_fit = time.perf_counter() - t0
        diff = float(np.max(np.abs(model.coefficients_ - want.coefficients_)))
        nbytes = total_rows * _ROW_BYTES
        print(
            f"  big on {gpus} GPUs: scan+persist {t_read:.2f} s ({nbytes / t_read / 1e9:.1f} GB/s), "
            f"{parts.npartitions} partitions; GPU memory in use per GPU (GB): "
            f"{', '.join(f'{b / 1e9:.1f}' for b in per_gpu)}; fit 20 it {t_fit:.2f} s "
            f"({model.n_passes_} passes, {nbytes * model.n_passes_ / t_fit / 1e9:.0f} GB/s over all GPUs); "
            f"coefficients vs the block's own fit: max diff {diff:.1e}; rows counted {model.num_rows_processed_:,}",
            flush=True,
        )
        assert model.num_rows_processed_ == total_rows, model.num_rows_processed_
        assert diff < 1e-6, diff
        del parts
    finally:
        client.close()
        cluster.close()
        for p in paths:
            os.unlink(p)
        os.rmdir(tmp)
    return []
