"""The store and tooling subcommands of ``pystrom``: ``load``, ``ls``, ``drop``, ``bench``, and the
writers back into PostgreSQL, ``arrow2pg`` (an Arrow file) and ``dump`` (a table of the store).

``cli.py`` owns the parser and ``main``; this module adds these subcommands to it. Their mistakes
(a missing option, a file that is not there, a daemon that is not running, an unknown table) are
raised as pystrom errors or ``OSError`` and end, in ``main``, as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

from ._dist import DISTRIBUTION
from .errors import InvalidArgumentError

__all__ = ["add_commands", "add_progress_flag", "column_list", "libpq_version", "table_name"]


def table_name(args: argparse.Namespace) -> str | tuple[str, str] | None:
    """``--table`` qualified by ``--schema`` as read_postgres takes it, or None without ``--table``."""
    if args.table is None:
        return None
    return (args.schema, args.table) if args.schema else args.table


def add_progress_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--progress/--no-progress``: None (the default) leaves the choice to pystrom's automatic rule."""
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"progress bar on stderr (default: when stderr is a terminal and the {what} takes over 2 s)",
    )


def column_list(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",")]
    if not text.strip() or not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return names


def _share_with(text: str) -> list[int] | str:
    if text.strip() == "all":
        return "all"
    try:
        uids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numeric uids or 'all', got {text!r}") from None
    if not uids or any(u < 0 for u in uids):
        raise argparse.ArgumentTypeError(f"expected comma-separated numeric uids or 'all', got {text!r}")
    return uids


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value")
    return text


def _size(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:,.0f} {unit}" if unit == "bytes" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def throughput(nbytes: int, secs: float) -> str:
    """``"1.23 GB/s"``, ``"45.6 MB/s"`` or ``"789 kB/s"`` (about three significant digits); ``""`` for reads too
    short (under 10 ms) or too small (under 1 MB) for a rate to mean anything: there the time is start-up."""
    if secs < 0.01 or nbytes < 1e6:
        return ""
    per_sec = nbytes / secs
    unit, scale = ("GB/s", 1e9) if per_sec >= 1e9 else ("MB/s", 1e6) if per_sec >= 1e6 else ("kB/s", 1e3)
    value = per_sec / scale
    return f"{value:.{0 if value >= 100 else 1 if value >= 10 else 2}f} {unit}"


def _store(socket: str | None) -> Any:
    from .ipc.client import Store

    return Store(socket)


# -- load -------------------------------------------------------------------------------------------


def _check_load(args: argparse.Namespace) -> None:
    """Option combinations argparse cannot express; one message naming the options at fault."""
    if args.arrow is not None:
        wrong = [
            flag
            for flag, value in (
                ("--dsn", args.dsn),
                ("--schema", args.schema),
                ("--partitions", args.partitions),
                ("--partition-on", args.partition_on),
                ("--numeric", args.numeric),
            )
            if value is not None
        ]
        if wrong:
            raise InvalidArgumentError(f"{', '.join(wrong)} go(es) with --query/--table, not with --arrow")
        if not any(ch in args.arrow for ch in "*?[") and not os.path.isfile(args.arrow):
            what = "is a directory, not a file" if os.path.isdir(args.arrow) else "does not exist"
            raise FileNotFoundError(f"Arrow file {args.arrow!r} {what}")
        return
    if args.dsn is None:
        raise InvalidArgumentError("--query and --table read from PostgreSQL: give the connection with --dsn")
    if args.query is not None and (args.columns is not None or args.where is not None):
        raise InvalidArgumentError("--columns and --where go with --table or --arrow; put them in the --query")
    if args.schema is not None and args.table is None:
        raise InvalidArgumentError("--schema goes with --table")
    if args.partition_on is not None and args.query is None:
        raise InvalidArgumentError("--partition-on goes with --query (a --table read is split by pages)")


def _load(args: argparse.Namespace) -> int:
    _check_load(args)
    with _store(args.socket) as store:  # first, so a daemon that is not running fails before a long read
        if not args.replace and any(t["name"] == args.name for t in store.list()):
            from .errors import TableExistsError

            raise TableExistsError(f"the store already has a table named {args.name!r} (add --replace)")
        device = store.device
        start = time.perf_counter()
        if args.arrow is not None:
            from .io.arrow import read_arrow, scan_arrow

            if any(ch in args.arrow for ch in "*?["):  # a glob: several files, one table
                scan = scan_arrow(args.arrow, args.columns, args.where, device=device, progress=args.progress)
                table = scan.collect()
            else:
                table = read_arrow(args.arrow, args.columns, args.where, device=device, progress=args.progress)
            source = args.arrow
        else:
            from .io.postgres import read_postgres

            table = read_postgres(
                args.dsn,
                args.query,
                table=table_name(args),
                columns=args.columns,
                where=args.where,
                partitions=args.partitions,
                partition_on=args.partition_on,
                numeric=args.numeric or "float64",
                device=device,
                progress=args.progress,
            )
            source = "PostgreSQL " + (f"table {args.table!r}" if args.table is not None else "query")
        read_secs = time.perf_counter() - start
        with table:
            rows, cols, nbytes = table.num_rows, table.num_columns, table.nbytes
            store.put(args.name, table, replace=args.replace, share_with=args.share_with)
        secs = time.perf_counter() - start
    rate = throughput(nbytes, read_secs)
    rate = f", {rate}" if rate else ""
    print(
        f"{args.name}: {rows:,} rows x {cols} columns, {nbytes:,} bytes from {source} in {secs:.2f} s "
        f"(read {read_secs:.2f} s{rate}; store {secs - read_secs:.2f} s) -> {store.address} on {device}"
    )
    return 0


# -- ls / drop --------------------------------------------------------------------------------------


def _short_schema(schema: Any, width: int = 60) -> str:
    parts = [f"{f.name}: {f.type}" for f in schema]
    text = ""
    for i, part in enumerate(parts):
        more = f", ... (+{len(parts) - i})" if i else f"... (+{len(parts)})"
        candidate = f"{text}, {part}" if text else part
        if len(candidate) > width and i:
            return text + more
        text = candidate
    return text


def _ls(args: argparse.Namespace) -> int:
    with _store(args.socket) as store:
        tables = sorted(store.list(), key=lambda t: t["name"])
        where = f"{store.address} ({store.info.get('device')})"
    if not tables:
        print(f"no tables in the store at {where}")
        return 0
    rows = [
        (t["name"], f"{t['num_rows']:,}", _size(t["nbytes"]), str(t["device"]), str(t.get("owner", "")),
         _shared(t.get("shared_with")), _short_schema(t["schema"]))
        for t in tables
    ]  # fmt: skip
    head = ("name", "rows", "bytes", "device", "owner", "shared", "schema")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    right = {1, 2}  # numbers align right
    for row in [head, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())
    print(f"{len(tables)} table(s) in the store at {where}")
    return 0


def _shared(shared_with: Any) -> str:
    """Who besides its owner may read a table: "all", uids, or "-" (private)."""
    if shared_with == "all":
        return "all"
    return ",".join(map(str, shared_with)) if shared_with else "-"


def _drop(args: argparse.Namespace) -> int:
    with _store(args.socket) as store:
        store.drop(args.name)
    print(f"dropped {args.name!r} (its memory is freed once no reader holds a view of it)")
    return 0


# -- bench ------------------------------------------------------------------------------------------


def _checkout(start: pathlib.Path) -> pathlib.Path | None:
    """The pystrom checkout holding ``start`` (a directory with benchmarks/run.py and pystrom's pyproject)."""
    for directory in [start, *start.parents]:
        runner, project = directory / "benchmarks" / "run.py", directory / "pyproject.toml"
        if runner.is_file() and project.is_file():
            try:
                if f'name = "{DISTRIBUTION}"' in project.read_text(encoding="utf-8", errors="replace"):
                    return directory
            except OSError:
                continue
    return None


def _bench(args: argparse.Namespace) -> int:
    cwd = pathlib.Path.cwd()
    root = _checkout(cwd)
    if root is None:
        raise InvalidArgumentError(
            f"no benchmarks/run.py in {cwd} or its parents: run `pystrom bench` inside a pystrom checkout "
            "(the benchmarks are not part of the installed package)"
        )
    bench_dir = root / "benchmarks"
    if args.only is not None and not (bench_dir / f"bench_{args.only}.py").is_file():
        known = sorted(p.stem.removeprefix("bench_") for p in bench_dir.glob("bench_*.py"))
        raise InvalidArgumentError(f"no benchmark {args.only!r} in {bench_dir}; there are: {', '.join(known)}")
    if args.device is not None:
        from .memory.backend import resolve_device

        resolve_device(args.device)  # a bad device is a one-line error here, not a traceback in the runner
    argv = [sys.executable, str(bench_dir / "run.py")]
    if args.quick:
        argv.append("--quick")
    if args.device is not None:
        argv += ["--device", args.device]
    if args.only is not None:
        argv += ["--only", args.only]
    print(f"pystrom bench: running {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    return subprocess.run(argv, cwd=root).returncode


# -- info -------------------------------------------------------------------------------------------


def libpq_version() -> str:
    """The libpq that psycopg loaded (the one read_postgres uses), for ``pystrom info``."""
    try:
        import psycopg
    except ImportError:
        from ._dist import install_hint

        return f"psycopg not installed ({install_hint('postgres')})"
    except Exception as exc:  # psycopg present but no usable libpq
        return f"unusable ({type(exc).__name__}: {exc})"
    version = psycopg.pq.version()  # e.g. 170004 for 17.4 (10 and later: major * 10000 + minor)
    text = f"{version // 10000}.{version % 10000}" if version >= 100000 else str(version)
    return f"{text} (psycopg {psycopg.__version__}, {psycopg.pq.__impl__} implementation)"


# -- arrow2pg / dump: tables back into PostgreSQL -----------------------------------------------------


def _pg_target(args: argparse.Namespace) -> str | tuple[str, str]:
    return (args.schema, args.name) if args.schema else args.name


def _write_pg(table: Any, args: argparse.Namespace, source: str, start: float) -> int:
    from .io.postgres import write_postgres

    written = time.perf_counter()
    with table:
        nbytes = table.nbytes
        rows = write_postgres(
            table,
            args.dsn,
            _pg_target(args),
            if_exists=args.if_exists,
            columns=args.columns,
            partitions=args.partitions,
            progress=args.progress,
        )
    now = time.perf_counter()
    target = f"{args.schema}.{args.name}" if args.schema else args.name
    print(
        f"{target}: {rows:,} rows, {nbytes:,} bytes from {source} in {now - start:.2f} s "
        f"(read {written - start:.2f} s; write {now - written:.2f} s, if_exists={args.if_exists})"
    )
    return 0


def _arrow2pg(args: argparse.Namespace) -> int:
    from .io.arrow import read_arrow

    if not os.path.isfile(args.file):
        what = "is a directory, not a file" if os.path.isdir(args.file) else "does not exist"
        raise FileNotFoundError(f"Arrow file {args.file!r} {what}")
    start = time.perf_counter()
    table = read_arrow(args.file, args.columns, args.where, device=args.device, progress=args.progress)
    return _write_pg(table, args, f"Arrow file {args.file!r}", start)


def _dump(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    with _store(args.socket) as store:
        table = store.get(args.store_name)  # a view of the daemon's memory, on its device
        return _write_pg(table, args, f"store table {args.store_name!r} ({table.device})", start)


def _add_pg_write_options(parser: argparse.ArgumentParser, positive_int: Any) -> None:
    parser.add_argument("name", type=_nonempty, help="PostgreSQL table to write (one identifier)")
    parser.add_argument("-d", "--dsn", required=True, type=_nonempty, help="libpq connection string or URI")
    parser.add_argument("--schema", type=_nonempty, help="schema of the table (default: the search path's)")
    parser.add_argument(
        "--if-exists",
        choices=("fail", "append", "replace"),
        default="fail",
        help="when the table exists: fail (default), append the rows, or replace the table",
    )
    parser.add_argument("--partitions", type=positive_int, help="connections writing in parallel (default: automatic)")


# -- parser wiring ----------------------------------------------------------------------------------


def add_commands(sub: Any, positive_int: Any) -> None:
    """Add ``load``, ``ls``, ``drop``, ``bench``, ``arrow2pg`` and ``dump`` to the subparsers of ``pystrom``."""
    socket_help = "the daemon's socket (default: $PYSTROM_STORE_SOCKET, else the per-user default)"

    load = sub.add_parser(
        "load",
        help="load a PostgreSQL query/table or an Arrow file into a named table of the store daemon",
        description="Load a PostgreSQL query or table, or an Arrow IPC file, into a named table of the store "
        "daemon (`pystrom serve`), on the daemon's device.",
    )
    load.add_argument("--name", required=True, type=_nonempty, help="name of the table in the store")
    source = load.add_mutually_exclusive_group(required=True)
    source.add_argument("-c", "--query", type=_nonempty, help="SQL query whose result is loaded (needs --dsn)")
    source.add_argument("-t", "--table", type=_nonempty, help="PostgreSQL table to load (needs --dsn)")
    source.add_argument("--arrow", metavar="PATH", type=_nonempty, help="Arrow IPC file (or a glob of files)")
    load.add_argument("-d", "--dsn", type=_nonempty, help="libpq connection string or URI")
    load.add_argument("--schema", type=_nonempty, help="schema of --table")
    load.add_argument("--columns", type=column_list, help="comma-separated columns (with --table or --arrow)")
    load.add_argument(
        "--where",
        type=_nonempty,
        help="rows to keep: SQL condition with --table, pystrom expression (docs/where.md) with --arrow",
    )
    load.add_argument("--partitions", type=positive_int, help="connections reading --table/--query in parallel")
    load.add_argument("--partition-on", type=_nonempty, help="integer column splitting --query over connections")
    load.add_argument("--numeric", choices=("float64", "decimal"), help="numeric columns as (default float64)")
    load.add_argument("--socket", default=None, help=socket_help)
    load.add_argument("--replace", action="store_true", help="replace a table of the same name")
    load.add_argument(
        "--share-with",
        type=_share_with,
        default=None,
        metavar="UIDS|all",
        help="other users who may read the table: comma-separated uids, or all (default: private)",
    )
    add_progress_flag(load, "load")
    load.set_defaults(run=_load)

    ls = sub.add_parser("ls", help="list the tables of the store daemon", description="List the store's tables.")
    ls.add_argument("--socket", default=None, help=socket_help)
    ls.set_defaults(run=_ls)

    drop = sub.add_parser("drop", help="drop a table of the store daemon", description="Drop a table of the store.")
    drop.add_argument("name", type=_nonempty, help="the table to drop")
    drop.add_argument("--socket", default=None, help=socket_help)
    drop.set_defaults(run=_drop)

    bench = sub.add_parser(
        "bench",
        help="run the benchmarks (benchmarks/run.py of a checkout)",
        description="Run benchmarks/run.py of the pystrom checkout around the current directory and print "
        "one table of ratios against the baselines measured in the same run.",
    )
    bench.add_argument("--quick", action="store_true", help="small sizes, about 2 minutes")
    bench.add_argument("--device", type=_nonempty, help="cpu, cuda or cuda:N (default: a GPU if present)")
    bench.add_argument("--only", type=_nonempty, help="run only benchmarks/bench_<ONLY>.py")
    bench.set_defaults(run=_bench)

    arrow2pg = sub.add_parser(
        "arrow2pg",
        help="write an Arrow IPC file into a PostgreSQL table (all or nothing)",
        description="Read an Arrow IPC file and write it into a PostgreSQL table with write_postgres: binary COPY "
        "over several connections into a staging table, put in place by one transaction.",
    )
    arrow2pg.add_argument("file", type=_nonempty, help="the Arrow IPC file")
    _add_pg_write_options(arrow2pg, positive_int)
    arrow2pg.add_argument("--columns", type=column_list, help="comma-separated columns to write (default: all)")
    arrow2pg.add_argument("--where", type=_nonempty, help="rows to write: a pystrom expression (docs/where.md)")
    arrow2pg.add_argument("--device", type=_nonempty, help="cpu, cuda or cuda:N (default: a GPU if present)")
    add_progress_flag(arrow2pg, "read or the write")
    arrow2pg.set_defaults(run=_arrow2pg)

    dump = sub.add_parser(
        "dump",
        help="write a table of the store daemon into a PostgreSQL table (all or nothing)",
        description="Write a named table of the store daemon (`pystrom serve`) into a PostgreSQL table with "
        "write_postgres, encoded on the daemon's device.",
    )
    dump.add_argument("store_name", type=_nonempty, help="the table of the store")
    _add_pg_write_options(dump, positive_int)
    dump.add_argument("--columns", type=column_list, help="comma-separated columns to write (default: all)")
    dump.add_argument("--socket", default=None, help=socket_help)
    add_progress_flag(dump, "write")
    dump.set_defaults(run=_dump)
