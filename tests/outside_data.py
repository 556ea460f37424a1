"""Test files from outside the project (tests/data/README.md), unpacked once per test session."""

from __future__ import annotations

import lzma
import tarfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"

# gpu-zstd-invalid-value-2.arrow is -1 with these bytes of its footer changed (position, new byte)
GPU_ZSTD_2_PATCH = [(517456, 80), (517457, 120), (517458, 6), (517472, 40), (517473, 107), (517504, 128),
                    (517505, 60), (517506, 3), (517520, 24), (517521, 156), (517552, 112), (517553, 1),
                    (517554, 0), (517569, 155)]  # fmt: skip

REPRO_FILES = [
    "bigendian-datetime-valid.arrow_file",
    "gpu-zstd-invalid-value-1.arrow",
    "gpu-zstd-invalid-value-2.arrow",
    "sieve-segv-once.arrow",
    "strings-not-utf8.arrow",
    "zstd-projection-valueerror.arrow",
]


def unpack_repro(into: Path) -> dict[str, Path]:
    """Issue 39's reproducer files in ``into``, by name."""
    into.mkdir(parents=True, exist_ok=True)
    out = {}
    for packed in sorted((DATA / "repro").glob("*.xz")):
        name = packed.name[: -len(".xz")]
        out[name] = into / name
        out[name].write_bytes(lzma.decompress(packed.read_bytes()))
    patched = bytearray(out["gpu-zstd-invalid-value-1.arrow"].read_bytes())
    for at, byte in GPU_ZSTD_2_PATCH:
        patched[at] = byte
    out["gpu-zstd-invalid-value-2.arrow"] = into / "gpu-zstd-invalid-value-2.arrow"
    out["gpu-zstd-invalid-value-2.arrow"].write_bytes(bytes(patched))
    assert sorted(out) == sorted(REPRO_FILES)
    return out


def unpack_arrow_testing(into: Path) -> Path:
    """arrow-testing's 1.0.0-bigendian and 1.0.0-littleendian folders, under ``into``."""
    with tarfile.open(DATA / "arrow-testing" / "integration-1.0.0-endianness.tar.xz") as tar:
        try:
            tar.extractall(into, filter="data")
        except TypeError:  # Python before 3.10.12 / 3.11.4: no filters (our own archive)
            tar.extractall(into)
    return into
