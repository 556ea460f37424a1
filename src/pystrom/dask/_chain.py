"""A rank's passes chained on its GPU: the pass, the all-gather and the Newton step queued on one stream,
and the next pass queued behind them before the host has seen this one.

Issue 35: on 4 H200s a pass over 40M rows cost the host ~0.3 ms beyond the GPU's 0.2 (the launch and
its wait, the all-gather's two copies and its wait, the solver's step in Python), so 4 GPUs were no
faster than 2. In-memory fits had the same gap and closed it by speculation (ml/_narrow.py's module
docstring): the step after a pass is computed on the device and the pass at it queued at once. Here the
same holds across ranks, because every rank sums the same rows in the same order:

1. ``logit_parts`` (kernels/logistic.cu) over this worker's partitions, its sums and the weights it used
   written into the row the all-gather sends (the rest of the row, the counts and flags, is constant);
2. ``ncclAllGather`` of that row (:meth:`._comm.NcclComm.enqueue_allgather`; none for one rank);
3. ``logit_gather_step``: the rows copied to mapped host memory (the host checks them as
   :class:`._rank_source.RankSource` does an unchained exchange's), their sums in rank order, and under the
   solver's step rule the Newton step and the weights after it;
4. with the solver's plan ``ahead``, steps 1-3 again at those weights (a speculative pass). The host
   hands the solver the device's step; when the solver asks for exactly the weights the device formed,
   that pass is its answer, already queued. Any other request is queued behind it: its work and its
   all-gather are lost, but every rank makes the same requests, so the ranks' collectives stay in step.

The host waits for a pass's step 3 through the communicator (its timeout, cancel flag and NCCL's own
errors). Used where every rank of an NCCL (or one-rank) fit has its partitions in one fused launch and
mapped host memory (:class:`._rank_source.RankSource` decides with the first exchange, so all ranks
chain or none does).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..ml._narrow import (
    STEP_TAIL,
    PartsPass,
    _mapped,
    layout_size,
    pass_weights,
    speculation_hit,
    step_rule,
)

__all__ = ["ChainedPasses", "prune", "retire"]

_STRIDE = 9  # STEP_STRIDE in kernels/logistic.cu
_RETIRED: list[tuple[Any, Any]] = []  # (chain, an event after its last work): kept until the event is done
_RETIRED_LOCK = threading.Lock()


def retire(chain: ChainedPasses) -> None:
    """Keep ``chain`` (its buffers and the partitions its pass reads) alive until its stream has passed
    what is queued now: after a communicator is aborted its kernels still run, and memory freed to CuPy's
    pool under them could be handed out again. Kept in ``_RETIRED`` until :func:`prune` (here, and at each
    rank's start) finds it done. Not waited for here: a bounded wait of 5 s (259406b) made the NCCL tests
    of a worker killed mid-fit fail on 2 H200s (the fit took 54 s against the test's 30) and passed with it
    off, so the rank returns at once and its error reaches the client while the others are cancelled."""
    import cupy

    event = cupy.cuda.Event(disable_timing=True)
    event.record(chain.stream)
    prune()
    if not event.done:
        with _RETIRED_LOCK:
            _RETIRED.append((chain, event))


def prune() -> None:
    """Let go of retired chains whose streams are done (each rank's start looks, so that none holds its
    partitions' memory past the next fit on that worker)."""
    if _RETIRED:
        with _RETIRED_LOCK:
            _RETIRED[:] = [(c, e) for c, e in _RETIRED if not e.done]


class ChainedPasses:
    """The chained passes of one rank (module docstring). ``fused``: its partitions' pass; ``row``: its
    constant row, laid out as :class:`._rank_source.RankSource` sends it (the pass vector's M sums, the counts, the
    weights, the flags), of which a pass writes the sums at 0 and the weights at ``weights_at``; ``comm``:
    an NCCL communicator, or None for one rank."""

    def __init__(self, fused: PartsPass, row: np.ndarray, weights_at: int, width: int, comm: Any, ordinal: int):
        import cupy

        self.fused = fused
        self.k = k = fused.k
        self.m = layout_size(k)
        self.comm = comm
        self.world = comm.world if comm is not None else 1
        self.rowlen = len(row)
        self.width = width
        self._weights_at = weights_at
        with cupy.cuda.Device(ordinal):
            self.stream = comm.stream if comm is not None else cupy.cuda.Stream(non_blocking=True)
            self.mine = cupy.asarray(np.tile(np.asarray(row, dtype=np.float64), (2, 1)))  # a row per slot
            self.rows = cupy.empty((2, self.world * self.rowlen)) if self.world > 1 else None
            self.totals = cupy.zeros((2, width))
            self.wnext = cupy.zeros((2, _STRIDE + 1))  # per slot: the next weights and the flag
            self._slot_size = self.world * self.rowlen + width + STEP_TAIL
            self.host, ptr = _mapped(2 * self._slot_size, np.float64)
        if self.host is None:
            raise RuntimeError("no mapped host memory on this GPU")
        self._host_ptr = ptr
        self.rule: tuple | None = None  # the solver's step rule (plan)
        self.ahead = False
        self._mask = 0
        self.launches = 0  # launch ids: 1, 2, ... (slot = id % 2)
        self.pending: tuple | None = None  # the speculative launch: (id, class weights)
        self.speculated = self.hits = 0

    def plan(self, active: np.ndarray, n_free_features: int, l2: float, ahead: bool = True) -> None:
        """The solver's step rule, as :meth:`~pystrom.ml._narrow.KernelPass.plan` takes it."""
        self.rule, self._mask = step_rule(active, n_free_features, l2)
        self.ahead = bool(ahead)

    def _views(self, slot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        base = slot * self._slot_size
        rows_end = base + self.world * self.rowlen
        totals_end = rows_end + self.width
        h = self.host
        return h[base:rows_end], h[rows_end:totals_end], h[totals_end : base + self._slot_size]

    def launch(self, cw: tuple[float, float], w: np.ndarray | None) -> int:
        """Queue steps 1-3 (module docstring) at ``w`` (None: at the step the launch before wrote); its id."""
        self.launches += 1
        lid = self.launches
        slot = lid % 2
        wsrc = self.wnext[(lid - 1) % 2].data.ptr if w is None else 0
        weights = pass_weights(w)
        mine = self.mine[slot].data.ptr
        base = self._host_ptr + 8 * slot * self._slot_size
        n = self.world * self.rowlen
        with self.stream:
            self.fused.launch(cw, weights, wsrc=wsrc, out=mine, wout=mine + 8 * self._weights_at)
            if self.world > 1:
                self.comm.enqueue_allgather(mine, self.rows[slot].data.ptr, self.rowlen)
            rows = self.rows[slot].data.ptr if self.world > 1 else mine
            nfree, l2 = (self.rule[1], self.rule[2]) if self.rule else (0, 0.0)
            step = self.fused.build(cw).step_fn  # the gather step of the build the pass ran
            step((1,), (128,), (np.uint64(rows), np.int32(self.world), np.int32(self.rowlen), np.int32(self.width),
                 np.uint64(base), self.totals[slot], np.uint64(base + 8 * n), *weights, np.uint64(wsrc),
                 np.uint32(self._mask), np.int32(nfree), np.float64(l2), np.int32(self.rule is not None),
                 np.uint64(base + 8 * (n + self.width)), self.wnext[slot]))  # fmt: skip
        return lid

    def __call__(self, cw: tuple[float, float], w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The pass at ``w``, waited for: every rank's row (world x row length), the totals in rank order,
        and the Newton step under the planned rule (None: no rule, or the step failed on the device)."""
        import cupy

        lid = self._claim(cw, w)
        if lid is None:
            lid = self.launch(cw, w)
        event = cupy.cuda.Event(disable_timing=True)
        event.record(self.stream)
        # the pass the solver most likely asks for next; every rank decides alike (the same class weights,
        # and sample weights on all or none: the same build, PartsPass.has_sw)
        if self.rule is not None and self.ahead and self.fused.build(cw).spec_ok:
            self.pending = (self.launch(cw, None), cw)
            self.speculated += 1
        self._wait(event)
        rows, totals, tail = self._views(lid % 2)
        ok = self.rule is not None and tail[2 * _STRIDE] == 1.0
        step = tail[: self.k + 1].copy() if ok else None
        return rows.reshape(self.world, self.rowlen).copy(), totals.copy(), step

    def _claim(self, cw: tuple[float, float], w: np.ndarray) -> int | None:
        """The pending speculative launch if it is the pass at ``w`` (else its work is lost)."""
        if self.pending is None:
            return None
        lid, spec_cw = self.pending
        self.pending = None
        before = self._views((lid - 1) % 2)[2]  # the pass it followed: done, its tail written
        if speculation_hit(before, self.k, spec_cw, cw, w):
            self.hits += 1
            return lid
        return None

    def _wait(self, event: Any) -> None:
        """Until ``event`` (with a communicator: its deadline, cancel flag and NCCL's errors)."""
        if self.comm is not None:
            self.comm.wait_for(lambda: event.done)
        else:
            event.synchronize()

    def close(self) -> None:
        """Wait for a speculative pass still queued (every rank queued it: its all-gather completes)."""
        import cupy

        if self.pending is not None:
            self.pending = None
            event = cupy.cuda.Event(disable_timing=True)
            event.record(self.stream)
            self._wait(event)
