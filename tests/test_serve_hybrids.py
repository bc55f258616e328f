"""`paramscope serve` on the hybrids whose recurrent layers reuse a mixer flops/recurrent_decode.py already has:
Granite-4.0-H (Mamba-2 mixers, routed and shared experts), Qwen3.5 and Qwen3.5-MoE (gated DeltaNet, a vision
composite decoded through its text model), LFM2-MoE (LFM2's short convolutions, dense then routed MLPs). Each decode
step's FLOPs are held against FlopCounterMode on the real class's cached one-token decode, each cache against the
tensors transformers' real cache holds after a bf16 prefill on CPU (the states' dtypes as transformers keeps them)."""

from __future__ import annotations

import pytest

# Granite-4.0-H cut to a Mamba-2 layer and an attention layer, both with top-2-of-4 experts and a shared MLP; the
# mixer: H 8 heads of P 16, state N 4, G 2 groups, conv over 8·16 + 2·2·4 = 144 channels, kernel K 3, chunks of Q 8
_GRANITE = dict(model_type="granitemoehybrid", architectures=["GraniteMoeHybridForCausalLM"], vocab_size=100,
                hidden_size=64, intermediate_size=32, shared_intermediate_size=48, num_local_experts=4,
                num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=4, mamba_d_conv=3,
                mamba_expand=2, mamba_chunk_size=8, layer_types=["mamba", "attention"],
                position_embedding_type="nope", tie_word_embeddings=True)
# Qwen3.5's text model: gated DeltaNet with Hk 2 key heads of dk 8, Hv 4 value heads of dv 16 (conv over
# 2·2·8 + 4·16 = 96 channels, K 3), then gated attention; a one-block vision tower beside it
_TEXT = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
             linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=3,
             layer_types=["linear_attention", "full_attention"])
_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
               spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16)
_QWEN3_5 = dict(model_type="qwen3_5", architectures=["Qwen3_5ForConditionalGeneration"],
                text_config=dict(model_type="qwen3_5_text", **_TEXT), vision_config=_VISION)
_QWEN3_5_MOE = dict(model_type="qwen3_5_moe", architectures=["Qwen3_5MoeForConditionalGeneration"],
                    text_config=dict(model_type="qwen3_5_moe_text", **_TEXT, num_experts=4, num_experts_per_tok=2,
                                     moe_intermediate_size=32, shared_expert_intermediate_size=32),
                    vision_config=_VISION)
# LFM2-MoE: short convs over the hidden 64 channels (kernel 3, conv_L_cache's default) around an attention layer; the
# first layer's MLP dense, the others top-2 of 4 experts. layer_types given: Lfm2MoeConfig has no default for it
_LFM2_MOE = dict(model_type="lfm2_moe", architectures=["Lfm2MoeForCausalLM"], vocab_size=100, hidden_size=64,
                 intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                 num_dense_layers=1, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 layer_types=["conv", "full_attention", "conv"])

# an attention layer (4 heads, d 16): 2·B·4·(16 + 16) = 256·B FLOPs a key
_PER_KEY = 2 * 4 * (16 + 16)
CASES = [  # test_serve_recurrent.py's decode-FLOP test runs these with its own
    # (config, batch, prompt, (prefill, step 1, step 2) as FlopCounterMode counts them, a step's recurrent FLOPs / B)
    # Granite: one Mamba-2 mixer, 2·B·(conv 144·K 3·2 outputs + scan H·P·N 8·16·4); a prompt of 9, 2 chunks of 8
    (_GRANITE, 2, 9, (3_201_088, 363_904, 364_416), 2 * (144 * 3 * 2 + 8 * 16 * 4)),
    # Qwen3.5 over two chunks of 64: the delta rule's step is elementwise in transformers' torch path, so only the
    # conv counts, 2·B·96·3·2
    (_QWEN3_5, 1, 70, (13_332_480, 168_320, 168_576), 2 * 96 * 3 * 2),
    (_QWEN3_5_MOE, 1, 70, (13_422_080, 169_600, 169_856), 2 * 96 * 3 * 2),
    # LFM2-MoE: two short convs, 2 × 2·B·64·3·2; a prompt shorter than the kernel (padded to K before the conv)
    (_LFM2_MOE, 2, 2, (743_936, 384_512, 385_024), 2 * (2 * 64 * 3 * 2)),
]
IDS = ["granite-4.0-h", "qwen3.5", "qwen3.5-moe", "lfm2-moe"]


def _build(config: dict, meta: bool = True):
    """The checkpoint's own class (a composite for Qwen3.5), on meta or with real CPU tensors."""
    import torch
    import transformers

    made = transformers.AutoConfig.for_model(**config)
    model_class = getattr(transformers, config["architectures"][0])
    if not meta:
        return model_class(made)
    with torch.device("meta"):
        return model_class(made)


@pytest.mark.parametrize("config, state, per_token", [
    # conv 144 × K 3 in bf16, the SSM's H·P·N in float32; attention's K and V, 2 kv heads × 16, bf16
    (_GRANITE, 144 * 3 * 2 + 8 * 16 * 4 * 4, 2 * 2 * 16 * 2),
    # conv 96 × K 3 in bf16, Hv 4 states of dk 8 × dv 16 in float32
    (_QWEN3_5, 96 * 3 * 2 + 4 * 8 * 16 * 4, 2 * 2 * 16 * 2),
    (_LFM2_MOE, 2 * 64 * 3 * 2, 2 * 2 * 16 * 2),  # two short convs of 64 channels × K 3, bf16
], ids=["granite-4.0-h", "qwen3.5", "lfm2-moe"])
def test_cache_formula_equals_the_real_bf16_cache(config, state, per_token):
    """memory/kv.py's cache (what serve reads and writes a step) against the tensors transformers' real cache holds
    after a bf16 prefill of 6 tokens for 2 sequences on CPU."""
    import torch

    from paramscope.cost.memory.kv import kv_cache

    torch.manual_seed(0)
    model = _build(config, meta=False).to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.zeros((2, 6), dtype=torch.long), use_cache=True).past_key_values
    held = attention = 0
    for layer in cache.layers:
        for states in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)):
            for tensor in (states.values() if isinstance(states, dict) else [states]):
                if isinstance(tensor, torch.Tensor):
                    held += tensor.numel() * tensor.element_size()
        attention += sum(t.numel() * t.element_size() for t in (getattr(layer, "keys", None),
                                                                  getattr(layer, "values", None))
                         if isinstance(t, torch.Tensor))
    assert (held, attention) == (2 * state, 2 * 6 * per_token)
    assert kv_cache(model.config, batch=2, seq=6, dtype="bfloat16").bytes == 2 * (state + 6 * per_token)


def test_estimate_serving_decodes_qwen3_5_through_its_text_model():
    """paramscope.estimate_serving on the Qwen3.5 composite at 16 keys, batch 2, fp32 (the tiny config names no
    dtype): the text model's weights (the vision tower is not run on text, so not read), its DeltaNet state read and
    written whole, its attention layer's 16 keys read and the new token's K and V written; the FLOPs FlopCounterMode
    counted above at 71 keys less 55 keys' 256 each."""
    import paramscope

    built = paramscope.estimate_serving(_QWEN3_5, paramscope.ServeOptions(gpu="h100", batch=2, seq=16, context=16))
    model = _build(_QWEN3_5)
    text = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("model.visual."))
    tower = sum(p.numel() for p in model.model.visual.parameters())
    state, per_token = 96 * 3 * 4 + 4 * 8 * 16 * 4, 2 * 2 * 16 * 4
    one = 168_320 - (71 - 16) * _PER_KEY  # a sequence's step at 16 keys
    step = built.at_batch
    # fp32 weights, read whole but for the untied embedding's 100 rows, of which the batch's 2 tokens read 2
    assert step.weight_bytes == 4 * (text - 100 * 64 + 2 * 64)
    assert (step.kv_bytes, step.flops) == (2 * (2 * state + per_token * 17), 2 * one)
    assert [s.flops for s in built.decode] == [b * one for b in (1, 2, 8, 32, 128)]
    assert built.report.model.class_name == "Qwen3_5ForConditionalGeneration"
    assert any(f"{3 * 2 * 2 * 4 * 8 * 16:,} FLOPs a step at batch 2" in note for note in built.notes)  # 3·2·B·Hv·dk·dv
    assert any(f"none of their {4 * tower:,} B of weights" in note for note in built.notes)


def test_an_lfm2_moe_config_without_layer_types_is_refused_naming_the_field(capsys, tmp_path):
    """Lfm2MoeConfig, unlike Lfm2Config, gives `layer_types` no default and its layers index it: transformers itself
    cannot build such a config (published ones list a kind a layer), so serve says which field, in one line."""
    import json

    from paramscope.cli import main

    config = {key: value for key, value in _LFM2_MOE.items() if key != "layer_types"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), "utf-8")
    assert main(["serve", str(path), "--gpu", "h100", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "could not build Lfm2MoeForCausalLM" in err and "config field 'layer_types' is unset" in err


def test_a_granite_without_routed_experts_passes_the_config_checks():
    """Granite-4.0-H-350M, -1B and -Micro publish num_local_experts 0 and num_experts_per_tok 0 (a dense shared MLP
    in every layer): no expert picked of none is a model; a top-k above no experts is still refused."""
    from paramscope.build import validate_config_dict
    from paramscope.errors import ConfigError

    dense = dict(_GRANITE, num_local_experts=0, num_experts_per_tok=0)
    validate_config_dict(dense)
    with pytest.raises(ConfigError, match="'num_experts_per_tok' must be a whole number of experts from 1 to the 0"):
        validate_config_dict(dict(dense, num_experts_per_tok=1))
