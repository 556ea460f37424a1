"""pystrom.dask across GPUs: one dask-cuda worker per GPU, the logreg table from PostgreSQL, then a fit.

Runs only where two or more GPUs are visible (skipped otherwise, also in a full ``benchmarks/run.py``).
One call prints issue 35's whole table. For each table size (``PYSTROM_BENCH_SCALE_ROWS``, default
``40000000,160000000``; quick 2M) and each GPU count N (1, 2, 4, ... up to the GPUs visible): a
LocalCUDACluster of N workers with T threads each (T = min(16, cores / N), so N x T backends read at
once), then

- ``pystrom.dask.read_postgres`` persisted on the workers, alternating with the server's own COPY of
  the table to /dev/null over the same N x T backends (the floor of the read); where the read's time
  goes, from inside the workers (_scaleout_probe.py: connect, snapshot, COPY streams and the pump's
  CPU, staging, upload, decode) and the server's CPU per row during the read and during the COPY;
- a 20-iteration logistic regression (tol=0) on the persisted partitions, with the Newton loop on the
  workers (NCCL between them; ``fit_info_``), and with the client's loop of before (one ``Client.run``
  a pass) for comparison; coefficients and statistics against the 1-GPU fit;
- the read and the COPY once more with the server pinned to one half of the cores and the workers to
  the other (``PYSTROM_BENCH_SCALE_SPLIT=0`` skips), to tell the pump's CPU from the server's.

Scaling efficiency = time on 1 GPU / (N x time on N GPUs). Then a table larger than one GPU's memory
(``PYSTROM_BENCH_SCALE_BIG_GB``, default 1.07x the largest GPU's memory, 0 to skip): one Arrow file of
logreg record batches written once and hard-linked under K names (the same bytes K times: the page
cache holds one copy, so the read is not a disk test), read by ``pystrom.dask.scan_arrow`` onto every
GPU, persisted, and fitted without a gather. Because the rows are the block's rows repeated, the fit
must give the block's own coefficients (checked), and the per-GPU memory in use shows where the table
lives. Every phase prints its wall time, and the whole its own.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from typing import Any

import numpy as np
from bench_postgres import _load, _server_copy

import _scaleout_probe as probe
from _harness import Result

_FEATURES = ["x1", "x2", "x3", "x4"]
_ROW_BYTES = 1 + 4 * 8  # t bool + four float8, as the fit reads them
_STATS = ["coefficients_", "std_err_", "z_stats_", "p_values_", "variance_covariance_"]


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
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: the fits stop at 20 iterations on purpose
        results: list[Result] = []
        rows_out: list[dict] = []
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
                    results += _postgres_scaling(pg, rows, counts, quick, rows_out)
            finally:
                pg.destroy()
        big = _bigger_than_one_gpu(gpus, quick)
        _print_table(rows_out, big)
    print(f"bench_scaleout: {time.perf_counter() - start:.0f} s in all", flush=True)
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


def _postgres_scaling(pg: Any, rows: int, counts: list[int], quick: bool, rows_out: list[dict]) -> list[Result]:
    cores = os.cpu_count() or 1
    name = f"logreg_{rows}"
    t0 = time.perf_counter()
    _load(pg.conninfo, rows, max(1, min(32, cores)), name, with_id=True, noise=0.1)
    label = f"{rows / 1e6:g}M"
    print(f"  {name}: {rows:,} rows loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])
    repeat = 2 if rows <= 40_000_000 or quick else 1
    split = os.environ.get("PYSTROM_BENCH_SCALE_SPLIT", "1") != "0" and cores >= 2
    results, first = [], None
    for n in counts:
        t_phase = time.perf_counter()
        threads = max(1, min(16, cores // n))
        cluster, client = _cluster(n, threads)
        try:
            client.run(probe.install)  # before any read: the tasks' functions are the wrapped ones
            row = {"rows": label, "n": rows, "gpus": n, "threads": threads}
            reader = _Reader(client, pg.conninfo, name, rows, n * threads, postmaster)
            reads, copies = [], []
            for i in range(1 + repeat):  # alternately, after one warm-up of each (measure_pair's way)
                last = i == repeat
                reads.append(reader.read(account=last))
                copies.append(reader.copy(account=last))
            row["read"], row["copy"] = statistics.median(reads[1:]), statistics.median(copies[1:])
            row["parts"], row["breakdown"] = reader.parts.npartitions, reader.breakdown
            row["srv_read"], row["srv_copy"] = reader.server_cpu["read"], reader.server_cpu["copy"]
            row.update(_fits(client, reader.parts, repeat))
            row["gpu_gb"] = _per_gpu_bytes(client)
            if first is None:
                first = row
            row["coef_diff"] = float(np.max(np.abs(row["model"].coefficients_ - first["model"].coefficients_)))
            row["stat_diff"] = max(_rel_diff(getattr(row["model"], s), getattr(first["model"], s)) for s in _STATS)
            if split:
                row["split_read"], row["split_copy"], row["split_cpus"] = reader.split(cores)
            print(f"  {label} on {n} GPU(s), {threads} threads each ({n * threads} backends, {row['parts']} "
                  f"partitions): read+persist {row['read']:.3f} s, COPY {row['copy']:.3f} s; fit 20 it "
                  f"{row['fit']:.3f} s ({row['path']}, {row['passes']} passes; client's loop {row['fit_client']:.3f} "
                  f"s); read breakdown: {row['breakdown']}; server CPU {row['srv_read']:.3f} s/Mrow in the read, "
                  f"{row['srv_copy']:.3f} in the COPY; GPU memory per GPU (GB): "
                  f"{', '.join(f'{b / 1e9:.1f}' for b in row['gpu_gb'])}; phase {time.perf_counter() - t_phase:.0f} s",
                  flush=True)  # fmt: skip
            results.append(Result(f"dask pg {label} -> {n} GPU(s) persisted", f"server COPY x{n * threads} to "
                                  "/dev/null", row["read"], row["copy"], rows * _ROW_BYTES))  # fmt: skip
            reader.parts = None
            rows_out.append(row)
        finally:
            client.close()
            cluster.close()
    return results


class _Reader:
    """The read and its COPY floor, each timed alone (the accounting around them is not in the times)."""

    def __init__(self, client: Any, conninfo: str, name: str, rows: int, backends: int, postmaster: int):
        self.client, self.conninfo, self.name, self.rows = client, conninfo, name, rows
        self.backends, self.postmaster = backends, postmaster
        self.parts: Any = None
        self.breakdown = ""
        self.server_cpu = {"read": float("nan"), "copy": float("nan")}

    def read(self, account: bool = False) -> float:
        import distributed

        import pystrom.dask

        self.parts = None
        self.client.run(probe.install)  # resets the sums
        s0 = probe.server_cpu(self.postmaster) if account else 0.0
        t0 = time.perf_counter()
        with pystrom.dask.read_postgres(self.conninfo, table=self.name, columns=["t", *_FEATURES]) as parts:
            parts = parts.persist()
            distributed.wait(parts)
        took = time.perf_counter() - t0
        self.parts = parts
        if account:
            self.server_cpu["read"] = (probe.server_cpu(self.postmaster) - s0) * 1e6 / self.rows
            self.breakdown = probe.summarise(self.client.run(probe.collect), self.rows)
        return took

    def copy(self, account: bool = False) -> float:
        s0 = probe.server_cpu(self.postmaster) if account else 0.0
        t0 = time.perf_counter()
        _server_copy(self.conninfo, self.backends, self.name)
        took = time.perf_counter() - t0
        if account:
            self.server_cpu["copy"] = (probe.server_cpu(self.postmaster) - s0) * 1e6 / self.rows
        return took

    def split(self, cores: int) -> tuple[float, float, str]:
        """The read and the COPY once each with the server on the upper half of the cores and the
        workers on the lower half; affinities restored after."""
        half = cores // 2
        low, high = list(range(half)), set(range(half, cores))
        everything = set(range(cores))
        self.client.run(probe.set_affinity, low)
        probe.pin_server(self.postmaster, high)
        try:
            self.parts = None
            t_read = self.read()
            t_copy = self.copy()
        finally:
            probe.pin_server(self.postmaster, everything)
            self.client.run(probe.set_affinity, None)
        return t_read, t_copy, f"server on cores {half}-{cores - 1}, workers on 0-{half - 1}"


def _fits(client: Any, parts: Any, repeat: int) -> dict:
    """The 20-iteration fit with the loop on the workers (auto), and with the client's loop."""
    import pystrom
    from pystrom.ml import LogisticRegression

    out: dict = {}
    for mode in ("auto", "client"):
        times, model = [], None
        with pystrom.defaults.set(dask_fit_loop=mode):
            for _ in range(1 + max(2, repeat)):  # the first forms the communicator and compiles the kernels
                t0 = time.perf_counter()
                model = LogisticRegression(max_iter=20, tol=0.0).fit(parts, columns=_FEATURES, target="t")
                times.append(time.perf_counter() - t0)
        if mode == "auto":
            info = model.fit_info_
            ranks = info.get("ranks") or [{}]
            out.update(
                fit=statistics.median(times[1:]),
                fit_first=times[0],
                model=model,
                passes=model.n_passes_,
                path=f"{info['path']}/{info['comm']}",
                gpu_pass=max(r.get("pass_s", float("nan")) for r in ranks),
                allgather=max(r.get("allgather_s", float("nan")) for r in ranks),
                loop_pass=ranks[0].get("loop_s", float("nan")) / max(1, model.n_passes_),
                formed=max(r.get("formed_s", 0.0) for r in ranks),
                chained=f"{min(r.get('chained', 0) for r in ranks)}/{model.n_passes_} "
                f"({min(r.get('hits', 0) for r in ranks)} speculative)",
                prepare=max(r.get("prepare_s", 0.0) for r in ranks),
                outside=times[-1] - ranks[0].get("loop_s", float("nan")),  # the last fit's time outside its loop
                # per rank: partitions/rows and its own pass (an uneven placement shows as the slowest pass)
                per_rank="; ".join(
                    f"rank {r.get('rank')}: {r.get('partitions')} partitions, {r.get('rows', 0) / 1e6:.1f}M rows, "
                    f"pass {1e3 * r.get('pass_s', float('nan')):.2f} ms"
                    for r in ranks
                ),
            )
        else:
            out["fit_client"] = statistics.median(times[1:])
    return out


def _rel_diff(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(all="ignore"):
        d = np.abs(a - b) / np.maximum(np.abs(b), 1e-300)
    return float(np.nanmax(d)) if d.size else 0.0


def _per_gpu_bytes(client: Any) -> list[int]:
    """Device memory in use on each worker's GPU (the driver's view, so every pool counts)."""

    def used() -> int:
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        return total - free

    return list(client.run(used).values())


def _print_table(rows_out: list[dict], big: dict | None) -> None:
    """Issue 35's table: one line per size and GPU count, then the big table's."""
    try:
        import cupy

        gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        gpu = f"{gpu.decode() if isinstance(gpu, bytes) else gpu} x{cupy.cuda.runtime.getDeviceCount()}"
    except Exception:  # noqa: BLE001 - a dry run on CPU workers
        gpu = "no GPU"
    print(f"\nscale-out on {gpu}, {os.cpu_count()} cores (PostgreSQL on the same host)\n")
    head = (
        "| rows | GPUs | read+persist | server COPY, same backends | read / COPY | read efficiency (COPY's "
        "own) | fit 20 it | fit efficiency | per pass (fit / passes) | in-loop pass | slowest rank's pass "
        "(chained: with its all-gather) | host all-gathers | chained passes (speculative used) | "
        "client's loop, fit 20 it | path | coef. diff vs 1 GPU | stat. rel. diff | split: read / COPY |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    one = {}
    for r in rows_out:
        base = one.setdefault(r["rows"], r)
        n = r["gpus"]
        read_eff = base["read"] / (n * r["read"])
        copy_eff = base["copy"] / (n * r["copy"])
        fit_eff = base["fit"] / (n * r["fit"])
        split = f"{r['split_read'] / r['split_copy']:.2f} ({r['split_read']:.3f} / {r['split_copy']:.3f} s)" \
            if "split_read" in r else "-"  # fmt: skip
        print(f"| {r['rows']} | {n} | {r['read']:.3f} s | {r['copy']:.3f} s | {r['read'] / r['copy']:.2f} | "
              f"{read_eff:.2f} ({copy_eff:.2f}) | {r['fit']:.3f} s | {fit_eff:.2f} | "
              f"{1e3 * r['fit'] / r['passes']:.2f} ms | {1e3 * r['loop_pass']:.2f} ms | {1e3 * r['gpu_pass']:.2f} ms | "
              f"{1e3 * r['allgather']:.3f} ms | {r['chained']} | {r['fit_client']:.3f} s | {r['path']} | "
              f"{r['coef_diff']:.1e} | "
              f"{r['stat_diff']:.1e} | {split} |")  # fmt: skip
    if big:
        print(f"| big: {big['rows'] / 1e6:.0f}M ({big['gb']:.0f} GB, {big['ratio']:.2f}x one GPU) | {big['gpus']} | "
              f"{big['read']:.2f} s scan+persist ({big['gb'] / big['read']:.1f} GB/s) | - | - | - | "
              f"{big['fit']:.3f} s | - | "
              f"{1e3 * big['fit'] / big['passes']:.2f} ms | {1e3 * big['loop_pass']:.2f} ms | "
              f"{1e3 * big['gpu_pass']:.2f} ms | {1e3 * big['allgather']:.3f} ms | {big['chained']} | - | "
              f"{big['path']} | "
              f"{big['coef_diff']:.1e} vs the block's own fit | - | - |")  # fmt: skip
        print(f"\nbig table: GPU memory in use per GPU (GB): {', '.join(f'{b / 1e9:.1f}' for b in big['gpu_gb'])}")
    for r in rows_out:
        print(f"read breakdown {r['rows']} on {r['gpus']} GPU(s): {r['breakdown']}; server CPU {r['srv_read']:.3f} "
              f"s/Mrow in the read, {r['srv_copy']:.3f} in the COPY; first fit {r['fit_first']:.3f} s "
              f"(communicator formed in {r['formed']:.3f} s); last fit outside the loop {r['outside']:.4f} s "
              f"(the ranks' preparing {r['prepare']:.4f} s); {r['per_rank']}; "
              f"split: {r.get('split_cpus', 'not run')}")  # fmt: skip


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


def _bigger_than_one_gpu(gpus: int, quick: bool) -> dict | None:
    if os.environ.get("PYSTROM_BENCH_SCALE_BIG_GB", "0.0" if quick else "") in ("0", "0.0"):
        return None
    import cupy
    import distributed

    import pystrom
    import pystrom.dask
    from pystrom.ml import LogisticRegression

    largest = max(cupy.cuda.runtime.getDeviceProperties(i)["totalGlobalMem"] for i in range(gpus))
    target = float(os.environ.get("PYSTROM_BENCH_SCALE_BIG_GB") or 1.07 * largest / 1e9) * 1e9
    t_phase = time.perf_counter()
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
    nbytes = total_rows * _ROW_BYTES
    print(f"  big: {links} names of one {os.path.getsize(first) / 1e9:.1f} GB file, {total_rows:,} rows, "
          f"{nbytes / 1e9:.0f} GB as a Table (largest GPU: {largest / 1e9:.0f} GB); written in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    want = LogisticRegression(max_iter=20, tol=0.0).fit(
        pystrom.Table.from_arrow(block, device="cuda"), columns=_FEATURES, target="t"
    )
    del block
    cupy.get_default_memory_pool().free_all_blocks()  # the client's GPU 0 holds nothing during the big read
    cluster, client = _cluster(gpus, 4, device_memory_limit=0.95)
    try:
        t0 = time.perf_counter()
        parts = pystrom.dask.scan_arrow(paths, columns=["t", *_FEATURES])
        parts = parts.persist()
        distributed.wait(parts)
        t_read = time.perf_counter() - t0
        per_gpu = _per_gpu_bytes(client)
        fits = []
        for _ in range(2):  # the first forms the communicator
            t0 = time.perf_counter()
            model = LogisticRegression(max_iter=20, tol=0.0).fit(parts, columns=_FEATURES, target="t")
            fits.append(time.perf_counter() - t0)
        info = model.fit_info_
        ranks = info.get("ranks") or [{}]
        diff = float(np.max(np.abs(model.coefficients_ - want.coefficients_)))
        big = dict(rows=total_rows, gb=nbytes / 1e9, ratio=nbytes / largest, gpus=gpus, read=t_read, fit=fits[-1],
                   passes=model.n_passes_, path=f"{info['path']}/{info['comm']}", coef_diff=diff, gpu_gb=per_gpu,
                   gpu_pass=max(r.get("pass_s", float("nan")) for r in ranks),
                   allgather=max(r.get("allgather_s", float("nan")) for r in ranks),
                   loop_pass=ranks[0].get("loop_s", float("nan")) / max(1, model.n_passes_),
                   chained=f"{min(r.get('chained', 0) for r in ranks)}/{model.n_passes_} "
                   f"({min(r.get('hits', 0) for r in ranks)} speculative)")  # fmt: skip
        print(f"  big on {gpus} GPUs: scan+persist {t_read:.2f} s ({nbytes / t_read / 1e9:.1f} GB/s), "
              f"{parts.npartitions} partitions; GPU memory in use per GPU (GB): "
              f"{', '.join(f'{b / 1e9:.1f}' for b in per_gpu)}; fit 20 it {fits[-1]:.3f} s (first {fits[0]:.3f} s; "
              f"{model.n_passes_} passes, {info['path']}/{info['comm']}, "
              f"{nbytes * model.n_passes_ / fits[-1] / 1e9:.0f} GB/s over all GPUs); coefficients vs the block's "
              f"own fit: max diff {diff:.1e}; rows counted "
              f"{model.num_rows_processed_:,}; phase {time.perf_counter() - t_phase:.0f} s", flush=True)  # fmt: skip
        assert model.num_rows_processed_ == total_rows, model.num_rows_processed_
        assert diff < 1e-6, diff
        del parts
        return big
    finally:
        client.close()
        cluster.close()
        for p in paths:
            os.unlink(p)
        os.rmdir(tmp)
