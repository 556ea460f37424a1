"""The everyday DataFrame operations of :class:`pystrom.Table`, named and shaped as polars has them.

:class:`TableOps` is a base of ``Table`` holding only thin methods: arguments checked, docs, and a
call into the module that does the work on the table's device (``_sort``, ``_unique``, ``_fill``,
``_describe``). Renaming and dropping are zero-copy views; the others return a new table (one new
allocation) unless a method says otherwise. docs/table.md compares them with polars.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .column import Column
from .errors import ColumnNotFoundError, InvalidArgumentError, SchemaMismatchError

if TYPE_CHECKING:
    from .table import Table

__all__ = ["TableOps"]


class TableOps:
    """DataFrame operations shared by every Table (mixed into :class:`pystrom.Table`)."""

    __slots__ = ()

    # -- columns: rename, drop (views) --------------------------------------------------------------

    def rename(self: Table, mapping: Mapping[str, str] | Callable[[str], str], *, strict: bool = True) -> Table:
        """A view with columns renamed (zero copy), as polars' ``DataFrame.rename``.

        Parameters
        ----------
        mapping
            ``{old: new}``, or a function called with each column name that returns its new name.
            Names may be swapped (``{"a": "b", "b": "a"}``).
        strict
            With a mapping: every old name must be a column (else
            :class:`~pystrom.errors.ColumnNotFoundError`); False ignores names that are not.

        Raises
        ------
        SchemaMismatchError
            When two columns would end with the same name.
        """
        names = self.column_names
        if callable(mapping) and not isinstance(mapping, Mapping):
            new_names = [mapping(n) for n in names]
        elif isinstance(mapping, Mapping):
            missing = [old for old in mapping if old not in self]
            if missing and strict:
                raise ColumnNotFoundError(
                    f"rename: no column named {', '.join(map(repr, missing))}; the table has: "
                    f"{', '.join(map(repr, names)) or 'no columns'} (strict=False ignores missing names)"
                )
            new_names = [mapping.get(n, n) for n in names]
        else:
            raise InvalidArgumentError(
                f"rename takes a mapping {{old: new}} or a function; got {type(mapping).__name__}"
            )
        for new in new_names:
            if not isinstance(new, str) or not new:
                raise InvalidArgumentError(f"rename: column names are non-empty strings; got {new!r}")
        dupes = sorted({n for n in new_names if new_names.count(n) > 1})
        if dupes:
            raise SchemaMismatchError(f"rename would give more than one column the name {', '.join(map(repr, dupes))}")
        columns = [
            Column._view(c._block, dataclasses.replace(c._plan, name=new), c.offset, len(c), c._null_count)
            for c, new in zip(self.columns, new_names)
        ]
        import pyarrow as pa

        fields = [f.with_name(new) for f, new in zip(self.schema, new_names)]
        schema = pa.schema(fields, metadata=self.schema.metadata)
        return type(self)._from_columns(self._block, schema, columns, self.num_rows)

    def drop(self: Table, *columns: str | Iterable[str], strict: bool = True) -> Table:
        """A view without ``columns`` (zero copy), as polars' ``DataFrame.drop``.

        Parameters
        ----------
        *columns
            Names, or lists of names.
        strict
            Every name must be a column (else :class:`~pystrom.errors.ColumnNotFoundError`); False
            ignores names that are not.
        """
        names: list[str] = []
        for c in columns:
            names += [c] if isinstance(c, str) else list(c)
        for name in names:
            if not isinstance(name, str):
                raise InvalidArgumentError(f"drop takes column names (str); got {name!r}")
            if strict and name not in self:
                self.column(name)  # ColumnNotFoundError listing the columns
        gone = set(names)
        return self.select([n for n in self.column_names if n not in gone])

    # -- rows -----------------------------------------------------------------------------------------

    def tail(self: Table, n: int = 5) -> Table:
        """A view of the last ``n`` rows (zero copy; all rows when the table has fewer)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"tail(n) needs a non-negative int; got {n!r}")
        return self.slice(max(0, self.num_rows - n))

    def sort(
        self: Table,
        by: str | Sequence[str],
        *more_by: str,
        descending: bool | Sequence[bool] = False,
        nulls_last: bool | Sequence[bool] = False,
        multithreaded: bool = True,
        maintain_order: bool = False,
    ) -> Table:
        """A new table with the rows sorted by one or more columns, as polars' ``DataFrame.sort``.

        The sort is stable: rows with equal keys keep their order (``maintain_order`` and
        ``multithreaded`` are accepted for polars' signature and change nothing: pystrom always
        keeps the order). It runs on the table's device (CuPy's sort on a GPU) and ends with one
        gather of every column.

        Parameters
        ----------
        by, *more_by
            Column names, most significant first: ``sort("a", "b")`` or ``sort(["a", "b"])``.
            Numbers, booleans, temporal types, decimals, strings and binary (in byte order, which is
            code point order for UTF-8) and fixed-size binary can be keys; lists and intervals cannot.
        descending
            One bool for every key, or one per key.
        nulls_last
            NULLs after the values (default: before them, as in polars); one bool or one per key.
            NaN is larger than every number: last ascending, first descending (as in polars).

        See Also
        --------
        sort_by : pyarrow's spelling (NaN beside the NULLs there, as pyarrow does).
        """
        from ._sort import sort  # up: a convenience method; _sort builds Tables

        for flag, value in (("multithreaded", multithreaded), ("maintain_order", maintain_order)):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"sort: {flag} must be a bool; got {value!r}")
        return sort(self, by, more_by, descending, nulls_last)

    def sort_by(self: Table, sorting: str | Sequence[tuple[str, ...]], *, null_placement: str | None = None) -> Table:
        """A new table sorted as pyarrow's ``Table.sort_by``: the alias of :meth:`sort` in pyarrow's terms.

        Parameters
        ----------
        sorting
            A column name (ascending), or a list of ``(name, "ascending" | "descending")`` or
            ``(name, order, "at_start" | "at_end")`` tuples; NULLs go at the end unless a key says
            otherwise (pyarrow's default). NaN is placed beside the NULLs, between them and the
            values, whatever the direction (pyarrow's rule).
        null_placement
            ``"at_start"`` or ``"at_end"`` for every key, overriding the keys' own (pyarrow's
            ``SortOptions.null_placement``).
        """
        from ._sort import sort_by  # up: a convenience method; _sort builds Tables

        return sort_by(self, sorting, null_placement)

    def unique(
        self: Table,
        subset: str | Sequence[str] | None = None,
        *,
        keep: str = "any",
        maintain_order: bool = False,
    ) -> Table:
        """A new table with duplicate rows removed, as polars' ``DataFrame.unique``.

        NULLs are equal to each other, NaN to NaN, -0.0 to 0.0 (as in polars).

        Parameters
        ----------
        subset
            The columns that decide whether two rows are duplicates (default: all).
        keep
            Which row of a group of duplicates stays: ``"first"``, ``"last"``, ``"any"`` (here the
            first) or ``"none"`` (groups of more than one row go entirely).
        maintain_order
            True: the rows kept stay in table order. False (default): they come in the order of the
            ``subset`` values, NULLs first (polars leaves this order unspecified).
        """
        from ._unique import unique_rows  # up: a convenience method; _unique builds Tables

        return unique_rows(self, subset, keep, maintain_order)

    # -- NULLs ----------------------------------------------------------------------------------------

    def fill_null(self: Table, value: Any = None, strategy: str | None = None, limit: int | None = None) -> Table:
        """A new table with NULLs replaced, as polars' ``DataFrame.fill_null``; column types never change.

        Parameters
        ----------
        value
            Fills the columns of its kind: a bool boolean columns, an int integer, float and
            decimal columns, a float float columns (an integer column cannot hold 1.5: polars would
            turn it into a float column, pystrom leaves it), a str string columns, bytes binary
            columns, a date/datetime/time/timedelta the matching temporal columns, a Decimal decimal
            columns, a pyarrow scalar the columns of exactly its type. Other columns are left as
            they are. A value a matching column cannot hold (300 in a uint8 column) is an
            :class:`~pystrom.errors.InvalidArgumentError` naming the column.
        strategy
            Instead of a value: ``"forward"``/``"backward"`` (the previous/next valid value, any
            type), ``"min"``/``"max"`` (of the column, skipping NaN; orderable types),
            ``"mean"`` (integer and float columns; truncated toward zero in an integer column, as
            polars), ``"zero"``/``"one"`` (numbers and booleans). Columns a strategy does not apply
            to are left as they are; use :meth:`Column.fill_null` for an error instead.
        limit
            With ``"forward"``/``"backward"``: fill at most this many consecutive NULLs.

        Returns
        -------
        Table
            A new table on the same device, or a view of this one when no NULL was filled.
        """
        from ._fill import fill_null  # up: a convenience method; _fill builds Tables

        return fill_null(self, value, strategy, limit)

    def drop_nulls(self: Table, subset: str | Sequence[str] | None = None) -> Table:
        """A new table without the rows that have a NULL in ``subset`` (default: any column), as polars.

        NaN is a value, not a NULL. Returns a view of this table when no row has a NULL there.
        """
        from ._fill import drop_nulls  # up: a convenience method; _fill builds Tables

        return drop_nulls(self, subset)

    # -- statistics -----------------------------------------------------------------------------------

    def describe(
        self: Table,
        percentiles: Sequence[float] | float | None = (0.25, 0.5, 0.75),
        *,
        interpolation: str = "nearest",
    ) -> Table:
        """Summary statistics of the numeric and boolean columns, as polars' ``DataFrame.describe``.

        A new table on the same device: a string column ``statistic`` (count, null_count, mean,
        std, min, one row per percentile such as ``25%``, max) and one float64 column per integer,
        float, decimal or bool column of this table. Other columns (strings, temporal, lists) are
        left out: polars turns their statistics into strings, pystrom keeps the result numeric.
        ``count`` counts non-NULL values, ``std`` is the sample standard deviation, ``min``/``max``
        skip NaN; a bool column gets count, null_count, mean (the fraction true), min and max.

        Parameters
        ----------
        percentiles
            Numbers in [0, 1] (sorted and shown once each), one number, or None for none.
        interpolation
            How a percentile between two values is taken: ``"nearest"`` (default, as polars),
            ``"lower"``, ``"higher"``, ``"midpoint"`` or ``"linear"``.
        """
        from ._describe import describe  # up: a convenience method; _describe builds Tables

        return describe(self, percentiles, interpolation)
