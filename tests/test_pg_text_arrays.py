"""PostgreSQL binary text-like arrays <-> Arrow list<string> (csrc/pg_arrays.cpp, io/postgres/text_arrays.py).

The server is the reference both ways: the decoder reads what ``array_send`` writes and must agree with
what psycopg reads for the same arrays; the encoder must write what ``array_send`` writes for the same
lists, byte for byte, and what it writes must load through a binary COPY. Hostile arrays (truncated,
lying about their lengths, flags, dimensions or element type) fail with their code and row; a
hypothesis round trip covers random lists with NULLs, sliced.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pystrom import _core
from pystrom.errors import DataError
from pystrom.io.postgres.text_arrays import decode_text_arrays, encode_text_arrays

ARRAY_NDIM, ARRAY_ELEMENT, ARRAY_BAD = 8, 9, 11
TEXT, VARCHAR, BPCHAR, NAME = 25, 1043, 1042, 19

postgres = pytest.mark.postgres


# -- helpers -------------------------------------------------------------------------------------------


def _array(elements, oid=TEXT, lower=1, has_null=None) -> bytes:
    """A binary array as array_send writes it (elements: bytes or None)."""
    if not elements:
        return struct.pack(">iiI", 0, 0, oid)
    flag = any(e is None for e in elements) if has_null is None else has_null
    out = [struct.pack(">iiIii", 1, int(flag), oid, len(elements), lower)]
    for e in elements:
        out.append(struct.pack(">i", -1) if e is None else struct.pack(">i", len(e)) + e)
    return b"".join(out)


def _rows(arrays, bit_offset=0):
    """Per-row bytes (None: a NULL row) -> offsets, data, validity (None when no row is NULL)."""
    lengths = [0 if a is None else len(a) for a in arrays]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(a for a in arrays if a is not None), dtype=np.uint8)
    if all(a is not None for a in arrays):
        return offsets, data, None
    bits = np.zeros(bit_offset + len(arrays), dtype=bool)
    bits[bit_offset:] = [a is not None for a in arrays]
    bits[:bit_offset] = [i % 2 == 0 for i in range(bit_offset)]  # noise before the rows
    return offsets, data, np.packbits(bits, bitorder="little")


def _lists(list_offsets, str_offsets, str_data, elem_validity, row_valid=None):
    """Decoded buffers -> Python lists (str; None for NULL elements and, given row_valid, NULL rows)."""
    out = []
    for i in range(len(list_offsets) - 1):
        if row_valid is not None and not row_valid[i]:
            out.append(None)
            continue
        row = []
        for j in range(list_offsets[i], list_offsets[i + 1]):
            if elem_validity is not None and not (elem_validity[j >> 3] >> (j & 7)) & 1:
                row.append(None)
            else:
                row.append(bytes(str_data[str_offsets[j] : str_offsets[j + 1]]).decode())
        out.append(row)
    return out


def _arrow_buffers(arr: pa.ListArray):
    """A (possibly sliced) list<string> array's buffers as encode_text_arrays takes them."""
    bufs = arr.buffers()
    list_offsets = np.frombuffer(bufs[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    row_validity = None if bufs[0] is None else np.frombuffer(bufs[0], dtype=np.uint8)
    child = arr.values  # unsliced by the list's offset: list_offsets index it
    cb = child.buffers()
    str_offsets = np.frombuffer(cb[1], dtype=np.int32)[child.offset : child.offset + len(child) + 1]
    str_data = np.frombuffer(cb[2], dtype=np.uint8) if cb[2] is not None else np.zeros(0, np.uint8)
    elem_validity = None
    if child.null_count:
        valid = child.is_valid().to_numpy(zero_copy_only=False)
        elem_validity = np.packbits(valid, bitorder="little")
    return list_offsets, row_validity, arr.offset, str_offsets, str_data, elem_validity


def _row_bytes(offsets, data):
    return [bytes(data[offsets[i] : offsets[i + 1]]) for i in range(len(offsets) - 1)]


# -- decode against the server -------------------------------------------------------------------------

_TEXT_ARRAYS = [
    "'{a,b,c}'",
    "'{}'",
    "NULL",
    "ARRAY[NULL]::text[]",
    "'{NULL,x,NULL}'",
    "'[0:1]={a,b}'",
    "'[-5:-3]={p,q,r}'",
    "ARRAY['', '']",
    "ARRAY['héllo', '日本語', '🙂', 'ß']",
    "ARRAY[repeat('x', 100000), repeat('yz', 40000)]",
    "ARRAY['with,comma', 'quote\"', 'back\\slash', ' spaced ', 'NULL', '{braces}']",
    "ARRAY[]::text[]",
    "(SELECT array_agg(g::text) FROM generate_series(1, 3000) g)",
    "array_fill('r'::text, ARRAY[4], ARRAY[7])",
]


def _fetch_arrays(pg, cast: str, literals: list[str]):
    values = ", ".join(f"({i}, {lit}::{cast})" for i, lit in enumerate(literals))
    rows = pg.fetch(f"SELECT array_send(x), x FROM (VALUES {values}) v(i, x) ORDER BY i")
    return [None if r[0] is None else bytes(r[0]) for r in rows], [r[1] for r in rows]


@postgres
@pytest.mark.parametrize(
    "cast, oid, literals",
    [
        ("text[]", TEXT, _TEXT_ARRAYS),
        ("varchar[]", VARCHAR, _TEXT_ARRAYS),
        ("varchar(3)[]", VARCHAR, ["'{abc,de,NULL}'", "'{}'", "NULL", "'[2:3]={é,ü}'"]),
        ("char(4)[]", BPCHAR, ["'{a,bc,NULL,abcd}'", "'{}'", "NULL", "'[0:0]={日}'"]),
        ("bpchar[]", BPCHAR, ["'{\"a  \",b}'", "'{NULL}'", "NULL"]),
        ("name[]", NAME, ["'{pg_class,\"Mixed Case\",NULL}'", "'{}'", "NULL", "ARRAY[repeat('n', 63)]::name[]"]),
    ],
)
@pytest.mark.parametrize("bit_offset", [0, 5])
def test_decode_matches_psycopg(pg, cast, oid, literals, bit_offset):
    arrays, expected = _fetch_arrays(pg, cast, literals)
    offsets, data, validity = _rows(arrays, bit_offset)
    lo, so, sd, ev = decode_text_arrays(offsets, data, validity, bit_offset, oid, "c")
    assert lo.dtype == so.dtype == np.int32 and sd.dtype == np.uint8
    assert lo[0] == 0 and so[0] == 0 and so[-1] == len(sd) and lo[-1] == len(so) - 1
    has_null = any(e is None for row in expected if row for e in row)
    assert (ev is None) == (not has_null)
    if ev is not None:
        m = len(so) - 1
        assert len(ev) == (m + 7) // 8
        if m % 8:
            assert ev[-1] >> (m % 8) == 0  # the last byte's bits past the elements are clear
    row_valid = [a is not None for a in arrays]
    assert _lists(lo, so, sd, ev, row_valid) == expected
    for i, a in enumerate(arrays):  # NULL rows: empty lists
        if a is None:
            assert lo[i] == lo[i + 1]


@postgres
def test_decode_refuses_another_element_type(pg):
    arrays, _ = _fetch_arrays(pg, "varchar[]", ["'{a}'", "'{b}'"])
    offsets, data, validity = _rows(arrays)
    assert _core.pg_text_arrays_measure(offsets, data, validity, 0, TEXT)[3:] == (0, ARRAY_ELEMENT)
    with pytest.raises(DataError, match=r"column 'tags' \(text\[\]\), row 0: .*element type"):
        decode_text_arrays(offsets, data, validity, 0, TEXT, "tags")


@postgres
def test_decode_refuses_two_dimensions(pg):
    arrays, _ = _fetch_arrays(pg, "text[]", ["'{a}'", "NULL", "'{{a,b},{c,d}}'"])
    offsets, data, validity = _rows(arrays)
    assert _core.pg_text_arrays_measure(offsets, data, validity, 0, TEXT)[3:] == (2, ARRAY_NDIM)
    with pytest.raises(DataError, match=r"column 'm' .*row 2: a multi-dimensional array"):
        decode_text_arrays(offsets, data, validity, 0, TEXT, "m")


# -- encode against the server -------------------------------------------------------------------------

_LISTS = [
    ["a", None, "b"],
    [],
    None,
    ["x" * 70000, "é日🙂"],
    [None],
    ["", ""],
    ["NULL", "with,comma", 'quote"', "back\\slash"],
    None,
    ["only"],
    [],
]


def _arrow_cases():
    full = pa.array(_LISTS, pa.list_(pa.string()))
    no_nulls = pa.array([r for r in _LISTS if r is not None and None not in r], pa.list_(pa.string()))
    return {
        "full": full,
        "sliced": full.slice(3, 6),
        "sliced_odd": full.slice(1, 8),
        "tail": full.slice(8),
        "no_nulls": no_nulls,
        "empty": full.slice(4, 0),
        "large_child": pa.array([[str(i)] * (i % 5) for i in range(300)], pa.list_(pa.string())).slice(17, 200),
    }


@postgres
@pytest.mark.parametrize("case", sorted(_arrow_cases()))
@pytest.mark.parametrize("cast, oid", [("text[]", TEXT), ("varchar[]", VARCHAR), ("name[]", NAME)])
def test_encode_matches_array_send(pg, case, cast, oid):
    arr = _arrow_cases()[case]
    if cast == "name[]" and any(len(s.encode()) > 63 for row in arr.to_pylist() if row for s in row if s):
        arr = pa.array(
            [None if r is None else [None if s is None else s[:10] for s in r] for r in arr.to_pylist()],
            pa.list_(pa.string()),
        )
    offsets, data = encode_text_arrays(*_arrow_buffers(arr), oid)
    assert offsets.dtype == np.int32 and offsets[0] == 0 and offsets[-1] == len(data)
    got = _row_bytes(offsets, data)
    for i, row in enumerate(arr.to_pylist()):
        if row is None:
            assert got[i] == b""
            continue
        (expected,) = pg.fetch(f"SELECT array_send(%s::{cast})", (row,))[0]
        assert got[i] == bytes(expected), (i, row)


def _copy_binary(rows: list[bytes | None]) -> bytes:
    out = [b"PGCOPY\n\xff\r\n\x00", struct.pack(">ii", 0, 0)]
    for i, r in enumerate(rows):
        out.append(struct.pack(">hii", 2, 4, i))
        out.append(struct.pack(">i", -1) if r is None else struct.pack(">i", len(r)) + r)
    out.append(struct.pack(">h", -1))
    return b"".join(out)


@postgres
@pytest.mark.parametrize("case", ["full", "sliced_odd", "large_child"])
@pytest.mark.parametrize("column_type, oid", [("text[]", TEXT), ("varchar(100000)[]", VARCHAR)])
def test_encode_loads_through_binary_copy(pg, case, column_type, oid):
    arr = _arrow_cases()[case]
    buffers = _arrow_buffers(arr)
    offsets, data = encode_text_arrays(*buffers, oid, column="a")
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    rows = [r if v else None for r, v in zip(_row_bytes(offsets, data), valid)]
    t = pg.name()
    pg.execute(f'CREATE TABLE "{t}" (i int4, a {column_type})')
    with pg.conn.cursor() as cur, cur.copy(f'COPY "{t}" (i, a) FROM STDIN (FORMAT BINARY)') as copy:
        copy.write(_copy_binary(rows))
    got = [r[0] for r in pg.fetch(f'SELECT a FROM "{t}" ORDER BY i')]
    assert got == arr.to_pylist()
    # and the server's own bytes for what it stored are ours
    sent = [None if r[0] is None else bytes(r[0]) for r in pg.fetch(f'SELECT array_send(a) FROM "{t}" ORDER BY i')]
    assert sent == rows


@postgres
def test_encode_wrong_element_type_is_refused_by_the_server(pg):
    # the element OID is the caller's promise: array_recv checks it against the column's
    arr = pa.array([["a"]], pa.list_(pa.string()))
    offsets, data = encode_text_arrays(*_arrow_buffers(arr), VARCHAR)
    t = pg.name()
    pg.execute(f'CREATE TABLE "{t}" (i int4, a text[])')
    psycopg = pytest.importorskip("psycopg")
    with pytest.raises(psycopg.Error, match="element type 1043"):
        with pg.conn.cursor() as cur, cur.copy(f'COPY "{t}" (i, a) FROM STDIN (FORMAT BINARY)') as copy:
            copy.write(_copy_binary(_row_bytes(offsets, data)))


# -- encode: bad inputs --------------------------------------------------------------------------------


def test_encode_empty_list_is_twelve_bytes():
    offsets, data = encode_text_arrays(np.array([0, 0], np.int32), None, 0, np.zeros(1, np.int32), b"", None, NAME)
    assert data.tobytes() == struct.pack(">iiI", 0, 0, NAME) and offsets.tolist() == [0, 12]


@pytest.mark.parametrize(
    "list_offsets, str_offsets, message",
    [
        ([0, 2, 1], [0, 1, 2], "row 1: its list offsets are negative or decrease"),
        ([-1, 1], [0, 1], "row 0: its list offsets are negative or decrease"),
        ([0, 1, 3], [0, 1, 2], "row 1: its list offsets reach past the string offsets"),
        ([0, 1, 2], [0, 2, 1], "row 1: its string offsets are negative or decrease"),
        ([0, 1], [-3, 1], "row 0: its string offsets are negative or decrease"),
    ],
)
def test_encode_refuses_bad_offsets(list_offsets, str_offsets, message):
    lo, so = np.array(list_offsets, np.int32), np.array(str_offsets, np.int32)
    with pytest.raises(DataError, match=r"column 'c' \(text\[\]\): pg_text_arrays_encode_sizes: " + message):
        encode_text_arrays(lo, None, 0, so, b"ab", None, TEXT, column="c")
    with pytest.raises(ValueError, match=message):
        _core.pg_text_arrays_encode(
            lo, None, 0, so, b"ab", None, len(lo) - 1, TEXT, np.zeros(len(lo), np.int32), np.zeros(1000, np.uint8)
        )


def test_encode_checks_buffers():
    lo, so = np.array([0, 2], np.int32), np.array([0, 1, 2], np.int32)
    with pytest.raises(ValueError, match="element validity"):
        _core.pg_text_arrays_encode_sizes(
            np.array([0, 9], np.int32), None, 0, np.arange(10, dtype=np.int32), np.zeros(1, np.uint8), 1
        )
    with pytest.raises(ValueError, match="does not fit out_data"):
        _core.pg_text_arrays_encode(
            lo, None, 0, so, b"ab", None, 1, TEXT, np.zeros(2, np.int32), np.zeros(29, np.uint8)
        )
    with pytest.raises(ValueError, match="out_offsets"):
        _core.pg_text_arrays_encode(
            lo, None, 0, so, b"ab", None, 1, TEXT, np.zeros(1, np.int32), np.zeros(30, np.uint8)
        )
    with pytest.raises(ValueError, match="n \\+ 1"):
        _core.pg_text_arrays_encode_sizes(lo, None, 0, so, None, 2)
    with pytest.raises((ValueError, IndexError), match="row_validity"):
        _core.pg_text_arrays_encode_sizes(np.zeros(6, np.int32), np.zeros(1, np.uint8), 4, so, None, 5)
    with pytest.raises(ValueError, match="row 1: its string offsets reach past the string data"):
        _core.pg_text_arrays_encode(
            np.array([0, 1, 2], np.int32),
            None,
            0,
            np.array([0, 1, 9], np.int32),
            b"ab",
            None,
            2,
            TEXT,
            np.zeros(3, np.int32),
            np.zeros(100, np.uint8),
        )
    assert (
        _core.pg_text_arrays_encode(
            lo, None, 0, so, b"ab", None, 1, TEXT, np.zeros(2, np.int32), np.zeros(30, np.uint8)
        )
        == 30
    )


def test_encode_refuses_more_than_int32_bytes():
    # the sizes pass reads no string bytes: a claimed 2**31 - 1 byte element is refused before any allocation
    lo, so = np.array([0, 1], np.int32), np.array([0, 2**31 - 1], np.int32)
    assert _core.pg_text_arrays_encode_sizes(lo, None, 0, so, None, 1) == 2**31 - 1 + 24
    with pytest.raises(DataError, match=r"column 'big' \(text\[\]\): the arrays take 2147483671 bytes"):
        encode_text_arrays(lo, None, 0, so, b"", None, TEXT, column="big")


def test_offsets_must_be_int32():
    # a cast of int64 offsets to int32 could wrap: the wrappers pass them on and the bindings refuse them
    with pytest.raises(ValueError, match="aligned array of int32"):
        decode_text_arrays(np.array([0, 12], np.int64), _array([]), None, 0, TEXT, "c")
    with pytest.raises(ValueError, match="aligned array of int32"):
        encode_text_arrays(np.array([0, 0], np.int64), None, 0, np.zeros(1, np.int32), b"", None, TEXT)


def test_unknown_element_oid_is_refused():
    with pytest.raises(ValueError, match="element OID 23"):
        encode_text_arrays(np.array([0], np.int32), None, 0, np.zeros(1, np.int32), b"", None, 23)
    with pytest.raises(ValueError, match="element OID 23"):
        decode_text_arrays(np.array([0], np.int32), b"", None, 0, 23, "c")


# -- decode: hostile arrays ----------------------------------------------------------------------------

_GOOD = _array([b"ok", None, b""])

_HOSTILE = {
    "empty bytes": (b"", ARRAY_BAD),
    "truncated header": (_GOOD[:7], ARRAY_BAD),
    "no dimension words": (_GOOD[:12], ARRAY_BAD),
    "half a dimension": (_GOOD[:16], ARRAY_BAD),
    "truncated element length": (_GOOD[:22], ARRAY_BAD),
    "element past the end": (_GOOD[:-5] + b"\x00", ARRAY_BAD),
    "element length past the end": (_array([b"abc"])[:-1], ARRAY_BAD),
    "huge element length": (_array([b"abc"])[:20] + struct.pack(">i", 2**31 - 1) + b"abc", ARRAY_BAD),
    "length -2": (_array([b"abc"])[:20] + struct.pack(">i", -2) + b"abc", ARRAY_BAD),
    "length INT_MIN": (_array([b"abc"])[:20] + struct.pack(">i", -(2**31)) + b"abc", ARRAY_BAD),
    "ndim 2": (struct.pack(">iiIiiii", 2, 0, TEXT, 1, 1, 1, 1) + struct.pack(">i", 1) + b"a", ARRAY_NDIM),
    "ndim 7": (struct.pack(">iiI", 7, 0, TEXT), ARRAY_NDIM),
    "ndim -1": (struct.pack(">iiI", -1, 0, TEXT), ARRAY_BAD),
    "wrong element oid": (_array([b"a"], oid=23), ARRAY_ELEMENT),
    "wrong element oid, empty": (_array([], oid=1043), ARRAY_ELEMENT),
    "NULL without the flag": (_array([b"a", None], has_null=False), ARRAY_BAD),
    "flag 2": (struct.pack(">iiI", 0, 2, TEXT), ARRAY_BAD),
    "huge dims": (struct.pack(">iiIii", 1, 0, TEXT, 2**31 - 1, 1) + struct.pack(">i", 0), ARRAY_BAD),
    "negative dims": (struct.pack(">iiIii", 1, 0, TEXT, -1, 1), ARRAY_BAD),
    "more elements than dims": (
        _array([b"a", b"b"])[:12] + struct.pack(">ii", 1, 1) + _array([b"a", b"b"])[20:],
        ARRAY_BAD,
    ),
    "trailing bytes": (_GOOD + b"\x00", ARRAY_BAD),
    "trailing bytes, empty": (_array([]) + b"\x00\x00\x00\x00", ARRAY_BAD),
}


@pytest.mark.parametrize("name", sorted(_HOSTILE))
def test_hostile_arrays_fail_with_code_and_row(name):
    bad, code = _HOSTILE[name]
    arrays = [_GOOD, None, _array([]), bad, _GOOD]
    offsets, data, validity = _rows(arrays, 3)
    elements, nbytes, nulls, row, failure = _core.pg_text_arrays_measure(offsets, data, validity, 3, TEXT)
    assert (row, failure) == (3, code)
    # fill, told nothing by a measure, checks the bytes itself (roomy outputs: the failure is the bytes')
    lo, so = np.zeros(6, np.int32), np.zeros(1000, np.int32)
    sd, ev = np.zeros(len(data), np.uint8), np.zeros(200, np.uint8)
    fill_code = ARRAY_BAD if code == ARRAY_ELEMENT else code
    if code != ARRAY_ELEMENT:  # fill does not check the element type again
        assert _core.pg_text_arrays_fill(offsets, data, validity, 3, lo, so, sd, ev) == (fill_code, 3)
    with pytest.raises(DataError, match=r"column 'h' \(text\[\]\), row 3: "):
        decode_text_arrays(offsets, data, validity, 3, TEXT, "h")
    # the same bytes in a NULL row are never read
    validity2 = validity.copy()
    validity2[(3 + 3) >> 3] &= ~np.uint8(1 << ((3 + 3) & 7))
    assert _core.pg_text_arrays_measure(offsets, data, validity2, 3, TEXT)[3:] == (-1, 0)


def test_lower_bounds_are_dropped():
    arrays = [_array([b"a", b"b"], lower=0), _array([b"c"], lower=-(2**31)), _array([b"d"], lower=2**31 - 1)]
    lo, so, sd, ev = decode_text_arrays(*_rows(arrays), 0, TEXT, "c")
    assert _lists(lo, so, sd, ev) == [["a", "b"], ["c"], ["d"]] and ev is None


def test_flag_without_nulls_is_accepted():
    # PostgreSQL may keep a NULL bitmap on an array whose NULLs are gone: the flag set, no element NULL
    lo, so, sd, ev = decode_text_arrays(*_rows([_array([b"a"], has_null=True)]), 0, TEXT, "c")
    assert _lists(lo, so, sd, ev) == [["a"]] and ev is None


def test_fill_checks_its_outputs():
    arrays = [_array([b"abc", None]), _array([b"de"])]
    offsets, data, validity = _rows(arrays)
    assert _core.pg_text_arrays_measure(offsets, data, validity, 0, TEXT) == (3, 5, 1, -1, 0)

    def fill(lo=3, so=4, sd=5, ev=1):
        return _core.pg_text_arrays_fill(
            offsets,
            data,
            validity,
            0,
            np.zeros(lo, np.int32),
            np.zeros(so, np.int32),
            np.zeros(sd, np.uint8),
            None if ev is None else np.full(ev, 0xFF, np.uint8),
        )

    assert fill() == (0, -1)
    with pytest.raises(ValueError, match="row 1 needs more than str_data"):
        fill(sd=4)
    with pytest.raises(ValueError, match="row 1 needs more than str_offsets"):
        fill(so=3)
    with pytest.raises(ValueError, match="row 0 holds a NULL element but elem_validity is None"):
        fill(ev=None)
    with pytest.raises(ValueError, match="row 0 needs more than elem_validity"):
        fill(ev=0)
    with pytest.raises(ValueError, match="list_offsets"):
        fill(lo=2)
    with pytest.raises(ValueError, match="str_offsets is empty"):
        fill(so=0)
    # bytes changed after the measure: the outputs sized for the old bytes are not overrun
    bigger = np.frombuffer(_array([b"abcdefgh", None]) + _array([b"de"]), np.uint8)
    offsets2 = np.array([0, len(_array([b"abcdefgh", None])), len(bigger)], np.int32)
    with pytest.raises(ValueError, match="row 0 needs more than str_data"):
        _core.pg_text_arrays_fill(
            offsets2,
            bigger,
            None,
            0,
            np.zeros(3, np.int32),
            np.zeros(4, np.int32),
            np.zeros(5, np.uint8),
            np.zeros(1, np.uint8),
        )


def test_bad_row_offsets_raise():
    data = np.frombuffer(_GOOD, np.uint8)
    for offsets in ([0, len(_GOOD) + 1], [4, 2], [-1, 4]):
        with pytest.raises(ValueError, match="row 0's offsets"):
            _core.pg_text_arrays_measure(np.array(offsets, np.int32), data, None, 0, TEXT)
    with pytest.raises((ValueError, IndexError), match="validity"):
        _core.pg_text_arrays_measure(np.array([0, 0, 0], np.int32), data, np.zeros(1, np.uint8), 7, TEXT)
    with pytest.raises(ValueError, match="int32"):
        _core.pg_text_arrays_measure(np.array([0, 0], np.int64), data, None, 0, TEXT)


def test_measure_at_the_int32_limit():
    # ARRAY_TOO_LARGE cannot be reached through int32 row offsets (the bytes, hence the elements' bytes and
    # count, stay under 2**31); the arithmetic next to the limit still must not wrap. One array spanning
    # 2**31 - 1 bytes: np.zeros maps untouched pages lazily and measure reads only the length words, so
    # this costs a few pages, not 2 GiB.
    size = 2**31 - 1
    try:
        data = np.zeros(size, np.uint8)
    except MemoryError:
        pytest.skip("no 2 GiB of address space")
    offsets = np.array([0, size], np.int32)
    for claimed, expected in ((size - 24, (1, size - 24, 0, -1, 0)), (size - 23, (0, 0, 0, 0, ARRAY_BAD))):
        data[:24] = np.frombuffer(struct.pack(">iiIiii", 1, 0, TEXT, 1, 1, claimed), np.uint8)
        assert _core.pg_text_arrays_measure(offsets, data, None, 0, TEXT) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 63), st.binary(max_size=8))
def test_mutated_arrays_never_read_outside(good_tail, cut, junk):
    # any prefix of a good array with junk after it: measure and fill agree, and never crash
    good = _array([good_tail, None, b"", good_tail[:3]])
    bad = good[: min(cut, len(good))] + junk
    offsets, data, validity = _rows([good, bad, good])
    elements, nbytes, nulls, row, failure = _core.pg_text_arrays_measure(offsets, data, validity, 0, TEXT)
    lo, so, sd = np.zeros(4, np.int32), np.zeros(elements + 1, np.int32), np.zeros(nbytes, np.uint8)
    ev = np.zeros((elements + 7) // 8, np.uint8) if nulls else None
    if failure == 0:
        assert _core.pg_text_arrays_fill(offsets, data, validity, 0, lo, so, sd, ev) == (0, -1)
        return
    assert row == 1
    roomy = np.zeros(4, np.int32), np.zeros(200, np.int32), np.zeros(len(data), np.uint8), np.zeros(64, np.uint8)
    got = _core.pg_text_arrays_fill(offsets, data, validity, 0, *roomy)
    if failure != ARRAY_ELEMENT:  # fill does not check the element type again
        assert got == (failure, 1)


# -- round trip ----------------------------------------------------------------------------------------

_texts = st.text(max_size=12)
_rows_strategy = st.lists(st.none() | st.lists(st.none() | _texts, max_size=6), max_size=25)


@settings(max_examples=300, deadline=None)
@given(_rows_strategy, st.data())
def test_encode_decode_round_trip(rows, data):
    arr = pa.array(rows, pa.list_(pa.string()))
    start = data.draw(st.integers(0, len(rows)))
    arr = arr.slice(start, data.draw(st.integers(0, len(rows) - start)))
    oid = data.draw(st.sampled_from([TEXT, VARCHAR, BPCHAR, NAME]))
    offsets, encoded = encode_text_arrays(*_arrow_buffers(arr), oid)
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if len(arr) else np.zeros(0, bool)
    bit_offset = data.draw(st.integers(0, 9))
    bits = np.zeros(bit_offset + len(arr), bool)
    bits[bit_offset:] = valid
    validity = np.packbits(bits, bitorder="little") if arr.null_count else None
    lo, so, sd, ev = decode_text_arrays(offsets, encoded, validity, bit_offset, oid, "c")
    assert _lists(lo, so, sd, ev, valid) == arr.to_pylist()
    # and decoding what the encoder wrote, then encoding it again, gives the same bytes
    again_offsets, again = encode_text_arrays(lo, validity, bit_offset, so, sd, ev, oid)
    assert np.array_equal(again_offsets, offsets) and again.tobytes() == encoded.tobytes()
