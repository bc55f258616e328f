"""GPT-style decoder recipes: GPT-2, GPT-NeoX (Pythia), GPT-J.

    GPT-NeoX (parallel residual, LayerNorm, fused qkv, partial rotary), per token: 32h (fp32), 18h (mixed), 16h
        (bf16-pure) + 4·heads + 16 (8 in bf16-pure) + the MLP's activation: exact GELU 8i (fp32) or 4i,
        GPT-NeoX-20B's unfused tanh "gelu_fast" 32i (fp32) or 16i.
    GPT-J (parallel attention and MLP, rotary on rd dimensions a head, unfused tanh GELU, no dropout), per layer:
        24·T·h + 20·T·i (fp32), 20·T·h + 10·T·i (mixed), 12·T·h + 10·T·i (bf16-pure), + 4·T·heads + 8·T (4) +
        16·S·rd (8: the rotary sin and cos, repeated per call).
    GPT-2 (LayerNorm, Conv1D, unfused tanh-GELU, dropout), per layer: 120·T·h (fp32), 66 (bf16-pure), 70 (mixed)
        + 12·B·heads·S² + 16·T (8 in bf16-pure).
"""

from __future__ import annotations

from typing import Any

from ...dims import attention_dropout, config_dims, config_int, first_positive, hidden_dropout, missing
from .layout import Layout, causal_backward_start, causal_loss_working

GPT2_STYLE = ("gpt2",)

# GPT-2, (T·h, B·heads·S², T) bytes per layer: LayerNorms, Conv1D inputs, the unfused tanh-GELU's intermediates,
# dropout masks, and eager-sized attention scores (sdpa with dropout runs the math kernel on CPU)
_GPT2_LAYER = {"fp32": (120, 12, 16), "bf16-pure": (66, 12, 8), "mixed": (70, 12, 16)}
# GPT-2, (T·h, T·V, T, S) outside the layers
_GPT2_OUTSIDE = {"fp32": (12, 4, 24, 8), "bf16-pure": (6, 4, 20, 8), "mixed": (10, 4, 24, 8)}


def gpt2_style(config: Any, kind: str, batch: int, seq: int) -> Layout | str:
    dims = config_dims(config, h=("n_embd", "hidden_size"), heads=("n_head", "num_attention_heads"),
                       vocab="vocab_size", layers=("n_layer", "num_hidden_layers"))
    if isinstance(dims, str):
        return dims
    h, heads, vocab, layers = dims
    inner = getattr(config, "n_inner", None)
    if inner not in (None, 4 * h):
        return f"an MLP width n_inner = {inner} other than 4 × n_embd"
    tokens = batch * seq
    per_h, per_score, per_t = _GPT2_LAYER[kind]
    layer = per_h * tokens * h + per_score * batch * heads * seq * seq + per_t * tokens
    th, tv, t, s = _GPT2_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + t * tokens + s * seq
    # as the loss is taken the training cache still holds 4·T·h a layer that attention did not save (its keys or
    # values, fp32 even in bf16-pure, where the math kernel that runs dropout upcasts; under autocast two 16-bit
    # copies); measured on the timeline (tests/test_training_memory.py)
    working = causal_loss_working(kind, batch, seq, h, layers, 0) + (
        (layers * 4 * tokens * h, f"what the training cache holds that attention did not save, {layers} layers × "
                                  "4·T·h", False),)
    return Layout(layer, f"({per_h}·T·h + {per_score}·B·heads·S² + {per_t}·T) = {layer:,} B each", outside,
                   f"{th}·T·h + {tv}·T·V + {t}·T + {s}·S = {outside:,} B", h, vocab, layers, loss_working=working,
                   backward_start=causal_backward_start(batch, seq))


# GPT-NeoX (Pythia; parallel residual, LayerNorm, fused qkv, rotary on part of each head), (T·h, T·heads, T) bytes
# per layer and, by activation, ·T·i: exact GELU keeps its input, the unfused tanh "gelu_fast" its intermediates
_NEOX_LAYER = {"fp32": (32, 4, 16), "mixed": (18, 4, 16), "bf16-pure": (16, 4, 8)}
_NEOX_ACTIVATION = {"gelu": {"fp32": 8, "mixed": 4, "bf16-pure": 4},
                    "gelu_fast": {"fp32": 32, "mixed": 16, "bf16-pure": 16}}
# GPT-NeoX, (T·h, T·V, S·rd, T) outside the layers; rd: the rotary dimensions of a head
_NEOX_OUTSIDE = {"fp32": (8, 4, 8, 16), "mixed": (6, 4, 8, 16), "bf16-pure": (4, 4, 4, 12)}


def neox_style(config: Any, kind: str, batch: int, seq: int) -> Layout | str:

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
        return missing(hidden_size=h, num_attention_heads=heads, intermediate_size=inner, vocab_size=vocab,
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
    return Layout(tokens * per_token, f"{tokens:,} tokens × {per_token:,} B ({per_h}h + {per_i}i + "
                   f"{per_heads}·heads + {per_t}) = {tokens * per_token:,} B each",
                   outside, f"{th}·T·h + {tv}·T·V + {srd}·S·rd + {t}·T = {outside:,} B", h, vocab, layers,
                   loss_working=causal_loss_working(kind, batch, seq, h, layers, h),
                   backward_start=causal_backward_start(batch, seq))


# GPT-J (gpt-j-6b: parallel attention and MLP from one LayerNorm, rotary on the first rd dimensions of each head,
# the unfused tanh GELU, no dropout), (T·h, T·i, S·rd, T·heads, T) per layer and (T·h, T·V, T) outside
_GPTJ_LAYER = {"fp32": (24, 20, 16, 4, 8), "mixed": (20, 10, 16, 4, 8), "bf16-pure": (12, 10, 8, 4, 4)}
_GPTJ_OUTSIDE = {"fp32": (8, 4, 16), "mixed": (6, 4, 16), "bf16-pure": (4, 4, 12)}


def gptj_style(config: Any, kind: str, batch: int, seq: int) -> Layout | str:

    dims = config_dims(config, h="n_embd", heads="n_head", rotary="rotary_dim", vocab="vocab_size", layers="n_layer")
    if isinstance(dims, str):
        return dims
    h, heads, rotary, vocab, layers = dims
    inner = config_int(config, "n_inner") or 4 * h
    if getattr(config, "activation_function", None) != "gelu_new":
        return f"the activation {getattr(config, 'activation_function', None)!r} (fitted: gelu_new)"
    if attention_dropout(config) or hidden_dropout(config) or first_positive(config, ("embd_pdrop",)):
        return "dropout (fitted without, as gpt-j-6b)"
    tokens = batch * seq
    per_h, per_i, per_srd, per_heads, per_t = _GPTJ_LAYER[kind]
    layer = tokens * (per_h * h + per_i * inner + per_heads * heads + per_t) + per_srd * seq * rotary
    th, tv, t = _GPTJ_OUTSIDE[kind]
    outside = th * tokens * h + tv * tokens * vocab + t * tokens
    # checkpointed layers are recomputed from the sin and cos (and the positions they were gathered at)
    kept = outside + per_srd // 4 * seq * rotary + 8 * seq
    return Layout(layer, f"({per_h}·T·h + {per_i}·T·i + {per_heads}·T·heads + {per_t}·T + the rotary sin and cos "
                          f"{per_srd}·S·rd) = {layer:,} B each",
                   outside, f"{th}·T·h + {tv}·T·V + {t}·T = {outside:,} B", h, vocab, layers,
                   checkpointed_outside=(kept, f"{th}·T·h + {tv}·T·V + {t}·T + the sin, cos and positions the layers "
                                               f"are recomputed from {per_srd // 4}·S·rd + 8·S = {kept:,} B"),
                   loss_working=causal_loss_working(kind, batch, seq, h, layers, h),
                   backward_start=causal_backward_start(batch, seq))
