"""One device's FLOPs per step under a layout (issue 28 §6): tp, pp, cp, ep, recompute, MFU per device.

- The invariant, exactly: over the tp × pp × cp devices of one replica, Σ device model FLOPs = the model's FLOPs at
  the replica's batch + Σ over the matmuls kept whole on every tp rank (copies − 1) × their FLOPs (copies: tp for a
  replicated weight, tp / kv for a KV projection replicated past the KV heads). The duplicated part is computed here
  from the whole model's terms, not from the per-device code.
- The check: FlopCounterMode on one rank of the real class under DTensor tensor parallelism on torch's fake process
  group (each op counted at its local tensors' shapes) equals the analytic per-device forward and backward.
"""

from __future__ import annotations

import json

import pytest

from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
from paramscope.cost.parallel.layout import layout_for
from paramscope.errors import ParamscopeError, UnsupportedError

LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256, intermediate_size=512,
             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)
MOE = dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], hidden_size=128, intermediate_size=256,
           moe_intermediate_size=64, shared_expert_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=1000, num_experts=8, num_experts_per_tok=2)


def _device(model, batch=2, seq=64, training=True, checkpointing="none", **layout):
    lay = layout_for(batch=batch, **layout)
    return estimate_flops(model, FlopOptions(batch=batch, seq=seq, training=training, layout=lay,
                                             devices=lay.devices, grad_checkpointing=checkpointing))


# --- figures ------------------------------------------------------------------------------------------------------

def test_llama3_70b_tp8_pp4_the_head_stage_is_the_busiest():
    estimate = _device("llama-3-70b", batch=16, seq=4096, devices=32, tp=8, pp=4)
    device = estimate.device
    assert estimate.step == 29_440_248_467_423_232
    assert device.stage == 3 and device.stages[3].last
    assert device.forward == 319_579_926_560_768
    assert device.step == 958_739_779_682_304 == 3 * device.forward
    # 20 layers of 80 over 8 tp ranks, and ⌈128,256 / 8⌉ vocabulary rows
    layers = estimate.forward - estimate.by_role["head.lm"]
    assert device.forward == layers * 20 // 80 // 8 + estimate.by_role["head.lm"] // 8
    assert device.recompute == estimate.recompute // 32  # flash attention's scores: ½ × its attention forward
    assert [s.forward for s in device.stages[:3]] == [302_365_697_638_400] * 3
    assert device.bubble == 3 / 19 and device.duplicated == 0
    assert device.devices_sum == estimate.step  # nothing duplicated: the sum is the model's, exactly


# --- the invariant ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", [dict(tp=2), dict(tp=8), dict(tp=2, pp=2), dict(tp=4, cp=2), dict(pp=2, cp=4),
                                    dict(tp=2, pp=2, cp=2, micro_batches=2)])
def test_sum_over_a_replica_is_the_model_plus_duplicated_kv_projections(layout):
    """Llama with 2 KV heads: past tp 2 each KV head's projection runs on tp / 2 ranks."""
    estimate = _device(LLAMA, **layout)
    device = estimate.device
    tp = layout.get("tp", 1)
    kv = estimate.by_role["attention.key"] + estimate.by_role["attention.value"]
    duplicated = 3 * kv * (tp // 2 - 1) if tp > 2 else 0
    assert device.duplicated == duplicated
    assert device.devices_sum == estimate.step + duplicated
    assert device.recompute_sum == estimate.recompute  # the scores' recompute splits exactly


def test_moe_router_and_shared_gate_are_whole_on_every_tp_rank():
    estimate = _device(MOE, tp=2, dp=2, ep=2)
    device = estimate.device
    gate = 2 * 2 * 64 * MOE["hidden_size"] * MOE["num_hidden_layers"]  # the one-output shared-expert gate, 2·T·h
    whole = estimate.by_role["moe.router"] + gate
    assert {t.role for t in device.terms if t.copies == 2} == {"moe.router", "moe.shared_experts"}
    assert device.duplicated == 3 * whole * (2 - 1)
    assert device.devices_sum == estimate.step + device.duplicated
    assert any("duplicated on every tp rank: moe.router, moe.shared_experts (shared_expert_gate)" in c
               for c in device.conventions)


def test_expert_parallel_under_balanced_routing_leaves_expert_flops_alone():
    alone = _device(MOE, dp=2).device
    split = _device(MOE, dp=2, ep=2).device
    assert alone.forward == split.forward
    assert [t.flops for t in alone.terms] == [t.flops for t in split.terms]
    assert any("balanced routing" in c for c in split.conventions)


def test_checkpointing_recompute_splits_exactly():
    estimate = _device(LLAMA, tp=2, pp=2, checkpointing="full")
    device = estimate.device
    assert device.recompute_sum == estimate.recompute
    assert device.recompute > device.forward // 2


def test_context_parallel_divides_tokens_and_scores():
    whole = estimate_flops(LLAMA, FlopOptions(batch=2, seq=64, training=True))
    device = _device(LLAMA, cp=4).device
    assert device.forward * 4 == whole.forward and device.tokens == 2 * 64 // 4
    assert any("load-balanced split" in c and "chunks i and 7 − i of 8" in c for c in device.conventions)


def test_sequence_parallel_changes_no_flop_figure():
    plain, sp = _device(LLAMA, tp=2).device, _device(LLAMA, tp=2, sp=True).device
    assert plain.step == sp.step
    assert any("--sp changes no FLOP figure" in c for c in sp.conventions)


def test_forward_only_under_tensor_parallel():
    estimate = _device(LLAMA, training=False, tp=2)
    assert estimate.device.backward is None and estimate.device.devices_sum == estimate.forward


# --- MFU per device -----------------------------------------------------------------------------------------------

def test_mfu_per_device_from_the_step_time_and_from_throughput():
    lay = layout_for(devices=8, tp=2, pp=2, batch=4)
    options = dict(batch=4, seq=64, training=True, layout=lay, devices=8, peak_tflops=100.0)
    timed = estimate_flops(LLAMA, FlopOptions(step_seconds=0.5, **options))
    device, compute = timed.device, timed.compute
    assert compute.device_mfu == device.step / (0.5 * 100e12)
    assert compute.device_hfu == device.hardware / (0.5 * 100e12) > compute.device_mfu  # PaLM: HFU has recompute
    assert compute.mfu == pytest.approx(2 * timed.step / (0.5 * 100e12 * 8))  # dp 2 replicas on 8 devices
    # the same step time from a throughput: dp × batch × seq tokens a step
    rate = estimate_flops(LLAMA, FlopOptions(tokens_per_second=2 * 4 * 64 / 0.5, **options)).compute
    assert rate.step_seconds == 0.5 and rate.device_mfu == compute.device_mfu


# --- refusals -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout, options, named", [
    (dict(tp=3), {}, "tp"),
    (dict(cp=3), {}, "cp"),
    (dict(pp=2, micro_batches=3), {}, "micro_batches"),
    (dict(tp=2), dict(generate=4, training=False), "generate"),
    (dict(tp=2), dict(freeze=("embeddings",)), "freeze"),
    (dict(tp=2), dict(step_seconds=1.0), "peak_tflops"),
])
def test_bad_layouts_are_refused_in_one_line(layout, options, named):
    with pytest.raises(ParamscopeError) as raised:
        lay = layout_for(batch=2, **layout)
        values = dict(batch=2, seq=64, training=True, layout=lay, devices=lay.devices)
        values.update(options)
        estimate_flops(LLAMA, FlopOptions(**values))
    assert named in str(raised.value) and "\n" not in str(raised.value)


def test_an_encoder_decoder_is_not_split():
    with pytest.raises(UnsupportedError, match="two stacks"):
        _device("t5-small", tp=2)


# --- CLI ----------------------------------------------------------------------------------------------------------

def test_cli_text_and_json(capsys):
    from paramscope.cli import main

    args = ["flops", "llama-3-70b", "--training", "--devices", "32", "--tp", "8", "--pp", "4", "--batch", "16",
            "--seq", "4096", "--gpu", "h100", "--step-seconds", "20"]
    assert main([*args, "--width", "200"]) == 0
    text = capsys.readouterr().out
    assert "One device: dp 1 × tp 8 × pp 4 (1F1B, 16 microbatches) = 32 devices; stage 3" in text
    assert "bubble 15.8% of the step idle" in text and "MFU per device" in text and "PaLM" in text
    assert main([*args, "--json"]) == 0
    device = json.loads(capsys.readouterr().out)["flops"]["device"]
    assert device["forward"] == 319_579_926_560_768 and device["stage"] == 3
    assert device["devices_sum"] == device["replica"] + device["duplicated"]
    assert device["mfu"] == pytest.approx(958_739_779_682_304 / (20 * 989.4e12))
    assert main(["flops", "llama-3-70b", "--tp", "7"]) == 2
    assert "--tp 7" in capsys.readouterr().err


# --- the check: FlopCounterMode on one tensor-parallel rank -------------------------------------------------------

@pytest.fixture(scope="module")
def llama_meta():
    import torch
    import transformers

    fields = {k: v for k, v in LLAMA.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))


@pytest.mark.parametrize("tp, rank", [(2, 0), (2, 1), (4, 3)])
def test_flopcountermode_on_a_tensor_parallel_rank_equals_the_analytic_device(llama_meta, tp, rank):
    from paramscope.cost.traced.parallel_flops import count_rank_flops
    from paramscope.cost.traced.step import StepSettings

    counted = count_rank_flops(llama_meta, StepSettings(batch=2, seq=64, precision="fp32"), tp=tp, rank=rank)
    device = _device(LLAMA, tp=tp).device
    assert counted.forward == device.forward  # rank 0 and the others alike: 1,000 rows split evenly
    assert counted.backward == device.backward + device.recompute  # as counted: flash's scores recomputed
