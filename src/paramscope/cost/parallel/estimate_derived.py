"""One rank's training step under a layout derived from traces: closed forms in B and S from traces of short cuts of
the real class with the layout applied on torch's fake process group (derived/), composed with the rank's exact
model states (derived_device); what those traces applied, and what torch's ring holds on a context-parallel rank,
in words. estimate.layout_device asks it where the layout is derivable, the closed form beside it as the check.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import ParamscopeError
from ..memory.phases import PhaseFigure
from .device import DeviceMemory, StepContext, NEEDS_BUILD
from .device_parts import (
    device_states_of, fsdp_sharded, resident_bytes, ring_chunk_bytes, sequence_parallel_norm_gradients,
    whole_embedding_gradient, with_norm_gradients, with_whole_gradient
)
from .estimate_checks import mixed_precision_words
from .estimate_closed_form import held_at_step
from .layout import ParallelLayout
from .rules import Placement, cuts_routed_experts
from .trace_reach import hybrid_replicas


def derived_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
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


def ring_words(ctx: StepContext) -> str:
    """What torch's ring attention holds on the rank, named: counted in the traced (derived) figures, not added."""
    ring = ring_chunk_bytes(ctx, ctx.batch, ctx.seq)
    cp = ctx.layout.cp
    return (f"context parallel's ring, as torch holds it (in the figures above, traced): each attention's K and V "
            f"of all {cp} ranks all-gathered at once (torch's default rotate method), cp × {ring:,} = "
            f"{cp * ring:,} B while it runs, in forward and again in backward, where the K and V gradients "
            f"pass all-to-all in fp32; the blocks' outputs and log-sum-exps merged in fp32; the rank's "
            f"{ctx.seq // cp:,} tokens in two chunks (head-tail load balancing)")
