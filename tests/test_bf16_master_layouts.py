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


def test_a_cp_rank_equals_its_trace_and_zero_partitions_over_dp_times_cp():
    """cp 2 on the cut, 2 × 64 tokens: the closed form (the recipe at S / cp, the ring's kept copies) with the master
    step equals the rank traced on torch's ring with MasterCopyOptimizer, phase by phase; beside dp 2 under ZeRO-1
    the masters and moments are partitioned over the dp × cp = 4 ranks (7,590,912 / 4 B of masters)."""
    from parallel_steps import cp_rank_beside_its_trace

    phases, traced = cp_rank_beside_its_trace(LLAMA, "bf16-master")
    assert (phases["end of forward"], phases["end of backward"], phases["optimizer step"]) == \
        tuple(p.bytes for p in traced.phases) == (28_808_172, 30_396_636, 37_954_772)
    zero = estimate_training(LLAMA, TrainingOptions(batch=2, seq=64, precision="bf16-master", fits=False,
                                                    layout=layout_for(dp=2, cp=2, zero="1"), derive_layout=False))
    device = zero.training.device
    assert (device.optimizer, device.master_weights) == (-(-(8 * 1_897_728 + 4 * 21) // 4), 1_897_728)
    assert any("dp × cp ranks" in n and "sequence-data-parallel" in n for n in zero.notes)


def test_ep_ranks_partition_their_experts_over_the_expert_data_parallel_group():
    """DeepSpeed-MoE: a rank's routed experts' states over the ranks holding the same experts (dp / ep), the rest
    over dp. A 2-layer Mixtral cut at dp 2 · ep 2: the rank's 98,304 expert parameters keep whole masters and moments
    (a group of 1), its 58,176 others are halved; ZeRO-3 beside ep is refused (DeepSpeed-MoE runs ZeRO 0-2)."""
    import paramscope
    from paramscope.cost.dims import text_config
    from paramscope.cost.parallel.layout import ParallelLayout
    from paramscope.cost.parallel.rules import model_shape, place
    from paramscope.cost.parallel.states import device_states
    from paramscope.errors import OptionError
    from parallel_steps import small_mixtral

    config = small_mixtral(2)
    report = paramscope.inspect(config)
    placements = place(report.params, model_shape(text_config(config), set()), tp=1, ep=2)
    trainable = frozenset(p.name for p in report.params)
    experts, rest = 98_304, 58_176
    for zero, gradients in (("zero1", 2 * (experts + rest)), ("zero2", 2 * experts + 2 * rest // 2)):
        got = device_states(report.params, placements, ParallelLayout(dp=2, ep=2, shard=zero),
                            precision="bf16-master", optimizer="adamw", trainable=trainable)
        assert (got.weights, got.gradients, got.optimizer, got.master_weights) == (
            2 * (experts + rest), gradients, 8 * experts + 4 * 4 + -(-(8 * rest + 4 * 17) // 2),
            4 * experts + 4 * rest // 2) == (312_960, (312_960, 254_784)[zero == "zero2"], 1_019_186, 509_568)
        assert "expert-data-parallel group of 1 rank" in got.arithmetic
    with pytest.raises(OptionError, match="DeepSpeed-MoE's, which runs with ZeRO 0, 1 or 2"):
        TrainingOptions(precision="bf16-master", layout=ParallelLayout(dp=2, ep=2, shard="zero3")).check()


def test_pipeline_stages_hold_their_own_parameters_states_and_step_copy():
    """pp 2 on the cut (2 × 32, 2 microbatches): each stage's bf16 weights, masters and moments are its own
    parameters' (948,736 on stage 0, 948,992 with the final norm and head on stage 1). At ZeRO 0 DeepSpeed's
    PipelineEngine runs BF16_Optimizer (engine.py _do_optimizer_sanity_check: bf16 with a pipeline): its bf16
    gradient-accumulation buffer of the stage's parameters (fp32_groups_gradients_flat in grad_acc_dtype, bf16 by
    default) is held at every moment beside the bf16 gradients, in the gradients column (2 + 2 B a parameter; was 2,
    the buffer uncounted: stage 1's peak 18,980,016 → 20,878,000 B), its masters and moments are partitioned over
    the data-parallel ranks as ZeRO-1 does (dp 2: halved, where they were whole), and its step casts the rank's
    partition of the buffer to fp32. ZeRO-1 over dp 2 is DeepSpeedZeroOptimizer (no buffer: BF16_Optimizer there
    only with grad_accum_dtype fp32); ZeRO-2 beside a pipeline is refused (DeepSpeed's PipelineEngine asserts
    stage < 2)."""
    from paramscope.errors import OptionError

    def stages(**layout):
        estimate = estimate_training(LLAMA, TrainingOptions(batch=2, seq=32, precision="bf16-master", fits=False,
                                                            layout=layout_for(pp=2, micro_batches=2, **layout)))
        return estimate, [(s.weights, s.gradients, s.optimizer, s.master_weights, s.peak, s.peak_phase)
                          for s in estimate.training.device.stages]

    estimate, got = stages()
    assert got == [(1_897_472, 2 * 1_897_472, 8 * 948_736 + 4 * 10, 4 * 948_736, 20_872_360, "optimizer step"),
                   (1_897_984, 2 * 1_897_984, 8 * 948_992 + 4 * 11, 4 * 948_992, 20_878_000, "optimizer step")]
    # weights + ids + moments + masters + the buffer + the bf16 gradients + the fp32 cast + the losses' mean
    assert 20_878_000 == 1_897_984 + 128 + 7_591_980 + 3_795_968 + 1_897_984 + 1_897_984 + 3_795_968 + 4
    assert any("BF16_Optimizer" in n and "gradient-accumulation buffer" in n for n in estimate.notes)
    assert estimate.training.device.accumulation_buffer == 1_897_984  # the worst stage's, named in its peak's sum
    _, zero0 = stages(dp=2)
    assert [row[1:5] for row in zero0] == [(2 * 1_897_472, 3_794_964, 1_897_472, 13_282_452),
                                           (2 * 1_897_984, 3_795_990, 1_897_984, 13_286_042)]
    _, zero1 = stages(dp=2, zero="1")
    assert [row[1:5] for row in zero1] == [(1_897_472, 3_794_964, 1_897_472, 11_384_980),
                                           (1_897_984, 3_795_990, 1_897_984, 11_388_058)]
    with pytest.raises(OptionError, match="PipelineEngine, which runs with ZeRO 0 or 1"):
        TrainingOptions(precision="bf16-master", layout=layout_for(dp=2, pp=2, zero="2")).check()


def test_find_layout_searches_it_over_zero_each_layout_equal_to_memory():
    """llama-3-8b on 8 H100s at 4,096 tokens, ZeRO-2: every layout without a pipeline is answered (10 fit), each
    equal to memory's answer for it to the byte; the pipelines are passed over, named (DeepSpeed's PipelineEngine
    runs ZeRO 0-1); FSDP2, the search's default sharding, is refused in one line under bf16-master."""
    from paramscope.cost.parallel.search_answer import find_layout
    from paramscope.cost.parallel.search_options import SearchOptions
    from paramscope.errors import OptionError

    found = find_layout("llama-3-8b", SearchOptions(devices=8, gpu="H100", precision="bf16-master", zero="2",
                                                    seq=4096))
    assert len(found.fitting) == 10 and not found.not_fitting
    assert all(row.layout.pp == 1 for row in found.fitting)
    assert sum("PipelineEngine" in row.reason for row in found.skipped) == 10  # the 10 pipelines of 8
    first = found.fitting[0]
    assert first.layout.words() == "dp 4 (ZeRO-2) × tp 2 (sequence parallel) = 8 devices"
    for row in (first, found.fitting[5]):
        memory = estimate_training("llama-3-8b", TrainingOptions(
            batch=row.replica_batch, seq=4096, precision="bf16-master", fits=False, layout=row.layout,
            derive_layout=False, grad_accum=row.accumulation))
        assert row.peak == memory.peak
    assert first.peak == 43_235_343_147
    assert any("DeepSpeed-MoE's" in n for n in found.notes)
    with pytest.raises(OptionError, match="over DeepSpeed's ZeRO: give zero 0, 1, 2 or 3"):
        SearchOptions(devices=8, gpu="H100", precision="bf16-master").check()
