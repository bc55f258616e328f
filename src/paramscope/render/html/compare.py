"""compare's page: one treemap per model at one scale (area ∝ parameters), and role groups as bars."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ...explain import exact, human
from ...roles import GROUP_TITLES
from ..treemap import active_share, module_treemap
from .page import FONT, GROUP_COLORS, LEGEND_ABOVE, Section, escape, figure, html_page, small_multiple

if TYPE_CHECKING:
    from ...compare import Comparison
    from ...report import Report

def render_compare_html(comparison: Comparison, reports: Sequence[Report], *, fragment: bool = False) -> str:
    """compare: one treemap per model at one scale (area ∝ parameters), and role groups as bars."""
    largest = max(r.total for r in reports)
    cells = [small_multiple(column.label, f"{column.class_name} · {exact(report.total)}",
                            module_treemap(report, active_share(report)), f"treemap-{index}", total=report.total,
                            largest=largest, side=560, least=120, depth=4)
             for index, (column, report) in enumerate(zip(comparison.columns, reports))]
    sections = [
        Section("Totals", _compare_table(comparison)),
        Section("Role groups", figure(_group_bars(comparison), "bars-groups")),
        Section("Parameters by module, one scale", '<p class="dim">Each treemap\'s area is proportional to its '
                'model\'s parameters (at least 120 px a side, so the smallest stay readable).</p>'
                f'<div class="multiples">{"".join(cells)}</div>'),
    ]
    title = "Comparison: " + ", ".join(column.label for column in comparison.columns)
    return html_page(title, f"{len(reports)} models", sections, fragment)


def _compare_table(comparison: Comparison) -> str:
    columns = comparison.columns
    head = "<tr><th></th>" + "".join(f"<th>{escape(c.label)}</th>" for c in columns) + "</tr>"
    rows = [("class", [escape(c.class_name) for c in columns]),
            ("parameters (unique)", [exact(c.total) for c in columns]),
            ("≈", [human(c.total) for c in columns]),
            *([("active per token", [_active(c) for c in columns])] if any(c.moe for c in columns) else []),
            ("with tied duplicates", [exact(c.with_tied_duplicates) for c in columns]),
            ("trainable", [exact(c.trainable) for c in columns]),
            ("layers", ["" if c.layers is None else str(c.layers) for c in columns])]
    for group in comparison.groups:
        rows.append((GROUP_TITLES.get(group, group),
                     [f"{exact(c.groups[group])} ({c.share(c.groups[group]) * 100:.1f}%)" if c.groups.get(group)
                      else "—" for c in columns]))
    body = "".join(f"<tr><th>{escape(label)}</th>" + "".join(f'<td class="num">{cell}</td>' for cell in cells)
                   + "</tr>" for label, cells in rows)
    note = ('<p class="dim">Active per token: a mixture of experts counts k of its E routed experts; a dense '
            "model's active count is its total; — where the config gives no top-k.</p>"
            if any(c.moe for c in columns) else "")
    return f'<div class="scroll"><table class="compare">{head}{body}</table></div>{note}'


def _active(column) -> str:
    """The active count (data-active for the tests), its share for a mixture of experts; — unknown."""
    if column.active is None:
        return "—"
    share = f" ({column.share(column.active) * 100:.1f}%)" if column.moe else ""
    return f'<span data-active="{column.active}">{exact(column.active)}</span>{share}'


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
            "hovertemplate": f"<b>%{{y}}</b><br>{escape(GROUP_TITLES.get(group, group))}: %{{x:.2f}}%<br>"
                             "%{customdata}<extra></extra>",
            "marker": {"color": GROUP_COLORS.get(group, "#79706e")},
        })
    layout = {"barmode": "stack", "height": 110 + 34 * len(labels), "margin": {"t": 40, "l": 10, "r": 10, "b": 40},
              "xaxis": {"title": {"text": "share of the model's parameters (%)"}, "range": [0, 100]},
              "yaxis": {"autorange": "reversed", "automargin": True},
              "legend": {**LEGEND_ABOVE, "traceorder": "normal"}, "font": FONT}
    return {"data": traces, "layout": layout}
