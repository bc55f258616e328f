"""inspect's page (and a Report's notebook display): totals, both treemaps, conventions, ties, the tree."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...explain import exact, human
from ..treemap import active_share, module_treemap, role_treemap
from .page import (Section, color_key, escape, figure, html_page, notes_section, subtitle, totals_table, tree_html,
                   treemap_figure)

if TYPE_CHECKING:  # type hints only (counted by tests/test_layout.py all the same)
    from ...report import Report

def render_report_html(report: Report, *, fragment: bool = False) -> str:
    """inspect: the totals, both treemaps, the conventions, tied weights and the module tree."""
    emphasis = active_share(report)
    by_module = module_treemap(report, emphasis)
    sections = [
        Section("Totals", _totals(report)),
        Section("Parameters by module", figure(treemap_figure(by_module), "treemap-module")
                + color_key(by_module)),
        Section("Parameters by role", figure(treemap_figure(role_treemap(report, emphasis)),
                                              "treemap-role")),
        *_explanations(report),
        Section("Module tree", tree_html(by_module), open=False),
        Section("As in the terminal", _terminal(report), open=False),
    ]
    return html_page(f"{report.model.label}: {report.model.class_name}", subtitle(report), sections, fragment)


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
    layers = "" if report.num_layers is None else f"<p>{report.num_layers} layers.</p>"
    return totals_table(rows, "totals", {"total": counts.total}, human) + layers


def _explanations(report: Report) -> list[Section]:
    sections = []
    if report.tied:
        items = "".join(
            f"<li><code>{escape(', '.join(g.aliases))}</code> is the same tensor as <code>{escape(g.canonical)}</code> "
            f"({'×'.join(map(str, g.shape))} = {exact(g.numel)}): counted once, under "
            f"<code>{escape(g.canonical)}</code>; its box is marked <i>tied</i>.</li>" for g in report.tied)
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
            f"experts, k = {k} per token; experts stored as {escape(moe.layout)}. {escape(moe.source)}.</p>"
            f"<p>Active per token: {active}, where active = {escape(moe.definition)}. In the treemaps, routed experts "
            "are pale in proportion to the share a token does not use.</p>")))
    if report.shared_layers:
        items = "".join(f"<li><code>{escape(s.path)}</code>: {escape(s.text)} ({escape(s.how)}); counted once.</li>"
                        for s in report.shared_layers)
        sections.append(Section("Shared layers", f"<ul>{items}</ul>"))
    notes = list(report.model.notes)
    if report.unclassified:
        notes.append(f"{len(report.unclassified)} tensors have no role: they are in the group 'other'.")
    if notes:
        sections.append(notes_section(notes))
    return sections


def _terminal(report: Report) -> str:
    from ..text import TextOptions, render_html

    return render_html(report, TextOptions(width=120, depth=3, explain=True))


def report_page(report: Report, fragment: bool) -> str:
    """A Report in a notebook and `Report.to_html()` (display.PAGES)."""
    return render_report_html(report, fragment=fragment)
