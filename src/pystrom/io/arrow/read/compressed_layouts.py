"""The layouts of record batches whose bodies are compressed (Arrow's BodyCompression, method BUFFER).

:mod:`.read.batches` walks the messages and hands over, for every batch, its codec, rows, FieldNodes and
Buffers; here, for the columns read directly, each buffer of the body becomes:

- an empty Range (0 bytes in the message, or a prefix claiming 0 bytes);
- a file Range past its 8-byte prefix where the prefix is -1 (the writer stored it uncompressed:
  pyarrow does that for tiny or incompressible buffers), read like any uncompressed buffer;
- a :class:`.file.metadata.Packed` Range otherwise: the compressed frame's file range, the codec, and the
  decompressed length the prefix claims, at its own offset above :data:`.file.metadata.PACKED_BASE`;
  :mod:`.read.compressed_reads` reads and decompresses it when a column reader asks for those offsets.

Checked here, before anything is read or allocated (FileFormatError naming the file, the record batch,
the column and the buffer): every buffer inside its body, 8-byte aligned; row counts equal to the
batch's and NULL counts in [0, rows] (also an element array's); a non-empty compressed buffer long
enough for its prefix; the prefix >= -1; every buffer as long as its rows need (what
:meth:`.file.metadata.ArrowFile.layout` checks) and a claimed length no longer than they can use: its need plus
an eighth plus 4 KiB of padding (string bytes: 2 GiB, the most int32 offsets address), and no more
than an LZ4 frame can expand to (255x). What a frame really produces is checked when it is inflated.
Columns pystrom cannot read directly (dictionaries...) have no layout here: :mod:`.read.host` reads them
through pyarrow, which inflates them itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ...._types import ColumnType, Layout, per_type
from ....errors import FileFormatError
from ..codecs.decompress import CODECS
from ..codecs.plan import Catalog, up  # up: each buffer's place 64-byte aligned
from ..file.metadata import PACKED_BASE, ArrowFile
from .layouts import Buffers, Chunks, Layouts

__all__ = ["field_counts", "compressed_layouts"]

_INT32_MAX = 2**31 - 1
_LZ4_RATIO = 256  # an LZ4 sequence of k bytes yields at most 255 k (a match length's extension bytes)

# the buffers of each direct layout, in the message's order: (role, node: 0 the column's, 1 its elements)
_ROLES = {
    Layout.FIXED: [("validity", 0), ("values", 0)],
    Layout.BYTES: [("validity", 0), ("values", 0)],
    Layout.BOOL: [("validity", 0), ("values", 0)],
    Layout.VARBINARY: [("validity", 0), ("offsets", 0), ("data", 0)],
    Layout.LIST: [("validity", 0), ("offsets", 0), ("element validity", 1), ("elements", 1)],
    Layout.FIXED_LIST: [("validity", 0), ("element validity", 1), ("elements", 1)],
}


@per_type
def field_counts(t: pa.DataType) -> tuple[int, int] | None:
    """(FieldNodes, Buffers) a field of type ``t`` has in a record batch message, None where it
    depends on more than the type (view types, run-end encoding): the caller leaves those to pyarrow."""
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if pa.types.is_dictionary(t):
        return field_counts(t.index_type)
    if pa.types.is_null(t):
        return 1, 0
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return 1, 3
    if pa.types.is_map(t):
        children = [field_counts(t.key_type), field_counts(t.item_type)]
        return None if None in children else (2 + sum(c[0] for c in children), 3 + sum(c[1] for c in children))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        child = field_counts(t.value_type)
        own = 1 if pa.types.is_fixed_size_list(t) else 2
        return None if child is None else (1 + child[0], own + child[1])
    if pa.types.is_struct(t) or pa.types.is_union(t):
        children = [field_counts(t.field(i).type) for i in range(t.num_fields)]
        own = 1 if pa.types.is_struct(t) else (2 if t.mode == "dense" else 1)  # V5 unions have no bitmap
        return None if None in children else (1 + sum(c[0] for c in children), own + sum(c[1] for c in children))
    try:
        t.bit_width  # noqa: B018 - fixed-width (also booleans, decimals, intervals): a bitmap and values
    except ValueError:
        return None
    return 1, 2


def compressed_layouts(
    file: ArrowFile,
    columns: Sequence[str],
    types: dict[str, ColumnType | None],
    counts: Sequence[tuple[int, int]],
    rows: np.ndarray,
    bodies: np.ndarray,
    nodes: np.ndarray,
    buffers: np.ndarray,
    codecs: np.ndarray,
) -> Layouts:
    """Every batch's layout for ``columns`` (``types``: None where read on the host). ``counts``: each
    schema field's :func:`field_counts`; the arrays as :mod:`.read.batches` parsed them: rows (B,), bodies
    (B, 2: file offset, length), nodes (B, N, 2: length, NULLs), buffers (B, M, 2: body offset, length),
    codecs (B,: index into :data:`.codecs.decompress.CODECS`)."""
    names = file.schema.names
    node_first = np.cumsum([0, *[c[0] for c in counts]]).tolist()
    buf_first = np.cumsum([0, *[c[1] for c in counts]]).tolist()
    owner = np.repeat(np.arange(len(names)), [c[1] for c in counts])  # the field of each buffer
    _check_structure(file, rows, bodies, buffers, lambda k: names[int(owner[k])])
    direct = [(name, names.index(name)) for name in columns if types[name] is not None]
    prefixes = _prefixes(file, bodies, buffers, [k for _, j in direct for k in range(buf_first[j], buf_first[j + 1])])
    out: dict[str, Chunks] = {}
    packed: list[Catalog] = []
    for name, j in direct:
        out[name] = _column(file, name, types[name], nodes, node_first[j], buffers, buf_first[j], rows, bodies,
                            codecs, prefixes, packed)  # fmt: skip
    return Layouts(np.arange(len(rows), dtype=np.int64), rows.copy(), out, Catalog.join(packed))


def _prefixes(file: ArrowFile, bodies: np.ndarray, buffers: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """(B, M) int64: the 8-byte length prefix of buffers ``ks`` (the direct columns') in every batch, where
    the buffer can hold one (0 elsewhere), all read at once by pread (:meth:`.file.metadata.ArrowFile.read_pieces`:
    through the mapping a prefix a page, 64 KiB buffers: 16,384 page faults, 65 ms against 15)."""
    out = np.zeros(buffers.shape[:2], dtype=np.int64)
    if not len(ks):
        return out
    ks = np.asarray(ks, dtype=np.int64)
    chosen = buffers[:, ks]
    holds = chosen[..., 1] >= 8  # inside the body (_check_structure), the body inside the file
    at = (bodies[:, :1] + chosen[..., 0])[holds]
    got = np.zeros(holds.shape, dtype=np.int64)
    got[holds] = file.read_pieces(at, np.full(len(at), 8, dtype=np.int64))[: 8 * len(at)].view("<i8")
    out[:, ks] = got
    return out


def _bad(file: ArrowFile, batch: int, what: str, why: str) -> FileFormatError:
    return FileFormatError(f"{file.path!r}: record batch {batch}, {what}: {why} (corrupt file)")


def _check_structure(file, rows, bodies, buffers, field_of) -> None:
    """Rows >= 0; every buffer inside its body and 8-byte aligned (all fields: pyarrow relies on it too)."""
    if (rows < 0).any():
        i = int(np.flatnonzero(rows < 0)[0])
        raise _bad(file, i, "the batch", f"it claims {int(rows[i])} rows")
    off, length = buffers[..., 0], buffers[..., 1]
    # a difference, not a sum: a length near 2**63 would wrap off + length around to a small number
    bad = (off < 0) | (length < 0) | (off % 8 != 0) | (length > bodies[:, 1:2] - off)
    if bad.any():
        i, k = (int(x) for x in np.argwhere(bad)[0])
        raise _bad(file, i, f"column {field_of(k)!r}, buffer {k}",
                   f"[{int(off[i, k])}, +{int(length[i, k])}) is not an aligned range inside the "
                   f"{int(bodies[i, 1])}-byte body")  # fmt: skip


def _column(file, name, ctype, nodes, nn, buffers, nb, rows, bodies, codecs, prefixes, packed) -> Chunks:
    """The chunks of one direct column in every batch; its compressed buffers appended to ``packed``."""
    layout = ctype.layout
    n, nulls = nodes[:, nn, 0], nodes[:, nn, 1]
    nested = layout in Layout.NESTED
    child_n = nodes[:, nn + 1, 0] if nested else np.zeros_like(n)
    child_nulls = nodes[:, nn + 1, 1] if nested else np.zeros_like(n)
    bad = (n != rows) | (nulls < 0) | (nulls > n) | (child_n < 0) | (child_nulls < 0) | (child_nulls > child_n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        why = f"{int(n[i])} rows and {int(nulls[i])} NULLs in a batch of {int(rows[i])} rows"
        if nested:
            why += f"; {int(child_n[i])} elements, {int(child_nulls[i])} of them NULL"
        raise _bad(file, i, f"column {name!r}", why)
    if layout == Layout.FIXED_LIST and (child_n < n * ctype.list_size).any():
        i = int(np.flatnonzero(child_n < n * ctype.list_size)[0])
        raise _bad(
            file, i, f"column {name!r}", f"{int(child_n[i])} elements for {int(n[i])} lists of {ctype.list_size}"
        )
    roles = _ROLES[layout]
    bits = (n + 7) // 8
    item = ctype.storage.itemsize if nested else 0
    needs = {
        "validity": np.where(nulls > 0, bits, 0),
        "offsets": np.where(n > 0, (n + 1) * 4, 0),
        "data": np.zeros_like(n),
        "element validity": np.where(child_nulls > 0, (child_n + 7) // 8, 0),
        "elements": child_n * item,
        "values": bits if layout == Layout.BOOL else n * ctype.width,
    }
    used = {  # a bitmap is read only where there are NULLs
        "validity": nulls > 0,
        "element validity": child_nulls > 0,
    }
    ranges: dict[str, Buffers] = {}
    for k, (role, _) in enumerate(roles):
        ranges[role] = _ranges(file, name, role, nb + k, buffers[:, nb + k], prefixes[:, nb + k], needs[role],
                               used.get(role), bodies, codecs, packed)  # fmt: skip
    values_role = {Layout.FIXED_LIST: "elements", Layout.VARBINARY: "offsets", Layout.LIST: "offsets"}.get(
        layout, "values"
    )
    data = ranges.get("data", ranges.get("elements") if layout == Layout.LIST else None)
    return Chunks(n.copy(), nulls.copy(), ranges["validity"], ranges[values_role], data, child_n.copy(),
                  child_nulls.copy(), ranges["element validity"] if nested else None)  # fmt: skip


def _ranges(file, name, role, k, bufs, prefixes, need, used, bodies, codecs, packed) -> Buffers:
    """One buffer (index ``k`` of the batch's buffers) of every batch: a file range, a place above
    PACKED_BASE (its frame appended to ``packed``) or none (an unused bitmap: no NULLs); checks its
    prefix and length (module docstring)."""
    length = bufs[:, 1]
    body = bodies[:, 0] + bufs[:, 0]
    live = np.ones(len(bufs), dtype=bool) if used is None else used
    stored = live & (length > 0)
    what = f"column {name!r}, buffer {k} ({role})"

    if (stored & (length < 8)).any():
        i = int(np.flatnonzero(stored & (length < 8))[0])
        raise _bad(file, i, what, f"{int(length[i])} bytes cannot hold the 8-byte length prefix of a compressed buffer")
    prefix = np.where(stored, prefixes, 0)
    if (prefix < -1).any():
        i = int(np.flatnonzero(prefix < -1)[0])
        raise _bad(file, i, what, f"its length prefix claims {int(prefix[i])} bytes")
    size = np.where(prefix == -1, length - 8, prefix)
    short = live & (size < need)
    if short.any():
        i = int(np.flatnonzero(short)[0])
        raise _bad(file, i, what, f"{int(size[i])} bytes, shorter than its {int(need[i])} rows need"
                   if role != "elements" else f"{int(size[i])} bytes, shorter than its elements need")  # fmt: skip
    packed_now = stored & (prefix > 0)
    limit = np.full(len(bufs), _INT32_MAX + 4096, dtype=np.int64) if role == "data" else need + need // 8 + 4096
    lz4 = np.asarray(codecs) == CODECS.index("lz4_frame")
    limit = np.where(lz4, np.minimum(limit, (length - 8) * _LZ4_RATIO + 64), limit)
    over = packed_now & (prefix > limit)
    if over.any():
        i = int(np.flatnonzero(over)[0])
        frame = f"a {int(length[i]) - 8:,}-byte {CODECS[int(codecs[i])]} frame"
        raise _bad(file, i, what, f"its length prefix claims {int(prefix[i]):,} bytes, more than it can hold "
                   f"(at most {int(limit[i]):,} from {frame})")  # fmt: skip
    # stored uncompressed (prefix -1): the bytes after the prefix; empty: Range(0, 0) as pyarrow's path
    raw = live & (length > 8) & (prefix == -1)
    offset = np.where(raw, body + 8, np.where(live, 0, -1))
    size = np.where(raw, length - 8, 0)
    at = np.flatnonzero(packed_now)
    if len(at):
        claim = prefix[at]
        place = up(claim)
        first = int(packed[-1].place[-1] + up(packed[-1].size[-1])) if packed else PACKED_BASE  # after the last
        offset[at] = first + np.cumsum(place) - place
        size[at] = claim
        packed.append(Catalog(offset[at], claim, body[at] + 8, length[at] - 8, np.asarray(codecs)[at].astype(np.int8),
                              at.astype(np.int64), np.zeros(len(at), np.int64), [what]))  # fmt: skip
    return Buffers(offset, size)
