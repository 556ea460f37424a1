"""``PartitionedTable``: a dask collection whose partitions are pystrom Tables living on the workers.

It implements Dask's collection protocol (``__dask_graph__``, ``__dask_keys__``,
``__dask_postcompute__``, ``__dask_postpersist__``, ``__dask_tokenize__``) over a plain graph of one
task per partition, so ``dask.compute``/``dask.persist``, ``Client.compute``, the dashboard and
``distributed.progress`` treat it as any dask collection. Derived collections (``filter``,
``map_partitions``) add one task per partition on top; arrays and DataFrames are dask's own
collections built over the same keys. Nothing here moves a partition: ``compute()`` alone brings
rows to the client.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from dask.base import DaskMethodsMixin, tokenize

from ..errors import ClosedError, InvalidArgumentError, SchemaMismatchError
from ..memory.backend import resolve_device
from ..table import Table
from ._tasks import concat_tables, filter_rows, row_count, to_array, to_frame

__all__ = ["PartitionedTable", "Partitions", "check_device"]


class Partitions:
    """A graph with one output key per partition, and what keeps its reads valid (a PostgreSQL snapshot)."""

    def __init__(self, name: str, graph: dict, keys: list, snapshot: Any = None, rows: list[int] | None = None):
        self.name = name
        self.graph = graph
        self.keys = keys
        self.snapshot = snapshot
        self.rows = rows  # rows per partition, once counted

    @classmethod
    def from_tasks(cls, prefix: str, tasks: Sequence[tuple], snapshot: Any = None, token: Any = None) -> Partitions:
        """``token``: what else the tasks' results depend on (a file's size and time), so that keys
        differ when the data may: the scheduler takes equal keys for equal results."""
        name = f"{prefix}-{tokenize(prefix, [t[1:] for t in tasks], token)}"
        keys = [(name, i) for i in range(len(tasks))]
        return cls(name, dict(zip(keys, tasks)), keys, snapshot)

    def derive(self, prefix: str, fn: Callable, *args: Any, token: Any = None, keep_rows: bool = False) -> Partitions:
        """One more task per partition: ``fn(partition, *args)``."""
        name = f"{prefix}-{tokenize(self.name, token if token is not None else (fn, args))}"
        keys = [(name, i) for i in range(len(self.keys))]
        graph = dict(self.graph)
        graph.update({k: (fn, parent, *args) for k, parent in zip(keys, self.keys)})
        return Partitions(name, graph, keys, self.snapshot, self.rows if keep_rows else None)


class PartitionedTable(DaskMethodsMixin):
    """A table cut into partitions that are pystrom Tables on the dask workers (lazy until computed).

    Made by :func:`pystrom.dask.read_postgres` and :func:`pystrom.dask.scan_arrow`. A partition is
    read by whichever worker runs its task, onto that worker's device, and stays there:
    ``persist()`` keeps the Tables in the workers' memory (their GPUs under dask-cuda), and the
    arrays, DataFrames and model fits built on the collection run where the partitions are.
    ``compute()`` is the one operation that brings all rows to the client.

    Use it as a context manager (or call :meth:`close`) to release a PostgreSQL read's snapshot
    as soon as it is no longer needed; it is also released when the collection is garbage collected.
    ``with read_postgres(...) as parts: parts = parts.persist()`` is safe: the partitions being
    persisted keep the snapshot until each has been read.
    """

    def __init__(self, parts: Partitions, schema: Any, device: Any = None):
        self._parts = parts
        self._schema = schema
        self._device = device

    # -- dask's collection protocol ----------------------------------------------------------------

    def __dask_graph__(self) -> dict:
        self._check_open()
        return self._parts.graph

    def __dask_keys__(self) -> list:
        return list(self._parts.keys)

    def __dask_layers__(self) -> tuple[str, ...]:
        return (self._parts.name,)

    def __dask_tokenize__(self) -> Any:
        return self._parts.name

    def __dask_postcompute__(self) -> tuple[Callable, tuple]:
        return concat_tables, (None, self._schema)

    def __dask_postpersist__(self) -> tuple[Callable, tuple]:
        return self._rebuild, ()

    @staticmethod
    def __dask_optimize__(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        return dsk  # one task per partition and stage: nothing to fuse or cull

    @staticmethod
    def __dask_scheduler__(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        import dask.threaded

        return dask.threaded.get(dsk, keys, **kwargs)

    def _rebuild(self, dsk: dict, *, rename: dict | None = None) -> PartitionedTable:
        """The persisted collection: its graph holds the partitions (futures on a cluster). The
        snapshot is released once every partition has been read (or has failed)."""
        name = self._parts.name if not rename else rename.get(self._parts.name, self._parts.name)
        keys = [(name, i) for i in range(len(self._parts.keys))]
        values = [dsk[k] for k in self._parts.keys] if not rename else [dsk[k] for k in keys]
        _release_when_done(self._parts.snapshot, values)
        parts = Partitions(name, dict(zip(keys, values)), keys, None, self._parts.rows)
        return PartitionedTable(parts, self._schema, self._device)

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the PostgreSQL snapshot this collection reads (nothing else to release for a scan).

        Partitions already persisted stay usable, and partitions being persisted finish their reads
        first (the transaction ends when the last of them is read); anything else that still has to
        read fails clearly.
        """
        if self._parts.snapshot is not None:
            self._parts.snapshot.close()

    def __enter__(self) -> PartitionedTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        snap = self._parts.snapshot
        if snap is not None and snap.closed:
            raise ClosedError(
                "the PostgreSQL snapshot of this pystrom.dask collection was released (close(), the end of its "
                "with block, or persist()): read again, or use the collection persist() returned"
            )

    # -- what it is ----------------------------------------------------------------------------------

    @property
    def schema(self) -> Any:
        """The pyarrow schema of every partition (known without reading)."""
        return self._schema

    @property
    def columns(self) -> list[str]:
        return list(self._schema.names)

    @property
    def npartitions(self) -> int:
        return len(self._parts.keys)

    @property
    def snapshot(self) -> str | None:
        """The id of the PostgreSQL snapshot the partitions read (None for a scan or a persisted collection)."""
        return None if self._parts.snapshot is None else self._parts.snapshot.id

    @property
    def num_rows(self) -> int:
        """Rows in all partitions: counted on the workers (one small task each, only counts come back)."""
        return sum(self.partition_rows())

    def partition_rows(self) -> list[int]:
        """Rows of each partition, counted on the workers (remembered: the partitions cannot change)."""
        if self._parts.rows is None:
            import dask

            counts = self._parts.derive("pystrom-num-rows", row_count)
            (rows,) = dask.compute(_Keys(counts))
            self._parts.rows = [int(r) for r in rows]
        return list(self._parts.rows)

    def __repr__(self) -> str:
        cols = ", ".join(f"{f.name}: {f.type}" for f in self._schema)
        return f"<pystrom.dask.PartitionedTable {self.npartitions} partitions [{cols}]>"

    def to_delayed(self) -> list[Any]:
        """One ``dask.delayed`` object per partition (each a pystrom Table when computed)."""
        from dask.delayed import Delayed

        self._check_open()
        return [Delayed(k, self._parts.graph) for k in self._parts.keys]

    # -- new collections -----------------------------------------------------------------------------

    def filter(self, expr: str) -> PartitionedTable:
        """The rows where the ``where`` expression ``expr`` is true (the language of ``scan_arrow``'s
        ``where``), filtered on each partition's worker and device."""
        from ..expr import compile_where

        if not isinstance(expr, str) or not expr.strip():
            raise InvalidArgumentError(f"filter needs a where expression (a non-empty string); got {expr!r}")
        compile_where(expr, self._schema)  # names the bad column or operator now, not on a worker
        return PartitionedTable(self._parts.derive("pystrom-filter", filter_rows, expr), self._schema, self._device)

    def map_partitions(self, fn: Callable, *args: Any, meta: Any = None, **kwargs: Any) -> Any:
        """``fn(partition, *args, **kwargs)`` on every partition, on its worker.

        What comes back follows what ``fn`` returns: Tables make a new PartitionedTable, arrays a
        dask array (rows per block unknown), anything else a list of ``dask.delayed`` objects. The
        kind is found by calling ``fn`` on an empty partition on the client, or given as ``meta``:
        a ``pyarrow.Schema`` (Tables with that schema) or an empty array (its type and dtype).
        """
        if not callable(fn):
            raise InvalidArgumentError(f"map_partitions needs a function; got {type(fn).__name__}")
        if meta is None:
            empty = Table.from_arrow(self._schema.empty_table(), device="cpu")
            try:
                meta = fn(empty, *args, **kwargs)
            except Exception as exc:
                raise InvalidArgumentError(
                    f"map_partitions called {getattr(fn, '__name__', fn)!r} on an empty partition to learn what it "
                    f"returns and it raised {type(exc).__name__}: {exc}; pass meta= (a pyarrow.Schema, or an empty "
                    "array) to say it"
                ) from exc
        call = _Call(fn, kwargs)
        parts = self._parts.derive("pystrom-map-partitions", call, *args, token=(tokenize(fn), args, kwargs))
        import pyarrow as pa

        if isinstance(meta, Table):
            meta = meta.schema
        if isinstance(meta, pa.Schema):
            return PartitionedTable(parts, meta, self._device)
        if hasattr(meta, "ndim") and hasattr(meta, "dtype"):
            return _dask_array(parts, meta)
        from dask.delayed import Delayed

        return [Delayed(k, parts.graph) for k in parts.keys]

    def to_dask_array(self, columns: Sequence[str] | None = None, dtype: Any = None) -> Any:
        """The columns as one 2-D dask array (rows x columns), a block per partition on its worker.

        Blocks are CuPy arrays on GPU workers, NumPy on CPU ones: zero-copy views of the partition's
        Table where the columns share a dtype, hold no NULLs and sit at a constant stride (as
        :meth:`pystrom.Table.to_array`). Rows per block are known once counted (:meth:`partition_rows`,
        or ``persist()`` then ``num_rows``), else NaN as for any dask array of unknown chunks.
        """
        self._check_open()
        if columns is None:
            columns = self._schema.names
        names = [columns] if isinstance(columns, str) else list(columns)
        empty = Table.from_arrow(self._schema.empty_table(), device="cpu")
        meta = empty.to_array(names, dtype=dtype)  # raises now for unknown columns or mixed dtypes
        meta = _on_client_device(meta, self._device)
        parts = self._parts.derive("pystrom-to-array", to_array, names, dtype, keep_rows=True)
        return _dask_array(parts, meta)

    def to_dask_dataframe(self) -> Any:
        """A dask DataFrame with one pandas partition per Table (cuDF partitions on GPU workers where
        cuDF is installed on the client and the workers)."""
        from dask.delayed import Delayed

        from .._dist import require

        dd = require("dask.dataframe", "PartitionedTable.to_dask_dataframe()")
        self._check_open()
        use_cudf = _cudf_wanted(self._device)
        parts = self._parts.derive("pystrom-to-frame", to_frame, use_cudf)
        meta = self._schema.empty_table().to_pandas()
        if use_cudf:
            import cudf

            meta = cudf.DataFrame.from_pandas(meta)
        return dd.from_delayed([Delayed(k, parts.graph) for k in parts.keys], meta=meta, verify_meta=False)


class _Call:
    """``fn(partition, *args, **kwargs)`` as one picklable task callable."""

    def __init__(self, fn: Callable, kwargs: dict):
        self.fn = fn
        self.kwargs = kwargs

    def __call__(self, part: Any, *args: Any) -> Any:
        return self.fn(part, *args, **self.kwargs)


class _Keys(DaskMethodsMixin):
    """The outputs of some keys as a list (a small helper collection for counts and passes)."""

    def __init__(self, parts: Partitions):
        self._parts = parts

    def __dask_graph__(self) -> dict:
        return self._parts.graph

    def __dask_keys__(self) -> list:
        return list(self._parts.keys)

    def __dask_tokenize__(self) -> Any:
        return self._parts.name

    def __dask_postcompute__(self) -> tuple[Callable, tuple]:
        return list, ()

    def __dask_postpersist__(self) -> tuple[Callable, tuple]:
        raise NotImplementedError

    __dask_optimize__ = staticmethod(PartitionedTable.__dask_optimize__)
    __dask_scheduler__ = staticmethod(PartitionedTable.__dask_scheduler__)


def check_device(device: Any) -> None:
    """The spelling of a workers' ``device=`` (it is resolved on each worker, which may have a GPU the client lacks)."""
    if device is None:
        return
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise InvalidArgumentError(f"device must be 'cpu', 'cuda', 'cuda:N', an int or None; got {device!r}")
    if isinstance(device, str) and not re.fullmatch(r"\s*(cpu|cuda|gpu)(:\d+)?\s*", device.lower()):
        raise InvalidArgumentError(f"device {device!r} makes no sense: use 'cpu', 'cuda' or 'cuda:N'")


def _dask_array(parts: Partitions, meta: Any) -> Any:
    import math

    import dask.array as da

    rows = tuple(parts.rows) if parts.rows is not None else (math.nan,) * len(parts.keys)
    if meta.ndim == 1:
        graph, chunks = parts.graph, (rows,)
    elif meta.ndim == 2:
        graph = dict(parts.graph)
        keys2 = [(parts.name, i, 0) for i in range(len(parts.keys))]
        graph.update({k2: k for k2, k in zip(keys2, parts.keys)})  # a block key names its row and column
        chunks = (rows, (meta.shape[1],))
    else:
        raise SchemaMismatchError(f"map_partitions returned {meta.ndim}-D arrays; 1-D and 2-D make dask arrays")
    return da.Array(graph, parts.name, chunks, meta=meta)


def _on_client_device(meta: Any, device: Any) -> Any:
    """The empty array dask keeps as the blocks' type: CuPy when the workers' partitions are on GPUs."""
    if device == "cpu":
        return meta
    try:
        backend = resolve_device(device)
    except Exception:
        return meta
    if backend.kind == "cuda":
        with backend.activate():
            return backend.xp.asarray(meta)
    return meta


def _cudf_wanted(device: Any) -> bool:
    if device == "cpu":
        return False
    try:
        import cudf  # noqa: F401
    except ImportError:
        return False
    try:
        return resolve_device(device).kind == "cuda"
    except Exception:
        return False


def _release_when_done(snapshot: Any, values: Sequence[Any]) -> None:
    """Release ``snapshot`` once every future among ``values`` has finished (at once when none is a future)."""
    if snapshot is not None:
        snapshot.hold([v for v in values if hasattr(v, "add_done_callback") and hasattr(v, "key")])
