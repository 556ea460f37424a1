"""Bounded fuzzing of handles and of the store daemon's frames (issue 14): no signal, no hang, only
pystrom errors. Each campaign runs its cases in a child process that reports every case
(tests/fuzz_ipc.py); a child killed by a signal or stuck in one case is recorded against that case
and restarted after it. Seeded: a failing case is reproduced with its seed and index.

``PYSTROM_FUZZ_SECONDS`` (default 20 per campaign, so both stay under a minute in CI) and
``PYSTROM_FUZZ_CASES`` (default 20,000) scale a longer run.
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import sys
import time

import pytest
from test_store import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
SECONDS = float(os.environ.get("PYSTROM_FUZZ_SECONDS", "20"))
CASES = int(os.environ.get("PYSTROM_FUZZ_CASES", "20000"))
HANG_S = 20.0  # one case taking longer than this is a hang


def campaign(kind: str, seed: int, *extra: str) -> tuple[collections.Counter, list[str]]:
    """Run cases 0..CASES-1 until SECONDS have passed; per-outcome counts and the failing cases."""
    deadline = time.time() + SECONDS
    counts: collections.Counter = collections.Counter()
    failures: list[str] = []
    nxt = 0
    while nxt < CASES and time.time() < deadline:
        argv = [sys.executable, os.path.join(HERE, "fuzz_ipc.py"), kind, str(seed), str(nxt), str(CASES - nxt)]
        proc = subprocess.Popen([*argv, str(deadline), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        current, buf = None, b""
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], HANG_S)
            if not ready:
                proc.kill()
                proc.wait()
                outcome = "hang"
                break
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.wait()
                outcome = None if proc.returncode == 0 else f"signal:{_signal(proc.returncode)}"
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                words = line.decode().split(" ", 2)
                if words[0] == "start":
                    current = int(words[1])
                elif words[0] == "end":
                    counts[words[2].split(":", 2)[0] + (":" + words[2].split(":")[1] if ":" in words[2] else "")] += 1
                    if words[2].startswith("raw:"):
                        failures.append(f"seed {seed} case {words[1]}: {words[2]}")
                    current = None
        stderr = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        proc.stdout.close()
        if outcome is None:
            break
        if current is None:  # died between cases: a harness failure, not a case
            failures.append(f"seed {seed} after case {nxt}: {outcome}\n{stderr[-2000:]}")
            break
        counts[outcome] += 1
        failures.append(f"seed {seed} case {current}: {outcome}\n{stderr[-2000:]}")
        nxt = current + 1
    return counts, failures


def _signal(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"exit {returncode}"


def test_mutated_handles_never_crash_hang_or_leak_raw_errors():
    counts, failures = campaign("handles", 14)
    print(f"\nhandle fuzzing, {sum(counts.values())} cases in {SECONDS:.0f} s: {dict(sorted(counts.items()))}")
    assert not failures, "\n".join(failures[:20])
    assert sum(counts.values()) >= 200 and counts["ok"] > 0 and counts["pystrom:InvalidHandleError"] > 0


def test_malformed_daemon_frames_never_stop_the_daemon(tmp_path):
    d = Daemon(str(tmp_path / "run" / "s.sock"), "cpu")
    try:
        counts, failures = campaign("frames", 14, d.path)
        alive = d.proc.poll() is None
    finally:
        code = d.stop()
        daemon_err = d.proc.stderr.read() if not d.proc.stderr.closed else ""
    print(f"\nframe fuzzing, {sum(counts.values())} cases in {SECONDS:.0f} s: {dict(sorted(counts.items()))}")
    assert alive and code == 0
    assert not failures, "\n".join(failures[:20])
    assert "Traceback" not in daemon_err, daemon_err[-3000:]
    assert sum(counts.values()) >= 100 and counts["ok"] > 0 and counts["pystrom:StoreError"] > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
