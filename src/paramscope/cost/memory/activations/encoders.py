"""Encoder recipes: BERT, RoBERTa, DistilBERT, ELECTRA's discriminator, ModernBERT, ALBERT (masked LMs).

    BERT masked LM (post-LN, exact GELU, dropout), per layer: 40·T·h + 8·T·i (fp32), 26·T·h + 4·T·i (bf16-pure),
        34·T·h + 4·T·i (mixed), + 12·B·heads·S² + 16·T (8 in bf16-pure).
    ModernBERT (pre-LN, GeGLU, RoPE, no dropout; global and local layers), per layer: 40·T·h + 16·T·i (fp32),
        24·T·h + 8·T·i (mixed), 20·T·h + 8·T·i (bf16-pure), + 4·T·heads + 16·T (8); each local layer keeps its
        sliding-window mask, 4·B·S² (2 in 16 bits), once the sequence fills the window.
    DeBERTa-v2/v3 (deberta-v3-base: disentangled attention, c2p and p2c through the shared query and key
        projections, log-bucketed relative positions; P buckets, the relative embeddings 2P wide), per layer:
        44·T·h + 8·T·i + 12·B·heads·S² + 16·T (fp32; 30, 4, 6, 16 mixed; 22, 4, 6, 8 bf16-pure), + the relative
        terms 8·B·2P·h + 8·B·heads·S·2P (4 and 4 in 16 bits: the repeated position keys and queries, the c2p and
        p2c scores the gathers keep), 8·2P·h (4 bf16-pure), 16·S² (the int64 gather indices), B·S² (the mask).
    ALBERT (albert-base-v2: one shared layer a pass, no dropout, unfused tanh GELU), per pass: 32·T·h + 20·T·i
        (fp32), 16·T·h + 10·T·i (mixed, bf16-pure), + 4·T·heads + 16·T (8).
    RoBERTa and ELECTRA's discriminator: BERT's layers; outside, RoBERTa counts positions from the ids and
        ELECTRA has one logit a token. DistilBERT: 36·T·h (fp32), 24 (bf16-pure), 32 (mixed), the rest as BERT.
"""

from __future__ import annotations

from typing import Any

from ...dims import attention_dropout, config_dims, config_int, first_positive, hidden_dropout, missing
from .layout import Layout, final_hidden_working

BERT_STYLE = ("bert",)


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


def bert_style(config: Any, kind: str, batch: int, seq: int, variant: str = "bert") -> Layout | str:

    dims = config_dims(config, h=("hidden_size", "dim"), heads=("num_attention_heads", "n_heads"),
                       inner=("intermediate_size", "hidden_dim"), vocab="vocab_size",
                       layers=("num_hidden_layers", "n_layers"))
    if isinstance(dims, str):
        return dims
    h, heads, inner, vocab, layers = dims
    # the fitted layout has dropout on the attention probabilities and the layers' outputs (masks, and sdpa's
    # math kernel with its S² scores); without it the step is traced
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
    return Layout(layer, f"({per_h}·T·h + {per_i}·T·i + {per_score}·B·heads·S² + {per_t}·T) = {layer:,} B each",
                   outside_bytes,
                   f"{th}·T·h + {tv}·T·V + {t}·T + {s}·S + {one} = {outside_bytes:,} B", h, loss_vocab, layers,
                   loss_tv, loss_working=final_hidden_working(kind, tokens, h))


# ModernBERT (pre-LN without biases, GeGLU, RoPE, no dropout; a global layer every few, the others local), per
# layer (T·h, T·i, T·heads, T), ·B·S² per local layer (its sliding-window mask, which sdpa keeps), and outside
# (T·h, T·V, T, S·hd)
_MODERNBERT_LAYER = {"fp32": (40, 16, 4, 16), "mixed": (24, 8, 4, 16), "bf16-pure": (20, 8, 4, 8)}
_MODERNBERT_MASK = {"fp32": 4, "mixed": 2, "bf16-pure": 2}
_MODERNBERT_OUTSIDE = {"fp32": (20, 4, 24, 16), "mixed": (12, 4, 20, 16), "bf16-pure": (10, 4, 16, 8)}
# checkpointed: the layers keep their input, and (·T·h, ·T) more outside with the S² mask they are recomputed from
_MODERNBERT_CHECKPOINTED = {"fp32": (4, 8), "mixed": (4, 8), "bf16-pure": (2, 4)}


def modernbert_style(config: Any, kind: str, batch: int, seq: int) -> Layout | str:
    dims = config_dims(config, h="hidden_size", heads="num_attention_heads", inner="intermediate_size",
                       vocab="vocab_size", layers="num_hidden_layers", window="sliding_window")
    if isinstance(dims, str):
        return dims
    h, heads, inner, vocab, layers, window = dims
    types = getattr(config, "layer_types", None)
    if not isinstance(types, (list, tuple)):
        return missing(layer_types=None)
    if getattr(config, "hidden_activation", None) != "gelu":
        return f"the activation {getattr(config, 'hidden_activation', None)!r} (fitted: gelu)"
    if first_positive(config, ("attention_dropout", "mlp_dropout", "embedding_dropout")):
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
    return Layout(layer, layer_text, outside, f"{th}·T·h + {tv}·T·V + {t}·T + {shd}·S·hd = {outside:,} B", h, vocab,
                   layers, checkpointed_outside=(kept, kept_text), loss_working=final_hidden_working(kind, tokens, h),
                   stack=(stack, f"{layers} layers × {layer_text}" + (
                       f"; the {local} local layers' sliding-window masks {mask}·B·S² each" if local else "")))


# ALBERT (albert-base-v2's layout: one shared layer a pass, no dropout, the unfused tanh GELU, embeddings of width e
# projected up), (T·h, T·i, T·heads, T) per pass and (T·h, T·e, T·V, T, S, 1) outside
_ALBERT_LAYER = {"fp32": (32, 20, 4, 16), "bf16-pure": (16, 10, 4, 8), "mixed": (16, 10, 4, 8)}
_ALBERT_OUTSIDE = {"fp32": (4, 32, 4, 24, 8, 8), "bf16-pure": (2, 16, 2, 16, 8, 4), "mixed": (2, 18, 4, 20, 8, 8)}


def albert_style(config: Any, kind: str, batch: int, seq: int) -> Layout | str:

    dims = config_dims(config, h="hidden_size", e="embedding_size", heads="num_attention_heads",
                       inner="intermediate_size", vocab="vocab_size", layers="num_hidden_layers")
    if isinstance(dims, str):
        return dims
    h, e, heads, inner, vocab, layers = dims
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
    return Layout(tokens * per_token, f"{tokens:,} tokens × {per_token:,} B ({per_h}h + {per_i}i + {per_heads}·heads"
                   f" + {per_t}) = {tokens * per_token:,} B each pass",
                   outside, f"{th}·T·h + {te}·T·e + {tv}·T·V + {t}·T + {s}·S + {one} = {outside:,} B", h, vocab,
                   layers, loss_tv)


# DeBERTa-v2/v3 (deberta-v3-base's layout), per layer: (T·h, T·i, B·heads·S², T, B·2P·h, 2P·h, S², B·S²,
# B·heads·S·2P, 1); 2P relative positions (P buckets)
_DEBERTA_LAYER = {"fp32": (44, 8, 12, 16, 8, 8, 16, 1, 8, 12), "mixed": (30, 4, 6, 16, 4, 8, 16, 1, 4, 6),
                  "bf16-pure": (22, 4, 6, 8, 4, 4, 16, 1, 4, 6)}
# outside the layers, (T·h, T·V, T, 2P, 1): the bare DebertaV2Model (its preset's class, trained on its output's
# sum) and the masked LM (the legacy head: dense, GELU, norm, the tied decoder)
_DEBERTA_OUTSIDE = {
    "model": {"fp32": (8, 0, 12, 8, 4), "mixed": (8, 0, 12, 8, 4), "bf16-pure": (4, 0, 6, 4, 4)},
    "lm": {"fp32": (24, 4, 28, 8, 8), "mixed": (16, 4, 24, 8, 8), "bf16-pure": (12, 2, 18, 4, 4)},
}
# checkpointed, the layers are recomputed from the normed relative embeddings (·2P·h), the int64 relative positions
# (8·S²) and the mask (4·B·S²), kept outside
_DEBERTA_CHECKPOINTED_2PH = {"fp32": 4, "mixed": 4, "bf16-pure": 2}
# the fitted layout, (field, value, words): deberta-v3-base's
_DEBERTA_FITTED = (("relative_attention", True, "no relative attention"),
                   ("share_att_key", True, "separate position projections (fitted: shared with query and key)"),
                   ("position_biased_input", False, "absolute positions added to the input"),
                   ("hidden_act", "gelu", "another activation (fitted: gelu)"))


def deberta_dims(config: Any) -> dict[str, int] | str:
    """DeBERTa-v2's dimensions (h, heads, i, layers, P2: the 2P relative positions) where the config has the layout
    the recipes were fitted at (deberta-v3-base's), else the words naming what differs."""

    dims = config_dims(config, h="hidden_size", heads="num_attention_heads", inner="intermediate_size",
                       layers="num_hidden_layers")
    if isinstance(dims, str):
        return dims
    h, heads, inner, layers = dims
    for field, value, words in _DEBERTA_FITTED:
        if getattr(config, field, None) != value:
            return words
    kinds = getattr(config, "pos_att_type", None)
    kinds = kinds.lower().split("|") if isinstance(kinds, str) else kinds
    if not isinstance(kinds, (list, tuple)) or sorted(str(k).strip() for k in kinds) != ["c2p", "p2c"]:
        return f"pos_att_type {getattr(config, 'pos_att_type', None)!r} (fitted: p2c|c2p)"
    norms = str(getattr(config, "norm_rel_ebd", "none")).lower().split("|")
    if "layer_norm" not in (n.strip() for n in norms):
        return "relative embeddings without their norm (fitted: norm_rel_ebd layer_norm)"
    if config_int(config, "conv_kernel_size"):
        return "a convolution beside the first layer (deberta-v2-xlarge's)"
    if config_int(config, "type_vocab_size") or config_int(config, "embedding_size") not in (None, h):
        return "token types or embeddings narrower than the layers"
    # the attention's span: position buckets, else the maximum relative position, else the positions
    span = config_int(config, "position_buckets") or config_int(config, "max_relative_positions") or \
        config_int(config, "max_position_embeddings")
    if span is None:
        return "a config without position_buckets, max_relative_positions or max_position_embeddings"
    return {"h": h, "heads": heads, "i": inner, "layers": layers, "P2": 2 * span}


def deberta_style(config: Any, kind: str, batch: int, seq: int, variant: str = "model") -> Layout | str:

    dims = deberta_dims(config)
    if isinstance(dims, str):
        return dims
    if not attention_dropout(config) or not hidden_dropout(config):
        return "no attention or hidden dropout (fitted with both)"
    h, heads, inner, layers, positions = dims["h"], dims["heads"], dims["i"], dims["layers"], dims["P2"]
    tokens, scores = batch * seq, batch * heads * seq * seq
    c = _DEBERTA_LAYER[kind]
    layer = (c[0] * tokens * h + c[1] * tokens * inner + c[2] * scores + c[3] * tokens + c[4] * batch * positions * h
             + c[5] * positions * h + c[6] * seq * seq + c[7] * batch * seq * seq
             + c[8] * batch * heads * seq * positions + c[9])
    layer_text = (f"({c[0]}·T·h + {c[1]}·T·i + {c[2]}·B·heads·S² + {c[3]}·T + {c[4]}·B·2P·h + {c[5]}·2P·h + "
                  f"{c[6]}·S² + {c[7]}·B·S² + {c[8]}·B·heads·S·2P + {c[9]}, 2P = {positions:,} relative positions) "
                  f"= {layer:,} B each")
    th, tv, t, p, one = _DEBERTA_OUTSIDE[variant][kind]
    vocab = config_int(config, "vocab_size") if tv else 0
    if vocab is None:
        return "a config without vocab_size"
    outside = th * tokens * h + tv * tokens * vocab + t * tokens + p * positions + one
    outside_text = f"{th}·T·h + " + (f"{tv}·T·V + " if tv else "") + f"{t}·T + {p}·2P + {one} = {outside:,} B"
    kept_ph = _DEBERTA_CHECKPOINTED_2PH[kind]
    kept = outside + kept_ph * positions * h + 8 * seq * seq + 4 * batch * seq * seq
    kept_text = (outside_text.rsplit(" = ", 1)[0] + f" + the normed relative embeddings, positions and mask the layers"
                 f" are recomputed from {kept_ph}·2P·h + 8·S² + 4·B·S² = {kept:,} B")
    loss_tv = (2, 4) if kind == "bf16-pure" and tv else (0, 0)  # bf16 logits go to the loss as they are (as BERT's)
    return Layout(layer, layer_text, outside, outside_text, h, vocab, layers, loss_tv,
                  checkpointed_outside=(kept, kept_text),
                  loss_working=final_hidden_working(kind, tokens, h) if tv else ())
