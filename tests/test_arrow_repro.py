"""Every read and scan entry point over the files outside testing found pystrom failing on (issue 39,
tests/data/README.md): all columns, each column alone, a ``where`` on a column left out of ``columns=``
(the CPU sieve), scans of small groups; each call in a crash-catching worker (tests/arrow_fuzz.py), and
each outcome a pystrom error or the rows pyarrow reads (filtered and projected the same way), never a
foreign exception, a signal, a hang or other rows. On a GPU, each call's outcome equals the CPU's."""

from __future__ import annotations

import warnings

import arrow_fuzz as af
import pyarrow as pa
import pytest

import pystrom
from pystrom.io.arrow.file.metadata import open_arrow_file

from conftest import needs_gpu
from outside_data import unpack_repro


@pytest.fixture(scope="module")
def repro(tmp_path_factory):
    return unpack_repro(tmp_path_factory.mktemp("repro"))


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _calls(path) -> list[dict]:
    """The reads made of one file: its schema from pyarrow where pyarrow opens it, else from pystrom."""
    ref = af._reference(str(path))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with open_arrow_file(path) as f:
                schema = f.schema
    except pystrom.Error:
        schema = pa.ipc.open_file(str(path)).schema
    names = schema.names
    calls = [{"api": "read"}, *({"api": "read", "columns": [n]} for n in names)]
    numeric = [f.name for f in schema if _numeric(f.type)]
    for k, col in enumerate(numeric[:3]):
        value = 0
        if isinstance(ref, pa.Table):  # a literal inside the column's range: some rows kept, some not
            values = ref.column(col).drop_null()
            value = values[len(values) // 2].as_py() if len(values) else 0
        others = [n for n in names if n != col][: 1 + k]
        for op in (">", "!="):
            mask = {"mask": [col, op, value], "where": f'"{col}" {op} {value!r}'}
            calls.append({"api": "read", "columns": others, **mask})
            calls.append({"api": "scan", "columns": others, "batch_rows": [1, 7, 100][k], **mask})
    calls.append({"api": "scan", "batch_rows": 3})
    return calls


def _walk(repro, device: str) -> dict[str, list[tuple[dict, str]]]:
    cases, where = [], []
    for name, path in sorted(repro.items()):
        for call in _calls(path):
            cases.append({"seed_file": str(path), "rng": None, "index": len(cases), "call": call})
            where.append(name)
    outcomes = af.run_cases(cases, device, case_timeout=60)
    out: dict[str, list[tuple[dict, str]]] = {}
    for case, name in zip(cases, where):
        out.setdefault(name, []).append((case["call"], outcomes[case["index"]]))
    return out


def _check(walked) -> None:
    bad = [(name, call, o) for name, runs in walked.items() for call, o in runs if af.failed(o)]
    assert not bad, f"{len(bad)} calls crashed, hung, raised a foreign error or answered wrongly: {bad}"
    for name, runs in walked.items():
        kinds = {af._kind(o.split(" | ")[0]) for _, o in runs}
        if name in ("bigendian-datetime-valid.arrow_file", "sieve-segv-once.arrow") or name.startswith("gpu-zstd"):
            assert kinds == {"same"}, (name, runs)  # valid files: read as pyarrow reads them, every way
        elif name == "zstd-projection-valueerror.arrow":
            assert kinds == {"error:FileFormatError"}, runs  # a buffer length of 2**63 - 1: refused, every way
        elif name == "strings-not-utf8.arrow":
            for call, o in runs:
                reads_s = call.get("columns") is None or "s" in call["columns"]
                assert o.startswith("error:FileFormatError" if reads_s else "same"), (call, o)


def test_the_repro_files_on_the_cpu(repro):
    walked = _walk(repro, "cpu")
    assert sum(len(r) for r in walked.values()) > 60
    _check(walked)


@pytest.mark.gpu
@needs_gpu
def test_the_repro_files_on_a_gpu_as_on_the_cpu(repro):
    """Each call on the GPU and on the CPU, compared (gpu-zstd-invalid-value-*: cudaErrorInvalidValue before)."""
    _check(_walk(repro, "cpu,cuda"))


def test_the_projection_that_raised_a_raw_value_error(repro):
    path = repro["zstd-projection-valueerror.arrow"]
    for columns in (["s", "i64"], ["s"], None):
        with pytest.raises(
            pystrom.FileFormatError, match=r"record batch 1, column 's', buffer 4: \[328, \+9223372036854775807\)"
        ):
            pystrom.read_arrow(path, columns=columns, device="cpu")
