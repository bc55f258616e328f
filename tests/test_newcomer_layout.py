"""A newcomer's trial of multi-device memory and FLOPs (issue 28): the options' batch is the one batch, a layout's
devices are FlopOptions' devices, counts agree with their nouns, --trace is refused up front where it cannot trace,
and the fits table's largest batch under a pipeline is one the pipeline takes."""

from __future__ import annotations

import pytest

from paramscope.cli import main
from paramscope.count import ParameterInfo
from paramscope.cost.flops.estimate import FlopOptions
from paramscope.cost.memory.training import TrainingOptions
from paramscope.cost.parallel.layout import ParallelLayout, layout_for
from paramscope.errors import OptionError


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- 1. the options' batch is the one batch ---------------------------------------------------------------------

def test_a_layout_without_a_batch_takes_the_options_batch():
    options = TrainingOptions(batch=4, layout=layout_for(tp=2, pp=2, micro_batches=4))
    options.check()
    assert (options.layout.batch, options.layout.micro_batches, options.layout.devices) == (4, 4, 4)
    # the pipeline's default microbatches, one sequence each, are the options' batch
    assert TrainingOptions(batch=6, layout=layout_for(pp=2)).layout.micro_batches == 6
    assert FlopOptions(batch=8, layout=layout_for(pp=2)).layout.micro_batches == 8
    # without a pipeline the microbatches stay 1; the layout compares equal to one built with the batch
    assert TrainingOptions(batch=5, layout=layout_for(tp=2)).layout == layout_for(tp=2, batch=5)


def test_a_layout_built_for_another_batch_is_refused_naming_both():
    for make in (lambda: TrainingOptions(batch=8, layout=layout_for(pp=2, micro_batches=4, batch=4)),
                 lambda: FlopOptions(batch=8, layout=layout_for(pp=2, micro_batches=4, batch=4))):
        with pytest.raises(OptionError) as caught:
            make().check()
        assert str(caught.value) == ("the layout was built for batch 4 (layout_for(batch=...)) but the options ask "
                                     "batch 8: give the batch once, in the options")


def test_microbatches_that_do_not_divide_the_options_batch_are_refused():
    with pytest.raises(OptionError, match=r"^micro_batches 4 must divide the batch, 6 sequences a replica$"):
        TrainingOptions(batch=6, layout=layout_for(pp=2, micro_batches=4)).check()


# --- 2. FlopOptions' devices default to the layout's ----------------------------------------------------------------

def test_flop_options_devices_default_to_the_layouts():
    options = FlopOptions(layout=layout_for(tp=2), batch=2)
    options.check()
    assert options.devices == 2
    assert FlopOptions().devices == 1
    with pytest.raises(OptionError, match=r"^devices 3 is not the layout's 2 devices$"):
        FlopOptions(layout=layout_for(tp=2), devices=3).check()


# --- 3. a count agrees with its noun ------------------------------------------------------------------------------

def test_one_sequence_a_replica_is_singular():
    with pytest.raises(OptionError, match=r"^micro_batches 2 must divide the batch, 1 sequence a replica$"):
        layout_for(pp=2, micro_batches=2, batch=1)


def test_routed_experts_over_one_rank_is_singular():
    from paramscope.cost.parallel.rules import Placement
    from paramscope.cost.parallel.states import device_states

    params = [ParameterInfo("experts.w", (4, 8), 32, True, "mlp.experts", "float32"),
              ParameterInfo("attn.w", (8, 8), 64, True, "attention.q", "float32")]
    placements = [Placement("experts.w", "mlp.experts", (4, 8), (2, 8), "replicated", None, True, "float32"),
                  Placement("attn.w", "attention.q", (8, 8), (8, 8), "replicated", None, False, "float32")]
    states = device_states(params, placements, ParallelLayout(dp=2, shard="fsdp", ep=2), precision="fp32",
                           optimizer="adamw", trainable=frozenset({"experts.w", "attn.w"}))
    assert states.arithmetic.endswith("; routed experts over 1 rank (2 / ep 2)")


def test_a_pipeline_of_one_microbatch_is_singular_in_the_flop_notes(capsys):
    base = ["flops", "llama-3-8b", "--training", "--pp", "2", "--width", "200"]
    code, one, _ = _cli(capsys, *base)  # batch 1: one microbatch of one sequence
    assert code == 0 and "pipeline: each stage's layers over 1 microbatch of batch / m sequences;" in one
    code, four, _ = _cli(capsys, *base, "--batch", "4")
    assert code == 0 and "pipeline: each stage's layers over all 4 microbatches of batch / m sequences;" in four


# --- 4. --trace refused up front where it cannot trace the layout ----------------------------------------------

def test_trace_under_a_pipeline_the_closed_form_answers_is_refused_before_the_build(capsys, monkeypatch):
    import paramscope.cost.memory.training as training

    def no_build(*args, **kwargs):
        raise AssertionError("built")

    monkeypatch.setattr(training, "training_answer", no_build)
    code, out, err = _cli(capsys, "memory", "llama-3-8b", "--training", "--pp", "2", "--seq", "512", "--trace")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("paramscope: error: --trace traces no stage here: pipeline parallelism over "
                          "LlamaForCausalLM has no traced engine: its stages are answered by the closed form "
                          "(Llama-style decoder recipe)")


def test_trace_is_refused_only_where_device_trace_declines_whatever_the_class():
    from paramscope.cost.parallel.trace_reach import untraced_by_layout

    refused = {"zero3": layout_for(dp=2, zero=3),
               "cp beside ep and tp under fsdp": layout_for(dp=2, cp=2, ep=4, tp=2, zero="fsdp"),
               "ep below dp": layout_for(dp=4, ep=2)}
    for name, layout in refused.items():
        with pytest.raises(OptionError, match=r"^trace traces no rank under this layout: "):
            TrainingOptions(trace="extended", layout=layout, batch=2).check()
    traced = (layout_for(tp=2), layout_for(dp=2, zero="fsdp"), layout_for(dp=2, ep=2), layout_for(cp=2, tp=2),
              layout_for(dp=2, cp=2, zero="fsdp"), layout_for(pp=2), layout_for(pp=2, dp=2, zero=3),
              layout_for(pp=2, cp=2),
              layout_for(pp=2, virtual_stages=2, batch=2))
    assert [untraced_by_layout(layout) for layout in traced] == [None] * len(traced)


def test_a_pipeline_whose_stages_are_replayed_from_a_derived_step_is_left_to_trace():
    from paramscope.cost.parallel.pipeline_trace_reach import untraced_pipeline
    from paramscope.sources import resolve

    layout = layout_for(pp=2)
    llama = resolve("llama-3-8b").config
    assert untraced_pipeline(llama, TrainingOptions(layout=layout, seq=512)) is not None
    # no closed form at eager attention, nor for GPT-2 at all: the stages are derived, and traced
    assert untraced_pipeline(llama, TrainingOptions(layout=layout, seq=512, attention="eager")) is None
    assert untraced_pipeline(resolve("gpt2").config, TrainingOptions(layout=layout, seq=512)) is None


# --- 5. under a pipeline the largest batch is one its microbatches divide ----------------------------------------

def test_the_largest_batch_is_searched_in_multiples_of_the_step():
    from paramscope.cost.hardware import Accelerator
    from paramscope.cost.memory.fits import fit_on

    # the figures take B // 8 sequences a microbatch: flat between multiples of 8, as a pipeline's are
    card = Accelerator("card", 1000, "", "test")
    fit = fit_on(card, lambda b, s: 100 * (b // 8) + s, 0, batch=8, seq=10, batch_step=8, contexts=False)
    assert fit.largest_batch == 72  # 100 · 9 + 10 ≤ 1,000; 80 is 1,010
    assert fit_on(card, lambda b, s: 100 * (b // 8) + s, 0, batch=8, seq=10, contexts=False).largest_batch == 79


def test_the_fits_answer_under_a_pipeline_is_a_batch_the_pipeline_takes(capsys):
    base = ["memory", "llama-3-8b", "--training", "--pp", "4", "--micro-batches", "8", "--seq", "2048", "--gpu",
            "h100", "--width", "250"]
    code, out, _ = _cli(capsys, *base, "--batch", "8")
    assert code == 0
    assert ("On H100 80GB: fits, 17.03 GiB to spare; largest batch 16 at 2,048 tokens (a multiple of the "
            "pipeline's 8 microbatches), largest context 4,379 at batch 8") in out
    assert "largest batch at 2,048 tokens, a multiple of the pipeline's 8 microbatches;" in out
    code, sixteen, _ = _cli(capsys, *base, "--batch", "16")
    assert code == 0 and "On H100 80GB: fits, 2.08 GiB to spare; largest batch 16 " in sixteen
    code, next_one, _ = _cli(capsys, *base, "--batch", "24")
    assert code == 0 and "On H100 80GB: does not fit, short by 12.90 GiB; largest batch 16 " in next_one
