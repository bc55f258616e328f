"""diff's page: both models' treemaps at one scale, what differs in full colour, and the tensor tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...explain import exact
from ..treemap import changed, module_treemap
from .page import Section, escape, html_page, small_multiple

if TYPE_CHECKING:
    from ...report import Report

def render_diff_html(diff, a: Report, b: Report, *, heads=None, fragment: bool = False) -> str:
    """diff: the sentence, both models' treemaps at one scale with what changes in full colour, and the tables."""
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
                                          'rest pale.</p>' f'<div class="multiples">{"".join(cells)}</div>'),
        Section("Tensor by tensor", render_diff_html_text(diff, heads=heads)),
    ]
    return html_page(f"Diff: {diff.a.spec} → {diff.b.spec}", f"{diff.a.class_name} → {diff.b.class_name}", sections,
                 fragment)
