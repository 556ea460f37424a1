"""Arrow data coming in: accepted inputs, type normalisation, and validation of foreign buffers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pt

from .._types import Layout, column_type
from ..errors import CapacityError, SchemaMismatchError, UnsupportedTypeError
from .build import HostColumn

__all__ = ["as_arrow_table", "host_column"]

_INT32_MAX = 2**31 - 1

# Types whose values pystrom keeps with 32-bit offsets (Arrow's plain string/binary layout).
_NARROWED = {
    "large_string": pa.string(),
    "string_view": pa.string(),
    "large_binary": pa.binary(),
    "binary_view": pa.binary(),
}


def as_arrow_table(obj: Any) -> pa.Table:
    """Accept pyarrow tables, batches, readers, pandas DataFrames and Arrow PyCapsule producers."""
    if isinstance(obj, pa.Table):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    if isinstance(obj, pa.RecordBatchReader):
        return obj.read_all()
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(b, pa.RecordBatch) for b in obj):
        try:
            return pa.Table.from_batches(list(obj))
        except pa.ArrowInvalid as exc:
            raise SchemaMismatchError(f"record batches with different schemas cannot form one table: {exc}") from None
    module = type(obj).__module__
    if module.startswith("pandas") and type(obj).__name__ == "DataFrame":
        return pa.Table.from_pandas(obj, preserve_index=False)
    if hasattr(obj, "__arrow_c_stream__") or hasattr(obj, "__arrow_c_array__"):
        return pa.table(obj)
    if hasattr(obj, "__arrow_c_device_array__"):
        return pa.Table.from_batches([pa.record_batch(obj)])
    raise UnsupportedTypeError(
        "Table.from_arrow expects a pyarrow Table, RecordBatch, RecordBatchReader, a pandas DataFrame or an "
        f"object with the Arrow PyCapsule interface; got {type(obj).__module__}.{type(obj).__qualname__}"
    )


def _narrow(name: str, chunk: pa.Array, target: pa.DataType) -> pa.Array:
    try:
        return chunk.cast(target)
    except (pa.ArrowInvalid, pa.ArrowCapacityError):
        raise CapacityError(
            f"column {name!r} ({chunk.type}) holds more bytes than 32-bit offsets address (2 GiB)"
        ) from None


def _normalize(name: str, arrow_type: pa.DataType, chunks: list[pa.Array]) -> tuple[pa.DataType, list[pa.Array]]:
    """Decode dictionaries, narrow large/view strings; return the logical type and storage chunks."""
    if pt.is_dictionary(arrow_type):
        value_type = arrow_type.value_type
        chunks = [c.dictionary_decode() for c in chunks]
        return _normalize(name, value_type, chunks)
    if isinstance(arrow_type, pa.BaseExtensionType):
        storage_type, storage = _normalize(name, arrow_type.storage_type, [c.storage for c in chunks])
        if storage_type != arrow_type.storage_type:
            raise UnsupportedTypeError(
                f"column {name!r} has extension type {arrow_type} over {arrow_type.storage_type}, "
                "which pystrom cannot hold without changing it"
            )
        return arrow_type, storage
    target = _NARROWED.get(str(arrow_type))
    if target is not None:
        return target, [_narrow(name, c, target) for c in chunks]
    return arrow_type, chunks


def _check_offsets(name: str, chunk: pa.Array) -> int:
    """Validate a string chunk's offsets (foreign producers may hand us anything); return its data bytes."""
    n = len(chunk)
    bufs = chunk.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=chunk.offset * 4) if n else None
    if offsets is None:
        return 0
    data_size = bufs[2].size if bufs[2] is not None else 0
    if offsets[0] < 0 or offsets[-1] > data_size or (n > 0 and np.any(offsets[1:] < offsets[:-1])):
        raise SchemaMismatchError(
            f"column {name!r}: invalid string offsets in the Arrow input (corrupt or hostile data)"
        )
    return int(offsets[-1] - offsets[0])


def _list_children(name: str, layout: str, chunks: list[pa.Array]) -> list[pa.Array]:
    """Each list chunk's child values for its own rows (offsets validated: foreign producers may hand us anything)."""
    out = []
    for c in chunks:
        n = len(c)
        if layout == Layout.FIXED_LIST:
            rows = None  # the rows that hold values (a NULL row's inner lists may be NULL: pyarrow makes them so)
            while pt.is_fixed_size_list(c.type):  # nested: down to the values, one level at a time
                d = c.type.list_size
                valid = c.is_valid().to_numpy(zero_copy_only=False) if c.null_count else np.ones(len(c), bool)
                rows = valid if rows is None else rows & valid
                c = c.values.slice(c.offset * d, len(c) * d)
                rows = np.repeat(rows, d)
                if pt.is_fixed_size_list(c.type) and c.null_count and bool((c.is_null().to_numpy(False) & rows).any()):
                    raise UnsupportedTypeError(
                        f"column {name!r}: an inner list of a nested fixed_size_list is NULL; pystrom holds its rows "
                        "as one block of values, where only the rows and the values may be NULL"
                    )
            out.append(c)
            continue
        offsets = np.frombuffer(c.buffers()[1], dtype=np.int32, count=n + 1, offset=c.offset * 4)
        if offsets[0] < 0 or offsets[-1] > len(c.values) or (n > 0 and np.any(offsets[1:] < offsets[:-1])):
            raise SchemaMismatchError(
                f"column {name!r}: invalid list offsets in the Arrow input (corrupt or hostile data)"
            )
        out.append(c.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))
    return out


def _composed(name: str, field: pa.Field, logical: pa.DataType, chunks: list[pa.Array]) -> HostColumn:
    """A struct or list<C> column: its own buffers and its children, each prepared by :func:`host_column`."""
    storage = logical.storage_type if isinstance(logical, pa.BaseExtensionType) else logical
    length = sum(len(c) for c in chunks)
    null_count = sum(c.null_count for c in chunks)
    if pt.is_struct(storage):
        children = []
        for i in range(storage.num_fields):
            child_field = storage.field(i)
            parts = pa.chunked_array([c.field(i) for c in chunks], type=child_field.type)  # field() applies c.offset
            children.append(_part(name, logical, f"field {child_field.name!r}", child_field, parts))
        fields = [pa.field(f.name, c.field.type, f.nullable, f.metadata) for f, c in zip(storage, children)]
        new_storage = pa.struct(fields)
    else:
        elements = _list_children(name, Layout.LIST, chunks)
        count = sum(len(c) for c in elements)
        if count > _INT32_MAX:
            raise CapacityError(f"column {name!r} holds {count:,} list elements; 32-bit offsets address 2**31 - 1")
        value_field = storage.value_field
        child = _part(name, logical, "elements", value_field, pa.chunked_array(elements, type=value_field.type))
        children = [child]
        new_storage = pa.list_(pa.field(value_field.name, child.field.type, value_field.nullable, value_field.metadata))
    if new_storage != storage:  # a child's dictionary decoded or strings narrowed: the logical type follows
        if isinstance(logical, pa.BaseExtensionType):
            raise UnsupportedTypeError(
                f"column {name!r} has extension type {logical} over {storage}, which pystrom cannot hold without "
                "changing it"
            )
        logical = new_storage
    ctype = column_type(logical, name)
    out_field = pa.field(field.name, logical, nullable=field.nullable, metadata=field.metadata)
    return HostColumn(out_field, ctype, chunks, length, null_count, 0, 0, None, children)


def _part(name: str, outer: pa.DataType, what: str, field: pa.Field, chunked: pa.ChunkedArray) -> HostColumn:
    """A struct's field or a list's elements prepared; a refusal names the column, its whole type and the part."""
    try:
        return host_column(name, field, chunked)
    except UnsupportedTypeError as exc:
        if f"has type {outer}," in str(exc):  # already said of the whole column, deeper down
            raise
        why = str(exc).split(", which pystrom cannot hold", 1)[-1]
        raise UnsupportedTypeError(
            f"column {name!r} has type {outer}, whose {what} ({field.type}) pystrom cannot hold{why}"
        ) from None


def host_column(name: str, field: pa.Field, chunked: pa.ChunkedArray) -> HostColumn:
    """One Arrow column prepared for copying into a table's allocation (``name``: the top-level column's
    name, for messages; the fields of its children keep their own names)."""
    logical, chunks = _normalize(name, field.type, list(chunked.chunks))
    storage = logical.storage_type if isinstance(logical, pa.BaseExtensionType) else logical
    if pt.is_struct(storage) or (pt.is_list(storage) and not _numeric(storage.value_type)):
        return _composed(name, field, logical, chunks)
    ctype = column_type(logical, name)
    length = sum(len(c) for c in chunks)
    null_count = sum(c.null_count for c in chunks)
    data_size = child_nulls = 0
    children = None
    if ctype.layout in Layout.NESTED:
        children = _list_children(name, ctype.layout, chunks)
        child_nulls = sum(c.null_count for c in children)
        if ctype.layout == Layout.LIST:
            elements = sum(len(c) for c in children)
            if elements > _INT32_MAX:
                raise CapacityError(
                    f"column {name!r} holds {elements:,} list elements; 32-bit offsets address 2**31 - 1"
                )
            data_size = elements * ctype.storage.itemsize
    if ctype.layout == Layout.VARBINARY:
        data_size = sum(_check_offsets(name, c) for c in chunks)
        if data_size > _INT32_MAX:
            raise CapacityError(
                f"column {name!r} holds {data_size:,} bytes of {logical} data; one column holds at most 2 GiB"
            )
    out_field = pa.field(field.name, logical, nullable=field.nullable, metadata=field.metadata)
    return HostColumn(out_field, ctype, chunks, length, null_count, data_size, child_nulls, children)


def _numeric(t: pa.DataType) -> bool:
    return pt.is_boolean(t) or pt.is_integer(t) or pt.is_floating(t)


def columns_of(table: pa.Table) -> list[HostColumn]:
    names = table.column_names
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise SchemaMismatchError(f"column name {n!r} appears more than once; pystrom needs unique names")
        seen.add(n)
    return [host_column(n, table.schema.field(i), table.column(i)) for i, n in enumerate(names)]
