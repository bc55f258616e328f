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

Here: the dispatch (layout_device), data parallel alone, the closed form on a tensor or context-parallel rank's shard,
and a rank's step derived from traces with the layout applied. Beside it: device.py (the answer as data),
device_parts.py (the pieces every answer adds up), pipeline_device.py and pipeline_replay.py (a pipeline's stages: the closed form, the replay), device_trace.py (--trace).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ...errors import ParamscopeError, UnsupportedError
from ..memory.expert_offsets import expert_offsets
from ..memory.states import grad_buffer
from ..memory.phases import PhaseFigure, moment_phases
from ..traced.step import HELD_BACKWARD, HELD_FORWARD
from .device import DeviceMemory, RingQuestion, StepContext, NEEDS_BUILD
from .device_parts import (
    check_analytic, device_states_of, encoder_refusal, expert_dispatch, fsdp_buffers, fsdp_policy, fsdp_sharded,
    hidden_size, local_activations, local_recipe_missing, local_shape, policy_context, refuse_attention_dropout,
    resident_bytes, ring_chunk_bytes, ring_output_copies,
    sequence_parallel_norm_gradients, tied_bytes, whole_embedding_gradient, with_buffers, with_norm_gradients,
    with_ring_outputs, with_whole_gradient, masked_token_ids, with_masked_ids, with_head_gather
)
from .device_trace import traced_check
from .fsdp_moments import fsdp_moments_missing
from .layout import ParallelLayout, shard_words
from .pipeline_device import pipeline_device
from .rules import Placement, cuts_routed_experts, placements_for, rules_in_words
from .trace_reach import hybrid_replicas


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
        derived = _derived_device(ctx, placements, rules)
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


def check_mixed_precision_policy(ctx: StepContext, placements: tuple[Placement, ...]) -> bool:
    """Whether the layout asks FSDP2's MixedPrecisionPolicy (--fsdp-mixed-precision policy), refusing in one line
    where it does not apply: not a mixed precision, or no derivation asked where the policy's closed form
    (fsdp_moments.py: Llama, Mistral and Qwen2; cp without sp or hybrid sharding beside it; not ep) does not reach; elsewhere the rank is derived from
    traces with the policy applied."""
    if ctx.layout.fsdp_mixed_precision != "policy":
        return False
    if not ctx.precision.endswith("-mixed"):
        raise UnsupportedError("{0} policy casts fp32 parameters to 16 bits as FSDP2 gathers them: it needs a mixed "
                               "precision (bf16-mixed, fp16-mixed), got {precision}", "fsdp_mixed_precision",
                               precision=ctx.precision)
    why = "" if ctx.derive else fsdp_moments_missing(ctx, placements)
    if why:
        raise UnsupportedError("{0} policy is answered from the rank's step derived from traces with the policy "
                               "applied; its closed form covers Llama, Mistral and Qwen2 (cp without sp or hybrid sharding "
                               "beside it; not ep), and here "
                               "{why}: leave derive_layout on", "fsdp_mixed_precision", why=why)
    return True


def mixed_precision_words(ctx: StepContext) -> str:
    """The convention a mixed precision under FSDP2 was traced with, named (--fsdp-mixed-precision)."""
    half = ctx.precision.split("-")[0]
    if ctx.layout.fsdp_mixed_precision == "policy":
        default = "the default, as torchtitan's apply_fsdp runs it; " \
            "--fsdp-mixed-precision autocast for torch.autocast over fp32 gathers" \
            if ctx.layout.fsdp_mixed_precision_defaulted else "--fsdp-mixed-precision policy"
        return (f"mixed precision: FSDP2's MixedPrecisionPolicy(param_dtype={half}, reduce_dtype=fp32), torchtitan's "
                f"({default}): the fp32 shards gathered as {half} parameters, no autocast, the "
                f"{half} gradients reduce-scattered in fp32; its closed form (fsdp_moments.py, for Llama, Mistral and "
                f"Qwen2; cp without sp or hybrid sharding beside it; not ep): {half}-pure's step over the fp32 shards, the reduce-scatter input and the "
                "reduced shards in fp32")
    return (f"mixed precision: torch.autocast({half}) over the fp32 parameters FSDP2 gathers in fp32 "
            "(--fsdp-mixed-precision autocast); torchtitan runs FSDP2 with its MixedPrecisionPolicy and no autocast "
            "instead, the default: --fsdp-mixed-precision policy (accelerate's FSDP2 path enters no autocast either)")


def _no_experts_words(ctx: StepContext) -> str:
    return (f"ep {ctx.layout.ep}: {ctx.view.class_name} has no routed experts, so expert parallelism cuts nothing: "
            "each rank runs as a data-parallel one")


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


def check_hybrid_experts(layout: ParallelLayout, experts: bool) -> None:
    """Expert parallel beside hybrid sharding (HSDP), as torchtitan lays it out: the ep ranks drawn from a shard group
    (ep = dp_shard_in_ep × cp, the shard group's dp_shard × cp ranks; its ParallelDims asserts (dp_shard × cp) % ep
    == 0), the experts' own FSDP2 unit over (dp_replicate, dp_shard_mod_ep), the rest over (dp_replicate,
    dp_shard_cp). One line where ep does not divide the shard group (`experts`: the layout cuts routed experts)."""
    if layout.shard != "hsdp" or layout.ep == 1 or not experts:
        return
    _check_ep_in_shard_group(layout, f"ep {layout.ep} beside")


def _check_ep_in_shard_group(layout: ParallelLayout, head: str) -> None:
    """Under hybrid sharding torchtitan draws the ep ranks from one shard group: one line where ep does not divide
    it, `head` saying what asked (ep beside HSDP, or the ring beside ep under HSDP)."""
    if layout.shard == "hsdp" and layout.shard_degree % layout.ep:
        raise UnsupportedError("{head} hybrid sharding over shard groups of {group} ranks: torchtitan draws the ep "
                               "ranks from a shard group (dp_shard × cp), which ep must divide", head=head,
                               group=layout.shard_degree)


def check_expert_load(ctx: StepContext, placements: tuple[Placement, ...]) -> bool:
    """Whether the layout asks an uneven expert load (--expert-load F > 1 under --ep), refusing in one line what the
    busiest rank's derivation does not take: a class without routed experts, DeepSpeed's ZeRO-3 (not traced), no
    derivation asked. FSDP2 over dp ranks is torchtitan's composition: the experts split over ep ranks (beside tp
    also cut over tp, its ETP = tp), their own FSDP2 unit over the dp / ep ranks holding the same experts (its
    dp_shard_mod_ep), the rest over dp; under hybrid sharding the same within a shard group, replicated over the
    groups (check_hybrid_experts). Beside context parallel the ep ranks are torchtitan's
    dp_shard_in_ep × cp, rank 0 of them the busiest and running its S / cp tokens through torch's ring
    (check_context_parallel refuses what that ring beside ep does not take)."""
    layout = ctx.layout
    if layout.expert_load == 1 or layout.ep == 1:
        return False
    load = f"{layout.expert_load:g}"
    if not cuts_routed_experts(placements):
        raise UnsupportedError("expert load {load}: {cls} has no routed experts for the ep ranks to share",
                               load=load, cls=ctx.view.class_name)
    if layout.shard == "zero3" or not ctx.derive:
        raise UnsupportedError("expert load {load}: the busiest expert-parallel rank is derived from traces with "
                               "expert parallel beside data parallel (ZeRO 0-2, or FSDP2, full or hybrid, over dp "
                               "ranks ep divides), "
                               "tensor parallel, context parallel and pipeline stages; got {layout}", load=load,
                               layout=layout.words())
    return True


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
        closed, _ = (_data_parallel_device if ctx.layout.tp == 1 else _sharded_activations_device)(
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


def _derived_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """One rank's step as closed forms in B and S derived from traces of short cuts of the real class with the
    layout applied on torch's fake process group (derived/, as for one device: two points, checked by a longer
    cut; kept in the cache under the layout), composed with the device's exact model states. Why not, in words,
    where the derivation declines (the caller answers analytically and says so); NEEDS_BUILD where it is not
    cached and there is no module to trace."""
    from ..derived.step import DerivedStep
    from ..derived.symbols import NotDerivable
    from ..dims import dim
    from ..traced.parallel import with_mixed_precision
    from ..traced.step import StepSettings
    from .experts import load_words

    layout = ctx.layout
    fsdp = fsdp_sharded(layout)
    # a context-parallel rank: (dp, shard, tp, sp, rank, ep, cp) on rank 0 (traced/parallel.py), beside tp, and
    # FSDP2 over the shard degree's dp × cp ranks (torchtitan's dp_shard_cp): dp = shard degree / cp in the trace;
    # beside ep (routed experts to cut) the experts over ep = dp_shard_in_ep × cp ranks, torchtitan's: dp = ep / cp
    # in the trace (under FSDP2 the shard degree is ep, check_context_parallel), the dp replicas beyond it alike;
    # under an uneven load the load appended (rank 0 of the flattened dp × cp ep ranks the busiest)
    # an expert-parallel rank under an uneven load: (dp, shard, tp, sp, rank, ep, cp, load) with dp == ep, rank 0
    # the busiest (traced/expert_parallel.py); the data-parallel ranks beyond ep run the same step; under FSDP2
    # dp is the shard degree, torchtitan's (dp / ep, ep, tp) mesh: the experts' own unit over the dp / ep ranks
    # a balanced expert-parallel rank beside tp: (ep, "none", tp, sp, 0, ep), the key derived_pipeline_device's
    # stages replay (a load of 1 keeps it); under FSDP2 (dp, "fsdp", tp, sp, 0, ep)
    experts_dp = layout.shard_degree if fsdp else layout.ep
    loaded = layout.ep > 1 and layout.expert_load != 1
    ring_ep = layout.ep if layout.cp > 1 and cuts_routed_experts(placements) else 1
    traced = ((layout.shard_degree // layout.cp if fsdp else max(1, ring_ep // layout.cp), "fsdp" if fsdp else "none",
               layout.tp, layout.sp, 0, ring_ep, layout.cp) + ((layout.expert_load,) if loaded else ())
              if layout.cp > 1 else
              (experts_dp, "fsdp" if fsdp else "none", layout.tp, layout.sp, 0, layout.ep, 1, layout.expert_load)
              if loaded else
              (experts_dp, "fsdp" if fsdp else "none", layout.tp, layout.sp, 0, layout.ep) if layout.ep > 1 else
              (layout.shard_degree if fsdp else 1, "fsdp" if fsdp else "none", layout.tp, layout.sp))
    traced = with_mixed_precision(traced, layout.fsdp_mixed_precision)  # the policy is part of the recipe's key
    # hybrid sharding: the rank derived as FSDP2's over its shard group (the replicas' all-reduce runs in place on the
    # reduce-scattered gradient; the experts' unit cut as over the group, torchtitan's rule reading the shard
    # dimension alone); beside routed experts --trace runs the real HSDP mesh, dp_replicate in front, as the check
    replicas = hybrid_replicas(layout, cuts_routed_experts(placements))
    settings = StepSettings(precision=ctx.precision, optimizer=ctx.optimizer,
                            grad_checkpointing=bool(ctx.shape.get("checkpointing")), attention=ctx.attention,
                            frozen=ctx.frozen, weights_dtype=ctx.weights_dtype, own_dtype=ctx.own, layout=traced)
    try:
        step = DerivedStep.first(ctx.view.module, ctx.view.class_name, ctx.view.config, settings, batch=ctx.batch,
                                 seq=ctx.seq, limit=ctx.limit, live=ctx.live, structure=ctx.structure)
    except (NotDerivable, ParamscopeError) as err:  # or the traced layout refuses (a class without a tp plan)
        return f"the per-device step was not derived from traces ({err}): the closed form answers"
    if step is None:
        return NEEDS_BUILD
    dev = device_states_of(ctx, placements)
    resident = resident_bytes(dev, ctx.buffer_bytes)
    whole = whole_embedding_gradient(ctx, placements)
    norms = sequence_parallel_norm_gradients(ctx)
    step_bytes, step_text = ctx.step

    def phases_at(figures: Any, batch: int, length: int) -> tuple[PhaseFigure, ...]:
        held, held_text = held_at_step(ctx, placements, batch, length)
        out = (PhaseFigure("forward", resident + figures.forward, "derived, one rank", "", 0, figures.forward),
               PhaseFigure("backward", resident + figures.backward, "derived, one rank", "",
                           figures.gradients_at_backward_peak, figures.backward - figures.gradients_at_backward_peak),
               PhaseFigure("optimizer step", resident + dev.gradients + step_bytes + held, "optimizer step",
                           f"gradients {dev.gradients:,}; {step_text}{held_text}", dev.gradients))
        if whole is not None:
            out = tuple(with_whole_gradient(p, whole) for p in out)
        return tuple(with_norm_gradients(p, norms) for p in out)

    figures = step.recipe.peaks(ctx.batch, ctx.seq)
    phases = phases_at(figures, ctx.batch, ctx.seq)
    for index, phase in enumerate(phases[:2]):
        where = "forward" if index == 0 else "backward"
        phases = phases[:index] + (dataclasses.replace(phase, arithmetic=f"{phase.bytes - resident:,} ("  # its value
            + step.recipe.words(where, ctx.batch, ctx.seq) + ")"),) + phases[index + 1:]
    if ctx.accumulating and fsdp:  # FSDP2's rank: its later micro-step replayed from the recipe (the new gradient
        # shards made beside the held ones until added in), as one device's is; beside tp the whole embedding
        # gradient a rank holds is not held between micro-steps under FSDP2 (whole is None there)
        from ..memory.grad_accum import derived_later

        phases = derived_later(phases, step, ctx.batch, ctx.seq, resident, dev.gradients)
    applied = _derived_applied_words(layout, fsdp, ring_ep, loaded)
    if replicas > 1:
        applied += (f"; hybrid sharding: traced as FSDP2 over the shard group of {layout.shard_degree}, which its "
                    f"{replicas} replicas run alike (--trace runs the (dp_replicate, shard ranks) meshes as "
                    "torchtitan's, the experts' on (dp_replicate, dp_shard_mod_ep))")
    notes = [f"one rank's step derived from traces of the real class on torch's fake process group ({applied}): "
             f"{step.recipe.traced}; {step.recipe.check}"]
    if fsdp and ctx.precision.endswith("-mixed"):
        notes.append(mixed_precision_words(ctx))
    if layout.cp > 1:
        notes.append(ring_words(ctx))
    if loaded:
        # T: the rank's tokens, S / cp on a ring's rank
        notes.append(load_words(layout.ep, layout.expert_load,
                                ctx.batch * (ctx.seq // layout.cp) * dim(ctx.text, "top_k")))
    device = DeviceMemory(layout, dev.weights, dev.gradients + dev.grad_buffer,
                          dev.optimizer, dev.master_weights, ctx.buffer_bytes,
                          figures.end_of_forward, "derived: one rank's step traced on short cuts with the layout "
                          "applied (torch's fake process group), laid out to the model's depth", dev.arithmetic,
                          (), phases, rules, notes=tuple(notes))

    def at(one_device: tuple[PhaseFigure, ...], batch: int, length: int, every: bool = False) -> Any:
        if layout.cp > 1:  # a length 2·cp does not divide runs unbalanced (not derived): the next that it divides
            # bounds it, so the fits table's largest context comes out a multiple of 2·cp (of 2·cp·tp under sp,
            # whose ranks split the rank's S / cp tokens again)
            unit = 2 * layout.cp * (layout.tp if layout.sp else 1)
            length = -(-length // unit) * unit
        point = step.at(batch, length)
        if point is None:
            return (PhaseFigure("backward", 1 << 62, "", ""),) if every else PhaseFigure("backward", 1 << 62, "", "")
        figures = phases_at(point, batch, length)
        if ctx.accumulating and fsdp:  # the later micro-step replayed there too (the fits under accumulation)
            from ..memory.grad_accum import derived_later

            figures = derived_later(figures, step, batch, length, resident, dev.gradients)
        return figures if every else max(figures, key=lambda p: p.bytes)
    return device, at



def _derived_applied_words(layout: ParallelLayout, fsdp: bool, ring_ep: int, loaded: bool) -> str:
    """What the derived rank's traces applied, named: expert parallel alone (beside FSDP2, tp), or the parts beside
    context parallel's ring joined, rank 0 of the ring (the busiest under an uneven load)."""
    if layout.ep > 1 and layout.cp == 1:
        words = f"torchtitan's ExpertParallel over ep {layout.ep}" + (" under FSDP2" if fsdp else "")
        if fsdp and layout.shard_degree > layout.ep:
            words += (f" over dp {layout.shard_degree} (the experts' own unit over the dp / ep = "
                      f"{layout.shard_degree // layout.ep} ranks holding them)")
        return (words + (" beside DTensor tensor parallel" if layout.tp > 1 else "")
                + (" with sequence parallel" if layout.sp else "") + (", rank 0 the busiest" if loaded else ""))
    parts = []
    if fsdp:
        parts.append("FSDP2" + (f" over dp × cp = {layout.shard_degree} ranks" if layout.cp > 1 else ""))
    if ring_ep > 1:
        parts.append(f"torchtitan's ExpertParallel over ep {ring_ep} = dp × cp ranks"
                     if not fsdp or layout.shard_degree == ring_ep else
                     f"torchtitan's ExpertParallel over ep {ring_ep} = dp_shard_in_ep × cp ranks (the experts' own "
                     f"FSDP2 unit over the dp × cp / ep = {layout.shard_degree // ring_ep} ranks holding them)")
    if layout.tp > 1:
        parts.append("DTensor tensor parallel" + (" with sequence parallel" if layout.sp else ""))
    if layout.cp > 1:
        parts.append("torch's context_parallel ring attention" + (" on the tp rank's heads" if layout.tp > 1 else ""))
    ring = ", rank 0" + (", the busiest" if loaded else "") if layout.cp > 1 else ""
    return " and ".join(parts) + ring

def held_at_step(ctx: StepContext, placements: tuple[Placement, ...], batch: int, length: int) -> tuple[int, str]:
    """(bytes, words) the traced rank still holds at its optimizer step beyond its states and gradients:
    - the token ids, int64, 8·B·S/cp, where the rank's inputs enter a DTensor module (the tp plan's replicated input,
      or under ep without FSDP2 the replicated rest): from_local aliases them, so MemTracker tracks them from the
      embedding on, and the batch stays referenced to the step's end (one device's ids, made before the tracker,
      are not seen; nor under FSDP2 or cp alone, where the embedding reads them as they are);
    - each MoE layer's expert offsets, int32, one per expert the rank holds (memory/expert_offsets.py, one device's
      rule too)."""
    layout = ctx.layout
    parts = []
    if layout.tp > 1 or layout.ep > 1 and not fsdp_sharded(layout):
        ids = 8 * batch * (length // layout.cp)
        parts.append((ids, f"the token ids 8·B·S{' / cp' if layout.cp > 1 else ''} = {ids:,} B (the rank's "
                           "DTensor input aliases them)"))
    offsets = expert_offsets(placements, ctx.precision, ctx.own, config=ctx.view.config, local=True)
    if offsets[0]:
        parts.append(offsets)
    if not parts:
        return 0, ""
    return sum(b for b, _ in parts), "; held from the step before: " + ", ".join(w for _, w in parts)


def _sharded_rank_derived(ctx: StepContext, placements: tuple[Placement, ...]) -> bool:
    """No context parallel: FSDP2's rank is derived for every class (its in-backward buffers are in no closed form),
    a tensor-parallel rank for the classes without the closed form on a rank's shard. Under expert parallel (balanced
    routing), where the class has routed experts: the rank of the (ep, tp) mesh beside tp without FSDP2
    (torchtitan's ExpertTensorParallel: each rank's E/ep experts also cut over tp; the key the pipeline's stages and
    the loaded rank trace), and FSDP2's rank over dp ranks ep divides, beside tp or not (torchtitan's
    (dp / ep, ep, tp) mesh, the experts' own unit over dp / ep; under hybrid sharding the shard group's, with
    dp_replicate in front); ep beside DDP or ZeRO 1-2 alone stays one device's step and its dispatch
    (_data_parallel_device)."""
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


def check_context_parallel(ctx: RingQuestion, experts: bool = False) -> None:
    """The context-parallel layouts a derived rank does not answer, each in one line: an encoder, hybrid sharding
    over ranks cp does not divide, cp not dividing S, S that 2·cp does not divide (torch's context_parallel then runs
    unbalanced: not derived), or under sp that 2·cp·tp does not divide, attention dropout, a window shorter than S;
    beside ep where it cuts routed experts (`experts`): what check_ring_beside_experts refuses."""
    from ..dims import config_int

    why = encoder_refusal(ctx) if not getattr(ctx.view, "can_generate", True) else ""
    if why:
        raise UnsupportedError(why)
    cp = ctx.layout.cp
    if fsdp_sharded(ctx.layout) and ctx.layout.shard_degree % cp:
        raise UnsupportedError("context parallel {cp} beside hybrid sharding over {ranks} ranks: torchtitan shards "
                               "over dp_shard × cp ranks, which cp does not divide here", cp=cp,
                               ranks=ctx.layout.shard_degree)
    if experts:
        check_ring_beside_experts(ctx.layout)
    if ctx.seq % cp:
        raise UnsupportedError("context parallelism splits the sequence: cp {cp} does not divide {seq:,}", cp=cp,
                               seq=ctx.seq)
    if ctx.seq % (2 * cp):
        raise UnsupportedError("context parallel {cp} at {seq:,} tokens: torch's context_parallel balances the load "
                               "(two chunks a rank) only where 2·cp divides S, and the rank's step is derived in that "
                               "regime; use a length that 2·cp = {two} divides", cp=cp, seq=ctx.seq, two=2 * cp)
    tp = ctx.layout.tp
    if ctx.layout.sp and ctx.seq % (2 * cp * tp):
        raise UnsupportedError("context parallel {cp} with sequence parallel over tp {tp} at {seq:,} tokens: the tp "
                               "ranks split each of the rank's two chunks again, and the rank's step is derived where "
                               "2·cp·tp = {unit} divides S; use such a length", cp=cp, tp=tp, seq=ctx.seq,
                               unit=2 * cp * tp)
    refuse_attention_dropout(ctx)
    for key in ("sliding_window", "attention_chunk_size"):
        window = config_int(ctx.text, key)
        if window and ctx.seq > window:
            raise UnsupportedError("context parallel at {seq:,} tokens past the {key} {window:,}: torch's ring "
                                   "attention takes no mask, and a window shorter than S needs one", seq=ctx.seq,
                                   key=key, window=window)


def check_ring_beside_experts(layout: ParallelLayout) -> None:
    """The ring beside ep as the trace lays it out (traced/parallel.py, torchtitan's mesh with ETP = tp): the ep ranks
    take every cp rank and some dp ones (ep = dp_shard_in_ep × cp); FSDP2 shards the rest over all dp × cp ranks
    and each rank's experts over the dp × cp / ep ranks holding them (its dp_shard_mod_ep), under hybrid sharding
    within a shard group that ep divides, dp_replicate in front; no ZeRO-3 (not traced), tp (each expert then cut
    over tp too, on the (ep, tp) mesh: torchtitan's ETP) without FSDP2. One line each."""
    cp, ep = layout.cp, layout.ep
    if ep % cp:
        raise UnsupportedError("context parallel {cp} beside ep {ep}: the ep ranks take every cp rank and some dp "
                               "ones (torchtitan's ep = dp_shard_in_ep × cp), so cp must divide ep", cp=cp, ep=ep)
    if layout.tp > 1 and fsdp_sharded(layout):
        raise UnsupportedError("context parallel {cp} beside ep {ep} and tp {tp} under FSDP2: each expert cut over "
                               "tp too (torchtitan's ETP) is traced beside the ring without FSDP2", cp=cp, ep=ep,
                               tp=layout.tp)
    if layout.shard == "zero3":
        raise UnsupportedError("context parallel {cp} beside ep {ep} under {shard}: traced under DDP's replication, "
                               "ZeRO 1-2 and FSDP2's full and hybrid sharding", cp=cp, ep=ep,
                               shard=shard_words(layout))
    _check_ep_in_shard_group(layout, f"context parallel {cp} beside ep {ep} under")


def ring_words(ctx: StepContext) -> str:
    """What torch's ring attention holds on the rank, named: counted in the traced (derived) figures, not added."""
    ring = ring_chunk_bytes(ctx, ctx.batch, ctx.seq)
    cp = ctx.layout.cp
    return (f"context parallel's ring, as torch holds it (in the figures above, traced): each attention's K and V "
            f"of all {cp} ranks all-gathered at once (torch's default rotate method), cp × {ring:,} = "
            f"{cp * ring:,} B while it runs, in forward and again in backward, where the K and V gradients "
            f"pass all-to-all in fp32; the blocks' outputs and log-sum-exps merged in fp32; the rank's "
            f"{ctx.seq // cp:,} tokens in two chunks (head-tail load balancing)")


def _data_parallel_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Data (and expert) parallel alone: each rank runs one device's step on its own batch; the moments are the
    one-device ones with the device's model states, and FSDP2's gathered units. Under FSDP2's MixedPrecisionPolicy
    the one-device moments are autocast's, not the policy's: the recipe's own (bf16-pure's step over the fp32 shards,
    policy_context), as on a rank's shard."""
    from .fsdp_moments import fsdp_backward_moments

    if fsdp_policy(ctx.layout):
        return _sharded_activations_device(ctx, placements, rules)

    states = ctx.states
    # bf16-main-grad: one device's fp32 main-gradient buffer (resident, in no phase's gradients) swapped for the rank's
    full_resident = states.weights.bytes + states.optimizer.bytes + states.master_weights.bytes + grad_buffer(states)
    dev = device_states_of(ctx, placements)
    comm = fsdp_buffers(ctx, placements)
    # under ep the optimizer step holds the rank's own (held_at_step: its E / ep experts' offsets, and the token ids
    # where its replicated rest is a DTensor module), not one device's offsets, which the derived and traced
    # one-device steps count (memory/expert_offsets.py) and the analytic one does not
    one_device = 0 if ctx.source_label.startswith("analytic") else \
        expert_offsets(ctx.report.params, ctx.precision, ctx.own, config=ctx.view.config)[0]

    def shifted(figures: tuple[PhaseFigure, ...], batch: int = ctx.batch,
                length: int = ctx.seq) -> tuple[PhaseFigure, ...]:
        out = []
        for p in figures:
            grads = -(-p.gradients * dev.gradients // states.gradients.bytes) if states.gradients.bytes else 0
            moved = dataclasses.replace(p, bytes=p.bytes - full_resident + dev.weights + dev.optimizer +
                                        dev.master_weights + dev.grad_buffer - p.gradients + grads, gradients=grads)
            if ctx.layout.ep > 1 and p.phase == "optimizer step":
                held, held_text = held_at_step(ctx, placements, batch, length)
                moved = dataclasses.replace(moved, bytes=moved.bytes - one_device + held, arithmetic=(
                    moved.arithmetic.split("; held past the backward: ")[0] + held_text))
            if grads != p.gradients or p.arithmetic.startswith("live at"):
                # the one device's words hold its whole gradients (and a derived moment reads as a polynomial): the
                # rank's moment opens on its own value, so the device's peak line sums to its figure
                swap = (f"; with the rank's gradients {grads:,} in place of one device's {p.gradients:,}"
                        if grads != p.gradients else "")
                own = moved.bytes - resident_bytes(dev, ctx.buffer_bytes)
                moved = dataclasses.replace(moved, arithmetic=f"{own:,} (one device's {moved.arithmetic}{swap})")
            out.append(with_buffers(moved, comm + expert_dispatch(ctx, placements, batch, length)))
        return tuple(out) + fsdp_backward_moments(ctx, placements, batch, length)

    phases = shifted(ctx.phases)
    device = DeviceMemory(ctx.layout, dev.weights, dev.gradients + dev.grad_buffer, dev.optimizer, dev.master_weights,
                          ctx.buffer_bytes, ctx.activations,
                          f"{ctx.source_label}: each rank runs its own batch, as one device does", dev.arithmetic,
                          tuple(comm + expert_dispatch(ctx, placements, ctx.batch, ctx.seq)), phases, rules)

    def at(figures: tuple[PhaseFigure, ...], batch: int, length: int, every: bool = False) -> Any:
        moments = shifted(figures, batch, length)  # every: all of them (a later micro-step's are added to them)
        return moments if every else max(moments, key=lambda p: p.bytes)
    return device, at


def _sharded_activations_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Tensor and context parallel: the device's activations are the recipe's on its own shard."""
    from .fsdp_moments import fsdp_backward_moments

    layout = ctx.layout
    policy = fsdp_policy(layout)
    asked = ctx.precision
    ctx = policy_context(ctx)  # under FSDP2's MixedPrecisionPolicy: bf16-pure's step over the fp32 shards
    what = ("tensor parallelism beside context parallelism" if layout.tp > 1 and layout.cp > 1 else
            "tensor parallelism" if layout.tp > 1 else "context parallelism" if layout.cp > 1 else
            "FSDP2's MixedPrecisionPolicy")
    recipe = check_analytic(ctx, what)
    missing = fsdp_moments_missing(ctx, placements) if policy else ""
    if missing:  # bf16-pure's step without FSDP2's moments would not be the policy's rank
        raise UnsupportedError("{0} policy: its closed form covers Llama, Mistral and Qwen2 (cp without sp or hybrid "
                               "sharding beside it; not ep), and "
                               "here {why}", "fsdp_mixed_precision", why=missing)
    dev = device_states_of(ctx, placements)
    shape = local_shape(ctx, placements)
    tied = tied_bytes(ctx, placements)
    comm = fsdp_buffers(ctx, placements)
    checkpointing = bool(ctx.shape.get("checkpointing"))

    def ring_kept(batch: int, length: int) -> tuple[int, str]:  # recomputed layers keep none to the moments
        return ring_output_copies(ctx, batch, length) if layout.cp > 1 and not checkpointing else (0, "")

    whole = whole_embedding_gradient(ctx, placements)
    norms = sequence_parallel_norm_gradients(ctx)

    def phases_at(batch: int, length: int) -> tuple[PhaseFigure, ...]:
        act = local_activations(ctx, shape, batch, length)
        # a tp rank alone (with or without sp) under full checkpointing: its first and last recomputed layers'
        # backward (the head's vocabulary shard held, the token ids the vocabulary-parallel embedding references)
        alone = layout.tp > 1 and layout.dp == layout.cp == layout.ep == layout.pp == 1
        figures = moment_phases(act, resident=resident_bytes(dev, ctx.buffer_bytes), gradients=dev.gradients, tied=tied,
                                text=ctx.text, batch=batch, length=-(-length // layout.cp), precision=ctx.precision,
                                step=ctx.step, recompute=(layout.tp, 8 * batch * length, layout.sp) if alone else None)
        if whole is not None:
            figures = tuple(with_whole_gradient(p, whole) for p in figures)
        kept = ring_kept(batch, length)
        masked = masked_token_ids(ctx, placements, batch, length)
        # what the traced rank still holds at its step (the token ids its DTensor input aliases; an MoE rank's
        # expert offsets), as the derived rank counts it: the closed form's step was 8·T under the trace without it,
        # and so was its end of backward (the ids are referenced there too: a later micro-step's peak under tp)
        held, held_text = held_at_step(ctx, placements, batch, length)
        figures = tuple(dataclasses.replace(p, bytes=p.bytes + held, arithmetic=p.arithmetic + held_text)
                        if p.where in ("end of backward", "optimizer step") and held else p for p in figures)
        figures = tuple(with_buffers(with_masked_ids(with_ring_outputs(with_norm_gradients(p, norms), kept), masked),
                                     comm) for p in figures)
        return with_head_gather(ctx, placements, figures, batch, length) + \
            fsdp_backward_moments(ctx, placements, batch, length)

    act = local_activations(ctx, shape, ctx.batch, ctx.seq)
    kept = ring_kept(ctx.batch, ctx.seq)
    parts = []
    if layout.tp > 1:
        # past as many ranks as KV heads each rank holds one KV head whole (rules.py's kv-replicated): say so
        parts.append(f"heads and widths / {layout.tp}, the KV heads replicated (one a rank: fewer KV heads than "
                     f"tp {layout.tp}), the hidden size whole" if any(p.tp == "kv-replicated" for p in placements)
                     else f"heads, KV heads and widths / {layout.tp}, the hidden size whole")
    if layout.cp > 1:
        parts.append(f"{ctx.seq // layout.cp:,} of the {ctx.seq:,} tokens (S / {layout.cp})")
    notes: tuple[str, ...] = ()
    if policy:
        half = asked.split("-")[0]
        parts.append(f"{half} throughout over its fp32 shards, as FSDP2's MixedPrecisionPolicy runs it: each unit "
                     f"gathered in {half}, no autocast; bf16-pure's recipe")
        notes += (mixed_precision_words(dataclasses.replace(ctx, precision=asked)),)
    if layout.cp > 1:
        notes += ("context parallel's closed form: the one-device recipe at S / cp tokens, and what torch's ring "
                  "attention keeps beyond it, its merged output copied for o_proj in each layer (where 2·cp divides "
                  "S the balanced merge leaves it heads-major); the ring's other buffers (every rank's K and V "
                  "all-gathered, the fp32 merge, the backward's fp32 dq/dk/dv and their all-to-all) are freed inside "
                  "each attention, under the logits' moments, and not counted. Held to the rank traced on torch's "
                  "ring (cost/traced/context_parallel.py): an 8-layer Llama cut, cp 2 and 4, B 2 and 4, 2,048 and "
                  "4,096 tokens, equal to it at the end of forward and the start of backward); beside --tp or --sp "
                  "not traced (the traced "
                  "ring runs alone); --cp alone answers with the rank derived from that ring" + (
                      "; with checkpointing the recomputed layer's copy is not counted" if checkpointing else ""),)
    if layout.sp:
        size = 2 if ctx.precision == "bf16-pure" else 4
        gathered = ctx.batch * (-(-ctx.seq // layout.cp)) * hidden_size(ctx) * size
        notes += (f"sequence parallel: each attention and MLP block all-gathers the whole sequence of the norm's "
                  f"output it reads, B·S·h × {size} B = {gathered:,} B a block while it runs, and torch keeps what "
                  "the column-parallel matmuls read of it (autocast's 16-bit casts under mixed precision) for their "
                  "weights' gradients: counted with the saved activations (Megatron gathers it again in backward "
                  "instead)",)
    device = DeviceMemory(layout, dev.weights, dev.gradients + dev.grad_buffer,
                          dev.optimizer, dev.master_weights, ctx.buffer_bytes,
                          act.saved + kept[0], f"analytic: {recipe} on the rank's shard ({'; '.join(parts)})",
                          dev.arithmetic, tuple(comm), phases_at(ctx.batch, ctx.seq), rules, notes=notes)

    def at(figures: tuple[PhaseFigure, ...], batch: int, length: int, every: bool = False) -> Any:
        moments = phases_at(batch, length)  # every: all of them (a later micro-step's are added to them)
        return moments if every else max(moments, key=lambda p: p.bytes)
    return device, at


def layout_settings(layout: ParallelLayout) -> dict[str, Any]:
    return {"devices": layout.devices, "dp": layout.dp, "shard": layout.shard, "shard_words": shard_words(layout),
            "shard_degree": layout.shard_degree, "tp": layout.tp, "sp": layout.sp, "pp": layout.pp,
            "micro_batches": layout.micro_batches, "schedule": layout.schedule,
            "virtual_stages": layout.virtual_stages, "ep": layout.ep, "cp": layout.cp,
            "expert_load": layout.expert_load, "fsdp_mixed_precision": layout.fsdp_mixed_precision,
            "words": layout.words()}
