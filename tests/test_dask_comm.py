"""The communicators of the Newton loop on the workers (pystrom.dask._comm), ranks as threads: the TCP one
as it is, the NCCL one over a stand-in for CuPy's binding (tests/fake_nccl.py; test_dask_nccl.py runs the
real one on GPUs). Exchanges return every rank's rows in rank order, identical everywhere; a rank that
stalls, leaves or is cancelled ends every wait within the timeout; and the whole rank loop over the
NCCL class fits what one process fits."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pystrom
from pystrom.dask import _comm
from pystrom.errors import ClusterError, CollectiveTimeoutError

import fake_nccl
from dask_loop_helpers import assert_same_model, logreg_data

pytest.importorskip("distributed")


def _ranks(world: int, make, work, timeout: float = 30.0):
    """Run ``work(rank, comm)`` for every rank on its own thread (the comm from ``make(rank)``); returns
    {rank: result or the exception it raised} and each rank's seconds."""
    out, took = {}, {}

    def one(rank: int) -> None:
        t0 = time.monotonic()
        try:
            out[rank] = work(rank, make(rank))
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            out[rank] = exc
        took[rank] = time.monotonic() - t0

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
        assert not t.is_alive(), "a rank never returned"
    return out, took


def _tcp(world: int, timeout: float = 10.0, cancel: threading.Event | None = None, cid: str = "t"):
    uid = _comm.tcp_rendezvous(cid, "127.0.0.1")
    peers = [f"tcp://127.0.0.1:{9000 + r}" for r in range(world)]
    event = cancel or threading.Event()
    return lambda rank: _comm.TcpComm(cid, uid, rank, world, peers, timeout, event)


def _exchanges(rank: int, comm) -> list:
    rng = np.random.default_rng(rank)
    got = []
    for n in (1, 7, 7, 300, 2):  # lengths change between exchanges, never within one
        got.append((rng.normal(size=n), comm.allgather(rng.normal(size=n) * 0 + rank + np.arange(n))))
    comm.close()
    return got


def _check_exchanges(out: dict, world: int) -> None:
    for rank in range(world):
        assert not isinstance(out[rank], BaseException), out[rank]
    for i, n in enumerate((1, 7, 7, 300, 2)):
        want = np.stack([r + np.arange(n, dtype=np.float64) for r in range(world)])
        for rank in range(world):
            np.testing.assert_array_equal(out[rank][i][1], want)


def test_tcp_all_gather_gives_every_rank_the_same_rows():
    out, _ = _ranks(3, _tcp(3), _exchanges)
    _check_exchanges(out, 3)


def test_nccl_all_gather_gives_every_rank_the_same_rows():
    with fake_nccl.installed() as nccl:
        uid = nccl.get_unique_id()
        peers = ["a", "b", "c"]
        out, _ = _ranks(3, lambda r: _comm.NcclComm(uid, r, 3, peers, 0, 10.0, threading.Event()), _exchanges)
    _check_exchanges(out, 3)
    assert all(c.destroyed and not c.aborted for c in fake_nccl.CREATED[-3:])  # closed, not aborted


@pytest.mark.parametrize("kind", ["tcp", "nccl"])
def test_a_stalled_rank_ends_the_others_waits_by_the_timeout(kind):
    def work(rank, comm):
        comm.allgather(np.ones(4))
        if rank == 2:
            time.sleep(4.0)  # never comes to the second exchange in time
            comm.abort()
            return "stalled"
        return comm.allgather(np.ones(4))

    with fake_nccl.installed() as nccl:
        if kind == "nccl":
            uid = nccl.get_unique_id()
            make = lambda r: _comm.NcclComm(uid, r, 3, ["a", "b", "c"], 0, 1.0, threading.Event())  # noqa: E731
        else:
            make = _tcp(3, timeout=1.0)
        out, took = _ranks(3, make, work)
    for rank in (0, 1):
        assert isinstance(out[rank], ClusterError), out[rank]
        assert took[rank] < 4.0, took  # not the stalled rank's 4 s: the 1 s timeout, or rank 0's leaving
    assert isinstance(out[0], CollectiveTimeoutError) and "dask_fit_timeout" in str(out[0])
    if kind == "nccl":
        assert all(c.aborted for c in fake_nccl.CREATED[-3:][:2] if c.rank in (0, 1))


def test_a_rank_that_leaves_ends_the_others_at_once_over_tcp():
    def work(rank, comm):
        comm.allgather(np.ones(3))
        if rank == 1:
            comm.abort()  # as a killed worker's sockets close
            return "left"
        return comm.allgather(np.ones(3))

    out, took = _ranks(3, _tcp(3, timeout=30.0), work)
    assert isinstance(out[0], ClusterError) and "rank 1" in str(out[0]) and "closed its connection" in str(out[0])
    assert isinstance(out[2], ClusterError)  # rank 0 went away when it failed
    assert max(took[0], took[2]) < 5.0, took


@pytest.mark.parametrize("kind", ["tcp", "nccl"])
def test_cancelling_ends_every_wait_promptly(kind):
    cancel = threading.Event()

    def work(rank, comm):
        if rank == 0:
            threading.Timer(0.5, cancel.set).start()
        comm.allgather(np.ones(2))  # rank 2 never comes
        return comm.allgather(np.ones(2))

    def work_without_2(rank, comm):
        if rank == 2:
            time.sleep(3.0)
            comm.abort()
            return "absent"
        return work(rank, comm)

    with fake_nccl.installed() as nccl:
        if kind == "nccl":
            uid = nccl.get_unique_id()
            make = lambda r: _comm.NcclComm(uid, r, 3, ["a", "b", "c"], 0, 60.0, cancel)  # noqa: E731
        else:
            make = _tcp(3, timeout=60.0, cancel=cancel)
        out, took = _ranks(3, make, work_without_2)
    for rank in (0, 1):
        assert isinstance(out[rank], ClusterError) and not isinstance(out[rank], CollectiveTimeoutError), out[rank]
        assert took[rank] < 2.5, took


def test_forming_waits_for_missing_ranks_only_until_the_timeout():
    # TCP: rank 2 never connects
    make = _tcp(3, timeout=1.0)
    out, took = _ranks(2, make, lambda rank, comm: comm)
    assert isinstance(out[0], CollectiveTimeoutError) and "rank 2" in str(out[0]), out[0]
    assert took[0] < 3.0
    # NCCL: rank 1 joins after the others gave up; its communicator is aborted, not leaked
    with fake_nccl.installed() as nccl:
        uid = nccl.get_unique_id()
        with pytest.raises(CollectiveTimeoutError, match="forming the NCCL communicator"):
            _comm.NcclComm(uid, 0, 2, ["a", "b"], 0, 0.5, threading.Event())
        late = nccl.NcclCommunicator(2, uid, 1)
        time.sleep(0.2)
        first = [c for c in fake_nccl.CREATED if c.fabric is late.fabric and c.rank == 0]
        assert first and first[0].aborted


def test_a_stray_connection_does_not_break_the_rendezvous():
    import socket

    uid = _comm.tcp_rendezvous("stray", "127.0.0.1")
    stray = socket.create_connection(uid[:2])
    stray.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 40)
    peers = ["a", "b"]
    out, _ = _ranks(2, lambda r: _comm.TcpComm("stray", uid, r, 2, peers, 10.0, threading.Event()), _exchanges)
    stray.close()
    _check_exchanges(out, 2)


def test_ranks_out_of_step_are_an_error_not_a_mix():
    def work(rank, comm):
        return comm.allgather(np.ones(3 if rank == 0 else 4))

    out, _ = _ranks(2, _tcp(2, timeout=5.0), work)
    assert isinstance(out[0], ClusterError) and "out of step" in str(out[0])


def test_nccl_errors_abort_and_name_the_rank():
    with fake_nccl.installed() as nccl:
        uid = nccl.get_unique_id()

        def work(rank, comm):
            if rank == 1:
                comm.fabric_hook = None
                time.sleep(0.3)
                fake_nccl.CREATED[-1].fabric.async_error = "ncclRemoteError: a peer went away"
                time.sleep(2)
                comm.abort()
                return "gone"
            return comm.allgather(np.ones(2))

        out, took = _ranks(2, lambda r: _comm.NcclComm(uid, r, 2, ["w0", "w1"], 0, 30.0, threading.Event()), work)
    assert isinstance(out[0], ClusterError) and "rank 0 (w0)" in str(out[0]) and "peer went away" in str(out[0])
    assert took[0] < 2.0


def test_the_rank_loop_over_the_nccl_class_fits_what_one_process_fits(tmp_path):
    """run_rank itself, three ranks as threads with the NCCL communicator (faked) between them."""
    from pystrom.dask._rank import RankJob, run_rank
    from pystrom.ml import LogisticRegression
    from pystrom.ml._sources import SolverSpec

    data = logreg_data(3000, nulls=True)
    table = pystrom.Table.from_arrow(data, device="cpu")
    want = LogisticRegression(penalty="l2", C=0.5).fit(table, columns=["x1", "x2", "x3"], target="y",
                                                         sample_weight="w")  # fmt: skip
    slices = [table.slice(0, 700), table.slice(700, 900), table.slice(1600, 400), table.slice(2000, 1000)]
    inputs = {0: [(slices[0],), (slices[3],)], 1: [(slices[1],)], 2: [(slices[2],)]}
    with fake_nccl.installed() as nccl:
        uid = nccl.get_unique_id()
        job = RankJob(fit_id="f", attempt=0, cid="nccl-test", comm="nccl", peers=("a", "b", "c"), ordinals=(0, 0, 0),
                      timeout=20.0, kind="table", args=(["x1", "x2", "x3"], "y", "w"), n_features=3,
                      names=("x1", "x2", "x3"), class_weight=(1.0, 1.0),
                      spec=SolverSpec(3, True, 2.0, 100, 1e-8))  # fmt: skip
        out, _ = _ranks(3, lambda r: r, lambda rank, _: run_rank(job, rank, uid, inputs[rank]))
    for rank in range(3):
        assert isinstance(out[rank], dict) and "deferred" not in out[rank], out[rank]
    res = out[0]["result"]
    assert res.passes == want.n_passes_ and out[0]["rows"] == want.num_rows_processed_
    np.testing.assert_allclose(res.w[:3], want.coef_[0], rtol=1e-9)
    np.testing.assert_allclose(res.w[3], want.intercept_[0], rtol=1e-9)
    assert out[1]["exchanges"] == out[2]["exchanges"] == res.passes
    assert assert_same_model  # (the estimator-level comparison: test_dask_loop.py, test_dask_nccl.py)
