"""The cost of the UTF-8 check of string columns (issue 39; io/arrow/read/utf8.py): read_arrow of a file
of one string column against the same read with the check switched off (the baseline; a speedup below
1 is the check's cost), three shapes of text at 4M rows (1M with --quick): short ASCII words, short
words of 1- to 4-byte characters, and long mixed text (~100 bytes a row). Page cache warm; pairs run
alternately (``measure_pair``); medians. On a GPU the check is one kernels/utf8.cu launch for the read.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa

import pystrom
from pystrom.io.arrow.read import direct

from _harness import Result, measure_pair

_SHAPES = {
    "short ASCII words": (["alpha", "beta", "gamma", "delta", "epsilon", "zeta"], 1),
    "short multi-byte words": (["alpha", "é", "naïve", "€uro", "日本語", "𝄞", "beta"], 1),
    "long mixed text": (
        ["the quick brown fox jumps over", "naïve café über straße", "日本語のテキスト", "€ 12,50 𝄞"],
        4,
    ),
}


def run(device: str, quick: bool) -> list[Result]:
    rows = 1_000_000 if quick else 4_000_000
    rng = np.random.default_rng(0)
    backend = pystrom.memory.backend.resolve_device(device)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (words, per_row) in _SHAPES.items():
            w = np.array(words, dtype=object)
            picks = rng.integers(0, len(words), (rows, per_row))
            values = [" ".join(row) for row in w[picks]] if per_row > 1 else list(w[picks[:, 0]])
            table = pa.table({"s": pa.array(values, pa.string())})
            path = os.path.join(tmp, "s.arrow")
            pystrom.write_arrow(table, path)
            with_check, without = _reads(path, device)
            ours, base = measure_pair(with_check, without, backend.synchronize, 3 if quick else 9)
            data = table.column("s").combine_chunks().buffers()[2].size
            out.append(Result(f"read_arrow {rows / 1e6:g}M {name}", "the same read, no UTF-8 check", ours, base, data))
            os.unlink(path)
    return out


def _reads(path: str, device: str) -> tuple:
    """read_arrow of ``path`` with the UTF-8 check and without it."""
    checked = direct.check_utf8

    def with_check() -> object:
        direct.check_utf8 = checked
        return pystrom.read_arrow(path, device=device)

    def without() -> object:
        direct.check_utf8 = lambda *args, **kwargs: None
        try:
            return pystrom.read_arrow(path, device=device)
        finally:
            direct.check_utf8 = checked

    return with_check, without
