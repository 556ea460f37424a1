"""LZ4 frames and blocks read by the book (the LZ4 frame and block format documents), for the tests of the
GPU compressor (kernels/lz4_encode.cu): what liblz4's decoder does not insist on is checked here.

:func:`check_frame` walks a frame as pystrom's GPU compressor writes it (independent blocks, no
checksums, no content size) and returns its bytes decoded by this reading, failing on any sequence that
breaks the block format's rules: a match offset of 0 or before the block's start, a match starting less
than 12 bytes before the block's end, a match covering any of its last 5 bytes, a block that does not
end on a sequence of literals only, a stored block not smaller than promised.
"""

from __future__ import annotations

FRAME_MAGIC = b"\x04\x22\x4d\x18"


def _length(block: bytes, at: int, nibble: int) -> tuple[int, int]:
    n = nibble
    if nibble == 15:
        while True:
            b = block[at]
            at += 1
            n += b
            if b != 255:
                break
    return n, at


def check_block(block: bytes) -> bytes:
    """One compressed LZ4 block -> its bytes, asserting the end rules."""
    out = bytearray()
    at = 0
    matches = []  # (start, end) in the output
    while True:
        token = block[at]
        at += 1
        lit, at = _length(block, at, token >> 4)
        assert at + lit <= len(block), "literals past the block"
        out += block[at : at + lit]
        at += lit
        if at == len(block):
            assert token & 15 == 0, "the last sequence has a match length"
            break
        offset = block[at] | (block[at + 1] << 8)
        at += 2
        mlen, at = _length(block, at, token & 15)
        mlen += 4
        assert 1 <= offset <= len(out), f"match offset {offset} at output {len(out)}"
        start = len(out)
        for _ in range(mlen):
            out.append(out[-offset])
        matches.append((start, len(out)))
    n = len(out)
    for start, end in matches:
        assert start + 12 <= n, f"a match starts at {start}, less than 12 bytes before the end ({n})"
        assert end + 5 <= n, f"a match ends at {end}, inside the last 5 bytes ({n})"
    return bytes(out)


def check_frame(frame: bytes, block_max: int = 1 << 16) -> bytes:
    """A whole frame as the GPU compressor writes it -> its bytes."""
    assert frame[:4] == FRAME_MAGIC
    assert frame[4] == 0x60 and frame[5] == 0x40, "independent blocks of 64 KiB, nothing optional"
    at = 7
    out = bytearray()
    while True:
        size = int.from_bytes(frame[at : at + 4], "little")
        at += 4
        if size == 0:
            break
        stored, size = size >> 31, size & 0x7FFFFFFF
        body = frame[at : at + size]
        assert len(body) == size, "a block past the frame's end"
        at += size
        if stored:
            assert size <= block_max
            out += body
        else:
            got = check_block(body)
            assert len(got) <= block_max and len(body) < len(got), "a compressed block no smaller than its bytes"
            out += got
    assert at == len(frame), "bytes after the end mark"
    return bytes(out)
