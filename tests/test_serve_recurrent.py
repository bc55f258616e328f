"""`paramscope serve` on the recurrent and hybrid classes beyond Mamba-1 (flops/recurrent_decode.py): Mamba-2 itself,
Bamba and Nemotron-H (Mamba-2 mixers), LFM2 (short convolutions), Qwen3-Next (gated DeltaNet). Each decode step's
FLOPs are held against FlopCounterMode on the real class's cached one-token decode, its bytes against the state
transformers' real cache holds after a prefill on CPU."""

from __future__ import annotations

import dataclasses

import pytest

from test_serve_hybrids import CASES as HYBRID_CASES, IDS as HYBRID_IDS


# tiny cuts, two or three layers; the Mamba-2 mixers: H 8 heads of P 16, state N 4, G 2 groups, conv over
# 8·16 + 2·2·4 = 144 channels, kernel K 3, chunks of Q 8
_MAMBA2 = dict(model_type="mamba2", architectures=["Mamba2ForCausalLM"], vocab_size=100, hidden_size=64, num_heads=8,
               head_dim=16, state_size=4, n_groups=2, num_hidden_layers=2, expand=2, conv_kernel=3, chunk_size=8,
               tie_word_embeddings=True)
_BAMBA = dict(model_type="bamba", architectures=["BambaForCausalLM"], vocab_size=100, hidden_size=64,
              intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=4, mamba_d_conv=3, mamba_expand=2,
              mamba_chunk_size=8, attn_layer_indices=[1])
_NEMOTRON_H = dict(model_type="nemotron_h", architectures=["NemotronHForCausalLM"], vocab_size=100, hidden_size=64,
                   intermediate_size=96, num_hidden_layers=3, hybrid_override_pattern="M*-", num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
                   ssm_state_size=4, conv_kernel=3, expand=2, chunk_size=8)
# LFM2: a short conv over the hidden 64 channels, kernel 3 (conv_L_cache's default)
_LFM2 = dict(model_type="lfm2", architectures=["Lfm2ForCausalLM"], vocab_size=100, hidden_size=64,
             intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             layer_types=["conv", "full_attention"])
# Qwen3-Next: gated DeltaNet with Hk 2 key heads of dk 8, Hv 4 value heads of dv 16 (conv over 2·2·8 + 4·16 = 96
# channels, K 3), then gated attention; top-2-of-4 experts and a shared expert in both layers
_QWEN3_NEXT = dict(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], vocab_size=100, hidden_size=64,
                   intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                   linear_value_head_dim=16, linear_conv_kernel_dim=3, num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=32, shared_expert_intermediate_size=32,
                   layer_types=["linear_attention", "full_attention"], decoder_sparse_step=1)

# each Mamba-2 mixer's step: 2·B·(conv 144·K 3·2 outputs + scan H·P·N 8·16·4) = 2,752·B
_MAMBA2_STEP = 2 * (144 * 3 * 2 + 8 * 16 * 4)
# an attention layer (4 heads, d 16): 2·B·4·(16 + 16) = 256·B FLOPs a key
_PER_KEY = 2 * 4 * (16 + 16)
_CASES = [
    # (config, batch, prompt, (prefill, step 1, step 2) as FlopCounterMode counts them, a step's recurrent FLOPs / B)
    # Mamba-2: attention-free, 2 mixers; the prompt of 9 is 2 chunks of 8
    (_MAMBA2, 2, 9, (2_275_456, 245_504, 245_504), 2 * _MAMBA2_STEP),
    # Bamba: a mixer, then attention reading 10 and 11 keys (the steps differ by 2·256)
    (_BAMBA, 2, 9, (2_961_472, 337_280, 337_792), _MAMBA2_STEP),
    (_NEMOTRON_H, 1, 5, (573_088, 118_464, 118_720), _MAMBA2_STEP),
    # LFM2 with a prompt shorter than the kernel: the cache pads it to K before the conv, so the prefill's conv
    # computes max(S, K) + K − 1 = 5 columns, not S + K − 1 = 4 (2·B·64·3 = 768 FLOPs more)
    (_LFM2, 2, 2, (1_047_296, 536_576, 537_088), 2 * 64 * 3 * 2),
    # Qwen3-Next over two chunks of 64: the delta rule's chunked matmuls are in the prefill; its decode step is
    # elementwise in transformers' torch path, so only the conv counts: 2·B·96·3·2
    (_QWEN3_NEXT, 1, 70, (13_422_080, 169_600, 169_856), 2 * 96 * 3 * 2),
]
_IDS = ["mamba2", "bamba", "nemotron-h", "lfm2", "qwen3-next"]


def _meta_build(config: dict):
    """The checkpoint's own class (its `architectures`: a vision composite for Qwen3.5) on meta."""
    import torch
    import transformers

    made = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return getattr(transformers, config["architectures"][0])(made)


@pytest.mark.parametrize("config, batch, seq, counts, per_sequence", _CASES + HYBRID_CASES,
                         ids=_IDS + HYBRID_IDS)
def test_decode_flops_equal_flopcountermode(config, batch, seq, counts, per_sequence):
    """generate()'s prefill and two cached decode steps of the tiny real class, FlopCounterMode's count against
    the analytic one (flops/generation.py with recurrent_decode.py's mixers); the later hybrids' cases are
    test_serve_hybrids.py's."""
    from paramscope.api import inspect_module
    from paramscope.cost.dims import text_config
    from paramscope.cost.flops.generation import analytic_generation
    from paramscope.cost.flops.recurrent_decode import recurrent_flops
    from paramscope.cost.model_view import from_module
    from paramscope.cost.traced.flops import count_generation

    module = _meta_build(config)
    traced = count_generation(module, batch, seq, 2)
    view = from_module(module)
    analytic = analytic_generation(view, inspect_module(module).params, batch=batch, seq=seq, new_tokens=3)
    assert (traced.prefill, *traced.steps) == (analytic.prefill, analytic.first_step, analytic.last_step) == counts
    assert counts[2] - counts[1] == (0 if config is _MAMBA2 else batch * _PER_KEY)  # one more key, attention only
    assert recurrent_flops(view, text_config(module.config)).step(batch) == per_sequence * batch


def _real_cache(config: dict, batch: int, seq: int) -> tuple[int, int]:
    """(the recurrent layers' state bytes, the attention layers' K and V bytes a token) in transformers' real cache
    after a prefill on CPU, per sequence."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.zeros((batch, seq), dtype=torch.long), use_cache=True).past_key_values
    state = attention = 0
    for layer in cache.layers:
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            state += sum(t.numel() * t.element_size() for t in states.values() if t is not None)
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                attention += tensor.numel() * tensor.element_size()
    assert state % batch == 0 and attention % (batch * seq) == 0
    return state // batch, attention // (batch * seq)


@pytest.mark.parametrize("config, state, per_token", [
    (_MAMBA2, 2 * (144 * 3 * 4 + 8 * 16 * 4 * 4), 0),  # 2 mixers: conv 144 × K 3, SSM H·P·N, all fp32
    (_BAMBA, 144 * 3 * 4 + 8 * 16 * 4 * 4, 2 * 2 * 16 * 4),  # + attention: K and V, 2 kv heads × 16, fp32
    (_NEMOTRON_H, 144 * 3 * 4 + 8 * 16 * 4 * 4, 2 * 2 * 16 * 4),
    (_LFM2, 64 * 3 * 4, 2 * 2 * 16 * 4),  # the short conv's 64 channels × K 3
    (_QWEN3_NEXT, 96 * 3 * 4 + 4 * 8 * 16 * 4, 2 * 2 * 16 * 4),  # conv 96 × K 3, Hv 4 states of dk 8 × dv 16
], ids=_IDS)
def test_cache_formula_equals_the_real_cache(config, state, per_token):
    """memory/kv.py's cache (what serve reads and writes a step) against the tensors transformers' real cache holds
    after a prefill of 6 tokens for 2 sequences on CPU."""
    from paramscope.cost.memory.kv import kv_cache

    assert _real_cache(config, 2, 6) == (state, per_token)
    assert kv_cache(_meta_build(config).config, batch=2, seq=6, dtype="float32").bytes == 2 * (state + 6 * per_token)


def test_estimate_serving_returns_the_frozen_bounds_of_the_real_cache_and_the_traced_step():
    """paramscope.estimate_serving on Qwen3-Next at 16 keys, batch 2, fp32 (the tiny config names no dtype): the
    DeltaNet layer's state read and written whole, the attention layer's 16 keys read and the new token's K and V
    written; the FLOPs FlopCounterMode counted at 6 keys and 256 more a key; the delta rule a kernel spends named
    beside the bound; frozen, with the report and the page."""
    import paramscope
    from paramscope.render.serve import render_serve_html

    options = paramscope.ServeOptions(gpu="h100", batch=2, seq=16, context=16)
    speed = paramscope.estimate_serving(_QWEN3_NEXT, options)
    state, per_token = 96 * 3 * 4 + 4 * 8 * 16 * 4, 2 * 2 * 16 * 4
    one = 152_960 + 10 * _PER_KEY  # a sequence's step
    step = speed.at_batch
    assert (step.kv_bytes, step.flops) == (2 * (2 * state + per_token * 17), 2 * one)
    assert [s.flops for s in speed.decode] == [b * one for b in (1, 2, 8, 32, 128)]
    assert [s.kv_bytes for s in speed.by_context][:2] == [2 * (2 * state + per_token * (c + 1)) for c in (16, 128)]
    assert any(f"{3 * 2 * 2 * 4 * 8 * 16:,} FLOPs a step at batch 2" in note for note in speed.notes)  # 3·2·B·Hv·dk·dv
    assert isinstance(speed, paramscope.ServeSpeed) and speed.report.model.class_name == "Qwen3NextForCausalLM"
    assert speed == dataclasses.replace(speed, report=None)  # the report takes no part in ==
    with pytest.raises(dataclasses.FrozenInstanceError):
        speed.batch = 4
    assert repr(speed).startswith("<ServeSpeed of ") and "Qwen3NextForCausalLM" in repr(speed)
    assert speed.to_html() == render_serve_html(speed.report, speed)  # the page `serve --html` writes
