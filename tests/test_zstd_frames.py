"""The ZSTD frame check (csrc/zstd_frame.cpp via io/arrow/codecs/host.py) that guards nvCOMP, and
nvCOMP behind it (GPU).

Frames pyarrow's zstd codec writes (every size, levels 1 and 19, raw, RLE and compressed blocks) must
pass; hand-built frames must be refused for their reason; damaged frames (every truncation, header bit
flips, byte changes, wrong claims) must be classified in a subprocess that survives, and never refused
where libzstd decodes them to the claimed size. On a GPU the same frames go through ``_inflate_device``
in a subprocess with a timeout: refused frames give -1, good frames libzstd's bytes, through nvCOMP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest
import zstd_cases as zc

import pystrom
from pystrom.io.arrow.codecs.host import check_zstd, zstd_reason

from conftest import needs_gpu

_WORKER = str(Path(zc.__file__))


def _check(frames: list[bytes], claims: list[int]) -> list[int]:
    sizes = np.array([len(f) for f in frames], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    src = np.frombuffer(b"".join(frames), dtype=np.uint8)
    return check_zstd(src, offsets, sizes, np.array(claims, dtype=np.int64)).tolist()


@pytest.mark.parametrize("level", [1, 3, 19, -5])
def test_pyarrow_frames_pass(level):
    payloads = zc.payloads()
    rng = np.random.default_rng(level + 10)
    for n in (1, 2, 100, 1023, 1024, 1025, 65_536, 131_071, 131_072, 131_073, 262_145):
        for k in (2, 17, 256):
            payloads.append(rng.integers(0, k, n, dtype=np.uint8).tobytes())
    frames = [zc.compress(p, level) for p in payloads]
    assert _check(frames, [len(p) for p in payloads]) == [0] * len(payloads)


def test_block_kinds_are_exercised():
    """The payloads make raw, RLE and compressed blocks, and frames of several blocks."""
    kinds = set()
    for p in zc.payloads():
        f = zc.compress(p, 1)
        fhd = f[4]
        at = 5 + (0 if fhd & 0x20 else 1) + [1 if fhd & 0x20 else 0, 2, 4, 8][fhd >> 6]
        blocks = 0
        while True:
            h = int.from_bytes(f[at : at + 3], "little")
            kinds.add((h >> 1) & 3)
            blocks += 1
            at += 3 + (1 if (h >> 1) & 3 == 1 else h >> 3)
            if h & 1:
                break
        kinds.add(("blocks", min(blocks, 2)))
    assert {0, 1, 2, ("blocks", 2)} <= kinds


@pytest.mark.parametrize("case", zc.built(), ids=lambda c: c[0])
def test_built_frames(case):
    name, frame, claim, expected = case
    got = _check([frame], [claim])[0]
    assert got == expected, f"{name}: {zstd_reason(got)}, expected {zstd_reason(expected)}"


def test_claims_must_match_the_content_size():
    payload = bytes(range(256)) * 40
    frame = zc.compress(payload)
    claims = [len(payload), 0, len(payload) - 1, len(payload) + 1, 2**40, 2**62]
    assert _check([frame] * len(claims), claims) == [0] + [zc.CONTENT_SIZE] * (len(claims) - 1)


def test_every_truncation_is_refused():
    for payload in (b"", b"a", bytes(5000), np.arange(3000, dtype=np.int32).tobytes()):
        for level in (1, 19):
            frame = zc.compress(payload, level)
            cuts = [frame[:k] for k in range(len(frame))]
            assert 0 not in _check(cuts, [len(payload)] * len(cuts)), (len(payload), level)


def test_spans_outside_src_raise():
    src = np.zeros(10, dtype=np.uint8)
    with pytest.raises(IndexError):
        check_zstd(src, np.array([5]), np.array([6]), np.array([0]))
    with pytest.raises(IndexError):
        check_zstd(src, np.array([-1]), np.array([2]), np.array([0]))
    with pytest.raises(ValueError):
        check_zstd(src, np.array([0, 1]), np.array([2]), np.array([0]))


def test_reasons_are_named():
    assert zstd_reason(0) == "well-formed"
    for code in range(1, 14):
        assert "code" not in zstd_reason(code)


def test_damaged_frames_in_a_subprocess(tmp_path):
    """Every damaged frame classified by a process that survives; no frame libzstd decodes to the claim
    is refused (except the rules Arrow files never meet: dictionaries, skippable and second frames)."""
    out = tmp_path / "codes.json"
    proc = subprocess.run([sys.executable, _WORKER, "walk", str(out)], timeout=120, capture_output=True, text=True)
    assert proc.returncode == 0, f"the walk's worker died (code {proc.returncode}): {proc.stderr[-2000:]}"
    codes = json.loads(out.read_text())
    cases = [(n, f, c) for n, f, c, _ in zc.built()] + zc.damaged()
    assert len(codes) == len(cases)
    assert [c for c, (_, _, _, e) in zip(codes, zc.built())] == [e for *_, e in zc.built()]
    damaged = codes[len(zc.built()) :]
    assert sum(1 for c in damaged if c) > len(damaged) // 2
    assert len({c for c in damaged if c}) >= 6  # many reasons met, not one catch-all
    codec = pa.Codec("zstd")
    for (name, frame, claim), code in zip(zc.damaged(), damaged):
        if name.endswith("trailing") or not code:
            continue
        try:
            ok = codec.decompress(frame, decompressed_size=claim).size == claim
        except (pa.ArrowException, OSError, ValueError):
            ok = False
        assert not ok, f"{name}: libzstd decodes it, the check refuses it ({zstd_reason(code)})"


# ---------------------------------------------------------------------------------------------------
# GPU: nvCOMP behind the check, in a subprocess (a fault poisons the CUDA context; a hang must not hang pytest)


def _gpu_run(tmp_path, which: str, env: dict | None = None) -> dict:
    out = tmp_path / f"gpu_{which}.json"
    try:
        proc = subprocess.run(
            [sys.executable, _WORKER, "gpu", str(out), which],
            timeout=300,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"_inflate_device hung on the {which} zstd frames")
    assert proc.returncode == 0, f"the GPU worker died (code {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(out.read_text())


@pytest.mark.gpu
@needs_gpu
def test_gpu_good_frames_through_nvcomp(tmp_path):
    from pystrom.io.arrow.codecs.device import nvcomp_available

    got = _gpu_run(tmp_path, "good", {"PYSTROM_NVCOMP": "1"})
    bad = [c["name"] for c in got["cases"] if not c["same"]]
    assert not bad, f"frames not decoded to libzstd's bytes: {bad}"
    assert got["padding_untouched"]
    if nvcomp_available():  # only the frames that claim 0 bytes go to the CPU codecs
        assert set(got["on_host"]) <= {0}, got["on_host"]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("nvcomp", ["0"])
def test_gpu_hostile_frames(tmp_path, nvcomp):
    """Without nvCOMP (kernels/zstd.cu): frames the check refuses are not decoded to their claim; good
    frames give libzstd's bytes; frames the check passes but libzstd refuses (corrupt entropy-coded
    contents) some size in [-1, claim] and no fault; a few libzstd decodes to garbage are refused. Only with
    nvCOMP off (the default): with it on, frames the structure check passes but that are corrupt
    inside made nvCOMP fault (cudaErrorIllegalAddress) or hang on an H100 (io/arrow/codecs/device.py)."""
    got = _gpu_run(tmp_path, "all", {"PYSTROM_NVCOMP": nvcomp})
    cases = got["cases"]
    built = {n: e for n, _, _, e in zc.built()}
    damaged = {n: (f, c) for n, f, c in zc.damaged()}
    wrong = []
    stricter = 0  # corrupt inside: libzstd decodes them to garbage, kernels/zstd.cu refuses them
    for c in cases:
        name, p, claim = c["name"], c["produced"], c["claim"]
        if name in built:
            code = built[name]
        elif name in damaged:
            frame, _ = damaged[name]
            code = _check([frame], [claim])[0]
        else:
            code = 0  # the good frames
        if code and p == claim:  # -1, or another size the reader refuses
            wrong.append((name, "refused by the check, produced", p))
        elif not code and c["libzstd"] and not c["same"] and p != -1:
            wrong.append((name, "libzstd decodes it, the GPU gave", p))
        elif not code and not c["libzstd"] and not -1 <= p <= claim:
            wrong.append((name, "corrupt inside, produced", p))
        stricter += not code and c["libzstd"] and p == -1
    assert not wrong, wrong[:20]
    assert got["padding_untouched"]
    assert stricter <= len(cases) // 50, stricter


def test_read_arrow_names_the_reason(tmp_path):
    """A refused frame in a file: FileFormatError naming the buffer and why the frame was refused."""
    import pyarrow.ipc as ipc

    import pystrom

    table = pa.table({"x": pa.array(np.arange(5000, dtype=np.int64))})
    path = tmp_path / "z.arrow"
    with ipc.new_file(path, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    data = bytearray(path.read_bytes())
    at = data.find(zc.MAGIC)
    data[at + 3] ^= 1  # the magic number
    path.write_bytes(bytes(data))
    with pytest.raises(pystrom.FileFormatError, match=r"column 'x'.*not a zstd frame \(bad magic number\)"):
        pystrom.read_arrow(path, device="cpu")


# ---------------------------------------------------------------------------------------------------
# CPU decoding: libzstd in C++ (csrc/zstd_decode.cpp) against pyarrow's codec, its fallback


def test_native_decoding_equals_pyarrows_codec(monkeypatch):
    """Good, hand-built and damaged frames through inflate_host both ways. Good and hand-built ones: the
    same bytes produced (or refused) and the same output. Damaged ones pass the structure check but hold
    corrupt entropy-coded data: libzstd versions differ in how much of that they notice (the system's
    1.5.4 decoded 15 of ~6,000 that pyarrow's bundled copy refuses; garbage out of both where neither
    does), so there only the contract: the claim or -1, nothing written past a claim."""
    from pystrom.io.arrow.codecs import host as ih
    from pystrom.io.arrow.codecs.decompress import Frames

    if not ih._libzstd_loads():
        pytest.skip("no libzstd loads here: pyarrow's codec is the only path")
    cases = [(f"good {i}", zc.compress(p, 3), len(p)) for i, p in enumerate(zc.payloads())]
    cases += [(n, f, c) for n, f, c, _ in zc.built()]
    exact = len(cases)
    cases += [c for c in zc.damaged() if c[2] <= 1 << 22]  # claims of 2**40 would need the memory
    sizes = np.array([len(f) for _, f, _ in cases], dtype=np.int64)
    claims = np.array([c for *_, c in cases], dtype=np.int64)
    src = np.frombuffer(b"".join(f for _, f, _ in cases), dtype=np.uint8)
    offsets = np.cumsum(sizes) - sizes
    room = -(-(claims + 64) // 64) * 64  # each output 64 bytes of padding
    places = np.cumsum(room) - room
    got = {}
    for native in (True, False):
        monkeypatch.setattr(ih, "native_zstd", lambda native=native: native)
        dst = np.full(int(room.sum()), 0xEE, dtype=np.uint8)
        got[native] = (ih.inflate_host(Frames("zstd", src, offsets, sizes, dst, places, claims)), dst)
    (mine, out), (theirs, ref) = got[True], got[False]
    assert mine[:exact].tolist() == theirs[:exact].tolist()
    assert sum(p == c for p, c in zip(mine.tolist(), claims.tolist())) > len(zc.payloads())
    assert ((mine == claims) | (mine == -1)).all()
    assert (mine == theirs).mean() > 0.99
    for k, ((name, _, claim), p, at) in enumerate(zip(cases, mine.tolist(), places.tolist())):
        if k < exact and p == claim:
            assert out[at : at + claim].tobytes() == ref[at : at + claim].tobytes(), name
        assert (out[at + claim : at + claim + 64] == 0xEE).all(), name


@pytest.mark.parametrize("decoder", ["auto", "pyarrow", "libzstd"])
def test_read_arrow_with_either_zstd_decoder(tmp_path, decoder, monkeypatch):
    """``defaults.zstd_decoder``: the same table either way (pyarrow's codec where no libzstd loads, and
    'auto', the default, is libzstd where it does); a frame that does not fill its claim refused either way."""
    from pystrom.io.arrow.codecs import host as ih

    table = pa.table({"x": np.arange(5000, dtype=np.int64), "y": np.random.default_rng(1).random(5000)})
    path = tmp_path / "z.arrow"
    feather.write_feather(table, path, compression="zstd", chunksize=700)
    calls = []
    real = pystrom._core.zstd_frames_decode
    monkeypatch.setattr(ih._core, "zstd_frames_decode", lambda *a: calls.append(1) or real(*a))
    with pystrom.defaults.set(zstd_decoder=decoder):
        assert pystrom.read_arrow(path, device="cpu").to_arrow().equals(table)
    native = ih._libzstd_version() >= (ih._AUTO_LIBZSTD if decoder == "auto" else 1)
    assert bool(calls) == (decoder != "pyarrow" and native)


def test_auto_takes_libzstd_from_the_version_pyarrow_bundles(monkeypatch):
    """'auto' (the default) decodes through the system's libzstd only from 1.5.7 on (older ones notice less
    corruption inside a frame); 'libzstd' through any that loads; 'pyarrow' never."""
    from pystrom.io.arrow.codecs import host as ih

    assert pystrom.defaults.zstd_decoder == "auto" or "PYSTROM_ZSTD_DECODER" in os.environ
    for version, auto in ((0, False), (10504, False), (10505, False), (10507, True), (10600, True)):
        monkeypatch.setattr(ih, "_libzstd_version", lambda version=version: version)
        with pystrom.defaults.set(zstd_decoder="auto"):
            assert ih.native_zstd() is auto, version
        with pystrom.defaults.set(zstd_decoder="libzstd"):
            assert ih.native_zstd() is (version > 0), version
        with pystrom.defaults.set(zstd_decoder="pyarrow"):
            assert ih.native_zstd() is False
