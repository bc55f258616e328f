"""`plan --no-memory` without a build (issue 25 §3): a template's stand-ins and PEFT's arithmetic give the very Plan
the meta build and PEFT give, field by field, and the planned stand-ins count as the PEFT model itself counts."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import subprocess
import sys

import pytest

import paramscope.plan as plan_module
import paramscope.plan_arithmetic as arithmetic_module
from paramscope.api import as_source, inspect_module, inspect_source, inspect_with_module
from paramscope.count import count_module
from paramscope.peft_source import peft_facts
from paramscope.plan import PlanOptions, make_plan
from paramscope.plan_arithmetic import plan_counts, plan_stand_ins, planned_report

@pytest.fixture(scope="module", autouse=True)
def _seq_cls_template(tmp_path_factory):
    """No template ships for BERT's classifiers: record them into a cache of this module's own, as the CLI does
    after a build, so that their plans answer without one (or decline for what they are, not for want of a
    template). Its own: other modules test that these tasks build until a template is recorded."""
    from paramscope.template_record import record_template

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("plan-nobuild-cache")))
        for task in ("text-classification", "token-classification"):
            template, said = record_template(as_source("bert-base-uncased").config, task=task)
            assert template is not None, said
        yield


@functools.lru_cache(maxsize=None)
def _built(name: str, task: str | None):
    return inspect_with_module(as_source(name), task=task)


def _both(name: str, options: PlanOptions, task: str | None = None):
    """(the Plan without a build, its planned stand-ins, the Plan PEFT gives on the meta build)."""
    source = as_source(name)
    report, stand_ins = inspect_source(source, task=task)
    assert report.model.engine == "template"
    answered = plan_stand_ins(report, stand_ins, options, source.config)
    assert answered is not None
    built_report, module = _built(name, task)
    return answered[0], answered[1], make_plan(built_report, module, options), report


CASES = [
    ("llama-2-7b", PlanOptions(lora=16), None),
    ("llama-2-7b", PlanOptions(lora=16, target=("all-linear",)), None),
    ("llama-2-7b", PlanOptions(lora=8, dora=True, rslora=True), None),
    ("llama-2-7b", PlanOptions(lora=8, modules_to_save=("lm_head",), dropout=0.1), None),
    ("llama-2-7b", PlanOptions(lora=8, rules=(("train-last", "2"),)), None),
    ("llama-2-7b", PlanOptions(), None),
    ("llama-2-7b", PlanOptions(rules=(("train-last", "2"),)), None),
    ("llama-2-7b", PlanOptions(rules=(("freeze", "embeddings"), ("train", "head.lm"))), None),
    ("llama-2-7b", PlanOptions(lora=4, target=("embed_tokens", "q_proj"), dora=True, adapter_dtype="bfloat16"), None),
    ("llama-2-7b", PlanOptions(lora=4, base_dtype="float32"), None),
    ("gpt2", PlanOptions(lora=8), None),  # Conv1D: weight in × out
    ("gpt2", PlanOptions(lora=8, dora=True, target=("c_attn", "c_fc", "wte"), modules_to_save=("lm_head",)), None),
    ("gpt2", PlanOptions(lora=8, target=("all-linear",)), None),
    ("bert-base-uncased", PlanOptions(lora=8), "text-classification"),  # modules_to_save: the classifier
    ("bert-base-uncased", PlanOptions(lora=8, target=("all-linear",)), "text-classification"),
    ("bert-base-uncased", PlanOptions(lora=8, dora=True, modules_to_save=("pooler",)), "text-classification"),
    ("bert-base-uncased", PlanOptions(rules=(("train", "head.classifier"),)), "text-classification"),
    ("bert-base-uncased", PlanOptions(lora=8), None),  # BertForMaskedLM: no task type, a plain PeftModel
    ("t5-small", PlanOptions(lora=8), None),
    ("t5-small", PlanOptions(lora=8, target=("all-linear",)), None),
    ("mixtral-8x7b", PlanOptions(lora=8, target=("q_proj", "o_proj")), None),
    ("mixtral-8x7b", PlanOptions(rules=(("train-last", "1"),)), None),
    ("qwen1.5-moe-a2.7b", PlanOptions(lora=8, target=("q_proj", "v_proj")), None),
]
IDS = ["llama-default", "llama-all-linear", "llama-dora-rslora", "llama-save-lm_head", "llama-lora-train-last",
       "llama-full", "llama-freeze", "llama-rules", "llama-embed-dora-bf16", "llama-fp32-base", "gpt2-conv1d",
       "gpt2-tied-save-dora", "gpt2-all-linear", "bert-seq-cls", "bert-seq-cls-all-linear", "bert-seq-cls-dora-save",
       "bert-seq-cls-freeze", "bert-mlm", "t5-default", "t5-all-linear", "mixtral-attention", "mixtral-freeze",
       "qwen-moe-qv"]


@pytest.mark.parametrize("name, options, task", CASES, ids=IDS)
def test_the_plan_without_a_build_is_the_builds(name, options, task):
    plan, stand_ins, built, report = _both(name, options, task)
    for f in dataclasses.fields(built):
        if f.compare:
            assert getattr(plan, f.name) == getattr(built, f.name), f.name
    assert plan == built and plan.module is None and plan.engine == "arithmetic" and built.engine == "build"
    # the planned stand-ins count as the PEFT model does: names, shapes, flags, roles, dtypes, ties, buffers, tree
    mine, peft = count_module(stand_ins), count_module(built.module)
    for part in ("parameters", "tied", "buffers", "breakdown", "tree", "counts"):
        assert getattr(mine, part) == getattr(peft, part), part
    planned, inspected = planned_report(stand_ins, report), inspect_module(built.module)
    for part in ("model", "params", "tree", "components", "shared_layers", "num_layers"):
        assert getattr(planned, part) == getattr(inspected, part), part


@pytest.mark.parametrize("name, options, task", [
    ("mixtral-8x7b", PlanOptions(lora=8), None),  # PEFT converts MoE targets first: its defaults are lost (refused)
    ("mixtral-8x7b", PlanOptions(lora=8, target=("all-linear",)), None),  # the experts become target parameters
    ("qwen1.5-moe-a2.7b", PlanOptions(lora=8, target=("gate_proj",)), None),
    ("llama-2-7b", PlanOptions(lora=8, qlora="nf4"), None),
    # BertForMaskedLM says which module is its output embedding (its own get_output_embeddings)
    ("bert-base-uncased", PlanOptions(lora=8, target=("all-linear",)), None),
    ("bert-base-uncased", PlanOptions(lora=8), "token-classification"),  # a task type not mirrored
    ("llama-2-7b", PlanOptions(lora=8, modules_to_save=("proj",)), None),  # PEFT's endswith picks the q_proj layers
], ids=["mixtral-default", "mixtral-all-linear", "qwen-experts", "qlora", "bert-mlm-all-linear", "bert-token-cls",
        "llama-loose-save"])
def test_what_is_not_mirrored_answers_none(name, options, task):
    source = as_source(name)
    report, stand_ins = inspect_source(source, task=task)
    assert report.model.engine == "template"
    assert plan_counts(report, stand_ins, options, source.config) is None


def test_a_plan_without_a_build_has_nothing_to_trace():
    from paramscope.errors import UnsupportedError

    source = as_source("gpt2")
    plan = plan_counts(*inspect_source(source), PlanOptions(lora=8), source.config)
    assert plan.module is None
    with pytest.raises(UnsupportedError, match="counted without a build"):
        plan_module.plan_memory(plan)
    with pytest.raises(UnsupportedError, match="counted without a build"):
        plan_module.plan_flops(plan, batch=1, seq=8)


def test_a_bad_target_is_refused_as_the_build_refuses_it():
    from paramscope.errors import OptionError

    source = as_source("gpt2")
    report, stand_ins = inspect_source(source)
    with pytest.raises(OptionError, match="matches no module that LoRA adapts"):
        plan_counts(report, stand_ins, PlanOptions(lora=8, target=("q_proj",)), source.config)


def test_without_peft_only_plans_without_adapters_answer(monkeypatch):
    source = as_source("gpt2")
    report, stand_ins = inspect_source(source)
    monkeypatch.setattr(arithmetic_module, "peft_facts", lambda: None)
    assert plan_counts(report, stand_ins, PlanOptions(lora=8), source.config) is None
    assert plan_counts(report, stand_ins, PlanOptions(rules=(("train-last", "1"),)), source.config) is not None
    assert plan_counts(report, inspect_with_module(source)[1], PlanOptions(), source.config) is None  # a real module


def test_pefts_facts_are_read_from_its_source_not_copied():
    from peft.utils import constants
    from peft.utils.transformers_weight_conversion import _MOE_TARGET_MODULE_MAPPING

    facts = peft_facts()
    assert dict(facts.default_targets) == {k: v if isinstance(v, str) else tuple(v) for k, v in
                                           constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.items()}
    assert facts.seq_cls_heads == tuple(constants.SEQ_CLS_HEAD_NAMES)
    assert facts.condense_from == constants.MIN_TARGET_MODULES_FOR_OPTIMIZATION
    assert facts.all_linear == constants.INCLUDE_LINEAR_LAYERS_SHORTHAND
    assert dict(facts.moe_renamed) == {k: frozenset(v) for k, v in _MOE_TARGET_MODULE_MAPPING.items()}
    assert facts.seq_cls_saved == ("classifier", "score") and "mamba" in facts.mamba_types


def _cli(argv: list[str], *, build: bool) -> str:
    """The CLI's stdout in this process; `build`: as if the arithmetic had not answered."""
    from paramscope.cli import main

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        if build:
            patch.setattr(arithmetic_module, "plan_stand_ins", lambda *args, **kwargs: None)
        with contextlib.redirect_stdout(out):
            assert main(argv) == 0
    return out.getvalue()


@pytest.mark.parametrize("argv", [
    ["plan", "llama-2-7b", "--lora", "16", "--target", "all-linear", "--no-memory", "--width", "100"],
    ["plan", "gpt2", "--lora", "8", "--dora", "--modules-to-save", "lm_head", "--train-last", "2", "--no-memory",
     "--depth", "5", "--width", "120"],
    ["plan", "bert-base-uncased", "--task", "sentiment", "--lora", "4", "--no-memory", "--width", "100"],
], ids=["llama-all-linear", "gpt2-dora-save-rules", "bert-seq-cls"])
def test_cli_text_is_the_builds_but_for_the_engine_line(argv):
    fast, built = _cli(argv, build=False).splitlines(), _cli(argv, build=True).splitlines()
    assert fast[1] == "  engine: counts from the template and PEFT's arithmetic (no build)"
    assert built[1] == "  engine: counts from the meta build, adapters applied by PEFT"
    assert fast[:1] + fast[2:] == built[:1] + built[2:] and "What trains, by module" in fast


def test_cli_json_is_the_builds_but_for_the_engines():
    argv = ["plan", "gpt2", "--lora", "8", "--target", "all-linear", "--no-memory", "--json"]
    fast, built = json.loads(_cli(argv, build=False)), json.loads(_cli(argv, build=True))
    assert (fast["plan"]["engine"], built["plan"]["engine"]) == ("arithmetic", "build")
    assert (fast["model"]["engine"]["name"], built["model"]["engine"]["name"]) == ("template", "build")
    for document in (fast, built):
        del document["plan"]["engine"], document["model"]["engine"]
    assert fast == built


def test_cli_no_memory_imports_no_torch():
    code = ("import sys; from paramscope.cli import main; "
            "rc = main(['plan', 'llama-2-7b', '--lora', '16', '--target', 'all-linear', '--no-memory']); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch', rc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("no torch 0")
    assert "trainable 39,976,960 of 6,778,392,576" in result.stdout.replace("\n  ", " ")


# Stops the process as torch is first imported (a build is starting): what a test that asks only whether the run
# builds needs, without the build's seconds.
_STOP_AT_TORCH = ("import os, sys\n"
                  "class StopAtTorch:\n"
                  "    def find_spec(self, name, path=None, target=None):\n"
                  "        if name == 'torch':\n"
                  "            sys.stdout.write('\\ntorch imported 0\\n'); sys.stdout.flush(); os._exit(0)\n"
                  "sys.meta_path.insert(0, StopAtTorch())\n")


def _plan_run(argv, cache, *, until_torch: bool = False):
    """The CLI in a fresh process: (stdout, whether torch was imported). `until_torch`: the process stops as torch
    is first imported (stdout up to then, True), else runs to its end."""
    import os

    code = ((_STOP_AT_TORCH if until_torch else "import sys\n") + "from paramscope.cli import main\n"
            f"rc = main({argv!r})\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch', rc)")
    env = dict(os.environ, PARAMSCOPE_CACHE_DIR=str(cache))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    out, _, last = result.stdout.rstrip().rpartition("\n")
    assert last.endswith(" 0")
    return out, last.startswith("torch imported")


def test_a_plan_asked_again_answers_from_what_the_first_run_kept_without_torch(tmp_path):
    """The first run builds, derives the step's memory and traces its FLOPs, and keeps them under the plan's key;
    the same plan asked again is counted by PEFT's arithmetic on the template's stand-ins and priced from the
    cache, with torch never imported, and every figure the same. Another plan (another rank) builds again."""
    argv = ["plan", "qwen2.5-0.5b", "--lora", "8", "--target", "all-linear", "--seq", "128"]
    first, first_torch = _plan_run(argv + ["--json"], tmp_path)
    second, second_torch = _plan_run(argv + ["--json"], tmp_path)
    assert first_torch and not second_torch
    first, second = json.loads(first), json.loads(second)
    assert (first["plan"]["engine"], second["plan"]["engine"]) == ("build", "arithmetic")
    for document in (first, second):
        del document["plan"]["engine"], document["model"]["engine"]
        memory = document["plan"]["memory"]
        memory["notes"] = [n.replace(" (read from the cache: derived and checked by an earlier run)", "")
                           for n in memory["notes"]]
    assert first == second
    text, _ = _plan_run(argv, tmp_path)
    assert "memory and FLOPs as an earlier run of this plan derived and traced them" in " ".join(text.split())
    _, other_torch = _plan_run(argv[:3] + ["4"] + argv[4:] + ["--json"], tmp_path, until_torch=True)
    assert other_torch


def test_a_tampered_flop_entry_is_not_used(tmp_path, monkeypatch):
    from paramscope.plan_store import PLANS, find_flops, flops_from_json, keep_flops
    from paramscope.cost.traced.flops import TracedFlops
    from paramscope.disk_cache import CacheEntryError

    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    flops = TracedFlops(10, 20, {"a": 10}, {"a": 20}, 0, 0)
    point = dict(batch=1, seq=8, checkpointing=False)
    path = keep_flops(PLANS, "plan-k", flops, **point)
    assert find_flops(PLANS, "plan-k", **point) == flops
    assert find_flops(PLANS, "plan-k", batch=2, seq=8, checkpointing=False) is None
    data = json.loads(path.read_text())
    data["points"]["1x8"]["forward"] = -1
    path.write_text(json.dumps(data))
    assert find_flops(PLANS, "plan-k", **point) is None
    with pytest.raises(CacheEntryError):
        flops_from_json({"forward": True})
