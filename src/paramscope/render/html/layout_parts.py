"""What a multi-GPU layout's memory page draws alike for training and for serving: one device's peak stacked by part
beside the one-device figure (one scale, so the saving shows) and again at its own scale (so its parts show), each
pipeline stage's peak stacked by part with the worst marked, the stages table, and how each role is cut.

A part is (label, bytes, arithmetic); the pages cut their figures into parts that add up to them exactly, these
functions draw them."""

from __future__ import annotations

from ...explain import exact
from ..memory import binary as bytes_text
from .page import FONT, LEGEND_ABOVE, escape

Part = tuple[str, int, str]

PART_COLORS = {"weights": "#4e79a7", "buffers": "#bab0ac", "optimizer state": "#f28e2b",
               "master weights": "#edc948", "KV cache": "#b07aa1", "gradients": "#e15759",
               "activations and temporaries": "#59a14f", "activations": "#59a14f",
               "activations and workspace": "#59a14f", "prefill workspace": "#59a14f",
               "activations saved": "#59a14f", "the rest of the moment": "#8cd17d",
               "gradients and the rest of the moment": "#ff9d9a"}
COMM_COLORS = ("#76b7b2", "#9c755f", "#d37295", "#a0cbe8", "#499894")  # communication buffers, in turn


def wrapped(text: str, width: int = 110) -> str:
    """Hover text: escaped, broken into lines of about `width` characters."""
    import textwrap

    return "<br>".join(escape(line) for line in textwrap.wrap(text, width)) if text else ""


def part_traces(names: list[str], stacks: list[list[Part]], orientation: str) -> list[dict]:
    """One stacked trace per part over the bars (a part a bar lacks is 0 there); hover: exact bytes, arithmetic."""
    order: list[str] = []
    for parts in sorted(stacks, key=len, reverse=True):  # the fullest stack's order (every stack's is the same)
        for label, _, _ in parts:
            if label not in order:
                order.append(label)
    comm = iter(COMM_COLORS)
    traces = []
    for label in order:
        found = [next(((v, h) for name, v, h in parts if name == label), (0, "")) for parts in stacks]
        if not any(v for v, _ in found):
            continue
        values = [v for v, _ in found]
        color = PART_COLORS.get(label) or next(comm, "#79706e")
        axis = {"y": names, "x": values} if orientation == "h" else {"x": names, "y": values}
        traces.append({"type": "bar", "orientation": orientation, "name": label, **axis,
                       "marker": {"color": color, "line": {"width": 0}},
                       "customdata": [f"{exact(v)} B ({bytes_text(v)})" + (f"<br>{wrapped(h)}" if h and v else "")
                                      for v, h in found],
                       "hovertemplate": f"<b>{escape(label)}</b><br>%{{customdata}}<extra>%{{"
                                        f"{'y' if orientation == 'h' else 'x'}}}</extra>"})
    return traces


def binary_axis(largest: int, title: str) -> dict:
    """A bytes axis ticked in binary units (20 GiB, 40 GiB, …), as the figures beside it are written, from 0 to a
    little past `largest`."""
    top = max(1, largest) * 1.12
    for power, unit in enumerate(("B", "KiB", "MiB", "GiB", "TiB")):
        size = 1024 ** power
        for nice in (1, 2, 5, 10, 20, 50, 100, 200, 500):
            if top / (nice * size) <= 6 or (unit == "TiB" and nice == 500):
                break
        else:
            continue
        break
    step = nice * size
    ticks = list(range(0, int(top) + 1, step))
    return {"title": {"text": title}, "range": [0, top], "tickvals": ticks,
            "ticktext": ["0" if t == 0 else f"{t // size:,} {unit}" for t in ticks], "automargin": True}


def versus_bars(one: tuple[str, list[Part], str], each: tuple[str, list[Part], str], own: str,
                axis_title: str) -> dict:
    """Two bars on one axis, (name, parts, label) each: the figure on one device and one device's under the
    layout; below, the device's bar again at its own scale, named `own`. Each bar's length is the sum of its parts,
    its label just past its end."""
    (one_name, one_parts, one_text), (each_name, each_parts, each_text) = one, each
    one_total = sum(v for _, v, _ in one_parts)
    each_total = sum(v for _, v, _ in each_parts)
    traces = part_traces([one_name, each_name], [one_parts, each_parts], "h")
    for trace in traces:
        trace["legendgroup"] = trace["name"]
    for trace in part_traces([own], [each_parts], "h"):
        trace.update(xaxis="x2", yaxis="y2", legendgroup=trace["name"], showlegend=False)
        traces.append(trace)
    notes = [(one_name, one_total, one_text, "y"), (each_name, each_total, each_text, "y"),
             (own, each_total, bytes_text(each_total), "y2")]
    annotations = [{"x": value, "y": name, "xref": "x" if axis == "y" else "x2", "yref": axis, "text": text,
                    "showarrow": False, "xanchor": "left", "xshift": 6, "font": FONT}
                   for name, value, text, axis in notes]
    layout_spec = {"barmode": "stack", "height": 420, "margin": {"t": 60, "l": 10, "r": 10, "b": 50},
                   "xaxis": {**binary_axis(max(one_total, each_total) * 1.25, ""), "anchor": "y"},
                   "yaxis": {"automargin": True, "autorange": "reversed", "domain": [0.42, 1]},
                   "xaxis2": {**binary_axis(each_total * 1.1, axis_title), "anchor": "y2"},
                   "yaxis2": {"automargin": True, "domain": [0, 0.2]}, "bargap": 0.3,
                   "annotations": annotations, "font": FONT, "legend": {**LEGEND_ABOVE, "traceorder": "normal"}}
    return {"data": traces, "layout": layout_spec}


def stage_label(stage: dict) -> str:
    """A pipeline stage (the JSON's: stage, layers [first, last] or null, first, last) as a bar's name."""
    layers = f"layers {stage['layers'][0]}–{stage['layers'][1]}" if stage["layers"] else "no layers"
    extra = " + embeddings" if stage["first"] else ""
    extra += " + head" if stage["last"] else ""
    return f"stage {stage['stage']}<br>{layers}{extra}"


def stage_bars(stages: list[dict], stacks: list[list[Part]], axis_title: str) -> dict:
    """Each pipeline stage's peak (the JSON stage's "peak") stacked by its parts; the worst stage marked."""
    names = [stage_label(s) for s in stages]
    traces = part_traces(names, stacks, "v")
    worst = max(stages, key=lambda s: s["peak"])
    annotations = [{"x": name, "y": s["peak"], "yanchor": "bottom", "showarrow": False, "yshift": 2,
                    "text": (f"<b>worst: {bytes_text(s['peak'])}</b>" if s is worst else bytes_text(s["peak"])),
                    "font": FONT} for name, s in zip(names, stages)]
    layout_spec = {"barmode": "stack", "height": 420, "margin": {"t": 60, "l": 10, "r": 10, "b": 60},
                   "yaxis": binary_axis(worst["peak"], axis_title),
                   "xaxis": {"automargin": True}, "annotations": annotations, "font": FONT,
                   "legend": {**LEGEND_ABOVE, "traceorder": "normal"}}
    return {"data": traces, "layout": layout_spec}


def stages_table(stages: list[dict], counts: tuple[tuple[str, str], ...], columns: tuple[tuple[str, str], ...],
                 tail: tuple[tuple[str, str], ...], caption: str) -> str:
    """The stages as a table (id "stages"): stage, layers, then `counts` (heading, key: plain numbers), `columns`
    (bytes: exact in each cell's tooltip and data-value), `tail` (heading, key: words); the worst stage's row bold.
    `caption`: HTML."""
    worst = max(stages, key=lambda s: s["peak"])
    head = ("<tr><th>stage</th><th>layers</th>" + "".join(f"<th>{h}</th>" for h, _ in counts)
            + "".join(f"<th>{h}</th>" for h, _ in columns) + "".join(f"<th>{h}</th>" for h, _ in tail) + "</tr>")
    body = ""
    for s in stages:
        layers = stage_label(s).split("<br>")[1]
        numbers = "".join(f'<td class="num">{s[k]}</td>' for _, k in counts)
        cells = "".join(f'<td class="num" data-value="{s[k]}" title="{exact(s[k])} B">{bytes_text(s[k])}</td>'
                        for _, k in columns)
        words = "".join(f"<td>{escape(s[k])}</td>" for _, k in tail)
        mark = ' class="worst" style="font-weight:600"' if s is worst else ""
        body += (f'<tr data-stage="{s["stage"]}"{mark}><td class="num">{s["stage"]}</td><td>{escape(layers)}</td>'
                 f"{numbers}{cells}{words}</tr>")
    return (f'<div class="scroll"><table class="compare" id="stages"><caption class="dim">{caption}</caption>'
            f"{head}{body}</table></div>")


def rules_table(rules: dict[str, str], caption: str) -> str:
    """How each role is cut (id "rules"): a row a role, its rule in the sharding rules' words. `caption`: HTML."""
    body = "".join(f'<tr data-role="{escape(role)}"><th>{escape(role)}</th><td>{escape(rule)}</td></tr>'
                   for role, rule in rules.items())
    return (f'<table class="totals" id="rules"><caption class="dim">{caption}</caption><tr><th>role</th>'
            f"<th>rule</th></tr>{body}</table>")
