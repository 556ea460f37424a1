"""The package as a user meets it: import cost, the public API, the command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

import pystrom

from conftest import needs_gpu


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_import_is_fast_and_does_not_load_cupy_or_pyarrow():
    code = (
        "import time, sys; t = time.perf_counter(); import pystrom; "
        "print(time.perf_counter() - t, 'cupy' in sys.modules, 'pyarrow' in sys.modules)"
    )
    best = min(float(_python(code).stdout.split()[0]) for _ in range(3))
    out = _python(code).stdout.split()
    assert best < 1.0, f"import pystrom took {best:.2f} s"
    assert out[1:] == ["False", "False"], "CuPy and pyarrow must load only when used"


def test_cpu_work_never_imports_cupy():
    code = (
        "import sys, pystrom; t = pystrom.Table.from_arrays({'x': [1.0, 2.0]}, device='cpu'); "
        "t.filter([True, False]); t.to_array(); t.to_arrow(); print('cupy' in sys.modules)"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_public_api():
    for name in pystrom.__all__:
        assert hasattr(pystrom, name), name
    assert pystrom.Table.__module__ == "pystrom.table"


def test_default_device_from_environment():
    result = _python("import pystrom; print(pystrom.Table.from_arrays({'x': [1]}).device)", PYSTROM_DEVICE="cpu")
    assert result.stdout.strip() == "cpu", result.stderr
    bad = _python("import pystrom", PYSTROM_REPR_ROWS="many")
    assert bad.returncode != 0 and "PYSTROM_REPR_ROWS='many'" in bad.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pystrom", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.postgres
def test_demo_runs_the_whole_data_path():
    pytest.importorskip("psycopg")
    from pystrom._embedded_pg import find_server_binaries
    from pystrom.testing import EmbeddedPostgres  # noqa: F401  (the demo starts its own server)

    if find_server_binaries() is None:
        pytest.skip("no PostgreSQL server binaries")
    result = _cli("demo", "--rows", "50000", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "PostgreSQL: a throwaway server from" in out
    for step in ("generate logreg in PostgreSQL (50,000 rows)", "PostgreSQL -> cpu (read_postgres, first load)",
                 "-> Arrow file (write_arrow)", "Arrow file -> cpu (read_arrow", "ipc_import there (zero copy, cpu)",
                 "logregr_train there on t (", "logregr_train there on t_exact ("):  # fmt: skip
        assert step in out, step
    steps = out[out.index("\nstep ") + 1 : out.index("\nlogistic regression")].strip().splitlines()
    assert steps[0].split() == ["step", "seconds", "GB/s"]
    for line in steps[1:]:  # seconds for every step; GB/s only where the table's bytes move
        moves = any(what in line for what in ("read_postgres", "write_arrow", "read_arrow"))
        numbers = re.findall(r"\s(\d+\.\d+)", line)
        assert len(numbers) == (2 if moves else 1), line

    # The headline fit: labels with noise, so it converges near the coefficients the rows were made with.
    head = out[out.index("logistic regression t ~ x1 + x2 + x3 + x4 + x5 on 50,000 rows") :]
    head = head[: head.index("second act")]
    rows = {m[0]: [float(v) for v in m[1:4]] for m in re.findall(r"^\s*(\w+)\s+(\S+)\s+(\S+)\s+(\S+)\s", head, re.M)
            if m[0] in ("intercept", "x1", "x2", "x3", "x4", "x5")}  # fmt: skip
    assert list(rows) == ["intercept", "x1", "x2", "x3", "x4", "x5"]
    for (name, (coef, se, z)), truth in zip(rows.items(), [1, 2, -3, 1, 0.5, 0]):
        assert 0 < se < 0.1 and abs(z - coef / se) <= 0.01 * abs(z) + 0.01, name
        assert abs(coef - truth) < 6 * se, (name, coef, truth, se)  # 6 sigma: a false alarm once in 10^8 runs
    assert "converged after" in head and "did NOT converge" not in head
    assert "warning" not in head
    assert "p-value" in head and "< 1e-16" in head  # x1..x4 matter beyond doubt

    # The second act: the noiseless rule separates the classes, and the demo says so.
    act = out[out.index("second act") :]
    assert "PerfectSeparationWarning" in act and "why:" in act


@pytest.mark.postgres
def test_demo_says_each_step_when_it_finishes(monkeypatch):
    """Each step's line comes when the step is done, not in a table at the end: every line before the
    second process starts is said before it starts, and the headline fit's line before the separated
    fit is done. The CPU default is sized for about a minute on two cores, the second act capped."""
    pytest.importorskip("psycopg")
    from pystrom import demo
    from pystrom._embedded_pg import find_server_binaries

    if find_server_binaries() is None:
        pytest.skip("no PostgreSQL server binaries")
    said: list[str] = []
    real = demo._train_elsewhere

    def train(handle, device, separated, timeout, on_result):
        said.append("<second process starts>")

        def each(kind, result):
            said.append(f"<{kind} arrived>")
            on_result(kind, result)

        return real(handle, device, separated, timeout, each)

    monkeypatch.setattr(demo, "_train_elsewhere", train)
    monkeypatch.setattr(demo, "SEPARATED_ROWS", 5_000)
    assert demo.run(rows=20_000, device="cpu", say=said.append) == 0
    start = said.index("<second process starts>")
    assert any(line.startswith("generate logreg in PostgreSQL (20,000 rows)") for line in said[:start])
    assert any(line.startswith("Arrow file -> cpu (read_arrow") for line in said[:start])
    noisy, exact = said.index("<noisy arrived>"), said.index("<exact arrived>")
    assert said[noisy + 1].startswith("logregr_train there on t (") and noisy < exact
    # about SEPARATED_ROWS rows, chosen by x5 (demo._separated_where): 5,000 of 20,000 are x5 < -0.6745
    line = said[exact + 1]
    assert line.startswith("logregr_train there on t_exact (") and "rows where x5 < -0.6745)" in line
    fitted = int(re.search(r"iterations, ([\d,]+) rows where", line).group(1).replace(",", ""))
    assert 4_500 <= fitted <= 5_500
    assert any(f"second act: t_exact, the same rule without noise, on {fitted:,} rows" in line for line in said)
    assert demo.CPU_ROWS <= 3_000_000 and demo.SEPARATED_ROWS <= 200_000


def test_demo_without_psycopg_names_the_extra_and_exits_2(tmp_path):
    # A plain install has no psycopg: an import blocker makes this interpreter look like one.
    code = textwrap.dedent(
        """
        import sys

        class NoPsycopg:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "psycopg":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoPsycopg())
        from pystrom.cli import main

        sys.exit(main(sys.argv[1:]))
        """
    )
    from pystrom._dist import DISTRIBUTION

    for args in (["--rows", "200000"], ["--dsn", "host=127.0.0.1"]):
        done = subprocess.run([sys.executable, "-c", code, "demo", *args], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith("pystrom demo: error: the demo needs psycopg")
        assert lines[0].endswith(f"pip install '{DISTRIBUTION}[demo]'"), lines[0]


def test_demo_without_server_binaries_names_the_extra(tmp_path):
    pytest.importorskip("psycopg")
    from pystrom._dist import DISTRIBUTION

    code = textwrap.dedent(
        """
        import sys
        import pystrom._embedded_pg as e
        e.find_server_binaries = lambda: None  # as on a machine with neither PostgreSQL nor pgserver
        from pystrom.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    done = subprocess.run([sys.executable, "-c", code, "demo", "--rows", "1000", "--device", "cpu"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no PostgreSQL server binaries" in lines[0], done.stderr
    assert f"pip install '{DISTRIBUTION}[demo]'" in lines[0]


def test_public_modules_do_not_leak_the_future_import():
    import pystrom.ml

    for module in (pystrom, pystrom.ml):
        assert "annotations" not in dir(module) and not hasattr(module, "annotations"), module.__name__


@pytest.mark.postgres
def test_demo_with_a_dsn_leaves_the_database_as_it_was(pg):
    before = pg.fetch("SELECT relname FROM pg_class WHERE relkind = 'r' ORDER BY 1")
    result = _cli("demo", "--rows", "20000", "--device", "cpu", "--dsn", pg.conninfo)
    assert result.returncode == 0, result.stderr
    assert "table pystrom_demo_" in result.stdout
    assert pg.fetch("SELECT relname FROM pg_class WHERE relkind = 'r' ORDER BY 1") == before


def test_demo_with_a_bad_dsn_is_one_line():
    pytest.importorskip("psycopg")
    result = _cli("demo", "--rows", "1000", "--device", "cpu", "--dsn", "host=127.0.0.1 port=1 connect_timeout=2")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr


def test_info_runs():
    result = _cli("info")
    assert result.returncode == 0, result.stderr
    assert f"pystrom {pystrom.__version__}" in result.stdout and "default device" in result.stdout


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["demo", "--rows", "0"], "positive integer"),
        (["demo", "--rows", "many"], "positive integer"),
        (["demo", "--device", "tpu"], "device 'tpu' makes no sense"),
        (["demo", "--bogus"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_cli_mistakes_are_one_line_and_exit_2(args, fragment):
    result = _cli(*args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2  # argparse: usage line + the error


@pytest.mark.gpu
@needs_gpu
def test_demo_uses_the_gpu_when_present():
    result = _cli("demo", "--rows", "200000")
    assert result.returncode == 0, result.stderr
    assert "device: cuda:0" in result.stdout and "PostgreSQL -> cuda:0" in result.stdout
    assert "read_arrow, KvikIO" in result.stdout and "ipc_import there (zero copy, cuda:0)" in result.stdout


@pytest.mark.postgres
def test_demo_cleans_up_on_ctrl_c():
    import shutil
    import signal
    import tempfile

    from pystrom._embedded_pg import find_server_binaries

    if find_server_binaries() is None:
        pytest.skip("no PostgreSQL server binaries")
    # A temporary directory of its own (short: the server's socket lives there), so that what other
    # tests on this machine leave in /tmp meanwhile does not count.
    tmp = tempfile.mkdtemp(prefix="pst-")
    os.chmod(tmp, 0o755)  # as root the server runs as another user, who must reach its directory in here
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pystrom", "demo", "--rows", "50000000", "--device", "cpu"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": tmp},
        )  # fmt: skip
        try:
            started = any(line.startswith("PostgreSQL:") for line in proc.stdout)  # stops at that line
            assert started, proc.stderr.read()
            assert os.listdir(tmp), "the demo made no server directory: TMPDIR was not used"
            proc.send_signal(signal.SIGINT)  # while the server generates the rows
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err
        assert "interrupted" in err and "Traceback" not in err
        assert os.listdir(tmp) == []  # server directory and work directory are gone
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_help_starts_with_a_quick_start_that_runs(tmp_path):
    """``help(pystrom)`` opens with the quick start (before the 3,000 lines of the API), and its code runs."""
    import pydoc

    import pystrom

    text = pydoc.render_doc(pystrom, renderer=pydoc.plaintext)
    head = text.splitlines()[:30]
    assert any("Quick start" in line for line in head[:8]), head[:8]
    doc = pystrom.__doc__
    block = doc[doc.index("Quick start") :].split("::\n\n", 1)[1].split("\n\n\n", 1)[0]
    lines = block.split("\n")
    end = next((i for i, line in enumerate(lines) if line and not line.startswith("    ")), len(lines))
    code = textwrap.dedent("\n".join(lines[:end]))
    assert 15 <= len(code.splitlines()) <= 25 and "read_arrow" in code and "@pystrom.udf" in code
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pystrom.Table: 5 rows x 2 columns" in done.stdout and done.stdout.strip().endswith("2")
