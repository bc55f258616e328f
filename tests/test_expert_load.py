"""--expert-load F under --ep E (traced/expert_parallel.py's routes): the busiest expert-parallel rank, rank 0, receives
⌈F·S⌉ of its S = B·T·k balanced token-expert pairs, every rank sending it an even part; the rest of each rank's pairs
spread evenly over the other ranks. memory answers from that rank's step derived from traces (derived/, keyed by the
load; a load of 1 keeps the balanced key), and under --pp replays it stage by stage. On a 5-layer Mixtral cut the
derived figures equal the traced rank's to the byte."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.cost.traced.expert_parallel import busiest_pairs, routes, splits
from paramscope.errors import OptionError, UnsupportedError
from parallel_steps import small_mixtral, small_mixtral_phases, stage_gaps

MICRO, SEQ = 2, 32


def test_the_busiest_rank_receives_f_times_its_share_and_the_others_the_rest():
    # balanced (F = 1): today's splits, sent and received alike
    assert routes(10, 4, 1, 0) == (splits(10, 4), splits(10, 4)) == ([3, 3, 2, 2], [3, 3, 2, 2])
    # F = 1.5 over 4 ranks of 128 pairs each: rank 0 receives 192, 48 from every rank, each of which spreads its
    # other 80 over the 3 others (27, 27, 26): they receive 4·S − 192 = 320 between them, fewer than S each
    sent, received = routes(128, 4, 1.5, 0)
    assert (sent, received) == ([48, 27, 27, 26], [48, 48, 48, 48]) and sum(received) == busiest_pairs(128, 4, 1.5)
    assert [sum(routes(128, 4, 1.5, r)[1]) for r in (1, 2, 3)] == [108, 108, 104]
    # the decimal as written (1.1 × 10 = 11, not float's 11.000000000000002 → 12); capped at every pair, F = ep
    assert busiest_pairs(10, 2, 1.1) == 11 and busiest_pairs(7, 2, 2) == 14 and routes(7, 2, 2, 0)[0] == [7, 0]
    # a load of 1 is today's layout: the same words, and (estimate.check_expert_load) today's balanced answer
    assert ParallelLayout(dp=2, ep=2, expert_load=1.0).words() == ParallelLayout(dp=2, ep=2).words() == \
        "dp 2 = 2 devices; ep 2 over the data-parallel ranks"


@pytest.mark.parametrize("load, forward, backward", [(1.5, 7_578_160, 7_581_744), (2, 8_367_664, 8_387_120)])
def test_the_busiest_rank_derived_equals_its_trace(cache, load, forward, backward):
    """`--dp 2 --ep 2 --expert-load F`, 2 × 32 tokens, bf16-mixed: derived (traced at 4 layers, checked at 5) and
    traced (--trace: rank 0 of the real class with that routing) equal to the byte in forward and backward; the
    balanced closed form named beside, below it."""
    device, derived, traced = small_mixtral_phases(ParallelLayout(dp=2, ep=2, expert_load=load), SEQ, batch=MICRO)
    assert device.activations_from.startswith("derived")
    assert (derived["forward"], derived["backward"]) == (traced["forward"], traced["backward"]) == (forward, backward)
    # the step's moment: the states, and what the traced rank still holds there (estimate.held_at_step): 8 B a
    # token of ids and the int32 offsets of the 2 experts it holds in each of the 5 layers
    assert traced["optimizer step"] == derived["optimizer step"]
    assert any(n.startswith(f"expert load {load:g} (a convention") and "the others are not the peak" in n
               for n in device.notes)
    assert any(n.startswith("balanced routing (--expert-load 1") for n in device.notes)


def test_under_fsdp2_the_busiest_rank_derived_equals_its_trace(cache):
    """`--dp 2 --ep 2 --zero fsdp --expert-load 1.5` (torchtitan's composition: each layer's experts split over the
    ep ranks, their own FSDP2 unit over the dp / ep = 1 ranks holding them, then each layer and the root over dp),
    2 × 32 tokens, bf16-mixed: the rank derived from traces with FSDP2 and that routing equals rank 0 traced, in
    forward and backward; balanced routing's closed form (which under FSDP2 is above its traced rank) beside."""
    device, derived, traced = small_mixtral_phases(ParallelLayout(dp=2, ep=2, shard="fsdp", expert_load=1.5), SEQ,
                                                 batch=MICRO)
    assert device.activations_from.startswith("derived")
    assert (derived["forward"], derived["backward"]) == (traced["forward"], traced["backward"]) == \
        (7_379_120, 7_433_392)
    assert device.traced.resident["parameters"] == device.weights and device.weights == device.gradients
    assert any("ExpertParallel over ep 2 under FSDP2, rank 0 the busiest" in n for n in device.notes)
    assert any(n.startswith("balanced routing (--expert-load 1, the closed form") and "6,628,584 B" in n
               and "FSDP2's gathered root and layer units" in n for n in device.notes)


def test_beside_tensor_parallel_the_busiest_rank_derived_equals_its_trace(cache):
    """`--dp 2 --ep 2 --tp 2 --sp --expert-load 1.5`: rank 0 of the (ep, tp) mesh, its E/ep experts also cut over tp
    (torchtitan's ExpertTensorParallel), derived from traces with that routing, equals the rank traced (forward and
    backward, 2 × 32 tokens, bf16-mixed; the states the traced rank's)."""
    import torch
    import transformers

    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.cost.traced.step import StepSettings

    _, estimate, _ = training_answer(small_mixtral(), TrainingOptions(
        batch=MICRO, seq=SEQ, precision="bf16-mixed", fits=False,
        layout=ParallelLayout(dp=2, ep=2, tp=2, sp=True, expert_load=1.5)), use_cache=False)
    device = estimate.training.device
    with torch.device("meta"):
        module = transformers.MixtralForCausalLM(small_mixtral())
    traced = trace_parallel_training(module, StepSettings(batch=MICRO, seq=SEQ, precision="bf16-mixed"), dp=2, tp=2,
                                     sp=True, ep=2, load=1.5)
    derived = {p.phase: p.bytes for p in device.phases}
    measured = {p.phase: p.bytes for p in traced.phases}
    assert device.activations_from.startswith("derived")
    assert (derived["forward"], derived["backward"]) == (measured["forward"], measured["backward"]) == \
        (4_268_848, 4_195_504)
    assert (traced.resident["parameters"], traced.resident["optimizer states"]) == (device.weights, device.optimizer)
    assert any("ExpertParallel over ep 2 beside DTensor tensor parallel with sequence parallel, rank 0 the busiest"
               in n for n in device.notes)


def test_pipeline_stages_replay_the_busiest_rank(cache):
    """`--dp 2 --ep 2 --pp 3 --expert-load 1.5`, 3 microbatches of 2 × 32, 1F1B: each stage replayed from the busiest
    rank's derived recipe equals the stage traced with that routing (held, forward peak, first backward's peak);
    balanced, the same stages hold 2,969,648 / 1,971,232 / 624,656 B (test_pipeline_expert_parallel.py)."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer

    layout = ParallelLayout(dp=2, ep=2, pp=3, micro_batches=3, schedule="1f1b", expert_load=1.5)
    _, estimate, _ = training_answer(small_mixtral(), TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    gaps = stage_gaps(device.stages, device.traced)
    # a later backward (1F1B's steady state: one more forward, then the backward) equal too: the replay takes that
    # forward's peak with the gradients held where it is above the backward's (the middle and last stages here)
    assert gaps == [0, 0, 0]
    assert [r.replayed.held for r in device.stages] == [3_857_456, 2_563_104, 772_624]
    index = next(b for b in device.comm if b.name == "expert parallel's permute index")
    assert index.bytes == 3 * 2 * 8 * 192  # 3 in flight × 2 MoE layers × int64 × ⌈1.5 · 2·32·2⌉
    assert any("the busiest rank's: 1.5 × its balanced token-expert pairs" in n and "first and later backward" in n
               for n in estimate.notes)


@pytest.mark.parametrize("layout, why", [
    (dict(dp=2, ep=2, expert_load=2.5), "expert_load must be from 1 to ep 2"),
    (dict(dp=2, ep=2, expert_load=0.5), "expert_load must be from 1 to ep 2"),
    (dict(dp=2, expert_load=1.5), "expert_load 1.5 needs expert parallelism"),
])
def test_a_load_out_of_range_is_refused_in_one_line(layout, why):
    with pytest.raises(OptionError, match=why) as err:
        ParallelLayout(**layout).check()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("layout, experts, why", [
    (dict(dp=2, ep=2, shard="zero3", expert_load=1.5), True,
     "beside data parallel \\(ZeRO 0-2, or FSDP2, full or hybrid, over dp ranks ep divides\\), tensor parallel, "
     "context parallel and"),
    (dict(dp=2, ep=2, expert_load=2), False, "expert load 2: GPT2LMHeadModel has no routed experts"),
])
def test_a_load_the_derivation_does_not_take_is_refused_in_one_line(layout, experts, why):
    from types import SimpleNamespace

    from paramscope.cost.parallel.estimate import check_expert_load

    ctx = SimpleNamespace(layout=ParallelLayout(**layout), derive=True,
                          view=SimpleNamespace(class_name="MixtralForCausalLM" if experts else "GPT2LMHeadModel"))
    with pytest.raises(UnsupportedError, match=why) as err:
        check_expert_load(ctx, (SimpleNamespace(experts_split=experts),))
    assert "\n" not in str(err.value)
    assert check_expert_load(SimpleNamespace(layout=ParallelLayout(dp=2, ep=2)), ()) is False  # balanced: as today
    # beside cp and under hybrid sharding the busiest rank is derived (tests/test_context_expert_parallel.py,
    # tests/test_expert_hybrid_shard.py)
    for taken in (dict(ep=2, cp=2), dict(dp=2, ep=2, shard="hsdp", shard_group=2)):
        assert check_expert_load(SimpleNamespace(layout=ParallelLayout(**taken, expert_load=1.5), derive=True,
                                                 view=ctx.view), (SimpleNamespace(experts_split=True),)) is True
