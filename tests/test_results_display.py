"""Python results display like the CLI (issue 27 §6).

`estimate_memory`, `estimate_training` and `estimate_flops` answer with one result each (the model's Report on it
as `.report`, the FLOPs' Compute as `.compute`), whose repr is one line and whose notebook display and
`.to_html()` are the CLI's page; a notebook fragment says its charset; a cached formula answers from Python as
`paramscope formula` does, without building the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

import paramscope
from paramscope import FlopOptions, MemoryOptions, TrainingOptions
from paramscope.cli import main
from paramscope.report import Report

CHARSET = '<meta charset="utf-8">'


# --------------------------------------------------------------------------------------------- one result each


def test_estimate_memory_answers_one_result_with_its_report_and_a_one_line_repr():
    memory = paramscope.estimate_memory("gpt2")
    assert type(memory) is paramscope.MemoryEstimate
    assert isinstance(memory.report, Report) and memory.report.total == 124_439_808
    # weights 497,759,232 + KV cache 75,497,472 + prefill workspace 69,222,400 (the CLI's text, line by line)
    assert memory.peak == 642_479_104
    assert repr(memory) == ("<MemoryEstimate to serve openai-community/gpt2 (GPT2LMHeadModel): peak 642,479,104 B "
                            "(0.60 GiB) in prefill · fp32 weights · batch 1 × 1,024 tokens · analytic engine>")


def test_a_memory_estimate_for_a_gpu_says_whether_it_fits():
    memory = paramscope.estimate_memory("llama-3-8b", MemoryOptions(dtype="nf4", gpu="4090"))
    assert repr(memory) == ("<MemoryEstimate to serve meta-llama/Meta-Llama-3-8B (LlamaForCausalLM): peak "
                            "8,078,842,368 B (7.52 GiB) in prefill · nf4 weights · batch 1 × 8,192 tokens · "
                            "analytic engine · fits on RTX 4090>")


def test_estimate_training_answers_one_result_with_its_report():
    training = paramscope.estimate_training("gpt2")
    assert type(training) is paramscope.MemoryEstimate and training.mode == "training"
    assert training.report.model.class_name == "GPT2LMHeadModel"
    assert repr(training) == ("<MemoryEstimate to train openai-community/gpt2 (GPT2LMHeadModel): peak 4,838,528,088 B "
                              "(4.51 GiB) in backward · bf16-mixed, adamw · batch 1 × 1,024 tokens · analytic "
                              "engine>")


def test_estimate_flops_answers_one_result_with_its_report_and_compute():
    flops = paramscope.estimate_flops("gpt2")
    assert type(flops) is paramscope.FlopEstimate
    assert flops.report.total == 124_439_808
    assert flops.forward == 291_648_307_200 and flops.compute.per_token_forward == 291_648_307_200 // 1024
    assert repr(flops) == ("<FlopEstimate of a forward pass of openai-community/gpt2 (GPT2LMHeadModel): "
                           "291,648,307,200 FLOPs (2.916e11) · batch 1 × 1,024 tokens · analytic engine>")
    step = paramscope.estimate_flops("llama-3-8b", FlopOptions(training=True))
    assert step.step == 98_814_312_579_072 == 3 * step.forward
    assert repr(step) == ("<FlopEstimate of a training step of meta-llama/Meta-Llama-3-8B (LlamaForCausalLM): "
                          "98,814,312,579,072 FLOPs (9.881e13; forward 32,938,104,193,024) · batch 1 × 2,048 tokens "
                          "· analytic engine>")


def test_the_report_and_compute_take_no_part_in_equality_or_hash():
    memory = paramscope.estimate_memory("gpt2", MemoryOptions(seq=128))
    bare = dataclasses.replace(memory, report=None)
    assert bare == memory and hash(bare) == hash(memory)
    flops = paramscope.estimate_flops("gpt2", FlopOptions(seq=128))
    assert dataclasses.replace(flops, report=None, compute=None) == flops


def test_every_repr_is_short_where_the_dataclass_one_ran_to_thousands():
    # before: repr(MemoryEstimate) was 7,136 characters for gpt2, 37,072 for DeepSeek-V3; FlopEstimate's 791-1,610
    results = [paramscope.estimate_memory("deepseek-v3", MemoryOptions(gpu="h100")),
               paramscope.estimate_training("deepseek-v3"),
               paramscope.estimate_flops("deepseek-v3", FlopOptions(training=True))]
    serving, training, flops = results
    assert repr(serving) == (
        "<MemoryEstimate to serve deepseek-ai/DeepSeek-V3 (DeepseekV3ForCausalLM): peak 712,434,725,472 B (663.51 GiB) "
        "in prefill · fp8-block weights · batch 1 × 163,840 tokens · analytic engine · does not fit on H100 80GB>")
    # derived: the recipe's moments do not hold DeepSeek-V3's attention backward (tests/test_analytic_exactness.py)
    assert repr(training) == (
        "<MemoryEstimate to train deepseek-ai/DeepSeek-V3 (DeepseekV3ForCausalLM): peak 10,746,642,427,708 B "
        "(10,008.59 GiB) in backward · bf16-mixed, adamw · batch 1 × 2,048 tokens · derived engine>")
    assert repr(flops) == (
        "<FlopEstimate of a training step of deepseek-ai/DeepSeek-V3 (DeepseekV3ForCausalLM): 512,921,369,051,136 "
        "FLOPs (5.129e14; forward 170,973,789,683,712) · batch 1 × 2,048 tokens · analytic engine>")
    assert len(repr(serving)) == 214 and len(repr(training)) < 200 and len(repr(flops)) == 194


def test_a_memory_estimate_without_a_report_names_no_model():
    memory = dataclasses.replace(paramscope.estimate_memory("gpt2", MemoryOptions(seq=128)), report=None)
    assert repr(memory).startswith("<MemoryEstimate to serve: peak ")


# ------------------------------------------------------------------------------------ displayed like the CLI


@pytest.mark.parametrize("command, answer", [
    (["memory", "gpt2"], lambda: paramscope.estimate_memory("gpt2")),
    (["memory", "gpt2", "--training"], lambda: paramscope.estimate_training("gpt2")),
    (["flops", "gpt2"], lambda: paramscope.estimate_flops("gpt2", FlopOptions(context_curve=True))),  # --html's
])
def test_to_html_is_the_clis_page_byte_for_byte(tmp_path, command, answer):
    path = tmp_path / "cli.html"
    assert main([*command, "--html", str(path)]) == 0
    result = answer()
    assert result.to_html(str(tmp_path / "python.html")) == path.read_text("utf-8")
    assert (tmp_path / "python.html").read_bytes() == path.read_bytes()


def test_the_notebook_fragment_is_the_page_with_the_models_parts():
    memory = paramscope.estimate_memory("gpt2", MemoryOptions(seq=128))
    fragment = memory._repr_html_()
    assert fragment.startswith(CHARSET) and "<!DOCTYPE" not in fragment
    assert "<h1>openai-community/gpt2: memory to serve</h1>" in fragment and "treemap-module" in fragment
    flops = paramscope.estimate_flops("gpt2", FlopOptions(seq=128, tokens=10**9))
    fragment = flops._repr_html_()
    assert "<h1>openai-community/gpt2: FLOPs</h1>" in fragment
    assert "for 1,000,000,000 tokens" in fragment  # the compute's rows, as the CLI's page has them


def test_ipython_text_is_the_one_line_repr():
    from IPython.lib.pretty import pretty

    memory = paramscope.estimate_memory("gpt2")
    assert pretty(memory) == repr(memory)
    assert pretty(paramscope.estimate_flops("gpt2")) == repr(paramscope.estimate_flops("gpt2"))


# ----------------------------------------------------------------------------------------------------- charset


def test_fragments_and_pages_declare_utf8_where_a_browser_looks(tmp_path):
    results = [paramscope.estimate_memory("gpt2", MemoryOptions(seq=128)),
               paramscope.estimate_training("gpt2", TrainingOptions(seq=128)),
               paramscope.estimate_flops("gpt2", FlopOptions(seq=128)), paramscope.inspect("gpt2")]
    for result in results:
        fragment = result._repr_html_()
        assert fragment.startswith(CHARSET), type(result).__name__
        raw = tmp_path / "fragment.html"
        raw.write_bytes(fragment.encode("utf-8"))  # written as it is, no page around it
        head = raw.read_bytes()[:1024]  # the bytes a browser's encoding prescan reads
        assert head.startswith(CHARSET.encode())
        assert "×".encode("utf-8") in raw.read_bytes()  # non-ASCII text the charset makes legible
        page = result.to_html()
        assert page.startswith('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">')


# ---------------------------------------------------------------------------------------------------- plan


def test_plan_repr_is_one_line():
    report, module = paramscope.inspect_with_module("bert-base-uncased")
    lora = paramscope.make_plan(report, module, paramscope.PlanOptions(lora=8))
    assert repr(lora) == ("<Plan lora: 294,912 of 109,809,210 parameters train (0.2686%) · adapters add 294,912 on "
                          "query, value>")
    full = paramscope.make_plan(report, module, paramscope.PlanOptions())
    assert repr(full) == "<Plan full: 109,514,298 of 109,514,298 parameters train (100.0000%)>"
    assert lora._repr_html_().startswith(CHARSET)


# ------------------------------------------------------------------------------------------ formula from cache

TINY_BERT = {"model_type": "bert", "vocab_size": 97, "hidden_size": 24, "num_attention_heads": 4,
             "intermediate_size": 40, "max_position_embeddings": 33, "type_vocab_size": 3, "num_hidden_layers": 2}


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny BERT's config file, its formula derived once into a cache of its own: (path, cache, formula)."""
    root = tmp_path_factory.mktemp("results-display")
    path = root / "config.json"
    path.write_text(json.dumps(TINY_BERT))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARAMSCOPE_CACHE_DIR", str(root / "cache"))
        first = paramscope.derive_formula(str(path), model_class="BertModel")
    assert first.origin == "derived"
    return path, root / "cache", first


def test_a_second_derive_formula_answers_from_the_cache_without_a_build(tiny_bert, monkeypatch):
    import paramscope.derive.probe
    import paramscope.formula

    path, cache, first = tiny_bert
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(cache))

    def no_build(*args, **kwargs):
        raise AssertionError("built the model")

    for module, name in ((paramscope.formula, "derive_structure"), (paramscope.formula, "check_cached"),
                         (paramscope.derive.probe, "count_build"), (paramscope.derive.probe, "build_anchor")):
        monkeypatch.setattr(module, name, no_build)
    again = paramscope.derive_formula(str(path), model_class="BertModel")
    assert again.origin == "cache" and again.checked is None and again.cache_path == first.cache_path
    # embeddings V·D + L·D + T·D + 2·D = 2,328 + 792 + 72 + 48 = 3,240; blocks 2 × 4,480 = 8,960; pooler 600
    assert again.value == first.value == first.checked == 12_800
    assert again.expression == first.expression and again.by_role == first.by_role


def test_a_cached_formula_answers_from_python_without_torch_or_transformers(tiny_bert):
    path, cache, first = tiny_bert
    blocked = ("import sys; sys.modules.update(torch=None, transformers=None);"
               "import paramscope; f = paramscope.derive_formula(sys.argv[1], model_class='BertModel');"
               "print(f.value, f.origin, f.checked)")
    env = {**os.environ, "PARAMSCOPE_CACHE_DIR": str(cache), "PYTHONIOENCODING": "utf-8"}
    run = subprocess.run([sys.executable, "-c", blocked, str(path)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "12800 cache None\n"


def test_verify_builds_and_checks_a_cached_formula(tiny_bert, monkeypatch, capsys):
    path, cache, first = tiny_bert
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(cache))
    checked = paramscope.derive_formula(str(path), model_class="BertModel", verify=True)
    assert checked.origin == "cache" and checked.checked == checked.value == 12_800
    assert main(["formula", str(path), "--class", "BertModel", "--verify", "--json"]) == 0  # the CLI's --verify
    derivation = json.loads(capsys.readouterr().out)["derivation"]
    assert (derivation["origin"], derivation["meta_count_here"]) == ("cache", 12_800)


def test_a_formula_repr_keeps_its_leading_terms_within_the_limit(tiny_bert, monkeypatch):
    from IPython.lib.pretty import pretty

    import paramscope.formula

    formula = tiny_bert[2]
    whole = "<Formula BertModel: P = V·D + L·D + T·D + 2·D + N·(4·D² + 2·D·I + 9·D + I) + D² + D = 12,800>"
    assert repr(formula) == whole == pretty(formula)
    monkeypatch.setattr(paramscope.formula, "REPR_LIMIT", 60)
    assert repr(formula) == "<Formula BertModel: P = V·D + L·D + T·D + 2·D + … = 12,800>"
    assert len(repr(formula)) <= 60 and pretty(formula) == whole  # IPython's text shows it whole
