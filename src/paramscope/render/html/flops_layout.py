"""What the flops page adds under a multi-GPU layout: the busiest device's forward FLOPs by role (its share of the
model's and how tensor parallelism cuts each), its totals a step, its MFU and HFU where a step time is known, and
each pipeline stage's device stacked by forward, backward and recompute with the busiest marked.

A pure function of the estimate's frozen DeviceFlops (cost/parallel/flops.py) and Compute, the data the text renderer
(render/flops.py) reads, in the text's words.
"""

from __future__ import annotations

from ...explain import exact
from ..flops import RECOMPUTE_WORDS, device_title
from .page import FONT, LEGEND_ABOVE, Section, escape, figure, role_bars

_STAGE_COLORS = {"forward": "#4e79a7", "backward": "#f28e2b", "recompute": "#bab0ac"}


def device_sections(device, compute) -> list[Section]:
    """The page's sections for one device under the layout (`estimate.device`), and its stages under --pp."""
    layout = device.layout
    tokens = f"{device.batch:,} × {device.seq:,} tokens a replica" + (
        f", {device.tokens:,} query tokens on each of {layout.cp} cp ranks" if layout.cp > 1 else "")
    body = (f'<p id="device-title"><b>{escape(device_title(device))}</b><br><span class="dim">{escape(tokens)}'
            "</span></p>" + _terms_table(device) + _totals_table(device, compute)
            + figure(_role_bars(device), "bars-device-flops"))
    sections = [Section("Per device", body)]
    if layout.pp > 1:
        words = device.stages_words
        sections.append(Section("Pipeline stages", f'<p id="stages-words">{escape(words)}</p>'
                                + figure(_stage_bars(device), "bars-stage-flops") + _stages_table(device)))
    if device.conventions:
        sections.append(Section("Conventions of the layout", "<ul>" + "".join(
            f"<li>{escape(c)}</li>" for c in device.conventions) + "</ul>", open=False))
    return sections


def _row(label: str, value: int, note: str, key: str = "") -> str:
    mark = f' data-row="{key}"' if key else ""
    return (f'<tr{mark}><th>{escape(label)}</th><td class="num" data-value="{value}">{exact(value)}</td>'
            f'<td class="num dim">{value:.3e}</td><td class="dim">{escape(note)}</td></tr>')


def _terms_table(device) -> str:
    rows = ""
    for term in device.terms:
        if not term.flops:  # a role the device holds none of (DeepSeek's dense MLPs on a later stage)
            continue
        share = f"{100 * term.flops / term.whole:.2f}%" if term.whole else "—"
        rows += (f'<tr data-role="{escape(term.role)}"><th>{escape(term.role)}</th>'
                 f'<td class="num" data-value="{term.flops}">{exact(term.flops)}</td>'
                 f'<td class="num dim">{term.flops:.3e}</td><td class="num">{share}</td>'
                 f"<td>{escape(term.rule)}</td></tr>")
    rows += (f'<tr style="font-weight:600"><th>forward</th><td class="num" data-value="{device.forward}">'
             f'{exact(device.forward)}</td><td class="num dim">{device.forward:.3e}</td><td></td>'
             "<td>the device's, a step</td></tr>")
    return ('<div class="scroll"><table class="compare" id="device-flops"><caption class="dim">The device\'s forward '
            "by role, a step</caption><tr><th>role</th><th>FLOPs</th><th></th><th>of the model's</th><th>how</th>"
            f"</tr>{rows}</table></div>")


def _totals_table(device, compute) -> str:
    layout = device.layout
    rows = ""
    if device.backward is not None:
        rows += _row("backward", device.backward, "2 × forward", "backward")
        rows += _row("model FLOPs a step", device.step, "forward + backward: what MFU counts", "step")
        rows += _row("recompute", device.recompute or 0, RECOMPUTE_WORDS, "recompute")
        rows += _row("hardware FLOPs a step", device.hardware, "model FLOPs + recompute: what HFU counts", "hardware")
    if layout.micro_batches > 1:
        micro = device.batch // layout.micro_batches
        rows += _row("per microbatch", device.per_microbatch,
                     f"÷ {layout.micro_batches} microbatches of {micro:,} sequence{'s' if micro > 1 else ''}",
                     "per-microbatch")
    replicas = f"{layout.tp * layout.pp * layout.cp:,} devices of a replica (tp × pp × cp)"
    rows += _row("Σ over a replica", device.devices_sum,
                 f"over the {replicas}: the model's {exact(device.replica)}"
                 + (f" + {exact(device.duplicated)} duplicated (matmuls kept whole on every tp rank, counted once a "
                    "rank)" if device.duplicated else ", exactly"), "sum")
    extra = ""
    if compute is not None and compute.device_mfu is not None:
        extra += (f'<tr data-row="device-mfu"><th>MFU per device</th><td class="num" data-value="{compute.device_mfu}">'
                  f"{100 * compute.device_mfu:.2f}%</td><td></td><td class=\"dim\">the busiest device's model FLOPs a "
                  "step ÷ (step time × peak); recompute excluded (PaLM's convention)</td></tr>")
    if compute is not None and compute.device_hfu is not None:
        extra += (f'<tr data-row="device-hfu"><th>HFU per device</th><td class="num" data-value="{compute.device_hfu}">'
                  f"{100 * compute.device_hfu:.2f}%</td><td></td><td class=\"dim\">its hardware FLOPs (with the "
                  "recompute) ÷ (step time × peak)</td></tr>")
    if compute is not None and compute.step_seconds is not None and extra:
        extra += (f'<tr data-row="step-seconds"><th>step time</th><td class="num">{compute.step_seconds:,.3f} s</td>'
                  f"<td></td><td class=\"dim\">{escape(compute.step_from or '')}</td></tr>")
    if compute is not None and compute.device_mfu is None and compute.peak is not None:
        extra += ('<tr data-row="device-mfu"><th>MFU per device</th><td class="num">—</td><td></td><td class="dim">'
                  "needs a step time: --step-seconds S or --tokens-per-second</td></tr>")
    return f'<table class="totals" id="device-totals" data-step="{device.step}">{rows}{extra}</table>'


def _role_bars(device) -> dict:
    terms = sorted((t for t in device.terms if t.flops), key=lambda t: t.flops)
    return role_bars(terms, [f"{exact(t.flops)} FLOPs ({100 * t.flops / device.forward:.2f}% of the device's "
                             f"forward)<br>{escape(t.rule)}" for t in terms], "the device's forward FLOPs a step")


def _stage_name(stage) -> str:
    held = f"layers {stage.layers[0]}–{stage.layers[1]}" if stage.layers else "no layers"
    extra = "".join(w for w, on in ((" + embeddings", stage.first), (" + head", stage.last)) if on)
    return f"stage {stage.rank}<br>{held}{extra}"


def _stage_bars(device) -> dict:
    """Each stage's device (tp rank 0) stacked: forward, backward, recompute; its total labelled, the busiest
    marked."""
    names = [_stage_name(s) for s in device.stages]
    parts = [("forward", [s.forward for s in device.stages])]
    if device.backward is not None:
        parts += [("backward", [s.backward or 0 for s in device.stages]),
                  ("recompute", [s.recompute or 0 for s in device.stages])]
    traces = [{"type": "bar", "name": name, "x": names, "y": values, "marker": {"color": _STAGE_COLORS[name]},
               "customdata": [exact(v) for v in values],
               "hovertemplate": f"<b>{name}</b><br>%{{customdata}} FLOPs<extra>%{{x}}</extra>"}
              for name, values in parts if any(values)]
    totals = [s.step + (s.recompute or 0) for s in device.stages]
    annotations = [{"x": name, "y": total, "yanchor": "bottom", "showarrow": False, "yshift": 2, "font": FONT,
                    "text": (f"<b>busiest: {total:.3e}</b>" if s.rank == device.stage else f"{total:.3e}")}
                   for name, total, s in zip(names, totals, device.stages)]
    layout = {"barmode": "stack", "height": 420, "margin": {"t": 60, "l": 10, "r": 10, "b": 60},
              "yaxis": {"title": {"text": "FLOPs a step (hardware: model + recompute)"}, "tickformat": ".3s",
                        "range": [0, max(totals) * 1.12], "automargin": True},
              "xaxis": {"automargin": True}, "annotations": annotations, "font": FONT,
              "legend": {**LEGEND_ABOVE, "traceorder": "normal"}}
    return {"data": traces, "layout": layout}


def _stages_table(device) -> str:
    head = ("<tr><th>stage</th><th>layers</th><th>forward</th><th>backward</th><th>model FLOPs a step</th>"
            "<th>recompute</th></tr>")
    body = ""
    for s in device.stages:
        held = f"{s.layers[0]}–{s.layers[1]}" if s.layers else "—"
        extra = "".join(w for w, on in ((" + embeddings", s.first), (" + head", s.last)) if on)
        cells = "".join('<td class="num">—</td>' if v is None else
                        f'<td class="num" data-value="{v}" title="{v:.3e}">{exact(v)}</td>'
                        for v in (s.forward, s.backward, s.step if s.backward is not None else None, s.recompute))
        mark = ' class="busiest" style="font-weight:600"' if s.rank == device.stage else ""
        body += (f'<tr data-stage="{s.rank}"{mark}><td class="num">{s.rank}</td>'
                 f"<td>{escape(f'{held} ({s.layer_count}){extra}')}</td>{cells}</tr>")
    return ('<div class="scroll"><table class="compare" id="flops-stages"><caption class="dim">Each stage\'s device '
            "(tp rank 0), a step; the busiest bold</caption>" f"{head}{body}</table></div>")
