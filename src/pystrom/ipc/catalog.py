"""What the store daemon holds: its memory (which kind it hands out, each allocation) and the catalog
(allocations by id, tables by name, and every connection's holds on them).

Host tables are memfds (passed to clients with SCM_RIGHTS; readers get a new read-only
descriptor). GPU tables are CUDA VMM allocations exported as POSIX file descriptors where the
driver supports them (only a process that received the descriptor can map the memory), else
legacy CUDA IPC handles (a capability: see docs/ipc.md).
"""

from __future__ import annotations

import collections
import itertools
import mmap
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import StoreError
from ..memory import shm
from ..memory.backend import Backend
from . import protocol
from .admission import Quota, Sharing

__all__ = ["DaemonMemory", "Allocation", "Entry", "Catalog"]


class DaemonMemory:
    """The kind of memory one daemon hands out on its backend (``memory``: "auto", "vmm" or "legacy")."""

    def __init__(self, backend: Backend, memory: str = "auto"):
        self.backend = backend
        self.vmm: Any = None
        self.vmm_problem: str | None = None
        if backend.kind == "cpu":
            if not shm.HAVE_MEMFD:
                raise StoreError("the CPU store needs Linux memfd (os.memfd_create)")
            self.kind, self.uuid_hex = "memfd", ""
            return
        from . import _cuda

        _cuda.use_device(backend.ordinal)
        self.uuid_hex = _cuda.device_uuid(backend.ordinal).hex()
        if memory not in ("auto", "vmm", "legacy"):
            raise StoreError(f"memory must be 'auto', 'vmm' or 'legacy'; got {memory!r}")
        if memory != "legacy":
            self.vmm_problem = _cuda.vmm_probe(backend.ordinal)
            if self.vmm_problem is None:
                self.vmm = _cuda.Vmm(backend.ordinal)
            elif memory == "vmm":
                raise StoreError(f"CUDA VMM with file descriptors does not work here: {self.vmm_problem}")
        self.kind = "vmm" if self.vmm is not None else "cuda_ipc"

    def footprint(self, nbytes: int) -> int:
        """The bytes an allocation of ``nbytes`` takes, as quotas count it: whole pages of a memfd. GPU
        memory is counted as asked for now (VMM rounds to 2 MiB granules: counting those waits for a
        run of the GPU store tests)."""
        if self.kind == "memfd":
            return -(-max(nbytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        return nbytes

    def allocate(self, nbytes: int) -> Allocation:
        return Allocation(self, nbytes)


class Allocation:
    """Memory the daemon owns: a memfd, a VMM allocation or a cudaMalloc block."""

    def __init__(self, memory: DaemonMemory, nbytes: int):
        self.kind = memory.kind
        self.ordinal = memory.backend.ordinal
        self.uuid = memory.uuid_hex
        if self.kind == "memfd":
            self.fd, self.name = shm.create_fd(max(nbytes, 1))
            self.size = max(nbytes, 1)
        elif self.kind == "vmm":
            self.handle, self.size = memory.vmm.create(nbytes)
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
class Entry:
    """One allocation: reserved (pending), bound to a name (live), or dropped and still held."""

    id: int
    name: str
    alloc: Allocation
    conn: int  # connection that reserved it (only it may commit or abort)
    uid: int  # the table's owner: the uid that put it
    charged: int  # bytes counted against the owner's quota until the memory is freed
    sharing: Sharing = Sharing()
    state: str = "pending"  # pending -> live -> dropped
    meta: dict | None = None
    schema: bytes = b""
    holds: collections.Counter = field(default_factory=collections.Counter)  # connection id -> holds
    created: float = field(default_factory=time.time)


class Catalog:
    """Allocations by id and live tables by name; memory is freed when a dropped entry's last hold goes.

    Every method is called with the server's lock held.
    """

    def __init__(self, quota: Quota):
        self.quota = quota
        self.entries: dict[int, Entry] = {}
        self.names: dict[str, Entry] = {}
        self._ids = itertools.count(1)

    def add(self, name: str, alloc: Allocation, conn: int, uid: int, charged: int, sharing: Sharing) -> Entry:
        entry = Entry(next(self._ids), name, alloc, conn, uid, charged, sharing)
        entry.holds[conn] += 1
        self.entries[entry.id] = entry
        return entry

    def pending(self, cid: int, entry_id: Any) -> Entry:
        entry = self.entries.get(entry_id) if isinstance(entry_id, int) else None
        if entry is None or entry.state != "pending" or entry.conn != cid:
            raise StoreError(f"no reservation {entry_id!r} of this connection is pending")
        return entry

    def bind(self, entry: Entry, meta: dict, schema: bytes) -> None:
        """Make a pending entry the table of its name (the old table of that name is dropped)."""
        old = self.names.get(entry.name)
        if old is not None:
            self.unbind(old)
        entry.meta, entry.schema, entry.state = meta, schema, "live"
        self.names[entry.name] = entry

    def unbind(self, entry: Entry) -> None:
        if self.names.get(entry.name) is entry:
            del self.names[entry.name]
        entry.state = "dropped"
        self.maybe_free(entry)

    def maybe_free(self, entry: Entry) -> None:
        if entry.state == "dropped" and not entry.holds and self.entries.pop(entry.id, None) is not None:
            self.quota.refund(entry.uid, entry.charged)
            entry.alloc.free()

    def release(self, cid: int, ids: list) -> None:
        """Give back one hold of connection ``cid`` on each entry of ``ids`` (views gone)."""
        for entry_id in ids:
            entry = self.entries.get(entry_id) if isinstance(entry_id, int) else None
            if entry is not None and entry.holds[cid] > 0:
                entry.holds[cid] -= 1
                if not entry.holds[cid]:
                    del entry.holds[cid]
                self.maybe_free(entry)

    def disconnect(self, cid: int) -> None:
        """Every hold of a closed connection goes; its pending puts are dropped (it died, or gave up, mid-put)."""
        for entry in list(self.entries.values()):
            entry.holds.pop(cid, None)
            if entry.state == "pending" and entry.conn == cid:
                entry.state = "dropped"
            self.maybe_free(entry)

    def free_all(self) -> None:
        for entry in self.entries.values():
            try:
                entry.alloc.free()
            except Exception:  # the daemon is stopping: free what can be freed
                pass
        self.entries.clear()
        self.names.clear()

    def counts(self) -> dict[str, int]:
        live = list(self.names.values())
        dropped = [e for e in self.entries.values() if e.state == "dropped"]
        return {
            "tables": len(live),
            "table_bytes": sum(e.alloc.size for e in live),
            "dropped_in_use": len(dropped),
            "dropped_bytes": sum(e.alloc.size for e in dropped),
            "pending_puts": sum(e.state == "pending" for e in self.entries.values()),
            "allocations": len(self.entries),
            "allocated_bytes": sum(e.alloc.size for e in self.entries.values()),
        }
