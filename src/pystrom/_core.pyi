"""Type stub for the C++ core (csrc/module.cpp). Buffers are any C-contiguous buffer-protocol objects."""

from collections.abc import Buffer

def copy_bits(src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, count: int) -> None:
    """Copy ``count`` bits (LSB order) between arbitrary bit offsets; other bits of ``dst`` are kept."""

def unpack_bits(src: Buffer, src_offset: int, dst: Buffer, count: int) -> None:
    """Expand ``count`` bits from ``src_offset`` into one byte (0/1) each in ``dst``."""

def count_bits(src: Buffer, src_offset: int, count: int) -> int:
    """Set bits among ``count`` bits from ``src_offset``."""

def lz4_frame_size(src: Buffer) -> int:
    """Bytes the one LZ4 frame in ``src`` decompresses to (its blocks and sequences walked), -1 if malformed."""

def lz4_frame_decode(src: Buffer, dst: Buffer) -> int:
    """Decode the single LZ4 frame in ``src`` into ``dst`` (writable, contiguous): the bytes produced,
    -1 where the frame is malformed, -2 where it would produce more than ``dst`` holds."""

def lz4_frames_decode(
    src: Buffer, offsets: Buffer, sizes: Buffer, dst: Buffer, caps: Buffer, which: Buffer, produced: Buffer
) -> None:
    """Frames ``which`` (int64 indices) of ``src[offsets[i], + sizes[i])`` decoded into ``caps[i]`` bytes at the
    address ``dst[i]`` (memory the caller owns), as :func:`lz4_frame_decode` does, without the GIL;
    ``produced[i]``: the bytes frame i produces, -1 where it is malformed (csrc/lz4_size.hpp)."""

def zstd_frames_check(src: Buffer, offsets: Buffer, sizes: Buffer, claims: Buffer, out: Buffer) -> None:
    """Per frame ``src[offsets[i], + sizes[i])`` (int64) claimed to decompress to ``claims[i]`` bytes: 0 in
    ``out[i]`` (int32) where it is one well-formed zstd frame that can, else a reason code (io/arrow/codecs/host.py)."""

def gather_varbinary(
    src_offsets: Buffer, src_data: Buffer, rows: Buffer, dst_offsets: Buffer, dst_data: Buffer
) -> None:
    """Copy the bytes of string rows ``rows`` (int64) into ``dst_data`` at ``dst_offsets`` (int32 prefix sums)."""

def copy_offsets_checked(src: Buffer, dst: Buffer, limit: int) -> int:
    """Copy int32 offsets ``src`` (n + 1 of them) into ``dst`` and check the copy, without the GIL: the first
    position that breaks the offsets' rules (``o[0] >= 0``, never decreasing, ``o[n] <= limit``), or -1."""

def arrow_flat_layouts(
    rows: Buffer,
    bodies: Buffer,
    nodes: Buffer,
    buffers: Buffer,
    file_size: int,
    layouts: Buffer,
    widths: Buffer,
    first_buffer: Buffer,
    selected: Buffer,
    out: Buffer,
) -> int:
    """Check every batch of a flat uncompressed file and lay out the ``selected`` fields into ``out``
    ((selected, 8, batches) int64); 0 when every check holds, else the failed check (csrc/arrow_meta.hpp)."""

def plan_runs(offsets: Buffer, sizes: Buffer, max_gap: int, max_bytes: int, run_first: Buffer) -> int:
    """Pieces sorted by file offset (int64) cut into runs of consecutive pieces (gaps of at most ``max_gap``
    bytes, spans of at most ``max_bytes``): their first pieces into ``run_first`` (n + 1 entries, the last
    one n); the number of runs (csrc/pread_runs.hpp)."""

def pread_runs(
    fd: int, offsets: Buffer, sizes: Buffer, ptrs: Buffer, run_first: Buffer, max_call: int, got: Buffer
) -> None:
    """Read each run of :func:`plan_runs` with preadv, piece i to the address ``ptrs[i]``, without the GIL;
    ``got[r]``: the bytes run r read (gaps included), or -errno. ``max_call`` > 0 caps each call (tests)."""

# -- Arrow arrays handed to consumers (csrc/arrow_keep.cpp): owners let go of without the GIL ------------

def arrow_keep(owner: object) -> int:
    """A ``private_data`` token holding ``owner``, for an ArrowArray released by :func:`arrow_release_address`."""

def arrow_release_address() -> int:
    """The release callback (children first, then the owner, never taking the GIL)."""

def arrow_release(address: int) -> None:
    """Release the ArrowArray at ``address`` from Python (the owner goes at once)."""

def arrow_array_capsule(owner: object, length: int, null_count: int, buffers: list[int]) -> object:
    """An ``arrow_array`` PyCapsule (no children, offset 0) over ``buffers`` kept alive by ``owner``."""

def arrow_sweep() -> int:
    """Let go of owners that threads without the GIL released; returns how many."""

# -- PostgreSQL (csrc/pg_pump.cpp, csrc/pg_decode.cpp; wrapped by pystrom/io/_pq.py) ----------------

class PgServerError(RuntimeError):
    """libpq or the server reported a failure (the message is theirs)."""

class PgProtocolError(RuntimeError):
    """Bytes that do not follow the binary COPY format."""

def pg_load_libpq(path: str) -> str:
    """Resolve libpq's functions from the copy already loaded (``path``, or found among loaded objects if empty)."""

class CopyPump:
    """One ``COPY ... TO STDOUT (FORMAT BINARY)`` on a ``PGconn*`` that psycopg opened."""

    def __init__(self, pgconn: int, ncols: int) -> None: ...
    def start(self, sql: str) -> None:
        """Send the COPY and wait for COPY OUT (GIL released)."""
    def fill(self, buf: Buffer, offsets: Buffer, nulls: Buffer, bytes: Buffer) -> tuple[int, int, bool, int]:
        """Append whole rows to ``buf`` and their int64 starts to ``offsets``, adding per-column NULL and byte
        counts; returns ``(nbytes, nrows, done, need)`` (GIL released)."""
    def abort(self) -> None:
        """Cancel on the server (PQcancel) and drain, leaving the connection idle or clearly failed."""
    @property
    def active(self) -> bool: ...
    @property
    def command_status(self) -> str: ...

def pg_decode(buf: Buffer, offsets: Buffer, nrows: int, row_base: int, desc: Buffer) -> tuple[int, int, int]:
    """Decode staged rows into the table memory the int64 descriptors point at; ``(failure, row, column)``."""

# -- PostgreSQL writes (csrc/pg_encode.cpp, csrc/pg_copy_in.cpp; wrapped by io/postgres/encode.py and pump.py) --

def pg_encode_sizes(desc: Buffer, begin: int, end: int, sizes: Buffer) -> tuple[int, int, int]:
    """Check rows [begin, end) and write their encoded sizes; ``(failure, row, column)``."""

def pg_encode_rows(desc: Buffer, begin: int, end: int, out: Buffer) -> int:
    """Encode rows [begin, end) as binary COPY rows into ``out``; the bytes written."""

# -- PostgreSQL text-like arrays <-> list<string> (csrc/pg_arrays.cpp; wrapped by io/postgres/text_arrays.py) --

def pg_text_arrays_measure(
    offsets: Buffer, data: Buffer, validity: Buffer | None, bit_offset: int, element_oid: int
) -> tuple[int, int, int, int, int]:
    """Check the binary arrays ``data[offsets[i]:offsets[i + 1]]`` (int32 offsets; rows whose ``validity`` bit
    ``bit_offset + i`` is clear skipped) and count what list<string> needs: ``(elements, nbytes,
    null_elements, bad_row, failure)``, failure 0 or a csrc/pg_decode.hpp Failure (8, 9, 11, 12) at ``bad_row``."""

def pg_text_arrays_fill(
    offsets: Buffer,
    data: Buffer,
    validity: Buffer | None,
    bit_offset: int,
    list_offsets: Buffer,
    str_offsets: Buffer,
    str_data: Buffer,
    elem_validity: Buffer | None,
) -> tuple[int, int]:
    """Decode the rows :func:`pg_text_arrays_measure` checked into list<string> buffers (int32 ``list_offsets``
    n + 1, int32 ``str_offsets`` elements + 1, ``str_data``, ``elem_validity`` bitmap or None); every byte is
    checked again: ``(failure, bad_row)``. ValueError where an output is too small for the rows."""

def pg_text_arrays_encode_sizes(
    list_offsets: Buffer,
    row_validity: Buffer | None,
    row_bit_offset: int,
    str_offsets: Buffer,
    elem_validity: Buffer | None,
    n: int,
) -> int:
    """Bytes :func:`pg_text_arrays_encode` writes for the ``n`` list<string> rows (may exceed 2**31 - 1, which
    encode refuses); ValueError naming the row whose offsets are bad."""

def pg_text_arrays_encode(
    list_offsets: Buffer,
    row_validity: Buffer | None,
    row_bit_offset: int,
    str_offsets: Buffer,
    str_data: Buffer,
    elem_validity: Buffer | None,
    n: int,
    element_oid: int,
    out_offsets: Buffer,
    out_data: Buffer,
) -> int:
    """Each row's array as ``array_send`` writes it into ``out_data`` at int32 ``out_offsets`` (NULL rows: empty);
    the bytes written. ValueError naming the row for bad offsets, a small ``out_data`` or a total past 2**31 - 1."""

class CopyInSender:
    def __init__(self, pgconn: int) -> None: ...
    def start(self, sql: str) -> None: ...
    def put(self, data: Buffer, size: int) -> None: ...
    def finish(self) -> str: ...
    def abort(self, reason: str) -> None: ...
    @property
    def active(self) -> bool: ...

def utf8_first_bad_row(data: Buffer, offsets: Buffer, validity: Buffer | None, bit_offset: int) -> int:
    """The first row that is not NULL (``validity``: a bitmap from ``bit_offset``, None: no NULLs) whose
    bytes ``data[offsets[i]:offsets[i + 1]]`` (int32 offsets) are not well-formed UTF-8; -1 if none."""

def utf8_best_level() -> int:
    """The fastest UTF-8 check this CPU runs: 0 byte by byte, 1 SSSE3 (16 bytes a step), 2 AVX2 (32)."""

def utf8_valid(data: Buffer, level: int) -> bool:
    """Whether ``data`` is well-formed UTF-8, checked by the path ``level`` (:func:`utf8_best_level`; 0,
    byte by byte, is the rule the tests hold the others to)."""
