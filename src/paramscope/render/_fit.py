"""Tables fitted to the terminal width without cutting a figure.

rich fits a table that is too wide by shrinking its columns, and as a last resort cuts cells with "…"
("14.23 …", "4,617,39…") or folds them over lines: an exact figure is then unreadable. Here, before a part is
printed, each table is checked against the width:

- where rich's own layout keeps every figure whole, the table is printed as it is (wide output is unchanged);
- otherwise figure columns (right-justified or no-wrap ones) keep their full width and prose columns share what is
  left, each at least as wide as its longest word, so they wrap between words;
- where even that does not fit and the table has a column of names (`add_names_column`: tensor names, keys), the
  names may fold anywhere: such a column needs only its widest figure (a shape, a count among the names), so rich's
  own layout is kept where it folds names only, else the columns are fixed as above with the names folding;
- where even that does not fit, a table of a few rows is turned on its side (a column a row), and any other is
  printed stacked, one block a row: its first cell, then "column: value" lines, the way CLIs lay tables out on
  narrow terminals.

Each column says what it holds: a figure (never cut, never folded), prose (wraps between words) or names (whole
where the width allows, else folded anywhere but inside a figure); `holds` reads which.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Column, Table
from rich.text import Text

# The narrowest a prose column is laid out (its words permitting) before the table is stacked instead.
PROSE_WIDTH = 16
# The most rows a table turned on its side keeps (a column each) before it is stacked instead.
TRANSPOSE_ROWS = 6
# Value lines of a stacked row start this far in, under the row's first cell (which starts at STACK_INDENT - 2).
STACK_INDENT = 4


# A figure among names and words: a count, a shape, a product, a number with its sign, exponent or per cent, in the
# brackets or before the punctuation that go with it ("1,500", "30522×768:", "768·768", "(4.30", "+1,024",
# "1.608e10", "[128,").
_FIGURE = re.compile(r"[(\[{'\"]*[+\-−]?\d[\d,._×·]*(?:e[+\-]?\d+)?%?[)\]}:;,.'\"]*")


@dataclasses.dataclass
class NamesColumn(Column):
    """A column of names (tensor names, keys) and what is said of them: a name too long for the width folds
    anywhere, a figure among them (a shape, a count) is never folded."""


def add_names_column(table: Table, header: str = "", **options) -> None:
    """Add to `table` a column of names (NamesColumn): laid out whole where the width allows, else folded."""
    table.add_column(header, overflow="fold", **options)
    column = table.columns[-1]
    table.columns[-1] = NamesColumn(**{field.name: getattr(column, field.name)
                                       for field in dataclasses.fields(Column)})


def holds(column: Column) -> str:
    """What a column holds: "figure" (right-justified, unless its renderer let it wrap with overflow="fold", or
    no-wrap: never cut, never folded), "names" (NamesColumn: may fold) or "prose" (wraps between words)."""
    if _keeps_whole(column):
        return "figure"
    return "names" if isinstance(column, NamesColumn) else "prose"


def figure_width(text: str) -> int:
    """The widest figure in `text` (0 for none): a column of names narrower than it would fold a figure."""
    return max((len(word) for word in text.split() if _FIGURE.fullmatch(word)), default=0)


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
    whole; else, for a table with a column of names, the same with the names folded (unless the names head the rows,
    and each heads its block whole turned or stacked); else the table turned on its side (a few rows), or stacked."""
    cells = _texts(table)
    if cells is None or not table.columns:  # a cell that is not text (a nested table): rich lays it out
        return table
    room = width - table._extra_width
    options = console.options.update_width(max(room, 1))
    laid_out = table._calculate_column_widths(console, options) if room > 0 else None
    rows = None
    fitting = _laid_out(table, console, options, cells, laid_out, room, fold=False)
    names = [index for index, column in enumerate(table.columns) if holds(column) == "names"]
    if fitting is None and names:
        rows = blocks(table, cells)
        # names that head the rows (a table of tensors) are whole as the heads of blocks where the width allows:
        # that reads better than each folded in a column of its own
        heads_whole = names == [0] and len(table.columns) > 1 and all(
            _widest_line(head) <= width - (STACK_INDENT - 2) for head, _ in rows)
        if not heads_whole:
            fitting = _laid_out(table, console, options, cells, laid_out, room, fold=True)
    if fitting is not None:
        return fitting
    rows = blocks(table, cells) if rows is None else rows
    turned = transposed(table, rows)
    if turned is not None and _fits_whole(turned, width):
        return turned
    return stacked(table, rows, width)


def _laid_out(table: Table, console: Console, options, cells: list[list[Text]], laid_out: list[int] | None,
              room: int, fold: bool) -> Table | None:
    """The table itself where rich's layout (`laid_out`, its column widths) cuts nothing; else a copy with fixed
    column widths that keep every figure whole; None where the needs alone are wider than the room. With `fold`, the
    names in a column of names may fold."""
    needs = [_need(table, index, column, cells[index], fold=fold) for index, column in enumerate(table.columns)]
    if laid_out is not None and all(have >= need for have, need in zip(laid_out, needs)):
        return table
    # laid out here, a header wraps between its words (the column is at least as wide as its widest cell, so no
    # cell of a no-wrap column wraps): "largest" over "context" rather than "largest con…"
    relaxed = [_need(table, index, column, cells[index], header_wraps=True, fold=fold)
               for index, column in enumerate(table.columns)]
    widths = _fixed_widths(table, console, options, relaxed, room)
    if widths is None:
        return None
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


def _need(table: Table, index: int, column, cells: list[Text], header_wraps: bool = False,
          fold: bool = False) -> int:
    """The narrowest width (padding included) at which no cell of the column is cut: a figure column's widest
    cell whole, a prose column's longest word, a column of names its longest word too, or with `fold` its widest
    figure (its names may fold); the header may wrap between its words either way. A column of fixed width was
    sized by its renderer."""
    padding = table._get_padding_width(index)
    if column.width is not None:
        return column.width + padding
    header = 0
    if table.show_header:  # as rich lays it out, a no-wrap column's header does not wrap either
        header = (_widest_line if column.no_wrap and not header_wraps else _longest_word)(_text(column.header))
    kind = holds(column)
    if kind == "figure":
        body = max((_widest_line(cell) for cell in cells), default=0)
    elif kind == "names" and fold:
        body = max((figure_width(cell.plain) for cell in cells), default=0)
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
    # column's row labels excepted: "full attention" reads well as "full" over "attention"; a column of names is
    # not, as a name folded a few characters a line reads as fragments)
    needs = [min(natural[i], max(need, PROSE_WIDTH + table._get_padding_width(i)))
             if i in prose and (i or holds(table.columns[i]) == "names") else need for i, need in enumerate(needs)]
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
    header qualifies the value before it, a row with an empty first cell continues the block before it; in a
    label/value grid, headerless, each value is a line of its own: a list of findings stays a list)."""
    columns = table.columns
    labels = [_text(column.header).plain.strip() if table.show_header else "" for column in columns]
    first_is_figure = _keeps_whole(columns[0]) and columns[0].justify == "right"
    listing = not table.show_header and len(columns) == 2  # nothing for a value to qualify or continue but a list
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
            if listing:
                entries.append([label, value])
            elif continuing and not head.plain.strip():  # a continuation row: the same column's value goes on
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


def stacked(table: Table, rows: list[Block], width: int | None = None) -> Group:
    """Each row as a block: its first cell as a heading, then "column: value" lines under it; where `width` leaves
    the values too little room beside their labels for a figure (or a few words), each value under its label."""
    parts: list = []
    if table.title:
        title = _text(table.title)
        title.stylize(table.title_style or "table.title")
        parts.append(title)
    labels = [STACK_INDENT + len(label) + 1 for _, entries in rows for label, _ in entries if label]
    values = [value for _, entries in rows for _, value in entries]
    need = max([min(PROSE_WIDTH, max(_longest_word(v) for v in values)), *map(figure_width, (v.plain for v in values))]
               ) if values else 0
    beside = width is None or width - max(labels, default=STACK_INDENT) - 1 >= need
    for head, entries in rows:
        if head.plain.strip():
            parts.append(Padding(head, (0, 0, 0, STACK_INDENT - 2)))
        if entries and beside:
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True)
            grid.add_column(overflow="fold")
            for label, value in entries:
                grid.add_row(" " * STACK_INDENT + (f"{label}:" if label else ""), value)
            parts.append(grid)
        for label, value in entries if not beside else ():  # "label:" on a line, its value under it
            if label:
                parts.append(Padding(Text(f"{label}:", overflow="fold"), (0, 0, 0, STACK_INDENT)))
            parts.append(Padding(value, (0, 0, 0, STACK_INDENT + 2 if label else STACK_INDENT)))
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
