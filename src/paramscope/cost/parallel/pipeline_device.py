"""A training step's devices under a pipeline, for the Llama-style family: the analytic recipe's layers × the
microbatches in flight on each stage, its embeddings or head and its point-to-point buffers; the stage with the largest
peak is the device's answer. Any other class's stages are replayed from its derived step (pipeline_replay.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..memory.phases import PhaseFigure, moment_phases
from .device import Buffer, StageMemory, DeviceMemory, StepContext
from .device_parts import (
    check_analytic, device_states_of, fsdp_buffers, fsdp_sharded, layer_runs, local_activations, local_recipe_missing,
    local_shape, matmul_names, policy_context, resident_bytes, ring_output_copies, tied_bytes, with_buffers, with_ring_outputs
)
from .pipeline_replay import (
    UNSYNCED, derived_pipeline_device, fsdp_beside, unsynced_buffer, unsynced_gradients, with_unsynced_gradients
)
from .pipeline import (
    Stage, after_layers, bubble, interleaved_order, layer_of, layer_stack_of, layers_in_flight, params_held, split_words,
    stages
)
from .rules import Placement
from .states import DeviceStates, stage_step
from ..dtypes import itemsize
from ..memory.states import trained_dtype


# FSDP2's MixedPrecisionPolicy with the derivation off (the layout search): the closed form over bf16-pure's stages
POLICY_CLOSED_FORM = (
    "FSDP2's MixedPrecisionPolicy (--fsdp-mixed-precision policy) with the derivation off (the layout search): each "
    "stage as bf16-pure's closed form (no autocast: the layers run on 16-bit parameters, no weight copies) over the "
    "rank's fp32 shards, its units gathered in 16 bits; an estimate: FSDP2's moments inside a layer's backward (its "
    "fp32 reduce-scatter input) are not among a stage's (every unit gathered and the gradients unsharded, as the "
    "pipeline's FSDP2 holds them, are: pipeline_replay.UNSYNCED); memory derives the stages instead, replaying the "
    "policy's FSDP2 rank (on a 4-layer Llama cut, dp 2 × pp 2, 2 × 64: the last stage 8 B over it, the first "
    "455,680 B over it; "
    "tests/test_policy_pipeline_search.py); beside tensor parallel it lies under the replay (tp's layers and the "
    "backward's moments: on the cut at dp 2 × tp 2 × pp 2, 2 × 64, the first stage 788,992 B under; llama-3-70b, dp 2 "
    "× tp 8 × pp 4, 1,393,735,680 B under), so the layout search replays the tp rank's stages there as memory does "
    "(layout_evaluation.policy_derived; tests/test_policy_pipeline_tp_search.py)")

# beside context parallel memory answers with that closed form too: the replay reaches no cp rank under the policy
POLICY_BESIDE_CP = (
    "beside context parallel the derived replay reaches no cp rank under FSDP2's MixedPrecisionPolicy, so memory "
    "answers with the closed form above too, an estimate: each stage's layers on the cp rank's S / cp tokens with "
    "the ring's kept copies, held to the traced ring without a pipeline (tests/test_policy_context_parallel.py), not "
    "traced beside one")

# the last stage's loss, kept in its cache until its backward, and the total weight cross-entropy saves for it: two
# fp32 scalars a microbatch (measured on the stage's trace)
LOSS_SCALARS = 8
# the loss once its microbatch's backward is done: torch's schedule keeps each to the step's end and hands them back
# (step(losses=...)); torchtitan holds their mean through the optimizer step (pipeline_replay.kept_losses): one fp32
# scalar each (a Llama's graph nodes hold nothing past their backward)
LOSS_KEPT = 4


def _stage_saved_words(arithmetic: str, act: Any, layers: int, in_flight: int, kept: int, saved: int,
                       outside_words: str, copy_words: str) -> str:
    """A one-device moment's words for the last stage: the one device's "saved X" (every layer, one batch) replaced
    by what this stage saves (`saved`: its layers' `kept`, the terms outside them, its weight copies), with its
    terms, so that the words sum to the stage's figure."""
    held = f"{in_flight} microbatch{'es' if in_flight > 1 else ''} in flight × this stage's {layers} layers of {act.layers}"
    words = (f"saved {saved:,} ({held} × {act.per_layer:,} B a layer = {kept:,}; {outside_words}"
             + (f"; {copy_words}" if copy_words else "") + ")")
    one_device = f"saved {act.saved:,}"
    if arithmetic.startswith(one_device):
        return words + arithmetic[len(one_device):]
    # a moment whose words do not open on the one device's saved bytes: the stage's difference, added
    return f"{arithmetic} + this stage's {words} − the one device's {one_device}"


def mlp_backward_working(precision: str, tokens: int, hidden: int, inner: int) -> tuple[int, str]:
    """(bytes, words) a Llama layer's backward holds above what it began with (its output's gradient, every
    microbatch's saved tensors, every gradient) at its MLP's largest moment, a later backward (each weight's
    gradient added into its .grad at once, then freed): down_proj's backward makes its weight's gradient (h × i)
    and its input's (T × i), then frees its saved input; the gated product's backward makes the gradients of its two
    factors (T × i each) and frees theirs. Under autocast the output's gradient is first cast to 16 bits (2·T·h),
    the weight's gradient is made in 16 bits and cast to fp32 for its .grad (4·h·i, after down_proj's 16-bit
    weight copy and input are freed). Traced: torch's MemTracker on a Llama stage, the moment to the byte (the
    full-size llama-3-8b middle stage at 4,096 tokens, and 1-layer cuts in fp32 and mixed precision; in bf16-pure
    on a narrow MLP, i < 2h, the post-attention norm's fp32 backward rises above it)."""
    t, h, i = tokens, hidden, inner
    if precision == "fp32":
        moments = ((4 * h * i + 4 * t * i, "down_proj's weight and input gradients 4·h·i + 4·T·i"),
                   (8 * t * i, "the gated product's two gradients beside its own, its saved input freed, 8·T·i"))
    elif precision == "bf16-pure":
        moments = ((2 * h * i + 2 * t * i, "down_proj's weight and input gradients 2·h·i + 2·T·i"),
                   (4 * t * i, "the gated product's two gradients beside its own, its saved input freed, 4·T·i"))
    else:
        moments = ((2 * t * h + 2 * h * i + 2 * t * i, "the output's gradient cast to 16 bits and down_proj's 16-bit "
                    "weight and input gradients 2·T·h + 2·h·i + 2·T·i"),
                   (4 * h * i, "down_proj's weight gradient cast to fp32, 4·h·i, its 16-bit copy and input freed"),
                   (4 * t * i - 2 * h * i, "the gated product's two gradients beside its own, its saved input and "
                    "down_proj's 16-bit weight copy freed, 4·T·i − 2·h·i"))
    value, words = max(moments, key=lambda m: m[0])
    return value, f"{words} = {value:,}"


def mlp_first_backward_working(precision: str, tokens: int, hidden: int, inner: int) -> tuple[int, str]:
    """(bytes, words) the top layer's MLP holds above what the stage began its first backward with (its output's
    gradient, its microbatches' saved tensors, no gradient yet): mlp_backward_working's moments, with down_proj's
    weight gradient kept as its .grad (a first backward makes each .grad and keeps it; a later one adds it in and
    frees it). fp32 4·h·i + 8·T·i, bf16-pure 2·h·i + 4·T·i, mixed max(2·T·h + 2·h·i + 2·T·i, 4·h·i, 4·T·i + 2·h·i).
    Traced: trace_stage's first backward on Llama cuts' first and middle stages (T 64, h 32, i 48 and 96), to the
    byte; where a layer's weights outweigh its tokens (T ≪ h) the layer's later moments, with more of its gradients
    made, rise above it (a 1-layer middle stage at T 8, h 32, i 48: 4,192 B under), and in bf16-pure on a narrow
    MLP (i < 2h) the post-attention norm's (1,856 B under at T 64)."""
    t, h, i = tokens, hidden, inner
    if precision == "fp32":
        moments = ((4 * h * i + 4 * t * i, "down_proj's weight and input gradients 4·h·i + 4·T·i"),
                   (4 * h * i + 8 * t * i, "down_proj's weight gradient kept as its .grad and the gated product's "
                    "two gradients beside its own, its saved input freed, 4·h·i + 8·T·i"))
    elif precision == "bf16-pure":
        moments = ((2 * h * i + 2 * t * i, "down_proj's weight and input gradients 2·h·i + 2·T·i"),
                   (2 * h * i + 4 * t * i, "down_proj's weight gradient kept as its .grad and the gated product's "
                    "two gradients beside its own, its saved input freed, 2·h·i + 4·T·i"))
    else:
        moments = ((2 * t * h + 2 * h * i + 2 * t * i, "the output's gradient cast to 16 bits and down_proj's 16-bit "
                    "weight and input gradients 2·T·h + 2·h·i + 2·T·i"),
                   (4 * h * i, "down_proj's weight gradient cast to fp32 for its .grad, 4·h·i, its 16-bit copy and "
                    "input freed"),
                   (4 * t * i + 2 * h * i, "down_proj's fp32 .grad kept and the gated product's two gradients beside "
                    "its own, its saved input and down_proj's 16-bit weight copy freed, 4·h·i + 4·T·i − 2·h·i"))
    value, words = max(moments, key=lambda m: m[0])
    return value, f"{words} = {value:,}"


# the precisions whose draining stages are priced moment by moment (held to trace_stage's first and later backward)
DRAIN_PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16-pure")


def _without_other_stages_keys(moment: Any, ctx: StepContext, layers: int, here: int, tokens: int) -> Any:
    """The end of forward on the last stage: under autocast the one device's moment holds the training KV cache's
    fp32 keys of every layer as the loss is taken (layout.causal_loss_working); the stage's forward builds a cache
    of its own layers only (the head's chunk's, interleaved), so the other layers' keys are taken out. Tensor and
    context parallel keep the one device's words (no trace of those stages holds them)."""
    from ..dims import config_int

    if moment.where != "end of forward" or not ctx.precision.endswith("-mixed") or ctx.shape.get("checkpointing") \
            or ctx.layout.tp > 1 or ctx.layout.cp > 1 or "KV cache's fp32 keys" not in moment.arithmetic:
        return moment
    heads = config_int(ctx.text, "num_attention_heads") or 1
    head_dim = config_int(ctx.text, "head_dim") or (config_int(ctx.text, "hidden_size") or 0) // heads
    kv = (config_int(ctx.text, "num_key_value_heads") or heads) * head_dim
    other = (layers - here) * 4 * tokens * kv
    return dataclasses.replace(moment, bytes=moment.bytes - other, arithmetic=moment.arithmetic + (
        f" − the KV cache's keys of the {layers - here} layers on other stages, {layers - here} × 4·T·kv = {other:,}"
        " (the stage's cache holds its own layers')"))


def _head_words(arithmetic: str, act: Any, saved: int, chunk_words: str) -> str:
    """An interleaved last stage's moment: the one device's "saved X" replaced by what the rank holds at its head's
    moments (`saved`: its chunk-microbatches along torch's order, `chunk_words` naming them)."""
    one_device = f"saved {act.saved:,}"
    words = f"saved {saved:,} (at the head's moments, the {chunk_words})"
    if arithmetic.startswith(one_device):
        return words + arithmetic[len(one_device):]
    return f"{arithmetic} + this stage's {words} − the one device's {one_device}"


def pipeline_device(ctx: StepContext, placements: tuple[Placement, ...], rules: dict[str, str]):
    """Pipeline stages: each device's layers, embeddings or head, and the microbatches it holds at once."""
    layout = ctx.layout
    # no closed form on a stage's layers: the derived recipe's segments; and under FSDP2's MixedPrecisionPolicy,
    # whose stages replay the policy's FSDP2 rank (this closed form prices autocast's per-microbatch copies)
    policy = layout.fsdp_mixed_precision == "policy" and fsdp_sharded(layout)
    # (the replay reaches no cp rank under the policy: there the closed form answers, derived or not, an estimate)
    if local_recipe_missing(ctx) or policy and ctx.derive and layout.cp == 1:
        return derived_pipeline_device(ctx, placements, rules)
    if policy:  # the derivation off (the layout search): the closed form over bf16-pure's stages (policy_context)
        ctx = policy_context(ctx)
    recipe = check_analytic(ctx, "pipeline parallelism")
    names = [p.name for p in ctx.report.params]
    stack, count = layer_stack_of(names)
    plan = stages(layout, count)
    micro = ctx.batch // layout.micro_batches
    shape_all = local_shape(ctx, placements)
    by_name = {p.name: p for p in placements}
    tied_name = next((g.canonical for g in ctx.report.tied), None)
    residual = 2 if ctx.precision == "bf16-pure" else 4
    from ..dims import config_int

    h = config_int(ctx.text, "hidden_size") or 0
    heads = config_int(ctx.text, "num_attention_heads") or 1
    head_dim = config_int(ctx.text, "head_dim") or h // heads
    figures_by_stage: list[tuple[Stage, DeviceStates, tuple[PhaseFigure, ...], int]] = []

    params_of: dict[int, list] = {}
    matmuls = matmul_names(ctx) if ctx.precision.endswith("-mixed") else frozenset()
    casts_of: dict[int, int] = {}
    # the 16-bit copies of each layer's matmul weights (an interleaved rank's chunks hold their own layers')
    layer_casts: dict[int, int] = {}

    def stage_params(stage: Stage) -> list:
        if stage.rank in params_of:
            return params_of[stage.rank]
        out = params_of[stage.rank] = params_held(ctx.report.params, stack, stage)
        casts_of[stage.rank] = 2 * sum(by_name[p.name].local_numel for p in out if p.name in matmuls)
        for p in out:
            index = layer_of(p.name, stack)
            if index is not None and p.name in matmuls:
                layer_casts[index] = layer_casts.get(index, 0) + 2 * by_name[p.name].local_numel
        return out

    def chunk_runs(stage: Stage) -> list[tuple[int, ...]]:
        runs, at = [], 0
        for size in stage.chunk_layers:
            runs.append(stage.layers[at:at + size])
            at += size
        return runs

    def interleaved_held(stage: Stage, each: list[int]) -> tuple[int, int, str]:
        """(the most bytes the rank holds at once along torch's ScheduleInterleaved1F1B order, the most at a moment of
        its last chunk's forward end or backward start, the counts there in words): each chunk-microbatch in flight
        holds its chunk's `each` bytes, a forward's from its end, a backward's to its start (pipeline.layers_in_flight's
        walk, in bytes)."""
        counts = [0] * len(each)
        most = head = 0
        words = ""
        for kind, chunk in interleaved_order(layout, stage.rank):
            if kind == "F":
                counts[chunk] += 1
            held_now = sum(n * size for n, size in zip(counts, each))
            if held_now > most:
                most = held_now
                words = " + ".join(f"{n} × {size:,}" for n, size in zip(counts, each) if n)
            if chunk == len(each) - 1:
                head = max(head, held_now)
            if kind == "B":
                counts[chunk] -= 1
        return most, head, words

    def stage_figures(stage: Stage, dev: DeviceStates, batch: int, length: int) -> tuple[tuple[PhaseFigure, ...], int]:
        figures, held = closed_figures(stage, dev, batch, length)
        return tuple(with_unsynced_gradients(f, whole_of[stage.rank], dev.gradients, comm_of[stage.rank])
                     for f in figures), held

    def closed_figures(stage: Stage, dev: DeviceStates, batch: int, length: int
                       ) -> tuple[tuple[PhaseFigure, ...], int]:
        act = local_activations(ctx, shape_all, batch, length)
        local_len = -(-length // layout.cp)
        # the layer-microbatches held: interleaved, each chunk-microbatch its own chunk's layers, counted along
        # torch's order (the most at once; at the head's moments on the last stage)
        most, _, first_chunk = layers_in_flight(layout, stage)
        interleaved = layout.virtual_stages > 1
        kept = most * act.per_layer
        # context parallel: what torch's ring keeps beyond the recipe at S / cp tokens, its merged output copied for
        # o_proj, one a layer (ring_output_copies, as without a pipeline), for each microbatch in flight
        ring, ring_words = ring_kept(stage, batch, length)
        kept += ring
        stage_params(stage)
        # the 16-bit weight copies: each microbatch's forward runs under its own autocast, whose copies of the
        # matmul weights it reads (the layers' and the head's; not the embeddings' or norms', which autocast does not
        # cast) are saved for that microbatch's backward, so each microbatch in flight holds its own (interleaved:
        # each chunk-microbatch its chunk's, counted below)
        mixed = ctx.precision.endswith("-mixed")
        copies = casts_of[stage.rank] * stage.in_flight if mixed and not interleaved else 0
        copy_words = (f"the 16-bit weight copies each microbatch's autocast keeps, {stage.in_flight} × "
                      f"{casts_of[stage.rank]:,} = {copies:,}")
        all_casts = 2 * shape_all["cast_weights"] if ctx.precision.endswith("-mixed") else 0
        resident = resident_bytes(dev, ctx.buffer_bytes)
        # a hidden state a microbatch, the rank's tokens (its sequence shard under sequence parallel): the stage's
        # cache holds each microbatch's input and output for its backward (PipelineStage's fwd_cache). In fp32 and
        # mixed precision the received input is the very tensor its first layer's norm saves (the recipe's layer
        # counts it); in bf16-pure the norm saves an fp32 copy, and the 16-bit input is held beside it
        received = residual * batch * (local_len // (layout.tp if layout.sp else 1)) * h
        input_kept = received if ctx.precision == "bf16-pure" and not stage.first else 0
        # the first stage runs the model's forward, which makes the rotary tables (cos and sin, 1 × S × head_dim,
        # fp32 but in bf16-pure) for each microbatch; a later stage takes them with its input (torchtitan's stages
        # hold them as buffers), so its recipe's outside terms lose them
        rotary = 2 * (2 if ctx.precision == "bf16-pure" else 4) * local_len * head_dim
        one_outside = act.saved - act.layers * act.per_layer - all_casts
        chunk_words = ""
        if interleaved:
            # each chunk-microbatch in flight holds its chunk's layers' saved bytes and 16-bit copies (each forward of
            # each chunk its own autocast region) and, as a stage of its own: the model's first chunk its output and
            # the rotary tables its forward makes, a later chunk its output in the cache (in bf16-pure its received
            # 16-bit input too), the model's last chunk the head's copies and what the head's forward keeps (its
            # loss), walked along torch's order
            each, parts = [], []
            runs = chunk_runs(stage)
            for c, run in enumerate(runs):
                head_chunk = stage.last and c == len(runs) - 1
                casts = sum(layer_casts.get(i, 0) for i in run) + \
                    (casts_of[stage.rank] - sum(layer_casts.get(i, 0) for i in stage.layers) if head_chunk else 0)
                # (a chunk that receives its input keeps it in bf16-pure, on the first rank too)
                kept_input = received if ctx.precision == "bf16-pure" and run[0] != 0 else 0
                extra = (one_outside - rotary + LOSS_SCALARS + kept_input if head_chunk else
                         residual * batch * local_len * h + rotary if run[0] == 0 else received + kept_input)
                each.append(len(run) * act.per_layer + (casts if mixed else 0) + extra)
                parts.append(f"chunk {c} (layers {run[0]}–{run[-1]}): {len(run)} × {act.per_layer:,}"
                             + (f" + its 16-bit copies {casts:,}" if mixed and casts else "")
                             + (f" + the head's outside terms less the rotary tables, with the loss, {extra:,}"
                                if head_chunk else f" + its output and the rotary tables {extra:,}" if run[0] == 0
                                else f" + its output in the cache{' and received 16-bit input' if kept_input else ''}"
                                f" {extra:,}") + f" = {each[-1]:,}")
            held_most, held_head, counts = interleaved_held(stage, each)
            chunk_words = (f"chunk-microbatches in flight along torch's interleaved order, each its chunk's bytes "
                           f"({'; '.join(parts)}), the most at once {counts}")
        if stage.last:
            tied_copy = tied_bytes(ctx, placements) if tied_name and layout.pp > 1 else 0
            outside = one_outside
            outside_words = f"outside the layers {outside:,}"
            if not interleaved and not stage.first:
                # each microbatch's forward runs to its loss (the stage's cache keeps it, with cross-entropy's
                # total weight: two fp32 scalars), all of it held until its backward
                one = outside
                outside = stage.in_flight * (one - rotary + LOSS_SCALARS + input_kept)
                outside_words = (f"outside the layers {stage.in_flight} × ({one:,} − the rotary tables {rotary:,} + "
                                 f"the loss and cross-entropy's total weight {LOSS_SCALARS}"
                                 + (f" + the received 16-bit hidden state {input_kept:,}" if input_kept else "")
                                 + f") = {outside:,}")
            # the head's moments: its layer-microbatches there (interleaved: along torch's order), the ring's
            # copies added apart (with_ring_outputs)
            layer_bytes = most * act.per_layer
            saved = layer_bytes + outside + copies if not interleaved else held_head
            moments = tuple(dataclasses.replace(
                m, bytes=m.bytes - act.saved + saved,
                arithmetic=_stage_saved_words(m.arithmetic, act, len(stage.layers), stage.in_flight, layer_bytes,
                                              saved,
                                              outside_words, copy_words if copies else "")
                if not interleaved else _head_words(m.arithmetic, act, saved, chunk_words))
                for m in act.moments)
            moments = tuple(_without_other_stages_keys(m, ctx, act.layers, stage.chunk_layers[-1] if interleaved
                                                       else len(stage.layers), batch * local_len) for m in moments)
            figures = moment_phases(dataclasses.replace(act, moments=moments), resident=resident,
                                    gradients=dev.gradients, tied=tied_copy, text=ctx.text, batch=batch,
                                    length=local_len, precision=ctx.precision, step=stage_step(ctx, dev))
            # the first moments hold the stage's gradients too once a microbatch has gone back (1F1B's steady
            # state): the largest of the two. GPipe runs every forward first: its first backward's moments hold no
            # gradient yet, and a later backward's start every gradient beside one microbatch fewer
            if layout.schedule == "gpipe" and layout.micro_batches > 1:
                start = next(f for f in figures if f.where == "start of backward")
                one = saved // stage.in_flight
                figures += (dataclasses.replace(
                    start, bytes=start.bytes + dev.gradients - one, where="later backward", gradients=dev.gradients,
                    arithmetic=f"{start.arithmetic}; at a later backward's start, gradients {dev.gradients:,} "
                    f"(made by the backwards before it) − the microbatch gone back {one:,}"),)
            elif stage.in_flight > 1 or layout.micro_batches > 1:
                figures = tuple(dataclasses.replace(f, bytes=f.bytes + dev.gradients, gradients=dev.gradients,
                                                    arithmetic=f.arithmetic + f"; gradients {dev.gradients:,} "
                                                    "(accumulated over the microbatches already gone back)")
                                if f.where in ("end of forward", "start of backward") else f for f in figures)
            # and the losses of the microbatches gone back (M − 1 at the last forward, 1F1B; none before GPipe's
            # backwards); at the optimizer step their mean
            gone = (layout.micro_batches - 1) * LOSS_KEPT if layout.schedule != "gpipe" else 0
            figures = tuple(dataclasses.replace(f, bytes=f.bytes + gone, arithmetic=f.arithmetic + f"; the losses of "
                                                f"the microbatches gone back, kept by torch's schedule, "
                                                f"{layout.micro_batches - 1} × {LOSS_KEPT} B = {gone:,}")
                            if gone and f.where in ("end of forward", "start of backward") else
                            dataclasses.replace(f, bytes=f.bytes + LOSS_KEPT, arithmetic=f.arithmetic + "; the "
                                                f"losses' mean torchtitan holds, {LOSS_KEPT} B")
                            if f.phase == "optimizer step" else f for f in figures)
            figures = tuple(with_ring_outputs(f, (ring, ring_words)) for f in figures)
            return (tuple(with_buffers(p, comm_of[stage.rank]) for p in figures),
                    kept + outside + copies if not interleaved else held_most + ring)
        embedding = first_chunk * residual * batch * local_len * h if stage.first and not interleaved else 0
        incoming = residual * batch * local_len * h
        tables = stage.in_flight * rotary if stage.first and not interleaved else 0
        inputs = stage.in_flight * (received + input_kept) if not stage.first and not interleaved else 0
        held = kept + embedding + tables + inputs + copies if not interleaved else held_most + ring
        words = (f"{stage.in_flight} microbatch{'es' if stage.in_flight > 1 else ''} in flight × "
                 f"{len(stage.layers)} layers × {act.per_layer:,} B a layer" + (f" + {ring_words}" if ring else "")
                 + f" = {kept:,}" if not interleaved else
                 f"{chunk_words} = {held_most:,}" + (f" + {ring_words}" if ring else ""))
        words = (words
                 + (f" + the embedding output {residual}·b·S·h each, {embedding:,}" if embedding else "")
                 + (f" + the rotary tables each microbatch's forward makes, {stage.in_flight} × 2·S·head_dim × "
                    f"{rotary // (2 * local_len * head_dim)} B = {tables:,}" if tables else "")
                 + (" + the output each microbatch's cache holds" + (" and its received 16-bit input" if input_kept
                                                                     else "")
                    + f", {stage.in_flight} × {received + input_kept:,} = {inputs:,}" if inputs else "")
                 + (f" + {copy_words}" if copies else "")
                 + f" + the gradient arriving from the next stage {incoming:,} + gradients {dev.gradients:,}")
        # 1F1B's steady state (more microbatches than the stage holds): a backward with every gradient already
        # made, its microbatches in flight (the one going back included) and the top layer's MLP backward moment
        # above them (mlp_backward_working, held to the stage's trace); a stage that runs every forward first (GPipe,
        # a 1F1B stage that only drains) its real moments (draining_figures); elsewhere (interleaved, tensor or
        # context parallel, FSDP2 beside, whose stages no trace has held it to) the figure takes every gradient
        # beside every microbatch, an estimate
        steady_state = layout.schedule == "1f1b" and layout.micro_batches > stage.in_flight and \
            layout.tp == 1 and layout.cp == 1
        working, working_words = mlp_backward_working(
            ctx.precision, batch * local_len, h, config_int(ctx.text, "intermediate_size") or 0) \
            if steady_state else (0, "")
        if working:
            words += f" + the top layer's MLP backward moment: {working_words}"
        steady = PhaseFigure("backward", resident + held + incoming + dev.gradients + working, "1F1B steady state" if
                             layout.schedule != "gpipe" else "first backward", words, dev.gradients)
        emb = embedding_gradient(stage) if steady_state else 0
        others = (stage.in_flight - 1) * (held // stage.in_flight)
        if emb and resident + others + dev.gradients + emb + 3 * incoming > steady.bytes:
            # a vocabulary outweighing a microbatch's layers: the steady state's backward peaks as it reaches the
            # embedding, its new gradient beside the .grad it is added into (draining_figures' later moment)
            steady = PhaseFigure(
                "backward", resident + others + dev.gradients + emb + 3 * incoming, "1F1B steady state",
                f"the {stage.in_flight - 1} other microbatches held, {others:,} + gradients {dev.gradients:,} + the "
                f"embedding's new gradient {emb:,} beside its .grad, added in place + three hidden states' gradients "
                f"3·{residual}·B·S·h = {3 * incoming:,}, as a later backward reaches the embedding", dev.gradients)
        step_bytes, step_text = stage_step(ctx, dev)
        step = PhaseFigure("optimizer step", resident + dev.gradients + step_bytes, "optimizer step",
                           f"gradients {dev.gradients:,}; {step_text}", dev.gradients)
        drain = draining_figures(stage, dev, batch, local_len, held, incoming, words, resident) \
            if not interleaved else ()
        if drain:
            return tuple(with_buffers(f, comm_of[stage.rank]) for f in drain) + (step,), held
        return (with_buffers(steady, comm_of[stage.rank]), step), held

    def embedding_gradient(stage: Stage) -> int:
        """The bytes of the gradient the first stage's embedding backward makes (0 elsewhere, or frozen)."""
        if not stage.first:
            return 0
        return sum(by_name[p.name].local_numel * itemsize(trained_dtype(by_name[p.name], ctx.precision, ctx.own))
                   for p in stage_params(stage) if p.name in ctx.trainable and by_name[p.name].role
                   .startswith("embedding"))

    def draining_figures(stage: Stage, dev: DeviceStates, batch: int, length: int, held: int, incoming: int,
                         held_words: str, resident: int) -> tuple[PhaseFigure, ...]:
        """A stage before the last that runs every forward before its first backward (GPipe; 1F1B where the
        microbatches are no more than the stage holds: it only drains): its real moments, not every gradient
        beside every microbatch (no moment holds both). The first backward: its k microbatches held, the gradient
        arriving, the top layer's MLP moment with its own gradient kept (mlp_first_backward_working), no other
        gradient made yet; its end: every gradient beside the k − 1 others (on the first stage as the embedding's
        backward makes its weight's gradient, with three hidden states' gradients, 3·r·B·S·h, live: measured on
        the stage's trace); a later backward (k ≥ 2): k − 1 held, every gradient, the gradient arriving and the
        top layer's MLP moment, each new gradient added in at once (the steady state's rule), and on the first
        stage the embedding's new gradient beside its .grad as they are added, k − 2 held. Where the layout is
        outside what the traces hold (tp, cp, FSDP2, checkpointing, another precision): () (the estimate)."""
        if layout.schedule not in ("gpipe", "1f1b") or layout.micro_batches > stage.in_flight or \
                layout.tp > 1 or layout.cp > 1 or policy or fsdp_beside(ctx) or \
                ctx.precision not in DRAIN_PRECISIONS or ctx.shape.get("checkpointing"):
            return ()
        k = stage.in_flight
        each = held // k
        tokens = batch * length
        inner = config_int(ctx.text, "intermediate_size") or 0
        first_w, first_words = mlp_first_backward_working(ctx.precision, tokens, h, inner)
        later_w, later_words = mlp_backward_working(ctx.precision, tokens, h, inner)
        g = dev.gradients
        held_short = held_words.split(" + the gradient arriving")[0]
        figures = [PhaseFigure(
            "backward", resident + held + incoming + first_w, "first backward",
            f"{held_short} + the gradient arriving from the next stage {incoming:,} + the top layer's MLP moment of "
            f"the first backward: {first_words} (no other gradient made yet: every forward ran first)", 0)]
        others = (k - 1) * each
        others_words = f"the {k - 1} other microbatch{'es' if k > 2 else ''} held, {k - 1} × {each:,} = {others:,} + " \
            if k > 1 else ""
        emb = embedding_gradient(stage)
        if stage.first:
            figures.append(PhaseFigure(
                "backward", resident + others + g + 3 * incoming, "end of the first backward",
                f"{others_words}gradients {g:,} (the embedding's made last, {emb:,}) + three hidden states' gradients "
                f"3·{residual}·B·S·h = {3 * incoming:,} (the embedding output's and the first layer's, live as the "
                "embedding's backward makes its weight's gradient)", g))
        else:
            figures.append(PhaseFigure(
                "backward", resident + others + g + incoming, "end of the first backward",
                f"{others_words}gradients {g:,} + the input's gradient to send {incoming:,}", g))
        if k > 1:
            figures.append(PhaseFigure(
                "backward", resident + others + g + incoming + later_w, "later backward",
                f"{others_words}gradients {g:,} + the gradient arriving {incoming:,} + the top layer's MLP moment: "
                f"{later_words} (each new gradient added into its .grad at once)", g))
            if emb:
                rest = (k - 2) * each
                figures.append(PhaseFigure(
                    "backward", resident + rest + g + emb + 3 * incoming, "a later backward's embedding gradient",
                    (f"the {k - 2} microbatch{'es' if k > 3 else ''} still held, {k - 2} × {each:,} = {rest:,} + "
                     if k > 2 else "") + f"gradients {g:,} + the embedding's new gradient {emb:,} beside its .grad, "
                    f"added in place + three hidden states' gradients {3 * incoming:,}", g))
        return tuple(figures)

    def ring_kept(stage: Stage, batch: int, length: int) -> tuple[int, str]:
        if layout.cp == 1 or ctx.shape.get("checkpointing"):  # a recomputed layer keeps no copy to the moments
            return 0, ""
        layers = max(stage.chunk_layers) if layout.virtual_stages > 1 else len(stage.layers)
        every, _ = ring_output_copies(ctx, batch, length)
        one = every // count
        size = 4 if ctx.precision == "fp32" else 2
        return stage.in_flight * layers * one, (
            f"ring attention's output copied for o_proj (torch's merge leaves it heads-major), {stage.in_flight} "
            f"microbatch{'es' if stage.in_flight > 1 else ''} × {layers} layers × B·(S / {layout.cp})·heads·head_dim "
            f"× {size} B = {stage.in_flight} × {layers} × {one:,} = {stage.in_flight * layers * one:,}"
            if one else "")

    comm_of: dict[int, list[Buffer]] = {}
    # FSDP2 beside the pipeline: each stage's gradients unsharded (pipeline_replay.unsynced_gradients), 0 without
    whole_of: dict[int, int] = {}
    for stage in plan:
        extra = ()
        if stage.last and layout.pp > 1 and tied_name is not None and tied_name in by_name and \
                by_name[tied_name].role.startswith("embedding"):
            copy = by_name[tied_name]
            extra = (dataclasses.replace(copy, name=copy.name + " (the last stage's copy)"),)
        dev = device_states_of(ctx, placements, stage_params(stage), extra)
        held_names = {q.name for q in stage_params(stage)}
        own = tuple(p for p in placements if p.name in held_names)
        # FSDP2 beside the pipeline (pipeline_replay.UNSYNCED): every unit of the stage gathered through its
        # microbatches, in place of FSDP2's default one layer and root unit, and the gradients a moment holds
        # unsharded until the step's reduce
        comm_of[stage.rank] = unsynced_buffer(ctx, own + extra) or fsdp_buffers(ctx, own)
        whole_of[stage.rank] = unsynced_gradients(ctx, own + extra, dev.gradients)
        figures, held = stage_figures(stage, dev, micro, ctx.seq)
        figures_by_stage.append((stage, dev, figures, held))
    worst = max(figures_by_stage, key=lambda item: max(p.bytes for p in item[2]))
    stage, dev, figures, held = worst
    comm = comm_of[stage.rank]
    rows = []
    for s, d, f, h_ in figures_by_stage:
        top = max(f, key=lambda p: p.bytes)
        rows.append(StageMemory(s.rank, (s.layers[0], s.layers[-1]) if s.layers else None, layer_runs(s.layers),
                                len(s.layers),
                                s.in_flight, s.first, s.last, d.weights, d.gradients + d.grad_buffer,
                                d.optimizer, d.master_weights,
                                h_, top.bytes, top.phase))
    tied_words = " and a copy of the tied embedding for the head (Megatron's rule)" if tied_name else ""
    words = (f"{split_words(layout, count)}; the embeddings on stage 0, {after_layers(ctx.report.params, stack)} on "
             f"stage {layout.pp - 1}{tied_words}; microbatches of {micro:,} sequence{'s' if micro > 1 else ''}")
    notes = (f"pipeline: each stage holds its layers' saved activations for every microbatch in flight "
             f"({layout.schedule}), and for each its own 16-bit weight copies (each microbatch's forward runs under "
             "its own autocast), its output in the stage's cache (in bf16-pure its received 16-bit input too), on the "
             "first stage its rotary tables, on the last its loss (interleaved: each chunk-microbatch its chunk's, "
             "along torch's order); what a stage holds before its first backward equals the stage's trace on a Llama "
             "cut under GPipe, 1F1B and interleaved, fp32, mixed and bf16-pure "
             "(tests/test_pipeline_closed_form_copies.py). Under 1F1B a stage before the last with more microbatches "
             "than it holds peaks in its steady state: every gradient, its microbatches in flight, the gradient "
             "arriving and the top layer's MLP backward moment, equal to the stage's trace (llama-3-8b, pp 4, 8 "
             "microbatches of 4,096 tokens, bf16-mixed: stages 0-2 to the byte; a 3-layer cut's middle stage in fp32, "
             "mixed and bf16-pure). A stage before the last that runs every forward first (GPipe; 1F1B with no "
             "more microbatches than it holds: it only drains) peaks at one of its real moments: its first backward "
             "(its microbatches, the gradient arriving, the top layer's MLP moment, no gradient made before), that "
             "backward's end (every gradient; on the first stage as the embedding's backward makes its weight's, "
             "three hidden states' gradients beside), a later backward (one microbatch fewer, every gradient), equal "
             "to the stage's trace (llama-3-8b --pp 2 --batch 1 stage 0, 64,342,721,604 B; 2-4-layer cuts in fp32, "
             "mixed and bf16-pure; tests/test_pipeline_draining_stage.py), but where a layer's weights outweigh its "
             "tokens (T << h: the layer's later moments, more of its gradients made, rise above the MLP's; 4,192 B "
             "under on a 1-layer stage at 8 tokens) or in bf16-pure on a narrow MLP (i < 2h, the norm's backward: "
             "1,856 B under). Elsewhere (interleaved, beside tensor or context parallel, FSDP2 beside) a stage's "
             "figure is an estimate, every gradient beside every microbatch held, "
             "without the backward's working memory (on a 3-layer cut, 1,728 B under to 32,000 B over its trace). "
             "The last stage's figure is the recipe's moments for its layers (its end of forward with its own layers' "
             "KV cache keys), with every gradient once a microbatch has gone back (GPipe: its first backward without "
             "them, a later one with one microbatch fewer): on the cut the trace's + 8 B (the loss and its gradient), "
             "GPipe and 1F1B",)
    if layout.cp > 1:
        notes += (f"context parallel under the pipeline: stage s runs on the {layout.devices // layout.pp} ranks from "
                  f"s × {layout.devices // layout.pp} on (pp outermost, then dp, cp, tp as torchtitan lays them out), "
                  f"each cp rank's layers at its "
                  f"S / {layout.cp} tokens (the recipe there, the hidden state sent and received B·(S / {layout.cp})·h)"
                  " and, for each microbatch in flight, what torch's ring keeps beyond it: each layer's merged output "
                  "copied for o_proj (the closed form of the cp rank without a pipeline, held to the traced ring "
                  "there); the ring's other buffers are freed inside each attention",)
    if policy:
        notes += (POLICY_CLOSED_FORM,) + ((POLICY_BESIDE_CP,) if ctx.derive else ())
    if fsdp_beside(ctx):
        notes += (UNSYNCED,)
    device = DeviceMemory(layout, dev.weights, dev.gradients + dev.grad_buffer,
                          dev.optimizer, dev.master_weights, ctx.buffer_bytes,
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
