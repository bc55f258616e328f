"""Every family of issue 5, built from its embedded preset: no parameter unclassified, exact totals, key roles.

Key role figures are checked by hand arithmetic in the comments (L layers, D hidden width, V vocabulary).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import paramscope
from paramscope.render.text import TextOptions, render_text
from paramscope.roles import ROLES, role_of

from conftest import report_of

KNOWN_ROLES = {role for role, _ in ROLES}

# (preset, class or None for the checkpoint's own, total, {role: figure})
FAMILIES = {
    # encoder-only
    "bert": ("bert-base-uncased", "BertModel", 109_482_240, {
        "attention.query": 12 * (768 * 768 + 768),  # 7,087,104
        "mlp.up": 12 * (768 * 3072 + 3072),  # 28,348,416
        "pooler": 768 * 768 + 768,
    }),
    "roberta": ("roberta-base", None, 124_697_433, {
        "embeddings.word": 50265 * 768,  # 38,603,520
        "embeddings.position": 514 * 768,  # 394,752: 512 + padding offset 2
        "head.bias": 50265,  # lm_head.bias; the decoder weight is tied to the word embeddings
    }),
    "distilbert": ("distilbert-base-uncased", None, 66_985_530, {
        "attention.query": 6 * (768 * 768 + 768),  # q_lin, 3,543,552
        "mlp.down": 6 * (3072 * 768 + 768),  # ffn.lin2, 14,160,384
        "head.transform": 768 * 768 + 768,  # vocab_transform
    }),
    "albert": ("albert-base-v2", None, 11_221_680, {
        "embeddings.word": 30000 * 128,  # factorised: E = 128
        "embeddings.projection": 128 * 768 + 768,  # embedding_hidden_mapping_in, 99,072
        "attention.query": 768 * 768 + 768,  # ONE shared layer, not × 12
        "mlp.up": 768 * 3072 + 3072,
    }),
    "electra": ("electra-base-discriminator", None, 109_483_009, {
        "head.transform": 768 * 768 + 768,  # discriminator_predictions.dense
        "head.classifier": 768 + 1,  # discriminator_predictions.dense_prediction: one logit per token
    }),
    "deberta-v2": ("deberta-v3-base", None, 183_831_552, {
        "embeddings.word": 128100 * 768,  # 98,380,800
        "attention.relative_position": 2 * 256 * 768,  # rel_embeddings: 2 × position_buckets × D = 393,216
        "attention.norm": 1536 + 12 * 1536,  # encoder.LayerNorm (for rel_embeddings) + 12 attention LayerNorms
        "attention.query": 12 * (768 * 768 + 768),  # query_proj
    }),
    "modernbert": ("modernbert-base", None, 149_655_232, {
        "attention.qkv": 22 * 768 * 2304,  # Wqkv, no bias: 38,928,384
        "mlp.gate_up": 22 * 768 * 2 * 1152,  # Wi: GeGLU input and gate fused
        "attention.norm": 21 * 768,  # layer 0's attn_norm is an Identity
        "norm.final": 768,
    }),
    # decoder-only
    "gpt2": ("gpt2", None, 124_439_808, {
        "attention.qkv": 12 * (768 * 2304 + 2304),  # c_attn Conv1D: 21,261,312
        "attention.output": 12 * (768 * 768 + 768),
        "embeddings.position": 1024 * 768,
    }),
    "gpt-neox": ("pythia-160m", None, 162_322_944, {
        "attention.qkv": 12 * (768 * 2304 + 2304),  # query_key_value
        "head.lm": 50304 * 768,  # embed_out, untied
    }),
    "llama": ("llama-3.1-8b", None, 8_030_261_248, {
        "attention.key": 32 * 4096 * 1024,  # GQA: 8 KV heads × 128
        "mlp.gate": 32 * 4096 * 14336,  # 1,879,048,192
        "head.lm": 128256 * 4096,  # 525,336,576
    }),
    "mistral": ("mistral-7b", None, 7_241_732_096, {
        "attention.value": 32 * 4096 * 1024,
        "mlp.down": 32 * 14336 * 4096,
    }),
    "qwen2": ("qwen2.5-7b", None, 7_615_616_512, {
        "attention.query": 28 * (3584 * 3584 + 3584),  # q_proj has a bias
        "attention.key": 28 * (3584 * 512 + 512),  # 4 KV heads × 128
        "attention.output": 28 * 3584 * 3584,  # o_proj has none
    }),
    "gemma": ("gemma-7b", None, 8_537_680_896, {
        "embeddings.word": 256000 * 3072,  # tied head: counted once
        "attention.query": 28 * 3072 * 4096,  # 16 heads × 256 > D
        "mlp.gate": 28 * 3072 * 24576,
    }),
    "gemma2": ("gemma-2-9b", None, 9_241_705_984, {
        "attention.norm": 42 * 2 * 3584,  # input_layernorm + post_attention_layernorm (sandwich)
        "mlp.norm": 42 * 2 * 3584,  # pre_ + post_feedforward_layernorm
    }),
    "phi3": ("phi-3-mini", None, 3_821_079_552, {
        "attention.qkv": 32 * 3072 * 9216,  # qkv_proj: 905,969,664
        "mlp.gate_up": 32 * 3072 * 16384,  # gate_up_proj: 1,610,612,736
        "mlp.down": 32 * 8192 * 3072,
    }),
    # encoder-decoder
    "t5": ("t5-small", None, 60_506_624, {
        "embeddings.word": 32128 * 512,  # shared, tied to both stacks and the LM head
        "attention.relative_bias": 2 * 32 * 8,  # first block of encoder and decoder: buckets × heads
        "cross_attention.query": 6 * 512 * 512,
        "cross_attention.norm": 6 * 512,
        "mlp.norm": 12 * 512,
        "norm.final": 2 * 512,
    }),
    "bart": ("bart-base", None, 139_420_416, {
        "embeddings.position": 2 * 1026 * 768,  # 1024 + offset 2, encoder and decoder
        "embeddings.norm": 2 * 1536,  # layernorm_embedding
        "cross_attention.query": 6 * (768 * 768 + 768),
        "mlp.norm": 12 * 1536,  # per-layer final_layer_norm
    }),
    # mixture of experts
    "mixtral": ("mixtral-8x7b", None, 46_702_792_704, {
        "moe.router": 32 * 8 * 4096,
        "moe.experts": 32 * 8 * 3 * 4096 * 14336,  # 45,097,156,608
    }),
    "deepseek-v3": ("deepseek-v3", None, 671_026_404_352, {
        "attention.q_down": 61 * 1536 * 7168,  # q_a_proj
        "attention.q_up": 61 * 128 * (128 + 64) * 1536,  # q_b_proj
        "attention.kv_down": 61 * (512 + 64) * 7168,  # kv_a_proj_with_mqa
        "attention.kv_up": 61 * 128 * (128 + 128) * 512,  # kv_b_proj
        "attention.latent_norm": 61 * (1536 + 512),
        "mlp.gate": 3 * 7168 * 18432,  # first_k_dense_replace = 3 dense layers
        "moe.router": 58 * 256 * 7168,
        "moe.shared_experts": 58 * 3 * 7168 * 2048,
        "moe.experts": 58 * 256 * 3 * 7168 * 2048,
    }),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_is_fully_classified_with_exact_figures(family):
    preset, model_class, total, roles = FAMILIES[family]
    report = report_of(preset, model_class)
    assert report.unclassified == (), report.unclassified
    assert report.parameters.total == total
    assert sum(report.breakdown.values()) == total
    assert set(report.breakdown) <= KNOWN_ROLES
    for role, figure in roles.items():
        assert report.breakdown[role] == figure, role


QWEN2_MOE_SMALL = {
    "model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2,
    "mlp_only_layers": [0], "architectures": ["Qwen2MoeForCausalLM"],
}


def test_qwen2_moe_small_config_dense_and_sparse_layers():
    report = paramscope.inspect(QWEN2_MOE_SMALL)
    assert report.unclassified == ()
    b = report.breakdown
    assert b["mlp.gate"] == 64 * 128  # layer 0 is dense (mlp_only_layers)
    assert b["moe.router"] == 8 * 64
    assert b["moe.experts"] == 8 * 3 * 64 * 32
    assert b["moe.shared_experts"] == 3 * 64 * 96 + 64  # shared expert and its sigmoid gate (D → 1)


@pytest.mark.parametrize("model_class", [
    "BertForPreTraining", "BertForQuestionAnswering", "BertForTokenClassification", "BertForMultipleChoice",
])
def test_bert_task_classes_fully_classified(model_class):
    assert report_of("bert-base-uncased", model_class).unclassified == ()


@pytest.mark.parametrize("preset, model_class", [
    ("llama-3.1-8b", "LlamaForSequenceClassification"),  # score
    ("roberta-base", "RobertaForSequenceClassification"),
    ("bart-base", "BartForConditionalGeneration"),
    ("albert-base-v2", "AlbertForPreTraining"),  # sop_classifier
    ("electra-base-discriminator", "ElectraForMaskedLM"),  # generator head
    ("deberta-v3-base", "DebertaV2ForMaskedLM"),
    ("gpt2", "GPT2DoubleHeadsModel"),
    ("qwen2.5-0.5b", "Qwen2ForTokenClassification"),
    ("t5-small", "T5EncoderModel"),
])
def test_task_heads_fully_classified(preset, model_class):
    report = report_of(preset, model_class)
    assert report.unclassified == ()
    assert sum(report.breakdown.values()) == report.total


def test_t5_v1_1_gated_feed_forward():
    config = {"model_type": "t5", "d_model": 64, "d_ff": 128, "d_kv": 16, "num_heads": 4, "num_layers": 2,
              "vocab_size": 100, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
    report = paramscope.inspect(config, model_class="T5ForConditionalGeneration")
    assert report.unclassified == ()
    assert report.breakdown["mlp.gate"] == 4 * 64 * 128  # wi_0 in 2 encoder + 2 decoder blocks
    assert report.breakdown["mlp.up"] == 4 * 64 * 128  # wi_1
    # transformers 5 always ties T5's head (tie_word_embeddings=False only turns off output scaling)
    assert "head.lm" not in report.breakdown


def test_gpt_j_lm_head_bias_belongs_to_the_head():
    report = report_of("gpt-j-6b")
    assert report.unclassified == ()
    assert report.breakdown["head.lm"] == 50400 * 4096 + 50400  # Linear with bias, untied
    assert "head.bias" not in report.breakdown


def test_gemma2_sandwich_norms_versus_llama_post_attention_norm():
    gemma2 = {p.name: p.role for p in report_of("gemma-2-2b").params}
    llama = {p.name: p.role for p in report_of("llama-3.1-8b").params}
    assert gemma2["model.layers.0.post_attention_layernorm.weight"] == "attention.norm"
    assert gemma2["model.layers.0.pre_feedforward_layernorm.weight"] == "mlp.norm"
    assert llama["model.layers.0.post_attention_layernorm.weight"] == "mlp.norm"


# ---------------------------------------------------------------- shared layers

def test_albert_shared_layers_in_components_tree_and_breakdown_note():
    report = report_of("albert-base-v2")
    [shared] = report.shared_layers
    assert shared.path == "albert.encoder.albert_layer_groups"
    assert (shared.layers, shared.sets, shared.params) == (12, 1, 7_087_872)
    assert shared.text == "12 layers sharing one set of 7,087,872"
    assert report.num_layers == 12
    encoder = next(c for c in report.components if c.name == "albert.encoder")
    assert encoder.shared == "12 layers sharing one set of 7,087,872"
    text = render_text(report, TextOptions(width=140, depth=4))
    assert "albert_layer_groups (ModuleList) 7,087,872 — 12 layers sharing one set of 7,087,872" in text
    assert "Shared layers" in text and "The breakdown counts the shared set once." in text


def test_albert_two_groups():
    config = {"model_type": "albert", "embedding_size": 32, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_hidden_layers": 6, "num_hidden_groups": 2, "vocab_size": 100}
    report = paramscope.inspect(config, model_class="AlbertModel")
    [shared] = report.shared_layers
    assert shared.sets == 2 and shared.layers == 6
    each = shared.params_per_set[0]
    assert shared.text == f"6 layers sharing 2 sets of {each:,} each (3 layers per set)"
    assert report.unclassified == ()


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(d, 4 * d))
        self.mlp.add_module("c_proj", nn.Linear(4 * d, d))


class _UniversalTransformer(nn.Module):
    """One block run 6 times, registered at every index (Universal-Transformer style)."""

    def __init__(self, d: int = 16, depth: int = 6) -> None:
        super().__init__()
        self.wte = nn.Embedding(50, d)
        block = _Block(d)
        self.h = nn.ModuleList([block] * depth)
        self.ln_f = nn.LayerNorm(d)


def test_module_list_of_one_block_is_reported_as_shared_layers():
    model = _UniversalTransformer()
    report = paramscope.inspect(model)
    block = sum(p.numel() for p in model.h[0].parameters())
    assert report.total == 50 * 16 + block + 2 * 16
    [shared] = report.shared_layers
    assert (shared.path, shared.layers, shared.sets, shared.params) == ("h", 6, 1, block)
    assert report.unclassified == ()  # MultiheadAttention's in_proj is attention.qkv
    text = render_text(report, TextOptions(width=120))
    assert f"h (ModuleList) {block:,} — 6 layers sharing one set of {block:,}" in text
    assert "0 (also 1–5)" in text


# ---------------------------------------------------------------- the generic classifier

class _Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.token_embedder = nn.Embedding(10, 4)  # an Embedding the name rules do not know
        self.pos_table = nn.Embedding(8, 4)
        self.blocks = nn.ModuleList([nn.Module() for _ in range(2)])
        for block in self.blocks:
            block.attention_block = nn.Module()
            block.attention_block.query_map = nn.Linear(4, 4)
            block.attention_block.value_map = nn.Linear(4, 4)
            block.pre_attn_rms = nn.RMSNorm(4)
            block.feedforward = nn.Module()
            block.feedforward.up_map = nn.Linear(4, 8)
            block.feedforward.down_map = nn.Linear(8, 4)
            block.mystery = nn.Parameter(torch.zeros(3))
        self.out_norm = nn.LayerNorm(4)
        self.readout = nn.Linear(4, 10)


def test_generic_classifier_lists_exactly_what_it_cannot_classify():
    report = paramscope.inspect(_Odd())
    roles = {p.name: p.role for p in report.params}
    assert roles["token_embedder.weight"] == "embeddings.word"  # by module type
    assert roles["pos_table.weight"] == "embeddings.position"
    assert roles["blocks.0.attention_block.query_map.weight"] == "attention.query"
    assert roles["blocks.0.attention_block.value_map.bias"] == "attention.value"
    assert roles["blocks.0.pre_attn_rms.weight"] == "attention.norm"
    assert roles["blocks.0.feedforward.up_map.weight"] == "mlp.up"
    assert roles["blocks.0.feedforward.down_map.weight"] == "mlp.down"
    assert roles["out_norm.weight"] == "norm.final"
    assert report.unclassified == ("blocks.0.mystery", "blocks.1.mystery", "readout.weight", "readout.bias")
    assert report.breakdown["other"] == 2 * 3 + 4 * 10 + 10
    assert sum(report.breakdown.values()) == report.total


def test_role_of_without_types_keeps_name_rules():
    assert role_of("bert.encoder.layer.0.attention.self.query.weight") == "attention.query"
    assert role_of("model.layers.0.mlp.gate_proj.weight") == "mlp.gate"
    assert role_of("model.layers.0.mlp.experts.gate_up_proj") == "moe.experts"
    assert role_of("something.unknown") == "other"
