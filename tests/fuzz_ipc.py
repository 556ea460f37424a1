"""Fuzz cases for the sharing paths, run in a child process that reports every case (tests/test_ipc_fuzz.py).

``python fuzz_ipc.py handles SEED START COUNT DEADLINE`` mutates handles of a table of every type (layout
fields, spans swapped between columns, header fields, bytes of the layout and the schema, and the
exporter's own offsets and bitmaps written after export), imports each and reads every byte of
the result. ``python fuzz_ipc.py frames SEED START COUNT DEADLINE SOCKET`` sends malformed frames to a
store daemon and commits tables with mutated layouts or garbage offsets, then reads them back.

Each case prints ``start <i>`` before it runs and ``end <i> <outcome>`` after it, flushed, so the
parent knows which case a signal or a hang belongs to and restarts after it. Outcomes: ``ok``,
``pystrom:<error class>``, ``raw:<exception class>`` (a failure: a non-pystrom exception escaped).
Cases are a pure function of (seed, index): a failing case is rerun alone with COUNT 1. No case
starts after DEADLINE (seconds since the epoch).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import random
import socket
import struct
import sys
import traceback
import zlib

import numpy as np
import pyarrow as pa

import pystrom
from pystrom.ipc import handle as fmt
from pystrom.ipc import protocol

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datagen import TYPES, make_array  # noqa: E402

EDGE = [0, 1, -1, 7, 8, 63, 64, 65, 4096, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, -(2**63), 2**64]
ODD = [None, True, False, 1.5, -1.0, "x", "", [], {}, [0], [0, 0, 0], [64, -64], {"a": 1}, [[[[[1]]]]]]


def source_table(rows: int = 24) -> pa.Table:
    cols = {name: make_array(t, rows, nulls=i % 3 == 0, seed=i) for i, (name, t) in enumerate(TYPES.items())}
    return pa.table(cols)


def touch(table: pystrom.Table) -> None:
    """Read every byte a consumer would: every column to Arrow, then every byte its buffers hold
    (strings through their offsets, as bytes: no UTF-8 decoding, no conversion of values to Python)."""
    for col in table._columns:
        col.null_count
        arr = col.to_arrow()
        arr.validate()
        if isinstance(arr.type, pa.BaseExtensionType):
            arr = arr.storage
        if pa.types.is_string(arr.type) or pa.types.is_binary(arr.type):
            arr.view(pa.binary()).to_pylist()
        for buf in arr.buffers():
            if buf is not None:
                int(np.frombuffer(buf, dtype=np.uint8).sum())


def _value(rng: random.Random, old):
    r = rng.random()
    if r < 0.35:
        return rng.choice(EDGE)
    if r < 0.5:
        return rng.choice(ODD)
    if isinstance(old, int) and not isinstance(old, bool):
        return old + rng.choice([-1, 1, -8, 8, -64, 64, old, -old, 1 << 20])
    if isinstance(old, list) and len(old) == 2:
        return [_value(rng, old[0]) if rng.random() < 0.5 else old[0], _value(rng, old[1])]
    return rng.choice(EDGE + ODD)


def _reseal(head: list, memory: bytes, body: bytes, schema: bytes) -> bytes:
    head = list(head)
    head[4], head[5], head[6] = len(body), len(schema), len(memory)
    raw = fmt._HEADER.pack(*head) + memory + body + schema
    return raw + struct.pack("<I", zlib.crc32(raw))


def mutate_layout(rng: random.Random, meta: dict) -> dict:
    meta = copy.deepcopy(meta)
    cols = meta["columns"]
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        r = rng.random()
        if r < 0.6 and cols:
            rec = rng.choice(cols)
            key = rng.choice(["length", "null_count", "values", "validity", "data", "offset", "rows", "nulls"])
            rec[key] = _value(rng, rec.get(key))
        elif r < 0.8 and len(cols) > 1:
            a, b = rng.sample(cols, 2)
            key_a = rng.choice(["values", "validity", "data"])
            key_b = rng.choice(["values", "validity", "data"])
            a[key_a], b[key_b] = b.get(key_b), a.get(key_a)
        elif r < 0.9:
            key = rng.choice(["nbytes", "num_rows"])
            meta[key] = _value(rng, meta.get(key))
        elif cols:
            rng.shuffle(cols)
    return meta


def mutate_handle(rng: random.Random, handle: bytes) -> bytes:
    d = fmt.decode(handle)
    head = list(fmt._HEADER.unpack_from(handle))
    body = json.dumps(d.layout.meta()).encode()
    memory, schema = d.memory, d.layout.schema
    r = rng.random()
    if r < 0.55:
        body = json.dumps(mutate_layout(rng, d.layout.meta())).encode()
    elif r < 0.65:
        raw = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        body = bytes(raw)
    elif r < 0.75:
        raw = bytearray(schema)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        schema = bytes(raw)
    elif r < 0.9:
        field = rng.choice([1, 2, 8, 9, 10, 11, 12, 14])  # version, kind, uuid, alloc size, offset, size, pid, start
        old = head[field]
        if field == 8:
            head[field] = bytes(rng.randrange(256) for _ in range(16))
        else:
            limit = {1: 0xFFFF, 2: 0xFF, 12: 0xFFFFFFFF}.get(field, 2**64 - 1)
            cand = _value(rng, old)
            head[field] = cand if isinstance(cand, int) and not isinstance(cand, bool) and 0 <= cand <= limit else 0
    else:
        raw = bytearray(memory)
        pos = rng.randrange(len(raw))
        raw[pos] = rng.randrange(256)
        if rng.random() < 0.3:
            raw = raw[: rng.randrange(5, len(raw) + 1)]
        memory = bytes(raw)
    return _reseal(head, memory, body, schema)


def _write_garbage(rng: random.Random, table: pystrom.Table, undo: list) -> None:
    """Write into the exporter's offsets or bitmaps, appending what to restore to ``undo`` before each
    write (restored last first: two writes may hit one place)."""
    for _ in range(rng.randint(1, 3)):
        col = rng.choice(table._columns)
        plan = col._plan
        if plan.data is not None and rng.random() < 0.8:
            arr = col.offsets
        elif plan.validity is not None:
            arr = col._base_validity()
        else:
            continue
        i = rng.randrange(arr.size)
        undo.append((arr, i, arr[i].copy()))
        if arr.dtype == np.int32:
            nudged = int(arr[i]) + rng.choice([-3, -1, 1, 3, 1000])  # wraps as int32 would: an extreme
            arr[i] = rng.choice([-1, -(2**31), 2**31 - 1, 2**30, (nudged + 2**31) % 2**32 - 2**31])
        else:
            arr[i] = rng.randrange(256)


def _stop(deadline: float) -> bool:
    import time

    return time.time() > deadline


def run_handles(seed: int, start: int, count: int, deadline: float) -> None:
    base = pystrom.Table.from_arrow(source_table(), device="cpu")
    views = [base, base.slice(5, 11), base.select(["string", "binary", "int32"])]
    for i in range(start, start + count):
        if _stop(deadline):
            break
        rng = random.Random(seed * 1_000_003 + i)
        table = rng.choice(views)
        print(f"start {i}", flush=True)
        undo = []
        try:
            if rng.random() < 0.2:
                _write_garbage(rng, base, undo)
                handle = table.export()
            else:
                handle = mutate_handle(rng, table.export())
            touch(pystrom.ipc_import(handle))
            outcome = "ok"
        except pystrom.Error as exc:
            outcome = f"pystrom:{type(exc).__name__}"
        except Exception as exc:
            outcome = f"raw:{type(exc).__name__}:{str(exc)[:120]!r}"
            traceback.print_exc()
        finally:
            for arr, k, old in reversed(undo):
                arr[k] = old
        print(f"end {i} {outcome}", flush=True)


# -- daemon frames -----------------------------------------------------------------------------------

OPS = ["hello", "reserve", "commit", "abort", "get", "list", "drop", "stats", "nope", "", None, 7]


def _frame(rng: random.Random) -> tuple[bytes, list[int]]:
    """One malformed or odd frame, and descriptors to attach."""
    r = rng.random()
    fds: list[int] = []
    if r < 0.1:
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        return struct.pack("<I", len(body)) + body, fds
    if r < 0.15:
        return struct.pack("<I", rng.choice([0, 1, 2**31, 2**32 - 1, 64 << 20])), fds  # length only: no body
    if r < 0.25:
        depth = rng.choice([20, 1000, 100_000])
        body = b'{"op":"get","name":' + b"[" * depth + b"]" * depth + b"}"
        return struct.pack("<I", len(body)) + body, fds
    if r < 0.3:
        body = json.dumps(rng.choice([[], 1, "x", None, [{"op": "list"}]])).encode()
        return struct.pack("<I", len(body)) + body, fds
    msg: dict = {"op": rng.choice(OPS)}
    for key in rng.sample(["name", "nbytes", "id", "layout", "schema", "replace", "release"], rng.randint(0, 4)):
        msg[key] = rng.choice(EDGE + ODD + ["t", "x" * 300, "\0", base64.b64encode(b"junk").decode()])
    if rng.random() < 0.1:
        fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(rng.choice([1, 2, 20]))]
    body = json.dumps(msg).encode()
    return struct.pack("<I", len(body)) + body, fds


def _exchange(path: str, data: bytes, fds: list[int]) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(path)
        try:
            if fds:
                socket.send_fds(s, [data], fds)
            else:
                s.sendall(data)
        except OSError:
            return "closed"
        complete = len(data) >= 4 and struct.unpack_from("<I", data)[0] == len(data) - 4
        if not complete:
            s.shutdown(socket.SHUT_WR)  # a short frame: the daemon sees the end, must drop the connection
        try:
            reply, got = protocol.recv(s)
        except (EOFError, ConnectionError, OSError):
            return "closed"
        for fd in got:
            os.close(fd)
        if reply.get("ok"):
            return "ok"
        name = reply.get("error")
        if not (isinstance(name, str) and isinstance(getattr(pystrom.errors, name, None), type)):
            return f"raw:reply:{name}"
        return f"pystrom:{name}"
    finally:
        s.close()
        for fd in fds:
            os.close(fd)


def _bad_commit(rng: random.Random, store: pystrom.Store, table: pystrom.Table, i: int) -> str:
    """Reserve, fill with the table (maybe garbage offsets), commit a maybe mutated layout; read it back."""
    from pystrom.ipc.client import _copy_block
    from pystrom.ipc.handle import TableLayout

    name = f"fuzz{i}"
    src = table._live()
    res = store.reserve(name, src.nbytes)
    try:
        _copy_block(src, res.block)
        if rng.random() < 0.5:
            cols = [c for c in table._columns if c._plan.data is not None]
            col = rng.choice(cols)
            offsets = res.block.array(col._plan.values.offset, np.int32, (col._plan.length + 1,))
            offsets[rng.randrange(offsets.size)] = rng.choice([-1, 2**30, 2**31 - 1, -(2**31), 12345])
        layout = TableLayout.of(table)
        meta = mutate_layout(rng, layout.meta()) if rng.random() < 0.6 else layout.meta()
        store._request(
            {"op": "commit", "id": res.id, "layout": meta, "schema": protocol.b64(layout.schema), "replace": True}
        )
        res.done = True
    finally:
        res.abort()
    with pystrom.Store(store.address) as reader:
        touch(reader.get(name))
        reader.drop(name)
    return "ok"


def run_frames(seed: int, start: int, count: int, deadline: float, path: str) -> None:
    table = pystrom.Table.from_arrow(source_table(), device="cpu")
    store = pystrom.Store(path)
    for i in range(start, start + count):
        if _stop(deadline):
            break
        rng = random.Random(seed * 1_000_003 + i)
        print(f"start {i}", flush=True)
        try:
            if rng.random() < 0.3:
                outcome = _bad_commit(rng, store, table, i)
            else:
                outcome = _exchange(path, *_frame(rng))
            if i % 20 == 0:
                store.stats()  # the daemon still answers a well-behaved client
        except pystrom.Error as exc:
            outcome = f"pystrom:{type(exc).__name__}"
        except Exception as exc:
            outcome = f"raw:{type(exc).__name__}:{str(exc)[:120]!r}"
            traceback.print_exc()
        print(f"end {i} {outcome}", flush=True)
    store.close()


if __name__ == "__main__":
    kind, seed, start, count, deadline = sys.argv[1], *map(int, sys.argv[2:5]), float(sys.argv[5])
    if kind == "handles":
        run_handles(seed, start, count, deadline)
    else:
        run_frames(seed, start, count, deadline, sys.argv[6])
    sys.stdout.flush()
