"""Canonical roles: one per parameter, from its canonical name.

The rules are data: an ordered list of (pattern, role); the first match wins. Order matters where names
nest (BERT's `attention.output.dense` is attention, a layer's bare `output.dense` is the MLP).
A parameter no rule matches gets the role `other`, and reports list it by name.
"""

from __future__ import annotations

import re

OTHER = "other"

# (role, description) in display order; docs/roles.md documents the same list.
ROLES: tuple[tuple[str, str], ...] = (
    ("embeddings.word", "token (word) embedding matrix, V×D"),
    ("embeddings.position", "learned absolute position embeddings, L×D"),
    ("embeddings.token_type", "segment (token type) embeddings, T×D"),
    ("embeddings.norm", "normalisation applied to the summed embeddings"),
    ("attention.query", "query projection"),
    ("attention.key", "key projection"),
    ("attention.value", "value projection"),
    ("attention.qkv", "fused query/key/value projection"),
    ("attention.output", "attention output projection"),
    ("attention.norm", "normalisation around the attention block"),
    ("mlp.gate", "gate projection of a gated MLP (SwiGLU/GeGLU)"),
    ("mlp.up", "MLP up projection (BERT 'intermediate')"),
    ("mlp.gate_up", "fused gate and up projections"),
    ("mlp.down", "MLP down projection (BERT 'output.dense')"),
    ("mlp.norm", "normalisation around the MLP block"),
    ("norm.final", "final normalisation after the last layer"),
    ("pooler", "pooler: dense layer over the first token"),
    ("head.transform", "dense transform inside a head (MLM transform, pre-classifier)"),
    ("head.transform_norm", "normalisation inside a head's transform"),
    ("head.decoder", "untied MLM decoder weight (vocabulary projection)"),
    ("head.bias", "MLM output (vocabulary) bias"),
    ("head.lm", "language-modelling head (vocabulary projection)"),
    ("head.nsp", "next-sentence-prediction head"),
    ("head.classifier", "task classifier (sequence or token classification, multiple choice)"),
    ("head.qa", "question-answering span head"),
    (OTHER, "parameters no rule recognised; listed by name"),
)
ROLE_ORDER = {role: i for i, (role, _) in enumerate(ROLES)}

_RULES: tuple[tuple[str, str], ...] = (
    # embeddings
    (r"(^|\.)(word_embeddings|embed_tokens|wte|embed_in)\.weight$", "embeddings.word"),
    (r"(^|\.)(position_embeddings|wpe|embed_positions)\.weight$", "embeddings.position"),
    (r"(^|\.)token_type_embeddings\.weight$", "embeddings.token_type"),
    (r"(^|\.)embeddings\.(LayerNorm|layer_norm|norm)\.", "embeddings.norm"),
    # attention: BERT family, DistilBERT, Llama-style, GPT-2
    (r"\.attention\.self\.query\.|\.attention\.q_lin\.|\.self_attn\.q_proj\.", "attention.query"),
    (r"\.attention\.self\.key\.|\.attention\.k_lin\.|\.self_attn\.k_proj\.", "attention.key"),
    (r"\.attention\.self\.value\.|\.attention\.v_lin\.|\.self_attn\.v_proj\.", "attention.value"),
    (r"\.attn\.c_attn\.|\.self_attn\.qkv_proj\.|\.attention\.query_key_value\.", "attention.qkv"),
    (
        r"\.attention\.output\.dense\.|\.attention\.out_lin\.|\.self_attn\.o_proj\.|\.attn\.c_proj\."
        r"|\.attention\.dense\.",
        "attention.output",
    ),
    (
        r"\.attention\.output\.LayerNorm\.|\.sa_layer_norm\.|\.input_layernorm\.|\.ln_1\.",
        "attention.norm",
    ),
    # MLP
    (r"\.mlp\.gate_proj\.", "mlp.gate"),
    (r"\.mlp\.gate_up_proj\.", "mlp.gate_up"),
    (r"\.intermediate\.dense\.|\.ffn\.lin1\.|\.mlp\.up_proj\.|\.mlp\.c_fc\.|\.mlp\.dense_h_to_4h\.", "mlp.up"),
    (
        r"\.layer\.\d+\.output\.dense\.|\.ffn\.lin2\.|\.mlp\.down_proj\.|\.mlp\.c_proj\.|\.mlp\.dense_4h_to_h\.",
        "mlp.down",
    ),
    (
        r"\.layer\.\d+\.output\.LayerNorm\.|\.output_layer_norm\.|\.post_attention_layernorm\.|\.ln_2\.",
        "mlp.norm",
    ),
    (r"(^|\.)(ln_f|final_layer_norm)\.|^model\.norm\.|^norm\.", "norm.final"),
    # pooler and heads
    (r"(^|\.)pooler\.", "pooler"),
    (r"(^|\.)cls\.predictions\.transform\.dense\.|(^|\.)lm_head\.dense\.|(^|\.)vocab_transform\.", "head.transform"),
    (r"(^|\.)pre_classifier\.", "head.transform"),
    (
        r"(^|\.)cls\.predictions\.transform\.LayerNorm\.|(^|\.)lm_head\.layer_norm\.|(^|\.)vocab_layer_norm\.",
        "head.transform_norm",
    ),
    (r"(^|\.)cls\.predictions\.decoder\.weight$|(^|\.)lm_head\.decoder\.weight$", "head.decoder"),
    (r"(^|\.)vocab_projector\.weight$", "head.decoder"),
    (
        r"(^|\.)cls\.predictions\.(decoder\.)?bias$|(^|\.)lm_head\.(decoder\.)?bias$|(^|\.)vocab_projector\.bias$",
        "head.bias",
    ),
    (r"(^|\.)cls\.seq_relationship\.", "head.nsp"),
    (r"^(lm_head|embed_out)\.", "head.lm"),
    (r"(^|\.)classifier\.", "head.classifier"),
    (r"(^|\.)qa_outputs\.", "head.qa"),
)
_COMPILED = tuple((re.compile(pattern), role) for pattern, role in _RULES)


def role_of(name: str) -> str:
    """The canonical role of the parameter called `name`, or `other`."""
    for pattern, role in _COMPILED:
        if pattern.search(name):
            return role
    return OTHER


def role_sort_key(role: str) -> tuple[int, str]:
    return (ROLE_ORDER.get(role, len(ROLE_ORDER) - 1), role)


def role_group(role: str) -> str:
    """`attention.query` → `attention`; used for subtotals."""
    return role.split(".", 1)[0]
