"""A rich console that renders to a string: shared by the renderers of diff, compare, audit and counts."""

from __future__ import annotations

import io
import re
from typing import Iterable

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from ._fit import fitted


def to_text(parts: Iterable, width: int, color: bool = False) -> str:
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        force_terminal=color,
        color_system="truecolor" if color else None,
        no_color=not color,
        highlight=False,
        emoji=False,
    )
    for part in parts:  # each table laid out so that no figure is cut (_fit.py)
        console.print(fitted(part, console, width))
    # Trailing blanks (rich pads table rows) only get in the way of diffs and golden files.
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def to_html(parts: Iterable, width: int) -> str:
    """The same output as HTML with inline styles, for Jupyter's rich display (a <pre> block)."""
    console = Console(record=True, file=io.StringIO(), width=width, force_terminal=True, color_system="truecolor",
                      highlight=False, emoji=False)
    for part in parts:
        console.print(fitted(part, console, width))
    return console.export_html(inline_styles=True, code_format="<pre style=\"font-family:monospace\">{code}</pre>")


def percent(share: float) -> str:
    if 0 < share < 0.00005:
        return "<0.01%"
    return f"{share * 100:.2f}%"


def shape(dims) -> str:
    return "×".join(str(d) for d in dims) if dims else "scalar"


def indented(text: str | Text, indent: int = 2, label: str = "", style: str | None = None) -> Padding:
    """`text` wrapped with a hanging indent: continuation lines start under the text, not at column 0.

    With `label`, the label sits in the indent: indented("BertModel, …", 11, "  class") puts the value at column 11.
    """
    body = text if isinstance(text, Text) else Text(text, style=style or "")
    if not label:
        return Padding(body, (0, 0, 0, indent))
    from rich.table import Table

    grid = Table.grid()
    grid.add_column(width=indent, no_wrap=True)
    grid.add_column()
    grid.add_row(label, body)
    return grid


def model_source_line(model) -> Padding | None:
    """How the cost commands read the model: from its template and recorded facts, or from a meta build (and why
    not the former); None for a live module."""
    if model.engine == "template":
        detail = f" ({model.engine_detail})" if model.engine_detail else ""
        return indented(f"model: its structure template and recorded cost facts, no build (--no-cache builds){detail}")
    if model.engine == "build":
        return indented("model: built on the meta device" + (f" ({model.engine_detail})" if model.engine_detail
                                                             else ""))
    return None


def wrap_words(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken between words; a word wider than the line (a path, a
    hub id) breaks after a '/', and only a single name wider than the line is cut inside."""
    width = max(width, 8)
    lines: list[str] = []
    current = ""
    for word in text.split(" "):
        chunks = re.findall(r"[^/]*/|[^/]+", word) if len(word) > width else [word]
        for index, chunk in enumerate(chunks):
            joined = (current + " " + chunk) if index == 0 and current else current + chunk
            if current and len(joined) > width:
                lines.append(current.rstrip())
                current = chunk
            else:
                current = joined
            while len(current) > width:
                lines.append(current[:width])
                current = current[width:]
    lines.append(current.rstrip())
    return lines


def hanging(label: str, text: str, width: int) -> list[str]:
    """`label` then `text` wrapped to `width`, continuation lines indented under the text (wrap_words)."""
    indent = " " * len(label)
    return [(label if i == 0 else indent) + line for i, line in enumerate(wrap_words(text, width - len(label)))]
