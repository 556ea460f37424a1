"""Whom the store daemon serves, what each may do, and how much: rights, connection caps, byte quotas.

**Rights.** The daemon's own user (its *owner*) may do everything, to every table. Other users are
served only when granted: ``readers`` may list and get the tables shared with them; ``writers`` may
also put tables of their own (and replace or drop those). Every table has an owner, the uid that put
it: only that uid and the daemon's own may replace or drop it. A table is private unless its put
named readers (``share_with``: uids, or ``"all"`` for every user the daemon serves). A refused
request raises :class:`~pystrom.errors.StorePermissionError` naming the table and the missing right.

**Connections.** Each connection holds a descriptor and a thread. The daemon serves at most
``max_clients`` of them (half of what its descriptor limit leaves once it keeps some for itself);
an eighth of those are kept for its own user, so other users together can never lock it out, and
each other user may hold at most ``max_per_uid`` (a quarter of the rest unless ``--max-connections``
says otherwise, which then caps the owner too).

**Bytes.** Every allocation counts against the uid that reserved it and against the total until it
is freed (a dropped table still held by a reader still counts). The total defaults to three
quarters of the machine's memory (or of the cgroup's limit) for host tables and nine tenths of the
GPU's memory for device tables; each other user may hold a quarter of it. Checked when memory is
reserved, before anything is allocated: a refusal (:class:`~pystrom.errors.StoreQuotaError`) names
the sizes.

Every method here is called with the server's lock held.
"""

from __future__ import annotations

import collections
import os
import resource
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import StoreError, StorePermissionError, StoreQuotaError

__all__ = [
    "ADMIN",
    "WRITE",
    "READ",
    "Grants",
    "Sharing",
    "Connections",
    "Quota",
    "default_max_bytes",
    "raise_descriptor_limit",
    "parse_share_with",
]

ADMIN, WRITE, READ = "admin", "write", "read"
RESERVED_FDS = 32  # descriptors the daemon keeps for itself: stdio, the listener, sealing, sending, libraries
MAX_CLIENTS = 4096  # connections at most (one thread each), whatever the descriptor limit
MAX_SHARED = 4096  # uids one table may name as readers
_UID_MAX = (1 << 32) - 2  # (uid_t)-1 means "no uid"


def _uids(values: Iterable[Any], what: str) -> frozenset[int]:
    out = set()
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _UID_MAX:
            raise StoreError(f"{what}: a uid is an integer between 0 and {_UID_MAX}; got {v!r}")
        out.add(v)
    return frozenset(out)


@dataclass(frozen=True)
class Sharing:
    """Who besides its owner may read one table: some uids, or everyone the daemon serves."""

    uids: frozenset[int] = frozenset()
    everyone: bool = False

    def wire(self) -> list[int] | str:
        return "all" if self.everyone else sorted(self.uids)


def parse_share_with(value: Any, where: str) -> Sharing:
    """``share_with`` of a put, as the client sends it: a list of uids, ``"all"``, or nothing (private)."""
    if value is None:
        return Sharing()
    if value == "all":
        return Sharing(everyone=True)
    if not isinstance(value, list) or len(value) > MAX_SHARED:
        raise StoreError(f"{where}: share_with is a list of at most {MAX_SHARED} uids or 'all'; got {value!r:.200}")
    return Sharing(_uids(value, f"{where}: share_with"))


class Grants:
    """The rights of each uid: the daemon's owner, its readers and writers (and groups of writers)."""

    def __init__(self, readers: Iterable[int] = (), writers: Iterable[int] = (), gids: Iterable[int] = ()):
        self.owner = os.getuid()
        self.writers = _uids(writers, "writers") - {self.owner}
        self.readers = _uids(readers, "readers") - self.writers - {self.owner}
        self.gids = frozenset(map(int, gids))

    @property
    def others(self) -> bool:
        """Whether anyone besides the owner is served (the socket must then be reachable by others)."""
        return bool(self.readers or self.writers or self.gids)

    def rights(self, uid: int, gid: int, pid: int) -> str | None:
        """ADMIN, WRITE or READ for a connecting process, or None: not served."""
        if uid == self.owner:
            return ADMIN
        if uid in self.writers:
            return WRITE
        if self.gids and (gid in self.gids or self.gids & _groups(pid)):
            return WRITE
        if uid in self.readers:
            return READ
        return None

    # -- per request ------------------------------------------------------------------------------------

    def may_read(self, uid: int, rights: str, owner: int, sharing: Sharing) -> bool:
        return rights == ADMIN or uid == owner or sharing.everyone or uid in sharing.uids

    def check_read(self, uid: int, rights: str, name: str, owner: int, sharing: Sharing) -> None:
        if not self.may_read(uid, rights, owner, sharing):
            raise StorePermissionError(
                f"uid {uid} may not read table {name!r} (missing right: read): it belongs to uid {owner} and is not "
                f"shared with uid {uid}; its owner shares it with put(..., share_with=[{uid}]) or share_with='all'"
            )

    def check_put(self, uid: int, rights: str, name: str) -> None:
        if rights == READ:
            raise StorePermissionError(
                f"uid {uid} may not put table {name!r} (missing right: write): the store daemon serves it as a "
                "reader; its owner grants puts with `pystrom serve --writers UIDS`"
            )

    def check_owner(self, uid: int, rights: str, verb: str, name: str, owner: int) -> None:
        """Only a table's owner and the daemon's own user may replace or drop it."""
        if rights != ADMIN and uid != owner:
            raise StorePermissionError(
                f"uid {uid} may not {verb} table {name!r} (missing right: owner): it belongs to uid {owner}; "
                f"only its owner or the store daemon's user (uid {self.owner}) may replace or drop it"
            )


def _groups(pid: int) -> set[int]:
    """Supplementary groups of a process (SO_PEERCRED gives only the primary one)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return set(map(int, line.split()[1:]))
    except (OSError, ValueError):
        pass
    return set()


class Connections:
    """Open connections per uid: a total cap, a share kept for the owner, and a cap per other uid."""

    def __init__(self, owner: int, fd_limit: int, max_per_uid: int | None):
        if max_per_uid is not None and max_per_uid < 1:
            raise StoreError(f"max_connections must be at least 1; got {max_per_uid}")
        spare = max(fd_limit - RESERVED_FDS, 8)
        self.owner, self.fd_limit = owner, fd_limit
        self.max_clients = max(min(spare // 2, MAX_CLIENTS), 4)  # the other half of the spare: host tables
        self.max_host_tables = max(spare - self.max_clients, 4)
        self.owner_reserve = max(self.max_clients // 8, 1)
        others = self.max_clients - self.owner_reserve
        self.max_per_uid = min(max_per_uid or max(others // 4, 1), others)
        self.max_owner = min(max_per_uid or self.max_clients, self.max_clients)
        self.open: set[int] = set()
        self.per_uid: collections.Counter = collections.Counter()

    def admit(self, cid: int, uid: int) -> str | None:
        """Count a new connection of ``uid``, or say why it is refused."""
        n = self.per_uid[uid]
        cap = self.max_owner if uid == self.owner else self.max_per_uid
        if n >= cap:
            return (
                f"too many connections from uid {uid}: {n} open, the store daemon serves at most {cap} per user "
                "(close some Stores, or raise --max-connections)"
            )
        if len(self.open) >= self.max_clients:
            return (
                f"too many connections: the store daemon serves {len(self.open)}, as many as its descriptor limit "
                f"({self.fd_limit}) allows; close some Stores or raise `ulimit -n`"
            )
        others = len(self.open) - self.per_uid[self.owner]
        if uid != self.owner and others >= self.max_clients - self.owner_reserve:
            return (
                f"too many connections: other users hold {others} of the store daemon's {self.max_clients}, and "
                f"{self.owner_reserve} are kept for its own user (uid {self.owner}); try again later"
            )
        self.open.add(cid)
        self.per_uid[uid] += 1
        return None

    def leave(self, cid: int, uid: int) -> None:
        if cid in self.open:
            self.open.discard(cid)
            self.per_uid[uid] -= 1
            if not self.per_uid[uid]:
                del self.per_uid[uid]

    def stats(self) -> dict[str, int]:
        return {
            "clients": len(self.open),
            "descriptor_limit": self.fd_limit,
            "max_connections": self.max_clients,
            "max_connections_per_uid": self.max_per_uid,
            "connections_kept_for_owner": self.owner_reserve,
        }


class Quota:
    """Bytes held per uid and in total, charged when memory is reserved and given back when it is freed."""

    def __init__(self, owner: int, max_bytes: int, max_bytes_per_uid: int | None):
        for what, value in (("max_bytes", max_bytes), ("max_bytes_per_uid", max_bytes_per_uid)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise StoreError(f"{what} must be a positive number of bytes; got {value!r}")
        self.owner = owner
        self.max_bytes = max_bytes
        self.max_per_uid = min(max_bytes_per_uid or max(max_bytes // 4, 1), max_bytes)
        self.used = 0
        self.per_uid: collections.Counter = collections.Counter()

    def limit(self, uid: int) -> int:
        return self.max_bytes if uid == self.owner else self.max_per_uid

    def charge(self, uid: int, nbytes: int, name: str, asked: int | None = None) -> None:
        """Count ``nbytes`` (the memory's footprint of the ``asked`` bytes) for ``uid``, or raise
        StoreQuotaError naming the sizes."""
        mine, cap = self.per_uid[uid], self.limit(uid)
        size = f"{nbytes:,} bytes" if asked in (None, nbytes) else f"{asked:,} bytes ({nbytes:,} in whole pages)"
        if uid != self.owner and mine + nbytes > cap:
            raise StoreQuotaError(
                f"reserve {name!r}: {size} would take uid {uid} past its quota: it holds {mine:,} of "
                f"{cap:,} bytes (drop tables, or ask for a higher `pystrom serve --max-bytes-per-uid`)"
            )
        if self.used + nbytes > self.max_bytes:
            raise StoreQuotaError(
                f"reserve {name!r}: {size} would take the store daemon past its limit: it holds "
                f"{self.used:,} of {self.max_bytes:,} bytes (drop tables, or restart it with a higher --max-bytes)"
            )
        self.used += nbytes
        self.per_uid[uid] += nbytes

    def refund(self, uid: int, nbytes: int) -> None:
        self.used -= nbytes
        self.per_uid[uid] -= nbytes
        if self.per_uid[uid] <= 0:
            del self.per_uid[uid]

    def stats(self, uid: int) -> dict[str, int]:
        return {
            "max_bytes": self.max_bytes,
            "max_bytes_per_uid": self.max_per_uid,
            "uid_bytes": self.per_uid[uid],
            "uid_max_bytes": self.limit(uid),
        }


def default_max_bytes(backend: Any) -> int:
    """The daemon's byte limit when none is given: 3/4 of host memory, 9/10 of a GPU's."""
    if backend.kind == "cuda":
        with backend.activate():
            _, total = backend.xp.cuda.runtime.memGetInfo()
        return int(total) * 9 // 10
    return host_memory() * 3 // 4


def host_memory() -> int:
    """Physical memory, or the cgroup's memory limit when that is lower (a container's)."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return int(total)


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
