"""The Newton loop on GPU workers with NCCL between them (issue 35), on a machine with two or more GPUs.

First NCCL alone (two processes, one GPU each, three all-gathers), so a failure of the library or the
machine shows apart from pystrom's loop; then dask-cuda's LocalCUDACluster (one worker per GPU): the
fit equals the in-memory fit statistic by statistic (narrow and wide, weights, NULLs, penalty,
balanced classes, separation, float32), keeps its communicator between fits, survives a worker killed
mid-fit (the fit restarts) or says clearly why it cannot, and ends a stalled worker's fit by the timeout;
last, workers started as separate ``dask-cuda-worker`` processes over TCP, once as they come and once
with NCCL's shared-memory and peer-to-peer transports off (NCCL then talks as between hosts).

Run: ``NCCL_NVLS_ENABLE=0 bash .gpu/run python -m pytest tests/test_dask_nccl.py -x -q -rs``.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom.errors import ClusterError, CollectiveTimeoutError, DataError
from pystrom.memory.backend import cuda_device_count

from dask_loop_helpers import (
    assert_same_model,
    fit_on,
    logreg_data,
    nccl_pair,
    persist_spread,
    process_cluster,
    rank_killed_mid_fit,
    slow_passes,
    stall_rank,
)

distributed = pytest.importorskip("distributed")
dask_cuda = pytest.importorskip("dask_cuda")

import pystrom.dask as pdask  # noqa: E402
from pystrom.ml import ConvergenceWarning, LogisticRegression, PerfectSeparationWarning  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda_device_count() < 2, reason="needs two CUDA GPUs")]

FEATURES = ["x1", "x2", "x3"]
ROWS = 400_000


def test_nccl_alone_between_two_processes():
    import subprocess

    from pystrom.dask._comm import nccl_library, nccl_module

    print("\nlibnccl loaded from:", nccl_library() or "(CuPy's own search)")
    print("NCCL version:", nccl_module().get_version(), "| NCCL env:",
          {k: v for k, v in os.environ.items() if k.startswith("NCCL_")})  # fmt: skip
    print(subprocess.run(["df", "-h", "/dev/shm"], capture_output=True, text=True).stdout.strip())
    uid = nccl_module().get_unique_id()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=nccl_pair, args=(r, uid, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    for rank in range(2):
        assert isinstance(got[rank], list), got[rank]
        for n, rows in zip((1, 5, 1000), got[rank]):
            np.testing.assert_array_equal(np.array(rows), np.stack([np.arange(n) + 10 * r for r in range(2)]))


@pytest.fixture(scope="module")
def client():
    from dask_cuda import LocalCUDACluster

    cluster = LocalCUDACluster(n_workers=2, threads_per_worker=2, dashboard_address=":0")
    c = distributed.Client(cluster, set_as_default=False)
    c.wait_for_workers(2)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


@pytest.fixture
def timeout():
    with pystrom.defaults.set(dask_fit_timeout=30.0, dask_fit_restarts=2):
        yield


def _persisted(client, path, batch_rows=ROWS // 8):
    with client.as_current():
        return persist_spread(client, pdask.scan_arrow(str(path), batch_rows=batch_rows))


@pytest.fixture(scope="module")
def _arrow_data():
    return logreg_data(ROWS, nulls=True)


@pytest.fixture
def arrow_file(_arrow_data, tmp_path):
    """A file of each test's own: its partitions get keys of their own, so none is the partition an earlier
    test left on the one worker that survived a kill (persisting the same keys again keeps that placement)."""
    path = tmp_path / "logreg.arrow"
    pystrom.write_arrow(_arrow_data, path, batch_rows=ROWS // 16)
    return path


CONFIGS = {
    "plain": dict(),
    "weights": dict(sample_weight="w"),
    "balanced": dict(class_weight="balanced"),
    "l2": dict(penalty="l2", C=0.05),
    "tol-0": dict(max_iter=15, tol=0.0),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_the_nccl_fit_equals_the_in_memory_fit(client, timeout, arrow_file, config):
    parts = _persisted(client, arrow_file)
    kw = dict(CONFIGS[config])
    weight = kw.pop("sample_weight", None)
    table = pystrom.read_arrow(arrow_file, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        want = LogisticRegression(**kw).fit(table, columns=FEATURES, target="y", sample_weight=weight)
        got = fit_on(client, parts, columns=FEATURES, target="y", sample_weight=weight, **kw)
    info = got.fit_info_
    assert (info["path"], info["comm"], info["workers"]) == ("workers", "nccl", 2), info
    assert all(r["rows"] > 0 for r in info["ranks"]), info  # the partitions are on both GPUs
    # every pass after the first queued on the GPU behind the all-gather and the step (dask/_chain.py)
    assert all(r["chained"] == info["passes"] - 1 for r in info["ranks"]), info
    assert_same_model(got, want)


def _chain(on: bool) -> None:
    from pystrom.dask import _rank_source

    _rank_source.CHAIN = on


def test_the_chained_passes_equal_the_host_exchanges(client, timeout, arrow_file):
    """The chain (each pass's all-gather and step queued on the GPU, the next pass speculatively behind
    them) against every pass through the host, on the same partitions: the same model, and the speculative
    passes were the ones the solver asked for."""
    parts = _persisted(client, arrow_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        chained = fit_on(client, parts, columns=FEATURES, target="y", max_iter=12, tol=0.0)
        client.run(_chain, False)
        try:
            host = fit_on(client, parts, columns=FEATURES, target="y", max_iter=12, tol=0.0)
        finally:
            client.run(_chain, True)
    ranks = chained.fit_info_["ranks"]
    assert all(r["chained"] == chained.n_passes_ - 1 and r["hits"] >= chained.n_passes_ - 3 for r in ranks), ranks
    assert all(r["chained"] == 0 for r in host.fit_info_["ranks"]), host.fit_info_
    assert_same_model(chained, host)


def test_wide_float32_and_separated_fits_over_nccl(client, timeout, tmp_path):
    cols = [f"x{j}" for j in range(1, 13)]
    data = logreg_data(ROWS // 2, k=12)
    path = tmp_path / "wide.arrow"
    pystrom.write_arrow(data, path, batch_rows=ROWS // 16)
    parts = _persisted(client, path, batch_rows=ROWS // 8)
    with pystrom.defaults.set(logit_hessian="float64"):  # the workers' passes are float64
        want = LogisticRegression(tol=1e-10).fit(pystrom.read_arrow(path, device="cuda"), columns=cols, target="y")
    got = fit_on(client, parts, columns=cols, target="y", tol=1e-10)
    assert got.fit_info_["comm"] == "nccl"
    assert_same_model(got, want)

    f32 = pa.table({c: data.column(c).cast(pa.float32()) for c in FEATURES} | {"y": data.column("y")})
    path32 = tmp_path / "f32.arrow"
    pystrom.write_arrow(f32, path32, batch_rows=ROWS // 16)
    parts32 = _persisted(client, path32)
    want = LogisticRegression().fit(pystrom.read_arrow(path32, device="cuda"), columns=FEATURES, target="y")
    got = fit_on(client, parts32, columns=FEATURES, target="y")
    assert got.fit_info_["comm"] == "nccl"
    # float32 sigmoids and logs: the passes' sums in another order round apart, and the stopping rule
    # reads changes at that rounding, so the iterations may differ by one; the fit agrees to its precision
    np.testing.assert_allclose(got.coefficients_, want.coefficients_, rtol=1e-6)
    np.testing.assert_allclose(got.std_err_, want.std_err_, rtol=1e-6)

    rng = np.random.default_rng(5)
    X = rng.normal(size=(60_000, 2))
    sep = tmp_path / "sep.arrow"
    pystrom.write_arrow(pa.table({"x1": X[:, 0], "x2": X[:, 1], "y": X[:, 0] + 0.5 * X[:, 1] > 0.2}), sep,
                        batch_rows=7_500)  # fmt: skip
    parts_sep = _persisted(client, sep, batch_rows=15_000)
    with pytest.warns(PerfectSeparationWarning):
        want = LogisticRegression().fit(pystrom.read_arrow(sep, device="cuda"), columns=["x1", "x2"], target="y")
    with pytest.warns(PerfectSeparationWarning):
        got = fit_on(client, parts_sep, columns=["x1", "x2"], target="y")
    assert got.separation_ == want.separation_ == "complete" and got.fit_info_["comm"] == "nccl"


def test_a_nan_is_named_and_the_communicator_is_kept(client, timeout, tmp_path):
    data = logreg_data(100_000)
    x2 = data.column("x2").to_numpy().copy()
    x2[99_000] = np.nan
    bad = tmp_path / "nan.arrow"
    pystrom.write_arrow(data.set_column(2, "x2", pa.array(x2)), bad, batch_rows=12_500)
    good = tmp_path / "good.arrow"
    pystrom.write_arrow(data, good, batch_rows=12_500)
    parts_good = _persisted(client, good, batch_rows=12_500)
    first = fit_on(client, parts_good, columns=FEATURES, target="y")
    assert first.fit_info_["comm"] == "nccl", first.fit_info_
    t0 = time.monotonic()
    with pytest.raises(DataError, match="'x2'"):
        fit_on(client, _persisted(client, bad, batch_rows=12_500), columns=FEATURES, target="y")
    assert time.monotonic() - t0 < 10
    again = fit_on(client, parts_good, columns=FEATURES, target="y")
    # over NCCL the rank that found the NaN leaves the other inside its all-gather, which only an abort of the
    # communicator ends (on the H200s it was not reused); the TCP twin keeps it (test_dask_loop.py)
    assert again.fit_info_["comm"] == "nccl", again.fit_info_
    np.testing.assert_array_equal(again.coefficients_, first.coefficients_)
    print("\nper pass on each GPU (s):", [(r["pass_s"], r["allgather_s"]) for r in again.fit_info_["ranks"]],
          "formed:", [r["formed_s"] for r in first.fit_info_["ranks"]])  # fmt: skip


def test_a_worker_killed_mid_fit_restarts_the_nccl_fit(client, timeout, arrow_file):
    parts = _persisted(client, arrow_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        want = LogisticRegression(max_iter=30, tol=0.0).fit(pystrom.read_arrow(arrow_file, device="cuda"),
                                                             columns=FEATURES, target="y")  # fmt: skip
    with rank_killed_mid_fit(client, passes=4) as killed:
        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            got = fit_on(client, parts, columns=FEATURES, target="y", max_iter=30, tol=0.0)
        took = time.monotonic() - t0
    assert killed, "the fit ended before a worker could be killed"
    assert got.fit_info_["restarts"] == 1, got.fit_info_
    assert_same_model(got, want)
    assert took < 30 + 60, took
    client.wait_for_workers(2, timeout=120)


def test_a_worker_killed_mid_fit_without_restarts_is_a_clear_error(client, timeout, arrow_file):
    parts = _persisted(client, arrow_file)
    with rank_killed_mid_fit(client, passes=3) as killed:
        t0 = time.monotonic()
        with pystrom.defaults.set(dask_fit_restarts=0), pytest.raises(ClusterError) as info:
            fit_on(client, parts, columns=FEATURES, target="y", max_iter=30, tol=0.0)
        took = time.monotonic() - t0
    assert killed and killed["address"] in str(info.value)
    assert took < 30, took  # within the timeout: the client cancels the survivor's all-gather
    client.wait_for_workers(2, timeout=120)


def test_a_stalled_gpu_worker_times_out_and_the_next_fit_works(client, arrow_file):
    parts = _persisted(client, arrow_file)
    client.run(stall_rank, 1, 2)
    try:
        t0 = time.monotonic()
        with pystrom.defaults.set(dask_fit_timeout=5.0, dask_fit_restarts=0):
            with pytest.raises(CollectiveTimeoutError, match="dask_fit_timeout"):
                fit_on(client, parts, columns=FEATURES, target="y")
        took = time.monotonic() - t0
    finally:
        client.run(slow_passes, 0.0)
    assert took < 5 + 15, took
    got = fit_on(client, parts, columns=FEATURES, target="y")
    assert got.fit_info_["comm"] == "nccl" and not got.fit_info_["comm_reused"]


def test_a_timed_out_exchange_restarts_the_nccl_fit_on_the_same_workers(client, arrow_file):
    parts = _persisted(client, arrow_file)
    want = LogisticRegression().fit(pystrom.read_arrow(arrow_file, device="cuda"), columns=FEATURES, target="y")
    client.run(stall_rank, 1, 2, 0)  # rank 1 hangs in the first attempt only
    try:
        with pystrom.defaults.set(dask_fit_timeout=5.0, dask_fit_restarts=1):
            got = fit_on(client, parts, columns=FEATURES, target="y")
    finally:
        client.run(slow_passes, 0.0)
    info = got.fit_info_
    assert (info["restarts"], info["comm"], info["workers"]) == (1, "nccl", 2), info
    assert_same_model(got, want)


def test_workers_sharing_a_gpu_keep_the_clients_loop(arrow_file):
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    with distributed.Client(cluster, set_as_default=False) as c:
        parts = _persisted(c, arrow_file)
        got = fit_on(c, parts, columns=FEATURES, target="y")
    cluster.close()
    assert got.fit_info_["path"] == "client" and "share a GPU" in got.fit_info_["reason"], got.fit_info_


@pytest.mark.parametrize("transports", ["as-they-come", "network-only"])
def test_nccl_fit_with_dask_cuda_workers_started_as_processes_over_tcp(arrow_file, transports):
    n = min(4, cuda_device_count())
    env = {}
    if transports == "network-only":  # no NVLink/PCIe peer access, no shared memory: NCCL as between hosts
        env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}
    want = LogisticRegression().fit(pystrom.read_arrow(arrow_file, device="cuda"), columns=FEATURES, target="y")
    with process_cluster(n, gpu=True, env=env, nthreads=2) as c:
        parts = _persisted(c, arrow_file, batch_rows=ROWS // 16)
        got = fit_on(c, parts, columns=FEATURES, target="y")
        pids = c.run(os.getpid)
    assert len(set(pids.values())) == n and all(a.startswith("tcp://") for a in pids)
    assert (got.fit_info_["path"], got.fit_info_["comm"], got.fit_info_["workers"]) == ("workers", "nccl", n)
    assert_same_model(got, want)
