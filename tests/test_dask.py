"""pystrom on Dask: a real dask.distributed cluster (worker processes), a real PostgreSQL, real files.

On the CPU a LocalCluster of two worker processes runs every test; on a GPU machine the same tests
run again on dask-cuda's LocalCUDACluster with one worker, and on two workers sharing GPU 0 (marked
``gpu``; skipped where there is no GPU or no dask_cuda). References: ``pystrom.read_postgres`` and
``pystrom.scan_arrow`` of the same data, the in-memory fit, statsmodels.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from psycopg import sql

import pystrom
from pystrom.errors import ClosedError, DataError, ExpressionError, InvalidArgumentError, PostgresError

from conftest import HAVE_GPU

distributed = pytest.importorskip("distributed")
pytest.importorskip("dask.dataframe")
import dask  # noqa: E402
import dask.array as da  # noqa: E402

import pystrom.dask as pdask  # noqa: E402
from pystrom.ml import LogisticRegression  # noqa: E402

pytestmark = pytest.mark.postgres

N_ROWS = 6000
COEF = np.array([1.2, -0.7, 0.4])


def _have_dask_cuda() -> bool:
    try:
        import dask_cuda  # noqa: F401
    except ImportError:
        return False
    return True


_gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU with CuPy in this environment")]
CLUSTERS = [
    "cpu",
    pytest.param(
        "cuda-1", marks=[*_gpu, pytest.mark.skipif(not _have_dask_cuda(), reason="dask_cuda is not installed")]
    ),
    pytest.param("cuda-2", marks=_gpu),
    pytest.param(
        "cuda-per-gpu",
        marks=[
            *_gpu,
            pytest.mark.skipif(not _have_dask_cuda(), reason="dask_cuda is not installed"),
            pytest.mark.skipif(pystrom.memory.backend.cuda_device_count() < 2, reason="needs two CUDA GPUs"),
        ],
    ),
]


def _start(kind: str):
    """(cluster, the device= the reads use). cuda-1: dask-cuda, one worker on GPU 0; cuda-2: two
    worker processes that both see GPU 0 (sharing it), each reading onto it; cuda-per-gpu: dask-cuda,
    one worker per GPU (each sees its own GPU as device 0)."""
    if kind == "cuda-per-gpu":
        from dask_cuda import LocalCUDACluster

        n = min(pystrom.memory.backend.cuda_device_count(), 4)
        return LocalCUDACluster(n_workers=n, threads_per_worker=2, dashboard_address=":0"), "cuda"
    if kind == "cuda-1":
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(n_workers=1, threads_per_worker=2, dashboard_address=":0"), "cuda"
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", memory_limit="2GiB"
    )
    return cluster, ("cpu" if kind == "cpu" else "cuda")


@pytest.fixture(scope="module", params=CLUSTERS)
def cluster(request):
    c, device = _start(request.param)
    client = distributed.Client(c)
    try:
        yield client, device
    finally:
        client.close()
        c.close()


@pytest.fixture
def client(cluster):
    return cluster[0]


@pytest.fixture
def dev(cluster):
    return cluster[1]


def _logreg_data(n: int = N_ROWS, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    p = 1 / (1 + np.exp(-(X @ COEF + 0.3)))
    y = rng.random(n) < p
    return pa.table({"id": np.arange(n, dtype=np.int64), "x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2], "y": y})


def _make_table(pg, data: pa.Table) -> str:
    name = pg.name("dask")
    pg.execute(f'CREATE TABLE "{name}" (id int8, x1 float8, x2 float8, x3 float8, y bool)')
    with pg.conn.cursor() as cur, cur.copy(f'COPY "{name}" FROM STDIN') as copy:
        for row in zip(*(data.column(c).to_pylist() for c in data.column_names)):
            copy.write_row(row)
    pg.execute(f'ANALYZE "{name}"')
    return name


@pytest.fixture
def logreg(pg):
    data = _logreg_data()
    yield _make_table(pg, data), data
    # A failed test's traceback may keep a collection, and so its snapshot's transaction and its lock on
    # the table, alive: end such sessions so that dropping the table does not wait for them.
    pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'pystrom.dask%%'")


def _sorted(t: pystrom.Table, key: str = "id") -> pa.Table:
    a = t.to_arrow()
    return a.sort_by(key)


def _sessions(pg, app: str) -> list[tuple]:
    return pg.fetch(
        "SELECT pid, state, xact_start IS NOT NULL FROM pg_stat_activity WHERE application_name = %s", (app,)
    )


def _wait_until(cond, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


# -- reads --------------------------------------------------------------------------------------------


def test_partitioned_read_equals_read_postgres(client, dev, pg, logreg):
    name, _ = logreg
    with pdask.read_postgres(pg.conninfo, table=name, npartitions=3, device=dev) as parts:
        assert parts.npartitions == 3
        assert parts.schema == pa.schema(
            [("id", pa.int64()), ("x1", pa.float64()), ("x2", pa.float64()), ("x3", pa.float64()), ("y", pa.bool_())]
        )
        got = parts.compute()
        assert isinstance(got, pystrom.Table)
        assert parts.num_rows == N_ROWS
        assert sum(parts.partition_rows()) == N_ROWS and min(parts.partition_rows()) > 0  # really split
    want = pystrom.read_postgres(pg.conninfo, table=name, partitions=1, device="cpu")
    assert _sorted(got).equals(_sorted(want))
    # columns= and where=, on the workers' ranges
    with pdask.read_postgres(
        pg.conninfo, table=name, columns=["id", "x2"], where="x1 > %s", params=(0.5,), npartitions=4, device=dev
    ) as parts:
        got = parts.compute()
    want = pystrom.read_postgres(pg.conninfo, table=name, columns=["id", "x2"], where="x1 > %s", params=(0.5,))
    assert got.num_rows == want.num_rows > 0 and _sorted(got).equals(_sorted(want.to("cpu")))


def test_partitions_of_ranges_composites_and_text_arrays(client, dev, pg):
    """Structs and list<string> columns across workers: each partition folds its own, one schema for all."""
    name = pg.name("dask_structs")
    pg.execute(f"""CREATE TABLE "{name}" AS SELECT g AS id, int4range(g, g + g % 4) AS r,
        CASE WHEN g % 5 = 0 THEN NULL ELSE ARRAY['t' || g, NULL] END AS tags,
        ROW(g, 'n' || g)::record::text AS as_text FROM generate_series(1, 3000) g""")
    with pdask.read_postgres(pg.conninfo, table=name, npartitions=3, device=dev) as parts:
        assert parts.schema.field("r").type.num_fields == 5 and parts.schema.field("tags").type == pa.list_(pa.utf8())
        got = parts.compute()
    want = pystrom.read_postgres(pg.conninfo, table=name, partitions=1, device="cpu")
    assert _sorted(got).equals(_sorted(want))


def test_query_split_on_a_key_equals_read_postgres(client, dev, pg, logreg):
    name, _ = logreg
    pg.execute(f'UPDATE "{name}" SET id = NULL WHERE id % 1000 = 7')  # NULL keys go to the first range
    q = f'SELECT id, x1, y FROM "{name}" WHERE x3 < 1'
    with pdask.read_postgres(pg.conninfo, q, partition_on="id", npartitions=5, device=dev) as parts:
        assert parts.npartitions == 5
        got = parts.compute().to_arrow()
    want = pystrom.read_postgres(pg.conninfo, q).to_arrow()
    key = [("id", "ascending"), ("x1", "ascending")]
    assert got.num_rows == want.num_rows and got.sort_by(key).equals(want.sort_by(key))
    assert got.column("id").null_count == want.column("id").null_count > 0


def test_one_snapshot_across_workers_while_another_connection_writes(client, dev, pg, logreg):
    name, _ = logreg
    stop = threading.Event()
    writes = [0]

    def writer():
        conn = pg.cluster.connect(autocommit=True)
        try:
            i = 0
            while not stop.is_set():  # every commit changes rows in every part of the heap
                conn.execute(f'UPDATE "{name}" SET x1 = x1 + 1 WHERE id %% 50 = %s', (i % 50,))
                conn.execute(f'INSERT INTO "{name}" VALUES (%s, 0, 0, 0, true)', (10**6 + i,))
                conn.execute(f'DELETE FROM "{name}" WHERE id = %s', (i * 7 % N_ROWS,))
                writes[0] += 1
                i += 1
        finally:
            conn.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert _wait_until(lambda: writes[0] > 5)
        parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=4, device=dev)
        seen = writes[0]
        got = parts.compute()  # the writer keeps committing while the workers read
        assert _wait_until(lambda: writes[0] > seen + 5)
        # the reference: pystrom.read_postgres inside a transaction that joined the same snapshot
        with pg.cluster.connect(autocommit=True) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(parts.snapshot)))
            want = pystrom.read_postgres(conn, table=name, device="cpu")
            conn.execute("ROLLBACK")
        parts.close()
    finally:
        stop.set()
        t.join()
    now = pystrom.read_postgres(pg.conninfo, table=name, device="cpu")
    assert _sorted(got).equals(_sorted(want))
    assert not _sorted(now).equals(_sorted(want))  # the writes did change the table meanwhile


def test_snapshot_is_released_on_close_exit_gc_and_persist(client, dev, pg, logreg):
    name, _ = logreg
    app = "pystrom.dask snapshot"
    assert _sessions(pg, app) == []

    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=2, device=dev)
    (held,) = _sessions(pg, app)
    assert held[2]  # idle in its open transaction
    parts.close()
    assert _wait_until(lambda: _sessions(pg, app) == [])
    with pytest.raises(ClosedError, match="snapshot"):
        parts.compute()

    with pdask.read_postgres(pg.conninfo, table=name, device=dev) as parts:
        assert len(_sessions(pg, app)) == 1
        # npartitions=None on a small table: one partition per worker thread (256 MB of heap each on large ones)
        threads = sum(w["nthreads"] for w in client.scheduler_info()["workers"].values())
        assert parts.npartitions == threads
    assert _wait_until(lambda: _sessions(pg, app) == [])

    parts = pdask.read_postgres(pg.conninfo, table=name, device=dev)
    arr = parts.filter("x1 > 0").to_dask_array(["x1", "x2"])  # anything built on the read keeps it
    del parts
    gc.collect()
    assert len(_sessions(pg, app)) == 1
    assert arr.compute().shape[1] == 2
    del arr
    gc.collect()
    assert _wait_until(lambda: _sessions(pg, app) == [])

    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=3, device=dev)
    kept = parts.persist()
    distributed.wait(kept)
    assert _wait_until(lambda: _sessions(pg, app) == [])  # every partition read: the snapshot is gone
    assert kept.num_rows == N_ROWS and kept.snapshot is None
    with pytest.raises(ClosedError):
        parts.compute()
    # no partition connection is left either
    assert _wait_until(lambda: _sessions(pg, "pystrom.dask partition") == [])


def test_default_partitions_keep_every_worker_thread_busy():
    from pystrom.dask._postgres import default_partitions

    mb = 1 << 20
    assert default_partitions(16, 10 * mb) == 16  # a small table: one partition per thread
    assert default_partitions(32, 40 * 256 * mb) == 64  # 40 partitions' worth on 32 threads: two full waves
    assert default_partitions(16, 40 * 256 * mb) == 48
    assert default_partitions(64, 40 * 256 * mb) == 64
    assert default_partitions(0, 300 * mb) == 2  # no client: one thread


def test_leaving_the_with_block_right_after_persist_keeps_the_snapshot_for_the_reads(client, dev, pg, logreg):
    """docs/dask.md's first example: ``with read_postgres(...) as parts: parts = parts.persist()``. The
    reads are held at a gate (an advisory lock the test holds, taken by each partition's rows) so that they
    are certainly still running when the block ends; the snapshot must outlive the block until they finish."""
    name, data = logreg
    app = "pystrom.dask snapshot"
    gate = pg.cluster.connect(autocommit=True)
    try:
        where = "pg_advisory_xact_lock_shared(4242)::text = ''"  # each partition's rows wait for the gate
        with pdask.read_postgres(pg.conninfo, table=name, where=where, npartitions=2, device=dev) as parts:
            gate.execute("SELECT pg_advisory_lock(4242)")  # after planning: the client's own queries pass
            original = parts
            parts = parts.persist()
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
        assert _wait_until(lambda: pg.fetch(waiting, ("pystrom.dask partition",)) == [(2,)])
        # the block has ended while both reads are inside the snapshot: the client still holds it
        (held,) = _sessions(pg, app)
        assert held[2]
        assert "released, held by persisted reads" in repr(original._parts.snapshot)
        with pytest.raises(ClosedError, match="snapshot"):
            original.compute()  # released for anything new
    finally:
        gate.execute("SELECT pg_advisory_unlock(4242)")
        gate.close()
    distributed.wait(parts)
    assert _sorted(parts.compute()).equals(_sorted(pystrom.Table.from_arrow(data, device="cpu")))
    assert _wait_until(lambda: _sessions(pg, app) == [])  # and released once the last partition was read


def test_the_with_block_ending_before_a_persist_is_read_still_reads_everything(client, dev, pg, logreg):
    """The same example without a gate, as written: 2 of 2 runs failed with "invalid snapshot identifier"
    when the block's end released the snapshot before the workers had joined it."""
    name, data = logreg
    with pdask.read_postgres(pg.conninfo, table=name, npartitions=4, device=dev) as parts:
        parts = parts.persist()
    model = LogisticRegression().fit(parts, columns=["x1", "x2", "x3"], target="y")
    assert parts.num_rows == N_ROWS and model.coef_.shape == (1, 3)


def test_scan_equals_scan_arrow_and_skipped_groups_get_no_task(client, dev, tmp_path):
    data = _logreg_data(8000).sort_by("x1")  # sorted: batch statistics on x1 are tight
    paths = []
    for i in range(2):
        path = tmp_path / f"part{i}.arrow"
        pystrom.write_arrow(data.slice(i * 4000, 4000), path, batch_rows=500)
        paths.append(str(path))
    where = "x1 > 0.8 and x2 < 1"
    parts = pdask.scan_arrow(paths, columns=["id", "x1", "x2", "y"], where=where, batch_rows=1000, device=dev)
    ref = pystrom.scan_arrow(paths, columns=["id", "x1", "x2", "y"], where=where, batch_rows=1000, device="cpu")
    want = ref.collect()
    assert ref.stats.batches_skipped > 0
    assert parts.stats.batches_skipped == ref.stats.batches_skipped
    # one task per group the scan reads: the groups of the batches that were not skipped
    assert parts.npartitions == len(list(ref))
    assert len(parts.__dask_graph__()) == parts.npartitions
    got = parts.compute()
    assert got.to("cpu").equals(want)
    assert parts.schema == ref.schema


def test_collection_api_persist_arrays_frames_map_filter(client, dev, pg, logreg):
    name, data = logreg
    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=3, device=dev).persist()
    assert parts.npartitions == 3 and parts.num_rows == N_ROWS
    want = data.sort_by("id")
    ids = _host(parts.to_dask_array(["id"]).compute()).ravel()
    order = np.argsort(ids)

    arr = parts.to_dask_array(["x1", "x2", "x3"])
    assert isinstance(arr, da.Array) and arr.shape[1] == 3 and arr.dtype == np.float64
    assert arr.chunks[0] == tuple(parts.partition_rows())  # counted, so known
    host = _host(arr.compute())[order]
    np.testing.assert_array_equal(host, np.column_stack([want.column(c).to_numpy() for c in ["x1", "x2", "x3"]]))
    as32 = parts.to_dask_array(["x1", "x2"], dtype=np.float32)
    assert as32.dtype == np.float32 and float(as32.sum().compute()) == pytest.approx(host[:, :2].sum(), rel=1e-5)

    ddf = parts.to_dask_dataframe()
    assert list(ddf.columns) == ["id", "x1", "x2", "x3", "y"] and ddf.npartitions == 3
    pdf = ddf.compute()
    pdf = pdf.to_pandas() if hasattr(pdf, "to_pandas") else pdf
    assert pa.Table.from_pandas(pdf.sort_values("id"), preserve_index=False).equals(want)
    assert float(ddf.x1.sum().compute()) == pytest.approx(float(np.sum(host[:, 0])))

    pos = parts.filter("x1 > 0 and y")
    assert isinstance(pos, pdask.PartitionedTable) and pos.schema == parts.schema
    expect = want.filter(pa.compute.and_(pa.compute.greater(want.column("x1"), 0), want.column("y")))
    assert pos.num_rows == expect.num_rows and _sorted(pos.compute()).equals(expect)

    doubled = parts.map_partitions(lambda t: t.select(["id", "x1"]))
    assert isinstance(doubled, pdask.PartitionedTable) and doubled.columns == ["id", "x1"]
    assert doubled.num_rows == N_ROWS
    sums = parts.map_partitions(lambda t, c: t.to_array([c]).ravel() * 2, "x2")
    assert isinstance(sums, da.Array)
    assert float(sums.sum().compute()) == pytest.approx(2 * float(np.sum(host[:, 1])))
    counts = parts.map_partitions(lambda t: t.num_rows)
    assert sum(dask.compute(*counts)) == N_ROWS
    with pytest.raises(InvalidArgumentError, match="meta="):
        parts.map_partitions(lambda t: t.column("nope"))


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def test_bad_input_is_refused_with_clear_errors(client, dev, pg, logreg, tmp_path):
    name, _ = logreg
    with pytest.raises(InvalidArgumentError, match="connection string"):
        with pg.cluster.connect() as conn:
            pdask.read_postgres(conn, table=name)
    with pytest.raises(InvalidArgumentError, match="npartitions"):
        pdask.read_postgres(pg.conninfo, table=name, npartitions=0)
    with pytest.raises(InvalidArgumentError, match="device"):
        pdask.read_postgres(pg.conninfo, table=name, device="tpu")
    with pytest.raises(PostgresError, match="nope"):
        pdask.read_postgres(pg.conninfo, table="nope")
    assert _wait_until(lambda: _sessions(pg, "pystrom.dask snapshot") == [])  # no holder left by the failure
    with pdask.read_postgres(pg.conninfo, table=name, device=dev) as parts:
        with pytest.raises(ExpressionError):
            parts.filter("nope > 1")
        with pytest.raises(pystrom.ColumnNotFoundError):
            parts.to_dask_array(["x1", "nope"])
        # int64 and float64 together: whatever Table.to_array does (refuse, or promote), the collection does
        empty = pystrom.Table.from_arrow(parts.schema.empty_table(), device="cpu")
        try:
            mixed = empty.to_array(["id", "x1"]).dtype
        except pystrom.SchemaMismatchError:
            with pytest.raises(pystrom.SchemaMismatchError):
                parts.to_dask_array(["id", "x1"])
        else:
            assert parts.to_dask_array(["id", "x1"]).dtype == mixed
        with pytest.raises(DataError, match="target"):
            LogisticRegression().fit(parts, columns=["x1"])
        with pytest.raises(pystrom.UnsupportedTypeError):
            LogisticRegression().fit(parts, columns=["x1"], target="y", sample_weight=np.ones(3))
    with pytest.raises(FileNotFoundError):
        pdask.scan_arrow(str(tmp_path / "missing.arrow"))


def test_a_file_changed_after_planning_fails_naming_it(client, dev, tmp_path):
    path = tmp_path / "changing.arrow"
    pystrom.write_arrow(_logreg_data(3000), path, batch_rows=1000)
    parts = pdask.scan_arrow(str(path), batch_rows=1000, device=dev)
    assert parts.npartitions == 3
    pystrom.write_arrow(_logreg_data(3000, seed=8), path, batch_rows=1000)  # the same layout, other values
    again = pdask.scan_arrow(str(path), batch_rows=1000, device=dev)
    assert again.__dask_keys__() != parts.__dask_keys__()  # else the scheduler could hand back the old partitions
    assert again.compute().to("cpu").equals(pystrom.read_arrow(path, device="cpu"))
    pystrom.write_arrow(_logreg_data(500), path, batch_rows=500)  # one batch now: batches 1 and 2 are gone
    with pytest.raises(pystrom.FileFormatError, match="changing.arrow"):
        parts.compute()
    path.write_bytes(b"not an arrow file at all")
    with pytest.raises(pystrom.FileFormatError, match="changing.arrow"):
        parts.compute()


def test_an_unreachable_server_is_a_clear_error(client):
    with pytest.raises(PostgresError, match="cannot connect"):
        pdask.read_postgres("host=127.0.0.1 port=1 connect_timeout=3", table="t")


# -- logistic regression --------------------------------------------------------------------------------


def test_distributed_fit_equals_in_memory_fit_and_statsmodels(client, dev, pg, logreg):
    sm = pytest.importorskip("statsmodels.api")
    name, data = logreg
    cols = ["x1", "x2", "x3"]
    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=3, device=dev).persist()
    model = LogisticRegression().fit(parts, columns=cols, target="y")
    table = pystrom.read_postgres(pg.conninfo, table=name, device="cpu")
    ref = LogisticRegression().fit(table, columns=cols, target="y")
    assert model.converged_ and model.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(model.coefficients_, ref.coefficients_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.std_err_, ref.std_err_, rtol=1e-9)
    np.testing.assert_allclose(model.p_values_, ref.p_values_, rtol=1e-9, atol=1e-300)
    assert model.log_likelihood_ == pytest.approx(ref.log_likelihood_, rel=1e-12)
    assert model.num_rows_processed_ == N_ROWS and model.num_missing_rows_skipped_ == 0
    assert list(model.feature_names_in_) == cols

    X = np.column_stack([data.column(c).to_numpy() for c in cols])
    y = data.column("y").to_numpy(zero_copy_only=False).astype(float)
    res = sm.Logit(y, sm.add_constant(X)).fit(disp=0, tol=1e-12, maxiter=100)
    np.testing.assert_allclose(model.coefficients_, res.params, rtol=1e-6)
    np.testing.assert_allclose(model.std_err_, res.bse, rtol=1e-6)
    assert model.log_likelihood_ == pytest.approx(res.llf, rel=1e-9)

    # predictions are dask arrays, equal to the in-memory model's
    proba = model.predict_proba(parts)
    pred = model.predict(parts)
    assert isinstance(proba, da.Array) and isinstance(pred, da.Array)
    ids = _host(parts.to_dask_array(["id"]).compute()).ravel()
    order = np.argsort(ids)
    want_proba = ref.predict_proba(table)[np.argsort(table.column("id").to_numpy())]
    np.testing.assert_allclose(_host(proba.compute())[order], want_proba, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(_host(pred.compute())[order], want_proba[:, 1] > 0.5)

    # dask arrays of the partitions' chunks fit the same model
    arr = parts.to_dask_array(cols)
    yarr = parts.to_dask_array(["y"], dtype=np.float64)[:, 0]
    on_arrays = LogisticRegression().fit(arr, yarr)
    np.testing.assert_allclose(on_arrays.coefficients_, ref.coefficients_, rtol=1e-9, atol=1e-12)
    assert not hasattr(on_arrays, "feature_names_in_")
    d = on_arrays.decision_function(arr)
    assert isinstance(d, da.Array)
    np.testing.assert_allclose(_host(d.compute())[order], ref.decision_function(table)[np.argsort(
        table.column("id").to_numpy())], rtol=1e-10, atol=1e-12)  # fmt: skip


def test_balanced_weights_and_penalty_match_in_memory(client, dev, pg, logreg):
    name, _ = logreg
    cols = ["x1", "x2"]
    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=2, device=dev).persist()
    table = parts.compute()
    for kw in [dict(class_weight="balanced"), dict(penalty="l2", C=0.05)]:
        got = LogisticRegression(**kw).fit(parts, columns=cols, target="y")
        want = LogisticRegression(**kw).fit(table, columns=cols, target="y")
        np.testing.assert_allclose(got.coefficients_, want.coefficients_, rtol=1e-9, atol=1e-12)


def test_separation_is_judged_as_in_memory(client, dev):
    from pystrom.ml import PerfectSeparationWarning

    rng = np.random.default_rng(5)
    X = rng.normal(size=(3000, 2))
    y = X[:, 0] + 0.5 * X[:, 1] > 0.2  # a hyperplane: complete separation
    if dev == "cuda":
        import cupy

        X, y = cupy.asarray(X), cupy.asarray(y)
    Xd, yd = da.from_array(X, chunks=(1000, 2)), da.from_array(y, chunks=1000)
    with pytest.warns(PerfectSeparationWarning):
        got = LogisticRegression().fit(Xd, yd)
    with pytest.warns(PerfectSeparationWarning):
        want = LogisticRegression().fit(X, y)
    assert got.separation_ == want.separation_ == "complete" and got.n_iter_ == want.n_iter_
    np.testing.assert_allclose(got.coefficients_, want.coefficients_, rtol=1e-9)


def test_fit_over_persisted_partitions_skips_the_scheduler_and_survives_a_stale_placement(client, dev, pg, logreg):
    from pystrom.dask._fit import dask_source

    name, data = logreg
    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=6, device=dev).persist()
    distributed.wait(parts)

    def transitions(dask_scheduler):
        return dask_scheduler.transition_counter

    before = client.run_on_scheduler(transitions)
    with pystrom.defaults.set(dask_fit_loop="client"):  # the client's loop (test_dask_loop.py: the workers')
        got = LogisticRegression().fit(parts, columns=["x1", "x2", "x3"], target="y")
    assert got.fit_info_["path"] == "client"
    assert client.run_on_scheduler(transitions) - before < parts.npartitions, "the passes went through the scheduler"
    want = LogisticRegression().fit(pystrom.read_postgres(pg.conninfo, table=name, device="cpu"),
                                    columns=["x1", "x2", "x3"], target="y")  # fmt: skip
    np.testing.assert_allclose(got.coefficients_, want.coefficients_, rtol=1e-9, atol=1e-12)

    source, _, _ = dask_source(parts, None, None, ["x1", "x2", "x3"], "y")
    w = np.array([0.1, -0.2, 0.3, 0.05])
    right = source._total(w, (1.0, 1.0))
    _, plan = source._placement
    workers = list(client.scheduler_info()["workers"])
    if len(workers) > 1:  # a stale plan: every partition said to be on one worker that lacks some
        stale = {workers[0]: [keys for held in plan.values() for keys in held]}
        source._placement = (client, stale)
        np.testing.assert_allclose(source._total(w, (1.0, 1.0)), right, rtol=1e-12)
        assert source._placement[1] == plan  # looked up again for the next pass
    # a plan that names a partition twice or forgets one is never summed
    twice = {a: keys + keys for a, keys in plan.items()}
    source._placement = (client, twice)
    np.testing.assert_allclose(source._total(w, (1.0, 1.0)), right, rtol=1e-12)


def test_fit_moves_no_partition_off_its_worker(client, dev, pg, logreg):
    name, _ = logreg
    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=4, device=dev).persist()
    distributed.wait(parts)
    where = {k: set(v) for k, v in client.who_has(parts).items()}

    def outgoing(dask_worker):
        return dask_worker.transfer_outgoing_bytes_total

    before = sum(client.run(outgoing).values())
    model = LogisticRegression(max_iter=20).fit(parts, columns=["x1", "x2", "x3"], target="y")
    proba = float(model.predict_proba(parts).sum().compute())
    moved = sum(client.run(outgoing).values()) - before
    assert proba == pytest.approx(N_ROWS)
    table_bytes = N_ROWS * 8 * 4
    # what left the workers: one pass vector per partition and pass (a few hundred bytes each) and the sums
    assert moved < 2048 * model.n_passes_ * parts.npartitions + 4096, moved
    assert moved < table_bytes
    assert {k: set(v) for k, v in client.who_has(parts).items()} == where  # no partition was copied elsewhere


def test_partitions_live_on_their_workers_gpu(client, dev, pg, logreg):
    """With one worker per GPU, each worker's partitions sit on the GPU it owns (its device 0 under
    dask-cuda's CUDA_VISIBLE_DEVICES), and the fit gathers none of them."""
    if dev == "cpu":
        pytest.skip("placement on GPUs")
    name, data = logreg
    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=8, device=dev).persist()
    distributed.wait(parts)
    keys = {f.key for f in distributed.futures_of(parts)}

    def placement(keys, dask_worker):
        import cupy

        # this collection's partitions only: the module's cluster may still hold an earlier test's
        tables = [v for k, v in dask_worker.data.items() if k in keys and isinstance(v, pystrom.Table)]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        pci = cupy.cuda.Device(0).pci_bus_id
        return visible, pci, sorted({t.device for t in tables}), {t["x1"].device.id for t in tables}, len(tables)

    seen = client.run(placement, keys)
    workers = len(client.scheduler_info()["workers"])
    assert len(keys) == 8 and sum(n for *_, n in seen.values()) == 8, seen
    for _, _, devices, ids, n in seen.values():
        if n:
            assert devices == ["cuda:0"] and ids == {0}, seen
    if workers > 1 and all(v[0] for v in seen.values()):
        assert len({v[1] for v in seen.values()}) == workers, seen  # one distinct physical GPU per worker
        assert sum(1 for v in seen.values() if v[4]) > 1, seen  # the partitions are spread, not on one GPU
    got = LogisticRegression().fit(parts, columns=["x1", "x2", "x3"], target="y")
    want = LogisticRegression().fit(pystrom.read_postgres(pg.conninfo, table=name, device="cpu"),
                                    columns=["x1", "x2", "x3"], target="y")  # fmt: skip
    np.testing.assert_allclose(got.coefficients_, want.coefficients_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.std_err_, want.std_err_, rtol=1e-7)


def test_out_of_core_fit_over_a_scan_reads_on_the_workers(client, dev, tmp_path):
    data = _logreg_data(5000, seed=3)
    path = tmp_path / "logreg.arrow"
    pystrom.write_arrow(data, path, batch_rows=700)
    parts = pdask.scan_arrow(str(path), columns=["x1", "x2", "x3", "y"], batch_rows=1400, device=dev)
    assert parts.npartitions == 4
    got = LogisticRegression().fit(parts, columns=["x1", "x2", "x3"], target="y")
    want = LogisticRegression().fit(pystrom.read_arrow(path, device="cpu"), columns=["x1", "x2", "x3"], target="y")
    np.testing.assert_allclose(got.coefficients_, want.coefficients_, rtol=1e-9, atol=1e-12)
    assert got.num_rows_processed_ == 5000


def test_predictions_from_partitions_with_null_features_match_in_memory(client, dev, tmp_path):
    data = _logreg_data(2000, seed=5)
    x1 = pa.array(data.column("x1").to_numpy(), mask=np.arange(2000) % 7 == 0)
    data = data.set_column(1, "x1", x1)
    path = tmp_path / "nulls.arrow"
    pystrom.write_arrow(data, path, batch_rows=300)
    parts = pdask.scan_arrow(str(path), batch_rows=600, device=dev)
    table = pystrom.read_arrow(path, device="cpu")
    model = LogisticRegression().fit(table, columns=["x1", "x2", "x3"], target="y")
    for method in ("predict_proba", "predict", "decision_function"):
        got = getattr(model, method)(parts).compute()
        want = getattr(model, method)(table)
        got = got.get() if hasattr(got, "get") else got
        assert got.shape == want.shape, method
        np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float), rtol=1e-12)
    assert np.isnan(model.predict_proba(parts).compute()[::7]).all() if dev == "cpu" else True
    with pytest.raises(DataError, match="expecting 3 features"):
        model.predict(parts, columns=["x1", "x2"])


def test_fit_names_a_column_with_nan_from_its_worker(client, dev, pg):
    name = pg.name("nan")
    pg.execute(f'CREATE TABLE "{name}" AS SELECT g AS id, (g % 7)::float8 AS a, '
               f"CASE WHEN g = 333 THEN 'NaN'::float8 ELSE g * 0.01 END AS b, g % 3 = 0 AS y "
               "FROM generate_series(1, 1000) g")  # fmt: skip
    parts = pdask.read_postgres(pg.conninfo, table=name, npartitions=2, device=dev).persist()
    with pytest.raises(DataError, match="'b'"):
        LogisticRegression().fit(parts, columns=["a", "b"], target="y")


# -- failures -------------------------------------------------------------------------------------------


@pytest.fixture
def fragile_cluster():
    """A cluster of its own whose workers the test kills (one attempt per task: no retry on another worker)."""
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", memory_limit="2GiB")
        client = distributed.Client(c, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        c.close()


def test_a_worker_killed_mid_read_gives_a_clear_error_and_leaves_no_session(fragile_cluster, pg, logreg):
    client = fragile_cluster
    name, _ = logreg
    # slow ranges: every row costs 2 ms on the server, so both reads are under way when the worker dies
    slow = f"{name}_slow"
    pg.execute(f'CREATE FUNCTION "{slow}"(x int8) RETURNS bool VOLATILE LANGUAGE sql '
               "AS $$ SELECT pg_sleep(0.002) IS NOT NULL OR x IS NOT NULL $$")  # fmt: skip
    parts = pdask.read_postgres(pg.conninfo, table=name, where=f'"{slow}"(id)', npartitions=2, device="cpu")
    try:
        future = client.compute(parts.to_dask_array(["id"]).sum())  # only a sum comes back
        assert _wait_until(lambda: len(_sessions(pg, "pystrom.dask partition")) == 2, 30)
        busy = next(addr for addr, keys in client.processing().items() if keys)
        pid = client.run(os.getpid, workers=[busy])[busy]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(distributed.KilledWorker) as info:
            future.result(timeout=60)
        assert "pystrom-read-postgres" in str(info.value) and "died" in str(info.value)
        client.cancel(future)
        # the killed worker's session ends with its socket, the other's when its range is read
        assert _wait_until(lambda: _sessions(pg, "pystrom.dask partition") == [], 30)
        assert len(_sessions(pg, "pystrom.dask snapshot")) == 1  # the client's holder is fine
    finally:
        parts.close()
        pg.execute(f'DROP FUNCTION IF EXISTS "{slow}"(int8)')
    assert _wait_until(lambda: _sessions(pg, "pystrom.dask snapshot") == [])


def test_a_worker_killed_mid_read_is_retried_on_the_same_snapshot(client, dev, pg, logreg):
    """With dask's default retries the read survives the worker: the result is still the snapshot's."""
    name, _ = logreg
    slow = f"{name}_slow"
    pg.execute(f'CREATE FUNCTION "{slow}"(x int8) RETURNS bool VOLATILE LANGUAGE sql '
               "AS $$ SELECT pg_sleep(0.001) IS NOT NULL OR x IS NOT NULL $$")  # fmt: skip
    parts = pdask.read_postgres(pg.conninfo, table=name, where=f'"{slow}"(id)', npartitions=2, device=dev)
    try:
        future = client.compute(parts.to_dask_array(["id"]).sum())
        assert _wait_until(lambda: len(_sessions(pg, "pystrom.dask partition")) == 2, 30)
        pg.execute(f'DELETE FROM "{name}" WHERE id < 100')  # committed after the snapshot: not seen
        busy = next(addr for addr, keys in client.processing().items() if keys)
        os.kill(client.run(os.getpid, workers=[busy])[busy], signal.SIGKILL)
        assert int(future.result(timeout=120)) == N_ROWS * (N_ROWS - 1) // 2
    finally:
        parts.close()
        pg.execute(f'DROP FUNCTION IF EXISTS "{slow}"(int8)')
    assert _wait_until(lambda: _sessions(pg, "pystrom.dask partition") == [], 30)


def test_import_pystrom_imports_no_dask():
    code = (
        "import sys, pystrom, pystrom.ml\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
