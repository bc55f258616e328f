"""One device's training step under a layout: its model states, activations, communication buffers and peak.

    Report + view → placements (rules.py: each parameter's tensor/expert-parallel cut, from its role)
    → pipeline stages (pipeline.py: the layers, embeddings and head each device holds; microbatches in flight)
    → each device's model states (states.py: its shards, then ZeRO's or FSDP2's data-parallel share)
    → its activations: data parallel alone leaves a rank's step as one device's (its own batch); under tensor
      parallelism the family's recipe on the rank's shard (activations.py); under context parallelism the recipe at
      the rank's S / cp tokens; under a pipeline each stage's layers × the microbatches it holds
    → the communication buffers that matter (FSDP2's all-gathered units, context parallel's rotating K and V)
    → each moment with the device's figures; the device's peak, and the largest over the stages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import ParamscopeError, UnsupportedError
from ...frozen import FrozenDict, freeze_fields
from ..memory.phases import PhaseFigure, cast_weights, moment_phases
from .layout import ParallelLayout, shard_words
from .pipeline import LAYER_PREFIX, Stage, bubble, layer_stack_of, params_held, split_words, stages
from .rules import Placement, model_shape, place, tp_rule_words
from .states import DeviceStates, device_states



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

    def __post_init__(self) -> None:
        freeze_fields(self, "rules")

    @property
    def peak_figure(self) -> PhaseFigure:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def peak(self) -> int:
        return self.peak_figure.bytes


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


def placements_for(report: Any, view: Any, layout: ParallelLayout) -> tuple[Placement, ...]:
    from ..dims import text_config

    classes = {sub.__class__.__name__ for _, sub in view.root.named_modules()} if view.root is not None else set()
    return place(report.params, model_shape(text_config(view.config), classes), tp=layout.tp, ep=layout.ep)


def rules_in_words(placements: tuple[Placement, ...], layout: ParallelLayout) -> dict[str, str]:
    words: dict[str, str] = {}
    for p in placements:
        if p.role in words:
            continue
        rule = tp_rule_words(p.tp, layout.tp) if layout.tp > 1 else "whole (no tensor parallelism)"
        cuts = {q.tp for q in placements if q.role == p.role}
        if layout.tp > 1 and p.role == "moe.experts" and cuts == {"column", "row"}:  # packed gate_up and down
            rule = (f"gate and up column-parallel (intermediate / {layout.tp} of each expert), down row-parallel "
                    f"(input features / {layout.tp})")
        if p.experts_split:
            rule += f"; experts / ep {layout.ep}"
        words[p.role] = rule
    return dict(sorted(words.items()))


def fsdp_units(placements: tuple[Placement, ...], weight_bytes: Callable[[Placement], int]) -> tuple[int, int]:
    """(the root unit's bytes, the largest layer unit's bytes) as FSDP2 all-gathers them on a rank: fully_shard on
    each layer of the stack and on the root, which holds the rest (embeddings, final norm, head)."""
    layers: dict[str, int] = {}
    root = 0
    for p in placements:
        match = LAYER_PREFIX.match(p.name)
        if match:
            key = match.group(0)
            layers[key] = layers.get(key, 0) + weight_bytes(p)
        else:
            root += weight_bytes(p)
    return root, max(layers.values(), default=0)


def _resident(dev: DeviceStates, buffers: int) -> int:
    return dev.weights + dev.optimizer + dev.master_weights + buffers


def layout_device(ctx: StepContext) -> tuple[DeviceMemory, Callable[[tuple[PhaseFigure, ...], int, int], PhaseFigure]]:
    """(the device's figures, the function that gives the device's largest moment at another batch and length from
    the one-device moments there: the fits table's question)."""
    layout = ctx.layout
    placements = placements_for(ctx.report, ctx.view, layout)
    rules = rules_in_words(placements, layout)
    derivable = ctx.derive and layout.pp == 1 and layout.cp == 1 and layout.ep == 1 and (
        layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1 or
        layout.tp > 1 and _local_recipe_missing(ctx))
    declined = ""
    if derivable:
        derived = _derived_device(ctx, placements, rules)
        if derived is _NEEDS_BUILD:
            return None
        if isinstance(derived, str):
            declined = derived
        else:
            device, at = derived
            closed = _closed_form_beside(ctx, placements, rules, device)
            if closed:
                device = dataclasses.replace(device, notes=device.notes + (closed,))
            return (_traced_check(ctx, device), at) if ctx.trace else (device, at)
    try:
        if layout.pp > 1:
            answer = _pipeline_device(ctx, placements, rules)
            if answer is _NEEDS_BUILD:
                return None
            device, at = answer
        elif layout.tp == 1 and layout.cp == 1:
            device, at = _data_parallel_device(ctx, placements, rules)
        else:
            device, at = _sharded_activations_device(ctx, placements, rules)
    except UnsupportedError as err:
        if not declined:
            raise
        raise UnsupportedError("{why}; and {declined}", why=str(err),
                               declined=declined.replace(": the closed form answers", "")) from err
    if declined:
        device = dataclasses.replace(device, notes=device.notes + (declined,))
    if layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1:
        device = dataclasses.replace(device, notes=device.notes + (
            "FSDP2: the root unit (embeddings, final norm, head) stays gathered through the step and one layer's "
            "parameters are gathered while it runs, as counted; its backward also holds the root's gradients "
            "unsharded until their reduce-scatter at the end, which the closed form does not count: where the "
            "logits do not dominate (short sequences against a large vocabulary) the step can peak there instead, "
            "above this figure (Llama-3-8B cut to 4 layers at 512 tokens: 12% above; full depth at 2,048 tokens: "
            "equal to 16 KB); --trace measures one rank",))
    if ctx.trace:
        device = _traced_check(ctx, device)
    return device, at


_NEEDS_BUILD = object()


def _closed_form_beside(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str],
                        device: DeviceMemory) -> str:
    """The closed form's device peak, where there is one, as a check beside a derived answer."""
    try:
        if ctx.layout.tp == 1 and ctx.layout.cp == 1:
            closed, _ = _data_parallel_device(ctx, placements, rules)
        else:
            closed, _ = _sharded_activations_device(ctx, placements, rules)
    except UnsupportedError:
        return ""
    diff = (closed.peak - device.peak) / device.peak if device.peak else 0.0
    what = " (it does not count FSDP2's in-backward buffers: the root's unsharded gradients)" if \
        ctx.layout.shard in ("fsdp", "hsdp") else ""
    return f"check: the closed form gives {closed.peak:,} B, {100 * diff:+.3f}% from the derived peak{what}"


def _local_recipe_missing(ctx: StepContext) -> bool:
    from .activations import local_recipe

    return local_recipe(ctx.text, ctx.view.class_name) is None or ctx.analytic is None or ctx.derived_or_traced


def _derived_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """One rank's step as closed forms in B and S derived from traces of short cuts of the real class with the
    layout applied on torch's fake process group (derived/, as for one device: two points, checked by a longer
    cut; kept in the cache under the layout), composed with the device's exact model states. Why not, in words,
    where the derivation declines (the caller answers analytically and says so); _NEEDS_BUILD where it is not
    cached and there is no module to trace."""
    from ..derived.step import DerivedStep
    from ..derived.symbols import NotDerivable
    from ..traced.step import StepSettings

    layout = ctx.layout
    fsdp = layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1
    settings = StepSettings(precision=ctx.precision, optimizer=ctx.optimizer,
                            grad_checkpointing=bool(ctx.shape.get("checkpointing")), attention=ctx.attention,
                            frozen=ctx.frozen, weights_dtype=ctx.weights_dtype, own_dtype=ctx.own,
                            layout=(layout.shard_degree if fsdp else 1, "fsdp" if fsdp else "none", layout.tp,
                                    layout.sp))
    try:
        step = DerivedStep.first(ctx.view.module, ctx.view.class_name, ctx.view.config, settings, batch=ctx.batch,
                                 seq=ctx.seq, limit=ctx.limit, live=ctx.live, structure=ctx.structure)
    except (NotDerivable, ParamscopeError) as err:  # or the traced layout refuses (a class without a tp plan)
        return f"the per-device step was not derived from traces ({err}): the closed form answers"
    if step is None:
        return _NEEDS_BUILD
    dev = _states(ctx, placements)
    resident = _resident(dev, ctx.buffer_bytes)
    whole = _whole_embedding_gradient(ctx, placements)
    norms = _sequence_parallel_norm_gradients(ctx)
    step_bytes, step_text = ctx.step

    def phases_at(figures: Any) -> tuple[PhaseFigure, ...]:
        out = (PhaseFigure("forward", resident + figures.forward, "derived, one rank", "", 0, figures.forward),
               PhaseFigure("backward", resident + figures.backward, "derived, one rank", "",
                           figures.gradients_at_backward_peak, figures.backward - figures.gradients_at_backward_peak),
               PhaseFigure("optimizer step", resident + dev.gradients + step_bytes, "optimizer step",
                           f"gradients {dev.gradients:,}; {step_text}", dev.gradients))
        if whole is not None:
            out = tuple(_with_whole_gradient(p, whole) for p in out)
        return tuple(_with_norm_gradients(p, norms) for p in out)

    figures = step.recipe.peaks(ctx.batch, ctx.seq)
    phases = phases_at(figures)
    for index, phase in enumerate(phases[:2]):
        where = "forward" if index == 0 else "backward"
        phases = phases[:index] + (dataclasses.replace(phase, arithmetic=step.recipe.words(
            where, ctx.batch, ctx.seq)),) + phases[index + 1:]
    notes = [f"one rank's step derived from traces of the real class on torch's fake process group "
             f"({'FSDP2' if fsdp else ''}{' and ' if fsdp and layout.tp > 1 else ''}"
             f"{'DTensor tensor parallel' if layout.tp > 1 else ''}{' with sequence parallel' if layout.sp else ''}"
             f"): {step.recipe.traced}; {step.recipe.check}"]
    device = DeviceMemory(layout, dev.weights, dev.gradients, dev.optimizer, dev.master_weights, ctx.buffer_bytes,
                          figures.end_of_forward, "derived: one rank's step traced on short cuts with the layout "
                          "applied (torch's fake process group), laid out to the model's depth", dev.arithmetic,
                          (), phases, rules, notes=tuple(notes))

    def at(one_device: tuple[PhaseFigure, ...], batch: int, length: int) -> PhaseFigure:
        point = step.at(batch, length)
        if point is None:
            return PhaseFigure("backward", 1 << 62, "", "")
        return max(phases_at(point), key=lambda p: p.bytes)
    return device, at


def _traced_check(ctx: StepContext, device: DeviceMemory) -> DeviceMemory:
    """--trace: rank 0's step of the real class traced on torch's fake process group (FSDP2 and DTensor as
    traced/parallel.py applies them), its peak beside the analytic one."""
    from ..traced.parallel import trace_parallel_training
    from ..traced.step import StepSettings

    layout = ctx.layout
    why = None
    if ctx.view.module is not None and layout.pp > 1 and device.stages and \
            all(s.replayed is not None for s in device.stages):
        return _traced_stages(ctx, device)
    if ctx.view.module is None:
        why = "the model was not built"
    elif layout.pp > 1 or layout.cp > 1:
        why = "pipeline and context parallelism have no traced engine here (their figures are checked against " \
              "torch's schedules in tests)"
    elif layout.ep > 1 and (layout.tp > 1 or layout.shard_degree > 1 or layout.dp != layout.ep):
        why = "expert parallelism is traced over every data-parallel rank, without sharding or tensor parallel " \
              "(--ep equal to dp)"
    elif layout.shard in ("zero1", "zero2", "zero3"):
        why = "DeepSpeed's ZeRO is not traced (no DeepSpeed here); --zero fsdp is"
    if why:
        return dataclasses.replace(device, notes=device.notes + (f"--trace: no rank traced: {why}",))
    fsdp = layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1
    settings = StepSettings(batch=ctx.batch, seq=ctx.seq, precision=ctx.precision, optimizer=ctx.optimizer,
                            attention=ctx.attention, frozen=ctx.frozen, weights_dtype=ctx.weights_dtype,
                            own_dtype=ctx.own)
    traced = trace_parallel_training(ctx.view.module, settings, dp=layout.ep if layout.ep > 1 else
                                     layout.shard_degree if fsdp else 1, shard="fsdp" if fsdp else "none",
                                     tp=layout.tp, sp=layout.sp, ep=layout.ep)
    top = traced.peak
    diff = (device.peak - top.bytes) / top.bytes if top.bytes else 0.0
    engine = "derived" if device.activations_from.startswith("derived") else "analytic"
    note = (f"check: rank 0's step traced on torch's fake process group (FSDP2 and DTensor, MemTracker): peak "
            f"{top.bytes:,} B in {top.phase}; the {engine} {device.peak:,} B is {100 * diff:+.3f}% from it")
    return dataclasses.replace(device, traced=traced, notes=device.notes + (note,) + tuple(traced.notes))



def _traced_stages(ctx: StepContext, device: DeviceMemory) -> DeviceMemory:
    """--trace under a pipeline of a derived class: each stage of the real class cut to its layers and run as
    PipelineStage runs it, its in-flight forwards then one backward, measured by MemTracker (traced/pipeline_stage.py),
    beside the stage's replayed figures."""
    from ..traced.parallel import check_layout
    from ..traced.pipeline_stage import trace_stage
    from ..traced.step import StepSettings

    layout = ctx.layout
    # tensor parallel: rank 0's stage, the copy sharded on torch's fake process group
    parallel = check_layout(1, "none", layout.tp, layout.sp, 0) if layout.tp > 1 else None
    if layout.virtual_stages > 1:
        return dataclasses.replace(device, notes=device.notes + (
            "--trace: no stage traced: an interleaved stage's chunks are bounded by the largest, not traced",))
    stack, _ = layer_stack_of([p.name for p in ctx.report.params])
    micro = ctx.batch // layout.micro_batches
    settings = StepSettings(batch=micro, seq=ctx.seq, precision=ctx.precision, optimizer=ctx.optimizer,
                            attention=ctx.attention, frozen=ctx.frozen, weights_dtype=ctx.weights_dtype,
                            own_dtype=ctx.own)
    notes, traces = [], []
    for stage in device.stages:
        start, stop = stage.layers[0], stage.layers[1] + 1
        replayed = stage.replayed
        later = replayed.later_in_flight
        traced = trace_stage(ctx.view.module, settings, stack, start, stop, stage.in_flight, later=later,
                             parallel=parallel)
        traces.append(traced)
        words = ""
        if later:  # the later backward's rise above what the first left (the microbatches still held)
            rise = traced.later_peak - traced.after_backward
            derived = replayed.later_peak - replayed.after_first_backward
            again = "one more forward and " if later == stage.in_flight else ""
            words = (f"; then {again}the next backward, gradients held: {rise:,} B above what the first backward "
                     f"left, replayed {derived:,} B")
        notes.append(f"check: stage {stage.rank} traced (the real class cut to layers {start}–{stop - 1} and run as "
                     f"PipelineStage runs it, {stage.in_flight} forward{'s' if stage.in_flight > 1 else ''} then a "
                     f"backward; MemTracker): held {traced.held:,} B, peak {traced.peak:,} B above its states; "
                     f"replayed {replayed.held:,} B and {replayed.peak:,} B "
                     f"({'equal' if (traced.held, traced.peak) == (replayed.held, replayed.peak) else 'differs'})"
                     + words)
    return dataclasses.replace(device, traced=tuple(traces), notes=device.notes + tuple(notes))


def _states(ctx: StepContext, placements: tuple[Placement, ...], params: Any = None,
            copies: tuple[Placement, ...] = ()) -> DeviceStates:
    """The device's model states for `params` (default: every parameter), and `copies`: placements of parameters it
    holds a second time (a tied head's copy on the last stage), with their own gradient and optimizer states."""
    params = list(params if params is not None else ctx.report.params)
    names = {p.name for p in params}
    chosen = tuple(p for p in placements if p.name in names) + tuple(copies)
    return device_states(params + [_as_param(c) for c in copies], chosen, ctx.layout, precision=ctx.precision,
                         optimizer=ctx.optimizer, trainable=ctx.trainable | {c.name for c in copies}, own=ctx.own)


def _as_param(placement: Placement) -> Any:
    import math

    from ...count import ParameterInfo

    return ParameterInfo(placement.name, placement.shape, math.prod(placement.shape), True, placement.role,
                         placement.dtype)


def _fsdp_buffers(ctx: StepContext, placements: tuple[Placement, ...]) -> list[Buffer]:
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    layout = ctx.layout

    def unsharded(p: Placement) -> int:
        return p.local_numel * itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]
    if layout.shard == "zero3" and layout.shard_degree > 1:
        # DeepSpeed gathers each module's parameters as it runs and frees them after (not traced here: no DeepSpeed);
        # the head, which the loss's backward reads first, is the largest outside the layers
        root, layer = fsdp_units(placements, unsharded)
        head = max((unsharded(p) for p in placements if p.role.startswith("head")), default=0)
        return [Buffer("ZeRO-3's gathered layer (DeepSpeed)", layer,
                       f"one layer's parameters gathered while it runs, {layer:,} B (DeepSpeed's module-by-module "
                       "all-gather; its prefetch bucket, stage3_prefetch_bucket_size, can hold part of the next)",
                       ("forward", "backward")),
                Buffer("ZeRO-3's gathered head (DeepSpeed)", head,
                       f"the head's parameters gathered as the logits are made and their backward runs, {head:,} B",
                       ("forward", "backward"))] if layer or head else []
    if layout.shard not in ("fsdp", "hsdp") or layout.shard_degree == 1:
        return []
    root, layer = fsdp_units(placements, unsharded)
    return [Buffer("FSDP2's root unit, all-gathered", root,
                   f"the parameters outside the layers (embeddings, final norm, head) unsharded, {root:,} B: the "
                   "root unit is not resharded after the forward", ("forward", "backward")),
            Buffer("FSDP2's layer unit, all-gathered", layer,
                   f"one layer's parameters unsharded while it runs, {layer:,} B (the last layer's as the loss is "
                   "taken and backward starts)", ("forward", "backward"))]


def _with_buffers(phase: PhaseFigure, comm: list[Buffer]) -> PhaseFigure:
    held = [b for b in comm if phase.phase in b.moments and phase.where not in ("optimizer step", "end of backward")]
    if not held:
        return phase
    extra = sum(b.bytes for b in held)
    return dataclasses.replace(phase, bytes=phase.bytes + extra, arithmetic=phase.arithmetic + "; + " + " + ".join(
        f"{b.name} {b.bytes:,}" for b in held))


def _data_parallel_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Data (and expert) parallel alone: each rank runs one device's step on its own batch; the moments are the
    one-device ones with the device's model states, and FSDP2's gathered units."""
    states = ctx.states
    full_resident = states.weights.bytes + states.optimizer.bytes + states.master_weights.bytes
    dev = _states(ctx, placements)
    comm = _fsdp_buffers(ctx, placements)

    def shifted(figures: tuple[PhaseFigure, ...], batch: int = ctx.batch,
                length: int = ctx.seq) -> tuple[PhaseFigure, ...]:
        out = []
        for p in figures:
            grads = -(-p.gradients * dev.gradients // states.gradients.bytes) if states.gradients.bytes else 0
            moved = dataclasses.replace(p, bytes=p.bytes - full_resident + dev.weights + dev.optimizer +
                                        dev.master_weights - p.gradients + grads, gradients=grads)
            out.append(_with_buffers(moved, comm + _expert_dispatch(ctx, placements, batch, length)))
        return tuple(out)

    phases = shifted(ctx.phases)
    device = DeviceMemory(ctx.layout, dev.weights, dev.gradients, dev.optimizer, dev.master_weights,
                          ctx.buffer_bytes, ctx.activations,
                          f"{ctx.source_label}: each rank runs its own batch, as one device does", dev.arithmetic,
                          tuple(comm + _expert_dispatch(ctx, placements, ctx.batch, ctx.seq)), phases, rules)

    def at(figures: tuple[PhaseFigure, ...], batch: int, length: int) -> PhaseFigure:
        return max(shifted(figures, batch, length), key=lambda p: p.bytes)
    return device, at


def _expert_dispatch(ctx: StepContext, placements: tuple[Placement, ...], batch: int, length: int) -> list[Buffer]:
    """Under expert parallelism, the dispatch's permute indices a rank keeps for the backward (experts.py)."""
    from ..dims import dim
    from .experts import dispatch_index_bytes, moe_layers

    layers, top_k = moe_layers(placements), dim(ctx.text, "top_k")
    if ctx.layout.ep == 1 or not layers or not top_k:
        return []
    size, words = dispatch_index_bytes(layers, top_k, batch, length)
    return [Buffer("expert parallel's permute index", size, words, ("forward", "backward"))]


def _local_shape(ctx: StepContext, placements: tuple[Placement, ...]) -> dict:
    if not ctx.precision.endswith("-mixed"):
        return dict(ctx.shape, cast_weights=0, cast_head=0, cast_biases=0)
    local = {p.name: p.local_numel for p in placements}
    for param in ctx.report.params:  # a tied head is its embedding's shard under any of its names
        for alias in param.aliases:
            local[alias] = local[param.name]
    cast, head, biases = cast_weights(ctx.view, local)
    return dict(ctx.shape, cast_weights=cast, cast_head=head, cast_biases=biases)


def _tied_bytes(ctx: StepContext, placements: tuple[Placement, ...]) -> int:
    """A trainable input embedding tied to the head, as the device holds it: its gradient arrives twice."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    by_name = {p.name: p for p in placements}
    for group in ctx.report.tied:
        local = by_name.get(group.canonical)
        if local is not None and local.role.startswith("embedding") and local.name in ctx.trainable:
            return local.local_numel * itemsize(trained_dtype(local, ctx.precision, ctx.own))  # type: ignore
    return 0


def _local_activations(ctx: StepContext, shape: dict, batch: int, length: int) -> Any:
    """The analytic activations of the device's shard: the recipe on the rank's heads and widths (tp), at its
    S / cp tokens (cp)."""
    from .activations import sequence_parallel, tp_activations

    seq = -(-length // ctx.layout.cp)
    act = tp_activations(ctx.text, ctx.view.class_name, tp=ctx.layout.tp, batch=batch, seq=seq, **shape)
    if ctx.layout.sp:
        act = sequence_parallel(act, tp=ctx.layout.tp, tokens=batch * seq, hidden=_hidden(ctx),
                                precision=ctx.precision, layer_norms=_layer_norms(ctx))
    return act


def _hidden(ctx: StepContext) -> int:
    from ..dims import config_int

    return config_int(ctx.text, "hidden_size") or 0


def _layer_norms(ctx: StepContext) -> int:
    """The hidden-size norms of one layer (two in a Llama layer, four in Gemma-2's), from the report."""
    hidden = _hidden(ctx)
    names = [p for p in ctx.report.params if LAYER_PREFIX.match(p.name) and p.role.endswith("norm") and
             tuple(p.shape) == (hidden,) and not p.name.endswith("bias")]
    if not names:
        return 0
    layer = LAYER_PREFIX.match(names[0].name).group(0)
    return sum(1 for p in names if p.name.startswith(layer))


def _check_analytic(ctx: StepContext, what: str) -> str:
    from .activations import local_recipe

    recipe = local_recipe(ctx.text, ctx.view.class_name)
    if recipe is None and not getattr(ctx.view, "can_generate", True):  # an encoder (BERT's kind)
        why = _encoder_refusal(ctx)
        if why:
            raise UnsupportedError(why)
    if recipe is None or ctx.analytic is None or ctx.derived_or_traced:
        raise UnsupportedError("{what} for {cls} needs its activations on each device: the closed form on a rank's "
                               "shard covers the Llama-style family (its recipe keeps heads, widths and tokens "
                               "apart), and a step derived from traces with the layout applied covers FSDP2 and "
                               "tensor parallelism where transformers or Megatron's names give a plan",
                               what=what, cls=ctx.view.class_name)
    if ctx.layout.cp > 1:
        from ..dims import attention_dropout

        if attention_dropout(ctx.text):
            raise UnsupportedError("context parallelism with attention dropout (S² terms) is not modelled")
        if ctx.seq % ctx.layout.cp:
            raise UnsupportedError("context parallelism splits the sequence: cp {cp} does not divide {seq:,}",
                                   cp=ctx.layout.cp, seq=ctx.seq)
    return recipe


def _encoder_refusal(ctx: StepContext) -> str:
    """Why context parallelism over an encoder (a class that does not generate, BERT's kind: no per-rank closed form)
    is not answered, in one line; "" for tensor parallelism, which the derived engine answers, and for pipeline
    parallelism, whose stages are replayed from the derived step (_derived_pipeline_device)."""
    cls = ctx.view.class_name
    if ctx.layout.cp > 1:
        return (f"context parallelism over {cls} is refused: its attention is bidirectional under the batch's "
                "padding mask, and ring attention (torch's context_parallel) takes no mask (its efficient kernel "
                "raises on attn_bias; load balancing needs is_causal), so there is no sharded step to count")
    return ""


def _sharded_activations_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Tensor and context parallel: the device's activations are the recipe's on its own shard."""
    layout = ctx.layout
    recipe = _check_analytic(ctx, "tensor parallelism" if layout.tp > 1 else "context parallelism")
    dev = _states(ctx, placements)
    shape = _local_shape(ctx, placements)
    tied = _tied_bytes(ctx, placements)
    comm = _fsdp_buffers(ctx, placements)
    if layout.cp > 1:
        comm.append(_ring_buffer(ctx, ctx.batch, ctx.seq))

    whole = _whole_embedding_gradient(ctx, placements)
    norms = _sequence_parallel_norm_gradients(ctx)

    def phases_at(batch: int, length: int) -> tuple[PhaseFigure, ...]:
        act = _local_activations(ctx, shape, batch, length)
        figures = moment_phases(act, resident=_resident(dev, ctx.buffer_bytes), gradients=dev.gradients, tied=tied,
                                text=ctx.text, batch=batch, length=-(-length // layout.cp), precision=ctx.precision,
                                step=ctx.step)
        if whole is not None:
            figures = tuple(_with_whole_gradient(p, whole) for p in figures)
        return tuple(_with_buffers(_with_norm_gradients(p, norms), comm) for p in figures)

    act = _local_activations(ctx, shape, ctx.batch, ctx.seq)
    parts = []
    if layout.tp > 1:
        parts.append(f"heads, KV heads and widths / {layout.tp}, the hidden size whole")
    if layout.cp > 1:
        parts.append(f"{ctx.seq // layout.cp:,} of the {ctx.seq:,} tokens (S / {layout.cp})")
    notes: tuple[str, ...] = ()
    if layout.sp:
        size = 2 if ctx.precision == "bf16-pure" else 4
        gathered = ctx.batch * (-(-ctx.seq // layout.cp)) * _hidden(ctx) * size
        notes = (f"sequence parallel: each attention and MLP block all-gathers the whole sequence of the norm's "
                 f"output it reads, B·S·h × {size} B = {gathered:,} B a block while it runs, and torch keeps what "
                 "the column-parallel matmuls read of it (autocast's 16-bit casts under mixed precision) for their "
                 "weights' gradients: counted with the saved activations (Megatron gathers it again in backward "
                 "instead)",)
    device = DeviceMemory(layout, dev.weights, dev.gradients, dev.optimizer, dev.master_weights, ctx.buffer_bytes,
                          act.saved, f"analytic: {recipe} on the rank's shard ({'; '.join(parts)})",
                          dev.arithmetic, tuple(comm), phases_at(ctx.batch, ctx.seq), rules, notes=notes)

    def at(figures: tuple[PhaseFigure, ...], batch: int, length: int) -> PhaseFigure:
        return max(phases_at(batch, length), key=lambda p: p.bytes)
    return device, at


def _whole_embedding_gradient(ctx: StepContext, placements: tuple[Placement, ...]) -> tuple[int, int] | None:
    """(the whole embedding gradient's bytes, the rank's shard's) where torch gives a vocabulary-parallel embedding
    its gradient whole: DTensor's embedding backward returns it Replicate, so each tensor-parallel rank holds all of
    it from the end of backward, and the fused optimizer step reads a shard of it made afresh. None where the
    embedding is not cut or does not train, or FSDP2 reduces it to a shard, or it is tied to the head: there the
    head's Shard(0) gradient and the embedding's Replicate one add up on the one parameter as Shard(0), so no rank
    holds it whole (traced: GPT-2's wte and Gemma-2's embed_tokens, tp 2)."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    if ctx.layout.tp == 1 or ctx.layout.shard in ("fsdp", "hsdp") and ctx.layout.shard_degree > 1:
        return None
    tied = {name for group in ctx.report.tied for name in (group.canonical, *group.aliases)}
    for p in placements:
        if p.role == "embeddings.word" and p.tp == "vocabulary" and p.name in ctx.trainable and p.name not in tied:
            size = itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]
            full = 1
            for n in p.shape:
                full *= n
            return full * size, p.local_numel * size
    return None


def _sequence_parallel_norm_gradients(ctx: StepContext, params: Any = None) -> int:
    """Bytes the optimizer step makes of the sequence-parallel norms' gradients: torch's SequenceParallel leaves each
    residual-stream norm's weight gradient Partial over the tp ranks (each rank's from its own tokens), and the
    step's all-reduce to the Replicate weight makes a new tensor of each (the layers' norms and the final norm, their
    weights and any biases; read off traces of one rank: 13 norms × h × 4 B on a 6-layer Llama or Mixtral). 0 without sequence parallel or
    under FSDP2, which reduces the gradients itself. `params`: a pipeline stage's (default: the model's)."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    layout = ctx.layout
    if not layout.sp or layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1:
        return 0
    hidden = _hidden(ctx)
    return sum(p.numel * itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]
               for p in (ctx.report.params if params is None else params)
               if (p.role == "norm.final" or p.role.endswith("norm") and LAYER_PREFIX.match(p.name))
               and tuple(p.shape) == (hidden,) and p.name in ctx.trainable)


def _with_norm_gradients(phase: PhaseFigure, extra: int) -> PhaseFigure:
    if phase.where != "optimizer step" or not extra:
        return phase
    return dataclasses.replace(phase, bytes=phase.bytes + extra, arithmetic=(
        f"{phase.arithmetic}; the sequence-parallel norms' gradients all-reduced for the step (torch's "
        f"SequenceParallel leaves them Partial), + {extra:,}"))


def _with_whole_gradient(phase: PhaseFigure, whole: tuple[int, int]) -> PhaseFigure:
    full, local = whole
    if phase.where in ("end of backward", "later backward"):  # a pipeline's later backward: every gradient held
        extra, words = full - local, f"the embedding's gradient whole on every rank (torch's DTensor), + {full - local:,}"
    elif phase.where == "optimizer step":
        extra, words = full, (f"the embedding's gradient whole on every rank (torch's DTensor), + {full - local:,}, "
                              f"and the shard the fused step makes of it, + {local:,}")
    else:
        return phase
    return dataclasses.replace(phase, bytes=phase.bytes + extra, gradients=phase.gradients + full - local,
                               arithmetic=f"{phase.arithmetic}; {words}")


def _ring_buffer(ctx: StepContext, batch: int, seq: int) -> Buffer:
    """Ring attention: the key and value chunk arriving from the next rank while the held one is used."""
    from ..dims import config_int

    heads = config_int(ctx.text, "num_attention_heads") or 1
    kv = (config_int(ctx.text, "num_key_value_heads") or heads) // ctx.layout.tp or 1
    hidden = config_int(ctx.text, "hidden_size") or 0
    head_dim = config_int(ctx.text, "head_dim") or hidden // heads
    size = 4 if ctx.precision == "fp32" else 2
    local = seq // ctx.layout.cp
    n = 2 * batch * local * kv * head_dim * size
    return Buffer("context parallel's rotating K and V", n,
                  f"the next rank's K and V chunk received while the held one is used, 2·B·(S / {ctx.layout.cp})·"
                  f"kv_heads·head_dim × {size} B = {n:,} B (the held chunk is counted with the activations)",
                  ("forward", "backward"))


def _pipeline_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Pipeline stages: each device's layers, embeddings or head, and the microbatches it holds at once."""
    layout = ctx.layout
    if _local_recipe_missing(ctx):  # no closed form on a stage's layers: the derived recipe's segments
        return _derived_pipeline_device(ctx, placements, rules)
    recipe = _check_analytic(ctx, "pipeline parallelism")
    names = [p.name for p in ctx.report.params]
    stack, count = layer_stack_of(names)
    plan = stages(layout, count)
    micro = ctx.batch // layout.micro_batches
    shape_all = _local_shape(ctx, placements)
    by_name = {p.name: p for p in placements}
    tied_name = next((g.canonical for g in ctx.report.tied), None)
    residual = 2 if ctx.precision == "bf16-pure" else 4
    from ..dims import config_int

    h = config_int(ctx.text, "hidden_size") or 0
    figures_by_stage: list[tuple[Stage, DeviceStates, tuple[PhaseFigure, ...], int]] = []

    params_of: dict[int, list] = {}
    matmuls = _matmul_names(ctx) if ctx.precision.endswith("-mixed") else frozenset()
    casts_of: dict[int, int] = {}

    def stage_params(stage: Stage) -> list:
        if stage.rank in params_of:
            return params_of[stage.rank]
        out = params_of[stage.rank] = params_held(ctx.report.params, stack, stage)
        casts_of[stage.rank] = 2 * sum(by_name[p.name].local_numel for p in out if p.name in matmuls)
        return out

    def stage_figures(stage: Stage, dev: DeviceStates, batch: int, length: int) -> tuple[tuple[PhaseFigure, ...], int]:
        act = _local_activations(ctx, shape_all, batch, length)
        local_len = -(-length // layout.cp)
        chunk = max(stage.chunk_layers)
        kept = stage.in_flight * chunk * act.per_layer if layout.virtual_stages > 1 else \
            stage.in_flight * len(stage.layers) * act.per_layer
        stage_params(stage)
        own_casts = casts_of[stage.rank]
        all_casts = 2 * shape_all["cast_weights"] if ctx.precision.endswith("-mixed") else 0
        resident = _resident(dev, ctx.buffer_bytes)
        if stage.last:
            tied_copy = _tied_bytes(ctx, placements) if tied_name and layout.pp > 1 else 0
            others = (act.layers - len(stage.layers)) * act.per_layer
            extra_mb = (stage.in_flight - 1) * len(stage.layers) * act.per_layer
            moments = tuple(dataclasses.replace(
                m, bytes=m.bytes - others - (all_casts - own_casts) + extra_mb,
                arithmetic=(f"{m.arithmetic}; this stage's {len(stage.layers)} layers of {act.layers}"
                            + (f", {stage.in_flight} microbatches in flight" if stage.in_flight > 1 else "")))
                for m in act.moments)
            figures = moment_phases(dataclasses.replace(act, moments=moments), resident=resident,
                                    gradients=dev.gradients, tied=tied_copy, text=ctx.text, batch=batch,
                                    length=local_len, precision=ctx.precision, step=ctx.step)
            # the first moments hold the stage's gradients too once a microbatch has gone back (1F1B's steady
            # state): the largest of the two
            if stage.in_flight > 1 or layout.micro_batches > 1:
                figures = tuple(dataclasses.replace(f, bytes=f.bytes + dev.gradients, gradients=dev.gradients,
                                                    arithmetic=f.arithmetic + f"; gradients {dev.gradients:,} "
                                                    "(accumulated over the microbatches already gone back)")
                                if f.where in ("end of forward", "start of backward") else f for f in figures)
            return tuple(_with_buffers(p, comm_of[stage.rank]) for p in figures), \
                kept + (act.saved - act.layers * act.per_layer - all_casts) + own_casts
        embedding = stage.in_flight * residual * batch * local_len * h if stage.first else 0
        incoming = residual * batch * local_len * h
        held = kept + embedding + own_casts
        words = (f"{stage.in_flight} microbatch{'es' if stage.in_flight > 1 else ''} in flight × "
                 + (f"{chunk} layers a chunk" if layout.virtual_stages > 1 else f"{len(stage.layers)} layers")
                 + f" × {act.per_layer:,} B a layer" + (f" + the embedding output {residual}·b·S·h each, "
                                                         f"{embedding:,}" if embedding else "")
                 + (f" + the stage's 16-bit weight copies {own_casts:,}" if own_casts else "")
                 + f" + the gradient arriving from the next stage {incoming:,} + gradients {dev.gradients:,}")
        steady = PhaseFigure("backward", resident + held + incoming + dev.gradients, "1F1B steady state" if
                             layout.schedule != "gpipe" else "first backward", words, dev.gradients)
        step_bytes, step_text = ctx.step
        step = PhaseFigure("optimizer step", resident + dev.gradients + step_bytes, "optimizer step",
                           f"gradients {dev.gradients:,}; {step_text}", dev.gradients)
        return (_with_buffers(steady, comm_of[stage.rank]), step), held

    comm_of: dict[int, list[Buffer]] = {}
    for stage in plan:
        extra = ()
        if stage.last and layout.pp > 1 and tied_name is not None and tied_name in by_name and \
                by_name[tied_name].role.startswith("embedding"):
            copy = by_name[tied_name]
            extra = (dataclasses.replace(copy, name=copy.name + " (the last stage's copy)"),)
        dev = _states(ctx, placements, stage_params(stage), extra)
        held_names = {q.name for q in stage_params(stage)}
        comm_of[stage.rank] = _fsdp_buffers(ctx, tuple(p for p in placements if p.name in held_names))
        figures, held = stage_figures(stage, dev, micro, ctx.seq)
        figures_by_stage.append((stage, dev, figures, held))
    worst = max(figures_by_stage, key=lambda item: max(p.bytes for p in item[2]))
    stage, dev, figures, held = worst
    comm = comm_of[stage.rank]
    rows = []
    for s, d, f, h_ in figures_by_stage:
        top = max(f, key=lambda p: p.bytes)
        rows.append(StageMemory(s.rank, (s.layers[0], s.layers[-1]) if s.layers else None, _runs(s.layers),
                                len(s.layers),
                                s.in_flight, s.first, s.last, d.weights, d.gradients, d.optimizer, d.master_weights,
                                h_, top.bytes, top.phase))
    tied_words = " and a copy of the tied embedding for the head (Megatron's rule)" if tied_name else ""
    words = (f"{split_words(layout, count)}; the embeddings on stage 0, the final norm and head on stage "
             f"{layout.pp - 1}{tied_words}; microbatches of {micro:,} sequence{'s' if micro > 1 else ''}")
    notes = (f"pipeline: each stage holds its layers' saved activations for every microbatch in flight "
             f"({layout.schedule}); the last stage's figure is the recipe's moments for its layers, whose outside "
             "terms include the embedding output the first stage holds (a bound); a stage's own backward working "
             "memory beyond what its layers saved is not counted, nor the point-to-point send and receive buffers "
             "(b·S·h each)",)
    device = DeviceMemory(layout, dev.weights, dev.gradients, dev.optimizer, dev.master_weights, ctx.buffer_bytes,
                          held, f"analytic: {recipe}, stage {stage.rank}'s layers × microbatches in flight",
                          dev.arithmetic, tuple(comm), figures, rules, tuple(rows), words, bubble(layout), notes)

    def at(one_device: tuple[PhaseFigure, ...], batch: int, length: int) -> PhaseFigure:
        best = None
        size = max(1, batch // layout.micro_batches)
        for s, d, _, _ in figures_by_stage:
            top = max(stage_figures(s, d, size, length)[0], key=lambda p: p.bytes)
            best = top if best is None or top.bytes > best.bytes else best
        return best
    return device, at



def _derived_pipeline_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Pipeline stages of a class whose step is derived from traces (derived/): each stage's activations and peak
    replayed from the one-device recipe's segments for its layers (stage_recipe.py), with its microbatches in flight,
    its point-to-point buffers and its model states. _NEEDS_BUILD where the recipe is neither cached nor derivable
    without the build."""
    from ..derived.step import DerivedStep
    from ..derived.symbols import NotDerivable
    from ..traced.step import StepSettings
    from .stage_recipe import stage_activations

    layout = ctx.layout
    cls = ctx.view.class_name
    if layout.cp > 1:
        raise UnsupportedError("pipeline parallelism with context parallelism for {cls} is not modelled: its stages "
                               "are replayed from a derived step, and none is derived with the sequence cut over "
                               "ranks (ring attention's chunks); pipeline with data and tensor parallelism is",
                               cls=cls)
    if layout.ep > 1:
        raise UnsupportedError("pipeline parallelism with expert parallelism for {cls} is not modelled: its stages "
                               "are replayed from a derived step, and none is derived with the experts cut over "
                               "ranks beside a pipeline (the dispatch's buffers); pipeline with data and tensor "
                               "parallelism is", cls=cls)
    if getattr(ctx.view.config, "is_encoder_decoder", False):
        raise UnsupportedError("pipeline parallelism over {cls} is refused: an encoder-decoder has two layer stacks "
                               "and the decoder's cross-attention reads the encoder's output on every decoder stage, "
                               "which the one-stack stage rules do not place", cls=cls)
    names = [p.name for p in ctx.report.params]
    stack, count = layer_stack_of(names)
    plan = stages(layout, count)
    micro = ctx.batch // layout.micro_batches
    settings = StepSettings(precision=ctx.precision, optimizer=ctx.optimizer,
                            grad_checkpointing=bool(ctx.shape.get("checkpointing")), attention=ctx.attention,
                            frozen=ctx.frozen, weights_dtype=ctx.weights_dtype, own_dtype=ctx.own,
                            # tensor parallel: the rank's recipe, derived with the layout applied on torch's fake
                            # process group (same segments: prefix, each layer's forward, head, each layer's backward)
                            layout=(1, "none", layout.tp, layout.sp) if layout.tp > 1 else None)
    try:
        step = DerivedStep.first(ctx.view.module, cls, ctx.view.config, settings, batch=micro, seq=ctx.seq,
                                 limit=ctx.limit, live=ctx.live, structure=ctx.structure)
    except NotDerivable as err:
        raise UnsupportedError("pipeline parallelism for {cls} needs its step derived from traces, which declined: "
                               "{why}", cls=cls, why=str(err)) from None
    if step is None:
        return _NEEDS_BUILD
    if len(step.recipe.layer_types) != count:
        raise UnsupportedError("pipeline parallelism for {cls}: the derived step's {derived} layers are not the "
                               "{count} of its stack {stack}", cls=cls, derived=len(step.recipe.layer_types),
                               count=count, stack=stack)
    by_name = {p.name: p for p in placements}
    tied_name = next((g.canonical for g in ctx.report.tied), None)
    residual_size = 2 if ctx.precision == "bf16-pure" else 4
    hidden = _hidden(ctx)
    step_bytes, step_text = ctx.step
    # the hidden state a rank sends and receives: under sequence parallel its sequence shard (torch's
    # SequenceParallel leaves the residual stream Shard(1) between layers), else whole on every tp rank
    shard = layout.tp if layout.sp else 1
    s_words = f"B·(S / {shard})·h" if shard > 1 else "B·S·h"
    whole = _whole_embedding_gradient(ctx, placements)

    def recipe_at(batch: int, length: int) -> Any:
        for recipe in step.recipes:
            if recipe.covers(batch, length):
                return recipe
        step.at(batch, length)  # derives (or reads) that regime's recipe, once
        return next((r for r in step.recipes if r.covers(batch, length)), None)

    def stage_params(stage: Stage) -> list:
        return params_held(ctx.report.params, stack, stage)

    def chunks_of(stage: Stage) -> list[tuple[int, int]]:
        return [(a, b + 1) for a, b in _runs(stage.layers)]

    def stage_figures(stage: Stage, dev: DeviceStates, comm: list[Buffer], batch: int, length: int
                      ) -> tuple[tuple[PhaseFigure, ...], Any, str]:
        recipe = recipe_at(batch, length)
        if recipe is None:
            return (PhaseFigure("backward", 1 << 62, "", ""),), None, ""
        residual = batch * (length // shard) * hidden * residual_size
        # a later backward (more than one microbatch): every gradient already held; as many microbatches in flight
        # as at the first where another forward comes before it (1F1B, interleaved), one fewer where every forward
        # came first (GPipe) or the stage's last microbatches drain
        more = layout.schedule != "gpipe" and layout.micro_batches * layout.virtual_stages > stage.in_flight
        later = 0 if layout.micro_batches * layout.virtual_stages == 1 else stage.in_flight - (0 if more else 1)
        # interleaved: the chunk whose microbatch keeps the most, for every chunk-microbatch in flight (a bound)
        figures = max((stage_activations(recipe, batch, length, a, b, stage.in_flight, residual, later)
                       for a, b in chunks_of(stage)), key=lambda f: (f.per_microbatch, f.peak))
        resident = _resident(dev, ctx.buffer_bytes)
        k = stage.in_flight
        held_words = (f"{k} microbatch{'es' if k > 1 else ''} in flight × {figures.per_microbatch:,} B each"
                      + (f" (the received hidden state B·S·h × {residual_size} B = {figures.received:,} included)"
                         if figures.received else "")
                      + (f", the largest chunk's (a bound over the {len(stage.chunk_layers)} chunks)"
                         if layout.virtual_stages > 1 else ""))
        phases = [
            PhaseFigure("forward", resident + figures.forward_peak, "forwards in flight",
                        f"{k - 1} microbatch{'es' if k != 2 else ''} held × {figures.per_microbatch:,} + the last "
                        f"forward's peak: {figures.forward_peak:,} (derived, the stage's segments)", 0,
                        figures.forward_peak),
            PhaseFigure("backward", resident + figures.backward_peak, "first backward",
                        f"{held_words} = {figures.held:,} + one microbatch's backward through the stage"
                        + (f" from the received output gradient {s_words} × {residual_size} B = "
                           f"{figures.output_gradient:,}" if figures.output_gradient else " from the loss")
                        + f", its gradients made as it goes: {figures.backward_peak:,} (derived)",
                        figures.gradients_at_backward_peak, figures.backward_peak - figures.gradients_at_backward_peak)]
        if later:
            phases.append(PhaseFigure(
                "backward", resident + dev.gradients + figures.later_peak, "later backward",
                f"gradients {dev.gradients:,} held from the microbatches gone back + {later} microbatch"
                f"{'es' if later > 1 else ''} in flight and one's backward, each new gradient added into its .grad "
                f"at once: {figures.later_peak:,} (derived; a head tied to the input embedding adds its gradients "
                "otherwise, within 40 KB on a GPT-2 cut)", dev.gradients, figures.later_peak))
        phases.append(PhaseFigure("optimizer step", resident + dev.gradients + step_bytes, "optimizer step",
                                  f"gradients {dev.gradients:,}; {step_text}", dev.gradients))
        if stage.first and whole is not None:  # the stage holding the vocabulary-parallel embedding
            phases = [_with_whole_gradient(p, whole) for p in phases]
        norms = _sequence_parallel_norm_gradients(ctx, stage_params(stage))
        return tuple(_with_buffers(_with_norm_gradients(p, norms), comm) for p in phases), figures, recipe.regime

    rows_in: list[tuple[Stage, DeviceStates, tuple[PhaseFigure, ...], Any, list[Buffer]]] = []
    regime = ""
    for stage in plan:
        extra = ()
        if stage.last and tied_name is not None and tied_name in by_name and \
                by_name[tied_name].role.startswith("embedding"):
            copy = by_name[tied_name]
            extra = (dataclasses.replace(copy, name=copy.name + " (the last stage's copy)"),)
        params = stage_params(stage)
        dev = _states(ctx, placements, params, extra)
        held_names = {q.name for q in params}
        comm = _fsdp_buffers(ctx, tuple(p for p in placements if p.name in held_names))
        figures, replayed, regime = stage_figures(stage, dev, comm, micro, ctx.seq)
        rows_in.append((stage, dev, figures, replayed, comm))
    stage, dev, figures, replayed, comm = max(rows_in, key=lambda item: max(p.bytes for p in item[2]))
    held = replayed.held if replayed is not None else 0
    residual = micro * (ctx.seq // shard) * hidden * residual_size
    p2p = [Buffer("pipeline's received hidden state", residual if not stage.first else 0,
                  f"{s_words} × {residual_size} B = {residual:,} a microbatch, from the previous stage (counted with "
                  "each microbatch in flight)", ("forward", "backward")),
           Buffer("pipeline's received output gradient", residual if not stage.last else 0,
                  f"{s_words} × {residual_size} B = {residual:,}, from the next stage, held through the microbatch's "
                  "backward (counted in it)", ("backward",)),
           Buffer("pipeline's input gradient to send", residual if not stage.first else 0,
                  f"{s_words} × {residual_size} B = {residual:,}, made by the backward for the previous stage "
                  "(counted in it)", ("backward",))]
    rows = []
    for s, d, f, r, _ in rows_in:
        top = max(f, key=lambda p: p.bytes)
        rows.append(StageMemory(s.rank, (s.layers[0], s.layers[-1]) if s.layers else None, _runs(s.layers),
                                len(s.layers), s.in_flight, s.first, s.last, d.weights, d.gradients, d.optimizer,
                                d.master_weights, r.held if r is not None else 0, top.bytes, top.phase, r))
    tied_words = " and a copy of the tied embedding for the head (Megatron's rule)" if tied_name else ""
    words = (f"{split_words(layout, count)}; the embeddings on stage 0, the final norm and head on stage "
             f"{layout.pp - 1}{tied_words}; microbatches of {micro:,} sequence{'s' if micro > 1 else ''}")
    source = (f"tensor-parallel rank's derived step (tp {layout.tp}{' with sequence parallel' if layout.sp else ''}"
              f", traced on torch's fake process group; {regime})" if layout.tp > 1 else
              f"derived one-device step ({regime})")
    check = ("checked against MemTracker on the real class cut to each stage with the tp layout applied on the fake "
             "process group: on a Mixtral cut its forwards and first backward equal to the byte "
             "(tests/test_pipeline_tensor_parallel.py); on a GPT-2 cut (Conv1D, tied head) the first backward traced "
             "up to 262 KB above a stage's 2.6 MB replay (10%), and a later backward up to 459 KB above on both: "
             "DTensor's gradient handling at a stage's edges, not modelled; --trace measures each stage"
             if layout.tp > 1 else
             "equal to MemTracker on the real class cut to each stage: tests/test_pipeline_stages.py")
    notes = (f"pipeline: each stage's activations replayed from {cls}'s {source}, segment "
             "by segment for its layers: the prefix (embeddings, position tables) on the first stage, the final norm, "
             "head and loss on the last, the received hidden state on the others; k microbatches in flight keep k "
             f"times what one forward keeps, and the peak adds one microbatch's backward through the stage ({check})",
             "pipeline convention: each microbatch's forward runs under its own autocast, so its 16-bit weight "
             "copies are held with it (as one device's step); later stages take the position tables with their "
             "input (torchtitan's stages hold them as buffers), not counted there",
             *step.notes()[:1])
    device = DeviceMemory(layout, dev.weights, dev.gradients, dev.optimizer, dev.master_weights, ctx.buffer_bytes,
                          held, f"derived: stage {stage.rank}'s layers from the recipe's segments × microbatches in "
                          "flight", dev.arithmetic, tuple(comm) + tuple(b for b in p2p if b.bytes), figures, rules,
                          tuple(rows), words, bubble(layout), notes)

    def at(one_device: tuple[PhaseFigure, ...], batch: int, length: int) -> PhaseFigure:
        size = max(1, batch // layout.micro_batches)
        return max((max(stage_figures(s, d, c, size, length)[0], key=lambda p: p.bytes)
                    for s, d, _, _, c in rows_in), key=lambda p: p.bytes)
    return device, at


def _runs(layers: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    runs: list[list[int]] = []
    for index in layers:
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return tuple((a, b) for a, b in runs)


def _matmul_names(ctx: StepContext) -> frozenset[str]:
    names = set()
    for path, sub in ctx.view.root.named_modules():
        if ctx.view.is_matmul(sub) and sub._parameters.get("weight") is not None:
            names.add(f"{path}.weight" if path else "weight")
    return frozenset(names)


def layout_settings(layout: ParallelLayout) -> dict[str, Any]:
    return {"devices": layout.devices, "dp": layout.dp, "shard": layout.shard, "shard_words": shard_words(layout),
            "shard_degree": layout.shard_degree, "tp": layout.tp, "sp": layout.sp, "pp": layout.pp,
            "micro_batches": layout.micro_batches, "schedule": layout.schedule,
            "virtual_stages": layout.virtual_stages, "ep": layout.ep, "cp": layout.cp, "words": layout.words()}
