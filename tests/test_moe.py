"""Mixture of experts: active parameters per token, the per-layer view, fused and per-expert layouts.

active = total − Σ over MoE layers of (E − k)/E × that layer's routed-expert parameters.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import paramscope
from paramscope.moe import summarize_moe
from paramscope.render.json import render_json
from paramscope.render.text import TextOptions, render_text

from conftest import report_of


def test_mixtral_8x7b_total_and_active():
    report = report_of("mixtral-8x7b")
    assert report.parameters.total == 46_702_792_704
    # one expert: gate, up (4096→14336) and down (14336→4096) = 3 × 4096 × 14336 = 176,160,768
    # per layer: 8 experts = 1,409,286,144; top-2 leaves 6 idle = 1,056,964,608; × 32 layers = 33,822,867,456
    # active = 46,702,792,704 − 33,822,867,456 = 12,879,925,248
    assert report.parameters.active == 12_879_925_248
    assert report.active == 12_879_925_248
    moe = report.moe
    assert (moe.num_experts, moe.top_k, moe.layout) == (8, 2, "fused [E, …] tensors")
    assert len(moe.moe_layers) == 32 and moe.dense_layers == ()
    assert {layer.routed for layer in moe.layers} == {8 * 176_160_768}
    assert {layer.per_expert for layer in moe.layers} == {176_160_768}
    assert moe.inactive == 33_822_867_456


def test_mixtral_8x22b_active_is_the_announced_39b():
    report = report_of("mixtral-8x22b")
    # one expert: 3 × 6144 × 16384 = 301,989,888; idle per layer 6 × that = 1,811,939,328; × 56 = 101,468,602,368
    assert report.parameters.total == 140_620_634_112
    assert report.parameters.active == 140_620_634_112 - 101_468_602_368 == 39_152_031_744


def test_deepseek_v3_active_dense_first_layers_shared_experts():
    report = report_of("deepseek-v3")
    assert report.parameters.total == 671_026_404_352
    # one routed expert: 3 × 7168 × 2048 = 44,040,192 (moe_intermediate_size 2048)
    # a MoE layer's routed experts: 256 × 44,040,192 = 11,274,289,152; top-8 leaves 248 idle:
    #   248 × 44,040,192 = 10,921,967,616 per MoE layer
    # 61 layers − first_k_dense_replace 3 = 58 MoE layers: 58 × 10,921,967,616 = 633,474,121,728
    # active = 671,026,404,352 − 633,474,121,728 = 37,552,282,624 (DeepSeek: "37B activated")
    assert report.parameters.active == 37_552_282_624
    moe = report.moe
    assert (moe.num_experts, moe.top_k, moe.num_shared_experts) == (256, 8, 1)
    assert [(layer.index, layer.kind) for layer in moe.dense_layers] == [(0, "dense"), (1, "dense"), (2, "dense")]
    assert len(moe.moe_layers) == 58
    layer = moe.moe_layers[0]
    assert layer.routed == 11_274_289_152
    assert layer.shared == 3 * 7168 * 2048  # one shared expert, always active
    assert layer.router == 256 * 7168
    assert layer.active == layer.params - 10_921_967_616 == 585_318_400
    runs = [(first.index, n, first.kind) for first, n in moe.runs()]
    assert runs == [(0, 3, "dense"), (3, 58, "moe")]
    assert "n_routed_experts=256" in moe.source and "num_experts_per_tok=8" in moe.source
    # the router's score-correction bias is a buffer in transformers 5: role given, not counted
    bias = [b for b in report.buffers if b.name.endswith("e_score_correction_bias")]
    assert len(bias) == 58 and {b.role for b in bias} == {"moe.router"}


# Qwen/Qwen1.5-MoE-A2.7B's config.json (Qwen2-MoE), as published.
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
    "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.39.0.dev0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False, "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}


def test_qwen2_moe_a2_7b_total_and_active():
    report = paramscope.inspect(QWEN15_MOE_A27B)
    assert report.unclassified == ()
    # per layer (D = 2048, 24 layers):
    #   attention: q, k, v 2048×2048 + 2048 bias each, o 2048×2048 = 16,783,360
    #   routed: 60 experts × 3 × 2048 × 1408 (8,650,752 each) = 519,045,120
    #   shared expert 3 × 2048 × 5632 = 34,603,008, its gate 2048; router 60 × 2048 = 122,880; norms 4,096
    #   = 570,560,512 per layer; × 24 = 13,693,452,288
    # embeddings 151,936 × 2048 = 311,164,928, untied head the same, final norm 2,048
    # total = 13,693,452,288 + 622,329,856 + 2,048 = 14,315,784,192 ("14.3B")
    assert report.parameters.total == 14_315_784_192
    # idle per layer: (60 − 4) × 8,650,752 = 484,442,112; × 24 = 11,626,610,688
    # active = 14,315,784,192 − 11,626,610,688 = 2,689,173,504 ("2.7B activated")
    assert report.parameters.active == 2_689_173_504
    assert report.moe.num_experts == 60 and report.moe.top_k == 4
    assert report.breakdown["moe.shared_experts"] == 24 * (34_603_008 + 2048)


# ------------------------------------------------------------- layouts: fused [E, …] and per-expert modules

D, F, E, K = 8, 16, 4, 1


class _ExpertMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(D, F, bias=False)
        self.w3 = nn.Linear(D, F, bias=False)
        self.w2 = nn.Linear(F, D, bias=False)


class _PerExpertMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList([_ExpertMLP() for _ in range(E)])


class _FusedExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.zeros(E, 2 * F, D))
        self.down_proj = nn.Parameter(torch.zeros(E, D, F))


class _FusedMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = _FusedExperts()


class _Layer(nn.Module):
    def __init__(self, moe: bool, fused: bool) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(D)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(D, D)
        self.self_attn.o_proj = nn.Linear(D, D)
        self.post_attention_layernorm = nn.LayerNorm(D)
        if not moe:
            self.mlp = nn.Module()
            self.mlp.gate_proj = nn.Linear(D, F, bias=False)
            self.mlp.up_proj = nn.Linear(D, F, bias=False)
            self.mlp.down_proj = nn.Linear(F, D, bias=False)
        else:
            self.block_sparse_moe = _FusedMoE() if fused else _PerExpertMoE()


class _TinyMoE(nn.Module):
    def __init__(self, fused: bool, top_k: int | None = K) -> None:
        super().__init__()
        self.config = SimpleNamespace(model_type=None, num_local_experts=E, num_experts_per_tok=top_k)
        self.embed_tokens = nn.Embedding(32, D)
        self.layers = nn.ModuleList([_Layer(moe=i > 0, fused=fused) for i in range(3)])
        self.norm = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, 32, bias=False)


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert modules", "fused [E, …] tensors"])
def test_active_is_the_same_for_fused_and_per_expert_layouts(fused):
    model = _TinyMoE(fused)
    report = paramscope.inspect(model)
    assert report.unclassified == ()
    per_expert = 3 * D * F
    routed_per_layer = E * per_expert
    assert report.breakdown["moe.experts"] == 2 * routed_per_layer
    assert report.breakdown["moe.router"] == 2 * D * E
    # two MoE layers, top-1 of 4: (4 − 1)/4 of each layer's routed experts is idle
    assert report.parameters.active == report.total - 2 * 3 * per_expert
    moe = report.moe
    assert moe.layout == ("fused [E, …] tensors" if fused else "per-expert modules")
    assert [layer.kind for layer in moe.layers] == ["dense", "moe", "moe"]
    assert moe.num_experts == E and moe.top_k == K


def test_fused_and_per_expert_models_have_the_same_total():
    assert paramscope.inspect(_TinyMoE(True)).total == paramscope.inspect(_TinyMoE(False)).total


def test_unknown_top_k_gives_no_active_figure():
    report = paramscope.inspect(_TinyMoE(True, top_k=None))
    assert report.moe is not None and report.moe.top_k is None
    assert report.parameters.active is None
    assert "k unknown" in report.moe.source
    text = render_text(report, TextOptions(width=120))
    assert "active per token" in text and "unknown" in text


def test_expert_count_comes_from_the_tensors_when_the_config_has_none():
    model = _TinyMoE(True)
    model.config = SimpleNamespace(model_type=None, top_k=2)
    summary = summarize_moe(paramscope.inspect(model).params, model.config)
    assert summary.num_experts == E and summary.top_k == 2
    assert "from the expert tensors" in summary.source


def test_dense_model_active_equals_total():
    report = report_of("llama-3.1-8b")
    assert report.moe is None
    assert report.parameters.active == report.parameters.total


def test_json_has_active_and_the_per_layer_view():
    doc = json.loads(render_json(report_of("deepseek-v3")))
    assert doc["parameters"]["active"] == 37_552_282_624
    moe = doc["moe"]
    assert (moe["num_experts"], moe["top_k"], moe["active"], moe["total"]) == (256, 8, 37_552_282_624,
                                                                                671_026_404_352)
    assert moe["inactive"] == 633_474_121_728
    assert len(moe["layers"]) == 61
    assert moe["layers"][0]["kind"] == "dense" and moe["layers"][3]["kind"] == "moe"
    assert moe["layers"][3]["active"] == 585_318_400
    dense = json.loads(render_json(report_of("gpt2")))
    assert dense["moe"] is None and dense["parameters"]["active"] == dense["parameters"]["total"]


def test_text_shows_active_and_the_layer_runs():
    text = render_text(report_of("deepseek-v3"), TextOptions(width=400, tree=False))
    assert "active per token" in text and "37,552,282,624" in text
    assert "0–2     3 dense layers, 583,483,392 each, all active" in text
    assert "3–60    58 MoE layers, 11,507,286,016 each: routed experts 11,274,289,152 (256 × 44,040,192)" in text
    assert "active 585,318,400 each (top-8 of 256)" in text
    assert "671,026,404,352 − 633,474,121,728 = 37,552,282,624" in text


def test_dbrx_two_dimensional_expert_packing_takes_e_from_the_nested_config():
    # DBRX stores experts as 2-D [E·F, D] tensors, so E = 4 and k = 2 come from ffn_config
    config = {"model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 64,
              "vocab_size": 100, "attn_config": {"kv_n_heads": 2, "rope_theta": 10000},
              "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}}
    report = paramscope.inspect(config)
    assert report.unclassified == ()
    routed = 2 * 3 * 4 * 128 * 64  # 2 layers × (w1, v1, w2) × E·F × D = 196,608
    assert report.breakdown["moe.experts"] == routed
    assert report.moe.num_experts == 4 and report.moe.top_k == 2
    assert report.parameters.active == report.total - routed * 2 // 4


def test_qwen15_moe_preset_reports_the_cards_figures():
    """The card: '14.3B parameters in total and 2.7B activated parameters during runtime'."""
    from paramscope.presets import find_preset

    assert find_preset("qwen1.5-moe-a2.7b").load_config() == QWEN15_MOE_A27B
    report = paramscope.inspect("qwen1.5-moe-a2.7b")
    assert (report.parameters.total, report.parameters.active) == (14_315_784_192, 2_689_173_504)


# ------------------------------------------------------------------------------ top-k and E in sub-configs

FORMULA_CONFIGS = __import__("pathlib").Path(__file__).parent / "configs" / "formula"


def test_qwen3_5_35b_a3b_finds_top_k_in_text_config():
    """Qwen3.5-MoE keeps num_experts_per_tok in text_config; the wrapper's top level has none (issue 9, point 3).

    The config is Qwen3_5MoeConfig's defaults (the 35B-A3B sizes) with the public card's 262,144 positions and a
    vision merger projecting to the text width, 2048.
    """
    report = report_of(str(FORMULA_CONFIGS / "qwen3_5_moe-35b-a3b.json"))
    assert report.parameters.total == 35_107_181_936
    # one routed expert: 3 × 2048 × 512 = 3,145,728; × 256 experts × 40 layers = 32,212,254,720
    # top-8 of 256 leaves 248/256 idle: 31,205,621,760; active = total − that = 3,901,560,176
    moe = report.moe
    assert moe.routed == 40 * 256 * 3 * 2048 * 512 == 32_212_254_720
    assert moe.inactive == 32_212_254_720 * 248 // 256 == 31_205_621_760
    assert report.parameters.active == 35_107_181_936 - 31_205_621_760 == 3_901_560_176
    assert (moe.num_experts, moe.top_k) == (256, 8)
    assert moe.source == "E from config text_config.num_experts=256; k from config text_config.num_experts_per_tok=8"


def test_qwen3_vl_moe_dict_config_names_the_aliased_field_it_read():
    config = {"model_type": "qwen3_vl_moe", "architectures": ["Qwen3VLMoeForConditionalGeneration"],
              "text_config": {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 48,
                              "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "head_dim": 8, "num_experts": 6, "num_experts_per_tok": 2,
                              "decoder_sparse_step": 1, "tie_word_embeddings": False},
              "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2,
                                "out_hidden_size": 32, "num_position_embeddings": 16, "patch_size": 4,
                                "deepstack_visual_indexes": []}}
    report = paramscope.inspect(config)
    assert report.parameters.total == 43_384
    # 2 layers × 6 experts × 3 × 32 × 16 = 18,432 routed; top-2 of 6 leaves 4/6 idle = 12,288
    assert report.moe.routed == 18_432
    assert report.parameters.active == 43_384 - 12_288 == 31_096
    # the text config maps num_experts onto num_local_experts (attribute_map): the source names the real field
    assert "text_config.num_local_experts=6" in report.moe.source
    assert "text_config.num_experts_per_tok=2" in report.moe.source


def test_top_k_in_a_nested_sub_config_and_disagreeing_sub_configs():
    from paramscope.moe import config_value

    omni = {"model_type": "x", "thinker_config": {"text_config": {"num_experts_per_tok": 8}},
            "talker_config": {"text_config": {"num_experts_per_tok": 8}}}
    assert config_value(omni, ("num_experts_per_tok",)) == ("thinker_config.text_config.num_experts_per_tok", 8)
    # the top level wins over sub-configs; fields that are no sub-config (rope, quantisation) are never read
    assert config_value({"top_k": 2, "text_config": {"top_k": 4}}, ("top_k",)) == ("top_k", 2)
    assert config_value({"quantization_config": {"top_k": 4}, "rope_scaling": {"top_k": 4}}, ("top_k",)) is None

    model = _TinyMoE(True)
    model.config = SimpleNamespace(model_type=None, thinker_config=SimpleNamespace(top_k=1, model_type="a",
                                                                                   to_dict=dict),
                                   talker_config={"top_k": 2})
    summary = summarize_moe(paramscope.inspect(model).params, model.config)
    assert summary.top_k is None and summary.active is None
    assert "the sub-configs disagree (thinker_config.top_k=1, talker_config.top_k=2)" in summary.source


def test_sub_config_search_is_bounded_and_survives_cycles():
    from paramscope.moe import config_value

    loop: dict = {"model_type": "x"}
    loop["text_config"] = loop  # a config that holds itself
    assert config_value(loop, ("num_experts_per_tok",)) is None
    deep = {"num_experts_per_tok": 3}
    for _ in range(6):
        deep = {"text_config": deep}
    assert config_value(deep, ("num_experts_per_tok",)) is None  # deeper than any real wrapper nests
    shallow = {"text_config": {"text_config": {"text_config": {"num_experts_per_tok": 3}}}}
    assert config_value(shallow, ("num_experts_per_tok",)) == (
        "text_config.text_config.text_config.num_experts_per_tok", 3)
