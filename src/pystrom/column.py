"""Column: one column of a Table, its Arrow-layout buffers seen as NumPy/CuPy arrays without copies."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ._types import ColumnType, Layout
from .errors import ClosedError, ColumnNotFoundError, DataError, NullValuesError, UnsupportedTypeError
from .memory import bitmap
from .memory import offsets as _offsets
from .memory.backend import Block
from .memory.layout import ColumnPlan

if TYPE_CHECKING:
    import pyarrow as pa

    from .table import Table

__all__ = ["Column"]


class Column:
    """One column of a :class:`Table`.

    Its buffers live in the table's single allocation and are laid out as an Arrow array:

    - ``values``: the values (see :mod:`pystrom._types` for each type's layout; booleans one byte each),
    - ``validity``: the LSB-ordered validity bitmap, or None when the column stores no NULLs,
    - ``offsets`` and ``data``: int32 offsets and bytes for string and binary columns,
    - ``offsets``, ``child_values`` and ``child_validity`` for list columns (``values`` is the (n, d)
      matrix of a fixed_size_list); the layout is defined in :mod:`pystrom.interop.lists`,
    - ``children`` (``field(name)``) of a struct column: one Column per field, row i of each is
      row i of the struct; ``offsets`` and ``elements`` (a Column) of a list of strings or structs.

    A column obtained from a slice keeps Arrow's convention: its rows start at element ``offset`` of
    the underlying buffers. Everything here is a view: nothing is copied unless a method says so.
    Columns are obtained with ``table.column(name)``.
    """

    __slots__ = ("_block", "_plan", "_offset", "_length", "_null_count")

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("Column objects come from Table.column(name); they are not built directly")

    @classmethod
    def _view(cls, block: Block, plan: ColumnPlan, offset: int, length: int, null_count: int | None) -> Column:
        self = object.__new__(cls)
        self._block = block
        self._plan = plan
        self._offset = offset
        self._length = length
        self._null_count = null_count
        return self

    # -- description ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The column's name."""
        return self._plan.name

    @property
    def type(self) -> pa.DataType:
        """The column's Arrow type (logical: timestamps stay timestamps, uuid stays uuid)."""
        return self._plan.type.arrow

    @property
    def column_type(self) -> ColumnType:
        """pystrom's description of the type: the Arrow type and how its buffers are laid out."""
        return self._plan.type

    @property
    def dtype(self) -> np.dtype:
        """dtype of :attr:`values` (uint8 for decimal and fixed-size binary, int32 offsets for strings)."""
        return self._plan.type.storage

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return self._live_block().backend.device

    @property
    def offset(self) -> int:
        """Arrow offset: the element of the underlying buffers where this column's rows begin."""
        return self._offset

    def __len__(self) -> int:
        return self._length

    @property
    def null_count(self) -> int:
        """Number of NULL rows (exact, also for slices)."""
        if self._null_count is None and self._plan.validity is None:
            self._null_count = 0
        elif self._null_count is None:
            self._null_count = self._length - bitmap.count_set(
                self._live_block().backend, self._base_validity(), self._offset, self._length
            )
        return self._null_count

    def _live_block(self) -> Block:
        block = self._block
        if block is None:
            raise ClosedError(f"column {self.name!r} belongs to a closed table")
        return block

    # -- buffers ----------------------------------------------------------------------------------

    def _base_validity(self) -> Any:
        span = self._plan.validity
        return self._live_block().array(span.offset, np.uint8, (span.size,))

    @property
    def values(self) -> Any:
        """The values as a zero-copy array of the column's device; NULL slots hold unspecified values.

        Shape (n,) for numeric, boolean and temporal types, (n, width) uint8 for decimal128 and
        fixed-size binary. String and binary columns have no values array: use :attr:`offsets` and :attr:`data`.
        """
        ctype = self._plan.type
        if ctype.layout == Layout.VARBINARY:
            raise UnsupportedTypeError(
                f"column {self.name!r} has type {ctype.name}, whose values are variable-length: "
                "use column.offsets and column.data, or column.to_arrow()"
            )
        if ctype.layout in (Layout.LIST, Layout.LIST_OF):
            raise UnsupportedTypeError(
                f"column {self.name!r} has type {ctype.name}, whose rows have different lengths: use column.offsets "
                f"and column.{'child_values' if ctype.layout == Layout.LIST else 'elements'}, or column.to_arrow()"
            )
        if ctype.layout == Layout.STRUCT:
            raise UnsupportedTypeError(
                f"column {self.name!r} has type {ctype.name}, whose values are its fields: use "
                f"column.field(name) (fields: {list(ctype.child_names)}), or column.to_arrow()"
            )
        block = self._live_block()
        start = self._plan.values.offset + self._offset * ctype.width
        if ctype.layout == Layout.BYTES:
            shape: tuple[int, ...] = (self._length, ctype.width)
        elif ctype.layout == Layout.FIXED_LIST:
            shape = (self._length, *ctype.row_shape)
        else:
            shape = (self._length,)
        return block.array(start, ctype.storage, shape)

    @property
    def child_values(self) -> Any:
        """A list column's elements, 1-D (the whole underlying buffer: index it with :attr:`offsets`;
        for a fixed_size_list, row i is elements ``[(offset + i) * d, (offset + i + 1) * d)``)."""
        ctype = self._plan.type
        if ctype.layout not in Layout.NESTED:
            raise UnsupportedTypeError(f"column {self.name!r} has type {ctype.name}, which has no child values")
        span = self._plan.data if ctype.layout == Layout.LIST else self._plan.values
        return self._live_block().array(span.offset, ctype.storage, (span.size // ctype.storage.itemsize,))

    @property
    def children(self) -> tuple[Column, ...]:
        """A struct's fields as Columns (row i of each is this column's row i; a NULL struct row's
        fields hold unspecified values), or a list<C>'s one :attr:`elements` column."""
        ctype = self._plan.type
        block = self._live_block()
        if ctype.layout == Layout.STRUCT:
            return tuple(
                Column._view(block, self._child_plan(i), self._offset, self._length, None if p.null_count else 0)
                for i, p in enumerate(self._plan.children)
            )
        if ctype.layout == Layout.LIST_OF:
            p = self._child_plan(0)
            return (Column._view(block, p, 0, p.length, None if p.null_count else 0),)
        raise UnsupportedTypeError(f"column {self.name!r} has type {ctype.name}, which has no child columns")

    def _element_rows(self, first: int, count: int) -> Column:
        """Elements ``[first, first + count)`` of a list<C> column, as a Column view."""
        p = self._child_plan(0)
        return Column._view(self._live_block(), p, first, count, None if p.null_count else 0)

    def _child_plan(self, i: int) -> ColumnPlan:
        """Child ``i``'s plan named by its path (``s.b``, ``tags.item``): what its messages call it."""
        return replace(self._plan.children[i], name=f"{self.name}.{self._plan.type.child_names[i]}")

    def _with_offsets(self, path: str = "") -> list[tuple[str, Column]]:
        """This column and its child columns (named by their path: ``field 'b'``, ``elements``) whose
        offsets steer reads (strings, lists), for the checks of memory another process wrote."""
        layout = self._plan.type.layout
        out = [(path, self)] if layout in (Layout.VARBINARY, Layout.LIST, Layout.LIST_OF) else []
        if layout in Layout.COMPOSED:
            names = self._plan.type.child_names if layout == Layout.STRUCT else ("",)
            for name, child in zip(names, self.children):
                step = f"field {name!r}" if layout == Layout.STRUCT else "elements"
                out += child._with_offsets(f"{path}, {step}" if path else step)
        return out

    def field(self, name: str) -> Column:
        """A struct column's field ``name`` as a Column (see :attr:`children`)."""
        ctype = self._plan.type
        if ctype.layout != Layout.STRUCT:
            raise UnsupportedTypeError(f"column {self.name!r} has type {ctype.name}, which has no fields")
        names = ctype.child_names
        if name not in names:
            raise ColumnNotFoundError(
                f"column {self.name!r} ({ctype.name}) has no field {name!r}; fields: {list(names)}"
            )
        return self.children[names.index(name)]

    @property
    def elements(self) -> Column:
        """The elements of a list of strings or structs (list<C>), all of them, as one Column: row i of
        this column is elements ``[offsets[i], offsets[i + 1])``."""
        if self._plan.type.layout != Layout.LIST_OF:
            hint = ": use column.child_values" if self._plan.type.layout in Layout.NESTED else ""
            raise UnsupportedTypeError(
                f"column {self.name!r} has type {self._plan.type.name}, which has no element column{hint}"
            )
        return self.children[0]

    @property
    def child_validity(self) -> Any | None:
        """A list column's element bitmap (uint8, LSB; bit j = element j of :attr:`child_values`), or None."""
        if self._plan.type.layout not in Layout.NESTED:
            raise UnsupportedTypeError(f"column {self.name!r} has type {self._plan.type.name}, which has no elements")
        span = self._plan.child_validity
        return None if span is None else self._live_block().array(span.offset, np.uint8, (span.size,))

    @property
    def validity(self) -> Any | None:
        """The validity bitmap (uint8, LSB order) from the byte holding this column's first row, or None.

        Row i is valid when bit ``validity_offset + i`` is set. None means the column stores no
        bitmap (no NULLs in the whole underlying column).
        """
        span = self._plan.validity
        if span is None:
            return None
        first, last = self._offset // 8, (self._offset + self._length + 7) // 8
        return self._live_block().array(span.offset + first, np.uint8, (last - first,))

    @property
    def validity_offset(self) -> int:
        """Bit position of row 0 inside :attr:`validity`'s first byte."""
        return self._offset % 8

    @property
    def offsets(self) -> Any:
        """int32 offsets (n + 1) into :attr:`data` (string, binary) or :attr:`child_values` (list), not rebased
        after slicing."""
        self._require_varbinary("offsets")
        return self._live_block().array(self._plan.values.offset + self._offset * 4, np.int32, (self._length + 1,))

    @property
    def data(self) -> Any:
        """The bytes of a string or binary column (the whole underlying buffer; index it with offsets)."""
        self._require_varbinary("data")
        span = self._plan.data
        return self._live_block().array(span.offset, np.uint8, (span.size,))

    def _offsets_limit(self) -> int:
        """What the last offset may reach: data bytes (strings) or child elements (lists)."""
        plan = self._plan
        if plan.type.layout == Layout.LIST_OF:
            return plan.children[0].length
        return plan.data.size if plan.type.layout == Layout.VARBINARY else plan.data.size // plan.type.storage.itemsize

    def _offsets_in_bounds(self) -> Any:
        """:attr:`offsets`, safe to follow: each row's range lies inside :attr:`data` (or the child values).

        Code that reads through offsets takes them from here. Memory no other process writes
        gives the view itself (its offsets were checked when they arrived). Memory another process
        may write (``Block.others_may_write``: an imported table) gives a private copy, checked in
        one pass: what is checked is what is followed, whatever that process writes meanwhile.
        Raises :class:`~pystrom.errors.DataError` naming the column and row when it is bad.
        """
        view = self.offsets
        block = self._live_block()
        if not block.others_may_write:
            return view
        copy, bad = _offsets.checked_copy(block.backend, view, self._offsets_limit())
        self._check_offsets(copy, bad)
        return copy

    def _check_offsets(self, offsets: Any, bad: int | None = -1) -> None:
        """Raise :class:`~pystrom.errors.DataError` naming the row where ``offsets`` (this view's, or a
        copy of them) would read outside the data buffer (or the child values); ``bad``: that row when
        known already (None: none), else -1 (they are checked here)."""
        backend = self._live_block().backend
        limit = self._offsets_limit()
        if bad == -1:
            bad = _offsets.first_bad(backend, offsets, limit)
        if bad is None:
            return
        base = max(bad - 1, 0)
        window = backend.to_host(offsets[base : bad + 2])
        is_list = self._plan.type.layout in (Layout.LIST, Layout.LIST_OF)
        reason = _offsets.describe(
            window, bad, base, self._length, limit, "element child values" if is_list else "byte data"
        )
        raise DataError(
            f"column {self.name!r}: its {'list' if is_list else 'string'} offsets no longer lie inside its "
            f"{'child values' if is_list else 'data buffer'}: {reason} (row {bad}); another process wrote them "
            "after this table was imported (its exporter, or the writer of a store table)"
        )

    def _require_varbinary(self, what: str) -> None:
        if self._plan.type.layout != Layout.VARBINARY and not (
            what == "offsets" and self._plan.type.layout in (Layout.LIST, Layout.LIST_OF)
        ):
            raise UnsupportedTypeError(
                f"column {self.name!r} has type {self._plan.type.name}, which has no {what} buffer"
            )

    def is_valid(self) -> Any:
        """A bool array on the column's device: True where the row is not NULL."""
        backend = self._live_block().backend
        if self._plan.validity is None:
            with backend.activate():
                return backend.xp.ones(self._length, dtype=bool)
        return bitmap.unpack(backend, self._base_validity(), self._offset, self._length)

    def is_null(self) -> Any:
        """A bool array on the column's device: True where the row is NULL (polars' ``is_null``;
        ``"x is null"`` in an expression)."""
        return ~self.is_valid()

    def is_not_null(self) -> Any:
        """A bool array on the column's device: True where the row is not NULL (:meth:`is_valid`)."""
        return self.is_valid()

    # -- operations (polars' Series methods; the work is in _unique and _fill) ----------------------

    def unique(self, *, maintain_order: bool = False) -> Column:
        """The distinct values, as polars' ``Series.unique``: a column of a new one-column table.

        NULL is one value, NaN is one value, -0.0 and 0.0 are one value (the first seen is kept).

        Parameters
        ----------
        maintain_order
            True: in order of first appearance. False (default): in the values' order, NULL first
            (polars leaves it unspecified).
        """
        from ._unique import unique_values  # up: a convenience method; _unique builds Tables

        return unique_values(self, maintain_order)

    def value_counts(self, *, sort: bool = False, name: str | None = None, normalize: bool = False) -> Table:
        """How often each distinct value occurs, as polars' ``Series.value_counts``.

        Returns a new Table on the column's device: this column's distinct values (NULL included)
        and ``count`` (int64; pyarrow's type, where polars uses uint32).

        Parameters
        ----------
        sort
            Most frequent first (equal counts in the values' order). False: in the values' order.
        name
            The name of the count column (default ``count``, or ``proportion`` with ``normalize``).
        normalize
            Give each value's share of the rows (float64) instead of its count.
        """
        from ._unique import value_counts  # up: a convenience method; _unique builds Tables

        return value_counts(self, sort, name, normalize)

    def fill_null(self, value: Any = None, strategy: str | None = None, limit: int | None = None) -> Column:
        """This column with NULLs replaced, as polars' ``Series.fill_null``: a column of a new
        one-column table, of the same type.

        Takes the values and strategies of :meth:`Table.fill_null`; a value or strategy that does
        not apply to this column's type is an error naming the column (a table's fill_null skips
        such columns). ``table.with_columns(x=table.column("x").fill_null(0))`` fills one column of
        a table.
        """
        from ._fill import fill_column  # up: a convenience method; _fill builds Tables

        return fill_column(self, value, strategy, limit)

    # -- conversion -------------------------------------------------------------------------------

    def to_arrow(self) -> pa.Array:
        """A host pyarrow Array (zero-copy on the CPU backend except for booleans, a copy from a GPU)."""
        from .interop.arrow_export import columns_to_arrow

        return columns_to_arrow([self])[0]

    def to_numpy(self) -> np.ndarray:
        """Host NumPy array with pyarrow's conventions (NULLs become NaN/None, strings objects)."""
        return self.to_arrow().to_numpy(zero_copy_only=False)

    def _dense_values(self, protocol: str) -> Any:
        if self.null_count:
            name = self.name
            raise NullValuesError(
                f"column {name!r} has {self.null_count:,} NULL(s), which {protocol} cannot carry. Fill or drop "
                f"them in one call: table.fill_null(0)[{name!r}] or table.fill_null(strategy='forward')[{name!r}] "
                f"(table.column({name!r}).fill_null(...) fills this column only), table.drop_nulls({name!r})[{name!r}] "
                f"(rows with a NULL left out), or table.to_array([{name!r}], nulls='nan'|'drop'); the raw values "
                "are column.values (NULL slots unspecified) with column.is_valid()"
            )
        if self._plan.child_validity is not None:
            d = self._plan.type.list_size
            backend = self._live_block().backend
            nulls = self._length * d - bitmap.count_set(
                backend, self.child_validity, self._offset * d, self._length * d
            )
            if nulls:
                raise NullValuesError(
                    f"column {self.name!r} has {nulls} NULL element(s) in its lists, which {protocol} cannot carry; "
                    "use column.values with column.child_validity, or table.to_array(nulls='nan'|'drop')"
                )
        return self.values

    # -- array protocols (no NULLs allowed: an exported array has no way to say which slots are missing) --

    @property
    def __cuda_array_interface__(self) -> dict:
        if self._live_block().backend.kind != "cuda":
            raise AttributeError(f"column {self.name!r} is on the CPU: it has no __cuda_array_interface__")
        return self._dense_values("__cuda_array_interface__").__cuda_array_interface__

    def __dlpack__(self, **kwargs: Any) -> Any:
        arr = self._dense_values("DLPack")
        return arr.__dlpack__(**{k: v for k, v in kwargs.items() if v is not None})

    def __dlpack_device__(self) -> tuple[int, int]:
        backend = self._live_block().backend
        return (1, 0) if backend.kind == "cpu" else (2, backend.ordinal)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if self._live_block().backend.kind != "cpu":
            raise TypeError(
                f"column {self.name!r} is on {self.device}: implicit conversion to a NumPy array is not "
                "allowed (as in CuPy); use column.to_numpy()"
            )
        arr = self._dense_values("a NumPy array")
        if copy:
            arr = arr.copy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __repr__(self) -> str:
        if self._block is None:
            return f"<pystrom.Column {self.name!r}: closed>"
        return (
            f"<pystrom.Column {self.name!r}: {self._plan.type.name}, {self._length:,} rows, "
            f"{self.null_count:,} nulls, on {self.device}>"
        )
