"""The statement a read runs, composed with :mod:`psycopg.sql` (identifiers are never formatted into
strings): a user's query as written, or ``SELECT columns FROM table WHERE (where)`` for ``table=`` reads.
Parameters are bound on the client, since COPY takes none on the server. :mod:`.session` later wraps
the statement in ``COPY (...) TO STDOUT (FORMAT BINARY)``, once per partition range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import InvalidArgumentError

__all__ = ["Plan", "compose"]


@dataclass
class Plan:
    select: Any  # psycopg.sql.Composable: the SELECT without partition predicates
    table: Any = None  # psycopg.sql.Identifier of the relation (table= reads)
    columns: Any = None  # composed column list
    where: Any = None  # composed user predicate or None


def _identifier(table: Any) -> Any:
    from psycopg import sql

    if isinstance(table, str):
        if not table:
            raise InvalidArgumentError("table must be a non-empty name")
        return sql.Identifier(table)
    if isinstance(table, (tuple, list)) and 1 <= len(table) <= 3 and all(isinstance(p, str) and p for p in table):
        return sql.Identifier(*table)
    raise InvalidArgumentError(
        f"table must be a name (taken literally, quotes and dots included) or a tuple such as "
        f"('schema', 'name'); got {table!r}"
    )


def compose(conn: Any, query: Any, table: Any, columns: Any, where: Any, params: Any) -> Plan:
    """The read's SELECT from a ``query=`` or from ``table=``, ``columns=`` and ``where=``."""
    from psycopg import ClientCursor, sql

    if table is not None:
        ident = _identifier(table)
        if columns is None:
            cols = sql.SQL("*")
        else:
            if isinstance(columns, str) or not all(isinstance(c, str) and c for c in columns) or not columns:
                raise InvalidArgumentError(f"columns must be a non-empty list of column names; got {columns!r}")
            cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        pred = None
        if where is not None:
            if not isinstance(where, str) or not where.strip():
                raise InvalidArgumentError(f"where must be a SQL condition (a non-empty string); got {where!r}")
            pred = sql.SQL(where)
            if params is not None:  # bound on the client: COPY takes no server-side parameters
                pred = sql.SQL(ClientCursor(conn).mogrify(where, params))
        select = sql.SQL("SELECT {} FROM {}").format(cols, ident)
        if pred is not None:
            select = sql.SQL("{} WHERE ({})").format(select, pred)
        return Plan(select, ident, cols, pred)
    if not isinstance(query, (str, sql.Composable)):
        raise InvalidArgumentError(f"query must be a SQL string or a psycopg.sql object; got {type(query).__name__}")
    text = query if isinstance(query, str) else query.as_string(conn)
    if params is not None:
        text = ClientCursor(conn).mogrify(text, params)
    text = text.strip().rstrip(";").strip()
    if not text:
        raise InvalidArgumentError("query is empty")
    return Plan(sql.SQL(text))
