"""Out-of-core fits over host Tables through pystrom.ml._staging: pinned memory, one async copy a batch.

On the CPU the pipeline runs with :class:`FakeOps`, a stand-in for the GPU side that defers every copy
until something waits for it (a slow copy engine) and fills fresh buffers with 0xFF (NaN as floats):
a missing wait hands over stale or NaN data and the fit differs. On a GPU the real CudaOps run.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc

import numpy as np
import pyarrow as pa
import pytest

import pystrom
from pystrom import Table
from pystrom.ml import LogisticRegression, _inputs
from pystrom.ml._staging import HostStaging, batch_layout, registered_ranges, staging_stats

from conftest import device_memory_in_use, needs_gpu

gpu = [pytest.mark.gpu, needs_gpu]


class _Event:
    def __init__(self) -> None:
        self.upto = 0  # copies queued up to and including this event's record


class FakeOps:
    """CudaOps' interface on the CPU: copies run only when an event recorded after them is waited for."""

    def __init__(self, backend, refuse: bool = False):
        self.backend = backend
        self.refuse = refuse
        self.queue: list = []
        self.ran = 0
        self.registered: dict[int, int] = {}
        self.clock = 0
        self.used_at: dict[int, int] = {}  # id(copied event) -> when compute last waited for it
        self.done_at: dict[int, int] = {}  # id(consumed event) -> when it was last recorded
        self.bounces: list[np.ndarray] = []
        self.last_from: dict[int, int] = {}  # bounce buffer -> index of the last copy out of it
        self.host_known = 0  # copies the host has waited for

    def compute_context(self):
        return contextlib.nullcontext()

    def event(self):
        return _Event()

    def register(self, ptr: int, nbytes: int) -> bool:
        if self.refuse:
            return False
        assert ptr not in self.registered, "registered twice"
        self.registered[ptr] = nbytes
        return True

    def unregister(self, ptr: int) -> None:
        assert self.ran == len(self.queue), "unregistered while copies from it are queued"
        del self.registered[ptr]

    def device_buffer(self, nbytes: int):
        return np.full(nbytes, 0xFF, dtype=np.uint8)

    def pinned_buffer(self, nbytes: int):
        self.bounces.append(np.full(nbytes, 0xFF, dtype=np.uint8))
        return self.bounces[-1]

    def _bounce_of(self, ptr: int) -> int | None:
        for i, b in enumerate(self.bounces):
            if b.ctypes.data <= ptr < b.ctypes.data + b.size:
                return i
        return None

    def block(self, buffer, nbytes: int):
        return self.backend.wrap(buffer, nbytes)

    def queue_copy(self, slot, pieces) -> None:
        # the buffer is refilled only after every pass handed it was marked done (its consumed event)
        assert self.done_at.get(id(slot.consumed), 0) >= self.used_at.get(id(slot.copied), 0)
        base = slot.device.ctypes.data
        for src, off, size in pieces:
            assert off + size <= slot.device.size
            bounce = self._bounce_of(src)
            if bounce is not None:  # the host refilled it only after waiting for the copy out of it
                assert self.host_known >= self.last_from.get(bounce, 0), "bounce buffer refilled during its DMA"
                self.last_from[bounce] = len(self.queue) + 1
            self.queue.append(lambda d=base + off, s=src, n=size: ctypes.memmove(d, s, n))
        slot.copied.upto = len(self.queue)

    def _run_until(self, n: int) -> None:
        while self.ran < n:
            self.queue[self.ran]()
            self.ran += 1

    def compute_after(self, event) -> None:
        self.clock += 1
        self.used_at[id(event)] = self.clock
        self._run_until(event.upto)

    def compute_done(self, event) -> None:
        self.clock += 1
        self.done_at[id(event)] = self.clock

    def host_wait(self, event) -> None:
        self._run_until(event.upto)
        self.host_known = max(self.host_known, event.upto)

    def synchronize(self) -> None:
        self._run_until(len(self.queue))
        self.host_known = len(self.queue)


@pytest.fixture
def fake(monkeypatch):
    """CPU fits over host Tables go through the staging pipeline with FakeOps; yields the ops made."""
    made = _Made()
    refuse = made.refuse

    def staging(backend, first, columns):
        if not isinstance(first, Table) or first.device != "cpu":
            return None
        made.append(FakeOps(backend, refuse["on"]))
        return HostStaging(backend, columns, ops=made[-1])

    monkeypatch.setattr(_inputs, "host_staging", staging)
    return made


class _Made(list):
    """The FakeOps of the fits made; ``refuse["on"]``: registrations fail from now on."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = {"on": False}


def _data(n: int, seed: int, noise: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    t = 1 + 2 * X[:, 0] - 3 * X[:, 1] + X[:, 2] + 0.5 * X[:, 3] > 0
    return X, t ^ (rng.random(n) < noise)


NAMES = ["x1", "x2", "x3", "x4"]


def _host_table(X, t, dtype=np.float64, nulls: dict | None = None, extra: bool = False) -> Table:
    arrays = {n: pa.array(X[:, j].astype(dtype)) for j, n in enumerate(NAMES)}
    arrays["y"] = pa.array(t)
    for name, rows in (nulls or {}).items():
        values = arrays[name].to_pylist()
        for r in rows:
            values[r] = None
        arrays[name] = pa.array(values, type=arrays[name].type)
    if extra:  # a column no fit reads, of a type a batch cannot use
        arrays["note"] = pa.array([f"row {i}" for i in range(len(t))])
    return Table.from_arrow(pa.table(arrays), device="cpu")


def _batches(X, t, sizes, dtypes=None, nulls=None, extra=False) -> list[Table]:
    out, start = [], 0
    for i, n in enumerate(sizes):
        dtype = dtypes[i] if dtypes else np.float64
        out.append(_host_table(X[start : start + n], t[start : start + n], dtype, (nulls or {}).get(i), extra))
        start += n
    return out


def _mixed_case():
    """Batches of different sizes (one empty), NULLs in two of them, float32 and float64 batches."""
    X, t = _data(9_000, seed=3)
    sizes = [2_000, 1, 0, 3_999, 3_000]
    dtypes = [np.float64, np.float32, np.float64, np.float64, np.float32]
    nulls = {0: {"x2": [5, 1999]}, 3: {"y": [0, 17], "x4": [17, 100]}}
    return X, t, _batches(X, t, sizes, dtypes, nulls)


def _direct(batches, device="cpu", columns=None):
    """The same fit without staging (the prefetch path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_inputs, "host_staging", lambda *a: None)
        return LogisticRegression(device=device).fit(batches, target="y", columns=columns)


def _same_fit(a, b, rtol=1e-12, same_path=True):
    np.testing.assert_allclose(a.coefficients_, b.coefficients_, rtol=rtol)
    np.testing.assert_allclose(a.std_err_, b.std_err_, rtol=rtol)
    np.testing.assert_allclose(a.log_likelihood_, b.log_likelihood_, rtol=rtol)
    assert a.num_rows_processed_ == b.num_rows_processed_
    assert a.num_missing_rows_skipped_ == b.num_missing_rows_skipped_
    if same_path:  # the same batches: the same sums, the same iterations
        assert a.n_passes_ == b.n_passes_


def test_layout_of_whole_tables_and_slices():
    X, t = _data(1000, seed=1)
    table = _host_table(X, t, nulls={"x3": [3, 500]}, extra=True)
    whole = batch_layout(table, None)
    assert len(whole.pieces) == 1 and whole.pieces[0][0] == whole.pieces[0][1] == 0
    assert table._live().nbytes - 64 < whole.size <= table._live().nbytes  # all but the last padding
    used = batch_layout(table, ["x1", "x2", "y"])  # only the used columns' span (their values, y's bitmap-free)
    assert used.pieces[0][2] < whole.pieces[0][2]
    sliced = batch_layout(table.slice(333, 400), ["x3", "y", "x3"])
    assert [p.name for p, *_ in sliced.columns] == ["x3", "y"]
    plan, r, n, nulls = sliced.columns[0]
    assert (r, n, nulls) == (333 % 8, 400, 1) and plan.validity is not None
    assert batch_layout(table.slice(10, 5), ["note"]) is None  # a string slice is not staged
    with pytest.raises(pystrom.ColumnNotFoundError, match="nope"):
        batch_layout(table, ["nope"])


def test_staged_fit_equals_direct_fit(fake):
    X, t, batches = _mixed_case()
    staged = LogisticRegression().fit(batches, target="y")
    ref = _direct(batches)
    _same_fit(staged, ref)
    assert staged.num_missing_rows_skipped_ == 5 and len(fake) == 1
    assert registered_ranges() == 0 and not fake[0].registered
    stats = staging_stats()
    assert stats["registered_bytes"] > 0 and stats["bounced_bytes"] == 0
    # the rows without NULLs, in memory (float64 throughout: the float32 batches count in float32)
    plain = _batches(X, t, [4_000, 5_000])
    _same_fit(LogisticRegression().fit(plain, target="y"), LogisticRegression().fit(X, t), 1e-9, same_path=False)


def test_staged_slices_scans_and_bounce_buffers(fake):
    X, t = _data(20_000, seed=4)
    table = _host_table(X, t, nulls={"x1": [9, 10, 12_345], "y": [4_001]}, extra=True)
    slices = [table.slice(s, 997) for s in range(0, table.num_rows, 997)]  # odd offsets: bitmaps keep bit positions
    ref = _direct(slices, columns=NAMES)
    _same_fit(LogisticRegression().fit(slices, target="y", columns=NAMES), ref)
    assert fake[-1].registered == {} and staging_stats()["registered_bytes"] == table._live().nbytes  # one block

    class Scan:  # a re-iterable: fresh Table objects every pass, never registered
        def __iter__(self):
            return iter([table.slice(s, 4_096) for s in range(0, table.num_rows, 4_096)])

    _same_fit(LogisticRegression().fit(Scan(), target="y", columns=NAMES), _direct(list(Scan()), columns=NAMES))
    assert staging_stats()["registered_bytes"] == 0 and staging_stats()["bounced_bytes"] > 0
    fake.refuse["on"] = True  # memory CUDA will not register: the bounce buffers
    whole = _batches(X, t, [7_000, 6_000, 7_000], extra=True)
    _same_fit(LogisticRegression().fit(whole, target="y", columns=NAMES), _direct(whole, columns=NAMES))
    assert staging_stats()["registered_bytes"] == 0 and staging_stats()["bounced_bytes"] > 0


def test_staged_scan_mixes_device_and_odd_items(fake):
    """Items the pipeline cannot stage (a string-column slice) go through prepare as they are, in order."""
    X, t = _data(6_000, seed=5)
    table = _host_table(X, t, extra=True)
    items = [table.slice(0, 2_000), table.slice(2_000, 2_000), table.slice(4_000)]
    # columns=None reads every column but y: the string column makes prepare refuse, as without staging
    with pytest.raises(pystrom.UnsupportedTypeError, match="note"):
        LogisticRegression().fit(items, target="y")
    assert registered_ranges() == 0
    _same_fit(LogisticRegression().fit(items, target="y", columns=NAMES), _direct(items, columns=NAMES))


class _FailingList(list):
    """A list of Tables whose iteration number ``fail_at`` raises after ``after`` tables."""

    def __init__(self, items, fail_at: int, after: int):
        super().__init__(items)
        self.fail_at, self.after, self.count = fail_at, after, 0

    def __iter__(self):
        self.count += 1
        for i, item in enumerate(list.__iter__(self)):
            if self.count == self.fail_at and i == self.after:
                raise OSError("the disk went away")
            yield item


def test_error_mid_pass_unregisters(fake):
    X, t = _data(8_000, seed=6)
    batches = _batches(X, t, [2_000] * 4)
    for fail_at in (3, 5):  # the first pass (iterations 1 and 2 look at the list), a later one
        with pytest.raises(OSError, match="disk went away"):
            LogisticRegression().fit(_FailingList(batches, fail_at, 2), target="y")
        assert registered_ranges() == 0 and not fake[-1].registered
    bad = _batches(X, t, [2_000] * 4)
    bad[2] = Table.from_arrays({n: X[:10, j] for j, n in enumerate(NAMES)} | {"y": np.arange(10.0)}, "cpu")
    with pytest.raises(pystrom.DataError, match="other than 0 and 1"):
        LogisticRegression().fit(bad, target="y")
    assert registered_ranges() == 0 and not fake[-1].registered


def test_fit_twice_on_one_list(fake):
    X, t, batches = _mixed_case()
    a = LogisticRegression().fit(batches, target="y")
    b = LogisticRegression(class_weight="balanced").fit(batches, target="y")
    c = LogisticRegression().fit(batches, target="y")
    _same_fit(a, c)
    assert not np.allclose(a.coefficients_, b.coefficients_)
    assert registered_ranges() == 0 and len(fake) == 3


# -- on a GPU: the real CudaOps ---------------------------------------------------------------------


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_gpu_staged_fit_equals_in_memory(device):
    X, t = _data(60_000, seed=7)
    batches = _batches(X, t, [20_000, 15_000, 25_000])
    ref = LogisticRegression().fit(_on_gpu(X), _on_gpu(t))
    staged = LogisticRegression(device=device).fit(batches, target="y")
    assert staged.device_.startswith("cuda") and staging_stats()["registered_bytes"] > 0
    _same_fit(staged, ref, 1e-9, same_path=False)
    assert registered_ranges() == 0


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_gpu_staged_nulls_sizes_and_dtypes(device):
    """NULLs in some batches, batches of different sizes (one empty), float32 and float64 batches: as
    the same batches fitted without staging on the GPU."""
    X, t, batches = _mixed_case()
    staged = LogisticRegression(device=device).fit(batches, target="y")
    _same_fit(staged, _direct(batches, device), rtol=1e-9)
    assert staged.num_missing_rows_skipped_ == 5 and registered_ranges() == 0
    # slices of one host table (odd offsets, bitmaps), a scan of fresh slices (bounce buffers)
    table = _host_table(X, t, nulls={"x1": [9, 10, 8_765]}, extra=True)
    slices = [table.slice(s, 997) for s in range(0, table.num_rows, 997)]
    sliced = LogisticRegression(device=device).fit(slices, target="y", columns=NAMES)
    _same_fit(sliced, _direct(slices, device, NAMES), rtol=1e-9)

    class Scan:
        def __iter__(self):
            return iter([table.slice(s, 2_500) for s in range(0, table.num_rows, 2_500)])

    streamed = LogisticRegression(device=device).fit(Scan(), target="y", columns=NAMES)
    assert staging_stats()["bounced_bytes"] > 0 and staging_stats()["registered_bytes"] == 0
    _same_fit(streamed, _direct(list(Scan()), device, NAMES), rtol=1e-9)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_gpu_error_mid_pass_leaves_nothing(device):
    X, t = _data(40_000, seed=8)
    batches = _batches(X, t, [10_000] * 4)
    first = LogisticRegression(device=device).fit(batches, target="y")  # kernels compiled, pools warm
    del first
    before = device_memory_in_use(device)
    for fail_at in (3, 6):
        try:
            LogisticRegression(device=device).fit(_FailingList(batches, fail_at, 2), target="y")
        except OSError as exc:
            assert "disk went away" in str(exc)
        else:
            raise AssertionError("the fit did not fail")
        assert registered_ranges() == 0
        assert device_memory_in_use(device) == before
    bad = list(batches)
    bad[3] = Table.from_arrays({n: X[:10, j] for j, n in enumerate(NAMES)} | {"y": np.arange(10.0)}, "cpu")
    try:
        LogisticRegression(device=device).fit(bad, target="y")
    except pystrom.DataError as exc:
        assert "other than 0 and 1" in str(exc)
    gc.collect()
    assert registered_ranges() == 0 and device_memory_in_use(device) == before


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_gpu_fit_twice_and_buffers_reused(device):
    X, t, batches = _mixed_case()
    a = LogisticRegression(device=device).fit(batches, target="y")
    copies = staging_stats()["copies"]
    b = LogisticRegression(device=device).fit(batches, target="y")
    _same_fit(a, b)
    assert staging_stats()["copies"] == copies and registered_ranges() == 0
    assert copies == a.n_passes_ * 4  # one copy a batch a pass (the empty batch: none)


def _on_gpu(a):
    import cupy

    return cupy.asarray(a)
