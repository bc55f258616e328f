"""Activations of a training step, analytic: what the forward saves for backward, and the peaks around it.

Closed forms in the config's fields, for the layouts whose step was measured op by op on fake tensors and fitted
exactly (tests/test_training_memory.py holds them to the traced engine within 3%). T = batch × seq tokens,
h = hidden, q = heads × head_dim, kv = kv_heads × head_dim, i = intermediate, V = vocab, L = layers.

Llama-style decoders (RMSNorm, RoPE, sdpa, SiLU-gated MLP; llama, mistral, qwen2), bytes saved per layer and token:

    fp32        24h + 8q + 8kv + 16i + 4·heads + 8
    bf16-pure   16h + 4q + 4kv +  8i + 4·heads + 8     (RMSNorm computes in fp32 and saves its fp32 input)
    *-mixed     26h + 4q + 4kv +  8i + 4·heads + 8     (autocast: matmuls in 16 bits, norms and residuals fp32)

the 4·heads being sdpa's log-sum-exp (fp32 per head and token) and the 8 the RMSNorms' reciprocal roots. Outside
the layers: the embedding output and final norm (fp32: 12·T·h), fp32 logits 4·T·V, RoPE's cos and sin 8·S·hd, and
12·T of positions and loss indices; mixed precision adds the 16-bit copies of the weights autocast casts (2 B per
layer matmul weight and lm_head). With full gradient checkpointing a layer saves only its input (T·h × size) and
its activations are recomputed, one layer at a time, in backward.

The peak is the largest of the step's moments, not the sum of its parts (R = weights + buffers + optimizer states):
- end of forward: R + saved + the loss's fp32 log-softmax (4·T·V; 6·T·V when logits are 16-bit);
- start of backward: R + saved + the logits' gradient and log-softmax (8·T·V);
- end of backward: R + gradients + the embedding's input gradient (T·h in fp32, or bf16 when pure);
- optimizer step: R + gradients (fused AdamW and foreach SGD keep no step-sized temporaries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLAMA_STYLE = ("llama", "mistral", "qwen2")

# (h, q, kv, i, heads, 1) bytes per layer and token
_LAYER = {"fp32": (24, 8, 8, 16, 4, 8), "bf16-pure": (16, 4, 4, 8, 4, 8), "mixed": (26, 4, 4, 8, 4, 8)}
# (T·h, T·V, S·hd, T) bytes outside the layers
_OUTSIDE = {"fp32": (12, 4, 8, 12), "bf16-pure": (8, 4, 4, 12), "mixed": (10, 4, 8, 12)}


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


def recipe_for(config: Any) -> str | None:
    model_type = getattr(config, "model_type", None)
    return "Llama-style decoder" if model_type in LLAMA_STYLE else None


def training_activations(config: Any, *, batch: int, seq: int, precision: str, checkpointing: bool,
                         cast_weights: int = 0, cast_head: int = 0) -> TrainingActivations | None:
    """The analytic activations of one training step, or None when no recipe covers the config's layout.

    `cast_weights`: elements of the matmul weights autocast copies to 16 bits (mixed precision only), of which
    `cast_head` are the output head's. Checkpointed layers do not keep their copies for backward (autocast's
    cache is dropped as the forward leaves it, and the recomputation casts again); the head's copy is kept."""
    from .kv_cache import config_int

    if recipe_for(config) is None:
        return None
    h = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    kv_heads = config_int(config, "num_key_value_heads") or heads
    head_dim = config_int(config, "head_dim") or h // heads
    inner = config_int(config, "intermediate_size")
    vocab = config_int(config, "vocab_size")
    layers = config_int(config, "num_hidden_layers")
    if None in (h, heads, head_dim, inner, vocab, layers):
        return None
    kind = "fp32" if precision == "fp32" else "bf16-pure" if precision == "bf16-pure" else "mixed"
    q, kv = heads * head_dim, kv_heads * head_dim
    tokens = batch * seq
    size = 2 if kind == "bf16-pure" else 4
    full = _LAYER[kind]
    full_bytes = full[0] * h + full[1] * q + full[2] * kv + full[3] * inner + full[4] * heads + full[5]
    full_text = (f"({full[0]}h + {full[1]}q + {full[2]}kv + {full[3]}i + {full[4]}·heads + {full[5]}) = "
                 f"{full_bytes:,} B")
    if checkpointing:
        layer_token = (2 if kind == "bf16-pure" else 4) * h
        layer_text = f"the layer's input, {layer_token // h}h = {layer_token:,} B (recomputed in backward)"
    else:
        layer_token, layer_text = full_bytes, full_text
    per_layer = tokens * layer_token
    th, tv, shd, t = _OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + shd * seq * head_dim + t * tokens
    kept_casts = (cast_head if checkpointing else cast_weights) if kind == "mixed" else 0
    casts = 2 * kept_casts
    saved = layers * per_layer + outside + casts
    text = (f"{layers} layers × {tokens:,} tokens × {layer_text.split(' (')[0]}; outside the layers {th}·T·h + "
            f"{tv}·T·V + {shd}·S·hd + {t}·T = {outside:,} B" + (f"; autocast's 16-bit weights 2 × {kept_casts:,}"
                                                                  if casts else ""))
    logits = 4 * tokens * vocab
    forward_extra = (4 if kind == "fp32" else 6) * tokens * vocab
    in_flight = 2 * (cast_weights - kept_casts) if kind == "mixed" else 0  # layer copies alive until the forward ends
    moments = [
        Moment("forward", "end of forward", saved + forward_extra + in_flight,
               f"saved {saved:,} + the loss's log-softmax {forward_extra // (tokens * vocab)}·T·V"
               + (f" + the layers' 16-bit weight copies 2 × {cast_weights - kept_casts:,}" if in_flight else "")),
        Moment("backward", "start of backward", saved + 8 * tokens * vocab,
               f"saved {saved:,} + the logits' gradient and log-softmax 8·T·V = {8 * tokens * vocab:,}"),
    ]
    if checkpointing:
        recompute = saved - 4 * tokens * vocab + tokens * full_bytes + 8 * tokens * h
        moments.append(Moment("backward", "last layer recomputed", recompute,
                              f"saved {saved:,} − the freed fp32 logits 4·T·V + one layer's activations {tokens:,} × "
                              f"{full_bytes:,} + its output and input gradients 8·T·h"))
    return TrainingActivations("Llama-style decoder", saved, text, per_layer, layers, logits, tuple(moments))


def embedding_gradient(config: Any, *, batch: int, seq: int, precision: str) -> int:
    """The gradient of the embedding's output, live as backward ends."""
    from .kv_cache import config_int

    h = config_int(config, "hidden_size") or 0
    return (2 if precision == "bf16-pure" else 4) * batch * seq * h + 8
