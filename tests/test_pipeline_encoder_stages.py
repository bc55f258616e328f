"""Pipeline stages of an encoder (BERT: post-norm layers, an MLM head of dense + activation + LayerNorm then the decoder
tied to the word embeddings): each stage replayed from the one-device recipe's segments (cost/parallel/stage_recipe.py)
against MemTracker on the real class cut to that stage (cost/traced/pipeline_stage.py): the first stage the model's own
forward (word, token-type and position embeddings, their LayerNorm) stopped at its last layer, a later stage its layers
on a received hidden state, the last then the class's own head and loss.

The first stage is equal to the byte. A later stage's received hidden state is a leaf (PipelineStage's receive buffer,
requires_grad): autocast casts a leaf to 16 bits once for every matmul that reads it (its cache keeps leaves' casts),
where one device's layer, whose input is the layer below's output, is cast once for each of q, k and v. The replay,
from one device's segments, so counts two more B·S·h 16-bit copies a microbatch in flight on every later stage: that
exact gap is asserted, and the replay's note names it. Without autocast (fp32) every stage is equal to the byte."""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.layout import ParallelLayout

MICRO, SEQ, HIDDEN = 2, 64, 64


@pytest.mark.parametrize("cls, schedule, micro_batches, precision, plan", [
    ("BertForMaskedLM", "1f1b", 3, "bf16-mixed", [((0, 1), 3), ((2, 3), 2), ((4, 4), 1)]),
    # without autocast no cast is made: every stage equal to the byte (the pooler and classifier on the last)
    ("BertForSequenceClassification", "gpipe", 2, "fp32", [((0, 1), 2), ((2, 3), 2), ((4, 4), 2)]),
])
def test_each_encoder_stage_replayed_from_the_recipe_equals_memtracker_but_the_received_leaf_s_casts(
        cls, schedule, micro_batches, precision, plan):
    import transformers as T

    from paramscope.cost.memory.training import TrainingOptions, training_answer

    config = T.BertConfig(hidden_size=HIDDEN, num_attention_heads=4, intermediate_size=128, num_hidden_layers=5,
                          vocab_size=500, max_position_embeddings=128, architectures=[cls])
    layout = ParallelLayout(pp=3, micro_batches=micro_batches, schedule=schedule)
    _, estimate, _ = training_answer(config, TrainingOptions(
        batch=micro_batches * MICRO, seq=SEQ, precision=precision, layout=layout, fits=False, trace=True),
        use_cache=False)
    device = estimate.training.device
    rows = device.stages
    assert [(r.layers, r.in_flight) for r in rows] == plan
    assert len(device.traced) == len(rows)
    # k, v's casts of the received leaf, which autocast makes once with q's: 2 × B·S·h × 2 B a microbatch held
    casts = 2 * MICRO * SEQ * HIDDEN * 2 if precision == "bf16-mixed" else 0
    for row, traced in zip(rows, device.traced):
        derived = row.replayed
        assert (traced.first, traced.stop, traced.in_flight) == (row.layers[0], row.layers[1] + 1, row.in_flight)
        gap = 0 if row.first else row.in_flight * casts
        assert (derived.held - gap, derived.forward_peak - gap, derived.peak - gap) == (
            traced.held, traced.forward_peak, traced.peak), (cls, row.rank)
        check = next(n for n in estimate.notes if n.startswith(f"check: stage {row.rank} traced"))
        assert ("(equal)" in check) if not gap else (f"(the replay {gap:+,} B held, {gap:+,} B at the peak)" in check)
        # the stage's parameters' gradients, the tied decoder's (Megatron's copy on the last stage) among the last's
        assert row.gradients == traced.gradients, (cls, row.rank)
    if cls == "BertForMaskedLM":
        word = config.vocab_size * HIDDEN * 4  # the tied decoder's copy: its fp32 gradient on the last stage
        assert rows[-1].gradients - word == sum(
            4 * p.numel() for name, p in _named_parameters(config) if name.startswith(("bert.encoder.layer.4.", "cls.")))
    assert any("a later stage's received hidden state is a leaf" in note for note in estimate.notes) == bool(casts)


def _named_parameters(config):
    import torch
    import transformers as T

    with torch.device("meta"):
        model = getattr(T, config.architectures[0])(config)
    return list(model.named_parameters())
