"""Balanced expert parallel beside tensor parallel at pp 1 (`--dp 2 --ep 2 --tp 2`) on a MoE class without the closed
form on a tp shard: the rank of the (ep, tp) mesh derived from traces with both applied (torchtitan's
ExpertTensorParallel: each rank's E/ep experts also cut over tp), the key the pipeline's stages replay, equal to that
rank traced (--trace) on the 5-layer Mixtral cut."""

from __future__ import annotations

from paramscope.cost.parallel.layout import ParallelLayout
from parallel_steps import small_mixtral_phases

MICRO, SEQ = 2, 32


def test_the_balanced_expert_tensor_rank_derived_equals_its_trace(cache):
    """2 × 32 tokens, bf16-mixed, no sp: forward and backward derived = traced to the byte (the closed form refuses
    Mixtral on a tp shard; it answered only under --expert-load or --pp)."""
    device, derived, traced = small_mixtral_phases(ParallelLayout(dp=2, ep=2, tp=2), SEQ, batch=MICRO)
    assert device.activations_from.startswith("derived")
    assert (derived["forward"], derived["backward"]) == (traced["forward"], traced["backward"]) == \
        (3_970_112, 3_964_976)
    # the optimizer step too: what the traced rank still holds there, the token ids (8·B·S = 512 B, aliased by its
    # DTensor input) and each layer's offsets of the 2 experts it holds (5 × 2 × 4 B = 40 B), counted (held_at_step)
    assert derived["optimizer step"] == traced["optimizer step"] == 2_817_832
    step = next(p for p in device.phases if p.phase == "optimizer step")
    assert "the token ids 8·B·S = 512 B" in step.arithmetic and "5 × 2 experts × 4 B = 40 B" in step.arithmetic
    assert (device.traced.resident["parameters"], device.traced.resident["optimizer states"]) == \
        (device.weights, device.optimizer)
    assert any("(torchtitan's ExpertParallel over ep 2 beside DTensor tensor parallel)" in n for n in device.notes)
    assert any(n.startswith("check: rank 0's step traced on torch's fake process group (torchtitan's ExpertParallel, "
                            "DTensor, MemTracker): peak 3,970,112 B in forward") for n in device.notes)
