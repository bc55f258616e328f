"""Cost facts (issue 14): `memory` and `flops` answered from a template and facts recorded per config, without
torch, identical to the answers of the meta build."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paramscope.cost.facts.store import FactsConfig, config_snapshot, facts_key, find_facts, read_facts
from paramscope.cost.facts.record import record_facts
from paramscope.cost.memory.serving import MemoryOptions
from paramscope.cost.memory.serving_answer import memory_answer
from paramscope.cost.flops.estimate import FlopOptions, flop_answer
from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.model_view import FactsGap
from paramscope.presets import all_presets, find_preset
from paramscope.render.flops import flops_to_dict
from paramscope.render.json import report_to_dict
from paramscope.render.memory import memory_to_dict
from paramscope.document_diff import comparable as _comparable, first_difference

from json_mutation import mutate
from test_template import needs_shipped


def _memory_document(report, estimate) -> dict:
    return {"report": _comparable(report_to_dict(report)), "memory": memory_to_dict(estimate)}


def _flops_document(report, estimate, compute) -> dict:
    return {"report": _comparable(report_to_dict(report)), "flops": flops_to_dict(estimate, compute)}


@needs_shipped
@pytest.mark.parametrize("preset", [p.name for p in all_presets()])
def test_every_preset_costs_from_facts_exactly_as_built(preset):
    """The shipped facts answer `memory` and `flops` for every preset, document for document as the build does."""
    report, memory, view = memory_answer(preset, MemoryOptions(seq=512, batch=2))
    if memory.check.status == "differs":  # the analytic peak's check found it off: the build traces two cuts
        assert report.model.engine == "build" and report.model.engine_detail == (
            "the analytic serving peak differs from a traced prefill for this config (checked once): the build "
            "traces two cuts (and the whole model where they disagree)")
    else:
        assert report.model.engine == "template" and view.module is None, report.model.engine_detail
    built_report, built_memory, built_view = memory_answer(preset, MemoryOptions(seq=512, batch=2), use_cache=False)
    assert built_report.model.engine == "build" and built_view.module is not None
    assert built_memory.check == memory.check  # made afresh without the cache: the shipped one
    difference = first_difference(_memory_document(built_report, built_memory), _memory_document(report, memory))
    assert difference is None, difference
    options = FlopOptions(seq=256, training=True, tokens=10**9)
    report, estimate, compute, view = flop_answer(preset, options)
    if estimate.engine == "traced":  # no analytic formula (encoder-decoders, ALBERT, DeBERTa): the build traces
        assert report.model.engine == "build" and view.module is not None
        assert report.model.engine_detail.startswith("no analytic FLOP formula for "), report.model.engine_detail
        return
    assert report.model.engine == "template" and view.module is None
    built = flop_answer(preset, options, use_cache=False)
    difference = first_difference(_flops_document(*built[:3]), _flops_document(report, estimate, compute))
    assert difference is None, difference


@needs_shipped
@pytest.mark.parametrize("preset, options", [
    ("llama-2-7b", MemoryOptions(dtype="nf4", seq=1024, gpu="rtx-4090")),
    ("mixtral-8x7b", MemoryOptions(dtype="gptq-int4", group_size=64, kv_dtype="fp8")),
    ("deepseek-v3", MemoryOptions(seq=4096, kv_layout="latent")),
    ("deepseek-v3", MemoryOptions(dtype="fp8-block", seq=128)),
    ("mixtral-8x7b", MemoryOptions(dtype="mxfp4", seq=8192, budget=24 << 30)),
    ("gemma-2-9b", MemoryOptions(dtype="q4_k", batch=8, seq=8192)),
    ("t5-small", MemoryOptions(dtype="bf16", encoder_seq=64, seq=32)),
    ("bert-base-uncased", MemoryOptions(dtype="int8", seq=128)),
])
def test_formats_and_layouts_from_facts_equal_the_build(preset, options):
    report, memory, view = memory_answer(preset, options)
    assert view.module is None, report.model.engine_detail
    built_report, built_memory, _ = memory_answer(preset, options, use_cache=False)
    difference = first_difference(_memory_document(built_report, built_memory), _memory_document(report, memory))
    assert difference is None, difference


@needs_shipped
@pytest.mark.parametrize("preset, options", [
    ("llama-2-7b", TrainingOptions(seq=2048)),
    ("llama-3-8b", TrainingOptions(seq=1024, grad_checkpointing="full", optimizer="adamw-8bit", gpu="a100-80gb")),
    ("mistral-7b", TrainingOptions(seq=512, precision="bf16-pure", freeze=("embeddings", "*.layers.[0-9].*"))),
    ("qwen2.5-7b", TrainingOptions(seq=512, devices=8, zero="3")),
    ("gpt2", TrainingOptions(seq=1024, precision="fp32", optimizer="sgd-momentum")),
    ("gemma-7b", TrainingOptions(seq=1024, grad_checkpointing="full")),
    ("phi-3-mini-4k-instruct", TrainingOptions(seq=2048, precision="bf16-pure")),
    ("pythia-1.4b", TrainingOptions(seq=2048, batch=4)),
    ("gpt-neox-20b", TrainingOptions(seq=1024, devices=8, zero="2")),
    ("gpt-j-6b", TrainingOptions(seq=2048, grad_checkpointing="full", precision="bf16-pure")),
    ("modernbert-base", TrainingOptions(seq=8192, batch=2)),
    ("roberta-large", TrainingOptions(seq=512, batch=8)),
    ("distilbert-base-uncased", TrainingOptions(seq=512, grad_checkpointing="full")),
    ("gemma-2-9b", TrainingOptions(seq=4096, grad_checkpointing="full")),
    ("albert-base-v2", TrainingOptions(seq=512, batch=16, precision="bf16-pure")),
    ("t5-large", TrainingOptions(seq=512, batch=4)),
    ("t5-base", TrainingOptions(seq=512, batch=4, grad_checkpointing="full")),
    ("mistral-7b", TrainingOptions(seq=4096)),  # the sequence fills the sliding window: sdpa's mask
])
def test_training_memory_from_facts_equals_the_build(preset, options):
    """`memory --training` from facts where an analytic recipe covers the layout: the build's answer exactly."""
    report, memory, view = training_answer(preset, options)
    assert view.module is None and memory.engine == "analytic", report.model.engine_detail
    built_report, built_memory, built_view = training_answer(preset, options, use_cache=False)
    assert built_view.module is not None
    difference = first_difference(_memory_document(built_report, built_memory), _memory_document(report, memory))
    assert difference is None, difference


@needs_shipped
@pytest.mark.parametrize("preset, options", [
    ("electra-base-discriminator", TrainingOptions(seq=512, precision="bf16-pure")),
    ("deberta-v3-base", TrainingOptions(seq=512, batch=8, precision="bf16-mixed")),
    ("mixtral-8x7b", TrainingOptions(seq=2048, devices=8, zero="3")),
    ("qwen1.5-moe-a2.7b", TrainingOptions(seq=1024, precision="bf16-pure")),
])
def test_training_where_the_step_peaks_inside_a_layer_is_derived_once_then_answered_without_a_build(
        preset, options, tmp_path, monkeypatch):
    """Their recipes' moments do not hold a peak inside a layer (no vocabulary-wide logits; the experts' backward):
    the first answer builds and derives, a second comes from the facts and the derived recipe kept in the cache,
    without a build, to the byte."""
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    built_report, built_memory, built_view = training_answer(preset, options)
    assert built_view.module is not None and built_memory.engine == "derived"
    report, memory, view = training_answer(preset, options)
    assert view.module is None and memory.engine == "derived", report.model.engine_detail
    cached = " (read from the cache: derived and checked by an earlier run)"
    assert any(cached in note for note in memory.notes)
    first = json.loads(json.dumps(_memory_document(built_report, built_memory)))
    later = json.loads(json.dumps(_memory_document(report, memory)).replace(cached, ""))
    difference = first_difference(first, later)
    assert difference is None, difference


@needs_shipped
def test_training_the_bare_bart_model_builds_and_traces_and_says_why():
    """BART's two stacks of layers cannot be cut, so where its recipe's moments do not hold the peak (the bare model
    has no logits), every layer is traced."""
    report, memory, view = training_answer("bart-base", TrainingOptions(seq=1024, precision="fp32"))
    assert view.module is not None and memory.engine == "traced"
    assert report.model.engine_detail.startswith(
        "the analytic BART (bare, trained on its output's sum) recipe's moments do not hold its step's peak (this "
        "head has no vocabulary-wide logits, so its step peaks inside the last layer)")


@needs_shipped
def test_training_a_recipe_declines_builds_and_says_why():
    """Every shipped template's class has a recipe; where it declines the settings, the build traces and says why."""
    report, memory, view = training_answer("bart-base", TrainingOptions(seq=32, grad_checkpointing="full"))
    assert view.module is not None and memory.engine == "traced"
    assert report.model.engine_detail == (
        "the analytic BART (bare, trained on its output's sum) recipe was not fitted for gradient checkpointing (its "
        "checkpointed layers keep more than their inputs): the traced step needs the build")


@needs_shipped
def test_memory_and_flops_of_presets_import_neither_torch_nor_transformers():
    code = ("import sys, io, contextlib\n"
            "from paramscope.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    assert main(['memory', 'llama-3-8b', '--json']) == 0\n"
            "    assert main(['memory', 'deepseek-v3', '--dtype', 'nf4', '--gpu', 'h100', '--width', '100']) == 0\n"
            "    assert main(['flops', 'mixtral-8x7b', '--training', '--tokens', '1e12', '--gpu', 'h100', "
            "'--mfu', '0.4', '--json']) == 0\n"
            "    assert main(['flops', 'gpt2', '--width', '100']) == 0\n"
            "    assert main(['memory', 'mistral-7b', '--training', '--grad-checkpointing', 'full', '--json']) == 0\n"
            "print(sorted(m for m in ('torch', 'transformers', 'sympy') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "PARAMSCOPE_CACHE_DIR"} | {"PARAMSCOPE_CACHE_DIR": "/nonexistent"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def _small_qwen(tmp_path):
    config = find_preset("qwen2.5-0.5b").load_config() | {"num_hidden_layers": 2, "hidden_size": 64,
                                                          "num_attention_heads": 4, "num_key_value_heads": 2,
                                                          "intermediate_size": 96, "vocab_size": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return config, path


@needs_shipped
def test_the_cli_records_cost_facts_after_a_build_and_answers_from_them_next(tmp_path, capsys, monkeypatch):
    """A config no facts cover: built once (and its facts recorded), then answered from them; the same documents.
    A build dtype the facts lack is a gap: the build answers it, says why, and records it too."""
    from paramscope.cli import main

    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "wait")
    _, path = _small_qwen(tmp_path)
    # FLOPs need no build dtype: the facts memory recorded answer them from the first call
    for command, first in ((["memory", str(path), "--seq", "64"], "build"),
                           (["flops", str(path), "--training"], "template")):
        runs = []
        for extra in ([], [], ["--no-cache"]):
            assert main([*command, "--json", *extra]) == 0
            runs.append(json.loads(capsys.readouterr().out))
        engines = [run["model"].pop("engine") for run in runs]
        assert [e["name"] for e in engines] == [first, "template", "build"], engines
        if first == "build":
            assert engines[0]["detail"].startswith("no cost facts recorded yet for this config of Qwen2ForCausalLM")
        assert runs[0] == runs[1] == runs[2]
    assert main(["memory", str(path), "--seq", "64", "--dtype", "fp32", "--json"]) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert fp32["model"]["engine"] == {"name": "build",
                                       "detail": "no cost facts recorded for a build in float32"}
    assert main(["memory", str(path), "--seq", "64", "--dtype", "fp32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["engine"]["name"] == "template"


def test_checkpointing_a_class_without_it_is_one_line(capsys):
    from paramscope.cli import main

    assert main(["flops", "albert-base-v2", "--training", "--grad-checkpointing", "full"]) == 2
    assert capsys.readouterr().err == ("paramscope: error: AlbertForMaskedLM does not support gradient "
                                       "checkpointing (--grad-checkpointing full)\n")


@needs_shipped
def test_the_text_says_where_the_model_was_read_from(capsys):
    from paramscope.cli import main

    assert main(["memory", "gpt2", "--width", "120"]) == 0
    assert "model: its structure template and recorded cost facts, no build (--no-cache builds)" in \
        capsys.readouterr().out
    assert main(["flops", "gpt2", "--width", "120", "--no-cache"]) == 0
    assert "model: built on the meta device" in capsys.readouterr().out
    # llama.cpp's serving memory reads the config's rope fields, which GPT-2 has none of: absent, not a gap
    assert main(["memory", "gpt2", "--engine", "llama.cpp", "--dtype", "q4_k_m", "--width", "120"]) == 0
    assert "model: its structure template and recorded cost facts, no build (--no-cache builds)" in \
        capsys.readouterr().out


def test_facts_are_checked_before_they_are_kept(tmp_path):
    """record_facts compares the facts' answers with the build's and keeps nothing that differs."""
    import paramscope.cost.facts.store as cost_facts
    import paramscope.cost.facts.record as facts_record
    from paramscope.api import inspect_with_module
    from paramscope.sources import Source

    config, _ = _small_qwen(tmp_path)
    source = Source("config-dict", "config", "a config dict", config)
    report, module = inspect_with_module(source, dtype="bfloat16")
    original = facts_record.facts_from_module

    def wrong(module, *, build_dtype, key):  # a probe that misreads the real cache by one byte
        facts = original(module, build_dtype=build_dtype, key=key)
        build = facts.builds[build_dtype]
        return dataclasses.replace(facts, builds={build_dtype: cost_facts.BuildFacts(
            build.dtypes, build.keep_fp32, (build.probe or 0) + 1)})

    try:
        facts_record.facts_from_module = wrong
        facts, message = record_facts(source, report, module, build_dtype="bfloat16", directory=tmp_path / "d")
    finally:
        facts_record.facts_from_module = original
    assert facts is None and "differs from the build's" in message, message
    facts, message = record_facts(source, report, module, build_dtype="bfloat16", directory=tmp_path / "d")
    assert facts is not None, message


def test_a_config_read_back_reads_as_the_real_one():
    """Attribute maps, sub-configs, absent fields (AttributeError) and fields that could not be kept (a gap, never
    an AttributeError a getattr default would swallow)."""
    from transformers import GPT2Config, T5Config

    snapshot = json.loads(json.dumps(config_snapshot(GPT2Config(n_layer=3))))
    config = FactsConfig(snapshot)
    assert config.num_hidden_layers == config.n_layer == 3 and config.hidden_size == 768
    assert getattr(config, "no_such_field", None) is None
    with pytest.raises(FactsGap):
        getattr(config, "name_or_path", None)
    assert config.get_text_config() is config
    # a property that raises AttributeError on the real object (GPT-2's rope_scaling reads a rope_parameters it has
    # none of) is absent, as hasattr() says there, not a gap that sends every reader to a build
    with pytest.raises(AttributeError):
        GPT2Config().rope_scaling
    assert "rope_scaling" not in snapshot["gaps"] and getattr(config, "rope_scaling", None) is None
    t5 = FactsConfig(json.loads(json.dumps(config_snapshot(T5Config(num_decoder_layers=4)))))
    assert t5.num_decoder_layers == 4 and t5.is_encoder_decoder is True


def test_the_key_is_the_exact_config_and_how_its_class_was_asked():
    config = find_preset("gpt2").load_config()
    key = facts_key(config, model_class=None, task=None, num_labels=None)
    assert key == facts_key(config | {"_name_or_path": "elsewhere"}, model_class=None, task=None, num_labels=None)
    assert key != facts_key(config | {"n_positions": 2048}, model_class=None, task=None, num_labels=None)
    assert key != facts_key(config, model_class=None, task="text-classification", num_labels=None)
    assert key != facts_key(config, model_class=None, task=None, num_labels=3)


@needs_shipped
def test_tampered_or_hostile_facts_files_are_ignored(tmp_path, monkeypatch):
    from paramscope.template import cache_directory

    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    config = find_preset("gpt2").load_config()
    key = facts_key(config, model_class=None, task=None, num_labels=None)
    shipped = find_facts("GPT2LMHeadModel", key)
    assert shipped is not None
    directory = cache_directory(shipped.transformers_version) / "GPT2LMHeadModel" / "costs"
    directory.mkdir(parents=True)
    target = directory / f"{key}.json"
    for content in ("not json", json.dumps({"format": 1}), json.dumps(shipped.to_json() | {"key": "other"}),
                    json.dumps(shipped.to_json() | {"builds": {"float8": {}}})):
        target.write_text(content)
        assert read_facts(directory, key, "GPT2LMHeadModel") is None
        assert find_facts("GPT2LMHeadModel", key) == shipped  # the cache's is skipped, the package's answers
    target.unlink()
    os.mkfifo(target)  # a FIFO costs one lstat, never a blocked open
    assert read_facts(directory, key, "GPT2LMHeadModel") is None


@needs_shipped
@settings(max_examples=int(os.environ.get("PARAMSCOPE_FUZZ_EXAMPLES", 100)), deadline=None)
@given(data=st.data())
def test_mutated_facts_are_refused_or_answer_never_crash(data, tmp_path_factory):
    """Any one value of a facts file replaced by any JSON value: the reader refuses it, or the facts answer, or
    the build does (a gap, or arithmetic the facts break); a user-facing error at most, never a traceback."""
    from paramscope.cost.facts.store import facts_directory
    from paramscope.errors import ParamscopeError
    from paramscope.disk_cache import installed_transformers_version
    from paramscope.template import cache_directory

    from unittest import mock

    cache = tmp_path_factory.mktemp("facts")
    with mock.patch.dict(os.environ, {"PARAMSCOPE_CACHE_DIR": str(cache)}):
        config = find_preset("gpt2").load_config()
        key = facts_key(config, model_class=None, task=None, num_labels=None)
        document = find_facts("GPT2LMHeadModel", key).to_json()
        mutate(document, data)
        directory = facts_directory(cache_directory(installed_transformers_version()) / "GPT2LMHeadModel")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{key}.json").write_text(json.dumps(document))
        try:
            memory_answer("gpt2", MemoryOptions(seq=64))
            flop_answer("gpt2", FlopOptions(seq=64, training=True))
        except ParamscopeError:
            pass


@needs_shipped
@pytest.mark.parametrize("preset", ["gpt2", "deepseek-v3"])
def test_shipped_facts_are_fresh(preset, tmp_path):
    """Recording a preset's facts again gives the shipped ones (all of them: python -m paramscope.template_record)."""
    from paramscope.cost.facts.store import BUILD_DTYPES, facts_directory
    from paramscope.sources import resolve

    source = resolve(preset)
    key = facts_key(source.config, model_class=None, task=None, num_labels=None)
    from paramscope.api import inspect_with_module
    from paramscope.disk_cache import class_directory, installed_transformers_version, safe_name
    from paramscope.template import lookup_template, shipped_directory

    # record_facts also keeps the engine checks (FLOPs, generation, serving per dtype) beside the facts, made on the
    # build unless kept there already; this test compares the facts only, so the shipped checks are put there first
    # (each preset's FLOP and serving checks are made afresh against the shipped ones in
    # test_every_preset_costs_from_facts_exactly_as_built): the same facts, without ~5 traces per preset
    class_name = lookup_template(source.config, model_class=None, task=None, num_labels=None).template.class_name
    shipped = facts_directory(class_directory(shipped_directory(installed_transformers_version()), class_name))
    kept = facts_directory(class_directory(tmp_path, class_name))
    kept.mkdir(parents=True)
    for check in shipped.glob(f"{safe_name(key)}*-check.json"):
        (kept / check.name).write_bytes(check.read_bytes())
    assert len(list(kept.iterdir())) >= 1 + len(BUILD_DTYPES)  # the FLOP check and one serving check a dtype
    for dtype in BUILD_DTYPES:
        report, module = inspect_with_module(source, dtype=None if dtype == "float32" else dtype)
        facts, message = record_facts(source, report, module, build_dtype=dtype, directory=tmp_path)
        assert facts is not None, message
    fresh = read_facts(facts_directory(tmp_path / facts.class_name), key, facts.class_name)
    assert fresh == find_facts(facts.class_name, key), ("the shipped cost facts are stale; run python -m "
                                                        "paramscope.template_record")
