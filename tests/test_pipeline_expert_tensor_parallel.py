"""Pipeline × expert × tensor parallelism on a class whose step is derived from traces (Mixtral): each stage replayed
(cost/parallel/stage_recipe.py) from the rank's derived recipe with tp and ep both applied on torch's fake process
group (the tp layout as under tensor parallel; each rank's E/ep experts also cut over tp, [Shard(0), Shard(1 or 2)]
on the (ep, tp) mesh, torchtitan's ExpertTensorParallel, with its dispatch and combine over the ep ranks). --trace
cuts each stage of the real class with the same layout (traced/pipeline_stage.py): its forwards and first backward
equal the replay to the byte, and so does a later backward (1F1B's steady state) on every stage."""

from __future__ import annotations

from paramscope.cost.parallel.layout import ParallelLayout
from parallel_steps import small_mixtral, stage_gaps

MICRO, SEQ, EP, TP = 2, 32, 2, 2


def test_pp_ep_tp_stages_replay_the_rank_with_both_applied_and_equal_their_traced_stages(cache):
    from paramscope.cost.memory.training import TrainingOptions, training_answer

    layout = ParallelLayout(dp=EP, ep=EP, tp=TP, sp=True, pp=3, micro_batches=3, schedule="1f1b")
    _, estimate, _ = training_answer(small_mixtral(), TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    rows = device.stages
    assert [(r.layers, r.in_flight) for r in rows] == [((0, 1), 3), ((2, 3), 2), ((4, 4), 1)]
    assert len(device.traced) == 3  # --trace: each stage cut, tp applied and its experts sharded (rank 0 of ep × tp)
    gaps = stage_gaps(rows, device.traced)
    # the rank's recipe, not the ep rank's (tp 1) nor the tp rank's (whole experts): the stages' figures
    assert [(r.replayed.held, r.replayed.forward_peak, r.replayed.peak) for r in rows] == [
        (1_809_968, 2_050_872, 2_050_872), (1_198_112, 1_422_376, 1_422_376), (402_576, 523_792, 533_136)]
    # a later backward (1F1B's steady state): equal on every stage; on the middle one the forward that comes first
    # (one microbatch held, every gradient made) peaks 117,768 B above the backward
    assert gaps == [0, 0, 0]
    assert any("each also cut over tp 2 with sequence parallel" in n and "equal to the byte" in n
               for n in estimate.notes)
    # model states: the rank's shards (fp32 weights), 687,872 B as the traced copy's local parameters on rank 0 of
    # ep 2 × tp 2 (sp), cut by layer
    assert sum(r.weights for r in rows) == 687_872 == sum(r.gradients for r in rows)
    # the point-to-point hidden state is the sequence shard (sp), the permute index over the whole tokens (the MoE
    # block gathers them under sp, each tp rank dispatching the same pairs)
    worst = next(r for r in rows if r.peak == device.peak)
    index = next(b for b in device.comm if b.name == "expert parallel's permute index")
    assert index.bytes == worst.in_flight * worst.layer_count * 8 * MICRO * SEQ * 2
    assert all("(equal)" in n for n in device.notes if n.startswith("check: stage"))
