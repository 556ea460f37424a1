"""The client's call of one rank on its worker (:func:`._rank.run_rank_here`), watched by :mod:`._loop`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
import time
from typing import Any

from ..errors import ClusterError
from ._rank import run_rank_here

__all__ = ["RankCall", "rank_payload"]

# A client outside the workers' network (another site, a laptop through the scheduler's port only) cannot
# connect to them: a connect there may hang until distributed's connect timeout (30 s by default) when the
# route drops packets. So the direct connect gets at most _CONNECT_S, and a worker it failed to reach is
# called through the scheduler, without trying again, for _UNREACHABLE_S (each fit would pay the wait).
_CONNECT_S = 5.0
_UNREACHABLE_S = 600.0
_UNREACHABLE: dict[tuple[str, str], float] = {}  # (client id, worker address) -> when its connect failed
_UNREACHABLE_MAX = 1024


class RankCall:
    """One rank's call of :func:`._rank.run_rank_here` on its worker, sent straight from the client's
    event loop over a pooled connection (the worker's ``run`` handler, as ``Client.run`` reaches it
    through the scheduler), so that the client watches every rank while they run; ``status`` as a dask
    future's. ``Client.run`` opens a new connection from the scheduler to the worker each call and, made
    from a thread per rank, reached the fourth of 4 H200 workers ~4 ms after the first; a worker the
    client cannot connect to is still called that way. ``payload``: the function and its arguments,
    pickled once for every rank."""

    def __init__(self, client: Any, address: str, payload: tuple[bytes, bytes]):
        self.future: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(
            _call_rank(client, address, payload), client.loop.asyncio_loop
        )

    def done(self) -> bool:
        return self.future.done()

    @property
    def status(self) -> str:
        if not self.future.done():
            return "pending"
        return "error" if self.future.exception() is not None else "finished"


def rank_payload(*args: Any) -> tuple[bytes, bytes]:
    """:func:`._rank.run_rank_here` and ``args``, pickled as the worker's ``run`` handler takes them."""
    from distributed.protocol.pickle import dumps

    return dumps(run_rank_here), dumps(args)


async def _call_rank(client: Any, address: str, payload: tuple[bytes, bytes]) -> dict:
    from distributed.core import clean_exception, send_recv

    function, args = payload
    comm = await _connect(client, address)
    if comm is None:  # not reachable from here: through the scheduler (its error if the worker is gone)
        got = await client._run(run_rank_here, *_unpickle(args), workers=[address], on_error="return")
        value = got.get(address)  # (absent where the worker left before the call reached it)
        if value is None:
            raise ClusterError(f"worker {address} did not answer the fit (it left the cluster?)") from None
        if isinstance(value, BaseException):
            raise value
        return pickle.loads(value)
    try:
        reply = await send_recv(comm, close=False, op="run", function=function, args=args, wait=True)
    finally:
        client.rpc.reuse(address, comm)
    if reply.get("status") == "OK":
        return pickle.loads(reply["result"])  # run_rank_here pickles its result (one frame)
    _, exc, tb = clean_exception(**reply)
    raise exc.with_traceback(tb)


async def _connect(client: Any, address: str) -> Any:
    """A pooled connection from the client to the worker at ``address``, or None where it cannot be
    reached (now, or within the last _UNREACHABLE_S seconds)."""
    import dask.config
    from dask.utils import parse_timedelta

    key = (client.id, address)
    failed = _UNREACHABLE.get(key)
    if failed is not None and time.monotonic() - failed < _UNREACHABLE_S:
        return None
    limit = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds")
    try:
        comm = await client.rpc.connect(address, timeout=min(_CONNECT_S, limit))
    except Exception:  # noqa: BLE001 - refused, unroutable, timed out: remembered
        while len(_UNREACHABLE) >= _UNREACHABLE_MAX:
            del _UNREACHABLE[next(iter(_UNREACHABLE))]
        _UNREACHABLE[key] = time.monotonic()
        return None
    _UNREACHABLE.pop(key, None)
    return comm


def _unpickle(data: bytes) -> tuple:
    from distributed.protocol.pickle import loads

    return loads(data)
