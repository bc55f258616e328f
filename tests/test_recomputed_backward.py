"""Full gradient checkpointing on a Llama-style decoder: the first micro-step's recomputed layers' backward.

Layer l's recomputed backward holds the checkpoints of layers 0..l, its recomputed activations, and the gradients of
the head, the final norm and layers l+1..L−1; its MLP makes its weight gradients one by one beside them. The closed
form (activations/step.py, recomputed_backward_moments) prices it at the first layer and the last; before, only
"last layer recomputed" (without the gradients held) and the end of backward were priced, under the trace by up to
10%. Each figure below is the traced step's peak (MemTracker on fake tensors, --trace)."""

from __future__ import annotations

import pytest

from paramscope.cost.memory.training import TrainingOptions, estimate_training


def _config(model_type, hidden, inner, layers, tied=False):
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[model_type]
    return dict(model_type=model_type, architectures=[arch], hidden_size=hidden, intermediate_size=inner,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                tie_word_embeddings=tied)


@pytest.mark.parametrize("model_type, hidden, inner, layers, tied, batch, seq, precision, traced, before", [
    ("llama", 128, 344, 2, False, 2, 64, "fp32", 10_576_604, 9_971_932),  # its first layer (the end of backward before)
    ("llama", 128, 344, 2, False, 2, 64, "bf16-mixed", 10_257_116, None),
    ("llama", 128, 344, 2, False, 2, 64, "bf16-pure", 5_456_860, None),
    ("llama", 256, 600, 3, False, 1, 16, "fp32", 39_793_024, None),
    ("llama", 192, 480, 3, False, 1, 128, "bf16-pure", 12_827_584, None),  # its output projection's backward
    ("mistral", 128, 400, 3, False, 2, 32, "bf16-mixed", 13_875_456, None),
    ("qwen2", 128, 344, 2, True, 2, 64, "fp32", 9_047_792, None),  # tied: the head's gradient held in its buffer
])
def test_the_first_recomputed_layer_s_backward_equals_the_trace(model_type, hidden, inner, layers, tied, batch, seq,
                                                                 precision, traced, before):
    options = TrainingOptions(batch=batch, seq=seq, precision=precision, fits=False, grad_checkpointing="full")
    answer = estimate_training(_config(model_type, hidden, inner, layers, tied), options)
    first = next(p for p in answer.training.phases if p.where == "first layer's backward (recomputed)")
    assert answer.peak == traced and first.bytes <= traced
    if before is not None:  # the end of backward, which the answer gave before
        end = next(p for p in answer.training.phases if p.where == "end of backward")
        assert end.bytes == before


@pytest.mark.parametrize("precision, batch, seq, hidden, inner, traced", [
    ("fp32", 2, 64, 128, 344, 4_636_380),
    ("bf16-pure", 1, 128, 128, 344, 2_512_860),
    ("bf16-mixed", 1, 256, 128, 512, 6_598_876),
    # at its post-attention norm's backward, the norm's output gradient held to its end (4·T·h): was 131,072 B under
    ("bf16-mixed", 2, 64, 256, 344, 10_498_396),
    ("fp32", 2, 64, 256, 344, 10_334_556),  # was 10,291,036, 43,520 B under
])
def test_a_tp_rank_s_first_recomputed_layer_equals_its_trace(precision, batch, seq, hidden, inner, traced):
    """A tp 2 rank (2-layer Llama, V 500): its first recomputed layer's backward holds the head's vocabulary
    shard's gradient and the later layer's shards, the token ids the vocabulary-parallel embedding references
    beside, and (in fp32 and under autocast) the post-attention norm's output gradient through the norm's
    backward; each figure is the traced rank's peak (--trace beside tp 2)."""
    from paramscope.cost.parallel.layout import layout_for

    config = dict(_config("llama", hidden, inner, 2), vocab_size=500)
    options = TrainingOptions(batch=batch, seq=seq, precision=precision, fits=False, grad_checkpointing="full",
                              layout=layout_for(tp=2))
    answer = estimate_training(config, options)
    top = max(answer.training.device.phases, key=lambda p: p.bytes)
    assert (answer.peak, top.where) == (traced, "first layer's backward (recomputed)")


@pytest.mark.parametrize("hidden, inner, tp, precision, traced", [
    (256, 344, 2, "bf16-mixed", 10_038_620),  # was 9,959,764 at the optimizer step, 78,856 B under
    (256, 344, 2, "fp32", 9_962_844),
    (256, 344, 2, "bf16-pure", 5_135_964),
    (192, 480, 2, "bf16-mixed", 8_230_172),
    (192, 480, 2, "fp32", 8_316_188),
    (192, 480, 2, "bf16-pure", 4_233_500),
    (256, 344, 4, "bf16-mixed", 5_848_668),
])
def test_a_tp_sp_rank_s_first_recomputed_layer_equals_its_trace(hidden, inner, tp, precision, traced):
    """A tp rank with sequence parallel (2-layer Llama, V 500, 2 × 64): its recomputed layer's MLP reads its input
    all-gathered and the post-attention norm's backward runs on the rank's S / tp tokens (its own table of the
    backward, read off the traced rank's allocations), over checkpoints on S / tp tokens; each figure is the traced
    rank's peak (--trace beside --tp --sp)."""
    from paramscope.cost.parallel.layout import layout_for

    config = dict(_config("llama", hidden, inner, 2), vocab_size=500)
    options = TrainingOptions(batch=2, seq=64, precision=precision, fits=False, grad_checkpointing="full",
                              layout=layout_for(tp=tp, sp=True))
    answer = estimate_training(config, options)
    top = max(answer.training.device.phases, key=lambda p: p.bytes)
    assert (answer.peak, top.where) == (traced, "first layer's backward (recomputed)")


@pytest.mark.parametrize("hidden, inner, tp, precision, accum, end, forward", [
    (256, 344, 2, "bf16-mixed", 1, 9_200_748, None),  # was 8,806,508: 394,240 under, L·(1 − 1/tp)·(12·h + 8)·T
    (256, 344, 2, "fp32", 1, 8_088_684, 8_214_612),  # the forward's peak with the head's logits gathered
    (256, 344, 2, "bf16-pure", 1, 4_463_212, None),  # was 328,704 under, L·(1 − 1/tp)·(10·h + 8)·T
    (192, 480, 2, "bf16-mixed", 1, 7_642_156, None),
    (256, 344, 4, "bf16-pure", 1, 2_794_988, None),
    (256, 344, 2, "bf16-mixed", 2, 11_817_068, None),  # the peak, the second micro-step's: was 11,422,828
])
def test_a_tp_sp_rank_s_forward_under_full_checkpointing_equals_its_trace(hidden, inner, tp, precision, accum, end,
                                                                          forward):
    """A checkpointed layer saves no norm: its checkpoint is its input, on the rank's S / tp tokens under sequence
    parallel (taking the norms' share off each instead left the forward under). Each figure is the traced rank's
    forward peak (--trace beside --tp --sp --checkpointing full), at the end of the forward (of the last
    micro-step's under --grad-accum 2, over every gradient held) where no `forward` is given."""
    from paramscope.cost.parallel.layout import layout_for

    config = dict(_config("llama", hidden, inner, 2), vocab_size=500)
    options = TrainingOptions(batch=2 * accum, seq=64, precision=precision, fits=False, grad_checkpointing="full",
                              grad_accum=accum, layout=layout_for(tp=tp, sp=True))
    phases = estimate_training(config, options).training.device.phases
    last = [p for p in phases if p.phase.startswith("forward")][-1]
    assert (last.where, last.bytes) == ("end of forward", end)
    assert max(p.bytes for p in phases if p.phase.startswith("forward")) == (forward or end)
    if (hidden, tp, precision, accum) == (256, 2, "bf16-mixed", 1):  # the start of backward, traced: 1,258,248 over
        start = next(p for p in phases if p.where == "start of backward")  # the resident 7,081,300 (was 864,008)
        assert start.bytes == 8_339_548 and "2 layers' checkpoints (each its input)" in start.arithmetic


@pytest.mark.parametrize("hidden, inner, tp, precision, traced, where, down", [
    # the recomputed last layer's down projection's new weight gradient beside the held ones, over the tp + sp
    # rank's anchor: was 11,331,156 and 9,390,100 (1,800 and 110,344 B under; no such moment beside sp)
    (256, 344, 2, "fp32", 11_332_956, "the recomputed last layer's down projection gradient", 11_332_956),
    (192, 480, 2, "fp32", 9_500_444, "the recomputed last layer's down projection gradient", 9_500_444),
    (256, 344, 4, "fp32", 6_704_092, "start of backward", 6_703_708),  # 384 B below it in the traced allocations
    (256, 344, 2, "bf16-pure", 5_864_540, "start of backward", 5_766_492),  # 98,048 B below it, likewise
    (192, 480, 2, "bf16-pure", 4_922_652, "start of backward", None),
    (256, 344, 4, "bf16-pure", 3_753_436, "start of backward", None),
    (256, 344, 2, "bf16-mixed", 11_817_068, "end of forward", None),
    (192, 480, 2, "bf16-mixed", 9_770_284, "end of forward", None),
    (256, 344, 4, "bf16-mixed", 7_135_724, "end of forward", None),
])
def test_a_tp_sp_rank_s_later_micro_step_under_full_checkpointing_equals_its_trace(hidden, inner, tp, precision,
                                                                                    traced, where, down):
    """--grad-accum 2 beside tp + sp under full checkpointing (2-layer Llama, V 500, 2 × 64 a micro-step): the later
    micro-step's recomputed last layer (fp32, bf16-pure) prices its down projection's new weight gradient, live beside
    every held one until AccumulateGrad adds it in, over the tp + sp rank's anchor; each peak is the traced rank's
    (--trace beside --tp --sp --grad-checkpointing full --grad-accum 2), at the moment named, and each `down` the
    traced second micro-step's allocations at that gradient (its live bytes against the traced peak's)."""
    from paramscope.cost.parallel.layout import layout_for

    config = dict(_config("llama", hidden, inner, 2), vocab_size=500)
    options = TrainingOptions(batch=4, seq=64, precision=precision, fits=False, grad_checkpointing="full",
                              grad_accum=2, layout=layout_for(tp=tp, sp=True))
    phases = estimate_training(config, options).training.device.phases
    top = max(phases, key=lambda p: p.bytes)
    assert (top.bytes, top.where, top.phase.endswith("gradients held")) == (traced, where, True)
    named = [p.bytes for p in phases if p.where == "the recomputed last layer's down projection gradient"]
    if precision == "bf16-mixed":  # its later backward peaks before the anchor (the layer's copies made again)
        assert named == []
    else:
        assert len(named) == 1 and named[0] <= traced and (down is None or named[0] == down)
