"""--grad-accum (issue 28): a replica's batch as N micro-steps, the later ones over the gradients held.

The traced engine runs two micro-steps before the optimizer's (every later micro-step is the second again): on
fake tensors it equals the same run on real CPU tensors to the byte; a later micro-step's forward is the first's
plus every gradient (the rank's shard under FSDP2, which reduce-scatters each micro-step). The analytic engine's
later micro-step (its moments over the held gradients, and the head's backward beside them) equals the trace's.
"""

from __future__ import annotations

import dataclasses

import pytest

from paramscope.cost.memory.training import TrainingOptions, estimate_training
from paramscope.cost.traced.step import HELD_BACKWARD, HELD_FORWARD, StepSettings, trace_training
from paramscope.errors import OptionError

LLAMA = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=500)


def _llama(device: str):
    import torch
    import transformers

    with torch.device(device):
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))


def _phases(step):
    return {p.phase: (p.bytes, dict(p.by_category)) for p in step.phases}


def test_two_traced_micro_steps_equal_a_real_run_and_hold_every_gradient():
    settings = StepSettings(batch=1, seq=32, precision="bf16-mixed", grad_accum=4)
    traced = trace_training(_llama("meta"), settings)
    assert _phases(traced) == _phases(trace_training(_llama("cpu"), settings, fake=False))
    assert [p.phase for p in traced.phases] == ["forward", "backward", HELD_FORWARD, HELD_BACKWARD, "optimizer step"]
    once = _phases(trace_training(_llama("meta"), dataclasses.replace(settings, grad_accum=1)))
    phases = _phases(traced)
    gradients = phases["optimizer step"][1]["gradients"]
    assert gradients == 4 * 491_136  # every parameter's fp32 gradient: 491,136 parameters
    assert phases["forward"] == once["forward"] and phases["optimizer step"] == once["optimizer step"]
    assert phases[HELD_FORWARD][0] == once["forward"][0] + gradients
    assert phases[HELD_BACKWARD][0] > once["backward"][0]


def test_fsdp2_accumulates_each_rank_s_gradient_shard():
    from paramscope.cost.traced.parallel import trace_parallel_training

    settings = StepSettings(batch=1, seq=32, precision="fp32", grad_accum=2)
    step = _phases(trace_parallel_training(_llama("meta"), settings, dp=2, shard="fsdp"))
    shard = step["optimizer step"][1]["gradients"]
    assert shard == 4 * 491_136 // 2  # every unit's dim 0 even over 2 ranks
    assert step[HELD_FORWARD][0] == step["forward"][0] + shard


def _llama_3_8b_cut():
    from paramscope.sources import resolve

    return dict(resolve("llama-3-8b").config, num_hidden_layers=2)


def _most(phases):
    return {p.phase: max(q.bytes for q in phases if q.phase == p.phase) for p in phases}


def test_the_analytic_later_micro_step_equals_the_trace_at_every_moment():
    """llama-3-8b cut to 2 layers, fp32, 2 × 256 in 2: the later backward peaks at the head's weight gradient, made
    beside every held gradient (was a lower bound, 25,895,961,180 B)."""
    config = _llama_3_8b_cut()
    options = TrainingOptions(batch=2, seq=256, precision="fp32", fits=False, grad_accum=2)
    analytic = estimate_training(config, options)
    traced = estimate_training(config, dataclasses.replace(options, trace="full"))
    assert analytic.engine == "analytic" and traced.engine == "traced"
    assert analytic.settings["micro_batch"] == 1 and analytic.settings["grad_accum"] == 2
    assert _most(analytic.training.phases) == _most(traced.training.phases)
    assert _most(traced.training.phases)[HELD_BACKWARD] == 26_228_954_716 == analytic.peak
    top = max(analytic.training.phases, key=lambda p: p.bytes)
    assert top.where == "the head's weight gradient" and "4·V·h = 2,101,346,304" in top.arithmetic
    assert not any("lower bound" in note for note in analytic.notes)


@pytest.mark.parametrize("precision, checkpointing, later_backward, later_forward", [
    # each the traced second micro-step's, measured by --trace full on the same cut (tests/slow_tests.txt's
    # test_the_analytic_later_micro_step_equals_the_trace_at_every_moment runs fp32 live)
    ("fp32", "full", 26_048_532_060, 24_074_327_652),
    ("bf16-mixed", "none", 27_951_502_940, 26_182_688_356),
    ("bf16-mixed", "full", 26_963_676_764, 26_065_180_260),
    ("bf16-pure", "none", 13_124_998_748, 12_334_898_788),
    ("bf16-pure", "full", 13_026_365_020, 12_236_265_060),
    ("bf16-master", "none", 25_020_208_732, 24_230_108_772),
])
def test_the_head_moment_in_each_precision(precision, checkpointing, later_backward, later_forward):
    options = TrainingOptions(batch=2, seq=256, precision=precision, fits=False, grad_accum=2,
                              grad_checkpointing=checkpointing)
    phases = _most(estimate_training(_llama_3_8b_cut(), options).training.phases)
    assert (phases[HELD_BACKWARD], phases[HELD_FORWARD]) == (later_backward, later_forward)


def test_a_frozen_head_leaves_the_later_micro_step_a_lower_bound_named_so():
    options = TrainingOptions(batch=2, seq=256, precision="fp32", fits=False, grad_accum=2, freeze=("lm_head.*",))
    answer = estimate_training(_llama_3_8b_cut(), options)
    assert any("lower bound" in note for note in answer.notes)
    assert not any(p.where.startswith("the head's") for p in answer.training.phases)


@pytest.mark.parametrize("options, words", [
    (TrainingOptions(batch=4, grad_accum=3), "grad_accum 3 must divide the batch, 4 sequences a replica"),
    (TrainingOptions(batch=4, grad_accum=0), "grad_accum must be a whole number of micro-steps"),
    (TrainingOptions(batch=4, devices=2, zero="2", grad_accum=2), "grad_accum is counted on one device"),
])
def test_refused_in_one_line(options, words):
    with pytest.raises(OptionError, match=words):
        options.check()


def test_refused_beside_a_pipeline():
    from paramscope.cost.parallel.layout import layout_for

    with pytest.raises(OptionError, match="beside a pipeline"):
        TrainingOptions(batch=4, grad_accum=2, layout=layout_for(pp=2, micro_batches=4)).check()


def test_fsdp2_closed_form_equals_the_trace_in_every_micro_step():
    """llama-3-8b cut to 2 layers (full widths), dp 2 FSDP2, bf16-mixed, 2 × 256 in 2 micro-steps: the closed
    form's moments (its FSDP2 moments included) over the held gradient shards equal rank 0's two traced micro-steps
    to the byte; so do tp 2's, in fp32 (but its forward, the tp closed form's own), bf16-mixed and bf16-pure, with
    and without full checkpointing: the head's weight gradient beside the held ones, or the end of backward (the
    whole embedding gradient a tp rank makes beside the one it holds)."""
    import torch
    import transformers

    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.sources import resolve

    config = dict(resolve("llama-3-8b").config, num_hidden_layers=2)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    options = TrainingOptions(batch=2, seq=256, precision="bf16-mixed", fits=False, grad_accum=2)
    settings = StepSettings(batch=1, seq=256, precision="bf16-mixed", grad_accum=2)
    for traced_layout, layout in ((dict(dp=2, shard="fsdp"), dict(dp=2, zero="fsdp", fsdp_mixed_precision="autocast")),
                                  (dict(tp=2), dict(tp=2))):  # the trace's autocast, not FSDP2's default policy
        traced = {p.phase: p.bytes for p in trace_parallel_training(model, settings, **traced_layout).phases}
        answer = estimate_training(config, dataclasses.replace(options, layout=layout_for(**layout)))
        assert _most(answer.training.device.phases) == traced
        assert not any("lower bound" in note for note in answer.notes)
        if "dp" in traced_layout:
            assert traced[HELD_BACKWARD] == 21_385_253_468 and traced[HELD_FORWARD] == 22_049_983_060
        else:  # was a lower bound 658,767,872 B under: the head's fp32 weight gradient cast from its bf16 one
            assert traced[HELD_BACKWARD] == 15_060_278_876 and traced[HELD_FORWARD] == 14_341_088_868
            assert max(answer.training.device.phases, key=lambda p: p.bytes).where == \
                "the head's weight gradient cast to fp32"


@pytest.mark.parametrize("precision, checkpointing, later_backward", [
    # the traced tp 2 rank's second micro-step (trace_parallel_training, the cut above): its end of backward, the
    # whole embedding gradient beside the one held, 8·B·S of token ids referenced there too
    ("fp32", "none", 15_051_590_236),
    ("bf16-mixed", "full", 15_051_590_236),
    ("bf16-pure", "none", 7_525_796_444),
])
def test_a_tp_rank_s_later_micro_step(precision, checkpointing, later_backward):
    from paramscope.cost.parallel.layout import layout_for

    options = TrainingOptions(batch=2, seq=256, precision=precision, fits=False, grad_accum=2,
                              grad_checkpointing=checkpointing, layout=layout_for(tp=2))
    answer = estimate_training(_llama_3_8b_cut(), options)
    assert _most(answer.training.device.phases)[HELD_BACKWARD] == later_backward == answer.peak


def test_the_fits_rows_are_the_micro_step_s_with_every_gradient_held():
    """--gpu under --grad-accum: the largest batch is a micro-batch's, searched over the later micro-step (every
    gradient held): 102 on an H100 for the fp32 cut (112 without accumulation, whose step holds none between)."""
    config = _llama_3_8b_cut()
    options = TrainingOptions(batch=2, seq=256, precision="fp32", grad_accum=2, gpu="H100")
    answer = estimate_training(config, options)
    capacity = answer.budget.accelerator.memory - answer.reserve
    assert answer.budget.free == capacity - answer.peak and answer.budget.largest_batch == 102
    assert any("each row's batch is a micro-batch" in note for note in answer.notes)
    assert [f.largest_batch for f in answer.fits if f.accelerator.name == "H100 80GB"] == [102]
    for micro, fits in ((102, True), (103, False)):
        at = estimate_training(config, dataclasses.replace(options, batch=2 * micro, gpu=None, fits=False))
        assert (at.peak <= capacity) is fits
    assert estimate_training(config, dataclasses.replace(options, batch=1, grad_accum=1)).budget.largest_batch == 112


def test_the_derived_later_micro_step_is_replayed_equal_to_the_trace():
    """A class without an analytic recipe (Qwen3, 4 layers): the derived recipe's allocations replayed for a later
    micro-step (each new weight gradient live beside the held one until its node returns and AccumulateGrad adds
    it in) equal --trace full's two micro-steps at every phase (was a lower bound, the head's 512,000 B under)."""
    config = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256,
                  vocab_size=1000, max_position_embeddings=512, architectures=["Qwen3ForCausalLM"],
                  model_type="qwen3", num_hidden_layers=4, tie_word_embeddings=False)
    options = TrainingOptions(batch=2, seq=64, precision="fp32", fits=False, grad_accum=2)
    derived = estimate_training(config, options)
    traced = estimate_training(config, dataclasses.replace(options, trace="full"))
    assert derived.engine == "derived" and traced.engine == "traced"
    assert _most(derived.training.phases) == _most(traced.training.phases)
    assert _most(traced.training.phases)[HELD_BACKWARD] == 17_105_476 == derived.peak
    assert any("replayed from the derived recipe" in note for note in derived.notes)


@pytest.mark.parametrize("precision, seq, micro, inner, hidden, later_backward, where", [
    # each the traced second micro-step's backward peak (--trace full, trace_training's two micro-steps) on a 2-layer
    # Llama (4 heads, 2 KV heads, V 500) under full checkpointing, 2 micro-steps of `micro` sequences
    ("fp32", 16, 1, 344, 128, 8_239_324, "the recomputed last layer's down projection gradient"),  # was 8,199,836
    ("fp32", 64, 2, 344, 128, 9_656_028, "the recomputed last layer's down projection gradient"),
    ("bf16-pure", 128, 1, 344, 128, 4_936_924, "the recomputed last layer's down projection gradient"),
    ("bf16-pure", 64, 1, 512, 128, 5_659_868, "the recomputed last layer's down projection gradient"),
    ("bf16-mixed", 256, 1, 344, 128, 10_639_580, "the recomputed last layer's down projection gradient"),
    ("bf16-mixed", 128, 1, 344, 256, 21_868_892, "the recomputed down projection gradient cast to fp32"),
])
def test_the_recomputed_layer_s_later_backward_equals_the_trace(precision, seq, micro, inner, hidden,
                                                                 later_backward, where):
    """Full checkpointing: the later micro-step's backward peaks in the recomputed last layer, its down projection's
    new weight gradient made beside the held ones over the layer's recomputed activations (was a named lower bound,
    the first micro-step's moment over the held gradients: 39,488 B under at 16 tokens, 54,776 B over at 128 in
    bf16-pure)."""
    config = dict(hidden_size=hidden, intermediate_size=inner, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=500, architectures=["LlamaForCausalLM"], model_type="llama",
                  tie_word_embeddings=False)
    options = TrainingOptions(batch=2 * micro, seq=seq, precision=precision, fits=False, grad_accum=2,
                              grad_checkpointing="full")
    answer = estimate_training(config, options)
    held = [p for p in answer.training.phases if p.phase == HELD_BACKWARD]
    top = max(held, key=lambda p: p.bytes)
    assert (top.bytes, top.where) == (later_backward, where)
    assert not any("lower bound" in note for note in answer.notes)
    assert not any(p.where == "last layer recomputed" for p in held)


def test_trace_under_a_layout_runs_the_rank_s_micro_steps():
    """--trace beside --grad-accum under dp 2 × tp 2 (FSDP2's default MixedPrecisionPolicy, reduce-scattering every
    micro-step): rank 0 runs two micro-steps before its optimizer's (was refused: "one rank's trace runs one
    micro-step"), and the check sets the answer with its later micro-step beside the traced one. 2-layer Llama at h
    128, 2 × 256 in 2: the closed form's 6,069,212 B = the traced rank's second micro-step's backward."""
    from paramscope.cost.parallel.layout import layout_for

    config = dict(LLAMA, architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=False)
    options = TrainingOptions(batch=2, seq=256, precision="bf16-mixed", fits=False, grad_accum=2, trace=True,
                              layout=layout_for(dp=2, tp=2, zero="fsdp"))
    answer = estimate_training(config, options)
    traced = {p.phase: p.bytes for p in answer.training.device.traced.phases}
    assert list(traced) == ["forward", "backward", HELD_FORWARD, HELD_BACKWARD, "optimizer step"]
    assert traced[HELD_BACKWARD] == 6_069_212 == answer.peak
    check = next(note for note in answer.notes if note.startswith("check: rank 0's step traced"))
    assert "two micro-steps before the optimizer's" in check and "set_requires_gradient_sync(True)" in check
    assert check.endswith("the analytic 6,069,212 B is +0.000% from it")


@pytest.mark.parametrize("layout", [dict(tp=2), dict(dp=2, zero="fsdp", fsdp_mixed_precision="autocast")])
def test_the_fits_rows_beside_a_layout_are_the_micro_step_s(layout):
    """--gpu under --grad-accum beside a layout (was left out: 'not searched under gradient accumulation beside a
    layout'): the largest batch is a data-parallel rank's micro-batch, searched over the device's later micro-step
    (every gradient, its share, held), as on one device: the answer's own peak at that micro-batch fits, one more
    does not."""
    from paramscope.cost.parallel.layout import layout_for

    config = _llama_3_8b_cut()
    options = TrainingOptions(batch=2, seq=256, precision="bf16-mixed", grad_accum=2, gpu="H100",
                              layout=layout_for(**layout))
    answer = estimate_training(config, options)
    capacity = answer.budget.accelerator.memory - answer.reserve
    assert answer.budget.free == capacity - answer.peak
    largest = answer.budget.largest_batch
    assert any("each row's batch is a micro-batch" in note for note in answer.notes)
    assert [f.largest_batch for f in answer.fits if f.accelerator.name == "H100 80GB"] == [largest]
    for micro, fits in ((largest, True), (largest + 1, False)):
        at = estimate_training(config, dataclasses.replace(options, batch=2 * micro, gpu=None, fits=False,
                                                           layout=layout_for(**layout)))
        assert (at.peak <= capacity) is fits
        assert at.peak_phase.endswith("gradients held")


@pytest.mark.parametrize("precision, seq, micro, inner, later_backward", [
    # each the traced tp 2 rank's second micro-step (--trace beside tp 2, now run with the answer's checkpointing)
    ("fp32", 64, 2, 344, 5_233_372),  # was 5,385,428, the first micro-step's composite over the held gradients
    ("bf16-pure", 128, 1, 344, 3_014_876),
    ("bf16-mixed", 256, 1, 512, 7_412_956),
])
def test_a_tp_rank_s_recomputed_layer_equals_its_trace(precision, seq, micro, inner, later_backward):
    """Full checkpointing on a tp 2 rank (2-layer Llama at h 128): the recomputed last layer's down projection, cut
    over tp, makes its new weight gradient beside the held ones, the token ids the vocabulary-parallel embedding
    references (8·T) there too."""
    from paramscope.cost.parallel.layout import layout_for

    config = dict(LLAMA, intermediate_size=inner, architectures=["LlamaForCausalLM"], model_type="llama",
                  tie_word_embeddings=False)
    options = TrainingOptions(batch=2 * micro, seq=seq, precision=precision, fits=False, grad_accum=2,
                              grad_checkpointing="full", layout=layout_for(tp=2))
    answer = estimate_training(config, options)
    held = [p for p in answer.training.device.phases if p.phase == HELD_BACKWARD]
    assert max(p.bytes for p in held) == later_backward
    assert not any("lower bound" in note for note in answer.notes)


def test_trace_beside_a_layout_runs_the_answer_s_checkpointing():
    """--trace beside tp with --grad-checkpointing full traces the rank checkpointed too (it ran without: 6,736,604 B,
    -20.057% from the answer): fp32, 2 × 64 a micro-step, 2 micro-steps."""
    from paramscope.cost.parallel.layout import layout_for

    config = dict(LLAMA, architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=False)
    options = TrainingOptions(batch=4, seq=64, precision="fp32", fits=False, grad_accum=2, trace=True,
                              grad_checkpointing="full", layout=layout_for(tp=2))
    answer = estimate_training(config, options)
    traced = {p.phase: p.bytes for p in answer.training.device.traced.phases}
    assert traced[HELD_BACKWARD] == 5_233_372 == answer.peak


def test_fp16_mixed_under_checkpointing_keeps_the_lower_bound():
    """The recomputed layer's later micro-step was read off fp32, bf16-pure and bf16-mixed traces; fp16-mixed (no
    such reading) answers with the first micro-step's moments over the held gradients, named a lower bound (it
    raised KeyError: 'fp16-mixed' before; second review)."""
    options = TrainingOptions(batch=2, seq=64, precision="fp16-mixed", grad_accum=2, grad_checkpointing="full",
                              fits=False)
    estimate = estimate_training({**LLAMA, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}, options)
    assert any("later micro-step's moments are a lower bound" in note for note in estimate.notes)
    assert estimate.engine == "analytic" and estimate.peak > estimate.weights.bytes  # an answer, not a refusal
