"""Min/max pruning: could any row whose columns lie within given [min, max] ranges satisfy the predicate?

Interval arithmetic over the typed tree. Each numeric node gets an interval (lo, hi) of Python
numbers, or None when nothing is known; each condition gets the pair (can be true, can be false).
The answer must never be "no" when some row could match, so every doubtful step says "unknown":
NaN (min/max statistics leave NaN out) makes any float comparison possibly false, overflowing int64
arithmetic and divisors that may be 0 give up, transcendental functions widen their bounds by a few
ulps since the GPU's libm may round differently from Python's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._ir import LIT, Expr

__all__ = ["may_match"]

Interval = tuple[Any, Any] | None
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _widen(iv: Interval, ulps: int = 4) -> Interval:
    if iv is None:
        return None
    lo, hi = float(iv[0]), float(iv[1])
    for _ in range(ulps):
        lo, hi = math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)
    return (lo, hi)


def _exp(x: float) -> float:
    return math.exp(x) if x < 709.0 else math.inf


class _Pruner:
    def __init__(self, stats: Mapping[str, tuple[Any, Any]]):
        self.stats = stats

    def interval(self, e: Expr) -> Interval:
        op = e.op
        if op == "col":
            got = self.stats.get(str(e.value))
            lo, hi = got if got is not None else (None, None)
            if lo is None or hi is None:
                # a float column with no statistics is still a float: x*x >= 0, sqrt(x) >= 0, ...
                return (-math.inf, math.inf) if e.kind == "float" else None
            if isinstance(lo, float) and math.isnan(lo) or isinstance(hi, float) and math.isnan(hi):
                return (-math.inf, math.inf) if e.kind == "float" else None
            if e.kind == "bool":
                return (bool(lo), bool(hi))
            return (lo, hi)
        if op == "const":
            return None if e.value is None else (e.value, e.value)
        if e.kind == "str" or e.kind == "bool":
            return None
        args = [self.interval(a) for a in e.args]
        if any(a is None for a in args):
            return None
        try:
            return self.arith(e, args)
        except (OverflowError, ValueError, ZeroDivisionError):
            return None

    def arith(self, e: Expr, args: list[Any]) -> Interval:
        op = e.op
        (lo, hi) = args[0]
        if op == "tofloat":
            return (float(lo), float(hi))
        if op == "toint":
            return (lo, hi) if hi <= _INT64_MAX else None
        if op == "neg":
            return self.fit(e, (-hi, -lo))
        if op == "abs":
            if lo >= 0:
                return (lo, hi)
            if hi <= 0:
                return self.fit(e, (-hi, -lo))
            return self.fit(e, (0 * lo, max(-lo, hi)))
        if op in ("floor", "ceil"):
            f = math.floor if op == "floor" else math.ceil
            return (float(f(lo)), float(f(hi)))
        # Rows where sqrt/log give NaN never make a comparison true (and `compare` treats
        # float != and NOT conservatively), so their bounds need only cover the non-NaN results.
        if op == "sqrt":
            return None if hi < 0 else (math.sqrt(max(lo, 0.0)), math.sqrt(hi))
        if op == "exp":
            return _widen((_exp(lo), _exp(hi)))
        if op == "log":
            if hi <= 0:
                return None
            return _widen((math.log(lo) if lo > 0 else -math.inf, math.log(hi)))
        if op == "square":
            if lo >= 0:
                return (lo * lo, hi * hi)
            if hi <= 0:
                return (hi * hi, lo * lo)
            return (0.0, max(lo * lo, hi * hi))
        (lo2, hi2) = args[1]
        if op in ("add", "sub", "mul"):
            if op == "add":
                cands = (lo + lo2, hi + hi2)
            elif op == "sub":
                cands = (lo - hi2, hi - lo2)
            else:
                cands = (lo * lo2, lo * hi2, hi * lo2, hi * hi2)
            if e.kind == "float" and any(math.isnan(c) for c in cands):
                return None
            return self.fit(e, (min(cands), max(cands)))
        if op == "div":
            if lo2 <= 0 <= hi2:
                return None
            cands = (lo / lo2, lo / hi2, hi / lo2, hi / hi2)
            if any(math.isnan(c) for c in cands):
                return None
            return (min(cands), max(cands))
        return None  # mod, pow: not worth the cases

    def fit(self, e: Expr, iv: tuple[Any, Any]) -> Interval:
        if e.kind == "int" and (iv[0] < _INT64_MIN or iv[1] > _INT64_MAX):
            return None  # the kernel's int64 arithmetic would wrap
        return iv

    def cond(self, e: Expr) -> tuple[bool, bool]:
        """(may be TRUE, may be FALSE) for a condition over rows within the statistics."""
        op = e.op
        if op == "const":
            if e.value is None:
                return (False, False)
            return (bool(e.value), not e.value)
        if op == "and":
            parts = [self.cond(a) for a in e.args]
            return (all(t for t, _ in parts), any(f for _, f in parts))
        if op == "or":
            parts = [self.cond(a) for a in e.args]
            return (any(t for t, _ in parts), all(f for _, f in parts))
        if op == "not":
            t, f = self.cond(e.args[0])
            return (f, t)
        if op == "col":  # a bool column
            iv = self.interval(e)
            return (True, True) if iv is None else (bool(iv[1]), not iv[0])
        if op == "like":
            return (self.like(e), True)
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            return self.compare(e)
        return (True, True)  # isnull / notnull: statistics say nothing of NULLs

    def like(self, e: Expr) -> bool:
        pieces = e.value
        if e.icase or not pieces or pieces[0][0] != LIT:  # type: ignore[index]
            return True
        prefix = pieces[0][1].decode("utf-8")  # type: ignore[index]
        exact = len(pieces) == 1  # type: ignore[arg-type]
        iv = self.str_interval(e.args[0])
        if iv is None:
            return True
        lo, hi = iv
        if exact:
            return lo <= prefix <= hi
        k = len(prefix)
        # strings starting with `prefix` form one block in code point order; prefixes keep order
        return not (hi[:k] < prefix or lo[:k] > prefix)

    def compare(self, e: Expr) -> tuple[bool, bool]:
        a, b = e.args
        if a.kind == "str":
            ia = self.str_interval(a)
            ib = self.str_interval(b)
        else:
            ia, ib = self.interval(a), self.interval(b)
        if ia is None or ib is None:
            return (True, True)
        (lo1, hi1), (lo2, hi2) = ia, ib
        floaty = a.kind == "float" or b.kind == "float"
        op = e.op
        if op == "eq":
            t = not (hi1 < lo2 or hi2 < lo1)
            f = not (lo1 == hi1 == lo2 == hi2)
        elif op == "ne":
            f = not (hi1 < lo2 or hi2 < lo1)
            t = not (lo1 == hi1 == lo2 == hi2)
        elif op == "lt":
            t, f = lo1 < hi2, hi1 >= lo2
        elif op == "le":
            t, f = lo1 <= hi2, hi1 > lo2
        elif op == "gt":
            t, f = hi1 > lo2, lo1 <= hi2
        else:
            t, f = hi1 >= lo2, lo1 < hi2
        if floaty:  # NaN rows make every comparison false and != true
            f = True
            t = t or op == "ne"
        return (t, f)

    def str_interval(self, e: Expr) -> Interval:
        if e.op == "const":
            return None if e.value is None else (e.value.decode("utf-8"),) * 2  # type: ignore[union-attr]
        got = self.stats.get(str(e.value))
        if got is None or got[0] is None or got[1] is None:
            return None
        lo, hi = got
        try:
            lo = lo.decode("utf-8") if isinstance(lo, bytes) else lo
            hi = hi.decode("utf-8") if isinstance(hi, bytes) else hi
        except UnicodeDecodeError:
            return None
        if not (isinstance(lo, str) and isinstance(hi, str)):
            return None
        return (lo, hi)


def may_match(expr: Expr, stats: Mapping[str, tuple[Any, Any]]) -> bool:
    """False only when no row with column values inside ``stats``' ranges can make ``expr`` TRUE."""
    return _Pruner(stats).cond(expr)[0]
