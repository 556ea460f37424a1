"""PostgreSQL result types -> pystrom column types, and the table assembled from staged COPY chunks.

The mapping reads each result column's type OID and typmod (from a ``LIMIT 0`` run of the
statement). Assembly allocates the table once through :func:`pystrom.interop.build.build_table_in_place`
with the row, NULL and string-byte counts the pump recorded, then decodes every chunk into its own
row range: C++ threads on the CPU, a CUDA kernel on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._layout import ColumnSpec, TablePlan
from .._types import ColumnType, Layout, column_type
from ..errors import (
    CapacityError,
    ColumnNotFoundError,
    OutOfMemoryError,
    PostgresError,
    SchemaMismatchError,
    UnsupportedTypeError,
)
from ..interop.build import build_table_in_place
from ._pq import DESC_SLOTS, FAILURES, Kind, Staged, decode_cpu

__all__ = ["PgColumn", "describe", "assemble", "check_partition_key", "drop_device_copies"]

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class PgColumn:
    name: str
    pg_type: str  # as PostgreSQL spells it, for messages
    kind: int
    type: ColumnType
    scale: int = 0


def _arrow_for(oid: int) -> tuple[int, Any] | None:
    import pyarrow as pa

    simple = {
        16: (Kind.BOOL, pa.bool_()),
        21: (Kind.INT2, pa.int16()),
        23: (Kind.INT4, pa.int32()),
        20: (Kind.INT8, pa.int64()),
        26: (Kind.OID, pa.uint32()),
        700: (Kind.FLOAT4, pa.float32()),
        701: (Kind.FLOAT8, pa.float64()),
        1082: (Kind.DATE, pa.date32()),
        1114: (Kind.TIMESTAMP, pa.timestamp("us")),
        1184: (Kind.TIMESTAMP, pa.timestamp("us", tz="UTC")),
        25: (Kind.VARLEN, pa.utf8()),  # text
        1043: (Kind.VARLEN, pa.utf8()),  # varchar
        1042: (Kind.VARLEN, pa.utf8()),  # bpchar
        19: (Kind.VARLEN, pa.utf8()),  # name
        17: (Kind.VARLEN, pa.binary()),  # bytea
        2950: (Kind.UUID, pa.uuid() if hasattr(pa, "uuid") else pa.binary(16)),
    }
    return simple.get(oid)


_CAST_HINTS = {
    114: "::text",  # json
    3802: "::text",  # jsonb
    1083: "::text",  # time
    1266: "::text",  # timetz
    1186: "extract(epoch from ...)::float8",  # interval
    18: "::text",  # "char"
    1560: "::text",  # bit
    1562: "::text",  # varbit
    869: "::text",  # inet
    650: "::text",  # cidr
    829: "::text",  # macaddr
    790: "::numeric",  # money
}


def describe(conn: Any, select: Any, numeric: str, run: Callable[..., Any]) -> list[PgColumn]:
    """Run ``select`` with ``LIMIT 0`` and map its columns, or raise naming the column at fault."""
    from psycopg import sql

    cur = run(conn, "describing the result", sql.SQL("SELECT * FROM ({}) AS _pystrom_q LIMIT 0").format(select))
    res = cur.pgresult
    encoding = conn.info.encoding if conn.info.encoding != "SQL_ASCII" else "utf-8"
    names = [res.fname(i).decode(encoding, "replace") for i in range(res.nfields)]
    oids = [res.ftype(i) for i in range(res.nfields)]
    typmods = [res.fmod(i) for i in range(res.nfields)]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SchemaMismatchError(f"the result has two columns named {name!r}: give them distinct aliases")
        seen.add(name)
    if not names:
        return []
    # Every column's type name in one round trip (one per column took 10-20 ms for 100 columns).
    pg_types = run(
        conn,
        "naming the types",
        "SELECT format_type(o, m) FROM unnest(%s::oid[], %s::int4[]) WITH ORDINALITY AS t(o, m, i) ORDER BY i",
        (oids, [m if m >= 0 else None for m in typmods]),
    ).fetchall()
    return [
        _map(name, oid, typmod, pg_type, numeric)
        for name, oid, typmod, (pg_type,) in zip(names, oids, typmods, pg_types)
    ]


def _map(name: str, oid: int, typmod: int, pg_type: str, numeric: str) -> PgColumn:
    import pyarrow as pa

    if oid == 1700:  # numeric
        if numeric == "float64":
            return PgColumn(name, pg_type, Kind.NUMERIC_F64, column_type(pa.float64(), name))
        if typmod < 4:
            raise UnsupportedTypeError(
                f"column {name!r} is numeric without a declared precision and scale, which decimal128 needs: "
                f"cast it in SQL, e.g. {name}::numeric(18, 6), or read it with numeric='float64'"
            )
        precision = ((typmod - 4) >> 16) & 0xFFFF
        scale = (((typmod - 4) & 0x7FF) ^ 1024) - 1024  # PostgreSQL 15 allows negative scales
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            raise UnsupportedTypeError(
                f"column {name!r} has type {pg_type}, which decimal128 cannot hold (precision <= 38, "
                f"0 <= scale <= precision): cast it in SQL, e.g. {name}::numeric(38, 6), or use numeric='float64'"
            )
        return PgColumn(name, pg_type, Kind.NUMERIC_DEC128, column_type(pa.decimal128(precision, scale), name), scale)
    mapped = _arrow_for(oid)
    if mapped is None:
        cast = _CAST_HINTS.get(oid, "::text")
        raise UnsupportedTypeError(
            f"column {name!r} has PostgreSQL type {pg_type} (oid {oid}), which read_postgres cannot decode: "
            f"add a cast in SQL, e.g. {name}{cast}"
            if not cast.startswith("extract")
            else f"column {name!r} has PostgreSQL type {pg_type} (oid {oid}), which read_postgres cannot decode: "
            f"convert it in SQL, e.g. extract(epoch from {name})::float8"
        )
    kind, arrow = mapped
    return PgColumn(name, pg_type, kind, column_type(arrow, name))


def check_partition_key(cols: Sequence[PgColumn], key: str) -> None:
    for col in cols:
        if col.name == key:
            if col.kind not in (Kind.INT2, Kind.INT4, Kind.INT8):
                raise UnsupportedTypeError(
                    f"partition_on column {key!r} has type {col.pg_type}; it must be int2, int4 or int8"
                )
            return
    raise ColumnNotFoundError(f"partition_on column {key!r} is not in the result; columns: {[c.name for c in cols]}")


@dataclass
class _Layout:
    """Where every chunk goes: its first row and, per string column, its first byte."""

    chunks: list[Staged]
    row_bases: list[int]
    data_bases: np.ndarray  # [chunk, column] int64
    nrows: int
    nulls: np.ndarray
    nbytes: np.ndarray


def _layout(parts: Sequence[list[Staged]], ncols: int) -> _Layout:
    chunks = [c for part in parts for c in part]
    rows = np.array([c.nrows for c in chunks], dtype=np.int64)
    row_bases = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    per_chunk = np.array([c.bytes for c in chunks], dtype=np.int64).reshape(len(chunks), ncols)
    data_bases = np.cumsum(per_chunk, axis=0) - per_chunk
    nulls = np.sum([c.nulls for c in chunks], axis=0, dtype=np.int64) if chunks else np.zeros(ncols, np.int64)
    return _Layout(
        chunks, [int(b) for b in row_bases[:-1]], data_bases, int(row_bases[-1]), nulls, per_chunk.sum(axis=0)
    )


def descriptors(cols: Sequence[PgColumn], plan: TablePlan, base_ptr: int, lay: _Layout, chunk: int) -> np.ndarray:
    """The decoder's per-column descriptors for one chunk (csrc/pg_decode.hpp)."""
    desc = np.zeros((len(cols), DESC_SLOTS), dtype=np.int64)
    for i, (col, cp) in enumerate(zip(cols, plan.columns)):
        desc[i, 0] = col.kind
        desc[i, 1] = base_ptr + cp.values.offset
        desc[i, 2] = base_ptr + cp.validity.offset if cp.validity is not None else 0
        desc[i, 3] = base_ptr + cp.data.offset if cp.data is not None else 0
        desc[i, 4] = lay.data_bases[chunk, i] if col.kind == Kind.VARLEN else 0
        desc[i, 5] = col.scale
    return desc


def decode_failure(cols: Sequence[PgColumn], lay: _Layout, chunk: int, code: int, row: int, column: int) -> Exception:
    col = cols[column]
    return PostgresError(
        f"column {col.name!r} ({col.pg_type}), row {lay.row_bases[chunk] + row}: {FAILURES.get(code, code)}"
    )


def assemble(backend: Any, cols: Sequence[PgColumn], parts: Sequence[list[Staged]]) -> Any:
    """One Table from all partitions' staged chunks, decoded in place."""
    lay = _layout(parts, len(cols))
    try:
        try:
            return _build(backend, cols, lay)
        except OutOfMemoryError:
            # The chunks' device copies (made while the read went on) took the room the table
            # needs: drop them (decode_chunks copies from the pinned host buffers instead), try again.
            if not drop_device_copies(lay.chunks):
                raise
            return _build(backend, cols, lay)
    finally:  # decode_chunks has dropped them on success; after a failure they go back now
        drop_device_copies(lay.chunks)


def drop_device_copies(chunks: Sequence[Staged]) -> bool:
    """Free the device copies Uploader made of these chunks (after their copies end); True if there were any."""
    dropped = False
    for c in chunks:
        if c.device is not None:
            c.device[2].synchronize()  # its copy has finished: nothing still writes the scratch
            c.device = None
            dropped = True
    return dropped


def _build(backend: Any, cols: Sequence[PgColumn], lay: _Layout) -> Any:
    import pyarrow as pa

    specs = []
    for i, col in enumerate(cols):
        size = int(lay.nbytes[i]) if col.type.layout == Layout.VARBINARY else 0
        if size > _INT32_MAX:
            raise CapacityError(
                f"column {col.name!r} ({col.pg_type}) holds {size:,} bytes of strings, more than the 2 GiB "
                f"that 32-bit offsets address: read it in parts (where=) or leave it out"
            )
        specs.append(ColumnSpec(col.name, col.type, lay.nrows, int(lay.nulls[i]), size))
    fields = [pa.field(c.name, c.type.arrow, nullable=True) for c in cols]

    def fill(block: Any, plan: TablePlan) -> None:
        for cp in plan.columns:  # NULLs clear their bit; a column of strings starts at byte 0
            if cp.validity is not None:
                block.array(cp.validity.offset, np.uint8, (cp.validity.size,)).fill(0xFF)
            if cp.type.layout == Layout.VARBINARY:
                block.array(cp.values.offset, np.int32, (1,)).fill(0)
        if backend.kind == "cuda":
            from ._pg_gpu import decode_chunks

            decode_chunks(backend, block, plan, cols, lay)
        else:
            _decode_host(block, plan, cols, lay)

    return build_table_in_place(backend, fields, specs, fill, lay.nrows)


def _decode_host(block: Any, plan: TablePlan, cols: Sequence[PgColumn], lay: _Layout) -> None:
    descs = [descriptors(cols, plan, block.ptr, lay, i) for i in range(len(lay.chunks))]
    jobs = list(zip(lay.chunks, lay.row_bases, descs))
    if len(jobs) <= 1:
        results = [decode_cpu(*job) for job in jobs]
    else:
        from .._transfer import _threads

        with ThreadPoolExecutor(max_workers=_threads()) as pool:  # the decoder runs without the GIL
            results = list(pool.map(lambda job: decode_cpu(*job), jobs))
    for i, (code, row, column) in enumerate(results):
        if code:
            raise decode_failure(cols, lay, i, code, row, column)
