"""The smaller defects a newcomer's trial of the multi-GPU layouts found (issue 28), each held here: the device's
peak line sums to its figure under --ep and ZeRO-2 (the rank's gradients, not one device's)."""

from __future__ import annotations

import pytest

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import ParallelLayout
from parallel_steps import small_mixtral
from test_device_arithmetic import _check


@pytest.mark.parametrize("layout, peak, own", [
    # the ep rank holds its E / ep experts' gradients, not the whole model's (2,350,848 B on one device)
    (ParallelLayout(dp=2, ep=2), 5_474_264, "1,369,944 (one device's live at the backward peak"),
    (ParallelLayout(dp=2, shard="zero2"), 5_879_416, "1,177,560 (one device's live at the backward peak"),
    (ParallelLayout(dp=2, ep=2, shard="zero2"), 3_422_456, "686,040 (one device's live at the backward peak"),
    (ParallelLayout(dp=2), 9_405_784, "2,352,984 (one device's live at the backward peak"),
])
def test_a_data_and_expert_parallel_rank_peak_sums_to_its_figure(layout, peak, own):
    """A 5-layer Mixtral cut, 1 × 8 tokens (its backward peaks, the gradients live): the printed line is resident +
    the rank's own moment (+ the permute index) = the peak; the one device's words kept inside, gradients swapped."""
    report, estimate, _ = training_answer(small_mixtral(), TrainingOptions(
        batch=1, seq=8, precision="bf16-mixed", fits=False, layout=layout), use_cache=False)
    assert estimate.training.device.peak == peak
    line = _check(report, estimate)
    assert own in line
    if layout.ep > 1 or layout.shard == "zero2":
        assert "with the rank's gradients" in line and "in place of one device's 2,350,848" in line


def _json(capsys, *argv):
    import json

    from paramscope.cli import main

    assert main(["memory", "llama-3-8b", "--training", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["memory"]


def test_devices_zero3_is_the_dp_layout_and_per_device_is_its_device(capsys):
    """--devices 8 --zero 3 and --dp 8 --zero 3: one layout, one answer (ZeRO-3's gathered layer and head counted,
    872,448,000 + 2,101,346,304 B); under a layout `per_device` is the device's, so `peak` is per device as the
    schema says when `per_device` is set."""
    spelled, layout = _json(capsys, "--devices", "8", "--zero", "3"), _json(capsys, "--dp", "8", "--zero", "3")
    assert spelled == layout
    device = layout["layout"]["device"]
    assert sum(b["bytes"] for b in device["communication"]) == 2_973_794_304
    shares = layout["per_device"]
    assert shares["peak"] == layout["peak"]["bytes"] == device["peak"]["bytes"] and shares["peak_phase"] == "backward"
    assert (shares["weights"], shares["gradients"], shares["master_weights"]) == (4_015_130_624, 4_015_130_624, 0)
