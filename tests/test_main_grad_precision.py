"""bf16-main-grad: Megatron-LM's bf16 training (Megatron-Core's DDP with accumulate_allreduce_grads_in_fp32): bf16
weights, a resident fp32 main-gradient buffer, fp32 masters and Adam moments, 18 B a parameter under plain DDP and
6 + 12/d under the distributed optimizer (theoretical_memory_usage.py's), beside tp [sp], pp, cp and ep; its step
held to a real traced one (MainGradOptimizer: the hook adding each gradient into an fp32 main_grad) on 2-layer Llama
and Mixtral cuts."""

import functools

import pytest

from paramscope.cost.memory.training import TrainingOptions, estimate_training
from paramscope.cost.parallel.layout import layout_for
from paramscope.errors import OptionError

LLAMA = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=1000, model_type="llama", architectures=["LlamaForCausalLM"])
N = 1_897_728  # the cut's parameters (21 tensors)
N_8B = 8_030_261_248  # llama-3-8b's (291 tensors)


def _peaks(estimate):
    out = {}
    for p in estimate.training.phases:
        out[p.phase] = max(out.get(p.phase, 0), p.bytes)
    return out


def test_the_states_are_2_4_12_bytes_and_the_buffer_is_held_from_the_forward():
    """2 + 4 + 8 + 4 B a parameter (+ the 21 step scalars); the fp32 buffer is in every moment, the forward's too:
    the end of the forward is bf16-pure's moment (2 + 2 × 2 B resident) with 12 B a parameter more (18 − 6), and the
    step holds the states alone: no cast copy, no .grad."""
    estimate = estimate_training(LLAMA, TrainingOptions(batch=2, seq=32, precision="bf16-main-grad", fits=False))
    states = estimate.training.states
    assert (states.weights.bytes, states.gradients.bytes, states.optimizer.bytes, states.master_weights.bytes) == \
        (2 * N, 4 * N, 8 * N + 4 * 21, 4 * N)
    assert _peaks(estimate) == {"forward": 36_333_548, "backward": 36_460_508, "optimizer step": 34_159_316}
    resident = 2 * N + 128 + 4 * N + 8 * N + 84 + 4 * N
    assert _peaks(estimate)["optimizer step"] == resident  # the fused step's temporaries: none; no cast copy
    pure = estimate_training(LLAMA, TrainingOptions(batch=2, seq=32, precision="bf16-pure", fits=False))
    pure_forward = max(p.bytes for p in pure.training.phases if p.phase == "forward")
    assert _peaks(estimate)["forward"] - pure_forward == 12 * N
    assert pure.activations.bytes == estimate.activations.bytes
    assert any(n.startswith("bf16-main-grad is Megatron-LM's bf16 training") for n in estimate.notes)


def test_a_small_llama_step_equals_its_trace_phase_by_phase():
    """One real step on fake tensors, the module in bf16, fused AdamW on fp32 masters whose gradients are the fp32
    main_grad buffer (held from before the forward, a hook adding each bf16 gradient in and freeing it)."""
    traced = estimate_training(LLAMA, TrainingOptions(batch=2, seq=32, precision="bf16-main-grad", fits=False,
                                                      trace="full"))
    assert traced.engine == "traced"
    assert _peaks(traced) == {"forward": 36_333_548, "backward": 36_460_508, "optimizer step": 34_159_316}
    step = next(p for p in traced.training.traced.phases if p.phase == "optimizer step")
    assert step.by_category["gradients"] == 0  # no .grad held: the buffer is the tracker's "other", 4 B each
    assert step.by_category["other"] == 4 * N


@pytest.mark.parametrize("layout, states, peak", [
    # 2 + 4 + 12 B: theoretical_memory_usage.py's 18 B without the distributed optimizer (+ 291 step scalars)
    (dict(dp=8, zero="0"), (2 * N_8B, 4 * N_8B, 8 * N_8B + 4 * 291, 4 * N_8B), 160_927_139_476),
    # 6 + 12/8 B with it (the step scalars' ⌈291 × 4 / 8⌉ = 146 B): the masters and moments sharded, the buffer whole
    (dict(dp=8, zero="1"), (2 * N_8B, 4 * N_8B, 8_030_261_394, 4_015_130_624), 76_609_395_354),
    # tp 2: the rank's shard n = 4,015,263,744, 2 + 4 + 12/4 B (9 B) + 291 step scalars × 4 B / 4
    (dict(tp=2, dp=4, zero="1"), (8_030_527_488, 16_061_054_976, 8_030_527_779, 4_015_263_744), 48_086_446_891),
])
def test_llama_3_8b_per_device_plain_ddp_and_the_distributed_optimizer(layout, states, peak):
    estimate = estimate_training("llama-3-8b", TrainingOptions(precision="bf16-main-grad", fits=False,
                                                               layout=layout_for(**layout)))
    device = estimate.training.device
    got = (device.weights, device.gradients, device.optimizer, device.master_weights)
    assert got == states
    n = device.weights // 2  # the rank's shard's parameters (the norms replicated over tp)
    megatron = 18 * n if layout["zero"] == "0" else 6 * n + 12 * n // layout["dp"]
    assert sum(got) - megatron == (4 * 291 if layout["zero"] == "0" else 146 if layout.get("tp", 1) == 1 else 291)
    assert estimate.peak == peak
    assert device.gradients_resident
    assert any("Megatron-LM's bf16 training" in n and ("distributed optimizer" in n if layout["zero"] == "1"
                                                       else "plain DDP" in n) for n in estimate.notes)


def test_flat_devices_and_zero_agree_with_the_layout():
    flat = estimate_training("llama-3-8b", TrainingOptions(precision="bf16-main-grad", fits=False, devices=8, zero="1"))
    assert flat.training.per_device["gradients"] == 4 * N_8B  # the buffer held whole under the distributed optimizer
    assert flat.peak == 76_609_395_354


@functools.lru_cache(maxsize=None)
def _tp_rank(sp: bool):
    import transformers as T

    from paramscope.cost.memory.training import training_answer
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.cost.traced.step import StepSettings

    config = {k: v for k, v in LLAMA.items() if k != "model_type"}
    _, estimate, view = training_answer(T.LlamaConfig(**config), TrainingOptions(
        batch=2, seq=32, precision="bf16-main-grad", fits=False, layout=layout_for(tp=2, sp=sp)), use_cache=False)
    traced = trace_parallel_training(view.module, StepSettings(batch=2, seq=32, precision="bf16-main-grad",
                                                               optimizer="adamw"), tp=2, sp=sp)
    return estimate, {p.phase: p for p in traced.phases}


@pytest.mark.parametrize("sp", [False, True], ids=["tp 2", "tp 2 sp"])
def test_a_tp_rank_equals_its_trace_with_the_main_grad_optimizer(sp):
    """The rank's shard: bf16 weights 1,899,008 B, the fp32 buffer and masters 3,798,016 B each, the moments; the
    embedding's gradient DTensor gives whole is added into the rank's main_grad shard by its hook and freed, and the
    sp norms' gradients too, so the step holds the states alone (+ the token ids): 17,091,796 B = the traced rank's;
    the start of backward, the peak, equals it too."""
    estimate, traced = _tp_rank(sp)
    device = estimate.training.device
    assert (device.weights, device.gradients, device.optimizer, device.master_weights) == \
        (1_899_008, 3_798_016, 7_596_116, 3_798_016)
    step = next(p for p in device.phases if p.phase == "optimizer step")
    assert step.bytes == traced["optimizer step"].bytes == 17_091_796
    assert traced["optimizer step"].by_category["other"] == device.gradients  # the buffer, held
    assert estimate.peak == traced["backward"].bytes == (18_710_364 if sp else 18_956_764)


def test_pipeline_stages_hold_their_own_buffer_masters_and_moments():
    """pp 2 on the cut (2 × 32, 2 microbatches): each stage's buffer is its own parameters' (948,736 on stage 0,
    948,992 with the final norm and head on stage 1), in its gradients column and resident at every moment; the
    distributed optimizer over dp 2 halves the masters and moments alone."""
    def stages(**layout):
        estimate = estimate_training(LLAMA, TrainingOptions(batch=2, seq=32, precision="bf16-main-grad", fits=False,
                                                            layout=layout_for(pp=2, micro_batches=2, **layout)))
        return [(s.weights, s.gradients, s.optimizer, s.master_weights, s.peak, s.peak_phase)
                for s in estimate.training.device.stages]

    # stage 0 drains (2 microbatches, 2 in flight): its peak is the draining stage's moments since d3939e1 (held to
    # traces in fp32, bf16-mixed and bf16-pure; under bf16-main-grad the buffer beside them, not traced: the stage
    # trace runs no main_grad hook), 17,833,640 before
    assert stages() == [(1_897_472, 4 * 948_736, 8 * 948_736 + 4 * 10, 4 * 948_736, 18_273_960, "backward"),
                        (1_897_984, 4 * 948_992, 8 * 948_992 + 4 * 11, 4 * 948_992, 17_897_536, "backward")]
    assert [row[1:5] for row in stages(dp=2, zero="1")] == \
        [(3_794_944, 3_794_964, 1_897_472, 12_581_524),  # stage 0 draining: 12,141,204 before d3939e1
         (3_795_968, 3_795_990, 1_897_984, 12_203_562)]


@pytest.mark.parametrize("options, words", [
    (dict(layout=layout_for(dp=4, zero="fsdp")), "plain DDP or its distributed optimizer .* not FSDP2's shards"),
    (dict(layout=layout_for(dp=4, zero="2")), "not ZeRO-2"),
    (dict(layout=layout_for(dp=2, tp=2, zero="3")), "not ZeRO-3"),
    (dict(devices=4, zero="2"), "ZeRO-2 is not one: Megatron's DDP keeps the whole fp32 gradient buffer"),
    (dict(optimizer="lion"), "'lion' is not one"),
])
def test_what_megatron_does_not_run_is_refused_in_one_line(options, words):
    with pytest.raises(OptionError, match=words) as err:
        TrainingOptions(precision="bf16-main-grad", **options).check()
    assert "\n" not in str(err.value)


def test_trace_under_the_distributed_optimizer_names_megatron_not_deepspeed():
    """--trace under bf16-main-grad's ZeRO-1 is Megatron-LM's distributed optimizer, refused in its own words;
    bf16-master's ZeRO-1 is DeepSpeed's."""
    layout = layout_for(dp=2, zero="1")
    with pytest.raises(OptionError, match="Megatron-LM's distributed optimizer .* is not traced") as err:
        TrainingOptions(precision="bf16-main-grad", layout=layout, trace=True).check()
    assert "DeepSpeed" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(OptionError, match="DeepSpeed's ZeRO is not traced"):
        TrainingOptions(precision="bf16-master", layout=layout, trace=True).check()


def test_find_layouts_dp_bytes_are_megatrons_fp32_gradients_and_bf16_parameters():
    """The search's dp bytes on the cut (N parameters, dp 4): Megatron's DDP all-reduces the fp32 main_grad, 2·3/4 ×
    4N; its distributed optimizer reduce-scatters it and all-gathers the bf16 parameters, 3/4 × (4N + 2N) (were 2 B a
    gradient: 2·3/4 × 2N and 3/4 × (2N + 2N)); under accumulation once a step (the DDP's no_sync), not each
    micro-step."""
    import transformers as T

    from paramscope.cost.memory.training import training_answer
    from paramscope.cost.parallel.layout_comm import StepCommunication
    from paramscope.cost.parallel.layout_facts import read_facts
    from paramscope.cost.parallel.search_options import SearchOptions

    config = T.LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"})
    report, _, view = training_answer(config, TrainingOptions(batch=1, seq=32, fits=False))
    for zero, expected in (("0", -(-2 * 3 * 4 * N // 4)), ("1", -(-3 * (4 * N + 2 * N) // 4))):
        options = SearchOptions(devices=4, gpu="h100", seq=32, precision="bf16-main-grad", zero=zero)
        comm = StepCommunication(read_facts(report, view, options, 32))
        for steps in (1, 2):
            _, (term,) = comm.busiest(layout_for(dp=4, zero=zero, batch=2), 2 // steps, steps)
            assert term.bytes == expected
            assert term.what.startswith("Megatron's") and ("no_sync" in term.what) == (steps == 2)


def test_a_cp_rank_equals_its_trace_and_the_distributed_optimizer_shards_over_dp_times_cp():
    """cp 2 on the cut, 2 × 64 tokens: the closed form (the recipe at S / cp, the ring's kept copies) with the whole
    fp32 buffer resident equals the rank traced on torch's ring with MainGradOptimizer, phase by phase (was refused);
    beside dp 2 the distributed optimizer shards the masters and moments over dp × cp = 4 ranks (Megatron's
    data-parallel group with context parallel), the buffer whole."""
    from parallel_steps import cp_rank_beside_its_trace

    phases, traced = cp_rank_beside_its_trace(LLAMA, "bf16-main-grad")
    assert (phases["end of forward"], phases["start of backward"], phases["optimizer step"]) == \
        tuple(p.bytes for p in traced.phases) == (36_399_084, 36_526_044, 34_159_316)
    zero = estimate_training(LLAMA, TrainingOptions(batch=2, seq=64, precision="bf16-main-grad", fits=False,
                                                    layout=layout_for(dp=2, cp=2, zero="1"), derive_layout=False))
    device = zero.training.device
    assert (device.gradients, device.optimizer, device.master_weights) == \
        (4 * N, -(-(8 * N + 4 * 21) // 4), N)
    assert any("beside cp 2" in n and "dp × cp" in n for n in zero.notes)


def test_ep_ranks_hold_their_experts_buffer_and_shard_their_masters_over_the_expert_data_parallel_group():
    """A 2-layer Mixtral cut at dp 2 · ep 2 (was refused): the rank's 98,304 expert and 58,176 other parameters'
    bf16 weights and fp32 buffer whole; under Megatron's DDP its step equals the rank traced with torchtitan's
    ExpertParallel and MainGradOptimizer (forward and backward 496 B under it, as bf16-master's and bf16-pure's are
    on this cut; the one device's fp32 buffer swapped for the rank's: was 392,720 B over); under the distributed
    optimizer the experts' masters and moments stay whole (their expert-data-parallel group is dp / ep = 1 rank),
    the rest halved."""
    from paramscope.cost.memory.training import training_answer
    from parallel_steps import small_mixtral

    experts, rest = 98_304, 58_176
    _, estimate, _ = training_answer(small_mixtral(2), TrainingOptions(
        batch=2, seq=32, precision="bf16-main-grad", fits=False, trace=True, layout=layout_for(dp=2, ep=2)),
        use_cache=False)
    device = estimate.training.device
    assert (device.weights, device.gradients) == (2 * (experts + rest), 4 * (experts + rest))
    phases = {p.phase: p.bytes for p in device.phases}
    traced = {p.phase: p.bytes for p in device.traced.phases}
    assert phases["optimizer step"] == traced["optimizer step"] == 2_817_300
    assert (traced["forward"] - phases["forward"], traced["backward"] - phases["backward"]) == (496, 496)
    zero = estimate_training(small_mixtral(2), TrainingOptions(batch=2, seq=32, precision="bf16-main-grad",
                                                               fits=False, layout=layout_for(dp=2, ep=2, zero="1")))
    device = zero.training.device
    assert (device.weights, device.gradients, device.optimizer, device.master_weights) == (
        2 * (experts + rest), 4 * (experts + rest), 8 * experts + 4 * 4 + -(-(8 * rest + 4 * 17) // 2),
        4 * experts + 4 * rest // 2) == (312_960, 625_920, 1_019_186, 509_568)
    assert "expert-data-parallel group of 1 rank" in device.states_arithmetic
