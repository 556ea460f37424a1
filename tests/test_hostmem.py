"""CPU-table memory: private and pooled until exported, then shared in place (pystrom.memory.hostmem)."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import pystrom
from pystrom.memory import hostmem, shm

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="anonymous mappings and memfd are Linux only")


def _smaps_entry(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that contains ``address``."""
    entry: dict[str, str] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                if entry is not None:
                    return entry
                if lo <= address < hi:
                    entry = {"path": head[5] if len(head) > 5 else ""}
            elif entry is not None and line.rstrip().endswith("kB"):
                key, value = line.split(":", 1)
                entry[key] = value.strip()
    assert entry is not None, f"no mapping holds {address:#x}"
    return entry


def _address(table: pystrom.Table) -> int:
    return table._block.ptr


@pytest.fixture(autouse=True)
def empty_pool():
    hostmem.release_pool()
    yield
    gc.collect()
    hostmem.release_pool()


def test_size_classes():
    assert hostmem.size_class(1) == 64 << 10
    assert hostmem.size_class(64 << 10) == 64 << 10
    assert hostmem.size_class((64 << 10) + 1) == 96 << 10
    assert hostmem.size_class(96 << 10) == 96 << 10
    assert hostmem.size_class((96 << 10) + 1) == 128 << 10
    for n in (1, 4095, 65537, 10**6, 3 * 2**27 + 1, 2**31 + 5):
        c = hostmem.size_class(n)
        assert n <= c < n * 1.5 + (64 << 10)


def test_fresh_memory_is_not_faulted_in_before_it_is_written():
    """No MAP_POPULATE: a new 64 MiB allocation holds no resident pages until the producer writes them."""
    memory = hostmem.allocate(64 << 20)
    entry = _smaps_entry(memory.ctypes.data)
    assert entry["Rss"] == "0 kB", entry
    assert entry["path"] == "", entry  # anonymous, private: no memfd yet
    memory[: 1 << 20] = 1
    assert int(_smaps_entry(memory.ctypes.data)["Rss"].split()[0]) >= 1024


def test_a_table_is_private_until_exported_then_shared_in_place():
    t = pystrom.Table.from_arrays({"x": np.arange(100_000, dtype=np.int64)}, device="cpu")
    before = t["x"]  # an array handed out before the export
    assert _smaps_entry(_address(t))["path"] == ""
    handle = t.export()
    assert _smaps_entry(_address(t))["path"].startswith("/memfd:pystrom-")
    assert before.ctypes.data == t["x"].ctypes.data  # same addresses, now shared memory
    v = pystrom.ipc_import(handle)  # a second, independent mapping of the memfd
    assert v["x"].ctypes.data != before.ctypes.data
    assert v["x"].tolist() == list(range(100_000))
    before[:10] = -1  # written through the pre-export array: the importer's mapping sees it
    assert v["x"][:11].tolist() == [-1] * 10 + [10]
    assert t.export() != b"" and _smaps_entry(_address(t))["path"].startswith("/memfd:pystrom-")


def test_freed_memory_is_reused_without_faults_and_shared_memory_is_not():
    with pystrom.defaults.set(host_pool_bytes=1 << 30):
        t = pystrom.Table.from_arrays({"x": np.ones(1 << 20)}, device="cpu")
        address = _address(t)
        del t
        gc.collect()
        assert hostmem.pool_bytes() == hostmem.size_class(8 << 20)
        t = pystrom.Table.from_arrays({"y": np.zeros(1 << 20)}, device="cpu")  # same size class
        assert _address(t) == address and hostmem.pool_bytes() == 0
        t.export()
        del t
        gc.collect()
        assert hostmem.pool_bytes() == 0  # importers may still map it: never handed out again


def test_the_pool_keeps_at_most_host_pool_bytes():
    with pystrom.defaults.set(host_pool_bytes=0):
        t = pystrom.Table.from_arrays({"x": np.ones(1000)}, device="cpu")
        del t
        gc.collect()
        assert hostmem.pool_bytes() == 0
    with pystrom.defaults.set(host_pool_bytes=256 << 10):
        tables = [pystrom.Table.from_arrays({"x": np.ones(n)}, device="cpu") for n in (100, 10_000, 20_000)]
        del tables
        gc.collect()
        assert 0 < hostmem.pool_bytes() <= 256 << 10


def test_an_importer_sees_no_bytes_of_an_earlier_table_in_the_same_mapping():
    secret = pystrom.Table.from_arrays({"s": np.full(5000, 0x5A5A5A5A5A5A5A5A, dtype=np.uint64)}, device="cpu")
    address = _address(secret)
    del secret
    gc.collect()
    t = pystrom.Table.from_arrays({"x": np.ones(100, dtype=np.uint8)}, device="cpu")
    assert _address(t) == address  # the secret's mapping, reused
    v = pystrom.ipc_import(t.export())
    whole = np.frombuffer(shm.mapping_of(v._block.memory), dtype=np.uint8)
    assert whole[:100].tolist() == [1] * 100
    assert not whole[t._block.nbytes :].any()  # the rest of the shared file is zeros, not the secret
