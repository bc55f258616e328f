"""`paramscope diff`: a pure function of (Diff, width) → text, and the JSON document."""

from __future__ import annotations

import json as _json

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..count import LAYER_INDEX
from ..diff import Diff, Tensor
from ..explain import exact
from ._console import shape, to_html, to_text
from ._fit import add_names_column

ROW_LIMIT = 24  # longer lists are grouped by role unless every tensor is asked for


def render_diff_text(diff: Diff, width: int = 100, *, color: bool = False, all_tensors: bool = False,
                     heads=None) -> str:
    """`heads`: optional (label, paramscope.heads.Heads) pairs to explain what the heads add."""
    return to_text(diff_parts(diff, all_tensors=all_tensors, heads=heads), width, color)


def render_diff_html_text(diff: Diff, width: int = 120, *, heads=None) -> str:
    """The terminal's diff as inline-styled HTML, for the --html page."""
    return to_html(diff_parts(diff, all_tensors=False, heads=heads), width)


def diff_parts(diff: Diff, *, all_tensors: bool = False, heads=None) -> list:
    parts = [_header(diff), Text(diff.sentence), Text("")]
    parts.append(_tensor_table(f"Removed from a ({len(diff.removed)} tensors, "
                               f"{exact(sum(t.numel for t in diff.removed))})", diff.removed, all_tensors))
    parts.append(_tensor_table(f"Added in b ({len(diff.added)} tensors, {exact(sum(t.numel for t in diff.added))})",
                               diff.added, all_tensors))
    parts.append(_changed_table(diff, all_tensors))
    parts.append(_ties(diff))
    for label, h in heads or ():
        if h.parts:
            parts.append(_heads(label, h))
    return [p for p in parts if p is not None]


def render_diff_json(diff: Diff, *, indent: int | None = 2) -> str:
    return _json.dumps(diff.to_dict(), indent=indent, ensure_ascii=False)


def _header(diff: Diff) -> Table:
    table = Table(title=f"{diff.a.spec} → {diff.b.spec}", title_justify="left", box=box.SIMPLE_HEAD,
                  show_header=False, pad_edge=False)
    table.add_column("side")
    table.add_column("model")
    table.add_column("class")
    table.add_column("parameters", justify="right")
    table.add_row("a", diff.a.spec, diff.a.class_name, exact(diff.a.total))
    table.add_row("b", diff.b.spec, diff.b.class_name, exact(diff.b.total))
    table.add_row("", "net change", "", f"{diff.delta:+,}", style="bold")
    return table


def _tensor_table(title: str, tensors: tuple[Tensor, ...], all_tensors: bool) -> Table | None:
    if not tensors:
        return None
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    add_names_column(table, "name")
    table.add_column("shape")
    table.add_column("parameters", justify="right")
    table.add_column("role")
    if all_tensors or len(tensors) <= ROW_LIMIT:
        for t in tensors:
            table.add_row(t.name, shape(t.shape), exact(t.numel), t.role)
        return table
    for pattern, members in _by_pattern(tensors, lambda t: (t.shape, t.role)).items():
        first = members[0]
        kind = shape(first.shape) if len(members) == 1 else f"{len(members)} × {shape(first.shape)}"
        table.add_row(pattern, kind, exact(sum(t.numel for t in members)), first.role)
    return table


def _changed_table(diff: Diff, all_tensors: bool) -> Table | None:
    if not diff.changed:
        return None
    title = (f"Changed shape ({len(diff.changed)} tensors, "
             f"{exact(sum(c.from_numel for c in diff.changed))} → {exact(sum(c.to_numel for c in diff.changed))})")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    add_names_column(table, "name")
    table.add_column("from")
    table.add_column("to")
    table.add_column("change", justify="right")
    if all_tensors or len(diff.changed) <= ROW_LIMIT:
        for c in diff.changed:
            table.add_row(c.name, shape(c.from_shape), shape(c.to_shape), f"{c.delta:+,}")
        return table
    for pattern, members in _by_pattern(diff.changed, lambda c: (c.from_shape, c.to_shape)).items():
        first = members[0]
        times = "" if len(members) == 1 else f"{len(members)} × "
        table.add_row(pattern, times + shape(first.from_shape), times + shape(first.to_shape),
                      f"{sum(m.delta for m in members):+,}")
    return table


def _ties(diff: Diff) -> Group | None:
    if not diff.tied_added and not diff.tied_removed:
        return None
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    add_names_column(grid)  # the tied tensors' names, folded where they must be, their sizes whole
    for tie, where in [(t, "new in b:") for t in diff.tied_added] + [(t, "gone from a:") for t in diff.tied_removed]:
        size = f"{shape(tie.shape)} = {exact(tie.numel)}" if len(tie.shape) > 1 else exact(tie.numel)
        grid.add_row(f"  {where}", f"{', '.join(tie.aliases)} = {tie.canonical} ({size}): one tensor, counted once")
    for alias, canonical, numel in diff.new_ties:
        grid.add_row("  reused:", f"{alias} is {canonical}, which a has too: adds 0, not {exact(numel)}")
    return Group(Text("Tied groups", style="bold"), grid, Text(""))


def _heads(label: str, heads) -> Group:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    add_names_column(grid)  # arithmetic over the tensors it names: the names fold where they must, figures whole
    for part in heads.parts:
        grid.add_row(f"  {part.module}:", part.arithmetic)
    if heads.suggestion_note:
        grid.add_row("  note:", heads.suggestion_note)
    return Group(Text(f"What the heads of {label} add ({exact(heads.total)})", style="bold"), grid, Text(""))


def _by_pattern(items, signature) -> dict[str, list]:
    """Group names that differ only by their layer index (and share a signature): 'layer.{12–23}.query.weight'."""
    groups: dict[tuple, list] = {}
    for item in items:
        key = (LAYER_INDEX.sub(".#.", item.name, count=1), signature(item))
        groups.setdefault(key, []).append(item)
    out: dict[str, list] = {}
    for (pattern, _), members in groups.items():
        indices = sorted({int(m.group(1)) for x in members for m in [LAYER_INDEX.search(x.name)] if m})
        if len(members) == 1 or not indices:
            label = members[0].name if len(members) == 1 else f"{members[0].name} (and {len(members) - 1} more)"
        else:
            contiguous = indices == list(range(indices[0], indices[-1] + 1))
            span = f"{indices[0]}–{indices[-1]}" if contiguous else ",".join(map(str, indices))
            label = pattern.replace(".#.", f".{{{span}}}.", 1)
        while label in out:
            label += " "
        out[label] = members
    return out
