"""Results are read-only all the way down: tuples and FrozenDicts (frozen.py), never a list, dict or set that a
caller could change in place; each result hashes; and JSON of a FrozenDict is byte for byte a dict's."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

import paramscope
from paramscope.frozen import FrozenDict, freeze, json_default, thaw

from conftest import report_of

# Fields that hold live or input objects on purpose, each documented where it is declared: the plan's meta module
# (plan.Plan), the config a Source read (input, not a result: transformers takes it as a dict), a formula's stored
# spec (formula_cache.FormulaSpec). None takes part in == or hash (compare=False).
NOT_WALKED = {("Plan", "module"), ("Source", "config"), ("Formula", "spec")}


def mutable_parts(value, path="result", seen=None) -> list[str]:
    """Every list, dict, set or unfrozen dataclass inside `value`, by path."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, (list, dict, set, bytearray)):
        return [f"{path}: {type(value).__name__}"]
    found = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not value.__dataclass_params__.frozen:
            found.append(f"{path}: {type(value).__name__} is not frozen")
        for f in dataclasses.fields(value):
            if (type(value).__name__, f.name) in NOT_WALKED:
                assert not f.compare, (type(value).__name__, f.name)
                continue
            found += mutable_parts(getattr(value, f.name), f"{path}.{f.name}", seen)
    elif isinstance(value, (tuple, frozenset)):
        for index, item in enumerate(value):
            found += mutable_parts(item, f"{path}[{index}]", seen)
    elif isinstance(value, FrozenDict):
        for key, item in value.items():
            found += mutable_parts(item, f"{path}[{key!r}]", seen)
    return found


def mapping_fields(value, path="result", seen=None):
    """(path, FrozenDict) of every FrozenDict inside `value`."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, FrozenDict):
        yield path, value
        for key, item in value.items():
            yield from mapping_fields(item, f"{path}[{key!r}]", seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if (type(value).__name__, f.name) not in NOT_WALKED:
                yield from mapping_fields(getattr(value, f.name), f"{path}.{f.name}", seen)
    elif isinstance(value, (tuple, frozenset)):
        for index, item in enumerate(value):
            yield from mapping_fields(item, f"{path}[{index}]", seen)


def assert_read_only(result, *, mappings: tuple[str, ...]):
    """Nothing mutable inside; hash works and agrees with ==; each mapping named (an attribute path) refuses
    item assignment, deletion and the dict methods that change one."""
    assert mutable_parts(result) == []
    assert hash(result) == hash(copy.copy(result))
    assert result == dataclasses.replace(result) and hash(result) == hash(dataclasses.replace(result))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(result, dataclasses.fields(result)[0].name, None)
    for dotted in mappings:
        mapping = result
        for part in dotted.split("."):
            mapping = getattr(mapping, part)
        assert isinstance(mapping, FrozenDict), dotted
        key = next(iter(mapping), "x")
        with pytest.raises(TypeError):
            mapping[key] = 0
        with pytest.raises(TypeError):
            del mapping[key]
        for method in ("update", "pop", "popitem", "setdefault", "clear"):
            assert not hasattr(mapping, method), (dotted, method)
    for path, mapping in mapping_fields(result):
        with pytest.raises(TypeError):
            mapping["x"] = 0


# --- the frozen mapping itself ----------------------------------------------------------------------------------


def test_frozen_dict_reads_like_a_dict_and_cannot_change():
    items = {"b": 2, "a": 1}
    frozen = FrozenDict(items)
    assert frozen == items and items == frozen and frozen != {"a": 1}
    assert list(frozen) == ["b", "a"] and frozen["a"] == 1 and frozen.get("c") is None and "b" in frozen
    assert repr(frozen) == repr(items) and dict(frozen) == items and len(frozen) == 2
    assert hash(frozen) == hash(FrozenDict({"a": 1, "b": 2}))  # order-free, like ==
    with pytest.raises(TypeError):
        frozen["a"] = 5
    with pytest.raises(TypeError):
        del frozen["a"]
    with pytest.raises(TypeError):
        frozen.extra = 1
    with pytest.raises(AttributeError):
        frozen.update({"a": 5})
    assert frozen | {"c": 3} == {"b": 2, "a": 1, "c": 3} and frozen == items  # a new mapping; this one unchanged
    assert pickle.loads(pickle.dumps(frozen)) == frozen and copy.deepcopy(frozen) is frozen
    with pytest.raises(TypeError):
        hash(FrozenDict(a=[1]))  # hashes when its values do: freeze makes them


def test_freeze_goes_all_the_way_down_and_json_is_unchanged():
    data = {"batch": 4, "gpus": ["h100", "a100"], "nested": {"sizes": [1, 2], "on": True}, "none": None}
    frozen = freeze(data)
    assert frozen == {"batch": 4, "gpus": ("h100", "a100"), "nested": {"sizes": (1, 2), "on": True}, "none": None}
    assert isinstance(frozen["nested"], FrozenDict) and hash(frozen)
    assert json.dumps(frozen, default=json_default, indent=2) == json.dumps(data, indent=2)
    assert json.dumps(thaw(frozen), ensure_ascii=False) == json.dumps(data, ensure_ascii=False)
    assert freeze(frozen) is frozen
    with pytest.raises(TypeError):
        json.dumps(frozen)  # a Mapping, not a dict: a JSON writer must thaw it, or pass json_default


# --- every public result ----------------------------------------------------------------------------------------


def test_report_is_read_only_and_hashes():
    report = report_of("bert-base-uncased", "BertForMaskedLM")
    assert_read_only(report, mappings=("breakdown",))
    with pytest.raises(TypeError):
        report.breakdown["x"] = 0
    assert "x" not in report.breakdown
    assert {report: 1}[report_of("bert-base-uncased", "BertForMaskedLM")] == 1  # equal reports, one key


@pytest.mark.parametrize("model", ["mistralai/Mixtral-8x7B-v0.1", "albert-base-v2"])
def test_moe_and_shared_layer_reports_are_read_only(model):
    assert_read_only(paramscope.inspect(model), mappings=("breakdown",))


def test_memory_estimates_are_read_only():
    serving = paramscope.estimate_memory("meta-llama/Meta-Llama-3-8B")
    assert_read_only(serving, mappings=("settings", "weights.by_dtype", "weights.buffers_by_dtype",
                                        "weights.by_role", "weights.by_component"))
    assert serving.kv_cache is not None and hash(serving.kv_cache)
    with pytest.raises(TypeError):
        serving.settings["batch"] = 64
    training = paramscope.estimate_training(
        "Qwen/Qwen2.5-0.5B", paramscope.TrainingOptions(batch=4, seq=1024, zero=3, devices=8))
    assert training.training is not None and training.training.per_device is not None
    assert_read_only(training, mappings=("settings", "training.per_device", "training.by_category"))


def test_flop_estimate_is_read_only():
    estimate = paramscope.estimate_flops("meta-llama/Meta-Llama-3-8B", paramscope.FlopOptions(training=True))
    assert_read_only(estimate, mappings=())
    assert hash(estimate.compute)


def test_comparison_and_diff_are_read_only():
    from paramscope.compare import compare_reports
    from paramscope.diff import diff_reports

    bert, roberta = report_of("bert-base-uncased", "BertModel"), paramscope.inspect("roberta-base")
    comparison = compare_reports([bert, roberta])
    assert_read_only(comparison, mappings=())
    for column in comparison.columns:
        assert_read_only(column, mappings=("breakdown", "groups"))
    assert_read_only(diff_reports(bert, report_of("bert-base-uncased", "BertForMaskedLM")), mappings=())


def test_formula_is_read_only():
    formula = paramscope.derive_formula("bert-base-uncased", model_class="BertModel")
    assert_read_only(formula, mappings=("by_role", "symbols", "values"))
    assert isinstance(formula.shown().values, FrozenDict)


def test_audit_result_is_read_only(tmp_path):
    from paramscope.audit import audit

    from test_audit import write_safetensors

    report = report_of("bert-base-uncased", "BertModel")
    shapes = {p.name: p.shape for p in report.params}
    shapes["embeddings.position_ids"] = (1, 512)
    (tmp_path / "config.json").write_text(json.dumps(paramscope.presets.find_preset("bert-base-uncased")
                                                     .load_config()))
    write_safetensors(tmp_path / "model.safetensors", shapes)
    result = audit(tmp_path, model_class="BertModel")
    assert result.audit.complete
    assert_read_only(result, mappings=("audit.by_dtype", "checkpoint.metadata", "checkpoint.by_dtype"))
    assert_read_only(result.audit, mappings=("by_dtype",))
    with pytest.raises(TypeError):
        result.checkpoint.by_dtype["F32"]["tensors"] = 0  # a cached property: the next reader sees the same


def test_plan_and_its_traced_memory_are_read_only(write_config):
    """A plan holds its live meta module, which takes no part in == or hash (plan.Plan): both are its figures."""
    from paramscope.api import inspect_with_module
    from paramscope.plan import PlanOptions, make_plan, plan_memory

    from conftest import bert_config

    report, module = inspect_with_module(write_config(bert_config(num_hidden_layers=2)))
    plan = make_plan(report, module, PlanOptions(lora=4))
    assert_read_only(plan, mappings=("by_role",))
    assert plan == dataclasses.replace(plan, module=None) and hash(plan) == hash(dataclasses.replace(plan, module=None))
    estimate = plan_memory(plan)
    traced = estimate.training.traced
    assert traced is not None
    assert_read_only(estimate, mappings=("settings", "training.by_category"))
    assert_read_only(traced, mappings=("resident", "end_of_forward"))
    for phase in traced.phases:
        assert_read_only(phase, mappings=("by_category",))


def test_json_of_a_frozen_result_is_plain_data(capsys):
    """The settings hold a list (--freeze) that freeze made a tuple, inside a FrozenDict: the JSON document is
    still plain lists and objects, as before results were frozen."""
    from paramscope.cli import main

    assert main(["memory", "Qwen/Qwen2.5-0.5B", "--training", "--freeze", "embedding", "--freeze", "lm_head*",
                 "--json"]) == 0
    text = capsys.readouterr().out
    document = json.loads(text)
    settings = document["memory"]["settings"]
    assert settings["freeze"] == ["embedding", "lm_head*"]
    assert isinstance(document["memory"]["weights"]["by_role"], dict)
    assert json.dumps(document, indent=2, ensure_ascii=False) + "\n" == text  # nothing written specially
