"""The store daemon: owns tables by name in GPU (or host) memory so they outlive the processes that made them.

The daemon only allocates, hands out and frees memory; it never reads or writes table data.
A ``put`` is two steps: *reserve* (the daemon allocates and passes the memory to the client,
which maps it and fills it) and *commit* (the client sends the layout; the name becomes visible
atomically). A client that dies between the two leaves nothing visible: its connection closes and
the daemon frees the reservation.

Lifetime rule (reference counts per connection): every ``get`` (and every reservation) counts one
hold by that connection on that allocation; a client gives holds back when the views of its
mapping are gone (piggybacked on its next request) or all at once when it disconnects, crashed or
not. ``drop`` removes the name at once (no new ``get`` sees it) and frees the memory when the last
hold is given back. ``put(..., replace=True)`` drops the old table the same way.

Memory: CUDA VMM allocations exported as POSIX file descriptors (passed with SCM_RIGHTS, so only
processes the daemon answered can map them) where the driver supports them, else legacy CUDA IPC
handles (a capability: see docs/ipc.md); on the CPU backend, memfd descriptors.
"""

from __future__ import annotations

import collections
import errno
import itertools
import os
import resource
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import Error, InvalidHandleError, StoreError, StorePermissionError, TableExistsError, TableNotFoundError
from ..memory import shm
from ..memory.backend import Backend, resolve_device
from . import protocol
from .handle import TableLayout

__all__ = ["serve", "StoreServer"]

MAX_NAME = 256
RESERVED_FDS = 32  # descriptors the daemon keeps for itself: stdio, the listener, sealing, sending, libraries
MAX_CLIENTS = 4096  # connections at most (one thread each), whatever the descriptor limit


class _Allocation:
    """Memory the daemon owns: a memfd, a VMM allocation or a cudaMalloc block."""

    def __init__(self, server: StoreServer, nbytes: int):
        self.kind = server.memory_kind
        self.ordinal = server.backend.ordinal
        self.uuid = server.uuid_hex
        if self.kind == "memfd":
            self.fd, self.name = shm.create_fd(max(nbytes, 1))
            self.size = max(nbytes, 1)
        elif self.kind == "vmm":
            self.handle, self.size = server.vmm.create(nbytes)
        else:
            import cupy

            self.size = max(nbytes, 1)
            self.ptr = int(cupy.cuda.runtime.malloc(self.size))
            from ._cuda import ipc_export

            self.ipc = ipc_export(self.ptr)

    def descriptor(self, writable: bool) -> tuple[dict, list[int]]:
        """What a client needs to map this memory, and descriptors to send with it (closed after sending).

        Host memory goes to the writer as a read-write descriptor, to readers as a read-only one
        (a new open file description: the daemon's own stays read-write).
        """
        desc: dict[str, Any] = {"kind": self.kind, "size": self.size, "uuid": self.uuid}
        if self.kind == "memfd":
            desc["name"] = self.name
            return desc, [os.dup(self.fd) if writable else shm.reopen_read_only(self.fd)]
        if self.kind == "vmm":
            from ._cuda import Vmm

            return desc, [Vmm.export_fd(self.handle)]
        desc["handle"] = protocol.b64(self.ipc)
        return desc, []

    def free(self) -> None:
        if self.kind == "memfd":
            os.close(self.fd)
        elif self.kind == "vmm":
            from ._cuda import Vmm

            Vmm.release(self.handle)
        else:
            import cupy

            cupy.cuda.runtime.free(self.ptr)


@dataclass
class _Entry:
    id: int
    name: str
    alloc: _Allocation
    owner: int  # connection that reserved it
    state: str = "pending"  # pending -> live -> dropped
    meta: dict | None = None
    schema: bytes = b""
    holds: collections.Counter = field(default_factory=collections.Counter)  # connection id -> holds
    created: float = field(default_factory=time.time)


class StoreServer:
    """The daemon's state and request handlers. :func:`serve` runs one; tests may embed one."""

    def __init__(
        self,
        socket_path: str | None = None,
        device: str | int | Backend | None = None,
        allow_uids: Iterable[int] = (),
        allow_gids: Iterable[int] = (),
        memory: str = "auto",
        max_connections: int | None = None,
    ):
        self.backend = resolve_device(device)
        self.path = socket_path or protocol.default_socket()
        self.others = bool(set(map(int, allow_uids)) - {os.getuid()} or allow_gids)
        self.allow_uids = {os.getuid(), *map(int, allow_uids)}
        self.allow_gids = set(map(int, allow_gids))
        self.lock = threading.Lock()
        self.entries: dict[int, _Entry] = {}
        self.names: dict[str, _Entry] = {}
        self.clients: set[int] = set()
        self.per_uid: collections.Counter = collections.Counter()  # open connections per peer uid
        # Descriptors: each connection holds one, each host table one. Both are capped so that the
        # daemon always keeps RESERVED_FDS for itself (accepting, sealing, sending) and never meets
        # EMFILE; half of what is left is for connections, half for host tables.
        self.fd_limit = raise_descriptor_limit()
        spare = max(self.fd_limit - RESERVED_FDS, 8)
        self.max_clients = max(min(spare // 2, MAX_CLIENTS), 4)
        self.max_host_tables = max(spare - self.max_clients, 4)
        if max_connections is not None and max_connections < 1:
            raise StoreError(f"max_connections must be at least 1; got {max_connections}")
        self.max_per_uid = min(max_connections or self.max_clients, self.max_clients)
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self.vmm: Any = None
        self.vmm_problem: str | None = None
        if self.backend.kind == "cpu":
            if not shm.HAVE_MEMFD:
                raise StoreError("the CPU store needs Linux memfd (os.memfd_create)")
            self.memory_kind, self.uuid_hex = "memfd", ""
        else:
            from . import _cuda

            _cuda.use_device(self.backend.ordinal)
            self.uuid_hex = _cuda.device_uuid(self.backend.ordinal).hex()
            if memory not in ("auto", "vmm", "legacy"):
                raise StoreError(f"memory must be 'auto', 'vmm' or 'legacy'; got {memory!r}")
            if memory != "legacy":
                self.vmm_problem = _cuda.vmm_probe(self.backend.ordinal)
                if self.vmm_problem is None:
                    self.vmm = _cuda.Vmm(self.backend.ordinal)
                elif memory == "vmm":
                    raise StoreError(f"CUDA VMM with file descriptors does not work here: {self.vmm_problem}")
            self.memory_kind = "vmm" if self.vmm is not None else "cuda_ipc"

    # -- socket -----------------------------------------------------------------------------------

    def bind(self) -> socket.socket:
        directory = os.path.dirname(os.path.abspath(self.path))
        if self.path == protocol.default_socket() and protocol.SOCKET_ENV not in os.environ:
            protocol.secure_dir(directory, others=self.others)  # the default place: only this user may write it
        else:
            try:
                os.makedirs(directory, mode=0o700, exist_ok=True)  # an explicit place: its modes are the caller's
            except OSError as exc:
                raise StoreError(f"cannot create the socket directory {directory}: {exc.strerror or exc}") from None
        if os.path.exists(self.path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
            except OSError:
                os.unlink(self.path)  # a socket left by a daemon that died
            else:
                probe.close()
                raise StoreError(f"another store daemon already serves {self.path}")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket: mode 0600
        try:
            sock.bind(self.path)
            if self.others:
                # --allow-uids/--allow-gids: anyone may connect, SO_PEERCRED decides whom the daemon
                # serves; the directory gets search permission for others (not read, not write)
                os.chmod(self.path, 0o666)
                st = os.stat(directory)
                if st.st_uid == os.getuid() and not st.st_mode & 0o001:
                    os.chmod(directory, stat.S_IMODE(st.st_mode) | 0o011)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise StoreError(f"cannot listen on {self.path}: {exc.strerror or exc}") from None
        finally:
            os.umask(old)
        return sock

    def serve_forever(self, ready: Callable[[StoreServer], None] | None = None) -> None:
        listener = self.bind()
        listener.settimeout(0.2)
        if ready is not None:
            ready(self)
        try:
            while not self._stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError as exc:
                    if self._stop.is_set():
                        break
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED):
                        time.sleep(0.05)  # out of descriptors or memory for a moment: serve the others meanwhile
                        continue
                    raise
                conn.settimeout(None)
                try:
                    threading.Thread(target=self._connection, args=(conn,), daemon=True).start()
                except RuntimeError:  # no thread to be had: the client is told by the closed connection
                    conn.close()
        finally:
            listener.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self._free_all()

    def stop(self) -> None:
        self._stop.set()

    # -- one client ---------------------------------------------------------------------------------

    def _allowed(self, uid: int, gid: int, pid: int) -> bool:
        if uid in self.allow_uids or gid in self.allow_gids:
            return True
        if self.allow_gids:
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("Groups:"):
                            return bool(self.allow_gids & set(map(int, line.split()[1:])))
            except OSError:
                pass
        return False

    def _connection(self, conn: socket.socket) -> None:
        cid = id(conn)
        uid = -1
        try:
            pid, uid, gid = protocol.peer_credentials(conn)
            if not self._allowed(uid, gid, pid):
                protocol.send(conn, _error(StorePermissionError(f"uid {uid} is not allowed by this store daemon")))
                conn.settimeout(2.0)  # let the client's first request arrive, so closing resets nothing it sent
                try:
                    _, fds = protocol.recv(conn)
                    for fd in fds:
                        os.close(fd)
                except (EOFError, OSError):
                    pass
                return
            refusal = self._admit(cid, uid)
            if refusal is not None:
                uid = -1  # not counted
                try:  # told at once and closed: a refused connection must not hold its descriptor
                    protocol.send(conn, _error(StoreError(refusal)))
                except OSError:
                    pass
                return
            if self.backend.kind == "cuda":
                from . import _cuda

                _cuda.use_device(self.backend.ordinal)
            while True:
                try:
                    request, fds = protocol.recv(conn)
                except (EOFError, ConnectionError, OSError):
                    return
                for fd in fds:  # clients never send descriptors
                    os.close(fd)
                reply, out_fds = self._dispatch(cid, request)
                try:
                    protocol.send(conn, reply, out_fds)
                except OSError:
                    return
                finally:
                    for fd in out_fds:
                        os.close(fd)
        finally:
            conn.close()
            self._disconnect(cid, uid)

    def _admit(self, cid: int, uid: int) -> str | None:
        """Count a new connection of ``uid``, or say why it is refused."""
        with self.lock:
            if self.per_uid[uid] >= self.max_per_uid:
                return (
                    f"too many connections from uid {uid}: {self.per_uid[uid]} open, the store daemon serves at "
                    f"most {self.max_per_uid} per user (close some Stores, or raise --max-connections)"
                )
            if len(self.clients) >= self.max_clients:
                return (
                    f"too many connections: the store daemon serves {len(self.clients)}, as many as its "
                    f"descriptor limit ({self.fd_limit}) allows; close some Stores or raise `ulimit -n`"
                )
            self.clients.add(cid)
            self.per_uid[uid] += 1
        return None

    def _dispatch(self, cid: int, request: dict) -> tuple[dict, list[int]]:
        op = request.get("op")
        handler = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
        try:
            self._release(cid, request.get("release", []))
            if handler is None:
                raise StoreError(f"unknown request {op!r}")
            reply, fds = handler(cid, request)
        except Error as exc:
            return _error(exc), []
        except Exception as exc:  # a bug or a driver failure: report it, keep serving
            return _error(StoreError(f"{op} failed in the daemon: {type(exc).__name__}: {exc}")), []
        reply["ok"] = True
        return reply, fds

    # -- requests -----------------------------------------------------------------------------------

    def _op_hello(self, cid: int, req: dict) -> tuple[dict, list[int]]:
        info = {"protocol": protocol.PROTOCOL, "pid": os.getpid(), "device": self.backend.device}
        info.update(memory=self.memory_kind, uuid=self.uuid_hex)
        return info, []

    def _op_reserve(self, cid: int, req: dict) -> tuple[dict, list[int]]:
        name = _name(req.get("name"))
        nbytes = req.get("nbytes")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or not 0 < nbytes < 1 << 50:
            raise StoreError(f"reserve {name!r}: nbytes must be a positive integer; got {nbytes!r}")
        with self.lock:
            if name in self.names and not req.get("replace"):
                raise TableExistsError(f"the store already has a table named {name!r} (use replace=True)")
            if self.memory_kind == "memfd" and len(self.entries) >= self.max_host_tables:
                raise StoreError(
                    f"reserve {name!r}: the store daemon holds {len(self.entries)} host tables (dropped ones still "
                    f"in use and pending puts included), as many as its descriptor limit ({self.fd_limit}) allows: "
                    "each holds one descriptor; drop tables, or restart the daemon with a higher `ulimit -n`"
                )
        alloc = _Allocation(self, nbytes)  # outside the lock: may take a while
        with self.lock:
            entry = _Entry(next(self._ids), name, alloc, cid)
            entry.holds[cid] += 1
            self.entries[entry.id] = entry
        desc, fds = alloc.descriptor(writable=True)
        return {"id": entry.id, "memory": desc}, fds

    def _op_commit(self, cid: int, req: dict) -> tuple[dict, list[int]]:
        with self.lock:
            entry = self._pending(cid, req.get("id"))
        try:
            schema = protocol.unb64(req.get("schema"))
        except ValueError:
            raise InvalidHandleError(f"commit {entry.name!r}: the schema is not base64") from None
        layout = TableLayout.from_meta(req.get("layout"), schema, f"commit {entry.name!r}")
        if layout.nbytes > entry.alloc.size:
            raise InvalidHandleError(
                f"commit {entry.name!r}: the layout needs {layout.nbytes} bytes, {entry.alloc.size} were reserved"
            )
        if entry.alloc.kind == "memfd":
            # Outside the lock: checking a large table must not hold up other clients. Only this
            # connection (whose requests this thread serves one at a time) can touch its reservation.
            self._seal_and_check(entry, layout)
        with self.lock:
            entry = self._pending(cid, req.get("id"))
            old = self.names.get(entry.name)
            if old is not None:
                if not req.get("replace"):
                    raise TableExistsError(f"the store already has a table named {entry.name!r} (use replace=True)")
                self._unbind(old)
            entry.meta, entry.schema, entry.state = layout.meta(), schema, "live"
            self.names[entry.name] = entry
        return {}, []

    def _seal_and_check(self, entry: _Entry, layout: TableLayout) -> None:
        """Make a host table immutable, then check what readers will read (in this order: no race).

        The write seal fails while the writer still maps the memory writable (its client remaps it
        read-only before committing). A table whose offsets would make readers read outside its
        buffers is refused, and its reservation freed: sealed memory cannot be fixed.
        """
        from .validate import check_table

        where = f"commit {entry.name!r}"
        try:
            shm.freeze(entry.alloc.fd)
        except OSError as exc:
            raise StoreError(
                f"{where}: cannot seal the table's memory against writes ({exc.strerror or exc}): the writer "
                "still maps it writable (pystrom's client remaps it read-only before committing)"
            ) from None
        try:
            memory = shm.map_fd(entry.alloc.fd, entry.alloc.size, entry.alloc.name, writable=False)
            check_table(layout.table(self.backend.wrap(memory, layout.nbytes), where), where)
        except Error:
            with self.lock:
                entry.state = "dropped"
                self._maybe_free(entry)
            raise

    def _op_abort(self, cid: int, req: dict) -> tuple[dict, list[int]]:
        with self.lock:
            entry = self._pending(cid, req.get("id"))
            entry.state = "dropped"
            self._maybe_free(entry)
        return {}, []

    def _op_get(self, cid: int, req: dict) -> tuple[dict, list[int]]:
        name = _name(req.get("name"))
        with self.lock:
            entry = self.names.get(name)
            if entry is None:
                raise TableNotFoundError(f"the store has no table named {name!r}")
            entry.holds[cid] += 1
        desc, fds = entry.alloc.descriptor(writable=False)
        return {"id": entry.id, "memory": desc, "layout": entry.meta, "schema": protocol.b64(entry.schema)}, fds

    def _op_list(self, cid: int, req: dict) -> tuple[dict, list[int]]:
        with self.lock:
            tables = [
                {
                    "name": e.name,
                    "nbytes": e.meta["nbytes"],
                    "num_rows": e.meta["num_rows"],
                    "device": self.backend.device,
                    "schema": protocol.b64(e.schema),
                    "created": e.created,
                }
                for e in self.names.values()
            ]
        return {"tables": tables}, []

    def _op_drop(self, cid: int, req: dict) -> tuple[dict, list[int]]:
        name = _name(req.get("name"))
        with self.lock:
            entry = self.names.get(name)
            if entry is None:
                raise TableNotFoundError(f"the store has no table named {name!r}")
            self._unbind(entry)
            deferred = entry.id in self.entries
        return {"deferred": deferred}, []

    def _op_stats(self, cid: int, req: dict) -> tuple[dict, list[int]]:
        with self.lock:
            live = list(self.names.values())
            dropped = [e for e in self.entries.values() if e.state == "dropped"]
            pending = [e for e in self.entries.values() if e.state == "pending"]
            stats = {
                "pid": os.getpid(),
                "device": self.backend.device,
                "memory": self.memory_kind,
                "vmm_problem": self.vmm_problem,
                "tables": len(live),
                "table_bytes": sum(e.alloc.size for e in live),
                "dropped_in_use": len(dropped),
                "dropped_bytes": sum(e.alloc.size for e in dropped),
                "pending_puts": len(pending),
                "allocations": len(self.entries),
                "allocated_bytes": sum(e.alloc.size for e in self.entries.values()),
                "clients": len(self.clients),
                "descriptor_limit": self.fd_limit,
                "max_connections": self.max_clients,
                "max_connections_per_uid": self.max_per_uid,
            }
            if self.memory_kind == "memfd":
                stats["max_tables"] = self.max_host_tables
        if self.backend.kind == "cuda":
            import cupy

            free, total = cupy.cuda.runtime.memGetInfo()
            stats.update(device_free_bytes=int(free), device_total_bytes=int(total))
        return stats, []

    # -- bookkeeping (call with self.lock held) -------------------------------------------------------

    def _pending(self, cid: int, entry_id: Any) -> _Entry:
        entry = self.entries.get(entry_id) if isinstance(entry_id, int) else None
        if entry is None or entry.state != "pending" or entry.owner != cid:
            raise StoreError(f"no reservation {entry_id!r} of this connection is pending")
        return entry

    def _unbind(self, entry: _Entry) -> None:
        if self.names.get(entry.name) is entry:
            del self.names[entry.name]
        entry.state = "dropped"
        self._maybe_free(entry)

    def _maybe_free(self, entry: _Entry) -> None:
        if entry.state == "dropped" and not entry.holds and self.entries.pop(entry.id, None) is not None:
            entry.alloc.free()

    def _release(self, cid: int, ids: Any) -> None:
        if not isinstance(ids, list) or not ids:
            return
        with self.lock:
            for entry_id in ids:
                entry = self.entries.get(entry_id) if isinstance(entry_id, int) else None
                if entry is not None and entry.holds[cid] > 0:
                    entry.holds[cid] -= 1
                    if not entry.holds[cid]:
                        del entry.holds[cid]
                    self._maybe_free(entry)

    def _disconnect(self, cid: int, uid: int) -> None:
        with self.lock:
            if cid in self.clients and uid != -1:
                self.per_uid[uid] -= 1
                if not self.per_uid[uid]:
                    del self.per_uid[uid]
            self.clients.discard(cid)
            for entry in list(self.entries.values()):
                entry.holds.pop(cid, None)
                if entry.state == "pending" and entry.owner == cid:
                    entry.state = "dropped"  # the client died (or gave up) mid-put
                self._maybe_free(entry)

    def _free_all(self) -> None:
        with self.lock:
            for entry in self.entries.values():
                try:
                    entry.alloc.free()
                except Exception:
                    pass
            self.entries.clear()
            self.names.clear()


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (tables and connections each hold a descriptor)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return int(soft)


def _name(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME or "\0" in value:
        raise StoreError(f"a table name is a non-empty string of at most {MAX_NAME} characters; got {value!r}")
    return value


def _error(exc: Exception) -> dict:
    return {"ok": False, "error": type(exc).__name__, "message": str(exc)}


def serve(
    socket: str | None = None,
    device: str | int | None = None,
    allow_uids: Iterable[int] = (),
    allow_gids: Iterable[int] = (),
    memory: str = "auto",
    ready: Callable[[StoreServer], None] | None = None,
    max_connections: int | None = None,
) -> None:
    """Run the store daemon until SIGTERM/SIGINT (or ``StoreServer.stop()`` from ``ready``'s server).

    Parameters
    ----------
    socket
        Socket path; None: ``$PYSTROM_STORE_SOCKET``, else ``$XDG_RUNTIME_DIR/pystrom/store.sock``,
        else ``/tmp/pystrom-<uid>/store.sock`` (the directory is created mode 0700).
    device
        Where tables live: ``"cuda:N"`` or ``"cpu"`` (default: as ``pystrom.defaults.device``).
    allow_uids, allow_gids
        Other users (or members of groups) the daemon serves besides its own user. With either,
        the socket is made mode 0666 and a default socket directory 0711 (others may pass through
        it, not list or change it): every connection's uid and groups are checked with
        ``SO_PEERCRED``, which is what keeps other users out. A directory above the socket that
        they cannot enter (``$XDG_RUNTIME_DIR`` is 0700) still stops them: use ``--socket`` then.
        Their clients must trust the daemon's user (``Store(..., trust_uids=[uid])``).
    memory
        ``"auto"`` (VMM file descriptors where they work, else legacy CUDA IPC), ``"vmm"`` or ``"legacy"``.
    ready
        Called with the server once it listens.
    max_connections
        Connections one user may hold open at a time (default: as many as the descriptor limit
        allows). Each connection and each host table holds a descriptor: the daemon raises its
        soft ``RLIMIT_NOFILE`` to the hard limit at start, refuses connections beyond its share
        with a clear error to that client, and refuses a put of more host tables than the
        limit allows; it never stops for lack of descriptors.
    """
    server = StoreServer(socket, device, allow_uids, allow_gids, memory, max_connections)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.stop())
    server.serve_forever(ready)


def _announce(server: StoreServer) -> None:
    extra = f" ({server.vmm_problem})" if server.vmm_problem else ""
    print(
        f"pystrom store: serving {server.backend.device} ({server.memory_kind} memory{extra}) on {server.path}",
        flush=True,
    )
    sys.stdout.flush()
