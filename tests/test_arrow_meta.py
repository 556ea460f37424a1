"""The C++ record batch metadata parser (csrc/arrow_meta.cpp) against its Python twin
(:func:`pystrom.io.arrow.read.batches._parse_one`, pyarrow's flatbuffer verifier included): identical arrays on
every batch it accepts (custom metadata included), and on mutated messages
never an acceptance where the Python parser or pyarrow refuses (the mutants run in a subprocess: a
crash fails the test rather than the run). The checks and layouts of flat uncompressed files
(``arrow_flat_layouts``) against their definition here (:func:`_flat_twin`, Python's integers), on real
metadata and on metadata changed at random."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pystrom
from pystrom import _core
from pystrom.io.arrow.file.format import FooterError, read_footer
from pystrom.io.arrow.file.metadata import ARROW_ERRORS, open_arrow_file
from pystrom.io.arrow.read import batches
from pystrom.io.arrow.read.compressed_layouts import field_counts


def _table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    nulls = rng.random(rows) < 0.2
    words = np.array(["", "a", "bc", "déf", "ghij"], dtype=object)
    return pa.table(
        {
            "i64": pa.array(rng.integers(0, 1 << 40, rows), mask=nulls),
            "f64": pa.array(rng.random(rows)),
            "b": pa.array(rng.random(rows) < 0.5, mask=nulls),
            "s": pa.array(words[rng.integers(0, 5, rows)], pa.string(), mask=nulls),
            "l": pa.array([None if k % 5 == 0 else list(range(k % 4)) for k in range(rows)], pa.list_(pa.int32())),
            "fl": pa.array([[k, None] for k in range(rows)], pa.list_(pa.int16(), 2)),
        }
    )


def _write(path: Path, table: pa.Table, chunk: int, codec: str | None, metadata_every: int = 0) -> Path:
    options = ipc.IpcWriteOptions(compression=codec)
    with ipc.new_file(str(path), table.schema, options=options) as w:
        for k, batch in enumerate(table.to_batches(max_chunksize=chunk)):
            meta = {"k": str(k)} if metadata_every and k % metadata_every == 0 else None
            w.write_batch(batch, custom_metadata=meta)
    return path


def _files(tmp: Path) -> list[Path]:
    t = _table(90)
    out = [
        _write(tmp / "plain.arrow", t, 10, None),
        _write(tmp / "lz4.arrow", t, 10, "lz4"),
        _write(tmp / "zstd.arrow", t, 7, "zstd"),
        _write(tmp / "meta.arrow", t, 10, "lz4", metadata_every=3),
        _write(tmp / "one.arrow", t, 1000, "zstd"),
        _write(tmp / "none.arrow", t.slice(0, 0), 10, "lz4"),
    ]
    feather.write_feather(t.select(["i64", "f64", "s"]), tmp / "feather.arrow", chunksize=16)
    pystrom.write_arrow(t.select(["i64", "f64", "s"]).to_pandas(), tmp / "ours.arrow", batch_rows=20)
    pystrom.write_arrow(t.select(["i64", "f64"]).to_pandas(), tmp / "ours.lz4.arrow", batch_rows=20, compression="lz4")
    return [*out, tmp / "feather.arrow", tmp / "ours.arrow", tmp / "ours.lz4.arrow"]


def _native_pairs(src: np.ndarray, custom: np.ndarray, pairs: bytes) -> list[list[tuple[bytes, bytes]]]:
    """The C++ parser's custom metadata per batch, as (key, value) pairs read from ``src``."""
    at = np.frombuffer(pairs, np.int64).reshape(-1, 4).tolist()
    raw = bytes(src)
    return [
        [(raw[k : k + kn], raw[v : v + vn]) for k, kn, v, vn in at[first : first + n]] for first, n in custom.tolist()
    ]


def _both(path: Path):
    """(native arrays and status, Python arrays or the exception per batch, native custom metadata as pairs
    per batch) of every batch of ``path``."""
    with open_arrow_file(path) as f:
        raw = f._whole
        whole = memoryview(raw)
        footer_len = struct.unpack_from("<i", whole, f.size - 10)[0]
        footer_start = f.size - 10 - footer_len
        blocks, _ = read_footer(whole[footer_start : f.size - 10])
        counts = [field_counts(x.type) for x in f.schema]
        if None in counts:
            raise FooterError("a field whose FieldNodes and Buffers depend on more than its type")
        nf, nb = sum(c[0] for c in counts), sum(c[1] for c in counts)
        b = len(blocks)
        native = (np.empty(b, np.int64), np.empty((b, 2), np.int64), np.empty((b, nf, 2), np.int64),
                  np.empty((b, nb, 2), np.int64), np.empty(b, np.int64))  # fmt: skip
        status = np.full(b, -1, np.int32)
        custom = np.full((b, 2), -1, np.int64)
        block = np.array([(x.offset, x.metadata_length, x.body_length) for x in blocks], np.int64).reshape(b, 3)
        src = np.frombuffer(raw, np.uint8)
        pairs = _core.arrow_batch_meta(src, footer_start, block[:, 0].copy(), block[:, 1].copy(), block[:, 2].copy(),
                                       block[:, 0].copy(), nf, nb, *native, status, custom)  # fmt: skip
        meta = _native_pairs(src, custom, pairs)
        python = []
        for i, blk in enumerate(blocks):
            try:
                python.append(batches._parse_one(f, whole, blk, footer_start, i, True, nf, nb))
            except (batches._Decline, FooterError, struct.error, pystrom.FileFormatError, *ARROW_ERRORS) as e:
                python.append(e)
        return native, status, python, meta


def _py_pairs(meta) -> list[tuple[bytes, bytes]]:
    return list(meta.items()) if meta else []


def test_native_parser_matches_the_python_one(tmp_path):
    with_metadata = 0
    for path in _files(tmp_path):
        native, status, python, meta = _both(path)
        for i, py in enumerate(python):
            assert not isinstance(py, Exception), (path.name, i, py)
            assert status[i] == 0, (path.name, i, status[i])  # custom metadata included
            rows, body, nodes, buffers, codec, custom = py
            assert native[0][i] == rows and tuple(native[1][i]) == body and native[4][i] == codec, (path.name, i)
            assert np.array_equal(native[2][i], nodes) and np.array_equal(native[3][i], buffers), (path.name, i)
            assert meta[i] == _py_pairs(custom), (path.name, i)
            with_metadata += bool(custom)
    assert with_metadata >= 10  # meta.arrow's every third batch, the statistics of ours*.arrow


def test_parse_batches_is_the_same_with_every_batch_left_to_python(tmp_path, monkeypatch):
    paths = _files(tmp_path)

    def run():
        out = []
        for path in paths:
            with open_arrow_file(path) as f:
                out.append((batches.parse_batches(f, f.schema.names), getattr(f, "batch_metadata", None)))
        return out

    native = run()
    assert sum(layouts is not None for layouts, _ in native) >= 6
    assert any(meta and any(meta) for _, meta in native)  # custom metadata, read by the C++ parser

    class _Python:
        @staticmethod
        def arrow_batch_meta(*args):
            args[-2][:] = 99  # every status: not ok
            return b""

    monkeypatch.setattr(batches, "_core", _Python)
    assert run() == native


def test_codec_errors_are_the_python_parsers(tmp_path):
    path = _write(tmp_path / "c.arrow", _table(30), 10, "zstd")  # ZSTD: a codec field pyarrow writes (1)
    raw = bytearray(path.read_bytes())
    _, status, _, _ = _both(path)
    assert (status == 0).all()
    footer_len = struct.unpack_from("<i", raw, len(raw) - 10)[0]
    blk = read_footer(memoryview(raw)[len(raw) - 10 - footer_len : len(raw) - 10])[0][1]
    for bad, why in ((5, "unknown codec id 5"), (-1, "unknown codec id -1")):
        mutated = _set_codec(raw, blk, bad)
        (tmp_path / "bad.arrow").write_bytes(mutated)
        native, status, python, _ = _both(tmp_path / "bad.arrow")
        assert status[1] == 7 and (np.delete(status, 1) == 0).all()
        with open_arrow_file(tmp_path / "bad.arrow") as f, pytest.raises(pystrom.FileFormatError, match=why):
            batches.parse_batches(f, f.schema.names)


def _set_codec(raw: bytearray, blk, codec: int) -> bytes:
    """``raw`` with batch ``blk``'s BodyCompression.codec set to ``codec`` (found through the flatbuffer)."""
    from pystrom.io.arrow.file.format import _Reader

    base = blk.offset + 8
    r = _Reader(bytes(raw[base : blk.offset + blk.metadata_length]))
    message = r.table(r.deref(0))
    batch = r.table(r.deref(r.field(message, 2)))
    body = r.table(r.deref(r.field(batch, 3)))
    out = bytearray(raw)
    out[base + r.field(body, 0)] = codec & 0xFF
    return bytes(out)


# --- mutants, in a subprocess -------------------------------------------------------------------------


def _message_positions(path: Path) -> list[int]:
    raw = path.read_bytes()
    footer_len = struct.unpack_from("<i", raw, len(raw) - 10)[0]
    blocks, _ = read_footer(memoryview(raw)[len(raw) - 10 - footer_len : len(raw) - 10])
    messages = [p for b in blocks for p in range(b.offset, b.offset + b.metadata_length)]
    return messages + list(range(len(raw) - 10 - footer_len, len(raw) - 10))  # the footer: its Blocks too


def mutants(folder: str, seed: int, count: int) -> dict:
    """Worker: ``count`` mutants of each file in ``folder``; per batch the native parser may accept
    only what the Python parser accepts (same values) and pyarrow's ``read_message`` verifies."""
    rng = np.random.default_rng(seed)
    accepted = refused = 0
    for path in sorted(Path(folder).glob("*.arrow")):
        raw = path.read_bytes()
        positions = _message_positions(path)
        if not positions:
            continue
        for k in range(count):
            bad = bytearray(raw)
            for at in rng.choice(positions, size=int(rng.integers(1, 4)), replace=False):
                bad[at] = int(rng.integers(0, 256)) if k % 2 else bad[at] ^ (1 << int(rng.integers(0, 8)))
            mutated = Path(folder) / "mutant.bin"
            mutated.write_bytes(bytes(bad))
            try:
                native, status, python, native_meta = _both(mutated)
            except (pystrom.FileFormatError, FooterError, *ARROW_ERRORS):
                continue  # the file no longer opens
            for i, py in enumerate(python):
                if status[i] != 0:
                    refused += 1
                    continue
                accepted += 1
                assert not isinstance(py, Exception), f"{path.name} mutant {k} batch {i}: accepted, Python: {py!r}"
                rows, body, nodes, buffers, codec, meta = py
                assert native[0][i] == rows and tuple(native[1][i]) == body and native[4][i] == codec
                assert np.array_equal(native[2][i], nodes) and np.array_equal(native[3][i], buffers)
                assert native_meta[i] == _py_pairs(meta), f"{path.name} mutant {k} batch {i}: custom metadata"
    return {"accepted": accepted, "refused": refused}


@pytest.mark.parametrize("seed", range(2))
def test_mutated_messages_are_never_accepted_where_python_refuses(tmp_path, seed):
    _files(tmp_path)
    for name in ("none.arrow", "one.arrow"):
        (tmp_path / name).unlink()
    args = [sys.executable, __file__, str(tmp_path), str(seed), "60"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent)
    assert done.returncode == 0, f"worker exited {done.returncode}: {done.stderr[-3000:]}"
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["accepted"] > 100 and counts["refused"] > 100, counts


if __name__ == "__main__":
    print(json.dumps(mutants(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))


def test_the_messages_read_alone_parse_as_in_the_whole_file(tmp_path):
    """parse_batches hands the C++ parser the messages read by pread one after the other (``msg_at``), not
    the mapping: the same arrays and statuses; Blocks outside the file, or overlapping ones that would add
    up to more than the file, are not read that way."""
    for path in _files(tmp_path):
        native, status, _, want_meta = _both(path)
        with open_arrow_file(path) as f:
            whole = memoryview(f._whole)
            footer_start = f.size - 10 - struct.unpack_from("<i", whole, f.size - 10)[0]
            blocks, _ = read_footer(whole[footer_start : f.size - 10])
            block = np.array([(x.offset, x.metadata_length, x.body_length) for x in blocks], np.int64).reshape(-1, 3)
            offset, meta, body = (block[:, j].copy() for j in range(3))
            src, msg_at = batches._messages(f, offset, meta, footer_start)
            assert src.shape[0] <= max(1, int(meta.sum()))
            b, nf, nb = len(block), native[2].shape[1], native[3].shape[1]
            again = (np.empty(b, np.int64), np.empty((b, 2), np.int64), np.empty((b, nf, 2), np.int64),
                     np.empty((b, nb, 2), np.int64), np.empty(b, np.int64))  # fmt: skip
            status2, custom2 = np.full(b, -1, np.int32), np.full((b, 2), -1, np.int64)
            pairs = _core.arrow_batch_meta(src, footer_start, offset, meta, body, msg_at, nf, nb, *again, status2,
                                           custom2)  # fmt: skip
            assert np.array_equal(status, status2), path.name
            assert _native_pairs(src, custom2, pairs) == want_meta, path.name
            ok = status == 0
            for x, y in zip(native, again):
                assert np.array_equal(x[ok], y[ok]), path.name
            outside = offset.copy()
            outside[:1] = footer_start  # a Block past the messages: left out, refused by the parser
            _, at = batches._messages(f, outside, meta, footer_start)
            assert b == 0 or at[0] == -1
            if b:
                src, at = batches._messages(f, np.full(b, 8, np.int64), np.full(b, f.size // 2, np.int64), footer_start)
                assert b < 3 or (src.shape[0] == f.size and (at == 8).all())  # overlapping: the mapping


# -- arrow_flat_layouts: the checks and layouts of flat uncompressed files --------------------------------


def _flat_twin(rows, bodies, nodes, buffers, file_size, codes, widths, first, selected):
    """What arrow_flat_layouts computes, with Python's integers (no overflow): None where it declines, else
    its ``out`` (per selected field and batch: rows, NULLs, validity, values and data as offset and size)."""
    count, nb = len(rows), buffers.shape[1]
    for i in range(count):
        n_rows, at, blen = int(rows[i]), int(bodies[i, 0]), int(bodies[i, 1])
        if n_rows < 0 or at < 0 or blen < 0 or at + blen > file_size:
            return None
        for k in range(nb):
            off, size = int(buffers[i, k, 0]), int(buffers[i, k, 1])
            if off < 0 or size < 0 or off % 8 or off + size > blen:
                return None
        for j, code in enumerate(codes.tolist()):
            n, nulls = int(nodes[i, j, 0]), int(nodes[i, j, 1])
            if n != n_rows or not 0 <= nulls <= n:
                return None
            size = [int(x) for x in buffers[i, first[j] :, 1]]  # validity, values, data
            bits = -(-n // 8)
            if nulls > 0 and size[0] < bits:
                return None
            if code == 1:
                need = bits
            elif code == 2:
                if n > 0 and size[2] == 0:
                    return None
                need = (n + 1) * 4 if n > 0 else 0
            else:
                need = n * int(widths[j])
            if size[1] < need:
                return None
    out = np.zeros((len(selected), 8, count), dtype=np.int64)
    for s, j in enumerate(selected.tolist()):
        for i in range(count):
            base = int(bodies[i, 0])
            (voff, vsize), (off, size) = buffers[i, first[j]].tolist(), buffers[i, first[j] + 1].tolist()
            nulls = int(nodes[i, j, 1])
            data = buffers[i, first[j] + 2].tolist() if codes[j] == 2 else None
            out[s, :, i] = [
                nodes[i, j, 0], nulls,
                (base + voff if vsize else 0) if nulls else -1, vsize if nulls else 0,
                base + off if size else 0, size,
                -1 if data is None else (base + data[0] if data[1] else 0), 0 if data is None else data[1],
            ]  # fmt: skip
    return out


@pytest.fixture(scope="module")
def flat_inputs(tmp_path_factory):
    """arrow_flat_layouts' arguments for a pyarrow-written file of every flat layout (NULLs, empty strings,
    an empty batch), as parse_batches makes them."""
    rng = np.random.default_rng(5)
    rows = 300
    nulls = rng.random(rows) < 0.3
    t = pa.table(
        {
            "i64": pa.array(rng.integers(-50, 50, rows), mask=nulls),
            "f32": pa.array(rng.random(rows).astype(np.float32)),
            "b": pa.array(rng.random(rows) < 0.5, mask=~nulls),
            "s": pa.array(np.array(["", "ab", "cde"], dtype=object)[rng.integers(0, 3, rows)], mask=nulls),
            "d": pa.array([None if k % 7 == 0 else k for k in range(rows)], pa.decimal128(12, 2)),
        }
    )
    path = tmp_path_factory.mktemp("flat") / "flat.arrow"
    with ipc.new_file(str(path), t.schema) as w:
        for lo, hi in ((0, 64), (64, 64), (64, 200), (200, 300)):
            w.write_batch(pa.record_batch([c.combine_chunks() for c in t.slice(lo, hi - lo).columns], schema=t.schema))
    captured = []
    real = batches._flat_layouts

    def capture(file_size, rows, bodies, nodes, buffers, layouts, per_field, types, names, columns):
        codes = np.array([batches._FLAT_CODES.get(layout, 0) for layout in layouts], dtype=np.int32)
        captured.append((rows.copy(), bodies.copy(), nodes.copy(), buffers.copy(), file_size, codes,
                         np.array([t.width for t in types], np.int64), np.cumsum([0, *per_field[:-1]], dtype=np.int64),
                         np.array([names.index(c) for c in columns], np.int64)))  # fmt: skip
        return real(file_size, rows, bodies, nodes, buffers, layouts, per_field, types, names, columns)

    batches._flat_layouts = capture
    try:
        with open_arrow_file(path) as f:
            assert batches.parse_batches(f, ["s", "i64", "d", "b"]) is not None
    finally:
        batches._flat_layouts = real
    assert len(captured) == 1 and len(captured[0][0]) == 4
    return captured[0]


def _flat_native(args) -> np.ndarray | None:
    rows, bodies, nodes, buffers, file_size, codes, widths, first, selected = args
    out = np.full((len(selected), 8, len(rows)), 12345, dtype=np.int64)
    code = _core.arrow_flat_layouts(rows, bodies, nodes, buffers, file_size, codes, widths, first, selected, out)
    return None if code else out


def test_flat_layouts_of_a_real_file_equal_the_twin(flat_inputs):
    want = _flat_twin(*flat_inputs)
    assert want is not None
    assert np.array_equal(_flat_native(flat_inputs), want)


_EDGES = [-(2**63), -9, -1, 0, 1, 4, 7, 8, 9, 16, 63, 64, 300, 2**31, 2**62, 2**63 - 8, 2**63 - 1]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_flat_layouts_of_changed_metadata_equal_the_twin(flat_inputs, data):
    """Entries of every input array set to edge values (overflowing sums and products included): the C++
    declines exactly where the definition does, and otherwise lays out the same."""
    args = [a.copy() if isinstance(a, np.ndarray) else a for a in flat_inputs]
    for _ in range(data.draw(st.integers(1, 3))):
        k = data.draw(st.sampled_from([0, 1, 2, 3, 4]))  # rows, bodies, nodes, buffers, the file's size
        value = data.draw(st.sampled_from(_EDGES) | st.integers(-(2**63), 2**63 - 1))
        if k == 4:
            args[4] = value
        else:
            flat = args[k].reshape(-1)
            flat[data.draw(st.integers(0, flat.size - 1))] = value
    want, got = _flat_twin(*args), _flat_native(args)
    assert (want is None) == (got is None)
    if want is not None:
        assert np.array_equal(got, want)


def test_flat_layouts_refuse_arguments_out_of_range(flat_inputs):
    rows, bodies, nodes, buffers, file_size, codes, widths, first, selected = flat_inputs
    for changed in ({"selected": selected + 99}, {"first": first + buffers.shape[1]}, {"codes": codes + 7}):
        args = dict(zip(["rows", "bodies", "nodes", "buffers", "file_size", "codes", "widths", "first", "selected"],
                        flat_inputs)) | changed  # fmt: skip
        assert _flat_native(list(args.values())) is None
    with pytest.raises(ValueError, match="lengths"):
        _core.arrow_flat_layouts(rows, bodies, nodes, buffers, file_size, codes, widths[:-1], first, selected,
                                 np.empty((len(selected), 8, len(rows)), np.int64))  # fmt: skip
