"""find-layout's data-parallel bytes under DeepSpeed's engine (layout_comm.py): ZeRO-0 and ZeRO-1 reduce once a step,
at the accumulation boundary (engine.py allreduce_gradients: "Communicate only at gradient accumulation
boundaries"), ZeRO-2 every micro-step; beside a pipeline, bf16-master's BF16_Optimizer also all-gathers the updated
bf16 parameters after its partitioned step (bf16_optimizer.py update_lp_params → all_gather_dp_groups)."""

from __future__ import annotations

from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.parallel.layout_comm import deepspeed_zero0_dp_terms, dp_terms

N = 1_897_728  # a cut's parameters
G = 2 * N  # their bf16 bytes


def test_bf16_optimizer_beside_a_pipeline_all_reduces_then_gathers_the_parameters():
    (term,) = deepspeed_zero0_dp_terms(layout_for(dp=4, pp=2, zero="0", batch=4), G, 0)
    assert term.bytes == -(-2 * 3 * G // 4) + -(-3 * G // 4) == 8_539_776
    assert term.what == ("DeepSpeed's BF16_Optimizer: all-reduce of the bf16 gradients, all-gather of the updated "
                         "bf16 parameters")
    assert term.formula == "2(n−1)/n · G + (n−1)/n · P, n = dp × cp = 4"


def test_zero0_without_a_pipeline_all_reduces_once_a_step():
    for steps in (1, 4):
        (term,) = deepspeed_zero0_dp_terms(layout_for(dp=4, zero="0", batch=4), G, 0, steps)
        assert term.bytes == -(-2 * 3 * G // 4) == 5_693_184
        assert ("once a step" in term.what) == (steps > 1)
    # the routed experts over their expert-data-parallel group: dp 4 / ep 2 = 2 ranks
    dense, experts = deepspeed_zero0_dp_terms(layout_for(dp=4, ep=2, zero="0", batch=4), G, 1000)
    assert (dense.bytes, experts.bytes) == (5_693_184, 1000) and "routed experts" in experts.what


def test_zero1_reduces_at_the_boundary_zero2_every_micro_step():
    one, = dp_terms(layout_for(dp=4, zero="1", batch=4), G, 0)
    assert one.bytes == -(-3 * (G + G) // 4) == 5_693_184
    (once,) = dp_terms(layout_for(dp=4, zero="1", batch=4), G, 0, steps=4)
    assert once.bytes == one.bytes and "once a step" in once.what
    (each,) = dp_terms(layout_for(dp=4, zero="2", batch=4), G, 0, steps=4)
    assert each.bytes == -(-3 * (4 * G + G) // 4) == 14_232_960  # the gradients each micro-step, the gather once
