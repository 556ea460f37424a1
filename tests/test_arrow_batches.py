"""The one-pass record batch parser (:mod:`pystrom.io.arrow.read.batches`) against pyarrow's per-batch path:
the same layouts wherever it answers, and it answers None (pyarrow's path decides) for every file that
path refuses, mutated metadata included."""

from __future__ import annotations

import decimal
import struct

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pytest

import pystrom
from pystrom.io.arrow.file.metadata import ARROW_ERRORS, direct_types, open_arrow_file
from pystrom.io.arrow.read.batches import parse_batches
from pystrom.testing import to_host


def _mixed(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    nulls = rng.random(rows) < 0.2
    words = np.array(["", "a", "bc", "déf", "ghij"], dtype=object)
    return pa.table(
        {
            "i8": pa.array(rng.integers(-100, 100, rows), pa.int8()),
            "i64": pa.array(rng.integers(0, 1 << 40, rows), mask=nulls),
            "f64": pa.array(rng.random(rows)),
            "b": pa.array(rng.random(rows) < 0.5, mask=nulls),
            "s": pa.array(words[rng.integers(0, 5, rows)], pa.string(), mask=nulls),
            "bin": pa.array([bytes([k % 7]) * (k % 4) for k in range(rows)], pa.binary()),
            "dec": pa.array([decimal.Decimal(k) / 100 for k in range(rows)], pa.decimal128(12, 2)),
            "fsb": pa.array([k.to_bytes(3, "little") for k in range(rows)], pa.binary(3)),
            "ts": pa.array(np.arange(rows).astype("datetime64[us]")),
        }
    )


def _pyarrow_path(path, columns):
    with open_arrow_file(path) as f:
        types = direct_types(f.schema, columns)
        return [f.layout(i, columns, types) for i in range(f.num_batches)]


def _fast(path, columns):
    with open_arrow_file(path) as f:
        return parse_batches(f, columns)


def _write_batches(path, table: pa.Table, sizes) -> None:
    with ipc.new_file(str(path), table.schema) as w:
        start = 0
        for n in sizes:
            w.write_batch(table.slice(start, n).combine_chunks().to_batches()[0] if n else
                          pa.RecordBatch.from_pylist([], schema=table.schema))  # fmt: skip
            start += n


@pytest.mark.parametrize("rows,chunk", [(200_000, 1 << 16), (1000, 7), (0, 1 << 16), (5, 1 << 16)])
def test_pyarrow_written_files_parse_as_pyarrow_lays_them_out(tmp_path, rows, chunk):
    table = _mixed(rows)
    path = tmp_path / "t.arrow"
    feather.write_feather(table, path, compression="uncompressed", chunksize=chunk)
    for columns in (table.column_names, ["s", "f64"], ["b"], []):
        fast = _fast(path, columns)
        assert fast is not None
        assert fast == _pyarrow_path(path, columns)
    got = pystrom.read_arrow(path, device="cpu")
    assert to_host(got).equals(table.combine_chunks()) if rows else got.num_rows == 0
    ours = tmp_path / "ours.arrow"
    pystrom.write_arrow(table, ours)  # pystrom's own files take the fast path too
    fast = _fast(ours, table.column_names)
    assert fast is not None and fast == _pyarrow_path(ours, table.column_names)


def test_empty_batches_between_full_ones(tmp_path):
    table = _mixed(300)
    path = tmp_path / "e.arrow"
    _write_batches(path, table, [0, 100, 0, 0, 150, 50, 0])
    fast = _fast(path, table.column_names)
    assert fast is not None and [b.num_rows for b in fast] == [0, 100, 0, 0, 150, 50, 0]
    assert fast == _pyarrow_path(path, table.column_names)
    assert to_host(pystrom.read_arrow(path, device="cpu")).equals(table)


def test_files_it_does_not_handle_are_left_to_pyarrow(tmp_path):
    plain = _mixed(50)
    large = plain.cast(plain.schema.set(4, pa.field("s", pa.large_string())))
    dictionary = pa.table({"d": pa.array(["x", "y"] * 10).dictionary_encode(), "i": pa.array(range(20))})
    cases = {
        "dictionary.arrow": lambda p: feather.write_feather(dictionary, p, compression="uncompressed"),
        "large.arrow": lambda p: feather.write_feather(large, p, compression="uncompressed"),
    }
    for name, write in cases.items():
        write(tmp_path / name)
        assert _fast(tmp_path / name, ["i"] if name.startswith("d") else ["f64"]) is None, name
    for codec in (None, "lz4"):  # streams, compressed or not (compressed files: tests/test_arrow_compressed.py)
        options = ipc.IpcWriteOptions(compression=codec)
        with ipc.new_stream(str(tmp_path / f"s{codec}.arrows"), plain.schema, options=options) as w:
            w.write_table(plain)
        assert _fast(tmp_path / f"s{codec}.arrows", ["f64"]) is None


def _metadata_positions(raw: bytes) -> list[int]:
    """Byte positions of the record batch messages' prefixes and flatbuffers, and of the footer."""
    footer_len = struct.unpack_from("<i", raw, len(raw) - 10)[0]
    out = list(range(len(raw) - 10 - footer_len, len(raw)))
    with pa.BufferReader(raw) as src:
        reader = ipc.open_file(src)
        pos = 8
        for _ in range(reader.num_record_batches + 1):  # the schema message, then each batch
            pos = raw.index(b"\xff\xff\xff\xff", pos)
            length = struct.unpack_from("<i", raw, pos + 4)[0]
            out.extend(range(pos, pos + 8 + length))
            msg = ipc.read_message(pa.BufferReader(raw[pos:]))
            pos += 8 + length + msg.body.size
    return out


@pytest.mark.parametrize("seed", range(4))
def test_mutated_metadata_is_never_accepted_where_pyarrow_refuses_it(tmp_path, seed):
    table = _mixed(40, seed)
    path = tmp_path / "m.arrow"
    feather.write_feather(table, path, compression="uncompressed", chunksize=10)
    raw = path.read_bytes()
    positions = _metadata_positions(raw)
    rng = np.random.default_rng(seed)
    answered = refused = 0
    for k in range(150):
        bad = bytearray(raw)
        for at in rng.choice(positions, size=int(rng.integers(1, 4)), replace=False):
            bad[at] = int(rng.integers(0, 256)) if k % 2 else bad[at] ^ (1 << int(rng.integers(0, 8)))
        mutated = tmp_path / f"m{k}.arrow"
        mutated.write_bytes(bytes(bad))
        try:
            f = open_arrow_file(mutated)
        except (pystrom.FileFormatError, *ARROW_ERRORS):
            continue
        with f:
            columns = f.schema.names  # a mutated name is a name
            fast = parse_batches(f, columns)
            try:
                slow = [f.layout(i, columns, direct_types(f.schema, columns)) for i in range(f.num_batches)]
            except (pystrom.FileFormatError, *ARROW_ERRORS):
                slow = None
            except pystrom.UnsupportedTypeError:
                slow = None
        if fast is not None:
            answered += 1
            assert slow is not None, f"mutation {k}: the fast path accepted what pyarrow's path refuses"
            assert fast == slow, f"mutation {k}"
        else:
            refused += 1
    assert answered and refused  # both sides of the property were exercised
