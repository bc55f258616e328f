"""The page of memory --training --find-layout: the search's settings, every layout it answered (those that fit, then
those that do not) as a table with the text's columns and more, each layout's peak per device against the GPU's
usable memory as a bar, the layouts not answered or passed over and why, and the fewest devices that fit.

A pure function of the search (cost/parallel/search.py's frozen LayoutSearch) and the model's report. A layout
holds its busiest device's peak only, not its parts, so each bar is that peak beside the capacity it is held
against (the GPU's memory less the reserve), to scale on one axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...explain import exact
from ..layout_search import layout_degrees as degrees
from ..layout_search import minimum_sentence
from ..layout_search import search_precision_words
from ..layout_search import SPANS_MARK
from ..layout_search import seconds_words as seconds_text
from ..layout_search import step_time_words
from ..memory import binary as bytes_text
from .layout_parts import binary_axis
from .page import FONT, Section, escape, figure, html_page, notes_section, subtitle

if TYPE_CHECKING:
    from ...report import Report

_SHARD = {"none": "no data-parallel sharding (DDP)", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
          "fsdp": "FSDP2 (full sharding)", "hsdp": "FSDP2 hybrid sharding"}
_KINDS = ("dp", "tp", "pp", "ep", "cp")
FITS_COLOR, SHORT_COLOR, CAPACITY_COLOR = "#59a14f", "#e15759", "#bab0ac"


def render_layout_search_html(report: Report, search, *, fragment: bool = False) -> str:
    capacity = search.memory - search.reserve
    answered = [*search.fitting, *search.not_fitting]
    sections = [Section("Settings", _settings_table(search)),
                Section("Layouts", _summary(search) + _layouts_table(search, answered)
                        + f'<p class="dim">{escape(step_time_words(search))}. '
                          "no overlap: compute, NVLink and the network one after another. "
                          "bubble: (pp − 1) / (v·m + pp − 1) of the step idle (m microbatches, v chunks a device). "
                          "comm/device: the bytes each device sends a step (as many received), a bound: ring "
                          "collectives, balanced expert routing; parameters and gradients in the dtype they train "
                          "in; kinds apart, since they cross different links (the step time says which). Figures of "
                          "a layout that does not fit stop at its peak (—).</p>")]
    if answered:
        sections.append(Section("Peak per device against the GPU",
                                figure(_peak_bars(search, answered, capacity), "bars-layouts")))
    best = search.best
    if best is not None:
        sections.append(Section("Communication of the first", _comm_table(best)))
    sections.append(Section("Fewest devices", f'<p id="minimum" data-devices="{search.minimum.devices or ""}">'
                                              f"{escape(minimum_sentence(search))}</p>" + _tried_table(search)))
    if search.skipped:
        sections.append(Section("Not answered or passed over", _skipped_table(search)))
    if search.notes:
        sections.append(notes_section(search.notes))
    found = (f"{len(search.fitting):,} of {len(answered):,} answered layouts fit"
             + (f"; the first: {best.layout.words()}" if best is not None else ""))
    title = f"{report.model.label}: layouts to train on {search.devices:,} × {search.accelerator}"
    return html_page(title, f"{subtitle(report)} · {found}", sections, fragment)


def layout_search_page(search, fragment: bool) -> str:
    """The page of a search paramscope.find_layout answered (display.py: Jupyter, .to_html)."""
    return render_layout_search_html(search.report, search, fragment=fragment)


def _settings_table(search) -> str:
    pipeline = search.schedule if search.virtual_stages == 1 else f"{search.schedule}, {search.virtual_stages} chunks"
    rows = [("devices", f"{search.devices:,} × {search.accelerator}"),
            ("GPU memory", f"{bytes_text(search.memory)} ({exact(search.memory)} B); reserve "
                           f"{bytes_text(search.reserve)}: a layout fits where its peak + reserve ≤ memory"),
            ("GPU peak", f"{search.peak_flops / 1e12:,.1f} TFLOP/s ({search.peak_dtype} dense): the step time's "
                         "bound divides by it"),
            ("global batch", f"{search.global_batch:,} sequences × {search.seq:,} tokens a step; each replica "
                             "global batch / dp"),
            ("precision", search_precision_words(search)), ("optimizer", search.optimizer),
            ("gradient checkpointing", search.grad_checkpointing),
            ("data parallel", f"{_SHARD[search.shard]} over dp × cp"),
            ("tensor parallel", "sequence parallel with tp"),
            ("pipeline", f"{pipeline}, microbatches of one sequence"),
            ("gradient accumulation", "without a pipeline, micro-steps of one sequence (accum N: N a step)"),
            ("searched", f"{search.evaluated:,} layouts evaluated in {search.seconds:.1f} s (here and in the "
                         "fewest devices' search)")]
    body = "".join(f"<tr><th>{escape(name)}</th><td>{escape(value)}</td></tr>" for name, value in rows)
    return f'<table class="totals" id="settings">{body}</table>'


def _summary(search) -> str:
    fitting, rest, skipped = search.fitting, search.not_fitting, search.skipped
    passed = sum(1 for entry in skipped if entry.bounded)
    unanswered = len(skipped) - passed
    words = (f"{len(fitting) + len(rest) + len(skipped):,} layouts of {search.devices:,} devices: {len(fitting):,} "
             f"fit (peak + {bytes_text(search.reserve)} reserve ≤ {bytes_text(search.memory)}), {len(rest):,} do not"
             + (f", {unanswered:,} not answered" if unanswered else "")
             + (f", {passed:,} passed over on a lower bound" if passed else ""))
    if not fitting:
        words += (f". None of the {len(rest):,} answered layouts fits; those not answered were not tried"
                  if unanswered else f". No layout of {search.devices:,} devices fits on {search.accelerator}")
    return f'<p id="summary"><b>{escape(words)}</b></p>'


def _layouts_table(search, answered) -> str:
    head = ("<tr><th>#</th><th>layout</th><th>peak/device</th><th>at</th><th>fits</th><th>spare</th>"
            "<th>step ≥ (bound)</th><th>no overlap</th><th>bubble</th><th>comm/device (bound)</th><th>by kind</th>"
            "<th>replica batch</th></tr>")
    body = ""
    for index, c in enumerate(answered, 1):
        kinds = c.comm_by_kind()
        by_kind = ", ".join(f"{kind} {bytes_text(kinds[kind])}" for kind in _KINDS if kind in kinds)
        spare = (bytes_text(c.free) if c.free >= 0 else f"short by {bytes_text(-c.free)}")
        comm = (f'<td class="num" data-value="{c.comm_bytes}" title="{exact(c.comm_bytes)} B">'
                f"{bytes_text(c.comm_bytes)}</td>" if c.fits else '<td class="num">—</td>')
        spans = (f' <span title="tp spans nodes: its collectives exposed, added to compute">{SPANS_MARK}</span>'
                 if c.tp_spans_nodes else "")
        body += (f'<tr data-layout="{escape(degrees(c.layout))}" data-fits="{str(c.fits).lower()}"'
                 + (' data-tp-spans-nodes="true"' if c.tp_spans_nodes else "") + ">"
                 f'<td class="num">{index if c.fits else "—"}</td>'
                 f'<td style="white-space:nowrap" title="{escape(c.layout.words())}">'
                 f'{escape(degrees(c.layout) + c.accumulation_words)}{spans}</td>'
                 f'<td class="num" data-value="{c.peak}" title="{exact(c.peak)} B">{bytes_text(c.peak)}</td>'
                 f"<td>{escape(c.peak_phase)}</td><td>{'yes' if c.fits else 'no'}</td>"
                 f'<td class="num" data-value="{c.free}" title="{exact(c.free)} B">{escape(spare)}</td>'
                 f'<td class="num">{seconds_text(c.step_bound)}</td>'
                 f'<td class="num">{seconds_text(c.no_overlap)}</td>'
                 f'<td class="num">{"—" if not c.fits else f"{100 * c.bubble:.1f}%"}</td>{comm}'
                 f"<td>{escape(by_kind) if c.fits else '—'}</td><td class=\"num\">{c.replica_batch:,}</td></tr>")
    if not body:
        return ""
    return (f'<div class="scroll"><table class="compare" id="layouts"><caption class="dim">Those that fit by the '
            f"step time's bound, then the bytes sent, then the peak; then those that do not, by peak ({SPANS_MARK}: tp "
            "spans nodes, its collectives exposed). Each row's layout in full and its exact bytes in the "
            "tooltips.</caption>"
            f"{head}{body}</table></div>")


def _peak_bars(search, answered, capacity: int) -> dict:
    """Each layout's peak per device on one axis, labelled with its bytes (green fits, red does not), and the capacity
    it must fit in (memory − reserve) as a dashed line across them all."""
    names = [f"{i}. {degrees(c.layout)}" if c.fits else degrees(c.layout) for i, c in enumerate(answered, 1)]
    trace = {"type": "bar", "orientation": "h", "y": names, "x": [c.peak for c in answered], "name": "peak per device",
             "marker": {"color": [FITS_COLOR if c.fits else SHORT_COLOR for c in answered]},
             "text": [bytes_text(c.peak) for c in answered], "textposition": "inside", "insidetextanchor": "end",
             "customdata": [f"{exact(c.peak)} B ({bytes_text(c.peak)}) at {escape(c.peak_phase)}<br>"
                            + (f"spare {bytes_text(c.free)}" if c.fits else f"short by {bytes_text(-c.free)}")
                            + f"<br>{escape(c.layout.words())}" for c in answered],
             "hovertemplate": "<b>%{y}</b><br>%{customdata}<extra></extra>"}
    largest = max(max(c.peak for c in answered), capacity)
    usable = f"usable: {bytes_text(capacity)} ({bytes_text(search.memory)} − {bytes_text(search.reserve)} reserve)"
    layout = {"height": 110 + 24 * len(answered), "margin": {"t": 50, "l": 10, "r": 10, "b": 50},
              "xaxis": binary_axis(largest, "peak per device (the busiest device's)"),
              "yaxis": {"automargin": True, "autorange": "reversed"}, "font": FONT, "showlegend": False,
              "shapes": [{"type": "line", "x0": capacity, "x1": capacity, "xref": "x", "yref": "paper", "y0": 0,
                          "y1": 1, "layer": "above", "line": {"color": "#222", "dash": "dash", "width": 2}}],
              "annotations": [{"x": capacity, "xref": "x", "y": 1, "yref": "paper", "yanchor": "bottom",
                               "xanchor": "right", "showarrow": False, "text": escape(usable), "font": FONT}]}
    return {"data": [trace], "layout": layout}


def _comm_table(candidate) -> str:
    stage = f" (stage {candidate.comm_stage}'s, the most)" if candidate.layout.pp > 1 else ""
    rows = "".join(f'<tr data-kind="{t.kind}"><th>{t.kind}</th><td class="num" data-value="{t.bytes}">'
                   f'{exact(t.bytes)}</td><td class="num dim">{bytes_text(t.bytes)}</td>'
                   f"<td>{escape(t.what)}: {escape(t.formula)} = {escape(t.arithmetic)}</td></tr>"
                   for t in candidate.comm)
    rows += (f'<tr style="font-weight:600"><th>all</th><td class="num" data-value="{candidate.comm_bytes}">'
             f'{exact(candidate.comm_bytes)}</td><td class="num dim">{bytes_text(candidate.comm_bytes)}</td>'
             "<td>a bound, not a prediction</td></tr>")
    return (f'<p>{escape(candidate.layout.words())}: each device\'s communication a step{stage}.</p>'
            f'<div class="scroll"><table class="compare" id="comm"><tr><th>kind</th><th>bytes</th><th></th>'
            f"<th>what, formula = arithmetic</th></tr>{rows}</table></div>")


def _tried_table(search) -> str:
    rows = "".join(f'<tr data-devices="{t.devices}"><td class="num">{t.devices:,}</td><td>{escape(t.outcome)}</td>'
                   f'<td class="num">{t.layouts:,}</td><td class="num">{t.unanswered:,}</td>'
                   f"<td>{escape(t.words)}</td></tr>" for t in search.minimum.tried)
    if not rows:
        return ""
    return ('<div class="scroll"><table class="compare" id="tried"><caption class="dim">Each device count tried, '
            "upward, at the same global batch</caption><tr><th>devices</th><th>outcome</th><th>layouts tried</th>"
            f"<th>not answered</th><th>words</th></tr>{rows}</table></div>")


def _skipped_table(search) -> str:
    rows = "".join(f'<tr data-bounded="{str(s.bounded).lower()}"><td>{escape(_skipped_degrees(s))}</td>'
                   f"<td>{'passed over' if s.bounded else 'not answered'}</td><td>{escape(s.reason)}</td></tr>"
                   for s in search.skipped)
    return ('<div class="scroll"><table class="compare" id="skipped"><caption class="dim">Not answered: no engine '
            "answers the layout here (one of them may fit). Passed over: its lower bound exceeds the GPU, so it "
            "cannot fit and was not derived.</caption><tr><th>layout</th><th>outcome</th><th>why</th></tr>"
            f"{rows}</table></div>")


def _skipped_degrees(entry) -> str:
    return " · ".join([f"dp {entry.dp}"] + [f"{name} {getattr(entry, name)}" for name in ("tp", "pp", "cp", "ep")
                                            if getattr(entry, name) > 1])
