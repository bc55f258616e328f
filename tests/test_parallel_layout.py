"""Multi-GPU layouts (issue 28): the sharding rules, one device's model states exactly, the options and the CLI.

The rules come from each parameter's role; transformers' own `base_model_tp_plan` must agree with them on every
module it names. One device's states are written out by hand here (nanoGPT-style arithmetic) and must be equal to
the byte. The analytic per-device step against torch's FSDP2 and DTensor on a fake process group is in
tests/test_parallel_trace.py and tests/test_parallel_check.py.
"""

from __future__ import annotations

import fnmatch
import json

import pytest

from paramscope import inspect
from paramscope.cli import main
from paramscope.cost.memory.training import TrainingOptions, estimate_training
from paramscope.cost.parallel.layout import ParallelLayout, layout_for
from paramscope.cost.parallel.rules import model_shape, place
from paramscope.errors import ParamscopeError

PLAN_RULE = {"colwise": "column", "packed_colwise": "column", "colwise_gather_output": "column",
             "rowwise": "row", "rowwise_split_input": "row", "embedding_rowwise": "vocabulary"}


@pytest.mark.parametrize("preset", ["llama-3-8b", "mistral-7b", "qwen2.5-7b", "gemma-2-9b", "phi-3-mini",
                                    "mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v3", "pythia-160m"])
def test_rules_agree_with_transformers_tp_plan(preset):
    """Every module transformers' plan names is cut as the plan says (column, row, vocabulary)."""
    import transformers

    report = inspect(preset)
    config_class = getattr(transformers, report.model.class_name.replace("ForCausalLM", "Config"))
    plan = config_class.base_model_tp_plan
    prefix = report.model.class_name and next(p.name for p in report.params).split(".")[0] + "."
    shape = model_shape(_text(preset), set())
    placements = {p.name: p for p in place(report.params, shape, tp=2, ep=1)}
    checked = 0
    for pattern, style in plan.items():
        rule = PLAN_RULE.get(style)
        if rule is None:  # "moe_tp_experts", "replicated_with_grad_allreduce": the module itself, not a cut
            continue
        for name, placement in placements.items():
            module = name.rsplit(".", 1)[0]
            if fnmatch.fnmatchcase(module, prefix + pattern) and name.endswith("weight") or \
                    fnmatch.fnmatchcase(name, prefix + pattern):
                if placement.tp == "kv-replicated":
                    continue
                assert placement.tp == rule, (name, style, placement.tp)
                checked += 1
    assert checked > 0


def _text(preset):
    from paramscope.api import as_source
    from paramscope.cost.dims import text_config
    from transformers import AutoConfig

    source = as_source(preset)
    return text_config(AutoConfig.for_model(**dict(source.config)))


def test_llama_3_8b_one_device_states_by_hand():
    """tp 8: q/k/v/gate/up cut by rows, o/down by columns, embeddings and head by vocabulary rows, norms whole."""
    h, i, kv, V, L = 4096, 14336, 1024, 128256, 32
    per_layer = (h * h + 2 * kv * h + h * h) // 8 + 3 * i * h // 8 + 2 * h
    params = L * per_layer + 2 * (V // 8) * h + h
    estimate = estimate_training("llama-3-8b", TrainingOptions(layout=layout_for(devices=8, tp=8)))
    device = estimate.training.device
    assert device.weights == 4 * params == 4_016_062_464
    assert device.gradients == 4 * params
    tensors = L * 9 + 3
    assert device.optimizer == 2 * 4 * params + 4 * tensors == 8_032_126_092
    assert estimate.peak == device.peak == estimate.training.device.peak_figure.bytes
    assert device.rules["attention.key"] == "column-parallel (output features / 8)"
    assert device.rules["embeddings.word"] == "vocabulary-parallel (⌈V / 8⌉ rows)"


def test_kv_heads_replicated_past_tp():
    """Llama-3-8B has 8 KV heads: at tp 16 each rank keeps the one KV head its queries read."""
    estimate = estimate_training("llama-3-8b", TrainingOptions(layout=layout_for(devices=16, tp=16)))
    device = estimate.training.device
    assert device.rules["attention.key"] == "KV heads replicated: one KV head a rank"
    h, i, V, L, hd = 4096, 14336, 128256, 32, 128
    per_layer = 2 * h * h // 16 + 2 * hd * h + 3 * i * h // 16 + 2 * h
    assert device.weights == 4 * (L * per_layer + 2 * (V // 16) * h + h)


def test_fsdp2_shards_each_parameter_along_its_first_dimension():
    """dp 3 does not divide 4,096: each rank allocates ⌈dim0 / 3⌉ rows of every parameter (FSDP2's padding);
    DeepSpeed's ZeRO-3 takes ⌈bytes / 3⌉ of one flat buffer."""
    report = inspect("llama-3-8b")
    rows = sum(-(-p.shape[0] // 3) * (p.numel // p.shape[0]) for p in report.params)
    fsdp = estimate_training("llama-3-8b", TrainingOptions(layout=layout_for(devices=3, zero="fsdp"))).training.device
    assert fsdp.weights == 4 * rows
    assert fsdp.optimizer == 2 * 4 * rows + 4 * len(report.params)
    zero3 = estimate_training("llama-3-8b", TrainingOptions(layout=layout_for(devices=3, zero="3"),
                                                            precision="bf16-mixed")).training.device  # fp32 weights
    total = report.total
    assert zero3.weights == -(-4 * total // 3)
    assert fsdp.weights > zero3.weights


def test_expert_parallel_splits_routed_experts_only():
    """Mixtral over ep 8 (dp 8): each rank keeps one of the 8 experts of each layer; attention, routers, norms and
    embeddings are whole."""
    report = inspect("mixtral-8x7b")
    experts = sum(p.numel for p in report.params if p.role == "moe.experts")
    device = estimate_training("mixtral-8x7b", TrainingOptions(layout=layout_for(devices=8, ep=8))).training.device
    assert device.weights == 4 * (report.total - experts + experts // 8)
    assert device.rules["moe.experts"].endswith("experts / ep 8")
    assert device.rules["moe.router"] == "whole (ep 8 cuts only the routed experts)"
    # a class without routed experts: ep cuts nothing, and the answer says so (it was silent)
    dense = estimate_training("llama-3-8b", TrainingOptions(layout=layout_for(devices=2, ep=2))).training.device
    assert "ep 2: LlamaForCausalLM has no routed experts, so expert parallelism cuts nothing" in " ".join(dense.notes)


@pytest.mark.parametrize("kwargs, message", [
    (dict(devices=6, tp=3), "--tp 3 would split attention heads: 32 heads are not a multiple of it"),
    (dict(devices=64, tp=64), "--tp 64 would split attention heads"),
    (dict(devices=6, tp=4), "--devices 6 is not a multiple of tp × pp × cp = 4"),
    (dict(devices=4, ep=3), "--ep 3 must divide dp × cp = 4"),
])
def test_layouts_refused_with_the_reason(kwargs, message, capsys):
    argv = ["memory", "llama-3-8b", "--training"]
    for key, value in kwargs.items():
        argv += [f"--{key}", str(value)]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--cp", "2"], "context parallelism over BertForMaskedLM is refused: its attention is bidirectional under the "
                    "batch's padding mask, and ring attention (torch's context_parallel) takes no mask"),
    (["--tp", "2", "--cp", "2"], "context parallelism over BertForMaskedLM is refused"),
])
def test_an_encoder_s_context_layouts_refused_in_one_line(flags, message, capsys):
    """BERT's tensor parallel (with --sp) is derived from traces (tests/test_parallel_check.py), its pipeline stages
    replayed from its derived step (tests/test_pipeline_stages.py); context parallel is refused before any trace,
    with the reason."""
    assert main(["memory", "bert-base-uncased", "--training", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_layout_options_are_for_training(capsys):
    """--tp, --pp, --dp and --ep serve across GPUs without --training (tests/test_parallel_serving.py,
    tests/test_serving_data_parallel.py); the rest train."""
    assert main(["memory", "llama-3-8b", "--cp", "2"]) == 2
    assert "--cp is for --training" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-2", "70000"])
def test_degrees_bounded(bad, capsys):
    assert main(["memory", "llama-3-8b", "--training", "--tp", bad]) == 2
    err = capsys.readouterr().err
    assert "--tp must be a whole number from 1 to 65,536" in err and "Traceback" not in err


def test_layout_words_and_checks():
    layout = layout_for(devices=16, tp=2, zero="fsdp")
    # FSDP2 takes its MixedPrecisionPolicy where none is asked (torchtitan's and accelerate's)
    assert layout == ParallelLayout(dp=8, shard="fsdp", tp=2, fsdp_mixed_precision="policy")
    assert layout.words() == "dp 8 (FSDP2, its MixedPrecisionPolicy) × tp 2 = 16 devices"
    assert layout_for(devices=16, tp=2, zero="fsdp", fsdp_mixed_precision="autocast").words() == \
        "dp 8 (FSDP2) × tp 2 = 16 devices"
    hybrid = layout_for(devices=32, zero="hybrid_shard", shard_group=8)
    assert hybrid.shard_degree == 8 and hybrid.words() == \
        "dp 32 (FSDP2 hybrid, shards over 8, its MixedPrecisionPolicy) = 32 devices"
    with pytest.raises(ParamscopeError, match="shard_group must divide dp × cp = 32"):
        layout_for(devices=32, zero="hybrid_shard", shard_group=5)
    with pytest.raises(ParamscopeError, match="shard_group is for hybrid sharding"):
        layout_for(devices=32, zero="fsdp", shard_group=8)


def test_cli_text_and_json(capsys):
    """DeepSpeed's ZeRO-3 × tp 2: the closed form answers; the device table, the rules and the JSON agree."""
    assert main(["memory", "llama-3-8b", "--training", "--devices", "8", "--tp", "2", "--zero", "3",
                 "--precision", "bf16-mixed", "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "One device (rank 0, the largest share): dp 4 (ZeRO-3) × tp 2 = 8 devices" in out
    assert "ZeRO-3 over 4 ranks" in out
    assert main(["memory", "llama-3-8b", "--training", "--devices", "8", "--tp", "2", "--zero", "3",
                 "--precision", "bf16-mixed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["memory"]
    layout = data["layout"]
    assert (layout["dp"], layout["tp"], layout["shard"], layout["devices"]) == (4, 2, "zero3", 8)
    device = layout["device"]
    assert device["peak"]["bytes"] == data["peak"]["bytes"] == max(p["bytes"] for p in device["phases"])
    assert device["weights"] == 4 * 4_015_263_744 // 4  # tp 2 shards, 4,015,263,744 parameters, ZeRO-3 over 4
    assert device["rules"]["mlp.down"] == "row-parallel (input features / 2)"
    # DeepSpeed gathers a layer and the head as they run: named, in the weights' dtype, on the tp rank's shards
    gathered = {b["name"]: b["bytes"] for b in device["communication"]}
    layer = (4096 * 4096 * 2 + 1024 * 4096 * 2) // 2 + 3 * 14336 * 4096 // 2 + 2 * 4096
    assert gathered == {"ZeRO-3's gathered layer (DeepSpeed)": 4 * layer,
                        "ZeRO-3's gathered head (DeepSpeed)": 4 * 128256 // 2 * 4096}


def test_fsdp2_is_derived_from_traces_of_the_laid_out_class(capsys):
    """FSDP2: one rank's step derived from short cuts traced with fully_shard applied (its in-backward buffers),
    the closed form beside as a check; kept, so the same question again answers without a build."""
    argv = ["memory", "llama-3-8b", "--training", "--devices", "8", "--zero", "fsdp", "--seq", "512",
            "--fsdp-mixed-precision", "autocast", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)["memory"]
    assert data["engine"] == "derived"
    assert data["layout"]["device"]["activations_from"].startswith("derived: one rank's step traced")
    assert any(n.startswith("check: the closed form gives") for n in data["notes"])
    assert data["peak"]["bytes"] == 38_856_105_620  # = rank 0 of the whole model traced (docs/commands.md)


def test_devices_and_zero_alone_keep_their_meaning():
    """--devices 8 --zero 3 is still DeepSpeed's flat ZeRO-3 over 8 data-parallel devices (no layout object)."""
    estimate = estimate_training("llama-3-8b", TrainingOptions(devices=8, zero="3", precision="bf16-mixed"))
    assert estimate.training.device is None and estimate.training.per_device["weights"] == 4_015_130_624
