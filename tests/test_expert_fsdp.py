"""Expert parallel under FSDP2, laid out as torchtitan lays it out (ETP = tp): the (dp / ep, ep, tp) mesh (its
dp_shard_mod_ep × dp_shard_in_ep × tp), each layer's experts split over the ep ranks of a row (beside tp also cut
over tp on the (ep, tp) mesh, its ExpertTensorParallel), then their own FSDP2 unit over the dp / ep ranks holding
the same experts, every layer and the root over all dp ranks. memory answers the rank from its step derived from
traces with that mesh (balanced, or the busiest rank under --expert-load); on the 5-layer Mixtral cut it equals
rank 0 traced (--trace) to the byte: FSDP2 over more ranks than ep, and FSDP2 beside tp."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout, layout_for
from parallel_steps import small_mixtral_phases

MICRO, SEQ = 2, 32


def test_the_trace_takes_fsdp2_over_more_ranks_than_ep_and_ddp_still_needs_ep_equal_to_dp():
    from paramscope.cost.parallel.trace_reach import untraced_by_layout
    from paramscope.cost.traced.parallel import check_layout
    from paramscope.errors import UnsupportedError

    layout = check_layout(4, "fsdp", 1, False, 0, 2)
    assert layout.describe() == ("dp 4 (FSDP2), ep 2 over each 2 dp ranks, the dp / ep = 2 holding the same experts "
                                 "sharding them (FSDP2)")
    assert untraced_by_layout(layout_for(dp=4, ep=2, zero="fsdp")) is None
    assert check_layout(2, "fsdp", 2, True, 0, 2).world == 4  # beside tp too (the (ep, tp) mesh, ETP = tp)
    assert untraced_by_layout(layout_for(dp=2, ep=2, tp=2, zero="fsdp")) is None
    with pytest.raises(UnsupportedError, match="got ep 2, dp 4, tp 1, shard none"):
        check_layout(4, "none", 1, False, 0, 2)  # DDP's replicas beyond ep run the same step: traced at dp = ep
    assert untraced_by_layout(layout_for(dp=4, ep=2)) is not None


@pytest.mark.parametrize("load, forward, backward", [(1, 5_023_088, 4_864_880), (1.5, 5_812_592, 5_670_256)])
def test_fsdp2_over_twice_the_ep_ranks_derived_equals_its_trace(cache, load, forward, backward):
    """`--dp 4 --ep 2 --zero fsdp [--expert-load 1.5]`, 2 × 32 tokens, bf16-mixed: forward, backward and the
    optimizer step derived (traced at 4 layers, checked at 5) equal rank 0 traced; its states are the analytic
    ones (the experts / ep, then / (dp / ep) = 2; the rest / dp = 4)."""
    device, derived, traced = small_mixtral_phases(ParallelLayout(dp=4, ep=2, shard="fsdp", expert_load=load), SEQ,
                                                   batch=MICRO)
    assert device.activations_from.startswith("derived")
    assert derived == traced and (traced["forward"], traced["backward"]) == (forward, backward)
    assert traced["optimizer step"] == 2_351_144
    assert device.traced.resident["parameters"] == device.weights == 587_712
    assert device.traced.resident["optimizer states"] == device.optimizer
    assert any("ExpertParallel over ep 2 under FSDP2 over dp 4 (the experts' own unit over the dp / ep = 2 ranks "
               "holding them)" in n for n in device.notes)


def test_fsdp2_beside_expert_tensor_parallel_derived_equals_its_trace(cache):
    """`--dp 2 --ep 2 --tp 2 --zero fsdp` (torchtitan's ExpertTensorParallel under FSDP2: each rank's E/ep experts also
    cut over tp on the (ep, tp) mesh, their own FSDP2 unit over the dp / ep = 1 ranks holding them), 2 × 32 tokens,
    bf16-mixed: derived = rank 0 traced in every phase; at the step the token ids its DTensor input aliases (8·B·S)
    and each layer's offsets of its 2 experts, counted."""
    device, derived, traced = small_mixtral_phases(ParallelLayout(dp=2, ep=2, tp=2, shard="fsdp"), SEQ, batch=MICRO)
    assert device.activations_from.startswith("derived")
    assert derived == traced == {"forward": 3_843_248, "backward": 3_780_272, "optimizer step": 2_359_592}
    assert device.traced.resident["parameters"] == device.weights == 589_696
    step = next(p for p in device.phases if p.phase == "optimizer step")
    assert "the token ids 8·B·S = 512 B" in step.arithmetic and "5 × 2 experts × 4 B = 40 B" in step.arithmetic
    assert any("ExpertParallel over ep 2 under FSDP2 beside DTensor tensor parallel)" in n for n in device.notes)


def test_more_fsdp2_ranks_than_a_rank_holds_experts_cut_them_on_dim_1(cache):
    """`--dp 8 --ep 2 --zero fsdp`: dp / ep = 4 ranks share each rank's 2 experts, more than it holds, so torchtitan
    shards them on dim 1 (Shard(1): [2, ⌈2I / 4⌉, h], not dim 0's one expert and padding); the analytic states
    (states.py) and the derived step equal rank 0 traced."""
    device, derived, traced = small_mixtral_phases(ParallelLayout(dp=8, ep=2, shard="fsdp"), SEQ, batch=MICRO)
    assert derived == traced == {"forward": 4_144_464, "backward": 4_165_968, "optimizer step": 1_178_280}
    assert device.traced.resident["parameters"] == device.weights == 294_496
    assert "cut along their second dimension" in device.states_arithmetic
