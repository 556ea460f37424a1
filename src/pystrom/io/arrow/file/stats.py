"""Per-record-batch min/max statistics in PG-Strom's format: written by our IPC writer, read back here.

PG-Strom's Arrow_Fdw skips record batches by two kinds of custom metadata (see docs/arrow-files.md):

* **per batch** (current): the record batch *message*'s custom metadata holds
  ``min_max_stats.<field name>`` = ``"<min>,<max>"``; PG-Strom splits the value at its first comma.
* **per file** (older): the footer schema's *field* metadata holds ``min_values`` and ``max_values``,
  comma-separated lists with one entry per record batch in file order (``null`` where a batch has none).

Values are in the column's storage form:

=========================  =========================================  =======================
column type                per batch (``min_max_stats.*``)             footer (``min_values``)
=========================  =========================================  =======================
int8..64, uint8..64        decimal integer                            same
float16/32/64              ``repr`` of the value as a float64          IEEE bits as a signed
                           (round-trips exactly; ``inf``/``-inf``)     integer of the width
date, time, timestamp,     the raw integer in the column's own unit    same (not duration)
duration
decimal128(p, s)           decimal text with ``s`` fraction digits     unscaled integer
bool                       ``0`` / ``1``                               not written
string, large_string       text, at most 31 bytes, no comma (below)    not written
binary, fixed_size_binary  not written                                 not written
=========================  =========================================  =======================

What a range means is "no row of this batch lies outside [min, max]". So a batch whose column is all
NULL gets no statistics (PG-Strom then treats the column as unknown for that batch and reads it); a
float batch holding a NaN gets none either (NaN sorts above +inf in PostgreSQL, and ``not (x < 3)`` is
true for it, so no finite range may stand for it). A uint64 batch whose max exceeds 2**63-1 gets none:
PG-Strom parses integers with ``strtol`` and would clamp the max below real rows.

Strings: PG-Strom keeps only the first 31 bytes of each bound, splits at the first comma and reads
values as C strings (to the first NUL). So the minimum is written as its prefix up to the first comma
or NUL and at most 31 bytes (a prefix is never greater than the string), and the maximum, when it is
longer or holds a comma/NUL, as a short prefix whose last character is bumped by one code point (which
is greater than every string starting with the prefix). Bounds compare in code-point order, which is
UTF-8 byte order and pyarrow.compute's order.

**Which statistics are trusted** (the rule of docs/arrow-files.md). Per-batch entries sit in the record
batch's own message: a writer that rewrites the batch writes its own message, so they cannot outlive
the rows they describe (pyarrow's ``read_all`` drops them; only a writer that copies a batch's custom
metadata onto different rows on purpose could defeat them). Footer lists are schema field metadata,
which pyarrow keeps in ``read_all`` and writes again with reordered rows: they are trusted only in a
file whose footer custom metadata holds :data:`FINGERPRINT_KEY` equal to :func:`blocks_fingerprint`
of its record batch messages (position, sizes and the whole metadata flatbuffer of each, written by
our writer). A rewritten file has other messages (and pyarrow does not copy footer custom metadata),
so its copied lists are ignored. Files with lists but no fingerprint (older PG-Strom) are read in
full: correct, only not skipped.

The reader (:func:`batch_stats`) never trusts what it cannot check: a malformed, out-of-range or
inverted entry gives *no* statistics for that column (a batch is never skipped on doubtful data).
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

__all__ = [
    "ColumnStats",
    "column_stats",
    "batch_stats",
    "StatsReader",
    "blocks_fingerprint",
    "BlocksFingerprint",
    "STATS_KEY_PREFIX",
    "FOOTER_MIN_KEY",
    "FOOTER_MAX_KEY",
    "FINGERPRINT_KEY",
]

STATS_KEY_PREFIX = "min_max_stats."
FOOTER_MIN_KEY = "min_values"
FOOTER_MAX_KEY = "max_values"
# Footer custom metadata (not the schema's: pyarrow's read_all does not carry it into a table) holding
# blocks_fingerprint() of the record batches that the footer lists describe.
FINGERPRINT_KEY = "pystrom.footer_stats.v1"
STRING_STATS_MAX_BYTES = 31  # PG-Strom's MINMAX_STAT_BYTESZ (32) less its length byte
_INT64_MAX = 2**63 - 1
_FLOAT_BITS = {16: ("<e", "<h"), 32: ("<f", "<i"), 64: ("<d", "<q")}


@dataclass(frozen=True)
class ColumnStats:
    """Statistics of one column in one batch, already as text."""

    per_batch: str  # value of min_max_stats.<name>
    footer: tuple[str, str] | None  # entries of min_values / max_values, or None when that format cannot hold it


def _storage(t: pa.DataType) -> pa.DataType:
    return t.storage_type if isinstance(t, pa.BaseExtensionType) else t


def _kind(t: pa.DataType) -> str | None:
    """Which statistics a storage type gets: int, temporal, float, decimal, bool, string or None."""
    if pt.is_integer(t):
        return "int"
    if pt.is_floating(t):
        return "float"
    if pt.is_date(t) or pt.is_time(t) or pt.is_timestamp(t) or pt.is_duration(t):
        return "temporal"
    if pt.is_decimal128(t):
        return "decimal"
    if pt.is_boolean(t):
        return "bool"
    if pt.is_string(t) or pt.is_large_string(t):
        return "string"
    return None


# ---------------------------------------------------------------------------------------------------
# writer side


def _decimal_unscaled(value: Decimal, scale: int) -> int:
    sign, digits, exponent = value.as_tuple()
    n = int("".join(map(str, digits)) or "0") * 10 ** (exponent + scale) if exponent + scale >= 0 else None
    if n is None:  # more fraction digits than the scale: cannot come from a decimal128(p, scale) array
        raise ValueError(f"decimal {value} has more than {scale} fraction digits")
    return -n if sign else n


def _decimal_text(unscaled: int, scale: int) -> str:
    """Plain decimal text (no exponent) of ``unscaled * 10**-scale``, as PostgreSQL's numeric_in reads."""
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled))
    if scale <= 0:
        return sign + digits + "0" * (-scale) if unscaled else "0"
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def _string_min_bound(s: str) -> str:
    cut = len(s)
    for ch in (",", "\0"):
        i = s.find(ch)
        if i >= 0:
            cut = min(cut, i)
    out = s[:cut]
    while len(out.encode()) > STRING_STATS_MAX_BYTES:
        out = out[:-1]
    return out


def _string_max_bound(s: str) -> str | None:
    if len(s.encode()) <= STRING_STATS_MAX_BYTES and "," not in s and "\0" not in s:
        return s
    prefix = _string_min_bound(s)
    while len(prefix.encode()) > STRING_STATS_MAX_BYTES - 4:  # room for the bumped character
        prefix = prefix[:-1]
    nxt = ord(s[len(prefix)])  # exists: s is longer than its cut prefix
    bumped = nxt + 1
    if bumped == ord(","):
        bumped += 1
    if 0xD800 <= bumped <= 0xDFFF:  # surrogates are not characters
        bumped = 0xE000
    if bumped > 0x10FFFF:
        return None  # U+10FFFF cannot be bumped; no statistics rather than a wrong bound
    return prefix + chr(bumped)


def _float_min_max(array: pa.Array, bit_width: int) -> tuple[float, float] | None:
    """Min and max of the valid values, or None when one of them is NaN.

    NumPy rather than pyarrow.compute here: its reductions are ~10x faster on floats (pc.min_max ran at
    0.4-0.8 GB/s on the development machine, NumPy at 7-9 GB/s) and they propagate NaN, so the same
    pass says whether the batch holds one.
    """
    dtype = np.dtype(f"float{bit_width}")
    values = np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        lo = values.min(where=valid, initial=np.inf)
        hi = values.max(where=valid, initial=-np.inf)
    else:
        lo, hi = values.min(), values.max()
    if np.isnan(lo) or np.isnan(hi):
        return None
    return float(lo), float(hi)


def column_stats(field_type: pa.DataType, array: pa.Array) -> ColumnStats | None:
    """Min/max of one column of one batch in PG-Strom's text forms, or None where none may be given."""
    t = _storage(field_type)
    kind = _kind(t)
    if kind is None or len(array) == array.null_count:
        return None
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if kind == "temporal":
        array = array.view(pa.int32() if t.bit_width == 32 else pa.int64())
        kind = "int"
    if kind == "float":
        found = _float_min_max(array, t.bit_width)
        if found is None:
            return None
        lo, hi = found
    else:
        mm = pc.min_max(array)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if kind == "int":
        if hi > _INT64_MAX:
            return None
        # PG-Strom's footer parser has no case for durations (it would drop the whole list): leave them out.
        return ColumnStats(f"{lo},{hi}", None if pt.is_duration(t) else (str(lo), str(hi)))
    if kind == "float":
        fmt, ifmt = _FLOAT_BITS[t.bit_width]
        bits = tuple(str(struct.unpack(ifmt, struct.pack(fmt, v))[0]) for v in (lo, hi))
        return ColumnStats(f"{float(lo)!r},{float(hi)!r}", bits)  # type: ignore[arg-type]
    if kind == "decimal":
        try:
            ulo, uhi = _decimal_unscaled(lo, t.scale), _decimal_unscaled(hi, t.scale)
        except ValueError:  # a value with more digits than the type allows: no bound rather than a wrong one
            return None
        return ColumnStats(f"{_decimal_text(ulo, t.scale)},{_decimal_text(uhi, t.scale)}", (str(ulo), str(uhi)))
    if kind == "bool":
        return ColumnStats(f"{int(lo)},{int(hi)}", None)
    smax = _string_max_bound(hi)
    if smax is None:
        return None
    return ColumnStats(f"{_string_min_bound(lo)},{smax}", None)


class BlocksFingerprint:
    """Fingerprint of a file's record batches, fed one batch at a time in file order: its file offset,
    metadata length, body length and the message's metadata bytes (which hold the batch's row count,
    null counts, buffer positions and per-batch statistics)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, offset: int, metadata_length: int, body_length: int, metadata: bytes | memoryview) -> None:
        self._h.update(struct.pack("<qqq", offset, metadata_length, body_length))
        self._h.update(metadata)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def blocks_fingerprint(messages: Iterable[tuple[int, int, int, bytes | memoryview]]) -> str:
    """:class:`BlocksFingerprint` of ``(offset, metadata length, body length, metadata bytes)`` items."""
    fp = BlocksFingerprint()
    for message in messages:
        fp.add(*message)
    return fp.hexdigest()


# ---------------------------------------------------------------------------------------------------
# reader side

_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity)", re.IGNORECASE)
_DECIMAL_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _int_range(t: pa.DataType) -> tuple[int, int]:
    if pt.is_integer(t):
        bits = t.bit_width
        return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if pt.is_signed_integer(t) else (0, 2**bits - 1)
    bits = t.bit_width  # temporal: its storage integer
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _parse_value(t: pa.DataType, kind: str, token: str, bound: str, footer: bool) -> Any:
    """One bound (``bound`` = "min"/"max") in storage form, or None when it is not trustworthy."""
    if kind == "string":
        return token
    token = token.strip(" \t\n\r")
    if kind in ("int", "temporal"):
        if not _INT_RE.fullmatch(token):
            return None
        value = int(token)
        lo, hi = _int_range(t)
        return value if lo <= value <= hi else None
    if kind == "bool":
        return {"0": False, "1": True, "false": False, "true": True}.get(token.lower())
    if kind == "float":
        if footer or not _FLOAT_RE.fullmatch(token):
            # Footer lists hold floats as IEEE bit patterns for PG-Strom, but other writers are not known
            # to agree on that; a misread bound would skip real rows, so footer floats are not used.
            return None
        value = float(token)
        return None if math.isnan(value) else value
    if kind == "decimal":
        if footer:
            if not _INT_RE.fullmatch(token):
                return None
            value = int(token)
        else:
            if not _DECIMAL_RE.fullmatch(token) or len(token) > 200:
                return None
            try:
                scaled = Decimal(token).scaleb(t.scale, context=_DECIMAL_CONTEXT)
                if scaled.is_zero():
                    return 0
                if scaled.adjusted() > 38:  # beyond decimal128's 38 digits (and no huge ints from "1e99999")
                    return None
                # A bound with more fraction digits than the scale is widened outward, never narrowed.
                rounding = ROUND_FLOOR if bound == "min" else ROUND_CEILING
                value = int(scaled.to_integral_value(rounding=rounding, context=_DECIMAL_CONTEXT))
            except (ArithmeticError, ValueError):
                return None
        return value if abs(value) < 10**38 else None
    return None


_DECIMAL_CONTEXT = Context(prec=400, Emax=10**6, Emin=-(10**6))


def _pair(t: pa.DataType, kind: str, lo_text: str, hi_text: str, footer: bool) -> tuple[Any, Any] | None:
    lo = _parse_value(t, kind, lo_text, "min", footer)
    hi = _parse_value(t, kind, hi_text, "max", footer)
    if lo is None or hi is None or lo > hi:
        return None
    return lo, hi


def _field_metadata(footer_schema_metadata: Any, schema: pa.Schema) -> list[Mapping | None]:
    if footer_schema_metadata is None or isinstance(footer_schema_metadata, Mapping):
        # None, or the schema-level metadata (which never holds the lists): the schema's own fields.
        return [f.metadata for f in schema]
    if isinstance(footer_schema_metadata, pa.Schema):
        if len(footer_schema_metadata) != len(schema):
            return [None] * len(schema)
        return [f.metadata for f in footer_schema_metadata]
    if isinstance(footer_schema_metadata, Sequence) and not isinstance(footer_schema_metadata, (str, bytes)):
        metas = list(footer_schema_metadata)
        if len(metas) != len(schema):
            return [None] * len(schema)
        return [m if isinstance(m, Mapping) else None for m in metas]
    return [None] * len(schema)


def _lookup(meta: Mapping | None, key: str) -> str | None:
    if not meta:
        return None
    for k, v in meta.items():
        if _text(k) == key:
            return _text(v)
    return None


def batch_stats(
    schema: pa.Schema,
    batch_index: int,
    batch_custom_metadata: Mapping | None,
    footer_schema_metadata: pa.Schema | Sequence[Mapping | None] | None = None,
    *,
    num_batches: int | None = None,
) -> dict[str, tuple[Any, Any]]:
    """Min/max statistics of record batch ``batch_index``, per column, in the column's storage form.

    Parameters
    ----------
    schema : pyarrow.Schema
        The file's schema (its field types decide how values parse).
    batch_index : int
        Position of the batch in the file (selects the entry of the footer lists).
    batch_custom_metadata : Mapping or None
        The batch message's custom metadata (``get_batch_with_custom_metadata``); keys and values
        may be ``bytes`` or ``str``.
    footer_schema_metadata : pyarrow.Schema, sequence of Mapping, or None
        Where the footer's per-field ``min_values``/``max_values`` lists are: the footer schema, or one
        field-metadata mapping per field in schema order. None (or a single mapping, such as the
        schema-level metadata, which never holds them) takes them from ``schema``'s fields, which is
        right when ``schema`` is ``RecordBatchFileReader.schema`` (pyarrow reads it from the footer).
    num_batches : int, optional
        Record batches in the file; when given, footer lists of another length are ignored (PG-Strom
        ignores them too).

    Returns
    -------
    dict
        ``{column: (min, max)}`` for the columns with trustworthy statistics: ``int`` for integer,
        temporal (raw value in the column's unit) and decimal128 (unscaled) columns, ``float`` for
        floats, ``bool`` for bool, ``str`` for strings. Per-batch entries take precedence; a column whose
        per-batch entry is present but malformed, or disagrees with a footer entry for the same batch,
        gets nothing. Never raises on malformed metadata.
    """
    return StatsReader(schema, footer_schema_metadata, num_batches=num_batches)(batch_index, batch_custom_metadata)


class StatsReader:
    """:func:`batch_stats` of one file's batches, one batch a call: what depends on the schema and the
    footer only (each field's kind, the footer lists split) is worked out once, not per batch (a scan of
    2048 batches spent ~70 ms on it). ``columns``: only these (default: every field)."""

    def __init__(self, schema: pa.Schema, footer_schema_metadata: Any = None, *, num_batches: int | None = None,
                 columns: Iterable[str] | None = None):  # fmt: skip
        names = [f.name for f in schema]
        duplicated = {n for n in names if names.count(n) > 1}  # ambiguous: which column would a key mean?
        wanted = None if columns is None else set(columns)
        self._fields = []  # (name, storage type, kind, the footer's (min, max) lists or None), schema order
        for field, meta in zip(schema, _field_metadata(footer_schema_metadata, schema)):
            if field.name in duplicated or (wanted is not None and field.name not in wanted):
                continue
            t = _storage(field.type)
            kind = _kind(t)
            if kind is not None:
                self._fields.append((field.name, t, kind, _footer_lists(t, kind, meta, num_batches)))

    def __call__(self, batch_index: int, batch_custom_metadata: Mapping | None) -> dict[str, tuple[Any, Any]]:
        per_batch: dict[str, str] = {}
        if isinstance(batch_custom_metadata, Mapping):
            for k, v in batch_custom_metadata.items():
                key, value = _text(k), _text(v)
                if key is not None and value is not None and key.startswith(STATS_KEY_PREFIX):
                    name = key[len(STATS_KEY_PREFIX) :]
                    if name in per_batch:  # the same key twice: which one is true?
                        per_batch[name] = ""
                    else:
                        per_batch[name] = value
        out: dict[str, tuple[Any, Any]] = {}
        for name, t, kind, lists in self._fields:
            if lists is None and name not in per_batch:
                continue
            footer = None
            if lists is not None and 0 <= batch_index < len(lists[0]):
                footer = _pair(t, kind, lists[0][batch_index], lists[1][batch_index], footer=True)
            if name in per_batch:
                lo_text, sep, hi_text = per_batch[name].partition(",")
                pair = _pair(t, kind, lo_text, hi_text, footer=False) if sep else None
                if pair is not None and footer is not None and footer != pair:
                    pair = None  # the two formats disagree about the same batch: one of them is wrong
            else:
                pair = footer
            if pair is not None:
                out[name] = pair
        return out


def _footer_lists(t: pa.DataType, kind: str, meta: Mapping | None, num_batches: int | None) -> tuple | None:
    """A field's footer ``min_values`` / ``max_values`` entries, one per batch, or None."""
    if kind in ("string", "bool") or (pt.is_duration(t)):
        return None  # the footer format has no entries for these (PG-Strom does not parse them there)
    mins, maxs = _lookup(meta, FOOTER_MIN_KEY), _lookup(meta, FOOTER_MAX_KEY)
    if mins is None or maxs is None:
        return None
    lo_list, hi_list = mins.split(","), maxs.split(",")
    if len(lo_list) != len(hi_list) or (num_batches is not None and len(lo_list) != num_batches):
        return None
    return lo_list, hi_list


def footer_lists(entries: Sequence[tuple[str, str] | None]) -> tuple[str, str]:
    """``min_values`` / ``max_values`` values from one (min, max) entry or None per batch."""
    lows = [e[0] if e is not None else "null" for e in entries]
    highs = [e[1] if e is not None else "null" for e in entries]
    return ",".join(lows), ",".join(highs)
