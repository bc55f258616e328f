"""Pipeline stages (issue 28 §1-§2): the layers each device holds, the microbatches in flight counted against
torch's own schedules step by step, the per-stage model states exactly, and context parallelism's share."""

from __future__ import annotations

import pytest

from paramscope import inspect
from paramscope.cli import main
from paramscope.cost.memory.training import TrainingOptions, estimate_training
from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.parallel.pipeline import bubble, in_flight, stages
from paramscope.errors import ParamscopeError


def _torch_interleaved_in_flight(pp: int, micro: int, chunks: int, rank: int) -> int:
    """The most chunk-microbatches rank `rank` holds, counted along torch's own ScheduleInterleaved1F1B order:
    +1 at each forward, −1 at each backward."""
    import torch.distributed.pipelining.schedules as schedules

    schedule = object.__new__(schedules.ScheduleInterleaved1F1B)  # its order needs no stage objects
    schedule.pp_group_size, schedule.n_local_stages, schedule.rank = pp, chunks, rank
    schedule._n_microbatches = micro
    schedule.number_of_rounds = max(1, micro // pp)
    schedule.microbatches_per_round = micro // schedule.number_of_rounds
    live = most = 0
    for action in schedule._calculate_single_rank_operations(rank):
        if action is None:
            continue
        if action.computation_type == schedules.FORWARD:
            live += 1
        elif action.computation_type in (schedules.FULL_BACKWARD, schedules.BACKWARD_INPUT):
            live -= 1
        most = max(most, live)
    return most


def _one_f_one_b_in_flight(pp: int, micro: int, rank: int) -> int:
    """Step by step: rank r runs min(m, pp − r) warm-up forwards, then one forward and one backward a step."""
    warmup = min(micro, pp - rank)
    live = most = 0
    order = ["F"] * warmup
    for _ in range(micro - warmup):
        order += ["B", "F"]
    order += ["B"] * warmup
    for op in order:
        live += 1 if op == "F" else -1
        most = max(most, live)
    return most


@pytest.mark.parametrize("pp, micro, chunks", [(4, 8, 2), (4, 16, 2), (4, 8, 4), (2, 4, 2), (8, 8, 2),
                                                (4, 4, 2), (4, 12, 3)])
def test_interleaved_in_flight_is_torchs_order(pp, micro, chunks):
    layout = layout_for(devices=pp, pp=pp, micro_batches=micro, virtual_stages=chunks, batch=micro)
    assert layout.schedule == "interleaved"
    for rank in range(pp):
        assert in_flight(layout, rank) == _torch_interleaved_in_flight(pp, micro, chunks, rank)


@pytest.mark.parametrize("pp, micro", [(4, 8), (4, 2), (8, 32), (2, 1)])
def test_1f1b_and_gpipe_in_flight(pp, micro):
    one = layout_for(devices=pp, pp=pp, micro_batches=micro, batch=micro)
    gpipe = layout_for(devices=pp, pp=pp, micro_batches=micro, schedule="gpipe", batch=micro)
    for rank in range(pp):
        assert in_flight(one, rank) == _one_f_one_b_in_flight(pp, micro, rank)
        assert in_flight(gpipe, rank) == micro
    assert bubble(one) == (pp - 1) / (micro + pp - 1)


def test_stages_split_layers_in_order_and_name_an_uneven_split():
    plan = stages(layout_for(devices=3, pp=3, batch=3), 32)
    assert [s.layers[0] for s in plan] == [0, 11, 22] and [len(s.layers) for s in plan] == [11, 11, 10]
    assert plan[0].first and plan[-1].last and not plan[1].first
    interleaved = stages(layout_for(devices=2, pp=2, virtual_stages=2, batch=4), 8)
    assert interleaved[0].layers == (0, 1, 4, 5) and interleaved[1].layers == (2, 3, 6, 7)
    with pytest.raises(ParamscopeError, match="more than the model's 2 layers"):
        stages(layout_for(devices=4, pp=4, batch=4), 2)


def test_llama_3_70b_stages_hold_their_layers_exactly():
    """pp 4 × tp 8: 20 layers a stage; the embeddings on stage 0, the final norm and head on stage 3."""
    estimate = estimate_training("llama-3-70b", TrainingOptions(batch=16, layout=layout_for(
        devices=32, tp=8, pp=4, batch=16)))
    device = estimate.training.device
    h, i, kv, V = 8192, 28672, 1024, 128256
    layer = (2 * h * h + 2 * kv * h) // 8 + 3 * i * h // 8 + 2 * h
    embed = (V // 8) * h
    weights = [4 * (20 * layer + embed), 4 * 20 * layer, 4 * 20 * layer, 4 * (20 * layer + embed + h)]
    assert [s.weights for s in device.stages] == weights
    assert [s.in_flight for s in device.stages] == [4, 3, 2, 1]
    assert [s.layers for s in device.stages] == [(0, 19), (20, 39), (40, 59), (60, 79)]
    assert device.peak == max(s.peak for s in device.stages) == estimate.peak
    assert device.bubble == 3 / 19


def test_a_tied_head_costs_the_last_stage_a_copy():
    """Gemma ties its head to the embedding: across stages the last keeps a copy (Megatron's rule), with its
    gradient and optimizer states."""
    report = inspect("gemma-2b")
    estimate = estimate_training("gemma-2b", TrainingOptions(batch=2, seq=512, layout=layout_for(
        devices=2, pp=2, batch=2)))
    first, last = estimate.training.device.stages
    embed = next(p for p in report.params if p.role == "embeddings.word").numel
    layers = {p.name.split(".")[2] for p in report.params if p.name.startswith("model.layers.")}
    per_layer = sum(p.numel for p in report.params if p.name.startswith("model.layers.0."))
    assert len(layers) == 18
    assert first.weights == 4 * (embed + 9 * per_layer)
    assert last.weights == 4 * (embed + 9 * per_layer + 2048)  # the copy and the final norm


def test_pipeline_text_and_json(capsys):
    import json

    assert main(["memory", "llama-3-70b", "--training", "--devices", "32", "--tp", "8", "--pp", "4", "--batch",
                 "16", "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "Pipeline stages: 80 layers, 20 a stage" in out
    assert "1F1B steady state" in out
    assert main(["memory", "llama-3-70b", "--training", "--devices", "32", "--tp", "8", "--pp", "4", "--batch",
                 "16", "--json"]) == 0
    layout = json.loads(capsys.readouterr().out)["memory"]["layout"]
    assert [s["in_flight"] for s in layout["device"]["stages"]] == [4, 3, 2, 1]
    assert layout["device"]["bubble"] == pytest.approx(3 / 19)


@pytest.mark.parametrize("argv, message", [
    (["--pp", "2", "--batch", "3", "--micro-batches", "2"], "--micro-batches 2 must divide the batch, 3 sequences"),
    (["--micro-batches", "2", "--batch", "2"], "--micro-batches split a batch across pipeline stages"),
    (["--virtual-stages", "2", "--pp", "2", "--schedule", "1f1b"], "--virtual-stages > 1 needs the interleaved"),
    (["--sp"], "--sp (sequence parallel) needs tensor parallelism"),
])
def test_pipeline_options_refused(argv, message, capsys):
    assert main(["memory", "llama-3-8b", "--training", *argv]) == 2
    assert message in capsys.readouterr().err


def test_context_parallel_holds_its_share_of_the_sequence():
    """The closed form (which checks the derived rank, and answers where none is derived): cp 4 at 8,192 tokens is
    the recipe at 2,048 tokens and, kept for backward, ring attention's output copied for o_proj in each layer (torch's
    merge leaves it heads-major): 32 layers × B·(S / cp)·heads·head_dim × 2 B, held at the end of forward and the
    start of backward; no rotating K and V chunk (torch frees the all-gathered ones inside the attention)."""
    cp = estimate_training("llama-3-8b", TrainingOptions(seq=8192, layout=layout_for(devices=4, cp=4),
                                                         derive_layout=False))
    one = estimate_training("llama-3-8b", TrainingOptions(seq=2048))
    device = cp.training.device
    copies = 32 * 2048 * 32 * 128 * 2
    assert device.activations == one.activations.bytes + copies
    assert not device.comm
    moments = {p.where: p for p in device.phases}
    assert "ring attention's output copied for o_proj" in moments["end of forward"].arithmetic
    assert "ring attention's output copied" not in moments["end of backward"].arithmetic
