"""Serving across GPUs under expert parallelism (`memory MODEL --tp T --ep`): a GPU's prefill workspace, held to the
byte against a module shaped as that GPU's rank and traced (MemTracker on fake tensors, as the one-device check
traces the real class): the config's heads and KV heads / tp (head_dim kept), the widths vLLM cuts over tp / tp,
the routed experts whole (vLLM's MoE tensor-parallel size 1 under --enable-expert-parallel), the vocabulary whole
(the last token's logits are gathered). Its traced peak less its own weights and buffers is the rank's KV cache and
workspace.

Mixtral's fitted moment reads the experts' intermediate i: under --ep it stays whole (8·T·k·i at the full width, as
vLLM's fused experts size their intermediate caches). Qwen1.5-MoE takes the Llama-style formula and the one-device
traced correction; its traced moment does not shrink with the widths the formula cuts, so each GPU carries the
formula's tp cut back with the correction.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def _two_layers(preset: str) -> dict:
    from paramscope.presets import find_preset

    return dict(find_preset(preset).load_config(), num_hidden_layers=2)


def _rank_beyond_weights(raw: dict, seq: int) -> int:
    """The traced prefill peak of the module `raw` builds, less its own weights and buffers (bf16, batch 1)."""
    import torch
    import transformers

    from paramscope.build import choose_class, make_config
    from paramscope.cost.traced.cache_probe import traced_prefill_peak

    config, _ = make_config(raw)
    cls = getattr(transformers, choose_class(config, raw).name)
    traced = traced_prefill_peak(cls, config, batch=1, seq=seq)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            module = cls(config)
    finally:
        torch.set_default_dtype(previous)
    held = sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])
    return traced - held


def _rank_shaped(raw: dict, tp: int, **widths: int) -> dict:
    """`raw` as tensor-parallel rank 0 computes it: heads and KV heads / tp, head_dim kept, `widths` as given."""
    heads = raw["num_attention_heads"]
    return dict(raw, num_attention_heads=heads // tp, num_key_value_heads=raw["num_key_value_heads"] // tp,
                head_dim=raw.get("head_dim") or raw["hidden_size"] // heads, **widths)


def test_mixtral_rank_under_ep_keeps_the_experts_intermediate_whole():
    """Mixtral-8x7B's widths (2 layers), tp 2 with ep, 512 tokens: the rank's KV cache and workspace equal the
    traced rank-shaped module's (16 heads, 4 KV heads, experts whole); the experts' i / 2 (the formula before) is
    short of it by 8·T·k·(i − i/2) B."""
    from paramscope.cost.memory.prefill import prefill_workspace
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import memory_answer

    raw, seq = _two_layers("mixtral-8x7b"), 512
    _, estimate, view = memory_answer(raw, MemoryOptions(seq=seq, tp=2, expert_parallel=True), use_cache=False,
                                      check=False)
    device = estimate.parallel.layout.device
    traced = _rank_beyond_weights(_rank_shaped(raw, 2), seq)
    assert device.kv_cache.bytes + device.workspace.bytes == traced == 145_014_848
    assert "the experts' i whole: expert parallel" in device.workspace.arithmetic
    cut = prefill_workspace(view.config, tp=2, batch=1, seq=seq, dtype_size=2, vocab=32000, layers=2,
                            class_name="MixtralForCausalLM", cache_bytes=device.kv_cache.bytes)
    assert device.workspace.bytes - cut.bytes == 8 * seq * 2 * (14336 - 14336 // 2) == 58_720_256


@pytest.mark.parametrize("tp, ep", [(2, True), (2, False)])
def test_qwen_moe_rank_carries_the_formulas_cut_back(tp, ep):
    """Qwen1.5-MoE-A2.7B's widths (2 layers) at 8,192 tokens: the one-device correction (traced − analytic, here
    measured on the same 2 layers) plus the formula's tp cut given back makes each GPU's KV cache, workspace and
    correction equal the traced rank-shaped module's (heads, KV heads, shared expert and intermediate / tp; the
    routed experts whole under ep, / tp without): the moment the formula misses keeps its size on a rank."""
    from paramscope.cost.memory.quantization import weight_format
    from paramscope.cost.memory.serving import MemoryOptions, serving_estimate
    from paramscope.cost.memory.serving_answer import memory_answer
    from paramscope.cost.memory.serving_correction import CutDifference

    raw, seq = _two_layers("qwen1.5-moe-a2.7b"), 8192
    report, one, view = memory_answer(raw, MemoryOptions(seq=seq), use_cache=False, check=False)
    one_device = _rank_beyond_weights(raw, seq) - one.kv_cache.bytes - one.activations.bytes
    assert one_device == 455_279_072  # the full model's, as kept (test_serving_parallel_cache.MEASURED)
    checked = SimpleNamespace(of=lambda view: SimpleNamespace(status="differs", words=lambda: "check: differs"))

    def correct(view, dtype, batch, length, encoder_seq):
        return CutDifference(batch, length, 2, -one_device, 2)

    options = MemoryOptions(seq=seq, tp=tp, expert_parallel=ep)
    estimate = serving_estimate(report, view, options, weight_format("bf16"), "--dtype", (), checked=checked,
                                correct=correct)
    device = estimate.parallel.layout.device
    shared = raw["shared_expert_intermediate_size"]
    rank = _rank_shaped(raw, tp, shared_expert_intermediate_size=shared // tp,
                        intermediate_size=raw["intermediate_size"] // tp,
                        moe_intermediate_size=raw["moe_intermediate_size"] // (1 if ep else tp))
    assert device.kv_cache.bytes + device.workspace.bytes + device.correction == _rank_beyond_weights(rank, seq)
    assert device.correction == one_device + seq * 2 * (5632 - 5632 // tp) * 2 == 547_553_760
