"""`memory MODEL --training`: build on meta in the training dtype, then model states, activations and the peak.

input → meta build in the weights' dtype (fp32, or bf16 when pure) → Report → what trains (--freeze) → model
states (memory/states.py, exact) → activations: the analytic recipe (memory/activations/) or the traced step (traced/step.py) →
the peak over the step's moments → per device (ZeRO) → fits.

The analytic engine answers where a recipe covers the layout; elsewhere, or with --trace, one step is traced on
fake tensors. With --trace the analytic answer, where there is one, is shown beside it with the difference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...entry_options import check_model_options
from ...errors import OptionError
from .result import MemoryEstimate
from .states import check_precision, weight_dtype
from .training_engines import accumulating_moments, one_device_derived, why_built
from .training_master import MAIN_GRAD_CONVENTION, MASTER_CONVENTION, master_layout_words, zero_stage_of
from .training_options import DEFAULT_TRAINING_SEQ, MAX_DEVICES, TRACE_DEPTHS, TrainingOptions, trace_depth
from .training_parts import TrainingDetail
from .training_step import step_estimate, step_estimate_at

__all__ = [
    "DEFAULT_TRAINING_SEQ", "MAIN_GRAD_CONVENTION", "MASTER_CONVENTION", "MAX_DEVICES", "TRACE_DEPTHS",
    "TrainingDetail", "TrainingOptions", "accumulating_moments", "estimate_training", "master_layout_words",
    "one_device_derived", "step_estimate", "step_estimate_at", "trace_depth", "training_answer", "zero_stage_of",
]


def estimate_training(model: Any, options: TrainingOptions = TrainingOptions(), use_cache: bool = True,
                      structure: str | None = None, **model_options: Any) -> MemoryEstimate:
    """The MemoryEstimate of one steady training step of `model`, with the model's Report as its `report`.

    With `use_cache` (and without --trace), a config whose template and cost facts are recorded, and whose layout
    an analytic activation recipe covers, is answered without torch (facts/store.py); otherwise the class is built
    on meta in the weights' dtype (and, without a recipe, one step is traced). `structure`: for a live module, the
    key its derived recipes are kept under (a plan's; default: a digest of the module's structure)."""
    check_model_options("estimate_training", model_options, TrainingOptions)
    report, estimate, _ = training_answer(model, options, use_cache, structure=structure, **model_options)
    return dataclasses.replace(estimate, report=report)


def training_answer(model: Any, options: TrainingOptions = TrainingOptions(), use_cache: bool = True,
                    structure: str | None = None, **model_options: Any):
    """`estimate_training`, and the ModelView it read (the CLI records cost facts from a built one)."""
    from ...api import is_module, as_source, inspect_module
    from ..facts.store import answer_from_facts_or_build
    from ..model_view import from_module

    options.check()
    dtype = weight_dtype(check_precision(options.precision))
    if is_module(model):  # a user's module: counted as it is, traced in a fake copy with the precision's dtype
        if any(v for k, v in model_options.items() if k != "trust_remote_code"):
            raise OptionError("{0}, {1} and {2} apply to configs, not to a live module", "model_class", "task",
                              "num_labels")
        report, view = inspect_module(model), from_module(model)
        return report, step_estimate(report, view, options, live=True, structure=structure), view
    source = as_source(model, model_options.pop("revision", None))
    report, view, estimate = answer_from_facts_or_build(
        source, lambda report, view: step_estimate(report, view, options, live=False),
        why_none=lambda report, view: why_built(view, options),
        dtype=dtype, use_cache=use_cache and not options.trace, **model_options)
    return report, estimate, view
