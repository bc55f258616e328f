"""One device's training step under a layout from closed forms: data (and expert) parallel alone, each rank one
device's step on its own batch with the rank's states (data_parallel_device), and a tensor or context-parallel rank,
the family's recipe on its shard (sharded_activations_device); what the traced rank still holds at its optimizer step
beyond its states (held_at_step), which the derived rank counts too (estimate_derived.py). estimate.layout_device
chooses between them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import UnsupportedError
from ..memory.expert_offsets import expert_offsets
from ..memory.states import grad_buffer
from ..memory.phases import PhaseFigure, moment_phases
from .device import DeviceMemory, StepContext
from .device_parts import (
    check_analytic, device_states_of, expert_dispatch, fsdp_buffers, fsdp_policy, fsdp_sharded,
    hidden_size, local_activations, local_shape, policy_context, resident_bytes, ring_output_copies,
    sequence_parallel_norm_gradients, tied_bytes, whole_embedding_gradient, with_buffers, with_norm_gradients,
    with_ring_outputs, with_whole_gradient, masked_token_ids, with_masked_ids, with_head_gather
)
from .estimate_checks import mixed_precision_words
from .fsdp_moments import fsdp_moments_missing
from .rules import Placement


def data_parallel_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Data (and expert) parallel alone: each rank runs one device's step on its own batch; the moments are the
    one-device ones with the device's model states, and FSDP2's gathered units. Under FSDP2's MixedPrecisionPolicy
    the one-device moments are autocast's, not the policy's: the recipe's own (bf16-pure's step over the fp32 shards,
    policy_context), as on a rank's shard."""
    from .fsdp_moments import fsdp_backward_moments

    if fsdp_policy(ctx.layout):
        return sharded_activations_device(ctx, placements, rules)

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


def sharded_activations_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
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


def token_ids_held(ctx: StepContext, batch: int, length: int) -> tuple[int, str]:
    """(bytes, words) of the token ids the traced rank holds at its optimizer step, int64, 8·B·S/cp, where its inputs
    enter a DTensor module (held_at_step's first term; a pipeline's first stage holds them too,
    pipeline_replay.derived_pipeline_device); (0, "") elsewhere."""
    layout = ctx.layout
    if not (layout.tp > 1 or layout.ep > 1 and not fsdp_sharded(layout)):
        return 0, ""
    ids = 8 * batch * (length // layout.cp)
    return ids, (f"the token ids 8·B·S{' / cp' if layout.cp > 1 else ''} = {ids:,} B (the rank's DTensor input "
                 "aliases them)")


def held_at_step(ctx: StepContext, placements: tuple[Placement, ...], batch: int, length: int) -> tuple[int, str]:
    """(bytes, words) the traced rank still holds at its optimizer step beyond its states and gradients:
    - the token ids, int64, 8·B·S/cp, where the rank's inputs enter a DTensor module (the tp plan's replicated input,
      or under ep without FSDP2 the replicated rest): from_local aliases them, so MemTracker tracks them from the
      embedding on, and the batch stays referenced to the step's end (one device's ids, made before the tracker,
      are not seen; nor under FSDP2 or cp alone, where the embedding reads them as they are);
    - each MoE layer's expert offsets, int32, one per expert the rank holds (memory/expert_offsets.py, one device's
      rule too)."""
    parts = []
    ids = token_ids_held(ctx, batch, length)
    if ids[0]:
        parts.append(ids)
    offsets = expert_offsets(placements, ctx.precision, ctx.own, config=ctx.view.config, local=True)
    if offsets[0]:
        parts.append(offsets)
    if not parts:
        return 0, ""
    return sum(b for b, _ in parts), "; held from the step before: " + ", ".join(w for _, w in parts)
