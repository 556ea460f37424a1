"""Mutation fuzzing of the Arrow reader: seed files, mutants, and a crash-catching harness.

Seeds are valid files of every type pystrom reads, written by pystrom and by pyarrow (dictionaries,
large strings, LZ4/ZSTD bodies, streams, a pre-0.15 legacy stream). A mutant is a seed with bit
flips, byte overwrites, or a 4/8-byte field set to an extreme value (0, -1, huge, negative); half of
the mutations land just after a continuation marker or in the footer, where the metadata is.

The cases run in a worker subprocess (``python arrow_fuzz.py worker SPEC``) that prints ``start i``
before case i and ``done i OUTCOME`` after it, so a signal or a hang is blamed on its own case; the
parent restarts the worker after the case that killed it. Outcomes:

- ``same``: pystrom read the file and its rows equal pyarrow's ``read_all()`` (which validated: the
  structure, offsets, dictionary indices and UTF-8, not value domains pyarrow's reader accepts too);
- ``read-invalid``: pystrom read a file pyarrow reads but that validation refuses;
- ``read-unreadable``: pystrom read a file pyarrow cannot read at all (allowed: e.g. a flipped bit in
  a column pystrom does not ask for);
- ``error:<Class>`` with ``ref-ok`` / ``ref-bad``: a pystrom error, where pyarrow's read validated or not;
- ``zstd-version``: rows that differ from pyarrow's, read the same when pystrom decodes the ZSTD frames
  with pyarrow's codec too (``zstd_decoder="pyarrow"``): a frame corrupt inside (no checksum) that the
  system's libzstd and pyarrow's bundled one both decode, each to its own bytes; not pystrom's reading;
- failures: ``DIFFERENT`` (rows differ from a validated pyarrow read, with either ZSTD decoder), ``FOREIGN:<Class>`` (an
  exception that is not pystrom's), ``SIGNAL:<n>``, ``HANG``.

Run a campaign by hand: ``python tests/arrow_fuzz.py campaign --cases 20000 --seed 1``; ``--compressed``
for LZ4/ZSTD files with mutants aimed at their frames (header and body bytes, frames cut short, length
prefixes, truncated files); ``--device cpu,cuda`` reads each mutant on both backends (the same call, one
after the other in the worker) and counts a mutant whose outcomes differ as a failure, printing the
mutants, those equal on both, clean errors, raw errors, signals and hangs.

A third of the mutants read every column, a third a few of the seed's columns (``columns=``: projections
skip buffers, and a skipped buffer must not hide a corrupt one's effect on those read), a third scan with a
``where`` that keeps every row (unfiltered where the seed has no ``i64``: the nested seeds).
"""

from __future__ import annotations

import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

FAILURES = ("DIFFERENT", "FOREIGN", "SIGNAL", "HANG")
_EXTREMES_32 = [0, 1, -1, 7, 2**31 - 1, -(2**31), 2**30, -(2**24), 65536]
_EXTREMES_64 = [0, 1, -1, 2**63 - 1, -(2**63), 2**40, -(2**40), 2**31]


# ---------------------------------------------------------------------------------------------------
# seeds


def _mixed(n: int, seed: int):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    mask = rng.random(n) < 0.2
    words = ["", "a", "bc", "déf", "ghij", "x" * 40]
    strings = [None if m else words[int(i)] for m, i in zip(mask, rng.integers(0, len(words), n))]
    return pa.table(
        {
            "b": pa.array(rng.random(n) < 0.5, mask=mask),
            "i8": pa.array(rng.integers(-100, 100, n, dtype=np.int8), mask=mask),
            "u16": pa.array(rng.integers(0, 60000, n, dtype=np.uint16)),
            "i64": pa.array(np.arange(n, dtype=np.int64), mask=mask),
            "f32": pa.array(rng.random(n).astype(np.float32)),
            "f64": pa.array(rng.random(n), mask=mask),
            "d32": pa.array(rng.integers(0, 20000, n, dtype=np.int32), type=pa.int32()).cast(pa.date32()),
            "ts": pa.array(rng.integers(0, 2**40, n), type=pa.int64()).cast(pa.timestamp("us", "UTC")),
            "t64": pa.array(rng.integers(0, 86_400_000_000, n), type=pa.int64()).cast(pa.time64("us")),
            "dur": pa.array(rng.integers(-1000, 1000, n), type=pa.int64()).cast(pa.duration("ms")),
            "dec": pa.array(
                [None if m else Decimal(i * 7 - 300).scaleb(-2) for m, i in zip(mask, range(n))], pa.decimal128(12, 2)
            ),
            "fsb": pa.array([bytes([i % 256]) * 4 for i in range(n)], type=pa.binary(4)),
            "s": pa.array(strings, type=pa.string()),
            "bin": pa.array([None if s is None else s.encode() for s in strings], type=pa.binary()),
        }
    )


def write_seeds(directory: Path) -> list[Path]:
    """Small valid files of every flavour pystrom reads; returns their paths."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    import pystrom

    directory.mkdir(parents=True, exist_ok=True)
    table = _mixed(97, 1)
    out = []

    def path(name: str) -> Path:
        p = directory / name
        out.append(p)
        return p

    pystrom.write_arrow(table, path("pystrom.arrow"), batch_rows=40)
    pystrom.write_arrow(table, path("pystrom_footer.arrow"), batch_rows=30, footer_stats=True)
    with ipc.new_file(path("pyarrow.arrow"), table.schema) as w:
        w.write_table(table, max_chunksize=33)
    words = table.column("s")
    extra = pa.table(
        {
            "dict": words.dictionary_encode(),
            "ls": words.cast(pa.large_string()),
            "lb": table.column("bin").cast(pa.large_binary()),
            "i64": table.column("i64"),
        }
    )
    with ipc.new_file(path("dict_large.arrow"), extra.schema) as w:
        w.write_table(extra, max_chunksize=50)
    with ipc.new_stream(path("dict_large.arrows"), extra.schema) as w:
        w.write_table(extra, max_chunksize=50)
    for codec in ("lz4", "zstd"):
        with ipc.new_file(path(f"{codec}.arrow"), table.schema, options=ipc.IpcWriteOptions(compression=codec)) as w:
            w.write_table(table, max_chunksize=50)
    # structs, lists of strings and of structs, nested fixed_size_lists (the host path, then the table's children)
    n = table.num_rows
    words_py = table.column("s").to_pylist()
    nested = pa.table(
        {
            "st": pa.StructArray.from_arrays(
                [table.column("i64").combine_chunks(), words.combine_chunks()], ["k", "w"]
            ),
            "tags": pa.array([None if i % 7 == 0 else [w, None, "x" * (i % 4)] for i, w in enumerate(words_py)]),
            "pairs": pa.array([[{"p": i, "q": [w]}] if i % 5 else [] for i, w in enumerate(words_py)]),
            "grid": pa.array(
                [[[i, i + 1], [None, i]] if i % 3 else None for i in range(n)], pa.list_(pa.list_(pa.int32(), 2), 2)
            ),  # fmt: skip
        }
    )
    pystrom.write_arrow(nested, path("nested_pystrom.arrow"), batch_rows=40)
    with ipc.new_file(path("nested_pyarrow.arrow"), nested.schema) as w:
        w.write_table(nested, max_chunksize=33)
    small = table.select(["i64", "s", "f64"])
    with ipc.new_stream(path("legacy.arrows"), small.schema, options=ipc.IpcWriteOptions(use_legacy_format=True)) as w:
        w.write_table(small, max_chunksize=50)
    return out


# ---------------------------------------------------------------------------------------------------
# mutants


def _metadata_positions(data: bytes) -> list[int]:
    """Byte positions likely to be metadata: after each continuation marker, and the footer."""
    spots = []
    at = data.find(b"\xff\xff\xff\xff")
    while at >= 0 and len(spots) < 64:
        spots.extend(range(at + 4, min(at + 260, len(data))))
        at = data.find(b"\xff\xff\xff\xff", at + 4)
    if data[:6] == b"ARROW1" and len(data) > 10:
        footer = int.from_bytes(data[-10:-6], "little", signed=True)
        if 0 < footer < len(data):
            spots.extend(range(len(data) - 10 - footer, len(data) - 6))
    if not spots:
        spots = list(range(min(len(data), 256)))
    return spots


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One mutant of ``data`` and a description of what was changed."""
    buf = bytearray(data)
    spots = _metadata_positions(data)
    steps = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        pos = rng.choice(spots) if rng.random() < 0.5 else rng.randrange(len(buf))
        kind = rng.choice(("flip", "flip", "byte", "int32", "int64"))
        if kind == "flip":
            buf[pos] ^= 1 << rng.randrange(8)
        elif kind == "byte":
            run = rng.randint(1, 8)
            for i in range(pos, min(pos + run, len(buf))):
                buf[i] = rng.randrange(256)
        else:
            width = 4 if kind == "int32" else 8
            pos -= pos % width
            if pos + width > len(buf):
                continue
            value = rng.choice(_EXTREMES_32 if width == 4 else _EXTREMES_64)
            buf[pos : pos + width] = value.to_bytes(width, "little", signed=True)
        steps.append(f"{kind}@{pos}")
    return bytes(buf), ",".join(steps)


def write_compressed_seeds(directory: Path) -> list[Path]:
    """Files pyarrow writes with LZ4_FRAME and ZSTD bodies: frames of several blocks (LZ4's 64 KiB,
    ZSTD's 128 KiB), incompressible bytes (stored / raw blocks), constant columns (RLE), ZSTD level 19."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    n = 24_000
    table = pa.table(
        {
            "i64": pa.array(rng.integers(0, 1000, n)),
            "f64": pa.array(rng.random(n), mask=rng.random(n) < 0.1),
            "k": pa.array(np.full(n, 7, dtype=np.int32)),
            "raw": pa.array([rng.bytes(int(k)) for k in rng.integers(0, 12, n)], type=pa.binary()),
            "s": pa.array([None if i % 11 == 0 else f"w{i % 97}" for i in range(n)]),
        }
    )
    out = []
    for codec, level in (("lz4", None), ("zstd", None), ("zstd", 19)):
        path = directory / f"{codec}{level or ''}.arrow"
        compression = pa.Codec(codec) if level is None else pa.Codec(codec, compression_level=level)
        with ipc.new_file(path, table.schema, options=ipc.IpcWriteOptions(compression=compression)) as w:
            w.write_table(table, max_chunksize=10_000)
        out.append(path)
    return out


def _frame_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each LZ4 / ZSTD frame in a file: from its magic to the next frame, metadata
    marker or the end (so the end may include padding)."""
    starts = []
    for magic in (b"\x28\xb5\x2f\xfd", b"\x04\x22\x4d\x18"):
        at = data.find(magic)
        while at >= 0:
            starts.append(at)
            at = data.find(magic, at + 4)
    starts.sort()
    spans = []
    for i, s in enumerate(starts):
        end = starts[i + 1] - 8 if i + 1 < len(starts) else len(data)  # the next buffer's length prefix
        marker = data.find(b"\xff\xff\xff\xff", s + 4, end)
        spans.append((s, marker if marker > s else max(end, s + 1)))
    return spans


def mutate_compressed(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One mutant of a compressed file: a frame's header or body bytes changed, a frame cut short (its
    tail zeroed, the span kept), a length prefix changed, or the file truncated."""
    spans = _frame_spans(data)
    if not spans:
        return mutate(data, rng)
    buf = bytearray(data)
    s, e = rng.choice(spans)
    kind = rng.choice(("header", "body", "body", "cut", "prefix", "truncate"))
    if kind == "header":
        pos = rng.randrange(s, min(s + 24, e))
        buf[pos] ^= 1 << rng.randrange(8)
    elif kind == "body":
        pos = rng.randrange(s, e)
        for i in range(pos, min(pos + rng.randint(1, 4), e)):
            buf[i] = rng.randrange(256)
    elif kind == "cut":
        pos = rng.randrange(s + 1, max(e, s + 2))
        buf[pos:e] = bytes(max(0, e - pos))
    elif kind == "prefix":
        pos = s - 8
        value = int.from_bytes(data[pos:s], "little", signed=True)
        value = rng.choice((0, -1, value - 1, value + 1, value * 2, 2**40))
        buf[pos:s] = value.to_bytes(8, "little", signed=True)
    else:
        pos = rng.randrange(s, e)
        return bytes(buf[:pos]), f"truncate@{pos}"
    return bytes(buf), f"{kind}@{pos}"


def cases(seeds: list[Path], count: int, seed: int, mutator: str = "any") -> list[dict]:
    rng = random.Random(seed)
    names = {src: _column_names(src) for src in seeds}  # of the seed: a projection asks for some of them
    out = []
    for i in range(count):
        src = seeds[i % len(seeds)]
        case = {"seed_file": str(src), "rng": rng.randrange(2**63), "index": i, "mutator": mutator}
        out.append({**case, "columns": names[src]})
    return out


def _column_names(path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(str(path)) as src:
        try:
            return ipc.open_file(src).schema.names
        except Exception:
            src.seek(0)
            return ipc.open_stream(src).schema.names


def mutant(data: bytes, case: dict) -> tuple[bytes, str]:
    """The case's mutant of ``data`` and what was changed."""
    how = mutate_compressed if case.get("mutator") == "compressed" else mutate
    return how(data, random.Random(case["rng"]))


# ---------------------------------------------------------------------------------------------------
# the worker (its own process)


def _normalise(table):
    import pyarrow as pa

    columns = []
    for col in table.columns:
        t = col.type
        if pa.types.is_dictionary(t):
            col = pa.chunked_array([c.dictionary_decode() for c in col.chunks], t.value_type)
            t = col.type
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            col = col.cast(pa.string())
        elif pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            col = col.cast(pa.binary())
        columns.append(col.combine_chunks())
    return columns


def _same(a, b) -> bool:
    """Equal arrays, NaN equal to NaN (a mutated float may well be a NaN, which ``equals`` refuses)."""
    import numpy as np
    import pyarrow as pa

    if a.equals(b):
        return True
    if a.type != b.type or not pa.types.is_floating(a.type) or len(a) != len(b):
        return False
    if not a.is_null().equals(b.is_null()):
        return False
    x = a.drop_null().to_numpy(zero_copy_only=False)
    y = b.drop_null().to_numpy(zero_copy_only=False)
    return bool(np.array_equal(x, y, equal_nan=True))


def _reference(path: str, columns=None):
    """pyarrow's table (columns normalised as pystrom holds them) if it reads and validates; else
    "ref-bad" / "unreadable". ``columns``: only those read (``IpcReadOptions.included_fields``: pyarrow
    then does not decompress the others, as pystrom does not; a corrupt frame elsewhere is no reason
    for pyarrow to refuse the projection)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        with pa.memory_map(path) as src:
            try:
                reader = ipc.open_file(src)
                options = None
                if columns is not None:
                    names = reader.schema.names
                    options = ipc.IpcReadOptions(included_fields=sorted({names.index(c) for c in columns}))
                    reader = ipc.open_file(src, options=options)
                table = reader.read_all()
            except Exception:
                src.seek(0)
                table = ipc.open_stream(src).read_all()
    except Exception:
        return "unreadable"
    try:
        names = table.column_names  # a mutated name may not decode
    except Exception:
        return "unreadable"
    good, bad = {}, set()
    for name, column in zip(names, table.columns):
        try:  # validated first: pyarrow's compute functions (dictionary_decode) trust their input
            for chunk in column.chunks:
                _validate_blind(chunk)
            (normalised,) = _normalise(pa.table([column], names=[name]))
            _validate_blind(normalised)
            good[name] = normalised
        except Exception:
            bad.add(name)
    if len(set(names)) != len(names):
        return "ref-bad"
    return pa.table(list(good.values()), names=list(good)), bad


def _valid(ref, names) -> bool:
    """Whether pyarrow's columns ``names`` of a reference pass the validation pystrom makes (a read of other
    columns needs no more)."""
    good, bad = ref
    return all(n in good.column_names and n not in bad for n in names)


def _validate_blind(array) -> None:
    """pyarrow's full validation of the structure (offsets, dictionary indices, UTF-8), not of the value
    domains pyarrow's reader accepts too (a date64 that is not a whole day...): the checks pystrom makes."""
    import pyarrow as pa

    from pystrom.io.arrow.read.host import value_blind

    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    blind = value_blind(array.type)
    (array if blind == array.type else array.view(blind)).validate(full=True)


def _call_of(case: dict) -> dict:
    """The read a case makes: its own ``call``, or one chosen by its index (mutants: every third reads
    all columns, every third a few of them, every third scans with a ``where`` that keeps every row, or
    without one where the seed has no ``i64``)."""
    if "call" in case:
        return case["call"]
    k = case["index"] % 3
    if k == 1 and case["rng"] is not None and case.get("columns"):
        names = case["columns"]
        r = random.Random(case["rng"] ^ 0x5EED)
        return {"api": "read", "columns": r.sample(names, r.randint(1, min(3, len(names))))}
    if k == 2 and case["rng"] is not None:
        # where expressions take no nested column, and the nested seeds have no i64: those scan unfiltered
        # (a where over a column they lack stopped every such scan at the expression, before any batch)
        if "i64" not in case.get("columns", ["i64"]):
            return {"api": "scan"}
        return {"api": "scan", "where": "i64 >= 0 or i64 < 0 or i64 is null"}
    return {"api": "read"}


def _apply(path: str, call: dict, device: str):
    import pystrom

    if call["api"] == "read":
        return pystrom.read_arrow(path, columns=call.get("columns"), where=call.get("where"), device=device)
    return pystrom.scan_arrow(path, columns=call.get("columns"), where=call.get("where"),
                              batch_rows=call.get("batch_rows"), device=device).collect()  # fmt: skip


def _expected(ref, call: dict):
    """pyarrow's answer to ``call``: the rows its ``mask`` (column, op, literal) keeps, its columns."""
    import pyarrow.compute as pc

    table = ref[0]
    if call.get("mask"):
        name, op, value = call["mask"]
        column = table.column(name)
        keep = {">": pc.greater, "<=": pc.less_equal, "!=": pc.not_equal}[op](column, value)
        table = table.filter(pc.fill_null(keep, False))
    return table.select(call["columns"]) if call.get("columns") else table


def _read_columns(call: dict) -> list[str] | None:
    """The columns a call reads (returned or filtered on); None: all of them."""
    if not call.get("columns"):
        return None
    return [*call["columns"], *([call["mask"][0]] if call.get("mask") else [])]


def _usable(ref, call: dict) -> bool:
    """pyarrow read the file and the columns ``call`` reads (those it returns, and its filter's) validate."""
    if isinstance(ref, str):
        return False
    names = list(call.get("columns") or [*ref[0].column_names, *ref[1]])
    if call.get("mask"):
        names.append(call["mask"][0])
    elif call.get("where"):  # a where over a column the call does not return (mutants: i64)
        names += [n for n in [*ref[0].column_names, *ref[1]] if n in call["where"] and n not in names]
    return _valid(ref, names)


def run_case(case: dict, workdir: str, device: str) -> str:
    """The case's outcome (module docstring); ``device`` "cpu,cuda": both, as "<cpu outcome> | <cuda outcome>"."""
    if case.get("selftest") == "crash":  # the harness's own test: a case that kills its worker
        os.kill(os.getpid(), 11)
    if case.get("selftest") == "hang":
        time.sleep(3600)

    data = Path(case["seed_file"]).read_bytes()
    if case["rng"] is not None:
        data, _ = mutant(data, case)
    path = os.path.join(workdir, f"mutant{case['index']}{Path(case['seed_file']).suffix}")
    with open(path, "wb") as f:
        f.write(data)
    try:
        call = _call_of(case)
        ref = _reference(path, _read_columns(call))
        return " | ".join(_outcome(path, ref, call, d) for d in device.split(","))
    finally:
        os.unlink(path)


def _outcome(path: str, ref, call: dict, device: str) -> str:
    import pystrom

    try:
        host = _apply(path, call, device).to_arrow()
    except pystrom.Error as exc:
        # a ZSTD frame refused as corrupt (kernels/zstd.cu refuses some that libzstd decodes to garbage)
        frame = " zstd-frame" if "its frame is corrupt" in str(exc) and "(zstd; corrupt file)" in str(exc) else ""
        return f"error:{type(exc).__name__} {'ref-ok' if _usable(ref, call) else 'ref-bad'}{frame}"
    except Exception as exc:  # anything else is a finding
        return f"FOREIGN:{type(exc).__name__}: {str(exc)[:200]}"
    if isinstance(ref, str):
        return "read-invalid" if ref == "ref-bad" else "read-unreadable"
    if not _usable(ref, call):
        return "read-invalid"
    want = _expected(ref, call)
    if _same_table(host, want):
        return "same"
    from pystrom.io.arrow.codecs.host import native_zstd

    if native_zstd():  # the module docstring's zstd-version
        with pystrom.defaults.set(zstd_decoder="pyarrow"):
            try:
                again = _apply(path, call, device).to_arrow()
            except pystrom.Error:
                return "DIFFERENT"
        if _same_table(again, want):
            return "zstd-version"
    return "DIFFERENT"


def _same_table(got, want) -> bool:
    return got.column_names == want.column_names and all(
        _same(got.column(n).combine_chunks(), want.column(n).combine_chunks()) for n in want.column_names
    )


def worker(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import warnings

    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as workdir:
        for case in spec["cases"]:
            print(f"start {case['index']}", flush=True)
            outcome = run_case(case, workdir, spec["device"])
            print(f"done {case['index']} {outcome}", flush=True)


# ---------------------------------------------------------------------------------------------------
# the parent: run every case, restart the worker after a crash or a hang


def run_cases(all_cases: list[dict], device: str = "cpu", case_timeout: float = 20.0) -> dict[int, str]:
    """Outcome of every case (by index), each worker crash or hang blamed on the case it was running."""
    outcomes: dict[int, str] = {}
    todo = list(all_cases)
    with tempfile.TemporaryDirectory() as tmp:
        while todo:
            spec = Path(tmp) / "spec.json"
            spec.write_text(json.dumps({"cases": todo, "device": device}))
            proc = subprocess.Popen(
                [sys.executable, *(["-S"] if sys.flags.no_site else []), __file__, "worker", str(spec)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONFAULTHANDLER": ""},
            )
            current = None
            deadline = time.monotonic() + case_timeout + 30  # the first case also pays the imports
            fd = proc.stdout.fileno()
            pending = ""
            while True:
                ready, _, _ = select.select([fd], [], [], 0.05)
                chunk = os.read(fd, 65536).decode() if ready else ""
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        word, _, rest = line.partition(" ")
                        if word == "start":
                            current = int(rest)
                            deadline = time.monotonic() + case_timeout
                        elif word == "done":
                            idx, _, outcome = rest.partition(" ")
                            outcomes[int(idx)] = outcome
                            current = None
                if ready and not chunk:  # end of output: the worker is done or dead
                    proc.wait()
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    if current is not None:
                        outcomes[current] = "HANG"
                    break
            proc.stdout.close()
            if current is not None and current not in outcomes:  # it died inside that case
                code = proc.returncode
                outcomes[current] = f"SIGNAL:{-code}" if code < 0 else f"FOREIGN:worker exit {code}"
            todo = [c for c in todo if c["index"] not in outcomes]
    return outcomes


def summary(outcomes: dict[int, str]) -> Counter:
    return Counter(o.split(":")[0] if o.startswith(("FOREIGN", "SIGNAL")) else o for o in outcomes.values())


def _kind(part: str) -> str:
    """An outcome without its details: "same", "error:FileFormatError", "FOREIGN", "SIGNAL:11"..."""
    word = part.split(" ")[0]
    return word.split(":")[0] if word.startswith("FOREIGN") else word


def _kinds_differ(parts: list[str]) -> bool:
    return len({_kind(p) for p in parts}) > 1


def stricter_zstd(parts: list[str]) -> bool:
    """Devices that disagree only because a GPU refused a ZSTD frame as corrupt where libzstd on the CPU
    decoded it (to garbage: Arrow's frames carry no checksum; kernels/zstd.cu checks more than libzstd)."""
    return (
        len(parts) > 1
        and not parts[0].startswith("error:")
        and all(p.endswith(" zstd-frame") for p in parts[1:] if _kind(p) != _kind(parts[0]))
    )


def failed(outcome: str) -> bool:
    """A finding: a failure on any device, or devices that disagree ("<cpu> | <cuda>") other than by
    :func:`stricter_zstd`."""
    parts = outcome.split(" | ")
    if any(p.startswith(FAILURES) for p in parts):
        return True
    return _kinds_differ(parts) and not stricter_zstd(parts)


def device_summary(outcomes: dict[int, str]) -> dict[str, int]:
    """The counts of a campaign over devices (``--device cpu,cuda``): mutants, those whose outcome is the
    same on every device (the same table, or the same pystrom error class), those a pystrom error
    refused on some device (clean errors), raw (foreign) errors, signals, hangs and wrong answers."""
    parts = [o.split(" | ") for o in outcomes.values()]
    return {
        "mutants": len(parts),
        "equal": sum(len(p) > 1 and len({_kind(x) for x in p}) == 1 for p in parts),
        "clean errors": sum(any(x.startswith("error:") for x in p) for p in parts),
        "raw errors": sum(any(x.startswith("FOREIGN") for x in p) for p in parts),
        "signals": sum(any(x.startswith("SIGNAL") for x in p) for p in parts),
        "hangs": sum(any(x == "HANG" for x in p) for p in parts),
        "different": sum(any(x == "DIFFERENT" for x in p) for p in parts),
        "stricter zstd": sum(_kinds_differ(p) and stricter_zstd(p) for p in parts),
    }


def main(argv: list[str]) -> None:
    if argv[0] == "worker":
        worker(argv[1])
        return
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["campaign"])
    p.add_argument("--cases", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, cuda, or cpu,cuda: each mutant on both, compared")
    p.add_argument("--compressed", action="store_true", help="LZ4/ZSTD files, mutants aimed at their frames")
    p.add_argument("--corpus", help="read every file under this folder as it is (e.g. arrow-testing's data/)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        if args.corpus:
            files = sorted(f for f in Path(args.corpus).rglob("*") if f.is_file() and f.suffix not in (".gz", ".md"))
            all_cases = [{"seed_file": str(f), "rng": None, "index": i} for i, f in enumerate(files)]
        elif args.compressed:
            seeds = write_compressed_seeds(Path(tmp) / "seeds")
            all_cases = cases(seeds, args.cases, args.seed, mutator="compressed")
        else:
            all_cases = cases(write_seeds(Path(tmp) / "seeds"), args.cases, args.seed)
        outcomes = run_cases(all_cases, args.device)
        print(f"{len(outcomes)} mutants in {time.monotonic() - start:.0f} s")
        per_seed: dict[str, Counter] = {}
        for case in all_cases:
            group = Path(case["seed_file"]).parent.name if args.corpus else Path(case["seed_file"]).name
            per_seed.setdefault(group, Counter())[outcomes[case["index"]].split(" ")[0]] += 1
        for name, counts in per_seed.items():
            print(f"  {name}: {dict(counts)}")
        print("total:", dict(summary(outcomes)))
        if "," in args.device:
            print("devices", args.device + ":", device_summary(outcomes))
        for case in all_cases:
            o = outcomes[case["index"]]
            if failed(o) or o == "error:FileFormatError ref-ok":
                if args.corpus:
                    print("FAILURE" if failed(o) else "refused", case["seed_file"], o)
                    continue
                data = Path(case["seed_file"]).read_bytes()
                print(
                    "FAILURE" if failed(o) else "refused",
                    case["index"],
                    Path(case["seed_file"]).name,
                    mutant(data, case)[1],
                    o,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
