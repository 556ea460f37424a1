"""pystrom on Dask: PostgreSQL tables and Arrow files read in partitions by the workers of a cluster,
kept there as pystrom Tables (on each worker's GPU under dask-cuda), and fitted there.

>>> from distributed import Client, LocalCluster
>>> import pystrom.dask
>>> client = Client(LocalCluster(n_workers=2))
>>> with pystrom.dask.read_postgres("dbname=shop", table="logreg") as parts:
...     parts = parts.persist()
>>> model = pystrom.ml.LogisticRegression().fit(parts, columns=["x1", "x2"], target="y")

Needs ``dask[distributed]`` (``pip install 'pystrom-gpu[dask]'``); ``import pystrom`` never imports it.
The guide: docs/dask.md.
"""

from __future__ import annotations

from .._dist import require

require("dask", "pystrom.dask")  # before anything imports dask: the error names the extra, not a bare module

from ._arrow import scan_arrow  # noqa: E402
from ._collection import PartitionedTable  # noqa: E402
from ._postgres import Snapshot, read_postgres  # noqa: E402

__all__ = ["read_postgres", "scan_arrow", "PartitionedTable", "Snapshot"]
