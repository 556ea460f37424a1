"""The GPU evaluator: the typed tree turned into ONE fused CUDA kernel (one thread per row, grid-stride).

Code generation lives here; the hand-written device helpers (int64 wrapping arithmetic, the LIKE
matcher, float16 decoding) live in ``kernels/where.cu``, and the kernel loader compiles the two as
one source, memoised by its text. :class:`CudaProgram` is built once per predicate (the source
depends only on the predicate and the schema's storage types), never per call.

Every value is a pair of C variables, the value and a NULL flag; AND/OR skip their remaining
operands once the answer is known, so an expensive LIKE after a cheap failed test costs nothing.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ._ir import LIT, ONE, Expr

__all__ = ["CudaProgram", "CudaColumnsProgram", "FUNCTION", "COLUMNS_FUNCTION"]

FUNCTION = "pystrom_where"
COLUMNS_FUNCTION = "pystrom_columns"
# No fused multiply-add: a*b + c must round the product as NumPy does, or the GPU's answer to
# "sqrt(dx*dx + dy*dy) < 10" could differ from the CPU's in the last bit, and so at the boundary.
OPTIONS = ("--std=c++17", "--fmad=false")

_CTYPE = {"int8": "signed char", "int16": "short", "int32": "int", "int64": "long long", "uint8": "unsigned char",
          "uint16": "unsigned short", "uint32": "unsigned int", "uint64": "unsigned long long", "float16":
          "unsigned short", "float32": "float", "float64": "double", "bool": "unsigned char"}  # fmt: skip
_VTYPE = {"int": "long long", "uint": "unsigned long long", "float": "double", "bool": "bool"}
_COP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_FLIP = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
_FLOAT_FN = {"sqrt": "sqrt", "exp": "exp", "log": "log", "floor": "floor", "ceil": "ceil", "abs": "fabs"}


def _or(*flags: str) -> str:
    live = [f for f in flags if f != "false"]
    if "true" in live:
        return "true"
    return " || ".join(f"({f})" if " " in f else f for f in live) or "false"


def _double(v: float) -> str:
    if np.isfinite(v):
        return float(v).hex()  # exact: C++17 reads hexadecimal floating literals
    bits = struct.unpack("<q", struct.pack("<d", v))[0]
    return f"__longlong_as_double({bits}LL)"


def _literal(e: Expr) -> str:
    v = e.value
    if e.kind == "bool":
        return "true" if v else "false"
    if e.kind == "float":
        return _double(float(v))  # type: ignore[arg-type]
    if e.kind == "uint":
        return f"{int(v)}ULL"  # type: ignore[call-overload]
    iv = int(v)  # type: ignore[call-overload]
    return "(-9223372036854775807LL - 1)" if iv == -(2**63) else f"{iv}LL"


class _Gen:
    def __init__(self, columns: tuple[str, ...], kinds: dict[str, tuple[str, str]]):
        self.columns = columns
        self.kinds = kinds  # name -> (kind, storage dtype)
        self.lines: list[str] = []
        self.globals: list[str] = []
        self.indent = 2
        self.count = 0

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def tmp(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def byte_array(self, data: bytes) -> str:
        name = f"k{len(self.globals)}"
        body = ", ".join(str(b) for b in data) or "0"
        self.globals.append(f"__device__ const unsigned char {name}[{max(len(data), 1)}] = {{{body}}};")
        return name

    # -- columns ----------------------------------------------------------------------------------

    def params(self) -> list[str]:
        out = []
        for k, name in enumerate(self.columns):
            kind, dtype = self.kinds[name]
            if kind == "str":
                out += [f"const int* __restrict__ c{k}_o", f"const unsigned char* __restrict__ c{k}_d"]
            else:
                out.append(f"const {_CTYPE[dtype]}* __restrict__ c{k}_v")
            out += [f"const unsigned char* __restrict__ c{k}_m", f"long long c{k}_mo"]
        return out

    def loads(self) -> None:
        for k, name in enumerate(self.columns):
            kind, dtype = self.kinds[name]
            self.emit(f"const bool c{k}n = !pw_valid(c{k}_m, c{k}_mo + i);")
            if kind == "str":
                self.emit(f"const unsigned char* c{k}s = c{k}_d + c{k}_o[i];")
                self.emit(f"const int c{k}l = c{k}_o[i + 1] - c{k}_o[i];")
            elif kind == "bool":
                self.emit(f"const bool c{k} = c{k}_v[i] != 0;")
            elif dtype == "float16":
                self.emit(f"const double c{k} = pw_half(c{k}_v[i]);")
            else:
                self.emit(f"const {_VTYPE[kind]} c{k} = ({_VTYPE[kind]})c{k}_v[i];")

    # -- expressions: each returns (value, null flag) as C expressions -------------------------------

    def gen(self, e: Expr) -> tuple[str, str]:
        op = e.op
        if op == "col":
            k = self.columns.index(str(e.value))
            return (f"c{k}", f"c{k}n")
        if op == "const":
            if e.value is None:
                return ({"float": "0.0", "bool": "false"}.get(e.kind, "0"), "true")
            return (_literal(e), "false")
        if op in ("and", "or"):
            return self.logic(e)
        if op == "not":
            v, n = self.gen(e.args[0])
            return (f"!({v})", n)
        if op in ("isnull", "notnull"):
            _, n = self.gen(e.args[0])
            return ((n if op == "isnull" else f"!({n})"), "false")
        if op == "like":
            return self.like(e)
        if op in _COP:
            return self.compare(e)
        return self.arith(e)

    def bind(self, ctype: str, value: str, null: str) -> tuple[str, str]:
        t = self.tmp()
        if null in ("true", "false"):
            self.emit(f"const {ctype} {t} = {value};")
            return (t, null)
        self.emit(f"const bool {t}n = {null};")
        self.emit(f"const {ctype} {t} = {value};")
        return (t, f"{t}n")

    def arith(self, e: Expr) -> tuple[str, str]:
        op, kind = e.op, e.kind
        ctype = _VTYPE[kind]
        if len(e.args) == 1:
            v, n = self.gen(e.args[0])
            if op == "tofloat":
                return self.bind(ctype, f"(double)({v})", n)
            if op == "toint":
                return self.bind(ctype, f"(long long)({v})", n)
            if op == "square":
                return self.bind(ctype, f"({v}) * ({v})", n)
            if kind == "int":
                return self.bind(ctype, f"pw_{op}({v})", n)  # neg, abs
            if op == "neg":
                return self.bind(ctype, f"-({v})", n)
            return self.bind(ctype, f"{_FLOAT_FN[op]}({v})", n)
        (a, na), (b, nb) = self.gen(e.args[0]), self.gen(e.args[1])
        null = _or(na, nb)
        if op in ("div", "mod"):
            zero = "0.0" if kind == "float" else "0"
            null = _or(null, f"{b} == {zero}")
            t = self.tmp()
            self.emit(f"const bool {t}n = {null};")
            if op == "div":
                expr = f"({a}) / ({b})"
            else:
                expr = f"fmod({a}, {b})" if kind == "float" else f"pw_mod({a}, {b})"
            self.emit(f"const {ctype} {t} = {t}n ? {zero} : {expr};")
            return (t, f"{t}n")
        if op == "pow":
            return self.bind(ctype, f"pow({a}, {b})", null)
        if kind == "int":
            return self.bind(ctype, f"pw_{op}({a}, {b})", null)
        sym = {"add": "+", "sub": "-", "mul": "*"}[op]
        return self.bind(ctype, f"({a}) {sym} ({b})", null)

    def compare(self, e: Expr) -> tuple[str, str]:
        x, y = e.args
        if x.kind == "str":
            s1, n1 = self.string(x)
            s2, n2 = self.string(y)
            test = f"pw_str_eq({s1[0]}, {s1[1]}, {s2[0]}, {s2[1]})"
            return self.bind("bool", test if e.op == "eq" else f"!{test}", _or(n1, n2))
        (a, na), (b, nb) = self.gen(x), self.gen(y)
        op = e.op
        if x.kind != y.kind and {x.kind, y.kind} == {"int", "uint"}:
            if x.kind == "int":
                a, b, op = b, a, _FLIP[op]
            return self.bind("bool", f"pw_cmp_ui({a}, {b}) {_COP[op]} 0", _or(na, nb))
        return self.bind("bool", f"({a}) {_COP[op]} ({b})", _or(na, nb))

    def string(self, e: Expr) -> tuple[tuple[str, str], str]:
        if e.op == "const":
            if e.value is None:
                return (("nullptr", "0"), "true")
            data = bytes(e.value)  # type: ignore[arg-type]
            return ((self.byte_array(data), str(len(data))), "false")
        k = self.columns.index(str(e.value))
        return ((f"c{k}s", f"c{k}l"), f"c{k}n")

    def like(self, e: Expr) -> tuple[str, str]:
        (s, length), n = self.string(e.args[0])
        kinds, lits = bytearray(), bytearray()
        for piece, data in e.value:  # type: ignore[attr-defined]
            if piece == LIT:
                folded = bytes(c + 32 if e.icase and 65 <= c <= 90 else c for c in data)
                kinds += bytes(len(folded))
                lits += folded
            else:
                kinds.append(1 if piece == ONE else 2)  # the codes pw_like reads (ONE, ANY)
                lits.append(0)
        kname, lname = self.byte_array(bytes(kinds)), self.byte_array(bytes(lits))
        icase = "true" if e.icase else "false"
        return self.bind("bool", f"!({n}) && pw_like({s}, {length}, {kname}, {lname}, {len(kinds)}, {icase})", n)

    def logic(self, e: Expr) -> tuple[str, str]:
        # Kleene AND: false once any operand is a known false, true when all are known true, else NULL.
        # `d` (decided) stops the evaluation of the remaining operands; `k` tracks "all known so far".
        is_and = e.op == "and"
        t = self.tmp()
        self.emit(f"bool {t}d = false, {t}k = true;")
        for idx, item in enumerate(e.args):
            self.emit("{" if idx == 0 else f"if (!{t}d) {{")
            self.indent += 1
            v, n = self.gen(item)
            hit = f"!({n}) && !({v})" if is_and else f"!({n}) && ({v})"
            self.emit(f"{t}d = {t}d || ({hit});")
            self.emit(f"{t}k = {t}k && !({n});")
            self.indent -= 1
            self.emit("}")
        value = f"!{t}d" if is_and else f"{t}d"
        return self.bind("bool", value, f"!({t}d || {t}k)")


class CudaProgram:
    """The generated kernel of one predicate: its source text and how to pass a table to it."""

    def __init__(self, expr: Expr, columns: tuple[str, ...], kinds: dict[str, tuple[str, str]]):
        gen = _Gen(columns, kinds)
        gen.loads()
        value, null = gen.gen(expr)
        gen.emit(f"out[i] = (!({null}) && ({value})) ? 1 : 0;")
        params = ", ".join(["long long n", *gen.params(), "unsigned char* __restrict__ out"])
        self.columns = columns
        self.kinds = kinds
        self.source = "\n".join(
            [
                "// Generated by pystrom.expr._cuda from a where expression; helpers: kernels/where.cu.",
                *gen.globals,
                f'extern "C" __global__ void {FUNCTION}({params}) {{',
                "  const long long stride = (long long)blockDim.x * gridDim.x;",
                "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {",
                *gen.lines,
                "  }",
                "}",
                "",
            ]
        )

    def arguments(self, table: Any, out: Any) -> tuple:
        """The kernel's arguments for ``table`` (arrays of its device) writing the mask into ``out``."""
        return (np.int64(table.num_rows), *_column_arguments(table, self.columns, self.kinds), out)

    def run(self, table: Any) -> Any:
        """The bool mask (CuPy, on the table's GPU) of rows where the predicate is TRUE."""
        from .. import kernels

        backend = table._backend
        n = table.num_rows
        with backend.activate():
            out = backend.xp.empty(n, dtype=bool)
            if n == 0:
                return out
            fn = kernels.generated(self.source, FUNCTION, backend.ordinal, ("where",), OPTIONS)
            kernels.launch_function(fn, backend.ordinal, n, self.arguments(table, out))
        return out


def _column_arguments(table: Any, columns: tuple[str, ...], kinds: dict[str, tuple[str, str]]) -> list:
    """The input columns' kernel arguments, in the order :meth:`_Gen.params` declares them.

    A column without a validity bitmap gets a null pointer (0) for it: the kernel reads that as
    "no NULLs".
    """
    args: list[Any] = []
    for name in columns:
        col = table.column(name)
        if kinds[name][0] == "str":
            args += [col._offsets_in_bounds(), col.data]  # a checked copy where another process may write
        else:
            args.append(col.values)
        validity = col.validity
        if validity is None:
            args += [np.uint64(0), np.int64(0)]
        else:
            args += [validity, np.int64(col.validity_offset)]
    return args


_OUT_CTYPE = {"int": "long long", "uint": "unsigned long long", "float": "double", "bool": "unsigned char"}


class CudaColumnsProgram:
    """The generated kernel computing several value expressions (new columns) in one pass.

    Thread i computes every expression for row i and writes its value (0 where NULL) to the
    output values buffer. Validity bitmaps are written a 32-bit word at a time: the threads of a
    warp hold 32 consecutive rows starting at a multiple of 32, and ``pw_store_valid`` (a warp
    vote, ``__ballot_sync``, in kernels/where.cu) gathers their bits. So the loop runs over
    warp-aligned bases (every lane of a warp iterates equally often and reaches the vote), and
    the word written may extend past the last row: the bitmap's 64-byte aligned span in the
    table has room for it. An output whose validity
    pointer is null (no row can be NULL) writes no bitmap.
    """

    def __init__(self, exprs: tuple[Expr, ...], columns: tuple[str, ...], kinds: dict[str, tuple[str, str]]):
        gen = _Gen(columns, kinds)
        gen.indent = 3
        gen.loads()
        results = [gen.gen(e) for e in exprs]
        body = gen.lines
        gen.lines = []
        gen.indent = 3
        outs, params = [], []
        for j, (e, (value, null)) in enumerate(zip(exprs, results)):
            ctype = _OUT_CTYPE[e.kind]
            params += [f"{ctype}* __restrict__ o{j}_v", f"unsigned int* __restrict__ o{j}_m"]
            gen.emit(f"ok{j} = !({null});")
            cast = f"(({value}) ? 1 : 0)" if e.kind == "bool" else f"({ctype})({value})"
            gen.emit(f"o{j}_v[i] = ok{j} ? {cast} : 0;")
            outs.append(f"    if (o{j}_m != nullptr) pw_store_valid(o{j}_m, base, lane, i, ok{j});")
        flags = ", ".join(f"ok{j} = false" for j in range(len(exprs)))
        all_params = ", ".join(["long long n", *gen.params(), *params])
        self.exprs = exprs
        self.columns = columns
        self.kinds = kinds
        self.source = "\n".join(
            [
                "// Generated by pystrom.expr._cuda from with_columns expressions; helpers: kernels/where.cu.",
                *gen.globals,
                f'extern "C" __global__ void {COLUMNS_FUNCTION}({all_params}) {{',
                "  const long long stride = (long long)blockDim.x * gridDim.x;",
                "  const int lane = threadIdx.x & 31;",
                "  for (long long base = (long long)blockIdx.x * blockDim.x + (threadIdx.x & ~31); base < n; "
                "base += stride) {",
                "    const long long i = base + lane;",
                f"    bool {flags};",
                "    if (i < n) {",
                *body,
                *gen.lines,
                "    }",
                *outs,
                "  }",
                "}",
                "",
            ]
        )

    def run(self, table: Any, outputs: list[tuple[Any, Any]]) -> None:
        """Compute every expression over ``table`` into ``outputs``: per expression (values array of
        its dtype, uint32 array of validity words or None), on the table's GPU."""
        from .. import kernels

        backend = table._backend
        n = table.num_rows
        if n == 0:
            return
        args: list[Any] = [np.int64(n), *_column_arguments(table, self.columns, self.kinds)]
        for values, words in outputs:
            args += [values, np.uint64(0) if words is None else words]
        with backend.activate():
            fn = kernels.generated(self.source, COLUMNS_FUNCTION, backend.ordinal, ("where",), OPTIONS)
            # one thread per row, rounded up to whole warps (the ballot needs all 32 lanes)
            kernels.launch_function(fn, backend.ordinal, (n + 31) // 32 * 32, tuple(args))
