"""Jupyter display and `.to_html(path)` for results: each result says which page draws it (render.html).

The page modules load only when a result is displayed or saved, so the core never imports plotly.
"""

from __future__ import annotations


class HtmlDisplay:
    """Mixed into Report, MemoryEstimate, FlopEstimate and Plan: the notebook shows the interactive page (offline,
    no CDN) and `.to_html(path)` writes the self-contained page that the CLI's --html writes."""

    def _html(self, fragment: bool) -> str:  # each result: its page, a full document or a notebook fragment
        raise NotImplementedError

    def _repr_html_(self) -> str | None:
        try:
            return self._html(fragment=True)
        except ImportError:  # plotly missing (installed without dependencies): IPython falls back to the text
            return None

    def to_html(self, path: str | None = None) -> str:
        """The self-contained HTML page; also written to `path` (UTF-8) when given."""
        from .render.html.page import save_page

        return save_page(self._html(fragment=False), path)
