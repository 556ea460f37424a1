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


def _text_arrays(cases: int) -> int:
    """Random list<string> rows encoded as PostgreSQL binary arrays, decoded back, then with bytes flipped
    and offsets moved: every output is allocated at exactly the size asked, so a write past it is reported."""
    from pystrom.io.postgres.text_arrays import decode_text_arrays, encode_text_arrays

    rng = np.random.default_rng(5)
    for _ in range(cases):
        n = int(rng.integers(0, 12))
        counts = rng.integers(0, 5, n)
        list_offsets = np.zeros(n + 1, np.int32)
        np.cumsum(counts, out=list_offsets[1:])
        m = int(list_offsets[-1])
        str_offsets = np.zeros(m + 1, np.int32)
        np.cumsum(rng.integers(0, 9, m), out=str_offsets[1:])
        str_data = rng.integers(0, 256, int(str_offsets[-1]), dtype=np.uint8)
        rows = rng.integers(0, 256, (n + 7) // 8, dtype=np.uint8) if rng.random() < 0.5 else None
        elems = rng.integers(0, 256, (m + 7) // 8, dtype=np.uint8) if rng.random() < 0.5 else None
        offsets, data = encode_text_arrays(list_offsets, rows, 0, str_offsets, str_data, elems, 25)
        decode_text_arrays(offsets, data, rows, 0, 25, "c")
        for _ in range(4):
            bad = data.copy()
            if bad.size:
                at = rng.integers(0, bad.size, int(rng.integers(1, 4)))
                bad[at] = rng.integers(0, 256, at.size, dtype=np.uint8)
            moved = np.sort(np.clip(offsets + rng.integers(-3, 4, n + 1), 0, bad.size)).astype(np.int32)
            for off in (offsets, moved):
                elements, nbytes, nulls, _row, failure = _core.pg_text_arrays_measure(off, bad, rows, 0, 25)
                if failure:  # fill on its own: room for any array the bytes can hold (no C++ throw under ASan:
                    # its __cxa_throw interceptor is not set up when libasan is preloaded into Python)
                    elements, nbytes, nulls = bad.size // 4, bad.size, 1
                out = (np.empty(n + 1, np.int32), np.empty(elements + 1, np.int32), np.empty(nbytes, np.uint8),
                       np.empty((elements + 7) // 8, np.uint8) if nulls else None)  # fmt: skip
                got = _core.pg_text_arrays_fill(off, bad, rows, 0, *out)
                assert failure or got == (0, -1), got
    return cases


def main(work: Path, cases: int) -> None:
    warnings.simplefilter("ignore")
    counts = {
        "sieve": _sieve(work, cases),
        "utf8": _utf8(cases * 5),
        "mutants": _mutants(work, cases),
        "text_arrays": _text_arrays(cases * 10),
    }
    print("sanitized workload done:", counts)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with tempfile.TemporaryDirectory(dir=sys.argv[1] if len(sys.argv) > 1 else None) as tmp:
        main(Path(tmp), int(sys.argv[2]) if len(sys.argv) > 2 else 60)
