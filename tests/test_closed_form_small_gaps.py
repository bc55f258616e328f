"""Two small gaps of the Llama family's closed form against one rank traced on torch's fake process group, each
held to the byte here (torch 2.13):

- a vocabulary-parallel embedding (tp) masks the token ids it reads and saves them for its backward, a (B, S) int64,
  8·T, held from its forward to its backward: the tensor-parallel closed form's end of forward counts them
  (device_parts.masked_token_ids), as FSDP2's moments do (fsdp_moments.py). A Llama cut at tp 2, 2 × 64 tokens, a
  512-token vocabulary, was 1,032 B under the traced forward with and without FSDP2 (8·T = 1,024, and the 8 below);
- the causal loss leaves two fp32 scalars live as the forward ends, the loss and the total weight nll_loss saves for
  its backward: the one-device recipe's end of forward counts them (activations/layout.causal_loss_working). It was
  8 B under every causal recipe's trace; llama-3-8b --dp 8 --zero fsdp --seq 512 --grad-checkpointing full, which
  peaks there, 33,084,868,244 -> 33,084,868,252 B, the derived engine's figure.
"""

from __future__ import annotations

import functools

import pytest

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings

CUT = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=448, num_attention_heads=4, num_key_value_heads=1,
           vocab_size=512, architectures=["LlamaForCausalLM"])


@functools.lru_cache(maxsize=None)
def _closed_and_traced(dp: int, tp: int, batch: int, seq: int, checkpointing: bool = False):
    import transformers as T

    shard = "fsdp" if dp > 1 else "none"
    _, estimate, view = training_answer(T.LlamaConfig(**CUT), TrainingOptions(
        batch=batch, seq=seq, precision="bf16-mixed", layout=ParallelLayout(dp=dp, shard=shard, tp=tp),
        grad_checkpointing="full" if checkpointing else "none", derive_layout=False), use_cache=False)
    traced = trace_parallel_training(view.module, StepSettings(
        batch=batch, seq=seq, precision="bf16-mixed", optimizer="adamw", grad_checkpointing=checkpointing),
        dp=dp, shard=shard, tp=tp)
    phases = estimate.training.device.phases if estimate.training.device else estimate.training.phases
    return {p.where: p for p in phases}, {p.phase: p.bytes for p in traced.phases}


@pytest.mark.parametrize("dp, forward", [(1, 6_307_052), (2, 5_288_940)], ids=["tp 2", "FSDP2 dp 2 × tp 2"])
def test_the_tp_end_of_forward_counts_the_embeddings_masked_ids(dp, forward):
    closed, traced = _closed_and_traced(dp, 2, 2, 64)
    end = closed["end of forward"]
    assert "masked token ids, 8·T = 1,024" in end.arithmetic
    assert end.bytes == traced["forward"] == forward


def test_the_checkpointed_end_of_forward_counts_the_loss_scalars():
    """One device, full checkpointing, 2 × 16 tokens: the forward peaks as the loss is taken, and the recipe's end of
    forward is the trace's to the byte: 8 B under it without the loss's scalars, and 8·S = 128 B under without the
    position ids, a (1, S) int64, that the checkpoints keep among the layers' inputs (the Llama-style recipe's
    checkpointed outside terms, as FSDP2's moments count them)."""
    closed, traced = _closed_and_traced(1, 1, 2, 16, checkpointing=True)
    end = closed["end of forward"]
    assert "the loss and nll_loss's total weight, two fp32 scalars = 8" in end.arithmetic
    assert end.bytes == traced["forward"] == 7_934_444


def _start_of_backward(module, settings) -> int:
    """The most bytes live (beyond the weights) from the loss to the last layer's backward on one device's timeline:
    the recipe's start of backward."""
    from paramscope.cost.derived.derive import layer_stack
    from paramscope.cost.traced.timeline import ALLOC, MARK, record_training_step

    timeline = record_training_step(module, settings, layer_stack(module)[0])
    live = top = 0
    inside = False
    for kind, what in timeline.events:
        if kind == MARK:
            if what == ("end-fw",):
                inside = True
            elif inside:
                return top
            continue
        live += timeline.allocations[what].nbytes if kind == ALLOC else -timeline.allocations[what].nbytes
        top = max(top, live) if inside else top
    raise AssertionError("no layer's backward on the timeline")


@pytest.mark.parametrize("family, precision, batch, seq", [
    ("gpt2", "fp32", 2, 32), ("llama", "fp32", 1, 128)])
def test_the_causal_start_of_backward_frees_the_shifted_labels(family, precision, batch, seq):
    """A causal LM's start of backward: nll_loss's backward frees the shifted labels it saved (8·T, counted in the
    saved activations) before log-softmax's backward makes the logits' gradient, and the loss and its gradient are
    held beside. The recipe's moment is the timeline's to the byte (8·T − 8 B over it before: 504 B here at 2 × 32,
    1,016 B at 1 × 128; T above h, so that the head's weight gradient does not outgrow the moment)."""
    import torch
    import transformers as T

    from paramscope.cost.memory.activations import training_activations

    config = (T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=256, n_positions=64) if family == "gpt2" else
              T.LlamaConfig(**dict(CUT, hidden_size=64, intermediate_size=128)))
    with torch.device("meta"):
        module = (T.GPT2LMHeadModel if family == "gpt2" else T.LlamaForCausalLM)(config)
    act = training_activations(config, type(module).__name__, batch=batch, seq=seq, precision=precision,
                               checkpointing=False)
    moment = next(m for m in act.moments if m.where == "start of backward")
    assert "the shifted labels nll_loss's backward frees first, 8·T" in moment.arithmetic
    assert moment.bytes == _start_of_backward(module, StepSettings(batch=batch, seq=seq, precision=precision))


@pytest.mark.parametrize("seq, checkpointing, forward", [(64, False, 9_121_252), (16, True, 7_807_012)],
                         ids=["1 × 64", "1 × 16 checkpointed"])
def test_at_batch_1_the_shifted_labels_are_a_view_of_the_padded_ones(seq, checkpointing, forward):
    """One device at batch 1: transformers' causal loss pads the labels by one and takes labels[..., 1:].contiguous(),
    which at batch 1 is the padded tensor itself (a (1, S) slice is contiguous whatever its leading stride), so
    nll_loss saves the padded labels and no 8·T copy is made: the end of forward holds the saved activations' 8·T and
    the pad's one element, not the whole padded labels beside them. The recipe's end of forward is the trace's to the
    byte (8·S over it before: 512 B at 1 × 64; under checkpointing the 128 B had cancelled the missing position ids),
    and its start of backward too."""
    closed, traced = _closed_and_traced(1, 1, 1, seq, checkpointing=checkpointing)
    end = closed["end of forward"]
    assert "of which the shifted labels are a view at batch 1: its one element more = 8" in end.arithmetic
    assert end.bytes == traced["forward"] == forward
    if not checkpointing:
        assert closed["start of backward"].bytes == traced["backward"]


def test_the_sliding_window_caches_hold_their_window_as_the_forward_runs():
    """transformers' training forward makes a DynamicCache; each of its sliding-window layers
    (DynamicSlidingWindowLayer) holds its window as an int64 scalar until the loss is taken. The Llama-style
    recipe's end of forward is the timeline's forward peak to the byte on a 2-layer Mistral cut whose window the
    sequence does not fill (16 B under before; Mistral-7B and Phi-3-mini at 1 × 2,048, 256 B)."""
    import torch
    import transformers as T

    from paramscope.cost.memory.activations import training_activations
    from paramscope.cost.traced.timeline import record_training_step

    config = T.MistralConfig(**dict(CUT, hidden_size=64, intermediate_size=128, sliding_window=4096))
    with torch.device("meta"):
        module = T.MistralForCausalLM(config)
    act = training_activations(config, "MistralForCausalLM", batch=2, seq=64, precision="fp32", checkpointing=False)
    end = next(m for m in act.moments if m.where == "end of forward")
    assert "the training cache's window sizes, an int64 in each of its 2 sliding-window layers = 16" in end.arithmetic
    forward_peak, _, _ = record_training_step(module, StepSettings(batch=2, seq=64, precision="fp32"),
                                              "model.layers").peaks()
    assert end.bytes == forward_peak
