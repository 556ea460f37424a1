"""Record batches' custom metadata (pystrom's min/max statistics) parsed by the C++ parser
(csrc/arrow_meta.cpp ``key_values``) rather than per batch in Python: the same metadata as the Python
parser hands out, and hostile KeyValue vectors, tables and strings (offsets out of the flatbuffer,
misaligned, a string without its NUL, a truncated message, too many pairs) never accepted natively; such
files still read as pyarrow reads them or fail with a pystrom error naming the file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from test_arrow_meta import _both, _py_pairs

import pystrom
from pystrom.io.arrow.file.format import _Reader, read_footer
from pystrom.io.arrow.file.metadata import open_arrow_file
from pystrom.io.arrow.read import batches
from pystrom.testing import to_host


def _file(tmp: Path, name: str = "m.arrow") -> Path:
    t = pa.table({"x": pa.array(np.arange(40, dtype=np.int64)), "y": pa.array(np.linspace(0, 1, 40))})
    path = tmp / name
    with ipc.new_file(str(path), t.schema) as w:
        for k, batch in enumerate(t.to_batches(max_chunksize=10)):
            w.write_batch(batch, custom_metadata={"k": str(k), "min_max_stats.x": f"{10 * k},{10 * k + 9}"})
    return path


def _blocks(raw: bytes):
    footer_len = struct.unpack_from("<i", raw, len(raw) - 10)[0]
    return read_footer(memoryview(raw)[len(raw) - 10 - footer_len : len(raw) - 10])[0]


def _positions(raw: bytes, batch: int) -> dict[str, int]:
    """File positions in batch ``batch``'s message: the custom_metadata offset field, the vector, its first
    element's offset, that KeyValue table, its key field and the key string's length."""
    blk = _blocks(raw)[batch]
    base = blk.offset + 8
    r = _Reader(raw[base : blk.offset + blk.metadata_length])
    message = r.table(r.deref(0))
    field = r.field(message, 4)
    first, count = r.vector(field, 4)
    assert count == 2
    kv_at = r.deref(first)
    kv = r.table(kv_at)
    key_field = r.field(kv, 0)
    key_len_at = r.deref(key_field)
    key_len = struct.unpack_from("<I", raw, base + key_len_at)[0]
    return {
        "field": base + field, "vector": base + first - 4, "element": base + first, "table": base + kv_at,
        "key_field": base + key_field, "key_len": base + key_len_at, "key_end": base + key_len_at + 4 + key_len,
        "end": blk.offset + blk.metadata_length,
    }  # fmt: skip


def test_statistics_are_parsed_natively(tmp_path, monkeypatch):
    """No batch of a file with custom metadata on every batch goes through the Python parser (it did, one
    batch at a time), and the metadata handed out is the Python parser's."""
    path = _file(tmp_path)
    pystrom.write_arrow(pa.table({"a": np.arange(100)}), tmp_path / "ours.arrow", batch_rows=10)
    for p in (path, tmp_path / "ours.arrow"):
        _, status, python, meta = _both(p)
        assert (status == 0).all()
        assert meta == [_py_pairs(py[5]) for py in python] and all(meta)

    def refuse(*args):
        raise AssertionError("a batch left to the Python parser")

    monkeypatch.setattr(batches, "_parse_one", refuse)
    with open_arrow_file(path) as f:
        assert batches.parse_batches(f, f.schema.names) is not None
        assert [dict(m) for m in f.batch_metadata] == [
            {b"k": str(k).encode(), b"min_max_stats.x": f"{10 * k},{10 * k + 9}".encode()} for k in range(4)
        ]
    with open_arrow_file(tmp_path / "ours.arrow") as f:
        assert batches.parse_batches(f, f.schema.names) is not None
        assert all(b"min_max_stats.a" in m for m in f.batch_metadata)


def _mutations(raw: bytes):
    """(name, mutated file) per hostile change to batch 1's custom metadata."""
    at = _positions(raw, 1)

    def put(fmt: str, pos: int, value: int) -> bytes:
        out = bytearray(raw)
        struct.pack_into(fmt, out, pos, value)
        return bytes(out)

    yield "vector offset past the message", put("<I", at["field"], 1 << 20)
    yield "vector offset misaligned", put("<I", at["field"], struct.unpack_from("<I", raw, at["field"])[0] + 1)
    yield "vector count past the message", put("<I", at["vector"], 1 << 24)
    yield "too many pairs", put("<I", at["vector"], (1 << 16) + 1)
    yield "element offset past the message", put("<I", at["element"], 1 << 20)
    yield "element offset zero", put("<I", at["element"], 0)
    yield "element offset misaligned", put("<I", at["element"], struct.unpack_from("<I", raw, at["element"])[0] + 2)
    yield "vtable offset out of range", put("<i", at["table"], -(1 << 20))
    yield "key offset past the message", put("<I", at["key_field"], 1 << 20)
    yield "key length past the message", put("<I", at["key_len"], 1 << 20)
    yield "key without its NUL", put("<B", at["key_end"], ord("x"))
    # the message cut short before its custom metadata ends: the flatbuffer length and the Block shrink
    short = bytearray(raw)
    blk = _blocks(raw)[1]
    cut = at["key_len"] - blk.offset - 8 + 2  # inside the key's length field
    struct.pack_into("<i", short, blk.offset + 4, cut)
    yield "flatbuffer truncated", bytes(short)


def _footer_with_metadata_length(raw: bytes, batch: int, length: int) -> bytes:
    """``raw`` with Block ``batch``'s metadata length set to ``length`` (found by its value in the footer)."""
    blk = _blocks(raw)[batch]
    footer_len = struct.unpack_from("<i", raw, len(raw) - 10)[0]
    footer_start = len(raw) - 10 - footer_len
    packed = struct.pack("<qi", blk.offset, blk.metadata_length)
    at = raw.find(packed, footer_start)
    assert at > 0
    out = bytearray(raw)
    struct.pack_into("<i", out, at + 8, length)
    return bytes(out)


_NAMES = [
    "vector offset past the message", "vector offset misaligned", "vector count past the message", "too many pairs",
    "element offset past the message", "element offset zero", "element offset misaligned",
    "vtable offset out of range", "key offset past the message", "key length past the message",
    "key without its NUL", "flatbuffer truncated",
]  # fmt: skip


@pytest.mark.parametrize("name", _NAMES)
def test_hostile_custom_metadata_is_never_accepted_natively(tmp_path, name):
    path = _file(tmp_path)
    raw = path.read_bytes()
    mutations = dict(_mutations(raw))
    assert sorted(mutations) == sorted(_NAMES)
    bad = mutations[name]
    if name == "flatbuffer truncated":
        blk = _blocks(raw)[1]
        bad = _footer_with_metadata_length(bad, 1, struct.unpack_from("<i", bad, blk.offset + 4)[0] + 8)
    mutated = tmp_path / "bad.arrow"
    mutated.write_bytes(bad)
    native, status, python, meta = _both(mutated)
    assert status[1] != 0, name
    assert meta[1] == []
    assert (np.delete(status, 1) == 0).all() and [m for i, m in enumerate(meta) if i != 1] == [
        _py_pairs(py[5]) for i, py in enumerate(python) if i != 1
    ]
    # read as pyarrow reads it, or refused with pystrom's error naming the file
    try:
        with pa.memory_map(str(mutated)) as src:
            want = ipc.open_file(src).read_all()
    except (pa.ArrowException, OSError):
        want = None
    if want is None:
        with pytest.raises(pystrom.FileFormatError, match="bad.arrow"):
            pystrom.read_arrow(mutated, device="cpu")
    else:
        assert to_host(pystrom.read_arrow(mutated, device="cpu")).equals(want)


def test_batch_metadata_is_built_when_asked(tmp_path):
    """``file.batch_metadata`` builds a batch's KeyValueMetadata on first access (read_arrow never asks) and
    behaves as the list it replaced; over a buffer it does not own (the file's mapping) it builds all at once."""
    path = _file(tmp_path)
    with open_arrow_file(path) as f:
        assert batches.parse_batches(f, f.schema.names) is not None
        meta = f.batch_metadata
        assert isinstance(meta, batches._BatchMetadata) and not meta._built
        assert meta[-1][b"k"] == b"3" and list(meta._built) == [3]
        assert len(meta) == 4 and meta[1:3] == [meta[1], meta[2]] and f.custom_metadata(0)[b"k"] == b"0"
        with pytest.raises(IndexError):
            meta[4]
        want = [dict(m) for m in meta]
        src = np.frombuffer(meta._src.tobytes(), np.uint8)  # not owned: as the file's mapping
        eager = batches._BatchMetadata(src, meta._custom, meta._pairs.tobytes())
        assert eager._src is None and [dict(m) for m in eager] == want and eager == meta
