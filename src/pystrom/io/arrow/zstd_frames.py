"""ZSTD frames checked for structure before anything decompresses them (``_core.zstd_frames_check``).

nvCOMP's batched ZSTD decoder faults (cudaErrorIllegalAddress, which poisons the CUDA context) on a
truncated or corrupt frame, so :mod:`.inflate_device` hands it only frames that pass; :mod:`.inflate_host`
runs the same check so that a file is refused alike on either device. The walk (csrc/zstd_frame.cpp,
RFC 8878) reads headers only, a few bytes per 128 KiB block: exactly one zstd frame (no skippable frame,
no dictionary, nothing after it), every block header inside the frame and within the block maximum,
the literals and sequences section headers of compressed blocks, and whether the blocks can produce
the claimed size (the frame's content size, where present, must equal it). Entropy-coded contents are
not decoded: the decoder still has to cope with a frame that passes and is corrupt inside.
"""

from __future__ import annotations

import numpy as np

from ... import _core

__all__ = ["check_zstd", "zstd_reason"]

# the codes of csrc/zstd_frame.hpp's ZstdCheck
_REASONS = {
    1: "the frame runs past the end of its buffer",
    2: "not a zstd frame (bad magic number)",
    3: "a skippable frame instead of a zstd frame",
    4: "the frame header's reserved bit is set",
    5: "the frame needs a dictionary",
    6: "the frame's window is above 2 GiB",
    7: "the frame's content size differs from the claimed length",
    8: "a block of the reserved type",
    9: "a block above the block maximum size",
    10: "bytes after the frame's end",
    11: "the frame's blocks cannot produce the claimed length",
    12: "a compressed block's literals section is malformed",
    13: "a compressed block's sequences section is malformed",
}


def check_zstd(src: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, claims: np.ndarray) -> np.ndarray:
    """Per frame ``src[offsets[i], + sizes[i])`` claimed to decompress to ``claims[i]`` bytes: 0 where it is
    one well-formed zstd frame that can, else a reason code (:func:`zstd_reason`). ``src`` host bytes."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    out = np.empty(len(offsets), dtype=np.int32)
    _core.zstd_frames_check(
        np.ascontiguousarray(src, dtype=np.uint8),
        offsets,
        np.ascontiguousarray(sizes, dtype=np.int64),
        np.ascontiguousarray(claims, dtype=np.int64),
        out,
    )
    return out


def zstd_reason(code: int) -> str:
    """What a code of :func:`check_zstd` means."""
    return "well-formed" if code == 0 else _REASONS.get(int(code), f"refused (code {int(code)})")
