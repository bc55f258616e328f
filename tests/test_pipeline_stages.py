"""Pipeline stages of classes whose step is derived from traces: each stage's figures replayed from the one-device
recipe's segments (cost/parallel/stage_recipe.py) equal MemTracker's on the real class cut to that stage and run as
PipelineStage runs it (cost/traced/pipeline_stage.py): k microbatch forwards in flight, then the first one's backward
from a received output gradient, then the next backward with the gradients held. The stages and their in-flight
counts are pipeline.stages' (pp 3, 3 microbatches, 1F1B on 5 layers: layers 0–1 with 3 in flight, 2–3 with 2, 4 with
1); the answer, its JSON and its HTML carry them."""

from __future__ import annotations

import json

import pytest

from paramscope.cost.parallel.layout import ParallelLayout

MICRO, SEQ = 2, 64


def _config(name: str):
    import transformers as T

    if name == "gpt2":
        return T.GPT2Config(n_embd=128, n_head=4, n_layer=5, vocab_size=500, bos_token_id=0, eos_token_id=0,
                            architectures=["GPT2LMHeadModel"]), "transformer.h"
    return T.MixtralConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           intermediate_size=256, vocab_size=500, num_hidden_layers=5, num_local_experts=4,
                           num_experts_per_tok=2, architectures=["MixtralForCausalLM"]), "model.layers"


@pytest.mark.parametrize("name", ["gpt2", "mixtral"])
def test_each_stage_replayed_from_the_recipe_equals_memtracker_on_the_stage(name):
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.render.html.cost import render_memory_html, stage_parts
    from paramscope.render.memory import memory_to_dict

    config, _ = _config(name)
    layout = ParallelLayout(pp=3, micro_batches=3, schedule="1f1b")
    report, estimate, view = training_answer(config, TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    rows = device.stages
    assert [(r.layers, r.in_flight) for r in rows] == [((0, 1), 3), ((2, 3), 2), ((4, 4), 1)]
    residual = MICRO * SEQ * 128 * 4  # the hidden state sent and received, fp32 under bf16-mixed
    assert len(device.traced) == len(rows)  # --trace: each stage traced (traced/pipeline_stage.py)
    for row, traced in zip(rows, device.traced):
        derived = row.replayed
        assert (traced.first, traced.stop, traced.in_flight) == (row.layers[0], row.layers[1] + 1, row.in_flight)
        assert (derived.held, derived.forward_peak, derived.peak) == (traced.held, traced.forward_peak,
                                                                        traced.peak), (name, row.rank)
        assert row.activations == derived.held
        # a later backward (1F1B's steady state: gradients held, each new one added into its .grad), above what the
        # first backward left, to the byte: on GPT-2 the first stage's wte gradient is its embedding's own, kept as
        # the .grad (its tied head is on the last stage), not the recipe's sum of the two
        # stage 0 holds all 3 microbatches at its first backward: the next comes with one fewer (the drain); the
        # others take one more forward first (1F1B's steady state)
        assert derived.later_in_flight == row.in_flight - (row.rank == 0)
        rise = traced.later_peak - traced.after_backward
        replayed = derived.later_peak - derived.after_first_backward
        assert rise == replayed, (rise, replayed)
        assert derived.received == (0 if row.first else residual)
        assert derived.output_gradient == (0 if row.last else residual)
    assert device.peak == max(r.peak for r in rows)
    worst = next(r for r in rows if r.peak == device.peak)
    names = {b.name for b in device.comm}
    assert ("pipeline's received hidden state" in names) == (not worst.first)
    assert ("pipeline's received output gradient" in names) == (not worst.last)
    data = json.loads(json.dumps(memory_to_dict(estimate)))
    stages = data["layout"]["device"]["stages"]
    assert [(s["activations"], s["peak"]) for s in stages] == [(r.activations, r.peak) for r in rows]
    assert data["layout"]["device"]["activations_from"].startswith("derived: stage")
    for stage in stages:  # the HTML's per-stage bars: parts adding up to the stage's peak, none negative
        stack = stage_parts(data, stage)
        assert sum(v for _, v, _ in stack) == stage["peak"] and all(v >= 0 for _, v, _ in stack), stack
    assert "Pipeline stages" in render_memory_html(report, estimate)
    assert sum("(equal)" in note and note.startswith("check: stage") for note in estimate.notes) == len(rows)


@pytest.mark.parametrize("argv, message", [
    (["t5-small", "--pp", "2"], "pipeline parallelism over T5ForConditionalGeneration is refused: an "
                                "encoder-decoder has two layer stacks"),
])
def test_what_a_derived_class_s_stages_do_not_cover_is_refused_in_one_line(argv, message, capsys):
    from paramscope.cli import main

    assert main(["memory", argv[0], "--training", *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
