"""Timing and reporting shared by the benchmarks: medians of repeated runs, ratios to baselines."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Result:
    benchmark: str  # what is measured
    baseline: str  # what pystrom is compared with, measured in the same run
    pystrom_s: float
    baseline_s: float
    nbytes: int  # bytes moved or produced, for GB/s

    @property
    def speedup(self) -> float:
        """baseline time / pystrom time: above 1 means pystrom is faster."""
        return self.baseline_s / self.pystrom_s if self.pystrom_s > 0 else float("inf")


def measure(fn: Callable[[], Any], sync: Callable[[], None], repeat: int) -> float:
    """Median wall time of ``fn`` over ``repeat`` runs after one warm-up, synchronising each."""
    fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - start)
        del out
    return statistics.median(times)


def measure_pair(
    fn: Callable[[], Any],
    baseline: Callable[[], Any],
    sync: Callable[[], None],
    repeat: int,
    settle: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """Median wall times of ``fn`` and ``baseline``, run alternately ``repeat`` times each after one
    warm-up of each: on a machine whose speed drifts between runs (a shared host, a server's caches),
    both sides then see the same conditions, which back-to-back blocks of runs do not give them.
    ``settle``, untimed after every call of either: waits for the work a call left running in the
    background (a file's writeback, its release), which would otherwise land in the other side's time."""
    for f in (fn, baseline):
        f()
        sync()
        if settle is not None:
            settle()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for f, out in ((fn, times[0]), (baseline, times[1])):
            start = time.perf_counter()
            result = f()
            sync()
            out.append(time.perf_counter() - start)
            del result
            if settle is not None:
                settle()
    return statistics.median(times[0]), statistics.median(times[1])


def print_table(device: str, results: list[Result]) -> None:
    head = f"{'benchmark':<40} {'baseline':<34} {'pystrom s':>10} {'baseline s':>11} {'GB/s':>7} {'speedup':>8}"
    print(f"\ndevice: {device}\n{head}\n{'-' * len(head)}")
    for r in results:
        rate = f"{r.nbytes / r.pystrom_s / 1e9:7.2f}" if r.nbytes and r.pystrom_s > 0 else f"{'-':>7}"
        print(f"{r.benchmark:<40} {r.baseline:<34} {r.pystrom_s:10.4f} {r.baseline_s:11.4f} {rate} {r.speedup:7.2f}x")
