"""`paramscope compare`: a pure function of (Comparison, width) → text; JSON and CSV producers.

A number is never broken across lines. The first layout that fits the width is used:

1. models side by side, exact counts with shares;
2. models side by side, human units (109.5M) with shares;
3. models as rows: exact totals, then each role group's share;
4. the same, compact: the role groups that fit (the largest first) and a note naming those left out, exact totals
   or human units;
5. one block per model, for a width where not even a model's name and total fit on a line.

Where a model is a mixture of experts, the parameters a token uses are a row of the side-by-side layouts, a line of
its block, and a note under the models-as-rows tables (a column would push them past the width they fit today); a
dense model's active count is its total, and the note says so.
"""

from __future__ import annotations

import json as _json

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..compare import Comparison
from ..explain import exact, human
from ..roles import GROUP_TITLES, role_group
from ._console import to_text, wrap_words

# Column headers of the models-as-rows layout, short so that more groups fit.
_SHORT_GROUP = {"embeddings": "embed", "attention": "attn", "cross_attention": "x-attn", "linear_attention": "lin-attn",
                "projector": "proj", "segmentation": "seg", "layer_scale": "scale", "encoder": "enc",
                "recurrent": "rnn", "pooler": "pool", "head": "heads"}


def render_compare_text(comparison: Comparison, width: int = 100, *, color: bool = False,
                        roles: bool = False) -> str:
    """Models side by side: totals, then each role group (and with `roles`, each role) with its share."""
    for layout in (_side_by_side_exact, _side_by_side_human, _models_as_rows):
        table = layout(comparison, roles)
        if table is not None and _needed_width(table) <= width:
            return to_text([table, *_dim(_active_words(comparison, figures=layout is _models_as_rows), width)],
                           width, color)
    compact = _compact_rows(comparison, roles, width)
    if compact is not None:
        return to_text(compact, width, color)
    return to_text([_blocks(comparison, roles), *_dim(_active_words(comparison, figures=False), width)], width,
                   color)


def _has_moe(comparison: Comparison) -> bool:
    return any(c.moe for c in comparison.columns)


def _active_words(comparison: Comparison, *, figures: bool) -> str:
    """The convention of the active counts when a model is a mixture of experts (else ""); with `figures` (the
    layouts with no row for them) each such model's count too."""
    if not _has_moe(comparison):
        return ""
    convention = "k of E routed experts; a dense model's is its total"
    if any(c.moe and c.active is None for c in comparison.columns):
        convention += "; unknown where the config gives no top-k"
    if not figures:
        return f"active per token: {convention}"
    counts = ", ".join(f"{c.label} {'unknown' if c.active is None else _cell(c.active, c.share)}"
                       for c in comparison.columns if c.moe)
    return f"active per token ({convention}): {counts}"


def _dim(note: str, width: int) -> list:
    return [Text("\n".join(wrap_words(note, width)), style="dim")] if note else []


def _compact_rows(comparison: Comparison, roles: bool, width: int) -> list | None:
    """Models as rows with as many role-group columns as fit, the largest groups first, and a note naming the rest;
    None when not even each model's name and total fit."""
    ranked = sorted(comparison.groups, key=lambda g: -max(c.share(c.groups.get(g, 0)) for c in comparison.columns))
    for count in (exact, human):
        for kept in range(len(ranked), -1, -1):
            shown = [g for g in comparison.groups if g in ranked[:kept]]
            headers = ["model", "parameters", *(_SHORT_GROUP.get(g, g) for g in shown)]
            rows = [(c.label, [count(c.total), *(_share(c.groups.get(g, 0), c.share) for g in shown)], None)
                    for c in comparison.columns]
            table = _table("Comparison: role groups as shares of each total", headers, rows)
            if _needed_width(table) <= width:
                left_out = [GROUP_TITLES.get(g, g) for g in comparison.groups if g not in shown]
                wider = [_side_by_side_human(comparison, roles)] + ([] if roles else [_models_as_rows(comparison, roles)])
                needed = min(_needed_width(t) for t in wider if t is not None)
                note = ("not shown at this width: " + ", ".join(left_out) + "; " if left_out else "")
                note += ("each role" if roles else "every group") + f" at --width {needed}, every figure in --json"
                active = _active_words(comparison, figures=True)  # one paragraph: the narrow layout spares lines
                return [table, *_dim(note + (f"; {active}" if active else ""), width)]
    return None


def _needed_width(table: Table) -> int:
    """The width rich needs to print `table` with no cell wrapped or cut, measured by rich itself."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(width=10_000)
    return Measurement.get(console, console.options, table).maximum


def _rows(comparison: Comparison, roles: bool, count, cell) -> list[tuple[str, list[str], str | None]]:
    """(label, one cell per model, style) for the side-by-side layouts."""
    cols = comparison.columns
    rows: list[tuple[str, list[str], str | None]] = [
        ("class", [c.class_name for c in cols], None),
        ("parameters (unique)", [count(c.total) for c in cols], "bold"),
    ]
    if count is exact:
        rows.append(("  ≈", [human(c.total) for c in cols], None))
    if _has_moe(comparison):
        rows.append(("active per token", [_active_cell(c, count, cell) for c in cols], None))
    rows += [
        ("with tied duplicates", [count(c.with_tied_duplicates) for c in cols], None),
        ("trainable", [count(c.trainable) for c in cols], None),
        ("buffers", [count(c.buffers) for c in cols], None),
        ("layers", ["" if c.layers is None else str(c.layers) for c in cols], None),
        ("", [], "section"),
    ]
    for group in comparison.groups:
        members = [r for r in comparison.roles if role_group(r) == group]
        style = "bold" if roles and len(members) > 1 else None
        rows.append((GROUP_TITLES.get(group, group), [cell(c.groups.get(group, 0), c) for c in cols], style))
        if roles and (len(members) > 1 or members[0] != group):
            for role in members:
                rows.append((f"  {role}", [cell(c.breakdown.get(role, 0), c) for c in cols], None))
    rows += [("", [], "section"), ("total", [count(c.total) for c in cols], "bold")]
    return rows


def _side_by_side(comparison: Comparison, roles: bool, count, cell) -> Table:
    headers = [""] + [column.label for column in comparison.columns]
    return _table("Comparison", headers, _rows(comparison, roles, count, cell))


def _side_by_side_exact(comparison: Comparison, roles: bool) -> Table:
    return _side_by_side(comparison, roles, exact, lambda n, c: _cell(n, c.share))


def _side_by_side_human(comparison: Comparison, roles: bool) -> Table:
    return _side_by_side(comparison, roles, human, lambda n, c: _human_cell(n, c.share))


def _models_as_rows(comparison: Comparison, roles: bool) -> Table | None:
    if roles:  # one column per role is too many: the blocks show them
        return None
    headers = ["model", "parameters", *(_SHORT_GROUP.get(g, g) for g in comparison.groups)]
    rows = []
    for c in comparison.columns:
        shares = [_share(c.groups.get(g, 0), c.share) for g in comparison.groups]
        rows.append((c.label, [exact(c.total), *shares], None))
    return _table("Comparison: models as rows, role groups as shares of each total", headers, rows)


def _table(title: str, headers: list[str], rows: list[tuple[str, list[str], str | None]]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index == 0 else "right", no_wrap=True)
    for label, cells, style in rows:
        if style == "section":
            table.add_section()
        else:
            table.add_row(label, *cells, style=style)
    return table


def _blocks(comparison: Comparison, roles: bool) -> Group:
    parts: list = [Text("Comparison", style="bold")]
    for c in comparison.columns:
        parts.append(Text(""))
        parts.append(Text(f"{c.label} ({c.class_name})", style="bold"))
        lines = [("parameters", exact(c.total)), ("≈", human(c.total))]
        if c.moe:
            lines.append(("active per token", _active_cell(c, exact, lambda n, col: _cell(n, col.share))))
        lines += [("with tied duplicates", exact(c.with_tied_duplicates)), ("trainable", exact(c.trainable))]
        if c.layers is not None:
            lines.append(("layers", str(c.layers)))
        for group in comparison.groups:
            if c.groups.get(group, 0):
                lines.append((GROUP_TITLES.get(group, group), _cell(c.groups[group], c.share)))
            if roles:
                for role in comparison.roles:
                    if role_group(role) == group and c.breakdown.get(role, 0):
                        lines.append((f"  {role}", _cell(c.breakdown[role], c.share)))
        for label, value in lines:
            parts.append(Text(f"  {label}: {value}"))
    return Group(*parts)


def render_compare_json(comparison: Comparison, *, indent: int | None = 2) -> str:
    return _json.dumps(comparison.to_dict(), indent=indent, ensure_ascii=False)


def render_compare_csv(comparison: Comparison) -> str:
    return comparison.to_csv()


def _percent(value: float) -> str:
    return "<0.1" if 0 < value < 0.0005 else f"{value * 100:.1f}"


def _cell(count: int, share) -> str:
    if not count:
        return "—"
    return f"{exact(count)} ({_percent(share(count))}%)"


def _human_cell(count: int, share) -> str:
    if not count:
        return "—"
    return f"{human(count)} ({_percent(share(count))}%)"


def _active_cell(column, count, cell) -> str:
    """A mixture of experts' active count with its share; a dense model's total (all of it is active); — unknown."""
    if column.active is None:
        return "—"
    return cell(column.active, column) if column.moe else count(column.active)


def _share(count: int, share) -> str:
    return "—" if not count else f"{_percent(share(count))}%"
