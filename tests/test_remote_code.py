"""Remote code: exactly the file given, only with --trust-remote-code, and --class for a native class.

A local remote-code model is a folder with config.json, configuration_x.py and modeling_x.py, its auto_map naming
them, as `transformers` writes with `register_for_auto_class`.
"""

from __future__ import annotations

import json

import pytest

import paramscope
from paramscope import ModelClassError, RemoteCodeError

from conftest import bert_config
from test_errors import assert_one_line_error, run_cli
from test_sources import SHA, make_hf_cache

CONFIGURATION = '''
from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny_remote"

    def __init__(self, width=10, depth=1, **kwargs):
        self.width = width
        self.depth = depth
        super().__init__(**kwargs)
'''

MODELING = '''
import torch
from transformers import PreTrainedModel

from .configuration_x import TinyConfig


class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(config.width, config.width) for _ in range(config.depth))
        self.post_init()


class TinyForClassification(TinyModel):
    def __init__(self, config):
        super().__init__(config)
        self.classifier = torch.nn.Linear(config.width, config.num_labels)
'''

AUTO_MAP = {
    "AutoConfig": "configuration_x.TinyConfig",
    "AutoModel": "modeling_x.TinyModel",
    "AutoModelForSequenceClassification": "modeling_x.TinyForClassification",
}


def tiny_config(**fields) -> dict:
    return {"model_type": "tiny_remote", "auto_map": AUTO_MAP, "architectures": ["TinyModel"], **fields}


@pytest.fixture
def remote_dir(tmp_path, monkeypatch):
    """A folder holding a remote-code model; transformers copies its modules into a private modules cache."""
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "configuration_x.py").write_text(CONFIGURATION)
    (folder / "modeling_x.py").write_text(MODELING)
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    return folder


def test_local_remote_code_model_builds_with_the_flag(remote_dir):
    report = paramscope.inspect(remote_dir, trust_remote_code=True)
    assert report.total == 10 * 10 + 10
    assert report.model.class_name == "TinyModel"
    assert report.model.native is False
    assert "remote code modeling_x.TinyModel" in report.model.class_reason


def test_local_remote_code_model_is_refused_without_the_flag(capsys, remote_dir):
    line = assert_one_line_error(capsys, ["inspect", str(remote_dir)], "'tiny_remote'", "--trust-remote-code")
    assert "--class" not in line  # transformers has no TinyModel: the flag is the only way


def test_the_file_given_is_read_not_config_json_beside_it(remote_dir):
    """The bug: dir/other.json was read as dir/config.json (here a BERT config) and BERT's count was reported."""
    (remote_dir / "config.json").write_text(json.dumps(bert_config()))
    other = remote_dir / "other.json"
    other.write_text(json.dumps(tiny_config(width=4, depth=3)))
    report = paramscope.inspect(str(other), trust_remote_code=True)
    assert report.total == 3 * (4 * 4 + 4)
    assert report.model.class_name == "TinyModel"


def test_remote_task_and_class_choose_from_auto_map(remote_dir):
    by_task = paramscope.inspect(remote_dir, trust_remote_code=True, task="sentiment", num_labels=3)
    assert by_task.model.class_name == "TinyForClassification"
    assert by_task.total == 110 + 10 * 3 + 3
    by_class = paramscope.inspect(remote_dir, trust_remote_code=True, model_class="TinyForClassification")
    assert by_class.total == 110 + 10 * 2 + 2  # PretrainedConfig's default num_labels is 2
    with pytest.raises(ModelClassError, match="auto_map names no such class"):
        paramscope.inspect(remote_dir, trust_remote_code=True, model_class="TinyForQA")
    with pytest.raises(ModelClassError, match="AutoModelForCausalLM"):
        paramscope.inspect(remote_dir, trust_remote_code=True, task="text-generation")


def test_remote_code_cli_end_to_end(capsys, remote_dir):
    code, out, err = run_cli(capsys, "inspect", str(remote_dir), "--trust-remote-code", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["parameters"]["total"] == 110
    assert err == ""


def test_missing_remote_module_is_one_line(capsys, remote_dir):
    (remote_dir / "modeling_x.py").unlink()
    assert_one_line_error(capsys, ["inspect", str(remote_dir), "--trust-remote-code"], "modeling_x")


def test_remote_code_from_a_hub_cache(tmp_path, monkeypatch, remote_dir):
    """A hub id offline: config.json and the code files come from the local cache's snapshot."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _, snapshot = make_hf_cache(cache, "someorg/tiny-remote", tiny_config(width=6))
    for name in ("configuration_x.py", "modeling_x.py"):
        (snapshot / name).write_text((remote_dir / name).read_text())
    report = paramscope.inspect("someorg/tiny-remote", trust_remote_code=True)
    assert report.total == 6 * 6 + 6
    assert report.model.source_kind == "hub-cache" and snapshot.name == SHA


KIMI_LIKE = {
    # Kimi-K2's config names DeepSeek-V3's classes in auto_map under its own model_type.
    "model_type": "kimi_k2",
    "architectures": ["DeepseekV3ForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "kv_lora_rank": 16,
    "q_lora_rank": 32, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "n_group": 1,
    "topk_group": 1,
}


def test_unknown_model_type_naming_a_native_class_suggests_class(capsys, write_config):
    path = write_config(KIMI_LIKE)
    assert_one_line_error(capsys, ["inspect", str(path)], "'kimi_k2'", "--trust-remote-code",
                          "--class DeepseekV3ForCausalLM")


def test_class_reads_an_unknown_model_type_with_the_native_config(write_config):
    report = paramscope.inspect(str(write_config(KIMI_LIKE)), model_class="DeepseekV3ForCausalLM")
    assert report.model.native is True
    assert any("read with DeepseekV3Config" in note for note in report.model.notes)
    expected = paramscope.inspect({**KIMI_LIKE, "model_type": "deepseek_v3"}, model_class="DeepseekV3ForCausalLM")
    assert report.total == expected.total
    assert report.active == expected.active


def test_remote_code_refusal_is_a_remote_code_error(write_config):
    with pytest.raises(RemoteCodeError):
        paramscope.inspect(str(write_config(tiny_config())))


# --- a native model_type with an auto_map (issue 30): the flag builds what transformers' Auto classes build ------------
# transformers 5.24, checked by hand: AutoConfig.from_pretrained(folder, trust_remote_code=True) reads this config with
# TinyConfig, and AutoModel.from_config(config, trust_remote_code=True) builds TinyModel (110 parameters); without the
# flag, BertConfig and BertModel (109,482,240). TinyConfig keeps its own defaults (width 10, depth 1).
BERT_BASE_MODEL = 109_482_240


@pytest.fixture
def native_remote_dir(remote_dir):
    """The toy remote model's folder, its config a BERT config (model_type "bert") whose auto_map names the toy."""
    (remote_dir / "config.json").write_text(json.dumps(bert_config(auto_map=AUTO_MAP, architectures=["TinyModel"])))
    return remote_dir


def test_trust_remote_code_prefers_auto_map_over_a_native_model_type(native_remote_dir):
    report = paramscope.inspect(native_remote_dir, trust_remote_code=True)
    assert report.total == 10 * 10 + 10
    assert report.model.class_name == "TinyModel" and report.model.native is False
    assert report.model.class_reason == ("the checkpoint's own class (config architectures[0]), remote code "
                                         "modeling_x.TinyModel")
    assert any("auto_map classes were used" in note for note in report.model.notes)
    by_task = paramscope.inspect(native_remote_dir, trust_remote_code=True, task="sentiment", num_labels=3)
    assert by_task.model.class_name == "TinyForClassification" and by_task.total == 110 + 10 * 3 + 3


def test_without_the_flag_a_native_model_type_builds_the_native_class(native_remote_dir):
    report = paramscope.inspect(native_remote_dir, use_cache=False)
    assert report.total == BERT_BASE_MODEL  # architectures[0] TinyModel is no transformers class: AutoModel's BertModel
    assert report.model.class_name == "BertModel" and report.model.native is True
    assert any("no remote code ran" in note for note in report.model.notes)
    assert paramscope.inspect(native_remote_dir).total == BERT_BASE_MODEL  # the template path agrees


def test_the_flag_with_a_native_class_builds_the_native_class(native_remote_dir):
    report = paramscope.inspect(native_remote_dir, trust_remote_code=True, model_class="BertModel")
    assert report.total == BERT_BASE_MODEL and report.model.native is True


def test_the_class_line_names_the_remote_class(capsys, native_remote_dir):
    code, out, err = run_cli(capsys, "inspect", str(native_remote_dir), "--trust-remote-code", "--width", "200")
    assert code == 0, err
    assert "  class    TinyModel, remote code\n" in out and "BertModel" not in out
    code, out, err = run_cli(capsys, "inspect", str(native_remote_dir), "--json")
    assert code == 0, err
    assert json.loads(out)["parameters"]["total"] == BERT_BASE_MODEL


def test_the_flag_with_missing_code_is_one_line_naming_the_native_way(capsys, native_remote_dir):
    (native_remote_dir / "configuration_x.py").unlink()
    assert_one_line_error(capsys, ["inspect", str(native_remote_dir), "--trust-remote-code"], "configuration_x",
                          "without --trust-remote-code, transformers' own BertConfig reads this config")


def test_the_flag_on_a_preset_has_no_code_to_run(monkeypatch):
    """An embedded preset carries no code files: its native class, and a note saying the flag ran nothing."""
    report = paramscope.inspect("phi-3-mini", trust_remote_code=True)
    assert report.model.class_name == "Phi3ForCausalLM" and report.total == 3_821_079_552
    assert any("carries no code files" in note for note in report.model.notes)


def test_auto_map_without_auto_config_builds_the_remote_class_from_the_native_config(capsys, remote_dir):
    """transformers reads this config with BertConfig, then AutoModel builds TinyModel from it, which fails on the
    missing `depth` (transformers 5.24: "'BertConfig' object has no attribute 'depth'"): so does the flag here."""
    models_only = {key: ref for key, ref in AUTO_MAP.items() if key != "AutoConfig"}
    (remote_dir / "config.json").write_text(json.dumps(bert_config(auto_map=models_only, architectures=["TinyModel"])))
    assert_one_line_error(capsys, ["inspect", str(remote_dir), "--trust-remote-code"], "TinyModel", "depth")
    assert paramscope.inspect(remote_dir, use_cache=False).total == BERT_BASE_MODEL
