"""Text and notebook views of a Table: shape, device, bytes, schema and the first rows.

Wide tables are elided as polars elides them: the text view keeps the first and the last columns
that fit the terminal's width with a ``…`` column between them, and packs a schema of many columns
into a few lines (the middle ones elided); the notebook view shows the first and last 10 columns.
"""

from __future__ import annotations

import html
import shutil
from typing import TYPE_CHECKING

from ._settings import defaults

if TYPE_CHECKING:
    from .table import Table

# Only free text is cut (a long string or blob would push every other column off the screen); numbers,
# timestamps, uuids and decimals are always shown whole: a cut one reads as a different value.
_MAX_TEXT = 40


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def _cell(value: object, cut: bool) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if not cut or len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"


def _is_text(arrow_type: object) -> bool:
    import pyarrow as pa

    t = arrow_type.storage_type if isinstance(arrow_type, pa.BaseExtensionType) else arrow_type
    if pa.types.is_fixed_size_binary(t):
        return not isinstance(arrow_type, pa.BaseExtensionType)  # uuid and other extensions: whole
    return pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)


def _column_cells(column: object, cut: bool) -> list[str]:
    """One column's first rows as text. A date or timestamp outside Python's datetime range (years
    past 9999, or before 1) is shown as its stored integer and unit rather than failing the repr."""
    try:
        return [_cell(v, cut) for v in column.to_pylist()]
    except (OverflowError, ValueError):
        pass
    cells = []
    unit = getattr(column.type, "unit", "days" if str(column.type).startswith("date32") else "ms")
    for scalar in column:
        try:
            cells.append(_cell(scalar.as_py(), cut))
        except (OverflowError, ValueError):
            cells.append(f"<{scalar.value} {unit} from 1970: beyond Python's datetime>")
    return cells


# Columns whose cells are computed for a repr: at most this many from each end (a table of 10,000
# columns shows a few dozen at best, and converting the rest would make repr slow).
_EDGE_COLUMNS = 64
_HTML_COLUMNS = 20  # the notebook view shows the first and last 10 of a wider table
_FOLD_AFTER = 10  # a schema of more columns is packed into lines instead of one column per line
_SCHEMA_LINES = 4  # the most lines a folded schema takes; the middle columns are elided beyond


def _width() -> int:
    """The terminal's width ($COLUMNS first), 100 when there is no terminal (a log, a pipe)."""
    return max(20, shutil.get_terminal_size((100, 24)).columns)


def _candidates(table: Table, limit: int) -> list[int]:
    """Indices of the columns a view may show: all of them, or ``limit`` from each end."""
    k = table.num_columns
    return list(range(k)) if k <= 2 * limit else [*range(limit), *range(k - limit, k)]


def _head(table: Table, indices: list[int]) -> tuple[list[str], list[list[str]]]:
    """Names of the columns ``indices`` and their first rows as text (one list per row)."""
    names = [table.column_names[i] for i in indices]
    rows = min(defaults.repr_rows, table.num_rows)
    if rows == 0 or not indices:
        return names, []
    head = table.select(indices).slice(0, rows).to_arrow()
    columns = [_column_cells(head.column(i), _is_text(head.schema.field(i).type)) for i in range(head.num_columns)]
    return names, [list(r) for r in zip(*columns)]


def _fit(widths: list[int], budget: int) -> list[int] | None:
    """Positions of the columns to show when all of them (``widths``, two spaces apart) do not fit
    in ``budget`` characters: taken from both ends in turn (first, last, second, second last, ...)
    while they fit beside a ``…`` column, at least the first and the last. None when all fit."""
    if sum(widths) + 2 * (len(widths) - 1) <= budget or len(widths) <= 2:
        return None
    left, right = [0], [len(widths) - 1]
    used = widths[0] + widths[-1] + 2 + 3  # both columns, their separators around "…"
    i, j = 1, len(widths) - 2
    take_left = True
    while i <= j:
        k = i if take_left else j
        if used + widths[k] + 2 > budget:
            break
        used += widths[k] + 2
        if take_left:
            left.append(i)
            i += 1
        else:
            right.insert(0, j)
            j -= 1
        take_left = not take_left
    return None if i > j else [*left, -1, *right]  # -1: the "…" column


def _header(table: Table) -> str:
    return (
        f"pystrom.Table: {table.num_rows:,} rows x {table.num_columns} columns on {table.device}, "
        f"{_human_bytes(table.nbytes)}"
    )


def _schema_entry(col: object) -> str:
    nulls = f" ({col.null_count:,} null{'s' if col.null_count > 1 else ''})" if col.null_count else ""
    return f"{col.name}: {col.type}{nulls}"


def _pack(entries: list[str], width: int) -> list[list[str]]:
    """``entries`` grouped into lines that, joined by ", " after two spaces, fit in ``width`` characters
    (an entry is never split; a line holds at least one)."""
    lines: list[list[str]] = []
    used = 0
    for entry in entries:
        if lines and used + 2 + len(entry) + 1 <= width:
            lines[-1].append(entry)
            used += 2 + len(entry)
        else:
            lines.append([entry])
            used = 2 + len(entry)
    return lines


def _format(lines: list[list[str]]) -> list[str]:
    return ["  " + ", ".join(line) + ("," if i < len(lines) - 1 else "") for i, line in enumerate(lines)]


def _schema_lines(table: Table, width: int) -> list[str]:
    """One line per column for a narrow table; otherwise packed into lines, the middle columns
    elided past :data:`_SCHEMA_LINES` lines (``table.schema`` lists all)."""
    columns = table.columns
    if len(columns) <= _FOLD_AFTER:
        return [f"  {_schema_entry(c)}" for c in columns]
    entries = [_schema_entry(c) for c in columns]
    lines = _pack(entries, width)
    if len(lines) <= _SCHEMA_LINES:
        return _format(lines)
    head = lines[: _SCHEMA_LINES - 2]
    shown = sum(len(line) for line in head)
    tail = _pack(entries[shown:][::-1], width)[0][::-1]  # as many of the last entries as fill one line
    hidden = len(entries) - shown - len(tail)
    marker = f"  … {hidden:,} more column{'s' if hidden > 1 else ''} (table.schema lists all) …"
    return [*_format(head), marker, *_format([tail])]


def table_repr(table: Table) -> str:
    if table.closed:
        return "<pystrom.Table: closed>"
    width = _width()
    lines = [_header(table), *_schema_lines(table, width)]
    indices = _candidates(table, _EDGE_COLUMNS)
    names, rows = _head(table, indices)
    if rows:
        widths = [max(len(n), *(len(r[i]) for r in rows)) for i, n in enumerate(names)]
        shown = _fit(widths, width)
        if shown is not None or len(indices) < table.num_columns:
            shown = shown or [*range(_EDGE_COLUMNS), -1, *range(_EDGE_COLUMNS, 2 * _EDGE_COLUMNS)]
            names = [names[i] if i >= 0 else "…" for i in shown]
            rows = [[r[i] if i >= 0 else "…" for i in shown] for r in rows]
            widths = [widths[i] if i >= 0 else 1 for i in shown]
        lines.append("----")
        lines.append("  ".join(n.rjust(w) for n, w in zip(names, widths)))
        lines.extend("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows)
        if table.num_rows > len(rows):
            lines.append(f"... {table.num_rows - len(rows):,} more rows")
    return "\n".join(lines)


def table_html(table: Table) -> str:
    if table.closed:
        return "<p><b>pystrom.Table</b>: closed</p>"
    esc = html.escape
    indices = _candidates(table, _HTML_COLUMNS // 2)
    names, rows = _head(table, indices)
    columns = [table.column(i) for i in indices]
    cut = len(indices) // 2 if len(indices) < table.num_columns else None  # where the "…" column goes

    def cells(values: list[str], tag: str) -> str:
        parts = [f"<{tag}>{v}</{tag}>" for v in values]
        if cut is not None:
            parts.insert(cut, f"<{tag}>…</{tag}>")
        return "".join(parts)

    head = cells(
        [
            f"{esc(c.name)}<br><small>{esc(str(c.type))}"
            f"{' · ' + format(c.null_count, ',') + ' nulls' if c.null_count else ''}</small>"
            for c in columns
        ],
        "th",
    )
    body = "".join("<tr>" + cells([esc(v) for v in r], "td") + "</tr>" for r in rows)
    more = f"<p><small>… {table.num_rows - len(rows):,} more rows</small></p>" if table.num_rows > len(rows) else ""
    return (
        f"<p><b>{esc(_header(table))}</b></p><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"
    )
