"""pystrom on Dask: the logreg table from PostgreSQL -> persisted on the workers -> 20-iteration fit.

Against, in the same run: the single-process pystrom path (``pystrom.read_postgres`` + the in-memory fit:
the difference is Dask's overhead, printed per stage and per pass), and dask's own route
(``dask.dataframe.read_sql_table`` + dask-glm's Newton solver, 20 iterations) on CPU workers.

The cluster: on a GPU, dask-cuda's LocalCUDACluster with one worker (``PYSTROM_BENCH_DASK_WORKERS=2``:
two worker processes sharing GPU 0, the partitions on it); on the CPU a LocalCluster of two processes.
The table (``PYSTROM_BENCH_DASK_ROWS``, default 40M; quick 500k) has the seed's columns with 10% of
the labels flipped so that the fit has an optimum. dask's route reads through pandas and is slow, so it
runs on a table of ``PYSTROM_BENCH_DASK_BASELINE_ROWS`` rows (default 4M; quick the same 500k), where
pystrom.dask is timed again for the ratio.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from bench_postgres import _load

from _harness import Result, measure_pair

_FEATURES = ["x1", "x2", "x3", "x4"]


def _cluster(device: str, workers: int) -> tuple[Any, str]:
    import distributed

    # As many threads in all as the single-process read opens connections (16 at most): every thread
    # reads one partition at a time, so npartitions=None gives one partition per thread or more.
    threads = max(1, min(16, os.cpu_count() or 1) // workers)
    if device.startswith("cuda"):
        if workers == 1:
            try:
                from dask_cuda import LocalCUDACluster

                return LocalCUDACluster(n_workers=1, threads_per_worker=threads, dashboard_address=":0"), "cuda"
            except ImportError:
                print("  dask_cuda is not installed: a LocalCluster worker on GPU 0 instead")
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=threads, dashboard_address=":0")
        return cluster, "cuda"
    return distributed.LocalCluster(n_workers=workers, threads_per_worker=threads, dashboard_address=":0"), "cpu"


def run(device: str, quick: bool) -> list[Result]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: the fits stop at 20 iterations on purpose
        return _run(device, quick)


def _run(device: str, quick: bool) -> list[Result]:
    try:
        import distributed
        import psycopg  # noqa: F401
        from fix_pg import PgCluster, _find_bindir

        import pystrom.dask
    except ImportError as exc:
        print(f"bench_dask: skipped ({exc}); pip install 'pystrom[dask]'")
        return []
    bindir = _find_bindir()
    if bindir is None:
        print("bench_dask: skipped (no PostgreSQL binaries and no pgserver)")
        return []
    import pystrom
    from pystrom.ml import LogisticRegression

    rows = int(os.environ.get("PYSTROM_BENCH_DASK_ROWS", 500_000 if quick else 40_000_000))
    base_rows = int(os.environ.get("PYSTROM_BENCH_DASK_BASELINE_ROWS", rows if quick else 4_000_000))
    workers = int(os.environ.get("PYSTROM_BENCH_DASK_WORKERS", 1 if device.startswith("cuda") else 2))
    repeat = 3 if quick else 2
    pg = PgCluster(bindir)
    results: list[Result] = []
    try:
        conninfo = pg.conninfo
        start = time.perf_counter()
        cores = max(1, min(16, os.cpu_count() or 1))
        _load(conninfo, rows, cores, "logreg", with_id=True, noise=0.1)
        if base_rows != rows:
            _load(conninfo, base_rows, cores, "logreg_base", with_id=True, noise=0.1)
        print(f"  logreg: {rows:,} rows (+ {base_rows:,} for dask's route) in {time.perf_counter() - start:.1f} s")
        cluster, wdev = _cluster(device, workers)
        client = distributed.Client(cluster)
        try:
            print(f"  cluster: {type(cluster).__name__}, {workers} worker(s), partitions on {wdev}")
            results += _ours_vs_single(pystrom, LogisticRegression, client, conninfo, "logreg", rows, wdev, device,
                                       workers, repeat)  # fmt: skip
            results += _ours_vs_dask_glm(pystrom, LogisticRegression, pg, "logreg" if base_rows == rows else
                                         "logreg_base", base_rows, wdev, workers)  # fmt: skip
        finally:
            client.close()
            cluster.close()
    finally:
        pg.destroy()
    return results


def _ours_vs_single(pystrom, LogisticRegression, client, conninfo, table, rows, wdev, device, workers, repeat):
    import distributed

    label = f"{rows / 1e6:g}M"
    stages: dict[str, list[float]] = {"read+persist": [], "fit": [], "passes": [], "partitions": []}
    single: dict[str, list[float]] = {"read": [], "fit": [], "passes": []}

    def ours():
        t0 = time.perf_counter()
        with pystrom.dask.read_postgres(conninfo, table=table, columns=["t", *_FEATURES], device=wdev) as parts:
            parts = parts.persist()
            distributed.wait(parts)
        t1 = time.perf_counter()
        stages["partitions"].append(parts.npartitions)
        model = LogisticRegression(max_iter=20, tol=0.0).fit(parts, columns=_FEATURES, target="t")
        stages["read+persist"].append(t1 - t0)
        stages["fit"].append(time.perf_counter() - t1)
        stages["passes"].append(model.n_passes_)
        del parts
        return model

    def one_process():
        t0 = time.perf_counter()
        data = pystrom.read_postgres(conninfo, table=table, columns=["t", *_FEATURES], device=device)
        t1 = time.perf_counter()
        model = LogisticRegression(max_iter=20, tol=0.0).fit(data, columns=_FEATURES, target="t")
        single["read"].append(t1 - t0)
        single["fit"].append(time.perf_counter() - t1)
        single["passes"].append(model.n_passes_)
        return model

    t_ours, t_single = measure_pair(ours, one_process, lambda: None, repeat)
    m_ours, m_single = ours(), one_process()
    same = abs(m_ours.coefficients_ - m_single.coefficients_).max()
    med = {k: sorted(v)[len(v) // 2] for k, v in stages.items()}
    med1 = {k: sorted(v)[len(v) // 2] for k, v in single.items()}
    passes = int(med["passes"])
    per_pass, per_pass1 = med["fit"] / passes, med1["fit"] / max(1, med1["passes"])
    print(
        f"  pg {label} -> {workers} worker(s), {int(med['partitions'])} partitions: read+persist "
        f"{med['read+persist']:.3f} s (one process: read "
        f"{med1['read']:.3f} s), fit {med['fit']:.3f} s for {passes} passes (one process {med1['fit']:.3f} s); "
        f"per pass {per_pass * 1e3:.2f} ms vs {per_pass1 * 1e3:.2f} ms: Dask's overhead "
        f"{1e3 * (per_pass - per_pass1):.2f} ms a pass (a round trip to each worker holding partitions, the "
        f"sums back); total "
        f"x{t_ours / t_single:.2f} of one process (goal <= 1.3); coefficients differ by {same:.1e}"
    )
    nbytes = rows * (1 + 4 * 8)
    return [
        Result(
            f"dask pg {label} -> persist -> fit 20", "one process: read_postgres + fit 20", t_ours, t_single, nbytes
        ),
        Result(f"dask fit 20 on persisted {label}", "one process: in-memory fit 20", med["fit"], med1["fit"], nbytes),
    ]


def _ours_vs_dask_glm(pystrom, LogisticRegression, pg, table, rows, wdev, workers):
    import distributed

    try:
        import dask.dataframe as dd
        import sqlalchemy  # noqa: F401
        from dask_glm.algorithms import newton
        from dask_glm.families import Logistic
    except ImportError as exc:
        print(f"  dask's route (read_sql_table + dask-glm) not measured: {exc}")
        return []
    import dask.array as da
    import dask_glm.algorithms
    import numpy as np

    # dask-glm 0.3.2 (its last release) tests `if arr:` on the empty _meta array, an error since NumPy 2:
    # its starting point is zeros of the features' width, so give it exactly that.
    dask_glm.algorithms.zeros = lambda shape, arr=None: np.zeros(shape)
    label = f"{rows / 1e6:g}M"
    uri = f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/postgres"
    nparts = max(2, workers * 4)

    def ours():
        with pystrom.dask.read_postgres(pg.conninfo, table=table, columns=["t", *_FEATURES], device=wdev) as parts:
            parts = parts.persist()
            distributed.wait(parts)
        return LogisticRegression(max_iter=20, tol=0.0).fit(parts, columns=_FEATURES, target="t")

    def dask_route():
        ddf = dd.read_sql_table(table, uri, index_col="id", npartitions=nparts, columns=["t", *_FEATURES])
        ddf = ddf.persist()
        X = ddf[_FEATURES].to_dask_array(lengths=True)
        X = da.concatenate([X, da.ones((X.shape[0], 1), chunks=(X.chunks[0], 1))], axis=1).persist()
        y = ddf["t"].astype("float64").to_dask_array(lengths=True).persist()
        return newton(X, y, max_iter=20, tol=0.0, family=Logistic)

    t0 = time.perf_counter()
    theirs = dask_route()
    t_theirs = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = ours()
    t_ours = time.perf_counter() - t0
    ref = [float(theirs[-1]), *map(float, theirs[:-1])]
    diff = max(abs(a - b) for a, b in zip(model.coefficients_, ref))
    print(
        f"  dask's route on {label}: {t_theirs:.2f} s, pystrom.dask {t_ours:.2f} s; coefficients differ by {diff:.1e}"
    )
    return [
        Result(
            f"dask pg {label} -> persist -> fit 20",
            "dask read_sql_table + dask-glm newton 20 it (CPU workers)",
            t_ours,
            t_theirs,
            rows * (1 + 4 * 8),
        )
    ]
