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

from . import _bitmap, _ops
from ._layout import ColumnSpec
from ._types import column_type
from .errors import ExpressionError, SchemaMismatchError
from .expr import compile_expression, compile_where, evaluate_columns
from .table import Table

if TYPE_CHECKING:
    import pyarrow as pa


__all__ = ["filter_expression", "with_columns"]


def filter_expression(table: Table, text: str) -> Table:
    """The rows of ``table`` where the where-expression ``text`` is TRUE (NULL and false drop the row)."""
    backend = table._live().backend
    try:
        predicate = compile_where(text, table.schema)
    except ExpressionError as exc:
        raise ExpressionError(f"filter({text!r}): {exc}", exc.position) from None
    with backend.activate():
        mask = predicate.evaluate(table)
        return _ops.gather(table, backend.xp.flatnonzero(mask))


def with_columns(table: Table, named: Mapping[str, Any]) -> Table:
    import pyarrow as pa

    backend = table._live().backend
    if not named:
        raise ValueError("with_columns needs at least one name=expression")
    new = {}
    for name, text in named.items():
        if not isinstance(name, str) or not name:
            raise SchemaMismatchError(f"with_columns: column names are non-empty strings; got {name!r}")
        if not isinstance(text, str):
            raise ExpressionError(
                f"with_columns({name}=...): the expression must be a str in the where language "
                f"(e.g. 'x * 2'), got {type(text).__name__}"
            )
        try:
            new[name] = compile_expression(text, table.schema)
        except ExpressionError as exc:
            raise ExpressionError(f"with_columns({name}={text!r}): {exc}", exc.position) from None

    n = table.num_rows
    slots, fields = _plan_slots(table, new, n)
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
                    block.write_device(cp.validity.offset, _bitmap.pack(backend, result))
            else:
                bits = block.array(cp.validity.offset, np.uint8, (cp.validity.size,))
                nulls = n - _bitmap.count_set(backend, bits, 0, n)
            columns[i] = dataclasses.replace(cp, null_count=nulls, validity=cp.validity if nulls else None)
        backend.synchronize()
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return Table._wrap(block, dataclasses.replace(plan, columns=tuple(columns)), schema, n)


def _plan_slots(table: Table, new: dict[str, Any], n: int) -> tuple[list[Any], list[pa.Field]]:
    """The output's columns in order (kept Columns, ColumnSpecs of new ones) and their fields."""
    import pyarrow as pa

    def spec(name: str) -> tuple[ColumnSpec, pa.Field]:
        e = new[name]
        nulls = n if e.may_be_null(table) else 0  # a bitmap is planned; the real count comes later
        return ColumnSpec(name, column_type(e.type, name), n, nulls), pa.field(name, e.type)

    slots: list[Any] = []
    fields = []
    for col in table.columns:  # a replaced column keeps its position
        slot, field = spec(col.name) if col.name in new else (col, table.schema.field(col.name))
        slots.append(slot)
        fields.append(field)
    for name in new:
        if name not in table:
            slot, field = spec(name)
            slots.append(slot)
            fields.append(field)
    return slots, fields
