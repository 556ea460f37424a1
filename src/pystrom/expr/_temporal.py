"""ISO date/time literals read into the integer storage of temporal columns, exactly (nanoseconds).

``'2024-01-01'``, ``'2024-01-01 12:00'``, ``'2024-01-01T12:00:00.123456789'``, with an optional
``Z`` or ``+HH:MM`` offset; times of day as ``'12:30'`` / ``'12:30:15.5'``. A literal without an
offset is read in the column's time zone (UTC for zone-less columns); a literal with an offset
compared with a zone-less timestamp column is refused, since the column does not say which zone
its values are in.
"""

from __future__ import annotations

import datetime as _dt
import re

__all__ = ["UNIT_NS", "parse_instant_ns", "parse_time_ns"]

UNIT_NS = {"D": 86_400 * 10**9, "s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}

_INSTANT = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})"
    r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?)?"
    r"\s*(Z|[+-]\d{2}(?::?\d{2})?)?$"
)
_TIME = re.compile(r"^(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?$")
_EPOCH = _dt.date(1970, 1, 1).toordinal()


def _frac_ns(frac: str | None) -> int:
    return int((frac or "").ljust(9, "0")) if frac else 0


def _offset_seconds(text: str) -> int:
    if text == "Z":
        return 0
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:4] or 0)
    if hours > 23 or minutes > 59:
        raise ValueError(f"bad UTC offset {text!r}")
    return sign * (hours * 3600 + minutes * 60)


def _zone_offset_seconds(tz: str, naive: _dt.datetime) -> int:
    """UTC offset of zone ``tz`` (a name such as 'Europe/Paris' or a fixed '+01:00') at local time ``naive``."""
    if tz.upper() in ("UTC", "Z", "ETC/UTC", "GMT"):
        return 0
    if tz[:1] in "+-":
        return _offset_seconds(tz)
    import zoneinfo

    try:
        zone = zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"the column's time zone {tz!r} is not known to this Python (zoneinfo)") from None
    offset = naive.replace(tzinfo=zone).utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0


def parse_instant_ns(text: str, tz: str | None) -> int:
    """Nanoseconds since 1970-01-01 UTC of ``text``; ValueError with a reason when it is not one."""
    m = _INSTANT.match(text.strip())
    if not m:
        raise ValueError("not an ISO date or date-time (YYYY-MM-DD[ HH:MM[:SS[.fraction]]][Z|+HH:MM])")
    year, month, day, hh, mm, ss, frac, off = m.groups()
    naive = _dt.datetime(int(year), int(month), int(day), int(hh or 0), int(mm or 0), int(ss or 0))
    days = naive.toordinal() - _EPOCH
    seconds = days * 86_400 + naive.hour * 3600 + naive.minute * 60 + naive.second
    if off is not None:
        if tz is None:
            raise ValueError("it has a UTC offset, but the column is a timestamp without time zone")
        seconds -= _offset_seconds(off)
    elif tz is not None:
        seconds -= _zone_offset_seconds(tz, naive)
    return seconds * 10**9 + _frac_ns(frac)


def parse_time_ns(text: str) -> int:
    """Nanoseconds since midnight of ``'HH:MM[:SS[.fraction]]'``."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError("not an ISO time of day (HH:MM[:SS[.fraction]])")
    hh, mm, ss, frac = m.groups()
    t = _dt.time(int(hh), int(mm), int(ss or 0))  # validates the ranges
    return (t.hour * 3600 + t.minute * 60 + t.second) * 10**9 + _frac_ns(frac)
