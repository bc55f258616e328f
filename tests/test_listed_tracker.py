"""cost/traced/tracker.py: ListedMemTracker answers every figure torch's MemTracker does, to the byte: the peak,
and each module's running peak and snapshots, over a training step whose model calls one module twice."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from paramscope.cost.traced.tracker import ListedMemTracker


def _step_under(tracker_class):
    torch.manual_seed(0)
    shared = nn.Linear(32, 32)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), shared, nn.Sequential(nn.GELU(), shared), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    inputs = torch.randn(8, 16)
    model(inputs).sum().backward()  # warm-up: the optimizer's states exist before the measured step
    optimizer.step()
    optimizer.zero_grad()
    tracker = tracker_class()
    tracker.track_external(model, optimizer)
    with tracker:
        model(inputs).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        peak_after_step = tracker.get_tracker_snapshot("peak")
        tracker.reset_mod_stats()  # stats made afresh after a reset, as a decode step after the prefill does
        with torch.no_grad():
            model(inputs)
    modules = [(stats.mod_fqn, stats.local_peak, stats.snapshots) for stats in tracker.memory_tracking.values()]
    return peak_after_step, tracker.get_tracker_snapshot("peak"), modules


def test_the_listed_tracker_measures_what_torchs_memtracker_measures():
    stock, listed = _step_under(MemTracker), _step_under(ListedMemTracker)
    # the shared Linear is one module, under the last of its names
    assert [fqn for fqn, _, _ in listed[2]] == ["Sequential", "Sequential.0", "Sequential.1", "Sequential.3.1",
                                                 "Sequential.3", "Sequential.3.0", "Sequential.4"]
    assert listed[0][torch.device("cpu")]["Total"] > 0
    assert listed == stock
