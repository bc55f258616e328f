"""The interleaved schedule's ranks on an MoE class (issue 28 §3): Mixtral's chunks replayed along torch's
ScheduleInterleaved1F1B order (stage_recipe.interleaved_activations) equal MemTracker on the real class cut to the
rank's chunks (traced/interleaved_stage.py) at every moment, not only the first backward's: with 4 microbatches on
pp 2 × 2 virtual stages each rank runs 8 backwards, and each used to leave the trace a received hidden state (held by
the tracker's own module hooks) and each MoE layer's expert offsets (a reference cycle of those hooks) above the
replay: 16–131 KB by the last. The last rank keeps each microbatch's loss to the step's end, as torch's schedule
does (step(losses=...)), in both engines: the loss and the expert offsets its graph's nodes hold."""

from __future__ import annotations

from paramscope.cost.parallel.layout import ParallelLayout
from parallel_steps import small_mixtral

MICRO, SEQ = 2, 32


def test_mixtral_interleaved_ranks_equal_their_traces_at_every_moment():
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.pipeline_replay import kept_losses

    layout = ParallelLayout(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    _, estimate, _ = training_answer(small_mixtral(4), TrainingOptions(
        batch=4 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    assert [r.chunks for r in device.stages] == [((0, 0), (2, 2)), ((1, 1), (3, 3))]
    for row, traced in zip(device.stages, device.traced, strict=True):
        derived = row.replayed
        first, every = derived.gradients_made
        assert derived.in_flight == traced.in_flight, row.rank
        # held at the first backward, the forwards' peak, the first backward's, what it leaves (with the gradients
        # it made), and the largest moment after it (with every gradient made by then)
        assert (derived.held, derived.forward_peak, derived.peak, derived.after_first_backward + first,
                derived.later_peak + every) == (traced.held, traced.forward_peak, traced.peak,
                                                traced.after_backward, traced.later_peak), row.rank
    # what a loss keeps past its backward: the fp32 loss, 4 B, and its MoE layer's offsets, 4 experts × int32 (the
    # grouped-mm fallback's node attribute: fp32 experts under bf16-mixed)
    assert [(r.replayed.loss_kept, r.replayed.loss_scalar) for r in device.stages] == [(0, 0), (20, 4)]
    assert [(r.replayed.held, r.replayed.later_peak + r.replayed.gradients_made[1]) for r in device.stages] == \
        [(2_512_208, 3_677_520), (1_623_608, 2_707_828)]
    # the last stage's optimizer step: the 4 losses' graphs, held by torchtitan's mean of them, 4 × 16 B, and the
    # mean, 4 B
    held, words = kept_losses(device.stages[-1].replayed, layout.micro_batches)
    assert held == 4 * 16 + 4 and words.startswith("; the microbatches' losses kept 68 B (4 × 20 B")
    assert kept_losses(device.stages[0].replayed, layout.micro_batches) == (0, "")
