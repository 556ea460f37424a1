"""``pystrom.Store``: the client of the store daemon (``pystrom serve``)."""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import errors
from ..errors import InvalidArgumentError, IPCError, StoreError, StoreUnavailableError
from ..memory import shm
from ..memory.backend import Backend, Block, resolve_device
from . import protocol
from .handle import TableLayout
from .validate import check_table

if TYPE_CHECKING:
    from ..table import Table

__all__ = ["Store", "Reservation"]


class _VmmMapping:
    """A VMM allocation mapped into this process; unmapped when the last view is gone."""

    def __init__(self, ordinal: int, fd: int, size: int, read_only: bool):
        from . import _cuda

        _cuda.use_device(ordinal)
        self.ptr, self.read_only = _vmm(ordinal).map_fd(fd, size, read_only)
        self.size = size
        self.writable = not read_only
        fin = weakref.finalize(self, _unmap, ordinal, self.ptr, size)
        fin.atexit = False


def _unmap(ordinal: int, ptr: int, size: int) -> None:
    try:
        from . import _cuda

        _cuda.use_device(ordinal)
        _cuda.synchronize()  # no kernel may still read the memory when it goes
        _cuda.Vmm.unmap(ptr, size)
    except Exception:  # at worst the mapping lives until the process exits
        pass


@functools.cache
def _vmm(ordinal: int) -> Any:
    from ._cuda import Vmm

    return Vmm(ordinal)


def _cuda_ordinal(uuid_hex: str) -> int:
    from .export import _visible_uuids, cuda_ordinal_for_uuid

    ordinal = cuda_ordinal_for_uuid(bytes.fromhex(uuid_hex), _visible_uuids())
    if ordinal is None:
        raise IPCError(f"the store daemon's GPU (UUID {uuid_hex}) is not visible to this process")
    return ordinal


def _memory(kind: str, owner: Any, ordinal: int) -> Any:
    """The object Backend.wrap takes, over a mapping ``owner``."""
    if kind == "memfd":
        return np.frombuffer(owner, dtype=np.uint8)
    import cupy

    mem = cupy.cuda.UnownedMemory(owner.ptr, owner.size, owner, device_id=ordinal)
    return cupy.cuda.MemoryPointer(mem, 0)


class Reservation:
    """Daemon-owned memory reserved under a name, mapped here for writing; invisible until :meth:`commit`.

    Loaders fill ``block`` directly (``interop.build.build_table(..., allocate=...)``), so data
    lands in the daemon's memory without an intermediate copy. Used as a context manager, a
    reservation not committed when the block ends is given back.
    """

    def __init__(self, store: Store, name: str, entry_id: int, block: Block, replace: bool):
        self.store, self.name, self.id, self.block, self.replace = store, name, entry_id, block, replace
        self.done = False

    @property
    def nbytes(self) -> int:
        return self.block.nbytes

    def commit(self, table: Table | None = None, layout: TableLayout | None = None) -> None:
        """Make the table built in :attr:`block` visible under the name (atomically)."""
        if layout is None:
            if table is None or table._live() is not self.block:
                raise StoreError(f"commit {self.name!r}: the table must be built in this reservation's block")
            layout = TableLayout.of(table)
        if self.done:
            raise StoreError(f"reservation for {self.name!r} is already committed or aborted")
        self.block.backend.synchronize()
        if self.block.backend.kind == "cuda":
            with self.block.backend.activate():
                self.block.backend.xp.cuda.runtime.deviceSynchronize()
        else:
            # The daemon seals host memory against writes at commit, which the kernel allows only
            # once no writable mapping of it is left: ours becomes read-only here, in place.
            mapping = shm.mapping_of(self.block.memory)
            if mapping is not None and getattr(mapping, "writable", False):
                shm.make_read_only(mapping)
                mapping.writable = False
            self.block.memory.flags.writeable = False
        self.store._request(
            {
                "op": "commit",
                "id": self.id,
                "layout": layout.meta(),
                "schema": protocol.b64(layout.schema),
                "replace": self.replace,
            }
        )
        self.done = True

    def abort(self) -> None:
        if not self.done:
            self.done = True
            try:
                self.store._request({"op": "abort", "id": self.id})
            except StoreError:  # gone already: refused at commit, or the daemon went away (it frees them)
                pass

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


class Store:
    """A connection to the store daemon, which keeps named tables in its device's memory.

    Tables from :meth:`get` are zero-copy views of the daemon's memory. The daemon keeps a table's
    memory while any connection that fetched it holds a view (dropping it only hides the name), so
    keep the Store open while using its tables: closing it, or exiting, gives back all its holds.
    Safe to share between threads (requests are serialised). ``info`` holds the daemon's answer to
    the greeting, among it this user's ``uid`` and ``rights`` (``"admin"``: the daemon's own user,
    ``"write"`` or ``"read"``).

    Parameters
    ----------
    address
        The daemon's socket path; None: ``$PYSTROM_STORE_SOCKET``, else the per-user default.
    timeout
        Seconds to wait for the connection. While the daemon's backlog is full or nobody listens
        (a crowd connecting at once, a daemon restarting) the client tries again with backoff
        for ``pystrom.defaults.store_connect_retry`` seconds (at most ``timeout``), then raises
        :class:`~pystrom.errors.StoreUnavailableError`.
    trust_uids
        Users besides this one whose daemon may be trusted. Before sending anything, the client
        checks that the socket's directory belongs to this user (or a trusted one) and that no
        other user may write it, and that the process listening runs as this user (or a trusted
        one, ``SO_PEERCRED``); otherwise :class:`~pystrom.errors.StorePermissionError`.
    """

    def __init__(self, address: str | None = None, timeout: float | None = 10.0, trust_uids: Any = ()):
        self.address = address or protocol.default_socket()
        self._lock = threading.Lock()
        self._released: list[int] = []  # entry ids whose views are gone; sent with the next request
        self._maps: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._sock: Any = None
        trusted = {os.getuid(), *map(int, trust_uids)}
        protocol.check_daemon_dir(self.address, trusted)
        self._sock = protocol.connect(self.address, timeout)
        try:
            protocol.check_daemon_peer(self._sock, self.address, trusted)
            self.info, _ = self._request({"op": "hello"})
            self.info.pop("ok", None)
        except BaseException:
            self.close()
            raise

    # -- plumbing -------------------------------------------------------------------------------------

    def _request(self, message: dict) -> tuple[dict, list[int]]:
        with self._lock:
            if self._sock is None:
                raise StoreUnavailableError(f"this Store ({self.address}) is closed")
            released = []
            while self._released:  # list.pop is atomic: a finalizer appending meanwhile loses nothing
                released.append(self._released.pop())
            if released:
                message["release"] = released
            try:
                try:
                    protocol.send(self._sock, message)
                except OSError:  # the daemon may have answered (a refusal) and hung up: read that answer
                    self._sock.settimeout(1.0)
                reply, fds = protocol.recv(self._sock)
            except (EOFError, OSError) as exc:
                self._sock.close()
                self._sock = None
                raise StoreUnavailableError(
                    f"the store daemon at {self.address} went away ({type(exc).__name__}); is it still running?"
                ) from None
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            raise _remote_error(reply)
        return reply, fds

    def _map(self, entry_id: int, desc: Any, fds: list[int], writable: bool) -> tuple[Backend, Any, bool]:
        """Map the memory a reply describes (or reuse this store's live mapping of it).

        Returns the backend, the memory, and whether the kernel guarantees it can no longer change
        (a memfd sealed against writes, whose contents the daemon checked when it sealed them).
        """
        try:
            if not isinstance(desc, dict) or not isinstance(desc.get("size"), int) or desc["size"] <= 0:
                raise StoreError(f"the daemon described memory as {desc!r}")
            kind, size = desc.get("kind"), desc["size"]
            if kind in ("memfd", "vmm") and len(fds) != 1:
                raise StoreError(f"the daemon sent {len(fds)} descriptors for {kind} memory, expected 1")
            ordinal = -1 if kind == "memfd" else _cuda_ordinal(str(desc.get("uuid")))
            backend = resolve_device("cpu" if kind == "memfd" else ordinal)
            owner = self._maps.get(entry_id)
            if owner is not None and (writable <= getattr(owner, "writable", True)):
                self._released.append(entry_id)  # the daemon counted a hold for a mapping we have already
                return backend, _memory(kind, owner, ordinal), getattr(owner, "sealed", False)
            if kind == "memfd":
                fd = fds[0]
                if os.fstat(fd).st_size < size:
                    raise StoreError(f"the daemon sent {os.fstat(fd).st_size} bytes of memory, described as {size}")
                if writable:  # the reservation keeps its descriptor: commit remaps it read-only
                    owner = shm.mapping_of(shm.map_fd_owned(fd, size, str(desc.get("name"))))
                    fds.remove(fd)  # owned by the mapping now
                else:
                    owner = shm.mapping_of(shm.map_fd(fd, size, str(desc.get("name")), writable=False))
                owner.writable = writable
                owner.sealed = not writable and shm.seals(fd) & shm.FROZEN_SEALS == shm.FROZEN_SEALS
            elif kind == "vmm":
                owner = _VmmMapping(ordinal, fds[0], size, read_only=not writable)
            elif kind == "cuda_ipc":
                from .export import CudaIpcMapping, _mappings
                from .export import _lock as cache_lock

                handle = protocol.unb64(desc.get("handle"))
                with cache_lock:
                    owner = _mappings.get(("cuda", ordinal, handle))
                    if owner is None:
                        with backend.activate():
                            owner = CudaIpcMapping(ordinal, handle)
                        _mappings[("cuda", ordinal, handle)] = owner
            else:
                raise StoreError(f"the daemon sent memory of unknown kind {kind!r}")
        except BaseException:
            self._released.append(entry_id)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        self._maps[entry_id] = owner
        weakref.finalize(owner, self._released.append, entry_id)
        return backend, _memory(kind, owner, ordinal), getattr(owner, "sealed", False)

    # -- the API ---------------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        """The daemon's device, as numbered in this process."""
        info = self.info
        if info.get("memory") == "memfd":
            return "cpu"
        return f"cuda:{_cuda_ordinal(str(info.get('uuid')))}"

    def reserve(self, name: str, nbytes: int, replace: bool = False, share_with: Any = None) -> Reservation:
        """Reserve ``nbytes`` of daemon memory for a table to be called ``name``, mapped here writable.

        ``share_with`` as in :meth:`put`. Raises :class:`~pystrom.errors.StoreQuotaError` when the
        bytes would pass this user's quota or the daemon's limit.
        """
        request = {"op": "reserve", "name": name, "nbytes": int(nbytes), "replace": replace}
        sharing = _sharing(share_with)
        if sharing is not None:
            request["share_with"] = sharing
        reply, fds = self._request(request)
        backend, memory, _ = self._map(reply["id"], reply.get("memory"), fds, writable=True)
        return Reservation(self, name, reply["id"], backend.wrap(memory, int(nbytes)), replace)

    def put(self, name: str, table: Table, replace: bool = False, share_with: Any = None) -> None:
        """Copy ``table`` into daemon memory under ``name`` (one copy of its allocation).

        The name becomes visible only once every byte is there; a client that dies midway leaves
        nothing. Raises :class:`~pystrom.errors.TableExistsError` when the name is taken, unless
        ``replace=True`` (readers of the old table keep it until they let go).

        The table belongs to this user: only this user and the daemon's may replace or drop it.
        ``share_with`` names the other users who may list and get it: uids, or ``"all"`` (every
        user the daemon serves); None (default) keeps it private. A user the daemon serves as a
        reader cannot put (:class:`~pystrom.errors.StorePermissionError`).
        """
        from .. import _ops

        source = table if table._is_whole() else _ops.gather(table, None)  # a view: compact it first
        src = source._live()
        layout = TableLayout.of(source)  # refuses what a handle cannot describe before anything is reserved
        with self.reserve(name, src.nbytes, replace, share_with) as res:
            _copy_block(src, res.block)
            res.commit(layout=layout)

    def put_arrow(self, name: str, data: Any, replace: bool = False, share_with: Any = None) -> None:
        """Load Arrow data (as ``Table.from_arrow`` takes) straight into daemon memory under ``name``
        (``replace`` and ``share_with`` as in :meth:`put`)."""
        from ..interop.arrow_import import as_arrow_table, columns_of
        from ..interop.build import build_table

        arrow = as_arrow_table(data)
        reservation: list[Reservation] = []

        def allocate(nbytes: int) -> Block:
            reservation.append(self.reserve(name, nbytes, replace, share_with))
            return reservation[0].block

        try:
            table = build_table(
                resolve_device(self.device), columns_of(arrow), arrow.schema.metadata, arrow.num_rows, allocate
            )
            reservation[0].commit(table)
        finally:
            if reservation:
                reservation[0].abort()

    def get(self, name: str) -> Table:
        """The table named ``name``: a zero-copy view of the daemon's memory (treat it as read-only)."""
        reply, fds = self._request({"op": "get", "name": name})
        entry_id = reply["id"]
        try:
            layout = TableLayout.from_meta(reply.get("layout"), protocol.unb64(reply.get("schema")), f"table {name!r}")
        except BaseException:
            for fd in fds:
                os.close(fd)
            self._released.append(entry_id)
            raise
        backend, memory, sealed = self._map(entry_id, reply.get("memory"), fds, writable=False)
        where = f"store table {name!r}"
        block = backend.wrap(memory, layout.nbytes)
        table = layout.table(block, where)
        if not sealed:  # GPU memory (its writer may still write) or a daemon that did not seal: check here
            check_table(table, where)
            block.others_may_write = True  # and again wherever offsets are followed later
        return table

    def list(self) -> list[dict[str, Any]]:
        """The tables this user may read: name, nbytes, num_rows, device (the daemon's), schema (pyarrow),
        created, owner (uid) and shared_with (uids, or ``"all"``)."""
        import pyarrow as pa

        reply, _ = self._request({"op": "list"})
        out = []
        for t in reply["tables"]:
            t = dict(t)
            t["schema"] = pa.ipc.read_schema(pa.py_buffer(protocol.unb64(t["schema"])))
            out.append(t)
        return out

    def drop(self, name: str) -> None:
        """Remove ``name``; its memory is freed once no client holds a view of it. Only the table's owner
        and the daemon's user may drop it (else :class:`~pystrom.errors.StorePermissionError`)."""
        self._request({"op": "drop", "name": name})

    def stats(self) -> dict[str, Any]:
        """The daemon's counters: tables and bytes, dropped tables still in use, pending puts, clients."""
        reply, _ = self._request({"op": "stats"})
        reply.pop("ok", None)
        return reply

    def close(self) -> None:
        """Disconnect; the daemon gives back every hold of this connection."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._sock is None else f"daemon pid {self.info.get('pid')}, {self.info.get('device')}"
        return f"<pystrom.Store {self.address}: {state}>"


def _sharing(share_with: Any) -> list[int] | str | None:
    """``share_with`` as the daemon takes it: None (private), "all", or a list of uids."""
    if share_with is None:
        return None
    if isinstance(share_with, str):
        if share_with != "all":
            raise InvalidArgumentError(f"share_with is 'all' or a list of uids; got {share_with!r}")
        return "all"
    try:
        uids = list(share_with)
    except TypeError:
        raise InvalidArgumentError(f"share_with is 'all' or a list of uids; got {share_with!r}") from None
    for uid in uids:
        if not isinstance(uid, (int, np.integer)) or isinstance(uid, bool) or uid < 0:
            raise InvalidArgumentError(f"share_with: a uid is a non-negative integer; got {uid!r}")
    return [int(u) for u in uids] or None


def _copy_block(src: Block, dst: Block) -> None:
    """Copy all of ``src`` to the start of ``dst`` (which may be on another device)."""
    n = src.nbytes
    s_kind, d_kind = src.backend.kind, dst.backend.kind
    if s_kind == "cuda" and d_kind == "cuda":
        dst.write_device(0, src.array(0, np.uint8, (n,)))
    elif d_kind == "cuda":
        dst.write_host_many([(0, src.read_host(0, n))])
    else:
        src.read_host_many([(dst.read_host(0, n), 0)])


def _remote_error(reply: dict) -> Exception:
    name, message = reply.get("error"), str(reply.get("message", "the store daemon refused the request"))
    cls = getattr(errors, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, errors.Error)):
        cls = StoreError
    return cls(message)
