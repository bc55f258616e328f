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
