"""The memory --training page under a multi-GPU layout (issue 28 §7): the layout among the settings, one device's peak
by part beside the one-device step's, each pipeline stage's peak by part (the worst marked) and the bubble, the rules
and stages tables, the fits table said to be per device. The page's data equals the JSON's to the byte; in Chromium
each bar is drawn to scale and labelled. Serving across GPUs (memory --tp T --pp P) draws the same bars by serving's
parts: weights, buffers, KV cache and prefill workspace per GPU and per stage.

Browser tests drive the system's Chromium through playwright, as tests/test_html.py does (they skip without one,
unless PARAMSCOPE_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

import html
import re

import pytest

from paramscope.cost.memory.serving import MemoryOptions
from paramscope.cost.memory.serving_answer import estimate_memory
from paramscope.cost.memory.training import TrainingOptions, estimate_training
from paramscope.cost.parallel.layout import layout_for
from paramscope.render.html.cost import device_parts, render_memory_html, stage_parts
from paramscope.render.html.gpus import gpu_parts, one_gpu_parts
from paramscope.render.memory import memory_to_dict
from test_html import _Page, _screenshot, browser  # noqa: F401  (browser: the module's Chromium, one launch)

# the brief's command: `paramscope memory llama-3-70b --training --devices 32 --tp 8 --pp 4 --batch 16`
PIPELINE = ("llama-3-70b", {"batch": 16}, {"devices": 32, "tp": 8, "pp": 4, "batch": 16})
# FSDP2's all-gathered units at the peak, under autocast (fp32 gathers), the convention these figures were read in
FSDP = ("llama-3-8b", {"batch": 1}, {"dp": 8, "zero": "fsdp", "fsdp_mixed_precision": "autocast"})
FSDP_PP = ("llama-3-8b", {"batch": 2}, {"dp": 2, "zero": "fsdp", "tp": 2, "pp": 2, "micro_batches": 1, "batch": 2,
                                        "fsdp_mixed_precision": "autocast"})
LAYOUTS = {
    "pipeline": PIPELINE, "fsdp": FSDP, "fsdp-pp": FSDP_PP,
    "cp": ("llama-3-8b", {"batch": 1}, {"dp": 2, "tp": 4, "cp": 2, "zero": "2"}),
    "interleaved": ("llama-3-8b", {"batch": 8}, {"tp": 2, "pp": 4, "schedule": "interleaved", "virtual_stages": 2,
                                                 "batch": 8}),
    # torch.autocast over ZeRO-3's fp32 weights (DeepSpeed's own bf16, ZeRO's default, refuses ZeRO-3 beside pp)
    "gpipe-zero3": ("llama-3-8b", {"batch": 8, "precision": "bf16-mixed"},
                    {"dp": 2, "zero": "3", "pp": 4, "schedule": "gpipe", "batch": 8}),
    "one-microbatch": ("llama-3-8b", {"batch": 4, "grad_checkpointing": "full"}, {"pp": 2, "micro_batches": 1,
                                                                                  "batch": 4}),
    "hsdp": ("gpt2", {"batch": 2, "seq": 128}, {"dp": 4, "zero": "hybrid_shard", "shard_group": 2,
                                                "fsdp_mixed_precision": "autocast"}),
}
_CACHE: dict[str, tuple] = {}


def _estimate(key: str):
    if key not in _CACHE:
        model, options, layout = LAYOUTS[key]
        # the closed form's figures (FSDP2 layouts are otherwise derived from traces, without named buffers)
        estimate = estimate_training(model, TrainingOptions(**options, layout=layout_for(**layout),
                                                            derive_layout=False))
        _CACHE[key] = estimate, memory_to_dict(estimate)
    return _CACHE[key]


def _serving():
    """llama-3-8b served at 8,192 tokens on tp 2 × pp 2 (4 GPUs), with --gpu rtx-4090 (the smallest tp)."""
    if "serving" not in _CACHE:
        estimate = estimate_memory("llama-3-8b", MemoryOptions(tp=2, pp=2, gpu="rtx-4090"))
        _CACHE["serving"] = estimate, memory_to_dict(estimate)
    return _CACHE["serving"]


def _table(page: str, table_id: str) -> str:
    return re.search(rf'<table class="[^"]*" id="{table_id}"[^>]*>(.*?)</table>', page, re.S).group(1)


def _settings_of(page: str) -> dict[str, str]:
    return {html.unescape(k): html.unescape(v)
            for k, v in re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", _table(page, "settings"))}


@pytest.mark.parametrize("key", sorted(LAYOUTS))
def test_each_stack_adds_up_to_its_peak_exactly(key):
    """The parts (none negative) add up to the device's peak and to each stage's; the device's communication
    buffers are parts where its peak moment holds them, by name; the resident states are the JSON's."""
    _, memory = _estimate(key)
    device = memory["layout"]["device"]
    parts = device_parts(memory)
    assert sum(v for _, v, _ in parts) == device["peak"]["bytes"]
    assert all(v >= 0 for _, v, _ in parts)
    by_name = {name: v for name, v, _ in parts}
    assert (by_name["weights"], by_name["optimizer state"], by_name["master weights"], by_name["buffers"]) == (
        device["weights"], device["optimizer"], device["master_weights"], device["buffers"])
    top = next(p for p in device["phases"] if p["moment"] == device["peak"]["moment"])
    assert by_name["gradients"] == top["gradients"]
    for buffer in device["communication"]:
        assert (buffer["name"] in by_name) == (buffer["name"] in top["arithmetic"])
        if buffer["name"] in by_name:
            assert by_name[buffer["name"]] == buffer["bytes"]
    for stage in device["stages"]:
        stack = stage_parts(memory, stage)
        assert sum(v for _, v, _ in stack) == stage["peak"] and all(v >= 0 for _, v, _ in stack)
        named = {name: v for name, v, _ in stack}
        assert (named["weights"], named["optimizer state"]) == (stage["weights"], stage["optimizer"])


def test_the_stacks_name_what_the_moment_holds():
    """llama-3-70b, tp 8 × pp 4: stage 0 holds 4 microbatches' activations in the 1F1B steady state, with its
    gradients and the gradient arriving from stage 1 (b·S·h in fp32); FSDP2's units are held at the start of the
    backward; one microbatch: the last stage's forward holds no gradient yet."""
    _, memory = _estimate("pipeline")
    assert {n: v for n, v, _ in device_parts(memory) if v} == {
        "weights": 9_083_027_456, "optimizer state": 18_166_055_636, "buffers": 512, "gradients": 9_083_027_456,
        "activations saved": 57_745_342_464, "the rest of the moment": 4 * 2048 * 8192}
    assert memory["layout"]["device"]["peak"]["bytes"] == 94_144_562_388
    _, memory = _estimate("fsdp")
    assert {n: v for n, v, _ in device_parts(memory) if "FSDP2" in n} == {
        "FSDP2's root unit, all-gathered": 4_202_708_992, "FSDP2's layer unit, all-gathered": 872_448_000}
    _, memory = _estimate("one-microbatch")
    last = memory["layout"]["device"]["stages"][-1]
    assert last["peak_phase"] == "forward"
    assert {n: v for n, v, _ in stage_parts(memory, last)}["gradients"] == 0


def test_the_page_states_the_layout_the_rules_the_stages_and_reads_per_device():
    estimate, memory = _estimate("pipeline")
    page = render_memory_html(estimate.report, estimate)
    settings = _settings_of(page)
    assert settings["layout"] == "dp 1 × tp 8 × pp 4 (1F1B, 16 microbatches) = 32 devices"
    assert settings["devices"] == "32 = dp 1 × tp 8 × pp 4 × cp 1; each data-parallel replica takes a batch of 16 a step"
    assert settings["data parallel"] == "dp 1"
    assert settings["shard mode"] == "no sharding: every data-parallel rank holds the model states whole"
    assert settings["tensor parallel"] == "tp 8: heads and widths cut 8 ways"
    assert settings["pipeline parallel"] == "pp 4 stages: 1F1B; 16 microbatches of 1 sequence each"
    assert settings["context parallel"] == "cp 1: none" and settings["expert parallel"] == "ep 1: none"
    assert "32, data parallel" not in page  # the --devices/--zero words the layout replaces
    rules = dict(re.findall(r'<tr data-role="[^"]*"><th>(.*?)</th><td>(.*?)</td></tr>', _table(page, "rules")))
    assert {k: html.unescape(v) for k, v in rules.items()} == memory["layout"]["device"]["rules"]
    assert rules["attention.key"] == "column-parallel (output features / 8)"
    stages = re.findall(r'<tr data-stage="(\d+)"( class="worst"[^>]*)?>(.*?)</tr>', _table(page, "stages"))
    assert [int(s) for s, _, _ in stages] == [0, 1, 2, 3] and [bool(w) for _, w, _ in stages] == [
        True, False, False, False]
    for (_, _, row), stage in zip(stages, memory["layout"]["device"]["stages"]):
        assert [int(v) for v in re.findall(r'data-value="(\d+)"', row)] == [
            stage[k] for k in ("weights", "gradients", "optimizer", "master_weights", "activations", "peak")]
    assert 'data-bubble="0.15789473684210525"' in page and "3 / (1·16 + 3) = 3 / 19" in page
    device = _table(page, "device")
    assert 'data-peak="94144562388"' in page and "1F1B steady state: resident 27,249,083,604 (weights" in device \
        and "+ 4 microbatches in flight" in device and "= 94,144,562,388</td>" in device
    caption = html.unescape(re.search(r'<caption class="dim" id="fits-caption">(.*?)</caption>', page).group(1))
    assert caption.startswith("Per device (dp 1 × tp 8 × pp 4 (1F1B, 16 microbatches) = 32 devices): each row "
                              "compares one device's peak, 87.68 GiB, plus the reserve")
    totals = html.unescape(_table(page, "memory"))
    assert "peak, one device alone" in totals and "peak per device + reserve" in totals and 'data-value="94144562388"' in totals
    assert "peak per device 87.68 GiB in backward" in html.unescape(page)


def test_fsdp_settings_say_the_shard_mode_and_no_stages_without_a_pipeline():
    estimate, _ = _estimate("fsdp")
    page = render_memory_html(estimate.report, estimate)
    settings = _settings_of(page)
    assert settings["shard mode"] == ("FSDP2 over 8 ranks: each parameter, its gradient and optimizer states cut "
                                      "along dim 0 (all-gathered to run)")
    assert settings["pipeline parallel"] == "pp 1: none"
    assert 'id="bars-device"' in page and 'id="bars-stages"' not in page and 'id="stages"' not in page
    estimate, _ = _estimate("cp")
    settings = _settings_of(render_memory_html(estimate.report, estimate))
    assert settings["context parallel"] == "cp 2: each rank holds 1,024 of the 2,048 tokens (ring attention)"
    assert settings["shard mode"] == "ZeRO-2 over 4 ranks: optimizer states and gradients sharded"


def test_without_a_layout_the_page_is_unchanged():
    estimate = estimate_training("gpt2", TrainingOptions(batch=1, seq=128))
    page = render_memory_html(estimate.report, estimate)
    assert "bars-device" not in page and "fits-caption" not in page and "layout" not in _settings_of(page)


def test_serving_per_gpu_parts_and_page():
    """Each GPU's stack is its weights, buffers, KV cache and prefill workspace, adding up to its peak exactly; the
    model on one GPU is the whole model's parts (the text's "peak on one device"); the page states the layout, draws
    no phase bar (its one bar, the whole model against a GPU's peak, is the per-GPU figure's first), and its tables
    are the JSON's."""
    from paramscope.render.memory import sum_one_device

    estimate, memory = _serving()
    layout = memory["layout"]
    assert [(n, v) for n, v, _ in gpu_parts(memory, layout["device"])] == [
        ("weights", 4_015_267_840), ("buffers", 512), ("KV cache", 268_435_456), ("prefill workspace", 625_016_832)]
    assert layout["device"]["peak"] == 4_908_720_640 == memory["peak"]["bytes"] and layout["device"]["stage"] == 1
    assert [sum(v for _, v, _ in gpu_parts(memory, s)) for s in layout["stages"]] == [4_908_712_448, 4_908_720_640]
    assert sum(v for _, v, _ in one_gpu_parts(memory)) == sum_one_device(estimate) == 18_111_603_200
    page = render_memory_html(estimate.report, estimate)
    settings = _settings_of(page)
    assert settings["layout"] == "tp 2 × pp 2 = 4 GPUs"
    assert settings["tensor parallel"] == ("tp 2: heads and widths cut 2 ways; KV cache: 8 K and V heads / tp 2 = 4 "
                                           "a rank")
    assert settings["pipeline parallel"] == "pp 2 stages: 32 layers, 16 a stage"
    assert 'id="bars-phases"' not in page and 'id="bars-gpu"' in page and 'id="bars-stages"' in page
    totals = html.unescape(_table(page, "memory"))
    assert "peak, the model on one GPU (the sum above)" in totals and 'data-value="18111603200"' in totals
    assert "peak per GPU + reserve" in totals and "peak per GPU 4.57 GiB in prefill" in html.unescape(page)
    gpu = _table(page, "gpu")
    assert [int(v) for v in re.findall(r'data-value="(\d+)"', gpu)] == [
        4_015_267_840, 512, 268_435_456, 625_016_832, 4_908_720_640]
    stages = re.findall(r'<tr data-stage="(\d+)"( class="worst"[^>]*)?>(.*?)</tr>', _table(page, "stages"))
    assert [bool(w) for _, w, _ in stages] == [False, True]
    for (_, _, row), stage in zip(stages, layout["stages"]):
        assert [int(v) for v in re.findall(r'data-value="(\d+)"', row)] == [
            stage["weights"]["bytes"], stage["kv_cache"]["bytes"], stage["workspace"]["bytes"], stage["peak"]]
    rules = dict(re.findall(r'<tr data-role="[^"]*"><th>(.*?)</th><td>(.*?)</td></tr>', _table(page, "rules")))
    assert {k: html.unescape(v) for k, v in rules.items()} == layout["rules"]
    caption = html.unescape(re.search(r'<caption class="dim" id="fits-caption">(.*?)</caption>', page).group(1))
    assert caption.startswith("Per GPU (tp 2 × pp 2 = 4 GPUs): each row compares one GPU's peak, 4.57 GiB")
    assert "Smallest tensor-parallel degree that fits RTX 4090" in html.unescape(page)


# --- in Chromium --------------------------------------------------------------------------------------------------

_STACKS = """([id, axis]) => { const d = document.getElementById(id).data, sums = {};
    d.filter(t => (t.xaxis || 'x') === axis).forEach(t => {
        const cats = t.orientation === 'h' ? t.y : t.x, vals = t.orientation === 'h' ? t.x : t.y;
        cats.forEach((c, i) => { sums[c] = (sums[c] || 0) + vals[i]; }); });
    return sums; }"""

# each bar category's drawn extent (px along the value axis), from its segments' rectangles
_EXTENTS = """([id, horizontal]) => { const out = {};
    document.getElementById(id).querySelectorAll('.barlayer .trace').forEach(tr => {
        tr.querySelectorAll('.point').forEach(pt => { const d = pt.__data__, r = pt.getBoundingClientRect();
            const key = (tr.__data__[0].trace.xaxis || 'x') + '|' + (horizontal ? d.p : d.p);
            const e = out[key] || (out[key] = {lo: Infinity, hi: -Infinity, cross: 0});
            if (horizontal) { e.lo = Math.min(e.lo, r.left); e.hi = Math.max(e.hi, r.right); e.cross = r.height; }
            else { e.lo = Math.min(e.lo, r.top); e.hi = Math.max(e.hi, r.bottom); e.cross = r.width; } }); });
    return out; }"""

_LABELS = """id => Array.from(document.getElementById(id).querySelectorAll('.annotation-text, .ytick text, .xtick text'))
    .map(t => { const r = t.getBoundingClientRect(); return [t.textContent, r.left, r.top, r.right, r.bottom]; })
    .filter(([_, l, t, r, b]) => r > l && b > t)"""


def _open(browser, tmp_path, key):
    estimate, memory = _estimate(key)
    path = tmp_path / f"{key}.html"
    path.write_text(render_memory_html(estimate.report, estimate), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    return page, memory


def test_device_and_stage_bars_in_chromium_are_the_json_drawn_to_scale(browser, tmp_path):
    """llama-3-70b, tp 8 × pp 4 over 32 devices: in the page the device's stacked parts add up to its peak and the
    one-device bar to the one-device step's, each stage's to its peak; each bar is drawn (its length ∝ its bytes,
    to a pixel) and labelled with its bytes; the worst stage is marked."""
    page, memory = _open(browser, tmp_path, "pipeline")
    device = memory["layout"]["device"]
    one = max(p["bytes"] for p in memory["phases"])
    sums = page.page.evaluate(_STACKS, ["bars-device", "x"])
    assert sorted(sums.values()) == sorted([device["peak"]["bytes"], one])
    assert list(page.page.evaluate(_STACKS, ["bars-device", "x2"]).values()) == [device["peak"]["bytes"]]
    parts = page.page.evaluate("""() => Object.fromEntries(document.getElementById('bars-device').data
        .filter(t => t.xaxis === 'x2').map(t => [t.name, t.x[0]]))""")
    assert parts == {name: value for name, value, _ in device_parts(memory) if value}
    stages = page.page.evaluate(_STACKS, ["bars-stages", "x"])
    assert list(stages.values()) == [s["peak"] for s in device["stages"]]
    hover = page.page.evaluate("""() => document.getElementById('bars-device').data
        .find(t => t.name === 'the rest of the moment' && t.xaxis === 'x2').customdata[0]""")
    assert hover.startswith("67,108,864 B (64.00 MiB)<br>1F1B steady state: 4 microbatches in flight")

    extents = page.page.evaluate(_EXTENTS, ["bars-device", True])
    assert sorted(extents) == ["x2|0", "x|0", "x|1"]  # three bars: one device, each device, each at its own scale
    assert all(e["hi"] - e["lo"] >= 20 and e["cross"] >= 20 for e in extents.values()), extents  # 23 px the least
    top = [e for k, e in extents.items() if k.startswith("x|")]
    lengths = sorted(e["hi"] - e["lo"] for e in top)  # one axis: the device's bar ∝ its share of one device's
    assert lengths[0] / lengths[1] == pytest.approx(device["peak"]["bytes"] / one, abs=1.5 / lengths[1])
    labels = page.page.evaluate(_LABELS, "bars-device")
    texts = [t for t, *_ in labels]
    assert "2.09 TiB: the step on one device" in texts and "87.68 GiB per device: 4.1% of one device's" in texts
    assert "87.68 GiB" in texts and "one device, no layout (end of forward)" in texts
    for text, left, *_ in labels:  # each bar's label just right of the bar's end
        if text.endswith("per device: 4.1% of one device's"):
            end = min(e["hi"] for e in top)
            assert 0 <= left - end <= 12

    drawn = page.page.evaluate(_EXTENTS, ["bars-stages", False])
    heights = [e["hi"] - e["lo"] for _, e in sorted(drawn.items(), key=lambda kv: float(kv[0].split("|")[1]))]
    assert len(heights) == 4 and all(e["cross"] >= 100 for e in drawn.values())
    peaks = [s["peak"] for s in device["stages"]]
    for height, peak in zip(heights, peaks):  # one scale: to a pixel
        assert height == pytest.approx(heights[0] * peak / peaks[0], abs=1.5)
    placed = page.page.evaluate(_LABELS, "bars-stages")
    stage_labels = [t for t, *_ in placed]
    assert stage_labels.count("worst: 87.68 GiB") == 1
    centre = {t: (left + right) / 2 for t, left, _, right, _ in placed}
    assert centre["worst: 87.68 GiB"] == pytest.approx(centre["stage 0layers 0–19 + embeddings"], abs=2)
    worst_top = next(top for t, _, top, _, bottom in placed if t.startswith("worst"))
    assert worst_top < min(e["lo"] for e in drawn.values())  # above the tallest bar
    assert all(f"stage {i}" in " ".join(stage_labels) for i in range(4))
    assert all(label in stage_labels for label in ("72.27 GiB", "58.83 GiB", "50.55 GiB"))
    _screenshot(page.page, "#bars-device", tmp_path / "layout-device.png")
    _screenshot(page.page, "#bars-stages", tmp_path / "layout-stages.png")
    page.page.close()


def test_fsdp_buffers_are_drawn_as_their_own_parts(browser, tmp_path):
    page, memory = _open(browser, tmp_path, "fsdp-pp")
    device = memory["layout"]["device"]
    parts = page.page.evaluate("""() => Object.fromEntries(document.getElementById('bars-device').data
        .filter(t => t.xaxis === 'x2').map(t => [t.name, t.x[0]]))""")
    # beside the pipeline every unit of the stage is gathered (fp32 under autocast) through its microbatches
    assert parts["FSDP2's units of the stage, all gathered"] == 8_030_519_296
    assert sum(parts.values()) == device["peak"]["bytes"] == 43_146_019_908
    stages = page.page.evaluate(_STACKS, ["bars-stages", "x"])
    assert list(stages.values()) == [s["peak"] for s in device["stages"]]
    # each stage's figure holds its own FSDP2 buffers: the worst stage's is the device's
    assert max(s["peak"] for s in device["stages"]) == device["peak"]["bytes"]
    assert "leaves out the communication buffers" not in page.page.inner_text("details.section:nth-of-type(4)")
    page.page.close()


def test_serving_gpu_and_stage_bars_in_chromium(browser, tmp_path):
    """Serving on tp 2 × pp 2: one page load. The GPU's stacked parts add up to its peak and the one-GPU bar to the
    whole model's parts, on one axis (the GPU's bar ∝ its share, to a pixel), and at its own scale; each stage's
    bar to its peak; every bar labelled."""
    estimate, memory = _serving()
    path = tmp_path / "serving.html"
    path.write_text(render_memory_html(estimate.report, estimate), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    device, one = memory["layout"]["device"], sum(v for _, v, _ in one_gpu_parts(memory))
    assert sorted(page.page.evaluate(_STACKS, ["bars-gpu", "x"]).values()) == [device["peak"], one]
    assert list(page.page.evaluate(_STACKS, ["bars-gpu", "x2"]).values()) == [device["peak"]]
    parts = page.page.evaluate("""() => Object.fromEntries(document.getElementById('bars-gpu').data
        .filter(t => t.xaxis === 'x2').map(t => [t.name, t.x[0]]))""")
    assert parts == {name: value for name, value, _ in gpu_parts(memory, device)}
    extents = page.page.evaluate(_EXTENTS, ["bars-gpu", True])
    assert sorted(extents) == ["x2|0", "x|0", "x|1"] and all(e["hi"] - e["lo"] >= 20 for e in extents.values())
    lengths = sorted(e["hi"] - e["lo"] for k, e in extents.items() if k.startswith("x|"))
    assert lengths[0] / lengths[1] == pytest.approx(device["peak"] / one, abs=1.5 / lengths[1])
    texts = [t for t, *_ in page.page.evaluate(_LABELS, "bars-gpu")]
    assert "16.87 GiB: the model on one GPU" in texts and "4.57 GiB per GPU: 27.1% of one GPU's" in texts
    assert list(page.page.evaluate(_STACKS, ["bars-stages", "x"]).values()) == [
        s["peak"] for s in memory["layout"]["stages"]]
    drawn = page.page.evaluate(_EXTENTS, ["bars-stages", False])
    assert len(drawn) == 2 and all(e["hi"] - e["lo"] >= 100 for e in drawn.values())
    labels = [t for t, *_ in page.page.evaluate(_LABELS, "bars-stages")]
    assert labels.count("worst: 4.57 GiB") == 1 and "stage 1layers 16–31 + head" in labels
    _screenshot(page.page, "#bars-gpu", tmp_path / "serving-gpu.png")
    page.page.close()
