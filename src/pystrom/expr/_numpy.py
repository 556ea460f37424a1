"""The CPU evaluator: the typed tree computed with NumPy (strings with pyarrow.compute), column at a time.

It is also the twin the GPU kernel is tested against, so every rule here (wrapping int64
arithmetic, NULL for a zero divisor, exact int64/uint64 comparisons, Kleene logic) is spelled out
once in plain array code. A value is a pair ``(values, valid)``; ``valid`` is None when every row
is valid, otherwise a bool array or scalar.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._ir import ANY, LIT, ONE, Expr

__all__ = ["evaluate", "evaluate_value", "like_arrow"]

_DT = {"int": np.int64, "uint": np.uint64, "float": np.float64, "bool": np.bool_}
_CMP = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "pow": np.power}
_FLIP = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
_UNARY = {"neg": np.negative, "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "sqrt": np.sqrt, "exp": np.exp,
          "log": np.log}  # fmt: skip


def _regex_literal(text: str) -> str:
    # RE2 reads \x{HH} as that character: safe for every ASCII punctuation and control character
    return "".join(c if c.isalnum() or ord(c) > 127 else f"\\x{{{ord(c):02x}}}" for c in text)


def like_arrow(arr: Any, pieces: tuple[tuple[int, bytes], ...]) -> Any:
    """pyarrow BooleanArray: ``arr`` LIKE the compiled pattern (case-sensitive; the caller folds for ILIKE).

    The common shapes go to pyarrow's substring kernels, the rest to an RE2 regex that this module
    writes itself: pyarrow's own LIKE translation mishandles a pattern ending in an escaped
    backslash (``'%\\\\'`` matches nothing in pyarrow 26), and the GPU matcher follows SQL.
    """
    import pyarrow.compute as pc

    shape = tuple(k for k, _ in pieces)
    lits = [b.decode("utf-8") for k, b in pieces if k == LIT]
    if shape == (ANY, LIT, ANY):
        return pc.match_substring(arr, lits[0])
    if shape == (LIT, ANY):
        return pc.starts_with(arr, lits[0])
    if shape == (ANY, LIT):
        return pc.ends_with(arr, lits[0])
    parts = []
    for kind, data in pieces:
        parts.append(".*" if kind == ANY else "." if kind == ONE else _regex_literal(data.decode("utf-8")))
    return pc.match_substring_regex(arr, "(?s)^" + "".join(parts) + "$")


def _and_valid(*valids: Any) -> Any:
    out = None
    for v in valids:
        if v is None:
            continue
        out = v if out is None else (out & v)
    return out


class _Evaluator:
    def __init__(self, table: Any):
        self.table = table
        self.n = table.num_rows
        self.cache: dict[str, tuple[Any, Any]] = {}
        # Arrays this evaluator made and nothing else holds: each node's value feeds exactly one
        # parent, so the parent may write its result over it (saves an allocation per operator).
        # Held by reference, not only by id, so that no other array can reuse a freed one's id.
        self.temps: dict[int, np.ndarray] = {}

    def out(self, *arrays: Any) -> Any:
        for a in arrays:
            if isinstance(a, np.ndarray) and self.temps.get(id(a)) is a and a.shape == (self.n,):
                del self.temps[id(a)]
                return a
        return None

    def temp(self, a: Any) -> Any:
        if isinstance(a, np.ndarray):
            self.temps[id(a)] = a
        return a

    def column(self, e: Expr) -> tuple[Any, Any]:
        name = str(e.value)
        if name in self.cache:
            return self.cache[name]
        col = self.table.column(name)
        valid = col.is_valid() if col.validity is not None else None
        if e.kind == "str":
            import pyarrow as pa

            offsets = np.ascontiguousarray(col._offsets_in_bounds())  # a checked copy where others may write
            data = col.data
            arr = pa.StringArray.from_buffers(self.n, pa.py_buffer(offsets), pa.py_buffer(data))
            out: tuple[Any, Any] = (arr, valid)
        elif e.kind == "bool":
            out = (col.values.view(np.uint8) != 0, valid)
        else:
            out = (col.values.astype(_DT[e.kind], copy=False), valid)
        self.cache[name] = out
        return out

    def run(self, e: Expr) -> tuple[Any, Any]:
        op = e.op
        if op == "col":
            return self.column(e)
        if op == "const":
            if e.value is None:
                return (_DT.get(e.kind, np.bool_)(0) if e.kind != "str" else b"", np.False_)
            return (e.value if e.kind == "str" else _DT[e.kind](e.value), None)
        if op in ("and", "or"):
            return self.logic(op, [self.run(a) for a in e.args])
        if op == "not":
            v, ok = self.run(e.args[0])
            return (~v, ok)
        if op in ("isnull", "notnull"):
            _, ok = self.run(e.args[0])
            isnull = np.False_ if ok is None else ~ok
            return (isnull if op == "isnull" else ~isnull, None)
        if op == "like":
            return self.like(e)
        if op in _CMP:
            return self.compare(e)
        if op in ("tofloat", "toint"):
            v, ok = self.run(e.args[0])
            return (np.asarray(v).astype(np.float64 if op == "tofloat" else np.int64), ok)
        if op in _UNARY:
            v, ok = self.run(e.args[0])
            return (self.temp(_UNARY[op](v, out=self.out(v))), ok)
        if op == "square":
            v, ok = self.run(e.args[0])
            return (self.temp(np.multiply(v, v, out=self.out(v))), ok)
        (a, oka), (b, okb) = self.run(e.args[0]), self.run(e.args[1])
        ok = _and_valid(oka, okb)
        if op in _BINARY:
            if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype != b.dtype:
                raise AssertionError("the type checker makes both operands one kind")  # pragma: no cover
            return (self.temp(_BINARY[op](a, b, out=self.out(a, b))), ok)
        if op == "div":
            zero = b == 0
            return (a / np.where(zero, 1, b), _and_valid(ok, ~zero))
        if op == "mod":
            zero = b == 0
            if e.kind == "int":  # INT64_MIN % -1 would trap in C: its result is 0
                safe = np.where(zero | (b == -1), 1, b)
                return (np.where(b == -1, 0, np.fmod(a, safe)), _and_valid(ok, ~zero))
            return (np.fmod(a, np.where(zero, 1, b)), _and_valid(ok, ~zero))
        raise AssertionError(f"unknown operation {op}")  # pragma: no cover

    def logic(self, op: str, items: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        # Kleene: AND is false if any operand is false, true if all are true, else NULL (OR dually).
        decided_any = np.False_  # some operand is a known false (AND) / known true (OR)
        all_known = np.True_
        for v, ok in items:
            known = np.True_ if ok is None else ok
            hit = known & (~v if op == "and" else v)
            decided_any = decided_any | hit
            all_known = all_known & known
        valid = decided_any | all_known
        value = ~decided_any if op == "and" else decided_any
        return (value, valid)

    def compare(self, e: Expr) -> tuple[Any, Any]:
        (a, oka), (b, okb) = self.run(e.args[0]), self.run(e.args[1])
        ok = _and_valid(oka, okb)
        ka, kb = e.args[0].kind, e.args[1].kind
        if ka == "str":
            return (self.str_equal(a, b, e.op == "eq"), ok)
        if ka != kb and {ka, kb} == {"int", "uint"}:
            op = e.op
            if ka == "int":  # put the uint64 operand first
                a, b, op = b, a, _FLIP[op]
            neg = b < 0
            as_u = _CMP[op](a, np.where(neg, 0, b).astype(np.uint64))
            # a negative int64 is below every uint64: the comparison holds as "a > b" would
            return (np.where(neg, op in ("ne", "gt", "ge"), as_u), ok)
        return (_CMP[e.op](a, b), ok)

    def str_equal(self, a: Any, b: Any, eq: bool) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(a, bytes):
            a, b = b, a
        rhs = pa.scalar(b.decode("utf-8"), pa.string()) if isinstance(b, bytes) else b
        res = pc.equal(a, rhs)
        out = res.fill_null(False).to_numpy(zero_copy_only=False)
        return out if eq else ~out

    def like(self, e: Expr) -> tuple[Any, Any]:
        import pyarrow as pa

        arr, ok = self.run(e.args[0])
        if e.icase:  # ASCII case fold of the data, the same as the GPU's (pyarrow's would fold Unicode)
            offsets = np.ascontiguousarray(self.table.column(str(e.args[0].value))._offsets_in_bounds())
            data = np.array(self.table.column(str(e.args[0].value)).data, copy=True)
            upper = (data >= 65) & (data <= 90)
            data[upper] += 32
            arr = pa.StringArray.from_buffers(self.n, pa.py_buffer(offsets), pa.py_buffer(data))
        pieces = e.value
        if e.icase:
            pieces = tuple((k, bytes(c + 32 if 65 <= c <= 90 else c for c in b)) for k, b in pieces)  # type: ignore[union-attr]
        res = like_arrow(arr, pieces).fill_null(False).to_numpy(zero_copy_only=False)  # type: ignore[arg-type]
        return (res, ok)


def evaluate(expr: Expr, table: Any) -> np.ndarray:
    """Bool mask of the rows of ``table`` (CPU) where ``expr`` is TRUE (NULL counts as not true)."""
    ev = _Evaluator(table)
    with np.errstate(all="ignore"):
        value, valid = ev.run(expr)
        mask = value if valid is None else (value & valid)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (ev.n,):  # a predicate on constants only
        mask = np.full(ev.n, bool(mask))
    return mask


def evaluate_value(expr: Expr, table: Any, out: np.ndarray) -> np.ndarray | None:
    """Write the value of ``expr`` for every row of ``table`` (CPU) into ``out`` (a 1-D array of the
    result's dtype: bool, int64, uint64 or float64); return the validity (bool array), or None when
    no row is NULL. NULL rows hold 0 (False) in ``out``, as the GPU kernel writes them."""
    ev = _Evaluator(table)
    n = ev.n
    with np.errstate(all="ignore"):
        value, valid = ev.run(expr)
        out[...] = value  # broadcasts constants
        if valid is None:
            return None
        valid = np.broadcast_to(np.asarray(valid, dtype=bool), (n,))
        if valid.all():
            return None
        valid = np.array(valid, dtype=bool)
        out[~valid] = 0
    return valid
