"""The GPU encoder of binary COPY rows (kernels/pg_encode.cu) run on the CPU under tests/simt.py's
emulation, against the C++ encoder (its CPU twin), inside real ``write_postgres`` calls.

The write path's CPU encoder is replaced by one that, as encode_device.DeviceEncoder does, sizes every
row with ``pg_encode_sizes`` (the first failing value folded in by atomicMin) and encodes each chunk with
``pg_encode_rows``; it compares each result with the C++ encoder's (row sizes, the failure named, every
chunk's bytes) and then sends the kernel's bytes, so the server receives what a GPU would have sent.
CI has no GPU: this is where a change to the kernels is first checked.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
import simt
from test_postgres_write import _arrow_table

import pystrom
from pystrom import DataError
from pystrom.io.postgres import encode, write
from pystrom.io.postgres.encode_device import failure_key

from conftest import needs_gpu  # noqa: E402

psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

pytestmark = [pytest.mark.postgres, pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler")]

_NO_FAILURE = (1 << 64) - 1


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return simt.Emulated("pg_encode", tmp_path_factory.mktemp("pg_encode"))


@pytest.fixture
def emulated(monkeypatch, kernels):
    """write_postgres on the CPU encodes with the emulated GPU kernels; the chunks compared."""
    return _emulate(monkeypatch, kernels)


def _emulate(monkeypatch, kernels):
    compared = []

    class EmulatedEncoder(encode.HostEncoder):
        def starts(self):
            n, ncols = self.nrows, np.int32(len(self._cols))
            sizes = np.zeros(n + 1, dtype=np.int64)
            first = np.full(1, _NO_FAILURE, dtype=np.uint64)
            kernels.launch("pg_encode_sizes", n, (self._desc, ncols, np.int64(0), np.int64(n), sizes[1:], first),
                           max_blocks=2)  # fmt: skip
            key = int(first[0])
            try:
                want = super().starts().copy()
            except DataError as exc:
                assert key != _NO_FAILURE, f"the C++ encoder refused a value the kernel took: {exc}"
                got = encode.encode_failure(self._cols, *failure_key(key))
                assert str(got) == str(exc)
                raise
            assert key == _NO_FAILURE, "the kernel refused a value the C++ encoder took"
            np.testing.assert_array_equal(np.cumsum(sizes), want)
            return self._starts

        def encode(self, chunk, out):
            super().encode(chunk, out)
            rows = chunk.end - chunk.begin
            starts = self._starts[chunk.begin : chunk.end] - self._starts[chunk.begin]
            scratch = np.full(max(chunk.nbytes, 1), 0xEE, dtype=np.uint8)
            args = (self._desc, np.int32(len(self._cols)), np.int64(chunk.begin), np.int64(rows), starts, scratch)
            kernels.launch("pg_encode_rows", rows, args, max_blocks=2)
            assert scratch[: chunk.nbytes].tobytes() == out[: chunk.nbytes].tobytes(), (chunk.begin, chunk.end)
            out[: chunk.nbytes] = scratch[: chunk.nbytes]  # the server gets the kernel's bytes
            compared.append(chunk)

    monkeypatch.setattr(write, "HostEncoder", EmulatedEncoder)
    return compared


def test_every_type_in_several_chunks(pg, emulated):
    data = _arrow_table()
    data = pa.concat_tables([data] * 300).set_column(0, "id", pa.array(np.arange(1200, dtype=np.int32)))
    t = pystrom.Table.from_arrow(data, device="cpu")
    out = pg.name("enc")
    with pystrom.defaults.set(pg_write_chunk=1 << 14):
        pystrom.write_postgres(t, pg.conninfo, out)
    assert len(emulated) >= 3  # chunks are at least 256 KiB: 1200 rows of ~450 bytes
    back = pystrom.read_postgres(pg.conninfo, sql.SQL("SELECT id, s, bin, dec0 FROM {} ORDER BY id").format(
        sql.Identifier(out)).as_string(pg.conn), device="cpu").to_arrow()  # fmt: skip
    assert back.column("s").combine_chunks().equals(data.column("s").combine_chunks())
    assert back.column("bin").combine_chunks().equals(data.column("bin").combine_chunks())


@pytest.mark.parametrize(
    "column,match",
    [
        (pa.array([0, 5, 2_146_000_000], pa.date32()), r"column 'x' \(date\), row 2: a date or timestamp outside"),
        (pa.array([0, 86_400_000_001], pa.time64("us")), r"column 'x' \(time\), row 1: a time of day"),
        (pa.array([dt.datetime(2000, 1, 1), None, dt.datetime(1, 1, 1)], pa.timestamp("us")), None),
        (pa.array([0, 1, -(2**62)], pa.timestamp("s")), r"column 'x'.*row 2"),
    ],
)
def test_the_kernel_refuses_what_the_cpp_encoder_refuses(pg, emulated, column, match):
    t = pystrom.Table.from_arrow(pa.table({"id": pa.array(np.arange(len(column))), "x": column}), device="cpu")
    out = pg.name("bad")
    if match is None:  # accepted by both: written, and read back equal
        pystrom.write_postgres(t, pg.conninfo, out)
        assert pg.fetch(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(out))) == [(len(column),)]
        return
    with pytest.raises(DataError, match=match):
        pystrom.write_postgres(t, pg.conninfo, out)


def _nested_table() -> pystrom.Table:
    """Lists of every element type (NULL rows, NULL elements, empty lists), fixed_size_lists, intervals."""
    rng = np.random.default_rng(5)
    n = 700
    cols = {"id": pa.array(np.arange(n, dtype=np.int32))}
    for t in ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
              "float32", "float64"]:  # fmt: skip
        dtype = np.dtype(t)
        vals = [None if i % 9 == 0 else [None if (i + j) % 5 == 0 else
                (bool(j % 2) if t == "bool" else np.array(rng.integers(0, 100) + j).astype(dtype).item())
                for j in range(i % 6)] for i in range(n)]  # fmt: skip
        cols["l_" + t] = pa.array(vals, pa.list_(pa.from_numpy_dtype(dtype)))
    cols["fx"] = pa.array([None if i % 7 == 3 else [float(i), None if i % 2 else -0.5, np.inf] for i in range(n)],
                          pa.list_(pa.float64(), 3))  # fmt: skip
    cols["big"] = pa.array([[2**64 - 1 - i, i] for i in range(n)], pa.list_(pa.uint64()))
    cols["iv"] = pa.array([None if i % 8 == 0 else (i - 300, -i, (i - 350) * 1_000_003) for i in range(n)],
                          pa.month_day_nano_interval())  # fmt: skip
    return pystrom.Table.from_arrow(pa.table(cols), device="cpu")


def test_lists_and_intervals_in_several_chunks(pg, emulated):
    t = _nested_table()
    out = pg.name("nested")
    with pystrom.defaults.set(pg_write_chunk=1 << 14):
        pystrom.write_postgres(t, pg.conninfo, out)
    assert len(emulated) >= 2
    q = f'SELECT l_int32, l_float64, l_bool, fx FROM "{out}" ORDER BY id'
    back = pystrom.read_postgres(pg.conninfo, q, device="cpu").to_arrow()
    for name in ["l_int32", "l_float64", "l_bool", "fx"]:
        assert back.column(name).to_pylist() == t.column(name).to_arrow().to_pylist(), name


def _encode_both(kernels, table: pystrom.Table, cols) -> tuple[Exception | None, bytes, bytes]:
    """The C++ encoder's failure (or None) and bytes of every row, and the emulated kernels' bytes."""
    host = encode.HostEncoder(table, cols)
    n, ncols = table.num_rows, np.int32(len(cols))
    sizes = np.zeros(n + 1, dtype=np.int64)
    first = np.full(1, _NO_FAILURE, dtype=np.uint64)
    kernels.launch("pg_encode_sizes", n, (host._desc, ncols, np.int64(0), np.int64(n), sizes[1:], first), max_blocks=2)
    try:
        starts = host.starts()
    except DataError as exc:
        key = int(first[0])
        assert key != _NO_FAILURE, f"the C++ encoder refused a value the kernel took: {exc}"
        return encode.encode_failure(cols, *failure_key(key)), str(exc).encode(), b""
    assert int(first[0]) == _NO_FAILURE, "the kernel refused a value the C++ encoder took"
    # before the rows are written at the kernel's starts: a size the C++ encoder disagrees with would
    # have the kernel write past the buffer
    assert np.array_equal(np.cumsum(sizes), starts), "the kernel's row sizes differ from the C++ encoder's"
    want = np.empty(int(starts[n]), dtype=np.uint8)
    host.encode(encode.Chunk(0, n, int(starts[n])), want)
    got = np.full(max(int(starts[n]), 1), 0xEE, dtype=np.uint8)
    kernels.launch("pg_encode_rows", n, (host._desc, ncols, np.int64(0), np.int64(n),
                                         np.cumsum(sizes)[:n].copy(), got), max_blocks=2)  # fmt: skip
    return None, want.tobytes(), got[: int(starts[n])].tobytes()


def _vectors(half: bool, n: int = 300, d: int = 37) -> pystrom.Table:
    m = np.random.default_rng(1).standard_normal((n, d)).astype(np.float16 if half else np.float32)
    return pystrom.Table.from_arrays({"id": np.arange(n), "e": m}, device="cpu")


@pytest.mark.parametrize("half", [False, True])
def test_vectors_equal_the_cpp_encoder(kernels, half):
    t = _vectors(half)
    for table in (t, t.slice(7, 200)):  # a slice: element index of row 0 past the buffer's start
        cols = write.target_columns(table, None, True)
        assert cols[1].pg_type == ("halfvec(37)" if half else "vector(37)")
        failure, want, got = _encode_both(kernels, table, cols)
        assert failure is None and want == got and len(want) > 0


@pytest.mark.parametrize("bad", ["nan", "inf", "null"])
def test_vector_refusals_agree(kernels, bad):
    e = pa.array([[1.0, 2.0]] * 5 + [[3.0, None if bad == "null" else float(bad)]] + [[0.0, 0.0]] * 3,
                 pa.list_(pa.float32(), 2))  # fmt: skip
    t = pystrom.Table.from_arrow(pa.table({"e": e}), device="cpu")
    failure, text, _ = _encode_both(kernels, t, write.target_columns(t, None, True))
    assert failure is not None and str(failure).encode() == text and "row 5" in text.decode()


# (kernels/pg_encode.cu text, a planted bug) in the new kinds: each must make the kernels' bytes or
# failures differ from the C++ encoder's on the tables below
ENCODE_MUTANTS = [
    ("put32(out + 4, nulls != 0 ? 1u : 0u);", "put32(out + 4, 0u);"),  # the array's NULL flag
    ("first = d[8] + row * dim;\n    count = dim;", "first = row * dim;\n    count = dim;"),  # slices
    ("put32(out + 8, days);", "put32(out + 8, 0u);"),  # month_day_nano days
    ("const long long us = ns / 1000 - ((ns % 1000 != 0 && ns < 0) ? 1 : 0);", "const long long us = ns / 1000;"),
    ("put16(out + 4 + 2 * j, ((const unsigned short*)d[4])[first + j]);", "put16(out + 4 + 2 * j, 0u);"),  # halfvec
    ("*failure = E_VECTOR_VALUE;", "*failure = E_OK;"),
]


@pytest.mark.parametrize("mutant", ENCODE_MUTANTS, ids=["nullflag", "slice", "days", "floor", "halfvec", "nan"])
def test_a_planted_bug_in_the_new_kinds_is_caught(tmp_path, mutant):
    mutated = simt.Emulated("pg_encode", tmp_path, mutant)
    nested = _nested_table().slice(3)
    bad = _vectors(False)
    bad.column("e").values[4, 2] = np.nan
    caught = []
    for table, vector in [(nested, False), (_vectors(True).slice(5), True), (bad, True)]:
        try:
            failure, want, got = _encode_both(mutated, table, write.target_columns(table, None, vector))
        except AssertionError as exc:  # the kernel took what C++ refused, or the reverse
            caught.append(str(exc))
            continue
        if want != got:
            caught.append("bytes differ")
    assert caught, "the planted bug went unnoticed"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("which", ["nested", "vector", "halfvec"])
def test_the_gpu_encoder_equals_the_cpp_one_on_the_new_kinds(which):
    """The real kernels on a GPU: every row's bytes of lists, fixed_size_lists, intervals and vectors (a
    slice too) equal the C++ encoder's."""
    from pystrom.io.postgres.encode_device import DeviceEncoder

    host = {"nested": _nested_table, "vector": lambda: _vectors(False), "halfvec": lambda: _vectors(True)}[which]()
    for table in (host, host.slice(3)):
        cols = write.target_columns(table, None, which != "nested")
        gpu_table = pystrom.Table.from_arrow(table.to_arrow(), device="cuda").slice(0)
        cpu, gpu = encode.HostEncoder(table, cols), DeviceEncoder(gpu_table, cols)
        starts = cpu.starts()
        np.testing.assert_array_equal(gpu.starts().get(), starts)
        n = table.num_rows
        want = np.empty(int(starts[n]), dtype=np.uint8)
        cpu.encode(encode.Chunk(0, n, int(starts[n])), want)
        for chunk in gpu.chunks(1 << 12):
            got = np.empty(chunk.nbytes, dtype=np.uint8)
            gpu.encode(chunk, got)
            assert got.tobytes() == want[starts[chunk.begin] : starts[chunk.end]].tobytes(), (chunk.begin, chunk.end)
        gpu.close()
