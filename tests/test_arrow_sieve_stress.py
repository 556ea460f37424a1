"""The CPU sieve under stress (issue 39 item 1): the scan oracle's shape in CI size. Random schemas
(fixed-width types, booleans, strings; NULLs or not), record batches of 1 to 100 rows written by pystrom
and by pyarrow, a ``where`` on a numeric column left out of ``columns=`` (the sieve's case), read_arrow
and scan_arrow with small groups, each compared with pyarrow's filter; run in forked children, two at a
time, forked from a parent whose own thread reads the whole time (its pools busy at every fork), so the
children run loaded and inherit whatever the parent's threads held. A child that dies by a signal, hangs
or answers wrongly fails the test naming its cases. ``PYSTROM_SIEVE_STRESS=<children>`` runs more."""

from __future__ import annotations

import json
import os
import random
import select
import threading
import time
import warnings

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest

import pystrom

from datagen import make_array

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")

_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint16(), pa.float32(), pa.float64(), pa.date32(),
          pa.timestamp("ms", tz="UTC"), pa.bool_(), pa.string(), pa.decimal128(12, 2), pa.binary(4)]  # fmt: skip
_OPS = {">": pc.greater, "<=": pc.less_equal, "!=": pc.not_equal}


def _files(folder, count: int, rng: random.Random) -> list[dict]:
    out = []
    for k in range(count):
        n = rng.randint(1, 2500)
        columns = {f"c{i}": make_array(rng.choice(_TYPES), n, rng.random() < 0.5, rng.randrange(10**6))
                   for i in range(rng.randint(2, 6))}  # fmt: skip
        columns["w"] = make_array(rng.choice([pa.int64(), pa.float32(), pa.float64(), pa.int32()]), n,
                                  rng.random() < 0.5, rng.randrange(10**6))  # fmt: skip
        table = pa.table(columns)
        path = str(folder / f"f{k}.arrow")
        if k % 2:
            pystrom.write_arrow(table, path, batch_rows=rng.randint(1, 100))
        else:
            with ipc.new_file(path, table.schema) as w:
                w.write_table(table, max_chunksize=rng.randint(1, 100))
        values = table.column("w").drop_null()
        literals = [values[rng.randrange(len(values))].as_py() for _ in range(4)] if len(values) else [0]
        out.append({"path": path, "names": [c for c in table.column_names if c != "w"], "literals": literals})
    return out


def _case(files: list[dict], r: random.Random) -> dict:
    f = r.choice(files)
    return {"path": f["path"], "columns": r.sample(f["names"], r.randint(1, len(f["names"]))),
            "op": r.choice(sorted(_OPS)), "value": r.choice(f["literals"]),
            "scan": r.random() < 0.5, "batch_rows": r.randint(1, 100)}  # fmt: skip


def _run(case: dict) -> str | None:
    """None where pystrom's rows are pyarrow's, else what differs."""
    where = f'"w" {case["op"]} {case["value"]!r}'
    if case["scan"]:
        got = pystrom.scan_arrow(case["path"], columns=case["columns"], where=where,
                                 batch_rows=case["batch_rows"], device="cpu").collect()  # fmt: skip
    else:
        got = pystrom.read_arrow(case["path"], columns=case["columns"], where=where, device="cpu")
    table = ipc.open_file(case["path"]).read_all()
    keep = pc.fill_null(_OPS[case["op"]](table.column("w"), pa.scalar(case["value"], table.column("w").type)), False)
    want = table.filter(keep).select(case["columns"])
    host = got.to_arrow()
    if host.column_names != want.column_names or not host.combine_chunks().equals(want.combine_chunks()):
        return f"{case}: {host.num_rows} rows, pyarrow {want.num_rows}"
    return None


def _child(cases: list[dict], out: int) -> None:
    """In a forked child: every case, the failures written to ``out`` as JSON; never returns."""
    code = 3
    try:
        failures = [f for f in map(_run, cases) if f is not None]
        os.write(out, json.dumps(failures).encode())
        code = 0
    finally:
        os._exit(code)


def test_the_sieve_in_forked_children_under_load(tmp_path):
    seed = int(os.environ.get("PYSTROM_SIEVE_SEED", "39"))
    children = int(os.environ.get("PYSTROM_SIEVE_STRESS", "48"))
    per_child = 8
    rng = random.Random(seed)
    files = _files(tmp_path, 10, rng)
    plan = [[_case(files, random.Random(seed * 1000 + c * 100 + i)) for i in range(per_child)] for c in range(children)]
    stop = threading.Event()

    def busy() -> None:  # the parent's reads: its pools and locks in use at every fork
        r = random.Random(seed + 1)
        while not stop.is_set():
            _run(_case(files, r))

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    start = time.monotonic()
    results: dict[int, str] = {}
    running: dict[int, tuple[int, int, float]] = {}  # pid -> (child, pipe, deadline)
    pending = list(range(children))
    try:
        while pending or running:
            while pending and len(running) < 2:
                c = pending.pop(0)
                r, w = os.pipe()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads
                    pid = os.fork()
                if pid == 0:
                    os.close(r)
                    _child(plan[c], w)
                os.close(w)
                running[pid] = (c, r, time.monotonic() + 60)
            for pid, (c, r, deadline) in list(running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                if not done and time.monotonic() < deadline:
                    continue
                if not done:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    results[c] = "HANG"
                else:
                    code = os.waitstatus_to_exitcode(status)
                    chunks = []
                    while select.select([r], [], [], 0)[0]:
                        chunk = os.read(r, 1 << 20)
                        if not chunk:
                            break
                        chunks.append(chunk)
                    body = b"".join(chunks).decode()
                    results[c] = body if code == 0 else f"SIGNAL:{-code}" if code < 0 else f"EXIT:{code}"
                os.close(r)
                del running[pid]
                if results[c] != "[]":
                    pending.clear()  # the first failure is the finding: no more children
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(60)
    seconds = time.monotonic() - start
    print(f"sieve stress: {children} children x {per_child} cases = {children * per_child} reads, {seconds:.1f} s")
    bad = {c: (r, plan[c]) for c, r in results.items() if r != "[]"}
    assert not bad, f"children that died, hung or answered wrongly: {bad}"
