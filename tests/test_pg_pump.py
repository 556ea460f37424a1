"""The COPY pump itself (csrc/pg_pump.cpp) against a real PostgreSQL: batched socket reads on TCP
(the receive buffer grown to hold a batch, SO_RCVLOWAT left as psycopg expects it, on success and on failure),
libpq's blocking reads on a Unix socket, slow streams, and buffers whose row offsets run out first."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pystrom
from pystrom import PostgresError

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgres

BATCH_BYTES = 256 << 10  # kBatchBytes in csrc/pg_pump.cpp


def _sockopt(conn, opt: int) -> int:
    with socket.socket(fileno=os.dup(conn.fileno())) as s:  # a duplicate: closing it leaves conn's socket open
        return s.getsockopt(socket.SOL_SOCKET, opt)


def _lowat(conn) -> int:
    return _sockopt(conn, socket.SO_RCVLOWAT)


def _unix_conninfo(cluster) -> str:
    return f"host={cluster.root} port={cluster.port} user=postgres dbname=postgres"


BIG = "SELECT i, i * 0.5 AS f FROM generate_series(1, 300000) i"  # several staging buffers


def test_tcp_reads_are_batched_and_the_socket_restored(pg):
    with psycopg.connect(pg.conninfo) as conn:
        assert _lowat(conn) == 1
        during: list[tuple[int, int]] = []

        def seen(rows: int) -> None:
            during.append((_lowat(conn), _sockopt(conn, socket.SO_RCVBUF)))

        t = pystrom.read_postgres(conn, BIG, device="cpu", progress=seen)
        # Called after each buffer, mid-COPY: the low-water mark stays 1 (raised, the kernel would ACK
        # every other packet), the receive buffer holds a batch (the pump sleeps while it fills).
        assert len(during) >= 2 and {lowat for lowat, _ in during} == {1}
        assert min(rcvbuf for _, rcvbuf in during) >= BATCH_BYTES
        assert _lowat(conn) == 1
        a = t.to_arrow()
        assert a.column("i").to_pylist() == list(range(1, 300001))
        assert a.column("f").to_pylist()[-1] == 150000.0
        assert conn.execute("SELECT 2").fetchone() == (2,)  # psycopg's own waits work again

        # A server error mid-COPY, and a stream the pump refuses: restored on both paths.
        with pytest.raises(PostgresError, match="division by zero"):
            pystrom.read_postgres(conn, "SELECT 1 / (i - 200000) AS q FROM generate_series(1, 300000) i")
        assert _lowat(conn) == 1
        conn.rollback()
        with pytest.raises(KeyboardInterrupt):
            pystrom.read_postgres(
                conn, BIG, device="cpu", progress=lambda rows: (_ for _ in ()).throw(KeyboardInterrupt)
            )
        assert _lowat(conn) == 1
        conn.rollback()  # the cancelled COPY failed the transaction
        assert conn.execute("SELECT 3").fetchone() == (3,)


def test_unix_socket_keeps_blocking_reads(pg, pg_cluster):
    with psycopg.connect(_unix_conninfo(pg_cluster)) as conn:
        during: list[int] = []
        t = pystrom.read_postgres(conn, BIG, device="cpu", progress=lambda rows: during.append(_lowat(conn)))
        assert during and set(during) == {1}
        assert t.to_arrow().column("i").to_pylist() == list(range(1, 300001))
    # partitions over the Unix socket equal one stream over TCP
    name = pg.name("unixparts")
    pg.execute(f"CREATE TABLE {name} AS SELECT i, md5(i::text) AS s FROM generate_series(1, 50000) i")
    by_unix = pystrom.read_postgres(_unix_conninfo(pg_cluster), table=name, partitions=3, device="cpu").to_arrow()
    by_tcp = pystrom.read_postgres(pg.conninfo, table=name, partitions=1, device="cpu").to_arrow()
    assert by_unix.sort_by("i").equals(by_tcp.sort_by("i"))


def test_slow_stream_below_the_batch_size(pg):
    # A few rows, each after a pause: the server flushes less than the batch size, so every wait ends
    # on the poll timeout; the read must neither hang nor lose the tail.
    query = "SELECT i FROM generate_series(1, 40) i WHERE pg_sleep(0.005)::text = ''"
    start = time.perf_counter()
    t = pystrom.read_postgres(pg.conninfo, query, device="cpu")
    assert t.to_arrow().column("i").to_pylist() == list(range(1, 41))
    assert time.perf_counter() - start < 10


@contextlib.contextmanager
def _pump(conn, ncols: int, sql: str):
    from pystrom import _core
    from pystrom.io.postgres.pump import _load_libpq

    _load_libpq()
    pump = _core.CopyPump(conn.pgconn.pgconn_ptr, ncols)
    pump.start(sql)
    try:
        yield pump
    finally:
        pump.abort()  # before the connection closes: the pump holds its PGconn pointer


def test_fill_stops_when_row_offsets_run_out(pg):
    # NULL int4 rows are the smallest a 1-column COPY has (2 + 4 bytes): with room for 7 offsets
    # and plenty of bytes, every fill must stop at 7 rows at most and the next one go on.
    sql = "COPY (SELECT NULL::int4 FROM generate_series(1, 100)) TO STDOUT (FORMAT BINARY)"
    with psycopg.connect(pg.conninfo, autocommit=True) as conn, _pump(conn, 1, sql) as pump:
        buf = np.zeros(1 << 16, np.uint8)
        offsets = np.full(7, -1, np.int64)
        total, fills, done = 0, 0, False
        while not done:
            nulls, nbytes = np.zeros(1, np.int64), np.zeros(1, np.int64)
            n, rows, done, need = pump.fill(buf, offsets, nulls, nbytes)
            fills += 1
            assert rows <= 7 and need == 0
            assert list(offsets[:rows]) == [6 * k for k in range(rows)]
            assert n == 6 * rows and nulls[0] == rows and nbytes[0] == 0
            total += rows
        assert total == 100 and fills >= 15
        assert not pump.active
        assert pump.command_status == "COPY 100"
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_fill_asks_for_a_larger_buffer(pg):
    # The caller sizes offsets for the smallest rows (bytes // (2 + 4 ncols) + 1), as pump.CopyStream does.
    sql = "COPY (SELECT repeat('x', 1000) FROM generate_series(1, 3)) TO STDOUT (FORMAT BINARY)"
    with psycopg.connect(pg.conninfo, autocommit=True) as conn, _pump(conn, 1, sql) as pump:
        nulls, nbytes = np.zeros(1, np.int64), np.zeros(1, np.int64)
        small = np.zeros(100, np.uint8)
        assert pump.fill(small, np.zeros(100 // 6 + 1, np.int64), nulls, nbytes) == (0, 0, False, 2 + 4 + 1000)
        big = np.zeros(4096, np.uint8)
        offsets = np.zeros(4096 // 6 + 1, np.int64)
        n, rows, done, need = pump.fill(big, offsets, nulls, nbytes)
        assert (n, rows, need) == (3 * 1006, 3, 0) and nbytes[0] == 3000 and nulls[0] == 0
        assert list(offsets[:3]) == [0, 1006, 2012]
        assert bytes(big[6:1006]) == b"x" * 1000
        while not done:
            n, rows, done, need = pump.fill(big, offsets, nulls, nbytes)
            assert rows == 0
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_first_buffer_from_the_size_hint(pg):
    """A range's expected size picks its first staging buffer from few size classes (CuPy's pinned pool
    reuses blocks of equal size only); no hint starts at 1 MiB; the chunk size caps both."""
    from pystrom.io.postgres.pump import CopyStream, _size_class

    assert [_size_class(n) >> 10 for n in (0, 1, 1 << 20, (1 << 20) + 1, 10_600_000, 44_040_192)] == [
        1024,
        1024,
        1024,
        1536,
        12288,
        49152,
    ]
    sql = "COPY (SELECT i FROM generate_series(1, 1000) i) TO STDOUT (FORMAT BINARY)"
    with psycopg.connect(pg.conninfo, autocommit=True) as conn:
        for hint, chunk, first in [
            (None, 64 << 20, 1 << 20),
            (10_600_000, 64 << 20, 12 << 20),
            (1 << 30, 8 << 20, 8 << 20),
        ]:
            sizes = []

            def allocate(n, sizes=sizes):
                sizes.append(n)
                return np.zeros(n, np.uint8)

            chunks = CopyStream(conn, 1, allocate, chunk).read(sql, size_hint=hint)
            assert sum(c.nrows for c in chunks) == 1000
            assert sizes[0] == first  # the bytes; sizes[1] is the row offsets for as many rows


def test_wrong_field_count_is_refused_and_the_connection_drained(pg):
    from pystrom import _core

    sql = "COPY (SELECT 1, 2 FROM generate_series(1, 50000)) TO STDOUT (FORMAT BINARY)"
    with psycopg.connect(pg.conninfo, autocommit=True) as conn:
        with _pump(conn, 3, sql) as pump:
            buf, offsets = np.zeros(1 << 20, np.uint8), np.zeros(1 << 16, np.int64)
            with pytest.raises(_core.PgProtocolError, match="a row has 2 fields, expected 3"):
                pump.fill(buf, offsets, np.zeros(3, np.int64), np.zeros(3, np.int64))
            pump.abort()
            assert not pump.active
            assert _lowat(conn) == 1
        assert conn.execute("SELECT 5").fetchone() == (5,)


# -- streams no real server sends, swapped in by a proxy (tests/hostile_pg.py) ----------------------------

HEADER = b"PGCOPY\n\xff\r\n\0" + struct.pack("!ii", 0, 0)
TRAILER = struct.pack("!h", -1)


def _row(*fields: bytes | None) -> bytes:
    out = struct.pack("!h", len(fields))
    for f in fields:
        out += struct.pack("!i", -1) if f is None else struct.pack("!i", len(f)) + f
    return out


def _int4(v: int) -> bytes:
    return struct.pack("!i", v)


@contextlib.contextmanager
def _hostile(pg, *messages: bytes):
    """A connection to the real test server through tests/hostile_pg.py, which swaps the data of every
    COPY the server sends for ``messages``."""
    port = pg.cluster.port
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("hostile_pg.py")), str(port), *(m.hex() for m in messages)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        proxy = int(proc.stdout.readline())
        conninfo = pg.cluster.conninfo.replace(f"port={port}", f"port={proxy}")
        with psycopg.connect(conninfo + " sslmode=disable gssencmode=disable", autocommit=True) as conn:
            assert conn.execute("SELECT 7").fetchone() == (7,)  # the real server behind the proxy
            yield conn
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def _read(conn, ncols: int, chunk_bytes: int = 1 << 20):
    from pystrom.io.postgres.pump import CopyStream

    sql = f"COPY (SELECT {', '.join(['1'] * ncols)}) TO STDOUT (FORMAT BINARY)"  # the server's own COPY header
    return CopyStream(conn, ncols, lambda n: np.zeros(n, np.uint8), chunk_bytes).read(sql)


def test_hostile_server_well_formed_stream_is_read(pg):
    # First the sanity check of the proxy itself: the header with the first row, rows sharing
    # a message, a NULL, rows with the trailer in the same message; 32-byte buffers, so most
    # messages ask for a larger one.
    rows = [_row(_int4(i), b"x" * i) for i in range(1, 9)]
    rows[2] = _row(None, b"")
    msgs = [HEADER + rows[0], rows[1] + rows[2], rows[3], rows[4] + rows[5] + rows[6] + rows[7] + TRAILER]
    with _hostile(pg, *msgs) as conn:
        chunks = _read(conn, 2, chunk_bytes=32)
    assert len(chunks) >= 3 and sum(c.nrows for c in chunks) == 8
    assert [int(v) for v in sum(c.nulls for c in chunks)] == [1, 0]
    assert [int(v) for v in sum(c.bytes for c in chunks)] == [7 * 4, sum(range(1, 9)) - 3]
    got = [
        bytes(c.buf[o : (c.offsets[k + 1] if k + 1 < c.nrows else c.nbytes)])
        for c in chunks
        for k, o in enumerate(c.offsets[: c.nrows])
    ]
    assert got == rows


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([b"PGCOPY\n\xff\r\n\0"], "missing binary COPY header"),
        ([b"NOTCOPY\n\xff\r\n\0" + bytes(8), TRAILER], "missing binary COPY header"),
        ([b"PGCOPY\n\xff\r\n\0" + struct.pack("!ii", 1 << 16, 0) + TRAILER], "with OIDs"),
        ([b"PGCOPY\n\xff\r\n\0" + struct.pack("!ii", 0, 100) + TRAILER], "header extension"),
        ([HEADER + _row(_int4(1)) + b"\0"], "truncated row header"),
        ([HEADER + _row(_int4(1), _int4(2)) + TRAILER], "a row has 2 fields, expected 1"),
        ([HEADER + struct.pack("!h", 1) + b"\0\0", TRAILER], "truncated field length"),
        ([HEADER + struct.pack("!hi", 1, 5) + b"abcd", TRAILER], "field length out of range"),
        ([HEADER + struct.pack("!hi", 1, -2), TRAILER], "field length out of range"),
        ([HEADER + _row(_int4(1)) + TRAILER + b"\0"], "data after the binary COPY trailer"),
        ([HEADER + _row(_int4(1)), _row(_int4(2))], "without its trailer"),
        ([HEADER + _row(_int4(1)), _row(_int4(2)) + struct.pack("!hi", 1, 4) + b"ab", TRAILER], "out of range"),
    ],
)
def test_hostile_server_malformed_streams_are_refused(pg, messages, match):
    with _hostile(pg, *messages) as conn:
        with pytest.raises(PostgresError, match=match):
            _read(conn, 1)
