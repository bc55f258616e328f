"""memory --training --find-layout --html (issue 28 §7): the page holds the search's settings, every answered layout
with the text's figures (peak per device, fits, spare, the step time's bound, bubble, communication as a bound), the
fewest devices that fit, and each layout's peak against the GPU's usable memory as a bar. The page is a pure
function of the frozen LayoutSearch: its numbers are the search's integers.

The browser test drives the system's Chromium through playwright, as tests/test_html.py does (it skips without one,
unless PARAMSCOPE_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

import html
import re

import pytest

from paramscope.cost.parallel.search import SearchOptions, find_layouts
from paramscope.render.html.layout_search import render_layout_search_html
from paramscope.render.layout_search import minimum_sentence
from paramscope.sources import resolve
from test_html import _Page, _screenshot, browser  # noqa: F401  (browser: the module's Chromium, one launch)

_CACHE: dict[str, tuple] = {}


def _search():
    """llama-3-8b on 2 × H100 (global batch 2 × 2,048): answered from its template; tp 2 and pp 2 fit (pp 2's
    draining stage priced at its real moments since d3939e1: 77.70 GiB, was over), two layouts do not."""
    if "search" not in _CACHE:
        report, search, _ = find_layouts(resolve("llama-3-8b"), SearchOptions(devices=2, gpu="h100",
                                                                            fsdp_mixed_precision="autocast"), True)
        _CACHE["search"] = report, search
    return _CACHE["search"]


def test_the_cli_writes_the_page_with_every_layout_and_its_figures(tmp_path):
    from paramscope.cli import main

    out = tmp_path / "layouts.html"
    assert main(["memory", "llama-3-8b", "--training", "--find-layout", "--gpu", "h100", "--devices", "2",
                 "--fsdp-mixed-precision", "autocast", "--html", str(out)]) == 0
    page = out.read_text("utf-8")
    report, search = _search()
    assert page == render_layout_search_html(report, search).replace(
        f"{search.seconds:.1f} s", re.search(r"evaluated in ([\d.]+ s)", page).group(1))  # the wall time differs
    rows = re.findall(r'<tr data-layout="([^"]*)" data-fits="(true|false)">(.*?)</tr>',
                      re.search(r'<table class="compare" id="layouts">(.*?)</table>', page, re.S).group(1))
    answered = [*search.fitting, *search.not_fitting]
    assert len(rows) == len(answered) == 4 and len(search.fitting) == 2
    for (degrees, fits, cells), candidate in zip(rows, answered):
        values = [int(v) for v in re.findall(r'data-value="(-?\d+)"', cells)]
        assert fits == str(candidate.fits).lower()
        assert values == [candidate.peak, candidate.free] + ([candidate.comm_bytes] if candidate.fits else [])
    best = search.fitting[0]
    assert rows[0][0] == "dp 1 · tp 2" and (best.peak, best.free, best.comm_bytes) == (
        80_625_624_724, 4_199_979_372, 4_362_076_160)
    assert f'data-devices="{search.minimum.devices}"' in page and search.minimum.devices == 2
    assert html.escape(minimum_sentence(search)).split("; ")[0] in page  # "fewest devices that fit: 2 (dp 2, …"
    assert "comm/device (bound)" in page and "step ≥ (bound)" in page and "short by" in page


def test_the_page_draws_each_peak_against_the_usable_memory_in_chromium(browser, tmp_path):  # noqa: F811
    report, search = _search()
    path = tmp_path / "layouts.html"
    path.write_text(render_layout_search_html(report, search), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    bars = page.page.evaluate("""() => document.getElementById('bars-layouts').data
        .map(t => ({name: t.name, x: t.x, colors: (t.marker || {}).color}))""")
    answered = [*search.fitting, *search.not_fitting]
    assert len(bars) == 1 and bars[0]["x"] == [c.peak for c in answered]
    assert bars[0]["colors"] == ["#59a14f" if c.fits else "#e15759" for c in answered]
    line = page.page.evaluate("() => document.getElementById('bars-layouts').layout.shapes[0].x0")
    assert line == search.memory - search.reserve == 84_825_604_096
    texts = page.page.evaluate("""() => Array.from(document.querySelectorAll('#bars-layouts text'))
        .map(t => t.textContent)""")
    assert "75.09 GiB" in texts and "usable: 79.00 GiB (80.00 GiB − 1.00 GiB reserve)" in texts
    drawn = page.page.evaluate("""() => Array.from(document.querySelectorAll('#bars-layouts .bars .point path'))
        .map(p => p.getBoundingClientRect().width)""")
    assert len(drawn) == 4 and all(w > 100 for w in drawn)
    for width, candidate in zip(drawn, answered):  # one axis: each bar ∝ its peak, to a pixel
        assert width == pytest.approx(drawn[0] * candidate.peak / answered[0].peak, abs=1.5)
    _screenshot(page.page, "#bars-layouts", tmp_path / "layouts.png")
    page.page.close()
