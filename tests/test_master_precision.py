"""bf16-master: bf16 weights and gradients, an fp32 master copy and the optimizer's states on it (DeepSpeed's bf16,
the ZeRO paper's 2 + 2 + 12 B a parameter), per device under ZeRO 1/2/3, and its step traced for real."""

import pytest

from paramscope.cost.memory.training import TrainingOptions, estimate_training
from paramscope.cost.parallel.layout import layout_for
from paramscope.errors import OptionError

LLAMA = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=1000, model_type="llama", architectures=["LlamaForCausalLM"])
N = 1_897_728  # the cut's parameters (21 tensors)


def test_a_small_llama_step_equals_its_trace_phase_by_phase():
    """The analytic answer (bf16-pure's forward and backward, the master copy's states, the step's fp32 gradient
    copy) equals one real step on fake tensors to the byte: module in bf16, fused AdamW on fp32 masters."""
    options = TrainingOptions(batch=2, seq=32, precision="bf16-master", fits=False)
    analytic = estimate_training(LLAMA, options)
    traced = estimate_training(LLAMA, TrainingOptions(batch=2, seq=32, precision="bf16-master", fits=False,
                                                      trace="full"))
    assert analytic.engine == "analytic" and traced.engine == "traced"
    states = analytic.training.states
    assert (states.weights.bytes, states.gradients.bytes, states.optimizer.bytes, states.master_weights.bytes) == \
        (2 * N, 2 * N, 8 * N + 4 * 21, 4 * N)

    def peaks(estimate):
        out = {}
        for p in estimate.training.phases:
            out[p.phase] = max(out.get(p.phase, 0), p.bytes)
        return out

    assert peaks(analytic) == peaks(traced) == {"forward": 28_742_636, "backward": 30_396_636,
                                                "optimizer step": 37_954_772}
    # the step: resident + bf16 gradients + their fp32 copies (4 B an element), the peak of the step
    resident = 2 * N + 128 + 8 * N + 84 + 4 * N
    assert peaks(traced)["optimizer step"] == resident + 2 * N + 4 * N
    # the bf16 weights' forward and backward are bf16-pure's: the same activations
    pure = estimate_training(LLAMA, TrainingOptions(batch=2, seq=32, precision="bf16-pure", fits=False))
    assert pure.activations.bytes == analytic.activations.bytes


@pytest.mark.parametrize("zero, states, peak", [
    # ZeRO paper: 2 + 2 + 12/8 B, 2 + 14/8, 16/8 a parameter (+ the step scalars' ⌈291 × 4 / 8⌉ = 146 B)
    ("1", (16_060_522_496, 16_060_522_496, 8_030_261_394, 4_015_130_624), 48_181_568_146),
    ("2", (16_060_522_496, 2_007_565_312, 8_030_261_394, 4_015_130_624), 44_488_350_362),
    ("3", (2_007_565_312, 2_007_565_312, 8_030_261_394, 4_015_130_624), 31_922_290_330),
])
def test_llama_3_8b_per_device_under_zero(zero, states, peak):
    n = 8_030_261_248
    estimate = estimate_training("llama-3-8b", TrainingOptions(precision="bf16-master", fits=False,
                                                               layout=layout_for(dp=8, zero=zero)))
    device = estimate.training.device
    got = (device.weights, device.gradients, device.optimizer, device.master_weights)
    assert got == states
    paper = {"1": 2 * n + 2 * n + 12 * n // 8, "2": 2 * n + 14 * n // 8, "3": 16 * n // 8}[zero]
    assert sum(got) - paper == 146
    assert estimate.peak == peak


def test_flat_zero_shares_and_the_step_copy_of_a_partition():
    """--devices N --zero K (states.py's shares) agrees with --dp N: the step's fp32 copy is the partition."""
    for zero, peak in (("1", 48_181_568_146), ("2", 44_488_350_362)):
        flat = estimate_training("llama-3-8b", TrainingOptions(precision="bf16-master", fits=False, devices=8,
                                                               zero=zero))
        assert flat.training.per_device["master_weights"] == 4_015_130_624
        assert flat.peak == peak


@pytest.mark.parametrize("options, words", [
    (dict(optimizer="adamw-8bit"), "'adamw-8bit' is not one"),
    (dict(layout=layout_for(dp=4, zero="fsdp")), "not with FSDP2"),
    (dict(layout=layout_for(dp=2, pp=2, zero="2")), "PipelineEngine, which runs with ZeRO 0 or 1"),
])
def test_what_it_does_not_model_is_refused_in_one_line(options, words):
    with pytest.raises(OptionError, match=words):
        TrainingOptions(precision="bf16-master", **options).check()


def test_the_layout_search_refuses_it_under_fsdp2_in_one_line():
    from paramscope.cost.parallel.search_options import SearchOptions

    with pytest.raises(OptionError, match="searches precision bf16-master over DeepSpeed's ZeRO"):
        SearchOptions(devices=8, gpu="H100", precision="bf16-master").check()
