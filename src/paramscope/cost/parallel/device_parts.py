"""The pieces each device's answer is composed of: its share of the model states, the communication buffers it holds
(FSDP2's gathered units, ring attention's K and V, the expert dispatch's index), the shard's analytic activations
and the gradients torch makes whole or all-reduces at the step's edges. estimate.py (one device's step under a
layout) and pipeline_device.py (a pipeline's stages) compose them."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ...errors import UnsupportedError
from ..memory.phases import PhaseFigure, cast_weights
from .device import Buffer, StepContext
from .pipeline import LAYER_PREFIX
from .rules import Placement
from .states import DeviceStates, device_states


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
    return dev.weights + dev.optimizer + dev.master_weights + buffers


def fsdp_sharded(layout: Any) -> bool:
    """Whether FSDP2 (full or hybrid) shards the layout's parameters over more than one rank."""
    return layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1


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
    return device_states(params + [as_param(c) for c in copies], chosen, ctx.layout, precision=ctx.precision,
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
                                precision=ctx.precision, layer_norms=layer_norms(ctx))
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
        untraced = untraced_beside_experts(ctx.layout)
        if untraced:  # name the combination, not the general coverage (it read as tp or cp refused outright)
            raise UnsupportedError("{untraced} for {cls} is not modelled: its step is derived from traces (no closed "
                                   "form on a rank's shard), and none is traced with that combination; {covered}",
                                   untraced=untraced, cls=ctx.view.class_name, covered=_TRACED_COMBINATIONS)
        raise UnsupportedError("{what} for {cls} needs its activations on each device: the closed form on a rank's "
                               "shard covers the Llama-style family (its recipe keeps heads, widths and tokens "
                               "apart), and a step derived from traces with the layout applied covers FSDP2, "
                               "tensor parallelism where transformers or Megatron's names give a plan, and context "
                               "parallelism beside tp, sp and FSDP2 (not beside ep)",
                               what=what, cls=ctx.view.class_name)
    if ctx.layout.cp > 1:
        refuse_attention_dropout(ctx)
        if ctx.seq % ctx.layout.cp:
            raise UnsupportedError("context parallelism splits the sequence: cp {cp} does not divide {seq:,}",
                                   cp=ctx.layout.cp, seq=ctx.seq)
    return recipe


_TRACED_COMBINATIONS = ("expert parallelism is traced beside data parallelism (ZeRO 0-2, or FSDP2 over the ep ranks "
                        "without tp), tensor parallelism without FSDP2, and pipeline stages")


def untraced_beside_experts(layout: Any) -> str:
    """The expert-parallel combination no trace composes, in words ('' where there is none): context parallelism
    beside ep (the ring's cp ranks and the experts' ep ranks drawn from the same dp ranks), tensor parallelism
    beside ep under FSDP2 (each expert then sharded over a mesh dimension not traced)."""
    if layout.ep == 1:
        return ""
    if layout.cp > 1:
        return f"context parallelism (cp {layout.cp}) beside expert parallelism (ep {layout.ep})"
    if layout.tp > 1 and fsdp_sharded(layout):
        return f"tensor parallelism (tp {layout.tp}) beside expert parallelism (ep {layout.ep}) under FSDP2"
    return ""


def refuse_attention_dropout(ctx: StepContext) -> None:
    """Context parallelism with attention dropout, refused in one line naming the rate: torch's ring attention runs
    without dropout, and the dropout mask's S² terms have no per-rank form here."""
    from ..dims import attention_dropout

    rate = attention_dropout(ctx.text)
    if rate:
        raise UnsupportedError("context parallelism with attention dropout {rate:g} (S² terms) is not modelled: "
                               "torch's ring attention runs without dropout; the same config with its attention "
                               "dropout at 0 is answered", rate=rate)


def encoder_refusal(ctx: StepContext) -> str:
    """Why context parallelism over an encoder (a class that does not generate, BERT's kind: no per-rank closed form)
    is not answered, in one line; "" for tensor parallelism, which the derived engine answers, and for pipeline
    parallelism, whose stages are replayed from the derived step (pipeline_device.derived_pipeline_device)."""
    cls = ctx.view.class_name
    if ctx.layout.cp > 1:
        return (f"context parallelism over {cls} is refused: its attention is bidirectional under the batch's "
                "padding mask, and ring attention (torch's context_parallel) takes no mask (its efficient kernel "
                "raises on attn_bias; load balancing needs is_causal), so there is no sharded step to count")
    return ""


def whole_embedding_gradient(ctx: StepContext, placements: tuple[Placement, ...],
                             under_fsdp: bool = False) -> tuple[int, int] | None:
    """(the whole embedding gradient's bytes, the rank's shard's) where torch gives a vocabulary-parallel embedding
    its gradient whole: DTensor's embedding backward returns it Replicate, so each tensor-parallel rank holds all of
    it from the end of backward, and the fused optimizer step reads a shard of it made afresh. None where the
    embedding is not cut or does not train, or FSDP2 reduces it to a shard (unless `under_fsdp`: FSDP2's backward
    holds it whole until the root's post-backward), or it is tied to the head: there the head's Shard(0) gradient
    and the embedding's Replicate one add up on the one parameter as Shard(0), so no rank holds it whole (traced:
    GPT-2's wte and Gemma-2's embed_tokens, tp 2)."""
    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    if ctx.layout.tp == 1 or not under_fsdp and ctx.layout.shard in ("fsdp", "hsdp") and ctx.layout.shard_degree > 1:
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


def sequence_parallel_norm_gradients(ctx: StepContext, params: Any = None) -> int:
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


# FSDP2's step (torch 2.13's fully_shard on each layer, then on the root, its defaults), what a rank holds beyond its
# sharded states at the moments inside the step where it can peak once the weights outweigh the logits:
#   the root unit (embeddings, final norm, head), all-gathered in the forward and never resharded before its
#     post-backward (the root's reshard_after_forward is False), padded as FSDP2 allocates it, ⌈dim0 / d⌉·d rows;
#   the root's gradients, unsharded until that post-backward reduce-scatters them: the head's and the final norm's
#     from the head's backward on, the embedding's at the end;
#   layer k's parameters all-gathered (padded), and layer k − 1's all-gather output, prefetched by layer k's
#     pre-backward (FSDP2's default backward prefetch, the next unit in reverse forward order) and held through it;
#   layer k + 1's reduce-scatter input (its gradients padded and chunk-catted; FSDP2's
#     reduce_scatter_max_input_buffers = 1 keeps it until the next post-backward) and the reduce-scattered shards
#     of the layers above k;
#   the one-device step's activations there: layers 0 .. k − 1 as saved, what layer k still holds, the gradients
#     flowing through it and its unsharded weight gradients made so far.
# Inside layer k, per precision (per token on the rank's shard; q, kv, i its widths), each read off one rank traced by
# MemTracker and named by the op it peaks in:
#   "MLP" under autocast: the gate projection's weight gradient cast to fp32, the MLP's last (its activations, 8i,
#     and the post-norm output's 16-bit copies they read, 4h, freed; the three MLP weight gradients held, the
#     gate's 16-bit one beside its fp32 cast; the attention's 16-bit weight copies still held); "MLP's up": the up
#     projection's, one before (the gate's output, its input copy and 16-bit weight copy still held, 2h + 2i and
#     the gate output's 16-bit gradient, 2i, flowing);
#   "MLP" in fp32: the gate projection's weight-gradient matmul (its input, the post-norm output, still held, and
#     the gate output's gradient, 4i, flowing); "MLP's product": the SiLU-and-product backward after down_proj's
#     (its product's 4i freed, the gate, up and product gradients, 12i, flowing; down's weight gradient held);
#   "attention" in fp32: q_proj's weight gradient, the layer's last matmul (of the layer only the input norm's saved
#     input, normalised input, output and reciprocal root held; every weight gradient but the input norm's).
# Each is linear in k (a layer lower holds one layer's activations fewer and one shard more), so its largest is at
# k = L − 2 or at k = 1, the lowest with a prefetch; the last layer (no reduce-scatter input yet) is its own case.
# Then the embedding's backward (every root gradient, its output's gradient) and, under tp, the root's
# post-backward; and in the forward each unit's all-gather (below, where it is made).
_FSDP_MOMENTS = {
    # kind: {moment: (of the layer's own activations, freed before it, per token (·h, ·i), or held, (·h, constant);
    #                 the gradients flowing, per token (·h, ·i); the weights whose gradients it holds, in fp32 (and
    #                 the one whose 16-bit gradient is being cast, under autocast); the layer's MLP weights whose
    #                 16-bit copies it still holds)}
    "mixed": {"MLP's up": ((2, 6), None, (8, 2), ("mlp.up", "mlp.down"), "mlp.up", ("mlp.gate",)),
              "MLP": ((4, 8), None, (8, 0), ("mlp.gate", "mlp.up", "mlp.down"), "mlp.gate", ())},
    "fp32": {"MLP's product": ((0, 4), None, (4, 12), ("mlp.down",), "", ()),
             "MLP": ((0, 16), None, (12, 4), ("mlp.gate", "mlp.up", "mlp.down"), "", ()),
             "attention": (None, (12, 4), (16, 0), ("attention.query", "attention.key", "attention.value",
                                                     "attention.output", "mlp.gate", "mlp.up", "mlp.down",
                                                     "mlp.norm"), "", ())},
}


def fsdp_backward_moments(ctx: StepContext, placements: tuple[Placement, ...], batch: int,
                          length: int) -> tuple[PhaseFigure, ...]:
    """FSDP2's in-step moments (above), each with its arithmetic; () where they are not modelled: without FSDP2, for
    a class other than Llama, beside context or expert parallelism, with checkpointing, under bf16-pure, or with
    fewer than two layers."""
    import math

    from ..dims import config_int
    from ..dtypes import itemsize
    from ..memory.activations import embedding_gradient
    from ..memory.states import trained_dtype
    from .activations import local_config

    layout = ctx.layout
    # traced here for Llama itself (no biases, no sliding window), one device's step a rank, no checkpointing
    if layout.shard not in ("fsdp", "hsdp") or layout.shard_degree == 1 or local_recipe_missing(ctx) or \
            getattr(ctx.text, "model_type", None) != "llama" or layout.cp > 1 or layout.ep > 1 or \
            ctx.shape.get("checkpointing"):
        return ()
    kind = "fp32" if ctx.precision == "fp32" else "mixed" if ctx.precision.endswith("-mixed") else None
    layers = config_int(ctx.text, "num_hidden_layers") or 0
    d = layout.shard_degree

    def size(p: Placement) -> int:
        return itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]

    def rows(p: Placement) -> int:  # a rank's shard of dim 0, ⌈dim0 / d⌉ rows, in elements
        shape = p.local_shape or (1,)
        return -(-shape[0] // d) * math.prod(shape[1:])

    by_layer: dict[int, list[Placement]] = {}
    root: list[Placement] = []
    for p in placements:
        match = LAYER_PREFIX.match(p.name)
        if match:
            by_layer.setdefault(int(match.group(2)), []).append(p)
        else:
            root.append(p)
    if kind is None or layers < 2 or sorted(by_layer) != list(range(layers)):
        return ()
    padded = {k: sum(rows(p) * d * size(p) for p in group) for k, group in by_layer.items()}  # all-gathered
    shard = {k: sum(rows(p) * size(p) for p in group) for k, group in by_layer.items()}  # reduce-scattered
    root_bytes = sum(rows(p) * d * size(p) for p in root)
    head = sum(p.local_numel * size(p) for p in root if p.role.startswith("head") or p.role == "norm.final")
    local = local_config(ctx.text, layout.tp) if layout.tp > 1 else ctx.text
    h = config_int(ctx.text, "hidden_size") or 0
    i = config_int(local, "intermediate_size") or 0
    head_dim = config_int(local, "head_dim") or h // (config_int(ctx.text, "num_attention_heads") or 1)
    seq = -(-length // layout.cp)
    tokens = batch * seq
    per_layer = local_activations(ctx, local_shape(ctx, placements), batch, length).per_layer
    casts = kind == "mixed"
    resident = resident_bytes(device_states_of(ctx, placements), ctx.buffer_bytes)
    rope = 8 * seq * head_dim + 8

    def at_layer(k: int, moment: str) -> PhaseFigure:
        roles = {p.role: p.local_numel for p in by_layer[k]}
        attn = sum(roles.get(r, 0) for r in ("attention.query", "attention.key", "attention.value",
                                             "attention.output"))
        freed, held, flowing, with_grads, cast, copied = _FSDP_MOMENTS[kind][moment]
        if freed is not None:
            own = per_layer - tokens * (freed[0] * h + freed[1] * i)
            own_text = (f"all but its MLP's and the post-norm output's, per layer − T·({freed[0]}h + {freed[1]}i)"
                        if freed[0] else f"all but its MLP's, per layer − {freed[1]}·T·i")
        else:
            own = tokens * (held[0] * h + held[1])
            own_text = f"the input norm's saved input, normalised input and root, and q's input, T·({held[0]}h + " \
                       f"{held[1]})"
        grads = sum(p.local_numel * size(p) for p in by_layer[k] if p.role in with_grads) + \
            (2 * roles.get(cast, 0) if cast else 0)
        below_casts = sum(n for kk in range(k) for p in by_layer[kk] for n in [p.local_numel]
                          if p.role.startswith(("mlp.", "attention.")) and not p.role.endswith("norm"))
        # the layer's attention copies (its MLP's moments) and the MLP's own still read
        copies = 2 * (below_casts + attn + sum(roles.get(r, 0) for r in copied)) if casts else 0
        flow = tokens * (flowing[0] * h + flowing[1] * i)
        flow_text = f"T·({flowing[0]}h" + (f" + {flowing[1]}i)" if flowing[1] else ")")
        above = sum(shard[kk] for kk in range(k + 1, layers))
        reduce_in = padded[k + 1] if k + 1 < layers else 0
        prefetched = padded[k - 1] if k >= 1 else 0
        fsdp = root_bytes + head + padded[k] + prefetched + reduce_in + above
        total = resident + k * per_layer + own + flow + grads + copies + rope + fsdp
        words = (f"layers below saved {k} × {per_layer:,} + layer {k}'s activations ({own_text}) {own:,} + "
                 f"gradients flowing {flow_text} {flow:,} + its weight gradients so far {grads:,}"
                 + (f" + autocast's 16-bit weight copies still held {copies:,}" if copies else "")
                 + f" + the rotary tables and the loss's scalars, 8·S·hd + 8 = {rope:,}; FSDP2: the root unit "
                 f"all-gathered {root_bytes:,} + the head's and final norm's gradients unsharded {head:,} + layer "
                 f"{k}'s parameters all-gathered {padded[k]:,}"
                 + (f" + layer {k - 1}'s all-gather output, prefetched {prefetched:,}" if prefetched else "")
                 + (f" + layer {k + 1}'s reduce-scatter input {reduce_in:,}" if reduce_in else "")
                 + (f" + the shards of the {layers - 1 - k} layers above {above:,}" if above else ""))
        return PhaseFigure("backward", total, f"FSDP2: inside layer {k}'s backward ({moment})", words, above)

    out = [at_layer(k, moment) for k in sorted({layers - 1, layers - 2, min(1, layers - 2)})
           for moment in _FSDP_MOMENTS[kind]]
    # the forward's all-gathers: a unit's copy-out allocates its parameters beside its all-gather output while the
    # previous unit's output is still referenced (wait_for_unshard frees it from its comm state, but its local
    # `prev_all_gather_state` holds it to the function's end): at layer 0 the root's, at the last layer layer L − 2's
    hidden = embedding_gradient(ctx.text, batch=batch, seq=seq, precision=ctx.precision) - 8
    positions = 8 * seq * head_dim + 8 * seq
    for k in sorted({0, layers - 1}):
        previous = root_bytes if k == 0 else padded[k - 1]
        layer_casts = 2 * sum(p.local_numel for kk in range(k) for p in by_layer[kk]
                              if p.role.startswith(("mlp.", "attention.")) and not p.role.endswith("norm")) \
            if casts else 0
        below = k * per_layer + layer_casts
        total = resident + root_bytes + previous + 2 * padded[k] + below + hidden + positions
        out.append(PhaseFigure("forward", total, f"FSDP2: layer {k}'s all-gather in the forward", (
            f"the root unit all-gathered {root_bytes:,} + {'its' if k == 0 else f'layer {k - 1}'}'s all-gather "
            f"output, still referenced {previous:,} + layer {k}'s all-gather output and its parameters copied out "
            f"of it, 2 × {padded[k]:,}"
            + (f" + layers below saved {k} × {per_layer:,}" if k else "")
            + (f" + their autocast 16-bit weight copies {layer_casts:,}" if layer_casts else "")
            + f" + the hidden state entering it {hidden:,} + the rotary tables and positions, 8·S·hd + 8·S = "
            f"{positions:,}"), 0))
    # the embedding's backward, the step's last, and the root's post-backward after it: every root gradient
    # unsharded (the embedding's whole on every tp rank, where DTensor returns a vocabulary-parallel embedding's
    # gradient Replicate), the root still gathered (it reshards only after collecting them), layer 0's
    # reduce-scatter input and every layer's reduce-scattered shard; in the embedding's backward its output's
    # gradient too, in the post-backward under tp the local chunk FSDP2 takes of the Replicate gradient
    whole = whole_embedding_gradient(ctx, placements, under_fsdp=True)
    root_grads = sum(p.local_numel * size(p) for p in root) + (whole[0] - whole[1] if whole is not None else 0)
    shards = sum(shard.values())
    held = root_bytes + root_grads + padded[0] + shards
    held_text = (f"the root unit all-gathered {root_bytes:,} + its gradients unsharded {root_grads:,}"
                 + (" (the embedding's whole on every tp rank: DTensor's Replicate)" if whole is not None else "")
                 + f" + layer 0's reduce-scatter input {padded[0]:,} + every layer's reduce-scattered gradients "
                 f"{shards:,}")
    output = embedding_gradient(ctx.text, batch=batch, seq=seq, precision=ctx.precision)
    out.append(PhaseFigure("backward", resident + held + output, "FSDP2: the embedding's backward", (
        f"{held_text} + the embedding output's gradient and the loss's scalars {output:,}"), shards))
    if whole is not None:
        ids = 8 * tokens + 8
        out.append(PhaseFigure("backward", resident + held + whole[1] + ids, "FSDP2: the root's post-backward", (
            f"{held_text} + the local chunk FSDP2 takes of the embedding's gradient {whole[1]:,} + a (B, S) int64 "
            f"of token ids and the loss's scalars, 8·T + 8 = {ids:,}"), shards))
    return tuple(out)
