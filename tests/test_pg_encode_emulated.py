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
