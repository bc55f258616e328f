"""FSDP2's closed form (cost/parallel/fsdp_moments.py) where the head is tied to the token embedding (Qwen2-0.5B's,
Llama-3.2-1B's kind), against one rank traced by MemTracker on torch's fake process group: the peak equals the traced
rank's to the byte, under autocast (fp32, bf16-mixed, bf16-pure) and under FSDP2's MixedPrecisionPolicy, dp alone
and beside tp, with and without full checkpointing. The tied weight is the root unit's one parameter used twice: the
head's matmul backward makes its whole gradient, held unsharded beside every layer's backward; the embedding's
backward makes its own, and autograd adds the two out of place, both beside their sum (the root's peak); beside tp
the vocabulary-parallel embedding's gradient is whole (DTensor's Replicate) beside them. A 4-layer Qwen2 cut at hidden
size 128 (test_fsdp_closed_form.py's proportions)."""

from __future__ import annotations

import pytest

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings

CUT = dict(hidden_size=128, intermediate_size=448, num_attention_heads=4, num_key_value_heads=1,
           tie_word_embeddings=True, num_hidden_layers=4, architectures=["Qwen2ForCausalLM"])
SUM = "FSDP2: the tied weight's two gradients summed"


def _closed(dp: int, tp: int, seq: int, batch: int, precision: str, mixed: str, vocab: int, checkpointing: bool):
    import transformers as T

    _, estimate, view = training_answer(T.Qwen2Config(vocab_size=vocab, **CUT), TrainingOptions(
        batch=batch, seq=seq, precision=precision, fits=False,
        layout=ParallelLayout(dp=dp, tp=tp, shard="fsdp", fsdp_mixed_precision=mixed),
        grad_checkpointing="full" if checkpointing else "none", derive_layout=False), use_cache=False)
    return estimate.training.device, view


# (dp, tp, seq, batch, precision, FSDP2's mixed precision, vocabulary, checkpointing): the moment it peaks at, its
# bytes (traced; torch 2.13). Before the tied head's moments autocast's closed form was 3,674,112 B under the first
# (15,298,384 B inside layer 2's backward) and the policy's refused tied heads
CASES = {
    "autocast, dp 2, 16 tokens": ((2, 1, 16, 1, "bf16-mixed", "autocast", 4008, False), SUM, 18_972_496),
    # beside tp: the embedding's whole gradient (Replicate) beside the two local ones and their sum
    "bf16-pure, dp 2 × tp 2, 16 tokens": ((2, 2, 16, 1, "bf16-pure", "autocast", 4008, False), SUM, 5_846_608),
    # inside a layer's backward the tied weight's whole gradient beside the layer's moments
    "fp32, dp 2, 2 × 64 tokens, a 512-token vocabulary": (
        (2, 1, 64, 2, "fp32", "autocast", 512, False), "FSDP2: inside layer 3's backward (MLP's product)", 14_430_288),
    "autocast, dp 2, 2 × 128 tokens, a 512-token vocabulary, checkpointing": (
        (2, 1, 128, 2, "bf16-mixed", "autocast", 512, True), "FSDP2: inside layer 1's backward (MLP's product)",
        12_692_048),
    "policy, dp 4 × tp 2, 16 tokens": ((4, 2, 16, 1, "bf16-mixed", "policy", 4008, False), SUM, 6_068_560),
    "policy, dp 2, 2 × 64 tokens, a 512-token vocabulary": (
        (2, 1, 64, 2, "bf16-mixed", "policy", 512, False), "FSDP2: inside layer 2's backward (MLP's product)",
        10_716_624),
    "policy, dp 4, 32 tokens, checkpointing": ((4, 1, 32, 1, "bf16-mixed", "policy", 4008, True), SUM, 9_913_296),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tied_head_closed_form_peak_is_the_traced_rank(name):
    (dp, tp, seq, batch, precision, mixed, vocab, checkpointing), moment, peak = CASES[name]
    device, view = _closed(dp, tp, seq, batch, precision, mixed, vocab, checkpointing)
    traced = trace_parallel_training(view.module, StepSettings(batch=batch, seq=seq, precision=precision,
                                                               optimizer="adamw", grad_checkpointing=checkpointing),
                                     dp=dp, shard="fsdp", tp=tp, mixed=mixed)
    assert (device.peak_figure.where, device.peak, traced.peak.bytes) == (moment, peak, peak), name


def test_the_sum_names_its_gradients():
    words = next(p.arithmetic for p in _closed(2, 1, 16, 1, "bf16-mixed", "autocast", 4008, False)[0].phases
                 if p.where == SUM)
    # the vocabulary × hidden fp32 gradient, twice beside the held sum
    assert "the head's and the embedding's gradients of the tied weight, 2 × 2,052,096 + the loss's" in words
    # beside tp each is the rank's half, and the embedding's whole gradient is beside them
    words = next(p.arithmetic for p in _closed(2, 2, 16, 1, "bf16-mixed", "autocast", 4008, False)[0].phases
                 if p.where == SUM)
    assert ("the tied weight, 2 × 1,026,048 + the embedding's whole gradient (Replicate) it was taken from "
            "2,052,096") in words


def test_under_gradient_accumulation_each_micro_step_is_the_traced_rank():
    """The policy, dp 2, 2 sequences of 16 tokens in 2 micro-steps: every phase the traced rank's, the later
    micro-step's peak the tied weight's sum over the held shards (15,894,096 B)."""
    import transformers as T

    options = TrainingOptions(batch=2, seq=16, precision="bf16-mixed", fits=False, grad_accum=2, derive_layout=False,
                              layout=ParallelLayout(dp=2, shard="fsdp", fsdp_mixed_precision="policy"))
    _, estimate, view = training_answer(T.Qwen2Config(vocab_size=4008, **CUT), options, use_cache=False)
    closed: dict[str, int] = {}
    for p in estimate.training.device.phases:
        closed[p.phase] = max(closed.get(p.phase, 0), p.bytes)
    traced = trace_parallel_training(view.module, StepSettings(batch=1, seq=16, precision="bf16-mixed", grad_accum=2),
                                     dp=2, shard="fsdp", mixed="policy")
    assert closed == {p.phase: p.bytes for p in traced.phases}
    assert closed["backward, gradients held"] == 15_894_096
