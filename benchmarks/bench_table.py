"""Table: getting data onto the device and back, 2-D feature arrays, filtering.

Baselines are what a user writes without pystrom: per-column ``cupy.asarray(chunked.to_numpy())``
(``numpy.array`` on the CPU), per-column ``cupy.asnumpy`` back into ``pyarrow.table``, ``xp.stack``
of columns, and boolean indexing of each column.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pystrom import Table

from _harness import Result, measure


def _data(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    cols: dict[str, Any] = {f"x{i}": rng.standard_normal(rows) for i in range(8)}
    cols["k"] = rng.integers(0, 1000, rows, dtype=np.int32)
    cols["flag"] = rng.random(rows) < 0.5
    return pa.table(cols)


def run(device: str, quick: bool) -> list[Result]:
    rows = 2_000_000 if quick else 20_000_000
    repeat = 3 if quick else 5
    source = _data(rows)
    table = Table.from_arrow(source, device=device)
    backend = table._block.backend
    xp, sync = backend.xp, backend.synchronize
    names = source.column_names
    features = [f"x{i}" for i in range(8)]
    results = []

    def baseline_upload():
        return {
            n: xp.asarray(source.column(n).to_numpy())
            if xp is not np
            else np.array(source.column(n).to_numpy(), copy=True)
            for n in names
        }

    results.append(
        Result(
            f"pyarrow -> {device} ({rows:,} rows x 10)",
            "per-column xp.asarray(to_numpy())",
            measure(lambda: Table.from_arrow(source, device=device), sync, repeat),
            measure(baseline_upload, sync, repeat),
            source.nbytes,
        )
    )

    arrays = baseline_upload()

    def baseline_download():
        return pa.table({n: backend.to_host(a) for n, a in arrays.items()})

    results.append(
        Result(
            f"{device} -> pyarrow",
            "per-column asnumpy + pa.table",
            measure(table.to_arrow, lambda: None, repeat),
            measure(baseline_download, lambda: None, repeat),
            source.nbytes,
        )
    )

    results.append(
        Result(
            "2-D features (8 float64 columns)",
            "xp.stack(columns, axis=1)",
            measure(lambda: table.to_array(features), sync, repeat),
            measure(lambda: xp.stack([arrays[n] for n in features], axis=1), sync, repeat),
            0,  # a view: pystrom moves no bytes
        )
    )

    mask = table["x0"] > 0.5

    def baseline_filter():
        return {n: a[mask] for n, a in arrays.items()}

    results.append(
        Result(
            "filter 31% of rows (10 columns)",
            "per-column boolean indexing",
            measure(lambda: table.filter(mask), sync, repeat),
            measure(baseline_filter, sync, repeat),
            table.nbytes,
        )
    )
    return results
