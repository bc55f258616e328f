"""Context parallelism beside expert parallelism (issue 28, --cp with --ep), laid out as torchtitan lays it out
(parallel_dims.py, ETP = tp): the ep ranks borrow every cp rank and some dp ones (ep = dp_shard_in_ep × cp), torch's
ring runs over the cp ranks, FSDP2 over the flattened dp × cp ranks (dp_shard_cp), the experts' own FSDP2 unit over
the dp_shard_mod_ep ranks holding the same experts (one here: dp × cp = ep). One rank traced on torch's fake process
group; the rank derived from such traces (derived/, keyed by the layout) equal to it to the byte on a Mixtral cut.
At full size (not run here): mixtral-8x7b --cp 2 --ep 2 --seq 4096 --training --trace, derived 386,759,370,900 B
a device, the traced rank the same to the byte."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout, layout_for
from paramscope.errors import ParamscopeError
from parallel_steps import small_mixtral_phases


@pytest.mark.parametrize("layout, phases", [
    (ParallelLayout(cp=2, ep=2), (5_565_248, 5_605_296, 5_471_784)),
    (ParallelLayout(dp=2, cp=2, ep=4, shard="fsdp"), (3_469_144, 3_546_588, 2_351_124)),
    (ParallelLayout(cp=2, ep=2, tp=2, sp=True), (2_977_712, 2_974_064, 2_820_392)),
], ids=["cp2 ep2", "fsdp dp2 cp2 ep4", "cp2 ep2 tp2 sp"])
def test_the_ring_beside_ep_derived_equals_its_trace(cache, layout, phases):
    """2 × 32 tokens, bf16-mixed: forward, backward and the optimizer step's moment, derived (traced at 4 layers,
    checked at 5) and traced (--trace: rank 0 of the real class) equal to the byte. Under FSDP2 the rank holds a
    quarter of the dense states and one whole expert of four in each layer; beside tp (torchtitan's ETP = tp) its two
    experts cut over tp too, on the (ep, tp) mesh, the ep dimension the flattened dp × cp one."""
    device, derived, traced = small_mixtral_phases(layout, 32)
    assert device.activations_from.startswith("derived")
    assert tuple(derived.values()) == tuple(traced.values()) == phases
    notes = " ".join(device.notes)
    assert f"torchtitan's ExpertParallel over ep {layout.ep} = dp × cp ranks" in notes
    assert "torch's context_parallel ring attention" in notes and "equal to the byte" in notes
    assert ("FSDP2 over dp × cp = 4 ranks" in notes) == (layout.shard == "fsdp")


def test_what_the_trace_and_the_derivation_take_and_refuse():
    from paramscope.cost.parallel.estimate import check_ring_beside_experts
    from paramscope.cost.parallel.layout_derivation import derivation_key, derivation_words
    from paramscope.cost.parallel.trace_reach import untraced_by_layout
    from paramscope.cost.traced.parallel import check_layout

    assert check_layout(1, "none", 1, False, 0, 2, 2).world == 2
    assert check_layout(2, "fsdp", 1, False, 0, 4, 2).world == 4
    assert check_layout(1, "none", 2, True, 0, 2, 2).world == 4
    for args in ((2, "none", 1, False, 0, 2, 2), (1, "fsdp", 2, False, 0, 2, 2)):  # ep ≠ dp × cp; tp under FSDP2
        with pytest.raises(ParamscopeError, match="ep == dp × cp: torchtitan's dp_shard_in_ep × cp"):
            check_layout(*args)
    traced = (layout_for(cp=2, ep=2), layout_for(dp=2, cp=2, ep=2), layout_for(dp=2, cp=2, ep=4, zero="fsdp"),
              layout_for(cp=2, ep=2, tp=2, sp=True))
    assert [untraced_by_layout(layout) for layout in traced] == [None] * 4
    refused = {"cp must divide ep": layout_for(dp=2, cp=4, ep=2),
               "and tp 2 under FSDP2": layout_for(dp=2, cp=2, ep=4, tp=2, zero="fsdp"),
               "also shard each expert over the 2 ranks": layout_for(dp=2, cp=2, ep=2, zero="fsdp"),
               "under FSDP2 hybrid": layout_for(dp=4, cp=2, ep=2, zero="hybrid_shard", shard_group=4)}
    for words, layout in refused.items():
        with pytest.raises(ParamscopeError, match=words) as refusal:
            check_ring_beside_experts(layout)
        assert "\n" not in str(refusal.value) and untraced_by_layout(layout) is not None
        assert derivation_key(layout, 2, 8) is None  # memory refuses first: the search spends no derivation
    key = derivation_key(layout_for(dp=2, cp=2, ep=4, zero="fsdp", batch=2), 2, 8)
    assert derivation_words(key) == "cp 2, FSDP2 over dp × cp = 4, ep 4 over dp × cp, batch 2 and up"
    # no routed experts to cut: the ring's own rank, today's key
    assert derivation_key(layout_for(cp=2, ep=2), 2, 0) == derivation_key(layout_for(cp=2), 2, 0)
