"""The handle format: self-describing bytes that let another process map a table, validated before use.

Layout (little endian)::

    offset  size  field
         0     8  magic b"PYSTROMH"
         8     2  format version (FORMAT_VERSION)
        10     1  memory kind: 1 = host memfd, 2 = CUDA legacy IPC
        11     1  reserved (0)
        12     4  length of the layout (JSON, UTF-8)
        16     4  length of the schema (Arrow IPC schema message)
        20     2  length of the memory handle
        22     2  reserved (0)
        24    16  device UUID (a GPU's UUID; the host's boot id for host memory)
        40     8  size of the allocation the memory handle maps
        48     8  offset of the table's block inside that allocation
        56     8  size of the table's block
        64     4  exporter's pid
        68     4  reserved (0)
        72     8  exporter's start time (clock ticks since boot: tells a reused pid apart)
        80     -  memory handle, layout, schema
      last     4  CRC-32 of everything before it

The memory handle is the 64-byte CUDA IPC handle of the allocation, or for host memory the
exporter's descriptor number (int32) followed by the memfd's name. The layout lists, per column,
every buffer's offset and size inside the block, the base column's length and null count, and the
view's row offset, length and null count (-1: not counted yet).

The CRC catches corruption, not malice: a handle is a capability, and anyone holding its bytes on
the same machine may map the memory (see docs/ipc.md). Every field is checked before anything is
mapped: buffers must lie inside the block, the block inside the allocation, sizes must match each
column's type and length, and types must be ones pystrom holds.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._types import Layout, column_type
from ..column import Column
from ..errors import InvalidHandleError, UnsupportedTypeError
from ..memory.layout import ALIGNMENT, ColumnPlan, ColumnSpec, Span, child_length, values_size
from ..table import Table

if TYPE_CHECKING:
    import pyarrow as pa

    from ..memory.backend import Block

__all__ = ["MAGIC", "FORMAT_VERSION", "HOST_MEMFD", "CUDA_IPC", "Handle", "TableLayout", "encode", "decode"]

MAGIC = b"PYSTROMH"
FORMAT_VERSION = 1
HOST_MEMFD = 1
CUDA_IPC = 2
KINDS = {HOST_MEMFD: "host memfd", CUDA_IPC: "CUDA IPC"}

_HEADER = struct.Struct("<8sHBBIIHH16sQQQIIQ")
assert _HEADER.size == 80
_CRC = struct.Struct("<I")
_MAX_PART = 64 << 20  # layout or schema larger than this is not something we wrote
_MAX_INT = (1 << 63) - 1
MAX_COLUMNS = 1 << 16  # a table with more columns than this is not something we wrote
MAX_NESTING = 8  # struct/list levels of a column shared by handle
MAX_DEPTH = 6 + 2 * MAX_NESTING  # JSON nesting from other processes (a layout needs 4 + 2 per type level, frames 1)


def _span_record(span: Span | None) -> list[int] | None:
    return None if span is None else [span.offset, span.size]


def _buffers(p: ColumnPlan) -> dict[str, Any]:
    """A base column's record: its length, NULL count, buffers, and its child columns' records."""
    record: dict[str, Any] = {
        "length": p.length,
        "null_count": p.null_count,
        "values": _span_record(p.values),
        "validity": _span_record(p.validity),
        "data": _span_record(p.data),
        "child_validity": _span_record(p.child_validity),
    }
    if p.children:
        record["children"] = [_buffers(child) for child in p.children]
    return record


def _nesting(t: Any) -> int:
    """Struct and list levels of an Arrow type, counted without recursion (a forged schema may nest deep)."""
    import pyarrow as pa

    deepest, stack = 0, [(t, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            return depth
        storage = item.storage_type if isinstance(item, pa.BaseExtensionType) else item
        if pa.types.is_struct(storage):
            stack.extend((storage.field(i).type, depth + 1) for i in range(storage.num_fields))
        elif pa.types.is_list(storage) or pa.types.is_fixed_size_list(storage) or pa.types.is_large_list(storage):
            stack.append((storage.value_type, depth + 1))
    return deepest


@dataclass(frozen=True)
class TableLayout:
    """Where a table's buffers sit in its block, and what they hold: enough to rebuild the Table."""

    nbytes: int  # size of the block
    num_rows: int
    columns: list[dict[str, Any]]
    schema: bytes  # Arrow IPC schema message

    @classmethod
    def of(cls, table: Table) -> TableLayout:
        block = table._live()
        cols = []
        for c in table._columns:
            if _nesting(c._plan.type.arrow) > MAX_NESTING:
                raise UnsupportedTypeError(
                    f"column {c.name!r} has type {c.type}, nested more than {MAX_NESTING} levels deep, which a handle "
                    "does not carry"
                )
            record = _buffers(c._plan)
            record.update(offset=c.offset, rows=len(c), nulls=-1 if c._null_count is None else c._null_count)
            cols.append(record)
        return cls(block.nbytes, table._num_rows, cols, table.schema.serialize().to_pybytes())

    def meta(self) -> dict[str, Any]:
        return {"nbytes": self.nbytes, "num_rows": self.num_rows, "columns": self.columns}

    @classmethod
    def from_meta(cls, meta: Any, schema: bytes, where: str) -> TableLayout:
        """Rebuild from :meth:`meta` output received from elsewhere, checking every field."""
        if not isinstance(meta, dict) or not isinstance(meta.get("columns"), list):
            raise InvalidHandleError(f"{where}: the layout is not an object with a list of columns")
        if len(meta["columns"]) > MAX_COLUMNS:
            raise InvalidHandleError(f"{where}: {len(meta['columns'])} columns (at most {MAX_COLUMNS})")
        nbytes = _int(meta.get("nbytes"), f"{where}: block size", 1)
        num_rows = _int(meta.get("num_rows"), f"{where}: row count")
        layout = cls(nbytes, num_rows, meta["columns"], bytes(schema))
        layout.check(where)
        return layout

    # -- validation -------------------------------------------------------------------------------

    def arrow_schema(self, where: str) -> pa.Schema:
        import pyarrow as pa

        try:
            schema = pa.ipc.read_schema(pa.py_buffer(self.schema))
            # names and metadata must decode too (pyarrow decodes them lazily, raising UnicodeDecodeError)
            _ = [(field.name, field.metadata) for field in schema], schema.metadata
            return schema
        except Exception as exc:  # pyarrow raises several kinds for garbage
            raise InvalidHandleError(f"{where}: the schema does not decode ({str(exc)[:200]})") from None

    def plans(self, where: str) -> tuple[pa.Schema, list[tuple[ColumnPlan, int, int, int | None]]]:
        """The schema and, per column, (base plan, view offset, view length, view null count)."""
        cached = self.__dict__.get("_plans")
        if cached is not None:
            return cached
        schema = self.arrow_schema(where)
        if len(schema) != len(self.columns):
            raise InvalidHandleError(
                f"{where}: the schema has {len(schema)} field(s) but the layout {len(self.columns)} column(s)"
            )
        out = []
        for field, rec in zip(schema, self.columns):
            out.append(self._column(field, rec, f"{where}: column {field.name!r}"))
        self.__dict__["_plans"] = (schema, out)  # checked once; the dataclass is frozen otherwise
        return schema, out

    def check(self, where: str) -> None:
        self.plans(where)

    def _column(self, field: pa.Field, rec: Any, where: str) -> tuple[ColumnPlan, int, int, int | None]:
        if not isinstance(rec, dict):
            raise InvalidHandleError(f"{where}: the column record is not an object")
        if _nesting(field.type) > MAX_NESTING:
            raise InvalidHandleError(f"{where}: type {field.type} nests more than {MAX_NESTING} levels")
        try:
            ctype = column_type(field.type, field.name)
        except UnsupportedTypeError as exc:
            raise InvalidHandleError(f"{where}: {exc}") from None
        plan = self._plan(field.name, ctype, rec, where)
        offset = _int(rec.get("offset"), f"{where}: row offset")
        rows = _int(rec.get("rows"), f"{where}: row count")
        if offset + rows > plan.length:
            raise InvalidHandleError(f"{where}: rows [{offset}, {offset + rows}) lie past the column's {plan.length}")
        if rows != self.num_rows:
            raise InvalidHandleError(f"{where}: {rows} rows, but the table has {self.num_rows}")
        nulls = rec.get("nulls")
        if nulls != -1 or isinstance(nulls, float):
            nulls = _int(nulls, f"{where}: view null count")
            if nulls > rows:
                raise InvalidHandleError(f"{where}: view null count {nulls} exceeds its {rows} rows")
        # The view's null count is not taken on trust: without a bitmap it is 0, else it is counted
        # from the bitmap when first asked for (a wrong count would let NULLs pass as values).
        return plan, offset, rows, 0 if plan.validity is None else None

    def _plan(self, name: str, ctype: Any, rec: Any, where: str, length: int | None = None) -> ColumnPlan:
        """A base column's plan from its record, every buffer checked against its type and length; child
        columns' records too (a struct's children have its length: ``length``)."""
        if not isinstance(rec, dict):
            raise InvalidHandleError(f"{where}: the column record is not an object")
        length_ = _int(rec.get("length"), f"{where}: length")
        if length is not None and length_ != length:
            raise InvalidHandleError(f"{where}: {length_} rows, but its struct has {length}")
        length = length_
        null_count = _int(rec.get("null_count"), f"{where}: null count")
        if null_count > length:
            raise InvalidHandleError(f"{where}: null count {null_count} exceeds the length {length}")
        values = self._span(rec.get("values"), f"{where}: values buffer")
        validity = self._span(rec.get("validity"), f"{where}: validity bitmap", optional=True)
        data = self._span(rec.get("data"), f"{where}: data buffer", optional=True)
        child_validity = self._span(rec.get("child_validity"), f"{where}: child validity bitmap", optional=True)
        spec = ColumnSpec(name, ctype, length, null_count, 0 if data is None else data.size)
        expected = values_size(spec)
        if values is None or values.size != expected:
            got = None if values is None else values.size
            raise InvalidHandleError(
                f"{where}: values buffer of {got} bytes, but {length} value(s) of {ctype.name} take {expected}"
            )
        if (validity is None) != (null_count == 0):
            raise InvalidHandleError(f"{where}: a validity bitmap must be present exactly when there are NULLs")
        if validity is not None and validity.size != (length + 7) // 8:
            raise InvalidHandleError(f"{where}: validity bitmap of {validity.size} bytes for {length} rows")
        if (data is None) != (ctype.layout not in (Layout.VARBINARY, Layout.LIST)):
            raise InvalidHandleError(f"{where}: a data buffer must be present exactly for string/binary/list columns")
        if ctype.layout == Layout.LIST and data.size % ctype.storage.itemsize:
            raise InvalidHandleError(
                f"{where}: child values buffer of {data.size} bytes is not a whole number of {ctype.storage} values"
            )
        elements = child_length(spec)
        if child_validity is not None and (
            ctype.layout not in Layout.NESTED or child_validity.size != (elements + 7) // 8
        ):
            raise InvalidHandleError(
                f"{where}: child validity bitmap of {child_validity.size} bytes for {elements} list element(s) "
                f"of a {ctype.name} column"
            )
        records = rec.get("children", [])
        if not isinstance(records, list) or len(records) != len(ctype.children):
            raise InvalidHandleError(
                f"{where}: {len(ctype.children)} child column record(s) expected for {ctype.name}, got "
                f"{len(records) if isinstance(records, list) else type(records).__name__}"
            )
        struct = ctype.layout == Layout.STRUCT
        children = tuple(
            self._plan(child_name, child_type, child_rec,
                       f"{where}, " + (f"field {child_name!r}" if struct else "elements"), length if struct else None)
            for child_name, child_type, child_rec in zip(ctype.child_names, ctype.children, records)
        )  # fmt: skip
        # child_null_count only says a bitmap exists: nothing counts on its value
        return ColumnPlan(name, ctype, length, null_count, values, validity, data, child_validity,
                          0 if child_validity is None else 1, children)  # fmt: skip

    def _span(self, value: Any, where: str, optional: bool = False) -> Span | None:
        if value is None:
            if optional:
                return None
            raise InvalidHandleError(f"{where} is missing")
        if not isinstance(value, list) or len(value) != 2:
            raise InvalidHandleError(f"{where}: expected [offset, size], got {value!r}")
        offset = _int(value[0], f"{where} offset")
        size = _int(value[1], f"{where} size")
        if offset % ALIGNMENT:
            raise InvalidHandleError(f"{where} at offset {offset} is not {ALIGNMENT}-byte aligned")
        if offset + size > self.nbytes:
            raise InvalidHandleError(
                f"{where} [{offset}, {offset + size}) lies past the end of the {self.nbytes}-byte block"
            )
        return Span(offset, size)

    # -- rebuilding -------------------------------------------------------------------------------

    def table(self, block: Block, where: str) -> Table:
        """A Table view over ``block`` (which must hold at least ``nbytes`` bytes)."""
        if block.nbytes < self.nbytes:
            raise InvalidHandleError(f"{where}: the block holds {block.nbytes} bytes, the layout needs {self.nbytes}")
        schema, plans = self.plans(where)
        columns = [Column._view(block, plan, off, rows, nulls) for plan, off, rows, nulls in plans]
        return Table._from_columns(block, schema, columns, self.num_rows)


@dataclass(frozen=True)
class Handle:
    kind: int  # HOST_MEMFD or CUDA_IPC
    device_uuid: bytes  # 16 bytes
    alloc_size: int
    offset: int
    pid: int
    pid_start: int
    memory: bytes  # the CUDA IPC handle, or int32 fd + memfd name
    layout: TableLayout
    version: int = FORMAT_VERSION

    @property
    def kind_name(self) -> str:
        return KINDS.get(self.kind, f"kind {self.kind}")

    def describe(self) -> str:
        return f"pystrom handle ({self.kind_name}, {self.layout.nbytes:,} bytes, exported by pid {self.pid})"


def encode(h: Handle) -> bytes:
    body = json.dumps(h.layout.meta(), separators=(",", ":")).encode()
    head = _HEADER.pack(
        MAGIC,
        h.version,
        h.kind,
        0,
        len(body),
        len(h.layout.schema),
        len(h.memory),
        0,
        h.device_uuid,
        h.alloc_size,
        h.offset,
        h.layout.nbytes,
        h.pid,
        0,
        h.pid_start,
    )
    raw = head + h.memory + body + h.layout.schema
    return raw + _CRC.pack(zlib.crc32(raw))


def decode(data: Any) -> Handle:
    """Parse and check handle bytes; raise :class:`InvalidHandleError` naming the first problem."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    if not isinstance(data, (bytes, bytearray)):
        raise InvalidHandleError(f"a pystrom handle is bytes (from Table.export()); got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size + _CRC.size:
        raise InvalidHandleError(
            f"pystrom handle: {len(data)} bytes is too short (the header alone is {_HEADER.size + _CRC.size})"
        )
    (magic, version, kind, res1, body_len, schema_len, mem_len, res2, uuid, alloc_size, offset, nbytes, pid, res3,
     pid_start) = _HEADER.unpack_from(data)  # fmt: skip
    if magic != MAGIC:
        raise InvalidHandleError(f"not a pystrom handle: magic {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise InvalidHandleError(
            f"pystrom handle format version {version}; this pystrom reads version {FORMAT_VERSION} "
            "(export and import with the same pystrom version)"
        )
    total = _HEADER.size + mem_len + body_len + schema_len + _CRC.size
    if len(data) != total:
        raise InvalidHandleError(f"pystrom handle: {len(data)} bytes, but its header announces {total} (truncated?)")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc != zlib.crc32(data[: -_CRC.size]):
        raise InvalidHandleError("pystrom handle: checksum mismatch (the bytes were corrupted or altered)")
    if kind not in KINDS:
        raise InvalidHandleError(f"pystrom handle: unknown memory kind {kind}")
    if res1 or res2 or res3:
        raise InvalidHandleError("pystrom handle: reserved header fields are not zero")
    if body_len > _MAX_PART or schema_len > _MAX_PART:
        raise InvalidHandleError("pystrom handle: layout or schema implausibly large")
    pos = _HEADER.size
    memory = data[pos : pos + mem_len]
    pos += mem_len
    if kind == CUDA_IPC and mem_len != 64:
        raise InvalidHandleError(f"pystrom handle: a CUDA IPC memory handle is 64 bytes, this one {mem_len}")
    if kind == HOST_MEMFD and not 4 < mem_len <= 260:
        raise InvalidHandleError(f"pystrom handle: host memory handle of {mem_len} bytes")
    meta = parse_json(data[pos : pos + body_len], "pystrom handle: the layout")
    pos += body_len
    schema = data[pos : pos + schema_len]
    where = "pystrom handle"
    layout = TableLayout.from_meta(meta, schema, where)
    if layout.nbytes != nbytes:
        raise InvalidHandleError(f"{where}: header says {nbytes} bytes, layout says {layout.nbytes}")
    if offset > alloc_size or nbytes > alloc_size - offset:
        raise InvalidHandleError(
            f"{where}: block [{offset}, {offset + nbytes}) lies past the end of the {alloc_size}-byte allocation"
        )
    return Handle(kind, uuid, alloc_size, offset, pid, pid_start, memory, layout, version)


def parse_json(text: bytes, what: str) -> Any:
    """JSON from another process, with a bound on nesting (the layout nests 4 deep, daemon frames 5)."""
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidHandleError(f"{what} is not valid JSON ({str(exc)[:200]})") from None
    stack = [(value, 1)]  # iterative: the check itself must not recurse
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidHandleError(f"{what} nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value


def _int(value: Any, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= _MAX_INT:
        raise InvalidHandleError(f"{what} must be an integer >= {minimum}; got {value!r}")
    return value
