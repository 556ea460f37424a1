"""User functions with numba: a UDF row function and a Tanimoto top-k kernel against hand-written code.

1. The seed's distance predicate ``sqrt((x-200)^2 + (y-300)^2 + (z-400)^2) < 10`` as ``@pystrom.udf``
   applied to a table's columns (``udf.apply``: the generated kernel, validity included), against a
   hand-written ``cupy.ElementwiseKernel`` on a GPU (goal: within 1.2x) or the NumPy expression on the
   CPU, and against pandas ``DataFrame.apply`` on a smaller table (pandas calls Python per row).
2. Tanimoto similarity over 1024-bit fingerprints (16 int64 columns): for every compound the best
   similarity to any of a query set, then the top k compounds. ``@pystrom.kernel`` against CuPy (a
   popcount ElementwiseKernel and array operations, one query at a time) on a GPU and NumPy
   (``numpy.bitwise_count``) on the host. The results are checked equal before timing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from numba import cuda
from numba.extending import register_jitable

import pystrom
from pystrom import Table

from _harness import Result, measure, measure_pair

K = 10
WORDS = 16  # 1024 bits

_M1, _M2, _M4 = np.uint64(0x5555555555555555), np.uint64(0x3333333333333333), np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
_S1, _S2, _S4, _S56 = np.uint64(1), np.uint64(2), np.uint64(4), np.uint64(56)


@pystrom.udf
def near_seed(x, y, z):
    return math.sqrt((x - 200.0) ** 2 + (y - 300.0) ** 2 + (z - 400.0) ** 2) < 10.0


@register_jitable
def popcount(word):
    """Set bits of an int64 (SWAR: compiles for numba's CPU and CUDA targets alike)."""
    v = np.uint64(word)
    v = v - ((v >> _S1) & _M1)
    v = (v & _M2) + ((v >> _S2) & _M2)
    v = (v + (v >> _S4)) & _M4
    return np.int32((v * _H01) >> _S56)


@pystrom.kernel(outputs={"best": "float32", "best_query": "int32"})
def tanimoto_best(fp0, fp1, fp2, fp3, fp4, fp5, fp6, fp7, fp8, fp9, fp10, fp11, fp12, fp13, fp14, fp15,
                  queries, query_bits, best, best_query):  # fmt: skip
    i = cuda.grid(1)
    if i < best.size:
        w = (fp0[i], fp1[i], fp2[i], fp3[i], fp4[i], fp5[i], fp6[i], fp7[i],
             fp8[i], fp9[i], fp10[i], fp11[i], fp12[i], fp13[i], fp14[i], fp15[i])  # fmt: skip
        bits = 0
        for j in range(16):
            bits += popcount(w[j])
        top = np.float32(-1.0)
        arg = -1
        for q in range(queries.shape[0]):
            inter = 0
            for j in range(16):
                inter += popcount(w[j] & queries[q, j])
            union = bits + query_bits[q] - inter
            s = np.float32(inter / union) if union > 0 else np.float32(1.0)
            if s > top:
                top = s
                arg = q
        best[i] = top
        best_query[i] = arg


def fingerprints(rows: int, nq: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(rows, 16) and (nq, 16) int64 words with about 1 bit in 8 set, like a hashed structure key."""
    rng = np.random.default_rng(seed)

    def words(n: int) -> np.ndarray:
        b = rng.random((n, WORDS * 64), dtype=np.float32) < 0.125
        return np.packbits(b, axis=1, bitorder="little").view(np.int64)

    return words(rows), words(nq)


def top_k(best: Any, xp: Any, k: int = K) -> Any:
    idx = xp.argpartition(-best, k)[:k]
    return idx[xp.argsort(-best[idx], kind="stable")]


def _best_numpy(fps: np.ndarray, queries: np.ndarray) -> np.ndarray:
    u = fps.view(np.uint64)
    bits = np.bitwise_count(u).sum(axis=1, dtype=np.int32)
    best = np.full(len(fps), -1.0, dtype=np.float32)
    for q in queries.view(np.uint64):
        inter = np.bitwise_count(u & q).sum(axis=1, dtype=np.int32)
        union = bits + int(np.bitwise_count(q).sum()) - inter
        s = np.where(union > 0, inter / np.maximum(union, 1), 1.0).astype(np.float32)
        np.maximum(best, s, out=best)
    return best


def _cupy_best(cp: Any) -> Any:
    popc = cp.ElementwiseKernel("uint64 x", "int32 c", "c = __popcll(x)", "pystrom_bench_popc")

    def best_of(fps: Any, queries: Any) -> Any:
        bits = popc(fps).sum(axis=1, dtype=cp.int32)
        best = cp.full(fps.shape[0], -1.0, dtype=cp.float32)
        for qi in range(queries.shape[0]):
            q = queries[qi]
            inter = popc(fps & q).sum(axis=1, dtype=cp.int32)
            union = bits + popc(q).sum(dtype=cp.int32) - inter
            s = cp.where(union > 0, inter / cp.maximum(union, 1), 1.0).astype(cp.float32)
            cp.maximum(best, s, out=best)
        return best

    return best_of


def run(device: str, quick: bool) -> list[Result]:
    rows = 2_000_000 if quick else 50_000_000
    pandas_rows = 20_000 if quick else 200_000
    fp_rows = 100_000 if quick else 1_000_000
    nq = 10 if quick else 100
    repeat = 3 if quick else 5
    rng = np.random.default_rng(1)
    xyz = pa.table(
        {"x": rng.uniform(150, 250, rows), "y": rng.uniform(250, 350, rows), "z": rng.uniform(350, 450, rows)}
    )
    t = Table.from_arrow(xyz, device=device)
    backend = t._block.backend
    xp, sync = backend.xp, backend.synchronize
    x, y, z = (t.column(n).values for n in "xyz")
    results = []

    def udf() -> Any:
        return near_seed.apply(t, "x", "y", "z")[0]

    if backend.kind == "cpu":
        name = "NumPy array expression"

        def hand() -> Any:
            return np.sqrt((x - 200) ** 2 + (y - 300) ** 2 + (z - 400) ** 2) < 10
    else:
        name = "cupy.ElementwiseKernel (by hand)"
        ek = xp.ElementwiseKernel(
            "float64 x, float64 y, float64 z", "bool m",
            "m = sqrt((x-200.0)*(x-200.0) + (y-300.0)*(y-300.0) + (z-400.0)*(z-400.0)) < 10.0",
            "pystrom_bench_near",
        )  # fmt: skip

        def hand() -> Any:
            return ek(x, y, z)

    assert np.array_equal(backend.to_host(udf()), backend.to_host(hand())), "UDF mask differs from the baseline"
    mine, theirs = measure_pair(udf, hand, sync, repeat)
    results.append(Result(f"udf distance predicate ({rows:,} rows)", name, mine, theirs, xyz.nbytes))

    small = xyz.slice(0, pandas_rows)
    ts = Table.from_arrow(small, device=device)
    df = small.to_pandas()

    def pandas_apply() -> Any:
        return df.apply(lambda r: math.sqrt((r.x - 200) ** 2 + (r.y - 300) ** 2 + (r.z - 400) ** 2) < 10, axis=1)

    want = pandas_apply().to_numpy()
    assert np.array_equal(backend.to_host(near_seed.apply(ts, "x", "y", "z")[0]), want), "UDF differs from pandas"
    results.append(
        Result(
            f"udf distance predicate ({pandas_rows:,} rows)",
            "pandas DataFrame.apply",
            measure(lambda: near_seed.apply(ts, "x", "y", "z")[0], sync, repeat),
            measure(pandas_apply, lambda: None, 1),
            small.nbytes,
        )
    )

    fps, queries = fingerprints(fp_rows, nq)
    table = Table.from_arrays({f"fp{j}": fps[:, j].copy() for j in range(WORDS)}, device=device)
    query_bits = np.bitwise_count(queries.view(np.uint64)).sum(axis=1, dtype=np.int32)

    def pystrom_topk() -> Any:
        out = tanimoto_best(table, queries=queries, query_bits=query_bits)
        return top_k(out.column("best").values, xp)

    def numpy_topk() -> Any:
        return top_k(_best_numpy(fps, queries), np)

    best_ref = _best_numpy(fps, queries)
    got = tanimoto_best(table, queries=queries, query_bits=query_bits)
    assert np.allclose(backend.to_host(got.column("best").values), best_ref), "Tanimoto differs from NumPy"
    name = f"Tanimoto top-{K}, {fp_rows:,} x 1024 bits, {nq} queries"
    mine = measure(pystrom_topk, sync, repeat)
    results.append(
        Result(name, "NumPy bitwise_count on the host", mine, measure(numpy_topk, lambda: None, 1), fps.nbytes)
    )
    if backend.kind != "cpu":
        best_of = _cupy_best(xp)
        d_fps, d_q = xp.asarray(fps.view(np.uint64)), xp.asarray(queries.view(np.uint64))
        assert np.allclose(backend.to_host(best_of(d_fps, d_q)), best_ref), "CuPy Tanimoto differs from NumPy"
        theirs = measure(lambda: top_k(best_of(d_fps, d_q), xp), sync, repeat)
        results.append(Result(name, "CuPy popcount kernel + array ops", mine, theirs, fps.nbytes))
    return results
