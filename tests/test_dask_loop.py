"""The Newton loop on the workers (issue 35) on CPU workers: the loop GPU workers run over NCCL, here
over the TCP communicator, on a LocalCluster of worker processes; a worker killed mid-fit; a worker
that stalls; the choice of the path; workers started as separate processes. Every fit is compared with
the in-memory fit of the same rows, statistic by statistic (test_dask_nccl.py runs the same on GPUs).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom.errors import ClusterError, CollectiveTimeoutError, DataError, PostgresError

from dask_loop_helpers import (
    assert_same_model,
    fit_on,
    logreg_data,
    persist_spread,
    process_cluster,
    rank_killed_mid_fit,
    slow_passes,
    stall_rank,
)

distributed = pytest.importorskip("distributed")

import pystrom.dask as pdask  # noqa: E402
from pystrom.ml import ConvergenceWarning, LogisticRegression, PerfectSeparationWarning, logregr_train  # noqa: E402

FEATURES = ["x1", "x2", "x3"]


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", memory_limit="2GiB"
    )
    c = distributed.Client(cluster, set_as_default=False)
    c.wait_for_workers(2)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


@pytest.fixture
def on_workers():
    with pystrom.defaults.set(dask_fit_loop="workers", dask_fit_timeout=20.0, dask_fit_restarts=2):
        yield


def _persisted(client, path, batch_rows=1000, **kw):
    with client.as_current():
        return persist_spread(client, pdask.scan_arrow(str(path), batch_rows=batch_rows, device="cpu", **kw))


def _write(tmp_path, data, name="data.arrow", batch_rows=500):
    path = tmp_path / name
    pystrom.write_arrow(data, path, batch_rows=batch_rows)
    return path


CONFIGS = {
    "plain": dict(),
    "weights": dict(sample_weight="w"),
    "balanced": dict(class_weight="balanced"),
    "class-dict": dict(class_weight={True: 2.0}),
    "l2": dict(penalty="l2", C=0.05),
    "no-intercept": dict(fit_intercept=False),
    "max-iter": dict(max_iter=2),
    "tol-0": dict(max_iter=12, tol=0.0),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_the_loop_on_the_workers_equals_the_in_memory_fit(client, on_workers, tmp_path, config):
    path = _write(tmp_path, logreg_data(nulls=True))
    parts = _persisted(client, path)
    table = pystrom.read_arrow(path, device="cpu")
    kw = dict(CONFIGS[config])
    weight = kw.pop("sample_weight", None)
    with warnings.catch_warnings(record=True) as want_warned:
        warnings.simplefilter("always")
        want = LogisticRegression(**kw).fit(table, columns=FEATURES, target="y", sample_weight=weight)
    with warnings.catch_warnings(record=True) as got_warned:
        warnings.simplefilter("always")
        got = fit_on(client, parts, columns=FEATURES, target="y", sample_weight=weight, **kw)
    info = got.fit_info_
    assert (info["path"], info["comm"], info["workers"], info["restarts"]) == ("workers", "tcp", 2, 0), info
    assert info["partitions"] == parts.npartitions and sum(r["rows"] for r in info["ranks"]) == want.num_rows_processed_
    assert want.num_missing_rows_skipped_ > 0  # NULL features: rows skipped on the workers, counted once
    assert_same_model(got, want)
    # the solver's warnings (the fits that stop at max_iter) reach the client as in one process
    assert sorted(str(w.category.__name__) for w in got_warned) == sorted(w.category.__name__ for w in want_warned)
    if config == "max-iter":
        assert any(issubclass(w.category, ConvergenceWarning) for w in got_warned)


def test_wide_fit_madlib_rule_and_dask_arrays_on_the_workers(client, on_workers, tmp_path):
    data = logreg_data(4000, k=12)
    path = _write(tmp_path, data)
    parts = _persisted(client, path)
    table = pystrom.read_arrow(path, device="cpu")
    cols = [f"x{j}" for j in range(1, 13)]
    with pystrom.defaults.set(logit_hessian="float64"):  # the workers' passes are float64 (so the fit's)
        want = LogisticRegression(tol=1e-10).fit(table, columns=cols, target="y")
    got = fit_on(client, parts, columns=cols, target="y", tol=1e-10)
    assert got.fit_info_["path"] == "workers"
    assert_same_model(got, want)

    want = logregr_train(table, "y", "ARRAY[x1, 1, x2]")
    with client.as_current():
        got = logregr_train(parts, "y", "ARRAY[x1, 1, x2]")
    assert got.fit_info_["path"] == "workers" and got.n_iter_ == want.n_iter_
    assert_same_model(got, want)

    # dask arrays whose blocks of X, y and weights sit together (made from the same partitions)
    with client.as_current():
        Xd = parts.to_dask_array(FEATURES)
        yd = parts.to_dask_array(["y"], dtype=np.float64)[:, 0]
        wd = parts.to_dask_array(["w"])[:, 0]
        Xd, yd, wd = client.persist([Xd, yd, wd])
        distributed.wait([Xd, yd, wd])
        got = LogisticRegression().fit(Xd, yd, wd)
        X, y, sw = (np.asarray(a.compute()) for a in (Xd, yd, wd))
    want = LogisticRegression().fit(X, y, sw)
    assert got.fit_info_["path"] == "workers", got.fit_info_
    assert_same_model(got, want)


def test_separation_is_judged_on_the_workers_as_in_memory(client, on_workers, tmp_path):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(3000, 2))
    y = X[:, 0] + 0.5 * X[:, 1] > 0.2  # a hyperplane: complete separation
    path = _write(tmp_path, pa.table({"x1": X[:, 0], "x2": X[:, 1], "y": y}))
    parts = _persisted(client, path)
    table = pystrom.read_arrow(path, device="cpu")
    with pytest.warns(PerfectSeparationWarning):
        want = LogisticRegression().fit(table, columns=["x1", "x2"], target="y")
    with pytest.warns(PerfectSeparationWarning):
        got = fit_on(client, parts, columns=["x1", "x2"], target="y")
    assert got.separation_ == want.separation_ == "complete" and got.fit_info_["path"] == "workers"
    assert (got.n_iter_, got.n_passes_) == (want.n_iter_, want.n_passes_)
    np.testing.assert_allclose(got.coefficients_, want.coefficients_, rtol=1e-9)


def test_a_nan_is_named_from_its_worker_and_the_communicator_survives(client, on_workers, tmp_path):
    data = logreg_data(4000)
    x2 = data.column("x2").to_numpy().copy()
    x2[3500] = np.nan  # in the last partition: one worker's
    path = _write(tmp_path, data.set_column(2, "x2", pa.array(x2)))
    parts = _persisted(client, path)
    t0 = time.monotonic()
    with pytest.raises(DataError, match="'x2'"):
        fit_on(client, parts, columns=FEATURES, target="y")
    assert time.monotonic() - t0 < 10  # every rank stopped at the same exchange: nobody waited for a timeout
    good = _persisted(client, _write(tmp_path, logreg_data(4000), "good.arrow"))
    first = fit_on(client, good, columns=FEATURES, target="y")
    again = fit_on(client, good, columns=FEATURES, target="y")
    assert again.fit_info_["comm_reused"] and again.fit_info_["ranks"][1]["formed_s"] == 0.0
    np.testing.assert_array_equal(again.coefficients_, first.coefficients_)


def _forget_communicators() -> int:
    """On a worker: drop every idle communicator it keeps (as another fit's forming one would)."""
    from pystrom.dask import _rank

    with _rank._LOCK:
        idle = [k for k, v in _rank._COMMS.items() if not v.busy]
        gone = [_rank._COMMS.pop(k) for k in idle]
    for kept in gone:
        kept.comm.abort()
    return len(gone)


def test_a_communicator_gone_since_the_last_fit_is_formed_again_without_a_restart(client, on_workers, tmp_path):
    """The second fit over the same partitions takes the workers' answers from the first (no probe) and
    the communicator kept since; when one worker no longer keeps it, the fit asks again, forms a new one
    and ends with the same model, no restart counted."""
    from pystrom.dask import _loop

    parts = _persisted(client, _write(tmp_path, logreg_data(4000)))
    first = fit_on(client, parts, columns=FEATURES, target="y")
    remembered = []  # per attempt: whether the workers' answers came from an earlier fit
    real = _loop._WorkerFit._choose

    def spied(self, plan):
        choice = real(self, plan)
        remembered.append(choice.remembered)
        return choice

    _loop._WorkerFit._choose = spied
    try:
        again = fit_on(client, parts, columns=FEATURES, target="y")
        assert again.fit_info_["comm_reused"] and remembered == [True], "the answers and communicator are reused"
        workers = sorted(client.scheduler_info()["workers"])
        assert client.run(_forget_communicators, workers=[workers[1]])[workers[1]] >= 1
        third = fit_on(client, parts, columns=FEATURES, target="y")
    finally:
        _loop._WorkerFit._choose = real
    assert remembered == [True, True, False], "the workers were asked again once the communicator was gone"
    info = third.fit_info_
    assert info["path"] == "workers" and info["restarts"] == 0 and not info["comm_reused"], info
    assert_same_model(third, first, rtol=0)


def test_a_partition_moved_since_the_last_fit_is_found_again_without_a_restart(client, on_workers, tmp_path):
    """The second fit over the same partitions takes their placement from the first (no who_has round trip
    to the scheduler); where that placement has gone stale (a partition named on a worker that no longer
    holds it), its rank says so, the fit asks the scheduler again and ends with the same model, no restart
    counted."""
    from pystrom.dask import _fit, _loop

    parts = _persisted(client, _write(tmp_path, logreg_data(4000)))
    first = fit_on(client, parts, columns=FEATURES, target="y")
    key = list(_loop._PLANNED)[-1]  # the first fit's placement, remembered last
    asked = []
    real = _fit.DaskSource._where

    def spied(self):
        asked.append(1)
        return real(self)

    _fit.DaskSource._where = spied
    try:
        again = fit_on(client, parts, columns=FEATURES, target="y")
        assert asked == [], "the placement of the first fit was used"
        plan = _loop._PLANNED[key]
        a, b = sorted(plan)
        stale = {a: plan[a][1:], b: plan[b] + plan[a][:1]}  # one of a's partitions said to be on b
        _loop._PLANNED[key] = stale
        third = fit_on(client, parts, columns=FEATURES, target="y")
        assert asked == [1], "the scheduler was asked again once"
    finally:
        _fit.DaskSource._where = real
    assert _loop._PLANNED[key] == plan
    info = third.fit_info_
    assert info["path"] == "workers" and info["restarts"] == 0, info
    assert_same_model(again, first, rtol=0)
    assert_same_model(third, first, rtol=0)


def test_workers_the_client_cannot_reach_are_called_through_the_scheduler(client, on_workers, tmp_path, monkeypatch):
    """The ranks are called straight from the client; where it cannot connect to a worker (a client
    outside the cluster's network), the call goes through the scheduler (Client.run) and the fit is the same.
    The connect waits at most 5 s (not distributed's 30), and a worker it could not reach is not tried again by
    the next fits (each would wait as long) until _UNREACHABLE_S has passed."""
    from pystrom.dask import _rank_call

    parts = _persisted(client, _write(tmp_path, logreg_data(4000)))
    direct = fit_on(client, parts, columns=FEATURES, target="y")
    real = client.rpc.connect
    workers = set(client.scheduler_info()["workers"])
    refused, reached, timeouts = [], [], []

    async def refusing(address, *args, **kwargs):
        if address not in workers:
            return await real(address, *args, **kwargs)  # the scheduler's, reachable
        refused.append(address)
        timeouts.append(kwargs.get("timeout"))
        raise OSError(f"no route to {address} (test)")

    async def counting(address, *args, **kwargs):
        if address in workers:
            reached.append(address)
        return await real(address, *args, **kwargs)

    try:
        client.rpc.connect = refusing
        relayed = fit_on(client, parts, columns=FEATURES, target="y")
        assert len(set(refused)) == 2, refused  # both ranks' workers, each then reached through the scheduler
        assert all(t is not None and 0 < t <= 5 for t in timeouts), timeouts
        again = fit_on(client, parts, columns=FEATURES, target="y")
        assert len(refused) == 2, refused  # remembered: not tried again
        client.rpc.connect = counting
        still = fit_on(client, parts, columns=FEATURES, target="y")
        assert reached == []  # within _UNREACHABLE_S of the failure
        monkeypatch.setattr(_rank_call, "_UNREACHABLE_S", 0.0)
        back = fit_on(client, parts, columns=FEATURES, target="y")
        assert sorted(set(reached)) == sorted(workers), reached  # tried again, and reached
    finally:
        client.rpc.connect = real
        _rank_call._UNREACHABLE.clear()
    for got in (relayed, again, still, back):
        assert got.fit_info_["path"] == "workers" and got.fit_info_["restarts"] == 0
        assert_same_model(got, direct, rtol=0)


def test_one_class_and_no_rows_are_the_in_memory_errors(client, on_workers, tmp_path):
    data = logreg_data(2000)
    one = data.set_column(data.schema.get_field_index("y"), "y", pa.array(np.zeros(2000, dtype=bool)))
    parts = _persisted(client, _write(tmp_path, one))
    with pytest.raises(DataError, match="one class"):
        fit_on(client, parts, columns=FEATURES, target="y")


def test_the_path_is_chosen_and_said(client, tmp_path):
    path = _write(tmp_path, logreg_data(3000))
    parts = _persisted(client, path)
    got = fit_on(client, parts, columns=FEATURES, target="y")  # auto: CPU workers keep the client's loop
    assert got.fit_info_["path"] == "client" and "CPU workers" in got.fit_info_["reason"]
    with pystrom.defaults.set(dask_fit_loop="workers"):
        lazy = pdask.scan_arrow(str(path), batch_rows=1000, device="cpu")
        got = fit_on(client, lazy, columns=FEATURES, target="y")
        assert got.fit_info_["path"] == "client" and "persist" in got.fit_info_["reason"]
    with pystrom.defaults.set(dask_fit_loop="client"):
        got = fit_on(client, parts, columns=FEATURES, target="y")
        assert got.fit_info_["path"] == "client" and "'client'" in got.fit_info_["reason"]
    want = LogisticRegression().fit(pystrom.read_arrow(path, device="cpu"), columns=FEATURES, target="y")
    assert want.fit_info_["path"] == "memory"
    assert_same_model(got, want)
    with pytest.raises(ValueError, match="dask_fit_loop"):
        pystrom.defaults.set(dask_fit_loop="gpu")


def test_passes_do_not_go_through_the_scheduler(client, on_workers, tmp_path):
    parts = _persisted(client, _write(tmp_path, logreg_data(3000)))

    def transitions(dask_scheduler):
        return dask_scheduler.transition_counter

    counts, passes = [], []
    for max_iter in (2, 30):
        before = client.run_on_scheduler(transitions)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = fit_on(client, parts, columns=FEATURES, target="y", max_iter=max_iter, tol=0.0)
        counts.append(client.run_on_scheduler(transitions) - before)
        passes.append(model.n_passes_)
    assert passes[1] >= passes[0] + 20 and counts[1] <= counts[0] + 4, (passes, counts)  # more passes, no more tasks


def test_a_worker_killed_mid_fit_restarts_the_fit(client, on_workers, tmp_path):
    path = _write(tmp_path, logreg_data(4000))
    parts = _persisted(client, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        want = LogisticRegression(max_iter=30, tol=0.0).fit(pystrom.read_arrow(path, device="cpu"),
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
    assert took < 20 + 30 * 0.05 * 2, took
    client.wait_for_workers(2, timeout=60)  # the nanny's new worker, for the tests after


def test_a_worker_killed_mid_fit_without_restarts_is_a_clear_error(client, on_workers, tmp_path):
    parts = _persisted(client, _write(tmp_path, logreg_data(4000)))
    with rank_killed_mid_fit(client, passes=3) as killed:
        t0 = time.monotonic()
        with pystrom.defaults.set(dask_fit_restarts=0), pytest.raises(ClusterError) as info:
            fit_on(client, parts, columns=FEATURES, target="y", max_iter=30, tol=0.0)
        took = time.monotonic() - t0
    assert killed
    assert killed["address"] in str(info.value) and "dask_fit_restarts=0" in str(info.value)
    assert took < 20, took  # the timeout (20 s) is the bound; a lost TCP peer is seen at once
    client.wait_for_workers(2, timeout=60)


def test_a_lost_postgres_partition_cannot_be_read_again_and_says_so(client, on_workers, pg):
    name = pg.name("loop")
    pg.execute(f'CREATE TABLE "{name}" AS SELECT g AS id, random() AS x1, random() AS x2, random() AS x3, '
               "random() < 0.5 AS y FROM generate_series(1, 4000) g")  # fmt: skip
    with client.as_current():
        parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=4, device="cpu").persist()
        distributed.wait(parts)
    with rank_killed_mid_fit(client, passes=3) as killed:
        with pytest.raises(ClusterError, match="snapshot") as info:
            fit_on(client, parts, columns=FEATURES, target="y", max_iter=30, tol=0.0)
    assert isinstance(info.value.__cause__, PostgresError) and killed["address"] in str(info.value)
    client.wait_for_workers(2, timeout=60)


def test_a_stalled_worker_times_out_and_the_next_fit_works(client, tmp_path):
    parts = _persisted(client, _write(tmp_path, logreg_data(3000)))
    client.run(stall_rank, 1, 2)
    try:
        t0 = time.monotonic()
        with pystrom.defaults.set(dask_fit_loop="workers", dask_fit_timeout=3.0, dask_fit_restarts=0):
            with pytest.raises(CollectiveTimeoutError, match="dask_fit_timeout"):
                fit_on(client, parts, columns=FEATURES, target="y")
        took = time.monotonic() - t0
    finally:
        client.run(slow_passes, 0.0)
    assert took < 3.0 + 10, took
    with pystrom.defaults.set(dask_fit_loop="workers", dask_fit_timeout=20.0):
        got = fit_on(client, parts, columns=FEATURES, target="y")
    assert got.fit_info_["path"] == "workers" and not got.fit_info_["comm_reused"]  # the failed one was dropped


def test_a_timed_out_exchange_restarts_the_fit_on_the_same_workers(client, tmp_path):
    path = _write(tmp_path, logreg_data(3000))
    parts = _persisted(client, path)
    want = LogisticRegression().fit(pystrom.read_arrow(path, device="cpu"), columns=FEATURES, target="y")
    client.run(stall_rank, 1, 2, 0)  # rank 1 hangs in the first attempt only
    try:
        with pystrom.defaults.set(dask_fit_loop="workers", dask_fit_timeout=3.0, dask_fit_restarts=1):
            got = fit_on(client, parts, columns=FEATURES, target="y")
    finally:
        client.run(slow_passes, 0.0)
    info = got.fit_info_
    assert (info["restarts"], info["comm"], info["workers"]) == (1, "tcp", 2), info  # both ranks, a new communicator
    assert_same_model(got, want)


def test_workers_started_as_separate_processes_over_tcp(tmp_path):
    path = _write(tmp_path, logreg_data(4000, nulls=True))
    want = LogisticRegression().fit(pystrom.read_arrow(path, device="cpu"), columns=FEATURES, target="y")
    with process_cluster(2, gpu=False) as c, pystrom.defaults.set(dask_fit_loop="workers"):
        parts = _persisted(c, path)
        got = fit_on(c, parts, columns=FEATURES, target="y")
        assert got.fit_info_["path"] == "workers" and got.fit_info_["workers"] == 2
        assert {a.split(":")[0] for a in c.scheduler_info()["workers"]} == {"tcp"}
    assert_same_model(got, want)
