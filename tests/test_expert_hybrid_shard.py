"""Expert parallel beside FSDP2's hybrid sharding (issue 28, --ep with --zero hybrid_shard), laid out as torchtitan lays
it out (parallel_dims.py: dp_replicate in front of (dp_shard_mod_ep, dp_shard_in_ep, cp, tp), ep = dp_shard_in_ep ×
cp drawn from a shard group, its (dp_shard × cp) % ep == 0): every FSDP2 unit on a (dp_replicate, shard ranks)
mesh, the experts' own unit on (dp_replicate, dp_shard_mod_ep), on dim 1 where its shard dimension outnumbers a
rank's experts (torchtitan's apply_fsdp: edp_mesh["efsdp"].size() × ep > E, the replicas not counted). The rank is
derived as FSDP2's over its shard group (the replicas' all-reduce runs in place), and --trace runs the real HSDP
meshes on torch's fake process group: equal to the byte on the 5-layer Mixtral cut. At full size (not run here):
mixtral-8x7b --dp 8 --ep 2 --zero hybrid_shard --shard-group 4 --seq 1024 --training --trace, derived and traced
equal (docs/commands.md)."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout, layout_for
from paramscope.errors import ParamscopeError
from parallel_steps import small_mixtral_phases


def test_what_hybrid_sharding_beside_ep_takes_and_refuses():
    from paramscope.cost.parallel.estimate import check_hybrid_experts, check_ring_beside_experts
    from paramscope.cost.parallel.trace_reach import hybrid_replicas, untraced_by_layout
    from paramscope.cost.traced.parallel import check_layout

    taken = (layout_for(dp=4, ep=2, zero="hybrid_shard", shard_group=2),
             layout_for(dp=8, ep=2, zero="hybrid_shard", shard_group=4),
             layout_for(dp=4, ep=2, tp=2, zero="hybrid_shard", shard_group=2),
             layout_for(dp=4, cp=2, ep=2, zero="hybrid_shard", shard_group=4))
    assert [untraced_by_layout(layout) for layout in taken] == [None] * 4
    assert [hybrid_replicas(layout, True) for layout in taken] == [2, 2, 2, 2]
    assert hybrid_replicas(taken[0], False) == 1  # no routed experts: HSDP's rank is FSDP2's over its group
    check_ring_beside_experts(taken[3])
    assert check_layout(2, "fsdp", 1, False, 0, 2, replicate=2).world == 4
    with pytest.raises(ParamscopeError, match="replicates FSDP2's shard groups"):
        check_layout(2, "none", 1, False, 0, 2, replicate=2)
    # ep must divide a shard group (torchtitan draws the ep ranks from it): one line each, --trace refuses too
    apart = layout_for(dp=8, ep=4, zero="hybrid_shard", shard_group=2)
    with pytest.raises(ParamscopeError, match="ep 4 beside hybrid sharding over shard groups of 2 ranks") as refusal:
        check_hybrid_experts(apart, True)
    assert "\n" not in str(refusal.value) and untraced_by_layout(apart) is not None
    ring = layout_for(dp=4, cp=2, ep=4, zero="hybrid_shard", shard_group=2)
    with pytest.raises(ParamscopeError, match="under hybrid sharding over shard groups of 2 ranks"):
        check_ring_beside_experts(ring)
    assert untraced_by_layout(ring) is not None



def test_hybrid_shard_replicas_trace_as_fsdp2_over_the_group_without_experts():
    """Without ep, HSDP's rank holds what FSDP2's over its shard group holds (the all-reduce over dp_replicate runs in
    place on the reduce-scattered gradient): why HSDP without experts is traced as FSDP2 over its group."""
    from paramscope.build import build_class_on_meta
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.cost.traced.step import StepSettings
    from parallel_steps import small_mixtral
    import transformers as T

    module = build_class_on_meta(T.MixtralForCausalLM, small_mixtral())
    settings = StepSettings(batch=2, seq=32, precision="bf16-mixed", optimizer="adamw", attention="sdpa")
    full, hybrid = (trace_parallel_training(module, settings, dp=2, shard="fsdp", replicate=r) for r in (1, 2))
    assert [(p.phase, p.bytes) for p in hybrid.phases] == [(p.phase, p.bytes) for p in full.phases] == [
        ("forward", 7_093_472), ("backward", 7_493_336), ("optimizer step", 4_702_032)]
    assert any("hybrid sharding (HSDP, torchtitan's dp_replicate 2" in n for n in hybrid.notes)


@pytest.mark.parametrize("layout, phases", [
    (ParallelLayout(dp=8, ep=2, shard="hsdp", shard_group=4), (5_023_088, 4_864_880, 2_351_144)),
    (ParallelLayout(dp=4, cp=2, ep=2, shard="hsdp", shard_group=4), (3_764_080, 3_709_424, 2_351_144)),
], ids=["dp8 hsdp4 ep2", "dp4 cp2 hsdp4 ep2"])
def test_hybrid_shard_beside_ep_derived_equals_its_trace(cache, layout, phases):
    """2 × 32 tokens, bf16-mixed: forward, backward and the optimizer step derived (as FSDP2 over the group of 4,
    traced at 4 layers, checked at 5) equal rank 0 traced on the (dp_replicate 2, ...) meshes, 587,712 B of weights
    (the experts over ep 2, then over the group's 2 dp_shard_mod_ep ranks, on dim 0: 2 ranks, 2 experts). dp 8 in
    groups of 4: --dp 4 --ep 2 --zero fsdp's figures (tests/test_expert_fsdp.py). Beside cp 2 the ep ranks are
    dp_shard_in_ep 1 × cp 2, the ring over cp."""
    device, derived, traced = small_mixtral_phases(layout, 32)
    assert device.activations_from.startswith("derived")
    assert tuple(derived.values()) == tuple(traced.values()) == phases
    assert device.traced.resident["parameters"] == device.weights == 587_712
    assert any("hybrid sharding: traced as FSDP2 over the shard group of 4, which its 2 replicas run alike" in n
               for n in device.notes)
    assert any("hybrid sharding (HSDP, torchtitan's dp_replicate 2" in n for n in device.traced.notes)
