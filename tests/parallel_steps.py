"""One device's step under a layout, both ways: the engines' answer and the traced rank on torch's fake process
group (the tests of the per-device engines hold the first to the second)."""

from __future__ import annotations

import dataclasses

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings


def derived_and_traced(config, layout, *, batch=2, seq=64, precision="bf16-mixed", attention=None):
    """(the answer for `config` under `layout`, the traced rank 0's step of the same class). One answer gives both
    the estimate and the built class (estimate_training's, with its report): a second answer without the layout
    would derive the one-device step again."""
    report, estimate, view = training_answer(config, TrainingOptions(batch=batch, seq=seq, precision=precision,
                                                                     attention=attention, layout=layout),
                                             use_cache=False)
    estimate = dataclasses.replace(estimate, report=report)
    fsdp = layout.shard == "fsdp"
    traced = trace_parallel_training(view.module, StepSettings(batch=batch, seq=seq, precision=precision,
                                                               optimizer="adamw", attention=attention),
                                     dp=layout.dp if fsdp else 1, shard="fsdp" if fsdp else "none", tp=layout.tp,
                                     sp=layout.sp)
    return estimate, traced
