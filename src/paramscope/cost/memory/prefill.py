"""The prefill's working memory by family: the largest moment of a layer's forward, exact on the traced prefill.

A prefill without gradients frees each tensor once nothing needs it, so its working memory is the largest moment of
the last layer's forward: the tensors live while one op runs. Which op that is depends on the config (the MLP's
activation when the intermediate is wide, the attention's scores when the sequence is long), so a family has a few
moments and the workspace is the largest. Each moment was fitted exactly, over varied configs grouped by the op at
their peak, by bench/fit_prefill.py against the traced prefill (MemTracker on fake tensors), in 16 bits and fp32;
tests/test_memory.py holds them to the trace. T = batch × seq tokens; S² and B·S² terms are masks and int64
positions (the same in every dtype).

Layouts without a recipe here take the Llama-style formula (`prefill_workspace`, at the end of this module) (exact for Llama, Mistral, Qwen2 and Gemma).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..dims import config_int, dim
from .result import Workspace


@dataclass(frozen=True)
class PrefillMoment:
    where: str  # "the decoder's MLP activation"
    formula: str  # "10·T·h + 8·T·i + 2·S·h + 8·T + 8·S"
    cached: bool = True  # the KV cache is already held (False: the encoder runs before the decoder caches)


# GPT-2 (the unfused tanh GELU keeps its input and three temporaries of T·i), the last token's logits apart
_GPT2 = {2: (PrefillMoment("the MLP's unfused GELU", "10·T·h + 8·T·i + 2·S·h + 8·T + 8·S"),),
         4: (PrefillMoment("the MLP's unfused GELU", "20·T·h + 16·T·i + 4·S·h + 8·T + 8·S"),)}
# T5 v1 (eager-free sdpa with the position bias as its mask; the encoder's output held through the decoder); the
# encoder's moment is its first layer's position-bias buckets (int64 and fp32 S² temporaries), before any cache
_T5 = {
    2: (PrefillMoment("the decoder's MLP activation", "10·T·h + 4·T·i + 4·heads·S²"),
        PrefillMoment("the decoder's cross-attention", "10·T·h + 6·T·inner + 4·heads·S²"),
        PrefillMoment("the decoder's self-attention", "8·T·h - 2·T·inner + 8·heads·S² + 1·S²"),
        PrefillMoment("the decoder's fp32 layer norm", "16·T·h + 4·heads·S²"),
        PrefillMoment("the encoder's position buckets", "4·T·h + 6·T·inner + 49·S² + 16·S", cached=False),
        PrefillMoment("the head's logits for every decoder token", "6·T·h + 2·T·V")),
    4: (PrefillMoment("the decoder's MLP activation", "20·T·h + 8·T·i + 8·heads·S²"),
        PrefillMoment("the decoder's cross-attention", "20·T·h + 12·T·inner + 8·heads·S²"),
        PrefillMoment("the decoder's self-attention", "16·T·h - 4·T·inner + 16·heads·S² + 1·S²"),
        PrefillMoment("the decoder's residual", "28·T·h + 8·heads·S²"),
        PrefillMoment("the encoder's position buckets", "8·T·h + 12·T·inner + 49·S² + 16·S", cached=False),
        PrefillMoment("the head's logits for every decoder token", "12·T·h + 4·T·V")),
}
# the bare BartModel (a forward for its outputs, no cache): the decoder's MLP or its cross-attention
_BART = {2: (PrefillMoment("the decoder's MLP activation", "8·T·h + 4·T·i + 2·S·h + 8·S"),
             PrefillMoment("the decoder's cross-attention", "18·T·h + 2·S·h + 8·S")),
         4: (PrefillMoment("the decoder's MLP activation", "16·T·h + 8·T·i + 4·S·h + 8·S"),
             PrefillMoment("the decoder's cross-attention", "36·T·h + 4·S·h + 8·S"))}
# DeBERTa-v2/v3 (the bare DebertaV2Model, eager disentangled attention; 2P relative positions): the scores' scaling,
# the gathered p2c scores, the repeated and copied position projections, the MLP's GELU; its encoder keeps every
# layer's output (L·T·h) for the hidden states it may return
_DEBERTA = {
    2: (PrefillMoment("the attention's scaled scores",
                      "6·T·h + 2·L·T·h + 10·B·heads·S² + 4·B·2P·h + 2·2P·h + 24·S² + 4·B·S² + 12·T + 10"),
        PrefillMoment("the p2c gather",
                      "6·T·h + 2·L·T·h + 8·B·heads·S² + 2·B·heads·S·2P + 4·B·2P·h "
                      "+ 2·2P·h + 24·S² + 4·B·S² + 12·T + 8"),
        PrefillMoment("the repeated position keys",
                      "6·T·h + 2·L·T·h + 2·B·heads·S² + 4·B·2P·h + 4·2P·h + 8·S² + 4·B·S² + 12·T + 4"),
        PrefillMoment("the heads' copy", "10·T·h + 2·L·T·h + 6·B·heads·S² + 2·2P·h + 8·S² + 5·B·S² + 12·T + 4"),
        PrefillMoment("the MLP's GELU", "2·T·h + 2·L·T·h + 4·T·i + 2·2P·h + 8·S² + 4·B·S² + 12·T")),
    4: (PrefillMoment("the attention's scaled scores",
                      "12·T·h + 4·L·T·h + 20·B·heads·S² + 8·B·2P·h + 4·2P·h + 24·S² + 4·B·S² + 12·T + 8"),
        PrefillMoment("the p2c gather",
                      "12·T·h + 4·L·T·h + 16·B·heads·S² + 4·B·heads·S·2P + 8·B·2P·h "
                      "+ 4·2P·h + 24·S² + 4·B·S² + 12·T + 8"),
        PrefillMoment("the repeated position keys",
                      "12·T·h + 4·L·T·h + 4·B·heads·S² + 8·B·2P·h + 8·2P·h + 8·S² + 4·B·S² + 12·T + 4"),
        PrefillMoment("the heads' copy", "20·T·h + 4·L·T·h + 12·B·heads·S² + 4·2P·h + 8·S² + 5·B·S² + 12·T + 4"),
        PrefillMoment("the MLP's GELU", "4·T·h + 4·L·T·h + 8·T·i + 4·2P·h + 8·S² + 4·B·S² + 12·T")),
}

# GPT-NeoX (Pythia: parallel residual, exact GELU, rotary on rd of each head): the MLP's GELU or the attention
_NEOX_ATTENTION = {2: PrefillMoment("the attention's rotary copy", "18·T·h + 4·S·rd + 8·S"),
                   4: PrefillMoment("the attention's rotary copy", "36·T·h + 8·S·rd + 8·S")}
_NEOX = {2: (PrefillMoment("the MLP's GELU", "8·T·h + 4·T·i + 4·S·rd + 8·S"), _NEOX_ATTENTION[2]),
         4: (PrefillMoment("the MLP's GELU", "16·T·h + 8·T·i + 8·S·rd + 8·S"), _NEOX_ATTENTION[4])}
# GPT-NeoX-20B's unfused tanh GELU ("gelu_fast"): five intermediates of T·i at its largest; the same attention
_NEOX_FAST = {2: (PrefillMoment("the MLP's unfused GELU", "8·T·h + 10·T·i + 4·S·rd + 8·S"), _NEOX_ATTENTION[2]),
              4: (PrefillMoment("the MLP's unfused GELU", "16·T·h + 20·T·i + 8·S·rd + 8·S"), _NEOX_ATTENTION[4])}
# GPT-J (parallel attention and MLP, the unfused tanh GELU, rotary on the first rd of each head)
_GPTJ = {2: (PrefillMoment("the MLP's unfused GELU", "8·T·h + 8·T·i + 2·S·rd + 8·S"),
             PrefillMoment("the attention's rotary halves", "16·T·h + 4·T·heads·rd + 2·S·rd + 8·S")),
         4: (PrefillMoment("the MLP's unfused GELU", "16·T·h + 16·T·i + 4·S·rd + 8·S"),
             PrefillMoment("the attention's rotary halves", "32·T·h + 8·T·heads·rd + 4·S·rd + 8·S"))}
# Phi-3 (fused qkv and gate-up projections), below its sliding window
_PHI3 = {2: (PrefillMoment("the MLP's gate-up halves", "8·T·h + 8·T·i + 4·S·hd + 8·S"),
             PrefillMoment("the attention's K and V copies", "14·T·h + 4·T·kv + 4·S·hd + 8·S")),
         4: (PrefillMoment("the MLP's gate-up halves", "16·T·h + 16·T·i + 8·S·hd + 8·S"),
             PrefillMoment("the attention's K and V copies", "28·T·h + 8·T·kv + 8·S·hd + 8·S"))}
# Gemma-2 (eager attention: bf16 scores, softcapped and softmaxed in fp32; a full and a sliding mask, both built):
# the softmax, where K and V repeated to the query heads are copies (R = 1) unless one kv head (a view) or as many
# as the heads (no repeat); or the MLP, beside the attention weights the layer still holds
_GEMMA2 = {2: (PrefillMoment("the attention's fp32 softmax",
                             "10·B·heads·S² + 6·T·h + 2·T·q + 4·R·T·q + 4·B·S² + 4·S·hd + 8·S"),
               PrefillMoment("the MLP's gate and up", "8·T·h + 6·T·i + 2·B·heads·S² + 4·B·S² + 4·S·hd + 8·S")),
           4: (PrefillMoment("the attention's fp32 softmax",
                             "8·B·heads·S² + 12·T·h + 4·T·q + 8·R·T·q + 8·B·S² + 8·S·hd + 8·S"),
               PrefillMoment("the MLP's gate and up", "16·T·h + 12·T·i + 4·B·heads·S² + 8·B·S² + 8·S·hd + 8·S"))}
# Mixtral (a router, then each token's k experts, run grouped with the tokens sorted by expert), in 16 bits: the
# experts' intermediates, or the gathered tokens
_MIXTRAL = {2: (PrefillMoment("the experts' intermediates",
                              "8·T·h + 8·T·k·i + 2·T·k·h + 2·T·E + 36·T·k + 4·S·hd + 8·E + 8·S"),
                PrefillMoment("the tokens gathered by expert", "8·T·h + 12·T·k·h + 2·T·E + 44·T·k + 4·S·hd + 8·E + 8·S"))}
_PHI3_WINDOW: dict[int, tuple] = {}
# ALBERT (the shared layer's unfused tanh GELU, embeddings of width e) and its masked-LM head over every token
_ALBERT = {2: (PrefillMoment("the MLP's unfused GELU", "4·T·h + 2·T·e + 8·T·i"),
               PrefillMoment("the attention's norm", "14·T·h + 2·T·e + 4·T"),
               PrefillMoment("the head's logits for every token", "2·T·V + 2·T·h + 2·T·e")),
           4: (PrefillMoment("the MLP's unfused GELU", "8·T·h + 4·T·e + 16·T·i"),
               PrefillMoment("the attention's norm", "28·T·h + 4·T·e + 8·T"),
               PrefillMoment("the head's logits for every token", "4·T·V + 4·T·h + 4·T·e"))}
# ELECTRA's discriminator (BERT's layers, one logit a token)
_ELECTRA = {2: (PrefillMoment("the MLP's GELU", "6·T·h + 4·T·i"),
                PrefillMoment("the output's norm", "12·T·h + 2·T·i + 4·T")),
            4: (PrefillMoment("the MLP's GELU", "12·T·h + 8·T·i"),
                PrefillMoment("the output's norm", "24·T·h + 4·T·i + 8·T"))}

_TERM = re.compile(r"([+-])?\s*(\d+)(?:·(\S+))?")


def evaluate(formula: str, dims: dict[str, int]) -> int:
    """`formula` ("10·T·h - 2·T·inner + 8") at `dims` (B, S, h, i, heads, inner, P2, layers)."""
    total = 0
    for sign, coefficient, term in _TERM.findall(formula.replace("+ ", "+").replace("- ", "-")):
        total += (-1 if sign == "-" else 1) * int(coefficient) * (_term(term, dims) if term else 1)
    return total


def _term(term: str, d: dict[str, int]) -> int:
    values = {"T": d["B"] * d["S"], "S²": d["S"] ** 2, "2P": d.get("P2", 0), "L": d.get("layers", 0),
              "R": d.get("R", 0)}
    value = 1
    for factor in term.split("·"):
        value *= values[factor] if factor in values else d[factor]
    return value


def prefill_moments(config: Any, class_name: str, seq: int) -> tuple[str, dict[str, int], dict[int, tuple]] | str | None:
    """(the family, its dimensions, its moments by compute dtype size) for a layout fitted here at `seq` tokens; the
    words naming what of the config was not fitted; or None for a family without moments here."""
    from .activations.encoders import deberta_dims

    model_type = getattr(config, "model_type", None)
    if model_type in ("gpt2",) and class_name == "GPT2LMHeadModel":
        h = config_int(config, "n_embd")
        if h is None or getattr(config, "activation_function", None) != "gelu_new":
            return "GPT-2 with another activation (fitted: gelu_new)"
        return "GPT-2", {"h": h, "i": config_int(config, "n_inner") or 4 * h}, _GPT2
    if model_type == "t5" and class_name == "T5ForConditionalGeneration":
        h, heads, d_kv, ff = (config_int(config, k) for k in ("d_model", "num_heads", "d_kv", "d_ff"))
        if None in (h, heads, d_kv, ff):
            return "a T5 config without d_model, num_heads, d_kv or d_ff"
        if getattr(config, "feed_forward_proj", "relu") != "relu":
            return f"T5's {getattr(config, 'feed_forward_proj', None)!r} MLP (fitted: relu, T5 v1)"
        vocab = config_int(config, "vocab_size")
        if vocab is None:
            return "a T5 config without vocab_size"
        return "T5 (v1)", {"h": h, "heads": heads, "inner": heads * d_kv, "i": ff, "V": vocab}, _T5
    if model_type == "bart" and class_name == "BartModel":
        h = config_int(config, "d_model")
        sides = {config_int(config, f"{side}_ffn_dim") for side in ("encoder", "decoder")}
        if h is None or len(sides) != 1 or None in sides:
            return "BART with encoder and decoder MLPs of other widths"
        if getattr(config, "activation_function", None) != "gelu" or getattr(config, "normalize_before", False):
            return "BART with another activation or pre-LN layers (fitted: gelu, post-LN)"
        return "BART (bare)", {"h": h, "i": sides.pop()}, _BART
    if model_type == "gpt_neox" and class_name == "GPTNeoXForCausalLM":
        h, heads, inner = (config_int(config, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
        rope = getattr(config, "rope_parameters", None)
        fraction = rope.get("partial_rotary_factor", 1.0) if isinstance(rope, dict) else \
            getattr(config, "rotary_pct", None)
        if None in (h, heads, inner) or not isinstance(fraction, (int, float)):
            return "a GPT-NeoX config without hidden_size, num_attention_heads, intermediate_size or rotary_pct"
        act = getattr(config, "hidden_act", None)
        if act not in ("gelu", "gelu_fast") or getattr(config, "use_parallel_residual", None) is not True:
            return "GPT-NeoX with another activation or a sequential residual (fitted: gelu, gelu_fast, parallel)"
        return "GPT-NeoX", {"h": h, "i": inner, "rd": int(h // heads * fraction)}, \
            _NEOX if act == "gelu" else _NEOX_FAST
    if model_type == "gptj" and class_name == "GPTJForCausalLM":
        h, heads = config_int(config, "n_embd"), config_int(config, "n_head")
        if None in (h, heads) or getattr(config, "activation_function", None) != "gelu_new":
            return "GPT-J with another activation (fitted: gelu_new)"
        rotary = config_int(config, "rotary_dim") or h // heads
        return "GPT-J", {"h": h, "heads": heads, "i": config_int(config, "n_inner") or 4 * h, "rd": rotary}, _GPTJ
    if model_type == "phi3" and class_name == "Phi3ForCausalLM":
        h, heads, inner = (config_int(config, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
        if None in (h, heads, inner):
            return "a Phi-3 config without hidden_size, num_attention_heads or intermediate_size"
        kv = config_int(config, "num_key_value_heads") or heads
        window = config_int(config, "sliding_window")
        dims = {"h": h, "i": inner, "hd": h // heads, "kv": kv * (h // heads), "W": window or 0}
        if window and seq >= window:  # sdpa takes a mask, K and V repeated to the query heads
            return ("Phi-3 at its sliding window", dims, _PHI3_WINDOW) if _PHI3_WINDOW else \
                "a sequence that fills the sliding window"
        return "Phi-3", dims, _PHI3
    if model_type == "gemma2" and class_name == "Gemma2ForCausalLM":
        h, heads, inner = (config_int(config, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
        if None in (h, heads, inner):
            return "a Gemma-2 config without hidden_size, num_attention_heads or intermediate_size"
        kv = config_int(config, "num_key_value_heads") or heads
        hd = config_int(config, "head_dim") or h // heads
        return "Gemma-2", {"h": h, "heads": heads, "i": inner, "q": heads * hd, "hd": hd,
                           "R": 1 if 1 < kv < heads else 0}, _GEMMA2
    if model_type == "mixtral" and class_name == "MixtralForCausalLM":
        h, heads, inner = (config_int(config, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
        experts, chosen = config_int(config, "num_local_experts"), config_int(config, "num_experts_per_tok")
        if None in (h, heads, inner, experts, chosen):
            return "a Mixtral config without its widths or experts"
        window = config_int(config, "sliding_window")
        if window and seq >= window:
            return "a sequence that fills the sliding window"
        hd = config_int(config, "head_dim") or h // heads
        return "Mixtral", {"h": h, "i": inner, "E": experts, "k": chosen, "hd": hd}, _MIXTRAL
    if model_type == "albert" and class_name == "AlbertForMaskedLM":
        h, e, inner, vocab = (config_int(config, k) for k in ("hidden_size", "embedding_size", "intermediate_size",
                                                              "vocab_size"))
        if None in (h, e, inner, vocab) or getattr(config, "hidden_act", None) != "gelu_new":
            return "ALBERT with another activation (fitted: gelu_new)"
        return "ALBERT", {"h": h, "e": e, "i": inner, "V": vocab}, _ALBERT
    if model_type == "electra" and class_name == "ElectraForPreTraining":
        h, inner = config_int(config, "hidden_size"), config_int(config, "intermediate_size")
        if None in (h, inner) or config_int(config, "embedding_size") not in (None, h) or \
                getattr(config, "hidden_act", None) != "gelu":
            return "ELECTRA with narrower embeddings or another activation (fitted: electra-base's)"
        return "ELECTRA discriminator", {"h": h, "i": inner}, _ELECTRA
    if model_type == "deberta-v2" and class_name == "DebertaV2Model":
        dims = deberta_dims(config)
        if isinstance(dims, str):
            return dims
        return "DeBERTa-v2 (bare)", dims, _DEBERTA  # with its layers, L
    return None


# the family moments' widths and heads a tensor-parallel rank holds 1/tp of (the hidden size stays whole)
SPLIT_BY_TP = ("i", "heads", "inner", "kv", "q")
# the family moments' widths that are the routed experts' own: under expert parallelism a rank holds whole experts
# (vLLM's MoE tensor-parallel size 1), so these stay whole on it while attention's heads are still / tp
EXPERT_WIDTHS = {"Mixtral": ("i",)}


def family_workspace(config: Any, class_name: str, *, batch: int, seq: int, dtype_size: int,
                     cache_bytes: int, tp: int = 1, last: bool = True,
                     experts_whole: bool = False) -> tuple[int, str] | str | None:
    """(bytes beyond weights, buffers and the KV cache, arithmetic) at the family's largest moment; the words why
    not (a config or dtype not fitted); None for a family without moments here. `tp`: on one tensor-parallel rank
    (widths and heads / tp); `last`: the stage that computes the logits (a pipeline's other stages skip them);
    `experts_whole`: the rank holds whole routed experts (expert parallelism), so the family's expert widths
    (EXPERT_WIDTHS) are not / tp."""
    found = prefill_moments(config, class_name, seq)
    if not isinstance(found, tuple):
        return found
    family, dims, tables = found
    if dtype_size not in tables:
        return f"{family} computing in {dtype_size}-byte floats (fitted: 16-bit and fp32)"
    dims = dict(dims, B=batch, S=seq)
    whole = EXPERT_WIDTHS.get(family, ()) if experts_whole else ()
    for key in SPLIT_BY_TP:
        if tp > 1 and dims.get(key) and key not in whole:
            dims[key] = -(-dims[key] // tp)
    kept = [key for key in whole if dims.get(key)]
    split = (f" (widths and heads / tp {tp}" + (f"; the experts' {', '.join(kept)} whole: expert parallel" if kept
                                                else "") + ")") if tp > 1 else ""
    best: tuple[int, str] | None = None
    for moment in tables[dtype_size]:
        if not last and "logits" in moment.where:
            continue
        value = evaluate(moment.formula, dims) - (0 if moment.cached else cache_bytes)
        text = (f"{family}, {moment.where}{split}: {moment.formula} = {evaluate(moment.formula, dims):,} B"
                + ("" if moment.cached else f", before the cache's {cache_bytes:,} B"))
        if best is None or value > best[0]:
            best = (value, text)
    return best


def prefill_workspace(config: Any, *, batch: int, seq: int, dtype_size: int, vocab: int | None, gated: bool = True,
                      layers: int = 2, every_token_logits: bool = False, class_name: str = "",
                      cache_bytes: int = 0, window_extra: int = 0, tp: int = 1, last: bool = True,
                      experts_whole: bool = False) -> Workspace:
    """The prefill's working memory on top of weights, buffers and the KV cache, at its peak: the last layer.

    Live then, per token: the embedding output (the model keeps `inputs_embeds`) and the layer's input (h each,
    one when there is a single layer), the post-attention residual and the normed MLP input (h each), and the
    MLP's intermediates: gate, up and their product (3 × intermediate) for a gated MLP, the projection and its
    activation (2 × intermediate) otherwise. Besides: RoPE's cos and sin (seq × head_dim each) and the position
    ids (seq × 8 B). Logits are for the last token only, as generate() asks (`logits_to_keep=1`); a model that
    does not generate (a masked-LM encoder) scores every token, and its head holds the logits with the encoder's
    output and the head's transform (hidden each): batch × seq × (vocab + 2 × hidden).

    Exact for Llama-style decoders (RMSNorm, gated MLP, RoPE) at sdpa, checked against a fake-tensor trace. The
    families this module has fitted (GPT-2, T5, the bare BART and DeBERTa-v2) take their own largest moment instead
    (`class_name`; `cache_bytes`, the full KV cache, for the moments before it is held); other layouts differ by
    their own temporaries (MoE routing, eager attention's scores), which the traced engine measures.

    `tp`: one tensor-parallel rank's (serving across GPUs): the same moments with the MLP's and attention's widths
    and heads / tp and the hidden size whole, the logits gathered (the whole vocabulary); `last`: the pipeline stage
    that computes them (the others hold none); `experts_whole`: the rank holds whole routed experts (expert
    parallelism) whose width is the formula's MLP width (or the family's expert widths), kept whole.
    """
    from ..dims import config_int, text_config

    text = text_config(config)
    family = family_workspace(text, class_name, batch=batch, seq=seq, dtype_size=dtype_size,
                              cache_bytes=cache_bytes, tp=tp, last=last,
                              experts_whole=experts_whole) if class_name else None
    beyond = (f" + the sliding layers' prompt K and V beyond their windows, kept until the first decode step "
              f"{window_extra:,} B" if window_extra else "")
    logits = batch * (vocab or 0) * dtype_size * (seq if every_token_logits else 1) if last else 0
    if isinstance(family, tuple):
        layer_peak, text_line = family
        return Workspace(max(layer_peak, logits) + window_extra, text_line + beyond, logits)
    hidden = dim(text, "hidden") or 0
    split = 1 if experts_whole else tp
    inner = -(-(dim(text, "intermediate") or 4 * hidden) // split)
    held = 2 if layers > 1 else 1
    mlp = 3 if gated else 2
    per_token = ((held + 2) * hidden + mlp * inner) * dtype_size
    heads = dim(text, "heads") or 1
    head_dim = config_int(text, "head_dim") or (hidden // heads if heads else 0)
    rotary = getattr(text, "rope_parameters", None) is not None or getattr(text, "rope_theta", None) is not None
    rope = 2 * seq * head_dim * dtype_size if rotary else 0
    positions = seq * 8
    # a sequence that fills the sliding window (the cache holds more than the window): sdpa takes a boolean S × S
    # mask, shared by the batch
    mask = seq * seq if window_extra else 0
    layer_peak = batch * seq * per_token + rope + positions + mask
    width = (f"intermediate {dim(text, 'intermediate') or 4 * hidden:,} / tp {tp}" if split > 1 else
             f"intermediate {inner:,}" + (" (the routed experts', whole: expert parallel)" if tp > 1 else ""))
    text_line = (f"{batch} × {seq:,} tokens × ({held + 2} × hidden {hidden:,} + {mlp} × {width}) × "
                 f"{dtype_size} B" + (f" + RoPE cos/sin 2 × {seq:,} × {head_dim} × {dtype_size} B" if rope else "")
                 + f" + position ids {seq:,} × 8 B" + (f" + the sliding window's mask {seq:,}² × 1 B" if mask else ""))
    if every_token_logits and vocab and last:
        head_peak = batch * seq * (vocab + 2 * hidden) * dtype_size
        if head_peak > layer_peak:
            gathered = " (gathered)" if tp > 1 else ""
            return Workspace(head_peak, f"the head: {batch} × {seq:,} tokens × (vocab {vocab:,} + 2 × hidden "
                                        f"{hidden:,}) × {dtype_size} B, every token's logits{gathered}", logits)
        return Workspace(layer_peak, text_line, logits)
    return Workspace(max(layer_peak, logits) + window_extra, text_line + beyond, logits)
