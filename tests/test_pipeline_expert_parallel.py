"""Pipeline with expert parallelism on a class whose step is derived from traces (Mixtral): each stage replayed
(cost/parallel/stage_recipe.py) from the expert-parallel rank's derived recipe, the one traced with the experts cut
over the ep ranks as torchtitan's ExpertParallel cuts them (traced/expert_parallel.py, balanced routing) on torch's
fake process group. --trace runs each stage of the real class cut to its layers with the same expert sharding
(traced/pipeline_stage.py with traced/parallel.py's ep layout): its forwards and first backward equal the replay to
the byte, and so does a later backward on every stage (its forward's peak, where one comes first, above its
backward's on the middle stage). The stages' model
states add up to the ep rank's without a pipeline (its experts / ep); each stage names the permute index its own MoE
layers keep, a microbatch in flight."""

from __future__ import annotations

from paramscope.cost.parallel.layout import ParallelLayout
from parallel_steps import small_mixtral

MICRO, SEQ, HIDDEN, EP = 2, 32, 64, 2


def test_pp_ep_stages_replay_the_expert_parallel_rank_and_equal_its_traced_stages(cache):
    from paramscope.cost.memory.training import TrainingOptions, training_answer

    config = small_mixtral()
    layout = ParallelLayout(dp=EP, ep=EP, pp=3, micro_batches=3, schedule="1f1b")
    _, estimate, _ = training_answer(config, TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    rows = device.stages
    assert [(r.layers, r.in_flight) for r in rows] == [((0, 1), 3), ((2, 3), 2), ((4, 4), 1)]
    assert len(device.traced) == 3  # --trace: each stage cut and traced with its experts sharded (ep 2, rank 0)
    gaps = []
    for row, traced in zip(rows, device.traced):
        derived = row.replayed
        assert (derived.held, derived.forward_peak, derived.peak) == (traced.held, traced.forward_peak,
                                                                        traced.peak), row.rank
        assert row.activations == derived.held
        gaps.append((traced.later_peak - traced.after_backward) - (derived.later_peak - derived.after_first_backward))
    # a later backward (1F1B's steady state): equal on every stage; on the middle one the peak is the forward that
    # comes first (one microbatch held, every gradient made), 69,640 B above the backward's, once missed
    assert gaps == [0, 0, 0]
    # the stages' figures are the ep rank's recipe's: the values above, and not the one-device replay's (its whole
    # experts' gradients and no dispatch): the first stage's held bytes are (the permute index, int64 over the
    # B·S·k token-expert pairs, and transformers' int32 offsets: E/ep of them a layer, E one device's)
    assert [r.replayed.held for r in rows] == [2_969_648, 1_971_232, 624_656]

    # model states: the ep rank's, cut by layer (experts / ep on every stage), as the ep answer without a pipeline
    _, flat, _ = training_answer(config, TrainingOptions(batch=MICRO, seq=SEQ, precision="bf16-mixed", fits=False,
                                                         layout=ParallelLayout(dp=EP, ep=EP)), use_cache=False)
    one = flat.training.device
    assert sum(r.weights for r in rows) == one.weights and sum(r.gradients for r in rows) == one.gradients
    assert sum(r.optimizer for r in rows) == one.optimizer
    # the worst stage names the permute index its MoE layers keep, each microbatch in flight (experts.py's rule)
    worst = next(r for r in rows if r.peak == device.peak)
    index = next(b for b in device.comm if b.name == "expert parallel's permute index")
    assert index.bytes == worst.in_flight * worst.layer_count * 8 * MICRO * SEQ * 2
    assert any("expert-parallel rank's derived step (ep 2" in n for n in estimate.notes)
    assert any("check: stage 0 traced" in n and "(equal)" in n for n in device.notes)

