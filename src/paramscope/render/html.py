"""Self-contained HTML reports: a pure function of the results → one page (or a notebook fragment).

Every script and style is inside the page: plotly.js is embedded once, in the page's head, so the file works offline,
can be mailed, and makes no network request. Figures are plotly figures built from the plain data of
render.treemap (and the cost results); the numbers in them are the results' exact integers.

Public entry points: render_report_html, render_compare_html, render_diff_html, render_memory_html,
render_flops_html, render_plan_html. Each returns a full page, or with fragment=True a <div> for Jupyter that
carries its own copy of plotly.js (loaded once per page: a second output finds window.Plotly).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from .. import __version__
from ..explain import exact, human
from ..roles import GROUP_TITLES
from .treemap import Treemap, active_share, module_treemap, role_treemap, trainable_share

if TYPE_CHECKING:  # type hints only: report.py imports this module lazily, which must not lead back
    from ..compare import Comparison
    from ..report import Report

# One colour per role group (Tableau 10 and its light companions), so a group has the same colour in every view.
GROUP_COLORS = {
    "embeddings": "#4e79a7", "attention": "#f28e2b", "cross_attention": "#ff9d9a", "mlp": "#59a14f",
    "moe": "#e15759", "norm": "#bab0ac", "head": "#b07aa1", "pooler": "#9c755f", "vision": "#76b7b2",
    "audio": "#edc948", "projector": "#d37295", "mixer": "#86bcb6", "linear_attention": "#a0cbe8",
    "ssm": "#8cd17d", "recurrent": "#b6992d", "conv": "#499894", "other": "#79706e",
}
_SPARE_COLORS = ("#d4a6c8", "#fabfd2", "#f1ce63", "#ffbe7d", "#9d7660", "#d7b5a6", "#a0cbe8")

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}


@dataclass(frozen=True)
class Section:
    """One part of a page: a heading and its HTML."""

    title: str
    body: str
    open: bool = True  # shown opened (a <details> element either way, so each part folds)


# --- pages ------------------------------------------------------------------------------------------------------

def render_report_html(report: Report, *, fragment: bool = False) -> str:
    """inspect: the totals, both treemaps, the conventions, tied weights and the module tree."""
    emphasis = active_share(report)
    label = "inactive per token (routed experts: a token uses k of E)" if emphasis else None
    by_module = module_treemap(report, emphasis, label)
    sections = [
        Section("Totals", _totals(report)),
        Section("Parameters by module", _figure(_treemap_figure(by_module), "treemap-module")
                + _key(by_module)),
        Section("Parameters by role", _figure(_treemap_figure(role_treemap(report, emphasis, label)),
                                              "treemap-role")),
        *_explanations(report),
        Section("Module tree", _tree_html(by_module), open=False),
        Section("As in the terminal", _terminal(report), open=False),
    ]
    return _page(f"{report.model.label}: {report.model.class_name}", _subtitle(report), sections, fragment)


def render_compare_html(comparison: Comparison, reports: Sequence[Report], *, fragment: bool = False) -> str:
    """compare: one treemap per model at one scale (area ∝ parameters), and role groups as bars."""
    largest = max(r.total for r in reports) or 1
    cells = []
    for index, (column, report) in enumerate(zip(comparison.columns, reports)):
        side = max(120, round(560 * (report.total / largest) ** 0.5))
        figure = _treemap_figure(module_treemap(report, active_share(report)), depth=4, side=side, toggle=False)
        cells.append(f'<div class="multiple"><div class="multiple-title">{_e(column.label)}<br>'
                     f'<span class="dim">{_e(column.class_name)} · {exact(report.total)}</span></div>'
                     f'{_figure(figure, f"treemap-{index}")}</div>')
    sections = [
        Section("Totals", _compare_table(comparison)),
        Section("Role groups", _figure(_group_bars(comparison), "bars-groups")),
        Section("Parameters by module, one scale", '<p class="dim">Each treemap\'s area is proportional to its '
                'model\'s parameters (at least 120 px a side, so the smallest stay readable).</p>'
                f'<div class="multiples">{"".join(cells)}</div>'),
    ]
    title = "Comparison: " + ", ".join(column.label for column in comparison.columns)
    return _page(title, f"{len(reports)} models", sections, fragment)


def render_diff_html(diff, a: Report, b: Report, *, heads=None, fragment: bool = False) -> str:
    """diff: the sentence, both models' treemaps at one scale with what changes in full colour, and the tables."""
    from .diff import render_diff_html_text

    changed_b = {t.name for t in diff.added} | {c.name for c in diff.changed}
    changed_a = {t.name for t in diff.removed} | {c.a_name for c in diff.changed}
    largest = max(a.total, b.total) or 1
    cells = []
    for index, (side, report, names, what) in enumerate(((diff.a, a, changed_a, "removed or reshaped"),
                                                         (diff.b, b, changed_b, "added or reshaped"))):
        treemap = module_treemap(report, lambda p, names=names: 1.0 if p.name in names else 0.0,
                                 f"unchanged (pale); full colour: {what}")
        side_px = max(160, round(520 * (report.total / largest) ** 0.5))
        tag = "ab"[index]
        cells.append(f'<div class="multiple"><div class="multiple-title">{tag}: {_e(side.spec)}<br>'
                     f'<span class="dim">{_e(side.class_name)} · {exact(report.total)}</span></div>'
                     f'{_figure(_treemap_figure(treemap, side=side_px, toggle=False), "treemap-" + tag)}</div>')
    rows = [("a", diff.a.total), ("b", diff.b.total), ("b − a", diff.delta)]
    table = "".join(f'<tr><th>{label}</th><td class="num">{value:+,}</td></tr>' if label == "b − a" else
                    f'<tr><th>{label}</th><td class="num">{exact(value)}</td></tr>' for label, value in rows)
    sections = [
        Section("What changes", f"<p>{_e(diff.sentence)}</p>"
                                f'<table class="totals" id="diff" data-delta="{diff.delta}">{table}</table>'),
        Section("Both models, one scale", '<p class="dim">Area ∝ parameters; what differs is in full colour, the '
                                          'rest pale.</p>' f'<div class="multiples">{"".join(cells)}</div>'),
        Section("Tensor by tensor", render_diff_html_text(diff, heads=heads)),
    ]
    return _page(f"Diff: {diff.a.spec} → {diff.b.spec}", f"{diff.a.class_name} → {diff.b.class_name}", sections,
                 fragment)


def render_memory_html(report: Report, estimate, *, fragment: bool = False) -> str:
    """memory: the bytes of each phase as stacked bars, the "fits on" table, the model's treemap."""
    from .memory import memory_to_dict

    memory = memory_to_dict(estimate)
    sections = [
        Section("Memory", _memory_totals(memory)),
        Section("By phase", _figure(_phase_bars(memory), "bars-phases")),
        Section("Fits on", _fits_table(memory)),
        Section("Parameters by module", _figure(_treemap_figure(module_treemap(report, active_share(report))),
                                                "treemap-module"), open=False),
    ]
    if memory.get("notes"):
        sections.append(Section("Notes", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in memory["notes"]) + "</ul>",
                                open=False))
    mode = "training step" if memory["mode"] == "training" else "serving"
    return _page(f"{report.model.label}: memory to {'train' if mode == 'training step' else 'serve'}",
                 f"{_subtitle(report)} · {memory['engine']} engine · peak {_bytes(memory['peak']['bytes'])} in "
                 f"{memory['peak']['phase']}", sections, fragment)


def render_flops_html(report: Report, estimate, compute, *, fragment: bool = False) -> str:
    """flops: the forward by role with the attention term apart, and the forward against context length."""
    sections = [Section("FLOPs", _flop_totals(estimate, compute)),
                Section("Forward by role", _figure(_flop_bars(estimate), "bars-flops"))]
    if estimate.by_context:
        sections.append(Section("Against context length", _figure(_flop_curve(estimate), "line-context")))
    else:
        sections.append(Section("Against context length", "<p class=\"dim\">Only the analytic engine gives the curve; "
                                                          "this model was counted by FlopCounterMode at one length."
                                                          "</p>"))
    if estimate.notes:
        sections.append(Section("Notes", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in estimate.notes) + "</ul>",
                                open=False))
    return _page(f"{report.model.label}: FLOPs", f"{_subtitle(report)} · {estimate.engine} engine · batch "
                 f"{estimate.batch} × {estimate.seq:,} tokens · attention convention: {estimate.causal}",
                 sections, fragment)


def render_plan_html(report: Report, plan, planned: Report, estimate=None, *, fragment: bool = False) -> str:
    """plan: what trains, as the treemap of the model with the plan applied (frozen parts pale)."""
    rows = [("trainable", plan.trainable, "requires_grad, adapters included"),
            ("frozen", plan.frozen, "no gradient, no optimizer state"),
            ("adapters add", plan.adapter, "parameters of the LoRA/DoRA matrices"),
            ("total", plan.total, "base + adapters, as PEFT counts")]
    body = "".join(f'<tr><th>{_e(label)}</th><td class="num" data-value="{value}">{exact(value)}</td>'
                   f'<td class="num dim">{human(value)}</td><td class="dim">{_e(note)}</td></tr>'
                   for label, value, note in rows)
    share = plan.trainable / plan.total * 100 if plan.total else 0.0
    treemap = module_treemap(planned, trainable_share, "frozen (pale): no gradient, no optimizer state")
    sections = [
        Section("Plan", f'<table class="totals" id="plan" data-trainable="{plan.trainable}">{body}</table>'
                        f"<p>{share:.4f}% of the parameters train.</p>"),
        Section("What trains", _figure(_treemap_figure(treemap), "treemap-plan") + _key(treemap)),
    ]
    if estimate is not None:
        from .memory import memory_to_dict

        memory = memory_to_dict(estimate)
        sections += [Section("Memory of a training step", _memory_totals(memory)
                             + _figure(_phase_bars(memory), "bars-phases")),
                     Section("Fits on", _fits_table(memory), open=False)]
    method = plan.method + (f" ({plan.storage})" if plan.storage else "")
    return _page(f"{report.model.label}: fine-tuning plan, {method}", _subtitle(report), sections, fragment)


# --- parts of the cost pages ------------------------------------------------------------------------------------

_PHASE_PARTS = (("weights", "weights"), ("buffers", "buffers"), ("optimizer", "optimizer state"),
                ("master_weights", "master weights"), ("kv_cache", "KV cache"))
_PART_COLORS = {"weights": "#4e79a7", "buffers": "#bab0ac", "optimizer state": "#f28e2b",
                "master weights": "#edc948", "KV cache": "#b07aa1",
                "gradients, activations and temporaries": "#59a14f", "activations and workspace": "#59a14f"}


def _held(memory: dict, key: str) -> int:
    part = memory.get(key)
    return int(part["bytes"]) if isinstance(part, dict) and part.get("bytes") else 0


def _phase_bars(memory: dict) -> dict:
    """Per phase, the bytes held: the state that persists (weights, buffers, optimizer, KV cache) and what the
    phase adds (the rest of its figure). Each bar is exactly the phase's figure."""
    if memory["mode"] == "training":
        moments = [(p["moment"], int(p["bytes"]), p.get("arithmetic", "")) for p in memory.get("phases") or []]
        rest = "gradients, activations and temporaries"
    else:
        moments = [("peak (" + memory["peak"]["phase"] + ")", int(memory["peak"]["bytes"]),
                    (memory.get("activations") or {}).get("arithmetic", ""))]
        rest = "activations and workspace"
    names = [m[0] for m in moments]
    traces = []
    persistent = {label: _held(memory, key) for key, label in _PHASE_PARTS}
    for label, value in persistent.items():
        if value:
            traces.append(_bar(label, names, [value] * len(moments), [""] * len(moments)))
    held = sum(persistent.values())
    traces.append(_bar(rest, names, [total - held for _, total, _ in moments], [a for _, _, a in moments]))
    layout = {"barmode": "stack", "height": 380, "margin": {"t": 40, "l": 10, "r": 10, "b": 60},
              "yaxis": {"title": {"text": "bytes"}, "tickformat": ".3s", "automargin": True}, "font": {"family": "system-ui, sans-serif"},
              "legend": {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom"}}
    return {"data": traces, "layout": layout}


def _bar(label: str, names: list[str], values: list[int], notes: list[str]) -> dict:
    return {"type": "bar", "name": label, "x": names, "y": values, "marker": {"color": _PART_COLORS.get(label)},
            "customdata": [f"{exact(v)} B ({_bytes(v)})" + (f"<br>{_e(n)}" if n else "") for v, n in
                           zip(values, notes)],
            "hovertemplate": f"<b>{_e(label)}</b><br>%{{customdata}}<extra>%{{x}}</extra>"}


def _memory_totals(memory: dict) -> str:
    rows = [(label, _held(memory, key)) for key, label in (("weights", "weights"), ("buffers", "buffers"),
                                                            ("gradients", "gradients"),
                                                            ("optimizer", "optimizer state"),
                                                            ("master_weights", "master weights"),
                                                            ("kv_cache", "KV cache"),
                                                            ("activations", "activations"))]
    rows = [(label, value) for label, value in rows if value]
    rows.append(("peak", int(memory["peak"]["bytes"])))
    rows.append(("peak + reserve", int(memory["peak"]["bytes"]) + int(memory.get("reserve") or 0)))
    body = "".join(f'<tr><th>{_e(label)}</th><td class="num" data-value="{value}">{exact(value)} B</td>'
                   f'<td class="num dim">{_bytes(value)}</td></tr>' for label, value in rows)
    return f'<table class="totals" id="memory" data-peak="{memory["peak"]["bytes"]}">{body}</table>'


def _fits_table(memory: dict) -> str:
    head = "<tr><th>accelerator</th><th>memory</th><th>fits</th><th>free</th><th>largest batch</th>" \
           "<th>largest context</th></tr>"
    rows = "".join(
        f'<tr><td>{_e(f["accelerator"])}</td><td class="num">{_bytes(f["memory"])}</td>'
        f'<td>{"yes" if f["fits"] else "no"}</td><td class="num">{_bytes(f["free"])}</td>'
        f'<td class="num">{"—" if f["largest_batch"] is None else exact(f["largest_batch"])}</td>'
        f'<td class="num">{"—" if f.get("largest_context") is None else exact(f["largest_context"])}</td></tr>'
        for f in memory.get("fits") or [])
    return f'<div class="scroll"><table class="fits">{head}{rows}</table></div>' if rows else \
        '<p class="dim">No accelerator table for these settings.</p>'


def _flop_totals(estimate, compute) -> str:
    rows = [("forward", estimate.forward, "model FLOPs of one forward: 2 per multiply-add"),
            ("of which attention scores", estimate.attention, f"QKᵀ and AV, convention {estimate.causal}")]
    if estimate.backward is not None:
        rows.append(("backward", estimate.backward, "model FLOPs, about 2 × forward"))
        rows.append(("training step", estimate.step, "forward + backward"))
    if estimate.recompute:
        rows.append(("recompute", estimate.recompute, "hardware FLOPs beyond the model's (checkpointing)"))
    rows.append(("per token, forward", compute.per_token_forward, ""))
    if compute.total is not None:
        rows.append((f"for {exact(compute.tokens)} tokens", compute.total, "model FLOPs"))
    body = "".join(f'<tr><th>{_e(label)}</th><td class="num" data-value="{value}">{exact(value)}</td>'
                   f'<td class="num dim">{value:.3e}</td><td class="dim">{_e(note)}</td></tr>'
                   for label, value, note in rows)
    extra = ""
    if compute.mfu is not None:
        extra += f"<p>MFU {compute.mfu * 100:.1f}% of {_e(compute.accelerator)}'s peak ({_e(compute.peak_from)}).</p>"
    return f'<table class="totals" id="flops" data-forward="{estimate.forward}">{body}</table>{extra}'


def _flop_bars(estimate) -> dict:
    terms = sorted(estimate.terms, key=lambda t: t.flops)
    colors = [GROUP_COLORS.get(t.role.split(".")[0], "#79706e") if t.role != "attention.scores" else "#e15759"
              for t in terms]
    trace = {"type": "bar", "orientation": "h", "y": [t.role for t in terms], "x": [t.flops for t in terms],
             "marker": {"color": colors},
             "customdata": [f"{exact(t.flops)} FLOPs ({t.flops / estimate.forward * 100:.2f}%)<br>{_e(t.arithmetic)}"
                            for t in terms],
             "hovertemplate": "<b>%{y}</b><br>%{customdata}<extra></extra>"}
    layout = {"height": 80 + 26 * len(terms), "margin": {"t": 10, "l": 10, "r": 10, "b": 40},
              "xaxis": {"title": {"text": "forward FLOPs"}, "tickformat": ".3s"}, "yaxis": {"automargin": True},
              "font": {"family": "system-ui, sans-serif"}}
    return {"data": [trace], "layout": layout}


def _flop_curve(estimate) -> dict:
    seqs = [p[0] for p in estimate.by_context]
    line = lambda name, values, color: {  # noqa: E731
        "type": "scatter", "mode": "lines+markers", "name": name, "x": seqs, "y": values,
        "line": {"color": color}, "customdata": [exact(v) for v in values],
        "hovertemplate": f"{name}<br>%{{x:,}} tokens: %{{customdata}} FLOPs<extra></extra>"}
    traces = [line("forward", [p[1] for p in estimate.by_context], "#4e79a7"),
              line("attention scores (∝ S²)", [p[2] for p in estimate.by_context], "#e15759"),
              line("the rest (∝ S)", [p[1] - p[2] for p in estimate.by_context], "#59a14f")]
    layout = {"height": 420, "margin": {"t": 40, "l": 10, "r": 10, "b": 50},
              "xaxis": {"title": {"text": f"context length (tokens), batch {estimate.batch}"}, "type": "log"},
              "yaxis": {"title": {"text": "forward FLOPs"}, "type": "log", "tickformat": ".2s", "automargin": True},
              "legend": {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom"},
              "font": {"family": "system-ui, sans-serif"}}
    return {"data": traces, "layout": layout}


def _bytes(value: int) -> str:
    from .memory import binary

    return binary(value)


# --- parts of the inspect page ----------------------------------------------------------------------------------

def _subtitle(report: Report) -> str:
    model = report.model
    engine = "answered from a structure template" if model.engine == "template" else (
        "built on the meta device" if model.engine == "build" else "counted from the module")
    version = f", transformers {model.transformers_version}" if model.transformers_version else ""
    return f"{model.source} · {model.class_reason} · {engine}{version}"


def _totals(report: Report) -> str:
    counts = report.parameters
    rows = [("parameters (unique)", counts.total, "each tensor once, however many names it has")]
    if counts.with_tied_duplicates != counts.total:
        rows.append(("with tied duplicates", counts.with_tied_duplicates,
                     "a naive sum over every parameter name: shared tensors counted again"))
    if report.moe is not None and counts.active is not None:
        rows.append(("active per token", counts.active, report.moe.definition))
    rows.append(("trainable", counts.trainable, "requires_grad"))
    if counts.frozen:
        rows.append(("frozen", counts.frozen, "requires_grad=False"))
    rows.append(("buffers", counts.buffers, "not parameters: position ids, running statistics, …"))
    for convention in report.conventions:
        rows.append((convention.label, convention.value, convention.definition))
    body = "".join(f'<tr><th>{_e(label)}</th><td class="num" data-value="{value}">{exact(value)}</td>'
                   f'<td class="num dim">{human(value)}</td><td class="dim">{_e(note)}</td></tr>'
                   for label, value, note in rows)
    layers = "" if report.num_layers is None else f"<p>{report.num_layers} layers.</p>"
    return f'<table class="totals" id="totals" data-total="{counts.total}">{body}</table>{layers}'


def _explanations(report: Report) -> list[Section]:
    sections = []
    if report.tied:
        items = "".join(
            f"<li><code>{_e(', '.join(g.aliases))}</code> is the same tensor as <code>{_e(g.canonical)}</code> "
            f"({'×'.join(map(str, g.shape))} = {exact(g.numel)}): counted once, under "
            f"<code>{_e(g.canonical)}</code>; its box is marked <i>tied</i>.</li>" for g in report.tied)
        extra = report.parameters.with_tied_duplicates - report.total
        sections.append(Section("Tied weights", f"<ul>{items}</ul><p>A naive sum over every parameter name counts "
                                                 f"them again: {exact(report.parameters.with_tied_duplicates)} "
                                                 f"instead of {exact(report.total)} (+{exact(extra)}).</p>"))
    if report.moe is not None:
        moe = report.moe
        k = "?" if moe.top_k is None else moe.top_k
        active = "unknown (k is not in the config)" if moe.active is None else (
            f"{exact(moe.total)} − {exact(moe.inactive)} = {exact(moe.active)}")
        sections.append(Section("Mixture of experts", (
            f"<p>{len(moe.moe_layers)} MoE and {len(moe.dense_layers)} dense layers; E = {moe.num_experts} routed "
            f"experts, k = {k} per token; experts stored as {_e(moe.layout)}. {_e(moe.source)}.</p>"
            f"<p>Active per token: {active}, where active = {_e(moe.definition)}. In the treemaps, routed experts "
            "are pale in proportion to the share a token does not use.</p>")))
    if report.shared_layers:
        items = "".join(f"<li><code>{_e(s.path)}</code>: {_e(s.text)} ({_e(s.how)}); counted once.</li>"
                        for s in report.shared_layers)
        sections.append(Section("Shared layers", f"<ul>{items}</ul>"))
    notes = list(report.model.notes)
    if report.unclassified:
        notes.append(f"{len(report.unclassified)} tensors have no role: they are in the group 'other'.")
    if notes:
        sections.append(Section("Notes", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>",
                                open=False))
    return sections


def _terminal(report: Report) -> str:
    from .text import TextOptions, render_html

    return render_html(report, TextOptions(width=120, depth=3, explain=True))


def _tree_html(treemap: Treemap) -> str:
    """The module treemap's boxes as nested <details>: runs of layers are one entry "× 12", as in the terminal."""
    children: dict[str, list] = {}
    for box in treemap.boxes:
        children.setdefault(box.parent, []).append(box)

    def entry(box, level: int) -> str:
        hover = box.hover.replace("<br>", " · ").replace("<b>", "").replace("</b>", "")
        summary = (f'<summary><span class="name">{_e(box.label)}</span> <span class="num">{exact(box.value)}</span>'
                   f'{" <span class=tied>tied</span>" if box.tied else ""}'
                   f'<span class="dim"> — {_e(hover)}</span></summary>')
        kids = children.get(box.id, [])
        if not kids:
            return f'<div class="leaf">{summary[9:-10]}</div>'
        inner = "".join(entry(kid, level + 1) for kid in kids)
        return f'<details{" open" if level < 2 else ""}>{summary}{inner}</details>'

    return '<div class="tree">' + "".join(entry(root, 0) for root in children.get("", [])) + "</div>"


def _compare_table(comparison: Comparison) -> str:
    columns = comparison.columns
    head = "<tr><th></th>" + "".join(f"<th>{_e(c.label)}</th>" for c in columns) + "</tr>"
    rows = [("class", [_e(c.class_name) for c in columns]),
            ("parameters (unique)", [exact(c.total) for c in columns]),
            ("≈", [human(c.total) for c in columns]),
            ("with tied duplicates", [exact(c.with_tied_duplicates) for c in columns]),
            ("trainable", [exact(c.trainable) for c in columns]),
            ("layers", ["" if c.layers is None else str(c.layers) for c in columns])]
    for group in comparison.groups:
        rows.append((GROUP_TITLES.get(group, group),
                     [f"{exact(c.groups[group])} ({c.share(c.groups[group]) * 100:.1f}%)" if c.groups.get(group)
                      else "—" for c in columns]))
    body = "".join(f"<tr><th>{_e(label)}</th>" + "".join(f'<td class="num">{cell}</td>' for cell in cells)
                   + "</tr>" for label, cells in rows)
    return f'<div class="scroll"><table class="compare">{head}{body}</table></div>'


# --- figures ----------------------------------------------------------------------------------------------------

def _treemap_figure(treemap: Treemap, *, depth: int = 6, side: int | None = None, toggle: bool = True) -> dict:
    """A plotly treemap (a sunburst at the press of a button) of the boxes; hover shows the exact arithmetic."""
    colors = _colors(treemap)
    trace = {
        "type": "treemap", "ids": [b.id for b in treemap.boxes], "parents": [b.parent for b in treemap.boxes],
        "labels": [b.label + (" · tied" if b.tied else "") for b in treemap.boxes],
        "values": [b.value for b in treemap.boxes], "branchvalues": "total", "maxdepth": depth,
        "customdata": [b.hover for b in treemap.boxes], "hovertemplate": "%{customdata}<extra></extra>",
        "texttemplate": "%{label}<br>%{value:,}", "marker": {"colors": [colors[b.id] for b in treemap.boxes]},
        "sort": False, "name": treemap.title,
    }
    layout: dict = {"margin": {"t": 30 if toggle else 4, "l": 4, "r": 4, "b": 4},
                    "font": {"family": "system-ui, sans-serif", "size": 12}}
    if side is not None:
        layout.update(width=side, height=side)
    else:
        layout["height"] = 560
    if toggle:
        layout["updatemenus"] = [{
            "type": "buttons", "direction": "right", "x": 0, "y": 1.0, "xanchor": "left", "yanchor": "bottom",
            "pad": {"b": 2}, "showactive": True,
            "buttons": [{"label": "treemap", "method": "restyle", "args": [{"type": "treemap"}]},
                        {"label": "sunburst", "method": "restyle", "args": [{"type": "sunburst"}]}],
        }]
    return {"data": [trace], "layout": layout}


def _group_bars(comparison: Comparison) -> dict:
    """One horizontal bar per model, split by role group as shares of its total; hover has the exact counts."""
    labels = [c.label for c in comparison.columns]
    traces = []
    for group in comparison.groups:
        counts = [c.groups.get(group, 0) for c in comparison.columns]
        traces.append({
            "type": "bar", "orientation": "h", "name": GROUP_TITLES.get(group, group), "y": labels,
            "x": [c.share(n) * 100 for c, n in zip(comparison.columns, counts)],
            "customdata": [f"{exact(n)} of {exact(c.total)}" for c, n in zip(comparison.columns, counts)],
            "hovertemplate": f"<b>%{{y}}</b><br>{_e(GROUP_TITLES.get(group, group))}: %{{x:.2f}}%<br>"
                             "%{customdata}<extra></extra>",
            "marker": {"color": GROUP_COLORS.get(group, "#79706e")},
        })
    layout = {"barmode": "stack", "height": 110 + 34 * len(labels), "margin": {"t": 40, "l": 10, "r": 10, "b": 40},
              "xaxis": {"title": {"text": "share of the model's parameters (%)"}, "range": [0, 100]},
              "yaxis": {"autorange": "reversed", "automargin": True},
              "legend": {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom",
                         "traceorder": "normal"},
              "font": {"family": "system-ui, sans-serif", "size": 12}}
    return {"data": traces, "layout": layout}


def _colors(treemap: Treemap) -> dict[str, str]:
    spare = iter(_SPARE_COLORS * 4)
    palette = dict(GROUP_COLORS)
    for group in treemap.groups:
        if group not in palette:
            palette[group] = next(spare, "#79706e")
    return {box.id: _pale(palette.get(box.group, "#79706e"), box.emphasis) for box in treemap.boxes}


def _pale(color: str, emphasis: float) -> str:
    """`color` mixed toward white as emphasis falls: a routed expert used by 8 of 256 tokens' routes is pale."""
    if emphasis >= 0.999:
        return color
    mix = 0.8 * (1 - max(0.0, min(1.0, emphasis)))
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def _key(treemap: Treemap) -> str:
    colors = _colors(treemap)
    first = {}
    for box in treemap.boxes:
        first.setdefault(box.group, colors[box.id] if box.emphasis >= 0.999 else GROUP_COLORS.get(box.group))
    items = "".join(f'<span class="swatch" style="background:{first.get(g) or "#79706e"}"></span>'
                    f'{_e(GROUP_TITLES.get(g, g))} ' for g in treemap.groups)
    pale = f'<br><span class="dim">Pale: {_e(treemap.emphasis)}.</span>' if treemap.emphasis else ""
    return (f'<p class="key">{items}{pale}<br><span class="dim">A click opens a box; the bar at the top goes back. '
            'A run of identical layers is one box "× n" whose parts add up all n layers.</span></p>')


def _figure(figure: dict, div_id: str) -> str:
    """A <div> and the script that draws `figure` in it (plotly.js is in the page's head)."""
    data = json.dumps(figure, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return (f'<div class="figure" id="{div_id}"></div><script>(function(){{var f={data};'
            f'(window.paramscopeFigures=window.paramscopeFigures||[]).push('
            f'Plotly.newPlot("{div_id}",f.data,f.layout,{json.dumps(PLOTLY_CONFIG)}));}})();</script>')


# --- the page ---------------------------------------------------------------------------------------------------

_STYLE = """
.paramscope{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;max-width:1200px;margin:0 auto;
  padding:12px;line-height:1.4}
.paramscope h1{font-size:1.4em;margin:0.2em 0}
.paramscope details.section>summary{font-size:1.15em;font-weight:600;margin:0.8em 0 0.4em;cursor:pointer}
.paramscope .dim{color:#666}
.paramscope .num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.paramscope table{border-collapse:collapse}
.paramscope th,.paramscope td{padding:2px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
.paramscope .scroll{overflow-x:auto}
.paramscope .swatch{display:inline-block;width:0.9em;height:0.9em;margin:0 4px 0 10px;vertical-align:-0.1em}
.paramscope .multiples{display:flex;flex-wrap:wrap;align-items:flex-end;gap:16px}
.paramscope .multiple-title{font-weight:600;font-size:0.9em}
.paramscope .tree details,.paramscope .tree .leaf{margin-left:1.2em}
.paramscope .tree summary{cursor:pointer}
.paramscope .tree .name{font-family:ui-monospace,monospace}
.paramscope .tied{color:#8e44ad;font-size:0.85em;border:1px solid #8e44ad;border-radius:3px;padding:0 3px}
.paramscope footer{margin-top:2em;font-size:0.85em;color:#666}
"""


def _page(title: str, subtitle: str, sections: Iterable[Section], fragment: bool) -> str:
    from plotly.offline import get_plotlyjs

    parts = "".join(f'<details class="section"{" open" if s.open else ""}><summary>{_e(s.title)}</summary>'
                    f"{s.body}</details>" for s in sections)
    body = (f'<div class="paramscope"><h1>{_e(title)}</h1><p class="dim">{_e(subtitle)}</p>{parts}'
            f'<footer>paramscope {__version__}: exact counts from the model\'s own structure; every figure in the '
            "charts is the report's exact integer.</footer></div>"
            # When every figure is drawn, the page says so (and when, in ms since navigation): tests wait on it.
            "<script>Promise.all(window.paramscopeFigures||[]).then(function(){"
            "document.documentElement.setAttribute('data-paramscope-ready',Math.round(performance.now()));});"
            "</script>")
    plotly_js = get_plotlyjs() + "\n"  # plotly.js 4 sets window.Plotly itself
    if fragment:  # Jupyter: each output carries plotly.js, but loads it only where the page has none yet
        return f"<style>{_STYLE}</style><script>if(!window.Plotly){{{plotly_js}}}</script>{body}"
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style><script>{plotly_js}</script></head><body>{body}</body></html>")


def save_page(page: str, path: str | None) -> str:
    """`page`, also written to `path` (UTF-8) when a path is given: what every result's .to_html(path) does."""
    if path is not None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(page)
    return page


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


__all__ = ["render_report_html", "render_compare_html", "render_diff_html", "render_memory_html", "render_flops_html",
           "render_plan_html", "save_page", "GROUP_COLORS"]
