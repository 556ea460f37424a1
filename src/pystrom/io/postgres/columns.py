"""What is known of a PostgreSQL result column once described (:class:`PgColumn`), and the columns its
COPY carries: a range or composite read as a struct is carried as its parts, each a column of its own
(:func:`leaf_columns`), written into the SELECT by :func:`part_items`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..._types import ColumnType
from .statement import cast_item

__all__ = ["PgColumn", "STRUCT_KIND", "PG_TYPE_KEY", "leaf_columns", "field_of", "part_items", "part_sql",
           "flattened", "quoted"]  # fmt: skip


@dataclass(frozen=True)
class PgColumn:
    name: str
    pg_type: str  # as PostgreSQL spells it, for messages
    kind: int
    type: ColumnType
    scale: int = 0
    text_cast: bool = False  # read as its text in the SELECT (statement.cast_item)
    dim: int = 0  # elements of a pgvector vector/halfvec column, or d of an array read as fixed_size_list
    lengths_open: bool = False  # an array column whose list/fixed_size_list choice waits for the rows
    # A range or composite read as a struct: its fields, then its validity (a bool, last); each part's
    # ``part_of`` says how its SQL follows from the struct's (part_sql). Only leaves reach the decoders.
    parts: tuple[PgColumn, ...] = ()
    part_of: tuple[str, str] | None = None  # ("call", function) or ("field", name)
    text_array: int = 0  # text[] and the like: their element type's OID; read as binary, then made list<string>
    flatten: bool = False  # a multi-dimensional array: read flattened (ARRAY(SELECT unnest(c))), held with its shape


STRUCT_KIND = -1  # the kind of a struct column: never decoded itself (its leaves are)
PG_TYPE_KEY = b"pystrom.pg_type"  # field metadata of a struct read from a range or composite: its type


def leaf_columns(cols: Sequence[PgColumn]) -> list[PgColumn]:
    """The columns the COPY carries, in order: each struct's parts in its place (recursively), each
    named by its path so that no two are alike (the struct takes the names back: assemble.fold_structs)."""
    out: list[PgColumn] = []
    for c in cols:
        if c.parts:
            out.extend(leaf_columns([replace(p, name=f"{c.name}\x00{i}") for i, p in enumerate(c.parts)]))
        else:
            out.append(c)
    return out


def field_of(col: PgColumn) -> Any:
    """The Arrow field of a read column; a struct read from a range or composite says which in its metadata."""
    import pyarrow as pa

    metadata = {PG_TYPE_KEY: col.pg_type.encode()} if col.parts else None
    return pa.field(col.name, col.type.arrow, nullable=True, metadata=metadata)


def part_items(col: PgColumn, expr: Any, alias: list[int]) -> list[Any]:
    """The select items of ``col``'s leaves, ``expr`` being ``col``'s SQL; aliases numbered by ``alias``."""
    from psycopg import sql

    if not col.parts:
        alias[0] += 1
        name = f"_pystrom_{alias[0]}"
        return [cast_item(expr, name) if col.text_cast else sql.SQL("{} AS {}").format(expr, sql.Identifier(name))]
    return [item for p in col.parts for item in part_items(p, part_sql(p.part_of, expr), alias)]


def flattened(expr: Any, name: str) -> Any:
    """A multi-dimensional array as the one-dimensional array of its elements in storage order (NULL stays NULL)."""
    from psycopg import sql

    return sql.SQL("CASE WHEN {e} IS NOT NULL THEN ARRAY(SELECT unnest({e})) END AS {n}").format(
        e=expr, n=sql.Identifier(name)
    )


def part_sql(part_of: tuple[str, str], expr: Any) -> Any:
    from psycopg import sql

    how, what = part_of
    if how == "field":
        return sql.SQL("({}).{}").format(expr, sql.Identifier(what))
    return sql.SQL(what + "({})").format(expr)  # what: one of this module's function names, never user text


# One-dimensional arrays the decoders read: array type OID -> (kind, element type). Any lower bound.

_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")


def quoted(name: str) -> str:
    """``name`` as an SQL identifier in a hint: bare when PostgreSQL reads it back unchanged (lower case
    letters, digits, underscores), else in double quotes (``"Weird Col"``). Keywords are quoted too."""
    if _PLAIN_IDENTIFIER.fullmatch(name) and name not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


# Reserved words a bare column name cannot be (PostgreSQL's reserved keywords, appendix C).
_KEYWORDS = frozenset(
    "all analyse analyze and any array as asc asymmetric both case cast check collate column constraint create "
    "current_catalog current_date current_role current_time current_timestamp current_user default deferrable "
    "desc distinct do else end except false fetch for foreign from grant group having in initially intersect "
    "into lateral leading limit localtime localtimestamp not null offset on only or order placing primary "
    "references returning select session_user some symmetric system_user table then to trailing true union "
    "unique user using variadic when where window with".split()
)
