"""A hostile network in front of a real PostgreSQL: a TCP proxy that forwards everything both ways,
except that the data of each binary COPY the server sends is swapped for bytes given on the command
line (truncated rows, wrong lengths, a broken header, a missing trailer).

A real server never sends such bytes, but a broken middlebox, a bad connection pooler or memory
corruption can; tests/test_pg_pump.py checks that the COPY pump refuses them with a clear error
instead of reading past a message. Authentication, the CopyOutResponse (column count and formats),
CopyDone, CommandComplete, ReadyForQuery and cancel requests are the real server's.

Usage: ``python hostile_pg.py UPSTREAM_PORT HEX [HEX ...]``: each client connection is forwarded to
127.0.0.1:UPSTREAM_PORT; within every COPY OUT the server's CopyData messages are dropped and, just
before its CopyDone, one CopyData message per HEX argument is sent instead. Clients must connect with
``sslmode=disable gssencmode=disable`` (the proxy reads the server's side as plain protocol messages).
The port the proxy listens on (127.0.0.1) is printed on stdout.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("peer went away")
        data += part
    return data


def _client_to_server(client: socket.socket, server: socket.socket) -> None:
    try:
        while data := client.recv(1 << 16):
            server.sendall(data)
    except OSError:
        pass
    finally:
        _shutdown(server)


def _server_to_client(server: socket.socket, client: socket.socket, replacement: list[bytes]) -> None:
    """Forward the server's messages, swapping the data of each COPY OUT for ``replacement``."""
    try:
        while True:
            try:
                kind = _recv_exact(server, 1)
            except ConnectionError:
                return  # e.g. a cancel request's connection, which the server just closes
            header = _recv_exact(server, 4)
            body = _recv_exact(server, struct.unpack("!i", header)[0] - 4)
            if kind == b"d":  # the server's CopyData: dropped
                continue
            if kind == b"c":  # CopyDone: the hostile data first
                client.sendall(b"".join(b"d" + struct.pack("!i", len(m) + 4) + m for m in replacement))
            client.sendall(kind + header + body)
    except OSError:
        pass
    finally:
        _shutdown(client)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def main() -> None:
    upstream = int(sys.argv[1])
    replacement = [bytes.fromhex(h) for h in sys.argv[2:]]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        server = socket.create_connection(("127.0.0.1", upstream))
        threading.Thread(target=_client_to_server, args=(client, server), daemon=True).start()
        threading.Thread(target=_server_to_client, args=(server, client, replacement), daemon=True).start()


if __name__ == "__main__":
    main()
