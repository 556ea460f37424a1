"""Table: named columns in one allocation on one device (a GPU, or the CPU)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import _ops
from ._dist import require as _require
from ._frame import TableOps
from ._types import Layout
from .column import Column
from .errors import ClosedError, ColumnNotFoundError, SchemaMismatchError
from .memory.backend import Backend, Block, resolve_device
from .memory.layout import TablePlan

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["Table"]


class Table(TableOps):
    """Named columns laid out as Arrow arrays inside **one** allocation, on a GPU or on the CPU.

    One allocation means one handle shares the whole table with another process, a column is a
    zero-copy CuPy (or NumPy) array, and adjacent columns of one dtype form a zero-copy 2-D array.
    Build tables with :meth:`from_arrow` or :meth:`from_arrays` (or the loaders); views made by
    :meth:`select` and :meth:`slice` share the allocation and keep it alive. The everyday DataFrame
    operations (:meth:`sort`, :meth:`rename`, :meth:`drop`, :meth:`fill_null`, :meth:`describe`, ...)
    are named as polars names them (docs/table.md lists them).

    The memory is released by :meth:`close` (or leaving a ``with`` block) once no view or exported
    array still uses it, or when the table is garbage collected. A closed table raises
    :class:`~pystrom.errors.ClosedError`; arrays taken from it earlier stay valid.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("build a Table with Table.from_arrow(...), Table.from_arrays(...) or a pystrom loader")

    @classmethod
    def _from_columns(cls, block: Block, schema: pa.Schema, columns: Sequence[Column], num_rows: int) -> Table:
        self = object.__new__(cls)
        self._block = block
        self._schema = schema
        self._columns = tuple(columns)
        self._index = {c.name: i for i, c in enumerate(self._columns)}
        self._num_rows = num_rows
        return self

    @classmethod
    def _of_column(cls, col: Column) -> Table:
        """A one-column table viewing ``col`` (zero copy)."""
        schema = _pa().schema([_pa().field(col.name, col.type)])
        view = Column._view(col._live_block(), col._plan, col.offset, len(col), col._null_count)
        return cls._from_columns(col._live_block(), schema, [view], len(col))

    @classmethod
    def _wrap(cls, block: Block, plan: TablePlan, schema: pa.Schema, num_rows: int) -> Table:
        columns = [Column._view(block, cp, 0, cp.length, cp.null_count) for cp in plan.columns]
        return cls._from_columns(block, schema, columns, num_rows)

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def from_arrow(cls, data: Any, device: str | int | None = None) -> Table:
        """Copy Arrow data into a new Table on ``device``.

        Parameters
        ----------
        data
            A pyarrow Table, RecordBatch, RecordBatchReader or list of batches, a pandas DataFrame, or
            any object with the Arrow PyCapsule interface. Chunked and sliced columns are accepted;
            dictionary columns are decoded.
        device
            ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or None (``pystrom.defaults.device``, else a GPU if
            one is visible, else the CPU).
        """
        from .interop.arrow_import import (  # up: a convenience constructor; interop builds Tables
            as_arrow_table,
            columns_of,
        )
        from .interop.build import build_table  # up: as above

        backend = resolve_device(device)
        table = as_arrow_table(data)
        return build_table(backend, columns_of(table), table.schema.metadata, table.num_rows)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any] | pd.DataFrame, device: str | int | None = None) -> Table:
        """A new Table from named arrays: NumPy (masked arrays give NULLs), CuPy or anything with
        ``__cuda_array_interface__``, pyarrow arrays, pandas Series, or Python lists (None is NULL).

        All columns must have the same length. GPU inputs are copied device to device. A pandas
        DataFrame (or a polars one, or any other Arrow stream producer) is taken whole, exactly as
        :meth:`from_arrow` takes it (through Arrow; the index is left out).
        """
        from .interop.arrays import columns_from_arrays  # up: a convenience constructor; interop builds Tables
        from .interop.build import build_table  # up: as above

        if not isinstance(arrays, Mapping) and (
            _is_pandas_frame(arrays) or hasattr(arrays, "__arrow_c_stream__")
        ):  # a data frame is named columns already: one conversion for both constructors
            return cls.from_arrow(arrays, device)
        backend = resolve_device(device)
        return build_table(backend, columns_from_arrays(arrays, backend))

    # -- description ------------------------------------------------------------------------------

    def _live(self) -> Block:
        if self._block is None:
            raise ClosedError("the table is closed")
        return self._block

    @property
    def _backend(self) -> Backend:
        return self._live().backend

    @property
    def num_rows(self) -> int:
        """Number of rows."""
        self._live()
        return self._num_rows

    def __len__(self) -> int:
        return self.num_rows

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, columns), as a DataFrame's."""
        return (self.num_rows, self.num_columns)

    @property
    def num_columns(self) -> int:
        """Number of columns."""
        return len(self._columns)

    @property
    def column_names(self) -> list[str]:
        """The column names, in order."""
        return [c.name for c in self._columns]

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema (logical types; booleans are ``bool`` even though stored as bytes)."""
        return self._schema

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return self._backend.device

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers this table's rows use (a view counts the parts it references)."""
        self._live()
        return sum(_column_bytes(c) for c in self._columns)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (the table can no longer be used)."""
        return self._block is None

    @property
    def columns(self) -> list[Column]:
        """The :class:`Column` objects, in order."""
        self._live()
        return list(self._columns)

    def column(self, key: str | int) -> Column:
        """The :class:`Column` named ``key`` (or at position ``key``)."""
        self._live()
        if isinstance(key, int) and not isinstance(key, bool):
            if not -len(self._columns) <= key < len(self._columns):
                raise ColumnNotFoundError(f"column index {key} is out of range for {len(self._columns)} column(s)")
            return self._columns[key]
        if not isinstance(key, str):
            raise ColumnNotFoundError(f"columns are named by strings; got {key!r}")
        try:
            return self._columns[self._index[key]]
        except KeyError:
            raise ColumnNotFoundError(
                f"no column named {key!r}; the table has: {', '.join(map(repr, self.column_names)) or 'no columns'}"
            ) from None

    def __getitem__(self, key: str | Sequence[str]) -> Any:
        """``table["x"]``: the column's values as a zero-copy CuPy (GPU) or NumPy (CPU) array.

        The column must be fixed-width (not string/binary) and hold no NULLs in the rows of this table
        (fill or drop them in one call first: ``table.fill_null(0)["x"]``, ``table.drop_nulls("x")["x"]``);
        for raw values with NULL slots use ``table.column("x").values``. ``table[["a", "b"]]`` is
        :meth:`select`.
        """
        if isinstance(key, (list, tuple)):
            return self.select(key)
        if not isinstance(key, str):
            raise ColumnNotFoundError(f"index a table by column name (a string) or a list of names; got {key!r}")
        col = self.column(key)
        return col._dense_values(f"table[{key!r}]")

    def __contains__(self, name: object) -> bool:
        return name in self._index

    # Not iterable: Python would otherwise iterate through table[0], table[1], ... and raise
    # ColumnNotFoundError, and iterating the names (pandas' way) made np.asarray(table) and
    # pandas.DataFrame(table) silently build arrays of the column names. None makes iter() raise
    # TypeError and isinstance(table, Iterable) False; the names are column_names, the columns columns.
    __iter__ = None

    # -- views ------------------------------------------------------------------------------------

    def select(self, columns: Iterable[str | int]) -> Table:
        """A view with only ``columns``, in that order (zero copy)."""
        if isinstance(columns, (str, int)):
            columns = [columns]
        chosen = [self.column(c) for c in columns]
        names = [c.name for c in chosen]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SchemaMismatchError(f"select names column(s) more than once: {', '.join(map(repr, dupes))}")
        fresh = [Column._view(c._block, c._plan, c.offset, len(c), c._null_count) for c in chosen]
        schema = _pa().schema([self._schema.field(n) for n in names], metadata=self._schema.metadata)
        return Table._from_columns(self._block, schema, fresh, self._num_rows)

    def slice(self, offset: int = 0, length: int | None = None) -> Table:
        """A view of rows ``[offset, offset + length)`` (zero copy), clipped to the table like pyarrow's."""
        self._live()
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"slice offset must be a non-negative int; got {offset!r}")
        if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 0):
            raise ValueError(f"slice length must be a non-negative int or None; got {length!r}")
        start = min(offset, self._num_rows)
        stop = self._num_rows if length is None else min(self._num_rows, start + length)
        n = stop - start
        fresh = []
        for c in self._columns:
            known = c._null_count if (c._null_count == 0 or (start == 0 and n == len(c))) else None
            fresh.append(Column._view(c._block, c._plan, c.offset + start, n, known))
        return Table._from_columns(self._block, self._schema, fresh, n)

    def head(self, n: int = 5) -> Table:
        """A view of the first ``n`` rows (zero copy; all rows when the table has fewer)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"head(n) needs a non-negative int; got {n!r}")
        return self.slice(0, n)

    def filter(self, mask: Any) -> Table:
        """A new table (new allocation, same device) with the rows where ``mask`` is TRUE.

        ``mask`` is one of:

        - an expression in the ``where`` language of :func:`pystrom.read_arrow` (docs/where.md),
          e.g. ``"bmi > 30 and age between 40 and 60"``: evaluated on the table's device (one
          generated kernel on a GPU, NumPy on the CPU); rows where it is false or NULL are dropped,
          as in SQL's WHERE;
        - the name of a bool column of this table (NULL drops the row);
        - a bool array (CuPy, NumPy, list) or a pyarrow BooleanArray (NULL drops the row).

        Raises :class:`~pystrom.errors.ExpressionError` (a ``ValueError``) naming the expression,
        the column and its type when the expression does not parse or type-check.
        """
        backend = self._backend
        if isinstance(mask, str) and mask not in self._index:
            from ._compute import filter_expression  # up: a convenience method; _compute builds Tables

            return filter_expression(self, mask)
        with backend.activate():
            return _ops.gather(self, backend.xp.flatnonzero(_ops.as_mask(self, mask)))

    def with_columns(self, columns: Mapping[str, Any] | None = None, /, **named: Any) -> Table:
        """A new table (new allocation, same device) with columns added or replaced.

        ``table.with_columns(bmi="weight / height^2", p=proba, run=7)``. Each value is one of:

        - an expression (str) in the ``where`` language (docs/where.md) over this table's columns
          as they are before the call;
        - an array: NumPy (masked arrays give NULLs), CuPy, anything with
          ``__cuda_array_interface__`` or DLPack (torch, JAX), a pyarrow array or chunked array, a
          pandas or polars Series, a list (None is NULL); a 2-D array gives a fixed_size_list column;
        - a :class:`Column` of a table on the same device;
        - a scalar (Python, NumPy or pyarrow; ``pyarrow.scalar(None, type)`` for NULLs), broadcast
          to every row with its Arrow type (``7`` is int64, ``2.5`` float64);
        - a user function call (docs/udf.md).

        Names may also come as a mapping (``with_columns({"body mass": ...})``). A name that exists
        replaces that column in place; new names are appended in the order given.

        Arrays must have the table's length and live on the table's device: ``with_columns`` never
        copies between host and GPU on its own, so a NumPy array for a GPU table (or a CuPy array
        for a CPU table) is refused with the call that moves it (``cupy.asarray(p)``, ``p.get()``,
        or ``table.to(...)``). A scalar is written on the device from one row.

        Expression types come from the type checker: integer arithmetic gives int64 (wrapping on
        overflow), anything with a float, ``/``, ``^``, sqrt/exp/log gives float64, comparisons and
        and/or/not give bool. NULL rules as in a scan's ``where``: a NULL operand makes the result
        NULL, a zero divisor (``/``, ``%``) gives NULL, and/or/not follow SQL's three-valued logic,
        ``x is null`` is never NULL. A new column has a validity bitmap only if some row is NULL.
        On a GPU all the expressions run as one generated kernel that writes every new column's
        values and validity; on the CPU they are computed with NumPy.

        Raises
        ------
        ExpressionError
            An expression that does not parse or type-check, or whose result is a string, a
            temporal value or a bare NULL (the message names the expression, the column and its type).
        SchemaMismatchError
            An array or Column of another length (the message names the column and both lengths).
        DeviceError
            Values on another device than the table (the message says how to move them).
        UnsupportedTypeError
            A value that is none of the above, or a bare None.
        """
        from ._compute import with_columns  # up: a convenience method; _compute builds Tables

        if columns is not None:
            if not isinstance(columns, Mapping):
                raise TypeError(f"with_columns takes a mapping of name -> value; got {type(columns).__name__}")
            named = {**columns, **named}
        return with_columns(self, named)

    # -- arrays -----------------------------------------------------------------------------------

    def to_array(self, columns: Sequence[str] | None = None, dtype: Any = None, nulls: str = "raise") -> Any:
        """A 2-D array (rows x columns) of fixed-width columns, on the table's device.

        Zero copy when the columns have the dtype asked for, hold no NULLs and sit at a constant
        stride in memory (adjacent columns of one dtype always do: a Fortran-ordered view whose
        column stride is the 64-byte aligned column size). Otherwise one gather into a new
        Fortran-ordered array.

        Parameters
        ----------
        columns
            Names (default: all columns).
        dtype
            Result dtype. None (default): NumPy's result type of the columns' dtypes,
            ``numpy.result_type(*dtypes)`` (int32 and float64 give float64, int64 and uint64
            float64, bool and int8 int8; temporal columns count as their int32/int64 storage).
            Required to convert decimals (a floating dtype).
        nulls
            ``"raise"`` (default): a column with NULLs is an error; ``"nan"``: NULLs become NaN
            (floating dtypes only); ``"drop"``: rows with a NULL in any chosen column are left out.
        """
        return _ops.to_array(self, columns, dtype, nulls)

    # -- sharing between processes ---------------------------------------------------------------

    def export(self) -> bytes:
        """A handle (bytes) another process passes to :func:`pystrom.ipc_import` to map this table.

        Zero copy: the importer maps this table's memory (CUDA IPC on a GPU, shared memory on the
        CPU), so writes made here before the export (and later ones, once synchronised) are what
        it reads. Keep this table alive while importers use it; for tables that must outlive their
        maker use :class:`pystrom.Store`. See docs/ipc.md for the format and the security model.
        """
        from .ipc.export import export_table  # up: a convenience method; ipc maps Tables, so it imports table.py

        return export_table(self)

    # -- conversion -------------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        """A host pyarrow Table with the same schema (zero copy on the CPU backend, except booleans)."""
        from .interop.arrow_export import columns_to_arrow

        self._live()
        pa = _pa()
        if not self._columns:  # keep the row count, which from_arrays cannot carry without columns
            batch = pa.record_batch({"_": pa.nulls(self._num_rows)}).select([])
            return pa.Table.from_batches([batch], schema=self._schema)
        return pa.Table.from_arrays(columns_to_arrow(self._columns), schema=self._schema)

    def to_pandas(self, **kwargs: Any) -> pd.DataFrame:
        """``to_arrow().to_pandas(**kwargs)``."""
        _require("pandas", "Table.to_pandas()")  # pyarrow's own error would not name the extra
        return self.to_arrow().to_pandas(**kwargs)

    def to(self, device: str | int | None) -> Table:
        """This table on ``device``: itself if already there, else a copy (one allocation copied whole)."""
        target = resolve_device(device)
        block = self._live()
        if target is block.backend:
            return self
        source = self if self._is_whole() else _ops.gather(self, None)
        src_block = source._live()
        new_block = target.allocate(src_block.nbytes)
        if target.kind == "cuda" and src_block.backend.kind == "cuda":
            new_block.write_device(0, src_block.array(0, "uint8", (src_block.nbytes,)))
        elif target.kind == "cpu":  # GPU -> host memory of the new block, through the staged bulk path
            src_block.read_host_many([(new_block.read_host(0, new_block.nbytes), 0)])
        else:
            new_block.write_host_many([(0, src_block.read_host(0, src_block.nbytes))])
        columns = [Column._view(new_block, c._plan, 0, len(c), c._null_count) for c in source._columns]
        if source._live().others_may_write:  # copied as they were: checked once here, where they cannot change
            for c in columns:
                for _, view in c._with_offsets():
                    view._check_offsets(view.offsets)
        return Table._from_columns(new_block, source._schema, columns, source._num_rows)

    def _is_whole(self) -> bool:
        return all(c.offset == 0 and len(c) == c._plan.length for c in self._columns)

    def equals(self, other: Table) -> bool:
        """Same schema and same values (compared on the host)."""
        if not isinstance(other, Table):
            return False
        return self.to_arrow().equals(other.to_arrow())

    # -- lifetime ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Release this table's hold on its memory (idempotent). Views and exported arrays keep theirs."""
        for c in self._columns:
            c._block = None
        self._block = None

    def __enter__(self) -> Table:
        self._live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- Arrow PyCapsule protocol -----------------------------------------------------------------

    def __arrow_c_schema__(self) -> Any:
        return self._schema.__arrow_c_schema__()

    def __arrow_c_device_array__(self, requested_schema: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        """Export as an Arrow C device array (struct of columns), zero copy except for booleans."""
        _check_capsule_kwargs(kwargs)
        from .interop.arrow_c import export_array

        return export_array(self, device=True)

    def __arrow_c_device_stream__(self, requested_schema: Any = None, **kwargs: Any) -> Any:
        _check_capsule_kwargs(kwargs)
        from .interop.arrow_c import export_stream

        return export_stream(self, device=True)

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        """Arrow C data interface export; CPU tables only (a GPU table: use to_arrow() or the device variant)."""
        self._require_cpu("__arrow_c_array__")
        from .interop.arrow_c import export_array

        return export_array(self, device=False)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        self._require_cpu("__arrow_c_stream__")
        from .interop.arrow_c import export_stream

        return export_stream(self, device=False)

    def _require_cpu(self, what: str) -> None:
        if self._backend.kind != "cpu":
            raise TypeError(
                f"{what} hands over host memory, but this table is on {self.device}: use table.to_arrow() for a "
                "host copy, or the Arrow C device interface (__arrow_c_device_array__)"
            )

    # -- display ----------------------------------------------------------------------------------

    def __repr__(self) -> str:
        from ._display import table_repr

        return table_repr(self)

    def _repr_html_(self) -> str:
        from ._display import table_html

        return table_html(self)


def _pa() -> Any:
    import pyarrow

    return pyarrow


def _is_pandas_frame(obj: Any) -> bool:
    return type(obj).__module__.startswith("pandas") and type(obj).__name__ == "DataFrame"


def _check_capsule_kwargs(kwargs: dict) -> None:
    unknown = {k: v for k, v in kwargs.items() if v is not None}
    if unknown:
        raise NotImplementedError(f"unsupported Arrow capsule keyword(s): {', '.join(unknown)}")


def _column_bytes(c: Column) -> int:
    """Bytes of the buffers a column's rows use (a list<C>'s elements: all of its element column's)."""
    plan = c._plan
    n = len(c)
    if plan.type.layout == Layout.LIST_OF:
        total = (n + 1) * 4 + _column_bytes(c.elements)
    elif plan.data is not None:
        total = (n + 1) * 4 + plan.data.size
    else:
        total = n * plan.type.width + (sum(_column_bytes(f) for f in c.children) if plan.children else 0)
    if plan.validity is not None:
        total += (c.offset % 8 + n + 7) // 8
    if plan.child_validity is not None:
        total += plan.child_validity.size
    return total
