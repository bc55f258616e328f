"""The pieces each device's answer is composed of: its share of the model states, the communication buffers it holds
(FSDP2's gathered units, ring attention's K and V, the expert dispatch's index), the shard's analytic activations
and the gradients torch makes whole or all-reduces at the step's edges. estimate.py (one device's step under a
layout) and pipeline_device.py (a pipeline's stages) compose them."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from ...errors import UnsupportedError
from ..memory.phases import PhaseFigure, cast_weights
from .device import Buffer, RingQuestion, StepContext
from .pipeline import LAYER_PREFIX
from .rules import Placement
from .states import DeviceStates, device_states, master_whole_gradient


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


def resident_bytes(dev: DeviceStates, buffers: int) -> int:
    # bf16-main-grad's fp32 gradient buffer is held at every moment (parallel/states.main_grad_states)
    return dev.weights + dev.optimizer + dev.master_weights + dev.grad_buffer + buffers


def fsdp_sharded(layout: Any) -> bool:
    """Whether FSDP2 (full or hybrid) shards the layout's parameters over more than one rank."""
    return layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1


def fsdp_policy(layout: Any) -> bool:
    """Whether FSDP2 shards the layout's parameters under its MixedPrecisionPolicy (--fsdp-mixed-precision policy:
    param_dtype 16-bit, reduce_dtype fp32, no autocast; the layout admits it under a mixed precision alone)."""
    return layout.fsdp_mixed_precision == "policy" and fsdp_sharded(layout)


def policy_context(ctx: StepContext) -> StepContext:
    """The step as FSDP2's MixedPrecisionPolicy runs it, for the closed form: each unit gathered in 16 bits and no
    autocast, so the forward and backward (the activations, the gathered units, the unsharded gradients) are
    bf16-pure's, while the rank's states stay the mixed precision's fp32 shards (ctx.states, ctx.step: kept) and the
    reduce-scatter runs in fp32 (fsdp_moments.py). `ctx` itself without the policy, or already so."""
    if not fsdp_policy(ctx.layout) or not ctx.precision.endswith("-mixed"):
        return ctx
    return dataclasses.replace(ctx, precision="bf16-pure", shape=dict(ctx.shape, precision="bf16-pure",
                                                                      cast_weights=0, cast_head=0, cast_biases=0))


def local_recipe_missing(ctx: StepContext) -> bool:
    from .activations import local_recipe

    return local_recipe(ctx.text, ctx.view.class_name) is None or ctx.analytic is None or ctx.derived_or_traced


def device_states_of(ctx: StepContext, placements: tuple[Placement, ...], params: Any = None,
            copies: tuple[Placement, ...] = ()) -> DeviceStates:
    """The device's model states for `params` (default: every parameter), and `copies`: placements of parameters it
    holds a second time (a tied head's copy on the last stage), with their own gradient and optimizer states."""
    params = list(params if params is not None else ctx.report.params)
    names = {p.name for p in params}
    chosen = tuple(p for p in placements if p.name in names) + tuple(copies)
    return device_states(params + [as_param(c) for c in copies], chosen, ctx.layout, precision=ctx.states.precision,
                         optimizer=ctx.optimizer, trainable=ctx.trainable | {c.name for c in copies}, own=ctx.own)


def as_param(placement: Placement) -> Any:
    import math

    from ...count import ParameterInfo

    return ParameterInfo(placement.name, placement.shape, math.prod(placement.shape), True, placement.role,
                         placement.dtype)


def fsdp_buffers(ctx: StepContext, placements: tuple[Placement, ...]) -> list[Buffer]:
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    layout = ctx.layout
    # under FSDP2's MixedPrecisionPolicy each unit is gathered in its 16-bit param_dtype (policy_context)
    precision = policy_context(ctx).precision

    def unsharded(p: Placement) -> int:
        return p.local_numel * itemsize(trained_dtype(p, precision, ctx.own))  # type: ignore[arg-type]
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
    gathered = " in 16 bits (its MixedPrecisionPolicy's param_dtype)" if fsdp_policy(layout) else ""
    return [Buffer("FSDP2's root unit, all-gathered", root,
                   f"the parameters outside the layers (embeddings, final norm, head) unsharded{gathered}, {root:,} B: "
                   "the root unit is not resharded after the forward", ("forward", "backward")),
            Buffer("FSDP2's layer unit, all-gathered", layer,
                   f"one layer's parameters unsharded{gathered} while it runs, {layer:,} B (the last layer's as the "
                   "loss is taken and backward starts)", ("forward", "backward"))]


def with_buffers(phase: PhaseFigure, comm: list[Buffer]) -> PhaseFigure:
    held = [b for b in comm if phase.phase in b.moments and phase.where not in ("optimizer step", "end of backward")]
    if not held:
        return phase
    extra = sum(b.bytes for b in held)
    return dataclasses.replace(phase, bytes=phase.bytes + extra, arithmetic=phase.arithmetic + "; + " + " + ".join(
        f"{b.name} {b.bytes:,}" for b in held))


def expert_dispatch(ctx: StepContext, placements: tuple[Placement, ...], batch: int, length: int) -> list[Buffer]:
    """Under expert parallelism, the dispatch's permute indices a rank keeps for the backward (experts.py)."""
    from ..dims import dim
    from .experts import dispatch_index_bytes, moe_layers

    layers, top_k = moe_layers(placements), dim(ctx.text, "top_k")
    if ctx.layout.ep == 1 or not layers or not top_k:
        return []
    size, words = dispatch_index_bytes(layers, top_k, batch, length)
    return [Buffer("expert parallel's permute index", size, words, ("forward", "backward"))]


def local_shape(ctx: StepContext, placements: tuple[Placement, ...]) -> dict:
    if not ctx.precision.endswith("-mixed"):
        return dict(ctx.shape, cast_weights=0, cast_head=0, cast_biases=0)
    local = {p.name: p.local_numel for p in placements}
    for param in ctx.report.params:  # a tied head is its embedding's shard under any of its names
        for alias in param.aliases:
            local[alias] = local[param.name]
    cast, head, biases = cast_weights(ctx.view, local)
    return dict(ctx.shape, cast_weights=cast, cast_head=head, cast_biases=biases)


def tied_bytes(ctx: StepContext, placements: tuple[Placement, ...]) -> int:
    """A trainable input embedding tied to the head, as the device holds it: its gradient arrives twice."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    by_name = {p.name: p for p in placements}
    for group in ctx.report.tied:
        local = by_name.get(group.canonical)
        if local is not None and local.role.startswith("embedding") and local.name in ctx.trainable:
            return local.local_numel * itemsize(trained_dtype(local, ctx.precision, ctx.own))  # type: ignore
    return 0


def local_activations(ctx: StepContext, shape: dict, batch: int, length: int) -> Any:
    """The analytic activations of the device's shard: the recipe on the rank's heads and widths (tp), at its
    S / cp tokens (cp)."""
    from .activations import sequence_parallel, tp_activations

    seq = -(-length // ctx.layout.cp)
    act = tp_activations(ctx.text, ctx.view.class_name, tp=ctx.layout.tp, batch=batch, seq=seq, **shape)
    if ctx.layout.sp:
        act = sequence_parallel(act, tp=ctx.layout.tp, tokens=batch * seq, hidden=hidden_size(ctx),
                                precision=ctx.precision, layer_norms=layer_norms(ctx),
                                checkpointing=shape.get("checkpointing", False))
    return act


def hidden_size(ctx: StepContext) -> int:
    from ..dims import config_int

    return config_int(ctx.text, "hidden_size") or 0


def layer_norms(ctx: StepContext) -> int:
    """The hidden-size norms of one layer (two in a Llama layer, four in Gemma-2's), from the report."""
    hidden = hidden_size(ctx)
    names = [p for p in ctx.report.params if LAYER_PREFIX.match(p.name) and p.role.endswith("norm") and
             tuple(p.shape) == (hidden,) and not p.name.endswith("bias")]
    if not names:
        return 0
    layer = LAYER_PREFIX.match(names[0].name).group(0)
    return sum(1 for p in names if p.name.startswith(layer))


def check_analytic(ctx: StepContext, what: str) -> str:
    from .activations import local_recipe

    recipe = local_recipe(ctx.text, ctx.view.class_name)
    if recipe is None and not getattr(ctx.view, "can_generate", True):  # an encoder (BERT's kind)
        why = encoder_refusal(ctx)
        if why:
            raise UnsupportedError(why)
    if recipe is None or ctx.analytic is None or ctx.derived_or_traced:
        raise UnsupportedError("{what} for {cls} needs its activations on each device: the closed form on a rank's "
                               "shard covers the Llama-style family (its recipe keeps heads, widths and tokens "
                               "apart), and a step derived from traces with the layout applied covers FSDP2, "
                               "tensor parallelism where transformers or Megatron's names give a plan, and context "
                               "parallelism beside tp, sp, FSDP2 and ep",
                               what=what, cls=ctx.view.class_name)
    if ctx.layout.cp > 1:
        refuse_attention_dropout(ctx)
        if ctx.seq % ctx.layout.cp:
            raise UnsupportedError("context parallelism splits the sequence: cp {cp} does not divide {seq:,}",
                                   cp=ctx.layout.cp, seq=ctx.seq)
    return recipe


def refuse_attention_dropout(ctx: RingQuestion) -> None:
    """Context parallelism with attention dropout, refused in one line naming the rate: torch's ring attention runs
    without dropout, and the dropout mask's S² terms have no per-rank form here."""
    from ..dims import attention_dropout

    rate = attention_dropout(ctx.text)
    if rate:
        raise UnsupportedError("context parallelism with attention dropout {rate:g} (S² terms) is not modelled: "
                               "torch's ring attention runs without dropout; the same config with its attention "
                               "dropout at 0 is answered", rate=rate)


def encoder_refusal(ctx: RingQuestion) -> str:
    """Why context parallelism over an encoder (a class that does not generate, BERT's kind: no per-rank closed form)
    is not answered, in one line; "" for tensor parallelism, which the derived engine answers, and for pipeline
    parallelism, whose stages are replayed from the derived step (pipeline_replay.derived_pipeline_device)."""
    cls = ctx.view.class_name
    if ctx.layout.cp > 1:
        return (f"context parallelism over {cls} is refused: its attention is bidirectional under the batch's "
                "padding mask, and ring attention (torch's context_parallel) takes no mask (its efficient kernel "
                "raises on attn_bias; load balancing needs is_causal), so there is no sharded step to count")
    return ""


class WholeGradient(NamedTuple):
    """A vocabulary-parallel embedding's gradient as DTensor holds it: whole on every rank (bytes), the rank's shard
    (bytes), and how bf16-master's step casts it for the fp32 master copy ("whole", "partition"; "": no master)."""
    full: int
    local: int
    master: str = ""


def whole_embedding_gradient(ctx: StepContext, placements: tuple[Placement, ...],
                             under_fsdp: bool = False, tied_apart: bool = False) -> WholeGradient | None:
    """(the whole embedding gradient's bytes, the rank's shard's) where torch gives a vocabulary-parallel embedding
    its gradient whole: DTensor's embedding backward returns it Replicate, so each tensor-parallel rank holds all of
    it from the end of backward, and the fused optimizer step reads a shard of it made afresh. None where the
    embedding is not cut or does not train, or FSDP2 reduces it to a shard (unless `under_fsdp`: FSDP2's backward
    holds it whole until the root's post-backward), or it is tied to the head: there the head's Shard(0) gradient
    and the embedding's Replicate one add up on the one parameter as Shard(0), so no rank holds it whole (traced:
    GPT-2's wte and Gemma-2's embed_tokens, tp 2). `tied_apart`: a tied head on another pipeline stage, the
    embedding's gradient made on its stage alone, whole as an untied one's (traced: GPT-2's wte, tp 2 × pp 3)."""
    from ..dtypes import itemsize
    from ..memory.states import MAIN_GRAD_PRECISION, MASTER_PRECISION, trained_dtype

    if ctx.layout.tp == 1 or not under_fsdp and ctx.layout.shard in ("fsdp", "hsdp") and ctx.layout.shard_degree > 1:
        return None
    # bf16-master's step casts the gradient as it holds it: whole under replication, its ZeRO partition's share of
    # the flat buffer under ZeRO 1-3 (states.master_whole_gradient)
    master = ("partition" if ctx.layout.zero_stage and ctx.layout.shard_degree > 1 else "whole") \
        if ctx.states.precision == MASTER_PRECISION else \
        "buffer" if ctx.states.precision == MAIN_GRAD_PRECISION else ""
    tied = {name for group in ctx.report.tied for name in (group.canonical, *group.aliases)}
    for p in placements:
        if p.role == "embeddings.word" and p.tp == "vocabulary" and p.name in ctx.trainable and \
                (p.name not in tied or tied_apart):
            size = itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]
            full = 1
            for n in p.shape:
                full *= n
            return WholeGradient(full * size, p.local_numel * size, master)
    return None


def sequence_parallel_norm_gradients(ctx: StepContext, params: Any = None) -> int:
    """Bytes the optimizer step makes of the sequence-parallel norms' gradients: torch's SequenceParallel leaves each
    residual-stream norm's weight gradient Partial over the tp ranks (each rank's from its own tokens), and the
    step's all-reduce to the Replicate weight makes a new tensor of each (the layers' norms and the final norm, their
    weights and any biases; read off traces of one rank: 13 norms × h × 4 B on a 6-layer Llama or Mixtral). 0 without sequence parallel or
    under FSDP2, which reduces the gradients itself. `params`: a pipeline stage's (default: the model's)."""
    from ..dtypes import itemsize
    from ..memory.states import MASTER_COPY_PRECISIONS, trained_dtype

    layout = ctx.layout
    if not layout.sp or layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1:
        return 0
    # bf16-master: all-reduced after the bf16 gradients are freed (states.py); bf16-main-grad: added into the fp32
    # buffer by their hooks and freed (traced: MainGradOptimizer on the rank's DTensors holds none at the step)
    if ctx.states.precision in MASTER_COPY_PRECISIONS:
        return 0
    hidden = hidden_size(ctx)
    return sum(p.numel * itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]
               for p in (ctx.report.params if params is None else params)
               if (p.role == "norm.final" or p.role.endswith("norm") and LAYER_PREFIX.match(p.name))
               and tuple(p.shape) == (hidden,) and p.name in ctx.trainable)


def with_norm_gradients(phase: PhaseFigure, extra: int) -> PhaseFigure:
    if phase.where != "optimizer step" or not extra:
        return phase
    return dataclasses.replace(phase, bytes=phase.bytes + extra, arithmetic=(
        f"{phase.arithmetic}; the sequence-parallel norms' gradients all-reduced for the step (torch's "
        f"SequenceParallel leaves them Partial), + {extra:,}"))


def with_whole_gradient(phase: PhaseFigure, whole: tuple[int, int]) -> PhaseFigure:
    full, local = whole[0], whole[1]
    if phase.where == "optimizer step" and isinstance(whole, WholeGradient) and whole.master:
        extra, words = master_whole_gradient(full, local, whole.master)
        return dataclasses.replace(phase, bytes=phase.bytes + extra, gradients=phase.gradients + (full - local
                                                                                                 if extra else 0),
                                   arithmetic=f"{phase.arithmetic}; {words}")
    if phase.where in ("end of backward", "later backward"):  # a pipeline's later backward: every gradient held
        extra, words = full - local, f"the embedding's gradient whole on every rank (torch's DTensor), + {full - local:,}"
    elif phase.where == "optimizer step":
        extra, words = full, (f"the embedding's gradient whole on every rank (torch's DTensor), + {full - local:,}, "
                              f"and the shard the fused step makes of it, + {local:,}")
    else:
        return phase
    return dataclasses.replace(phase, bytes=phase.bytes + extra, gradients=phase.gradients + full - local,
                               arithmetic=f"{phase.arithmetic}; {words}")


def ring_chunk_bytes(ctx: StepContext, batch: int, seq: int) -> int:
    """The rank's own K and V of one attention: 2·B·(S / cp)·kv_heads·head_dim × the attention's element size
    (16 bits under autocast or bf16-pure: autocast casts SDPA's arguments before the ring runs)."""
    heads, kv, head_dim, size = _attention_dims(ctx)
    return 2 * batch * (seq // ctx.layout.cp) * kv * head_dim * size


def _attention_dims(ctx: StepContext) -> tuple[int, int, int, int]:
    """(the rank's query heads, its KV heads, head_dim, the attention's element size)."""
    from ..dims import config_int

    heads = config_int(ctx.text, "num_attention_heads") or 1
    kv = (config_int(ctx.text, "num_key_value_heads") or heads) // ctx.layout.tp or 1
    hidden = config_int(ctx.text, "hidden_size") or 0
    head_dim = config_int(ctx.text, "head_dim") or hidden // heads
    return heads // ctx.layout.tp or 1, kv, head_dim, 4 if ctx.precision == "fp32" else 2


def ring_output_copies(ctx: StepContext, batch: int, seq: int) -> tuple[int, str]:
    """(bytes, arithmetic in words) that torch's ring attention keeps for backward beyond the one-device step at
    S / cp tokens: its merged output comes out (B, heads, S/cp, head_dim)-contiguous (_SDPAMerger's head-tail
    partial updates torch.cat the halves, and the result's .to(dtype) keeps that layout), where the flash kernel's
    is (B, S/cp, heads, head_dim)-strided; so the attention's transpose(1, 2).reshape before o_proj copies it, and
    o_proj keeps the copy for its weight's gradient: B·(S / cp)·heads·head_dim × the element size, one a layer,
    from the layer's forward to its o_proj's backward (held at the end of forward and the start of backward). What
    the ring makes besides (the all-gathered K and V, the fp32 merge, the backward's fp32 dq/dk/dv and their
    all-to-all) is freed inside the attention, under the logits' moments. The rest (q, k, v, the 16-bit output, the
    fp32 log-sum-exp: (B, heads, S/cp, 1) for flash's (B, heads, S/cp), the same bytes) is the one-device step's.
    Where 2·cp does not divide S torch does not balance the load: no partial update, no cat, the output keeps the
    kernel's layout and the reshape is a view (rank 0 traced: no copy), so (0, ""). Traced (torch's ring on the fake
    process group, cost/traced/context_parallel.py): a 2-layer Llama cut, cp 2 and 4, balanced and not, equal to
    the byte."""
    from ..dims import config_int

    if seq % (2 * ctx.layout.cp):
        return 0, ""
    heads, _, head_dim, size = _attention_dims(ctx)
    layers = config_int(ctx.text, "num_hidden_layers") or 0
    local = seq // ctx.layout.cp
    one = batch * local * heads * head_dim * size
    return layers * one, (f"ring attention's output copied for o_proj (torch's merge leaves it heads-major, so the "
                          f"reshape copies it), {layers} layers × B·(S / {ctx.layout.cp})·heads·head_dim × {size} B = "
                          f"{layers} × {one:,} = {layers * one:,}")


def with_ring_outputs(phase: PhaseFigure, extra: tuple[int, str]) -> PhaseFigure:
    """A closed-form moment with the ring's kept output copies where they are held (end of forward, start of
    backward: before the layers' backward frees them)."""
    n, words = extra
    if not n or phase.where not in ("end of forward", "start of backward"):
        return phase
    return dataclasses.replace(phase, bytes=phase.bytes + n, arithmetic=f"{phase.arithmetic}; + {words}")


def layer_runs(layers: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    runs: list[list[int]] = []
    for index in layers:
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return tuple((a, b) for a, b in runs)


def matmul_names(ctx: StepContext) -> frozenset[str]:
    names = set()
    for path, sub in ctx.view.root.named_modules():
        if ctx.view.is_matmul(sub) and sub._parameters.get("weight") is not None:
            names.add(f"{path}.weight" if path else "weight")
    return frozenset(names)


def masked_token_ids(ctx: StepContext, placements: tuple[Placement, ...], batch: int, length: int) -> int:
    """Bytes of the token ids a vocabulary-parallel embedding (tp) masks and saves for its backward: a (B, S / cp)
    int64, 8·T, held from the embedding's forward to its backward (0 where the embedding is not cut or does not
    train). fsdp_moments.py counts them on FSDP2's moments."""
    if ctx.layout.tp == 1 or not any(p.role == "embeddings.word" and p.tp == "vocabulary" and p.name in ctx.trainable
                                     for p in placements):
        return 0
    return 8 * batch * -(-length // ctx.layout.cp)


def with_masked_ids(phase: PhaseFigure, masked: int) -> PhaseFigure:
    """The end of forward and the start of backward with the vocabulary-parallel embedding's masked token ids
    (masked_token_ids) beside the recipe's moment: the embedding's backward, the step's last, frees them (traced on
    the Llama cut, tp 2 with and without sp: both moments equal to the rank's trace)."""
    if not masked or phase.where not in ("end of forward", "start of backward"):
        return phase
    return dataclasses.replace(phase, bytes=phase.bytes + masked, arithmetic=(
        f"{phase.arithmetic}; + the vocabulary-parallel embedding's masked token ids, 8·T = {masked:,}"))


# the recipes whose tensor-parallel rank's gather moment was held to its trace (tests/test_tp_forward_moment.py)
GATHER_TRACED_RECIPES = ("Llama-style decoder",)


def with_head_gather(ctx: StepContext, placements: tuple[Placement, ...], figures: tuple[PhaseFigure, ...],
                     batch: int, length: int) -> tuple[PhaseFigure, ...]:
    """`figures` with the forward's moment inside the head under tensor parallelism: transformers' lm_head is
    colwise_gather_output, so the rank's logits shard (B, S, ⌈V / t⌉) is all-gathered into t shards (t·⌈V / t⌉
    columns) and concatenated into the whole logits (B, S, V) while both are live, before the loss makes its
    buffers. That moment is the end of forward's less what the loss makes: its log-softmax 4·T·V, the logits' fp32
    copy 4·T·V where they are 16-bit (the saved activations count it), the shifted labels 8·T (counted saved) and the
    labels padded by one, the loss and its total weight; plus the shard and the all-gather's output in the logits'
    dtype e (4 B in fp32, 2 B under autocast and in bf16-pure); under sp and autocast, plus the head's input
    all-gathered in fp32 (4·T·h), freed once autocast's 16-bit cast has gone through the matmul. In fp32 it is the
    forward's peak, 4·T·⌈V / t⌉ − 8·T − 8·B·(S + 1) − 8 over the end of forward (at B 1, whose shifted labels are a
    view of the padded ones, 4·T·⌈V / t⌉ − 8·T − 16; the rank traced on torch's
    fake process group, llama-3-8b cut to 2 layers, tp 2 with and without sp, B 1 and 2: equal to the byte; was
    65,665,008 B under at B 1, 256 tokens); under autocast and in bf16-pure the loss's end of forward stays above."""
    from ..dims import config_int
    from .activations import local_recipe, norm_kind

    tp = ctx.layout.tp
    head = next((p for p in placements if p.role == "head.lm" and p.tp == "vocabulary"), None)
    end = next((p for p in figures if p.where == "end of forward"), None)
    vocab = config_int(ctx.text, "vocab_size") or 0
    if tp == 1 or head is None or end is None or not vocab or \
            local_recipe(ctx.text, ctx.view.class_name) not in GATHER_TRACED_RECIPES:
        return figures
    kind = norm_kind(ctx.precision)
    size = 4 if kind == "fp32" else 2
    seq = -(-length // ctx.layout.cp)
    tokens = batch * seq
    shard = head.local_shape[0]
    padded = 8 * batch * (seq + 1) if batch > 1 else 8
    made = 4 * tokens * vocab + (4 * tokens * vocab if size == 2 else 0) + 8 * tokens + padded + 8
    gathered = size * tokens * shard + size * tokens * tp * shard
    head_input = 4 * tokens * hidden_size(ctx) if ctx.layout.sp and kind == "mixed" else 0
    made_words = "4·T·V" + (" + its fp32 copy of the 16-bit logits 4·T·V" if size == 2 else "") + \
        " + the shifted labels 8·T + the labels padded by one " + \
        ("8·B·(S + 1)" if batch > 1 else "(their one element more at batch 1)") + " + the loss's two scalars 8"
    words = (f"; at the head's gather, before the loss: − what the loss makes ({made_words}) = {made:,}, + the "
             f"rank's logits {size}·T·⌈V / {tp}⌉ and the all-gather's output {tp} × {size}·T·⌈V / {tp}⌉ = "
             f"{gathered:,} (the whole logits, concatenated from it, counted above)")
    if head_input:
        words += f" + the head's input all-gathered in fp32 (sequence parallel) 4·T·h = {head_input:,}"
    gather = dataclasses.replace(end, bytes=end.bytes - made + gathered + head_input,
                                 where="the head's logits gathered", arithmetic=end.arithmetic + words)
    at = figures.index(end)  # in the step's order: the gather comes before the loss
    return figures[:at] + (gather,) + figures[at:]
