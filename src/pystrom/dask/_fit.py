"""Logistic regression over dask partitions: the pass source the IRLS solver runs, and predictions.

:class:`DaskSource` is one more :class:`~pystrom.ml._sources.Source`: each ``evaluate(w)`` is one
dask computation in which every partition (a pystrom Table of a :class:`PartitionedTable`, or a block
of dask arrays) makes its pass on its worker with the same fused kernel as a single-GPU fit
(:func:`~pystrom.dask._tasks.table_pass`), the vectors are summed in a tree on the workers
(:func:`~pystrom.dask._tasks.sum_passes`, eight at a time) and at most eight vectors of a few hundred
bytes reach the client, where the solver takes its Newton step and line search unchanged. When the
partitions are persisted, a pass skips the scheduler: the client asks each worker holding partitions
(``Client.run`` of :func:`~pystrom.dask._tasks.local_passes`) for the sum over the ones it holds,
which saves the scheduler's round trips (47 ms a pass measured on 16 partitions); a partition that
has moved since makes that pass a scheduled one. Predictions are dask arrays computed per partition
where it lives.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError, SchemaMismatchError, UnsupportedTypeError
from ..memory.backend import resolve_device
from ..ml._irls import IRLSResult
from ..ml._pass import layout_size
from ..ml._sources import SolverSpec, Source
from ..table import Table
from ._collection import PartitionedTable, Partitions, _dask_array, _Keys, _on_client_device
from ._tasks import _EXTRA, PartitionMoved, array_pass, local_passes, sum_passes, table_pass

__all__ = ["is_dask_input", "DaskSource", "dask_source", "dask_predict"]

_FAN_IN = 8


def is_dask_input(x: Any) -> bool:
    """A PartitionedTable or a dask array (without importing dask when it was never imported)."""
    import sys

    if isinstance(x, PartitionedTable):
        return True
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(x, da.Array)


class DaskSource(Source):
    """Passes over partitions on dask workers; only each pass's summed vector comes to the client.

    :meth:`solve` runs the whole Newton loop on the workers instead where it can (:mod:`._loop`)."""

    path = "client"

    def __init__(self, leaves: list[Any], task: Any, args: tuple, n_features: int, names: list[str], backend: Any):
        self._leaves = leaves  # per partition: (graph, key) or a tuple of (graph, key) for X, y, weights
        self._task = task
        self._args = args
        self.n_features = n_features
        self.names = names
        self.backend = backend
        self._placement: tuple[Any, dict] | None | bool = False  # False: not looked up yet

    def solve(self, spec: SolverSpec) -> IRLSResult:
        from ._loop import solve

        return solve(self, spec)

    def _graph(self, w: np.ndarray, cw: tuple[float, float], check: bool) -> Partitions:
        from dask.base import tokenize

        token = tokenize(self._leaves_token, w.tobytes(), cw, check)
        name = f"pystrom-logit-pass-{token}"
        graph: dict = {}
        level: list = []
        for i, leaf in enumerate(self._leaves):
            inputs = []
            for g, k in leaf:
                graph.update(g)
                inputs.append(k)
            key = (name, 0, i)
            graph[key] = (self._task, *inputs, *self._args, cw, w, check)
            level.append(key)
        depth = 0
        # Sums of at most _FAN_IN vectors are made on the client: a task of its own would add a hop
        # (each vector sent to the summing worker, then the sum to the client) to every pass.
        while len(level) > _FAN_IN:
            depth += 1
            level_next = []
            for j in range(0, len(level), _FAN_IN):
                key = (name, depth, j // _FAN_IN)
                graph[key] = (sum_passes, *level[j : j + _FAN_IN])
                level_next.append(key)
            level = level_next
        return Partitions(name, graph, level)

    @property
    def _leaves_token(self) -> Any:
        return [[k for _, k in leaf] for leaf in self._leaves]

    def _futures(self) -> list[Any] | None:
        """The futures of every partition's inputs, where all are persisted (None: some are lazy)."""
        try:
            from distributed import Future
        except ImportError:
            return None
        futures = []
        for leaf in self._leaves:
            for g, k in leaf:
                if k is not None:
                    if not isinstance(g.get(k), Future):
                        return None
                    futures.append(g[k])
        return futures or None

    def _where(self) -> tuple[Any, dict] | None:
        """(client, {worker address: [input keys of each partition it holds]}) when every partition's
        inputs are persisted and held together by one worker; None otherwise (lazy inputs are read by
        scheduled tasks in every pass: the out-of-core fit)."""
        futures = self._futures()
        if futures is None:
            return None
        client = futures[0].client
        who = client.who_has(futures)
        plan: dict = {}
        for leaf in self._leaves:
            keys = tuple(k for _, k in leaf)
            holders = None
            for k in keys:
                if k is not None:
                    held = set(who.get(k) or ())
                    holders = held if holders is None else holders & held
            if not holders:
                return None  # a partition not in memory, or its X and y blocks on different workers
            plan.setdefault(min(holders), []).append(keys)
        return client, plan

    def _total(self, w: np.ndarray, cw: tuple[float, float], check: bool = False) -> np.ndarray:
        import dask

        if not self._leaves:
            raise DataError("the collection has no partitions: nothing to fit")
        w = np.asarray(w, dtype=np.float64)
        if self._placement is False:
            self._placement = self._where()
        if self._placement is not None:
            client, plan = self._placement
            try:
                got = client.run(local_passes, plan, self._task, self._args, cw, w, check, workers=list(plan))
                done = [v for v in got.values() if v is not None]
                if sum(n for n, _ in done) == len(self._leaves):  # every partition summed once
                    return np.asarray(sum_passes(*(v for _, v in done)), dtype=np.float64)
            except (PartitionMoved, OSError):  # OSError: a worker of the plan has gone (its comm closed)
                pass
            self._placement = self._where()  # the placement changed: this pass is scheduled instead
        (vecs,) = dask.compute(_Keys(self._graph(w, cw, check)))
        return np.asarray(sum_passes(*vecs), dtype=np.float64)

    def _run(self, w: np.ndarray, first: bool) -> np.ndarray:
        total = self._total(w, self.class_weight)
        vec, (rows, skipped, single) = total[:-_EXTRA], total[-_EXTRA:]
        if first:
            self.rows, self.skipped = int(rows), int(skipped)
        self.single_precision = self.single_precision or bool(single)
        if vec[layout_size(self.n_features) - 3]:  # rows with a non-finite eta: find the column on its worker
            self._total(w, self.class_weight, check=True)
            raise DataError("the pass met non-finite values (NaN/Inf) in the features")
        return vec

    def batches(self) -> list:
        return []  # the partitions stay on the workers (_run names a non-finite column from there)

    def counts(self) -> tuple[float, float]:
        total = self._total(np.zeros(self.n_features + 1), (1.0, 1.0))
        m = layout_size(self.n_features)
        weight, positive = total[m - 5], total[m - 4]
        return weight - positive, positive


def _client_backend(device: Any) -> Any:
    """The device the model reports (``device_``): the workers' spelling resolved here, CPU where unknown."""
    try:
        return resolve_device(device)
    except Exception:
        return resolve_device("cpu")


def dask_source(X: Any, y: Any, sample_weight: Any, columns: Any, target: Any) -> tuple[DaskSource, np.ndarray, list]:
    """(the source, the classes, the feature names) for a PartitionedTable or dask arrays."""
    from ..ml._data import table_features

    if isinstance(X, PartitionedTable):
        weight = sample_weight if isinstance(sample_weight, str) else None
        if (sample_weight is not None and weight is None) or y is not None:
            raise UnsupportedTypeError(
                "with a pystrom.dask collection, pass target='name' (and sample_weight='column'), not arrays"
            )
        if target is None or not isinstance(target, str):
            raise DataError(f"fitting a pystrom.dask collection needs target='column name'; got target={target!r}")
        empty = Table.from_arrow(X.schema.empty_table(), device="cpu")
        names = table_features(empty, columns, [target] + ([weight] if weight else []))
        if target in names:
            raise SchemaMismatchError(f"column {target!r} is both the target and a feature")
        import pyarrow.types as pt

        ttype = empty.column(target).type
        if not (pt.is_integer(ttype) or pt.is_floating(ttype) or pt.is_boolean(ttype)):
            raise UnsupportedTypeError(f"target column {target!r} has type {ttype}; it must be bool or numeric")
        if weight is not None:
            empty.column(weight)  # names the table's columns when it is not one
        X._check_open()
        graph = X.__dask_graph__()
        leaves = [[(graph, k)] for k in X.__dask_keys__()]
        source = DaskSource(leaves, table_pass, (names, target, weight), len(names), names, _client_backend(X._device))
        return source, np.array([False, True]), names
    # dask arrays
    import dask.array as da

    if columns is not None or target is not None:
        raise DataError("columns= and target= apply to Tables and pystrom.dask collections; for arrays pass fit(X, y)")
    if X.ndim != 2:
        raise SchemaMismatchError(f"X must be a 2-D dask array (rows x features); got {X.ndim}-D shape {X.shape}")
    if y is None:
        raise DataError("LogisticRegression requires y to be passed, but the target y is None")
    if not isinstance(y, da.Array):
        raise UnsupportedTypeError(f"with a dask array X, y must be a dask array too; got {type(y).__name__}")
    k = X.shape[1]
    if X.numblocks[1] != 1:
        X = X.rechunk({1: k})
    blocks = [y]
    if sample_weight is not None:
        if not isinstance(sample_weight, da.Array):
            raise UnsupportedTypeError("with a dask array X, sample_weight must be a dask array too")
        blocks.append(sample_weight)
    for other, what in zip(blocks, ["y", "sample_weight"]):
        if (
            other.ndim != 1
            or other.numblocks[0] != X.numblocks[0]
            or (not any(np.isnan(c) for c in X.chunks[0]) and other.chunks[0] != X.chunks[0])
        ):
            raise SchemaMismatchError(
                f"{what} must be a 1-D dask array chunked along the rows as X is: X has row chunks {X.chunks[0]}, "
                f"{what} has {other.chunks[0] if other.ndim else 'none'} (rechunk one of them)"
            )
    arrays = [X, *blocks]
    graphs = [a.__dask_graph__() for a in arrays]
    keys = [a.__dask_keys__() for a in arrays]
    leaves = []
    for i in range(X.numblocks[0]):
        leaf = [(graphs[0], keys[0][i][0]), (graphs[1], keys[1][i])]
        leaf.append((graphs[2], keys[2][i]) if sample_weight is not None else ({}, None))
        leaves.append(leaf)
    names = [f"x{j}" for j in range(k)]
    from dask.array.utils import meta_from_array

    backend = _client_backend("cpu" if isinstance(meta_from_array(X), np.ndarray) else None)
    return DaskSource(leaves, array_pass, (), k, names, backend), np.array([False, True]), names


def dask_predict(model: Any, method: str, X: Any, columns: Sequence[str] | None, table_dtype: Any) -> Any:
    """``model.<method>`` (decision_function, predict, predict_proba, ...) as a dask array: each block
    is the in-memory method on one partition's features, run on its worker, so the answers are the
    single-process ones. ``table_dtype(table, names)``: the dtype the model multiplies columns in."""
    from dask.array.utils import meta_from_array

    if isinstance(X, PartitionedTable):
        names = list(columns) if columns is not None else list(getattr(model, "feature_names_in_", []))
        if not names:
            raise DataError("this model was fitted on an array: pass columns=[...] to predict from a collection")
        X._check_open()
        empty = Table.from_arrow(X.schema.empty_table(), device="cpu")
        empty.to_array(names, dtype=table_dtype(empty, names))  # unknown or non-numeric columns: named now
        k = model.coef_.shape[1]
        if len(names) != k:
            raise DataError(f"{len(names)} columns given, but LogisticRegression is expecting {k} features as input")
        # Each partition goes through the in-memory Table method, so NULL features give NaN rows as there.
        parts = X._parts.derive(f"pystrom-{method}", _apply_table, model, method, names, token=uuid.uuid4().hex,
                                keep_rows=True)  # fmt: skip
        if method in ("predict_proba", "predict_log_proba"):
            meta = np.empty((0, 2), dtype=np.float64)
        else:
            meta = np.empty(0, dtype=model.classes_.dtype if method == "predict" else np.float64)
        return _dask_array(parts, _on_client_device(meta, X._device))
    if columns is not None:
        raise DataError("columns= applies to pystrom.dask collections and Tables, not to dask arrays")
    if X.ndim != 2:
        raise SchemaMismatchError(f"X must be a 2-D dask array (rows x features); got {X.ndim}-D")
    k = model.coef_.shape[1]
    if X.shape[1] != k:
        raise DataError(f"X has {X.shape[1]} features, but LogisticRegression is expecting {k} features as input")
    if X.numblocks[1] != 1:
        X = X.rechunk({1: k})
    if method in ("predict_proba", "predict_log_proba"):
        meta = meta_from_array(X, ndim=2, dtype=np.float64)
        return X.map_blocks(_apply, model, method, chunks=(X.chunks[0], (2,)), dtype=np.float64, meta=meta)
    dtype = model.classes_.dtype if method == "predict" else np.dtype(np.float64)
    meta = meta_from_array(X, ndim=1, dtype=dtype)
    return X.map_blocks(_apply, model, method, drop_axis=1, dtype=dtype, meta=meta)


def _apply_table(table: Table, model: Any, method: str, names: list[str]) -> Any:
    with table._live().backend.activate():
        return getattr(model, method)(table, columns=names)


def _apply(block: Any, model: Any, method: str) -> Any:
    return getattr(model, method)(block)
