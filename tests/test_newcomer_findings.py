"""The smaller defects a newcomer's trial of the multi-GPU layouts found (issue 28), each held here: the device's
peak line sums to its figure under --ep and ZeRO-2 (the rank's gradients, not one device's)."""

from __future__ import annotations

import pytest

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import ParallelLayout
from parallel_steps import small_mixtral
from test_device_arithmetic import _check


@pytest.mark.parametrize("layout, peak, own", [
    # the ep rank holds its E / ep experts' gradients, not the whole model's (2,350,848 B on one device)
    (ParallelLayout(dp=2, ep=2), 5_474_264, "1,369,944 (one device's live at the backward peak"),
    (ParallelLayout(dp=2, shard="zero2"), 5_879_416, "1,177,560 (one device's live at the backward peak"),
    # ZeRO-2 beside ep: the rank's experts' states over their expert-data-parallel group (dp / ep = 1 rank, as
    # DeepSpeed-MoE partitions them), the rest over dp
    (ParallelLayout(dp=2, ep=2, shard="zero2"), 4_897_036, "1,177,560 (one device's live at the backward peak"),
    (ParallelLayout(dp=2), 9_405_784, "2,352,984 (one device's live at the backward peak"),
])
def test_a_data_and_expert_parallel_rank_peak_sums_to_its_figure(layout, peak, own):
    """A 5-layer Mixtral cut, 1 × 8 tokens (its backward peaks, the gradients live): the printed line is resident +
    the rank's own moment (+ the permute index) = the peak; the one device's words kept inside, gradients swapped."""
    report, estimate, _ = training_answer(small_mixtral(), TrainingOptions(
        batch=1, seq=8, precision="bf16-mixed", fits=False, layout=layout), use_cache=False)
    assert estimate.training.device.peak == peak
    line = _check(report, estimate)
    assert own in line
    if layout.ep > 1 or layout.shard == "zero2":
        assert "with the rank's gradients" in line and "in place of one device's 2,350,848" in line


def _json(capsys, *argv):
    import json

    from paramscope.cli import main

    assert main(["memory", "llama-3-8b", "--training", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["memory"]


def test_devices_zero3_is_the_dp_layout_and_per_device_is_its_device(capsys):
    """--devices 8 --zero 3 and --dp 8 --zero 3: one layout, one answer (ZeRO-3's gathered layer and head counted,
    872,448,000 + 2,101,346,304 B); under a layout `per_device` is the device's, so `peak` is per device as the
    schema says when `per_device` is set."""
    spelled, layout = _json(capsys, "--devices", "8", "--zero", "3"), _json(capsys, "--dp", "8", "--zero", "3")
    assert spelled == layout
    device = layout["layout"]["device"]
    # ZeRO's default precision is DeepSpeed's bf16 (bf16-master): the gathered layer and head in bf16, half autocast's
    assert layout["settings"]["precision"] == "bf16-master"
    assert sum(b["bytes"] for b in device["communication"]) == 1_486_897_152 == 2_973_794_304 // 2
    shares = layout["per_device"]
    assert shares["peak"] == layout["peak"]["bytes"] == device["peak"]["bytes"] and shares["peak_phase"] == "backward"
    assert (shares["weights"], shares["gradients"], shares["master_weights"]) == (
        2_007_565_312, 2_007_565_312, 4_015_130_624)  # 8,030,261,248 × 2 B / 8 twice; × 4 B / 8


# --- refusals and the layout's words -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["memory", "flops"])
def test_a_schedule_without_a_pipeline_is_refused_in_one_line(capsys, command):
    from paramscope.cli import main

    assert main([command, "llama-3-8b", "--training", "--schedule", "gpipe"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == \
        "paramscope: error: --schedule 'gpipe' orders a pipeline's microbatches: give pp > 1\n"


def test_virtual_stages_without_a_schedule_say_they_imply_interleaved():
    from paramscope.cost.parallel.layout import layout_for

    implied = layout_for(pp=2, virtual_stages=2, micro_batches=4)
    assert implied.words() == ("dp 1 × pp 2 (interleaved (implied by --virtual-stages, no --schedule given), 2 chunks "
                               "a device, 4 microbatches) = 2 devices")
    assert implied == layout_for(pp=2, virtual_stages=2, micro_batches=4, schedule="interleaved")
    assert layout_for(pp=2, virtual_stages=2, micro_batches=4, schedule="interleaved").words() == \
        "dp 1 × pp 2 (interleaved, 2 chunks a device, 4 microbatches) = 2 devices"


def test_ep_on_a_dense_class_says_it_cuts_nothing():
    from paramscope import TrainingOptions, estimate_training, layout_for

    rules = estimate_training("llama-3-8b", TrainingOptions(layout=layout_for(dp=2, ep=2), fits=False)
                              ).training.device.rules
    assert rules["attention.key"] == ("whole (ep 2: the class has no routed experts, so ep cuts nothing; each rank's "
                                      "step is dp's alone)")
    assert not any("cuts only the routed experts" in rule for rule in rules.values())


# --- wording: the words follow the rule and the count ---------------------------------------------------------------

@pytest.mark.parametrize("tp, shard", [
    (16, "heads and widths / 16, the KV heads replicated (one a rank: fewer KV heads than tp 16), the hidden size "
         "whole"),
    (4, "heads, KV heads and widths / 4, the hidden size whole"),
])
def test_the_tp_shard_words_say_the_kv_heads_are_replicated_past_their_count(tp, shard):
    from paramscope import TrainingOptions, estimate_training, layout_for

    device = estimate_training("llama-3-8b", TrainingOptions(layout=layout_for(tp=tp), fits=False)).training.device
    assert device.activations_from == f"analytic: Llama-style decoder on the rank's shard ({shard})"


def test_the_replica_sum_counts_its_devices_in_the_singular_and_names_ep(capsys):
    from paramscope.cli import main

    assert main(["flops", "mixtral-8x7b", "--training", "--dp", "8", "--ep", "8", "--width", "400"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "over the 1 device of a replica (tp × pp × cp; the ep 8 ranks are data-parallel replicas, each computing " \
           "as many token-expert pairs as its own tokens send, at balanced routing): the model's " \
           "163,251,706,920,960, exactly" in text
    assert "1 devices" not in text


def test_the_recompute_says_why_it_is_below_the_layers_forward():
    """llama-3-8b, 4 × 4,096, checkpointed: recompute 2.199e14 below the layers' forward (2.639e14): each layer's
    down projection is not rerun (61,572,651,155,456), flash attention's scores are (½ × 35,184,372,088,832)."""
    from paramscope import FlopOptions, estimate_flops

    estimate = estimate_flops("llama-3-8b", FlopOptions(training=True, batch=4, seq=4096, grad_checkpointing="full"))
    assert estimate.recompute == 219_902_325_555_200 == \
        228_698_418_577_408 + 35_184_372_088_832 - 61_572_651_155_456 + 17_592_186_044_416
    note = next(n for n in estimate.notes if n.startswith("recompute "))
    assert note == (
        "recompute 219,902,325,555,200 = the checkpointed layers' forward rerun in backward, their matmuls "
        "228,698,418,577,408 + their attention scores 35,184,372,088,832, less each layer's last matmul (mlp.down: 32 "
        "of them, 61,572,651,155,456), which is not rerun: torch's non-reentrant checkpoint stops a layer's rerun once "
        "backward has every tensor the layer saved, and nothing after that matmul saves its output; + flash "
        "attention's backward recomputing the scores, ½ × 35,184,372,088,832 = 17,592,186,044,416; the head and the "
        "embeddings are outside the layers and not rerun")
