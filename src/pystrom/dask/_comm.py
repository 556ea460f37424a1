"""How the workers of a fit exchange each pass's sums: an all-gather of one float64 vector per worker.

A fit whose Newton loop runs on the workers (:mod:`._rank`) needs one collective: after each pass every
worker contributes its vector and receives everybody's, in rank order, the same bytes on every worker
(each then sums them in that order, so all ranks hold bit-identical totals). Three communicators do it
behind one interface (:class:`Comm`):

- :class:`NcclComm`: GPU workers, through CuPy's binding of NCCL (``cupy.cuda.nccl``), NVLink or the
  network between the GPUs. NCCL's collectives never time out on their own: the host polls the stream
  with a deadline and aborts the communicator (``ncclCommAbort``) when it passes or the fit is cancelled.
- :class:`TcpComm`: the same exchange over TCP between the worker processes (a star through rank 0):
  CPU workers, GPUs without NCCL, and the CPU twin the tests run :class:`NcclComm`'s loop with.
- :class:`SoloComm`: one worker.

A communicator forms from a unique id made on rank 0's worker (:func:`make_unique_id`, called through
``Client.run``) and handed to every rank by the client, as NCCL's own ``ncclGetUniqueId`` is meant to
be used. Every wait, forming included, ends by ``timeout`` seconds, or at once when ``cancel`` is set
(the client sets it when a worker of the fit is lost), with :class:`~pystrom.errors.ClusterError`.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ClusterError, CollectiveTimeoutError

__all__ = ["Comm", "NcclComm", "TcpComm", "SoloComm", "form", "make_unique_id", "nccl_module", "nccl_library"]

_SLICE = 0.1  # seconds between looks at the deadline and the cancel flag while blocked on a socket
_MAGIC = b"PSTC"
_HELLO = struct.Struct("!4sI16s")  # magic, rank, the rendezvous's token
_HEAD = struct.Struct("!4sQQ")  # magic, exchange number, payload bytes
_LISTENERS: dict[str, tuple[socket.socket, bytes, float]] = {}  # communicator id -> rank 0's rendezvous
_LISTENERS_LOCK = threading.Lock()
_LISTENER_TTL = 600.0  # a rendezvous no rank 0 took (the client went away) is closed after this long


class Comm:
    """An all-gather among ``world`` ranks. ``peers``: each rank's worker address, for messages."""

    kind = "none"

    def __init__(self, rank: int, world: int, peers: Sequence[str], timeout: float, cancel: threading.Event):
        self.rank = rank
        self.world = world
        self.peers = list(peers)
        self.timeout = float(timeout)
        self.cancel = cancel  # replaced by each fit that uses the communicator
        self.exchanges = 0

    def allgather(self, vec: np.ndarray) -> np.ndarray:
        """Every rank's ``vec`` (same length everywhere) as rows of a (world, n) float64 array."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the communicator after a fit that ended well."""

    def abort(self) -> None:
        """Release it at once, whatever is in flight (after a failure)."""
        self.close()

    def who(self, rank: int) -> str:
        address = self.peers[rank] if 0 <= rank < len(self.peers) else "?"
        return f"rank {rank} ({address})"

    def _check(self, end: float, what: str) -> None:
        """Raise when the fit was cancelled or the deadline ``end`` (time.monotonic) passed."""
        if self.cancel.is_set():
            raise ClusterError(f"{self.who(self.rank)}: cancelled while {what}: a worker of the fit was lost")
        if time.monotonic() > end:
            raise CollectiveTimeoutError(
                f"{self.who(self.rank)} waited {self.timeout:g} s while {what} (pystrom.defaults.dask_fit_timeout): "
                f"a worker of the fit stalled or was lost"
            )


class SoloComm(Comm):
    """One rank: its vector is everybody's."""

    def allgather(self, vec: np.ndarray) -> np.ndarray:
        self.exchanges += 1
        return np.array(vec, dtype=np.float64).reshape(1, -1)


# -- NCCL ----------------------------------------------------------------------------------------------


def nccl_library() -> str | None:
    """Load ``libnccl.so.2`` from the NVIDIA wheel (nvidia-nccl-cu12/-cu13) before CuPy's binding looks for it
    (CuPy finds a system NCCL itself, a wheel's only in some versions); the path loaded, or None."""
    if "cupy_backends.cuda.libs.nccl" in sys.modules:
        return None  # CuPy loaded its NCCL already
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        for pattern in ("nccl/lib/libnccl.so*", "*/lib/libnccl.so*", "*/*/lib/libnccl.so*"):
            for candidate in sorted(Path(base).glob(pattern)):
                try:
                    ctypes.CDLL(str(candidate), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
                return str(candidate)
    return None


@functools.cache
def nccl_module() -> Any:
    """``cupy.cuda.nccl`` with a working library (ImportError saying why not; not cached then)."""
    nccl_library()
    from cupy.cuda import nccl

    if not getattr(nccl, "available", True) or not hasattr(nccl, "NcclCommunicator"):
        raise ImportError("CuPy's NCCL binding is unavailable (cupy.cuda.nccl.available is False): pip install "
                          "nvidia-nccl-cu13 (or -cu12, as CuPy's CUDA)")  # fmt: skip
    nccl.get_version()  # a binding without its library fails here
    return nccl


class NcclComm(Comm):
    """The all-gather over NCCL on GPU ``ordinal`` (CuPy's ``NcclCommunicator``), on its own stream.

    The host copies the vector in, enqueues ``ncclAllGather`` and polls the stream: done, or past the
    deadline or cancelled (then ``ncclCommAbort``, which makes the waiting kernels return), or an
    asynchronous NCCL error (a peer's connection lost). Float64 throughout: the rows come back bit for
    bit as each rank sent them.
    """

    kind = "nccl"

    def __init__(self, uid: Any, rank: int, world: int, peers: Sequence[str], ordinal: int,
                 timeout: float, cancel: threading.Event):  # fmt: skip
        import cupy

        super().__init__(rank, world, peers, timeout, cancel)
        self._nccl = nccl_module()
        self.ordinal = int(ordinal)
        with cupy.cuda.Device(self.ordinal):
            self._stream = cupy.cuda.Stream(non_blocking=True)
        self._buffers: dict[int, tuple[Any, ...]] = {}  # length -> device send/recv, pinned send/recv
        self._comm = _form_in_thread(lambda: self._nccl.NcclCommunicator(world, uid, rank), self)

    def allgather(self, vec: np.ndarray) -> np.ndarray:
        import cupy

        if self._comm is None:
            raise ClusterError(f"{self.who(self.rank)}: the NCCL communicator was aborted")
        host = np.ascontiguousarray(vec, dtype=np.float64).ravel()
        n = host.size
        self.exchanges += 1
        end = time.monotonic() + self.timeout
        try:
            with cupy.cuda.Device(self.ordinal):
                if n not in self._buffers:  # one vector length a fit: keep the last length's buffers only
                    self._buffers = {n: self._make_buffers(n)}
                send, recv, pinned_send, pinned_recv = self._buffers[n]
                # Through pinned memory, both copies queued on the stream around the all-gather, so the
                # host waits once, in _wait, where the deadline and the cancel flag are looked at. (Not
                # ndarray.get(out=...): CuPy 13+ then waits for the stream itself, which a lost peer's
                # all-gather never lets end.)
                rt = cupy.cuda.runtime
                pinned_send[:] = host
                rt.memcpyAsync(send.data.ptr, pinned_send.ctypes.data, host.nbytes, rt.memcpyHostToDevice,
                               self._stream.ptr)  # fmt: skip
                self._comm.allGather(send.data.ptr, recv.data.ptr, n, self._nccl.NCCL_FLOAT64, self._stream.ptr)
                rt.memcpyAsync(pinned_recv.ctypes.data, recv.data.ptr, pinned_recv.nbytes, rt.memcpyDeviceToHost,
                               self._stream.ptr)  # fmt: skip
                self._wait(end, lambda: self._stream.done)
                return pinned_recv.reshape(self.world, n).copy()
        except BaseException:
            self.abort()  # whatever is in flight returns; the communicator is not used again
            raise

    @property
    def stream(self) -> Any:
        """The stream the all-gathers run on (dask/_chain.py queues its passes on it too)."""
        return self._stream

    def enqueue_allgather(self, send: int, recv: int, n: int) -> None:
        """Queue an all-gather of ``n`` float64 at device address ``send`` into ``recv`` (world x n) on
        :attr:`stream`, not waited for (:meth:`wait_for` waits)."""
        if self._comm is None:
            raise ClusterError(f"{self.who(self.rank)}: the NCCL communicator was aborted")
        self.exchanges += 1
        self._comm.allGather(send, recv, n, self._nccl.NCCL_FLOAT64, self._stream.ptr)

    def wait_for(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()`` (a CUDA event queued after all-gathers on :attr:`stream`), within the
        timeout, the cancel flag and NCCL's own errors as :meth:`allgather` waits (then aborted)."""
        try:
            self._wait(time.monotonic() + self.timeout, ready)
        except BaseException:
            self.abort()
            raise

    def _make_buffers(self, n: int) -> tuple[Any, ...]:
        import cupy
        import cupyx

        whole = self.world * n
        device = cupy.empty(n, dtype=np.float64), cupy.empty(whole, dtype=np.float64)
        return (*device, cupyx.empty_pinned(n, dtype=np.float64), cupyx.empty_pinned(whole, dtype=np.float64))

    def _wait(self, end: float, ready: Callable[[], bool]) -> None:
        start = time.monotonic()
        look = start
        while not ready():
            now = time.monotonic()
            if now >= look:  # every millisecond: the deadline, the cancel flag, NCCL's own error
                look = now + 0.001
                try:
                    self._check(end, "in an NCCL all-gather")
                    self._comm.check_async_error()
                except ClusterError:
                    self.abort()
                    raise
                except Exception as exc:  # noqa: BLE001 - CuPy's NcclError (or its KeyError for newer codes)
                    self.abort()
                    raise ClusterError(f"{self.who(self.rank)}: NCCL failed in an all-gather: {exc!r}") from exc
            # A small all-gather ends within microseconds of the last rank's arrival, which may be a pass
            # later: spin (yielding the GIL) for 20 ms, then nap. Napping from 0.5 ms on (a nap lasts
            # 60-100 us) cost a 2-GPU pass ~0.15 ms of waiting where the exchange itself takes ~0.02.
            time.sleep(0 if now - start < 0.02 else 0.00005)

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()

    def abort(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            try:
                comm.abort()
            except Exception:  # noqa: BLE001 - nothing more to release
                pass


def _form_in_thread(make: Callable[[], Any], comm: NcclComm) -> Any:
    """``make()`` (``ncclCommInitRank``, which blocks until every rank joined and has no timeout of its own)
    on a thread with the comm's GPU current, waited for with ``comm``'s deadline and cancel flag. A
    communicator that forms after the wait gave up is aborted by that thread."""
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def run() -> None:
        import cupy

        try:
            with cupy.cuda.Device(comm.ordinal):
                made = make()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
            return
        with lock:
            if box.get("abandoned"):
                made.abort()
            else:
                box["comm"] = made

    thread = threading.Thread(target=run, name="pystrom-nccl-init", daemon=True)
    thread.start()
    end = time.monotonic() + comm.timeout
    while thread.is_alive():
        thread.join(_SLICE / 2)
        if thread.is_alive():
            try:
                comm._check(end, f"forming the NCCL communicator of {comm.world} ranks")
            except ClusterError:
                with lock:
                    box["abandoned"] = True
                raise
    if "error" in box:
        raise ClusterError(f"{comm.who(comm.rank)}: NCCL could not form a communicator of {comm.world} ranks: "
                           f"{box['error']!r}") from box["error"]  # fmt: skip
    return box["comm"]


# -- TCP -----------------------------------------------------------------------------------------------


def _listen(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, 0), family=family, backlog=128)
    except OSError:  # an address this host cannot bind (a NAT's): every interface
        return socket.create_server(("", 0), family=family, backlog=128)


def tcp_rendezvous(cid: str, host: str) -> tuple[str, int, bytes]:
    """Rank 0's listening socket for communicator ``cid``, kept here until rank 0 takes it; its unique id."""
    now = time.monotonic()
    with _LISTENERS_LOCK:
        for old in [k for k, (_, _, t) in _LISTENERS.items() if now - t > _LISTENER_TTL]:
            _LISTENERS.pop(old)[0].close()
        sock = _listen(host)
        token = os.urandom(16)
        _LISTENERS[cid] = (sock, token, now)
    return host, sock.getsockname()[1], token


def drop_rendezvous(cid: str) -> None:
    with _LISTENERS_LOCK:
        entry = _LISTENERS.pop(cid, None)
    if entry is not None:
        entry[0].close()


class TcpComm(Comm):
    """The all-gather over TCP: every rank sends its vector to rank 0, which sends the stacked rows back.

    Frames carry the exchange number, so ranks out of step are an error, not a mix of two passes. A
    peer that is gone closes its socket, which ends the exchange at once (not at the deadline)."""

    kind = "tcp"

    def __init__(self, cid: str, uid: tuple[str, int, bytes], rank: int, world: int, peers: Sequence[str],
                 timeout: float, cancel: threading.Event):  # fmt: skip
        super().__init__(rank, world, peers, timeout, cancel)
        host, port, self._token = uid
        self._socks: dict[int, socket.socket] = {}  # rank 0: each peer's; others: {0: rank 0's}
        end = time.monotonic() + self.timeout
        try:
            if rank == 0:
                with _LISTENERS_LOCK:
                    entry = _LISTENERS.pop(cid, None)
                if entry is None:
                    raise ClusterError(f"{self.who(0)}: the rendezvous of communicator {cid} is not on this "
                                       "worker (did it restart?)")  # fmt: skip
                with entry[0] as listener:
                    self._accept(listener, end)
            else:
                self._connect(host, port, end)
        except BaseException:
            self.abort()
            raise

    def _accept(self, listener: socket.socket, end: float) -> None:
        listener.settimeout(_SLICE)
        while len(self._socks) < self.world - 1:
            missing = [r for r in range(1, self.world) if r not in self._socks]
            self._check(end, f"waiting for {', '.join(self.who(r) for r in missing)} to connect")
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                hello = _HELLO.unpack(self._recv(sock, _HELLO.size, min(end, time.monotonic() + 5.0), -1))
            except (ClusterError, OSError):
                sock.close()  # not a rank of this communicator (or it left at once)
                continue
            magic, rank, token = hello
            if magic != _MAGIC or token != self._token or not 0 < rank < self.world or rank in self._socks:
                sock.close()
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks[rank] = sock

    def _connect(self, host: str, port: int, end: float) -> None:
        while True:
            self._check(end, f"connecting to {self.who(0)} at {host}:{port}")
            try:
                sock = socket.create_connection((host, port), timeout=max(0.01, min(5.0, end - time.monotonic())))
                break
            except OSError:
                time.sleep(_SLICE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socks[0] = sock
        self._send(sock, _HELLO.pack(_MAGIC, self.rank, self._token), end, 0)

    def allgather(self, vec: np.ndarray) -> np.ndarray:
        try:
            return self._allgather(np.ascontiguousarray(vec, dtype=np.float64).ravel())
        except BaseException:
            self.abort()  # closed sockets end the others' waits at once
            raise

    def _allgather(self, host: np.ndarray) -> np.ndarray:
        self.exchanges += 1
        end = time.monotonic() + self.timeout
        if self.rank != 0:
            sock = self._socks[0]
            self._send(sock, _HEAD.pack(_MAGIC, self.exchanges, host.nbytes) + host.tobytes(), end, 0)
            rows = self._frame(sock, host.nbytes * self.world, end, 0)
            return np.frombuffer(rows, dtype=np.float64).reshape(self.world, host.size).copy()
        rows = [host]
        for r in range(1, self.world):
            rows.append(np.frombuffer(self._frame(self._socks[r], host.nbytes, end, r), dtype=np.float64))
        out = np.stack(rows)
        frame = _HEAD.pack(_MAGIC, self.exchanges, out.nbytes) + out.tobytes()
        for r in range(1, self.world):
            self._send(self._socks[r], frame, end, r)
        return out

    def _frame(self, sock: socket.socket, nbytes: int, end: float, peer: int) -> bytearray:
        magic, number, size = _HEAD.unpack(self._recv(sock, _HEAD.size, end, peer))
        if magic != _MAGIC or number != self.exchanges or size != nbytes:
            raise ClusterError(
                f"{self.who(self.rank)}: {self.who(peer)} sent exchange {number} of {size} bytes where exchange "
                f"{self.exchanges} of {nbytes} was due: the workers are out of step"
            )
        return self._recv(sock, nbytes, end, peer)

    def _recv(self, sock: socket.socket, nbytes: int, end: float, peer: int) -> bytearray:
        buf = bytearray(nbytes)
        view = memoryview(buf)
        got = 0
        while got < nbytes:
            self._check(end, f"waiting for {self.who(peer)}")
            sock.settimeout(min(_SLICE, max(0.001, end - time.monotonic())))
            try:
                k = sock.recv_into(view[got:])
            except TimeoutError:
                continue
            except OSError as exc:
                raise ClusterError(f"{self.who(self.rank)}: the connection to {self.who(peer)} failed: {exc}") from exc
            if k == 0:
                raise ClusterError(f"{self.who(self.rank)}: {self.who(peer)} closed its connection: its worker was "
                                   "lost or its part of the fit failed")  # fmt: skip
            got += k
        return buf

    def _send(self, sock: socket.socket, data: bytes, end: float, peer: int) -> None:
        self._check(end, f"sending to {self.who(peer)}")
        sock.settimeout(max(0.001, end - time.monotonic()))
        try:
            sock.sendall(data)
        except TimeoutError:
            raise CollectiveTimeoutError(f"{self.who(self.rank)}: {self.who(peer)} took no data for {self.timeout:g} "
                                         "s (pystrom.defaults.dask_fit_timeout)") from None  # fmt: skip
        except OSError as exc:
            raise ClusterError(f"{self.who(self.rank)}: the connection to {self.who(peer)} failed: {exc}") from exc

    def close(self) -> None:
        socks, self._socks = self._socks, {}
        for sock in socks.values():
            try:
                sock.close()
            except OSError:
                pass


# -- forming -------------------------------------------------------------------------------------------


def make_unique_id(kind: str, cid: str, host: str) -> Any:
    """What every rank of communicator ``cid`` forms it from, made on rank 0's worker (``host``: its address)."""
    if kind == "nccl":
        return nccl_module().get_unique_id()  # as CuPy made it: bytes in CuPy 14, a tuple of ints before
    if kind == "tcp":
        return tcp_rendezvous(cid, host)
    return None


def form(kind: str, cid: str, uid: Any, rank: int, world: int, peers: Sequence[str], ordinal: int,
         timeout: float, cancel: threading.Event) -> Comm:  # fmt: skip
    """Rank ``rank``'s end of communicator ``cid`` (every rank calls this at about the same time)."""
    if kind == "nccl":
        return NcclComm(uid, rank, world, peers, ordinal, timeout, cancel)
    if kind == "tcp":
        return TcpComm(cid, uid, rank, world, peers, timeout, cancel)
    if world != 1:
        raise ClusterError(f"no communicator for {world} ranks (kind {kind!r})")
    return SoloComm(rank, world, peers, timeout, cancel)
