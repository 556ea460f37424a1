"""Tokenizer for ``where`` expressions: a hand-written scanner, one pass, positions kept for messages."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ExpressionError

__all__ = ["Token", "tokenize", "MAX_TEXT"]

# Longer texts are refused before any work: a predicate is typed by a person or built by a program,
# and neither needs 100 kB; the limit keeps hostile input from costing time or memory.
MAX_TEXT = 100_000

KEYWORDS = frozenset({"and", "or", "not", "between", "in", "is", "null", "true", "false", "like", "ilike"})

# Longest first, so that "<=" is not read as "<" then "=".
_OPERATORS = ("**", "<=", ">=", "<>", "!=", "==", "+", "-", "*", "/", "%", "^", "<", ">", "=", "(", ")", ",")


@dataclass(frozen=True)
class Token:
    kind: str  # "num", "str", "ident" (a column), "kw" (keyword, lower case), "op", "end"
    value: object  # int/float for num, str for str/ident/kw/op
    pos: int  # character offset of the token's first character
    text: str  # the token as written, for messages

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the expression"
        return f"{self.text!r} at position {self.pos}"


_DIGITS = frozenset("0123456789")


def _is_digit(ch: str) -> bool:
    return ch in _DIGITS  # str.isdigit() also accepts "²", which int() refuses


def _is_ident_start(ch: str) -> bool:
    return ch == "_" or ch.isalpha()


def _is_ident_part(ch: str) -> bool:
    return ch == "_" or ch.isalnum()


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens; raise :class:`ExpressionError` naming the bad character and its position."""
    if not isinstance(text, str):
        raise ExpressionError(f"a where expression must be a str, not {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise ExpressionError(f"the where expression is {len(text):,} characters long; the limit is {MAX_TEXT:,}")
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        start = i
        if _is_digit(ch) or (ch == "." and i + 1 < n and _is_digit(text[i + 1])):
            i = _scan_number(text, i)
            raw = text[start:i]
            if i < n and _is_ident_part(text[i]):
                raise ExpressionError(f"malformed number {text[start : i + 1]!r} at position {start}", start)
            is_float = any(c in raw for c in ".eE")
            tokens.append(Token("num", float(raw) if is_float else int(raw), start, raw))
        elif ch == "'":
            value, i = _scan_quoted(text, i, "'", "string literal")
            tokens.append(Token("str", value, start, text[start:i]))
        elif ch == '"':
            value, i = _scan_quoted(text, i, '"', "quoted column name")
            if not value:
                raise ExpressionError(f'empty quoted column name "" at position {start}', start)
            tokens.append(Token("ident", value, start, text[start:i]))
        elif _is_ident_start(ch):
            while i < n and _is_ident_part(text[i]):
                i += 1
            word = text[start:i]
            lower = word.lower()
            if lower in KEYWORDS:
                tokens.append(Token("kw", lower, start, word))
            else:
                tokens.append(Token("ident", word, start, word))
        else:
            for op in _OPERATORS:
                if text.startswith(op, i):
                    i += len(op)
                    tokens.append(Token("op", op, start, op))
                    break
            else:
                raise ExpressionError(f"unexpected character {ch!r} at position {start}", start)
    tokens.append(Token("end", None, n, ""))
    return tokens


def _scan_number(text: str, i: int) -> int:
    n = len(text)
    while i < n and _is_digit(text[i]):
        i += 1
    if i < n and text[i] == ".":
        i += 1
        while i < n and _is_digit(text[i]):
            i += 1
    if i < n and text[i] in "eE":
        j = i + 1
        if j < n and text[j] in "+-":
            j += 1
        if j < n and _is_digit(text[j]):
            while j < n and _is_digit(text[j]):
                j += 1
            i = j
    return i


def _scan_quoted(text: str, i: int, quote: str, what: str) -> tuple[str, int]:
    """Read a quoted token starting at ``text[i] == quote``; a doubled quote stands for one (SQL)."""
    start = i
    i += 1
    parts = []
    n = len(text)
    while True:
        j = text.find(quote, i)
        if j < 0:
            raise ExpressionError(f"unterminated {what} starting at position {start}", start)
        parts.append(text[i:j])
        if j + 1 < n and text[j + 1] == quote:
            parts.append(quote)
            i = j + 2
            continue
        return "".join(parts), j + 1
