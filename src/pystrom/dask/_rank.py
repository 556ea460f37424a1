"""The Newton loop where the data is: what runs on each worker of a fit over persisted partitions.

One long-lived call per worker (:func:`run_rank_here`, made by :mod:`._loop` through ``Client.run``) builds the same
:class:`~pystrom.ml._irls.IRLSSolver` as a fit in one process, over a :class:`RankSource` whose pass is
this worker's partitions' sums (the fused kernel on a GPU, as :func:`._tasks.table_pass` makes them)
all-gathered with every other worker's (:mod:`._comm`: NCCL between GPUs) and summed in rank order.
Every rank holds the same totals bit for bit, so every rank's solver takes the same steps and line
search, judges separation alike and stops at the same pass; each pass's coefficients travel with the
sums and are compared, so ranks that ever diverged would stop with an error instead of mixing passes.
Rank 0 returns the result (and the warnings its solver gave) to the client; nothing else leaves the
workers but one vector per worker and pass.

A rank that fails (a partition it cannot prepare, NaN in its features) still takes part in the next
all-gather, flagged: every rank then stops at that exchange, the failing one raising its error, the
others returning without one (:class:`_Deferred`), so no rank waits for one that will never come.
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

from ..errors import ClusterError, DataError
from ..memory.backend import resolve_device
from ..ml._pass import batch_pass, layout_size
from ..ml._sources import SolverSpec, Source
from ._comm import Comm, SoloComm, form, make_unique_id, nccl_module
from ._tasks import _EXTRA, _check_finite, _empty_pass, array_batch, sum_passes, table_batch

__all__ = [
    "RankJob",
    "LocalPasses",
    "RankSource",
    "CommunicatorNotKept",
    "run_rank",
    "run_rank_here",
    "probe",
    "unique_id",
    "cancel",
    "status",
]

_KEEP = 2  # idle communicators a worker keeps per rank slot (the newest)
CHAIN = True  # chain the passes on the GPU where every rank can (dask/_chain.py); False: the host's exchanges


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


# -- this worker's passes -------------------------------------------------------------------------------


class LocalPasses:
    """This worker's share of each pass at ``w``: its partitions' sums (the dask pass layout: the pass
    vector, then rows used, rows skipped for NULLs, float32 seen), one host vector.

    Narrow GPU batches of one GPU and dtype make one fused launch over all of them
    (:class:`~pystrom.ml._narrow.PartsPass`), set up once for the whole fit: launched one by one from
    Python, 16 partitions of 40M rows cost a pass 0.8 ms on an H200, of which the GPU's work was under
    0.5 (and four streams had already taken it down from 0.9). Other batches take
    :func:`~pystrom.ml._pass.batch_pass`, as the client's loop does (a wide batch's scratch, up to
    1 GiB, is not held between passes).
    """

    def __init__(self, batches: list[Any], k: int):
        from ..ml._narrow import PartsPass, uses_kernel

        self.k = k
        self.batches = batches
        self.backend = batches[0].backend if batches else resolve_device("cpu")
        self.rows = sum(b.X.shape[0] for b in batches)
        tails = [(b.X.shape[0], b.skipped, float(b.X.dtype == np.float32)) for b in batches]
        self._tails = np.array(tails, dtype=np.float64).reshape(-1, _EXTRA)
        self._tail = self._tails.sum(axis=0)  # rows, rows skipped for NULLs (empty batches' too), float32 seen
        if len(self._tails):
            self._tail[-1] = self._tails[:, -1].max()
        groups: dict[tuple, list[int]] = {}  # (GPU, dtype) -> the batches one fused launch covers
        self._others: list[int] = []  # batches passed one at a time
        for i, b in enumerate(batches):
            if b.X.shape[0] and uses_kernel(b.backend, b.X):
                groups.setdefault((b.backend.ordinal, b.X.dtype.str), []).append(i)
            elif b.X.shape[0]:
                self._others.append(i)
        self._fused: list[tuple[Any, Any]] = []  # (backend, the PartsPass of its batches)
        for idx in groups.values():
            backend = batches[idx[0]].backend
            with backend.activate():
                # the partitions were made on other streams: done before the pass reads them
                backend.xp.cuda.Device(backend.ordinal).synchronize()
                fused = PartsPass([(batches[i].X, batches[i].y, batches[i].sw) for i in idx], backend.ordinal)
            self._fused.append((backend, fused))

    @classmethod
    def prepare(cls, job: RankJob, inputs: list[tuple]) -> LocalPasses:
        batches = []
        for values in inputs:
            batch = table_batch(values[0], *job.args) if job.kind == "table" else array_batch(*values)
            if batch is not None:
                batches.append(batch)
        return cls(batches, job.n_features)

    def __call__(self, cw: tuple[float, float], w: np.ndarray) -> np.ndarray:
        m = layout_size(self.k)
        sums = []  # each launch's or batch's pass vector on the host (usually one: a single launch)
        for backend, fused in self._fused:
            with backend.activate():
                sums.append(fused(cw, w))
        for i in self._others:
            b = self.batches[i]
            with b.backend.activate():
                vec = batch_pass(b.backend, b.X, b.y, b.sw, cw, w)  # a device vector on a GPU
                sums.append(vec.get() if b.backend.kind == "cuda" else vec)
        out = _empty_pass(self.k)  # no rows at all: nothing summed
        if len(sums) == 1:
            out[:m] = sums[0]
        elif sums:
            out[:m] = sum_passes(*(np.concatenate([v, np.zeros(_EXTRA)]) for v in sums))[:m]
        out[m:] = self._tail
        return out

    def single_launch(self) -> tuple[Any, Any] | None:
        """(backend, PartsPass) where one fused launch makes this worker's whole pass (dask/_chain.py)."""
        return self._fused[0] if len(self._fused) == 1 and not self._others else None

    @property
    def tail(self) -> np.ndarray:
        """The pass vector's tail here: rows, rows skipped for NULLs, float32 seen."""
        return self._tail

    def check_finite(self) -> None:
        """Raise naming the column when a batch here holds NaN/Inf in its features."""
        for b in self.batches:
            _check_finite(b)


# -- the source the solver runs on ------------------------------------------------------------------------


class _Deferred(Exception):
    """This rank stops because of a failure that may lie on another rank: ``fallback`` is the error to
    raise if no rank names a better one."""

    def __init__(self, fallback: BaseException):
        super().__init__(str(fallback))
        self.fallback = fallback


class RankSource(Source):
    """The passes of one rank: local sums, all-gathered, summed in rank order (the module docstring).

    What each rank sends a pass: its pass vector (``width`` values: the sums, then the counts), the
    weights it used, whether it can chain its passes on the GPU (dask/_chain.py) and whether it failed.
    After the first exchange every rank knows whether all of them can chain; if so, every later pass is
    chained (the all-gather and the step queued on the GPU behind the pass, the next pass speculatively
    behind them), else every pass goes through the host as the first did.
    """

    path = "workers"

    def __init__(self, job: RankJob, comm: Comm, local: LocalPasses | None, failure: BaseException | None,
                 state: dict):  # fmt: skip
        self.n_features = job.n_features
        self.names = list(job.names)
        self.backend = local.backend if local is not None else resolve_device("cpu")
        self.class_weight = job.class_weight
        self._comm = comm
        self._local = local
        self._failure = failure
        self._state = state
        self._width = layout_size(job.n_features) + _EXTRA
        self._p = job.n_features + 1
        self.local_s = 0.0  # seconds in this worker's passes (launch to sums on the host; chained: to the totals)
        self.comm_s = 0.0  # seconds in the host's all-gathers (waiting for the slowest rank included)
        self.in_exchange = False  # an exception now leaves the communicator out of step
        self.chained = 0  # passes made on the GPU's chain
        self._plan: tuple | None = None
        self._chain = self._make_chain(job) if failure is None and local is not None else None
        self._chaining = False  # every rank can chain: agreed at the first exchange

    def _make_chain(self, job: RankJob) -> Any:
        """This rank's ChainedPasses, where it can make them (None: the host's exchanges)."""
        if not CHAIN or job.comm not in ("nccl", "none") or (job.comm == "none") != (job.world == 1):
            return None
        single = self._local.single_launch()
        if single is None:
            return None
        from ._chain import ChainedPasses

        backend, fused = single
        row = np.zeros(self._width + self._p + 2)
        row[self._width - _EXTRA : self._width] = self._local.tail
        row[-2] = 1.0  # can chain
        try:
            with backend.activate():
                return ChainedPasses(fused, row, self._width, self._width,
                                     self._comm if job.comm == "nccl" else None, backend.ordinal)  # fmt: skip
        except Exception:  # noqa: BLE001 - no mapped memory, a kernel that does not load: the host's way
            return None

    def batches(self) -> list:
        return []  # the check for NaN/Inf runs in _run, on every rank at the same exchange

    def plan_steps(
        self, active: np.ndarray, n_free_features: int, l2: float, ahead: bool = True, exact_next: bool = False
    ) -> None:
        self._plan = (np.array(active), int(n_free_features), float(l2), bool(ahead))
        if self._chain is not None:
            self._chain.plan(*self._plan)

    def close(self) -> None:
        """Wait for a chained pass still queued (its all-gather is every rank's: it completes)."""
        if self._chain is not None:
            with self.backend.activate():
                self._chain.close()

    def retire(self) -> None:
        """The chain's buffers outlive whatever its stream still runs (after an abort)."""
        if self._chain is not None:
            from ._chain import retire

            with self.backend.activate():
                retire(self._chain)

    def chain_counts(self) -> dict:
        """Passes made on the chain, speculative passes queued, and those the solver used."""
        c = self._chain
        return {"chained": self.chained, "speculated": c.speculated if c else 0, "hits": c.hits if c else 0}

    def _run(self, w: np.ndarray, first: bool) -> np.ndarray:
        self._step = None
        if self._chaining:
            total = self._chained(w)
        else:
            local = None
            if self._failure is None:
                start = time.perf_counter()
                try:
                    local = self._local(self.class_weight, w)
                except Exception as exc:  # noqa: BLE001 - raised after the all-gather has told the others
                    self._failure = exc
                self.local_s += time.perf_counter() - start
            total = self._gather(local, w)
        self._state["passes"] = self.passes
        vec, (rows, skipped, single) = total[:-_EXTRA], total[-_EXTRA:]
        if first:
            self.rows, self.skipped = int(rows), int(skipped)
        self.single_precision = self.single_precision or bool(single)
        if vec[layout_size(self.n_features) - 3]:  # rows with a non-finite eta, on some rank
            self._local.check_finite()  # names the column where the rows are here
            raise _Deferred(DataError("the pass met non-finite values (NaN/Inf) in the features"))
        return vec

    def _chained(self, w: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        self.in_exchange = True
        with self.backend.activate():
            rows, totals, self._step = self._chain(self.class_weight, w)
        self.in_exchange = False
        self.local_s += time.perf_counter() - start
        self.chained += 1
        self._rule = self._chain.rule
        self._check(rows)
        return totals

    def _gather(self, local: np.ndarray | None, w: np.ndarray) -> np.ndarray:
        """All ranks' [sums, coefficients, chain flag, failed flag]; the summed totals, or the stop every rank makes."""
        width, p = self._width, self._p
        mine = np.zeros(width + p + 2)
        if local is None:
            mine[-1] = 1.0
        else:
            mine[:width] = local
        mine[width : width + p] = w
        mine[-2] = float(self._chain is not None)
        start = time.perf_counter()
        self.in_exchange = True
        rows = self._comm.allgather(mine)
        self.in_exchange = False
        self.comm_s += time.perf_counter() - start
        self._check(rows)
        if self.passes == 1:
            self._chaining = bool(rows[:, -2].all())
            if self._chaining and self._plan is not None:
                self._chain.plan(*self._plan)
        return sum_passes(*rows[:, :width])

    def _check(self, rows: np.ndarray) -> None:
        """Stop where a rank failed (raising its error here, if it is this one), or where the ranks'
        coefficients differ (their solvers diverged)."""
        width, p = self._width, self._p
        failed = np.flatnonzero(rows[:, -1])
        if len(failed):
            if self._failure is not None:
                raise self._failure
            ranks = ", ".join(self._comm.who(int(r)) for r in failed)
            raise _Deferred(ClusterError(f"the fit stopped: {ranks} failed (its error is reported)"))
        coefs = rows[:, width : width + p].view(np.uint64)
        if not (coefs == coefs[0]).all():
            odd = [int(r) for r in np.flatnonzero((coefs != coefs[0]).any(axis=1))]
            raise ClusterError(f"at pass {self.passes} the coefficients of {', '.join(map(self._comm.who, odd))} "
                               f"differ from {self._comm.who(0)}'s: the workers' solvers diverged (their hosts "
                               "round differently?); use pystrom.defaults.dask_fit_loop='client'")  # fmt: skip


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
    except _Deferred as stop:
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
