"""Expressions over a Table: ``Table.filter("expr")`` and ``Table.with_columns(name="expr", ...)``.

The language is the ``where`` language of the loaders (:mod:`pystrom.expr`: one parser, type
checker, NumPy evaluator and CUDA generator). A filter compiles its predicate against the table's
schema, evaluates it (one generated kernel on a GPU) and gathers the rows where it is TRUE.
``with_columns``, in order:

1. compiles every expression against the table's schema as it is before the call (new columns
   cannot refer to each other), each to a type from the type checker;
2. plans one new allocation: the table's columns (a column named like a new one is replaced in
   place), then the new columns, each with a validity bitmap only if some row may be NULL;
3. copies the kept columns and computes the new ones: NumPy column at a time on the CPU, one
   generated kernel for all of them on a GPU, writing values and validity bitmaps together;
4. counts each new column's NULLs and drops the bitmap of a column that has none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _ops
from ._types import column_type
from .errors import ExpressionError, SchemaMismatchError
from .expr import compile_expression, evaluate_columns
from .memory import bitmap
from .memory.layout import ColumnSpec
from .table import Table

if TYPE_CHECKING:
    import pyarrow as pa


__all__ = ["filter_expression", "with_columns", "with_arrays"]


def filter_expression(table: Table, text: str) -> Table:
    """The rows of ``table`` where the where-expression ``text`` is TRUE (NULL and false drop the row)."""
    from ._udf._where import compile_where_udf  # up: where strings may call registered UDFs

    backend = table._live().backend
    try:
        predicate = compile_where_udf(text, table.schema)
    except ExpressionError as exc:
        raise ExpressionError(f"filter({text!r}): {exc}", exc.position) from None
    with backend.activate():
        mask = predicate.evaluate(table)
        return _ops.gather(table, backend.xp.flatnonzero(mask))


def with_columns(table: Table, named: Mapping[str, Any]) -> Table:
    """``table`` with the columns ``named`` (name -> expression text, UDF call, array, Column or
    scalar) added or replaced, in a new allocation.

    Expressions alone are computed straight into the new allocation. Otherwise each value first
    becomes a column of the table's device (expressions and UDF calls computed from the table as it
    is before the call, data placed by :func:`._values.value_column`), and one gather assembles the
    result in the call's order.
    """
    table._live()
    if not named:
        raise ValueError("with_columns needs at least one name=value")
    for name in named:
        if not isinstance(name, str) or not name:
            raise SchemaMismatchError(f"with_columns: column names are non-empty strings; got {name!r}")
    texts = {n: v for n, v in named.items() if isinstance(v, str)}
    if len(texts) == len(named):
        return _with_expressions(table, _compile(table, texts), keep=True)
    from ._values import value_column  # up: a convenience method; _values builds Tables

    takes: dict[str, _ops.Take] = {}
    if texts:
        computed = _with_expressions(table, _compile(table, texts), keep=False)
        takes.update((n, _ops.Take(computed.column(n))) for n in texts)
    calls = {n: v for n, v in named.items() if hasattr(v, "evaluate") and hasattr(v, "udf")}  # UDFCall
    if calls:
        results = with_arrays(table.select([]), {n: call.evaluate(table) for n, call in calls.items()})
        takes.update((n, _ops.Take(results.column(n))) for n in calls)
    for name, value in named.items():
        if name not in takes:
            takes[name] = value_column(table, name, value)
    return splice(table, {n: takes[n] for n in named})


def _compile(table: Table, texts: Mapping[str, str]) -> dict[str, Any]:
    new = {}
    for name, text in texts.items():
        try:
            new[name] = compile_expression(text, table.schema)
        except ExpressionError as exc:
            raise ExpressionError(f"with_columns({name}={text!r}): {exc}", exc.position) from None
    return new


def splice(table: Table, new: Mapping[str, _ops.Take]) -> Table:
    """A new table: ``table``'s columns with those named in ``new`` replaced in place and the other
    names appended in order, all gathered into one new allocation on the table's device."""
    import pyarrow as pa

    backend = table._live().backend
    n = table.num_rows
    slots: list[Any] = []
    fields = []
    for col in table.columns:
        take = new.get(col.name)
        slots.append(col if take is None else _ops.Take(take.column, take.rows, col.name))
        fields.append(table.schema.field(col.name) if take is None else pa.field(col.name, take.column.type))
    for name, take in new.items():
        if name not in table:
            slots.append(_ops.Take(take.column, take.rows, name))
            fields.append(pa.field(name, take.column.type))
    with backend.activate():
        block, plan = _ops.gather_into(backend, backend.xp.arange(n, dtype=np.int64), slots)
    return Table._wrap(block, plan, pa.schema(fields, metadata=table.schema.metadata), n)


def _with_expressions(table: Table, new: dict[str, Any], keep: bool) -> Table:
    """The table with the compiled expressions ``new`` computed into a new allocation: after the
    kept columns of ``table`` (``keep``), or alone."""
    import pyarrow as pa

    backend = table._live().backend
    n = table.num_rows
    slots, fields = _plan_slots(table, new, n, keep)
    with backend.activate():
        block, plan = _ops.gather_into(backend, backend.xp.arange(n, dtype=np.int64), slots)
        where = {cp.name: i for i, cp in enumerate(plan.columns)}
        outputs = []
        for name, e in new.items():
            cp = plan.columns[where[name]]
            words = None
            if cp.validity is not None and backend.kind == "cuda":
                words = block.array(cp.validity.offset, np.uint32, ((n + 31) // 32,))
            outputs.append((block.array(cp.values.offset, e.dtype, (n,)), words))
        results = evaluate_columns(tuple(new.values()), table, outputs)
        columns = list(plan.columns)
        for name, result in zip(new, results):
            i = where[name]
            cp = columns[i]
            if cp.validity is None:
                continue
            if backend.kind == "cpu":
                nulls = 0 if result is None else n - int(np.count_nonzero(result))
                if nulls:
                    block.write_device(cp.validity.offset, bitmap.pack(backend, result))
            else:
                bits = block.array(cp.validity.offset, np.uint8, (cp.validity.size,))
                nulls = n - bitmap.count_set(backend, bits, 0, n)
            columns[i] = dataclasses.replace(cp, null_count=nulls, validity=cp.validity if nulls else None)
        backend.synchronize()
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return Table._wrap(block, dataclasses.replace(plan, columns=tuple(columns)), schema, n)


def with_arrays(table: Table, arrays: Mapping[str, tuple[Any, Any]]) -> Table:
    """A new table: ``table`` with columns added or replaced from (values, validity bools or None)
    arrays on its device (user functions' results), NULL where the validity is False."""
    import pyarrow as pa

    backend = table._live().backend
    n = table.num_rows
    specs, nulls = {}, {}
    with backend.activate():
        for name, (values, valid) in arrays.items():
            count = 0 if valid is None else n - bitmap.count_true(valid)
            nulls[name] = count
            specs[name] = (pa.from_numpy_dtype(np.dtype(values.dtype)), count)
    slots, fields = [], []
    for col in table.columns:
        if col.name in specs:
            t, count = specs[col.name]
            slots.append(ColumnSpec(col.name, column_type(t, col.name), n, count))
            fields.append(pa.field(col.name, t))
        else:
            slots.append(col)
            fields.append(table.schema.field(col.name))
    for name, (t, count) in specs.items():
        if name not in table.schema.names:
            slots.append(ColumnSpec(name, column_type(t, name), n, count))
            fields.append(pa.field(name, t))
    with backend.activate():
        block, plan = _ops.gather_into(backend, backend.xp.arange(n, dtype=np.int64), slots)
        columns = list(plan.columns)
        for i, cp in enumerate(columns):
            if cp.name not in arrays:
                continue
            values, valid = arrays[cp.name]
            if n:
                block.array(cp.values.offset, values.dtype, (n,))[...] = values
            if cp.validity is not None and nulls[cp.name]:
                block.write_device(cp.validity.offset, bitmap.pack(backend, valid))
            else:
                columns[i] = dataclasses.replace(cp, null_count=0, validity=None)
        backend.synchronize()
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return Table._wrap(block, dataclasses.replace(plan, columns=tuple(columns)), schema, n)


def _plan_slots(table: Table, new: dict[str, Any], n: int, keep: bool) -> tuple[list[Any], list[pa.Field]]:
    """The output's columns in order (kept Columns unless not ``keep``, ColumnSpecs of new ones) and
    their fields."""
    import pyarrow as pa

    def spec(name: str) -> tuple[ColumnSpec, pa.Field]:
        e = new[name]
        nulls = n if e.may_be_null(table) else 0  # a bitmap is planned; the real count comes later
        return ColumnSpec(name, column_type(e.type, name), n, nulls), pa.field(name, e.type)

    slots: list[Any] = []
    fields = []
    for col in table.columns if keep else ():  # a replaced column keeps its position
        slot, field = spec(col.name) if col.name in new else (col, table.schema.field(col.name))
        slots.append(slot)
        fields.append(field)
    for name in new:
        if name not in table or not keep:
            slot, field = spec(name)
            slots.append(slot)
            fields.append(field)
    return slots, fields
