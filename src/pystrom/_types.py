"""The column types pystrom holds, and how each is laid out in memory.

Every Arrow type a Table accepts maps to one :class:`ColumnType`: its *logical* Arrow type (what
``table.schema`` and ``to_arrow()`` report) and its *physical* layout (what sits in device memory).

=====================  ========================  =======================================
Arrow type             values buffer             array view (``table[name]``)
=====================  ========================  =======================================
bool                   1 byte per value (0/1)    ``bool``, shape (n,)
int8..64, uint8..64    native                    same dtype, shape (n,)
float16/32/64          native                    same dtype, shape (n,)
date32, time32         int32                     ``int32`` (days / time units)
date64, time64,        int64                     ``int64`` (ms / time units / the
timestamp, duration                              timestamp's unit since the epoch, UTC)
decimal128(p<=38, s)   16 bytes, little endian   ``uint8``, shape (n, 16)
fixed_size_binary(w)   w bytes                   ``uint8``, shape (n, w); uuid is (n, 16)
utf8, binary           int32 offsets + bytes     none: use ``column(name).offsets/data``
fixed_size_list<T>[d]  child values, d per row   ``T``, shape (n, d) (zero copy)
list<T>                int32 offsets + child     none: ``column(name).offsets`` and
                       values                    ``column(name).child_values``
month_day_nano_        16 bytes: int32 months,   ``uint8``, shape (n, 16); ``.view("<i4")``
interval               int32 days, int64 nanos   gives months/days, ``.view("<i8")[:, 1]`` ns
list<C> (C: any other  int32 offsets; the        none: ``column(name).offsets`` and
held type: strings,    elements a child column   ``column(name).elements`` (a Column)
structs, lists)
struct<...>            none (validity only);     none: ``column(name).field(f)``
                       a child column per field
=====================  ========================  =======================================

``T`` of a list is bool, int8..64, uint8..64 or float16/32/64. How list buffers sit in the table's
allocation is defined in :mod:`pystrom.interop.lists`. Arrow's ``month_interval`` and
``day_time_interval`` are read as ``month_day_nano_interval`` (pyarrow has no other interval type).

Booleans take one byte each, unlike Arrow's bit-packed buffers: CuPy and DLPack consumers read
``bool`` arrays as bytes, and one byte per value makes a boolean column a zero-copy array like
any other. Exporting to Arrow (``to_arrow``, the Arrow C device interface) packs the bits.

Dictionary arrays are decoded on the way in; ``large_string``/``large_binary`` and the view
types are narrowed to 32-bit offsets (a column whose bytes exceed 2 GiB is refused).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .errors import UnsupportedTypeError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ColumnType", "column_type", "Layout", "per_type"]

_R = TypeVar("_R")


def per_type(fn: Callable[[Any], _R]) -> Callable[[Any], _R]:
    """``fn`` of an Arrow type, remembered per type: a file read asks the same few questions of every field's
    type several times (~4 us each), and so does every read of files with the same schema. ``fn`` must
    depend on nothing an equal type may differ in (a list's child field name or metadata), and raise
    nothing (a raise is not remembered, so it is recomputed); unhashable types are never remembered."""
    remembered = functools.lru_cache(maxsize=1024)(fn)

    @functools.wraps(fn)
    def lookup(t: Any) -> _R:
        try:
            return remembered(t)
        except TypeError:  # an unhashable type (a Python extension type may be)
            return fn(t)

    return lookup


class Layout:
    """Physical layouts. Strings and binary share VARBINARY."""

    FIXED = "fixed"  # one values buffer, `width` bytes per value, a NumPy/CuPy dtype
    BOOL = "bool"  # like FIXED with width 1, but Arrow stores it as bits
    BYTES = "bytes"  # fixed-size raw bytes: decimal128, fixed_size_binary (values view is (n, width) uint8)
    VARBINARY = "varbinary"  # int32 offsets (n + 1) + data bytes
    FIXED_LIST = "fixed_list"  # fixed_size_list<T>[d]: n * d child values (`storage` dtype), d = list_size
    LIST = "list"  # list<T>: int32 offsets (n + 1) in `values`, child values in `data`
    # Columns made of columns (children planned after every top-level buffer; see memory/layout.py):
    LIST_OF = "list_of"  # list<C> of any other held type C (strings, structs): int32 offsets, one child column
    STRUCT = "struct"  # struct<...>: a validity bitmap only; one child column per field, row i = their row i

    NESTED = (FIXED_LIST, LIST)  # lists of numbers: their elements are a plain buffer of the column
    COMPOSED = (LIST_OF, STRUCT)  # columns whose elements are child columns (ColumnType.children)


@dataclass(frozen=True)
class ColumnType:
    """How one Arrow type is held: its logical type, physical layout and per-value width."""

    arrow: pa.DataType  # logical type, possibly an extension type (uuid)
    layout: str
    width: int  # bytes per value in the values buffer (offsets: 4)
    storage: np.dtype  # dtype of the values buffer; uint8 for BYTES; int32 offsets for VARBINARY; child dtype for lists
    list_size: int = 0  # d of a fixed_size_list (FIXED_LIST); 0 otherwise
    children: tuple[ColumnType, ...] = ()  # LIST_OF: the element type; STRUCT: one per field, in order
    # a fixed_size_list of fixed_size_lists (d1 of d2 of ... T): (d1, d2, ...), list_size their product; () otherwise
    shape: tuple[int, ...] = ()

    @classmethod
    def _of(
        cls, arrow: pa.DataType, layout: str, width: int, storage: np.dtype, list_size: int = 0, children: tuple = (),
        shape: tuple = (),
    ) -> ColumnType:  # fmt: skip
        """The constructor's result without its cost (~1.5 us: a frozen dataclass sets each field through
        ``object.__setattr__``), for :func:`column_type`, which a file read calls a few times per field."""
        self = object.__new__(cls)
        self.__dict__.update(
            arrow=arrow, layout=layout, width=width, storage=storage, list_size=list_size, children=children,
            shape=shape,
        )  # fmt: skip
        return self

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of one row of a fixed_size_list's values: (d,) or, nested, (d1, d2, ...)."""
        return self.shape or (self.list_size,)

    @property
    def child_names(self) -> tuple[str, ...]:
        """The names of :attr:`children`: a struct's field names; ``("item",)``-like for a list."""
        storage = self.storage_arrow
        if self.layout == Layout.STRUCT:
            return tuple(storage.field(i).name for i in range(storage.num_fields))
        if self.layout == Layout.LIST_OF:
            return (storage.value_field.name,)
        return ()

    @property
    def name(self) -> str:
        return str(self.arrow)

    @property
    def storage_arrow(self) -> pa.DataType:
        """The Arrow type of the stored buffers (an extension type's storage type)."""
        import pyarrow as pa

        return self.arrow.storage_type if isinstance(self.arrow, pa.BaseExtensionType) else self.arrow


SUPPORTED_TYPES_TEXT = (
    "bool, int8/16/32/64, uint8/16/32/64, float16/32/64, date32/64, time32/64, timestamp (any unit, "
    "with or without time zone), duration, decimal128 (precision <= 38), string, binary, "
    "fixed_size_binary (uuid), month_day_nano_interval, fixed_size_list and list (32-bit offsets) of "
    "bool/int/uint/float, list of any other of these types, and struct of any of them"
)


# The types whose values a list may hold: one-byte booleans and NumPy's fixed-width numbers.
def _list_child(arrow: pa.DataType, child: pa.DataType, column: str) -> np.dtype:
    import pyarrow.types as pt

    if pt.is_boolean(child):
        return np.dtype(bool)
    if pt.is_integer(child) or pt.is_floating(child):
        return np.dtype(child.to_pandas_dtype())
    raise UnsupportedTypeError(
        f"column {column!r} has type {arrow}, whose elements pystrom cannot hold: lists hold bool, "
        "int8/16/32/64, uint8/16/32/64 or float16/32/64"
    )


def _fixed(arrow: pa.DataType, dtype: str | np.dtype) -> ColumnType:
    dt = np.dtype(dtype)
    return ColumnType(arrow, Layout.FIXED, dt.itemsize, dt)


def column_type(arrow: pa.DataType, column: str) -> ColumnType:
    """Map a (storage-normalised) Arrow type to its ColumnType, or raise naming the column.

    ``arrow`` must already be normalised by :func:`pystrom.interop.arrow_in.normalize_type`:
    no dictionaries, no large or view variants.
    """
    held = _held_parts(arrow)
    if held is None:
        return _column_type(arrow, column)  # raises, naming the column
    if held[0] in Layout.COMPOSED:  # the children keep their own (logical) Arrow types
        return _column_type(arrow, column)
    return ColumnType._of(arrow, *held)


@per_type
def _held_parts(arrow: pa.DataType) -> tuple | None:
    """The layout, width, storage and list size of ``arrow``'s ColumnType; None where it has none (they
    depend on no field name or metadata an equal type may differ in)."""
    try:
        t = _column_type(arrow, "")
    except UnsupportedTypeError:
        return None
    return t.layout, t.width, t.storage, t.list_size, (), t.shape


def _part_type(outer: pa.DataType, part: pa.DataType, column: str, what: str) -> ColumnType:
    """A struct field's or a list's element type, or a refusal naming the column, its whole type and the part."""
    try:
        return _column_type(part, column)
    except UnsupportedTypeError as exc:
        why = str(exc).split(", which pystrom cannot hold", 1)[-1]
        raise UnsupportedTypeError(
            f"column {column!r} has type {outer}, whose {what} ({part}) pystrom cannot hold{why}"
        ) from None


def _column_type(arrow: pa.DataType, column: str) -> ColumnType:
    import pyarrow as pa
    import pyarrow.types as pt

    storage = arrow.storage_type if isinstance(arrow, pa.BaseExtensionType) else arrow
    if pt.is_boolean(storage):
        return ColumnType(arrow, Layout.BOOL, 1, np.dtype(bool))
    if pt.is_integer(storage) or pt.is_floating(storage):
        return _fixed(arrow, np.dtype(storage.to_pandas_dtype()))
    if pt.is_date32(storage) or pt.is_time32(storage):
        return _fixed(arrow, "int32")
    if pt.is_date64(storage) or pt.is_time64(storage) or pt.is_timestamp(storage) or pt.is_duration(storage):
        return _fixed(arrow, "int64")
    if pt.is_decimal128(storage):
        return ColumnType(arrow, Layout.BYTES, 16, np.dtype(np.uint8))
    if pt.is_fixed_size_binary(storage):
        return ColumnType(arrow, Layout.BYTES, storage.byte_width, np.dtype(np.uint8))
    if pt.is_string(storage) or pt.is_binary(storage):
        return ColumnType(arrow, Layout.VARBINARY, 4, np.dtype(np.int32))
    if pt.is_fixed_size_list(storage):
        shape, element = [storage.list_size], storage.value_type
        while pt.is_fixed_size_list(element):  # d1 lists of d2 lists ... of T: held as d1 * d2 * ... values
            shape.append(element.list_size)
            element = element.value_type
        child = _list_child(arrow, element, column)
        d = int(np.prod(shape))
        nested = tuple(shape) if len(shape) > 1 else ()
        return ColumnType(arrow, Layout.FIXED_LIST, d * child.itemsize, child, d, shape=nested)
    if pt.is_list(storage):
        element = storage.value_type
        if pt.is_boolean(element) or pt.is_integer(element) or pt.is_floating(element):
            return ColumnType(arrow, Layout.LIST, 4, _list_child(arrow, element, column))
        child = _part_type(arrow, element, column, "elements")
        return ColumnType(arrow, Layout.LIST_OF, 4, np.dtype(np.int32), children=(child,))
    if pt.is_struct(storage):
        if storage.num_fields == 0:
            raise UnsupportedTypeError(
                f"column {column!r} has type {arrow}, a struct without fields, which holds nothing"
            )
        fields = tuple(
            _part_type(arrow, storage.field(i).type, column, f"field {storage.field(i).name!r}")
            for i in range(storage.num_fields)
        )
        return ColumnType(arrow, Layout.STRUCT, 0, np.dtype(np.uint8), children=fields)
    if storage == pa.month_day_nano_interval():
        return ColumnType(arrow, Layout.BYTES, 16, np.dtype(np.uint8))
    hint = ""
    if pt.is_decimal(storage):
        hint = " (cast it to decimal128 with precision <= 38, or to float64)"
    elif pt.is_nested(storage):
        hint = " (nested types other than struct, list and fixed_size_list are not supported: flatten it first)"
    elif pt.is_null(storage):
        hint = " (a column of only NULLs has no value type: cast it to the type it should have)"
    raise UnsupportedTypeError(
        f"column {column!r} has type {arrow}, which pystrom cannot hold{hint}; supported: {SUPPORTED_TYPES_TEXT}"
    )
