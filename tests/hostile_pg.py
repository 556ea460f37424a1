"""A process that speaks just enough of PostgreSQL's wire protocol (v3) to answer one COPY with bytes a
real server never sends: truncated rows, wrong lengths, a broken header, a missing trailer.

It exists for tests/test_pg_pump.py, which checks that the COPY pump refuses such streams with a
clear error instead of reading past a message; everything else in the suite runs against a real
PostgreSQL. Usage: ``python hostile_pg.py NCOLS HEX [HEX ...]``: every client that connects gets
``AuthenticationOk``, and its first query a binary ``CopyOutResponse`` with NCOLS columns, one
``CopyData`` message per HEX argument, then ``CopyDone``, ``CommandComplete`` and ``ReadyForQuery``.
The port it listens on (127.0.0.1) is printed on stdout. Cancel requests are read and closed.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading


def _msg(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("client went away")
        data += part
    return data


def _serve(sock: socket.socket, ncols: int, messages: list[bytes]) -> None:
    with sock:
        (length,) = struct.unpack("!i", _recv_exact(sock, 4))
        body = _recv_exact(sock, length - 4)
        if struct.unpack("!i", body[:4])[0] == 80877102:  # CancelRequest: nothing to cancel here
            return
        params = [(b"server_version", b"16.0"), (b"server_encoding", b"UTF8"), (b"client_encoding", b"UTF8")]
        params += [(b"standard_conforming_strings", b"on"), (b"integer_datetimes", b"on"), (b"DateStyle", b"ISO, MDY")]
        out = _msg(b"R", struct.pack("!i", 0))
        out += b"".join(_msg(b"S", k + b"\0" + v + b"\0") for k, v in params)
        out += _msg(b"K", struct.pack("!ii", 4242, 1234)) + _msg(b"Z", b"I")
        sock.sendall(out)
        while True:
            kind = _recv_exact(sock, 1)
            (length,) = struct.unpack("!i", _recv_exact(sock, 4))
            _recv_exact(sock, length - 4)
            if kind == b"X":
                return
            if kind != b"Q":
                continue
            out = _msg(b"H", struct.pack("!bh", 1, ncols) + struct.pack("!h", 1) * ncols)
            out += b"".join(_msg(b"d", m) for m in messages)
            out += _msg(b"c", b"") + _msg(b"C", b"COPY 0\0") + _msg(b"Z", b"I")
            sock.sendall(out)


def main() -> None:
    ncols = int(sys.argv[1])
    messages = [bytes.fromhex(h) for h in sys.argv[2:]]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()

        def serve(c: socket.socket = conn) -> None:
            try:
                _serve(c, ncols, messages)
            except (ConnectionError, OSError):
                pass

        threading.Thread(target=serve, daemon=True).start()


if __name__ == "__main__":
    main()
