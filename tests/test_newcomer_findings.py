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
