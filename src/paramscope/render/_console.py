"""A rich console that renders to a string: shared by the renderers of diff, compare, audit and counts."""

from __future__ import annotations

import io
from typing import Iterable

from rich.console import Console


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
    for part in parts:
        console.print(part)
    # Trailing blanks (rich pads table rows) only get in the way of diffs and golden files.
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def percent(share: float) -> str:
    if 0 < share < 0.00005:
        return "<0.01%"
    return f"{share * 100:.2f}%"


def shape(dims) -> str:
    return "×".join(str(d) for d in dims) if dims else "scalar"
