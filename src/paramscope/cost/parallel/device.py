"""One device's answer under a parallel layout, as data: its model states, activations, communication
buffers, moments and pipeline stages (estimate.py composes them; render/ and the JSON read them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ...frozen import FrozenDict, freeze_fields
from ..memory.phases import PhaseFigure
from .layout import ParallelLayout


@dataclass(frozen=True)
class Buffer:
    """A communication buffer live at some moments of the step: what it is, its bytes, when."""

    name: str
    bytes: int
    arithmetic: str
    moments: tuple[str, ...]  # the phases whose moments hold it


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's device (rank 0 of its tensor and data-parallel groups)."""

    rank: int
    layers: tuple[int, int] | None  # (first, last) layer index held; None: none
    chunks: tuple[tuple[int, int], ...]  # the runs of layers held, (first, last) each: one, or v interleaved
    layer_count: int
    in_flight: int
    first: bool
    last: bool
    weights: int
    gradients: int
    optimizer: int
    master_weights: int
    activations: int
    peak: int
    peak_phase: str
    replayed: Any = None  # a derived class's stage: its figures replayed from the recipe (stage_recipe.py)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's share of a training step under `layout`: rank 0 of each group (the largest share wherever a cut
    is uneven), on the pipeline stage whose peak is the largest."""

    layout: ParallelLayout
    weights: int
    gradients: int
    optimizer: int
    master_weights: int
    buffers: int  # the model's own buffers (rotary tables), replicated
    activations: int  # what this device's forward saves for backward (every microbatch it holds)
    activations_from: str
    states_arithmetic: str
    comm: tuple[Buffer, ...]
    phases: tuple[PhaseFigure, ...]
    rules: FrozenDict[str, str]  # role → its tensor/expert-parallel rule in words
    stages: tuple[StageMemory, ...] = ()  # every pipeline stage (pp > 1)
    pipeline: str = ""  # the split and schedule in words
    bubble: float = 0.0
    notes: tuple[str, ...] = field(default=())
    traced: Any = None  # with --trace: rank 0's step traced on torch's fake process group (a TracedStep); under a
    # derived class's pipeline, each stage traced (traced/pipeline_stage.StageTrace, one a stage)
    rank_check: Any = None  # with --trace on one rank: its check's data (device_trace.RankCheck), its note in `notes`
    # bf16-main-grad: `gradients` is the fp32 main-gradient buffer, resident at every moment (in each phase's bytes
    # beside the weights, not among its moment's terms)
    gradients_resident: bool = False
    # bf16-master under DeepSpeed's BF16_Optimizer (a pipeline at ZeRO 0): the bytes of `gradients` that are its bf16
    # gradient-accumulation buffer, resident at every moment beside the bf16 .grad (parallel/states.bf16_optimizer)
    accumulation_buffer: int = 0

    def __post_init__(self) -> None:
        freeze_fields(self, "rules")

    @property
    def peak_figure(self) -> PhaseFigure:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def peak(self) -> int:
        return self.peak_figure.bytes


class RingQuestion(Protocol):
    """What the context-parallel refusals read (estimate.check_context_parallel, device_parts.encoder_refusal and
    refuse_attention_dropout): the model, its text config, the layout and the sequence. A StepContext is one; the
    layout search asks with these four alone, before any step (layout_evaluation)."""

    @property
    def view(self) -> Any: ...
    @property
    def text(self) -> Any: ...
    @property
    def layout(self) -> ParallelLayout: ...
    @property
    def seq(self) -> int: ...


@dataclass(frozen=True)
class StepContext:
    """What the one-device training answer (memory/training.py) knows that a device's answer reads."""

    report: Any
    view: Any
    layout: ParallelLayout
    states: Any  # the one-device ModelStates
    buffer_bytes: int
    phases: tuple[PhaseFigure, ...]  # the one-device moments
    activations: int
    analytic: Any  # the one-device analytic TrainingActivations, or None
    derived_or_traced: bool
    source_label: str
    precision: str
    optimizer: str
    trainable: frozenset[str]
    own: frozenset[str]
    text: Any
    batch: int
    seq: int
    shape: dict  # the analytic recipe's keywords (precision, checkpointing, casts)
    step: tuple[int, str]  # the optimizer step's temporaries, (bytes, words)
    trace: bool = False  # --trace: one rank's step traced on torch's fake process group, as a check
    attention: str | None = None
    frozen: frozenset[str] = frozenset()
    weights_dtype: str | None = None
    limit: int | None = None  # the model's context
    live: bool = False
    structure: str | None = None
    derive: bool = True  # TrainingOptions.derive_layout
    accumulating: bool = False  # a micro-step under gradient accumulation: a derived rank replays the later one


# an answer that needs the built module: the recipe is neither cached nor derivable without it
NEEDS_BUILD = object()
