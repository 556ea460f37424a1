"""where predicates: the one fused kernel (NumPy on the CPU) against what a user writes without pystrom.

Baselines: pyarrow.compute on the host Arrow table (what scan filters cost without a GPU), and on a GPU
the same expression written with CuPy array operations (one kernel per operator, temporaries in
between). Times are for computing the mask only; the data already sits on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pystrom import Table
from pystrom.expr import compile_where

from _harness import Result, measure

SEED_XYZ = "sqrt((x-200)^2 + (y-300)^2 + (z-400)^2) < 10"
SEED_LIKE = "memo like '%abcd%'"


def _data(rows: int, string_rows: int) -> tuple[pa.Table, pa.Table]:
    rng = np.random.default_rng(1)
    xyz = pa.table(
        {"x": rng.uniform(150, 250, rows), "y": rng.uniform(250, 350, rows), "z": rng.uniform(350, 450, rows)}
    )
    words = np.array([f"w{k:05d}{'abcd' if k % 10 == 0 else 'efgh'}tail" for k in range(100_000)], dtype=object)
    memo = pa.table({"memo": pa.array(words[rng.integers(0, len(words), string_rows)], pa.string())})
    return xyz, memo


def _xyz_arrow(t: pa.Table) -> Any:
    def sq(name: str, c: float) -> Any:
        d = pc.subtract(t[name], c)
        return pc.multiply(d, d)

    return pc.less(pc.sqrt(pc.add(pc.add(sq("x", 200), sq("y", 300)), sq("z", 400))), 10)


def run(device: str, quick: bool) -> list[Result]:
    rows = 2_000_000 if quick else 50_000_000
    string_rows = 1_000_000 if quick else 10_000_000
    repeat = 3 if quick else 5
    xyz, memo = _data(rows, string_rows)
    t_xyz = Table.from_arrow(xyz, device=device)
    t_memo = Table.from_arrow(memo, device=device)
    backend = t_xyz._block.backend
    xp, sync = backend.xp, backend.synchronize
    p_xyz, p_like = compile_where(SEED_XYZ, xyz.schema), compile_where(SEED_LIKE, memo.schema)
    results = []

    x, y, z = (t_xyz.column(n).values for n in "xyz")

    def array_ops() -> Any:
        return xp.sqrt((x - 200) ** 2 + (y - 300) ** 2 + (z - 400) ** 2) < 10

    got = backend.to_host(p_xyz.evaluate(t_xyz))
    assert np.array_equal(got, _xyz_arrow(xyz).to_numpy(zero_copy_only=False)), "mask differs from pyarrow"
    name = f"{SEED_XYZ[:22]}... ({rows:,} rows)"
    run_p = measure(lambda: p_xyz.evaluate(t_xyz), sync, repeat)
    results.append(Result(name, "pyarrow.compute on the host", run_p, measure(lambda: _xyz_arrow(xyz), sync, repeat),
                          xyz.nbytes))  # fmt: skip
    results.append(Result(name, f"{xp.__name__} array expression", run_p, measure(array_ops, sync, repeat), xyz.nbytes))

    got = backend.to_host(p_like.evaluate(t_memo))
    want = pc.match_like(memo["memo"], "%abcd%").to_numpy(zero_copy_only=False)
    assert np.array_equal(got, want), "LIKE mask differs from pyarrow"
    results.append(
        Result(
            f"{SEED_LIKE} ({string_rows:,} rows)",
            "pyarrow.compute on the host",
            measure(lambda: p_like.evaluate(t_memo), sync, repeat),
            measure(lambda: pc.match_like(memo["memo"], "%abcd%"), sync, repeat),
            memo.nbytes,
        )
    )
    return results
