"""diff's page: both models' treemaps at one scale, what differs in full colour, what differs at its own scale, and
the tensor tables."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ...explain import exact, shape_term
from ...roles import role_group
from .._console import percent
from ..treemap import Box, Treemap, changed, module_treemap
from .page import Section, color_key, escape, figure, html_page, small_multiple, treemap_figure

if TYPE_CHECKING:
    from ...report import Report

# Module boxes drawn per side in the view of what differs; the smallest beyond are one box "n more modules".
MAX_MODULES = 200
DIFFERS_HEIGHT = 440  # px: the view of what differs, as wide as the page


def render_diff_html(diff, a: Report, b: Report, *, heads=None, fragment: bool = False) -> str:
    """diff: the sentence, both models' treemaps at one scale with what changes in full colour, what differs at
    its own scale (a treemap of those tensors alone, and its exact figures), and the tables."""
    from ..diff import render_diff_html_text

    changed_b = {t.name for t in diff.added} | {c.name for c in diff.changed}
    changed_a = {t.name for t in diff.removed} | {c.a_name for c in diff.changed}
    largest = max(a.total, b.total)
    cells = [small_multiple(f"{tag}: {side.spec}", f"{side.class_name} · {exact(report.total)}",
                            module_treemap(report, changed(names, what)), f"treemap-{tag}", total=report.total,
                            largest=largest, side=520, least=160)
             for tag, side, report, names, what in (("a", diff.a, a, changed_a, "removed or reshaped"),
                                                    ("b", diff.b, b, changed_b, "added or reshaped"))]
    rows = [("a", diff.a.total), ("b", diff.b.total), ("b − a", diff.delta)]
    table = "".join(f'<tr><th>{label}</th><td class="num">{value:+,}</td></tr>' if label == "b − a" else
                    f'<tr><th>{label}</th><td class="num">{exact(value)}</td></tr>' for label, value in rows)
    sections = [
        Section("What changes", f"<p>{escape(diff.sentence)}</p>"
                                f'<table class="totals" id="diff" data-delta="{diff.delta}">{table}</table>'),
        Section("Both models, one scale", '<p class="dim">Area ∝ parameters; what differs is in full colour, the '
                                          'rest pale. A small difference is a sliver here: the next part draws it '
                                          'at its own scale.</p>' f'<div class="multiples">{"".join(cells)}</div>'),
        Section("What differs, at its own scale", _differs(diff)),
        Section("Tensor by tensor", render_diff_html_text(diff, heads=heads)),
    ]
    return html_page(f"Diff: {diff.a.spec} → {diff.b.spec}", f"{diff.a.class_name} → {diff.b.class_name}", sections,
                 fragment)


# --- what differs, alone --------------------------------------------------------------------------------------

def _sides(diff) -> list[tuple[str, str, int, list[tuple[str, tuple[int, ...], int, str]]]]:
    """(tag, title, the model's total, [(name, shape, numel, role)]) for each side that has tensors of its own:
    a's removed and reshaped ones (at a's shape), b's added and reshaped ones (at b's shape)."""
    a = [(t.name, t.shape, t.numel, t.role) for t in diff.removed] + [
        (c.a_name, c.from_shape, c.from_numel, c.role) for c in diff.changed]
    b = [(t.name, t.shape, t.numel, t.role) for t in diff.added] + [
        (c.name, c.to_shape, c.to_numel, c.role) for c in diff.changed]
    return [(tag, title, total, tensors) for tag, title, total, tensors in (
        ("a", f"a: removed or reshaped ({diff.a.spec})", diff.a.total, a),
        ("b", f"b: added or reshaped ({diff.b.spec})", diff.b.total, b)) if tensors]


def _span(values: set[int]) -> str:
    """A layer index position: '6–11' for a run, '3' alone, '*' for indices not consecutive."""
    low, high = min(values), max(values)
    if low == high:
        return str(low)
    return f"{low}–{high}" if high - low + 1 == len(values) else "*"


def _modules(tensors) -> list[tuple[str, int, list[tuple[str, tuple[int, ...], int, int, str]]]]:
    """Tensors by module, folded over layer indices as the treemaps fold runs: (label, instances,
    [(tensor, shape, numel each, count, role)]), largest first. h.6.attn.c_attn … h.11.attn.c_attn are one module
    'h.6–11.attn.c_attn' of 6 instances; a model's own tensors (no module) are '(own tensors)'."""
    families: dict[tuple[str, ...], dict] = {}
    for name, shape, numel, role in tensors:
        path, _, local = name.rpartition(".")
        parts = path.split(".") if path else []
        pattern = tuple("*" if part.isdigit() else part for part in parts)
        entry = families.setdefault(pattern, {"indices": [set() for part in pattern if part == "*"],
                                              "instances": set(), "tensors": {}})
        numbers = tuple(int(part) for part in parts if part.isdigit())
        entry["instances"].add(numbers)
        for position, number in enumerate(numbers):
            entry["indices"][position].add(number)
        count, _ = entry["tensors"].get((local, shape, role), (0, numel))
        entry["tensors"][(local, shape, role)] = (count + 1, numel)
    modules = []
    for pattern, entry in families.items():
        spans = iter(_span(values) for values in entry["indices"])
        label = ".".join(next(spans) if part == "*" else part for part in pattern) or "(own tensors)"
        parts = [(local, shape, numel, count, role)
                 for (local, shape, role), (count, numel) in entry["tensors"].items()]
        modules.append((label, len(entry["instances"]), sorted(parts, key=lambda t: -t[2] * t[3])))
    return sorted(modules, key=lambda m: -sum(t[2] * t[3] for t in m[2]))


def differs_treemap(diff) -> Treemap | None:
    """A treemap of the tensors that differ and nothing else: side → module (folded over layers) → tensor, at
    their own scale; None when no parameter differs (only ties, or nothing)."""
    sides = _sides(diff)
    if not sides:
        return None
    total = sum(numel for *_, tensors in sides for _, _, numel, _ in tensors)
    root = "what differs"
    boxes = [Box(root, "", root, total, f"<b>what differs</b><br>{exact(total)} parameters: removed, added or "
                                        "reshaped, on both sides", _dominant_group(
                     [(role, numel) for *_, tensors in sides for _, _, numel, role in tensors]))]
    for tag, title, model_total, tensors in sides:
        side_id = f"{root}/{tag}"
        value = sum(numel for _, _, numel, _ in tensors)
        boxes.append(Box(side_id, root, title, value, f"<b>{escape(title)}</b><br>{exact(value)} parameters, "
                                                      f"{percent(value / model_total)} of {exact(model_total)}",
                         _dominant_group([(role, numel) for _, _, numel, role in tensors])))
        modules = _modules(tensors)
        shown, rest = modules[:MAX_MODULES], modules[MAX_MODULES:]
        for label, instances, parts in shown:
            module_id = f"{side_id}/{label}"
            module_value = sum(numel * count for _, _, numel, count, _ in parts)
            times = f" × {instances}" if instances > 1 else ""
            arithmetic = " + ".join(f"{shape_term(shape)}" for _, shape, _, _, _ in parts)
            hover = (f"<b>{escape(label)}</b>{times}<br>{arithmetic} = {exact(module_value // instances)}"
                     + (f" per module × {instances} = {exact(module_value)}" if instances > 1 else "")
                     + f"<br>{percent(module_value / model_total)} of {exact(model_total)}")
            boxes.append(Box(module_id, side_id, label + times, module_value, hover,
                             _dominant_group([(role, numel * count) for _, _, numel, count, role in parts])))
            if len(parts) > 1:
                for local, shape, numel, count, role in parts:
                    each = f"{shape_term(shape)} = {exact(numel)}"
                    hover = (f"<b>{escape(label)}.{escape(local)}</b> ({escape(role)})<br>"
                             + (f"{each} × {count} = {exact(numel * count)}" if count > 1 else each))
                    boxes.append(Box(f"{module_id}/{local}", module_id, local + (f" × {count}" if count > 1 else ""),
                                     numel * count, hover, role_group(role)))
        if rest:
            value = sum(numel * count for _, _, parts in rest for _, _, numel, count, _ in parts)
            groups = _dominant_group([(role, numel * count) for _, _, parts in rest
                                      for _, _, numel, count, role in parts])
            boxes.append(Box(f"{side_id}/…", side_id, f"{len(rest)} more modules", value,
                             f"<b>{len(rest)} more modules</b><br>{exact(value)} parameters", groups))
    return Treemap("What differs", total, tuple(boxes))


def _dominant_group(parts) -> str:
    groups: Counter[str] = Counter()
    for role, numel in parts:
        groups[role_group(role)] += numel
    return groups.most_common(1)[0][0] if groups else "other"


def _differs(diff) -> str:
    """The section: the treemap of what differs, as wide as the page, and its figures, exact, module by module."""
    treemap = differs_treemap(diff)
    if treemap is None:
        return ('<p id="differs" data-total="0">No parameter differs: the two models hold the same tensors at the same '
                "shapes (what changes, if anything, is which names share them: see the tables below).</p>")
    spec = treemap_figure(treemap, toggle=False)
    spec["layout"]["height"] = DIFFERS_HEIGHT
    sides = _sides(diff)
    share = " and ".join(f"{percent(sum(t[2] for t in tensors) / total)} of {tag}"
                         for tag, _, total, tensors in sides)
    head = "<tr><th>side</th><th>module</th><th>parameters</th><th>share of its model</th><th>tensors</th></tr>"
    body = ""
    for tag, _, model_total, tensors in sides:
        modules = _modules(tensors)
        for label, instances, parts in modules[:MAX_MODULES]:
            value = sum(numel * count for _, _, numel, count, _ in parts)
            names = ", ".join(f"{local} {shape_term(shape)}" + (f" × {count}" if count > 1 else "")
                              for local, shape, _, count, _ in parts)
            body += (f'<tr data-side="{tag}" data-module="{escape(label)}" data-value="{value}"><td>{tag}</td>'
                     f'<td class="name">{escape(label)}{f" × {instances}" if instances > 1 else ""}</td>'
                     f'<td class="num">{exact(value)}</td><td class="num">{percent(value / model_total)}</td>'
                     f'<td class="dim">{escape(names)}</td></tr>')
        if len(modules) > MAX_MODULES:
            rest = sum(numel * count for _, _, parts in modules[MAX_MODULES:] for _, _, numel, count, _ in parts)
            body += (f'<tr data-side="{tag}"><td>{tag}</td><td>{len(modules) - MAX_MODULES:,} more modules</td>'
                     f'<td class="num">{exact(rest)}</td><td class="num">{percent(rest / model_total)}</td>'
                     '<td class="dim">in the tables below (every tensor: the terminal\'s diff --all)</td></tr>')
    return (f'<p class="dim" id="differs" data-total="{treemap.total}">Only the {exact(treemap.total)} parameters '
            f"that differ, drawn at their own scale: above they are {share}; here they fill the figure. Area ∝ "
            "parameters; colour is the role group.</p>"
            + figure(spec, "treemap-differs", modebar=False) + color_key(treemap)
            + f'<div class="scroll"><table class="compare" id="differs-table">{head}{body}</table></div>')
