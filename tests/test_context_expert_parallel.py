"""Context parallelism beside expert parallelism (issue 28, --cp with --ep), laid out as torchtitan lays it out
(parallel_dims.py, ETP = tp): the ep ranks borrow every cp rank and some dp ones (ep = dp_shard_in_ep × cp), torch's
ring runs over the cp ranks, FSDP2 over the flattened dp × cp ranks (dp_shard_cp), the experts' own FSDP2 unit over
the dp_shard_mod_ep = dp × cp / ep ranks holding the same experts; under --expert-load rank 0, the busiest. One rank
traced on torch's fake process group; the rank derived from such traces (derived/, keyed by the layout) equal to it
to the byte on a Mixtral cut. At full size (not run here), mixtral-8x7b --seq 4096 --training --trace, derived and
traced equal to the byte: --cp 2 --ep 2 386,759,370,900 B a device; with --expert-load 1.5 387,061,377,172 B."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout, layout_for
from paramscope.errors import ParamscopeError
from parallel_steps import small_mixtral_phases


@pytest.mark.parametrize("layout, phases", [
    (ParallelLayout(cp=2, ep=2), (5_565_248, 5_605_296, 5_471_784)),
    (ParallelLayout(dp=2, cp=2, ep=4, shard="fsdp"), (3_469_144, 3_546_588, 2_351_124)),
    (ParallelLayout(cp=2, ep=2, tp=2, sp=True), (2_977_712, 2_974_064, 2_820_392)),
    (ParallelLayout(cp=2, ep=2, expert_load=1.5), (5_935_168, 5_991_600, 5_471_784)),
    (ParallelLayout(dp=4, cp=2, ep=2, shard="fsdp"), (2_885_456, 3_027_408, 1_178_280)),
], ids=["cp2 ep2", "fsdp dp2 cp2 ep4", "cp2 ep2 tp2 sp", "cp2 ep2 load 1.5", "fsdp dp4 cp2 ep2"])
def test_the_ring_beside_ep_derived_equals_its_trace(cache, layout, phases):
    """2 × 32 tokens, bf16-mixed: forward, backward and the optimizer step's moment, derived (traced at 4 layers,
    checked at 5) and traced (--trace: rank 0 of the real class) equal to the byte. Under FSDP2 the rank holds a
    quarter of the dense states and one whole expert of four in each layer; beside tp (torchtitan's ETP = tp) its two
    experts cut over tp too, on the (ep, tp) mesh, the ep dimension the flattened dp × cp one. Under a load of 1.5
    rank 0, the busiest, receives ⌈1.5·S⌉ of its S = B·(T / cp)·k pairs (96 of 64: the forward 369,920 B above the
    balanced rank's). FSDP2 over dp × cp = 8 ranks, ep 2: torchtitan's (dp_shard_mod_ep 4, dp_shard_in_ep 1, cp 2)
    mesh, each rank's two experts their own unit over the 4 ranks holding them (on dim 1: more ranks than experts),
    the rest over all 8: 294,496 B of weights, as --dp 8 --ep 2 --zero fsdp holds."""
    device, derived, traced = small_mixtral_phases(layout, 32)
    assert device.activations_from.startswith("derived")
    assert tuple(derived.values()) == tuple(traced.values()) == phases
    assert device.traced.resident["parameters"] == device.weights
    notes = " ".join(device.notes)
    ranks = layout.dp * layout.cp
    assert f"torchtitan's ExpertParallel over ep {layout.ep} = " + (
        "dp × cp ranks" if layout.shard == "none" or ranks == layout.ep else
        f"dp_shard_in_ep × cp ranks (the experts' own FSDP2 unit over the dp × cp / ep = {ranks // layout.ep} "
        "ranks holding them)") in notes
    assert "torch's context_parallel ring attention" in notes and "equal to the byte" in notes
    assert (f"FSDP2 over dp × cp = {ranks} ranks" in notes) == (layout.shard == "fsdp")
    assert ("rank 0, the busiest" in notes) == (layout.expert_load != 1)
    if layout.expert_load != 1:
        assert "⌈1.5·S⌉ = 96 of S = B·T·k = 64 token-expert pairs" in notes


def test_what_the_trace_and_the_derivation_take_and_refuse():
    from paramscope.cost.parallel.estimate import check_ring_beside_experts
    from paramscope.cost.parallel.layout_derivation import derivation_key, derivation_words
    from paramscope.cost.parallel.trace_reach import untraced_by_layout
    from paramscope.cost.traced.parallel import check_layout

    assert check_layout(1, "none", 1, False, 0, 2, 2).world == 2
    assert check_layout(2, "fsdp", 1, False, 0, 4, 2).world == 4
    assert check_layout(1, "none", 2, True, 0, 2, 2).world == 4
    # FSDP2 over more dp × cp ranks than ep: torchtitan's dp_shard_mod_ep = dp × cp / ep shards each rank's experts
    assert check_layout(4, "fsdp", 1, False, 0, 2, 2).describe() == (
        "dp 4 (FSDP2) × cp 2, ep 2 over each 2 dp × cp ranks, the dp × cp / ep = 4 holding the same experts sharding "
        "them (FSDP2)")
    # ep ≠ dp × cp without FSDP2; tp under FSDP2; cp not dividing ep
    for args in ((2, "none", 1, False, 0, 2, 2), (1, "fsdp", 2, False, 0, 2, 2), (2, "fsdp", 1, False, 0, 2, 4)):
        with pytest.raises(ParamscopeError, match="torchtitan's dp_shard_in_ep × cp: cp dividing ep"):
            check_layout(*args)
    traced = (layout_for(cp=2, ep=2), layout_for(dp=2, cp=2, ep=2), layout_for(dp=2, cp=2, ep=4, zero="fsdp"),
              layout_for(cp=2, ep=2, tp=2, sp=True), layout_for(dp=2, cp=2, ep=2, zero="fsdp"),
              layout_for(cp=2, ep=2, expert_load=1.5))
    assert [untraced_by_layout(layout) for layout in traced] == [None] * 6
    refused = {"cp must divide ep": layout_for(dp=2, cp=4, ep=2),
               "and tp 2 under FSDP2": layout_for(dp=2, cp=2, ep=4, tp=2, zero="fsdp"),
               "under hybrid sharding over shard groups of 2": layout_for(dp=4, cp=2, ep=4, zero="hybrid_shard",
                                                                          shard_group=2)}
    for words, layout in refused.items():
        with pytest.raises(ParamscopeError, match=words) as refusal:
            check_ring_beside_experts(layout)
        assert "\n" not in str(refusal.value) and untraced_by_layout(layout) is not None
        assert derivation_key(layout, 2, 8) is None  # memory refuses first: the search spends no derivation
    key = derivation_key(layout_for(dp=2, cp=2, ep=4, zero="fsdp", batch=2, fsdp_mixed_precision="autocast"), 2, 8)
    assert derivation_words(key) == "cp 2, FSDP2 over dp × cp = 4, ep 4 over dp × cp, batch 2 and up"
    # FSDP2 over more ranks than ep beside cp, answered now: the search's key follows memory's (a derivation of its own)
    assert derivation_key(layout_for(dp=2, cp=2, ep=2, zero="fsdp", batch=2), 2, 8) not in (None, key)
    # no routed experts to cut: the ring's own rank, today's key
    assert derivation_key(layout_for(cp=2, ep=2), 2, 0) == derivation_key(layout_for(cp=2), 2, 0)
