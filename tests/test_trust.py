"""The cache is trusted as pip trusts its own, and still nothing read from it is taken on faith (issue 30 §1).

- The package's own templates, routes and cost facts answer first: an entry in the user's cache never overrides them,
  however self-consistent an edit is.
- Every store's entries are bound to what they were derived from: paramscope's version and transformers' (the user
  cache's directories for templates, formulas, routes and cost facts; the key and the entry for derived recipes and
  plan FLOPs), the class and the config. An entry that does not match is not read; the answer is built and the entry
  rebuilt.
- Patterns a cache holds are globs paramscope compiles and matches with bounded work, never a regular expression.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import paramscope
from paramscope import disk_cache
from paramscope.disk_cache import (CacheEntryError, installed_transformers_version, read_route, route_file, route_fits,
                                   route_key)
from paramscope.presets import find_preset
from paramscope.template import SHIPPED, Template, cache_directory, lookup_template, write_template

from test_template import needs_shipped

OWN = "the checkpoint's own class (config architectures[0])"


def _other_version(monkeypatch) -> None:
    """From here on this process is another paramscope version (or the same version with other source: an engine
    fixed in a checkout, which `disk_cache.source_version` fingerprints)."""
    monkeypatch.setattr(disk_cache, "__version__", "0.0.1-other")
    monkeypatch.setattr(disk_cache, "source_version", lambda: "0.1.0+src.000000000000")


def test_derived_entries_are_bound_to_the_source_not_only_the_version():
    import re

    assert re.fullmatch(re.escape(disk_cache.__version__) + r"\+src\.[0-9a-f]{12}", disk_cache.source_version())
    assert disk_cache.versions()[0] == disk_cache.source_version()


# ------------------------------------------------------------------------------- the package's own data answers


@needs_shipped
def test_a_self_consistent_template_edit_never_overrides_the_package(cache):
    """The issue's case: BERT's word embeddings doubled in a cached template and its check total fixed to match.
    The package's template answers the preset, and a config of its class, exactly."""
    config = find_preset("bert-base-uncased").load_config()
    data = lookup_template(config).template.to_json()
    data["spec"]["families"][0]["shape"][0] = [[2, {"V": 1}]]
    data["spec"]["anchor"]["total"] += 23_440_896
    data["spec"]["anchor"]["by_role"]["embeddings.word"] *= 2
    tampered = Template.from_json(data)
    assert tampered.spec.anchor_problem() is None  # it passes its own check: only the order protects the preset
    write_template(tampered, route_key(config, model_class=None, task=None),
                   cache_directory(installed_transformers_version()))
    report = paramscope.inspect("bert-base-uncased")
    assert report.model.engine == "template" and report.total == 109_514_298
    assert str(lookup_template(config).path).startswith(str(SHIPPED))
    smaller = paramscope.inspect(config | {"num_hidden_layers": 2})
    assert smaller.total == 109_514_298 - 10 * 7_087_872


@needs_shipped
def test_a_redirected_route_never_overrides_the_package(cache):
    """A cached route sending BertForMaskedLM's request to BertModel, calling it "the checkpoint's own class"."""
    config = find_preset("bert-base-uncased").load_config()
    key = route_key(config, model_class=None, task=None)
    path = route_file(cache_directory(installed_transformers_version()), key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"route": key, "class": "BertModel", "reason": OWN}))
    report = paramscope.inspect("bert-base-uncased")
    assert report.model.class_name == "BertForMaskedLM" and report.total == 109_514_298
    assert report.model.class_reason == OWN
    assert read_route(path.parent.parent, key, ("class", "reason")) is None  # and read alone, it is refused


@pytest.mark.parametrize("key, class_name, reason, fits", [
    ("bert|default|BertForMaskedLM", "BertForMaskedLM", OWN, True),
    ("bert|default|BertForMaskedLM", "BertModel", OWN, False),
    ("bert|default|BertForMaskedLM", "BertModel", "AutoModel fallback (architectures[0] 'BertForMaskedLM' is not a "
                                                  "transformers class)", True),
    ("llama|default|MyLlama", "LlamaForCausalLM", "architectures[0] 'MyLlama' is not a transformers class; "
                                                  "LlamaForCausalLM is the native class with the same head", True),
    ("deberta-v2|default|", "DebertaV2Model", "AutoModel fallback (no architectures in the config)", True),
    ("deberta-v2|default|", "DebertaV2Model", OWN, False),
    ("bert|task|token-classification", "BertForTokenClassification",
     "--task ner (= token-classification): token classification", True),
    ("bert|task|token-classification", "BertModel", "--task ner: the bare model (AutoModel)", False),
    ("bert|default|X", "os.system", "AutoModel fallback (architectures[0] 'X' is not a transformers class)", False),
    ("bert|default|X", "X" * 200, OWN, False),
    ("bert|sideways|X", "X", OWN, False),
    ("bert|default|BertModel", "BertModel", None, True),  # formula routes keep no reason: the class alone
    ("bert|default|BertModel", "__import__('os')", None, False),
])
def test_a_route_is_one_the_build_could_have_written(key, class_name, reason, fits):
    assert route_fits(key, class_name, reason) is fits


def test_a_route_written_for_another_request_is_refused(tmp_path):
    key, other = "bert|default|BertForMaskedLM", "bert|default|BertModel"
    path = route_file(tmp_path, key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"route": other, "class": "BertModel", "reason": OWN}))
    assert read_route(tmp_path, key, ("class", "reason")) is None
    path.write_text(json.dumps({"route": key, "class": "BertForMaskedLM", "reason": OWN}))
    assert read_route(tmp_path, key, ("class", "reason"))["class"] == "BertForMaskedLM"


@needs_shipped
def test_cost_facts_in_the_cache_never_override_the_package(cache):
    """GPT-2's facts copied into the cache with every tensor made float64 (a JSON-valid, schema-valid edit that
    doubles its weights): the package's facts answer."""
    from paramscope.cost.facts.store import CostFacts, facts_directory, facts_key, find_facts
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import memory_answer
    from paramscope.render.memory import memory_to_dict

    expected = memory_to_dict(memory_answer("gpt2", MemoryOptions(seq=64))[1])
    config = find_preset("gpt2").load_config()
    key = facts_key(config, model_class=None, task=None, num_labels=None)
    shipped = find_facts("GPT2LMHeadModel", key)
    document = shipped.to_json()
    for build in document["builds"].values():
        build["dtypes"] = dict.fromkeys(build["dtypes"], "float64")
    CostFacts.from_json(document)  # valid as far as any schema can tell
    directory = facts_directory(cache_directory(installed_transformers_version()) / "GPT2LMHeadModel")
    directory.mkdir(parents=True)
    (directory / f"{key}.json").write_text(json.dumps(document))
    assert find_facts("GPT2LMHeadModel", key) == shipped
    report, memory, view = memory_answer("gpt2", MemoryOptions(seq=64))
    assert view.module is None and memory_to_dict(memory) == expected


# ----------------------------------------------------------------- bound to the versions that derived an entry


@needs_shipped
def test_templates_and_routes_are_filed_under_the_paramscope_version(cache, monkeypatch):
    config = find_preset("bert-base-uncased").load_config()
    template = lookup_template(config).template
    version = installed_transformers_version()
    mine = cache_directory(version)
    write_template(template, route_key(config, model_class=None, task=None), mine)
    assert lookup_template(config, directories=[mine]).template == template
    assert mine.relative_to(cache).parts[:2] == (f"paramscope-{paramscope.__version__}", "templates")
    _other_version(monkeypatch)
    theirs = cache_directory(version)
    assert theirs != mine and lookup_template(config, directories=[theirs]).template is None


@pytest.mark.slow
def test_a_formula_of_another_paramscope_version_is_not_read_and_is_derived_again(cache, monkeypatch):
    from paramscope.formula import derive_formula
    from paramscope.formula_cache import lookup

    anchor = {"model_type": "bert", "vocab_size": 97, "hidden_size": 24, "num_attention_heads": 4,
              "intermediate_size": 40, "max_position_embeddings": 33, "type_vocab_size": 3, "num_hidden_layers": 2}
    first = derive_formula(anchor, model_class="BertModel")
    assert first.origin == "derived" and lookup(anchor, model_class="BertModel").spec is not None
    assert derive_formula(anchor, model_class="BertModel").origin == "cache"
    _other_version(monkeypatch)
    assert lookup(anchor, model_class="BertModel").spec is None
    again = derive_formula(anchor, model_class="BertModel")
    assert again.origin == "derived" and again.value == first.value
    assert Path(again.cache_path) != Path(first.cache_path) and Path(first.cache_path).exists()


def _tiny_qwen() -> dict:
    return find_preset("qwen2.5-0.5b").load_config() | {"num_hidden_layers": 2, "hidden_size": 64,
                                                        "num_attention_heads": 4, "num_key_value_heads": 2,
                                                        "intermediate_size": 96, "vocab_size": 128}


@needs_shipped
@pytest.mark.slow
def test_cost_facts_of_another_paramscope_version_are_not_read(cache, monkeypatch):
    from paramscope.api import inspect_with_module
    from paramscope.cost.facts.record import record_facts
    from paramscope.cost.facts.store import facts_key, find_facts
    from paramscope.sources import Source

    source = Source("config-dict", "config", "a config dict", _tiny_qwen())
    report, module = inspect_with_module(source, dtype="bfloat16")
    facts, message = record_facts(source, report, module, build_dtype="bfloat16")
    assert facts is not None, message
    key = facts_key(source.config, model_class=None, task=None, num_labels=None)
    assert find_facts(facts.class_name, key) == facts
    _other_version(monkeypatch)
    assert find_facts(facts.class_name, key) is None


def _recipe():
    from paramscope.cost.derived.recipe import recipe_from_json

    one = [[1, 0, None]]
    return recipe_from_json({"sizes": [[[1, 1, 8]]], "gradient": [1], "middle_forward": {"a|a|a": one},
                             "middle_backward": {"a|a|a": []}, "layer_types": ["a"] * 3,
                             "cut_types": ["a"] * 3, "seq_range": [1, 64], "batch_range": [1, 1], "regime": "r",
                             "traced": "t", "check": "c", "prefix": [], "first_forward": one, "last_forward": one,
                             "head_backward": [], "last_backward": [], "first_backward": []})


def test_a_derived_recipe_is_read_only_by_the_versions_that_derived_it(cache, monkeypatch):
    from paramscope.cost.derived.store import find_recipe, keep_recipe

    recipe = _recipe()
    path = keep_recipe("Qwen2ForCausalLM", "k" * 32, recipe)
    assert find_recipe("Qwen2ForCausalLM", "k" * 32) == recipe
    assert json.loads(path.read_text())["versions"] == disk_cache.versions()
    for edit in ({"versions": ["0.0.1", "2.0", "4.0"]}, {"key": "j" * 32}, {"class": "LlamaForCausalLM"},
                 {"versions": None}):
        data = json.loads(path.read_text()) | edit
        path.write_text(json.dumps(data))
        assert find_recipe("Qwen2ForCausalLM", "k" * 32) is None, edit
        keep_recipe("Qwen2ForCausalLM", "k" * 32, recipe)  # what the engine does after deriving it again
        assert find_recipe("Qwen2ForCausalLM", "k" * 32) == recipe
    _other_version(monkeypatch)
    assert find_recipe("Qwen2ForCausalLM", "k" * 32) is None


@pytest.mark.slow
def test_the_derived_and_plan_keys_hash_the_versions(monkeypatch):
    from types import SimpleNamespace

    from paramscope.cost.derived.store import recipe_key
    from paramscope.plan_store import plan_key
    from paramscope.plan import PlanOptions

    config = _tiny_qwen()
    settings = SimpleNamespace(precision="bf16-mixed", attention="sdpa", frozen=(), weights_dtype="bfloat16",
                               own_dtype=(), grad_checkpointing=False)
    before = (recipe_key("C", config, settings, 1, (1, 64)), plan_key(config, "C", PlanOptions()))
    _other_version(monkeypatch)
    after = (recipe_key("C", config, settings, 1, (1, 64)), plan_key(config, "C", PlanOptions()))
    assert before[0] != after[0] and before[1] != after[1]


def test_plan_flops_are_read_only_by_the_versions_that_traced_them(cache, monkeypatch):
    from paramscope.cost.traced.flops import TracedFlops
    from paramscope.plan_store import PLANS, find_flops, keep_flops

    flops = TracedFlops(10, 20, {"a": 10}, {"a": 20}, 0, 0)
    point = dict(batch=1, seq=8, checkpointing=False)
    path = keep_flops(PLANS, "plan-k", flops, **point)
    assert find_flops(PLANS, "plan-k", **point) == flops
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data | {"versions": ["0.0.1"]}))
    assert find_flops(PLANS, "plan-k", **point) is None
    keep_flops(PLANS, "plan-k", flops, **point)  # rebuilt: the bad entry's points are not carried over
    assert json.loads(path.read_text())["versions"] == disk_cache.versions("peft")
    assert find_flops(PLANS, "plan-k", **point) == flops
    _other_version(monkeypatch)
    assert find_flops(PLANS, "plan-k", **point) is None


# ------------------------------------------------------------------------------------- tampered, then rebuilt


@needs_shipped
@pytest.mark.slow
@pytest.mark.parametrize("tamper", ["planted regex", "format 1", "another class", "another key", "garbage"])
def test_tampered_cost_facts_are_rebuilt_and_the_answer_stays_right(tmp_path, cache, monkeypatch, capsys, tamper):
    """`memory` of a config the package has no facts for: built and recorded, then answered from the facts; the
    recorded entry edited: refused in an instant (a planted regex never runs), built again with the same answer,
    and recorded afresh, after which the facts answer again."""
    from paramscope.cli import main
    from paramscope.cost.facts.store import FORMAT, facts_directory, facts_key

    monkeypatch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "wait")
    config = _tiny_qwen()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))

    def memory() -> tuple[str, dict]:
        assert main(["memory", str(path), "--seq", "64", "--dtype", "fp16", "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
        return document["model"].pop("engine")["name"], document

    first_engine, first = memory()
    assert first_engine == "build"
    engine, answer = memory()
    assert engine == "template" and answer == first
    key = facts_key(config, model_class=None, task=None, num_labels=None)
    entry = facts_directory(cache_directory(installed_transformers_version()) / "Qwen2ForCausalLM") / f"{key}.json"
    data = json.loads(entry.read_text())
    assert data["format"] == FORMAT == 2
    if tamper == "planted regex":
        for build in data["builds"].values():
            build["keep_fp32"] = ["(a*)*b"]  # catastrophic backtracking, were it ever compiled as a regex
    elif tamper == "format 1":
        data["format"] = 1
    elif tamper == "another class":
        data["class"] = "LlamaForCausalLM"
    elif tamper == "another key":
        data["key"] = "0" * 32
    entry.write_text("{not json" if tamper == "garbage" else json.dumps(data))
    started = time.perf_counter()
    engine, answer = memory()
    assert engine == "build" and answer == first
    assert time.perf_counter() - started < 60
    assert json.loads(entry.read_text())["format"] == 2 and json.loads(entry.read_text())["key"] == key
    engine, answer = memory()
    assert engine == "template" and answer == first


# ------------------------------------------------------------------------------------------- globs, not regex


def test_a_regex_in_cost_facts_is_refused_by_the_schema():
    from paramscope.cost.facts.store import CostFacts, FORMAT

    document = {"format": FORMAT, "class": "C", "transformers_version": "5", "roles_fingerprint": "r", "key": "k",
                "text": "self", "can_generate": True, "supports_checkpointing": True, "matmul_classes": [],
                "linear_classes": [], "default_skips": [], "config": {"fields": {}, "subs": {}, "gaps": []},
                "builds": {"float16": {"dtypes": {}, "keep_fp32": ["*wo*"], "probe": None}}}
    assert CostFacts.from_json(document).builds["float16"].keep_fp32 == ("*wo*",)
    for planted in ("(a*)*b", "(?P<g0>wo)", "wo|.*", "[a-z]+", "a" * 257, "", "\\d"):
        document["builds"]["float16"]["keep_fp32"] = [planted]
        with pytest.raises(CacheEntryError, match="keep_fp32"):
            CostFacts.from_json(document)
    for planted in ("(a*)*b", ["*wo*"] * 65, []):
        document["builds"]["float16"]["keep_fp32"] = planted
        with pytest.raises(CacheEntryError, match="keep_fp32"):
            CostFacts.from_json(document)


@pytest.mark.parametrize("glob, name, matches", [
    ("*wo*", "encoder.block.0.layer.1.DenseReluDense.wo.weight", True),
    ("*wo*", "encoder.block.0.layer.1.DenseReluDense.wi.weight", False),
    ("*gate?weight*", "model.layers.3.mlp.gate.weight", True),
    ("*gate?weight*", "model.layers.3.mlp.gate_proj.weight", False),
    ("*gate?weight*", "model.layers.3.mlp.gateXweight", True),  # transformers' `.` is any character
    ("a*b*c", "abc", True),
    ("a*b*c", "acb", False),
    ("a?c", "abc", True),
    ("a?c", "ac", False),
    ("*", "", True),
    ("abc", "abc", True),
    ("abc", "abcd", False),
    ("*ab*ab*", "abab", True),
    ("*ab*ab*", "aba", False),
])
def test_globs_match_whole_names(glob, name, matches):
    from paramscope.cost.facts.globs import compile_glob

    assert compile_glob(glob)(name) is matches


def test_glob_matching_is_bounded():
    """Globs a regex engine would backtrack on for ever answer at once: each piece is found leftmost in turn."""
    from paramscope.cost.facts.globs import compile_glob

    name = "a" * 100_000
    started = time.perf_counter()
    for glob in ("*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", "*" + "a?" * 100 + "*b*", "a*" * 100 + "b"):
        assert compile_glob(glob)(name) is False
    assert time.perf_counter() - started < 1
    with pytest.raises(ValueError):
        compile_glob("(a*)*b")


@pytest.mark.slow
def test_transformers_keep_in_fp32_names_become_globs_that_match_as_its_loader_does():
    """Every `_keep_in_fp32_modules(_strict)` entry transformers' models declare, matched by its loader's regex
    (core_model_loading.build_glob_alternation, searched) and by paramscope's glob: the same names."""
    import random
    import re

    import transformers
    from transformers.core_model_loading import build_glob_alternation

    from paramscope.cost.facts.globs import glob_of, match_any

    entries = set()
    for path in (Path(transformers.__file__).parent / "models").rglob("modeling_*.py"):
        for found in re.finditer(r"_keep_in_fp32_modules(?:_strict)?\s*=\s*\[([^\]]*)\]", path.read_text()):
            entries.update(re.findall(r"[\"']([^\"']*)[\"']", found.group(1)))
    assert len(entries) > 20 and all(glob_of(entry) for entry in entries)
    rng = random.Random(30)
    names = {"".join(rng.choice("abgtewo._ 0") for _ in range(rng.randrange(16))) for _ in range(3000)}
    for entry in entries:
        for _ in range(20):
            chars = list(f"model.layers.{rng.randrange(9)}.{entry.replace('*', rng.choice(['', 'x.y']))}"
                         f"{rng.choice(['', '.weight', '_b'])}")
            chars[rng.randrange(len(chars))] = rng.choice("._ax")
            names.add("".join(chars))
    for entry in entries:
        regex, globs = build_glob_alternation([entry])[0], (glob_of(entry),)
        assert [n for n in names if bool(regex.search(n)) != match_any(globs, n)] == [], entry


@needs_shipped
@pytest.mark.slow
@pytest.mark.parametrize("preset, dtype", [("t5-small", "fp16"), ("deepseek-v3", None)])
def test_names_kept_in_fp32_from_facts_equal_the_build(preset, dtype):
    """T5 keeps `wo` in fp32 in an fp16 load, DeepSeek-V3 its router's weight and bias in bf16: the facts' globs give
    the build's answer, document for document."""
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import memory_answer
    from paramscope.render.memory import memory_to_dict

    options = MemoryOptions(dtype=dtype, seq=32)
    report, memory, view = memory_answer(preset, options)
    assert view.module is None, report.model.engine_detail
    kept = view.kept_in_fp32("float16" if dtype == "fp16" else "bfloat16", [p.name for p in report.params])
    assert kept and all(("wo" in n) if preset == "t5-small" else ("gate.weight" in n or "e_score" in n) for n in kept)
    built_report, built_memory, built_view = memory_answer(preset, options, use_cache=False)
    assert built_view.module is not None and memory_to_dict(built_memory) == memory_to_dict(memory)
