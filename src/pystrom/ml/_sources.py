"""How one pass over the data is made: in memory (one batch) or streamed (a scan, many batches).

The solver calls :meth:`Source.evaluate` once per pass; only this differs between the two kinds.
The first pass also validates (NaN/Inf in features, rows skipped for NULLs, the class counts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._settings import defaults
from ..errors import DataError
from ..memory.backend import Backend
from ..memory.bitmap import count_true
from ._data import Batch, locate_nonfinite, prefetch
from ._irls import IRLSResult, IRLSSolver
from ._narrow import KernelPass, uses_kernel
from ._pass import (
    F32_LL_ATOL,
    F32_LL_RTOL,
    MAX_KERNEL_FEATURES,
    PassTotals,
    batch_pass,
    combine,
    layout_size,
    reduced_hessians,
)
from ._staging import HostStaging
from ._wide import WidePass, uses_wide

__all__ = ["Source", "ArraySource", "ScanSource", "SolverSpec"]


@dataclass(frozen=True)
class SolverSpec:
    """What the estimator asks of the solver, apart from the data: picklable, so that a source whose data
    lives elsewhere (pystrom.dask's workers) can build the same solver next to it (:meth:`Source.solve`)."""

    n_features: int
    fit_intercept: bool
    l2: float
    max_iter: int
    tol: float
    rule: str = "pystrom"

    def build(self, source: Source) -> IRLSSolver:
        """The solver whose passes are ``source``'s."""
        return IRLSSolver(
            source.evaluate,
            self.n_features,
            self.fit_intercept,
            self.l2,
            self.max_iter,
            self.tol,
            source.ll_rounding,
            rule=self.rule,
            approximate=source.approximate_hessian(),
            plan_steps=source.plan_steps,
        )


class Source:
    backend: Backend
    n_features: int
    names: list[str]
    path = "memory"  # how the passes are made, for the model's fit_info_
    class_weight: tuple[float, float] = (1.0, 1.0)
    rows: int = 0  # rows used, known after the first pass
    skipped: int = 0  # rows left out for NULLs, known after the first pass
    passes: int = 0
    single_precision: bool = False  # some batch was float32: the pass used float32 sigmoids and logs
    _hessian = "float64"  # of the pass being made: "float32" for the features' block of a wide fit

    def solve(self, spec: SolverSpec) -> IRLSResult:
        """Run the solver over this source's passes; ``fit_info`` then says how (the model's ``fit_info_``).
        A source may run the same solver elsewhere (pystrom.dask: on the workers holding the data)."""
        res = spec.build(self).solve()
        self.fit_info = {"path": self.path, "device": self.backend.device, "passes": int(res.passes)}
        return res

    fit_info: dict = {}

    def ll_rounding(self) -> tuple[float, float]:
        """How exact a pass's log-likelihood is: (relative, per unit of row weight)."""
        return (F32_LL_RTOL, F32_LL_ATOL) if self.single_precision else (0.0, 0.0)

    def batches(self) -> Iterable[Batch]:
        raise NotImplementedError

    def reduced_hessians(self) -> tuple[tuple[str, float], ...]:
        """The reduced precisions a pass may form its Hessian in (``evaluate(w, exact=False,
        rounding=u)``), cheapest first, with their unit roundings (:func:`._pass.reduced_hessians`):
        none for :data:`MAX_KERNEL_FEATURES` features or fewer (the fused narrow kernel's float64
        sums cost nothing extra), for ``pystrom.defaults.logit_hessian = "float64"``, and for a source
        that makes its own passes (a dask source's workers always sum in float64)."""
        if not (self._batched and self.n_features > MAX_KERNEL_FEATURES):
            return ()
        return reduced_hessians(self.backend, defaults.logit_hessian)

    def approximate_hessian(self) -> tuple[float, ...]:
        """The unit roundings of :meth:`reduced_hessians`, for the solver."""
        return tuple(u for _, u in self.reduced_hessians())

    _batched = False  # the pass goes through batch_pass here (ArraySource, ScanSource)

    def evaluate(self, w: np.ndarray, exact: bool = True, rounding: float = 0.0) -> PassTotals:
        """One pass at ``w``. ``exact=False`` forms the Hessian in the reduced precision of unit
        ``rounding`` where :meth:`reduced_hessians` offers it."""
        first = self.passes == 0
        self.passes += 1
        modes = {u: mode for mode, u in self.reduced_hessians()}
        self._hessian = "float64" if exact or first or rounding not in modes else modes[rounding]
        vec = self._run(w, first)
        totals = PassTotals.unpack(vec, self.n_features)
        totals.exact_hessian = self._hessian == "float64"
        if self._step is not None:
            totals.newton_step, totals.step_rule = self._step, self._rule
        if totals.nonfinite_rows:  # X had NaN/Inf (any such row makes eta non-finite at w = 0)
            for batch in self.batches():
                with batch.backend.activate():
                    if not bool(batch.backend.xp.isfinite(batch.X).all()):
                        raise locate_nonfinite(batch.backend.xp, batch.X, batch.names)
            raise self._overflow_error(w, "w.x")
        if not (
            np.isfinite(totals.hessian).all()
            and np.isfinite(totals.gradient).all()
            and np.isfinite(totals.log_likelihood)
        ):  # finite values whose squares or sums overflow float64: no solver may see them (LAPACK can hang)
            raise self._overflow_error(w, "X^T A X")
        if first:
            self._check_classes(totals)
        return totals

    def _overflow_error(self, w: np.ndarray, what: str) -> DataError:
        """The error for sums that overflowed float64, naming the column that drives them: the largest
        |w_j| max|x_j| (or the largest max|x_j| at w = 0)."""
        top = np.zeros(self.n_features)
        for batch in self.batches():
            if batch.X.shape[0]:
                with batch.backend.activate():
                    m = batch.backend.to_host(batch.backend.xp.abs(batch.X).max(axis=0))
                top = np.maximum(top, np.asarray(m, dtype=np.float64))
        with np.errstate(all="ignore"):
            drive = np.abs(w[: self.n_features]) * top if np.any(w[: self.n_features]) else top
        j = int(np.nanargmax(drive)) if len(drive) else 0
        return DataError(
            f"{what} overflows float64 (over- or underflow in an intermediate calculation): column "
            f"{self.names[j]!r} holds values up to {top[j]:.3g}; rescale it (e.g. standardise the features)"
        )

    def _check_classes(self, t: PassTotals) -> None:
        if self.rows == 0:
            raise DataError(
                "no rows to fit" + (f": all {self.skipped:,} rows hold NULLs and were skipped" if self.skipped else "")
            )
        if t.weight_sum <= 0:
            raise DataError("sample weights are all zero: at least one row needs a non-zero weight")
        if t.positive_weight <= 0 or t.positive_weight >= t.weight_sum:
            only = "1/True" if t.positive_weight > 0 else "0/False"
            raise DataError(f"the target has one class only ({only}, counting weights); logistic regression needs two")

    def _run(self, w: np.ndarray, first: bool) -> np.ndarray:
        raise NotImplementedError

    _step: np.ndarray | None = None  # the Newton step the last pass computed under _rule (plan_steps)
    _rule: tuple | None = None

    def plan_steps(
        self, active: np.ndarray, n_free_features: int, l2: float, ahead: bool = True, exact_next: bool = False
    ) -> None:
        """The solver's step rule (free parameters, features among them, L2 penalty), for a source whose
        passes compute the next Newton step themselves (:mod:`._narrow`, :mod:`._wide`; ``ahead``: and
        start the pass at it before it is asked for, ``exact_next``: with a float64 Hessian); others
        ignore it."""

    def close(self) -> None:
        """Release what the fit held for its passes (the fit calls it when it ends, also on an error)."""

    def counts(self) -> tuple[float, float]:
        """(rows of class 0, rows of class 1), weighted by sample_weight (as scikit-learn's 'balanced')."""
        raise NotImplementedError


class ArraySource(Source):
    """One batch in memory (a NumPy/CuPy array, or one Table)."""

    _batched = True

    def __init__(self, batch: Batch):
        self.batch = batch
        self.backend = batch.backend
        self.n_features = batch.X.shape[1]
        self.names = batch.names
        self.rows = batch.X.shape[0]
        self.skipped = batch.skipped
        self.single_precision = batch.X.dtype == np.float32
        self._passes: KernelPass | WidePass | None = None  # in-memory passes on a GPU, set up once
        self._plan: tuple | None = None
        self._exact_next = False

    def batches(self) -> Iterable[Batch]:
        return [self.batch]

    def plan_steps(
        self, active: np.ndarray, n_free_features: int, l2: float, ahead: bool = True, exact_next: bool = False
    ) -> None:
        self._plan = (np.array(active), int(n_free_features), float(l2), bool(ahead))
        self._exact_next = exact_next
        if self._passes is not None:
            self._passes.plan(*self._plan)

    def close(self) -> None:
        if self._passes is not None:
            with self.backend.activate():
                self._passes.close()

    def _run(self, w: np.ndarray, first: bool) -> np.ndarray:
        b = self.batch
        self._step = None
        with self.backend.activate():
            if self._passes is None and b.X.shape[0]:
                if uses_kernel(self.backend, b.X):
                    self._passes = KernelPass(b.X, b.y, b.sw, self.backend.ordinal, to_host=True)
                elif uses_wide(self.backend, b.X) and not defaults.logit_chunk_rows:
                    self._passes = WidePass(self.backend, b.X, b.y, b.sw, to_host=True)
                if self._passes is not None and self._plan is not None:
                    self._passes.plan(*self._plan)
            if self._passes is not None:
                # the pass queued after this one: in this one's precision, or after the first (always
                # float64) in the cheapest reduced one, which the solver's guard most often admits
                reduced = self.reduced_hessians()
                after = "float64" if self._exact_next else reduced[0][0] if first and reduced else self._hessian
                vec, self._step = self._passes(self.class_weight, w, self._hessian, after)
                self._rule = self._passes.rule
                return vec
            out = batch_pass(
                self.backend, b.X, b.y, b.sw, self.class_weight, w, self._hessian, defaults.logit_chunk_rows
            )
            return np.asarray(self.backend.to_host(out), dtype=np.float64)

    def counts(self) -> tuple[float, float]:
        b = self.batch
        with self.backend.activate():
            if b.sw is None:
                pos = float(count_true(b.y))
                return float(self.rows) - pos, pos
            pos = float((b.sw * b.y).sum())
            return float(b.sw.sum()) - pos, pos


class ScanSource(Source):
    """A re-iterable of Tables: every pass iterates it again. Host Tables fitted on a GPU stream
    through ``staging`` (:class:`~pystrom.ml._staging.HostStaging`: pinned memory, one async copy a
    batch into reused device buffers); other scans through :func:`~pystrom.ml._data.prefetch` (fetch
    and transfer of batch k+1 on a worker thread overlap compute on batch k)."""

    _batched = True
    path = "scan"

    def __init__(
        self,
        scan: Iterable[Any],
        prepare: Callable[[Any], Batch],
        backend: Backend,
        first: Batch,
        staging: HostStaging | None = None,
    ):
        self.scan = scan
        self.prepare = prepare
        self.backend = backend
        self.n_features = first.X.shape[1]
        self.names = first.names
        self.staging = staging

    def close(self) -> None:
        if self.staging is not None:
            self.staging.close()

    def batches(self) -> Iterable[Batch]:
        return prefetch(self.scan, self.prepare, self.backend)

    def _run(self, w: np.ndarray, first: bool) -> np.ndarray:
        backend = self.backend
        total = None
        rows = skipped = 0
        stream_cm: Any = contextlib.nullcontext()
        wait_each = backend.kind == "cuda"
        if self.staging is not None:  # the passes wait for the copies through events, on the staging's stream
            stream_cm, wait_each = self.staging.compute_context(), False
            batches: Any = self.staging.batches(self.scan, self.prepare)
        else:
            batches = self.batches()
            if wait_each:  # our kernels on a non-blocking stream, so the worker's copies overlap them
                stream_cm = backend.xp.cuda.Stream(non_blocking=True)
        with backend.activate(), stream_cm, contextlib.closing(batches):
            for batch in batches:
                if batch.X.shape[1] != self.n_features:
                    raise DataError(
                        f"a batch of the scan has {batch.X.shape[1]} feature columns, the first had {self.n_features}"
                    )
                rows += batch.X.shape[0]
                self.single_precision = self.single_precision or batch.X.dtype == np.float32
                skipped += batch.skipped
                out = batch_pass(
                    backend, batch.X, batch.y, batch.sw, self.class_weight, w, self._hessian, defaults.logit_chunk_rows
                )
                total = out if total is None else _combine_device(backend, total, out)
                if wait_each:  # the batch's memory may go back to the pool only after its kernels ran
                    backend.synchronize()
                del batch
            if total is None:
                vec = np.zeros(layout_size(self.n_features))
                vec[-1] = np.inf
            else:
                vec = np.asarray(backend.to_host(total), dtype=np.float64)
        if first:
            self.rows, self.skipped = rows, skipped
        return vec

    def counts(self) -> tuple[float, float]:
        saved = self.class_weight
        self.class_weight = (1.0, 1.0)
        try:
            vec = self._run(np.zeros(self.n_features + 1), first=True)
        finally:
            self.class_weight = saved
        t = PassTotals.unpack(vec, self.n_features)
        return t.weight_sum - t.positive_weight, t.positive_weight


def _combine_device(backend: Backend, a: Any, b: Any) -> Any:
    if backend.kind == "cpu":
        return combine(a, b)
    xp = backend.xp
    out = a + b
    out[-1] = xp.minimum(a[-1], b[-1])
    return out
