"""All of pystrom's tunables in one place, filled from ``PYSTROM_*`` environment variables.

>>> import pystrom
>>> pystrom.defaults.repr_rows
10
>>> with pystrom.defaults.set(repr_rows=3):      # restored when the block ends
...     pystrom.defaults.repr_rows
3

``set`` also works as a plain call (the change then stays until set back).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["defaults", "Settings"]


@dataclass(frozen=True)
class _Option:
    env: str
    parse: Callable[[str], Any]
    default: Any
    check: Callable[[Any], bool]
    doc: str


def _device_or_none(text: str) -> str | None:
    return text or None


_OPTIONS: dict[str, _Option] = {
    "device": _Option(
        "PYSTROM_DEVICE",
        _device_or_none,
        None,
        lambda v: v is None or isinstance(v, str),
        "Device used when a call passes device=None: 'cpu', 'cuda' or 'cuda:N'; None picks a GPU if one is visible.",
    ),
    "copy_threads": _Option(
        "PYSTROM_COPY_THREADS",
        int,
        0,
        lambda v: isinstance(v, int) and v >= 0,
        "Threads for bulk host<->GPU and host copies; 0 picks min(8, CPU cores).",
    ),
    "staging_chunk": _Option(
        "PYSTROM_STAGING_CHUNK",
        int,
        8 << 20,
        lambda v: isinstance(v, int) and v >= 4096,
        "Bytes per pinned staging slot (each copy thread has two).",
    ),
    "host_pool_bytes": _Option(
        "PYSTROM_HOST_POOL_BYTES",
        int,
        1 << 30,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "Most bytes of freed CPU-table memory kept mapped for reuse (new tables then skip page faults); 0 keeps none.",
    ),
    "pg_partitions": _Option(
        "PYSTROM_PG_PARTITIONS",
        int,
        0,
        lambda v: isinstance(v, int) and v >= 0,
        "Most connections read_postgres(partitions=None) opens for one table; 0 picks from the server's cores.",
    ),
    "pg_staging_chunk": _Option(
        "PYSTROM_PG_STAGING_CHUNK",
        int,
        64 << 20,
        lambda v: isinstance(v, int) and v >= 4096,
        "Largest staging buffer (bytes) the PostgreSQL COPY pump fills before starting the next one.",
    ),
    "pg_write_chunk": _Option(
        "PYSTROM_PG_WRITE_CHUNK",
        int,
        4 << 20,
        lambda v: isinstance(v, int) and v >= 4096,
        "Largest chunk (bytes of encoded rows) a write_postgres connection encodes and sends at a time.",
    ),
    "io_threads": _Option(
        "PYSTROM_IO_THREADS",
        int,
        0,
        lambda v: isinstance(v, int) and v >= 0,
        "Threads reading files (KvikIO's pool on a GPU unless KVIKIO_NTHREADS is set); 0 picks the CPU count.",
    ),
    "compress_threads": _Option(
        "PYSTROM_COMPRESS_THREADS",
        int,
        0,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "Threads compressing record batch buffers in write_arrow(compression=...); 0 picks the CPU count.",
    ),
    "io_task_size": _Option(
        "PYSTROM_IO_TASK_SIZE",
        int,
        16 << 20,
        lambda v: isinstance(v, int) and v >= 4096,
        "Bytes per file read task (KvikIO's task and bounce buffer size unless KVIKIO_TASK_SIZE is set).",
    ),
    "zstd_decoder": _Option(
        "PYSTROM_ZSTD_DECODER",
        str,
        "auto",
        lambda v: v in ("auto", "pyarrow", "libzstd"),
        "What decodes the ZSTD bodies of Arrow files on the host (the CPU backend; a GPU's ZSTD without nvCOMP): "
        "'libzstd', the system's libzstd.so.1 called from C++, a thread's frames in one call straight into their "
        "places (1.2x pyarrow's codec on 16 cores, more where frames are small); 'pyarrow', pyarrow's bundled "
        "codec (a Python call, a decompression context and an output buffer a frame); 'auto', libzstd where it "
        "loads and is 1.5.7 or later (the version pyarrow bundles), else pyarrow's. Every valid frame decodes "
        "alike; a frame corrupt inside (Arrow's carry no checksum) may decode to other bytes through another "
        "version, and older ones notice less corruption.",
    ),
    "gpu_zstd_decoder": _Option(
        "PYSTROM_GPU_ZSTD_DECODER",
        str,
        "kernel",
        lambda v: v in ("kernel", "host"),
        "What decodes the ZSTD bodies of Arrow files read onto a GPU: 'kernel', pystrom's decoder "
        "(kernels/zstd.cu, a warp a frame; a frame with a content checksum goes to the host codec); 'host', the "
        "CPU codec (zstd_decoder) into pinned staging. PYSTROM_NVCOMP=1 hands them to nvCOMP instead of either.",
    ),
    "gpu_compressor": _Option(
        "PYSTROM_GPU_COMPRESSOR",
        str,
        "kernel",
        lambda v: v in ("kernel", "host"),
        "What compresses write_arrow(compression='lz4') of a Table or scan on a GPU: 'kernel', pystrom's LZ4 "
        "compressor (kernels/lz4_encode.cu, a warp a 64 KiB block; only the compressed bytes cross to the host); "
        "'host', the CPU codec on compress_threads threads. A compression_level, and 'zstd', always use the CPU "
        "codec.",
    ),
    "logit_hessian": _Option(
        "PYSTROM_LOGIT_HESSIAN",
        str,
        "auto",
        lambda v: v in ("auto", "float32", "float64", "tf32"),
        "Logistic regression with more than 8 features: 'float32' forms the Hessian of each Newton step in "
        "float32 (the gradient, log-likelihood and statistics stay float64); 'tf32' likewise on a GPU's TF32 "
        "tensor cores (float32 on the CPU); 'float64' forms every one in float64; 'auto' is 'tf32' where the "
        "problem's condition allows it, else 'float32' (the solver's guard decides at the first pass).",
    ),
    "logit_chunk_rows": _Option(
        "PYSTROM_LOGIT_CHUNK_ROWS",
        int,
        0,
        lambda v: isinstance(v, int) and v >= 0,
        "Rows per chunk of the logistic regression pass with more than 8 features; 0 sizes chunks by the device.",
    ),
    "dask_fit_loop": _Option(
        "PYSTROM_DASK_FIT_LOOP",
        str,
        "auto",
        lambda v: v in ("auto", "workers", "client"),
        "Where a fit over persisted pystrom.dask partitions runs its Newton loop: 'auto' runs it on the GPU workers "
        "(each pass's sums all-gathered over NCCL; one GPU worker needs none) and on the client otherwise; "
        "'workers' also on CPU workers and where NCCL is unusable (all-gathers over TCP between the workers); "
        "'client' always on the client (one Client.run of every worker a pass).",
    ),
    "dask_fit_timeout": _Option(
        "PYSTROM_DASK_FIT_TIMEOUT",
        float,
        120.0,
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf"),
        "Seconds a worker of a fit whose loop runs on the workers waits for the others at one all-gather (the "
        "slowest worker's pass included), or for its communicator to form, before it gives up with an error.",
    ),
    "dask_fit_restarts": _Option(
        "PYSTROM_DASK_FIT_RESTARTS",
        int,
        2,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "Times a fit whose loop runs on the workers starts again (its lost partitions read again) after a worker "
        "was lost or an all-gather failed; past that it raises pystrom.ClusterError.",
    ),
    "repr_rows": _Option(
        "PYSTROM_REPR_ROWS",
        int,
        10,
        lambda v: isinstance(v, int) and v >= 0,
        "Rows shown by repr() and the notebook view of a Table.",
    ),
    "store_connect_retry": _Option(
        "PYSTROM_STORE_CONNECT_RETRY",
        float,
        3.0,
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf"),
        "Seconds pystrom.Store() keeps trying to connect while the daemon's backlog is full or nobody listens "
        "(a crowd connecting at once, a daemon restarting) before StoreUnavailableError.",
    ),
    "progress_delay": _Option(
        "PYSTROM_PROGRESS_DELAY",
        float,
        2.0,
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf"),
        "Seconds a load runs before its automatic progress bar (progress=None, stderr a terminal) appears.",
    ),
}


class _Restore:
    """Returned by ``Settings.set``: a context manager that puts the previous values back."""

    def __init__(self, settings: Settings, previous: dict[str, Any]):
        self._settings = settings
        self._previous = previous

    def __enter__(self) -> Settings:
        return self._settings

    def __exit__(self, *exc: object) -> None:
        self._settings._values.update(self._previous)


class Settings:
    """pystrom's tunables. Read them as attributes; change them with :meth:`set`."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        for name, opt in _OPTIONS.items():
            raw = os.environ.get(opt.env)
            if raw is None:
                self._values[name] = opt.default
                continue
            try:
                value = opt.parse(raw)
            except ValueError:
                value = None
            if not opt.check(value):
                raise ValueError(f"environment variable {opt.env}={raw!r} is not valid: {opt.doc}")
            self._values[name] = value

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"pystrom.defaults has no setting {name!r}; known: {sorted(_OPTIONS)}") from None

    def set(self, **changes: Any) -> _Restore:
        """Change settings; use as ``with defaults.set(...):`` to restore them afterwards."""
        for name, value in changes.items():
            opt = _OPTIONS.get(name)
            if opt is None:
                raise ValueError(f"pystrom.defaults has no setting {name!r}; known: {sorted(_OPTIONS)}")
            if not opt.check(value):
                raise ValueError(f"invalid value {value!r} for setting {name!r}: {opt.doc}")
        previous = {name: self._values[name] for name in changes}
        self._values.update(changes)
        return _Restore(self, previous)

    def describe(self) -> dict[str, tuple[Any, str, str]]:
        """Each setting's current value, environment variable and meaning."""
        return {name: (self._values[name], opt.env, opt.doc) for name, opt in _OPTIONS.items()}

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"pystrom.defaults({body})"


defaults = Settings()
