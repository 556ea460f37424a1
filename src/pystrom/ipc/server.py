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

Who may do what, how many connections and bytes each user gets: :mod:`.admission`.

Memory: CUDA VMM allocations exported as POSIX file descriptors (passed with SCM_RIGHTS, so only
processes the daemon answered can map them) where the driver supports them, else legacy CUDA IPC
handles (a capability: see docs/ipc.md); on the CPU backend, memfd descriptors.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import Error, InvalidHandleError, StoreError, StorePermissionError, TableExistsError, TableNotFoundError
from ..memory import shm
from ..memory.backend import Backend, resolve_device
from . import protocol
from .admission import (
    Connections,
    Grants,
    Quota,
    default_max_bytes,
    parse_share_with,
    raise_descriptor_limit,
)
from .catalog import Catalog, DaemonMemory, Entry
from .handle import TableLayout

__all__ = ["serve", "StoreServer", "raise_descriptor_limit"]

MAX_NAME = 256


@dataclass(frozen=True)
class _Peer:
    """One connection: its id, the uid at the other end (SO_PEERCRED) and that uid's rights."""

    cid: int
    uid: int
    rights: str


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
        *,
        readers: Iterable[int] = (),
        writers: Iterable[int] = (),
        max_bytes: int | None = None,
        max_bytes_per_uid: int | None = None,
    ):
        self.backend = resolve_device(device)
        self.path = socket_path or protocol.default_socket()
        # allow_uids (before roles existed, every right) now grants what --writers does
        self.grants = Grants(readers, [*map(int, allow_uids), *map(int, writers)], allow_gids)
        self.others = self.grants.others
        self.lock = threading.Lock()
        # Descriptors: each connection holds one, each host table one. Both are capped so that the
        # daemon always keeps some for itself (accepting, sealing, sending) and never meets EMFILE.
        self.fd_limit = raise_descriptor_limit()
        self.connections = Connections(self.grants.owner, self.fd_limit, max_connections)
        self.max_host_tables = self.connections.max_host_tables
        self.quota = Quota(self.grants.owner, max_bytes or default_max_bytes(self.backend), max_bytes_per_uid)
        self.catalog = Catalog(self.quota)
        self.entries, self.names = self.catalog.entries, self.catalog.names
        self._stop = threading.Event()
        self.memory = DaemonMemory(self.backend, memory)
        self.memory_kind, self.uuid_hex = self.memory.kind, self.memory.uuid_hex
        self.vmm_problem = self.memory.vmm_problem

    # -- socket -----------------------------------------------------------------------------------

    def bind(self) -> socket.socket:
        return protocol.listen(self.path, self.others)

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

    def _connection(self, conn: socket.socket) -> None:
        cid = id(conn)
        uid = -1
        try:
            pid, uid, gid = protocol.peer_credentials(conn)
            rights = self.grants.rights(uid, gid, pid)
            if rights is None:
                refused = StorePermissionError(
                    f"uid {uid} is not allowed by this store daemon (its user grants access with "
                    "`pystrom serve --readers UIDS` or `--writers UIDS`)"
                )
                protocol.send(conn, _error(refused))
                conn.settimeout(2.0)  # let the client's first request arrive, so closing resets nothing it sent
                try:
                    _, fds = protocol.recv(conn)
                    for fd in fds:
                        os.close(fd)
                except (EOFError, OSError):
                    pass
                return
            with self.lock:
                refusal = self.connections.admit(cid, uid)
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
            peer = _Peer(cid, uid, rights)
            while True:
                try:
                    request, fds = protocol.recv(conn)
                except (EOFError, ConnectionError, OSError):
                    return
                for fd in fds:  # clients never send descriptors
                    os.close(fd)
                reply, out_fds = self._dispatch(peer, request)
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

    def _dispatch(self, peer: _Peer, request: dict) -> tuple[dict, list[int]]:
        op = request.get("op")
        handler = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
        try:
            self._release(peer.cid, request.get("release", []))
            if handler is None:
                raise StoreError(f"unknown request {op!r}")
            reply, fds = handler(peer, request)
        except Error as exc:
            return _error(exc), []
        except Exception as exc:  # a bug or a driver failure: report it, keep serving
            return _error(StoreError(f"{op} failed in the daemon: {type(exc).__name__}: {exc}")), []
        reply["ok"] = True
        return reply, fds

    # -- requests -----------------------------------------------------------------------------------

    def _op_hello(self, peer: _Peer, req: dict) -> tuple[dict, list[int]]:
        info = {"protocol": protocol.PROTOCOL, "pid": os.getpid(), "device": self.backend.device}
        info.update(memory=self.memory_kind, uuid=self.uuid_hex, uid=peer.uid, rights=peer.rights)
        info.update(owner=self.grants.owner)
        return info, []

    def _op_reserve(self, peer: _Peer, req: dict) -> tuple[dict, list[int]]:
        name = _name(req.get("name"))
        nbytes = req.get("nbytes")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or not 0 < nbytes < 1 << 50:
            raise StoreError(f"reserve {name!r}: nbytes must be a positive integer; got {nbytes!r}")
        self.grants.check_put(peer.uid, peer.rights, name)
        sharing = parse_share_with(req.get("share_with"), f"reserve {name!r}")
        with self.lock:
            self._check_name(peer, name, bool(req.get("replace")))
            if self.memory_kind == "memfd" and len(self.entries) >= self.max_host_tables:
                raise StoreError(
                    f"reserve {name!r}: the store daemon holds {len(self.entries)} host tables (dropped ones still "
                    f"in use and pending puts included), as many as its descriptor limit ({self.fd_limit}) allows: "
                    "each holds one descriptor; drop tables, or restart the daemon with a higher `ulimit -n`"
                )
            # what the memory will take (pages, granules), not what was asked: else many small tables
            # could hold far more than the quota; charged before allocating, so concurrent reserves see it
            charged = self.memory.footprint(nbytes)
            self.quota.charge(peer.uid, charged, name, asked=nbytes)
        try:
            alloc = self.memory.allocate(nbytes)  # outside the lock: may take a while
        except BaseException:
            with self.lock:
                self.quota.refund(peer.uid, charged)
            raise
        with self.lock:
            entry = self.catalog.add(name, alloc, peer.cid, peer.uid, charged, sharing)
        desc, fds = alloc.descriptor(writable=True)
        return {"id": entry.id, "memory": desc}, fds

    def _check_name(self, peer: _Peer, name: str, replace: bool) -> None:
        """A put of ``name`` may go ahead: the name is free, or replaced by its owner (or the daemon's user)."""
        old = self.names.get(name)
        if old is None:
            return
        if not replace:
            raise TableExistsError(f"the store already has a table named {name!r} (use replace=True)")
        self.grants.check_owner(peer.uid, peer.rights, "replace", name, old.uid)

    def _op_commit(self, peer: _Peer, req: dict) -> tuple[dict, list[int]]:
        with self.lock:
            entry = self.catalog.pending(peer.cid, req.get("id"))
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
            entry = self.catalog.pending(peer.cid, req.get("id"))
            self._check_name(peer, entry.name, bool(req.get("replace")))  # again: another put may have come first
            self.catalog.bind(entry, layout.meta(), schema)
        return {}, []

    def _seal_and_check(self, entry: Entry, layout: TableLayout) -> None:
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
                self.catalog.maybe_free(entry)
            raise

    def _op_abort(self, peer: _Peer, req: dict) -> tuple[dict, list[int]]:
        with self.lock:
            entry = self.catalog.pending(peer.cid, req.get("id"))
            entry.state = "dropped"
            self.catalog.maybe_free(entry)
        return {}, []

    def _op_get(self, peer: _Peer, req: dict) -> tuple[dict, list[int]]:
        name = _name(req.get("name"))
        with self.lock:
            entry = self.names.get(name)
            if entry is None:
                raise TableNotFoundError(f"the store has no table named {name!r}")
            self.grants.check_read(peer.uid, peer.rights, name, entry.uid, entry.sharing)
            entry.holds[peer.cid] += 1
        desc, fds = entry.alloc.descriptor(writable=False)
        return {"id": entry.id, "memory": desc, "layout": entry.meta, "schema": protocol.b64(entry.schema)}, fds

    def _op_list(self, peer: _Peer, req: dict) -> tuple[dict, list[int]]:
        with self.lock:
            tables = [
                {
                    "name": e.name,
                    "nbytes": e.meta["nbytes"],
                    "num_rows": e.meta["num_rows"],
                    "device": self.backend.device,
                    "schema": protocol.b64(e.schema),
                    "created": e.created,
                    "owner": e.uid,
                    "shared_with": e.sharing.wire(),
                }
                for e in self.names.values()
                if self.grants.may_read(peer.uid, peer.rights, e.uid, e.sharing)  # others' private tables: unseen
            ]
        return {"tables": tables}, []

    def _op_drop(self, peer: _Peer, req: dict) -> tuple[dict, list[int]]:
        name = _name(req.get("name"))
        with self.lock:
            entry = self.names.get(name)
            if entry is None:
                raise TableNotFoundError(f"the store has no table named {name!r}")
            self.grants.check_owner(peer.uid, peer.rights, "drop", name, entry.uid)
            self.catalog.unbind(entry)
            deferred = entry.id in self.entries
        return {"deferred": deferred}, []

    def _op_stats(self, peer: _Peer, req: dict) -> tuple[dict, list[int]]:
        with self.lock:
            stats = {
                "pid": os.getpid(),
                "device": self.backend.device,
                "memory": self.memory_kind,
                "vmm_problem": self.vmm_problem,
                "uid": peer.uid,
                "rights": peer.rights,
                **self.catalog.counts(),
                **self.connections.stats(),
                **self.quota.stats(peer.uid),
            }
            if self.memory_kind == "memfd":
                stats["max_tables"] = self.max_host_tables
        if self.backend.kind == "cuda":
            import cupy

            free, total = cupy.cuda.runtime.memGetInfo()
            stats.update(device_free_bytes=int(free), device_total_bytes=int(total))
        return stats, []

    # -- bookkeeping --------------------------------------------------------------------------------------

    def _release(self, cid: int, ids: Any) -> None:
        if isinstance(ids, list) and ids:
            with self.lock:
                self.catalog.release(cid, ids)

    def _disconnect(self, cid: int, uid: int) -> None:
        with self.lock:
            if uid != -1:
                self.connections.leave(cid, uid)
            self.catalog.disconnect(cid)

    def _free_all(self) -> None:
        with self.lock:
            self.catalog.free_all()


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
    *,
    readers: Iterable[int] = (),
    writers: Iterable[int] = (),
    max_bytes: int | None = None,
    max_bytes_per_uid: int | None = None,
) -> None:
    """Run the store daemon until SIGTERM/SIGINT (or ``StoreServer.stop()`` from ``ready``'s server).

    Parameters
    ----------
    socket
        Socket path; None: ``$PYSTROM_STORE_SOCKET``, else ``$XDG_RUNTIME_DIR/pystrom/store.sock``,
        else ``/tmp/pystrom-<uid>/store.sock`` (the directory is created mode 0700).
    device
        Where tables live: ``"cuda:N"`` or ``"cpu"`` (default: as ``pystrom.defaults.device``).
    readers, writers
        Other users served besides the daemon's own (who may do everything): readers list and get
        the tables shared with them, writers also put tables of their own and replace or drop
        those. A table is private to the uid that put it unless its put names readers
        (``Store.put(..., share_with=...)``). With other users the socket is made mode 0666 and a
        default socket directory 0711; ``SO_PEERCRED`` decides whom the daemon serves. Their
        clients must trust the daemon's user (``Store(..., trust_uids=[uid])``). See
        :mod:`pystrom.ipc.admission` and docs/ipc.md.
    allow_uids
        Deprecated: the same as ``writers`` (it once granted every right, on every table).
    allow_gids
        Groups whose members (primary or supplementary) are served as writers.
    memory
        ``"auto"`` (VMM file descriptors where they work, else legacy CUDA IPC), ``"vmm"`` or ``"legacy"``.
    ready
        Called with the server once it listens.
    max_connections
        Connections one user may hold open (default: the daemon's user as many as the descriptor
        limit allows, each other user a quarter of what is left once an eighth is kept for the
        daemon's user). Connections beyond a cap are refused with a clear error; the daemon never
        stops for lack of descriptors.
    max_bytes, max_bytes_per_uid
        The most bytes of tables the daemon holds (default: 3/4 of the host's memory, or of its
        cgroup's limit, on the CPU; 9/10 of the GPU's) and each other user may hold (default: a
        quarter of ``max_bytes``). A reservation beyond either is refused before anything is
        allocated (:class:`~pystrom.errors.StoreQuotaError`, naming the sizes).
    """
    if allow_uids:
        warnings.warn(
            "serve(allow_uids=...) is deprecated: it now means writers=... (put tables of their own, read "
            "tables shared with them); pass readers= and writers=",
            DeprecationWarning,
            stacklevel=2,
        )
    limits = {"max_bytes": max_bytes, "max_bytes_per_uid": max_bytes_per_uid}
    server = StoreServer(socket, device, allow_uids, allow_gids, memory, max_connections, readers=readers,
                         writers=writers, **limits)  # fmt: skip
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
