"""A training step's devices under a pipeline, for any class without the Llama family's closed form: each stage
replayed from the derived step's segments (stage_recipe.py) of the one-device, tensor-, expert- or context-parallel
rank, walking the schedule's microbatches (interleaved chunks in torch's order); the stage with the largest peak is the
device's answer. The Llama family's closed form is pipeline_device.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import UnsupportedError
from ..memory.phases import PhaseFigure
from .device import Buffer, StageMemory, DeviceMemory, StepContext, NEEDS_BUILD
from .estimate_closed_form import token_ids_held
from .device_parts import (
    device_states_of, fsdp_buffers, hidden_size, layer_runs, resident_bytes, sequence_parallel_norm_gradients,
    whole_embedding_gradient, with_buffers, with_norm_gradients, with_whole_gradient
)
from .pipeline import Stage, after_layers, bubble, layer_stack_of, params_held, split_words, stages
from .rules import Placement, cuts_routed_experts
from .states import DeviceStates, stage_step
from .unsynced_backward import (
    backward_gathers_apart, end_of_first_backward, first_backward_unsharded, whole_embedding_extra
)


# a bound where the replay is above the stage's trace (tests/test_pipeline_encoder_stages.py)
LEAF_CASTS = ("pipeline: a later stage's received hidden state is a leaf (PipelineStage's receive buffer, requiring "
              "grad), and autocast casts a leaf to 16 bits once for all the matmuls that read it (its cache keeps "
              "leaves' casts); the replay, from one device's layers, whose input is the layer below's output, counts a "
              "cast for each: where a layer's matmuls read its input directly (a post-norm encoder's q, k and v: "
              "BERT) a later stage's replay is above its trace by 2·B·S·h × 2 B a microbatch in flight (a bound); a "
              "pre-norm layer reads its input through its norm, and is equal")

# FSDP2's MixedPrecisionPolicy under a pipeline (--fsdp-mixed-precision policy beside --pp): the convention and what
# the replay is held to (tests/test_policy_pipeline_search.py)
POLICY_CONVENTION = (
    "pipeline convention under FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), no autocast "
    "(torchtitan's): each stage replays the FSDP2 rank's own traced step for its layers (16-bit parameters, 16-bit "
    "gradients made as each layer's backward runs), the rank's root unit apart (torchtitan's fully_shard on each "
    "stage's model part), with every unit of the stage gathered and its gradients unsharded as the pipeline's FSDP2 "
    "holds them (below); the hidden state between stages 16-bit")
POLICY_CHECK = (
    "the replay's mechanics held to the rank traced under the policy: the whole cut replayed as one stage equals the "
    "derived rank, which equals --trace (a 4-layer Llama cut, dp 2, bf16-mixed: tests/test_policy_pipeline_search.py);"
    " no stage is traced under FSDP2 (traced/pipeline_stage.py runs no fully_shard), so --trace is refused here")


def policy_rank_layout(ctx: StepContext, experts: bool) -> tuple | None:
    """The traced layout whose derived step a pipeline's stages replay under FSDP2's MixedPrecisionPolicy: the FSDP2
    rank's as estimate_derived.derived_device keys it without a pipeline ((shard degree, "fsdp", tp, sp) with the policy,
    traced/parallel.py with_mixed_precision); None without the policy. One line where the policy beside a pipeline is
    not answered: beside context parallel or routed experts cut over ep (their ranks' FSDP2 keys are not replayed)."""
    from ..traced.parallel import with_mixed_precision
    from .device_parts import fsdp_sharded

    layout = ctx.layout
    if layout.fsdp_mixed_precision != "policy" or not fsdp_sharded(layout):
        return None
    if layout.cp > 1 or experts:
        raise UnsupportedError("{0} policy beside pipeline stages is answered with FSDP2 and tensor parallel (the "
                               "policy's FSDP2 rank replayed per stage), not beside {what}", "fsdp_mixed_precision",
                               what="context parallel" if layout.cp > 1 else "routed experts cut over ep")
    return with_mixed_precision((layout.shard_degree, "fsdp", layout.tp, layout.sp), "policy")


def root_apart(recipe: Any, reduced: tuple[tuple[int, int], tuple[int, int]] | None = None) -> Any:
    """The FSDP2 rank's recipe without its root unit's gather: the prefix's allocations that depend on neither B nor
    S (the root's all-gather input and output and its unsharded 16-bit parameters, made before the embeddings run;
    held until the end of the backward, and counted once a microbatch by the replay), sized 0, so that each stage
    holds its own root unit instead (policy_root). `reduced` (a first stage without the head): ((the whole root's
    fp32 reduce-scatter input, its fp32 gradient shards), the same of the stage's own root), in bytes: the root's
    post-backward at the end of the first layer's backward segment reduces the stage's root, not the model's."""
    sizes = list(recipe.sizes)
    for sign, index, _ in recipe.prefix:
        if sign > 0 and _constant(sizes[index]):
            sizes[index] = ()
    if reduced is not None:
        (whole_input, whole_shards), (own_input, own_shards) = reduced
        for sign, index, _ in recipe.first_backward:
            if sign < 0 or not _constant(sizes[index]):
                continue
            value = sizes[index][0][2] if sizes[index] else 0
            if value == whole_input and not recipe.gradient[index]:
                sizes[index] = ((0, 0, own_input),) if own_input else ()
            elif value == whole_shards and recipe.gradient[index]:
                sizes[index] = ((0, 0, own_shards),) if own_shards else ()
    return dataclasses.replace(recipe, sizes=tuple(sizes))


def _constant(poly: Any) -> bool:
    return all(i == 0 and j == 0 for i, j, _ in poly)


def root_reduced(ctx: StepContext, placements: tuple[Placement, ...], held: set[str]) -> tuple[tuple[int, int], ...]:
    """((the whole root's reduce-scatter input, its gradient shards), the same of the stage's own root), fp32 bytes:
    the parameters outside the layers, each padded as fully_shard pads it (⌈dim0 / d⌉·d rows; its shard ⌈dim0 / d⌉),
    and of those the stage holds (`held`)."""
    import math

    from .pipeline import LAYER_PREFIX

    d = ctx.layout.shard_degree

    def sizes(group: list[Placement]) -> tuple[int, int]:
        rows = [(-(-(p.local_shape or (1,))[0] // d), math.prod((p.local_shape or (1,))[1:])) for p in group]
        return 4 * sum(r * d * rest for r, rest in rows), 4 * sum(r * rest for r, rest in rows)

    root = [p for p in placements if not LAYER_PREFIX.match(p.name) and p.name in ctx.trainable]
    return sizes(root), sizes([p for p in root if p.name in held])


# FSDP2 beside a pipeline, as torch's PipelineStage and torchtitan run it (both engines, both conventions)
UNSYNCED = (
    "FSDP2 beside a pipeline, as torchtitan and torch's PipelineStage run it: torchtitan keeps each unit gathered "
    "after its forward under a pipeline (apply_fsdp's reshard_after_forward = not pp_enabled), and PipelineStage runs every "
    "microbatch's backward with set_requires_gradient_sync(False) and set_reshard_after_backward(False) "
    "(backward_maybe_with_nosync), reducing once after the last backward (perform_reduce_grad: each unit resharded, "
    "then its gradients reduce-scattered): so from its first forward to the step's reduce a stage holds every unit "
    "gathered (16 bits under the MixedPrecisionPolicy's param_dtype, the trained dtype under autocast), and from each "
    "layer's first backward its gradients unsharded (fp32: the policy accumulates them in its reduce_dtype, "
    "unsharded_accumulated_grad; autocast's .grad) in place of the fp32 shards, which exist only from the reduce to "
    "the optimizer step. Counted at every forward and backward moment: the stage's units gathered in place of the one "
    "layer and root unit FSDP2's default step holds, and the gradients a moment holds unsharded (at the first "
    "backward's largest moment those of the layer units gone back, unit by unit; its end, every one, its own moment: "
    "parallel/unsynced_backward.py); under the policy, where the "
    "stage gathers nothing (a backward, a forward after its first microbatch's), less the running layer's 16-bit "
    "gather the replayed rank makes. Held to FSDP2's rank traced as one stage runs it (two microbatches without "
    "gradient sync, then the reduce; a 4-layer Llama cut, dp 2, 2 × 64: tests/test_fsdp_pipeline_stage.py): under "
    "the policy every forward and backward equal; under autocast too, but the first microbatch's forward, where "
    "each unit is first gathered, one layer's fp32 parameters over what is counted (4·N of a layer; a stage's peak "
    "is a later moment). With three microbatches in flight (three forwards, then three backwards; the cut, 2 × 40, "
    "replayed as one stage under the policy) each microbatch holds its activations alone, no gather, in the trace as "
    "in the replay: the forwards and the later backward equal (the replay keeps the first microbatch's loss, 4 B), "
    "and the first backward's end, the phase's peak there, equal (with 2 in flight too): every gradient unsharded "
    "in fp32 beside the root's last 16-bit gradient, cast as the root's post-backward runs. Beside tp 2 with "
    "sequence parallel the vocabulary-parallel embedding's gradient is whole from the first backward's end to the "
    "reduce (DTensor's embedding backward makes it Replicate, and FSDP2 casts and adds it so; 4·(V − V/tp)·h over "
    "the rank's own, counted: unsynced_backward.whole_embedding_extra): on that cut (vocabulary 4,008, one KV head), "
    "3 and 2 in flight, the forwards, the first backward's end and the later backward equal (the kept loss, 4 B), "
    "where without it the first backward was 351,328 B under (the replay's largest moment above the end short of "
    "it) and the later 1,026,044; on test_policy_pipeline_tp_search's cut (vocabulary 512, two KV heads), 3 and 2 "
    "in flight, the forwards, the first backward's end and the later backward equal (the kept loss, 4 B; the first "
    "backward's end was 81,856 B under): there the trace's later peak holds the running microbatch's activations "
    "and 327,680 B of temporaries above every fp32 gradient, 4 × the fp32 logits' shard B·S·V/tp, the loss's moment, "
    "while the replay's largest later moment was inside a middle layer's backward, 49,828 B above it, where the "
    "replayed FSDP2 rank holds the layer's 16-bit parameters copied out of its all-gather, the next layer's "
    "prefetched all-gather and the layer above's fp32 reduce-scatter input, none of which the stage makes (every "
    "unit gathered, no reduce without the sync): a later backward is replayed without them "
    "(unsynced_backward.backward_gathers_apart), and the forward before it, where counted, less the running "
    "layer's gather. The optimizer step beside tp holds the first stage's token ids (8·B·S, a microbatch's: the tp "
    "plan's DTensor input aliases them, as without a pipeline), equal on both cuts but for the kept loss (4 B; it "
    "was 636 B under). An "
    "estimate still, no pipeline stage traced under FSDP2: the reduce after the last backward "
    "(no activations left; each unit's fp32 reduce-scatter input beside its gradients as its gathered parameters are "
    "freed) is no moment of its own (below the last backward on the traced cut)")


UNITS = "FSDP2's units of the stage, all gathered"


def fsdp_beside(ctx: StepContext) -> bool:
    """Whether FSDP2 shards the stage's parameters over more than one rank beside a pipeline (UNSYNCED)."""
    from .device_parts import fsdp_sharded

    return fsdp_sharded(ctx.layout) and ctx.layout.pp > 1


def unsynced_buffer(ctx: StepContext, held: tuple[Placement, ...]) -> list[Buffer]:
    """FSDP2 beside a pipeline (UNSYNCED): every unit the stage holds gathered, in the dtype fully_shard gathers it
    (fsdp_buffers' own: 16-bit under the policy), from the first forward to the reduce after the last backward;
    none without FSDP2 sharding or a pipeline."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype
    from .device_parts import policy_context

    if not fsdp_beside(ctx):
        return []
    precision = policy_context(ctx).precision
    gathered = sum(p.local_numel * itemsize(trained_dtype(p, precision, ctx.own))  # type: ignore[arg-type]
                   for p in held)
    size = "16 bits (the MixedPrecisionPolicy's param_dtype)" if ctx.layout.fsdp_mixed_precision == "policy" \
        else f"the dtype they train in ({precision})"
    return [Buffer(UNITS, gathered,
                   f"every parameter the stage holds unsharded in {size}, {gathered:,} B: gathered at the first "
                   "forward and kept to the reduce after the last backward (torchtitan's reshard_after_forward False "
                   "under a pipeline, PipelineStage's set_reshard_after_backward(False))", ("forward", "backward"))]


def unsynced_gradients(ctx: StepContext, held: tuple[Placement, ...], shards: int) -> int:
    """The bytes of the stage's gradients unsharded (UNSYNCED): fp32 under the policy (its reduce_dtype accumulates
    them), else the dtype they train in; 0 without FSDP2 sharding beside a pipeline or where no shard is counted."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype
    from .device_parts import fsdp_policy

    if not fsdp_beside(ctx) or not shards:
        return 0
    policy = fsdp_policy(ctx.layout)
    return sum(p.local_numel * (4 if policy else itemsize(trained_dtype(p, ctx.precision, ctx.own)))  # type: ignore
               for p in held if p.name.split(" (")[0] in ctx.trainable)


def _without_running_gather(phase: PhaseFigure, layer: int, in_flight: int, bare: bool = False) -> PhaseFigure:
    """Under the policy beside a pipeline (UNSYNCED): the replayed FSDP2 rank gathers each layer as it runs (and
    frees it after), which the stage, holding every unit gathered, does not: a moment with no gather of its own (a
    backward, a forward after the stage's first microbatch's) is one layer's 16-bit parameters below the replay,
    `layer` (the largest layer unit). Held to the trace (trace_unsynced_fsdp on a 4-layer Llama cut: the first
    forward equal without it, the backwards and the later forward equal with it). `bare`: the later backward is
    counted without the rank's gathers already (unsynced_backward.backward_gathers_apart), left as it is."""
    if bare and phase.where == "later backward" or phase.where not in ("first backward", "later backward") and not (
            phase.where == "forwards in flight" and in_flight > 1):
        return phase
    return dataclasses.replace(phase, bytes=phase.bytes - layer, arithmetic=phase.arithmetic + (
        f"; − the running layer's 16-bit gather the replayed rank makes, held here among the stage's units, {layer:,}"))


def with_unsynced_gradients(phase: PhaseFigure, whole: int, shards: int, comm: list[Buffer] = (),
                            partial: tuple[int, str] | None = None, whole_words: str = "") -> PhaseFigure:
    """A forward or backward moment of a stage under FSDP2 beside a pipeline (UNSYNCED): the gradient shards it
    counts held unsharded instead, `whole` where it counts every shard (`shards`); where it counts some (the first
    backward's largest moment) `partial`, (bytes, words) counted unit by unit (unsynced_backward
    .first_backward_unsharded), else in proportion, named an estimate; at the end of a backward (which with_buffers
    leaves without FSDP2's gathered units) the stage's units, still gathered. `whole_words`: what `whole` holds
    over the rank's own gradients, in words."""
    from .unsynced_backward import IN_PROPORTION

    if phase.phase == "optimizer step" or not whole:
        return phase
    if phase.where == "end of backward":
        gathered = [b for b in comm if b.name == UNITS]
        phase = with_buffers(dataclasses.replace(phase, where="end of a backward"), gathered)
        phase = dataclasses.replace(phase, where="end of backward")
    if not phase.gradients:
        return phase
    if partial is not None and phase.where == "first backward":
        extra, words = partial
    elif phase.gradients >= shards:
        extra, words = whole - shards, f"{whole:,}{whole_words} − the shards {shards:,}"
    else:
        extra = phase.gradients * (whole - shards) // shards
        words = (f"{phase.gradients:,} of the shards made × ({whole:,} − {shards:,}) / {shards:,}, "
                 f"{IN_PROPORTION}")
    return dataclasses.replace(phase, bytes=phase.bytes + extra, gradients=phase.gradients + extra,
                               arithmetic=phase.arithmetic + f"; + the gradients unsharded until the step's reduce "
                               f"(PipelineStage's unsynced backward), {words} = {extra:,}")


def policy_root(ctx: StepContext, placements: tuple[Placement, ...]) -> list[Buffer]:
    """The stage's own root unit under the policy, gathered in 16 bits (param_dtype) through the step: its
    parameters outside the layers (the first stage's embeddings, the last stage's final norm and head, a tied head's
    copy), unsharded; none on a stage holding layers alone."""
    from .device_parts import fsdp_units

    root, _ = fsdp_units(placements, lambda p: 2 * p.local_numel)
    if not root:
        return []
    return [Buffer("FSDP2's root unit, all-gathered in 16 bits", root,
                   f"the stage's parameters outside its layers unsharded in 16 bits (the MixedPrecisionPolicy's "
                   f"param_dtype), {root:,} B: the stage's root unit, not resharded after the forward",
                   ("forward", "backward"))]


def derived_pipeline_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Pipeline stages of a class whose step is derived from traces (derived/): each stage's activations and peak
    replayed from the one-device recipe's segments for its layers (stage_recipe.py), with its microbatches in flight,
    its point-to-point buffers and its model states. NEEDS_BUILD where the recipe is neither cached nor derivable
    without the build."""
    from ..derived.step import DerivedStep
    from ..derived.symbols import NotDerivable
    from ..traced.step import StepSettings
    from ..dims import dim
    from .experts import load_words
    from .pipeline import interleaved_order
    from .policy_degrees import sibling_step
    from .stage_recipe import interleaved_activations, stage_activations

    layout = ctx.layout
    cls = ctx.view.class_name
    # expert parallel: the stages replayed from the expert-parallel rank's derived step (a class without routed
    # experts has nothing to cut: its step is one device's, as without a pipeline)
    experts = cuts_routed_experts(placements)
    # FSDP2's MixedPrecisionPolicy: the stages replay the policy's FSDP2 rank (policy_rank_layout)
    policy = policy_rank_layout(ctx, experts)
    # context parallel beside it: the stages replay the ring's rank with its experts cut, rank 0 of torchtitan's
    # (dp_shard_in_ep, cp, tp) mesh inside each stage (pp outermost), the ep ranks dp_shard_in_ep × cp (ETP = tp)
    ring_experts = layout.cp > 1 and experts
    if ring_experts and layout.ep % layout.cp:
        raise UnsupportedError("pipeline parallelism with context parallel {cp} beside ep {ep}: the ep ranks take "
                               "every cp rank and some dp ones (torchtitan's ep = dp_shard_in_ep × cp), so cp must "
                               "divide ep", cp=layout.cp, ep=layout.ep)
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
                            # context parallel: the cp rank's recipe (rank 0 of torchtitan's (dp, cp, tp) mesh),
                            # derived with torch's ring attention over the cp ranks and the tp layout beside, at its
                            # S / cp tokens, without FSDP2 (the key the cp rank at dp 1 has: the same recipe)
                            # (beside routed experts: the ring's rank with them cut over ep = dp_shard_in_ep × cp,
                            # dp = ep / cp in the trace, the busiest's under a load)
                            layout=policy if policy is not None else
                            (layout.ep // layout.cp if ring_experts else 1, "none", layout.tp, layout.sp, 0,
                                    layout.ep if ring_experts else 1, layout.cp)
                            + ((layout.expert_load,) if ring_experts and layout.expert_load != 1 else ())
                            if layout.cp > 1 else
                            (1, "none", layout.tp, layout.sp) if layout.tp > 1 and not experts else
                            # expert parallel: the rank's recipe, derived with the experts cut over ep ranks as
                            # torchtitan's ExpertParallel cuts them (traced/expert_parallel.py), dp == ep there: the
                            # data-parallel ranks beyond ep run the same step
                            # (an uneven load keys it by the load: the busiest rank's, rank 0's; balanced as before);
                            # with tp beside: the tp layout applied too, each rank's E/ep experts also cut over tp on
                            # the (ep, tp) mesh (torchtitan's ExpertTensorParallel)
                            (layout.ep, "none", layout.tp, layout.sp, 0, layout.ep)
                            + ((1, layout.expert_load) if layout.expert_load != 1 else ()) if experts else None)
    try:
        # under the policy beside tp, its FSDP2 rank at another shard degree cached: that recipe, its shards resized
        # to this degree (policy_degrees.py: the layout search derives one a tp degree, not one a layout)
        step = sibling_step(DerivedStep(ctx.view.module, cls, ctx.view.config, settings, ctx.limit, ctx.live,
                                        ctx.structure), placements, micro, ctx.seq) \
            if policy is not None and layout.tp > 1 else None
        step = step or DerivedStep.first(ctx.view.module, cls, ctx.view.config, settings, batch=micro, seq=ctx.seq,
                                         limit=ctx.limit, live=ctx.live, structure=ctx.structure)
    except NotDerivable as err:
        raise UnsupportedError("pipeline parallelism for {cls} needs its step derived from traces, which declined: "
                               "{why}", cls=cls, why=str(err)) from None
    if step is None:
        return NEEDS_BUILD
    if len(step.recipe.layer_types) != count:
        raise UnsupportedError("pipeline parallelism for {cls}: the derived step's {derived} layers are not the "
                               "{count} of its stack {stack}", cls=cls, derived=len(step.recipe.layer_types),
                               count=count, stack=stack)
    # under the policy the root unit is the stage's own (root_apart: taken out of the recipe, held per stage)
    root_apart_of = root_apart if policy is not None else (lambda recipe: recipe)
    by_name = {p.name: p for p in placements}
    tied_name = next((g.canonical for g in ctx.report.tied), None)
    # the hidden state between stages: 16-bit under bf16-pure and under the policy (its layers run on 16-bit
    # parameters, no autocast), else fp32
    residual_size = 2 if ctx.precision == "bf16-pure" or policy is not None else 4
    hidden = hidden_size(ctx)
    # the hidden state a rank sends and receives: under sequence parallel its sequence shard (torch's
    # SequenceParallel leaves the residual stream Shard(1) between layers), else whole on every tp rank; under
    # context parallel the rank's S / cp tokens (its two chunks), split again over tp under sp
    shard = (layout.tp if layout.sp else 1) * layout.cp
    s_words = f"B·(S / {shard})·h" if shard > 1 else "B·S·h"
    whole = whole_embedding_gradient(ctx, placements)
    waiting = _waiting_gradients(ctx, placements)
    # a head tied to the embedding, on the last stage: the first stage's embedding makes the weight's gradient alone,
    # and keeps it as the .grad (whole under a vocabulary-parallel cut, as DTensor's embedding backward returns it)
    tied = _tied_apart(ctx, placements, tied_name)
    tied_whole = whole_embedding_gradient(ctx, placements, tied_apart=True) if tied else None

    def recipe_at(batch: int, length: int) -> Any:
        for recipe in step.recipes:
            if recipe.covers(batch, length):
                return root_apart_of(recipe)
        step.at(batch, length)  # derives (or reads) that regime's recipe, once
        return next((root_apart_of(r) for r in step.recipes if r.covers(batch, length)), None)

    def stage_params(stage: Stage) -> list:
        return params_held(ctx.report.params, stack, stage)

    def chunks_of(stage: Stage) -> list[tuple[int, int]]:
        return [(a, b + 1) for a, b in layer_runs(stage.layers)]

    def stage_figures(stage: Stage, dev: DeviceStates, comm: list[Buffer], batch: int, length: int
                      ) -> tuple[tuple[PhaseFigure, ...], Any, str]:
        recipe = recipe_at(batch, length)
        if recipe is None:
            return (PhaseFigure("backward", 1 << 62, "", ""),), None, ""
        if policy is not None and stage.first:
            # the rank's root post-backward at the end of the first layer's backward: beside a pipeline no unit
            # reduces in a microbatch's backward (UNSYNCED), so the whole root's reduce-scatter input and gradient
            # shards are taken out (root_reduced's stage's own, sized 0); a stage holding the whole model too (the
            # single stage tests/test_fsdp_pipeline_stage.py replays against the trace: no pp ≥ 2 stage is both)
            whole_root, _ = root_reduced(ctx, placements, {p.name for p in stage_params(stage)})
            recipe = root_apart(recipe, (whole_root, (0, 0)))
        residual = batch * (length // shard) * hidden * residual_size
        # a later backward (more than one microbatch): every gradient already held; as many microbatches in flight
        # as at the first where another forward comes before it (1F1B, interleaved), one fewer where every forward
        # came first (GPipe) or the stage's last microbatches drain
        more = layout.schedule != "gpipe" and layout.micro_batches * layout.virtual_stages > stage.in_flight
        later = 0 if layout.micro_batches * layout.virtual_stages == 1 else stage.in_flight - (0 if more else 1)
        interleaved = layout.virtual_stages > 1
        if interleaved:  # the rank's chunks walked along torch's ScheduleInterleaved1F1B order, each its own bytes
            figures = interleaved_activations(recipe, batch, length, tuple(chunks_of(stage)),
                                              interleaved_order(layout, stage.rank), residual, waiting, tied)
            later = figures.later_in_flight
        else:
            figures = stage_activations(recipe, batch, length, stage.layers[0], stage.layers[-1] + 1,
                                        stage.in_flight, residual, later, waiting, tied)
        resident = resident_bytes(dev, ctx.buffer_bytes)
        k = stage.in_flight
        # what the step never frees (an object the model keeps and replaces at its next call) is held once a
        # stage, not once a microbatch: its own term, so that k × each + once is the figure
        once = figures.kept_once if not interleaved else 0
        each = figures.per_microbatch - once
        once_words = f" + {once:,} B held once a stage (what the step never frees, not made again)" if once else ""
        held_words = (f"{k} microbatch{'es' if k > 1 else ''} in flight × {each:,} B each"
                      + (f" (the received hidden state B·S·h × {residual_size} B = {figures.received:,} included)"
                         if figures.received else "") + once_words) if not interleaved else \
            (f"the chunk-microbatches in flight at the rank's first backward along torch's interleaved order, each "
             f"its chunk's bytes (of its {len(stage.chunk_layers)} chunks, the largest's {figures.per_microbatch:,}"
             + (f", a received hidden state B·S·h × {residual_size} B = {residual:,} included" if figures.received
                else "") + ")")
        phases = [
            # each figure's words open on its value and name its parts in parentheses: the line sums to the figure
            PhaseFigure("forward", resident + figures.forward_peak, "forwards in flight",
                        f"the forwards {figures.forward_peak:,} ({k - 1} microbatch{'es' if k != 2 else ''} held × "
                        f"{each:,}" + (once_words if k > 1 else "")
                        + " and the last forward's peak; derived, the stage's segments)"
                        if not interleaved else
                        f"the forwards {figures.forward_peak:,} (the largest forward before the rank's first "
                        "backward along torch's interleaved order, with the chunk-microbatches then in flight; "
                        "derived, each chunk's segments)", 0, figures.forward_peak),
            PhaseFigure("backward", resident + figures.backward_peak, "first backward",
                        f"the first backward {figures.backward_peak:,} ({held_words} = {figures.held:,}, and one "
                        "microbatch's backward through the stage"
                        + (f" from the received output gradient {s_words} × {residual_size} B = "
                           f"{figures.output_gradient:,}" if figures.output_gradient else " from the loss")
                        + ", its gradients made as it goes; derived)",
                        figures.gradients_at_backward_peak, figures.backward_peak - figures.gradients_at_backward_peak)]
        # under the policy beside the pipeline: a later backward without the replayed rank's own gathers and
        # reduce-scatters, which the stage makes none of (unsynced_backward.backward_gathers_apart)
        bare = bare_later(stage, recipe, batch, length, residual, later, tied) \
            if policy is not None and later and not interleaved and fsdp_beside(ctx) else None
        if bare is not None:
            gather = running_gather(stage)
            value = max(bare[0], figures.later_forward - gather)
            phases.append(PhaseFigure(
                "backward", resident + dev.gradients + value, "later backward",
                f"gradients {dev.gradients:,} (held from the microbatches gone back) + a later backward {value:,} "
                f"({later} microbatch{'es' if later > 1 else ''} in flight and one's backward, each new gradient "
                "added into its .grad at once, the replayed rank's backward without its FSDP2 gathers and "
                f"reduce-scatters ({bare[1]} allocations: each layer unit's 16-bit parameters copied out of its "
                "all-gather, the next unit's prefetched all-gather, the unit above's fp32 reduce-scatter input), "
                "which the stage makes none of, every unit gathered and no reduce without the sync"
                + (f"; or the forward before it with one fewer held, less the running layer's 16-bit gather the "
                   f"replayed rank makes ({figures.later_forward:,} − {gather:,}), where larger"
                   if figures.later_forward else "") + "; derived)", dev.gradients, value))
        elif later:
            phases.append(PhaseFigure(
                "backward", resident + dev.gradients + figures.later_peak, "later backward",
                f"gradients {dev.gradients:,} (held from the microbatches gone back) + a later backward "
                f"{figures.later_peak:,} ({later} microbatch{'es' if later > 1 else ''} in flight and one's "
                "backward, each new gradient added into its .grad at once"
                + (", or the forward before it with one fewer held, where larger" if later == k else "")
                + "; derived)" if not interleaved else
                f"gradients {dev.gradients:,} + the largest moment after the rank's first backward along torch's "
                f"interleaved order, less every gradient the rank holds by the step's end, {figures.later_peak:,} "
                "(each moment the chunk-microbatches then in flight, each chunk's gradients made at its first "
                "backward and added into their .grad at once after; derived)", dev.gradients, figures.later_peak))
        losses, losses_text = kept_losses(figures, layout.micro_batches)
        step_bytes, step_text = stage_step(ctx, dev)  # bf16-master: the stage's own fp32 gradient copy
        # the first stage's token ids, where a DTensor input aliases them (held to the step's end, as without a
        # pipeline: estimate_closed_form.held_at_step)
        ids, ids_text = token_ids_held(ctx, batch, length) if stage.first else (0, "")
        phases.append(PhaseFigure("optimizer step", resident + dev.gradients + step_bytes + losses + ids,
                                  "optimizer step", f"gradients {dev.gradients:,}; {step_text}{losses_text}"
                                  + (f"; held from the step before: {ids_text}" if ids else ""), dev.gradients))
        if stage.first and whole is not None:  # the stage holding the vocabulary-parallel embedding
            phases = [with_whole_gradient(p, whole) for p in phases]
        elif stage.first and tied_whole is not None:  # and one tied to the head on the last stage
            phases = [with_whole_gradient(p, tied_whole) for p in phases]
        if policy is not None:  # the replayed rank's running layer, gathered again: held among the stage's units
            phases = [_without_running_gather(p, running_gather(stage), k, bare is not None) for p in phases]
        norms = sequence_parallel_norm_gradients(ctx, stage_params(stage))
        # FSDP2 beside the pipeline: the gradients a moment holds are unsharded until the step's reduce (UNSYNCED):
        # at the first backward's largest moment those of the units gone back, and its end, every one (its own
        # moment: unsynced_backward)
        whole_grads = unsynced_gradients(ctx, held_of(stage), dev.gradients)
        partial = None
        whole_words = ""
        if whole_grads:  # a vocabulary-parallel embedding's gradient whole, from its first (unsynced_backward)
            embedding = whole_embedding_extra(ctx, held_of(stage), policy is not None)
            whole_grads += embedding
            whole_words = (f" (the vocabulary-parallel embedding's gradient whole, as DTensor's backward makes it, "
                           f"{embedding:,} over the rank's own)") if embedding else ""
            partial = first_backward_unsharded(ctx, held_of(stage), stack, stage, figures.gradients_at_backward_peak,
                                               policy is not None)
            if not interleaved:
                phases.insert(2, end_of_first_backward(ctx, held_of(stage), stage, figures, resident, dev.gradients,
                                                       policy is not None))
        return tuple(with_unsynced_gradients(with_buffers(with_norm_gradients(p, norms), comm), whole_grads,
                                             dev.gradients, comm, partial, whole_words)
                     for p in phases), figures, recipe.regime

    def bare_later(stage: Stage, recipe: Any, batch: int, length: int, residual: int, later: int,
                   tied: tuple[int, int] | None) -> tuple[int, int] | None:
        """(the stage's later backward replayed without the rank's gathers and reduce-scatters, how many
        allocations were taken out); None where none is recognised."""
        apart, count = backward_gathers_apart(ctx, recipe, held_of(stage))
        if not count:
            return None
        return stage_activations(apart, batch, length, stage.layers[0], stage.layers[-1] + 1, stage.in_flight,
                                 residual, later, waiting, tied).later_backward, count

    def running_gather(stage: Stage) -> int:
        """The largest layer unit of the stage gathered in 16 bits (the policy's param_dtype)."""
        from .device_parts import fsdp_units

        return fsdp_units(held_of(stage), lambda p: 2 * p.local_numel)[1]

    def held_of(stage: Stage) -> tuple[Placement, ...]:
        """The placements the stage holds, with the last stage's copy of a tied embedding."""
        names = {q.name for q in stage_params(stage)}
        return tuple(p for p in placements if p.name in names) + extra_of(stage)

    def extra_of(stage: Stage) -> tuple[Placement, ...]:
        if stage.last and tied_name is not None and tied_name in by_name and \
                by_name[tied_name].role.startswith("embedding"):
            copy = by_name[tied_name]
            return (dataclasses.replace(copy, name=copy.name + " (the last stage's copy)"),)
        return ()

    rows_in: list[tuple[Stage, DeviceStates, tuple[PhaseFigure, ...], Any, list[Buffer]]] = []
    regime = ""
    for stage in plan:
        extra = ()
        if stage.last and tied_name is not None and tied_name in by_name and \
                by_name[tied_name].role.startswith("embedding"):
            copy = by_name[tied_name]
            extra = (dataclasses.replace(copy, name=copy.name + " (the last stage's copy)"),)
        params = stage_params(stage)
        dev = device_states_of(ctx, placements, params, extra)
        held_names = {q.name for q in params}
        # FSDP2 beside the pipeline: every unit of the stage gathered through its microbatches (UNSYNCED), in place
        # of FSDP2's default one layer and root unit (and of the policy's stage root, the recipe's root taken apart)
        comm = unsynced_buffer(ctx, tuple(p for p in placements if p.name in held_names) + extra) or (
            fsdp_buffers(ctx, tuple(p for p in placements if p.name in held_names)) if policy is None else
            policy_root(ctx, tuple(p for p in placements if p.name in held_names) + extra))
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
    if experts:
        p2p.append(_stage_dispatch(ctx, placements, stage_params(stage), stage.in_flight, micro))
    rows = []
    for s, d, f, r, _ in rows_in:
        top = max(f, key=lambda p: p.bytes)
        rows.append(StageMemory(s.rank, (s.layers[0], s.layers[-1]) if s.layers else None, layer_runs(s.layers),
                                len(s.layers), s.in_flight, s.first, s.last, d.weights, d.gradients + d.grad_buffer,
                                d.optimizer,
                                d.master_weights, r.held if r is not None else 0, top.bytes, top.phase, r))
    tied_words = " and a copy of the tied embedding for the head (Megatron's rule)" if tied_name else ""
    words = (f"{split_words(layout, count)}; the embeddings on stage 0, {after_layers(ctx.report.params, stack)} on "
             f"stage {layout.pp - 1}{tied_words}; microbatches of {micro:,} sequence{'s' if micro > 1 else ''}")
    tp_words = f"tp {layout.tp}{' with sequence parallel' if layout.sp else ''}"
    source = (f"context-parallel rank's derived step (cp {layout.cp}: rank 0 of torchtitan's (dp, cp, tp) mesh, its "
              f"S / {layout.cp} tokens in two chunks, torch's ring attention over the cp ranks"
              + (f", beside {tp_words}" if layout.tp > 1 else "")
              + (f", torchtitan's ExpertParallel over ep {layout.ep} = dp_shard_in_ep × cp ranks"
                 + (f", the busiest rank's routing ({layout.expert_load:g}×)" if layout.expert_load != 1 else "")
                 if ring_experts else "")
              + f", traced on torch's fake process group; {regime})"
              if layout.cp > 1 else
              f"tensor-parallel rank's derived step ({tp_words}, traced on torch's fake process group; {regime})"
              if layout.tp > 1 and not experts else
              f"expert-parallel rank's derived step (ep {layout.ep}: its routed experts / {layout.ep}, Shard(0), "
              + (f"each also cut over {tp_words} as under tensor parallel, [Shard(0), Shard(1 or 2)] on the (ep, tp) "
                 "mesh as torchtitan's ExpertTensorParallel places them, the rest of each layer cut as under tp; "
                 if layout.tp > 1 else "")
              + "with torchtitan's dispatch and combine, traced on torch's fake process group under "
              + ("balanced routing" if layout.expert_load == 1 else
                 f"an uneven load, the busiest rank's: {layout.expert_load:g} × its balanced token-expert pairs")
              + f"; {regime})" if experts else f"derived one-device step ({regime})")
    if policy is not None:
        source = (f"FSDP2 rank's derived step under its MixedPrecisionPolicy (FSDP2 over {layout.shard_degree}"
                  + (f", beside {tp_words}" if layout.tp > 1 else "") + f", traced on torch's fake process group as "
                  f"without a pipeline, the same recipe as memory's rank of this layout without --pp; {regime})")
    check = (POLICY_CHECK if policy is not None else
             RING_EXPERT_CHECK if ring_experts else CONTEXT_CHECK if layout.cp > 1 else
             "checked against MemTracker on the real class cut to each stage with the tp layout applied on the fake "
             "process group: on a Mixtral cut (tp 2 with sequence parallel, pp 3; "
             "tests/test_pipeline_tensor_parallel.py) its forwards and first backward equal to the byte, and on a "
             "GPT-2 cut (Conv1D, tied head; tp 2, pp 2; tests/test_pipeline_tied_stages.py) its forwards, first and "
             "later backward, the first stage keeping its embedding's own whole gradient as wte's .grad (the tied "
             "head's is on the last stage); on the Mixtral cut a later backward (1F1B's steady state) "
             "too, where the packed experts' down_proj gradient is held until gate_up_proj's is made (the experts "
             "read their local shards once, as they are entered, so autograd adds both into their .grad only after "
             "the experts' backward; the replay adds every other gradient at once); --trace measures each stage"
             if layout.tp > 1 and not experts else EXPERT_TP_CHECK if experts and layout.tp > 1 else
             EXPERT_CHECK + (LOADED_CHECK if layout.expert_load != 1 else "") if experts else
             "equal to MemTracker on the real class cut to each stage: tests/test_pipeline_stages.py, on GPT-2 and "
             "Mixtral cuts; on a BERT cut, tests/test_pipeline_encoder_stages.py, but for the received leaf's casts "
             "below")
    notes = (f"pipeline: each stage's activations replayed from {cls}'s {source}, segment "
             "by segment for its layers: the prefix (embeddings, position tables) on the first stage, "
             f"{after_layers(ctx.report.params, stack)} and the loss on the last, the received hidden state on the "
             "others; k microbatches in flight keep k "
             f"times what one forward keeps, and the peak adds one microbatch's backward through the stage ({check})",
             POLICY_CONVENTION if policy is not None else
             "pipeline convention: each microbatch's forward runs under its own autocast, so its 16-bit weight "
             "copies are held with it (as one device's step); later stages take the position tables with their "
             "input (torchtitan's stages hold them as buffers), not counted there",
             *((LEAF_CASTS,) if ctx.precision in ("bf16-mixed", "fp16-mixed") and policy is None else ()),
             *((UNSYNCED,) if fsdp_beside(ctx) else ()),
             *step.notes()[:1],
             *((load_words(layout.ep, layout.expert_load,
                           micro * (ctx.seq // layout.cp) * (dim(ctx.text, "top_k") or 0)),)
               if experts and layout.expert_load != 1 else ()))
    device = DeviceMemory(layout, dev.weights, dev.gradients + dev.grad_buffer,
                          dev.optimizer, dev.master_weights, ctx.buffer_bytes,
                          held, f"derived: stage {stage.rank}'s layers from the recipe's segments × microbatches in "
                          "flight", dev.arithmetic, tuple(comm) + tuple(b for b in p2p if b.bytes), figures, rules,
                          tuple(rows), words, bubble(layout), notes)

    def at(one_device: tuple[PhaseFigure, ...], batch: int, length: int) -> PhaseFigure:
        size = max(1, batch // layout.micro_batches)
        if layout.cp > 1:  # the rank is derived where 2·cp (2·cp·tp under sp) divides S: the next such length
            # bounds one it does not divide, as without a pipeline (estimate_derived.derived_device)
            unit = 2 * layout.cp * (layout.tp if layout.sp else 1)
            length = -(-length // unit) * unit
        return max((max(stage_figures(s, d, c, size, length)[0], key=lambda p: p.bytes)
                    for s, d, _, _, c in rows_in), key=lambda p: p.bytes)
    return device, at


# what the context-parallel stages are checked against (tests/test_pipeline_context_parallel.py)
RING_EXPERT_CHECK = ("checked against MemTracker on the real class cut to each stage, run on rank 0 of torchtitan's "
                     "(dp_shard_in_ep, cp) mesh with torch's ring attention over the cp ranks and the experts cut over "
                     "ep = dp_shard_in_ep × cp on the fake process group: on a Mixtral cut (pp 3, cp 2, ep 2, 1F1B; "
                     "tests/test_pipeline_context_expert_parallel.py) each stage's forwards, first and later backward "
                     "equal to the byte; --trace measures each stage")
CONTEXT_CHECK = ("checked against MemTracker on the real class cut to each stage, run on rank 0 of the (dp, cp, tp) "
                 "mesh with torch's ring attention over the cp ranks on the fake process group: on a Mixtral cut "
                 "(pp 3, cp 2, 1F1B; alone and beside tp 2 with sequence parallel) each stage's forwards, first "
                 "backward and a later backward (1F1B's steady state) equal to the byte, and so on a GPT-2 cut (tied "
                 "head; pp 3, cp 2) and GPT-2 at full size (pp 2, cp 2, 4,096 tokens); --trace measures each stage")


# what the expert-parallel stages are checked against (tests/test_pipeline_expert_parallel.py)
EXPERT_CHECK = ("checked against MemTracker on the real class cut to each stage with its experts sharded on the fake "
                "process group (traced/expert_parallel.py): on a Mixtral cut (pp 3, ep 2, 1F1B) each stage's "
                "forwards, first backward and a later backward (1F1B's steady state: the forward that comes first, "
                "every gradient held, peaks above the backward on the middle stage) equal to the byte; --trace "
                "measures each stage")


# and with tensor parallel beside (tests/test_pipeline_expert_tensor_parallel.py)
EXPERT_TP_CHECK = ("checked against MemTracker on the real class cut to each stage with the tp layout applied and its "
                   "experts sharded over ep and tp on the fake process group: on a Mixtral cut (pp 3, ep 2, tp 2, "
                   "with and without sequence parallel, 1F1B) each stage's forwards, first backward and a later "
                   "backward (1F1B's steady state) equal to the byte; --trace measures each stage")


# and under an uneven expert load (tests/test_expert_load.py)
LOADED_CHECK = ("; under an uneven load (--expert-load 1.5 on that cut) the busiest rank's stages equal to the byte "
                "too, forwards, first and later backward")


def kept_losses(figures: Any, micro_batches: int) -> tuple[int, str]:
    """(bytes, words) the last stage holds at the optimizer step from its microbatches' losses. torch's schedule
    keeps each microbatch's loss, graph and all, from its forward to the step's end (_PipelineSchedule
    ._maybe_compute_loss appends it to _internal_losses; _update_losses hands the list back through
    step(target=..., losses=losses)); torchtitan's forward_backward_step returns torch.mean(torch.stack(losses)),
    not detached, which train_step holds in `loss` through clip_grad_norm_ and optimizers.step(): the M loss tensors
    are freed with the list (stack's and mean's nodes keep no tensor), their graphs are not (the mean's reaches
    each), nor what the graphs' nodes hold beyond their saved tensors (the expert offsets of transformers'
    grouped-mm fallback). So: M × what a loss keeps (stage_recipe: `loss_kept`), less M − 1 loss scalars, the mean
    in their place (the same fp32 scalar)."""
    if figures is None or not figures.loss_kept:
        return 0, ""
    each, scalar = figures.loss_kept, figures.loss_scalar
    held = micro_batches * each - (micro_batches - 1) * scalar
    graphs = f", its graph's nodes {each - scalar:,} B" if each > scalar else ""
    return held, (f"; the microbatches' losses kept {held:,} B ({micro_batches} × {each:,} B: the loss {scalar:,} B"
                  f"{graphs}; less {micro_batches - 1} × {scalar:,} B, the M losses held as their mean: torch's "
                  "schedule hands the losses back through step(losses=...), and torchtitan's train_step holds "
                  "torch.mean(torch.stack(losses)), not detached, through the optimizer step; its graph keeps "
                  "each loss's)")


def _tied_apart(ctx: StepContext, placements: tuple[Placement, ...], tied_name: str | None
                ) -> tuple[int, int] | None:
    """(the bytes of the gradient the first stage's embedding backward makes, the bytes of the weight's .grad in the
    rank's one-device step) where the embedding is tied to the head, which the last stage holds (with its copy):
    under a vocabulary-parallel cut the first is the whole V × h (DTensor's embedding backward returns it Replicate),
    the second the rank's shard (the head's Shard(0) gradient and the embedding's added as Shard(0)); else both the
    weight's. None where nothing is tied or the embedding does not train (stage_recipe._Replay.tied_apart)."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    p = next((q for q in placements if q.name == tied_name), None)
    if ctx.layout.pp == 1 or p is None or not p.role.startswith("embedding") or p.name not in ctx.trainable:
        return None
    size = itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]
    whole = size
    for n in p.shape:
        whole *= n
    return (whole if p.tp == "vocabulary" else p.local_numel * size), p.local_numel * size


def _waiting_gradients(ctx: StepContext, placements: tuple[Placement, ...]) -> frozenset[int]:
    """The bytes of the gradients a later backward holds until the next gradient is made: under tensor parallel
    the packed experts' modules read their weights' local shards once, as they are entered (moe_parallel's
    PackedExpertsParallel, as torchtitan's GroupedExperts does), so autograd runs the gradients' AccumulateGrad only
    after the experts' whole backward (the to_local node is the first the experts' forward made): down_proj's,
    made first (its row-parallel shard), is still held when gate_up_proj's grouped backward makes its own."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    if ctx.layout.tp == 1:
        return frozenset()
    return frozenset(p.local_numel * itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]
                     for p in placements if p.role == "moe.experts" and len(p.shape) == 3 and p.tp == "row")


def _stage_dispatch(ctx: StepContext, placements: tuple[Placement, ...], params: list, in_flight: int,
                    micro: int) -> Buffer:
    """The expert dispatch's permute index the stage's MoE layers keep for their backward, a microbatch in flight
    (experts.py's rule, as without a pipeline): in the replayed step already, named here."""
    from ..dims import dim
    from .experts import INDEX_BYTES, dispatch_index_bytes, moe_layers

    held = {p.name for p in params}
    layers, top_k = moe_layers(p for p in placements if p.name in held), dim(ctx.text, "top_k") or 0
    tokens = ctx.seq // ctx.layout.cp  # the rank's tokens: S / cp on a ring's rank
    if ctx.layout.expert_load != 1:  # the busiest rank: its index is over the ⌈F·S⌉ pairs it receives
        from ..traced.expert_parallel import busiest_pairs

        pairs = busiest_pairs(micro * tokens * top_k, ctx.layout.ep, ctx.layout.expert_load)
        size = in_flight * layers * INDEX_BYTES * pairs
        return Buffer("expert parallel's permute index", size,
                      f"{in_flight} microbatch{'es' if in_flight > 1 else ''} in flight × the stage's {layers} MoE "
                      f"layers × {INDEX_BYTES} B × the ⌈{ctx.layout.expert_load:g}·S⌉ = {pairs:,} token-expert pairs "
                      f"the busiest rank receives (S = {micro}·{tokens}·{top_k}) = {size:,} B, int64, kept for the "
                      "backward (torchtitan's _permute; counted with each microbatch in the replayed step)",
                      ("forward", "backward"))
    size = in_flight * dispatch_index_bytes(layers, top_k, micro, tokens)[0]
    return Buffer("expert parallel's permute index", size,
                  f"{in_flight} microbatch{'es' if in_flight > 1 else ''} in flight × the stage's {layers} MoE layers "
                  f"× {INDEX_BYTES} B × S = {micro}·{tokens}·{top_k} token-expert pairs = {size:,} B, int64, "
                  "kept for the backward (torchtitan's _permute; balanced routing: a rank receives its own S pairs; "
                  "counted with each microbatch in the replayed step)", ("forward", "backward"))
