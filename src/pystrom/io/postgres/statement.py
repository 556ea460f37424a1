"""The statement a read runs, composed with :mod:`psycopg.sql` (identifiers are never formatted into
strings): a user's query as written, or ``SELECT columns FROM table WHERE (where)`` for ``table=`` reads.
Parameters are bound on the client, since COPY takes none on the server. :mod:`.session` later wraps
the statement in ``COPY (...) TO STDOUT (FORMAT BINARY)``, once per partition range.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidArgumentError

__all__ = [
    "Plan",
    "check_read_arguments",
    "check_identifier_length",
    "check_query_text",
    "compose",
    "rewrite_columns",
    "cast_item",
    "sql_name_parts",
]


@dataclass
class Plan:
    select: Any  # psycopg.sql.Composable: the SELECT without partition predicates
    table: Any = None  # psycopg.sql.Identifier of the relation (table= reads)
    columns: Any = None  # composed column list
    where: Any = None  # composed user predicate or None


# PostgreSQL keeps the first NAMEDATALEN - 1 bytes of an identifier and drops the rest with only a NOTICE.
MAX_IDENTIFIER_BYTES = 63


def check_identifier_length(name: str, what: str) -> None:
    """Refuse a name PostgreSQL would truncate (silently, to a name that may be another table's)."""
    size = len(name.encode("utf-8"))
    if size > MAX_IDENTIFIER_BYTES:
        raise InvalidArgumentError(
            f"{what} name {name!r} is {size} bytes long; PostgreSQL truncates names to {MAX_IDENTIFIER_BYTES} "
            f"bytes ({name.encode('utf-8')[:MAX_IDENTIFIER_BYTES].decode('utf-8', 'ignore')!r}): use a shorter name"
        )


def _identifier(table: Any) -> Any:
    from psycopg import sql

    if isinstance(table, str):
        if not table:
            raise InvalidArgumentError("table must be a non-empty name")
        check_identifier_length(table, "table")
        return sql.Identifier(table)
    if isinstance(table, (tuple, list)) and 1 <= len(table) <= 3 and all(isinstance(p, str) and p for p in table):
        for part in table:
            check_identifier_length(part, "table")
        return sql.Identifier(*table)
    raise InvalidArgumentError(
        f"table must be a name (taken literally, quotes and dots included) or a tuple such as "
        f"('schema', 'name'); got {table!r}"
    )


# One part of a qualified name as SQL writes it: a quoted identifier ("" for a quote) or a plain one.
_PART = r'(?:"(?:[^"]|"")+"|[^\W\d][\w$]*)'
_SQL_NAME = re.compile(rf"\s*({_PART}(?:\s*\.\s*{_PART}){{0,2}})\s*;?\s*\Z")
_PARTS = re.compile(rf"\s*({_PART})\s*(?:\.|\Z)")
# Words that are whole statements by themselves: a query of one of these is left to the server.
_STATEMENT_WORDS = {"select", "values", "table", "with", "show", "explain", "begin", "commit", "rollback", "end",
                    "abort", "checkpoint", "vacuum", "analyze", "analyse", "reset", "discard", "listen", "unlisten",
                    "load", "savepoint", "prepare", "execute", "deallocate", "fetch", "close", "move"}  # fmt: skip


def sql_name_parts(text: str) -> list[str] | None:
    """The parts of a (possibly qualified) name as PostgreSQL reads it: plain parts folded to lower
    case (ASCII, as the server folds them), quoted ones unquoted; None if ``text`` is not such a name."""
    match = _SQL_NAME.match(text)
    if match is None:
        return None
    parts = []
    for m in _PARTS.finditer(match.group(1)):
        part = m.group(1)
        if part.startswith('"'):
            parts.append(part[1:-1].replace('""', '"'))
        else:
            parts.append(part.translate(_ASCII_LOWER))
    return parts


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _table_argument(parts: list[str]) -> str:
    return f"table={parts[0]!r}" if len(parts) == 1 else f"table={tuple(parts)!r}"


def check_query_text(query: Any) -> None:
    """A table's name passed where a query goes is refused before it reaches the server (which would
    answer with a syntax error in pystrom's own wrapping statement), pointing at ``table=``."""
    if not isinstance(query, str):
        return
    parts = sql_name_parts(query)
    if parts is None or (len(parts) == 1 and not query.strip().startswith('"') and parts[0] in _STATEMENT_WORDS):
        return
    name = query.strip().rstrip(";").strip()
    raise InvalidArgumentError(
        f"query={query!r} is a name, not a query: did you mean {_table_argument(parts)}? "
        f"(or query='SELECT * FROM {name}')"
    )


def resolve_table(conn: Any, table: Any) -> Any:
    """``table=`` as the identifier of the relation to read. A string is one name taken literally; one
    with a dot that no relation has is read as SQL reads a qualified name (``'public.breast_cancer'``
    -> ``("public", "breast_cancer")``, quotes honoured) when that relation exists, and refused with
    the tuple form to use when it does not."""
    if not isinstance(table, str) or "." not in table:
        return _identifier(table)
    from psycopg import sql

    from ...errors import PostgresError

    if len(table.encode("utf-8")) <= MAX_IDENTIFIER_BYTES and _exists(conn, sql.Identifier(table)):
        return sql.Identifier(table)
    parts = sql_name_parts(table)
    if parts is not None and len(parts) > 1:
        for part in parts:
            check_identifier_length(part, "table")
        qualified = sql.Identifier(*parts)
        if _exists(conn, qualified):
            return qualified
        raise PostgresError(
            f"table {table!r} does not exist: no table or view has that name (taken literally, dots included), "
            f"nor is there {qualified.as_string(conn)} (the name read as SQL reads it); for a table in a schema, "
            f"pass {_table_argument(parts)}"
        )
    check_identifier_length(table, "table")
    raise PostgresError(
        f"table {table!r} does not exist: no table or view has that name (taken literally, dots included); "
        f"for a table in a schema, pass a tuple such as table=('schema', 'name')"
    )


def _exists(conn: Any, ident: Any) -> bool:
    """Whether ``ident`` names a relation this session sees (to_regclass: NULL, never an error, when not)."""
    import psycopg
    from psycopg import sql

    from ...errors import PostgresError

    try:
        row = conn.execute(sql.SQL("SELECT to_regclass({}) IS NOT NULL").format(ident.as_string(conn))).fetchone()
    except psycopg.Error as exc:
        raise PostgresError(f"PostgreSQL, while looking up table {ident.as_string(conn)}: {exc}") from exc
    return bool(row[0])


def check_read_arguments(query: Any, table: Any, columns: Any, where: Any, numeric: Any, partition_on: Any) -> None:
    """The checks every PostgreSQL read makes of what it is asked to read (one process or many)."""
    if (query is None) == (table is None):
        raise InvalidArgumentError("read_postgres needs exactly one of query= or table=")
    check_query_text(query)
    if query is not None and (columns is not None or where is not None):
        raise InvalidArgumentError("columns= and where= go with table=; put them in the query instead")
    if numeric not in ("float64", "decimal"):
        raise InvalidArgumentError(f"numeric must be 'float64' or 'decimal'; got {numeric!r}")
    if partition_on is not None and (query is None or not isinstance(partition_on, str) or not partition_on):
        raise InvalidArgumentError(f"partition_on must name an integer column of a query= read; got {partition_on!r}")


def compose(conn: Any, query: Any, table: Any, columns: Any, where: Any, params: Any) -> Plan:
    """The read's SELECT from a ``query=`` or from ``table=``, ``columns=`` and ``where=``."""
    from psycopg import ClientCursor, sql

    if table is not None:
        ident = resolve_table(conn, table)
        if columns is None:
            cols = sql.SQL("*")
        else:
            if isinstance(columns, str) or not all(isinstance(c, str) and c for c in columns) or not columns:
                raise InvalidArgumentError(f"columns must be a non-empty list of column names; got {columns!r}")
            for c in columns:
                check_identifier_length(c, "column")
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
            select = sql.SQL("{} WHERE ({}\n)").format(select, pred)  # a trailing -- comment ends at the newline
        return Plan(select, ident, cols, pred)
    if not isinstance(query, (str, sql.Composable)):
        raise InvalidArgumentError(f"query must be a SQL string or a psycopg.sql object; got {type(query).__name__}")
    text = query if isinstance(query, str) else query.as_string(conn)
    if params is not None:
        text = ClientCursor(conn).mogrify(text, params)
    text = _statement_body(text)
    if not text:
        raise InvalidArgumentError("query is empty")
    return Plan(sql.SQL(text))


def _statement_body(text: str) -> str:
    """``text`` up to its last token that is not a semicolon: trailing semicolons, comments and
    whitespace go, since the statement is wrapped in ``COPY (...)`` and ``SELECT * FROM (...)``,
    where a trailing ``-- comment`` would swallow the closing parenthesis. Strings, quoted
    identifiers, dollar quotes and comments are skipped as PostgreSQL's lexer skips them, so a
    semicolon or dash inside them is left alone."""
    end = 0  # just past the last significant token that is not ';'
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace() or text[i] == ";":
            i += 1
            continue
        comment = _comment_end(text, i)
        if comment < 0:  # an unclosed comment: left for the server to refuse
            i = end = n
        elif comment > i:
            i = comment
        else:
            i = end = _token_end(text, i)
    return text[:end]


def first_keyword(text: str) -> str | None:
    """The statement's first word in lower case, past whitespace, comments (as :func:`_statement_body`
    skips them) and opening parentheses; None where it starts with something else."""
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace() or text[i] == "(":
            i += 1
            continue
        comment = _comment_end(text, i)
        if comment < 0:
            return None
        if comment == i:
            break
        i = comment
    word = _WORD.match(text, i)
    return word.group(0).lower() if word else None


_WORD = re.compile(r"[A-Za-z_]+")


def _comment_end(text: str, i: int) -> int:
    """Where the comment starting at ``text[i]`` ends: ``i`` itself where none starts there, -1 for a
    block comment never closed. Block comments nest in PostgreSQL."""
    n = len(text)
    if text.startswith("--", i):
        newline = text.find("\n", i)
        return n if newline < 0 else newline + 1
    if not text.startswith("/*", i):
        return i
    depth, i = 1, i + 2
    while i < n and depth:
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
        else:
            i += 1
    return -1 if depth else i


def _token_end(text: str, i: int) -> int:
    """Where the token starting at ``text[i]`` (not a space, comment or ';') ends."""
    n = len(text)
    c = text[i]
    if c in "'\"" or (c in "eE" and text.startswith("'", i + 1)):
        escapes = c in "eE"
        quote = "'" if escapes else c
        i += 2 if escapes else 1
        while i < n:
            if escapes and text[i] == "\\":
                i += 2
            elif text[i] == quote:
                if text.startswith(quote, i + 1):  # a doubled quote stands for itself
                    i += 2
                else:
                    return i + 1
            else:
                i += 1
        return n
    if c == "$":
        match = _DOLLAR_TAG.match(text, i)
        if match:
            close = text.find(match.group(0), match.end())
            return n if close < 0 else close + len(match.group(0))
    return i + 1


_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][\w\x80-\U0010ffff]*)?\$")


def rewrite_columns(plan: Plan, names: list[str], rewrites: list[Callable[[Any], list[Any]] | None]) -> Plan:
    """``plan`` reading, for each result column ``names[i]`` whose ``rewrites[i]`` is given, the select
    items ``rewrites[i](expr)`` return for the column's expression instead of the column (casts, or the
    parts a struct is read as); the other columns as they are, under their names (partition predicates
    name them). ``plan`` itself when nothing is rewritten."""
    from psycopg import sql

    if not any(r is not None for r in rewrites):
        return plan

    def items(expr_of: Callable[[str], Any]) -> Any:
        out = []
        for n, r in zip(names, rewrites):
            out.extend([expr_of(n)] if r is None else r(expr_of(n)))
        return sql.SQL(", ").join(out)

    if plan.table is not None:  # table= reads: ctid ranges select the columns from the table itself
        cols = items(sql.Identifier)
        select = sql.SQL("SELECT {} FROM {}").format(cols, plan.table)
        if plan.where is not None:
            select = sql.SQL("{} WHERE ({}\n)").format(select, plan.where)
        return Plan(select, plan.table, cols, plan.where)
    q = sql.Identifier("_pystrom_t")
    cols = items(lambda n: sql.SQL("{}.{}").format(q, sql.Identifier(n)))
    return Plan(sql.SQL("SELECT {} FROM ({}) AS {}").format(cols, plan.select, q))


def cast_item(expr: Any, name: str) -> Any:
    """``expr`` as the type's output text, named ``name``: format('%s') calls the output function (an
    inet host address without its /32, as psql and psycopg show it, where ``::text`` adds it), and the
    CASE keeps NULL a NULL (format gives '' for it)."""
    from psycopg import sql

    return sql.SQL("CASE WHEN {} IS NOT NULL THEN format('%s', {}) END AS {}").format(expr, expr, sql.Identifier(name))
