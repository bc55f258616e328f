"""bf16-master (DeepSpeed's bf16: bf16 weights and gradients, fp32 masters and Adam moments) beside the other splits:
each rank's states are its shard's, partitioned over dp by ZeRO; beside tp the closed form is held to a tp rank traced
with the master-copy optimizer (MasterCopyOptimizer on the rank's DTensor shards) to the byte, on a 2-layer Llama cut."""

import functools

import pytest

from paramscope.cost.memory.training import TrainingOptions, estimate_training, training_answer
from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings

LLAMA = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=1000, model_type="llama", architectures=["LlamaForCausalLM"])


@functools.lru_cache(maxsize=None)
def _closed_and_traced(sp: bool):
    import transformers as T

    config = {k: v for k, v in LLAMA.items() if k != "model_type"}
    _, estimate, view = training_answer(T.LlamaConfig(**config), TrainingOptions(
        batch=2, seq=32, precision="bf16-master", fits=False, layout=layout_for(tp=2, sp=sp)), use_cache=False)
    traced = trace_parallel_training(view.module, StepSettings(batch=2, seq=32, precision="bf16-master",
                                                               optimizer="adamw"), tp=2, sp=sp)
    return estimate, {p.phase: p for p in traced.phases}


@pytest.mark.parametrize("sp", [False, True], ids=["tp 2", "tp 2 sp"])
def test_a_tp_rank_equals_its_trace_with_the_master_copy_optimizer(sp):
    """The rank's bf16 shard (1,899,008 B), its fp32 masters (3,798,016 B) and moments; the step holds the bf16
    gradients and their fp32 cast, the embedding's whole on every rank (DTensor's Replicate gradient: + 256,000 B bf16,
    + 512,000 B its fp32 cast) and the token ids: 19,758,804 B, the traced rank's optimizer step and peak."""
    estimate, traced = _closed_and_traced(sp)
    device = estimate.training.device
    assert (device.weights, device.gradients, device.optimizer, device.master_weights) == \
        (1_899_008, 1_899_008, 7_596_116, 3_798_016)
    step = next(p for p in device.phases if p.phase == "optimizer step")
    assert step.bytes == traced["optimizer step"].bytes == estimate.peak == 19_758_804
    assert traced["optimizer step"].by_category["parameters"] == device.weights + device.master_weights
    assert "fp32 cast for the master copy whole too, + 512,000" in step.arithmetic
    if not sp:  # the forward's moment too (under sp the closed form is 16,384 B under bf16-pure's trace alike)
        forward = max(p.bytes for p in device.phases if p.phase == "forward")
        assert forward == traced["forward"].bytes == 15_031_788
    assert any("Megatron-DeepSpeed's composition" in n for n in estimate.notes)


@pytest.mark.parametrize("zero, states, peak", [
    # the tp rank's shard n = 4,015,263,744 parameters: 2 + 2 + 12 B, then 2 + 2 + 12/4, 2 + 14/4, 16/4 (+ 291 step
    # scalars × 4 B, partitioned alike)
    ("0", (8_030_527_488, 8_030_527_488, 32_122_111_116, 16_061_054_976), 81_881_302_668),
    ("1", (8_030_527_488, 8_030_527_488, 8_030_527_779, 4_015_263_744), 32_647_463_715),
    ("2", (8_030_527_488, 2_007_631_872, 8_030_527_779, 4_015_263_744), 32_025_391_915),
    ("3", (2_007_631_872, 2_007_631_872, 8_030_527_779, 4_015_263_744), 26_745_953_067),
])
def test_llama_3_8b_tp_2_dp_4_states_are_the_shard_partitioned_by_zero(zero, states, peak):
    n = 4_015_263_744
    estimate = estimate_training("llama-3-8b", TrainingOptions(precision="bf16-master", fits=False,
                                                               layout=layout_for(dp=4, tp=2, zero=zero)))
    device = estimate.training.device
    got = (device.weights, device.gradients, device.optimizer, device.master_weights)
    assert got == states
    d = 4 if zero != "0" else 1
    assert got == (2 * n // (4 if zero == "3" else 1), 2 * n // (4 if zero in "23" else 1),
                   -(-(8 * n + 4 * 291) // d), 4 * n // d)
    assert estimate.peak == peak
