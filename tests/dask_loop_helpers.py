"""Shared by the tests of the Newton loop on the workers (test_dask_loop.py on CPU workers over TCP,
test_dask_nccl.py on GPU workers over NCCL): data, the model comparison, slowing the workers' passes,
killing a rank's worker mid-fit, and a cluster of separately started processes.

Functions sent to the workers are pickled by value (the workers cannot import the tests' modules).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pyarrow as pa

cloudpickle.register_pickle_by_value(sys.modules[__name__])

COEF = np.array([1.2, -0.7, 0.4])
STATS = ["coefficients_", "std_err_", "z_stats_", "p_values_", "odds_ratios_", "variance_covariance_"]


def logreg_data(n: int = 6000, seed: int = 7, k: int = 3, nulls: bool = False) -> pa.Table:
    """id, x1..xk (normal), w (a positive weight), y (logistic in the first three features)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k))
    coef = np.resize(COEF, k) / np.sqrt(max(1, k // 3))
    y = rng.random(n) < 1 / (1 + np.exp(-(X @ coef + 0.3)))
    cols = {"id": np.arange(n, dtype=np.int64)}
    for j in range(k):
        cols[f"x{j + 1}"] = pa.array(X[:, j], mask=(np.arange(n) % 97 == j) if nulls else None)
    cols["w"] = rng.uniform(0.5, 2.0, size=n)
    cols["y"] = y
    return pa.table(cols)


def assert_same_model(got, want, rtol: float = 1e-9) -> None:
    """Every coefficient and statistic of ``got`` equals ``want``'s to ``rtol``; counts exactly."""
    for name in STATS:
        a, b = getattr(got, name), getattr(want, name)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-300 if name == "p_values_" else 1e-12, err_msg=name)
    assert got.log_likelihood_ == __import__("pytest").approx(want.log_likelihood_, rel=rtol)
    assert got.condition_no_ == __import__("pytest").approx(want.condition_no_, rel=1e-6)
    assert (got.n_iter_, got.n_passes_, got.converged_, got.separation_) == (
        want.n_iter_,
        want.n_passes_,
        want.converged_,
        want.separation_,
    )
    assert (got.num_rows_processed_, got.num_missing_rows_skipped_) == (
        want.num_rows_processed_,
        want.num_missing_rows_skipped_,
    )
    assert list(got.aliased_) == list(want.aliased_)


def _pass_hook():
    """RankSource._run as it was (every pass of a rank goes through it, chained on the GPU or not)."""
    from pystrom.dask._rank_source import RankSource

    original = RankSource.__dict__.get("_unslowed", RankSource._run)
    RankSource._unslowed = original
    return RankSource, original


def slow_passes(pause: float) -> None:
    """On a worker: each pass of its ranks sleeps ``pause`` s first (0: as it was)."""
    source, original = _pass_hook()
    if not pause:
        source._run = original
        return

    def run(self, w, first):
        time.sleep(pause)
        return original(self, w, first)

    source._run = run


def stall_rank(rank: int, after: int, attempt: int | None = None) -> None:
    """On a worker: rank ``rank``'s pass number ``after`` + 1 (in attempt ``attempt`` of the fit only, or
    in every one) does not start until the client cancels the attempt (as a hung worker would not end at
    all), so the other ranks wait for it at the exchange."""
    from pystrom.dask import _rank

    source, original = _pass_hook()
    seen = {"n": 0}

    def run(self, w, first):
        mine = [s for s in _rank.status() if s["rank"] == rank and attempt in (None, s["attempt"])]
        if mine:
            seen["n"] += 1
            if seen["n"] > after:
                _rank.cancel_event(mine[0]["fit"], mine[0]["attempt"]).wait(600)
        return original(self, w, first)

    source._run = run


def kill_when(client, rank: int, passes: int, found: dict, timeout: float = 60.0) -> threading.Thread:
    """A thread that SIGKILLs the worker process of ``rank`` once a running fit has made ``passes``
    passes; what it killed goes into ``found`` (keys "address", "pid", "status")."""
    from pystrom.dask import _rank

    def watch() -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                seen = [s for v in client.run(_rank.status).values() for s in v]
            except Exception:  # noqa: BLE001 - a worker restarting
                seen = []
            mine = [s for s in seen if s["rank"] == rank]
            if mine and max(s["passes"] for s in seen) >= passes:
                address = mine[0]["address"]
                pid = client.run(os.getpid, workers=[address])[address]
                found.update(address=address, pid=pid, status=mine[0])
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, name="kill-a-rank", daemon=True)
    thread.start()
    return thread


def fit_on(client, X, **kw):
    """``LogisticRegression(**kw).fit(X, ...)`` with ``client`` current (``columns``, ``target`` and
    ``sample_weight`` go to fit, the rest to the estimator)."""
    from pystrom.ml import LogisticRegression

    fit_kw = {k: kw.pop(k) for k in ("columns", "target", "sample_weight") if k in kw}
    with client.as_current():
        return LogisticRegression(**kw).fit(X, **fit_kw)


@contextlib.contextmanager
def rank_killed_mid_fit(client, passes: int, rank: int = 1, pause: float = 0.05):
    """Around a fit: every rank's passes slowed by ``pause`` s, and the worker of ``rank`` SIGKILLed
    once the fit has made ``passes`` passes (:func:`kill_when`); yields the dict of what was killed.
    Passes run at full speed again afterwards, whatever happened."""
    client.run(slow_passes, pause)
    killed: dict = {}
    try:
        watcher = kill_when(client, rank=rank, passes=passes, found=killed)
        yield killed
        watcher.join(5)
    finally:
        client.run(slow_passes, 0.0)


@contextlib.contextmanager
def process_cluster(n: int, gpu: bool, env: dict | None = None, nthreads: int = 1):
    """A scheduler and ``n`` workers, each a process started from the command line (``dask-cuda-worker``
    with one GPU each when ``gpu``, else ``dask worker``), over TCP on this host; yields a Client."""
    import distributed

    procs = []
    with tempfile.TemporaryDirectory(prefix="pystrom-cluster-") as tmp:
        sched_file = str(Path(tmp) / "scheduler.json")
        base = {**os.environ, **(env or {})}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--protocol", "tcp", "--no-dashboard", "--scheduler-file", sched_file],
            env=base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
        try:
            end = time.monotonic() + 60
            while not Path(sched_file).exists():
                if time.monotonic() > end or procs[0].poll() is not None:
                    why = procs[0].stderr.read() if procs[0].poll() is not None else "no scheduler file in 60 s"
                    raise RuntimeError(f"the scheduler did not start: {why}")
                time.sleep(0.1)
            for i in range(n):
                if gpu:
                    cmd = [sys.executable, "-c", "import sys; from dask_cuda.cli import worker; "
                           "sys.exit(worker.main(prog_name='dask-cuda-worker'))"]  # fmt: skip
                    wenv = {**base, "CUDA_VISIBLE_DEVICES": str(i)}
                else:
                    cmd = [sys.executable, "-m", "distributed.cli.dask_worker"]
                    wenv = base
                cmd += ["--scheduler-file", sched_file, "--nthreads", str(nthreads), "--no-dashboard",
                        "--memory-limit", "2GiB", "--local-directory", str(Path(tmp) / f"w{i}")]  # fmt: skip
                cmd += ["--host", "127.0.0.1"]
                log = open(Path(tmp) / f"worker{i}.log", "w")  # noqa: SIM115 - closed with the process
                procs.append(subprocess.Popen(cmd, env=wenv, stdout=log, stderr=subprocess.STDOUT))
            client = distributed.Client(scheduler_file=sched_file, set_as_default=False)
            try:
                try:
                    client.wait_for_workers(n, timeout=120)
                except Exception as exc:
                    logs = "\n".join(f"--- worker {i}:\n" + (Path(tmp) / f"worker{i}.log").read_text()[-3000:]
                                      for i in range(n))  # fmt: skip
                    raise RuntimeError(f"{n} workers did not join: {exc}\n{logs}") from exc
                yield client
            finally:
                client.close()
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in reversed(procs):
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def nccl_pair(rank: int, uid: bytes, out) -> None:
    """In a process of its own: rank ``rank`` of two forms an NCCL communicator on GPU ``rank`` and
    all-gathers three vectors; puts what it received (or the error) on queue ``out``."""
    import threading

    from pystrom.dask._comm import NcclComm

    try:
        comm = NcclComm(uid, rank, 2, ["p0", "p1"], rank, 60.0, threading.Event())
        got = [comm.allgather(np.arange(n, dtype=np.float64) + 10 * rank).tolist() for n in (1, 5, 1000)]
        comm.close()
        out.put((rank, got))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put((rank, f"{type(exc).__name__}: {exc}"))


def persist_spread(client, collection):
    """``collection`` persisted with its partitions alternately on the client's workers (a preference, so a
    partition lost with its worker is recomputed on another). Left to the scheduler, a loaded machine put
    them all on one worker now and then, and the fit then ran on one rank where a test asked for several."""
    import dask
    import distributed

    workers = sorted(client.scheduler_info()["workers"])
    place = {k: [workers[i % len(workers)]] for i, k in enumerate(collection.__dask_keys__())}
    with client.as_current(), dask.annotate(workers=lambda k: place.get(k, workers), allow_other_workers=True):
        parts = collection.persist()
    distributed.wait(parts)
    return parts
