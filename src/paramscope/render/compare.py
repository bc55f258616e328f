"""`paramscope compare`: a pure function of (Comparison, width) → text; JSON and CSV producers."""

from __future__ import annotations

import json as _json

from rich import box
from rich.table import Table

from ..compare import Comparison
from ..explain import exact, human
from ..roles import GROUP_TITLES, role_group
from ._console import to_text



def render_compare_text(comparison: Comparison, width: int = 100, *, color: bool = False,
                        roles: bool = False) -> str:
    """Models side by side: totals, then each role group (and with `roles`, each role) with its share."""
    table = Table(title="Comparison", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    for column in comparison.columns:
        table.add_column(column.label, justify="right", overflow="fold")
    cols = comparison.columns
    table.add_row("class", *[c.class_name for c in cols])
    table.add_row("parameters (unique)", *[exact(c.total) for c in cols], style="bold")
    table.add_row("  ≈", *[human(c.total) for c in cols])
    table.add_row("with tied duplicates", *[exact(c.with_tied_duplicates) for c in cols])
    table.add_row("trainable", *[exact(c.trainable) for c in cols])
    table.add_row("buffers", *[exact(c.buffers) for c in cols])
    table.add_row("layers", *["" if c.layers is None else str(c.layers) for c in cols])
    table.add_section()
    for group in comparison.groups:
        members = [r for r in comparison.roles if role_group(r) == group]
        style = "bold" if roles and len(members) > 1 else None
        table.add_row(GROUP_TITLES.get(group, group), *[_cell(c.groups.get(group, 0), c.share) for c in cols],
                      style=style)
        if roles and (len(members) > 1 or members[0] != group):
            for role in members:
                table.add_row(f"  {role}", *[_cell(c.breakdown.get(role, 0), c.share) for c in cols])
    table.add_section()
    table.add_row("total", *[exact(c.total) for c in cols], style="bold")
    return to_text([table], width, color)


def render_compare_json(comparison: Comparison, *, indent: int | None = 2) -> str:
    return _json.dumps(comparison.to_dict(), indent=indent, ensure_ascii=False)


def render_compare_csv(comparison: Comparison) -> str:
    return comparison.to_csv()


def _cell(count: int, share) -> str:
    if not count:
        return "—"
    value = share(count)
    return f"{exact(count)} ({'<0.1' if 0 < value < 0.0005 else f'{value * 100:.1f}'}%)"
