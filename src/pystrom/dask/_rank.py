"""The Newton loop where the data is: what runs on each worker of a fit over persisted partitions.

One long-lived call per worker (:func:`run_rank_here`, made by :mod:`._loop`) builds the same
:class:`~pystrom.ml._irls.IRLSSolver` as a fit in one process, over a :class:`._rank_source.RankSource` whose pass is
this worker's partitions' sums (the fused kernel on a GPU, as :func:`._tasks.table_pass` makes them)
all-gathered with every other worker's (:mod:`._comm`: NCCL between GPUs) and summed in rank order.
Every rank holds the same totals bit for bit, so every rank's solver takes the same steps and line
search, judges separation alike and stops at the same pass; each pass's coefficients travel with the
sums and are compared, so ranks that ever diverged would stop with an error instead of mixing passes.
Rank 0 returns the result (and the warnings its solver gave) to the client; nothing else leaves the
workers but one vector per worker and pass.

A rank that fails (a partition it cannot prepare, NaN in its features) still takes part in the next
all-gather, flagged: every rank then stops at that exchange, the failing one raising its error, the
others returning without one (:class:`._rank_source.Deferred`), so no rank waits for one that will never come.
Communicators are kept between fits (forming an NCCL one costs far more than a fit's exchanges) and
dropped after any failure inside an exchange.
"""

from __future__ import annotations

import pickle
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ClusterError
from ..ml._sources import SolverSpec
from ._comm import Comm, SoloComm, form, make_unique_id, nccl_module
from ._rank_source import Deferred, LocalPasses, RankSource

__all__ = [
    "RankJob",
    "CommunicatorNotKept",
    "run_rank",
    "run_rank_here",
    "probe",
    "unique_id",
    "cancel",
    "status",
]

_KEEP = 2  # idle communicators a worker keeps per rank slot (the newest)


@dataclass(frozen=True)
class RankJob:
    """One attempt of one fit, as every rank receives it."""

    fit_id: str
    attempt: int
    cid: str  # the communicator's id
    comm: str  # "nccl", "tcp" or "none"
    peers: tuple[str, ...]  # worker addresses by rank
    ordinals: tuple[int, ...]  # each rank's GPU (-1: CPU)
    timeout: float
    kind: str  # "table" (args: feature names, target, weight column) or "array"
    args: tuple
    n_features: int
    names: tuple[str, ...]
    class_weight: tuple[float, float]
    spec: SolverSpec

    @property
    def world(self) -> int:
        return len(self.peers)


# -- the task -------------------------------------------------------------------------------------------


class CommunicatorNotKept(ClusterError):
    """The communicator the client expected this worker to keep from an earlier fit is gone (another
    fit's took its place): the client asks the workers again and forms a new one."""


class _Kept:
    def __init__(self, comm: Comm):
        self.comm = comm
        self.busy = True
        self.used = time.monotonic()


_COMMS: dict[tuple[str, int], _Kept] = {}  # (communicator id, rank) -> its end on this worker
_CANCELS: dict[str, tuple[threading.Event, float]] = {}  # "fit id/attempt" -> (cancelled, when made)
_RUNNING: dict[tuple[str, int], dict] = {}  # (fit id, rank) -> what status() reports
_LOCK = threading.Lock()


def cancel_event(fit_id: str, attempt: int) -> threading.Event:
    """What cancels attempt ``attempt`` of fit ``fit_id`` on this worker (each attempt has its own)."""
    key = f"{fit_id}/{attempt}"
    now = time.monotonic()
    with _LOCK:
        for old in [f for f, (_, t) in _CANCELS.items() if now - t > 3600.0]:
            del _CANCELS[old]
        event, _ = _CANCELS.setdefault(key, (threading.Event(), now))
    return event


def _take_comm(job: RankJob, rank: int, uid: Any, cancel: threading.Event) -> tuple[Comm, bool]:
    """This rank's communicator: the one kept from an earlier fit (``uid`` None), or a new one; and
    whether it was formed now."""
    if job.comm == "none":
        return SoloComm(rank, 1, job.peers, job.timeout, cancel), True
    key = (job.cid, rank)
    if uid is None:
        with _LOCK:
            kept = _COMMS.get(key)
            if kept is not None and not kept.busy:
                kept.busy = True
                kept.comm.cancel, kept.comm.timeout = cancel, job.timeout
                return kept.comm, False
        raise CommunicatorNotKept(f"rank {rank} ({job.peers[rank]}): communicator {job.cid} is no longer kept on "
                                  "this worker (another fit's took its place)")  # fmt: skip
    comm = form(job.comm, job.cid, uid, rank, job.world, job.peers, job.ordinals[rank], job.timeout, cancel)
    with _LOCK:
        _COMMS[key] = _Kept(comm)
        idle = sorted((k for k, v in _COMMS.items() if not v.busy and k[1] == rank), key=lambda k: _COMMS[k].used)
        evicted = [_COMMS.pop(k) for k in idle[: max(0, len(idle) - (_KEEP - 1))]]
    for old in evicted:
        old.comm.abort()
    return comm, True


def _give_back(job: RankJob, rank: int, comm: Comm, healthy: bool) -> None:
    key = (job.cid, rank)
    with _LOCK:
        kept = _COMMS.get(key)
        if kept is not None and kept.comm is comm:
            if healthy:
                kept.busy, kept.used = False, time.monotonic()
                return
            del _COMMS[key]
    comm.abort()


def run_rank(job: RankJob, rank: int, uid: Any, inputs: list[tuple]) -> dict:
    """Rank ``rank`` of ``job``: the whole IRLS loop over this worker's partitions (``inputs``: per
    partition, its Table, or its X, y and weight blocks). Rank 0 returns the solver's result. Runs in a
    thread of its own (:func:`run_rank_here`), never one of the worker's task threads."""
    cancel = cancel_event(job.fit_id, job.attempt)
    if job.comm in ("nccl", "none"):
        from ._chain import prune

        prune()  # chains kept after an earlier fit's abort, done by now
    state = {"fit": job.fit_id, "attempt": job.attempt, "rank": rank, "passes": 0, "address": job.peers[rank]}
    with _LOCK:
        _RUNNING[(job.fit_id, rank)] = state
    comm: Comm | None = None
    source: RankSource | None = None
    try:
        local, failure = None, None
        prepared = time.perf_counter()
        try:
            local = LocalPasses.prepare(job, inputs)
        except Exception as exc:  # noqa: BLE001 - raised at the first exchange, where the others learn of it
            failure = exc
        prepared = time.perf_counter() - prepared
        formed = time.perf_counter()
        comm, fresh = _take_comm(job, rank, uid, cancel)
        formed = time.perf_counter() - formed
        source = RankSource(job, comm, local, failure, state)
        loop = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:  # the client issues rank 0's again
            warnings.simplefilter("always")
            res = job.spec.build(source).solve()
        loop = time.perf_counter() - loop
        source.in_exchange = True  # (a speculative pass's all-gather may still be queued)
        source.close()
        source.in_exchange = False
        chain = source.chain_counts()
        out = {
            "rank": rank,
            "address": job.peers[rank],
            "result": res if rank == 0 else None,
            "warnings": [(w.category, str(w.message)) for w in caught] if rank == 0 else [],
            "rows": source.rows,
            "skipped": source.skipped,
            "partitions": len(inputs),
            "local_rows": local.rows if local is not None else 0,
            "local_s": source.local_s,
            "comm_s": source.comm_s,
            "loop_s": loop,
            "exchanges": source.passes,
            "formed_s": formed if fresh else 0.0,
            "prepare_s": prepared,
            **chain,
        }
        _give_back(job, rank, comm, healthy=True)
        return out
    except Deferred as stop:
        if comm is not None:
            _give_back(job, rank, comm, healthy=_settle(source, comm))
        return {"rank": rank, "address": job.peers[rank], "deferred": stop.fallback}
    except BaseException:
        if comm is not None:
            _give_back(job, rank, comm, healthy=_settle(source, comm))
        raise
    finally:
        with _LOCK:
            _RUNNING.pop((job.fit_id, rank), None)


def _settle(source: RankSource | None, comm: Comm) -> bool:
    """After a rank stopped on an error: whether its communicator is still in step with the others'.
    A chained pass still queued is waited for (every rank queued it) where the stop was outside an
    exchange; otherwise the communicator is aborted (its kernels then return) and the chain's buffers
    are kept until its stream has passed them (:func:`._chain.retire`)."""
    if source is None:
        return True
    healthy = not source.in_exchange
    if healthy:
        try:
            source.close()
        except Exception:  # noqa: BLE001 - its all-gather did not complete: not kept
            healthy = False
    if not healthy:
        comm.abort()
        source.retire()
    return healthy


async def run_rank_here(job: RankJob, ranks: dict, uid: Any, dask_worker: Any = None) -> dict:
    """:func:`run_rank` as ``Client.run`` calls it on each worker of the fit: ``ranks`` maps a worker's
    address to (its rank, the keys of each of its partitions' inputs, held in its memory). The loop runs
    in a thread of its own (the worker's event loop and task threads stay free), and the result comes back
    pickled with the call's reply: no task for the scheduler to place, and no result to fetch after it finishes
    (submitting the ranks as tasks cost a 40M-row fit on two H200s ~8 ms before the ranks started and ~8
    after they ended, against a loop of ~14 ms)."""
    import asyncio

    rank, plan = ranks[dask_worker.address]
    inputs = []
    for keys in plan:
        try:
            inputs.append(tuple(None if k is None else dask_worker.data[k] for k in keys))
        except KeyError as exc:
            raise PartitionNotHere(f"rank {rank} ({dask_worker.address}): partition {exc.args[0]!r} is no longer "
                                   "in this worker's memory") from None  # fmt: skip
    out = await asyncio.to_thread(run_rank, job, rank, uid, inputs)
    return pickle.dumps(out, protocol=5)  # one frame (dask's own serialisation sends each array as its own)


class PartitionNotHere(ClusterError):
    """A partition the fit's plan placed on this worker is no longer in its memory (moved or lost since):
    the fit starts again once every partition is in some worker's memory."""


# -- what the client asks each worker through Client.run ---------------------------------------------------


def _device_of(value: Any) -> str:
    device = getattr(value, "device", None)
    if isinstance(device, str):
        return device  # a Table's
    if isinstance(value, np.ndarray):
        return "cpu"
    ident = getattr(device, "id", None)
    return f"cuda:{ident}" if isinstance(ident, int) else "cpu"


def _gpu_identity(ordinal: int) -> str:
    """What tells two workers' GPUs apart: the device's UUID, else host and PCI bus."""
    import cupy

    try:
        uuid = cupy.cuda.runtime.getDeviceProperties(ordinal).get("uuid")
        if uuid:
            return bytes(uuid).hex()
    except Exception:  # noqa: BLE001 - an older CuPy: the bus id
        pass
    return f"{socket.gethostname()}/{cupy.cuda.Device(ordinal).pci_bus_id}"


def probe(plan: dict, nccl: bool, dask_worker: Any = None) -> dict:
    """Where this worker's partitions of ``plan`` live (and which of them it does not hold), whether NCCL
    works here, and the communicators it keeps."""
    devices, missing = set(), []
    for keys in plan.get(dask_worker.address, []):
        for key in keys:
            if key is not None:
                try:
                    devices.add(_device_of(dask_worker.data[key]))
                except KeyError:
                    missing.append(key)
    info: dict = {"devices": sorted(devices), "host": socket.gethostname(), "missing": missing}
    with _LOCK:
        info["kept"] = sorted(list(k) for k, v in _COMMS.items() if not v.busy)
    gpus = [d for d in devices if d.startswith("cuda")]
    if len(gpus) == 1:
        ordinal = int(gpus[0].partition(":")[2] or 0)
        info["ordinal"] = ordinal
        info["gpu"] = _gpu_identity(ordinal)
        if nccl:
            try:
                info["nccl"] = int(nccl_module().get_version())
            except Exception as exc:  # noqa: BLE001 - said in the model's fit_info_
                info["nccl_error"] = f"{type(exc).__name__}: {exc}"
    return info


def unique_id(kind: str, cid: str, dask_worker: Any = None) -> Any:
    """Communicator ``cid``'s unique id, made on this worker (its rank 0)."""
    try:
        from distributed.comm import get_address_host

        host = get_address_host(dask_worker.address)
    except Exception:  # noqa: BLE001 - an address without a host part
        host = "127.0.0.1"
    return make_unique_id(kind, cid, host)


def cancel(fit_id: str, attempt: int, dask_worker: Any = None) -> None:
    """End every rank of attempt ``attempt`` of fit ``fit_id`` on this worker at its next look (~0.1 s)."""
    cancel_event(fit_id, attempt).set()


def status(dask_worker: Any = None) -> list[dict]:
    """The ranks running on this worker: fit, attempt, rank, passes made, address."""
    with _LOCK:
        return [dict(s) for s in _RUNNING.values()]
