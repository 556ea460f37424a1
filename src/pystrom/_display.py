"""Text and notebook views of a Table: shape, device, bytes, schema and the first rows."""

from __future__ import annotations

import html
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


def _head(table: Table) -> tuple[list[str], list[list[str]]]:
    rows = min(defaults.repr_rows, table.num_rows)
    if rows == 0 or table.num_columns == 0:
        return table.column_names, []
    head = table.slice(0, rows).to_arrow()
    columns = [_column_cells(head.column(i), _is_text(head.schema.field(i).type)) for i in range(head.num_columns)]
    return table.column_names, [list(r) for r in zip(*columns)]


def _header(table: Table) -> str:
    return (
        f"pystrom.Table: {table.num_rows:,} rows x {table.num_columns} columns on {table.device}, "
        f"{_human_bytes(table.nbytes)}"
    )


def table_repr(table: Table) -> str:
    if table.closed:
        return "<pystrom.Table: closed>"
    lines = [_header(table)]
    for col in table.columns:
        nulls = f"  ({col.null_count:,} null{'s' if col.null_count > 1 else ''})" if col.null_count else ""
        lines.append(f"  {col.name}: {col.type}{nulls}")
    names, rows = _head(table)
    if rows:
        widths = [max(len(n), *(len(r[i]) for r in rows)) for i, n in enumerate(names)]
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
    names, rows = _head(table)
    head = "".join(
        f"<th>{esc(c.name)}<br><small>{esc(str(c.type))}"
        f"{' · ' + format(c.null_count, ',') + ' nulls' if c.null_count else ''}</small></th>"
        for c in table.columns
    )
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows)
    more = f"<p><small>… {table.num_rows - len(rows):,} more rows</small></p>" if table.num_rows > len(rows) else ""
    return (
        f"<p><b>{esc(_header(table))}</b></p><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"
    )
