"""Property tests: a formula derived once per family holds at random valid configs of that family.

Each family's formula is derived at a small anchor config; hypothesis then draws configs with every size field
varied independently (key/value heads apart from heads, feed-forward size apart from the width, …) and compares
the formula's value with a fresh meta-device build. Sizes stay small so that each build takes milliseconds.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramscope.build import build_on_meta, make_config
from paramscope.count import count_module
from paramscope.formula import derive_formula

ANCHORS = {
    "bert": ("BertForMaskedLM", {
        "model_type": "bert", "vocab_size": 97, "hidden_size": 24, "num_attention_heads": 4,
        "intermediate_size": 40, "max_position_embeddings": 33, "type_vocab_size": 3, "num_hidden_layers": 2}),
    "gpt2": ("GPT2LMHeadModel", {
        "model_type": "gpt2", "vocab_size": 101, "n_embd": 24, "n_head": 4, "n_positions": 40, "n_layer": 2}),
    # key/value heads equal to heads at the anchor, as at Llama-2-7B: the draws separate them
    "llama": ("LlamaForCausalLM", {
        "model_type": "llama", "vocab_size": 103, "hidden_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 44, "num_hidden_layers": 2, "tie_word_embeddings": False}),
    "t5": ("T5ForConditionalGeneration", {
        "model_type": "t5", "vocab_size": 99, "d_model": 20, "d_kv": 6, "num_heads": 3, "d_ff": 28,
        "num_layers": 2, "relative_attention_num_buckets": 8}),
    "mixtral": ("MixtralForCausalLM", {
        "model_type": "mixtral", "vocab_size": 97, "hidden_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 24, "num_hidden_layers": 2, "num_local_experts": 3,
        "num_experts_per_tok": 1}),
    # num_experts is an attribute_map alias of num_local_experts: one symbol, either spelling
    "qwen3_moe": ("Qwen3MoeForCausalLM", {
        "model_type": "qwen3_moe", "vocab_size": 101, "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 1, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "tie_word_embeddings": False}),
    # patches per side, image_size // patch_size, is a derived symbol: image sizes need not be multiples (at
    # 224/16 some probes are no multiples, which no polynomial in the two fields fits)
    "vit": ("ViTModel", {
        "model_type": "vit", "hidden_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 40, "image_size": 224, "patch_size": 16, "num_channels": 3}),
}

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@functools.lru_cache(maxsize=None)
def formula(family: str):
    class_name, anchor = ANCHORS[family]
    return derive_formula(anchor, model_class=class_name, use_cache=False)


def meta_count(family: str, config: dict) -> int:
    class_name, _ = ANCHORS[family]
    built, _ = make_config(config)
    return count_module(build_on_meta(class_name, built)).counts.total


def check(family: str, changes: dict, drop: tuple[str, ...] = ()) -> None:
    config = {k: v for k, v in {**ANCHORS[family][1], **changes}.items() if k not in drop}
    assert formula(family).evaluate(config) == meta_count(family, config), changes


sizes = st.integers
heads_and_width = st.tuples(sizes(1, 4), sizes(1, 8)).map(lambda t: (t[0], t[0] * t[1]))


@SETTINGS
@given(hw=heads_and_width, vocab=sizes(2, 200), ffn=sizes(1, 64), positions=sizes(1, 64), types=sizes(1, 4),
       layers=sizes(1, 4))
def test_bert_formula_at_random_configs(hw, vocab, ffn, positions, types, layers):
    heads, width = hw
    check("bert", {"num_attention_heads": heads, "hidden_size": width, "vocab_size": vocab,
                   "intermediate_size": ffn, "max_position_embeddings": positions, "type_vocab_size": types,
                   "num_hidden_layers": layers})


@SETTINGS
@given(hw=heads_and_width, vocab=sizes(1, 200), positions=sizes(1, 64), layers=sizes(1, 4))
def test_gpt2_formula_at_random_configs(hw, vocab, positions, layers):
    heads, width = hw
    check("gpt2", {"n_head": heads, "n_embd": width, "vocab_size": vocab, "n_positions": positions,
                   "n_layer": layers})


gqa = st.tuples(sizes(1, 4), sizes(1, 3), st.sampled_from([2, 4, 6, 8])).map(
    lambda t: {"num_key_value_heads": t[0], "num_attention_heads": t[0] * t[1], "hidden_size": t[0] * t[1] * t[2]})


@SETTINGS
@given(attention=gqa, vocab=sizes(2, 200), ffn=sizes(1, 64), layers=sizes(1, 4))
def test_llama_formula_at_random_grouped_query_configs(attention, vocab, ffn, layers):
    check("llama", {**attention, "vocab_size": vocab, "intermediate_size": ffn, "num_hidden_layers": layers})


@SETTINGS
@given(width=sizes(1, 48), head_width=sizes(1, 12), heads=sizes(1, 4), ffn=sizes(1, 48), vocab=sizes(2, 200),
       layers=sizes(1, 4), buckets=sizes(1, 16))
def test_t5_formula_at_random_configs(width, head_width, heads, ffn, vocab, layers, buckets):
    check("t5", {"d_model": width, "d_kv": head_width, "num_heads": heads, "d_ff": ffn, "vocab_size": vocab,
                 "num_layers": layers, "relative_attention_num_buckets": buckets})


@SETTINGS
@given(attention=gqa, vocab=sizes(2, 200), ffn=sizes(1, 48), layers=sizes(1, 3), experts=sizes(1, 4))
def test_mixtral_formula_at_random_configs(attention, vocab, ffn, layers, experts):
    check("mixtral", {**attention, "vocab_size": vocab, "intermediate_size": ffn, "num_hidden_layers": layers,
                      "num_local_experts": experts, "num_experts_per_tok": 1})


@SETTINGS
@given(attention=gqa, vocab=sizes(2, 200), expert_ffn=sizes(1, 32), layers=sizes(1, 3), experts=sizes(1, 6),
       head_width=sizes(1, 6).map(lambda h: 2 * h), spelled_local=st.booleans())  # RoPE needs an even width
def test_qwen3_moe_formula_at_random_configs_under_either_spelling(attention, vocab, expert_ffn, layers, experts,
                                                                   head_width, spelled_local):
    changes = {**attention, "vocab_size": vocab, "moe_intermediate_size": expert_ffn, "num_hidden_layers": layers,
               "head_dim": head_width, "num_local_experts" if spelled_local else "num_experts": experts}
    check("qwen3_moe", changes, drop=("num_experts",) if spelled_local else ())


@SETTINGS
@given(hw=heads_and_width, ffn=sizes(1, 48), layers=sizes(1, 3), patch=sizes(1, 12), image=sizes(1, 64),
       channels=sizes(1, 4))
def test_vit_formula_at_random_image_and_patch_sizes(hw, ffn, layers, patch, image, channels):
    assert formula("vit").spec.definitions() == {"Q": "image_size // patch_size"}
    heads, width = hw
    check("vit", {"num_attention_heads": heads, "hidden_size": width, "intermediate_size": ffn,
                  "num_hidden_layers": layers, "patch_size": patch, "image_size": max(image, patch),
                  "num_channels": channels})


@pytest.mark.parametrize("family", sorted(ANCHORS))
def test_every_family_formula_is_exact_at_its_anchor(family):
    assert formula(family).value == meta_count(family, ANCHORS[family][1])
