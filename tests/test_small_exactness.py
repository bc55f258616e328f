"""Small exactness defects named at stop 43 (issue 28): each figure derived equals the traced one to the byte on a
cut, or the output says what it is."""

from __future__ import annotations


from parallel_steps import small_mixtral

SEQ = 32  # the point both tests answer: the second reads the first's derived one-device recipe from the cache


def test_one_device_derived_optimizer_step_holds_the_expert_offsets_as_the_trace_does():
    """transformers' grouped-mm fallback (experts not bf16) keeps each MoE layer's int32 offsets on its autograd
    node (ctx.offs) past the backward: 4 B × 4 experts × 5 layers = 80 B the derived step counted nowhere."""
    import transformers

    from paramscope.cost.memory.expert_offsets import expert_offsets
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.traced.step import StepSettings, trace_training

    config = small_mixtral()
    report, estimate, _ = training_answer(config, TrainingOptions(batch=2, seq=SEQ, precision="bf16-mixed",
                                                                  fits=False))
    derived = {p.phase: p for p in estimate.training.phases}
    assert estimate.training.activation_source == "derived"
    traced = trace_training(transformers.MixtralForCausalLM(config),
                            StepSettings(batch=2, seq=SEQ, precision="bf16-mixed", optimizer="adamw"))
    measured = {p.phase: p.bytes for p in traced.phases}
    assert measured["optimizer step"] == derived["optimizer step"].bytes == 9_403_728
    assert (derived["forward"].bytes, derived["backward"].bytes) == (measured["forward"], measured["backward"]) == \
        (9_771_112, 9_818_200)
    assert "5 × 4 experts × 4 B = 80 B" in derived["optimizer step"].arithmetic

    # the rule: fp32 and mixed precision run the fallback; bf16 weights run torch's grouped_mm, which keeps nothing;
    # an experts implementation other than grouped_mm makes no offsets
    assert [expert_offsets(report.params, p)[0] for p in ("fp32", "bf16-mixed", "bf16-pure")] == [80, 80, 0]
    eager = small_mixtral()
    eager._experts_implementation = "eager"
    assert expert_offsets(report.params, "fp32", config=eager) == (0, "")


def test_a_data_parallel_expert_rank_holds_its_own_offsets_and_ids_at_the_step():
    """dp 2 × ep 2 without tp runs one device's step with the experts cut: at the optimizer step the rank holds the
    offsets of its E / ep = 2 experts a layer (not one device's 4) and the token ids its replicated rest's DTensor
    input aliases (8·B·S), as its trace does: 5 × 2 × 4 B + 8 × 2 × 32 B = 552 B over the states (it was 552 B
    under, then 472 B under with one device's offsets)."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.layout import ParallelLayout

    _, estimate, _ = training_answer(small_mixtral(), TrainingOptions(
        batch=2, seq=SEQ, precision="bf16-mixed", fits=False, trace=True, layout=ParallelLayout(dp=2, ep=2)))
    device = estimate.training.device
    step = next(p for p in device.phases if p.phase == "optimizer step")
    traced = next(p for p in device.traced.phases if p.phase == "optimizer step")
    assert step.bytes == traced.bytes == 5_472_040
    assert "the token ids 8·B·S = 512 B" in step.arithmetic and "5 × 2 experts × 4 B = 40 B" in step.arithmetic


def test_a_forward_pipeline_has_per_stage_flops_and_no_schedule_or_bubble(capsys):
    """`flops MODEL --pp 2` without --training: the stages run forwards only, so no 1F1B and no bubble (a serving
    engine keeps a batch in flight on every stage); the default microbatches (training's, one a sequence) do not
    apply, and microbatches or a schedule given are refused in one line."""
    import json

    import pytest

    from paramscope.cli import main
    from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.errors import OptionError

    estimate = estimate_flops("llama-3-8b", FlopOptions(batch=8, layout=layout_for(pp=2)))
    device = estimate.device
    assert device.forward_only and device.bubble == 0.0 and device.layout.micro_batches == 1
    assert [s.forward for s in device.stages] == [123_145_302_310_912, 140_359_531_233_280]
    assert sum(s.forward for s in device.stages) == estimate.forward == 263_504_833_544_192
    assert device.step == device.forward == device.per_microbatch and device.backward is None
    assert device.layout_words == "dp 1 × pp 2 (forward only) = 2 devices"
    assert "idle" not in device.stages_words and "no schedule and no bubble counted" in device.stages_words
    trained = estimate_flops("llama-3-8b", FlopOptions(batch=8, training=True, layout=layout_for(pp=2))).device
    assert trained.bubble == 1 / 9 and "(1F1B, 8 microbatches)" in trained.layout_words
    assert [s.forward for s in trained.stages] == [s.forward for s in device.stages]

    assert main(["flops", "llama-3-8b", "--pp", "2", "--width", "200"]) == 0
    text = capsys.readouterr().out
    assert "One device: dp 1 × pp 2 (forward only) = 2 devices" in text
    assert "1F1B" not in text and "bubble 50.0%" not in text and "no schedule and no bubble counted" in text
    assert main(["flops", "llama-3-8b", "--pp", "2", "--json"]) == 0
    flops = json.loads(capsys.readouterr().out)["flops"]["device"]
    assert (flops["layout"]["schedule"], flops["bubble"], flops["backward"]) == (None, 0.0, None)
    for flag in (["--schedule", "gpipe"], ["--micro-batches", "2", "--batch", "2"], ["--virtual-stages", "2"]):
        assert main(["flops", "llama-3-8b", "--pp", "2", *flag]) == 2
        err = capsys.readouterr().err
        assert f"{flag[0]} is for --training" in err and err.count("\n") == 1
    with pytest.raises(OptionError, match="micro_batches"):
        FlopOptions(batch=8, layout=layout_for(pp=2, micro_batches=4)).check()


def test_a_pipeline_trace_refusal_reads_the_recorded_config_without_transformers():
    """`memory llama-3-8b --training --pp 2 --trace` is refused before the build (the closed form answers the
    stages): from the recorded cost facts' config and class, the same words as from the config's dict, and without
    importing transformers (its config and modeling modules cost seconds the answer itself, 0.4 CPU s, does not)."""
    import subprocess
    import sys

    from paramscope.cost.facts.store import recorded_view
    from paramscope.cost.memory.training import TrainingOptions
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.parallel.pipeline_trace_reach import untraced_pipeline
    from paramscope.sources import resolve

    source = resolve("llama-3-8b")
    _, view = recorded_view(source)
    for attention, refused in ((None, True), ("eager", False)):  # no closed form at eager attention: traced
        options = TrainingOptions(layout=layout_for(pp=2), seq=512, attention=attention)
        why = untraced_pipeline(view.config, options, class_name=view.class_name)
        assert why == untraced_pipeline(source.config, options) and (why is not None) == refused
    code = ("import sys; from paramscope.cli import main; "
            "rc = main(['memory', 'llama-3-8b', '--training', '--pp', '2', '--trace']); "
            "print(rc, 'transformers' in sys.modules, 'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["2", "False", "False"], run.stderr
    assert "--trace traces no stage here: pipeline parallelism over LlamaForCausalLM" in run.stderr
