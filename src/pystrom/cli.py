"""The ``pystrom`` command: ``demo``, ``info``, ``pg2arrow``, ``serve``; ``load``, ``ls``, ``drop`` and
``bench`` live in ``_cli_commands``.

User mistakes end as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from .errors import Error


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints the usage too)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


# -- demo -------------------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from .demo import missing_dependency, run

    missing = missing_dependency(args.dsn)
    if missing is not None:  # checked before anything starts: a plain install has no psycopg
        print(f"pystrom demo: error: {missing}", file=sys.stderr)
        return 2
    return run(rows=args.rows, device=args.device, dsn=args.dsn)


# -- info -------------------------------------------------------------------------------------------


def _info(args: argparse.Namespace) -> int:
    import importlib.metadata as md
    import platform

    from . import __version__, defaults
    from ._dist import DISTRIBUTION
    from .memory.backend import cuda_device_count, no_gpu_reason, resolve_device

    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "not installed"

    print(f"pystrom {__version__} ({DISTRIBUTION}) on Python {platform.python_version()} ({platform.machine()})")
    for dist in ("numpy", "pyarrow", "cupy-cuda13x", "cupy-cuda12x", "kvikio-cu13", "kvikio-cu12"):
        print(f"  {dist:<14} {version(dist)}")
    from ._cli_commands import libpq_version

    print(f"  libpq          {libpq_version()}")
    count = cuda_device_count()
    if count:
        for i in range(count):
            print(f"  cuda:{i}         {resolve_device(f'cuda:{i}').name}")
    else:
        print(f"  GPU            none ({no_gpu_reason()})")
    print(f"  default device {resolve_device(None).device}")
    if count and any(version(d) != "not installed" for d in ("kvikio-cu13", "kvikio-cu12")):
        from .io.arrow.file.ranges import _configure_kvikio, kvikio_settings

        try:
            _configure_kvikio()
            kv = kvikio_settings()
            gds = {True: "available", False: "not available", None: "unknown"}[kv.pop("gds_driver")]
            print(f"  KvikIO         {', '.join(f'{k}={v}' for k, v in kv.items())}; GPUDirect Storage {gds}")
        except Exception as exc:  # a broken KvikIO install must not break `info`
            print(f"  KvikIO         unusable: {exc}")
    for name, (value, env, _) in defaults.describe().items():
        print(f"  {name:<14} {value!r} (${env})")
    return 0


def _pg2arrow(args: argparse.Namespace) -> int:
    from ._cli_commands import table_name
    from .io.postgres import postgres_to_arrow

    start = time.perf_counter()
    summary = postgres_to_arrow(
        args.dsn,
        args.output,
        args.query,
        table=table_name(args),
        columns=args.columns,
        where=args.where,
        batch_rows=args.batch_rows,
        partitions=args.partitions,
        partition_on=args.partition_on,
        numeric=args.numeric,
        stats=not args.no_stats,
        progress=args.progress,
        compression=args.compression,
        compression_level=args.compression_level,
    )
    print(
        f"{summary.path}: {summary.num_rows:,} rows in {summary.num_batches} record batch(es), "
        f"{summary.bytes_written:,} bytes, {time.perf_counter() - start:.2f} s"
    )
    return 0


# -- serve ------------------------------------------------------------------------------------------


def _id_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numeric ids, got {text!r}") from None


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _byte_size(text: str) -> int:
    """``123``, ``512M``, ``64G``, ``1.5TiB``: bytes (units are powers of 1024)."""
    t = text.strip().lower().replace("_", "").removesuffix("ib").removesuffix("b")
    unit = t[-1:] if t[-1:] in _SIZE_UNITS else ""
    try:
        value = int(float(t[: len(t) - len(unit)]) * _SIZE_UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 512M or 64G, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def _serve(args: argparse.Namespace) -> int:
    from .ipc.server import _announce, serve

    if args.allow_uids:
        print(
            "pystrom serve: --allow-uids is deprecated and now means --writers (put tables of their own, read "
            "tables shared with them); use --readers/--writers",
            file=sys.stderr,
        )
    serve(
        args.socket,
        args.device,
        allow_gids=args.allow_gids,
        memory=args.memory,
        ready=_announce,
        max_connections=args.max_connections,
        readers=args.readers,
        writers=[*args.writers, *args.allow_uids],
        max_bytes=args.max_bytes,
        max_bytes_per_uid=args.max_bytes_per_uid,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from ._cli_commands import add_progress_flag, column_list
    from ._dist import DISTRIBUTION

    parser = _Parser(prog="pystrom", description="PostgreSQL and Arrow data straight into GPU memory.")
    parser.add_argument("--version", action="version", version=f"pystrom {__version__} ({DISTRIBUTION})")
    sub = parser.add_subparsers(dest="command", metavar="command", parser_class=_Parser)
    demo = sub.add_parser(
        "demo",
        help="a guided tour: PostgreSQL -> GPU -> Arrow file -> another process fits a logistic regression",
        description="Generate a table of labelled rows in a throwaway PostgreSQL server (or --dsn), load it "
        "onto the GPU (the CPU without one), write and read it as an Arrow file, share it with a second "
        f"process that fits a logistic regression, and print the time of each step. Needs {DISTRIBUTION}[demo].",
    )
    demo.add_argument("--rows", type=_positive_int, default=None,
                      help="rows to generate (default 10,000,000 on a GPU, 3,000,000 on the CPU)")  # fmt: skip
    demo.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if present)")
    demo.add_argument("--dsn", default=None, help="use this database instead of a throwaway PostgreSQL server")
    demo.set_defaults(run=_demo)
    info = sub.add_parser("info", help="versions, GPUs and settings")
    info.set_defaults(run=_info)
    pg2arrow = sub.add_parser(
        "pg2arrow",
        help="write a PostgreSQL query result or table to an Arrow IPC file",
        description="Write a PostgreSQL query result or table to an Arrow IPC file with min/max statistics.",
    )
    pg2arrow.add_argument("-d", "--dsn", required=True, help="libpq connection string or URI")
    source = pg2arrow.add_mutually_exclusive_group(required=True)
    source.add_argument("-c", "--query", help="SQL query whose result is written")
    # PG-Strom's pg2arrow (and pystrom until 0.1.0) spell it --command: still accepted, not advertised
    source.add_argument("--command", dest="query", help=argparse.SUPPRESS)
    source.add_argument("-t", "--table", help="table to write (one identifier; schema.name with --schema)")
    pg2arrow.add_argument("--schema", default=None, help="schema of --table")
    pg2arrow.add_argument("--columns", type=column_list, default=None, help="comma-separated columns (with --table)")
    pg2arrow.add_argument("--where", default=None, help="rows to keep: a SQL condition (with --table)")
    pg2arrow.add_argument("-o", "--output", required=True, help="Arrow file to write")
    pg2arrow.add_argument("--batch-rows", type=_positive_int, default=1 << 20, help="rows per record batch")
    pg2arrow.add_argument("--partitions", type=_positive_int, default=None, help="connections for a --table read")
    pg2arrow.add_argument("--partition-on", default=None, help="integer column splitting --query over connections")
    pg2arrow.add_argument("--numeric", choices=("float64", "decimal"), default="float64", help="numeric columns as")
    pg2arrow.add_argument("--no-stats", action="store_true", help="leave out the per-batch min/max statistics")
    pg2arrow.add_argument(
        "--compression", choices=("lz4", "zstd"), default=None, help="compress record batch bodies (default: none)"
    )
    pg2arrow.add_argument("--compression-level", type=int, default=None, help="the codec's level (default: its own)")
    add_progress_flag(pg2arrow, "read")
    pg2arrow.set_defaults(run=_pg2arrow)
    serve = sub.add_parser("serve", help="run the store daemon that keeps named tables in GPU memory")
    serve.add_argument("--socket", default=None, help="socket path (default: a per-user runtime directory)")
    serve.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if present)")
    serve.add_argument(
        "--readers", type=_id_list, default=[], help="other uids that may list and get tables shared with them"
    )
    serve.add_argument("--writers", type=_id_list, default=[], help="other uids that may also put tables of their own")
    serve.add_argument("--allow-uids", type=_id_list, default=[], help="deprecated: the same as --writers")
    serve.add_argument("--allow-gids", type=_id_list, default=[], help="groups whose members are served as writers")
    serve.add_argument(
        "--memory", choices=["auto", "vmm", "legacy"], default="auto", help="GPU sharing mechanism (default auto)"
    )
    serve.add_argument(
        "--max-connections",
        type=_positive_int,
        default=None,
        help="connections one user may hold open (default: this user as many as the descriptor limit allows, "
        "each other user a quarter of what is left once an eighth is kept for this user)",
    )
    serve.add_argument(
        "--max-bytes",
        type=_byte_size,
        default=None,
        help="bytes of tables the daemon holds at most, e.g. 64G (default: 3/4 of the host's memory, 9/10 of a GPU's)",
    )
    serve.add_argument(
        "--max-bytes-per-uid",
        type=_byte_size,
        default=None,
        help="bytes of tables each other user may hold (default: a quarter of --max-bytes)",
    )
    serve.set_defaults(run=_serve)
    from ._cli_commands import add_commands

    add_commands(sub, _positive_int)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand's parser, so the line names it ("pystrom load: error: ...")
        commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
        commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:  # bare `pystrom`: what there is to do, which is no error
        parser.print_help()
        return 0
    try:
        code = int(args.run(args))
        sys.stdout.flush()  # a closed pipe shows here, where it is handled, not at exit
        return code
    except BrokenPipeError:  # `pystrom ls | head`: the reader has gone, which is no error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush must not fail too
        return 141  # as if killed by SIGPIPE, like other commands in a pipeline
    except (Error, OSError) as exc:  # user mistakes and the environment's refusals (files, sockets, servers)
        message = " ".join(str(exc).split()) or type(exc).__name__  # one line, whatever the message holds
        print(f"pystrom {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pystrom {args.command}: interrupted", file=sys.stderr)
        return 130
