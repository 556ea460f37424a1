"""A rank's passes: this worker's partitions' sums (:class:`LocalPasses`) and the source its solver runs on
(:class:`RankSource`): the sums all-gathered with every other rank's and added in rank order, through
the host or chained on the GPU (:mod:`._chain`). :mod:`._rank` runs the solver over it on each worker.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ClusterError, DataError
from ..memory.backend import resolve_device
from ..ml._pass import batch_pass, layout_size
from ..ml._sources import Source
from ._comm import Comm
from ._tasks import _EXTRA, _check_finite, _empty_pass, array_batch, sum_passes, table_batch

if TYPE_CHECKING:
    from ._rank import RankJob

__all__ = ["CHAIN", "LocalPasses", "RankSource", "Deferred"]

CHAIN = True  # chain the passes on the GPU where every rank can (dask/_chain.py); False: the host's exchanges


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


class Deferred(Exception):
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
            raise Deferred(DataError("the pass met non-finite values (NaN/Inf) in the features"))
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
            raise Deferred(ClusterError(f"the fit stopped: {ranks} failed (its error is reported)"))
        coefs = rows[:, width : width + p].view(np.uint64)
        if not (coefs == coefs[0]).all():
            odd = [int(r) for r in np.flatnonzero((coefs != coefs[0]).any(axis=1))]
            raise ClusterError(f"at pass {self.passes} the coefficients of {', '.join(map(self._comm.who, odd))} "
                               f"differ from {self._comm.who(0)}'s: the workers' solvers diverged (their hosts "
                               "round differently?); use pystrom.defaults.dask_fit_loop='client'")  # fmt: skip
