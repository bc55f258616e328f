"""The HTML report: treemap data exact to the integer, the page self-contained, and (in Chromium) interactive.

Browser tests drive the system's Chromium through playwright (`executable_path`, no browser download). They skip
where no Chromium is installed, unless PARAMSCOPE_REQUIRE_BROWSER=1 (set by .ci/run), where they fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from paramscope import inspect
from paramscope.compare import compare_reports
from paramscope.presets import preset_names
from paramscope.render.html.compare import render_compare_html
from paramscope.render.html.report import render_report_html
from paramscope.render.treemap import TRAINABLE, active_share, module_treemap, role_treemap

BROWSER_MODELS = ["bert-base-uncased", "mixtral-8x7b", "deepseek-v3"]


def _leaf_sum(treemap) -> int:
    return sum(box.value for box in treemap.leaves)


def _consistent(treemap) -> None:
    """Ids unique, every parent present, each parent's value the sum of its children's."""
    ids = [box.id for box in treemap.boxes]
    assert len(ids) == len(set(ids))
    by_id = {box.id: box for box in treemap.boxes}
    children: dict[str, int] = {}
    for box in treemap.boxes:
        if box.parent:
            assert box.parent in by_id, box.id
            children[box.parent] = children.get(box.parent, 0) + box.value
    for parent, total in children.items():
        assert by_id[parent].value == total, parent


# --- the data ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", preset_names())
def test_every_preset_treemap_leaves_sum_to_the_unique_total(name):
    report = inspect(name)
    for treemap in (module_treemap(report, active_share(report)), role_treemap(report)):
        assert _leaf_sum(treemap) == report.total
        assert treemap.total == report.total
        _consistent(treemap)


def test_bert_layers_are_one_block_of_twelve_with_the_arithmetic():
    report = inspect("bert-base-uncased")
    boxes = {box.label: box for box in module_treemap(report).boxes}
    layers = boxes["encoder.layer.0–11 × 12"]
    assert layers.value == 12 * 7_087_872
    assert "7,087,872 per layer × 12 = 85,054,464" in layers.hover
    query = next(b for b in module_treemap(report).boxes if b.id.endswith("/attention/self/query"))
    assert query.value == 12 * 590_592
    assert "768×768 + 768 = 590,592 per layer × 12 = 7,087,104" in query.hover
    # the tied word embedding is marked, and counted once: the decoder's alias adds no box
    assert boxes["word_embeddings"].tied and boxes["word_embeddings"].value == 30522 * 768
    assert "shared with cls.predictions.decoder.weight" in boxes["word_embeddings"].hover
    assert not any("decoder" in box.label for box in module_treemap(report).boxes)


def test_bert_ffn_dwarfs_attention_in_the_role_view():
    report = inspect("bert-base-uncased")
    groups = {box.label: box.value for box in role_treemap(report).boxes if box.parent == report.model.class_name}
    assert groups["feed-forward (MLP)"] == 56_687_616
    assert groups["attention"] == 28_366_848


def test_moe_experts_are_shaded_by_the_share_a_token_uses():
    report = inspect("deepseek-v3")
    boxes = module_treemap(report, active_share(report)).boxes
    experts = next(b for b in boxes if b.id.endswith("/3–60/mlp/experts"))
    assert experts.emphasis == pytest.approx(8 / 256)
    assert experts.value == 58 * 256 * 3 * 7168 * 2048
    attention = next(b for b in boxes if b.id.endswith("/3–60/self_attn"))
    assert attention.emphasis == 1.0
    root = boxes[0]
    assert root.emphasis == pytest.approx(report.active / report.total)
    # the experts fill the picture: 97.4% of the model
    assert experts.value / report.total > 0.97


def test_plan_emphasis_is_the_trainable_share():
    report = inspect("bert-base-uncased")
    boxes = module_treemap(report, TRAINABLE).boxes
    assert all(box.emphasis == 1.0 for box in boxes)  # all trainable


def test_wide_models_fold_deep_levels_to_stay_bounded():
    report = inspect("t5-small")
    full = module_treemap(report)
    small = module_treemap(report, max_boxes=20)
    assert len(small.boxes) <= 20 < len(full.boxes)
    assert _leaf_sum(small) == report.total
    _consistent(small)


# --- the page ---------------------------------------------------------------------------------------------------

def test_page_is_self_contained_and_small():
    page = render_report_html(inspect("deepseek-v3"))
    assert len(page.encode()) < 10_000_000
    assert page.startswith("<!DOCTYPE html>") and page.count("window.Plotly = Plotly") == 1  # plotly.js once
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)  # nothing loaded from elsewhere
    assert "671,026,404,352" in page and "37,552,282,624" in page


def test_notebook_display_is_the_interactive_fragment(tmp_path):
    report = inspect("bert-base-uncased")
    fragment = report._repr_html_()
    assert not fragment.startswith("<!DOCTYPE") and "if(!window.Plotly)" in fragment
    assert "treemap-module" in fragment
    # self-describing: written to a file as it is, it still reads as UTF-8 (×, –, ≈ and the like)
    assert fragment.startswith('<meta charset="utf-8">')
    path = tmp_path / "bert.html"
    page = report.to_html(str(path))
    assert path.read_text("utf-8") == page and page.startswith("<!DOCTYPE html>")


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "paramscope", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def _cli_here(capsys, *args) -> str:
    """The CLI in this process, for the runs that build (a fresh process costs an import of torch, transformers and
    PEFT, about 6 CPU s, more; the CLI's own process is held by the runs above and below): stdout."""
    from paramscope.cli import main

    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_cli_html_writes_the_page_and_says_where(tmp_path):
    out = tmp_path / "bert.html"
    result = _cli("inspect", "bert-base-uncased", "--html", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # the page replaces the text
    assert f"wrote {out}" in result.stderr
    assert 'data-total="109514298"' in out.read_text("utf-8")
    both = _cli("compare", "bert-base-uncased", "gpt2", "--html", str(tmp_path / "c.html"), "--json")
    assert both.returncode == 0 and '"models"' in both.stdout  # --json still goes to stdout
    assert (tmp_path / "c.html").stat().st_size > 1_000_000


@pytest.mark.parametrize("target, message", [
    ("/no/such/folder/x.html", "--html: no such folder"),
    (".", "is a folder"),
])
def test_cli_html_refuses_a_bad_path_before_any_work(tmp_path, target, message):
    result = _cli("inspect", "bert-base-uncased", "--html", target, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert result.stdout == ""


# --- in a real browser ------------------------------------------------------------------------------------------

def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api")
    executable = _chromium()
    if executable is None:
        if os.environ.get("PARAMSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail("no chromium on PATH, and PARAMSCOPE_REQUIRE_BROWSER=1")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


class _Page:
    """A page opened from a file, with every console error and every request recorded."""

    def __init__(self, browser, path):
        self.page = browser.new_page(viewport={"width": 1280, "height": 1000})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector("html[data-paramscope-ready]", timeout=20_000)
        self.ready_ms = int(self.page.get_attribute("html", "data-paramscope-ready"))

    def leaf_sum(self, div_id: str) -> int:
        return self.page.evaluate("""id => { const t = document.getElementById(id).data[0];
            const parents = new Set(t.parents); let s = 0;
            t.ids.forEach((x, i) => { if (!parents.has(x)) s += t.values[i]; }); return s; }""", div_id)


@pytest.fixture(scope="module")
def pages(browser, tmp_path_factory):
    folder = tmp_path_factory.mktemp("html")
    opened = {}
    for name in BROWSER_MODELS:
        path = folder / f"{name}.html"
        path.write_text(render_report_html(inspect(name)), "utf-8")
        opened[name] = _Page(browser, path)
    yield opened
    for page in opened.values():
        page.page.close()


@pytest.mark.parametrize("name", BROWSER_MODELS)
def test_page_renders_offline_with_no_console_error(pages, name):
    page = pages[name]
    assert page.errors == []
    assert page.requests == [page.url]  # the file itself, nothing else


@pytest.mark.parametrize("name", BROWSER_MODELS)
def test_treemap_leaves_in_the_browser_sum_to_the_total(pages, name):
    total = inspect(name).total
    assert int(pages[name].page.get_attribute("#totals", "data-total")) == total
    assert pages[name].leaf_sum("treemap-module") == total
    assert pages[name].leaf_sum("treemap-role") == total


@pytest.mark.parametrize("name", BROWSER_MODELS)
def test_page_becomes_interactive(pages, name):
    """Every figure drawn (the page sets data-paramscope-ready). How fast is measured, not timed here: about 1.5–2.7 s
    from navigation on a 2-core machine, depending on its load (docs/benchmarks.md); this bound only catches a page
    that hangs or draws nothing."""
    assert 0 < pages[name].ready_ms < 15_000  # in ms since navigation began


def _slice(page, div_id: str, label: str):
    return page.locator(f"#{div_id} g.slice").filter(has=page.locator("text.slicetext", has_text=label)).first


def test_hover_shows_the_exact_count_and_a_click_drills_down(pages):
    page = pages["bert-base-uncased"].page
    box = _slice(page, "treemap-module", "encoder.layer.0–11 × 12").bounding_box()
    # the box's own strip is its top edge, where its label is; below it lie its parts
    x, y = box["x"] + 12, box["y"] + 6
    page.mouse.move(x, y)
    page.wait_for_selector("#treemap-module .hoverlayer .hovertext")
    hover = page.text_content("#treemap-module .hoverlayer")
    assert "7,087,872 per layer × 12 = 85,054,464" in hover
    page.mouse.click(x, y)
    page.wait_for_function("document.getElementById('treemap-module').data[0].level !== undefined")
    level = page.evaluate("document.getElementById('treemap-module').data[0].level")
    assert level.endswith("/encoder.layer.0–11")


def test_sunburst_toggle_redraws(pages):
    page = pages["mixtral-8x7b"].page
    page.locator("#treemap-role .updatemenu-button", has_text="sunburst").click()
    page.wait_for_function("document.getElementById('treemap-role').data[0].type === 'sunburst'")
    assert page.locator("#treemap-role .sunburstlayer").count() == 1
    assert pages["mixtral-8x7b"].leaf_sum("treemap-role") == inspect("mixtral-8x7b").total


def test_compare_page_small_multiples_and_bars(browser, tmp_path):
    names = ["bert-base-uncased", "gpt2", "mixtral-8x7b", "deepseek-v3"]
    reports = [inspect(n) for n in names]
    path = tmp_path / "compare.html"
    path.write_text(render_compare_html(compare_reports(reports, names), reports), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    for index, report in enumerate(reports):
        assert page.leaf_sum(f"treemap-{index}") == report.total
    widths = [page.page.evaluate(f"document.getElementById('treemap-{i}').layout.width") for i in range(4)]
    assert widths[3] == 560 and widths[2] == round(560 * (reports[2].total / reports[3].total) ** 0.5)
    bars = page.page.evaluate("document.getElementById('bars-groups').data.length")
    assert bars == len(compare_reports(reports, names).groups)
    page.page.close()


# --- memory, FLOPs and plans ------------------------------------------------------------------------------------

def test_memory_page_bars_are_each_phase_exactly(browser, tmp_path):
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import estimate_memory
    from paramscope.cost.memory.training import TrainingOptions, estimate_training
    from paramscope.render.html.cost import render_memory_html
    from paramscope.render.memory import memory_to_dict

    serving = estimate_memory("gpt2", MemoryOptions(batch=2, seq=256))
    report = serving.report
    training = estimate_training("gpt2", TrainingOptions(batch=1, seq=128))
    for name, estimate in (("serving", serving), ("training", training)):
        path = tmp_path / f"{name}.html"
        path.write_text(render_memory_html(report, estimate), "utf-8")
        page = _Page(browser, path)
        assert page.errors == [] and page.requests == [page.url]
        stacks = page.page.evaluate("""() => { const d = document.getElementById('bars-phases').data;
            return d[0].x.map((_, i) => d.reduce((s, t) => s + t.y[i], 0)); }""")
        memory = memory_to_dict(estimate)
        expected = [p["bytes"] for p in memory["phases"]] if name == "training" else [memory["peak"]["bytes"]]
        assert stacks == expected
        assert int(page.page.get_attribute("#memory", "data-peak")) == estimate.peak
        if name == "training":  # gradients are their own segment: none at the end of forward, all at the step
            grads = page.page.evaluate("""() => document.getElementById('bars-phases').data
                .find(t => t.name === 'gradients').y""")
            assert grads == [p["gradients"] for p in memory["phases"]]
            assert grads[0] == 0 and grads[-1] == memory["gradients"]["bytes"] == 4 * 124_439_808
        page.page.close()


def _settings_of(page: str) -> dict[str, str]:
    """The page's settings table: setting → words."""
    import html

    table = re.search(r'<table class="totals" id="settings">(.*?)</table>', page).group(1)
    return {html.unescape(k): html.unescape(v) for k, v in re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", table)}


def test_memory_page_states_every_setting_and_the_gpu_answer(tmp_path):
    """Issue 27: `memory llama-3-8b --dtype nf4 --gpu 4090 --html` said neither nf4 nor batch × seq, and left the
    --gpu answer out. The page lists every setting and says the text's bold line, word for word."""
    from paramscope.cli import main
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import estimate_memory
    from paramscope.render.html.cost import memory_page, render_memory_html
    from paramscope.render.memory import render_memory_text

    estimate = estimate_memory("llama-3-8b", MemoryOptions(dtype="nf4", gpu="4090"))
    report = estimate.report
    answer = ("On RTX 4090: fits, 15.48 GiB to spare; largest batch 9 at 8,192 tokens, largest context 8,192 at "
              "batch 1")
    assert answer in render_memory_text(report, estimate, 200)
    for page in (render_memory_html(report, estimate), memory_page(estimate, True)):  # the CLI's, a notebook's
        assert _settings_of(page) == {
            "engine": "analytic engine, allocator level (bytes of tensors)",
            "weights": "bitsandbytes 4-bit NF4 (blocks of 64), from --dtype",
            "compute dtype": "bf16",
            "KV cache": "bf16, kv layout",
            "batch × sequence": "1 × 8,192 tokens (max_position_embeddings)",
            "reserve": "1.00 GiB (--reserve): CUDA context and allocator fragmentation, added to the peak before "
                       "comparing with a device"}
        budget = re.search(r'<p id="budget" ([^>]*)><b>(.*?)</b></p>', page)
        assert budget.group(2) == answer
        assert ('data-fits="true" data-free="16617219584" data-largest-batch="9" data-largest-context="8192"'
                == budget.group(1))
        assert "analytic engine · nf4 weights · batch 1 × 8,192 tokens · peak 7.52 GiB in prefill" in page
    out = tmp_path / "m.html"  # the command itself: its --gpu reaches the page
    assert main(["memory", "llama-3-8b", "--dtype", "nf4", "--gpu", "4090", "--html", str(out)]) == 0
    assert f"<b>{answer}</b>" in out.read_text("utf-8")
    plain = estimate_memory("gpt2", MemoryOptions(seq=128))
    assert 'id="budget"' not in render_memory_html(None, plain)  # neither --gpu nor --budget: no answer to give


def test_training_memory_page_states_every_setting_and_the_budget_answer():
    from paramscope.cost.hardware import GiB
    from paramscope.cost.memory.training import TrainingOptions, estimate_training
    from paramscope.render.html.cost import render_memory_html
    from paramscope.render.memory import render_memory_text

    estimate = estimate_training("gpt2", TrainingOptions(
        batch=2, seq=128, optimizer="sgd-momentum", precision="fp16-mixed", grad_checkpointing="full",
        freeze=("embeddings",), devices=4, zero="2", budget=24 * GiB, reserve=GiB // 2))
    report = estimate.report
    page = render_memory_html(report, estimate)
    assert _settings_of(page) == {
        "engine": "analytic engine, allocator level (bytes of tensors)",
        "precision": "fp16-mixed: fp32 weights (the master copy), fp16 autocast",
        "weights dtype": "fp32",
        "optimizer": "sgd-momentum",
        "batch × sequence": "2 × 128 tokens",
        "attention": "sdpa",
        "gradient checkpointing": "full",
        "activations": "analytic: GPT-2",
        "frozen": "embeddings (39,383,808 parameters; 85,056,000 train)",
        "devices": "4, data parallel, each with its own batch; ZeRO-2",
        "reserve": "512.00 MiB (--reserve): CUDA context and allocator fragmentation, added to the peak before "
                   "comparing with a device"}
    answer = re.search(r'<p id="budget" [^>]*data-free="(\d+)" data-largest-batch="(\d+)"[^>]*><b>(.*?)</b>', page)
    assert answer.group(3) in render_memory_text(report, estimate, 200)
    assert answer.group(3) == ("On 24.00 GiB budget: fits, 22.60 GiB to spare; largest batch 296 at 128 tokens, "
                               "largest context 1,024 at batch 2")
    # 24 GiB − (the per-device peak 970,902,040 B + the 512 MiB reserve)
    assert (int(answer.group(1)), int(answer.group(2))) == (24_262_030_824, 296) == (
        24 * GiB - 970_902_040 - GiB // 2, estimate.budget.largest_batch)
    assert "analytic engine · fp16-mixed, sgd-momentum · batch 2 × 128 tokens · peak" in page


def test_flops_page_has_the_context_curve_from_the_analytic_count(browser, tmp_path):
    from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
    from paramscope.render.html.cost import render_flops_html

    estimate = estimate_flops("llama-2-7b", FlopOptions(context_curve=True))
    report, compute = estimate.report, estimate.compute
    assert estimate.forward == 29_261_612_187_648 and estimate.attention == 2_199_023_255_552
    points = dict((seq, (forward, attention)) for seq, forward, attention in estimate.by_context)
    assert points[2048] == (estimate.forward, estimate.attention)  # the curve passes through the answer
    assert max(points) == 4096 and min(points) == 128
    assert points[4096][1] == 4 * points[2048][1]  # attention scores grow with S²
    path = tmp_path / "flops.html"
    path.write_text(render_flops_html(report, estimate, compute), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    bars = page.page.evaluate("document.getElementById('bars-flops').data[0].x.reduce((a, b) => a + b, 0)")
    assert bars == estimate.forward
    assert page.page.evaluate("document.getElementById('line-context').data.length") == 3
    page.page.close()


def test_plan_page_treemap_marks_what_trains(browser, tmp_path):
    from paramscope.api import inspect_with_module
    from paramscope.plan import PlanOptions, make_plan
    from paramscope.render.html.cost import render_plan_html

    report, module = inspect_with_module("bert-base-uncased")
    plan = make_plan(report, module, PlanOptions(lora=8))
    planned = inspect(plan.module)
    assert planned.total == plan.total == 109_809_210
    treemap = module_treemap(planned, TRAINABLE)
    assert sum(box.value * box.emphasis for box in treemap.leaves) == pytest.approx(294_912)
    path = tmp_path / "plan.html"
    path.write_text(render_plan_html(report, plan, planned), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    assert page.leaf_sum("treemap-plan") == 109_809_210
    assert int(page.page.get_attribute("#plan", "data-trainable")) == 294_912
    page.page.close()


@pytest.mark.parametrize("argv", [
    ["memory", "gpt2", "--seq", "128"],
    ["flops", "gpt2", "--seq", "128"],
    ["plan", "gpt2", "--train-last", "1", "--no-memory"],
    # a PeftModel with no task type (BertForMaskedLM) forwards **kwargs: its traced step feeds the wrapped model's
    # inputs (it used to stop at "PeftModel.forward takes no input_ids")
    ["plan", "bert-base-uncased", "--lora", "8", "--seq", "64"],
])
def test_cost_commands_write_html(tmp_path, argv):
    out = tmp_path / "page.html"
    result = _cli(*argv, "--html", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and out.stat().st_size > 1_000_000
    assert "data-paramscope-ready" in out.read_text("utf-8")


def test_diff_page_shows_both_models_with_what_changes_in_full_colour(browser, tmp_path):
    from paramscope.diff import diff_reports
    from paramscope.render.html.diff import render_diff_html

    a, b = inspect("bert-base-uncased", model_class="BertModel"), inspect("bert-base-uncased")
    diff = diff_reports(a, b, a_label="a", b_label="b")
    path = tmp_path / "diff.html"
    path.write_text(render_diff_html(diff, a, b), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    assert page.leaf_sum("treemap-a") == 109_482_240 and page.leaf_sum("treemap-b") == 109_514_298
    assert int(page.page.get_attribute("#diff", "data-delta")) == 32_058
    assert "The pooler (590,592) is removed" in page.page.text_content("body")
    page.page.close()


# --- what the figures show, by geometry (issue 27 §8) -------------------------------------------------------------

_SLICE_AREAS = """id => Object.fromEntries(Array.from(document.getElementById(id).querySelectorAll('g.slice'))
    .filter(s => s.__data__ && s.__data__.data).map(s => { const r = s.querySelector('path').getBoundingClientRect();
        return [s.__data__.data.id, [Math.round(r.width), Math.round(r.height)]]; }))"""


def _screenshot(page, selector: str, path) -> None:
    """The part of the page the test is about, as a PNG beside the test's files (look at it when a test fails)."""
    page.locator(selector).first.screenshot(path=str(path))
    assert path.stat().st_size > 1_000


def test_diff_page_draws_what_differs_at_its_own_scale(browser, tmp_path):
    """BertModel → BertForMaskedLM: at the models' one scale the pooler is a 390×0 px sliver in a's 520 px treemap
    and b's head is not drawn at all; the view of what differs alone draws each at hundreds of pixels a side, with the
    exact figures beside it."""
    from paramscope.diff import diff_reports
    from paramscope.render.html.diff import differs_treemap, render_diff_html

    a, b = inspect("bert-base-uncased", model_class="BertModel"), inspect("bert-base-uncased")
    diff = diff_reports(a, b, a_label="a", b_label="b")
    treemap = differs_treemap(diff)
    assert treemap.total == _leaf_sum(treemap) == 590_592 + 622_650
    _consistent(treemap)
    path = tmp_path / "diff.html"
    path.write_text(render_diff_html(diff, a, b), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    at_one_scale = {**page.page.evaluate(_SLICE_AREAS, "treemap-a"), **page.page.evaluate(_SLICE_AREAS, "treemap-b")}
    pooler = at_one_scale["BertModel/pooler.dense"]
    assert pooler[0] * pooler[1] < 100  # the defect this view answers: 390 × 0 px in Chromium
    assert all(w * h < 100 for key, (w, h) in at_one_scale.items() if "cls.predictions" in key)
    alone = page.page.evaluate(_SLICE_AREAS, "treemap-differs")
    for key in ("what differs/a/pooler.dense", "what differs/b/cls.predictions.transform.dense"):
        width, height = alone[key]
        assert width >= 300 and height >= 300, (key, alone[key])  # 561 × 372 px at a 1280 px viewport
    assert page.leaf_sum("treemap-differs") == 1_213_242
    assert int(page.page.get_attribute("#differs", "data-total")) == 1_213_242
    rows = page.page.evaluate("""() => Array.from(document.querySelectorAll('#differs-table tr[data-side]'))
        .map(r => [r.dataset.side, r.dataset.module, Number(r.dataset.value), r.cells[3].textContent,
                   r.cells[4].textContent])""")
    assert rows == [["a", "pooler.dense", 590_592, "0.54%", "weight 768×768, bias 768"],
                    ["b", "cls.predictions.transform.dense", 590_592, "0.54%", "weight 768×768, bias 768"],
                    ["b", "cls.predictions", 30_522, "0.03%", "bias 30522"],
                    ["b", "cls.predictions.transform.LayerNorm", 1_536, "<0.01%", "weight 768, bias 768"]]
    _screenshot(page.page, "details.section:nth-of-type(3)", tmp_path / "diff-differs.png")
    page.page.close()


def test_differs_view_folds_layers_and_says_when_nothing_differs():
    from paramscope.diff import diff_reports
    from paramscope.render.html.diff import differs_treemap, render_diff_html

    gpt2, distil = inspect("gpt2"), inspect("distilgpt2")
    treemap = differs_treemap(diff_reports(gpt2, distil, a_label="a", b_label="b"))
    modules = {box.label: box.value for box in treemap.boxes if box.parent == "what differs/a"}
    assert modules == {"transformer.h.6–11.mlp.c_fc × 6": 6 * (768 * 3072 + 3072),
                       "transformer.h.6–11.mlp.c_proj × 6": 6 * (3072 * 768 + 768),
                       "transformer.h.6–11.attn.c_attn × 6": 6 * (768 * 2304 + 2304),
                       "transformer.h.6–11.attn.c_proj × 6": 6 * (768 * 768 + 768),
                       "transformer.h.6–11.ln_1 × 6": 6 * 1536, "transformer.h.6–11.ln_2 × 6": 6 * 1536}
    assert treemap.total == sum(modules.values()) == 42_527_232 == gpt2.total - distil.total
    hover = next(box.hover for box in treemap.boxes if box.label == "transformer.h.6–11.attn.c_attn × 6")
    assert "768×2304 + 2304 = 1,771,776 per module × 6 = 10,630,656" in hover
    t5, t5_lm = inspect("t5-small", model_class="T5Model"), inspect("t5-small")  # only ties change
    diff = diff_reports(t5, t5_lm, a_label="a", b_label="b")
    assert differs_treemap(diff) is None
    page = render_diff_html(diff, t5, t5_lm)
    assert '<p id="differs" data-total="0">No parameter differs' in page and "treemap-differs" not in page


def _covered_labels(page, div_id: str) -> list:
    """Hover a small multiple, then every visible plotly toolbar in it against its title and the treemap's labels:
    the (toolbar, text) pairs that overlap."""
    plot = page.locator(f"#{div_id} svg.main-svg").first  # the plot, not its div (as wide as its title)
    plot.scroll_into_view_if_needed()
    box = plot.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector(f"#{div_id} .hoverlayer .hovertext")  # the mouse is over it: plotly shows its hover
    page.wait_for_timeout(400)  # and fades its toolbar in
    return page.evaluate("""id => { const fig = document.getElementById(id), cell = fig.closest('.multiple');
        const rect = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
        const shown = el => { const r = el.getBoundingClientRect(), s = getComputedStyle(el);
            let opacity = 1; for (let e = el; e instanceof Element; e = e.parentElement)
                opacity *= Number(getComputedStyle(e).opacity);
            return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && opacity > 0; };
        const bars = Array.from(cell.querySelectorAll('.modebar-group')).filter(shown).map(rect);
        const texts = [cell.querySelector('.multiple-title'),
                       ...fig.querySelectorAll('text.slicetext, .pathbar text')].filter(shown)
            .map(el => [el.textContent, rect(el)]);
        const over = (a, b) => a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3];
        return bars.flatMap(bar => texts.filter(([_, r]) => over(bar, r)).map(([t, r]) => [bar, t, r])); }""",
                         div_id)


def test_small_multiples_toolbar_covers_no_title(browser, tmp_path):
    """compare's small treemaps: plotly's toolbar, shown on hover at the top right, covered the root box's label
    ("BertForMaskedLM" under a 56 × 25 px toolbar in a 116 px treemap). Each treemap hovered, no toolbar overlaps
    its title or any of its labels; the same on the diff page's pair. The big treemaps keep theirs."""
    names = ["bert-base-uncased", "gpt2", "mixtral-8x7b", "deepseek-v3"]
    reports = [inspect(n) for n in names]
    path = tmp_path / "compare.html"
    path.write_text(render_compare_html(compare_reports(reports, names), reports), "utf-8")
    page = _Page(browser, path)
    for index in range(len(names)):
        assert _covered_labels(page.page, f"treemap-{index}") == [], names[index]
    _screenshot(page.page, ".multiples", tmp_path / "compare-multiples.png")
    page.page.close()
    from paramscope.diff import diff_reports
    from paramscope.render.html.diff import render_diff_html

    a, b = inspect("bert-base-uncased", model_class="BertModel"), inspect("bert-base-uncased")
    path = tmp_path / "diff.html"
    path.write_text(render_diff_html(diff_reports(a, b, a_label="a", b_label="b"), a, b), "utf-8")
    page = _Page(browser, path)
    assert _covered_labels(page.page, "treemap-a") == [] and _covered_labels(page.page, "treemap-b") == []
    page.page.close()
    quiet = '"sendDataToCloud"], "displayModeBar": false})'  # the config a figure is drawn with, without toolbar
    assert render_compare_html(compare_reports(reports, names), reports).count(quiet) == 4
    assert render_report_html(reports[1]).count(quiet) == 0  # inspect's keep theirs, in the strip of their buttons


def test_diff_cli_writes_html(tmp_path):
    out = tmp_path / "diff.html"
    result = _cli("diff", "bert-base-uncased:BertModel", "bert-base-uncased:BertForMaskedLM", "--html", str(out))
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert 'data-delta="32058"' in out.read_text("utf-8")


# --- the notebook -----------------------------------------------------------------------------------------------

def test_two_notebook_outputs_on_one_page_each_draw_their_own_figures(browser, tmp_path):
    """A notebook shows fragments one after another on one page: ids repeat, plotly.js must load once."""
    bert, mixtral = inspect("bert-base-uncased"), inspect("mixtral-8x7b")
    path = tmp_path / "notebook.html"
    path.write_text(f"<!DOCTYPE html><html><body>{bert._repr_html_()}{mixtral._repr_html_()}</body></html>",
                    "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    sums = page.page.evaluate("""() => Array.from(document.querySelectorAll('.figure')).map(div => {
        const t = div.data[0]; const parents = new Set(t.parents); let s = 0;
        t.ids.forEach((x, i) => { if (!parents.has(x)) s += t.values[i]; }); return s; })""")
    assert sums == [bert.total, bert.total, mixtral.total, mixtral.total]
    page.page.close()


def test_memory_flops_and_plan_results_display_and_save_alone(tmp_path):
    from paramscope.api import inspect_with_module
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import estimate_memory
    from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
    from paramscope.plan import PlanOptions, make_plan

    memory = estimate_memory("gpt2", MemoryOptions(seq=128))
    flops = estimate_flops("gpt2", FlopOptions(seq=128, context_curve=True))
    report, module = inspect_with_module("gpt2")
    plan = make_plan(report, module, PlanOptions(lora=4))
    for result, marker in ((memory, f'data-peak="{memory.peak}"'), (flops, f'data-forward="{flops.forward}"'),
                           (plan, f'data-trainable="{plan.trainable}"')):
        fragment = result._repr_html_()
        assert "if(!window.Plotly)" in fragment and marker in fragment
        path = tmp_path / f"{type(result).__name__}.html"
        assert result.to_html(str(path)).startswith("<!DOCTYPE html>") and marker in path.read_text("utf-8")


def test_layers_that_train_stay_apart_from_frozen_ones(tmp_path):
    from paramscope.api import inspect_with_module
    from paramscope.plan import PlanOptions, make_plan

    report, module = inspect_with_module("gpt2")
    plan = make_plan(report, module, PlanOptions(rules=(("train-last", "2"),)))
    boxes = {box.label: box for box in module_treemap(inspect(plan.module), TRAINABLE).boxes}
    assert boxes["0–9 × 10"].emphasis == 0.0 and boxes["10–11 × 2"].emphasis == 1.0
    assert boxes["10–11 × 2"].value == 2 * 7_087_872 == plan.trainable


def test_plan_compare_page(browser, tmp_path, capsys):
    """Issue 27 §1: `plan --compare --gpu A100-80GB --html` left out the --gpu answer and every setting. The page
    answers for each plan as the text and the JSON do, and states every setting (one cell where the plans agree)."""
    import json

    out = tmp_path / "plans.html"
    plans = json.loads(_cli_here(capsys, "plan", "gpt2", "--compare", "full,freeze,lora", "--seq", "64", "--gpu",
                                 "A100-80GB", "--html", str(out), "--json"))["plans"]
    page = _Page(browser, out)
    assert page.errors == [] and page.requests == [page.url]
    totals = [124_439_808, 124_439_808, 124_734_720]  # LoRA's adapters add 294,912
    assert [page.leaf_sum(f"treemap-{i}") for i in range(3)] == totals
    table = page.page.evaluate("""() => Array.from(document.querySelectorAll('#plans tr[data-plan]')).map(row =>
        [Number(row.cells[1].dataset.value), Number(row.cells[6].dataset.value),
         Number(row.cells[7].dataset.largestBatch), row.cells[7].textContent])""")
    assert table == [[124_439_808, 748_270_080, 949, "fits, largest batch 949"],
                     [14_175_744, 384_027_648, 959, "fits, largest batch 959"],
                     [294_912, 499_424_256, 1_052, "fits, largest batch 1,052"]]
    assert [p["memory"]["budget"]["largest_batch"] for p in plans] == [949, 959, 1_052]  # the JSON's, the text's
    assert [p["flops"]["step"] // 64 for p in plans] == [748_270_080, 384_027_648, 499_424_256]
    answers = page.page.evaluate("Array.from(document.querySelectorAll('#budget li')).map(li => li.textContent)")
    assert answers == [
        "full: On A100 80GB: fits, 76.86 GiB to spare; largest batch 949 at 64 tokens, largest context 1,024 at "
        "batch 1",
        "freeze: On A100 80GB: fits, 78.12 GiB to spare; largest batch 959 at 64 tokens, largest context 1,024 at "
        "batch 1",
        "lora: On A100 80GB: fits, 78.23 GiB to spare; largest batch 1,052 at 64 tokens, largest context 1,024 at "
        "batch 1"]
    settings = dict(page.page.evaluate("""() => Array.from(document.querySelectorAll('#settings tr[data-setting]'))
        .map(row => [row.dataset.setting, Array.from(row.querySelectorAll('td')).map(td => td.textContent)])"""))
    assert settings == {
        "plan": ["full", "freeze", "lora"],
        "rules": ["—", "train last 2 blocks (transformer.h.10–11) → 24 tensors, 14,175,744 parameters", "—"],
        "adapters on": ["—", "—", "c_attn (as PEFT resolved them)"],
        "adapter dtype": ["—", "—", "stored in --precision's weights dtype (fp32 under mixed precision, as PEFT "
                                    "makes them)"],
        "base dtype": ["—", "—", "fp32 (the config names no dtype, and transformers 5 loads such a checkpoint in "
                                 "float32)"],
        "counts": ["counts from the meta build", "counts from the meta build",
                   "counts from the meta build, adapters applied by PEFT"],
        "engine": ["analytic engine, allocator level (bytes of tensors)"] * 2
                  + ["derived engine, allocator level (bytes of tensors)"],
        "precision": ["bf16-mixed: fp32 weights (the master copy), bf16 autocast"],  # one cell: the plans agree
        "weights dtype": ["fp32"],
        "optimizer": ["adamw (fused)"],
        "batch × sequence": ["1 × 64 tokens"],
        "attention": ["sdpa"],
        "gradient checkpointing": ["none"],
        "activations": ["analytic: GPT-2", "analytic: GPT-2", "derived"],
        "frozen": ["nothing; 124,439,808 parameters train",
                   "110,264,064 parameters, by the plan (no gradient, no optimizer state); 14,175,744 train",
                   "124,439,808 parameters, by the plan (no gradient, no optimizer state); 294,912 train"],
        "devices": ["1, no sharding (ZeRO-0)"],
        "reserve": ["1.00 GiB (--reserve): CUDA context and allocator fragmentation, added to the peak before "
                    "comparing with a device"]}
    assert "bf16-mixed, adamw · batch 1 × 64 tokens · on A100 80GB" in page.page.text_content("body")
    page.page.close()


def test_plan_page_states_every_setting_the_gpu_answer_and_the_flops(tmp_path, capsys):
    """Issue 27 §1: `plan MODEL --lora 8 --gpu … --html` ignored --gpu and named no setting: the page now says the
    text's --gpu answer, every setting and the step's traced FLOPs."""
    import json

    out = tmp_path / "plan.html"
    plan = json.loads(_cli_here(capsys, "plan", "gpt2", "--lora", "8", "--seq", "64", "--gpu", "A100-80GB", "--html",
                                str(out), "--json"))["plan"]
    page = out.read_text("utf-8")
    assert _settings_of(page) == {
        "plan": "lora",
        "adapters on": "c_attn (as PEFT resolved them)",
        "adapter dtype": "stored in --precision's weights dtype (fp32 under mixed precision, as PEFT makes them)",
        "base dtype": "fp32 (the config names no dtype, and transformers 5 loads such a checkpoint in float32)",
        "counts": "counts from the meta build, adapters applied by PEFT",
        "engine": "derived engine, allocator level (bytes of tensors)",
        "precision": "bf16-mixed: fp32 weights (the master copy), bf16 autocast",
        "weights dtype": "fp32",
        "optimizer": "adamw (fused)",
        "batch × sequence": "1 × 64 tokens",
        "attention": "sdpa",
        "gradient checkpointing": "none",
        "activations": "derived",
        "frozen": "124,439,808 parameters, by the plan (no gradient, no optimizer state); 294,912 train",
        "devices": "1, no sharding (ZeRO-0)",
        "reserve": "1.00 GiB (--reserve): CUDA context and allocator fragmentation, added to the peak before "
                   "comparing with a device"}
    budget = re.search(r'<p id="budget" ([^>]*)><b>(.*?)</b></p>', page)
    assert budget.group(2) == ("On A100 80GB: fits, 78.23 GiB to spare; largest batch 1,052 at 64 tokens, largest "
                               "context 1,024 at batch 1")
    assert plan["memory"]["budget"]["largest_batch"] == 1_052  # the text's "largest batch 1052"
    assert 'data-largest-batch="1052"' in budget.group(1)
    assert f'data-step="{plan["flops"]["step"]}"' in page and plan["flops"]["step"] == 31_963_152_384
    assert "derived engine · bf16-mixed, adamw · batch 1 × 64 tokens · peak 787.08 MiB in backward" in page
    assert "the base is fp32 and autocast computes in bf16" in page  # the notes, as the text says them


def test_hovers_name_what_full_colour_means():
    from paramscope.render.treemap import changed

    base = inspect("bert-base-uncased", model_class="BertModel")
    root = module_treemap(base, changed({"pooler.dense.weight", "pooler.dense.bias"}, "removed or reshaped")).boxes[0]
    assert "590,592 removed or reshaped (0.54%)" in root.hover
    experts_root = module_treemap(inspect("mixtral-8x7b"), active_share(inspect("mixtral-8x7b"))).boxes[0]
    assert "12,879,925,248 active per token (27.58%)" in experts_root.hover
