"""Decoder recipes: Llama-style (llama, mistral, qwen2), Gemma, Gemma-2, Phi-3, and the sparse MoE decoders
Mixtral and Qwen2-MoE. Bytes saved per layer, T = batch × seq tokens, h = hidden, q = heads × head_dim,
kv = kv_heads × head_dim, i = intermediate:

    Llama-style decoders (llama, mistral, qwen2; RMSNorm, RoPE, sdpa, SiLU-gated MLP), per token:
        fp32        24h + 8q + 8kv + 16i + 4·heads + 8
        bf16-pure   16h + 4q + 4kv +  8i + 4·heads + 8     (RMSNorm computes in fp32 and saves its fp32 input)
        *-mixed     26h + 4q + 4kv +  8i + 4·heads + 8     (autocast: matmuls in 16 bits, norms fp32)
      the 4·heads being sdpa's log-sum-exp (fp32 per head and token), the 8 the RMSNorms' reciprocal roots.
    Gemma: the same, + 4h in bf16-pure, + 8h per layer whatever the tokens (each RMSNorm's fp32 (1 + weight)).
    Phi-3 (fused qkv_proj and gate_up_proj): the same, + 4h (fp32), − 4h (mixed), + 2h (bf16-pure).
    Mixtral (sparse MoE: a router, each token to k of E experts, sorted by expert and run grouped; transformers'
        grouped_mm is not autocast, so under mixed precision the experts run in fp32), i_e = an expert's width,
        per token: 24h + 8q + 8kv + 16k·i_e + 8k·h + 4E + 40k + 4·heads + 12 (fp32); 24h + 4q + 4kv + 16k·i_e +
        8k·h … (mixed); 16h + 4q + 4kv + 8k·i_e + 4k·h … (bf16-pure); + 4E per layer and, mixed, the router's
        16-bit weight copy 2·E·h. Qwen2-MoE adds a shared expert (its width as i: 16i fp32, 8i otherwise).
    Gemma-2 (eager attention, as transformers runs it: sdpa cannot softcap), per token: 40h + 16q + 16i + 16
        (fp32), 42h + 8q + 8i + 16 (mixed), 36h + 8q + 8i + 16 (bf16-pure); + 8·B·heads·S² and 16h per layer.
        Checkpointed, its layers keep the full and sliding masks they are recomputed from: 8·B·S² (4 bf16-pure).

Sliding windows (Mistral, Phi-3-mini's 2,047, Qwen2's upper layers): once the sequence fills the window, sdpa is
given a mask, a float B × S × S that each such layer keeps, and transformers repeats K and V to the query heads
(sdpa's own grouped-query path runs only without a mask): + 4·B·S² + 8·T·(q − kv) per layer (fp32; 2 and 4 in
16 bits; a single KV head repeats as a view, but for K under autocast, 2·T·(q − kv)). Checkpointed layers keep
only the (bool, S²) mask they are recomputed from.

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...dims import config_int, missing
from .layout import Layout, causal_backward_start, causal_loss_working

LLAMA_STYLE = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class _DecoderTables:
    """One decoder family's fitted coefficients, by precision kind (fp32, mixed, bf16-pure)."""

    layer: dict[str, tuple[int, int, int, int, int, int]]  # (h, q, kv, i, heads, 1) bytes per layer and token
    outside: dict[str, tuple[int, int, int, int]]  # (T·h, T·V, S·hd, T) bytes outside the layers
    scores: int = 0  # ·B·heads·S² per layer: eager attention keeps its score matrices
    layer_vector: int = 0  # ·h per layer, whatever the tokens
    outside_vector: int = 0  # ·h outside the layers, whatever the tokens
    checkpointed_masks: dict[str, int] | None = None  # ·B·S² of masks checkpointed layers are given (eager)
    # sparse MoE layers (the table's ·i is then 0): (k·i, k·h, E, k) bytes per token, k of E experts a token, and
    # (E, E·h) per layer whatever the tokens
    experts: dict[str, tuple[int, int, int, int]] | None = None
    experts_layer: dict[str, tuple[int, int]] | None = None
    inner_key: str = "intermediate_size"  # the config's width for ·i (Qwen2-MoE: its shared expert's)
    expert_keys: tuple[str, str] = ("num_local_experts", "intermediate_size")  # E, and a routed expert's width


_DECODERS = {
    "llama": _DecoderTables(
        {"fp32": (24, 8, 8, 16, 4, 8), "bf16-pure": (16, 4, 4, 8, 4, 8), "mixed": (26, 4, 4, 8, 4, 8)},
        {"fp32": (12, 4, 8, 12), "bf16-pure": (8, 4, 4, 12), "mixed": (10, 4, 8, 12)}),
    # Gemma: RMSNorm scales by (1 + weight) in fp32, so each norm keeps that h-vector (4h B, whatever the tokens)
    # and in bf16-pure its fp32 normalised input as well
    "gemma": _DecoderTables(
        {"fp32": (24, 8, 8, 16, 4, 8), "bf16-pure": (20, 4, 4, 8, 4, 8), "mixed": (26, 4, 4, 8, 4, 8)},
        {"fp32": (12, 4, 8, 12), "bf16-pure": (10, 4, 4, 12), "mixed": (10, 4, 8, 12)}, layer_vector=8,
        outside_vector=4),
    # Phi-3: fused qkv_proj and gate_up_proj, whose outputs are split into views of the fused tensors (q = h)
    "phi3": _DecoderTables(
        {"fp32": (28, 8, 8, 16, 4, 8), "bf16-pure": (18, 4, 4, 8, 4, 8), "mixed": (22, 4, 4, 8, 4, 8)},
        {"fp32": (12, 4, 8, 12), "bf16-pure": (8, 4, 4, 12), "mixed": (10, 4, 8, 12)}),
    # Gemma-2: eager attention (sdpa cannot softcap scores) keeps its S² score matrices, K and V repeated to the
    # query heads; four norms a layer; the logits softcapped (tanh) before the loss
    "gemma2": _DecoderTables(
        {"fp32": (40, 16, 0, 16, 0, 16), "bf16-pure": (36, 8, 0, 8, 0, 16), "mixed": (42, 8, 0, 8, 0, 16)},
        {"fp32": (12, 8, 8, 12), "bf16-pure": (10, 6, 4, 12), "mixed": (10, 6, 8, 12)}, scores=8,
        layer_vector=16, outside_vector=4,
        # checkpointed layers keep the arguments they are recomputed from: eager's full and sliding masks
        checkpointed_masks={"fp32": 8, "mixed": 8, "bf16-pure": 4}),
    # Mixtral: a router (fp32 softmax over E, top-k), each token copied to its k experts, sorted by expert and run
    # grouped (transformers' grouped_mm, which autocast does not cast: under mixed precision the experts run in
    # fp32); the router's 16-bit weight copy (2·E·h, mixed)
    "mixtral": _DecoderTables(
        {"fp32": (24, 8, 8, 0, 4, 12), "bf16-pure": (16, 4, 4, 0, 4, 12), "mixed": (24, 4, 4, 0, 4, 12)},
        {"fp32": (12, 4, 8, 12), "bf16-pure": (8, 4, 4, 12), "mixed": (10, 4, 8, 12)},
        experts={"fp32": (16, 8, 4, 40), "bf16-pure": (8, 4, 4, 40), "mixed": (16, 8, 4, 40)},
        experts_layer={"fp32": (4, 0), "bf16-pure": (4, 0), "mixed": (4, 2)}),
    # Qwen2-MoE (Qwen1.5-MoE): Mixtral's routed experts beside a shared expert (·i: its width) and its sigmoid gate
    "qwen2_moe": _DecoderTables(
        {"fp32": (28, 8, 8, 16, 4, 12), "bf16-pure": (18, 4, 4, 8, 4, 10), "mixed": (32, 4, 4, 8, 4, 10)},
        {"fp32": (12, 4, 8, 12), "bf16-pure": (8, 4, 4, 12), "mixed": (10, 4, 8, 12)},
        experts={"fp32": (16, 8, 4, 36), "bf16-pure": (8, 4, 4, 34), "mixed": (16, 8, 4, 34)},
        experts_layer={"fp32": (4, 0), "bf16-pure": (4, 0), "mixed": (4, 2)},
        inner_key="shared_expert_intermediate_size", expert_keys=("num_experts", "moe_intermediate_size")),
}


def llama_style(config: Any, kind: str, batch: int, seq: int, variant: str = "llama") -> Layout | str:

    h = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    kv_heads = config_int(config, "num_key_value_heads") or heads
    head_dim = config_int(config, "head_dim") or (h // heads if h and heads else None)
    tables = _DECODERS[variant]
    inner = config_int(config, tables.inner_key)
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "num_hidden_layers")
    if None in (h, heads, head_dim, inner, vocab, layers):
        return missing(hidden_size=h, num_attention_heads=heads, **{tables.inner_key: inner}, vocab_size=vocab,
                        num_hidden_layers=layers)
    if _partial_rotary(config):  # rotary on part of each head splits and joins q and k
        return "rotary embeddings on part of each head"
    q, kv, tokens = heads * head_dim, kv_heads * head_dim, batch * seq
    c = tables.layer[kind]
    per_token = c[0] * h + c[1] * q + c[2] * kv + c[3] * inner + c[4] * heads + c[5]
    terms = " + ".join(f"{n}{name}" for n, name in zip(c, ("h", "q", "kv", "i", "·heads", "")) if n)
    scores = tables.scores * batch * heads * seq * seq
    th, tv, shd, t = tables.outside[kind]
    layer = tokens * per_token + scores + tables.layer_vector * h
    extra = (f" + {tables.scores}·B·heads·S²" if scores else "") + \
        (f" + {tables.layer_vector}h" if tables.layer_vector else "")
    if tables.experts is not None:
        experts_key, width_key = tables.expert_keys
        experts, width = config_int(config, experts_key), config_int(config, width_key)
        top_k = config_int(config, "num_experts_per_tok")
        if None in (experts, width, top_k):
            return missing(**{experts_key: experts, width_key: width, "num_experts_per_tok": top_k})
        if variant == "qwen2_moe" and (config_int(config, "decoder_sparse_step") != 1 or
                                       getattr(config, "mlp_only_layers", None) or
                                       getattr(config, "norm_topk_prob", False)):
            return "dense layers among the sparse ones, or renormalised top-k weights (fitted: every layer sparse)"
        ki, kh, e, k = tables.experts[kind]
        routed = ki * top_k * width + kh * top_k * h + e * experts + k * top_k
        per_token += routed
        terms += f" + {ki}k·i_e + {kh}k·h + {e}E + {k}k"
        e_layer, eh_layer = tables.experts_layer[kind]
        layer += tokens * routed + e_layer * experts + eh_layer * experts * h
        extra += f" + {e_layer}E" + (f" + the router's 16-bit copy {eh_layer}·E·h" if eh_layer else "")
    outside = th * tokens * h + tv * tokens * vocab + shd * seq * head_dim + t * tokens + tables.outside_vector * h
    layer_text = f"{tokens:,} tokens × {per_token:,} B ({terms}){extra} = {layer:,} B each"
    stack = None
    window = _window_layers(config, seq, layers) if not tables.scores else 0  # eager attention masks anyway
    kept, kept_text = 0, ""
    if tables.checkpointed_masks:  # and the positions they were built from, 8·S
        masks = tables.checkpointed_masks[kind]
        kept = masks * batch * seq * seq + 8 * seq
        kept_text = f"the attention masks and positions the layers are recomputed from, {masks}·B·S² + 8·S"
    elif window:
        kept = seq * seq + 8 * seq
        kept_text = "the sliding-window mask and positions the layers are recomputed from, S² + 8·S"
    else:  # the position ids, a (1, S) int64, among the checkpoints' inputs until layer 0's backward
        kept = 8 * seq
        kept_text = "the position ids the layers are recomputed from, 8·S"
    if window:
        masked, masked_text = _masked_sdpa(kind, batch, seq, q, kv, kv_heads)
        layer_text = f"{layer_text}; the {window} layers whose sliding window the sequence fills add {masked_text}"
        stack = (layers * layer + window * masked, f"{layers} layers × {layer_text}")
    # eager attention saves K and V repeated to the query heads: the training cache's own K and V are extra (fp32
    # and bf16-pure: both; mixed: the values, the fp32 keys being counted as for sdpa)
    cache_held = ((layers * {"fp32": 8, "bf16-pure": 4, "mixed": 2}[kind] * tokens * kv,
                     f"the training cache's {'values' if kind == 'mixed' else 'keys and values'} (eager attention "
                     f"saved them repeated), {layers} layers", False),) if tables.scores else ()
    outside_text = f"{th}·T·h + {tv}·T·V + {shd}·S·hd + {t}·T" + \
        (f" + {tables.outside_vector}h" if tables.outside_vector else "")
    sliding = _sliding_cache_layers(config, layers)
    if sliding:  # held from the model's forward until its output (and cache) is dropped after the loss
        cache_held += ((8 * sliding, f"the training cache's window sizes, an int64 in each of its {sliding} "
                                       "sliding-window layers", False),)
    return Layout(layer + (masked if window == layers else 0), layer_text, outside, f"{outside_text} = {outside:,} B",
                   h, vocab, layers, stack=stack, checkpointed_outside=(
                       outside + kept, f"{outside_text} + {kept_text} = {outside + kept:,} B") if kept else None,
                   loss_working=causal_loss_working(kind, batch, seq, h, layers, kv) + cache_held,
                   backward_start=causal_backward_start(batch, seq))


def _window_layers(config: Any, seq: int, layers: int) -> int:
    """How many layers attend through a sliding window that `seq` tokens fill (then sdpa takes a mask)."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0 or seq < window:
        return 0
    types = getattr(config, "layer_types", None)
    return sum(kind == "sliding_attention" for kind in types) if isinstance(types, (list, tuple)) else layers


def _sliding_cache_layers(config: Any, layers: int) -> int:
    """The layers whose training cache is transformers' DynamicSlidingWindowLayer (sliding or chunked attention, by
    the config's layer_types, else by its sliding_window or attention_chunk_size, as cache_utils reads them), each
    holding its window as an int64 scalar, 8 B, from the forward's start to the loss (traced: Mistral-7B and
    Phi-3-mini at 1 × 2,048, 32 layers, 256 B under; a 2-layer Gemma-2 cut, 8 B). Checkpointing turns the cache off."""
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)):
        return sum(kind in ("sliding_attention", "chunked_attention") for kind in types[:layers])
    if getattr(config, "sliding_window", None) is not None or getattr(config, "attention_chunk_size", None) is not None:
        return layers
    return 0


def _masked_sdpa(kind: str, batch: int, seq: int, q: int, kv: int, kv_heads: int) -> tuple[int, str]:
    """(bytes, arithmetic) a layer's sdpa keeps beyond the fitted causal case when it is given a mask: the mask,
    a float B × S × S like the scores, and K and V repeated to the query heads (transformers uses sdpa's own
    grouped-query path only without a mask). One KV head repeats as a view, except K under autocast.
    Fitted by bench/fit_activations.py (family mistral_window)."""
    size = 4 if kind == "fp32" else 2
    repeat = 0 if q == kv else 2 * size if kv_heads > 1 else size if kind == "mixed" else 0
    value = repeat * (q - kv) * batch * seq + size * batch * seq * seq
    return value, (f"({repeat}·T·(q − kv) + {size}·B·S²) = {value:,} B each" if repeat else
                   f"the mask {size}·B·S² = {value:,} B each")


def _partial_rotary(config: Any) -> bool:
    rope = getattr(config, "rope_parameters", None)
    fraction = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    fraction = fraction if fraction is not None else getattr(config, "partial_rotary_factor", None)
    return isinstance(fraction, (int, float)) and fraction != 1
