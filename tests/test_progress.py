"""Progress bars of long loads: shown on a terminal once a load runs past the delay, never for short
loads, never when stderr is not a terminal, never with ``progress=False``; ``True`` forces one and a
callable gets running totals.

The reporter is tested with injected streams; the loaders and ``pystrom load`` in subprocesses whose
stderr is a real pseudo-terminal (or a pipe), against a real PostgreSQL and real Arrow files.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom._progress import reporter
from pystrom.errors import InvalidArgumentError


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


# -- the reporter -------------------------------------------------------------------------------------


def test_auto_bar_appears_on_a_terminal_only_after_the_delay():
    stream = Tty()
    with pystrom.defaults.set(progress_delay=0.3):
        report = reporter(None, unit="rows", desc="load", stream=stream)
        report(10)
        assert stream.getvalue() == ""  # within the delay: nothing yet
        time.sleep(0.4)
        report(2500)
        report.close()
    text = stream.getvalue()
    assert text.startswith("\rload: 2.50k rows") and text.endswith("\n"), repr(text)


def test_no_bar_for_short_loads():
    stream = Tty()
    report = reporter(None, unit="B", desc="load", stream=stream)  # the default delay: 2 s
    assert pystrom.defaults.progress_delay == 2.0
    for total in (100, 5000, 1 << 20):
        report(total)
    report.close()
    report.close()  # closing twice is harmless
    assert stream.getvalue() == ""


def test_no_bar_when_not_a_terminal():
    stream = io.StringIO()
    with pystrom.defaults.set(progress_delay=0.0):
        report = reporter(None, unit="rows", desc="load", stream=stream)
        assert not report.active and report.bar is None
        report(1000)
        report.close()
    assert stream.getvalue() == ""


def test_false_means_no_bar_even_on_a_terminal():
    stream = Tty()
    with pystrom.defaults.set(progress_delay=0.0):
        report = reporter(False, unit="rows", desc="load", stream=stream)
        report(1000)
        report.close()
    assert not report.active and stream.getvalue() == ""


def test_true_forces_a_bar_anywhere_from_the_start():
    stream = io.StringIO()  # not a terminal: True still shows the bar
    report = reporter(True, unit="B", desc="read", total=4 << 20, stream=stream)
    report(1 << 20)
    report(4 << 20)
    report.close()
    text = stream.getvalue()
    assert "read:   0%" in text and "read: 100%" in text and "4.00M/4.00M [" in text, repr(text)


def test_callable_gets_running_totals_in_order():
    seen: list[int] = []
    stream = Tty()
    report = reporter(seen.append, unit="rows", desc="load", stream=stream)
    for total in (5, 12, 9, 12, 30):  # 9: a stale total from a slower thread is dropped
        report(total)
    report.close()
    assert seen == [5, 12, 12, 30] and stream.getvalue() == ""


def test_totals_from_many_threads_add_up():
    stream = io.StringIO()
    report = reporter(True, unit="rows", desc="load", stream=stream)
    lock, counter = threading.Lock(), [0]

    def work():
        for _ in range(500):
            with lock:
                counter[0] += 3
                total = counter[0]
            report(total)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert report.bar.n == 8 * 500 * 3
    report.close()


@pytest.mark.parametrize("bad", ["yes", 1, 0.5, [print]])
def test_bad_progress_values_are_refused(bad, tmp_path):
    with pytest.raises(InvalidArgumentError, match="progress must be None"):
        reporter(bad, unit="rows", desc="x")
    path = tmp_path / "t.arrow"
    pystrom.write_arrow(pa.table({"x": [1, 2]}), path)
    with pytest.raises(InvalidArgumentError, match="progress must be None"):
        pystrom.read_arrow(path, progress=bad, device="cpu")
    with pytest.raises(InvalidArgumentError, match="progress must be None"):
        pystrom.scan_arrow(path, progress=bad, device="cpu")


def test_read_postgres_refuses_a_bad_progress_before_connecting():
    pytest.importorskip("psycopg")
    with pytest.raises(InvalidArgumentError, match="progress must be None"):
        pystrom.read_postgres("host=/nonexistent dbname=x", "SELECT 1", progress="yes", device="cpu")


# -- the loaders report what they read ------------------------------------------------------------------


def _file(tmp_path, rows=50_000, batch_rows=10_000):
    rng = np.random.default_rng(3)
    data = pa.table(
        {
            "a": np.arange(rows, dtype=np.int64),
            "b": rng.standard_normal(rows),
            "s": pa.array([f"v{i % 1000}" if i % 7 else None for i in range(rows)]),
        }
    )
    path = tmp_path / "p.arrow"
    pystrom.write_arrow(data, path, batch_rows=batch_rows)
    return path, data


def _selected_bytes(path, columns) -> int:
    """Bytes of the columns' buffers in the file, as pyarrow sees them."""
    total = 0
    with pa.ipc.open_file(path) as reader:
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            for name in columns:
                total += sum(b.size for b in batch.column(name).buffers() if b is not None)
    return total


def test_read_arrow_reports_bytes_as_reads_complete(tmp_path, device):
    path, data = _file(tmp_path)
    seen: list[int] = []
    with pystrom.defaults.set(io_task_size=64 << 10):  # small read tasks: many reports
        table = pystrom.read_arrow(path, columns=["a", "s"], device=device, progress=seen.append)
    assert table.to_arrow().equals(data.select(["a", "s"]))
    assert len(seen) > 5 and seen == sorted(seen)
    assert seen[-1] == _selected_bytes(path, ["a", "s"])


def test_scan_arrow_reports_bytes_per_group(tmp_path, device):
    path, data = _file(tmp_path)
    seen: list[int] = []
    scan = pystrom.scan_arrow(path, columns=["b"], batch_rows=20_000, device=device, progress=seen.append)
    assert sum(t.num_rows for t in scan) == 50_000
    assert len(seen) == 3 and seen == sorted(seen)  # groups of 2, 2 and 1 record batches
    assert seen[-1] == scan.stats.bytes_read == 50_000 * 8
    seen.clear()
    list(scan)  # each pass reports from zero again
    assert seen[0] == 2 * 10_000 * 8


def test_read_postgres_reports_rows_received(pg, device):
    name = pg.name("prog")
    pg.execute(f"CREATE TABLE {name} AS SELECT g::int8 AS g, md5(g::text) AS h FROM generate_series(1, 20000) g")
    seen: list[int] = []
    with pystrom.defaults.set(pg_staging_chunk=4096):  # small staging buffers: many reports
        table = pystrom.read_postgres(pg.conninfo, table=name, partitions=1, device=device, progress=seen.append)
    assert table.num_rows == 20000
    assert len(seen) > 10 and seen == sorted(seen) and seen[-1] == 20000


# -- on a real terminal -----------------------------------------------------------------------------


def run_on_pty(argv: list[str], env: dict | None = None, timeout: float = 120) -> tuple[int, str, str]:
    """Run ``argv`` with stderr on a pseudo-terminal (100 columns); return (exit code, stdout, terminal text)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            env={**os.environ, **(env or {})},
        )
    finally:
        os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # the child must never block on a full terminal buffer
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out = proc.stdout.read().decode()
        code = proc.wait(timeout=timeout)
        reader.join(timeout=10)
    finally:
        proc.kill()
        proc.stdout.close()
        os.close(master)
    return code, out, b"".join(chunks).decode(errors="replace")


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


# 25 rows, one every 0.1 s: a read of about 2.5 s, longer than the default delay of 2 s.
SLOW_QUERY = "SELECT g::int8 AS g FROM generate_series(1, 25) g, LATERAL (SELECT pg_sleep(0.1 + 0 * g)) AS pause"
READ_PG = """
import sys, pystrom
t = pystrom.read_postgres(sys.argv[1], sys.argv[2], device="cpu")
print(t.num_rows)
"""


def test_long_postgres_read_on_a_terminal_shows_a_bar(pg):
    code, out, tty = run_on_pty(_python(READ_PG, pg.conninfo, SLOW_QUERY))
    assert code == 0 and out == "25\n", tty
    assert "read_postgres: 25.0 rows [00:02" in tty, repr(tty)


def test_long_postgres_read_to_a_pipe_shows_no_bar(pg):
    done = subprocess.run(_python(READ_PG, pg.conninfo, SLOW_QUERY), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "25\n"
    assert done.stderr == ""


def test_short_postgres_read_on_a_terminal_shows_no_bar(pg):
    code, out, tty = run_on_pty(_python(READ_PG, pg.conninfo, "SELECT g::int8 FROM generate_series(1, 5000) g"))
    assert code == 0 and out == "5000\n"
    assert tty == ""


ARROW = """
import sys, pystrom, pyarrow as pa
path, how, progress = sys.argv[1], sys.argv[2], {"none": None, "false": False, "true": True}[sys.argv[3]]
pystrom.write_arrow(pa.table({"x": list(range(100_000))}), path, batch_rows=25_000)
if how == "read":
    t = pystrom.read_arrow(path, device="cpu", progress=progress)
else:
    t = pystrom.scan_arrow(path, batch_rows=25_000, device="cpu", progress=progress).collect()
print(t.num_rows)
"""


@pytest.mark.parametrize("how", ["read", "scan"])
def test_arrow_loads_on_a_terminal(tmp_path, how):
    path = str(tmp_path / "x.arrow")
    name = "read_arrow" if how == "read" else "scan_arrow"
    # A short load with the default delay: nothing.
    code, out, tty = run_on_pty(_python(ARROW, path, how, "none"))
    assert code == 0 and out == "100000\n" and tty == ""
    # The same load with no delay stands in for a long one: a bar in bytes.
    code, out, tty = run_on_pty(_python(ARROW, path, how, "none"), env={"PYSTROM_PROGRESS_DELAY": "0"})
    assert code == 0 and out == "100000\n"
    assert f"{name}: " in tty and "781k" in tty and "B/s]" in tty, repr(tty)  # 800,000 bytes = 781 KiB
    # progress=False: nothing, even with no delay.
    code, out, tty = run_on_pty(_python(ARROW, path, how, "false"), env={"PYSTROM_PROGRESS_DELAY": "0"})
    assert code == 0 and tty == ""
    # progress=True to a pipe: the bar anyway.
    done = subprocess.run(_python(ARROW, path, how, "true"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and f"{name}: " in done.stderr
