"""A Llama stage before the last that runs every forward before its first backward (1F1B with no more microbatches
than the stage holds: it only drains; GPipe) priced moment by moment in the closed form (pipeline_device.py's
draining_figures), held to the stage's trace (traced/pipeline_stage.py: k forwards, the first backward, then the
next backward with one microbatch fewer). Its figure took every gradient beside every microbatch, a moment the
schedule never has: llama-3-8b --pp 2 --batch 1 stage 0 was 79,213,888,580 B; its trace 64,342,721,604 (the
embedding's backward making its weight's gradient: every gradient beside three hidden states' gradients), now
equal."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout

MICRO, SEQ = 2, 32
LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=32, intermediate_size=48,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
             tie_word_embeddings=False)


def _draining(precision: str, vocab: int, pp: int, micro_batches: int, schedule: str = "1f1b") -> list:
    """(the closed form's stage peak above its resident states, the trace's largest moment) of each stage before
    the last."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.traced.pipeline_stage import trace_stage
    from paramscope.cost.traced.step import StepSettings

    layout = ParallelLayout(pp=pp, micro_batches=micro_batches, schedule=schedule,
                            fsdp_mixed_precision_defaulted=True)
    _, estimate, view = training_answer(dict(LLAMA, vocab_size=vocab), TrainingOptions(
        batch=micro_batches * MICRO, seq=SEQ, precision=precision, layout=layout, fits=False), use_cache=False)
    device = estimate.training.device
    settings = StepSettings(batch=MICRO, seq=SEQ, precision=precision, optimizer="adamw", attention="sdpa")
    out = []
    for row in device.stages[:-1]:
        assert row.in_flight == micro_batches  # every forward first
        traced = trace_stage(view.module, settings, "model.layers", row.layers[0], row.layers[1] + 1, row.in_flight,
                             later=row.in_flight - 1)
        resident = row.weights + row.optimizer + row.master_weights + device.buffers
        out.append((row.peak - resident, max(traced.peak, traced.later_peak)))
    return out


@pytest.mark.parametrize("precision, vocab, pp, micro_batches, expected", [
    # the first backward's top-layer moment: the first stage and a middle one, each holding 2 microbatches (was
    # 535,040 and 269,568: every gradient beside both)
    ("bf16-mixed", 128, 3, 2, [(472_064, 472_064), (253_952, 253_952)]),
    # one microbatch: the first backward alone, fp32 (was 345,600)
    ("fp32", 128, 2, 1, [(297_984, 297_984)]),
    # a large vocabulary: the embedding's backward making its weight's gradient at the first backward's end, and its
    # new gradient beside the .grad at a later one (was 818,688 and 1,042,944)
    ("bf16-mixed", 4096, 2, 1, [(610_816, 610_816)]),
    ("bf16-mixed", 4096, 2, 2, [(1_135_104, 1_135_104)]),
])
def test_a_draining_stage_is_its_real_moments_as_traced(precision, vocab, pp, micro_batches, expected):
    assert _draining(precision, vocab, pp, micro_batches) == expected


def test_gpipe_stages_before_the_last_drain_alike():
    """GPipe runs every forward first on every stage: its stages before the last take the same moments."""
    assert _draining("bf16-pure", 4096, 2, 2, "gpipe") == [(567_552, 567_552)]


def test_the_steady_state_of_a_first_stage_whose_vocabulary_outweighs_a_microbatch_reaches_the_embedding():
    """1F1B, 3 microbatches on pp 2 (stage 0 holds 2): a later backward, one more forward first, peaks as it reaches
    the embedding (its new gradient beside the .grad, the other microbatch held) where the vocabulary outweighs a
    microbatch's layers: the trace's 1,359,360 B above the states (the steady state's figure was 1,056,256)."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.traced.pipeline_stage import trace_stage
    from paramscope.cost.traced.step import StepSettings

    layout = ParallelLayout(pp=2, micro_batches=3, schedule="1f1b")
    _, estimate, view = training_answer(dict(LLAMA, vocab_size=4096), TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False), use_cache=False)
    device = estimate.training.device
    row = device.stages[0]
    traced = trace_stage(view.module, StepSettings(batch=MICRO, seq=SEQ, precision="bf16-mixed", optimizer="adamw",
                                                   attention="sdpa"), "model.layers", 0, row.layers[1] + 1, 2, later=2)
    resident = row.weights + row.optimizer + row.master_weights + device.buffers
    assert (row.in_flight, row.peak - resident) == (2, traced.later_peak) == (2, 1_359_360)
