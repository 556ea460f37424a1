"""The store daemon's wire protocol and socket location.

Messages are length-prefixed JSON objects (a 4-byte little-endian length, then UTF-8 JSON) on a
Unix stream socket; binary fields travel base64-encoded. File descriptors (memory the daemon owns)
ride along as SCM_RIGHTS ancillary data of a reply. JSON rather than pickle: a peer must never
be able to make the daemon run code, whatever it sends.

The socket lives in a directory only its user can enter (mode 0700): ``$XDG_RUNTIME_DIR/pystrom/``
when that is set, else ``/tmp/pystrom-<uid>/``; ``PYSTROM_STORE_SOCKET`` or an explicit path
overrides it. The daemon listens with the system's largest backlog (``net.core.somaxconn``), and a
client whose connection finds the backlog full (EAGAIN) or nobody listening yet (ECONNREFUSED: a
daemon starting or restarting) tries again with backoff for ``pystrom.defaults.store_connect_retry``
seconds before it gives up with :class:`~pystrom.errors.StoreUnavailableError`.
"""

from __future__ import annotations

import array
import base64
import json
import os
import random
import socket
import stat
import struct
import time
from typing import Any

from .._settings import defaults
from ..errors import StoreError, StorePermissionError, StoreUnavailableError
from .handle import parse_json

__all__ = [
    "default_socket",
    "secure_dir",
    "check_daemon_dir",
    "check_daemon_peer",
    "send",
    "recv",
    "b64",
    "unb64",
    "peer_credentials",
    "listen",
    "listen_backlog",
    "connect",
    "PROTOCOL",
]

PROTOCOL = 1
MAX_MESSAGE = 64 << 20
MAX_FDS = 8
_LEN = struct.Struct("<I")
SOCKET_ENV = "PYSTROM_STORE_SOCKET"


def default_socket() -> str:
    """The socket path used when none is given."""
    env = os.environ.get(SOCKET_ENV)
    if env:
        return env
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "pystrom", "store.sock")
    return os.path.join("/tmp", f"pystrom-{os.getuid()}", "store.sock")


def secure_dir(path: str, others: bool = False) -> None:
    """Create ``path`` mode 0700 if missing; refuse one that another user owns or can enter.

    ``others`` (the daemon serves other users too): the directory gets mode 0711, so that they can
    reach the socket inside without listing or changing the directory.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise StorePermissionError(f"store socket directory {path} is not a directory (a symlink?)")
    if st.st_uid != os.getuid():
        raise StorePermissionError(f"store socket directory {path} belongs to uid {st.st_uid}, not to this user")
    mode = stat.S_IMODE(st.st_mode)
    if others and mode & 0o077 != 0o011:
        os.chmod(path, 0o711)
    elif not others and mode & 0o077:
        raise StorePermissionError(
            f"store socket directory {path} has mode {mode:04o}; it must be 0700 (only its user may enter it)"
        )


def check_daemon_dir(socket_path: str, trusted: set[int]) -> None:
    """Refuse a socket whose directory another user owns or may write: whoever can, could listen there.

    Done by the client before it connects (finding 6 of issue 14: another user made
    ``/tmp/pystrom-<uid>`` first and received the tables of whoever connected).
    """
    directory = os.path.dirname(os.path.abspath(socket_path))
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return  # nothing listens there: connect() says so
    except PermissionError:
        raise StorePermissionError(
            f"not allowed to reach the store socket {socket_path}: its directory belongs to another user"
        ) from None
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in trusted:
        raise StorePermissionError(
            f"the store socket directory {directory} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.getuid()}): another user could run a daemon there and receive your tables; refusing it "
            f"(pass trust_uids=[{st.st_uid}] to trust that user)"
        )
    if mode & 0o022:
        raise StorePermissionError(
            f"the store socket directory {directory} has mode {mode:04o}: other users may write it, so anyone "
            "could have put the socket there; refusing it (use a directory only you can write)"
        )


def check_daemon_peer(sock: socket.socket, socket_path: str, trusted: set[int]) -> None:
    """Refuse a daemon that runs as a user not in ``trusted``, before anything is sent to it."""
    pid, uid, _ = peer_credentials(sock)
    if uid not in trusted:
        raise StorePermissionError(
            f"the store daemon at {socket_path} (pid {pid}) runs as uid {uid}, not as this user (uid {os.getuid()}); "
            f"refusing to send it anything (pass trust_uids=[{uid}] to trust that user)"
        )


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError("expected a base64 string")
    return base64.b64decode(text, validate=True)


def send(sock: socket.socket, message: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    data = _LEN.pack(len(body)) + body
    sent = 0
    if fds:
        sent = socket.send_fds(sock, [data], list(fds))
    if sent < len(data):
        sock.sendall(data[sent:])


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    parts, got = [], 0
    space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
    while got < n:
        data, anc, flags, _ = sock.recvmsg(n - got, space, getattr(socket, "MSG_CMSG_CLOEXEC", 0))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
                fds.extend(received)
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            for fd in fds:
                os.close(fd)
            raise ConnectionError("too many file descriptors in one message")
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def recv(sock: socket.socket) -> tuple[dict, list[int]]:
    """One message and the descriptors that came with it (the caller owns and closes them).

    Raises EOFError when the peer closed the connection before a message began, ConnectionError
    on a malformed message.
    """
    fds: list[int] = []
    (length,) = _LEN.unpack(_recv_exact(sock, _LEN.size, fds))
    try:
        if length > MAX_MESSAGE:
            raise ConnectionError(f"message of {length} bytes exceeds the limit of {MAX_MESSAGE}")
        body = _recv_exact(sock, length, fds)
        message = parse_json(body, "a store message")
        if not isinstance(message, dict):
            raise ConnectionError("a message must be a JSON object")
    except (ValueError, EOFError, ConnectionError):  # InvalidHandleError is a ValueError
        for fd in fds:
            os.close(fd)
        raise ConnectionError("malformed message") from None
    return message, fds


def listen_backlog() -> int:
    """The system's largest listen backlog (``net.core.somaxconn``): a crowd of clients connecting at
    once queues there instead of being refused."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return max(int(f.read().strip()), socket.SOMAXCONN)
    except (OSError, ValueError):
        return socket.SOMAXCONN


def listen(path: str, others: bool) -> socket.socket:
    """The daemon's listening socket at ``path`` (mode 0600, or 0666 when ``others`` are served).

    The default place gets a private directory (:func:`secure_dir`); an explicit one keeps the
    caller's modes. A socket left there by a daemon that died is replaced; one a live daemon
    answers on is refused.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if path == default_socket() and SOCKET_ENV not in os.environ:
        secure_dir(directory, others=others)  # the default place: only this user may write it
    else:
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)  # an explicit place: its modes are the caller's
        except OSError as exc:
            raise StoreError(f"cannot create the socket directory {directory}: {exc.strerror or exc}") from None
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # a socket left by a daemon that died
        else:
            raise StoreError(f"another store daemon already serves {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket: mode 0600
    try:
        sock.bind(path)
        if others:
            # other users served: anyone may connect, SO_PEERCRED decides whom the daemon serves;
            # the directory gets search permission for others (not read, not write)
            os.chmod(path, 0o666)
            st = os.stat(directory)
            if st.st_uid == os.getuid() and not st.st_mode & 0o001:
                os.chmod(directory, stat.S_IMODE(st.st_mode) | 0o011)
        sock.listen(listen_backlog())
    except OSError as exc:
        sock.close()
        raise StoreError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    return sock


def connect(path: str, timeout: float | None = None, retry: float | None = None) -> socket.socket:
    """A connection to the daemon at ``path``.

    A full backlog (EAGAIN: a crowd connecting at once) or nobody listening (ECONNREFUSED: the
    daemon is starting, restarting, or died and left its socket) is tried again with growing,
    jittered pauses for ``retry`` seconds (default ``defaults.store_connect_retry``, at most
    ``timeout``) before :class:`StoreUnavailableError` says which it was.
    """
    window = defaults.store_connect_retry if retry is None else retry
    if timeout is not None:
        window = min(window, timeout)
    start = time.monotonic()
    pause = 0.002
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            break
        except (BlockingIOError, ConnectionRefusedError) as exc:
            sock.close()
            waited = time.monotonic() - start
            if waited + pause > window:
                why = "its listen backlog stayed full" if isinstance(exc, BlockingIOError) else "connection refused"
                raise StoreUnavailableError(
                    f"no pystrom store daemon answers at {path} ({why} for {waited:.1f} s); "
                    "start one with `pystrom serve`"
                ) from None
            time.sleep(pause * (0.5 + random.random()))  # jitter: a crowd refused together does not return together
            pause = min(pause * 2, 0.1)
        except FileNotFoundError as exc:
            sock.close()
            raise StoreUnavailableError(
                f"no pystrom store daemon answers at {path} ({exc.strerror}); start one with `pystrom serve`"
            ) from None
        except PermissionError:
            sock.close()
            raise StorePermissionError(
                f"not allowed to reach the store socket {path}: it belongs to another user"
            ) from None
        except OSError as exc:
            sock.close()
            raise StoreUnavailableError(f"cannot connect to the store daemon at {path}: {exc}") from None
    sock.settimeout(None)
    return sock
