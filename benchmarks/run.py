"""Run every benchmark of the project and print one table of pystrom against its baselines.

    python benchmarks/run.py [--quick] [--device DEV]

Each ``bench_*.py`` module beside this file has ``run(device, quick) -> list[Result]``; baselines are
measured in the same process run, and ratios are baseline time / pystrom time (above 1: pystrom is faster).
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import print_table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, about 2 minutes")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if present)")
    parser.add_argument("--only", default=None, help="run only bench_<ONLY>.py")
    args = parser.parse_args(argv)

    from pystrom.memory.backend import resolve_device

    device = resolve_device(args.device).device
    results = []
    for path in sorted(HERE.glob("bench_*.py")):
        if args.only and path.stem != f"bench_{args.only}":
            continue
        module = importlib.import_module(path.stem)
        print(f"running {path.stem} on {device}{' (quick)' if args.quick else ''} ...", flush=True)
        results.extend(module.run(device, args.quick))
    print_table(device, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
