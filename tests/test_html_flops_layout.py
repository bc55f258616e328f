"""flops --html under a multi-GPU layout (issue 28 §7): the page holds the busiest device's table by role, its totals
a step, MFU and HFU per device given a step time, and each pipeline stage's device, all the DeviceFlops' exact
integers (the data the text reads); the recompute is named as the text names it (flash attention's scores rerun
even without checkpointing)."""

from __future__ import annotations

import html
import re

from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
from paramscope.cost.parallel.layout import layout_for
from paramscope.render.flops import RERUN_WORDS
from paramscope.render.html.cost import render_flops_html


def _values(page: str, table_id: str) -> list[int]:
    table = re.search(rf'<table class="[^"]*" id="{table_id}"[^>]*>(.*?)</table>', page, re.S).group(1)
    return [int(v) for v in re.findall(r'data-value="(\d+)"', table)]


def test_the_page_holds_the_device_its_stages_and_its_mfu():
    """llama-3-70b, tp 8 × pp 4 over 32 H100s, a 2 s step (the newcomer's command, with --step-seconds 2)."""
    estimate = estimate_flops("llama-3-70b", FlopOptions(training=True, layout=layout_for(devices=32, tp=8, pp=4),
                                                         devices=32, gpu="h100", step_seconds=2.0))
    device, compute = estimate.device, estimate.compute
    page = render_flops_html(estimate.report, estimate, compute)
    shown = [t for t in device.terms if t.flops]
    assert _values(page, "device-flops") == [t.flops for t in shown] + [device.forward]
    assert device.forward == 9_643_275_321_344 and device.stage == 3
    totals = re.search(r'id="device-totals"(.*?)</table>', page, re.S).group(1)
    rows = dict(re.findall(r'data-row="([a-z-]+)"><th>[^<]*</th><td class="num" data-value="([\d.e-]+)"', totals))
    assert {k: int(rows[k]) for k in ("backward", "step", "recompute", "hardware", "sum")} == {
        "backward": device.backward, "step": device.step, "recompute": device.recompute,
        "hardware": 29_101_624_655_872, "sum": 887_022_415_773_696}
    assert float(rows["device-mfu"]) == compute.device_mfu and float(rows["device-hfu"]) == compute.device_hfu
    assert f"{100 * compute.device_mfu:.2f}%" == "1.46%" and "1.46%</td>" in page
    stages = _values(page, "flops-stages")
    assert stages == [v for s in device.stages for v in (s.forward, s.backward, s.step, s.recompute)]
    assert 'data-stage="3" class="busiest"' in page and 'id="bars-stage-flops"' in page
    # the recompute here is flash attention's (checkpointing is off): named as the text names it
    assert "(checkpointing)" not in page
    assert html.escape(f"hardware FLOPs beyond the model's: {RERUN_WORDS}") in page
    assert html.escape("One device: dp 1 × tp 8 × pp 4 (1F1B, 1 microbatch) = 32 devices; stage 3 (layers 60–79, "
                       "the head: the busiest), tp rank 0 (the most vocabulary rows)") in page
