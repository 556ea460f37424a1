"""The ``pystrom`` command as a new user meets it: real subprocesses, a real store daemon on a
temporary socket, a real PostgreSQL (the ``pg`` fixture), real Arrow files.

Every subcommand works on the CPU backend, and every subcommand given wrong arguments prints
exactly one line on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from test_progress import run_on_pty
from test_store import Daemon

import pystrom

REPO = pathlib.Path(__file__).resolve().parents[1]
COMMANDS = ["demo", "info", "pg2arrow", "serve", "load", "ls", "drop", "bench", "arrow2pg", "dump"]


def cli(*args: str, cwd: str | os.PathLike | None = None, env: dict | None = None, timeout: float = 180):
    return subprocess.run(
        [sys.executable, "-m", "pystrom", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess, fragment: str) -> str:
    """The rule for user mistakes: exit code 2, one line on stderr naming the problem, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    assert lines[0].startswith("pystrom"), lines[0]
    assert "error:" in lines[0] and "Traceback" not in result.stderr
    assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(str(tmp_path / "run" / "store.sock"), "cpu")
    try:
        yield d
    finally:
        assert d.stop() == 0


def sample(rows: int = 5000) -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "x": rng.standard_normal(rows),
            "flag": rng.random(rows) < 0.3,
            "s": pa.array([f"s{i % 97}" if i % 11 else None for i in range(rows)]),
        }
    )


@pytest.fixture
def arrow_file(tmp_path) -> pathlib.Path:
    path = tmp_path / "data.arrow"
    pystrom.write_arrow(sample(), path, batch_rows=1000)
    return path


@pytest.fixture
def pg_table(pg) -> str:
    name = pg.name("cli")
    pg.execute(f"CREATE TABLE {name} (id int8, x float8, label text)")
    pg.execute(f"INSERT INTO {name} SELECT g, g / 4.0, 'row ' || g FROM generate_series(1, 3000) g")
    pg.execute(f"ANALYZE {name}")
    return name


# -- help and the entry points ----------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(command):
    out = ok(cli(command, "--help"))
    assert out.startswith(f"usage: pystrom {command}")
    assert "-h, --help" in out


def test_top_level_help_lists_every_subcommand_and_the_script_entry_point():
    out = ok(cli("--help"))
    for command in COMMANDS:
        assert f"\n    {command} " in out, command
    script = pathlib.Path(sys.executable).with_name("pystrom")  # the console script pip installed
    if not script.exists():  # a --user or system install puts it elsewhere on PATH
        script = pathlib.Path(shutil.which("pystrom") or script)
    assert script.exists(), script
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == out


def test_no_command_shows_help_and_exits_0():
    result = cli()
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout == ok(cli("--help"))  # the same help as --help: what there is to do


def test_version():
    from pystrom._dist import DISTRIBUTION

    out = ok(cli("--version"))
    assert out == f"pystrom {pystrom.__version__} ({DISTRIBUTION})\n"


@pytest.mark.parametrize(
    "nbytes,secs,shown",
    [
        (838_894, 0.08, ""),  # under 1 MB: start-up time, not a rate (was "9.9 MB/s")
        (50_000_000, 0.005, ""),  # under 10 ms: the timer's noise
        (32_778_004, 0.41, "79.9 MB/s"),
        (5_000_000_000, 1.0, "5.00 GB/s"),
        (2_000_000, 3.0, "667 kB/s"),  # slow loads keep their digits (was "0.0 MB/s" below 50 kB/s)
        (1_500_000, 0.5, "3.00 MB/s"),
    ],
)
def test_load_rate_is_shown_with_digits_or_not_at_all(nbytes, secs, shown):
    from pystrom._cli_commands import throughput

    assert throughput(nbytes, secs) == shown


def test_a_reader_that_leaves_early_is_no_error():  # `pystrom info | head -1`
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pystrom", "info"], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == ""


# -- the subcommands at work (CPU backend) -----------------------------------------------------------


def test_info_reports_libpq_and_settings():
    psycopg = pytest.importorskip("psycopg")
    out = ok(cli("info"))
    version = psycopg.pq.version()
    assert f"libpq          {version // 10000}.{version % 10000} (psycopg {psycopg.__version__}" in out
    assert f"pystrom {pystrom.__version__}" in out and "default device" in out
    assert "progress_delay 2.0 ($PYSTROM_PROGRESS_DELAY)" in out


def test_load_postgres_then_ls_and_drop(daemon, pg, pg_table):
    sock = daemon.path
    out = ok(cli("load", "--name", "whole", "--table", pg_table, "--dsn", pg.conninfo, "--partitions", "2",
                 "--socket", sock))  # fmt: skip
    assert out.startswith("whole: 3,000 rows x 3 columns, ") and f"from PostgreSQL table '{pg_table}'" in out
    assert f"-> {sock} on cpu" in out
    query = f"SELECT id, x FROM {pg_table} WHERE id % 3 = 0"
    out = ok(cli("load", "--name", "third", "-c", query, "-d", pg.conninfo, "--partition-on", "id",
                 "--partitions", "3", "--socket", sock))  # fmt: skip
    assert out.startswith("third: 1,000 rows x 2 columns, 16,000 bytes from PostgreSQL query")
    out = ok(cli("load", "--name", "some", "-t", pg_table, "-d", pg.conninfo, "--columns", "id,label",
                 "--where", "id <= 10", "--socket", sock))  # fmt: skip
    assert out.startswith("some: 10 rows x 2 columns")

    with pystrom.Store(sock) as store:
        whole = store.get("whole")
        assert whole.column_names == ["id", "x", "label"]
        got = whole.to_arrow().sort_by("id")
        assert got["id"].to_pylist() == list(range(1, 3001))
        assert got["x"].to_pylist() == [i / 4 for i in range(1, 3001)]
        assert got["label"][41].as_py() == "row 42"
        assert sorted(store.get("third").to_arrow()["id"].to_pylist()) == list(range(3, 3001, 3))
        assert store.get("some").to_arrow().sort_by("id")["label"].to_pylist()[-1] == "row 10"
        del whole

    listing = ok(cli("ls", "--socket", sock)).splitlines()
    assert listing[0].split() == ["name", "rows", "bytes", "device", "owner", "shared", "schema"]
    rows = {line.split()[0]: line for line in listing[1:-1]}
    assert set(rows) == {"whole", "third", "some"}
    assert rows["whole"].split()[1] == "3,000" and " cpu " in rows["whole"]
    assert rows["whole"].split()[5:7] == [str(os.getuid()), "-"]  # owned by this user, private
    assert rows["whole"].endswith("id: int64, x: double, label: string")
    assert rows["third"].split()[1:4] == ["1,000", "15.6", "KiB"]
    assert listing[-1] == f"3 table(s) in the store at {sock} (cpu)"

    assert ok(cli("drop", "third", "--socket", sock)).startswith("dropped 'third'")
    assert ok(cli("drop", "some", "--socket", sock)).startswith("dropped 'some'")
    assert [line.split()[0] for line in ok(cli("ls", "--socket", sock)).splitlines()[1:-1]] == ["whole"]
    ok(cli("drop", "whole", "--socket", sock))
    assert ok(cli("ls", "--socket", sock)) == f"no tables in the store at {sock} (cpu)\n"


def test_load_arrow_file_columns_where_glob_and_replace(daemon, arrow_file, tmp_path):
    sock = daemon.path
    out = ok(cli("load", "--name", "all", "--arrow", str(arrow_file), "--socket", sock))
    assert out.startswith("all: 5,000 rows x 4 columns, ") and f"from {arrow_file} in " in out
    ok(cli("load", "--name", "sel", "--arrow", str(arrow_file), "--columns", "id,s", "--where", "id < 10 and flag",
           "--socket", sock))  # fmt: skip
    second = tmp_path / "data2.arrow"
    pystrom.write_arrow(sample(300), second)
    out = ok(cli("load", "--name", "both", "--arrow", str(tmp_path / "data*.arrow"), "--columns", "id",
                 "--socket", sock))  # fmt: skip
    assert out.startswith("both: 5,300 rows x 1 columns")

    taken = cli("load", "--name", "all", "--arrow", str(second), "--socket", sock)
    one_line_error(taken, "already has a table named 'all' (add --replace)")
    ok(cli("load", "--name", "all", "--arrow", str(second), "--replace", "--socket", sock))

    expected = sample()
    keep = pa.compute.and_(pa.compute.less(expected["id"], 10), expected["flag"])
    with pystrom.Store(sock) as store:
        assert store.get("all").num_rows == 300
        assert store.get("sel").to_arrow().equals(expected.filter(keep).select(["id", "s"]))
        assert store.get("both").to_arrow()["id"].to_pylist() == list(range(5000)) + list(range(300))
        for name in ("all", "sel", "both"):
            store.drop(name)


def test_pg2arrow_writes_a_file(pg, pg_table, tmp_path):
    path = tmp_path / "out.arrow"
    out = ok(cli("pg2arrow", "-d", pg.conninfo, "-t", pg_table, "-o", str(path), "--batch-rows", "1000"))
    assert out.startswith(f"{path}: 3,000 rows in 3 record batch(es)")
    assert pa.ipc.open_file(path).read_all().sort_by("id")["label"][0].as_py() == "row 1"
    forced = cli("pg2arrow", "-d", pg.conninfo, "-t", pg_table, "-o", str(path), "--progress")
    assert forced.returncode == 0 and "read_postgres: 3.00k rows" in forced.stderr, forced.stderr


def test_pg2arrow_takes_the_query_as_load_does_and_the_old_spelling_too(pg, pg_table, tmp_path):
    query = f"SELECT id, label FROM {pg_table} WHERE id <= 10"
    written = []
    for flag in ("--query", "-c", "--command"):  # --command: PG-Strom's pg2arrow and pystrom 0.1.0 spell it so
        path = tmp_path / f"{flag.strip('-')}.arrow"
        ok(cli("pg2arrow", "-d", pg.conninfo, flag, query, "-o", str(path)))
        written.append(pa.ipc.open_file(path).read_all().sort_by("id"))
    assert written[0].num_rows == 10 and written[0].column_names == ["id", "label"]
    assert written[1].equals(written[0]) and written[2].equals(written[0])
    path = tmp_path / "cols.arrow"
    ok(cli("pg2arrow", "-d", pg.conninfo, "-t", pg_table, "--columns", "id,x", "--where", "id > 2990", "-o", str(path)))
    got = pa.ipc.open_file(path).read_all().sort_by("id")
    assert got.column_names == ["id", "x"] and got["id"].to_pylist() == list(range(2991, 3001))
    both = cli("pg2arrow", "-d", pg.conninfo, "--query", query, "--command", query, "-o", str(path))
    one_line_error(both, "not allowed with argument")


def test_load_and_pg2arrow_spell_their_common_options_alike():
    from pystrom.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]

    def options(command: str) -> dict[str, list[str]]:
        """{long option: its short forms} of the options a command's help shows."""
        found = {}
        for action in sub.choices[command]._actions:
            if action.help != argparse.SUPPRESS:
                shorts = [o for o in action.option_strings if not o.startswith("--")]
                found.update({o: shorts for o in action.option_strings if o.startswith("--")})
        return found

    load, pg2arrow = options("load"), options("pg2arrow")
    common = ["--query", "--table", "--dsn", "--schema", "--columns", "--where", "--partitions", "--partition-on",
              "--numeric", "--progress"]  # fmt: skip
    for option in common:
        assert option in load and option in pg2arrow, option
        assert load[option] == pg2arrow[option], (option, load[option], pg2arrow[option])
    assert "--command" not in pg2arrow  # the old spelling works but is not advertised
    assert "--command" not in ok(cli("pg2arrow", "--help"))


def test_bench_runs_the_checkouts_runner_with_its_arguments(tmp_path):
    # A checkout of its own, so the test controls what the runner does; a real one is run below.
    root = tmp_path / "checkout"
    (root / "benchmarks").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "pystrom-gpu"\n')
    (root / "benchmarks" / "bench_fake.py").write_text("")
    (root / "benchmarks" / "run.py").write_text(
        textwrap.dedent(
            """
            import os, sys
            print("runner", sys.argv[1:], os.getcwd())
            sys.exit(3)
            """
        )
    )
    inner = root / "benchmarks"  # found from a subdirectory too
    result = cli("bench", "--quick", "--device", "cpu", "--only", "fake", cwd=inner)
    assert result.returncode == 3  # the runner's own exit status
    assert result.stdout.strip() == f"runner ['--quick', '--device', 'cpu', '--only', 'fake'] {root}"


def test_bench_runs_a_real_benchmark_quickly():  # the cheapest one: a few seconds
    out = ok(cli("bench", "--quick", "--device", "cpu", "--only", "table", cwd=REPO, timeout=600))
    assert "running bench_table on cpu (quick)" in out and "2-D features (8 float64 columns)" in out


def test_serve_runs_and_stops_on_sigterm(tmp_path):
    d = Daemon(str(tmp_path / "s" / "store.sock"), "cpu")
    try:
        assert d.banner.startswith("pystrom store: serving cpu (memfd memory) on ")
        assert ok(cli("ls", "--socket", d.path)).startswith("no tables")
    finally:
        assert d.stop() == 0
    assert not os.path.exists(d.path)


# -- wrong arguments: one line, exit code 2 ---------------------------------------------------------

# Placeholders filled per test: {sock} a running daemon, {nosock} a socket nobody serves, {dsn} the
# test server, {table} a table there, {arrow} an Arrow file, {dir} a directory, {text} a text file,
# {tmp} the test's temporary directory.
MISTAKES = [
    # load
    (["load"], "the following arguments are required: --name"),
    (["load", "--name", "t"], "one of the arguments -c/--query -t/--table --arrow is required"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--table", "x"], "not allowed with argument"),
    (["load", "--name", "", "--arrow", "{arrow}"], "argument --name: expected a non-empty value"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--bogus"], "unrecognized arguments: --bogus"),
    (["load", "--name", "t", "--table", "x", "--socket", "{sock}"], "give the connection with --dsn"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--dsn", "{dsn}"], "--dsn go(es) with --query/--table"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--partitions", "2"], "--partitions go(es) with"),
    (["load", "--name", "t", "-c", "SELECT 1", "-d", "{dsn}", "--columns", "a"], "put them in the --query"),
    (["load", "--name", "t", "-t", "x", "-d", "{dsn}", "--partition-on", "id"], "--partition-on goes with --query"),
    (["load", "--name", "t", "-c", "SELECT 1", "-d", "{dsn}", "--schema", "s"], "--schema goes with --table"),
    (["load", "--name", "t", "-t", "{table}", "-d", "{dsn}", "--partitions", "0"], "expected a positive integer"),
    (["load", "--name", "t", "-t", "{table}", "-d", "{dsn}", "--numeric", "int"], "invalid choice: 'int'"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--columns", ",x"], "expected comma-separated column names"),
    (["load", "--name", "t", "--arrow", "{tmp}/missing.arrow"], "missing.arrow' does not exist"),
    (["load", "--name", "t", "--arrow", "{dir}"], "is a directory, not a file"),
    (["load", "--name", "t", "--arrow", "{text}", "--socket", "{sock}"], "is not an Arrow IPC file"),
    (["load", "--name", "t", "--arrow", "{tmp}/none*.arrow", "--socket", "{sock}"], "no file matches"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--columns", "zz", "--socket", "{sock}"], "column 'zz' is not"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--where", "id >", "--socket", "{sock}"], "where expression"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--where", "nope > 1", "--socket", "{sock}"], "nope"),
    (["load", "--name", "t", "--arrow", "{arrow}", "--socket", "{nosock}"], "no pystrom store daemon answers"),
    (
        ["load", "--name", "t", "-t", "{table}", "-d", "host=/nonexistent dbname=x", "--socket", "{sock}"],
        "cannot connect to PostgreSQL",
    ),  # fmt: skip
    (["load", "--name", "t", "-t", "{table}", "-d", "not a dsn", "--socket", "{sock}"], "cannot connect"),
    (["load", "--name", "t", "-t", "no_such_table", "-d", "{dsn}", "--socket", "{sock}"], "does not exist"),
    (["load", "--name", "t", "-c", "SELECT nope FROM nowhere", "-d", "{dsn}", "--socket", "{sock}"], "nowhere"),
    (["load", "--name", "t", "-c", "SELECT 1", "-d", "{dsn}", "--socket", "{nosock}"], "no pystrom store daemon"),
    # ls, drop
    (["ls", "--socket", "{nosock}"], "no pystrom store daemon answers"),
    (["ls", "extra"], "unrecognized arguments: extra"),
    (["ls", "--socket"], "argument --socket: expected one argument"),
    (["drop"], "the following arguments are required: name"),
    (["drop", "ghost", "--socket", "{sock}"], "the store has no table named 'ghost'"),
    (["drop", "ghost", "--socket", "{nosock}"], "no pystrom store daemon answers"),
    (["drop", "a", "b"], "unrecognized arguments: b"),
    # info
    (["info", "--bogus"], "unrecognized arguments: --bogus"),
    # bench
    (["bench", "--bogus"], "unrecognized arguments: --bogus"),
    (["bench", "--quick"], "no benchmarks/run.py in"),  # run in an empty directory, as from a wheel
    (["bench", "--only", "nope"], "no benchmark 'nope' in"),
    (["bench", "--device", "tpu"], "device 'tpu' makes no sense"),
    # pg2arrow
    (["pg2arrow"], "the following arguments are required: -d/--dsn, -o/--output"),
    (["pg2arrow", "-d", "{dsn}", "-o", "{tmp}/o.arrow"], "one of the arguments -c/--query -t/--table is required"),
    (["pg2arrow", "-d", "{dsn}", "-o", "{tmp}/o.arrow", "-t", "{table}", "--partitions", "-1"], "positive integer"),
    (["pg2arrow", "-d", "{dsn}", "-o", "{tmp}/o.arrow", "-t", "{table}", "--numeric", "x"], "invalid choice"),
    (["pg2arrow", "-d", "not a dsn", "-o", "{tmp}/o.arrow", "-t", "{table}"], "cannot connect"),
    (["pg2arrow", "-d", "{dsn}", "-o", "{tmp}/o.arrow", "-t", "no_such_table"], "does not exist"),
    (["pg2arrow", "-d", "{dsn}", "-o", "{tmp}/no/dir/o.arrow", "-t", "{table}"], "o.arrow"),
    (["pg2arrow", "-d", "{dsn}", "-o", "{tmp}/o.arrow", "-t", "{table}", "--bogus"], "unrecognized arguments"),
    # serve
    (["serve", "--device", "tpu"], "device 'tpu' makes no sense"),
    (["serve", "--allow-uids", "root"], "expected comma-separated numeric ids"),
    (["serve", "--memory", "magic"], "invalid choice: 'magic'"),
    (["serve", "--socket", "{sock}", "--device", "cpu"], "another store daemon already serves"),
    (["serve", "--socket", "/proc/pystrom/store.sock", "--device", "cpu"], "cannot create the socket directory"),
    # arrow2pg / dump
    (["arrow2pg", "{arrow}"], "the following arguments are required: name, -d/--dsn"),
    (["arrow2pg", "{tmp}/nope.arrow", "t", "-d", "{dsn}"], "does not exist"),
    (["arrow2pg", "{arrow}", "t", "-d", "{dsn}", "--if-exists", "merge"], "invalid choice: 'merge'"),
    (["arrow2pg", "{arrow}", "{table}", "-d", "{dsn}"], "already exists (if_exists='fail')"),
    (["arrow2pg", "{arrow}", "t", "-d", "{dsn}", "--columns", "id,nope"], "'nope'"),
    (["arrow2pg", "{arrow}", "t", "-d", "{dsn}", "--partitions", "0"], "expected a positive integer"),
    (["dump", "nothere", "t", "-d", "{dsn}", "--socket", "{sock}"], "nothere"),
    (["dump", "x", "t", "-d", "{dsn}", "--socket", "{nosock}"], "store"),
    # the command itself
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
]


def _needs(args: list[str], what: str) -> bool:
    return any(what in a for a in args)


@pytest.mark.parametrize("args,fragment", MISTAKES, ids=[" ".join(a)[:60] for a, _ in MISTAKES])
def test_mistakes_are_one_line_and_exit_2(args, fragment, request, tmp_path):
    values = {"tmp": str(tmp_path), "nosock": str(tmp_path / "nobody" / "store.sock")}
    if _needs(args, "{sock}"):
        values["sock"] = request.getfixturevalue("daemon").path
    if _needs(args, "{dsn}") or _needs(args, "{table}"):
        pg = request.getfixturevalue("pg")
        values["dsn"] = pg.conninfo
        values["table"] = request.getfixturevalue("pg_table")
    if _needs(args, "{arrow}"):
        values["arrow"] = str(request.getfixturevalue("arrow_file"))
    (tmp_path / "adir").mkdir()
    values["dir"] = str(tmp_path / "adir")
    (tmp_path / "notes.txt").write_text("not an arrow file\n")
    values["text"] = str(tmp_path / "notes.txt")
    argv = [a.format(**values) for a in args]
    # `bench` looks for the checkout around the current directory: the repository, except where
    # the case is about running without one.
    cwd = tmp_path if argv[:2] == ["bench", "--quick"] else REPO
    line = one_line_error(cli(*argv, cwd=cwd), fragment)
    if argv[0] in COMMANDS:  # the line names the subcommand that was used wrongly
        assert line.startswith(f"pystrom {argv[0]}: error: "), line


# -- arrow2pg and dump: back into PostgreSQL --------------------------------------------------------


def test_arrow2pg_and_dump(daemon, pg, arrow_file):
    name = pg.name("from_arrow")
    out = ok(cli("arrow2pg", str(arrow_file), name, "-d", pg.conninfo, "--partitions", "2"))
    assert out.startswith(f"{name}: 5,000 rows, ") and f"from Arrow file '{arrow_file}'" in out
    want = sample()
    got = pg.fetch(f"SELECT id, x, flag, s FROM {name} ORDER BY id")
    assert [r[0] for r in got] == want["id"].to_pylist() and [r[1] for r in got] == want["x"].to_pylist()
    assert [r[3] for r in got] == want["s"].to_pylist()
    out = ok(cli("arrow2pg", str(arrow_file), name, "-d", pg.conninfo, "--if-exists", "append",
                 "--columns", "id,s", "--where", "id < 10"))  # fmt: skip
    assert out.startswith(f"{name}: 10 rows, ")
    assert pg.fetch(f"SELECT count(*), count(x) FROM {name}") == [(5010, 5000)]

    ok(cli("load", "--name", "tbl", "--arrow", str(arrow_file), "--socket", daemon.path))
    dumped = pg.name("dumped")
    out = ok(cli("dump", "tbl", dumped, "-d", pg.conninfo, "--socket", daemon.path, "--columns", "id,flag"))
    assert out.startswith(f"{dumped}: 5,000 rows, ") and "from store table 'tbl' (cpu)" in out
    assert pg.fetch(f"SELECT count(*), sum(id), count(*) FILTER (WHERE flag) FROM {dumped}") == [
        (5000, sum(range(5000)), sum(want["flag"].to_pylist()))
    ]
    ok(cli("dump", "tbl", dumped, "-d", pg.conninfo, "--socket", daemon.path, "--if-exists", "replace"))
    assert pg.fetch(f"SELECT count(*), count(s) FROM {dumped}") == [(5000, want["s"].drop_null().__len__())]


def test_arrow2pg_progress(pg, tmp_path):
    path = tmp_path / "x.arrow"
    pystrom.write_arrow(pa.table({"x": np.arange(100_000, dtype=np.int64)}), path, batch_rows=25_000)
    name = pg.name("bar")
    base = [sys.executable, "-m", "pystrom", "arrow2pg", str(path), name, "-d", pg.conninfo, "--if-exists", "replace"]
    code, out, tty = run_on_pty(base, env={"PYSTROM_PROGRESS_DELAY": "0"})
    assert code == 0 and out.startswith(f"{name}: 100,000 rows")
    assert "write_postgres: 100%" in tty and "read_arrow: 100%" in tty, repr(tty)
    piped = subprocess.run([*base, "--no-progress"], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""


# -- the progress bar of `load` ---------------------------------------------------------------------


def test_cli_load_progress(tmp_path):
    path = tmp_path / "x.arrow"
    pystrom.write_arrow(pa.table({"x": np.arange(100_000, dtype=np.int64)}), path, batch_rows=25_000)
    daemon = Daemon(str(tmp_path / "run" / "store.sock"), "cpu")
    try:
        base = [sys.executable, "-m", "pystrom", "load", "--arrow", str(path), "--socket", daemon.path]
        no_delay = {"PYSTROM_PROGRESS_DELAY": "0"}
        code, out, tty = run_on_pty([*base, "--name", "a"], env=no_delay)
        assert code == 0 and out.startswith("a: 100,000 rows x 1 columns")
        assert "read_arrow: 100%" in tty, repr(tty)
        code, out, tty = run_on_pty([*base, "--name", "b", "--no-progress"], env=no_delay)
        assert code == 0 and out.startswith("b: 100,000 rows") and tty == ""
        code, out, tty = run_on_pty([*base, "--name", "c"])  # short, default delay: no bar
        assert code == 0 and tty == ""
        piped = subprocess.run([*base, "--name", "d", "--progress"], capture_output=True, text=True, timeout=120)
        assert piped.returncode == 0 and "read_arrow: 100%" in piped.stderr
        quiet = subprocess.run([*base, "--name", "e"], capture_output=True, text=True, timeout=120, env=no_delay)
        assert quiet.returncode == 0 and quiet.stderr == ""  # not a terminal: no bar
    finally:
        assert daemon.stop() == 0
