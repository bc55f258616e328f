"""The interleaved schedule's ranks (issue 28 §3): each rank's chunks replayed from the derived recipe and walked
along torch's ScheduleInterleaved1F1B order (stage_recipe.interleaved_activations), each moment the
chunk-microbatches then in flight, each chunk's own bytes, equal MemTracker on the real class cut to the rank's
chunks and run in that order (traced/interleaved_stage.py, as --trace runs it); and the order is torch's own."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.cost.parallel.pipeline import interleaved_order

MICRO, SEQ = 2, 32


def _torch_order(pp: int, micro: int, chunks: int, rank: int) -> tuple[tuple[str, int], ...]:
    import torch.distributed.pipelining.schedules as schedules

    schedule = object.__new__(schedules.ScheduleInterleaved1F1B)  # its order needs no stage objects
    schedule.pp_group_size, schedule.n_local_stages, schedule.rank = pp, chunks, rank
    schedule._n_microbatches = micro
    schedule.number_of_rounds = max(1, micro // pp)
    schedule.microbatches_per_round = micro // schedule.number_of_rounds
    return tuple(("F" if a.computation_type == schedules.FORWARD else "B", a.stage_index // pp)
                 for a in schedule._calculate_single_rank_operations(rank) if a is not None)


@pytest.mark.parametrize("pp, micro, chunks", [(4, 8, 2), (4, 8, 4), (2, 4, 2), (4, 12, 3), (2, 2, 2), (2, 3, 2)])
def test_interleaved_order_is_torchs(pp, micro, chunks):
    layout = ParallelLayout(pp=pp, micro_batches=micro, schedule="interleaved", virtual_stages=chunks)
    for rank in range(pp):
        assert interleaved_order(layout, rank) == _torch_order(pp, micro, chunks, rank)


def test_each_interleaved_rank_replayed_along_torchs_order_equals_its_trace():
    """GPT-2 (5 layers, h 64), pp 2 × 2 virtual stages, 2 microbatches: rank 0 holds layers 0–1 and 3, rank 1
    layers 2 and 4 with the head. Held at the first backward, the forwards' peak, the first backward's and the
    later moments' rise: the replay's equal the trace's to the byte, where the single-chunk bound took every
    chunk-microbatch in flight as the largest chunk's."""
    import transformers as T

    from paramscope.cost.memory.training import TrainingOptions, training_answer

    config = T.GPT2Config(n_embd=64, n_head=4, n_layer=5, vocab_size=500, bos_token_id=0, eos_token_id=0,
                          architectures=["GPT2LMHeadModel"])
    layout = ParallelLayout(pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2)
    _, estimate, _ = training_answer(config, TrainingOptions(batch=2 * MICRO, seq=SEQ, precision="bf16-mixed",
                                                             layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    assert [(r.chunks, r.in_flight) for r in device.stages] == [(((0, 1), (3, 3)), 4), (((2, 2), (4, 4)), 3)]
    for row, traced in zip(device.stages, device.traced):
        derived = row.replayed
        assert derived.in_flight == traced.in_flight == row.in_flight  # the most chunk-microbatches held at once
        assert (derived.held, derived.forward_peak, derived.peak) == (traced.held, traced.forward_peak,
                                                                        traced.peak), row.rank
        # the later moments above what the first backward left: the gradients made since (the other chunks')
        # included
        first, every = derived.gradients_made
        assert traced.later_peak - traced.after_backward == \
            derived.later_peak + every - (derived.after_first_backward + first), row.rank


def test_the_closed_form_s_last_interleaved_stage_holds_what_torchs_order_holds():
    """The Llama closed form's last stage under the interleaved schedule: its head's moments hold, of each chunk,
    the microbatches in flight there along torch's own order (each its chunk's layers), as its held activations do;
    they counted every chunk-microbatch in flight with all the stage's layers. Against 1F1B on the same 5 layers'
    worth (one microbatch in flight): each chunk-microbatch holds its chunk's bytes (its layers' saved bytes and
    16-bit copies, the first chunk's output, the last chunk's head), counted along torch's order."""
    import transformers as T

    from paramscope.cost.memory.training import TrainingOptions, training_answer

    config = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                           num_hidden_layers=10, vocab_size=500, architectures=["LlamaForCausalLM"])
    last = {}
    for layout in (ParallelLayout(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2),
                   ParallelLayout(pp=2, micro_batches=4, schedule="1f1b")):
        _, estimate, _ = training_answer(config, TrainingOptions(batch=8, seq=SEQ, precision="bf16-mixed",
                                                                 layout=layout, fits=False), use_cache=False)
        last[layout.schedule] = estimate.training.device.stages[-1]
    interleaved, plain = last["interleaved"], last["1f1b"]
    assert interleaved.chunks == ((3, 5), (8, 9)) and plain.chunks == ((5, 9),) and plain.in_flight == 1
    # the head's moment: the start of backward (the end of forward holds the KV cache's keys of the stage's layers
    # only, the head's chunk's under interleaving, not every layer's)
    assert interleaved.peak_phase == plain.peak_phase == "backward"
    counts, most, at_head = [0, 0], 0, 0
    for kind, chunk in _torch_order(2, 4, 2, 1):  # torch's order for the last rank, chunks of 3 and 2 layers
        counts[chunk] += kind == "F"
        layers = 3 * counts[0] + 2 * counts[1]
        most, at_head = max(most, layers), max(at_head, layers) if chunk == 1 else at_head
        counts[chunk] -= kind == "B"
    assert (most, at_head) == (9, 8)
    # each chunk-microbatch holds its chunk's layers' saved bytes and 16-bit copies (each forward its own autocast):
    # the first chunk (3 layers) its output in the cache too (4·B·S·h), the last (2 layers) the head's copies and
    # outside terms, as 1F1B's last stage holds them for its one microbatch (5 layers): held along torch's order
    # (tests/test_pipeline_closed_form_copies.py holds it to the trace)
    layer = 198_144 + (64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3) * 2  # saved + q, k, v, o, gate, up, down copied
    each = (3 * layer + 4 * 2 * SEQ * 64, plain.activations - 3 * layer)
    counts, held, head = [0, 0], 0, 0
    for kind, chunk in _torch_order(2, 4, 2, 1):
        counts[chunk] += kind == "F"
        now = counts[0] * each[0] + counts[1] * each[1]
        held, head = max(held, now), max(head, now) if chunk == 1 else head
        counts[chunk] -= kind == "B"
    assert interleaved.activations == held
    assert interleaved.peak - plain.peak == head - plain.activations
