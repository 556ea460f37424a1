"""Parser for ``where`` expressions: precedence climbing (Pratt) over the tokens of :mod:`._lexer`.

Operator precedence follows PostgreSQL, loosest first::

    OR  <  AND  <  NOT  <  IS [NOT] NULL  <  comparisons (= == != <> < <= > >=, not chainable)
        <  [NOT] BETWEEN / IN / LIKE / ILIKE  <  + -  <  * / %  <  ^ **  <  unary - +

``^`` and ``**`` are the same operator, left-associative, and bind looser than unary minus, as
PostgreSQL's ``^`` does: ``-2^2`` is 4 and ``2^3^2`` is 64.

The parser never recurses deeper than :data:`MAX_DEPTH` levels and the tree it builds is no deeper
than that either, so every later pass (type check, evaluators, code generation) can recurse freely.
``and``/``or`` chains become one n-ary node, so long lists of conditions stay shallow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ExpressionError
from ._lexer import Token, tokenize

__all__ = ["parse", "Node", "MAX_DEPTH", "MAX_NODES", "FUNCTIONS"]

MAX_DEPTH = 100
MAX_NODES = 10_000
FUNCTIONS = ("abs", "ceil", "exp", "floor", "log", "sqrt")

_OR, _AND, _NOT, _IS, _CMP, _LIKE, _ADD, _MUL, _POW, _UNARY = 10, 20, 30, 40, 50, 60, 70, 80, 90, 100
_CMP_OPS = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_ARITH = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL, "%": _MUL, "^": _POW, "**": _POW}


@dataclass(frozen=True, eq=False)
class Node:
    """One node of the syntax tree.

    ``kind`` is one of: ``col`` (value: name), ``lit`` (value: int/float/str/bool/None), ``neg``,
    ``not``, ``arith`` (op: + - * / % ^), ``cmp`` (op: = != < <= > >=), ``and``/``or`` (n-ary),
    ``between`` (args: x, lo, hi), ``in`` (args: x, item...), ``isnull``, ``like``/``ilike`` (args:
    x, pattern literal), ``call`` (value: function name). ``negated`` marks NOT BETWEEN / NOT IN /
    IS NOT NULL / NOT LIKE.
    """

    kind: str
    pos: int
    text: str  # the token that introduced the node, for messages
    args: tuple[Node, ...] = ()
    value: object = None
    op: str = ""
    negated: bool = False
    depth: int = field(default=1)

    def where(self) -> str:
        return f"{self.text!r} at position {self.pos}"


class _Parser:
    def __init__(self, text: str):
        self.tokens = tokenize(text)
        self.i = 0
        self.nesting = 0
        self.nodes = 0

    # -- helpers ----------------------------------------------------------------------------------

    def peek(self, k: int = 0) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def take(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at_kw(self, word: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok.kind == "kw" and tok.value == word

    def at_op(self, op: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.value == op

    def expect_op(self, op: str, context: str) -> Token:
        tok = self.peek()
        if not (tok.kind == "op" and tok.value == op):
            raise ExpressionError(f"expected {op!r} {context}, found {tok.describe()}", tok.pos)
        return self.take()

    def node(self, kind: str, tok: Token, args: tuple[Node, ...] = (), **kw: object) -> Node:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ExpressionError(f"the where expression has more than {MAX_NODES:,} terms", tok.pos)
        depth = 1 + max((a.depth for a in args), default=0)
        if depth > MAX_DEPTH:
            raise ExpressionError(
                f"the where expression nests more than {MAX_DEPTH} levels deep (at {tok.text!r}, "
                f"position {tok.pos}); split it or use IN (...) for long lists",
                tok.pos,
            )
        return Node(kind, tok.pos, tok.text, args, depth=depth, **kw)  # type: ignore[arg-type]

    # -- grammar ----------------------------------------------------------------------------------

    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise ExpressionError("the where expression is empty", 0)
        tree = self.expr(0)
        tok = self.peek()
        if tok.kind != "end":
            if tok.kind == "op" and tok.value == ")":
                raise ExpressionError(f"unbalanced parenthesis: {tok.describe()} closes nothing", tok.pos)
            raise ExpressionError(f"unexpected {tok.describe()} after a complete expression", tok.pos)
        return tree

    def expr(self, min_bp: int) -> Node:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            tok = self.peek()
            raise ExpressionError(
                f"the where expression nests more than {MAX_DEPTH} levels deep (at {tok.describe()})", tok.pos
            )
        try:
            left = self.prefix()
            while True:
                left, done = self.infix(left, min_bp)
                if done:
                    return left
        finally:
            self.nesting -= 1

    def prefix(self) -> Node:
        tok = self.peek()
        if tok.kind == "end":
            raise ExpressionError("the where expression ends where a value was expected", tok.pos)
        if tok.kind == "num" or tok.kind == "str":
            self.take()
            return self.node("lit", tok, value=tok.value)
        if tok.kind == "kw":
            if tok.value in ("true", "false"):
                self.take()
                return self.node("lit", tok, value=tok.value == "true")
            if tok.value == "null":
                self.take()
                return self.node("lit", tok, value=None)
            if tok.value == "not":
                self.take()
                return self.node("not", tok, (self.expr(_NOT),))
            raise ExpressionError(f"expected a value, found the keyword {tok.describe()}", tok.pos)
        if tok.kind == "ident":
            self.take()
            if self.at_op("("):
                return self.call(tok)
            return self.node("col", tok, value=tok.value)
        if tok.kind == "op":
            if tok.value == "(":
                self.take()
                inner = self.expr(0)
                if not self.at_op(")"):
                    nxt = self.peek()
                    raise ExpressionError(
                        f"unbalanced parenthesis: the '(' at position {tok.pos} is not closed (found {nxt.describe()})",
                        tok.pos,
                    )
                self.take()
                return inner
            if tok.value in ("-", "+"):
                self.take()
                operand = self.expr(_UNARY)
                if tok.value == "+":
                    return operand
                if (
                    operand.kind == "lit"
                    and isinstance(operand.value, (int, float))
                    and not isinstance(operand.value, bool)
                ):
                    # fold "-5" into a literal so that -9223372036854775808 is in range
                    return self.node("lit", tok, value=-operand.value)
                return self.node("neg", tok, (operand,))
        raise ExpressionError(f"expected a value, found {tok.describe()}", tok.pos)

    def call(self, name: Token) -> Node:
        fname = str(name.value).lower()
        if fname not in FUNCTIONS:
            raise ExpressionError(
                f"unknown function {name.text!r} at position {name.pos}; the functions are {', '.join(FUNCTIONS)}",
                name.pos,
            )
        self.take()  # "("
        args = [self.expr(0)]
        while self.at_op(","):
            self.take()
            args.append(self.expr(0))
        self.expect_op(")", f"to close the call of {fname}() at position {name.pos}")
        if len(args) != 1:
            raise ExpressionError(
                f"function {fname}() at position {name.pos} takes 1 argument, got {len(args)}", name.pos
            )
        return self.node("call", name, tuple(args), value=fname)

    def infix(self, left: Node, min_bp: int) -> tuple[Node, bool]:
        """Extend ``left`` by one infix/postfix operator binding tighter than ``min_bp``; (node, done)."""
        tok = self.peek()
        if tok.kind == "op" and tok.value in _ARITH:
            bp = _ARITH[str(tok.value)]
            if bp <= min_bp:
                return left, True
            self.take()
            right = self.expr(bp)
            op = "^" if tok.value == "**" else str(tok.value)
            return self.node("arith", tok, (left, right), op=op), False
        if tok.kind == "op" and tok.value in _CMP_OPS:
            if _CMP <= min_bp:
                return left, True
            self.take()
            right = self.expr(_CMP)
            nxt = self.peek()
            if nxt.kind == "op" and nxt.value in _CMP_OPS:
                raise ExpressionError(
                    f"comparisons cannot be chained: {nxt.describe()} follows the comparison at position "
                    f"{tok.pos}; use AND (or BETWEEN)",
                    nxt.pos,
                )
            return self.node("cmp", tok, (left, right), op=_CMP_OPS[str(tok.value)]), False
        if tok.kind != "kw":
            return left, True
        word = tok.value
        if word in ("and", "or"):
            bp = _AND if word == "and" else _OR
            if bp <= min_bp:
                return left, True
            items = [left]
            while self.at_kw(str(word)):
                self.take()
                items.append(self.expr(bp))
            return self.node(str(word), tok, tuple(items)), False
        if word == "is":
            if _IS <= min_bp:
                return left, True
            self.take()
            negated = self.at_kw("not")
            if negated:
                self.take()
            if not self.at_kw("null"):
                raise ExpressionError(f"expected NULL after {tok.describe()}, found {self.peek().describe()}", tok.pos)
            self.take()
            return self.node("isnull", tok, (left,), negated=negated), False
        negated = False
        op_tok = tok
        if word == "not" and self.peek(1).kind == "kw" and self.peek(1).value in ("between", "in", "like", "ilike"):
            negated = True
            op_tok = self.peek(1)
        elif word not in ("between", "in", "like", "ilike"):
            return left, True
        if _LIKE <= min_bp:
            return left, True
        self.take()
        if negated:
            self.take()
        kind = str(op_tok.value)
        if kind == "between":
            lo = self.expr(_LIKE)
            if not self.at_kw("and"):
                raise ExpressionError(
                    f"expected AND in the BETWEEN at position {op_tok.pos}, found {self.peek().describe()}", op_tok.pos
                )
            self.take()
            hi = self.expr(_LIKE)
            return self.node("between", op_tok, (left, lo, hi), negated=negated), False
        if kind == "in":
            self.expect_op("(", f"after IN at position {op_tok.pos}")
            items = [self.expr(0)]
            while self.at_op(","):
                self.take()
                items.append(self.expr(0))
            self.expect_op(")", f"to close the IN list opened at position {op_tok.pos}")
            return self.node("in", op_tok, (left, *items), negated=negated), False
        pat = self.peek()
        if pat.kind != "str":
            raise ExpressionError(
                f"{kind.upper()} at position {op_tok.pos} needs a string literal pattern, found {pat.describe()}",
                pat.pos,
            )
        self.take()
        pattern = self.node("lit", pat, value=pat.value)
        return self.node(kind, op_tok, (left, pattern), negated=negated), False


def parse(text: str) -> Node:
    """Parse ``text`` into a syntax tree or raise :class:`ExpressionError` naming the bad token."""
    return _Parser(text).parse()
