"""What tests/test_sanitizers.py runs under AddressSanitizer and UBSan: the C++ core's Arrow read paths
on valid and corrupt input, in one process (a report ends it with a non-zero status).

    python tests/sanitized_workload.py WORKDIR [CASES]
"""

from __future__ import annotations

import random
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

import pystrom
from pystrom import _core


def _sieve(work: Path, cases: int) -> int:
    import test_arrow_sieve_stress as stress

    rng = random.Random(7)
    files = stress._files(work, 6, rng)
    bad = [f for f in (stress._run(stress._case(files, rng)) for _ in range(cases)) if f]
    assert not bad, bad
    return cases


def _utf8(cases: int) -> int:
    rng = np.random.default_rng(3)
    alphabet = np.frombuffer("aé€𝄞\U0010ffff".encode() + bytes(range(0x80, 0x100, 7)), dtype=np.uint8)
    for _ in range(cases):
        n = int(rng.integers(0, 40))
        data = rng.choice(alphabet, int(rng.integers(0, 300)))
        offsets = np.sort(rng.integers(0, data.shape[0] + 1, n + 1)).astype(np.int32)
        offsets[0] = 0
        validity = rng.integers(0, 256, (n + 7) // 8 + 1, dtype=np.uint8) if rng.random() < 0.5 else None
        if n:
            _core.utf8_first_bad_row(data, offsets, validity, 0)
        for level in range(_core.utf8_best_level() + 1):
            _core.utf8_valid(data, level)
    return cases


def _mutants(work: Path, cases: int) -> int:
    import arrow_fuzz as af

    seeds = af.write_seeds(work / "seeds") + af.write_compressed_seeds(work / "compressed")
    rng = random.Random(11)
    done = 0
    for i in range(cases):
        seed = seeds[i % len(seeds)]
        compressed = seed.parent.name == "compressed"
        data, _ = (af.mutate_compressed if compressed else af.mutate)(seed.read_bytes(), rng)
        path = work / f"m{seed.suffix}"
        path.write_bytes(data)
        for call in ({"api": "read"}, {"api": "read", "columns": af._column_names(seed)[:2]},
                     {"api": "scan", "where": "i64 >= 0 or i64 is null", "batch_rows": 7}):  # fmt: skip
            try:
                af._apply(str(path), call, "cpu").to_arrow()
            except pystrom.Error:
                pass
            done += 1
    return done


def main(work: Path, cases: int) -> None:
    warnings.simplefilter("ignore")
    counts = {"sieve": _sieve(work, cases), "utf8": _utf8(cases * 5), "mutants": _mutants(work, cases)}
    print("sanitized workload done:", counts)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with tempfile.TemporaryDirectory(dir=sys.argv[1] if len(sys.argv) > 1 else None) as tmp:
        main(Path(tmp), int(sys.argv[2]) if len(sys.argv) > 2 else 60)
