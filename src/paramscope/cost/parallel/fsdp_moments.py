"""FSDP2's in-step moments for the Llama family's closed form (Llama, Mistral, Qwen2): what a rank holds beyond its
sharded states inside torch's fully_shard step (a unit's all-gather, the root's unsharded gradients, the
reduce-scatter input, the backward prefetch, each layer's weight-gradient moments), each a PhaseFigure with its
arithmetic, under torch.autocast or FSDP2's MixedPrecisionPolicy. estimate.py adds them to the data-parallel and the
shard's closed forms."""

from __future__ import annotations

from typing import Any

from ..memory.phases import PhaseFigure
from .device import StepContext
from .device_parts import (device_states_of, fsdp_policy, local_activations, local_recipe_missing, local_shape,
                           policy_context, resident_bytes, ring_output_copies, tied_bytes, whole_embedding_gradient)
from .pipeline import LAYER_PREFIX
from .rules import Placement


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
#     the gate output's 16-bit gradient, 2i, flowing); "MLP's product": the SiLU-and-product backward after
#     down_proj's (down's input, its product, 2i, freed, and its 16-bit weight copy; the gradients flowing, the
#     residual's fp32 4h, down's input gradient and the gate's and up's, 6i; down's weight gradient in fp32);
#     "MLP's norm": the post-attention norm's backward after the MLP's (the MLP's activations and the norm's
#     normalised output and reciprocal root, 8h + 8i + 4, freed; the norm's saved input held; the residual's and
#     the norm's fp32 gradients, 24h, flowing, under tp the input gradient all-reduced; the MLP's and the norm's
#     weight gradients held; the MLP's 16-bit copies freed);
#   "MLP" in fp32: the gate projection's weight-gradient matmul (its input, the post-norm output, still held, and
#     the gate output's gradient, 4i, flowing); "MLP's product": the SiLU-and-product backward after down_proj's
#     (its product's 4i freed, the gate, up and product gradients, 12i, flowing; down's weight gradient held);
#   "attention" in fp32: q_proj's weight gradient, the layer's last matmul (of the layer only the input norm's saved
#     input, normalised input, output and reciprocal root held; every weight gradient but the input norm's).
#   bf16-pure (no autocast copies; each norm upcasts its input to fp32 and saves that copy): "MLP's norm" and
#     "MLP's product" as above in 16 bits (the norm's backward's four fp32 temporaries, 16h, beside the fp32 product
#     gradient, 4h, and the residual's 16-bit gradient, 2h); "attention's norm": the input norm's backward, the
#     layer's last (of the layer only the norm's fp32 input held; every weight gradient). The gate's and q_proj's
#     weight-gradient moments of fp32 lie under these in 16 bits (each layer's largest on the traced cuts is one of
#     these three: q_proj's holds less than its norm's backward after it, the gate's less than the norm's after
#     the MLP while the rank's MLP width is under about 6h) and are not priced.
#   The rotary cos and sin are in the hidden state's dtype: 8·S·hd in fp32 and under autocast, 4·S·hd when pure.
# Under full checkpointing (each layer's forward recomputed in its backward; FSDP2 neither gathers nor reshards
# there) the same moments, the layers below holding their checkpointed inputs, layer k its recomputed activations
# and no autocast copies of the layers below; the checkpoints keep the position ids, a (1, S) int64, and in bf16
# layer k's own 16-bit input (the norm saves its fp32 copy; in fp32 and under autocast it saves that same tensor).
# Beside those, on every moment but the root's post-backward: under tp the vocabulary-parallel embedding's masked
# token ids, a (B, S) int64 it saves for its backward. A projection's bias (Qwen2's q, k and v) has its gradient
# with its weight's and no 16-bit copy held (the addition reads it; autocast's copy is freed in the forward).
# Each is linear in k (a layer lower holds one layer's activations fewer and one shard more), so its largest is at
# k = L − 2 or at k = 1, the lowest with a prefetch; the last layer (no reduce-scatter input yet) is its own case.
# Then the embedding's backward (every root gradient, its output's gradient) and, under tp, the root's
# post-backward; and in the forward each unit's all-gather (below, where it is made) and, in 16 bits, the last layer's
# residual add, its all-gather output still held (no unit follows it in the forward: _last_residual_add); and in
# 16 bits each layer's pre-backward, its parameters copied out beside its prefetched all-gather output, then (past
# layer 0) the prefetch of the layer below, its 16-bit all-gather input beside its output (a 2-layer cut's peak).
# A head tied to the embedding (Qwen2-0.5B's, Llama-3.2-1B's: the root's one weight used twice): the head's matmul
# backward makes the whole weight's gradient, held unsharded from there (beside every layer's moments, as an untied
# head's is); the embedding's backward makes its own beside it, and autograd adds the two out of place, both live
# beside their sum once the output's gradient is freed: "the tied weight's two gradients summed", 2·V·h a gradient's
# size over the untied root (the root's peak where it outweighs the activations). Beside tp the vocabulary-parallel
# embedding's backward returns the gradient whole (DTensor's Replicate) and its local chunk is copied out to meet the
# head's Shard(0) one: the whole gradient, V·h, beside the two local ones and their sum. Traced under dp and dp × tp
# (autocast in fp32, 16-bit mixed and bf16-pure; the policy; with and without checkpointing; --sp too).
# Under FSDP2's MixedPrecisionPolicy (param_dtype 16-bit, reduce_dtype fp32, no autocast: torchtitan's apply_fsdp;
# device_parts.policy_context) the rank runs bf16-pure's step over its fp32 shards: the units gathered in 16 bits
# (2 B an element, padded as above), no autocast copies, the activations and the unsharded weight gradients
# bf16-pure's; the reduce-scatter input is fp32 (foreach_reduce allocates it in reduce_dtype and chunk-cats the 16-bit
# gradients into it, 4 B an element, padded), and so are its output and every reduce-scattered shard. The same
# moments as bf16-pure, with those sizes, and two of the root's own, after its post-backward reshards (the gathered
# root and layer 0's reduce-scatter input freed): "the root's reduce-scatter input", its fp32 input beside the root's
# 16-bit gradients (under tp the embedding's local chunk: DTensor's Replicate gradient is freed once FSDP2 takes it),
# and "the root's reduce-scatter output", its fp32 shard beside that input and the last root parameter's 16-bit
# gradient, which foreach_reduce's loop variable still references (the head's). Under autocast these lie under
# the embedding's backward (the input, in fp32 as the gradients are, replaces them); under the policy the fp32 input
# is twice the 16-bit gradients, and one of them is the peak wherever the root outweighs the activations (llama-3-8b
# on 8 ranks at 512 tokens). Read off one rank traced by MemTracker with the policy applied (traced/parallel.py).
# Beside context parallel (the policy alone; FSDP2 over dp × cp, torchtitan's dp_shard_cp) the same moments at the
# rank's S / cp tokens, each layer's ring output copied for o_proj held from its forward to its o_proj's backward
# (_ring_copy: the layers below's at every moment, layer k's own inside its MLP's backward), and one moment more,
# inside layer k's ring backward on rank 0 (_ring_backward_bytes): the fp32 dq, dk, dv of torch's ring, every rank's K
# and V all-gathered and the dk, dv passed all-to-all, the peak from cp 4 on the traced cuts (8,704 B over the MLP's
# norm at cp 4). Traced on the ring (traced/context_parallel.py), with and without tp; beside sp not (the rank's
# tokens split again over tp inside the layer: 44,672 B over on a cp 2 × tp 2 cut), nor unbalanced beyond cp 2.

# the classes whose ranks were traced against these moments: Llama's layer, Mistral's (the same; its sliding window
# is the recipe's concern) and Qwen2's (q, k and v with biases)
TRACED_FAMILY = ("llama", "mistral", "qwen2")

_FSDP_MOMENTS = {
    # kind: {moment: (of the layer's own activations, freed before it, per token (·h, ·i, constant), or held, (·h,
    #                 constant);
    #                 the gradients flowing, per token (·h, ·i); the weights whose gradients it holds, in fp32 (and
    #                 the one whose 16-bit gradient is being cast, under autocast); the layer's MLP weights whose
    #                 16-bit copies it still holds)}
    "mixed": {"MLP's norm": ((8, 8, 4), None, (24, 0), ("mlp.gate", "mlp.up", "mlp.down", "mlp.norm"), "", ()),
              "MLP's product": ((0, 2, 0), None, (4, 6), ("mlp.down",), "", ("mlp.gate", "mlp.up")),
              "MLP's up": ((2, 6, 0), None, (8, 2), ("mlp.up", "mlp.down"), "mlp.up", ("mlp.gate",)),
              "MLP": ((4, 8, 0), None, (8, 0), ("mlp.gate", "mlp.up", "mlp.down"), "mlp.gate", ())},
    "fp32": {"MLP's product": ((0, 4, 0), None, (4, 12), ("mlp.down",), "", ()),
             "MLP": ((0, 16, 0), None, (12, 4), ("mlp.gate", "mlp.up", "mlp.down"), "", ()),
             "attention": (None, (12, 4), (16, 0), ("attention.query", "attention.key", "attention.value",
                                                     "attention.output", "mlp.gate", "mlp.up", "mlp.down",
                                                     "mlp.norm"), "", ())},
    "bf16": {"MLP's norm": ((4, 8, 4), None, (22, 0), ("mlp.gate", "mlp.up", "mlp.down", "mlp.norm"), "", ()),
             "MLP's product": ((0, 2, 0), None, (2, 6), ("mlp.down",), "", ()),
             "attention's norm": (None, (4, 0), (22, 0), ("attention.query", "attention.key", "attention.value",
                                                          "attention.output", "mlp.gate", "mlp.up", "mlp.down",
                                                          "mlp.norm", "attention.norm"), "", ())},
}


def fsdp_moments_missing(ctx: StepContext, placements: tuple[Placement, ...]) -> str:
    """Why FSDP2's in-step moments (fsdp_backward_moments) are not modelled for this rank, in words ("here ..."); ""
    where they are: FSDP2 sharding over more than one rank, a class of Llama, Mistral or Qwen2 with its closed form
    on a rank's shard, no expert parallelism, no context parallelism but under FSDP2's MixedPrecisionPolicy (full
    sharding, no sp, the head untied; balanced beyond cp 2), fp32, a mixed precision (autocast or FSDP2's
    MixedPrecisionPolicy) or bf16-pure, and two layers or more; the head tied to the embedding or not."""
    from ..dims import config_int

    layout = ctx.layout
    ctx = policy_context(ctx)
    if layout.shard not in ("fsdp", "hsdp") or layout.shard_degree == 1:
        return "FSDP2 shards nothing"
    if local_recipe_missing(ctx) or getattr(ctx.text, "model_type", None) not in TRACED_FAMILY:
        return f"the class is {ctx.view.class_name}"
    if layout.ep > 1:
        return "expert parallelism is applied"
    # context parallel under the policy: torch's ring beside FSDP2 over dp × cp, held to the traced rank (the ring's
    # kept output copies, _ring_copy, and its backward's own buffers, _ring_backward_bytes); where 2·cp does not
    # divide S the ring runs unbalanced, traced at cp 2 alone
    if layout.cp > 1 and not fsdp_policy(layout):
        return "context parallelism is applied"
    if layout.cp > 2 and ctx.seq % (2 * layout.cp):
        return f"context parallel {layout.cp} runs unbalanced at {ctx.seq:,} tokens (2·cp does not divide them)"
    # beside sp a layer's in-backward moments are priced as without sp, as they are without cp (the 4-layer cut, cp 2 ×
    # tp 2 × sp: 44,672 B over the traced rank; without cp 85,760 B over): a few KB over on the cuts, 0 B on
    # llama-3-8b's cp × tp × sp layouts at the search's setting (equal to their derived ranks)
    if layout.cp > 1 and (layout.shard != "fsdp" or tied_bytes(ctx, placements)):
        return "context parallel is applied beside hybrid sharding or a tied head"
    if _kind(ctx.precision) is None:
        return f"the precision is {ctx.precision}"
    layers = config_int(ctx.text, "num_hidden_layers") or 0
    if layers < 2 or sorted(_split(placements)[0]) != list(range(layers)):
        return "the model has fewer than two layers"
    return ""


def _kind(precision: str) -> str | None:
    return "fp32" if precision == "fp32" else "bf16" if precision == "bf16-pure" else \
        "mixed" if precision.endswith("-mixed") else None


def _split(placements: tuple[Placement, ...]) -> tuple[dict[int, list[Placement]], list[Placement]]:
    """(each layer's placements by its index, the root unit's: the rest), as FSDP2's units hold them."""
    by_layer: dict[int, list[Placement]] = {}
    root: list[Placement] = []
    for p in placements:
        match = LAYER_PREFIX.match(p.name)
        if match:
            by_layer.setdefault(int(match.group(2)), []).append(p)
        else:
            root.append(p)
    return by_layer, root


def fsdp_backward_moments(ctx: StepContext, placements: tuple[Placement, ...], batch: int,
                          length: int) -> tuple[PhaseFigure, ...]:
    """FSDP2's in-step moments (above), each with its arithmetic; () where they are not modelled
    (fsdp_moments_missing says why)."""
    import math

    from ..dims import config_int
    from ..dtypes import itemsize
    from ..memory.activations import embedding_gradient
    from ..memory.states import trained_dtype
    from .activations import local_config

    # traced here for Llama, Mistral and Qwen2, one device's step a rank, with and without full checkpointing
    if fsdp_moments_missing(ctx, placements):
        return ()
    layout = ctx.layout
    # under FSDP2's MixedPrecisionPolicy: bf16-pure's step (16-bit units, activations and unsharded gradients) over
    # the fp32 shards, reduce-scattered in fp32
    policy = fsdp_policy(layout)
    ctx = policy_context(ctx)
    kind = _kind(ctx.precision)
    layers = config_int(ctx.text, "num_hidden_layers") or 0
    d = layout.shard_degree

    def size(p: Placement) -> int:
        return itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]

    def rows(p: Placement) -> int:  # a rank's shard of dim 0, ⌈dim0 / d⌉ rows, in elements
        shape = p.local_shape or (1,)
        return -(-shape[0] // d) * math.prod(shape[1:])

    by_layer, root = _split(placements)

    def reduced(p: Placement) -> int:  # the reduce-scatter's element size: the policy's reduce_dtype, fp32
        return 4 if policy else size(p)

    padded = {k: sum(rows(p) * d * size(p) for p in group) for k, group in by_layer.items()}  # all-gathered
    # the reduce-scatter input (the unsharded gradients padded and chunk-catted) and its output, the rank's shard
    reduce_input = {k: sum(rows(p) * d * reduced(p) for p in group) for k, group in by_layer.items()}
    shard = {k: sum(rows(p) * reduced(p) for p in group) for k, group in by_layer.items()}
    root_bytes = sum(rows(p) * d * size(p) for p in root)
    head = sum(p.local_numel * size(p) for p in root if p.role.startswith("head") or p.role == "norm.final")
    # a head tied to the embedding (one root parameter, used twice): the head's matmul backward makes the whole
    # weight's gradient, held unsharded beside the layers' moments until the embedding's backward adds its own
    tied = tied_bytes(ctx, placements)
    head += tied
    tied_words = " (the head's the tied weight's whole gradient)" if tied else ""
    local = local_config(ctx.text, layout.tp) if layout.tp > 1 else ctx.text
    h = config_int(ctx.text, "hidden_size") or 0
    i = config_int(local, "intermediate_size") or 0
    head_dim = config_int(local, "head_dim") or h // (config_int(ctx.text, "num_attention_heads") or 1)
    seq = -(-length // layout.cp)
    tokens = batch * seq
    shape = local_shape(ctx, placements)
    per_layer = local_activations(ctx, shape, batch, length).per_layer  # a layer below saves (its input, checkpointed)
    checkpointing = bool(ctx.shape.get("checkpointing"))
    # the layer in its backward: recomputed whole under checkpointing
    whole_layer = local_activations(ctx, dict(shape, checkpointing=False), batch, length).per_layer \
        if checkpointing else per_layer
    casts = kind == "mixed"
    resident = resident_bytes(device_states_of(ctx, placements), ctx.buffer_bytes)
    # the rotary cos and sin, (S, hd) each in the hidden state's dtype (fp32 under autocast, bf16 when pure)
    rotary = 4 if kind == "bf16" else 8
    rope = rotary * seq * head_dim + 8
    # under checkpointing each layer's checkpoint keeps its inputs, the position ids a (1, S) int64 among them,
    # through the backward until layer 0's
    positions_kept = 8 * seq if checkpointing else 0
    # and layer k's checkpointed input: in fp32 and under autocast the input norm saves that same fp32 tensor (counted
    # in the recomputed layer); in bf16 the norm saves its fp32 copy, so the checkpoint's 16-bit input is its own
    kept_input = per_layer if checkpointing and kind == "bf16" else 0
    # a vocabulary-parallel embedding (tp) saves its masked token ids, a (B, S) int64, for its backward: held from
    # the embedding's forward to its backward, the whole step's moments but the root's post-backward
    masked = 8 * tokens if layout.tp > 1 and any(p.role == "embeddings.word" and p.tp == "vocabulary" and
                                                 p.name in ctx.trainable for p in root) else 0
    masked_text = f" + the embedding's masked token ids, 8·T = {masked:,}" if masked else ""
    ring = _ring_copy(ctx, batch, length)


    def fsdp_words(k: int, prefetched: int, reduce_in: int, above: int) -> str:
        """What FSDP2 holds at a moment inside layer k's backward, in words (the moments below share it)."""
        return (f"FSDP2: the root unit all-gathered {root_bytes:,} + the head's and final norm's gradients "
                f"unsharded{tied_words} {head:,} + layer {k}'s parameters all-gathered {padded[k]:,}"
                + (f" + layer {k - 1}'s all-gather output, prefetched {prefetched:,}" if prefetched else "")
                + (f" + layer {k + 1}'s reduce-scatter input {reduce_in:,}" if reduce_in else "")
                + (f" + the shards of the {layers - 1 - k} layers above {above:,}" if above else ""))
    def at_layer(k: int, moment: str) -> PhaseFigure:
        roles = {p.role: p.local_numel for p in by_layer[k] if _copied(p)}  # the projections' weights
        attn = sum(roles.get(r, 0) for r in ("attention.query", "attention.key", "attention.value",
                                             "attention.output"))
        freed, held, flowing, with_grads, cast, copied = _FSDP_MOMENTS[kind][moment]
        if freed is not None:
            own = whole_layer - tokens * (freed[0] * h + freed[1] * i + freed[2])
            own_text = (f"all but its MLP's and the post-norm output's, per layer − T·({freed[0]}h + {freed[1]}i"
                        + (f" + {freed[2]})" if freed[2] else ")") if freed[0] else
                        f"all but its MLP's, per layer − {freed[1]}·T·i")
        else:
            own = tokens * (held[0] * h + held[1])
            own_text = ("the input norm's saved input, normalised input and root, and q's input" if held[1] else
                        "the input norm's saved fp32 input") + f", T·({held[0]}h + {held[1]})"
        grads = sum(p.local_numel * size(p) for p in by_layer[k] if p.role in with_grads) + \
            (2 * roles.get(cast, 0) if cast else 0)
        below_casts = 0 if checkpointing else sum(p.local_numel for kk in range(k) for p in by_layer[kk]
                                                   if _copied(p))
        # the layer's attention copies (its MLP's moments) and the MLP's own still read
        copies = 2 * (below_casts + attn + sum(roles.get(r, 0) for r in copied)) if casts else 0
        flow = tokens * (flowing[0] * h + flowing[1] * i)
        flow_text = f"T·({flowing[0]}h" + (f" + {flowing[1]}i)" if flowing[1] else ")")
        above = sum(shard[kk] for kk in range(k + 1, layers))
        reduce_in = reduce_input[k + 1] if k + 1 < layers else 0
        prefetched = padded[k - 1] if k >= 1 else 0
        fsdp = root_bytes + head + padded[k] + prefetched + reduce_in + above
        rings = _rings_held(ring, k, moment, checkpointing)
        total = resident + (k + (1 if kept_input else 0)) * per_layer + own + flow + grads + copies + rope + \
            positions_kept + masked + fsdp + rings * ring
        below_words = (f"layers below saved {k} × {per_layer:,}" if not checkpointing else
                       "the checkpointed inputs of the layers below" + (" and its own" if kept_input else "")
                       + f" {k + (1 if kept_input else 0)} × {per_layer:,}")
        recomputed = " recomputed" if checkpointing else ""
        words = (f"{below_words} + layer {k}'s{recomputed} activations ({own_text}) {own:,} + "
                 f"gradients flowing {flow_text} {flow:,} + its weight gradients so far {grads:,}"
                 + (f" + autocast's 16-bit weight copies still held {copies:,}" if copies else "")
                 + f" + the rotary tables and the loss's scalars, {rotary}·S·hd + 8 = {rope:,}"
                 + (f" + the position ids the checkpoints keep, 8·S = {positions_kept:,}" if positions_kept else "")
                 + (f" + ring attention's outputs copied for o_proj, {rings} × {ring:,}" if rings else "")
                 + f"{masked_text}; "
                 + fsdp_words(k, prefetched, reduce_in, above))
        return PhaseFigure("backward", total, f"FSDP2: inside layer {k}'s backward ({moment})", words, above)

    def in_ring(k: int) -> PhaseFigure:
        """Inside layer k's attention backward, torch's ring at its peak (_ring_backward_bytes), over what the layer
        holds as its attention's backward starts: its o_proj's backward done (its ring output copy freed)."""
        own, ring_words = _ring_backward_bytes(ctx, tokens, h)
        grads = sum(p.local_numel * size(p) for p in by_layer[k] if p.role in _BEFORE_ATTENTION)
        above = sum(shard[kk] for kk in range(k + 1, layers))
        reduce_in = reduce_input[k + 1] if k + 1 < layers else 0
        prefetched = padded[k - 1] if k >= 1 else 0
        fsdp = root_bytes + head + padded[k] + prefetched + reduce_in + above
        rings = 0 if checkpointing else k
        below = (k + (1 if kept_input else 0)) * per_layer
        total = resident + below + own + grads + rope + positions_kept + masked + fsdp + rings * ring
        words = ((f"layers below saved {k} × {per_layer:,}" if not checkpointing else
                  f"the checkpointed inputs of the layers below{' and its own' if kept_input else ''} "
                  f"{k + (1 if kept_input else 0)} × {per_layer:,}")
                 + f" + {ring_words} + its weight gradients so far (the MLP's, its norm's and o_proj's) {grads:,}"
                 + f" + the rotary tables and the loss's scalars, {rotary}·S·hd + 8 = {rope:,}"
                 + (f" + the position ids the checkpoints keep, 8·S = {positions_kept:,}" if positions_kept else "")
                 + (f" + ring attention's outputs copied for o_proj, {rings} × {ring:,}" if rings else "")
                 + f"{masked_text}; "
                 + fsdp_words(k, prefetched, reduce_in, above))
        return PhaseFigure("backward", total, f"FSDP2: inside layer {k}'s backward (the ring attention's)", words,
                           above)

    out = [at_layer(k, moment) for k in sorted({layers - 1, layers - 2, min(1, layers - 2)})
           for moment in _FSDP_MOMENTS[kind]]
    if ring:  # torch's balanced ring (cp; 2·cp divides S), under the policy: its backward's own buffers
        out += [in_ring(k) for k in sorted({layers - 1, layers - 2, min(1, layers - 2)})]
    # the forward's all-gathers: a unit's copy-out allocates its parameters beside its all-gather output while the
    # previous unit's output is still referenced (wait_for_unshard frees it from its comm state, but its local
    # `prev_all_gather_state` holds it to the function's end): at layer 0 the root's, at the last layer layer L − 2's
    hidden = embedding_gradient(ctx.text, batch=batch, seq=seq, precision=ctx.precision) - 8
    positions = rotary * seq * head_dim + 8 * seq
    # in 16 bits (bf16-pure, the policy) each norm saves its fp32 copy of its input, so the embedding's 16-bit output,
    # which the model's forward keeps referenced (inputs_embeds) to its end, is held apart from the layers' saved
    # tensors past layer 0 (in fp32 and under autocast the first norm saves that very tensor; under checkpointing it
    # is layer 0's checkpointed input); traced without tp
    embedded = hidden if kind == "bf16" and not checkpointing and layout.tp == 1 else 0
    embedded_text = f" + the embedding's output, which the model keeps referenced {embedded:,}" if embedded else ""
    for k in sorted({0, layers - 1}):
        previous = root_bytes if k == 0 else padded[k - 1]
        layer_casts = 2 * sum(p.local_numel for kk in range(k) for p in by_layer[kk] if _copied(p)) \
            if casts and not checkpointing else 0
        rings = 0 if checkpointing else k  # the layers below keep their ring outputs' copies (cp)
        below = k * per_layer + layer_casts + rings * ring + (embedded if k else 0)
        total = resident + root_bytes + previous + 2 * padded[k] + below + hidden + positions + masked
        out.append(PhaseFigure("forward", total, f"FSDP2: layer {k}'s all-gather in the forward", (
            f"the root unit all-gathered {root_bytes:,} + {'its' if k == 0 else f'layer {k - 1}'}'s all-gather "
            f"output, still referenced {previous:,} + layer {k}'s all-gather output and its parameters copied out "
            f"of it, 2 × {padded[k]:,}"
            + (f" + layers below saved {k} × {per_layer:,}" if k else "")
            + (f" + their autocast 16-bit weight copies {layer_casts:,}" if layer_casts else "")
            + (f" + their ring attention outputs copied for o_proj, {rings} × {ring:,}" if rings and ring else "")
            + (embedded_text if k else "")
            + f" + the hidden state entering it {hidden:,} + the rotary tables and positions, {rotary}·S·hd + 8·S = "
            f"{positions:,}{masked_text}"), 0))
    if embedded:
        out.append(_last_residual_add(resident, root_bytes, padded[layers - 1], layers, per_layer, ring, hidden,
                                      positions))
        # each layer's pre-backward in 16 bits: its parameters copied out of its all-gather output (prefetched in the
        # layer above's backward) while that output is still referenced, before it prefetches the layer below's;
        # the layer's saved tensors all held, the gradient flowing into it, the layer above's reduce-scatter input
        # and the shards above. Linear in k: its largest at k = 0 or L − 2 (a 2-layer cut's peak, 80,640 B over
        # the in-layer moments: layer 0 has no layer below prefetched beside them); past layer 0, the prefetch of
        # the layer below that follows it
        for k in sorted({0, layers - 2}):
            above = sum(shard[kk] for kk in range(k + 1, layers))
            saved = (k + 1) * (per_layer + ring)
            total = resident + root_bytes + head + 2 * padded[k] + reduce_input[k + 1] + above + saved + hidden + rope
            out.append(PhaseFigure("backward", total, f"FSDP2: layer {k}'s parameters copied out in its backward", (
                f"layers {k} and below saved {k + 1} × {per_layer:,}"
                + (f" + their ring attention outputs copied for o_proj, {k + 1} × {ring:,}" if ring else "")
                + f" + the gradient flowing into layer {k} {hidden:,} + the rotary tables and the loss's scalars, "
                f"{rotary}·S·hd + 8 = {rope:,}; FSDP2: the root unit all-gathered {root_bytes:,} + the head's and "
                f"final norm's gradients unsharded{tied_words} {head:,} + layer {k}'s all-gather output, prefetched "
                f"and still referenced, and its parameters copied out of it, 2 × {padded[k]:,} + layer {k + 1}'s "
                f"reduce-scatter input {reduce_input[k + 1]:,} + the shards of the {layers - 1 - k} layers above "
                f"{above:,}"), above))
            if k:  # then it frees that output and prefetches layer k − 1's: its 16-bit input (the rank's shard cast)
                # beside its output, freed as the all-gather returns
                gather_in = padded[k - 1] // d
                out.append(PhaseFigure(
                    "backward", total - padded[k] + padded[k - 1] + gather_in,
                    f"FSDP2: layer {k - 1}'s all-gather prefetched in layer {k}'s backward", (
                        f"layer {k}'s parameters copied out in its backward {total - resident:,} − its all-gather "
                        f"output, freed, {padded[k]:,} + layer {k - 1}'s all-gather output {padded[k - 1]:,} and its "
                        f"input, the rank's shard in 16 bits, {gather_in:,}"), above))
    # the embedding's backward, the step's last, and the root's post-backward after it: every root gradient
    # unsharded (the embedding's whole on every tp rank, where DTensor returns a vocabulary-parallel embedding's
    # gradient Replicate), the root still gathered (it reshards only after collecting them), layer 0's
    # reduce-scatter input and every layer's reduce-scattered shard; in the embedding's backward its output's
    # gradient too, in the post-backward under tp the local chunk FSDP2 takes of the Replicate gradient
    whole = whole_embedding_gradient(ctx, placements, under_fsdp=True)
    root_grads = sum(p.local_numel * size(p) for p in root) + (whole[0] - whole[1] if whole is not None else 0)
    shards = sum(shard.values())
    held = root_bytes + root_grads + reduce_input[0] + shards
    held_text = (f"the root unit all-gathered {root_bytes:,} + its gradients unsharded {root_grads:,}"
                 + (" (the embedding's whole on every tp rank: DTensor's Replicate)" if whole is not None else "")
                 + f" + layer 0's reduce-scatter input {reduce_input[0]:,} + every layer's reduce-scattered gradients "
                 f"{shards:,}")
    output = embedding_gradient(ctx.text, batch=batch, seq=seq, precision=ctx.precision)
    # under tp a vocabulary-parallel tied embedding's backward returns its gradient whole (DTensor's Replicate),
    # redistributed to the head's Shard(0) (a local chunk, copied) before the two are added
    replicate = _tied_whole(ctx, root) if tied and layout.tp > 1 else 0
    own = replicate or tied
    own_words = (f" + the embedding's own gradient of the tied weight{', whole (Replicate)' if replicate else ''} "
                 f"{own:,}" if tied else "")
    out.append(PhaseFigure("backward", resident + held + output + masked + own, "FSDP2: the embedding's backward", (
        f"{held_text}{own_words} + the embedding output's gradient and the loss's scalars {output:,}{masked_text}"),
        shards))
    if tied:
        # autograd adds the two gradients of the tied weight out of place (the head's, held, and the embedding's, made
        # as its output's gradient is freed): both beside their sum until the sum replaces them
        whole_words = f" + the embedding's whole gradient (Replicate) it was taken from {replicate:,}" if replicate \
            else ""
        out.append(PhaseFigure("backward", resident + held + replicate + 2 * tied + 8 + masked,
                               "FSDP2: the tied weight's two gradients summed", (
                                   f"{held_text} (their sum among them) + the head's and the embedding's "
                                   f"gradients of the tied weight, 2 × {tied:,}{whole_words} + the loss's scalars "
                                   f"8{masked_text}"), shards))
    if whole is not None:
        ids = 8 * tokens + 8
        out.append(PhaseFigure("backward", resident + held + whole[1] + ids, "FSDP2: the root's post-backward", (
            f"{held_text} + the local chunk FSDP2 takes of the embedding's gradient {whole[1]:,} + a (B, S) int64 "
            f"of token ids and the loss's scalars, 8·T + 8 = {ids:,}"), shards))
    if policy:
        # the embedding's Replicate gradient (tp) is freed once FSDP2 has taken its local chunk, before the reduce
        out += _policy_root_reduce(root, rows, size, d, sum(p.local_numel * size(p) for p in root), shards, resident,
                                   8 * tokens + 8 if whole else 8, whole is not None)
    return tuple(out)


def _last_residual_add(resident: int, root_bytes: int, padded: int, layers: int, per_layer: int, ring: int,
                       hidden: int, positions: int) -> PhaseFigure:
    """In 16 bits (bf16-pure, the policy), without checkpointing or tp: the last layer's MLP residual add, its
    forward's largest moment. No unit follows the last layer in the forward, so its all-gather output is never
    released by a later copy-out (the unit's `prev_all_gather_state`) and stays beside its parameters copied out of
    it until the layer reshards after its forward; the layer holds all it saves (one layer's saved tensors, its ring
    output copy under cp) and, in 16 bits, the attention's residual sum, down_proj's output and the sum itself, beside
    its input and the embedding's output that the model keeps referenced. Equal to the traced rank's forward peak
    on the 4-layer cut under the policy (cp 2 at 2 × 64 and 2 × 68, cp 4 at 2 × 128 with 1 and 2 KV heads: 58,368 B
    above the last layer's all-gather, which the closed form named before); under the all-gather or the end of
    forward at cp 8, dp 2 × cp 4 and dp 2 (tests/test_policy_context_parallel.py)."""
    rings = layers * ring
    total = resident + root_bytes + 2 * padded + layers * per_layer + rings + 5 * hidden + positions
    return PhaseFigure("forward", total, f"FSDP2: layer {layers - 1}'s residual add in the forward", (
        f"the root unit all-gathered {root_bytes:,} + layer {layers - 1}'s all-gather output, still held (no unit "
        f"follows it in the forward), and its parameters copied out of it, 2 × {padded:,} + every layer's saved "
        f"tensors, its own among them, {layers} × {per_layer:,}"
        + (f" + their ring attention outputs copied for o_proj, {layers} × {ring:,}" if ring else "")
        + f" + five 16-bit hidden states, the embedding's output (the model keeps it referenced), the layer's input, "
        f"its attention's residual sum, down_proj's output and the layer's output, 5 × {hidden:,} + the rotary tables "
        f"and positions {positions:,}"), 0)


def _policy_root_reduce(root: list[Placement], rows: Any, size: Any, d: int, root_grads: int, shards: int,
                        resident: int, scalars: int, chunk: bool) -> tuple[PhaseFigure, ...]:
    """Under FSDP2's MixedPrecisionPolicy the root's post-backward, after it reshards (the gathered root and layer 0's
    reduce-scatter input freed): its reduce-scatter input in fp32 (the policy's reduce_dtype, twice its 16-bit
    gradients' bytes, padded) beside those gradients; then its output, the root's fp32 shard, beside the input and
    the last root parameter's 16-bit gradient (foreach_reduce's loop over the gradients leaves its variable on the
    last one until it returns: the head's, or the final norm's where the head is tied). The output is not counted
    among the moment's gradients: in a later micro-step (gradient accumulation) it is made beside the root's held
    shard, then added into it. `chunk`: under tp, the
    embedding's gradient is the local chunk FSDP2 took of DTensor's Replicate one, which is freed by then."""
    reduce_in = sum(rows(p) * d * 4 for p in root)
    output = sum(rows(p) * 4 for p in root)
    last = root[-1].local_numel * size(root[-1]) if root else 0
    scalar_words = "the token ids and the loss's scalars, 8·T + 8" if chunk else "the loss's scalars"
    chunk_words = " (the embedding's, the local chunk FSDP2 took)" if chunk else ""
    return (PhaseFigure("backward", resident + shards + root_grads + reduce_in + scalars,
                        "FSDP2: the root's reduce-scatter input (policy)", (
                            f"every layer's reduce-scattered gradients {shards:,} + the root's 16-bit gradients "
                            f"unsharded{chunk_words} {root_grads:,} + their reduce-scatter input in fp32, padded "
                            f"{reduce_in:,} + {scalar_words} {scalars:,}"), shards),
            PhaseFigure("backward", resident + shards + reduce_in + output + last + scalars,
                        "FSDP2: the root's reduce-scatter output (policy)", (
                            f"every layer's reduce-scattered gradients {shards:,} + the root's reduce-scatter input in "
                            f"fp32 {reduce_in:,} + its output, the root's fp32 gradient shard {output:,} + the last "
                            f"root parameter's ({root[-1].name if root else ''}) 16-bit gradient, still referenced "
                            f"{last:,} + {scalar_words} {scalars:,}"), shards))


def _tied_whole(ctx: StepContext, root: list[Placement]) -> int:
    """A vocabulary-parallel tied embedding's whole gradient, V·h in its gradient's dtype (0 where it is not cut)."""
    import math

    from ..dtypes import itemsize
    from ..memory.states import trained_dtype

    return next((math.prod(p.shape) * itemsize(trained_dtype(p, ctx.precision, ctx.own))  # type: ignore[arg-type]
                 for p in root if p.role == "embeddings.word" and p.tp == "vocabulary"), 0)


def _ring_copy(ctx: StepContext, batch: int, length: int) -> int:
    """Under context parallelism (the policy's closed form), one layer's ring attention output as o_proj keeps it:
    torch's balanced merge leaves it heads-major, so the reshape before o_proj copies it (device_parts.
    ring_output_copies, B·(S / cp)·heads·head_dim × 2 B); held from the layer's forward to its o_proj's backward.
    0 without cp, or where 2·cp does not divide S (no copy)."""
    from ..dims import config_int

    if ctx.layout.cp == 1:
        return 0
    layers = config_int(ctx.text, "num_hidden_layers") or 1
    return ring_output_copies(ctx, batch, length)[0] // layers


# the weights whose gradients a layer holds as its attention's backward starts (the MLP's, its norm's, o_proj's)
_BEFORE_ATTENTION = ("mlp.gate", "mlp.up", "mlp.down", "mlp.norm", "attention.output")


def _ring_backward_bytes(ctx: StepContext, tokens: int, hidden: int) -> tuple[int, str]:
    """(bytes, words) of a layer as torch's ring attention's backward peaks on rank 0 (torch 2.13's
    _templated_ring_attention_backward, load-balanced, K and V all-gathered at once, dk and dv passed all-to-all), in
    16 bits over the rank's T = B·S / cp tokens, q = its heads × head_dim, kv = its KV heads × head_dim, H its heads:
    what the layer holds as the attention's backward starts, T·(10h + 4 + 6q + 4kv + 4H): the input norm's saved fp32
    input, reciprocal root, 16-bit normalised input and output (8h + 4), the residual's gradient (2h), the attention
    output's gradient (2q), q, K, V, the output and the fp32 log-sum-exp the ring saved (4q + 4kv + 4H); and the
    ring's own at its second step (every later step alike), T·(9q + (32 + 4·cp)·kv + 2H): the fp32 dq accumulator and
    its partial update's new copy (8q), the fp32 dk and dv received, concatenated and passed all-to-all (24kv), every
    rank's K and V all-gathered (4·cp·kv), the K and V sent on and the step's own dk and dv (8kv), the step's dq on
    the second half of q (q) and that half's log-sum-exp made contiguous (2H). Held to the ring rank traced on the
    4-layer Llama cut: cp 2, 4 and 8, beside tp 2, with 1 and 2 KV heads, B 1 and 2: equal to the byte."""
    from ..dims import config_int

    heads_all = config_int(ctx.text, "num_attention_heads") or 1
    head_dim = config_int(ctx.text, "head_dim") or hidden // heads_all
    heads = heads_all // ctx.layout.tp or 1
    kv_heads = (config_int(ctx.text, "num_key_value_heads") or heads_all) // ctx.layout.tp or 1
    q, kv, cp = heads * head_dim, kv_heads * head_dim, ctx.layout.cp
    held = tokens * (10 * hidden + 4 + 6 * q + 4 * kv + 4 * heads)
    ring = tokens * (9 * q + (32 + 4 * cp) * kv + 2 * heads)
    return held + ring, (f"the layer as its attention's backward starts (the input norm's saved input, root and "
                         f"outputs, the residual's and the attention output's gradients, q, K, V, the output and "
                         f"log-sum-exp the ring saved), T·(10h + 4 + 6q + 4kv + 4H) = {held:,} + torch's ring "
                         f"backward at its second step (the fp32 dq and its partial update, the fp32 dk, dv passed "
                         f"all-to-all, every rank's K and V all-gathered, the step's own gradients), "
                         f"T·(9q + {32 + 4 * cp}kv + 2H) = {ring:,}")


def _rings_held(ring: int, k: int, moment: str, checkpointing: bool) -> int:
    """How many layers' ring output copies (_ring_copy) a moment inside layer k's backward holds: the layers below's
    (none under checkpointing: each keeps its input alone) and, before its attention's backward (the MLP's moments),
    layer k's own, its recomputed one under checkpointing."""
    if not ring:
        return 0
    return (0 if checkpointing else k) + (0 if moment in ("attention", "attention's norm") else 1)


def _copied(p: Placement) -> bool:
    """A projection's weight, whose 16-bit copy autocast makes and its matmul saves for backward (held from the
    layer's forward to its backward); a bias's copy (Qwen2's q, k and v) is read by the addition alone and freed."""
    return p.role.startswith(("mlp.", "attention.")) and not p.role.endswith("norm") and \
        not p.name.endswith(".bias")
