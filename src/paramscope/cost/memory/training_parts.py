"""The pieces a training step adds up beside its activations, and what it hands back: `TrainingDetail` (model states,
the phases, the check between engines), the optimizer step's temporaries, a tied embedding's gradient arriving twice,
the parameters kept in their own dtype, and a cross-attention family's tower lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...frozen import FrozenDict, freeze_fields
from ..traced.step import TracedStep
from .phases import PhaseFigure
from .states import ModelStates

@dataclass(frozen=True)
class TrainingDetail:
    """What a training estimate adds to MemoryEstimate: model states, the phases, the check between engines."""

    states: ModelStates
    frozen: tuple[str, ...]  # parameter names that do not train
    activation_source: str  # "analytic: Llama-style decoder" | "traced"
    phases: tuple[PhaseFigure, ...]
    per_device: FrozenDict[str, int] | None
    traced: TracedStep | None = None
    analytic_peak: int | None = None  # beside a traced answer, where a recipe exists
    by_category: FrozenDict[str, int] = field(default_factory=FrozenDict)  # the traced peak's MemTracker breakdown
    analytic_activations: int | None = None  # beside a traced answer: the recipe's saved activations
    trace_depth: str | None = None  # the traced engine's: "extended" (cuts extended to the depth) | "full"
    device: Any = None  # parallel.estimate.DeviceMemory: one device's figures under a layout
    # a cross-attention family's step on audio or images: (part, module path, the activation bytes its forward
    # leaves allocated as it returns, MemTracker's) for the tower and its projector, part of the activations
    towers: tuple[tuple[str, str, int], ...] = ()

    def __post_init__(self) -> None:
        freeze_fields(self, "per_device", "by_category")


def tower_activations(traced: TracedStep | None, cross: Any) -> tuple[tuple[str, str, int], ...]:
    """The tower's and projector's lines of a cross-attention family's traced step: what each one's forward leaves
    allocated as it returns (its output, what it saved for backward, autocast's 16-bit weight copies), read off the
    same MemTracker trace; the backward frees them."""
    if traced is None or cross is None:
        return ()
    kept = dict(traced.kept_by_module)
    return tuple((part, path, kept[path]) for part, path in cross.parts if path in kept)


def own_dtypes(report: Any, own: frozenset[str]) -> dict[str, int]:
    """dtype → parameters stored in their own dtype rather than the precision's (a plan's bf16 adapters)."""
    counts: dict[str, int] = {}
    for param in report.params:
        if param.name in own:
            counts[param.dtype] = counts.get(param.dtype, 0) + param.numel
    return dict(sorted(counts.items()))


def step_temporaries(optimizer: str, gradients: int) -> tuple[int, str]:
    """(bytes, words) the optimizer's step allocates beside the states, as the step runs on a GPU."""
    if optimizer in ("adamw", "adam"):
        return 0, f"the fused {'AdamW' if optimizer == 'adamw' else 'Adam'} step keeps no temporaries"
    if optimizer in ("sgd", "sgd-momentum"):
        return 0, "the foreach SGD step updates in place"
    if optimizer == "adafactor":
        # torch.optim.Adafactor with foreach (its default on CUDA) builds every trainable tensor's update at once:
        # one tensor like each gradient (a real CPU step with foreach=True measures exactly this)
        return gradients, (f"Adafactor's foreach step makes an update like every gradient at once, "
                           f"{gradients:,} B")
    return 0, f"{optimizer}'s step temporaries are not counted"


def tied_embedding_bytes(report: Any, trainable: frozenset[str]) -> int:
    """Bytes of a trainable input embedding tied to the output head: its gradient arrives twice."""
    roles = {p.name: p for p in report.params}
    for group in report.tied:
        param = roles.get(group.canonical)
        if param is not None and param.role.startswith("embedding") and param.name in trainable:
            from ..dtypes import itemsize

            return param.numel * itemsize(param.dtype)
    return 0
