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
import itertools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import _shm
from .._backend import Backend, resolve_device
from ..errors import Error, InvalidHandleError, StoreError, StorePermissionError, TableExistsError, TableNotFoundError
from . import protocol
from .handle import TableLayout

__all__ = ["serve", "StoreServer"]

MAX_NAME = 256


class _Allocation:
    """Memory the daemon owns: a memfd, a VMM allocation or a cudaMalloc block."""

    def __init__(self, server: StoreServer, nbytes: int):
        self.kind = server.memory_kind
        self.ordinal = server.backend.ordinal
        self.uuid = server.uuid_hex
        if self.kind == "memfd":
            self.fd, self.name = _shm.create_fd(max(nbytes, 1))
            self.size = max(nbytes, 1)
        elif self.kind == "vmm":
            self.handle, self.size = server.vmm.create(nbytes)
        else:
            import cupy

            self.size = max(nbytes, 1)
            self.ptr = int(cupy.cuda.runtime.malloc(self.size))
            from ._cuda import ipc_export

            self.ipc = ipc_export(self.ptr)

    def descriptor(self) -> tuple[dict, list[int]]:
        """What a client needs to map this memory, and descriptors to send with it (closed after sending)."""
        desc: dict[str, Any] = {"kind": self.kind, "size": self.size, "uuid": self.uuid}
        if self.kind == "memfd":
            desc["name"] = self.name
            return desc, [os.dup(self.fd)]
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
    ):
        self.backend = resolve_device(device)
        self.path = socket_path or protocol.default_socket()
        self.allow_uids = {os.getuid(), *map(int, allow_uids)}
        self.allow_gids = set(map(int, allow_gids))
        self.lock = threading.Lock()
        self.entries: dict[int, _Entry] = {}
        self.names: dict[str, _Entry] = {}
        self.clients: set[int] = set()
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self.vmm: Any = None
        self.vmm_problem: str | None = None
        if self.backend.kind == "cpu":
            if not _shm.HAVE_MEMFD:
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
            protocol.secure_dir(directory)  # the default place: only this user may enter it
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
            sock.listen(64)
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
                except OSError:
                    if self._stop.is_set():
                        break
                    raise
                conn.settimeout(None)
                threading.Thread(target=self._connection, args=(conn,), daemon=True).start()
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
            if self.backend.kind == "cuda":
                from . import _cuda

                _cuda.use_device(self.backend.ordinal)
            with self.lock:
                self.clients.add(cid)
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
            self._disconnect(cid)

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
        alloc = _Allocation(self, nbytes)  # outside the lock: may take a while
        with self.lock:
            entry = _Entry(next(self._ids), name, alloc, cid)
            entry.holds[cid] += 1
            self.entries[entry.id] = entry
        desc, fds = alloc.descriptor()
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
            old = self.names.get(entry.name)
            if old is not None:
                if not req.get("replace"):
                    raise TableExistsError(f"the store already has a table named {entry.name!r} (use replace=True)")
                self._unbind(old)
            entry.meta, entry.schema, entry.state = layout.meta(), schema, "live"
            self.names[entry.name] = entry
        return {}, []

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
        desc, fds = entry.alloc.descriptor()
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
            }
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

    def _disconnect(self, cid: int) -> None:
        with self.lock:
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
        Other users (or members of groups) the daemon serves besides its own user. They also need
        access to the socket's directory, which the default one does not give.
    memory
        ``"auto"`` (VMM file descriptors where they work, else legacy CUDA IPC), ``"vmm"`` or ``"legacy"``.
    ready
        Called with the server once it listens.
    """
    server = StoreServer(socket, device, allow_uids, allow_gids, memory)
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
