"""`flops --ep E --expert-load F`: the busiest expert-parallel rank's FLOPs (parallel/flops.py). Its routed experts
receive ⌈F·S⌉ of its balanced S = B·T·k token-expert pairs a MoE layer (and microbatch), so each routed expert
weight's FLOPs are its balanced ones × ⌈F·S⌉ / S; the layout's step time is that rank's. Checked against
FlopCounterMode on rank 0 of the real class traced with that routing (traced/expert_parallel.py's routes) on a fake
process group."""

from __future__ import annotations

import json

import pytest

from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
from paramscope.cost.parallel.layout import layout_for
from parallel_steps import small_mixtral

BATCH, SEQ = 2, 32
# the cut's expert FLOPs a layer and pair: 2 × (gate, up, down) × hidden 64 × intermediate 128
PER_PAIR = 2 * 3 * 64 * 128


def _device(load, dp=2, **layout):
    lay = layout_for(batch=BATCH, dp=dp, ep=2, expert_load=load, **layout)
    return estimate_flops(small_mixtral(2), FlopOptions(batch=BATCH, seq=SEQ, training=True, layout=lay,
                                                             devices=lay.devices)).device


@pytest.fixture(scope="module")
def mixtral_meta():
    import torch
    import transformers

    with torch.device("meta"):
        return transformers.MixtralForCausalLM(small_mixtral(2))


@pytest.mark.parametrize("load, pairs, forward", [(1, 128, 18_939_904), (1.3, 167, 22_773_760),
                                                  (1.5, 192, 25_231_360), (2, 256, 31_522_816)])
def test_flopcountermode_on_the_busiest_rank_equals_the_analytic_device(mixtral_meta, load, pairs, forward):
    """`--dp 2 --ep 2 --expert-load F`, 2 × 32 tokens, top-2: S = 128 pairs a layer; ⌈1.3·128⌉ = 167 (rounded up)."""
    from paramscope.cost.traced.parallel_flops import count_rank_flops
    from paramscope.cost.traced.step import StepSettings

    counted = count_rank_flops(mixtral_meta, StepSettings(batch=BATCH, seq=SEQ, precision="fp32"), ep=2, load=load)
    device = _device(load)
    assert counted.forward == device.forward == forward
    assert counted.backward == device.backward + device.recompute  # as counted: flash's scores recomputed
    # the load's arithmetic: 2 layers × the pairs beyond S × each pair's expert FLOPs
    assert device.forward - 18_939_904 == device.loaded == 2 * (pairs - 128) * PER_PAIR
    assert device.pairs == ((pairs, 128) if load != 1 else None)
    # the replica's sum stays at balanced routing (the load moves pairs between the ep ranks)
    assert device.devices_sum == device.replica == 3 * 18_939_904


def test_pipeline_stages_round_each_microbatch():
    """`--pp 2` over 2 microbatches of 1 × 32, a layer a stage: S = 64 pairs a microbatch, ⌈1.3·64⌉ = 84, so the
    layer runs 2 × 84 = 168 pairs (not ⌈1.3·128⌉ = 167), on each stage; the busiest stage is the head's."""
    balanced, loaded = _device(1, pp=2), _device(1.3, pp=2)
    assert loaded.pairs == (84, 64)
    assert [s.forward - b.forward for s, b in zip(loaded.stages, balanced.stages)] == [2 * 20 * PER_PAIR] * 2
    assert loaded.stage == balanced.stage == 1 and loaded.loaded == 2 * 20 * PER_PAIR
    assert loaded.forward == balanced.forward + loaded.loaded


@pytest.mark.parametrize("sp", [False, True])
def test_beside_tensor_parallel_each_tp_rank_runs_its_slice_of_the_pairs(mixtral_meta, sp):
    """`--dp 2 --ep 2 --tp 2 --expert-load 1.5`: rank 0 of the (ep, tp) mesh (traced/expert_parallel.py: its E/ep
    experts also cut over tp, as torchtitan's ExpertTensorParallel) runs 192 pairs through half of each expert's
    width: 2 layers × 64 more pairs × PER_PAIR / 2 above its balanced 9,502,720."""
    from paramscope.cost.traced.parallel_flops import count_rank_flops
    from paramscope.cost.traced.step import StepSettings

    counted = count_rank_flops(mixtral_meta, StepSettings(batch=BATCH, seq=SEQ, precision="fp32"), tp=2, sp=sp,
                               ep=2, load=1.5)
    device = _device(1.5, tp=2, sp=sp)
    assert counted.forward == device.forward == 9_502_720 + 2 * 64 * PER_PAIR // 2
    assert counted.backward == device.backward + device.recompute


def test_beside_context_parallel_the_busiest_rank_routes_its_own_tokens(mixtral_meta):
    """`--cp 2 --ep 2 --expert-load 1.5` (memory's composition: torchtitan's ep = dp_shard_in_ep × cp): rank 0 holds
    S / cp = 16 tokens of each sequence, S = 2 × 16 × 2 = 64 pairs a layer, ⌈1.5·64⌉ = 96 at its experts. Traced on
    rank 0 under torch's ring (FlopCounterMode over each op's local shapes): every matmul and the experts' grouped
    matmuls equal the analytic device, forward and backward; the ring's attention blocks are counted apart (its
    diagonal block whole: 3/4 of the cp convention's scores here, as for any cp layout)."""
    from torch.utils.flop_counter import FlopCounterMode

    from paramscope.cost.traced.parallel import check_layout, parallel_copy, rank_tokens
    from paramscope.cost.traced.parallel_flops import local_formulas
    from paramscope.cost.traced.step import StepSettings, loss_of, running, training_inputs

    settings = StepSettings(batch=BATCH, seq=SEQ, precision="fp32", grad_checkpointing=False)
    layout = check_layout(1, "none", 1, False, 0, 2, 2, 1.5)
    with parallel_copy(mixtral_meta, settings, layout) as (model, _, _):
        model.train(True)
        inputs = training_inputs(model, rank_tokens(settings, layout))
        with running(model):
            forward = FlopCounterMode(display=False, depth=None, custom_mapping=local_formulas())
            with forward:
                loss = loss_of(model(**inputs))
            backward = FlopCounterMode(display=False, depth=None, custom_mapping=local_formulas())
            with backward:
                loss.backward()
    traced = [{str(op).split(".")[-1]: flops for op, flops in counter.get_flop_counts()["Global"].items()}
              for counter in (forward, backward)]
    device = _device(1.5, cp=2, dp=1)
    roles = {t.role: t.flops for t in device.terms}
    assert device.pairs == (96, 64) and device.loaded == 2 * (96 - 64) * PER_PAIR
    assert traced[0]["grouped_mm_fallback"] == roles["moe.experts"] == 2 * 96 * PER_PAIR
    assert traced[0]["mm"] == device.forward - roles["moe.experts"] - roles["attention.scores"] == 2_654_208
    assert traced[1]["grouped_mm_fallback_backward"] == 2 * roles["moe.experts"] and traced[1]["mm"] == 2 * 2_654_208
    assert traced[0]["_scaled_dot_product_flash_attention_for_cpu"] * 4 == roles["attention.scores"] * 3
    assert any("T = S / 2: the rank's own tokens under context parallel" in c for c in device.conventions)


def test_cli_mixtral_8x7b(capsys):
    """mixtral-8x7b `--dp 8 --ep 8 --seq 1024`: 23,089,744,183,296 expert FLOPs a forward of 26,658,862,006,272;
    S = 2,048 pairs a layer, so at F 1.5 the busiest rank runs 3,072 and its experts 1.5 × theirs."""
    from paramscope.cli import main

    args = ["flops", "mixtral-8x7b", "--training", "--dp", "8", "--ep", "8", "--seq", "1024", "--gpu", "h100",
            "--step-seconds", "2"]
    forwards = {}
    for load in ("1", "1.5", "2"):
        assert main([*args, "--expert-load", load, "--json"]) == 0
        flops = json.loads(capsys.readouterr().out)["flops"]
        device = flops["device"]
        forwards[load] = device["forward"]
        assert device["step"] == 3 * device["forward"]
        assert device["mfu"] == pytest.approx(device["step"] / (2 * 989.4e12))
        assert flops["mfu"] == pytest.approx(8 * 79_976_586_018_816 / (2 * 989.4e12 * 8))  # the layout's: unchanged
    assert forwards == {"1": 26_658_862_006_272, "1.5": 38_203_734_097_920, "2": 49_748_606_189_568}
    assert forwards["1.5"] - forwards["1"] == 23_089_744_183_296 // 2
    # --zero as memory takes it (FSDP2, the layout memory answers under --expert-load too): named, no FLOP changes
    assert main([*args, "--expert-load", "1.5", "--zero", "fsdp", "--json"]) == 0
    device = json.loads(capsys.readouterr().out)["flops"]["device"]
    assert device["forward"] == forwards["1.5"] and device["layout"]["words"].startswith(
        "dp 8 (FSDP2, its MixedPrecisionPolicy) = 8 devices")
    assert main([*args, "--expert-load", "1.5", "--width", "200"]) == 0
    text = capsys.readouterr().out
    assert "⌈1.5·S⌉ = 3,072 of its balanced S = 2,048 token-expert pairs a layer" in text
    assert "and so is the layout's step time" in text and "at balanced routing" in text
