"""What every HTML page shares: the page itself (plotly.js inline once), sections, figures, treemap figures.

A page is a pure function of the results. plotly.js is embedded once, in the page's head, so the file works offline,
can be mailed, and makes no network request; a notebook fragment carries its own copy and loads it only where the
page has none yet. Figures are plotly figure dicts built from plain data (render.treemap, the cost results), and the
numbers in them are the results' exact integers. Each command's page is its own module beside this one.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..._version import __version__
from ...explain import exact
from ...roles import GROUP_TITLES
from ..treemap import Treemap

if TYPE_CHECKING:
    from ...report import Report

# One colour per role group (Tableau 10 and its light companions), so a group has the same colour in every view.
GROUP_COLORS = {
    "embeddings": "#4e79a7", "attention": "#f28e2b", "cross_attention": "#ff9d9a", "mlp": "#59a14f",
    "moe": "#e15759", "norm": "#bab0ac", "head": "#b07aa1", "pooler": "#9c755f", "vision": "#76b7b2",
    "audio": "#edc948", "projector": "#d37295", "mixer": "#86bcb6", "linear_attention": "#a0cbe8",
    "ssm": "#8cd17d", "recurrent": "#b6992d", "conv": "#499894", "other": "#79706e",
}


_SPARE_COLORS = ("#d4a6c8", "#fabfd2", "#f1ce63", "#ffbe7d", "#9d7660", "#d7b5a6", "#a0cbe8")


PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}
# Small multiples draw no toolbar: over a treemap of 120–560 px, plotly's modebar (shown on hover, at the top right)
# covers the root box's label, and a treemap's toolbar holds only "download as PNG".
QUIET_CONFIG = {**PLOTLY_CONFIG, "displayModeBar": False}
FONT = {"family": "system-ui, sans-serif", "size": 12}
LEGEND_ABOVE = {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom"}


@dataclass(frozen=True)
class Section:
    """One part of a page: a heading and its HTML."""

    title: str
    body: str
    open: bool = True  # shown opened (a <details> element either way, so each part folds)


def subtitle(report: Report) -> str:
    model = report.model
    engine = "answered from a structure template" if model.engine == "template" else (
        "built on the meta device" if model.engine == "build" else "counted from the module")
    version = f", transformers {model.transformers_version}" if model.transformers_version else ""
    return f"{model.source} · {model.class_reason} · {engine}{version}"


def tree_html(treemap: Treemap) -> str:
    """The module treemap's boxes as nested <details>: runs of layers are one entry "× 12", as in the terminal."""
    children: dict[str, list] = {}
    for box in treemap.boxes:
        children.setdefault(box.parent, []).append(box)

    def entry(box, level: int) -> str:
        hover = box.hover.replace("<br>", " · ").replace("<b>", "").replace("</b>", "")
        line = (f'<span class="name">{escape(box.label)}</span> <span class="num">{exact(box.value)}</span>'
                f'{" <span class=tied>tied</span>" if box.tied else ""}<span class="dim"> — {escape(hover)}</span>')
        kids = children.get(box.id, [])
        if not kids:
            return f'<div class="leaf">{line}</div>'
        inner = "".join(entry(kid, level + 1) for kid in kids)
        return f'<details{" open" if level < 2 else ""}><summary>{line}</summary>{inner}</details>'

    return '<div class="tree">' + "".join(entry(root, 0) for root in children.get("", [])) + "</div>"


def treemap_figure(treemap: Treemap, *, depth: int = 6, side: int | None = None, toggle: bool = True) -> dict:
    """A plotly treemap (a sunburst at the press of a button) of the boxes; hover shows the exact arithmetic."""
    colors = box_colors(treemap)
    trace = {
        "type": "treemap", "ids": [b.id for b in treemap.boxes], "parents": [b.parent for b in treemap.boxes],
        "labels": [b.label + (" · tied" if b.tied else "") for b in treemap.boxes],
        "values": [b.value for b in treemap.boxes], "branchvalues": "total", "maxdepth": depth,
        "customdata": [b.hover for b in treemap.boxes], "hovertemplate": "%{customdata}<extra></extra>",
        "texttemplate": "%{label}<br>%{value:,}", "marker": {"colors": [colors[b.id] for b in treemap.boxes]},
        "sort": False, "name": treemap.title,
    }
    layout: dict = {"margin": {"t": 30 if toggle else 4, "l": 4, "r": 4, "b": 4}, "font": FONT}
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


def _palette(treemap: Treemap) -> dict[str, str]:
    """GROUP_COLORS, and a spare colour for each group it lacks (a role group added after this table)."""
    spare = iter(_SPARE_COLORS)
    palette = dict(GROUP_COLORS)
    for group in treemap.groups:
        if group not in palette:
            palette[group] = next(spare, GROUP_COLORS["other"])
    return palette


def box_colors(treemap: Treemap) -> dict[str, str]:
    palette = _palette(treemap)
    return {box.id: _pale(palette.get(box.group, GROUP_COLORS["other"]), box.emphasis) for box in treemap.boxes}


def _pale(color: str, emphasis: float) -> str:
    """`color` mixed toward white as emphasis falls: a routed expert used by 8 of 256 tokens' routes is pale."""
    if emphasis >= 0.999:
        return color
    mix = 0.8 * (1 - max(0.0, min(1.0, emphasis)))
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def color_key(treemap: Treemap) -> str:
    palette = _palette(treemap)
    items = "".join(f'<span class="swatch" style="background:{palette[g]}"></span>'
                    f'{escape(GROUP_TITLES.get(g, g))} ' for g in treemap.groups)
    pale = f'<br><span class="dim">Pale: {escape(treemap.emphasis)}.</span>' if treemap.emphasis else ""
    return (f'<p class="key">{items}{pale}<br><span class="dim">A click opens a box; the bar at the top goes back. '
            'A run of identical layers is one box "× n" whose parts add up all n layers.</span></p>')


def small_multiple(title: str, note: str, treemap: Treemap, div_id: str, *, total: int, largest: int, side: int,
                   least: int, depth: int = 6) -> str:
    """One of several treemaps drawn at one scale: its area is `total`/`largest` of a `side` × `side` square, and
    never under `least` px a side, so the smallest stay readable."""
    px = max(least, round(side * (total / (largest or 1)) ** 0.5))
    drawn = treemap_figure(treemap, depth=depth, side=px, toggle=False)
    subtitle_line = f'<br><span class="dim">{escape(note)}</span>' if note else ""
    return (f'<div class="multiple"><div class="multiple-title">{escape(title)}{subtitle_line}</div>'
            f"{figure(drawn, div_id, modebar=False)}</div>")


def totals_table(rows, table_id: str, data: dict[str, int], human_text) -> str:
    """(label, value, note) rows as the pages' totals table: the exact value (also in data-value), a short form
    (`human_text`), the note; `data` becomes the table's data-* attributes (the tests read them)."""
    body = "".join(f'<tr><th>{escape(label)}</th><td class="num" data-value="{value}">{exact(value)}</td>'
                   f'<td class="num dim">{human_text(value)}</td><td class="dim">{escape(note)}</td></tr>'
                   for label, value, note in rows)
    attributes = "".join(f' data-{key}="{value}"' for key, value in data.items())
    return f'<table class="totals" id="{table_id}"{attributes}>{body}</table>'


def notes_section(notes) -> Section:
    return Section("Notes", "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>", open=False)


def role_bars(terms, hover: list[str], axis_title: str) -> dict:
    """FLOPs by role as horizontal bars, smallest first, coloured by role group (the attention scores apart):
    `terms` have .role and .flops, `hover` each one's second line (already escaped)."""
    colors = [GROUP_COLORS.get(t.role.split(".")[0], "#79706e") if t.role != "attention.scores" else "#e15759"
              for t in terms]
    trace = {"type": "bar", "orientation": "h", "y": [t.role for t in terms], "x": [t.flops for t in terms],
             "marker": {"color": colors}, "customdata": hover,
             "hovertemplate": "<b>%{y}</b><br>%{customdata}<extra></extra>"}
    layout = {"height": 80 + 26 * len(terms), "margin": {"t": 10, "l": 10, "r": 10, "b": 40},
              "xaxis": {"title": {"text": axis_title}, "tickformat": ".3s"}, "yaxis": {"automargin": True},
              "font": FONT}
    return {"data": [trace], "layout": layout}


def figure(spec: dict, div_id: str, *, modebar: bool = True) -> str:
    """A <div> and the script that draws `spec` in it (plotly.js is in the page's head, or the fragment's);
    `modebar` False: without plotly's toolbar (small multiples).

    The script draws into the element just before it, not the one found by id: a notebook shows several
    fragments on one page, whose ids repeat. The id is for tests and links."""
    data = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return (f'<div class="figure" id="{div_id}"></div><script>(function(){{var f={data};'
            "var target=document.currentScript.previousElementSibling;"
            "(window.paramscopeFigures=window.paramscopeFigures||[]).push("
            f"Plotly.newPlot(target,f.data,f.layout,{json.dumps(PLOTLY_CONFIG if modebar else QUIET_CONFIG)}));}})();"
            "</script>")


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
.paramscope caption{text-align:left;padding:2px 10px;caption-side:top}
.paramscope .swatch{display:inline-block;width:0.9em;height:0.9em;margin:0 4px 0 10px;vertical-align:-0.1em}
.paramscope .multiples{display:flex;flex-wrap:wrap;align-items:flex-end;gap:16px}
.paramscope .multiple-title{font-weight:600;font-size:0.9em}
.paramscope .tree details,.paramscope .tree .leaf{margin-left:1.2em}
.paramscope .tree summary{cursor:pointer}
.paramscope .tree .name{font-family:ui-monospace,monospace}
.paramscope .tied{color:#8e44ad;font-size:0.85em;border:1px solid #8e44ad;border-radius:3px;padding:0 3px}
.paramscope footer{margin-top:2em;font-size:0.85em;color:#666}
"""


def html_page(title: str, subtitle: str, sections: Iterable[Section], fragment: bool) -> str:
    from plotly.offline import get_plotlyjs

    parts = "".join(f'<details class="section"{" open" if s.open else ""}><summary>{escape(s.title)}</summary>'
                    f"{s.body}</details>" for s in sections)
    body = (f'<div class="paramscope"><h1>{escape(title)}</h1><p class="dim">{escape(subtitle)}</p>{parts}'
            f'<footer>paramscope {__version__}: exact counts from the model\'s own structure; every figure in the '
            "charts is the report's exact integer.</footer></div>"
            # When every figure is drawn, the page says so (and when, in ms since navigation): tests wait on it.
            "<script>Promise.all(window.paramscopeFigures||[]).then(function(){"
            "document.documentElement.setAttribute('data-paramscope-ready',Math.round(performance.now()));});"
            "</script>")
    plotly_js = get_plotlyjs() + "\n"  # plotly.js 4 sets window.Plotly itself
    if fragment:  # Jupyter: each output carries plotly.js, but loads it only where the page has none yet
        # the charset first: a fragment written to a file as it is still reads as UTF-8 (a notebook ignores it)
        return f'<meta charset="utf-8"><style>{_STYLE}</style><script>if(!window.Plotly){{{plotly_js}}}</script>{body}'
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style><script>{plotly_js}</script></head><body>{body}</body></html>")


def escape(text: object) -> str:
    return html.escape(str(text), quote=True)
