"""Activations of a training step, analytic: what the forward saves for backward, and the peaks around it.

Closed forms in the config's fields for the layouts whose step was traced on fake tensors (trace.py) and fitted
exactly over varied configs by bench/fit_activations.py (a layer's bytes: 3 layers minus 2);
tests/test_training_memory.py holds these families' presets to the traced engine: the saved activations within
0.01%, the peak within 3%. T = batch × seq tokens, h = hidden, q = heads × head_dim,
kv = kv_heads × head_dim, i = intermediate, V = vocab, L = layers. Bytes saved per layer:

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
    DeepSeek-V3 (MLA; the first k layers dense, the rest MoE with a shared expert), bf16-mixed and bf16-pure only,
        per token: 24h (16h bf16-pure) + 8r_q + 8r_kv + 8·heads·nope + 8·heads·rope + 6·heads·v + 16, + 8i (dense)
        or + Mixtral-like routed terms (MoE), + 4·B·heads·S² (its q and k are wider than v, so CPU sdpa runs the
        math kernel, in fp32). fp32 is traced: there the kernel's inputs are views or copies depending on shapes.
    Gemma-2 (eager attention, as transformers runs it: sdpa cannot softcap), per token: 40h + 16q + 16i + 16
        (fp32), 42h + 8q + 8i + 16 (mixed), 36h + 8q + 8i + 16 (bf16-pure); + 8·B·heads·S² and 16h per layer.
        Checkpointed, its layers keep the full and sliding masks they are recomputed from: 8·B·S² (4 bf16-pure).
    GPT-NeoX (parallel residual, LayerNorm, fused qkv, partial rotary), per token: 32h (fp32), 18h (mixed), 16h
        (bf16-pure) + 4·heads + 16 (8 in bf16-pure) + the MLP's activation: exact GELU 8i (fp32) or 4i,
        GPT-NeoX-20B's unfused tanh "gelu_fast" 32i (fp32) or 16i.
    GPT-J (parallel attention and MLP, rotary on rd dimensions a head, unfused tanh GELU, no dropout), per layer:
        24·T·h + 20·T·i (fp32), 20·T·h + 10·T·i (mixed), 12·T·h + 10·T·i (bf16-pure), + 4·T·heads + 8·T (4) +
        16·S·rd (8: the rotary sin and cos, repeated per call).
    GPT-2 (LayerNorm, Conv1D, unfused tanh-GELU, dropout), per layer: 120·T·h (fp32), 66 (bf16-pure), 70 (mixed)
        + 12·B·heads·S² + 16·T (8 in bf16-pure).
    BERT masked LM (post-LN, exact GELU, dropout), per layer: 40·T·h + 8·T·i (fp32), 26·T·h + 4·T·i (bf16-pure),
        34·T·h + 4·T·i (mixed), + 12·B·heads·S² + 16·T (8 in bf16-pure).
    T5 v1 (ReLU MLP, dropout, tied head; encoder and decoder at S tokens each), inner = heads × d_kv:
        encoder layer 32·T·h + 16·T·inner + 12·T·i (fp32; 28, 14, 6 mixed; 24, 14, 6 bf16-pure) + 12·B·heads·S² +
        8·T; decoder layer 48·T·h + 32·T·inner + 12·T·i (44, 28, 6; 36, 28, 6) + 24·B·heads·S² + 12·T + S² (its
        causal mask). Checkpointed, T5 keeps the position biases its layers are recomputed from (12·heads·S² fp32,
        10 mixed, 6 bf16-pure) outside the layers.
    ModernBERT (pre-LN, GeGLU, RoPE, no dropout; global and local layers), per layer: 40·T·h + 16·T·i (fp32),
        24·T·h + 8·T·i (mixed), 20·T·h + 8·T·i (bf16-pure), + 4·T·heads + 16·T (8); each local layer keeps its
        sliding-window mask, 4·B·S² (2 in 16 bits), once the sequence fills the window.
    ALBERT (albert-base-v2: one shared layer a pass, no dropout, unfused tanh GELU), per pass: 32·T·h + 20·T·i
        (fp32), 16·T·h + 10·T·i (mixed, bf16-pure), + 4·T·heads + 16·T (8).
    BART (post-LN, exact GELU, dropout everywhere; each side at S tokens): encoder layer 40·T·h + 12·T·i (fp32;
        34, 6 mixed; 26, 6 bf16-pure) + 12·B·heads·S² + 16·T (8); decoder layer 68·T·h + 12·T·i (60, 6; 46, 6) +
        24·B·heads·S² + 24·T (12). The bare BartModel (its preset's class) trains on its output's sum: no logits.
    RoBERTa and ELECTRA's discriminator: BERT's layers; outside, RoBERTa counts positions from the ids and
        ELECTRA has one logit a token. DistilBERT: 36·T·h (fp32), 24 (bf16-pure), 32 (mixed), the rest as BERT.

Sliding windows (Mistral, Phi-3-mini's 2,047, Qwen2's upper layers): once the sequence fills the window, sdpa is
given a mask, a float B × S × S that each such layer keeps, and transformers repeats K and V to the query heads
(sdpa's own grouped-query path runs only without a mask): + 4·B·S² + 8·T·(q − kv) per layer (fp32; 2 and 4 in
16 bits; a single KV head repeats as a view, but for K under autocast, 2·T·(q − kv)). Checkpointed layers keep
only the (bool, S²) mask they are recomputed from.

The S² terms are attention dropout's: torch's fused CPU kernels do not support dropout, so sdpa in training runs
the math kernel and keeps the probabilities and the dropout mask. CUDA's flash and memory-efficient kernels support
dropout and keep only a log-sum-exp, so these figures, like the traced ones they are checked against, overstate a
GPU step for models with attention dropout by that term (the report says so).

Outside the layers: the embedding output and final norm, the fp32 logits 4·T·V, RoPE's cos and sin, positions and
loss indices; mixed precision adds the 16-bit copies autocast keeps of every matmul weight (2 B each). With full
gradient checkpointing a layer saves only its input (T·h × size) and is recomputed, one at a time, in backward;
the checkpointed layers' weight copies are not kept.

The peak is the largest of the step's moments, not the sum of its parts (R = weights + buffers + optimizer states):
- end of forward: R + saved + the loss's log-softmax (4·T·V; 6·T·V when the logits are 16-bit and upcast);
- start of backward: R + saved + the logits' gradient and log-softmax (8·T·V; 4·T·V for BERT in bf16-pure, which
  takes the loss in bf16);
- last layer recomputed (checkpointing): R + saved − the freed logits + one layer + its gradients;
- end of backward: R + gradients + the embedding output's gradient (a tied embedding's gradient arrives twice);
- optimizer step: R + gradients (fused AdamW and foreach SGD keep no step-sized temporaries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLAMA_STYLE = ("llama", "mistral", "qwen2")
GPT2_STYLE = ("gpt2",)
BERT_STYLE = ("bert",)

# GPT-2, (T·h, B·heads·S², T) bytes per layer: LayerNorms, Conv1D inputs, the unfused tanh-GELU's intermediates,
# dropout masks, and eager-sized attention scores (sdpa with dropout runs the math kernel on CPU)
_GPT2_LAYER = {"fp32": (120, 12, 16), "bf16-pure": (66, 12, 8), "mixed": (70, 12, 16)}
# GPT-2, (T·h, T·V, T, S) outside the layers
_GPT2_OUTSIDE = {"fp32": (12, 4, 24, 8), "bf16-pure": (6, 4, 20, 8), "mixed": (10, 4, 24, 8)}


@dataclass(frozen=True)
class _Layout:
    """One family's closed forms at one precision: bytes and arithmetic, per layer and outside the layers."""

    layer: int  # a whole layer's saved bytes at this batch and length, without checkpointing
    layer_text: str
    outside: int
    outside_text: str
    hidden: int
    vocab: int
    layers: int
    loss_tv: tuple[int, int] = (0, 0)  # (end of forward, start of backward) extra ·T·V; (0, 0): the usual
    # with checkpointing, (bytes, arithmetic) outside the layers where the arguments the layers are recomputed from
    # (masks, position biases) change them; None: as without
    checkpointed_outside: tuple[int, str] | None = None
    stack: tuple[int, str] | None = None  # (bytes, arithmetic) of all the layers when they differ (encoder-decoders)
    checkpointing: bool = True  # fitted with gradient checkpointing too


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


def _llama_style(config: Any, kind: str, batch: int, seq: int, variant: str = "llama") -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    kv_heads = config_int(config, "num_key_value_heads") or heads
    head_dim = config_int(config, "head_dim") or (h // heads if h and heads else None)
    tables = _DECODERS[variant]
    inner = config_int(config, tables.inner_key)
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "num_hidden_layers")
    if None in (h, heads, head_dim, inner, vocab, layers):
        return _missing(hidden_size=h, num_attention_heads=heads, **{tables.inner_key: inner}, vocab_size=vocab,
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
            return _missing(**{experts_key: experts, width_key: width, "num_experts_per_tok": top_k})
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
    if window:
        masked, masked_text = _masked_sdpa(kind, batch, seq, q, kv, kv_heads)
        layer_text = f"{layer_text}; the {window} layers whose sliding window the sequence fills add {masked_text}"
        stack = (layers * layer + window * masked, f"{layers} layers × {layer_text}")
    outside_text = f"{th}·T·h + {tv}·T·V + {shd}·S·hd + {t}·T" + \
        (f" + {tables.outside_vector}h" if tables.outside_vector else "")
    return _Layout(layer + (masked if window == layers else 0), layer_text, outside, f"{outside_text} = {outside:,} B",
                   h, vocab, layers, stack=stack, checkpointed_outside=(
                       outside + kept, f"{outside_text} + {kept_text} = {outside + kept:,} B") if kept else None)


def _window_layers(config: Any, seq: int, layers: int) -> int:
    """How many layers attend through a sliding window that `seq` tokens fill (then sdpa takes a mask)."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0 or seq < window:
        return 0
    types = getattr(config, "layer_types", None)
    return sum(kind == "sliding_attention" for kind in types) if isinstance(types, (list, tuple)) else layers


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


# DeepSeek-V3 (multi-head latent attention, the first k layers dense, the rest MoE with a shared expert and
# group-limited sigmoid routing), fitted in bf16-mixed and bf16-pure. Per token, by kind:
# attention (h, r_q, r_kv, heads·nope, heads·rope, heads·v, 1), the dense MLP's ·i, and the MoE's
# (·h extra, 1 extra, k·i_e, k·h, shared·i_e, E, k); (E, E·h) per MoE layer whatever the tokens.
# Its q and k are wider than v (192 and 128), so CPU sdpa runs the math kernel, which upcasts 16-bit inputs and
# keeps fp32 q, k, v and probabilities: 4·B·heads·S².
_MLA = {"bf16-pure": (16, 8, 8, 8, 8, 6, 16), "mixed": (24, 8, 8, 8, 8, 6, 16)}
_MLA_DENSE_I = 8
_MLA_MOE = {"bf16-pure": (4, 4, 8, 4, 8, 4, 40), "mixed": (2, 2, 16, 8, 8, 2, 36)}
_MLA_MOE_LAYER = {"bf16-pure": (4, 0), "mixed": (4, 2)}
_MLA_OUTSIDE = {"bf16-pure": (8, 4, 4, 12), "mixed": (10, 4, 8, 12)}  # (T·h, T·V, S·rope, T)


def _deepseek_style(config: Any, kind: str, batch: int, seq: int) -> _Layout | str:
    from .kv_cache import config_int

    names = ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
             "num_experts_per_tok", "n_shared_experts", "vocab_size", "num_hidden_layers")
    values = {name: config_int(config, name) for name in names}
    if None in values.values():
        return _missing(**values)
    h, heads, rq, rkv, nope, rope, v, inner, expert, experts, top_k, shared, vocab, layers = values.values()
    dense = getattr(config, "first_k_dense_replace", 0)
    if kind == "fp32":
        return "fp32 (fitted in bf16-mixed and bf16-pure: in fp32 the math kernel's inputs are views or copies " \
               "by shape)"
    if nope + rope <= v:
        return "q and k no wider than v (fitted: wider, so CPU sdpa runs its math kernel)"
    if getattr(config, "rope_interleave", True) is not True or getattr(config, "norm_topk_prob", True) is not True \
            or getattr(config, "moe_layer_freq", 1) != 1 or not isinstance(dense, int) or not 0 <= dense <= layers:
        return "another rotary layout, routing normalisation or MoE layer spacing (fitted: DeepSeek-V3's)"
    tokens = batch * seq
    a = _MLA[kind]
    attention = a[0] * h + a[1] * rq + a[2] * rkv + a[3] * heads * nope + a[4] * heads * rope + a[5] * heads * v + a[6]
    scores = 4 * batch * heads * seq * seq
    dense_layer = tokens * (attention + _MLA_DENSE_I * inner) + scores
    m = _MLA_MOE[kind]
    routed = m[0] * h + m[1] + m[2] * top_k * expert + m[3] * top_k * h + m[4] * shared * expert + m[5] * experts + \
        m[6] * top_k
    e_layer, eh_layer = _MLA_MOE_LAYER[kind]
    moe_layer = tokens * (attention + routed) + scores + e_layer * experts + eh_layer * experts * h
    th, tv, srope, t = _MLA_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + srope * seq * rope + t * tokens
    attention_text = (f"{a[0]}h + {a[1]}r_q + {a[2]}r_kv + {a[3]}·heads·nope + {a[4]}·heads·rope + "
                      f"{a[5]}·heads·v + {a[6]}")
    stack = dense * dense_layer + (layers - dense) * moe_layer
    stack_text = (f"{dense} dense layers × (T × ({attention_text} + {_MLA_DENSE_I}i) + 4·B·heads·S²) = "
                  f"{dense_layer:,} B + {layers - dense} MoE layers × (T × ({attention_text} + {m[0]}h + {m[1]} + "
                  f"{m[2]}k·i_e + {m[3]}k·h + {m[4]}·shared·i_e + {m[5]}E + {m[6]}k) + 4·B·heads·S² + {e_layer}E"
                  + (f" + the router's 16-bit copy {eh_layer}·E·h" if eh_layer else "") + f") = {moe_layer:,} B")
    return _Layout(moe_layer, f"{moe_layer:,} B each (MoE)", outside,
                   f"{th}·T·h + {tv}·T·V + {srope}·S·rope + {t}·T = {outside:,} B", h, vocab, layers,
                   stack=(stack, stack_text))


def _partial_rotary(config: Any) -> bool:
    rope = getattr(config, "rope_parameters", None)
    fraction = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    fraction = fraction if fraction is not None else getattr(config, "partial_rotary_factor", None)
    return isinstance(fraction, (int, float)) and fraction != 1


def _gpt2_style(config: Any, kind: str, batch: int, seq: int) -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "n_embd", "hidden_size")
    heads = config_int(config, "n_head", "num_attention_heads")
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "n_layer", "num_hidden_layers")
    inner = getattr(config, "n_inner", None)
    if None in (h, heads, vocab, layers):
        return _missing(n_embd=h, n_head=heads, vocab_size=vocab, n_layer=layers)
    if inner not in (None, 4 * h):
        return f"an MLP width n_inner = {inner} other than 4 × n_embd"
    tokens = batch * seq
    per_h, per_score, per_t = _GPT2_LAYER[kind]
    layer = per_h * tokens * h + per_score * batch * heads * seq * seq + per_t * tokens
    th, tv, t, s = _GPT2_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + t * tokens + s * seq
    return _Layout(layer, f"({per_h}·T·h + {per_score}·B·heads·S² + {per_t}·T) = {layer:,} B each", outside,
                   f"{th}·T·h + {tv}·T·V + {t}·T + {s}·S = {outside:,} B", h, vocab, layers)


# GPT-NeoX (Pythia; parallel residual, LayerNorm, fused qkv, rotary on part of each head), (T·h, T·heads, T) bytes
# per layer and, by activation, ·T·i: exact GELU keeps its input, the unfused tanh "gelu_fast" its intermediates
_NEOX_LAYER = {"fp32": (32, 4, 16), "mixed": (18, 4, 16), "bf16-pure": (16, 4, 8)}
_NEOX_ACTIVATION = {"gelu": {"fp32": 8, "mixed": 4, "bf16-pure": 4},
                    "gelu_fast": {"fp32": 32, "mixed": 16, "bf16-pure": 16}}
# GPT-NeoX, (T·h, T·V, S·rd, T) outside the layers; rd: the rotary dimensions of a head
_NEOX_OUTSIDE = {"fp32": (8, 4, 8, 16), "mixed": (6, 4, 8, 16), "bf16-pure": (4, 4, 4, 12)}


def _neox_style(config: Any, kind: str, batch: int, seq: int) -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    inner = config_int(config, "intermediate_size")
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "num_hidden_layers")
    act = _NEOX_ACTIVATION.get(getattr(config, "hidden_act", None))
    rope = getattr(config, "rope_parameters", None)
    fraction = rope.get("partial_rotary_factor", 1.0) if isinstance(rope, dict) else \
        getattr(config, "rotary_pct", None)
    # the fitted layout: parallel residual, no dropout (dropout adds masks and sdpa's S² scores)
    if None in (h, heads, inner, vocab, layers) or not isinstance(fraction, (int, float)):
        return _missing(hidden_size=h, num_attention_heads=heads, intermediate_size=inner, vocab_size=vocab,
                        num_hidden_layers=layers, rotary_pct=fraction if isinstance(fraction, (int, float)) else None)
    if act is None:
        return f"the activation {getattr(config, 'hidden_act', None)!r} (fitted: gelu, gelu_fast)"
    if getattr(config, "use_parallel_residual", None) is not True:
        return "a sequential residual (fitted: parallel)"
    if attention_dropout(config) or hidden_dropout(config):
        return "dropout (fitted without)"
    rotary = int(h // heads * fraction)
    tokens = batch * seq
    per_h, per_heads, per_t = _NEOX_LAYER[kind]
    per_i = act[kind]
    per_token = per_h * h + per_i * inner + per_heads * heads + per_t
    th, tv, srd, t = _NEOX_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + srd * seq * rotary + t * tokens
    return _Layout(tokens * per_token, f"{tokens:,} tokens × {per_token:,} B ({per_h}h + {per_i}i + "
                   f"{per_heads}·heads + {per_t}) = {tokens * per_token:,} B each",
                   outside, f"{th}·T·h + {tv}·T·V + {srd}·S·rd + {t}·T = {outside:,} B", h, vocab, layers)


# GPT-J (gpt-j-6b: parallel attention and MLP from one LayerNorm, rotary on the first rd dimensions of each head,
# the unfused tanh GELU, no dropout), (T·h, T·i, S·rd, T·heads, T) per layer and (T·h, T·V, T) outside
_GPTJ_LAYER = {"fp32": (24, 20, 16, 4, 8), "mixed": (20, 10, 16, 4, 8), "bf16-pure": (12, 10, 8, 4, 4)}
_GPTJ_OUTSIDE = {"fp32": (8, 4, 16), "mixed": (6, 4, 16), "bf16-pure": (4, 4, 12)}


def _gptj_style(config: Any, kind: str, batch: int, seq: int) -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "n_embd")
    heads = config_int(config, "n_head")
    rotary = config_int(config, "rotary_dim")
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "n_layer")
    if None in (h, heads, rotary, vocab, layers):
        return _missing(n_embd=h, n_head=heads, rotary_dim=rotary, vocab_size=vocab, n_layer=layers)
    inner = config_int(config, "n_inner") or 4 * h
    if getattr(config, "activation_function", None) != "gelu_new":
        return f"the activation {getattr(config, 'activation_function', None)!r} (fitted: gelu_new)"
    if attention_dropout(config) or hidden_dropout(config) or _first_positive(config, ("embd_pdrop",)):
        return "dropout (fitted without, as gpt-j-6b)"
    tokens = batch * seq
    per_h, per_i, per_srd, per_heads, per_t = _GPTJ_LAYER[kind]
    layer = tokens * (per_h * h + per_i * inner + per_heads * heads + per_t) + per_srd * seq * rotary
    th, tv, t = _GPTJ_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + t * tokens
    # checkpointed layers are recomputed from the sin and cos (and the positions they were gathered at)
    kept = outside + per_srd // 4 * seq * rotary + 8 * seq
    return _Layout(layer, f"({per_h}·T·h + {per_i}·T·i + {per_heads}·T·heads + {per_t}·T + the rotary sin and cos "
                          f"{per_srd}·S·rd) = {layer:,} B each",
                   outside, f"{th}·T·h + {tv}·T·V + {t}·T = {outside:,} B", h, vocab, layers,
                   checkpointed_outside=(kept, f"{th}·T·h + {tv}·T·V + {t}·T + the sin, cos and positions the layers "
                                               f"are recomputed from {per_srd // 4}·S·rd + 8·S = {kept:,} B"))


# BERT, (T·h, T·i, B·heads·S², T) bytes per layer: post-LN blocks, exact GELU, dropout masks, CPU sdpa's scores
_BERT_LAYER = {"fp32": (40, 8, 12, 16), "bf16-pure": (26, 4, 12, 8), "mixed": (34, 4, 12, 16)}
# BERT with its masked-LM head, (T·h, T·V, T, S, 1) outside the layers
_BERT_OUTSIDE = {"fp32": (24, 4, 24, 8, 8), "bf16-pure": (12, 2, 16, 8, 4), "mixed": (16, 4, 20, 8, 8)}
# Encoders of BERT's layout, as fitted: (·T·h per layer by kind, the outside terms (T·h, T·V, T, S, 1) by kind)
# where they differ from BERT masked LM's
_ENCODER_VARIANTS = {
    "bert": ({}, {}),
    # positions counted from the input ids (int64 masks and cumulative sums, 16·T), no position-id buffer slice
    "roberta": ({}, {"fp32": (24, 4, 40, 0, 8), "bf16-pure": (12, 2, 32, 0, 4), "mixed": (16, 4, 36, 0, 8)}),
    # DistilBERT: no token types, its attention keeps 4·T·h less (2 in bf16-pure); no position-id slice
    "distilbert": ({"fp32": 36, "bf16-pure": 24, "mixed": 32},
                   {"fp32": (24, 4, 24, 0, 8), "bf16-pure": (12, 2, 16, 0, 4), "mixed": (16, 4, 20, 0, 8)}),
    # ELECTRA's discriminator: a token-level real/replaced logit, no vocabulary-wide logits
    "electra": ({}, {"fp32": (20, 0, 16, 8, 4), "bf16-pure": (10, 0, 10, 8, 4), "mixed": (14, 0, 16, 8, 4)}),
}


def _bert_style(config: Any, kind: str, batch: int, seq: int, variant: str = "bert") -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "hidden_size", "dim")
    heads = config_int(config, "num_attention_heads", "n_heads")
    inner = config_int(config, "intermediate_size", "hidden_dim")
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "num_hidden_layers", "n_layers")
    # the fitted layout has dropout on the attention probabilities and the layers' outputs (masks, and sdpa's
    # math kernel with its S² scores); without it the step is traced
    if None in (h, heads, inner, vocab, layers):
        return _missing(hidden_size=h, num_attention_heads=heads, intermediate_size=inner, vocab_size=vocab,
                        num_hidden_layers=layers)
    if not attention_dropout(config) or not hidden_dropout(config):
        return "no attention or hidden dropout (fitted with both)"
    layer_h, outside = _ENCODER_VARIANTS[variant]
    if variant == "electra" and config_int(config, "embedding_size") not in (None, h):
        return "embeddings narrower than the layers, projected up (ELECTRA-small's)"
    tokens = batch * seq
    per_h, per_i, per_score, per_t = _BERT_LAYER[kind]
    per_h = layer_h.get(kind, per_h)
    layer = per_h * tokens * h + per_i * tokens * inner + per_score * batch * heads * seq * seq + per_t * tokens
    th, tv, t, s, one = outside.get(kind, _BERT_OUTSIDE[kind])
    loss_vocab = vocab if tv else 1  # ELECTRA's loss is over one logit a token
    outside_bytes = th * tokens * h + tv * tokens * vocab + t * tokens + s * seq + one
    # bf16 logits go to the loss as they are (Llama and GPT-2 upcast them): a bf16 log-softmax and its gradient
    loss_tv = (2, 4) if kind == "bf16-pure" and tv else (0, 0)
    return _Layout(layer, f"({per_h}·T·h + {per_i}·T·i + {per_score}·B·heads·S² + {per_t}·T) = {layer:,} B each",
                   outside_bytes,
                   f"{th}·T·h + {tv}·T·V + {t}·T + {s}·S + {one} = {outside_bytes:,} B", h, loss_vocab, layers,
                   loss_tv)


# ModernBERT (pre-LN without biases, GeGLU, RoPE, no dropout; a global layer every few, the others local), per
# layer (T·h, T·i, T·heads, T), ·B·S² per local layer (its sliding-window mask, which sdpa keeps), and outside
# (T·h, T·V, T, S·hd)
_MODERNBERT_LAYER = {"fp32": (40, 16, 4, 16), "mixed": (24, 8, 4, 16), "bf16-pure": (20, 8, 4, 8)}
_MODERNBERT_MASK = {"fp32": 4, "mixed": 2, "bf16-pure": 2}
_MODERNBERT_OUTSIDE = {"fp32": (20, 4, 24, 16), "mixed": (12, 4, 20, 16), "bf16-pure": (10, 4, 16, 8)}
# checkpointed: the layers keep their input, and (·T·h, ·T) more outside with the S² mask they are recomputed from
_MODERNBERT_CHECKPOINTED = {"fp32": (4, 8), "mixed": (4, 8), "bf16-pure": (2, 4)}


def _modernbert_style(config: Any, kind: str, batch: int, seq: int) -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    inner = config_int(config, "intermediate_size")
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "num_hidden_layers")
    window = config_int(config, "sliding_window")
    types = getattr(config, "layer_types", None)
    if None in (h, heads, inner, vocab, layers, window) or not isinstance(types, (list, tuple)):
        return _missing(hidden_size=h, num_attention_heads=heads, intermediate_size=inner, vocab_size=vocab,
                        num_hidden_layers=layers, sliding_window=window,
                        layer_types=types if isinstance(types, (list, tuple)) else None)
    if getattr(config, "hidden_activation", None) != "gelu":
        return f"the activation {getattr(config, 'hidden_activation', None)!r} (fitted: gelu)"
    if _first_positive(config, ("attention_dropout", "mlp_dropout", "embedding_dropout")):
        return "dropout (fitted without, as ModernBERT-base)"
    # the local layers' mask exists once the sequence fills the window (shorter, every token sees every other)
    local = sum(kind_ == "sliding_attention" for kind_ in types) if seq >= window else 0
    tokens = batch * seq
    per_h, per_i, per_heads, per_t = _MODERNBERT_LAYER[kind]
    per_token = per_h * h + per_i * inner + per_heads * heads + per_t
    layer = tokens * per_token
    mask = _MODERNBERT_MASK[kind]
    stack = layers * layer + local * mask * batch * seq * seq
    layer_text = f"{tokens:,} tokens × {per_token:,} B ({per_h}h + {per_i}i + {per_heads}·heads + {per_t}) = " \
                 f"{layer:,} B each"
    th, tv, t, shd = _MODERNBERT_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + t * tokens + shd * seq * (h // heads)
    more_th, more_t = _MODERNBERT_CHECKPOINTED[kind]
    mask_kept = seq * seq if local else 0
    kept = outside + more_th * tokens * h + more_t * tokens + mask_kept
    kept_text = f"{th + more_th}·T·h + {tv}·T·V + {t + more_t}·T + {shd}·S·hd" + \
        (" + the mask the layers are recomputed from S²" if mask_kept else "") + f" = {kept:,} B"
    return _Layout(layer, layer_text, outside, f"{th}·T·h + {tv}·T·V + {t}·T + {shd}·S·hd = {outside:,} B", h, vocab,
                   layers, checkpointed_outside=(kept, kept_text),
                   stack=(stack, f"{layers} layers × {layer_text}" + (
                       f"; the {local} local layers' sliding-window masks {mask}·B·S² each" if local else "")))


# ALBERT (albert-base-v2's layout: one shared layer a pass, no dropout, the unfused tanh GELU, embeddings of width e
# projected up), (T·h, T·i, T·heads, T) per pass and (T·h, T·e, T·V, T, S, 1) outside
_ALBERT_LAYER = {"fp32": (32, 20, 4, 16), "bf16-pure": (16, 10, 4, 8), "mixed": (16, 10, 4, 8)}
_ALBERT_OUTSIDE = {"fp32": (4, 32, 4, 24, 8, 8), "bf16-pure": (2, 16, 2, 16, 8, 4), "mixed": (2, 18, 4, 20, 8, 8)}


def _albert_style(config: Any, kind: str, batch: int, seq: int) -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "hidden_size")
    e = config_int(config, "embedding_size")
    heads = config_int(config, "num_attention_heads")
    inner = config_int(config, "intermediate_size")
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "num_hidden_layers")
    if None in (h, e, heads, inner, vocab, layers):
        return _missing(hidden_size=h, embedding_size=e, num_attention_heads=heads, intermediate_size=inner,
                        vocab_size=vocab, num_hidden_layers=layers)
    if getattr(config, "hidden_act", None) != "gelu_new":
        return f"the activation {getattr(config, 'hidden_act', None)!r} (fitted: gelu_new)"
    if config_int(config, "inner_group_num") != 1:
        return "more than one layer in a group"
    if attention_dropout(config) or hidden_dropout(config):
        return "dropout (fitted without, as albert-base-v2)"
    tokens = batch * seq
    per_h, per_i, per_heads, per_t = _ALBERT_LAYER[kind]
    per_token = per_h * h + per_i * inner + per_heads * heads + per_t
    th, te, tv, t, s, one = _ALBERT_OUTSIDE[kind]
    outside = th * tokens * h + te * tokens * e + tv * tokens * vocab + t * tokens + s * seq + one
    loss_tv = (2, 4) if kind == "bf16-pure" else (0, 0)  # bf16 logits go to the loss as they are (as BERT's)
    return _Layout(tokens * per_token, f"{tokens:,} tokens × {per_token:,} B ({per_h}h + {per_i}i + {per_heads}·heads"
                   f" + {per_t}) = {tokens * per_token:,} B each pass",
                   outside, f"{th}·T·h + {te}·T·e + {tv}·T·V + {t}·T + {s}·S + {one} = {outside:,} B", h, vocab,
                   layers, loss_tv)


# T5 v1 (t5-small/base/large: ReLU MLP, dropout, the head tied), each side at --seq tokens; inner = heads × d_kv.
# (T·h, T·inner, T·i, B·heads·S², T, S²) per encoder layer and per decoder layer (its causal mask, cross-attention)
_T5_ENCODER = {"fp32": (32, 16, 12, 12, 8, 0), "bf16-pure": (24, 14, 6, 12, 8, 0), "mixed": (28, 14, 6, 12, 8, 0)}
_T5_DECODER = {"fp32": (48, 32, 12, 24, 12, 1), "bf16-pure": (36, 28, 6, 24, 12, 1),
               "mixed": (44, 28, 6, 24, 12, 1)}
# T5, (T·h, T·V, T, S², 1) outside the layers: embeddings, position biases and masks, final norms, head, loss
_T5_OUTSIDE = {"fp32": (40, 4, 24, 16, 8), "bf16-pure": (28, 2, 24, 16, 4), "mixed": (34, 4, 24, 16, 8)}
# T5 checkpointed, (T·h, T·V, T, heads·S², 1) outside: the position biases the layers are recomputed from are kept
_T5_CHECKPOINTED_OUTSIDE = {"fp32": (40, 4, 24, 12, 8), "bf16-pure": (28, 2, 24, 6, 4), "mixed": (38, 4, 24, 10, 8)}


def _t5_style(config: Any, kind: str, batch: int, seq: int) -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "d_model")
    inner = (config_int(config, "num_heads") or 0) * (config_int(config, "d_kv") or 0)
    heads = config_int(config, "num_heads")
    ff = config_int(config, "d_ff")
    vocab = config_int(config, "vocab_size")
    encoder_layers = config_int(config, "num_layers")
    decoder_layers = config_int(config, "num_decoder_layers") or encoder_layers
    if None in (h, heads, ff, vocab, encoder_layers) or not inner:
        return _missing(d_model=h, num_heads=heads, d_kv=inner or None, d_ff=ff, vocab_size=vocab,
                        num_layers=encoder_layers)
    if getattr(config, "feed_forward_proj", "relu") != "relu":
        return f"the feed-forward {getattr(config, 'feed_forward_proj', None)!r} (fitted: T5 v1's relu)"
    if not attention_dropout(config):
        return "no dropout (fitted with it)"
    if getattr(config, "tie_word_embeddings", True) is not True:
        return "an untied head (fitted: tied and rescaled)"
    tokens = batch * seq

    def layer(c: tuple[int, ...]) -> tuple[int, str]:
        value = (c[0] * tokens * h + c[1] * tokens * inner + c[2] * tokens * ff + c[3] * batch * heads * seq * seq
                 + c[4] * tokens + c[5] * seq * seq)
        return value, (f"({c[0]}·T·h + {c[1]}·T·inner + {c[2]}·T·i + {c[3]}·B·heads·S² + {c[4]}·T"
                       + (f" + {c[5]}·S²" if c[5] else "") + f") = {value:,} B")

    encoder, encoder_text = layer(_T5_ENCODER[kind])
    decoder, decoder_text = layer(_T5_DECODER[kind])
    th, tv, t, s2, one = _T5_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + t * tokens + s2 * seq * seq + one
    stack = encoder_layers * encoder + decoder_layers * decoder
    loss_tv = (2, 4) if kind == "bf16-pure" else (0, 0)  # the bf16 logits go to the loss as they are
    th_c, tv_c, t_c, biases, one_c = _T5_CHECKPOINTED_OUTSIDE[kind]
    kept = th_c * tokens * h + tv_c * tokens * vocab + t_c * tokens + biases * heads * seq * seq + one_c
    return _Layout(decoder, decoder_text, outside, f"{th}·T·h + {tv}·T·V + {t}·T + {s2}·S² + {one} = {outside:,} B",
                   h, vocab, encoder_layers + decoder_layers, loss_tv, checkpointed_outside=(
                       kept, f"{th_c}·T·h + {tv_c}·T·V + {t_c}·T + the position biases the layers are recomputed "
                             f"from {biases}·heads·S² + {one_c} = {kept:,} B"),
                   stack=(stack, f"{encoder_layers} encoder layers × {encoder_text} + {decoder_layers} decoder layers"
                                 f" × {decoder_text}"))


# BART (bart-base/large: post-LN, exact GELU, dropout on the attention, activations and outputs, learned positions),
# each side at --seq tokens (the labels shifted right), (T·h, T·i, B·heads·S², T) per encoder and per decoder layer
_BART_ENCODER = {"fp32": (40, 12, 12, 16), "bf16-pure": (26, 6, 12, 8), "mixed": (34, 6, 12, 16)}
_BART_DECODER = {"fp32": (68, 12, 24, 24), "bf16-pure": (46, 6, 24, 12), "mixed": (60, 6, 24, 24)}
# BART outside the layers, (T·h, T·V, T, S, 1): with the LM head (ForConditionalGeneration), and the bare BartModel
# trained on the sum of its output
_BART_OUTSIDE = {"fp32": (24, 4, 40, 8, 8), "bf16-pure": (12, 2, 32, 8, 4), "mixed": (18, 4, 40, 8, 8)}
_BART_CHECKPOINTED_TH = {"fp32": 24, "bf16-pure": 12, "mixed": 22}  # ·T·h outside with checkpointing (LM head)
_BART_MODEL_OUTSIDE = {"fp32": (20, 0, 24, 8, 4), "bf16-pure": (10, 0, 16, 8, 4), "mixed": (16, 0, 24, 8, 4)}


def _bart_style(config: Any, kind: str, batch: int, seq: int, variant: str = "lm") -> _Layout | str:
    from .kv_cache import config_int

    h = config_int(config, "d_model")
    vocab = config_int(config, "vocab_size")
    sides = [(config_int(config, f"{side}_layers"), config_int(config, f"{side}_attention_heads"),
              config_int(config, f"{side}_ffn_dim")) for side in ("encoder", "decoder")]
    # the fitted layout: post-LN (mBART's pre-LN is another model type), no extra final norms, unscaled
    # embeddings, exact GELU, dropout everywhere
    if None in (h, vocab) or None in sides[0] + sides[1]:
        return _missing(d_model=h, vocab_size=vocab, encoder_layers=sides[0][0], encoder_attention_heads=sides[0][1],
                        encoder_ffn_dim=sides[0][2], decoder_layers=sides[1][0],
                        decoder_attention_heads=sides[1][1], decoder_ffn_dim=sides[1][2])
    if getattr(config, "activation_function", None) != "gelu":
        return f"the activation {getattr(config, 'activation_function', None)!r} (fitted: gelu)"
    if getattr(config, "normalize_before", False) or getattr(config, "add_final_layer_norm", False):
        return "pre-LN layers or final norms (fitted: BART's post-LN)"
    if getattr(config, "scale_embedding", False):
        return "scaled embeddings (fitted without)"
    if not all(_first_positive(config, (key,)) for key in ("dropout", "attention_dropout", "activation_dropout")):
        return "no dropout on the attention, activations or outputs (fitted with all three)"
    tokens = batch * seq

    def layer(c: tuple[int, ...], heads: int, ffn: int) -> tuple[int, str]:
        value = c[0] * tokens * h + c[1] * tokens * ffn + c[2] * batch * heads * seq * seq + c[3] * tokens
        return value, f"({c[0]}·T·h + {c[1]}·T·i + {c[2]}·B·heads·S² + {c[3]}·T) = {value:,} B"

    (encoder_layers, encoder_heads, encoder_ffn), (decoder_layers, decoder_heads, decoder_ffn) = sides
    encoder, encoder_text = layer(_BART_ENCODER[kind], encoder_heads, encoder_ffn)
    decoder, decoder_text = layer(_BART_DECODER[kind], decoder_heads, decoder_ffn)
    th, tv, t, s, one = (_BART_OUTSIDE if variant == "lm" else _BART_MODEL_OUTSIDE)[kind]
    outside = th * tokens * h + tv * tokens * vocab + t * tokens + s * seq + one
    stack = encoder_layers * encoder + decoder_layers * decoder
    loss_tv = (2, 4) if kind == "bf16-pure" else (0, 0)  # the bf16 logits go to the loss as they are
    th_c = _BART_CHECKPOINTED_TH[kind]
    kept = outside + (th_c - th) * tokens * h
    return _Layout(decoder, decoder_text, outside, f"{th}·T·h + {tv}·T·V + {t}·T + {s}·S + {one} = {outside:,} B"
                   if tv else f"{th}·T·h + {t}·T + {s}·S + {one} = {outside:,} B",
                   h, vocab if tv else 0, encoder_layers + decoder_layers, loss_tv, checkpointing=variant == "lm",
                   checkpointed_outside=(kept, f"{th_c}·T·h + {tv}·T·V + {t}·T + {s}·S + {one} = {kept:,} B"),
                   stack=(stack, f"{encoder_layers} encoder layers × {encoder_text} + {decoder_layers} decoder layers"
                                 f" × {decoder_text}"))


@dataclass(frozen=True)
class _Recipe:
    model_types: tuple[str, ...]
    heads: tuple[str, ...]  # the class must end with one: the head carries the loss the recipe counts
    layout: Any  # (config, kind, batch, seq) → _Layout | None
    attention: str = "sdpa"  # the implementation it was fitted at (flash runs as sdpa here)


def _variant(function: Any, variant: str) -> Any:
    return lambda config, kind, batch, seq: function(config, kind, batch, seq, variant=variant)


_RECIPES = {
    "Llama-style decoder": _Recipe(LLAMA_STYLE, ("ForCausalLM",), _llama_style),
    "Gemma decoder": _Recipe(("gemma",), ("ForCausalLM",), _variant(_llama_style, "gemma")),
    "Gemma-2 decoder": _Recipe(("gemma2",), ("ForCausalLM",), _variant(_llama_style, "gemma2"), "eager"),
    "Phi-3 decoder": _Recipe(("phi3",), ("ForCausalLM",), _variant(_llama_style, "phi3")),
    "Mixtral (sparse MoE)": _Recipe(("mixtral",), ("ForCausalLM",), _variant(_llama_style, "mixtral")),
    "DeepSeek-V3 (MLA, MoE)": _Recipe(("deepseek_v3",), ("ForCausalLM",), _deepseek_style),
    "Qwen2-MoE": _Recipe(("qwen2_moe",), ("ForCausalLM",), _variant(_llama_style, "qwen2_moe")),
    "GPT-2": _Recipe(GPT2_STYLE, ("LMHeadModel",), _gpt2_style),
    "GPT-NeoX": _Recipe(("gpt_neox",), ("ForCausalLM",), _neox_style),
    "GPT-J": _Recipe(("gptj",), ("ForCausalLM",), _gptj_style),
    "BERT masked LM": _Recipe(BERT_STYLE, ("ForMaskedLM",), _bert_style),
    "RoBERTa masked LM": _Recipe(("roberta",), ("ForMaskedLM",), _variant(_bert_style, "roberta")),
    "DistilBERT masked LM": _Recipe(("distilbert",), ("ForMaskedLM",), _variant(_bert_style, "distilbert")),
    "T5 (v1)": _Recipe(("t5",), ("ForConditionalGeneration",), _t5_style),
    "ModernBERT masked LM": _Recipe(("modernbert",), ("ForMaskedLM",), _modernbert_style),
    "ALBERT masked LM": _Recipe(("albert",), ("ForMaskedLM",), _albert_style),
    "BART": _Recipe(("bart",), ("ForConditionalGeneration",), _bart_style),
    "BART (bare, trained on its output's sum)": _Recipe(("bart",), ("BartModel",), _variant(_bart_style, "model")),
    "ELECTRA discriminator": _Recipe(("electra",), ("ForPreTraining",), _variant(_bert_style, "electra")),
}


@dataclass(frozen=True)
class Moment:
    phase: str  # "forward" | "backward" | "optimizer step"
    where: str  # "end of forward", "start of backward", …
    bytes: int  # beyond the resident weights, buffers and optimizer states
    arithmetic: str


@dataclass(frozen=True)
class TrainingActivations:
    recipe: str  # "Llama-style decoder"
    saved: int  # bytes the forward leaves for backward
    saved_arithmetic: str
    per_layer: int  # saved per layer
    layers: int
    logits: int  # the fp32 logits, 4·T·V
    moments: tuple[Moment, ...]  # candidate peaks; the gradients' moments are added by the caller


def recipe_for(config: Any, class_name: str) -> str | None:
    """The recipe covering this config's layout built as `class_name`, or None."""
    model_type = getattr(config, "model_type", None)
    return next((name for name, recipe in _RECIPES.items()
                 if model_type in recipe.model_types and class_name.endswith(recipe.heads)), None)


def recipe_attention(recipe: str) -> str:
    """The attention implementation a recipe was fitted at: "sdpa" (flash too) or "eager"."""
    return _RECIPES[recipe].attention


def recipe_declines(config: Any, class_name: str, *, batch: int, seq: int, precision: str,
                    checkpointing: bool) -> str | None:
    """What of this config (or step) its recipe was not fitted for, in words; None when the recipe answers or
    there is none."""
    layout = _layout(config, class_name, batch, seq, precision, checkpointing)
    return layout if isinstance(layout, str) else None


def _kind(precision: str) -> str:
    return "fp32" if precision == "fp32" else "bf16-pure" if precision == "bf16-pure" else "mixed"


def _layout(config: Any, class_name: str, batch: int, seq: int, precision: str,
            checkpointing: bool) -> _Layout | str | None:
    recipe = recipe_for(config, class_name)
    if recipe is None:
        return None
    layout = _RECIPES[recipe].layout(config, _kind(precision), batch, seq)
    if isinstance(layout, _Layout) and checkpointing and not layout.checkpointing:
        # checkpointed layers keep more than their input here (T5: masks and biases)
        return "gradient checkpointing (its checkpointed layers keep more than their inputs)"
    return layout


def _missing(**fields: Any) -> str:
    return "a config without " + ", ".join(name for name, value in fields.items() if value is None)


def training_activations(config: Any, class_name: str, *, batch: int, seq: int, precision: str,
                         checkpointing: bool, cast_weights: int = 0, cast_head: int = 0) -> TrainingActivations | None:
    """The analytic activations of one training step, or None when no recipe covers the config's layout.

    `cast_weights`: elements of the matmul weights autocast copies to 16 bits (mixed precision only), of which
    `cast_head` are outside the repeated layers (the heads'). Checkpointed layers do not keep their copies for backward (autocast's
    cache is dropped as the forward leaves it, and the recomputation casts again); the head's copy is kept."""
    layout = _layout(config, class_name, batch, seq, precision, checkpointing)
    if not isinstance(layout, _Layout):
        return None
    recipe = recipe_for(config, class_name)
    kind = _kind(precision)
    tokens, h, vocab, layers = batch * seq, layout.hidden, layout.vocab, layout.layers
    if checkpointing:
        size = 2 if kind == "bf16-pure" else 4
        per_layer = size * tokens * h
        layer_text = f"the layer's input, {size}·T·h = {per_layer:,} B each (recomputed in backward)"
    else:
        per_layer, layer_text = layout.layer, layout.layer_text
    outside, outside_text = layout.checkpointed_outside if checkpointing and layout.checkpointed_outside else \
        (layout.outside, layout.outside_text)
    kept_casts = (cast_head if checkpointing else cast_weights) if kind == "mixed" else 0
    casts = 2 * kept_casts
    if layout.stack is not None and not checkpointing:
        stack, stack_text = layout.stack
    else:
        stack, stack_text = layers * per_layer, f"{layers} layers × {layer_text}"
    saved = stack + outside + casts
    text = (f"{stack_text}; outside the layers {outside_text}"
            + (f"; autocast's 16-bit weights 2 × {kept_casts:,}" if casts else ""))
    logits = 4 * tokens * vocab
    forward_tv, backward_tv = layout.loss_tv if layout.loss_tv != (0, 0) else (4 if kind == "fp32" else 6, 8)
    forward_extra = forward_tv * tokens * vocab
    in_flight = 2 * (cast_weights - kept_casts) if kind == "mixed" else 0  # layer copies alive until the forward ends
    if not vocab:  # a bare model trains on its output's sum: no logits, no loss buffers (the sum's gradient is a view)
        moments = [Moment("forward", "end of forward", saved + in_flight, f"saved {saved:,}" + (
            f" + the layers' 16-bit weight copies 2 × {cast_weights - kept_casts:,}" if in_flight else ""))]
        return TrainingActivations(recipe, saved, text, per_layer, layers, 0, tuple(moments))
    moments = [
        Moment("forward", "end of forward", saved + forward_extra + in_flight,
               f"saved {saved:,} + the loss's log-softmax {forward_extra // (tokens * vocab)}·T·V"
               + (f" + the layers' 16-bit weight copies 2 × {cast_weights - kept_casts:,}" if in_flight else "")),
        Moment("backward", "start of backward", saved + backward_tv * tokens * vocab,
               f"saved {saved:,} + the logits' gradient and log-softmax {backward_tv}·T·V = "
               f"{backward_tv * tokens * vocab:,}"),
    ]
    if checkpointing:
        recompute = saved - 4 * tokens * vocab + layout.layer + 8 * tokens * h
        moments.append(Moment("backward", "last layer recomputed", recompute,
                              f"saved {saved:,} − the freed fp32 logits 4·T·V + one layer's activations "
                              f"{layout.layer:,} + its output and input gradients 8·T·h"))
    return TrainingActivations(recipe, saved, text, per_layer, layers, logits, tuple(moments))


def embedding_gradient(config: Any, *, batch: int, seq: int, precision: str) -> int:
    """The gradient of the embedding's output, live as backward ends."""
    from .kv_cache import config_int

    h = config_int(config, "hidden_size", "n_embd") or 0
    return (2 if precision == "bf16-pure" else 4) * batch * seq * h + 8


def attention_dropout(config: Any) -> float:
    """The attention-probability dropout a config sets for training (0 when none)."""
    return _first_positive(config, ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout",
                                    "attention_dropout_prob", "dropout_rate"))  # T5: one rate for both


def hidden_dropout(config: Any) -> float:
    """The dropout on a layer's outputs a config sets for training (0 when none)."""
    return _first_positive(config, ("resid_pdrop", "hidden_dropout_prob", "hidden_dropout", "dropout",
                                    "dropout_rate"))


def _first_positive(config: Any, keys: tuple[str, ...]) -> float:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return 0.0
