"""Type stub for the C++ core (csrc/module.cpp). Buffers are any C-contiguous buffer-protocol objects."""

from collections.abc import Buffer

def copy_bits(src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, count: int) -> None:
    """Copy ``count`` bits (LSB order) between arbitrary bit offsets; other bits of ``dst`` are kept."""

def unpack_bits(src: Buffer, src_offset: int, dst: Buffer, count: int) -> None:
    """Expand ``count`` bits from ``src_offset`` into one byte (0/1) each in ``dst``."""

def count_bits(src: Buffer, src_offset: int, count: int) -> int:
    """Set bits among ``count`` bits from ``src_offset``."""

def gather_varbinary(
    src_offsets: Buffer, src_data: Buffer, rows: Buffer, dst_offsets: Buffer, dst_data: Buffer
) -> None:
    """Copy the bytes of string rows ``rows`` (int64) into ``dst_data`` at ``dst_offsets`` (int32 prefix sums)."""
