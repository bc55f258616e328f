"""Encoder-decoder recipes: T5 v1 and BART, encoder and decoder layers apart, each side at --seq tokens.

    T5 v1 (ReLU MLP, dropout, tied head; encoder and decoder at S tokens each), inner = heads × d_kv:
        encoder layer 32·T·h + 16·T·inner + 12·T·i (fp32; 28, 14, 6 mixed; 24, 14, 6 bf16-pure) + 12·B·heads·S² +
        8·T; decoder layer 48·T·h + 32·T·inner + 12·T·i (44, 28, 6; 36, 28, 6) + 24·B·heads·S² + 12·T + S² (its
        causal mask). Checkpointed, T5 keeps the position biases its layers are recomputed from (12·heads·S² fp32,
        10 mixed, 6 bf16-pure) outside the layers.
    BART (post-LN, exact GELU, dropout everywhere; each side at S tokens): encoder layer 40·T·h + 12·T·i (fp32;
        34, 6 mixed; 26, 6 bf16-pure) + 12·B·heads·S² + 16·T (8); decoder layer 68·T·h + 12·T·i (60, 6; 46, 6) +
        24·B·heads·S² + 24·T (12). The bare BartModel (its preset's class) trains on its output's sum: no logits.
"""

from __future__ import annotations

from typing import Any

from ...dims import attention_dropout, config_int, first_positive, missing
from .layout import Layout, encoder_output_working, final_hidden_working

# T5 v1 (t5-small/base/large: ReLU MLP, dropout, the head tied), each side at --seq tokens; inner = heads × d_kv.
# (T·h, T·inner, T·i, B·heads·S², T, S²) per encoder layer and per decoder layer (its causal mask, cross-attention)
_T5_ENCODER = {"fp32": (32, 16, 12, 12, 8, 0), "bf16-pure": (24, 14, 6, 12, 8, 0), "mixed": (28, 14, 6, 12, 8, 0)}
_T5_DECODER = {"fp32": (48, 32, 12, 24, 12, 1), "bf16-pure": (36, 28, 6, 24, 12, 1),
               "mixed": (44, 28, 6, 24, 12, 1)}
# T5, (T·h, T·V, T, S², 1) outside the layers: embeddings, position biases and masks, final norms, head, loss
_T5_OUTSIDE = {"fp32": (40, 4, 24, 16, 8), "bf16-pure": (28, 2, 24, 16, 4), "mixed": (34, 4, 24, 16, 8)}
# T5 checkpointed, (T·h, T·V, T, heads·S², 1) outside: the position biases the layers are recomputed from are kept
_T5_CHECKPOINTED_OUTSIDE = {"fp32": (40, 4, 24, 12, 8), "bf16-pure": (28, 2, 24, 6, 4), "mixed": (38, 4, 24, 10, 8)}


def t5_style(config: Any, kind: str, batch: int, seq: int) -> Layout | str:

    h = config_int(config, "d_model")
    inner = (config_int(config, "num_heads") or 0) * (config_int(config, "d_kv") or 0)
    heads = config_int(config, "num_heads")
    ff = config_int(config, "d_ff")
    vocab = config_int(config, "vocab_size")
    encoder_layers = config_int(config, "num_layers")
    decoder_layers = config_int(config, "num_decoder_layers") or encoder_layers
    if None in (h, heads, ff, vocab, encoder_layers) or not inner:
        return missing(d_model=h, num_heads=heads, d_kv=inner or None, d_ff=ff, vocab_size=vocab,
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
    # as the loss is taken: each decoder layer's training cache (self- and cross-attention keys and values, 8·T·inner
    # in every precision; the cache is off with checkpointing) and the decoder's output before the tied head's
    # rescaling (fp32 4·T·h, bf16 2·T·h; under autocast both it and its rescaled copy, 8·T·h, and the encoder's
    # fp32 output). Measured on the timeline (tests/test_training_memory.py)
    output = {"fp32": 4, "bf16-pure": 2, "mixed": 8}[kind]
    working = ((decoder_layers * 8 * tokens * inner, f"the training cache, {decoder_layers} decoder layers × "
                                                     "8·T·inner", False),
               (output * tokens * h, f"the decoder's output before the head's rescaling, {output}·T·h", True)) + \
        encoder_output_working(kind, tokens, h)
    return Layout(decoder, decoder_text, outside, f"{th}·T·h + {tv}·T·V + {t}·T + {s2}·S² + {one} = {outside:,} B",
                   h, vocab, encoder_layers + decoder_layers, loss_tv, loss_working=working, checkpointed_outside=(
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


def bart_style(config: Any, kind: str, batch: int, seq: int, variant: str = "lm") -> Layout | str:

    h = config_int(config, "d_model")
    vocab = config_int(config, "vocab_size")
    sides = [(config_int(config, f"{side}_layers"), config_int(config, f"{side}_attention_heads"),
              config_int(config, f"{side}_ffn_dim")) for side in ("encoder", "decoder")]
    # the fitted layout: post-LN (mBART's pre-LN is another model type), no extra final norms, unscaled
    # embeddings, exact GELU, dropout everywhere
    if None in (h, vocab) or None in sides[0] + sides[1]:
        return missing(d_model=h, vocab_size=vocab, encoder_layers=sides[0][0], encoder_attention_heads=sides[0][1],
                        encoder_ffn_dim=sides[0][2], decoder_layers=sides[1][0],
                        decoder_attention_heads=sides[1][1], decoder_ffn_dim=sides[1][2])
    if getattr(config, "activation_function", None) != "gelu":
        return f"the activation {getattr(config, 'activation_function', None)!r} (fitted: gelu)"
    if getattr(config, "normalize_before", False) or getattr(config, "add_final_layer_norm", False):
        return "pre-LN layers or final norms (fitted: BART's post-LN)"
    if getattr(config, "scale_embedding", False):
        return "scaled embeddings (fitted without)"
    if not all(first_positive(config, (key,)) for key in ("dropout", "attention_dropout", "activation_dropout")):
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
    # the bf16 logits go to the loss as they are; under autocast, adding the fp32 final_logits_bias makes them fp32
    # (the 16-bit ones are freed), so the loss reads no second copy
    loss_tv = (2, 4) if kind == "bf16-pure" else (4, 8) if kind == "mixed" else (0, 0)
    # as the loss is taken, under autocast: the decoder's fp32 output and the encoder's (which checkpointed decoder
    # layers save as their input), each 4·T·h, where the head and cross-attention saved 16-bit casts
    working = final_hidden_working(kind, tokens, h) + encoder_output_working(kind, tokens, h)
    th_c = _BART_CHECKPOINTED_TH[kind]
    kept = outside + (th_c - th) * tokens * h
    return Layout(decoder, decoder_text, outside, f"{th}·T·h + {tv}·T·V + {t}·T + {s}·S + {one} = {outside:,} B"
                   if tv else f"{th}·T·h + {t}·T + {s}·S + {one} = {outside:,} B",
                   h, vocab if tv else 0, encoder_layers + decoder_layers, loss_tv, checkpointing=variant == "lm",
                   loss_working=working if tv else (),
                   checkpointed_outside=(kept, f"{th_c}·T·h + {tv}·T·V + {t}·T + {s}·S + {one} = {kept:,} B"),
                   stack=(stack, f"{encoder_layers} encoder layers × {encoder_text} + {decoder_layers} decoder layers"
                                 f" × {decoder_text}"))
