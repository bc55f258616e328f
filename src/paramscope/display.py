"""Jupyter display and `.to_html(path)` for results, registered by type name: the results carry no presentation.

A result class mixes in `HtmlDisplay`; which page draws it, and which text IPython shows, are looked up here by the
class's name and imported by name only when a result is displayed or saved. So no data module imports a renderer
(the import graph stays one-way: data → render), and the core never imports plotly or rich.
"""

from __future__ import annotations

import importlib
from typing import Any

# type name → "module:function": function(result, fragment) → the page, a full document or a notebook fragment
PAGES = {
    "Report": "paramscope.render.html.report:report_page",
    "MemoryEstimate": "paramscope.render.html.cost:memory_page",
    "FlopEstimate": "paramscope.render.html.cost:flops_page",
    "Plan": "paramscope.render.html.cost:plan_page",
    "ServeSpeed": "paramscope.render.serve:serve_page",
    "LayoutSearch": "paramscope.render.html.layout_search:layout_search_page",
}
# type name → "module:function": function(result) → the text IPython shows for it (`_repr_pretty_`)
TEXTS = {
    "Report": "paramscope.render.text:notebook_text",
}


def _function(registry: dict[str, str], result: Any):
    target = registry.get(type(result).__name__)
    if target is None:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class HtmlDisplay:
    """Mixed into Report, MemoryEstimate, FlopEstimate, ServeSpeed, Plan and LayoutSearch: the notebook shows the interactive page
    (offline, no CDN) and `.to_html(path)` writes the self-contained page that the CLI's --html writes."""

    def _html(self, fragment: bool) -> str:
        page = _function(PAGES, self)
        if page is None:
            raise TypeError(f"no page is registered for {type(self).__name__}")
        return page(self, fragment)

    def _repr_html_(self) -> str | None:
        try:
            return self._html(fragment=True)
        except ImportError:  # plotly missing (installed without dependencies): IPython falls back to the text
            return None

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's text display
        text = None
        if not cycle:
            try:
                render = _function(TEXTS, self)
                text = render(self) if render is not None else None
            except ImportError:  # rich missing: the one-line repr
                text = None
        printer.text(repr(self) if text is None else text)

    def to_html(self, path: str | None = None) -> str:
        """The self-contained HTML page; also written to `path` (UTF-8) when given."""
        page = self._html(fragment=False)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(page)
        return page
