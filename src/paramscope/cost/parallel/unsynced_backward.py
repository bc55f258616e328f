"""A pipeline stage's backward under FSDP2 beside the pipeline (pipeline_replay.UNSYNCED): the gradients the first
backward's largest moment holds unsharded, unit by unit, and the moment its end makes, every gradient unsharded and,
under the MixedPrecisionPolicy, the root unit's 16-bit gradients upcast one by one; a later backward replayed without
the FSDP2 rank's own gathers and reduce-scatters (backward_gathers_apart).

    first backward   the replayed step's largest moment, whose gradients made by then are, under the policy, the
                     replayed FSDP2 rank's fp32 shards of the layer units gone back (one reduce-scatter output a
                     unit, padded as fully_shard pads: ⌈dim0 / d⌉ rows); the stage holds those units' gradients
                     unsharded in fp32 instead (FSDP2's unsharded_accumulated_grad), so + Σ (whole − shard) over
                     them. Under autocast the replayed step is one device's: its .grad are the stage's, unsharded.
                     Where that moment falls inside a unit's post-backward, the rank's reduce-scatter input (the
                     unit's fp32 gradients, padded, beside its 16-bit ones) stands where the stage casts them one
                     by one, which holds no more: a bound there (no trace holds such a moment; on the traced cut
                     the largest moment is the loss's, no gradient made).
    end of the       the root's final callback (_root_post_backward_final_callback) runs the post-backward of each
    first backward   group not yet run; under the policy with no gradient sync each parameter's 16-bit gradient is
                     cast to fp32 (FSDPParam.to_accumulated_grad_if_needed: .grad set to None, then .to(reduce_dtype)
                     of the kept reference), so the moment casting root parameter i holds the fp32 gradients of every
                     unit gone back and of root parameters ≤ i, and the 16-bit ones of parameters ≥ i; the k − 1
                     other microbatches held, and on the last stage the loss and autograd's seed gradient
                     (ones_like(loss), held by torch.autograd.backward's frame through the callback).
    later backward   under the policy the replayed rank, in each layer unit's backward, holds the unit's 16-bit
                     parameters copied out of its all-gather, the next unit's prefetched all-gather (the cast shards
                     and the flat output) and the unit above's fp32 reduce-scatter input; the stage, every unit
                     gathered and no reduce without the sync, makes none: the later backward is replayed without
                     them (traced: on the vocabulary-512 cut, tp 2 + sp, 3 and 2 in flight, the replay's largest
                     later moment inside a middle layer's backward was 49,828 B above the trace's, the loss's
                     moment; without them the later backward is the loss's moment, the trace + the kept loss, 4 B).

Traced: trace_unsynced_fsdp on a 4-layer Llama cut (dp 2, the whole cut one stage), 2 × 40, 3 and 2 microbatches
in flight: the end of the first backward is the phase's peak there, equal to the byte
(tests/test_fsdp_pipeline_stage.py). A stage of a pp ≥ 2 layout is held by argument: a first stage's root is its
embeddings, a last's its final norm and head, a middle stage's none; a stage before the last holds the received
output gradient and, after the first, its input's gradient to send, in place of the loss and its seed. An
interleaved rank's end moment is not counted (its first backward is one chunk's). Beside tensor parallel a
vocabulary-parallel embedding's gradient is whole (DTensor's embedding backward makes it Replicate; without the sync
FSDP2 casts it to fp32 and adds each later microbatch's into it so, redistributing to the rank's Shard(0) only in
the step's reduce): from the end of the first backward the stage holds 4·(V − V/tp)·h over the rank's own
(whole_embedding_extra; traced beside tp 2 with sequence parallel: the trace's reduce holds every fp32 gradient with
the embedding whole, and the end moment with it equals the trace's first backward, UNSYNCED).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..memory.phases import PhaseFigure
from .device import StepContext
from .pipeline import LAYER_PREFIX, Stage
from .rules import Placement

# where the gradients' count of the first backward is not unit by unit: the replayed rank's gradients by its largest
# moment are not a run of whole layer units from the stage's top (no case the replay makes is known)
IN_PROPORTION = ("in proportion to the shards it counts (an estimate: the replayed rank's gradients at that moment "
                 "are not whole layer units)")


def unit_gradient_bytes(ctx: StepContext, params: list[Placement]) -> tuple[int, int]:
    """(the unit's gradients unsharded in fp32, its fp32 shards as fully_shard pads them: ⌈dim0 / d⌉ rows each) in
    bytes, of its trainable parameters."""
    d = ctx.layout.shard_degree
    whole = shard = 0
    for p in params:
        if p.name.split(" (")[0] not in ctx.trainable:
            continue
        shape = p.local_shape or (1,)
        whole += 4 * p.local_numel
        shard += 4 * -(-shape[0] // d) * math.prod(shape[1:])
    return whole, shard


def first_backward_unsharded(ctx: StepContext, held: tuple[Placement, ...], stack: str, stage: Stage, made: int,
                             policy: bool) -> tuple[int, str] | None:
    """(bytes, words) the stage's first backward holds at the replay's largest moment above the `made` gradient
    bytes the replayed step had made by then: under the policy the layer units gone back (from the stage's top,
    whose fp32 shards add up to `made`) held unsharded, whole − shard each; under autocast nothing (the one-device
    step's .grad are the stage's). None where no run of layer units from the top adds up to `made`."""
    if not policy:
        return 0, (f"the replayed one-device step's gradients made by then, {made:,}, unsharded already as the stage "
                   "holds them (FSDP2 under autocast keeps each .grad whole without the sync)")
    if not made:
        return 0, "no layer unit gone back at that moment, no gradient made"
    whole = shards = units = 0
    for layer in reversed(stage.layers):
        params = [p for p in held if (m := LAYER_PREFIX.match(p.name)) and m.group(1) == stack
                  and int(m.group(2)) == layer]
        w, s = unit_gradient_bytes(ctx, params)
        whole, shards, units = whole + w, shards + s, units + 1
        if shards == made:
            return whole - made, (f"the {units} layer unit{'s' if units > 1 else ''} gone back by that moment held "
                                  f"unsharded in fp32 (the policy's reduce_dtype, unsharded_accumulated_grad), "
                                  f"{whole:,}, in place of the replayed rank's padded fp32 shards of them {made:,}")
        if shards > made:
            break
    return None


def whole_gradient_numel(ctx: StepContext, p: Placement) -> int:
    """The elements of the gradient the stage holds of `p` unsharded: the whole embedding where tensor parallel cuts
    it over the vocabulary and no head is tied to it (DTensor's embedding backward returns its gradient Replicate,
    and without the sync FSDP2 keeps it so: the cast to fp32 and each later microbatch's add are on that Replicate
    DTensor, redistributed to the rank's Shard(0) only in the step's reduce), else the rank's own."""
    tied = {name for group in ctx.report.tied for name in (group.canonical, *group.aliases)}
    if ctx.layout.tp > 1 and p.role == "embeddings.word" and p.tp == "vocabulary" \
            and p.name.split(" (")[0] not in tied:
        return math.prod(p.shape)
    return p.local_numel


def whole_embedding_extra(ctx: StepContext, held: tuple[Placement, ...], policy: bool) -> int:
    """The bytes the stage's unsharded gradients hold above the rank's own (unsynced_gradients' count) from the
    embedding's first gradient (the end of the first backward) to the step's reduce: a vocabulary-parallel
    embedding's gradient whole (whole_gradient_numel), fp32 under the policy (its reduce_dtype), else the dtype it
    trains in; 0 without one."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    return sum((whole_gradient_numel(ctx, p) - p.local_numel)
               * (4 if policy else itemsize(trained_dtype(p, ctx.precision, ctx.own)))  # type: ignore[arg-type]
               for p in held if p.name.split(" (")[0] in ctx.trainable)


def root_upcast(ctx: StepContext, held: tuple[Placement, ...]) -> int:
    """Under the policy, the most the root unit's post-backward holds above every fp32 gradient of the stage as it
    casts its parameters' 16-bit gradients to fp32 in order: max over i of (16-bit of parameters ≥ i) − (fp32 of
    parameters > i), each gradient as the stage holds it (whole_gradient_numel); 0 where the stage's root holds no
    trainable parameter."""
    root = [whole_gradient_numel(ctx, p) for p in held if not LAYER_PREFIX.match(p.name)
            and p.name.split(" (")[0] in ctx.trainable]
    return max((2 * sum(root[i:]) - 4 * sum(root[i + 1:]) for i in range(len(root))), default=0)


def end_of_first_backward(ctx: StepContext, held: tuple[Placement, ...], stage: Stage, figures: Any,
                          resident: int, shards: int, policy: bool) -> PhaseFigure:
    """The moment the stage's first backward ends, above its resident states: the k − 1 other microbatches held
    (the replay's after_first_backward, what the first microbatch's backward leaves: on the last stage its loss), the
    loss's seed gradient (the last stage) or the received output gradient and the input's gradient to send (the
    others), the gradient shards (with_unsynced_gradients puts every gradient unsharded in their place, and
    with_buffers the stage's gathered units beside), and under the policy the root's upcast (root_upcast)."""
    after = figures.after_first_backward
    if stage.last:
        tail, tail_words = figures.loss_scalar, (f"autograd's seed gradient of the loss, ones_like(loss), "
                                                 f"{figures.loss_scalar:,}")
    else:
        tail = figures.output_gradient + figures.received
        tail_words = (f"the received output gradient {figures.output_gradient:,}"
                      + (f" and the input's gradient to send {figures.received:,}" if figures.received else ""))
    upcast = root_upcast(ctx, held) if policy else 0
    k = stage.in_flight
    words = (f"the end of the first backward: {after:,} held (the {k - 1} other microbatch{'es' if k != 2 else ''} "
             "in flight" + (" and the first microbatch's loss, kept" if stage.last else "") + f") + {tail_words} + "
             f"the gradient shards {shards:,}"
             + (f" + the root unit's post-backward (its final callback) casting its 16-bit gradients to fp32 one by "
                f"one (FSDPParam.to_accumulated_grad_if_needed), the most it holds above the fp32 ones, the last "
                f"cast's 16-bit gradient beside its fp32 copy where that is largest, {upcast:,}" if upcast else ""))
    return PhaseFigure("backward", resident + after + tail + shards + upcast, "end of the first backward", words,
                       shards)


def backward_gathers_apart(ctx: StepContext, recipe: Any, held: tuple[Placement, ...]) -> tuple[Any, int]:
    """(the replayed FSDP2 rank's recipe with the allocations of its backward's gathers and reduce-scatters sized 0,
    how many): under the policy a stage beside a pipeline makes neither in a later microbatch's backward (every unit
    gathered since its first forward, no reduce without the sync: UNSYNCED), where the rank, in each layer unit's
    backward, holds the unit's 16-bit parameters copied out of its all-gather, the next unit's prefetched all-gather
    (its input, the 16-bit shards cast, and its flat output) and the unit above's fp32 reduce-scatter input
    (FSDP2's foreach_all_gather, foreach_all_gather_copy_out, foreach_reduce). Recognised among the constant
    allocations a backward segment makes (B and S appear in none of them), not the rank's gradients: the unit's
    16-bit shards 2·Σ⌈dim0 / d⌉·rest, its all-gather output d times that, its reduce-scatter input 4·d·Σ⌈dim0 / d⌉·rest,
    and a run of consecutive allocations the unit's parameters' 16-bit sizes in order (the copy-out). The reduce-
    scatter's output, the rank's gradient shard, is the replay's own gradient (not made at a later backward)."""
    d = ctx.layout.shard_degree
    units: dict[str, list[Placement]] = {}
    for p in held:
        if (m := LAYER_PREFIX.match(p.name)) and p.name.split(" (")[0] in ctx.trainable:
            units.setdefault(m.group(0), []).append(p)
    whole: set[int] = set()
    copies: set[tuple[int, ...]] = set()
    for params in units.values():
        shards = sum(-(-(p.local_shape or (1,))[0] // d) * math.prod((p.local_shape or (1,))[1:]) for p in params)
        whole |= {2 * shards, 2 * d * shards, 4 * d * shards}
        copies.add(tuple(2 * p.local_numel for p in params))
    sizes = list(recipe.sizes)

    def constant(index: int) -> int | None:
        poly = sizes[index]
        if recipe.gradient[index] or not all(i == 0 and j == 0 for i, j, _ in poly):
            return None
        return sum(v for _, _, v in poly)

    apart = set()
    segments = (recipe.head_backward, recipe.last_backward, recipe.first_backward, *recipe.middle_backward.values())
    for entries in segments:
        made = [(sign > 0 and mult is None, index) for sign, index, mult in entries]
        for position, (alloc, index) in enumerate(made):
            if not alloc or constant(index) is None:
                continue
            if constant(index) in whole:
                apart.add(index)
            for run in copies:
                window = made[position:position + len(run)]
                if len(window) == len(run) and all(a and constant(i) == v for (a, i), v in zip(window, run)):
                    apart.update(i for _, i in window)
    for index in apart:
        sizes[index] = ()
    return dataclasses.replace(recipe, sizes=tuple(sizes)), len(apart)
