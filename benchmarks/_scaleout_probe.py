"""Where a pystrom.dask read's time goes, measured inside the workers (bench_scaleout.py's read breakdown).

``install`` (through ``Client.run``) wraps, on each worker, the stages of one partition's read: the
task (``read_pg_range``), its connection and snapshot join, the COPY streams (``CopyStream.read``:
wall and the reader thread's CPU, i.e. libpq and the pump), the pinned staging allocations, the
uploads (the enqueue on the host, and the host->device copy on the GPU, timed by CUDA events) and the
decode into the Table (``assemble``). ``collect`` returns and resets the sums. The functions travel
by value (the workers cannot import the benchmarks); their sums live on the worker object.

Also here: CPU affinity for the split runs (the server on one half of the cores, the workers on the
other), and the server's CPU time from /proc (pg_pump_cpu.py's accounting).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

_TICK = os.sysconf("SC_CLK_TCK")


def install(dask_worker: Any = None) -> None:
    """Wrap the read path's stages on this worker (once; later calls only reset the sums)."""
    from pystrom.dask import _tasks
    from pystrom.io.postgres import assemble as assemble_mod
    from pystrom.io.postgres import pump, session, stream

    stats = getattr(dask_worker, "_pystrom_read_stats", None)
    if stats is not None:
        _reset(stats)
        return
    stats = {"lock": threading.Lock(), "events": []}
    _reset(stats)
    dask_worker._pystrom_read_stats = stats

    def add(**values: float) -> None:
        with stats["lock"]:
            for k, v in values.items():
                stats[k] = stats.get(k, 0.0) + v

    def timed(fn, name):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                add(**{name: time.perf_counter() - t0})

        return wrapper

    task = _tasks.read_pg_range

    def read_pg_range(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return task(*args, **kwargs)
        finally:
            add(tasks=1, task_s=time.perf_counter() - t0, task_cpu_s=time.thread_time() - c0)

    _tasks.read_pg_range = read_pg_range
    session.connect = timed(session.connect, "connect_s")
    session.join_snapshot = timed(session.join_snapshot, "snapshot_s")
    stream.read_all = timed(stream.read_all, "read_all_s")
    assemble_mod.assemble = timed(assemble_mod.assemble, "assemble_s")

    copy_read = pump.CopyStream.read

    def read(self, *args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        chunks = copy_read(self, *args, **kwargs)
        add(streams=1, pump_s=time.perf_counter() - t0, pump_cpu_s=time.thread_time() - c0,
            rows=sum(c.nrows for c in chunks), bytes=sum(c.nbytes for c in chunks))  # fmt: skip
        return chunks

    pump.CopyStream.read = read

    allocator = stream._staging_allocator

    def staging_allocator(backend):
        allocate = allocator(backend)

        def timed_allocate(n):
            t0 = time.perf_counter()
            try:
                return allocate(n)
            finally:
                add(staging_allocs=1, staging_s=time.perf_counter() - t0, staging_bytes=n)

        return timed_allocate

    stream._staging_allocator = staging_allocator

    upload = stream.Uploader.__call__

    def upload_chunk(self, chunk):
        import cupy

        start = None
        s = getattr(self._local, "stream", None)
        if s is not None:
            start = cupy.cuda.Event()
            start.record(s)
        t0 = time.perf_counter()
        upload(self, chunk)
        add(uploads=1, upload_enqueue_s=time.perf_counter() - t0, upload_bytes=chunk.nbytes)
        device = getattr(chunk, "device", None)
        if start is not None and device is not None:
            with stats["lock"]:
                stats["events"].append((start, device[2], chunk.nbytes))

    stream.Uploader.__call__ = upload_chunk


def _reset(stats: dict) -> None:
    with stats["lock"]:
        keep = {"lock": stats["lock"]}
        stats.clear()
        stats.update(keep, events=[], process_cpu0=time.process_time())


def collect(dask_worker: Any = None) -> dict:
    """This worker's sums since install/reset, the host->device copies' GPU time included; then reset."""
    stats = getattr(dask_worker, "_pystrom_read_stats", None)
    if stats is None:
        return {}
    with stats["lock"]:
        out = {k: v for k, v in stats.items() if k not in ("lock", "events", "process_cpu0")}
        events = list(stats["events"])
        out["process_cpu_s"] = time.process_time() - stats["process_cpu0"]
    gpu_ms = 0.0
    timed_bytes = 0
    for start, end, nbytes in events:
        try:
            end.synchronize()
            import cupy

            gpu_ms += cupy.cuda.get_elapsed_time(start, end)
            timed_bytes += nbytes
        except Exception:  # noqa: BLE001 - an event without timing: not counted
            pass
    out["h2d_gpu_s"] = gpu_ms / 1e3
    out["h2d_timed_bytes"] = timed_bytes
    _reset(stats)
    return out


def summarise(per_worker: dict, rows: int) -> str:
    """One line: where a read's time went, summed over the workers (CPU per million rows)."""
    tot: dict[str, float] = {}
    for stats in per_worker.values():
        for k, v in stats.items():
            tot[k] = tot.get(k, 0.0) + v
    if not tot.get("tasks"):
        return "no partition tasks seen"
    per_m = 1e6 / max(rows, 1)
    n = tot["tasks"]

    def each(key: str) -> float:
        return tot.get(key, 0.0) / n

    h2d = tot.get("h2d_timed_bytes", 0) / tot["h2d_gpu_s"] / 1e9 if tot.get("h2d_gpu_s") else float("nan")
    return (
        f"{int(n)} tasks, per task: {each('task_s'):.3f} s = connect {each('connect_s'):.3f} + snapshot "
        f"{each('snapshot_s'):.3f} + COPY->staging->upload {each('read_all_s'):.3f} + decode {each('assemble_s'):.3f}; "
        f"pump CPU {tot.get('pump_cpu_s', 0) * per_m:.3f} s/Mrow (stream wall {tot.get('pump_s', 0) * per_m:.3f} "
        f"s/Mrow), staging allocs {int(tot.get('staging_allocs', 0))} in {tot.get('staging_s', 0):.3f} s, upload "
        f"enqueue {tot.get('upload_enqueue_s', 0):.3f} s, H2D on GPU {tot.get('h2d_gpu_s', 0):.3f} s ({h2d:.1f} GB/s "
        f"a stream); workers' process CPU {tot.get('process_cpu_s', 0) * per_m:.3f} s/Mrow"
    )


# -- CPU affinity and the server's CPU -----------------------------------------------------------------


def set_affinity(cpus: list[int] | None, dask_worker: Any = None) -> list[int]:
    """Every thread of this process on ``cpus`` (None: back to what it had before); returns the old set."""
    saved = getattr(dask_worker, "_pystrom_affinity", None)
    if saved is None:
        saved = sorted(os.sched_getaffinity(0))
        dask_worker._pystrom_affinity = saved
    target = set(saved if cpus is None else cpus)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), target)
        except OSError:
            pass
    return saved


def server_pids(postmaster: int) -> list[int]:
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                pids.append(int(entry))
    return pids


def pin_server(postmaster: int, cpus: set[int]) -> None:
    """The postmaster (so every backend forked from now on) and its present children on ``cpus``."""
    os.sched_setaffinity(postmaster, cpus)  # (an error here says the split cannot be made)
    for pid in server_pids(postmaster)[1:]:
        try:
            os.sched_setaffinity(pid, cpus)
        except OSError:  # a backend that just exited
            pass


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the postmaster and its children, live and reaped (pg_pump_cpu.py's accounting),
    once the backends of the last statement have exited."""
    time.sleep(0.3)
    total = 0
    for pid in server_pids(postmaster):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) if pid == postmaster else int(fields[11]) + int(fields[12])
    return total / _TICK
