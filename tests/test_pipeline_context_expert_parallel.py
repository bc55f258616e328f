"""Pipeline × context × expert parallelism (issue 28, --pp P --cp C --ep E), torchtitan's order: pp outermost, then
(dp_shard_in_ep, cp, tp) with ep = dp_shard_in_ep × cp (ETP = tp). Each stage of a class replayed from a derived step
(Mixtral) replays the ring's rank with its experts cut (rank 0, its S / cp tokens through torch's ring, the token-
expert pairs through torchtitan's dispatch over the ep ranks); --trace cuts each stage of the real class and runs it on
that rank (traced/pipeline_stage.py). On the 5-layer Mixtral cut every stage's held, forward peak, first and later
backward equal the replay to the byte; under --expert-load 1.5 too (by hand: stage 0 held 2,028,592 B, peak
2,183,728 B, device 3,864,252 B)."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.errors import ParamscopeError
from parallel_steps import small_mixtral, stage_gaps

MICRO, SEQ, HIDDEN, CP = 2, 32, 64, 2


def test_pp_cp_ep_stages_replay_the_ring_rank_with_its_experts_cut_and_equal_their_traces():
    from paramscope.cost.memory.training import TrainingOptions, training_answer

    layout = ParallelLayout(cp=CP, ep=2, pp=3, micro_batches=3, schedule="1f1b")
    _, estimate, _ = training_answer(small_mixtral(), TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    rows = device.stages
    assert [(r.layers, r.in_flight) for r in rows] == [((0, 1), 3), ((2, 3), 2), ((4, 4), 1)]
    assert len(device.traced) == 3  # --trace: each stage cut, on rank 0 of (dp_shard_in_ep 1, cp 2), experts over 2
    assert stage_gaps(rows, device.traced) == [0, 0, 0]
    assert [(r.replayed.held, r.replayed.forward_peak, r.replayed.peak) for r in rows] == [
        (1_584_688, 1_692_856, 1_723_440), (1_052_192, 1_160_232, 1_190_944), (345_360, 407_072, 463_504)]
    assert [r.replayed.later_peak - r.replayed.after_first_backward for r in rows] == [105_984, 634_136, 410_640]
    # the hidden state sent and received: the rank's S / cp tokens, fp32
    residual = MICRO * (SEQ // CP) * HIDDEN * 4
    assert all(r.replayed.received == (0 if r.first else residual) for r in rows)
    notes = " ".join(device.notes)
    assert "torchtitan's ExpertParallel over ep 2 = dp_shard_in_ep × cp ranks" in notes
    assert all("(equal)" in n for n in device.notes if n.startswith("check: stage"))
    # the permute index each stage's MoE layers keep: over the rank's S / cp tokens' pairs
    index = next(b for b in device.comm if b.name == "expert parallel's permute index")
    assert f"S = {MICRO}·{SEQ // CP}·2 token-expert pairs" in index.arithmetic


def test_cp_not_dividing_ep_under_a_pipeline_is_refused_in_one_line():
    from paramscope.cost.memory.training import TrainingOptions, training_answer

    layout = ParallelLayout(dp=2, cp=4, ep=2, pp=2, micro_batches=2)
    with pytest.raises(ParamscopeError, match="context parallel 4 beside ep 2: .* so cp must divide ep") as refusal:
        training_answer(small_mixtral(), TrainingOptions(batch=2, seq=SEQ, precision="bf16-mixed", layout=layout,
                                                         fits=False), use_cache=False)
    assert "\n" not in str(refusal.value)
