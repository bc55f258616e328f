"""One device's training step under a layout: its model states, activations, communication buffers and peak.

    Report + view → placements (rules.py: each parameter's tensor/expert-parallel cut, from its role)
    → pipeline stages (pipeline.py: the layers, embeddings and head each device holds; microbatches in flight)
    → each device's model states (states.py: its shards, then ZeRO's or FSDP2's data-parallel share)
    → its activations: data parallel alone leaves a rank's step as one device's (its own batch); under tensor
      parallelism the family's recipe on the rank's shard (activations.py); under context parallelism the recipe at
      the rank's S / cp tokens and ring attention's kept output copies; under a pipeline each stage's layers × the
      microbatches it holds
    → the communication buffers that matter (FSDP2's all-gathered units)
    → each moment with the device's figures; the device's peak, and the largest over the stages.

Here: the dispatch (layout_device: which answer the layout takes, and the closed form beside a derived one as its
check), which layouts a derived rank answers, and the layout as settings (layout_settings). This module is the entry
and re-exports the names callers import from it; the parts live one concern each: estimate_checks.py (the layouts
refused in one line: FSDP2's MixedPrecisionPolicy, an uneven expert load, ep beside hybrid sharding, context
parallel's ring; the policy's convention in words), estimate_closed_form.py (data parallel alone, the closed form on a
tensor or context-parallel rank's shard, what the traced rank still holds at its step), estimate_derived.py (a rank's
step derived from traces with the layout applied, and its words). Beside them: device.py (the answer as data),
device_parts.py (the pieces every answer adds up), pipeline_device.py and pipeline_replay.py (a pipeline's stages: the
closed form, the replay), device_trace.py (--trace).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ...errors import UnsupportedError
from ..memory.phases import PhaseFigure
from ..traced.step import HELD_BACKWARD, HELD_FORWARD
from .device import DeviceMemory, StepContext, NEEDS_BUILD
from .device_parts import fsdp_sharded, local_recipe_missing
from .device_trace import traced_check
from .estimate_checks import (
    check_context_parallel, check_expert_load, check_hybrid_experts, check_mixed_precision_policy,
    check_ring_beside_experts, mixed_precision_words
)
from .estimate_closed_form import data_parallel_device, held_at_step, sharded_activations_device
from .estimate_derived import derived_device, ring_words
from .fsdp_moments import fsdp_moments_missing
from .layout import ParallelLayout, shard_words
from .pipeline_device import pipeline_device
from .rules import Placement, cuts_routed_experts, placements_for, rules_in_words

__all__ = ["check_context_parallel", "check_expert_load", "check_hybrid_experts", "check_mixed_precision_policy",
           "check_ring_beside_experts", "held_at_step", "layout_device", "layout_settings", "mixed_precision_words",
           "ring_words"]


def layout_device(ctx: StepContext) -> tuple[DeviceMemory, Callable[..., PhaseFigure | tuple[PhaseFigure, ...]]]:
    """(the device's figures, the function that gives the device's largest moment at another batch and length from
    the one-device moments there: the fits table's question; with every=True all its moments there, to which
    gradient accumulation adds a later micro-step's, grad_accum.later_rank_step)."""
    layout = ctx.layout
    placements = placements_for(ctx.report, ctx.view, layout)
    rules = rules_in_words(placements, layout)
    # an uneven expert load: the busiest ep rank's step derived from traces with its experts cut and that routing
    # (the balanced closed form beside, as the comparison); a pipeline replays that rank's recipe (pipeline_device)
    loaded = check_expert_load(ctx, placements)
    check_hybrid_experts(layout, cuts_routed_experts(placements))
    policy = check_mixed_precision_policy(ctx, placements)
    if loaded and layout.cp > 1:  # the busiest rank's ring: what the ring beside ep refuses, refused first
        check_context_parallel(ctx, True)
    derivable = ctx.derive and layout.pp == 1 and (loaded or (
        _ring_rank_derived(ctx, placements) if layout.cp > 1 else _sharded_rank_derived(ctx, placements)))
    declined = ""
    if derivable:
        derived = derived_device(ctx, placements, rules)
        if derived is NEEDS_BUILD:
            return None
        # where the policy's closed form (fsdp_moments.py) does not reach, the derived rank alone answers it
        if isinstance(derived, str) and policy and fsdp_moments_missing(ctx, placements):
            raise UnsupportedError("{0} policy is answered from the rank's step derived from traces, and {why}",
                                   "fsdp_mixed_precision", why=derived.replace(": the closed form answers", ""))
        if isinstance(derived, str) and loaded:  # the balanced closed form is not the busiest rank's answer
            raise UnsupportedError("expert load {load:g}: the busiest rank is answered from its step derived from "
                                   "traces of short cuts, and {why}", load=layout.expert_load,
                                   why=derived.replace(": the closed form answers", ""))
        if isinstance(derived, str):
            declined = derived
        else:
            device, at = derived
            closed = "" if policy and fsdp_moments_missing(ctx, placements) else (
                _balanced_beside if loaded else _closed_form_beside)(ctx, placements, rules, device)
            if closed:
                device = dataclasses.replace(device, notes=device.notes + (closed,))
            if layout.ep > 1 and not cuts_routed_experts(placements):  # the ring's rank alone (cp)
                device = dataclasses.replace(device, notes=device.notes + (_no_experts_words(ctx),))
            return (traced_check(ctx, device), at) if ctx.trace else (device, at)
    try:
        if layout.pp > 1:
            if layout.cp > 1 and local_recipe_missing(ctx):  # the stages replay the cp rank's derived step
                check_context_parallel(ctx)
            answer = pipeline_device(ctx, placements, rules)
            if answer is NEEDS_BUILD:
                return None
            device, at = answer
        elif layout.tp == 1 and layout.cp == 1:
            device, at = data_parallel_device(ctx, placements, rules)
        else:
            device, at = sharded_activations_device(ctx, placements, rules)
    except UnsupportedError as err:
        if not declined:
            raise
        raise UnsupportedError("{why}; and {declined}", why=str(err),
                               declined=declined.replace(": the closed form answers", "")) from err
    if declined:
        device = dataclasses.replace(device, notes=device.notes + (declined,))
    if layout.ep > 1 and not cuts_routed_experts(placements):
        device = dataclasses.replace(device, notes=device.notes + (_no_experts_words(ctx),))
    # (beside a pipeline the stages' own note says how PipelineStage runs FSDP2: units kept gathered, no per-layer
    # reshard or reduce-scatter until the last backward; this default-step note would contradict it)
    if layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1 and layout.pp == 1:
        modelled = any(p.where.startswith("FSDP2:") for p in device.phases)
        device = dataclasses.replace(device, notes=device.notes + (
            "FSDP2 as torch's fully_shard runs it by default (on each layer, then the root; a layer resharded after "
            "its forward, the root not; one unit prefetched in backward; one reduce-scatter input held): the root "
            "unit stays gathered through the step and a layer's parameters while it runs, "
            + ("and the moments named FSDP2 (a unit's all-gather in the forward, inside a layer's backward, the "
               "embedding's backward) add the all-gather outputs, the root's unsharded gradients, the "
               "reduce-scatter input and the shards held there" if modelled else
               "counted; the moments inside its backward (the root's unsharded gradients, the reduce-scatter "
               "input) are modelled for Llama, Mistral and Qwen2 (fp32, mixed precision and bf16-pure, with or "
               "without full checkpointing), without cp or ep, not here: --trace measures one rank"),))
    if ctx.trace:
        device = traced_check(ctx, device)
    return device, at


def _no_experts_words(ctx: StepContext) -> str:
    return (f"ep {ctx.layout.ep}: {ctx.view.class_name} has no routed experts, so expert parallelism cuts nothing: "
            "each rank runs as a data-parallel one")


def _closed_form_beside(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str],
                        device: DeviceMemory) -> str:
    """The closed form's device peak, where there is one, as a check beside a derived answer."""
    try:
        if ctx.layout.tp == 1 and ctx.layout.cp == 1:
            closed, _ = data_parallel_device(ctx, placements, rules)
        else:
            closed, _ = sharded_activations_device(ctx, placements, rules)
    except UnsupportedError:
        return ""
    if ctx.accumulating:  # the closed form's is the first micro-step's: compared with the derived first micro-step's
        derived, ours = _first_micro_step_peak(device), _first_micro_step_peak(closed)
        diff = (ours - derived) / derived if derived else 0.0
        return (f"check: the first micro-step's peak: the closed form gives {ours:,} B, {100 * diff:+.3f}% from the "
                "derived first micro-step")
    diff = (closed.peak - device.peak) / device.peak if device.peak else 0.0
    return f"check: the closed form gives {closed.peak:,} B, {100 * diff:+.3f}% from the derived peak"


def _first_micro_step_peak(device: DeviceMemory) -> int:
    """The largest moment of the first micro-step (and the optimizer's): every phase but a later micro-step's."""
    return max(p.bytes for p in device.phases if p.phase not in (HELD_FORWARD, HELD_BACKWARD))


def _balanced_beside(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str],
                     device: DeviceMemory) -> str:
    """Balanced routing's answer (--expert-load 1: the closed form, one device's step and the permute index; on a
    tensor-parallel rank the family's recipe on its shard, where the class has one) beside the busiest rank's derived
    peak: what the load adds. On a ring's rank (cp) no closed form prices the experts' dispatch: nothing beside, the
    balanced rank named as what --expert-load 1 derives."""
    if ctx.layout.cp > 1:
        return ("balanced routing on this ring's rank is derived from its own traces by --expert-load 1 (no closed "
                "form prices the experts' dispatch beside context parallel)")
    try:
        closed, _ = (data_parallel_device if ctx.layout.tp == 1 else sharded_activations_device)(
            ctx, placements, rules)
    except UnsupportedError:  # no closed form on a tp rank's shard for this class: nothing beside
        return ""
    # under --grad-accum the derived rank holds a later micro-step the closed form does not: compare first ones
    peak, base = (_first_micro_step_peak(device), _first_micro_step_peak(closed)) if ctx.accumulating else \
        (device.peak, closed.peak)
    more = peak - base
    first = "the first micro-step's" if ctx.accumulating else ""
    fsdp = ctx.layout.shard == "fsdp"
    return (f"balanced routing (--expert-load 1, the closed form{', ' + first if first else ''}: "
            f"{'the recipe on the rank' + chr(39) + 's shard' if ctx.layout.tp > 1 else 'one device' + chr(39) + 's step'}, "
            f"the rank's states"
            f"{', FSDP2' + chr(39) + 's gathered root and layer units' if fsdp else ''} and the permute index) gives "
            f"{base:,} B; the busiest rank's {ctx.layout.expert_load:g}× share adds {more:,} B{' to its first micro-step' if first else ''} "
            f"({100 * more / base:+.3f}%)" + (" (under FSDP2 that balanced figure is the closed form, not a "
                                                     "trace: 0.56% under the traced balanced rank at Mixtral-8x7B's "
                                                     "size, dp 8; --expert-load 1 derives it)" if fsdp else ""))


def _sharded_rank_derived(ctx: StepContext, placements: tuple[Placement, ...]) -> bool:
    """No context parallel: FSDP2's rank is derived for every class (its in-backward buffers are in no closed form),
    a tensor-parallel rank for the classes without the closed form on a rank's shard. Under expert parallel (balanced
    routing), where the class has routed experts: the rank of the (ep, tp) mesh beside tp without FSDP2
    (torchtitan's ExpertTensorParallel: each rank's E/ep experts also cut over tp; the key the pipeline's stages and
    the loaded rank trace), and FSDP2's rank over dp ranks ep divides, beside tp or not (torchtitan's
    (dp / ep, ep, tp) mesh, the experts' own unit over dp / ep; under hybrid sharding the shard group's, with
    dp_replicate in front); ep beside DDP or ZeRO 1-2 alone stays one device's step and its dispatch
    (data_parallel_device)."""
    layout = ctx.layout
    if layout.ep > 1:
        if not cuts_routed_experts(placements):
            return False
        if fsdp_sharded(layout):  # FSDP2, full or hybrid (torchtitan's dp_replicate in front)
            return True
        return layout.tp > 1 and layout.zero_stage != 3
    return fsdp_sharded(layout) or layout.tp > 1 and local_recipe_missing(ctx)


def _ring_rank_derived(ctx: StepContext, placements: tuple[Placement, ...]) -> bool:
    """Context parallel, alone or beside tp (with or without sp), FSDP2 and ep (torchtitan's composition;
    traced/parallel.py): the rank is derived from torch's own ring, traced, for every class whose ring runs there. A
    class without the closed form, or with routed experts under ep (the closed form has no dispatch on a ring's rank),
    is refused here in one line where the ring is not derived (check_context_parallel);
    the Llama family's closed form (the recipe at S / cp tokens and the ring's kept output copies, equal to the ring
    on a Llama cut but for the one-device recipe's own bytes) is the check beside it, and answers alone where the
    ring is not derived (2·cp not dividing S, say)."""
    experts = cuts_routed_experts(placements)
    if local_recipe_missing(ctx) or experts:
        check_context_parallel(ctx, experts)
        return True
    return _ring_derivable(ctx)


def _ring_derivable(ctx: StepContext) -> bool:
    try:
        check_context_parallel(ctx)
    except UnsupportedError:
        return False
    return True


def layout_settings(layout: ParallelLayout) -> dict[str, Any]:
    return {"devices": layout.devices, "dp": layout.dp, "shard": layout.shard, "shard_words": shard_words(layout),
            "shard_degree": layout.shard_degree, "tp": layout.tp, "sp": layout.sp, "pp": layout.pp,
            "micro_batches": layout.micro_batches, "schedule": layout.schedule,
            "virtual_stages": layout.virtual_stages, "ep": layout.ep, "cp": layout.cp,
            "expert_load": layout.expert_load, "fsdp_mixed_precision": layout.fsdp_mixed_precision,
            "words": layout.words()}
