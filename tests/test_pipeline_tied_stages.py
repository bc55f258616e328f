"""A head tied to the embedding across pipeline stages, under tensor parallel (GPT-2: Conv1D, wte tied, tp 2 × pp 3):
each stage replayed from the tensor-parallel rank's derived recipe (cost/parallel/stage_recipe.py) equals MemTracker
on the real class cut to the stage with the tp layout on torch's fake process group (traced/pipeline_stage.py, as
--trace runs it): its forwards, its first and its later backward, to the byte."""

from __future__ import annotations

from paramscope.cost.parallel.layout import ParallelLayout

MICRO, SEQ, TP = 2, 32, 2


def test_gpt2_tp_pp_first_stage_keeps_its_tied_embedding_s_own_gradient_as_traced():
    """The first stage holds wte but not the head: its embedding's backward makes the weight's first gradient, the
    whole V × h (DTensor returns it Replicate), which autograd keeps as the .grad. The replay took the one-device
    step's sum into the head's Shard(0) gradient, and was above the trace at the first backward by V·h·2 − B·S·h·4 B
    (95,232 B here); since the step recorder sees inside DTensor's operators (traced/timeline.py), the one-device
    step also shows the Replicate gradient's local chunk copied out for that sum, which the stage does not make
    either (it was 95,232 B over again until the replay left it out)."""
    import transformers as T

    from paramscope.cost.memory.training import TrainingOptions, training_answer

    hidden, vocab = 128, 500
    config = T.GPT2Config(n_embd=hidden, n_head=4, n_layer=5, vocab_size=vocab, bos_token_id=0, eos_token_id=0,
                          architectures=["GPT2LMHeadModel"])
    layout = ParallelLayout(tp=TP, pp=3, micro_batches=3, schedule="1f1b")
    _, estimate, _ = training_answer(config, TrainingOptions(batch=3 * MICRO, seq=SEQ, precision="bf16-mixed",
                                                             layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    assert [(r.layers, r.in_flight) for r in device.stages] == [((0, 1), 3), ((2, 3), 2), ((4, 4), 1)]
    for row, traced in zip(device.stages, device.traced):
        derived = row.replayed
        assert (derived.held, derived.forward_peak, derived.peak, derived.later_peak - derived.after_first_backward) \
            == (traced.held, traced.forward_peak, traced.peak, traced.later_peak - traced.after_backward), row.rank
    first, traced = device.stages[0], device.traced[0]
    # the gradients the first stage holds after its first backward: its states' and wte's whole beyond its shard
    # (which the later backward and the optimizer step add: device_parts.with_whole_gradient)
    assert traced.after_backward - first.replayed.after_first_backward == first.gradients + vocab * hidden * 4 // TP
