"""The typed tree the type checker produces and every backend consumes (NumPy, CUDA, pruning).

Every node has a value ``kind``:

- ``bool``; ``int`` (int64: all signed and unsigned integer columns up to 32 bits, int64, and the
  integer storage of temporal columns); ``uint`` (uint64 columns); ``float`` (float64); ``str``.

Conversions are explicit nodes (``tofloat``, ``toint``), so a backend never guesses a promotion.
Operations (``op``):

=============================  ==========================================================
``col``                        a column; ``value`` is its name, ``dtype`` its storage dtype
``const``                      a literal; ``value`` is None for NULL (str literals as bytes)
``neg abs floor ceil``         unary numeric, same kind (int arithmetic wraps like int64)
``sqrt exp log square``        unary to float (``square`` is x*x: ``x^2`` exactly)
``tofloat toint``              int/uint -> float64, uint64 -> int64 (two's complement)
``add sub mul mod``            int or float; ``mod`` takes the dividend's sign; by 0 -> NULL
``div pow``                    float; ``div`` by 0 -> NULL
``eq ne lt le gt ge``          comparisons; operands of one kind, or int with uint (exact)
``and or not``                 Kleene logic; ``and``/``or`` are n-ary
``isnull notnull``             never NULL
``like``                       ``value`` is the compiled pattern, ``icase`` the ASCII case fold
=============================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Expr", "LIT", "ONE", "ANY"]

# LIKE pattern pieces: (LIT, bytes) a run of literal bytes, (ONE, b"") one character, (ANY, b"") "%".
LIT, ONE, ANY = 0, 1, 2


@dataclass(frozen=True, eq=False)
class Expr:
    op: str
    kind: str
    args: tuple[Expr, ...] = ()
    value: object = None
    dtype: str = ""  # storage dtype of a column (numpy name), "" otherwise
    icase: bool = False

    @property
    def is_null(self) -> bool:
        return self.op == "const" and self.value is None


def const(value: object, kind: str) -> Expr:
    return Expr("const", kind, value=value)
