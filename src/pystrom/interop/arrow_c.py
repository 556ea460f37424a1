"""Export through the Arrow C data and C device interfaces (the Arrow PyCapsule protocol).

A Table is exported as one struct array (one child per column) whose buffers point into the
table's allocation, so consumers (pyarrow on the CPU; cuDF, nanoarrow and others on a GPU) read it
without a copy. The exception is booleans: Arrow packs them into bits, so a packed copy is made on
the table's device and kept alive by the exported array. The schema structs are produced by pyarrow.

Lifetime follows the C interface's rules: every exported ArrowArray owns a ``private_data`` token;
its ``release`` callback drops what the token keeps alive (the table's memory and any packed copy),
after releasing the children that were not moved out. That callback is C++ (csrc/arrow_keep.hpp) and
never takes the GIL, since consumers release on their own threads, even during interpreter shutdown
(where a thread that asks for the GIL is ended and the process aborts). A capsule nobody consumed
releases its array when it is garbage collected. Data on a GPU is complete when exported (the stream is synchronised),
so ``sync_event`` is NULL.
"""

from __future__ import annotations

import ctypes
import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _core
from .._pools import ForkSafeLock
from .._types import Layout
from ..memory import bitmap

if TYPE_CHECKING:
    from ..column import Column
    from ..table import Table

__all__ = ["export_array", "export_stream"]

ARROW_DEVICE_CPU = 1
ARROW_DEVICE_CUDA = 2


class ArrowSchema(ctypes.Structure):
    pass


class ArrowArray(ctypes.Structure):
    pass


_ReleaseSchema = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowSchema))
_ReleaseArray = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowArray))

ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p),
    ("name", ctypes.c_char_p),
    ("metadata", ctypes.c_char_p),
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))),
    ("dictionary", ctypes.POINTER(ArrowSchema)),
    ("release", _ReleaseSchema),
    ("private_data", ctypes.c_void_p),
]
ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.POINTER(ArrowArray)),
    ("release", _ReleaseArray),
    ("private_data", ctypes.c_void_p),
]


class ArrowDeviceArray(ctypes.Structure):
    _fields_ = [
        ("array", ArrowArray),
        ("device_id", ctypes.c_int64),
        ("device_type", ctypes.c_int32),
        ("sync_event", ctypes.c_void_p),
        ("reserved", ctypes.c_int64 * 3),
    ]


class ArrowArrayStream(ctypes.Structure):
    pass


class ArrowDeviceArrayStream(ctypes.Structure):
    pass


_GetSchema = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ArrowSchema))
_GetNext = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_GetLastError = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_ReleaseStream = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

ArrowArrayStream._fields_ = [
    ("get_schema", _GetSchema),
    ("get_next", _GetNext),
    ("get_last_error", _GetLastError),
    ("release", _ReleaseStream),
    ("private_data", ctypes.c_void_p),
]
ArrowDeviceArrayStream._fields_ = [("device_type", ctypes.c_int32)] + ArrowArrayStream._fields_

# -- what exported structs keep alive, by private_data token ---------------------------------------

_tokens = itertools.count(1)
_live: dict[int, Any] = {}  # token -> state of one exported stream (arrays keep theirs in C++: _core.arrow_keep)
_capsule_storage: dict[int, Any] = {}  # struct address -> ctypes struct owned by an unconsumed capsule
_lock = ForkSafeLock()  # a forked child must not inherit it held


def _register(record: Any) -> int:
    token = next(_tokens)
    with _lock:
        _live[token] = record
    return token


# Releases an array's children, then lets go of its private_data (from _core.arrow_keep) without the GIL.
_release_array = _ReleaseArray(_core.arrow_release_address())

# -- building arrays -------------------------------------------------------------------------------


def _fill(out: ArrowArray, length: int, null_count: int, offset: int, buffers: list, keep: list,
          child: ArrowArray | list[ArrowArray] | None = None) -> None:  # fmt: skip
    """Fill ``out``; ``keep`` (and the children, whose release the C++ callback calls first) live until release."""
    pointers = (ctypes.c_void_p * len(buffers))(*buffers)
    keep.append(pointers)
    out.length = length
    out.null_count = null_count
    out.offset = offset
    out.n_buffers = len(buffers)
    out.buffers = ctypes.cast(pointers, ctypes.POINTER(ctypes.c_void_p))
    kids = [] if child is None else [child] if isinstance(child, ArrowArray) else child
    if not kids:
        out.n_children = 0
        out.children = None
    else:
        children = (ctypes.POINTER(ArrowArray) * len(kids))(*[ctypes.pointer(k) for k in kids])
        keep += [*kids, children]
        out.n_children = len(kids)
        out.children = ctypes.cast(children, ctypes.POINTER(ctypes.POINTER(ArrowArray)))
    out.dictionary = None
    out.private_data = _core.arrow_keep(keep)
    out.release = _release_array


def _elements_array(col: Column) -> ArrowArray:
    """A list column's child array: every element of the base column (the parent's offset picks the rows)."""
    block = col._live_block()
    plan = col._plan
    ctype = plan.type
    count = (
        plan.length * ctype.list_size if ctype.layout == Layout.FIXED_LIST else plan.data.size // ctype.storage.itemsize
    )
    span = plan.values if ctype.layout == Layout.FIXED_LIST else plan.data
    keep: list[Any] = [block]
    values = block.ptr + span.offset
    if ctype.storage == np.bool_:
        bits = bitmap.pack(block.backend, block.array(span.offset, np.bool_, (count,)))
        keep.append(bits)
        values = block.backend.array_ptr(bits) if bits.size else None
    validity = block.ptr + plan.child_validity.offset if plan.child_validity is not None else None
    child = ArrowArray()
    _fill(child, count, -1 if validity is not None else 0, 0, [validity, values], keep)  # -1: not counted
    for i in range(len(ctype.shape) - 1, 0, -1):  # a nested fixed_size_list: its inner lists (never NULL)
        count = plan.length * int(np.prod(ctype.shape[:i]))  # counted down: a dimension may be 0
        inner = ArrowArray()
        _fill(inner, count, 0, 0, [None], [], child)
        child = inner
    return child


def _column_array(out: ArrowArray, col: Column) -> None:
    """Fill ``out`` with one column's buffers (pointers into the table's memory)."""
    block = col._live_block()
    backend = block.backend
    plan = col._plan
    ctype = plan.type
    keep: list[Any] = [block]
    validity = block.ptr + plan.validity.offset if plan.validity is not None else None
    child = None
    if ctype.layout == Layout.BOOL:
        # Pack the base column from element 0 so the Arrow offset applies to both buffers alike.
        base = block.array(plan.values.offset, np.bool_, (col.offset + len(col),))
        bits = bitmap.pack(backend, base)
        keep.append(bits)
        buffers = [validity, backend.array_ptr(bits) if bits.size else None]
    elif ctype.layout == Layout.VARBINARY:
        buffers = [validity, _offsets_address(col, keep), block.ptr + plan.data.offset]
    elif ctype.layout == Layout.FIXED_LIST:
        buffers, child = [validity], _elements_array(col)
    elif ctype.layout == Layout.LIST:
        buffers, child = [validity, _offsets_address(col, keep)], _elements_array(col)
    elif ctype.layout in Layout.COMPOSED:  # children: the base child columns (the parent's offset picks the rows)
        child = []
        for i, p in enumerate(plan.children):
            child.append(ArrowArray())
            view = type(col)._view(block, col._child_plan(i), 0, p.length, None if p.null_count else 0)
            _column_array(child[-1], view)
        offsets = [_offsets_address(col, keep)] if ctype.layout == Layout.LIST_OF else []
        buffers = [validity, *offsets]
    else:
        buffers = [validity, block.ptr + plan.values.offset]
    _fill(out, len(col), col.null_count, col.offset, buffers, keep, child)


def _offsets_address(col: Column, keep: list[Any]) -> int:
    """Where the consumer finds a string or list column's offsets: element ``col.offset`` of the base
    buffer (the Arrow offset applies to every buffer alike). Memory another process may write hands
    out a checked copy instead, placed at that same element of a buffer of its own."""
    block = col._live_block()
    if not block.others_may_write:
        return block.ptr + col._plan.values.offset
    checked = col._offsets_in_bounds()
    xp = block.backend.xp
    with block.backend.activate():
        placed = xp.empty(col.offset + len(col) + 1, dtype=np.int32)  # elements before col.offset are never read
        placed[col.offset :] = checked
    keep.append(placed)
    return block.backend.array_ptr(placed)


def _table_array(out: ArrowArray, table: Table) -> None:
    columns = table.columns
    children = (ArrowArray * len(columns))()
    for child, col in zip(children, columns):
        _column_array(child, col)
    child_ptrs = (ctypes.POINTER(ArrowArray) * len(columns))(*[ctypes.pointer(c) for c in children])
    buffers = (ctypes.c_void_p * 1)(None)
    out.length = table.num_rows
    out.null_count = 0
    out.offset = 0
    out.n_buffers = 1
    out.n_children = len(columns)
    out.buffers = ctypes.cast(buffers, ctypes.POINTER(ctypes.c_void_p))
    out.children = ctypes.cast(child_ptrs, ctypes.POINTER(ctypes.POINTER(ArrowArray)))
    out.dictionary = None
    out.private_data = _core.arrow_keep([children, child_ptrs, buffers])
    out.release = _release_array


def _device_of(table: Table) -> tuple[int, int]:
    backend = table._live().backend
    if backend.kind == "cpu":
        return ARROW_DEVICE_CPU, -1
    backend.synchronize()  # the data is complete before anyone reads it: sync_event stays NULL
    return ARROW_DEVICE_CUDA, backend.ordinal


# -- capsules --------------------------------------------------------------------------------------

# Private prototypes: ctypes.pythonapi's function objects are shared process-wide, and other code
# setting their argtypes must not change how ours convert arguments.
_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def capsule_pointer(capsule: Any, name: bytes) -> int:
    """The pointer held by a capsule (checked against its name)."""
    return _PyCapsule_GetPointer(id(capsule), name)


_ARRAY_NAME = b"arrow_array"
_DEVICE_ARRAY_NAME = b"arrow_device_array"
_STREAM_NAME = b"arrow_array_stream"
_DEVICE_STREAM_NAME = b"arrow_device_array_stream"

# Destructors take the capsule as a raw pointer: converting a dying object to py_object would revive it.
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _make_destructor(name: bytes, release_of: Any) -> Any:
    def destroy(capsule: int) -> None:
        address = _PyCapsule_GetPointer(capsule, name)
        with _lock:
            struct = _capsule_storage.pop(address, None)
        if struct is not None:
            release_of(struct)

    return _CapsuleDestructor(destroy)


def _release_unconsumed_array(struct: Any) -> None:
    array = struct.array if isinstance(struct, ArrowDeviceArray) else struct
    _core.arrow_release(ctypes.addressof(array))  # with the GIL: what it kept goes at once


def _release_unconsumed_stream(struct: Any) -> None:
    if struct.release:
        struct.release(ctypes.addressof(struct))


_destroy_array = _make_destructor(_ARRAY_NAME, _release_unconsumed_array)
_destroy_device_array = _make_destructor(_DEVICE_ARRAY_NAME, _release_unconsumed_array)
_destroy_stream = _make_destructor(_STREAM_NAME, _release_unconsumed_stream)
_destroy_device_stream = _make_destructor(_DEVICE_STREAM_NAME, _release_unconsumed_stream)
_DESTRUCTORS = {
    _ARRAY_NAME: _destroy_array,
    _DEVICE_ARRAY_NAME: _destroy_device_array,
    _STREAM_NAME: _destroy_stream,
    _DEVICE_STREAM_NAME: _destroy_device_stream,
}


def _capsule(struct: Any, name: bytes) -> Any:
    address = ctypes.addressof(struct)
    with _lock:
        _capsule_storage[address] = struct
    destructor = ctypes.cast(_DESTRUCTORS[name], ctypes.c_void_p)
    return _PyCapsule_New(address, name, destructor)


def _schema_capsule(table: Table) -> Any:
    return table.schema.__arrow_c_schema__()


def export_array(table: Table, device: bool) -> tuple[Any, Any]:
    """(schema capsule, array capsule) for ``__arrow_c_array__`` / ``__arrow_c_device_array__``."""
    _core.arrow_sweep()
    if device:
        struct = ArrowDeviceArray()
        struct.device_type, struct.device_id = _device_of(table)
        struct.sync_event = None
        _table_array(struct.array, table)
        return _schema_capsule(table), _capsule(struct, _DEVICE_ARRAY_NAME)
    struct = ArrowArray()
    _table_array(struct, table)
    return _schema_capsule(table), _capsule(struct, _ARRAY_NAME)


# -- streams: one batch, the whole table -----------------------------------------------------------


def _move_schema(table: Table, out: Any) -> None:
    capsule = _schema_capsule(table)
    source = ctypes.cast(capsule_pointer(capsule, b"arrow_schema"), ctypes.POINTER(ArrowSchema))
    ctypes.memmove(out, source, ctypes.sizeof(ArrowSchema))
    source.contents.release = _ReleaseSchema()  # moved: the capsule no longer owns it


def _stream_state(address: int, device: bool) -> dict | None:
    kind = ArrowDeviceArrayStream if device else ArrowArrayStream
    token = ctypes.cast(address, ctypes.POINTER(kind)).contents.private_data or 0
    with _lock:
        return _live.get(token)


def _make_stream_callbacks(device: bool) -> tuple[Any, Any, Any, Any]:
    kind = ArrowDeviceArrayStream if device else ArrowArrayStream

    def get_schema(address: int, out: Any) -> int:
        state = _stream_state(address, device)
        try:
            _move_schema(state["table"], out)
            return 0
        except Exception as exc:  # the C caller gets an errno and the message from get_last_error
            state["error"] = ctypes.create_string_buffer(str(exc).encode())
            return 5  # EIO

    def get_next(address: int, out_address: int) -> int:
        # Only moves the batch export_stream built: a Python error here would reach the consumer as an
        # exception pending while it calls release, which then cannot run (pyarrow aborts the process).
        state = _stream_state(address, device)
        prepared = state["array"]
        size = ctypes.sizeof(ArrowDeviceArray if device else ArrowArray)
        if state["done"]:
            ctypes.memset(out_address, 0, size)
            return 0
        ctypes.memmove(out_address, ctypes.addressof(prepared), size)
        state["done"] = True  # moved: the consumer releases it now
        return 0

    def get_last_error(address: int) -> int | None:
        state = _stream_state(address, device)
        error = state.get("error") if state else None
        return ctypes.addressof(error) if error is not None else None

    def release(address: int) -> None:
        struct = ctypes.cast(address, ctypes.POINTER(kind)).contents
        with _lock:
            state = _live.pop(struct.private_data or 0, None)
        if state is not None and not state["done"]:  # never consumed: the batch goes with the stream
            prepared = state["array"]
            _core.arrow_release(ctypes.addressof(prepared.array if device else prepared))
        struct.release = _ReleaseStream()

    return _GetSchema(get_schema), _GetNext(get_next), _GetLastError(get_last_error), _ReleaseStream(release)


_STREAM_CALLBACKS = {False: _make_stream_callbacks(False), True: _make_stream_callbacks(True)}


def export_stream(table: Table, device: bool) -> Any:
    """A stream capsule yielding the table as one batch (``__arrow_c_stream__`` / ``__arrow_c_device_stream__``).

    The batch is built here, where an error (offsets another process broke, ``DataError``) is raised
    to the caller; the stream's callbacks only hand it over.
    """
    _core.arrow_sweep()
    if device:
        prepared: Any = ArrowDeviceArray()
        prepared.device_type, prepared.device_id = _device_of(table)
        prepared.sync_event = None
        _table_array(prepared.array, table)
    else:
        prepared = ArrowArray()
        _table_array(prepared, table)
    get_schema, get_next, get_last_error, release = _STREAM_CALLBACKS[device]
    struct = ArrowDeviceArrayStream() if device else ArrowArrayStream()
    if device:
        struct.device_type = _device_of(table)[0]
    struct.get_schema = get_schema
    struct.get_next = get_next
    struct.get_last_error = get_last_error
    struct.private_data = _register({"table": table, "array": prepared, "done": False, "error": None})
    struct.release = release
    return _capsule(struct, _DEVICE_STREAM_NAME if device else _STREAM_NAME)
