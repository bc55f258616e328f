"""Tables fitted to the terminal width without cutting a figure.

rich fits a table that is too wide by shrinking its columns, and as a last resort cuts cells with "…"
("14.23 …", "4,617,39…") or folds them over lines: an exact figure is then unreadable. Here, before a part is
printed, each table is checked against the width:

- where rich's own layout keeps every figure whole, the table is printed as it is (wide output is unchanged);
- otherwise figure columns (right-justified or no-wrap ones) keep their full width and prose columns share what is
  left, each at least as wide as its longest word, so they wrap between words;
- where even that does not fit, a table of a few rows is turned on its side (a column a row), and any other is
  printed stacked, one block a row: its first cell, then "column: value" lines, the way CLIs lay tables out on
  narrow terminals.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

# The narrowest a prose column is laid out (its words permitting) before the table is stacked instead.
PROSE_WIDTH = 16
# The most rows a table turned on its side keeps (a column each) before it is stacked instead.
TRANSPOSE_ROWS = 6
# Value lines of a stacked row start this far in, under the row's first cell (which starts at STACK_INDENT - 2).
STACK_INDENT = 4


def fitted(part: Any, console: Console, width: int) -> Any:
    """`part` as it prints at `width` with no figure cut: tables re-laid out where needed, groups and padding
    searched for them; anything else unchanged."""
    if isinstance(part, Table):
        return fitted_table(part, console, width)
    if isinstance(part, Group):
        return Group(*(fitted(r, console, width) for r in part.renderables), fit=part.fit)
    if isinstance(part, Padding):
        inner = width - part.left - part.right
        if inner < 1:
            return part
        padded = copy.copy(part)
        padded.renderable = fitted(part.renderable, console, inner)
        return padded
    return part


def fitted_table(table: Table, console: Console, width: int) -> Table | Group:
    """The table itself where rich's layout at `width` cuts nothing; else fixed column widths that keep figures
    whole; else the table turned on its side (a few rows), or stacked."""
    cells = _texts(table)
    if cells is None or not table.columns:  # a cell that is not text (a nested table): rich lays it out
        return table
    if table.box is None and not table.show_header and any(c.overflow == "fold" for c in table.columns):
        return table  # a label/value grid whose renderer lets its values fold (the audit's findings: long names)
    room = width - table._extra_width
    options = console.options.update_width(max(room, 1))
    needs = [_need(table, index, column, cells[index]) for index, column in enumerate(table.columns)]
    if room > 0 and all(have >= need for have, need in
                        zip(table._calculate_column_widths(console, options), needs)):
        return table
    # laid out here, a header wraps between its words (the column is at least as wide as its widest cell, so no
    # cell of a no-wrap column wraps): "largest" over "context" rather than "largest con…"
    relaxed = [_need(table, index, column, cells[index], header_wraps=True)
               for index, column in enumerate(table.columns)]
    widths = _fixed_widths(table, console, options, relaxed, room)
    if widths is None:
        rows = blocks(table, cells)
        turned = transposed(table, rows)
        if turned is not None and _fits_whole(turned, width):
            return turned
        return stacked(table, rows)
    fixed = copy.copy(table)
    fixed.columns = [dataclasses.replace(column, width=w - table._get_padding_width(index),
                                         min_width=None, max_width=None, ratio=None, no_wrap=False,
                                         overflow="fold" if not _keeps_whole(column) else column.overflow)
                     for index, (column, w) in enumerate(zip(table.columns, widths))]
    return fixed


def _fits_whole(table: Table, width: int) -> bool:
    """Whether every column of `table` (all figure or no-wrap columns) fits at its full width."""
    cells = _texts(table)
    return cells is not None and sum(_need(table, index, column, cells[index]) for index, column in
                                      enumerate(table.columns)) <= width - table._extra_width


def _keeps_whole(column) -> bool:
    """A figure column (right-justified, as every figure column here is, unless its renderer let it wrap with
    overflow="fold": a column of arithmetic, which wraps between words) or one whose cells must not wrap."""
    return column.no_wrap or (column.justify == "right" and column.overflow != "fold")


def _need(table: Table, index: int, column, cells: list[Text], header_wraps: bool = False) -> int:
    """The narrowest width (padding included) at which no cell of the column is cut: a figure column's widest
    cell whole, a prose column's longest word; the header may wrap between its words either way. A column of
    fixed width was sized by its renderer."""
    padding = table._get_padding_width(index)
    if column.width is not None:
        return column.width + padding
    header = 0
    if table.show_header:  # as rich lays it out, a no-wrap column's header does not wrap either
        header = (_widest_line if column.no_wrap and not header_wraps else _longest_word)(_text(column.header))
    if _keeps_whole(column):
        body = max((_widest_line(cell) for cell in cells), default=0)
    else:
        body = max((_longest_word(cell) for cell in cells), default=0)
        if column.max_width is not None:
            body = min(body, column.max_width)
    return max(header, body, 1) + padding


def _fixed_widths(table: Table, console: Console, options, needs: list[int], room: int) -> list[int] | None:
    """Column widths (padding included) within `room`: figure columns at their need, prose columns from their
    need up to their natural width, sharing what is left in proportion to what each lacks; None where the needs
    alone are wider than the room."""
    natural = [max(need, table._measure_column(console, options, column).maximum)
               for need, column in zip(needs, table.columns)]
    prose = [i for i, column in enumerate(table.columns) if not _keeps_whole(column) and column.width is None]
    # a prose column narrower than a few words reads as a column of fragments: stacked reads better (the first
    # column's row labels excepted: "full attention" reads well as "full" over "attention")
    needs = [min(natural[i], max(need, PROSE_WIDTH + table._get_padding_width(i))) if i in prose and i else need
             for i, need in enumerate(needs)]
    if sum(needs) > room:
        return None
    widths = list(needs)
    spare = room - sum(widths)
    lacking = sum(natural[i] - widths[i] for i in prose)
    if lacking <= spare:
        for i in prose:
            widths[i] = natural[i]
        return widths
    for i in prose:
        widths[i] += (natural[i] - needs[i]) * spare // lacking
    for i in sorted(prose, key=lambda i: widths[i] - natural[i]):  # the rounding's remainder, most lacking first
        if sum(widths) < room and widths[i] < natural[i]:
            widths[i] += 1
    return widths


Block = tuple[Text, list[list]]  # a row's heading and its [column, value] entries


def blocks(table: Table, cells: list[list[Text]]) -> list[Block]:
    """One block a row: its first cell as a heading, then each other cell as [column, value] (a cell under an empty
    header qualifies the value before it, a row with an empty first cell continues the block before it)."""
    columns = table.columns
    labels = [_text(column.header).plain.strip() if table.show_header else "" for column in columns]
    first_is_figure = _keeps_whole(columns[0]) and columns[0].justify == "right"
    found: list[Block] = []
    for row_index, row in enumerate(table.rows):
        values = [column_cells[row_index] for column_cells in cells]
        head = values[0].copy()
        if first_is_figure and labels[0]:  # "batch 8", not "8"
            head = Text.assemble(labels[0] + " ", head)
        if row.style:
            head.stylize(row.style)
        if head.plain.strip() or not found:
            found.append((head, []))
        entries = found[-1][1]
        for index in range(1, len(columns)):
            value = values[index]
            if not value.plain.strip():
                continue
            label = labels[index]
            continuing = [e for e in entries if e[0] == label]
            if continuing and not head.plain.strip():  # a continuation row: the same column's value goes on
                continuing[-1][1] = _qualified(continuing[-1][1], value)
            elif not label and entries:  # a column with no header: it qualifies the value before it
                entries[-1][1] = _qualified(entries[-1][1], value)
            else:
                entries.append([label, value])
    return found


def transposed(table: Table, rows: list[Block]) -> Table | None:
    """A table of a few rows turned on its side: a column a row (headed by its first cell), a row a column (named
    by its header); None where a row has no heading or a column no name, or there are too many rows to read
    across."""
    if not rows or len(rows) > TRANSPOSE_ROWS or any(not head.plain.strip() for head, _ in rows):
        return None
    names: list[str] = []
    for _, entries in rows:
        for label, _ in entries:
            if not label:
                return None
            if label not in names:
                names.append(label)
    turned = Table(title=table.title, title_justify=table.title_justify, title_style=table.title_style,
                   caption=table.caption, caption_justify=table.caption_justify, caption_style=table.caption_style,
                   box=box.SIMPLE_HEAD, pad_edge=False)
    turned.add_column("", no_wrap=True)
    for head, _ in rows:
        turned.add_column(head, justify="right", no_wrap=True)
    for name in names:
        turned.add_row(name, *(dict((label, value) for label, value in entries).get(name, "")
                               for _, entries in rows))
    return turned


def stacked(table: Table, rows: list[Block]) -> Group:
    """Each row as a block: its first cell as a heading, then "column: value" lines under it."""
    parts: list = []
    if table.title:
        title = _text(table.title)
        title.stylize(table.title_style or "table.title")
        parts.append(title)
    for head, entries in rows:
        if head.plain.strip():
            parts.append(Padding(head, (0, 0, 0, STACK_INDENT - 2)))
        if entries:
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True)
            grid.add_column(overflow="fold")
            for label, value in entries:
                grid.add_row(" " * STACK_INDENT + (f"{label}:" if label else ""), value)
            parts.append(grid)
    if table.caption:
        parts.append(_text(table.caption))
    return Group(*parts, Text(""))


def _qualified(value: Text, qualifier: Text) -> Text:
    """"4,617,396,224 (4.30 GiB)": a value and what qualifies it (its human units, most often), in brackets."""
    if qualifier.plain.lstrip().startswith("("):
        return Text.assemble(value, " ", qualifier)
    return Text.assemble(value, " (", qualifier, ")")


def _texts(table: Table) -> list[list[Text]] | None:
    """Each column's cells as Text (a string cell is markup, as rich renders it); None if one is not text."""
    columns = []
    for column in table.columns:
        texts = []
        for cell in column._cells:
            text = _text(cell)
            if text is None:
                return None
            texts.append(text)
        columns.append(texts)
    return columns


def _text(cell: Any) -> Text | None:
    if isinstance(cell, Text):
        return cell.copy()
    if isinstance(cell, str):
        return Text.from_markup(cell, emoji=False)
    if cell is None:
        return Text("")
    return None


def _widest_line(text: Text | None) -> int:
    if text is None:
        return 0
    return max((line.cell_len for line in text.split("\n")), default=0)


def _longest_word(text: Text | None) -> int:
    if text is None:
        return 0
    return max((Text(word).cell_len for word in text.plain.split()), default=0)
