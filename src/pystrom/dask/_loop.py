"""Where a fit over pystrom.dask partitions runs its Newton loop, and the client's side of running it on the workers.

:func:`solve` picks the path (said in the model's ``fit_info_``):

- ``"workers"``: the partitions are persisted and held by GPU workers that can form an NCCL communicator
  (each on its own GPU), or by one GPU worker (no communicator), or ``pystrom.defaults.dask_fit_loop``
  is ``"workers"`` (TCP between the workers where NCCL is not usable). One call per worker
  (:func:`._rank.run_rank_here`, by the worker's ``run`` handler) runs the whole loop; the client waits for
  rank 0's result.
- ``"client"``: otherwise. The client runs the loop and asks the workers for each pass
  (:class:`._fit.DaskSource`): the only way for partitions that are not in memory (each pass reads them).

While the ranks run, the client watches them: a rank that fails, or a worker that leaves the cluster,
makes it cancel the others (they stop within ~0.1 s, NCCL's by ``ncclCommAbort``) and, where the
failure was the cluster's (a lost worker, a timed-out exchange), wait until the lost partitions are in
memory again (the scheduler recomputes them: an Arrow scan reads them again, a PostgreSQL read on the
snapshot if it is still held) and start again, at most ``pystrom.defaults.dask_fit_restarts`` times.
Errors of the data or the fit itself (a NaN named in its column, one class) are raised as in one process.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any

from .._settings import defaults
from ..errors import ClusterError, CollectiveTimeoutError
from ..ml._irls import IRLSResult
from ..ml._sources import SolverSpec
from ._rank import CommunicatorNotKept, PartitionNotHere, RankJob, cancel, probe, unique_id
from ._rank_call import RankCall, rank_payload

__all__ = ["solve"]

_LOOK = 0.5  # seconds between the client's looks at which workers are alive while the ranks run
_GRACE = 30.0  # the most seconds the others get to stop after one rank failed or a worker was lost
_KEPT: dict[tuple, str] = {}  # (client id, communicator kind, rank addresses, GPUs) -> communicator id
_BUSY: set[str] = set()  # communicator ids a fit of this process is using
_KEPT_LOCK = threading.Lock()
# (client id, the plan) -> the workers' probe() answers: where a fit's partitions live does not change
# while they stay where they are (the plan, from who_has, says so every fit), so the next fit over the
# same partitions skips that round trip (3.5 ms of a 37 ms fit of 40M rows on an H200). What the answers
# say about kept communicators is not trusted then: a rank that no longer keeps one says so
# (CommunicatorNotKept) and the fit asks again. Any failed attempt forgets the plan's answers.
_PROBED: dict[tuple, dict] = {}
_PROBED_MAX = 32
# (client id, the partitions' input keys) -> where the last fit over them found them (who_has: a round
# trip to the scheduler, ~1 ms of a 23 ms fit on 4 H200s). A partition that has moved since is not on
# the worker the plan names: that rank says so (PartitionNotHere) and the fit asks the scheduler again,
# without counting a restart.
_PLANNED: dict[tuple, dict] = {}


def solve(source: Any, spec: SolverSpec) -> IRLSResult:
    """Fit ``source`` (a :class:`._fit.DaskSource`) on the workers where that can be done, else from the client."""
    mode = defaults.dask_fit_loop
    if mode == "client":
        return _on_client(source, spec, "pystrom.defaults.dask_fit_loop is 'client'", None)
    futures = source._futures()
    planned = None  # the key of a plan remembered from an earlier fit over the same partitions
    placement = None
    if futures is not None:
        key = _plan_key(futures)
        with _KEPT_LOCK:
            plan = _PLANNED.get(key)
        if plan is not None:
            placement, planned = (futures[0].client, plan), key
        else:
            placement = source._where()
            if placement is not None:
                _remember(_PLANNED, key, placement[1])
    source._placement = placement
    if placement is None:
        return _on_client(source, spec, "the partitions are not all persisted in the workers' memory (persist() "
                          "them): every pass reads them, from the client's loop", None)  # fmt: skip
    return _WorkerFit(source, spec, placement[0], mode, planned).run(placement[1])


def _plan_key(futures: list[Any]) -> tuple:
    """Where _PLANNED keeps the placement of these partitions' inputs: (client id, their keys)."""
    return (futures[0].client.id, tuple(str(f.key) for f in futures))


def _remember(cache: dict, key: tuple, value: Any) -> None:
    with _KEPT_LOCK:
        while len(cache) >= _PROBED_MAX:
            cache.pop(next(iter(cache)))
        cache[key] = value


def _on_client(source: Any, spec: SolverSpec, reason: str, workers: int | None, restarts: int = 0) -> IRLSResult:
    res = spec.build(source).solve()
    source.fit_info = {"path": "client", "comm": None, "workers": workers, "partitions": len(source._leaves),
                       "passes": int(res.passes), "restarts": restarts, "reason": reason}  # fmt: skip
    return res


@dataclass
class _Choice:
    comm: str | None  # "nccl", "tcp", "none"; None: the client's loop
    reason: str
    ranks: list[str] = field(default_factory=list)  # worker addresses by rank
    infos: dict = field(default_factory=dict)  # probe() of each worker
    remembered: bool = False  # infos from an earlier fit's probe (_PROBED)
    moved: bool = False  # a worker does not hold a partition the plan names


@dataclass
class _Outcome:
    result: dict | None = None  # rank 0's, when the attempt ended well
    error: BaseException | None = None
    restartable: bool = False
    ranks: list[dict] = field(default_factory=list)
    not_kept: bool = False  # a rank no longer kept the communicator the client expected it to
    moved: bool = False  # a partition was not on the worker the plan named


class _WorkerFit:
    """One fit run on the workers: attempts, each watched, and restarts after the cluster's failures."""

    def __init__(self, source: Any, spec: SolverSpec, client: Any, mode: str, planned: tuple | None = None):
        self.source = source
        self.planned = planned  # the plan came from an earlier fit (_PLANNED): its key
        self.spec = spec
        self.client = client
        self.mode = mode
        self.fit_id = uuid.uuid4().hex[:16]
        self.timeout = float(defaults.dask_fit_timeout)
        self.reused = False  # the last attempt's communicator was kept from an earlier fit
        self.futures = {}  # input key -> its Future (the partitions)
        for leaf in source._leaves:
            for graph, key in leaf:
                if key is not None:
                    self.futures[key] = graph[key]

    def run(self, plan: dict) -> IRLSResult:
        restarts = 0
        start = time.perf_counter()
        asked_again = False
        attempt = 0  # each attempt's own number (its cancel flag on the workers is its own)
        while True:
            choice = self._choose(plan)
            if choice.moved and self.planned is not None:
                plan = self._plan_again(None)
                continue
            if choice.comm is None:
                return _on_client(self.source, self.spec, choice.reason, len(plan), restarts)
            outcome = self._attempt(plan, choice, attempt)
            attempt += 1
            if outcome.result is not None:
                return self._finish(outcome, choice, plan, restarts, time.perf_counter() - start)
            with _KEPT_LOCK:
                _PROBED.pop(self._probe_key(plan), None)
            if outcome.not_kept and choice.remembered and not asked_again:
                asked_again = True  # not a restart: the workers are asked afresh and a communicator formed
                continue
            if outcome.moved and self.planned is not None:
                plan = self._plan_again(outcome.error)
                continue
            if not outcome.restartable or restarts >= defaults.dask_fit_restarts:
                if outcome.restartable:
                    raise type(outcome.error)(f"the fit on the workers failed {restarts + 1} time(s) (restarts: "
                                       f"pystrom.defaults.dask_fit_restarts={defaults.dask_fit_restarts}): "
                                       f"{outcome.error}") from outcome.error  # fmt: skip
                raise outcome.error
            restarts += 1
            plan = self._partitions_back(outcome.error)
            _remember(_PLANNED, _plan_key(self.source._futures()), plan)

    # -- choosing ---------------------------------------------------------------------------------------

    def _probe_key(self, plan: dict) -> tuple:
        return (self.client.id, tuple(sorted((a, tuple(map(str, keys))) for a, keys in plan.items())))

    def _choose(self, plan: dict) -> _Choice:
        ranks = sorted(plan)
        key = self._probe_key(plan)
        with _KEPT_LOCK:
            infos = _PROBED.get(key)
        remembered = infos is not None
        if infos is None:
            try:
                infos = self.client.run(probe, plan, True, workers=ranks)
            except Exception as exc:  # noqa: BLE001 - a worker left between the plan and now
                return _Choice(None, f"the workers could not be asked where their partitions are ({exc!r})")
            _remember(_PROBED, key, infos)
        missing = [k for a in ranks for k in infos[a].get("missing", ())]
        if missing:
            with _KEPT_LOCK:
                _PROBED.pop(key, None)
            return _Choice(None, f"partition {missing[0]!r} is no longer where it was", moved=True)
        choice = self._choose_from(ranks, infos)
        choice.remembered = remembered
        return choice

    def _choose_from(self, ranks: list[str], infos: dict) -> _Choice:
        devices = [infos[a]["devices"] for a in ranks]
        world = len(ranks)
        on_gpu = all(d and all(x.startswith("cuda") for x in d) for d in devices)
        on_cpu = all(d == ["cpu"] for d in devices)
        if on_gpu and world == 1:
            return _Choice("none", "one GPU worker holds every partition: the loop runs there", ranks, infos)
        if on_gpu:
            problems = _nccl_problems(ranks, infos)
            if not problems:
                version = min(infos[a]["nccl"] for a in ranks)
                return _Choice("nccl", f"{world} GPU workers, NCCL {version}", ranks, infos)
            if self.mode == "workers":
                return _Choice("tcp", f"NCCL is not usable ({problems}): all-gathers over TCP", ranks, infos)
            return _Choice(None, f"NCCL is not usable ({problems}): the client's loop (pystrom.defaults."
                           "dask_fit_loop='workers' runs it on the workers over TCP)")  # fmt: skip
        kind = "CPU workers" if on_cpu else "workers whose partitions are on different devices"
        if self.mode == "workers" and world == 1:
            return _Choice("none", "one worker holds every partition: the loop runs there", ranks, infos)
        if self.mode == "workers":
            return _Choice("tcp", f"{kind}: all-gathers over TCP", ranks, infos)
        return _Choice(None, f"{kind}: the client's loop (pystrom.defaults.dask_fit_loop='workers' runs it on "
                       "the workers over TCP)")  # fmt: skip

    # -- one attempt ------------------------------------------------------------------------------------

    def _attempt(self, plan: dict, choice: _Choice, attempt: int) -> _Outcome:
        source, ranks = self.source, choice.ranks
        cid, uid = self._communicator(choice)
        ok = False
        try:  # (everything from here gives the communicator id back)
            job = RankJob(
                fit_id=self.fit_id,
                attempt=attempt,
                cid=cid,
                comm=choice.comm,
                peers=tuple(ranks),
                ordinals=tuple(int(choice.infos[a].get("ordinal", -1)) for a in ranks),
                timeout=self.timeout,
                kind="table" if source._args else "array",
                args=tuple(source._args),
                n_features=source.n_features,
                names=tuple(source.names),
                class_weight=tuple(source.class_weight),
                spec=self.spec,
            )
            assigned = {address: (r, plan[address]) for r, address in enumerate(ranks)}
            payload = rank_payload(job, assigned, uid)
            futures = {r: RankCall(self.client, address, payload) for r, address in enumerate(ranks)}
            outcome = self._watch(futures, ranks, attempt)
            ok = outcome.result is not None
            return outcome
        finally:
            with _KEPT_LOCK:
                _BUSY.discard(cid)
                key = self._kept_key(choice)
                if ok:
                    _KEPT[key] = cid
                elif _KEPT.get(key) == cid:
                    del _KEPT[key]

    def _kept_key(self, choice: _Choice) -> tuple:
        gpus = tuple(choice.infos[a].get("gpu") for a in choice.ranks)
        return (self.client.id, choice.comm, tuple(choice.ranks), gpus)

    def _communicator(self, choice: _Choice) -> tuple[str, Any]:
        """(communicator id, unique id): the one the same ranks kept from an earlier fit (unique id None)
        where each of them still has it, else a new one made on rank 0's worker."""
        key = self._kept_key(choice)
        with _KEPT_LOCK:
            cid = _KEPT.get(key)
            kept = (
                cid is not None
                and cid not in _BUSY
                and (choice.remembered or all([cid, r] in choice.infos[a]["kept"] for r, a in enumerate(choice.ranks)))
            )
            if not kept:
                cid = f"{choice.comm}-{uuid.uuid4().hex}"
            _BUSY.add(cid)
        self.reused = kept
        if kept or choice.comm == "none":
            return cid, None
        first = choice.ranks[0]
        try:
            return cid, self.client.run(unique_id, choice.comm, cid, workers=[first])[first]
        except BaseException:
            with _KEPT_LOCK:
                _BUSY.discard(cid)
            raise

    def _watch(self, futures: dict, ranks: list[str], attempt: int) -> _Outcome:
        lost: set[str] = set()
        stopping = None  # when the others were told to stop
        look = time.monotonic() + _LOOK  # (a worker gone before the call is told by the call itself)
        while True:
            live = [f for r, f in futures.items() if ranks[r] not in lost]
            if all(f.done() for f in live):
                break
            now = time.monotonic()
            if now >= look:
                look = now + _LOOK
                lost = self._lost(ranks)
            failed = any(f.status == "error" for f in futures.values())
            if (failed or lost) and stopping is None:
                stopping = now
                self._cancel([a for a in ranks if a not in lost], attempt)
            if stopping is not None and now - stopping > min(_GRACE, self.timeout):
                break
            concurrent.futures.wait([f.future for f in live if not f.done()], timeout=0.1,
                                    return_when=concurrent.futures.FIRST_COMPLETED)  # fmt: skip
        if any(f.status != "finished" for f in futures.values()):
            lost = self._lost(ranks)  # a rank's error may be a lost worker's doing, seen only now
        return self._judge(futures, ranks, lost)

    def _lost(self, ranks: list[str]) -> set[str]:
        """The ranks' workers the scheduler no longer knows."""
        try:
            alive = set(self.client.scheduler_info()["workers"])
        except Exception:  # noqa: BLE001 - the scheduler did not answer this time
            return set()
        return {a for a in ranks if a not in alive}

    def _cancel(self, addresses: list[str], attempt: int) -> None:
        """Tell the ranks on ``addresses`` to stop, without waiting: a worker that died a moment ago and is
        not yet known to be gone holds a message to it for the scheduler's connect timeout (30 s)."""

        def tell(address: str) -> None:
            try:
                self.client.run(cancel, self.fit_id, attempt, workers=[address], on_error="ignore")
            except Exception:  # noqa: BLE001 - its exchanges still end by the timeout
                pass

        for address in addresses:
            threading.Thread(target=tell, args=(address,), name="pystrom-fit-cancel", daemon=True).start()

    def _judge(self, futures: dict, ranks: list[str], lost: set[str]) -> _Outcome:
        """What the ranks' ends say: rank 0's result, or the error to raise, and whether a restart may help."""
        results = {r: f.future.result() for r, f in futures.items() if f.status == "finished"}
        errors = {r: f.future.exception() for r, f in futures.items() if f.status == "error"}
        if len(results) == len(ranks) and not errors and not any("deferred" in v for v in results.values()):
            return _Outcome(result=results[0], ranks=[results[r] for r in sorted(results)])
        not_kept = next((e for e in errors.values() if isinstance(e, CommunicatorNotKept)), None)
        if not_kept is not None and not lost:
            return _Outcome(error=not_kept, restartable=True, not_kept=True)
        moved = next((e for e in errors.values() if isinstance(e, PartitionNotHere)), None)
        if moved is not None and not lost:
            return _Outcome(error=moved, restartable=True, moved=True)
        theirs = [e for _, e in sorted(errors.items()) if not _of_the_cluster(e)]
        if theirs and not lost:  # the data's or the fit's own error, as one process would raise it (with a
            # worker lost, a rank's error may be its partitions' failing to be read again: the restart says)
            return _Outcome(error=theirs[0])
        deferred = [v["deferred"] for _, v in sorted(results.items()) if "deferred" in v]
        if deferred and not errors and not lost and len(results) == len(ranks):
            return _Outcome(error=deferred[0], restartable=isinstance(deferred[0], ClusterError))
        what = []
        if lost:
            what.append(f"worker(s) {', '.join(f'rank {ranks.index(a)} ({a})' for a in sorted(lost))} left the "
                        "cluster")  # fmt: skip
        what += [f"{type(e).__name__}: {e}" for _, e in sorted(errors.items())]
        silent = [r for r in range(len(ranks)) if r not in results and r not in errors and ranks[r] not in lost]
        if silent:
            what.append(f"rank(s) {silent} did not stop within {min(_GRACE, self.timeout):g} s of being cancelled")
        cause = next((e for _, e in sorted(errors.items())), None)
        timed_out = not lost and any(isinstance(e, CollectiveTimeoutError) for e in errors.values())
        error = (CollectiveTimeoutError if timed_out else ClusterError)(
            "; ".join(what) or "the ranks ended without a result"
        )
        error.__cause__ = cause
        return _Outcome(error=error, restartable=True)

    def _plan_again(self, error: BaseException | None) -> dict:
        """The placement asked of the scheduler afresh, where the one remembered from an earlier fit has
        gone stale (a partition moved since): not a restart."""
        with _KEPT_LOCK:
            _PLANNED.pop(self.planned, None)
            _PROBED.pop(self._probe_key(self.source._placement[1]), None)
        self.planned = None
        plan = self._partitions_back(error)
        _remember(_PLANNED, _plan_key(self.source._futures()), plan)
        return plan

    def _partitions_back(self, error: BaseException | None) -> dict:
        """The plan once every partition is in some worker's memory again (lost ones recomputed by the scheduler)."""
        import distributed

        end = time.monotonic() + self.timeout
        futures = list(self.futures.values())
        while True:
            placement = self.source._where()
            if placement is not None:
                self.source._placement = placement
                return placement[1]
            bad = [f for f in futures if f.status in ("error", "cancelled")]
            if bad:
                exc = bad[0].exception() if bad[0].status == "error" else None
                raise ClusterError(f"{error}; and partition {bad[0].key!r} could not be read again to restart the "
                                   f"fit: {exc or 'it was cancelled'}") from exc  # fmt: skip
            if time.monotonic() > end:
                raise ClusterError(f"{error}; and the lost partitions were not back in the workers' memory within "
                                   f"{self.timeout:g} s (pystrom.defaults.dask_fit_timeout)") from error  # fmt: skip
            try:
                distributed.wait(futures, timeout=_LOOK)
            except TimeoutError:
                pass

    def _finish(self, outcome: _Outcome, choice: _Choice, plan: dict, restarts: int, seconds: float) -> IRLSResult:
        source, first = self.source, outcome.result
        res = first["result"]
        source.rows, source.skipped = int(first["rows"]), int(first["skipped"])
        for category, message in first["warnings"]:
            warnings.warn(message, category, stacklevel=8)  # the caller of fit()
        passes = max(1, int(res.passes))
        source.fit_info = {
            "path": "workers",
            "comm": choice.comm,
            "workers": len(choice.ranks),
            "partitions": len(source._leaves),
            "passes": int(res.passes),
            "restarts": restarts,
            "reason": choice.reason,
            "comm_reused": bool(self.reused),
            "seconds": seconds,
            "ranks": [
                {
                    "rank": r["rank"],
                    "address": r["address"],
                    "partitions": r["partitions"],
                    "rows": r["local_rows"],
                    "pass_s": r["local_s"] / passes,
                    "allgather_s": r["comm_s"] / passes,
                    "loop_s": r["loop_s"],
                    "formed_s": r["formed_s"],
                    "prepare_s": r["prepare_s"],
                    "chained": r["chained"],  # passes queued on the GPU behind the step (dask/_chain.py)
                    "speculated": r["speculated"],
                    "hits": r["hits"],
                }
                for r in outcome.ranks
            ],
        }
        return res


def _nccl_problems(ranks: list[str], infos: dict) -> str:
    """Why these workers cannot form an NCCL communicator ('' when they can)."""
    problems = []
    for a in ranks:
        info = infos[a]
        if len(info["devices"]) != 1:
            problems.append(f"{a} holds partitions on {', '.join(info['devices'])}")
        elif "nccl" not in info:
            problems.append(f"{a}: {info.get('nccl_error', 'no NCCL')}")
    gpus = [infos[a].get("gpu") for a in ranks]
    shared = sorted({g for g in gpus if g is not None and gpus.count(g) > 1})
    if shared:
        problems.append(f"workers share a GPU ({len(shared)} GPU(s) held by more than one worker; NCCL needs one "
                        "GPU a rank)")  # fmt: skip
    return "; ".join(problems)


def _of_the_cluster(exc: BaseException) -> bool:
    """A failure of the workers or their links (restartable), not of the data or the fit."""
    return isinstance(exc, ClusterError) or type(exc).__name__ in (
        "KilledWorker",
        "CommClosedError",
        "FutureCancelledError",
        "CancelledError",
    )
