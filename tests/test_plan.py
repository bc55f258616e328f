"""`paramscope plan` (issue 12): what trains, exactly as PEFT counts it, and the plan's training memory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paramscope.api import as_source, inspect_with_module
from paramscope.cost.training_estimate import TrainingOptions, estimate_training
from paramscope.errors import ParamscopeError
from paramscope.plan import PlanOptions, make_plan


def _plan(name: str, options: PlanOptions, **model_options):
    report, module = inspect_with_module(as_source(name), **model_options)
    return report, make_plan(report, module, options)


# peft 0.21 get_nb_trainable_parameters() on the same configs (the table)
@pytest.mark.parametrize("name, options, trainable, total", [
    ("llama-2-7b", PlanOptions(lora=8, target=("q_proj", "v_proj")), 4_194_304, 6_742_609_920),
    ("llama-2-7b", PlanOptions(lora=8, target=("q_proj", "v_proj"), dora=True), 4_456_448, 6_742_872_064),
    ("llama-2-7b", PlanOptions(lora=8, target=("all-linear",)), 19_988_480, 6_758_404_096),
    ("qwen2.5-3b", PlanOptions(lora=16), 3_686_400, 3_089_625_088),
], ids=["lora-qv", "dora-qv", "lora-all-linear", "qwen-default-targets"])
def test_adapter_counts_are_pefts(name, options, trainable, total):
    _, plan = _plan(name, options)
    assert (plan.trainable, plan.total) == (trainable, total) == plan.peft_counts
    assert plan.adapter == plan.total - _plan(name, PlanOptions())[1].total
    assert sum(t for t, _ in plan.by_role.values()) == plan.trainable


@pytest.mark.parametrize("rules, trainable", [
    ((("train", "head.classifier"),), 1_538),
    ((("freeze", "embeddings"),), 85_646_594),
])
def test_bert_sentiment_rules(rules, trainable):
    _, plan = _plan("bert-base-uncased", PlanOptions(rules=rules), task="sentiment")
    assert (plan.trainable, plan.total) == (trainable, 109_483_778)
    assert plan.rules[0].pattern == rules[0][1]


def test_rules_combine_in_order_and_echo_what_they_matched():
    _, plan = _plan("bert-base-uncased", PlanOptions(rules=(("train-last", "2"), ("train", "head.classifier"),
                                                            ("freeze", "*.layer.11.output.*"))),
                    task="ner", num_labels=9)
    last, head, frozen = plan.rules
    assert last.pattern == "last 2 blocks (bert.encoder.layer.10–11)" and last.tensors == 32
    assert head.parameters == 768 * 9 + 9
    assert plan.trainable == 2 * 7_087_872 + 6_921 - frozen.parameters


def test_a_pattern_that_names_nothing_is_one_line():
    with pytest.raises(ParamscopeError, match="--train 'wings' matches no parameter"):
        _plan("gpt2", PlanOptions(rules=(("train", "wings"),)))
    with pytest.raises(ParamscopeError, match="--train-last must be between 1 and 12"):
        _plan("gpt2", PlanOptions(rules=(("train-last", "13"),)))


def test_lora_peak_is_below_full_finetuning_and_traced():
    from paramscope.sources import resolve

    config = dict(resolve("llama-2-7b").config, num_hidden_layers=2)
    report, module = inspect_with_module(config)
    options = TrainingOptions(batch=1, seq=512, precision="bf16-mixed")
    _, full = estimate_training(make_plan(report, module, PlanOptions()).module, options)
    _, lora = estimate_training(make_plan(report, module, PlanOptions(lora=8, target=("q_proj", "v_proj"))).module,
                                options)
    assert lora.engine == "traced" and lora.peak < full.peak
    assert full.training.states.weights.bytes + full.training.states.gradients.bytes + \
        full.training.states.optimizer.bytes >= 16 * report.total
    assert lora.training.states.trainable == 2 * (8 * 4096 * 2) * 2  # q and v, A and B, 2 layers


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "paramscope", *args], capture_output=True, text=True, timeout=300)


def test_cli_plan_json():
    result = _cli("plan", "bert-base-uncased", "--task", "sentiment", "--train", "head.classifier", "--seq", "128",
                  "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    assert plan["method"] == "freeze" and plan["trainable"] == 1_538 and plan["total"] == 109_483_778
    assert plan["by_role"]["head.classifier"] == {"trainable": 1_538, "frozen": 0}
    assert plan["memory"]["mode"] == "training" and plan["memory"]["gradients"]["bytes"] == 4 * 1_538


def test_cli_plan_text_lora_counts_only():
    result = _cli("plan", "llama-2-7b", "--lora", "8", "--target", "q_proj,v_proj", "--no-memory", "--width", "120")
    assert result.returncode == 0, result.stderr
    assert "trainable 4,194,304 of 6,742,609,920" in result.stdout and "(the same)" in result.stdout


@pytest.mark.parametrize("args, named", [
    (("--lora", "0"), "--lora"),
    (("--dora",), "need --lora"),
    (("--train-last", "x"), "'x'"),
    (("--freeze", "nothing_here"), "'nothing_here'"),
])
def test_cli_plan_bad_options_give_one_line(args, named):
    result = _cli("plan", "gpt2", "--no-memory", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and named in result.stderr


def test_plan_flops_full_is_twice_forward_and_lora_skips_base_weight_gradients():
    from paramscope.plan import plan_flops
    from paramscope.sources import resolve

    config = dict(resolve("llama-2-7b").config, num_hidden_layers=2)
    report, module = inspect_with_module(config)
    full = plan_flops(make_plan(report, module, PlanOptions()), batch=1, seq=128)
    assert full.model_backward == 2 * full.forward
    lora = plan_flops(make_plan(report, module, PlanOptions(lora=8, target=("q_proj", "v_proj"))), batch=1, seq=128)
    adapters = 2 * 128 * (2 * 2 * (8 * 4096 + 4096 * 8))  # A and B on q and v, 2 layers, forward
    assert lora.forward == full.forward + adapters
    # backward: input gradients (at most a forward's worth: with the embedding frozen, the first layer's
    # projections need none) and the adapters' weight gradients, no base weight gradient
    assert 0 < lora.model_backward <= lora.forward + adapters < full.model_backward
