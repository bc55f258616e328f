"""Every way a model can be named: preset, config file, directory, HF cache layouts, hub id offline."""

from __future__ import annotations

import json

import pytest

from paramscope import SourceError
from paramscope.presets import find_preset
from paramscope.sources import resolve

from conftest import bert_config, report_of

REPO = "someorg/tiny-bert"
SHA = "0123456789abcdef0123456789abcdef01234567"


def make_hf_cache(root, repo_id: str = REPO, config: dict | None = None):
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<sha>/config.json}."""
    repo_dir = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(SHA)
    (snapshot / "config.json").write_text(json.dumps(config or bert_config()))
    return repo_dir, snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_preset_by_alias_hub_id_and_case():
    for name in ("bert-base-uncased", "google-bert/bert-base-uncased", "BERT-BASE-UNCASED", "bert-base"):
        source = resolve(name)
        assert source.kind == "preset"
        assert source.label == "google-bert/bert-base-uncased"
        assert source.config["vocab_size"] == 30522


def test_all_foundation_presets_exist():
    for name in ("bert-base-uncased", "bert-base-cased", "bert-large-uncased", "bert-large-cased",
                 "bert-base-chinese", "bert-base-multilingual-cased", "distilbert-base-uncased",
                 "roberta-base", "roberta-large"):
        assert find_preset(name) is not None, name


def test_config_file_and_directory(write_config, tmp_path):
    path = write_config(bert_config())
    assert resolve(str(path)).kind == "config-file"
    source = resolve(str(tmp_path))
    assert source.kind == "directory"
    assert source.path == str(path)


def test_hf_cache_snapshot_folder_and_repo_folder(tmp_path):
    repo_dir, snapshot = make_hf_cache(tmp_path)
    assert resolve(str(snapshot)).config["hidden_size"] == 768
    # The repo folder itself: follow refs/main to the snapshot.
    assert resolve(str(repo_dir)).path == str(snapshot / "config.json")


def test_hub_id_offline_uses_the_local_cache(offline_cache):
    make_hf_cache(offline_cache, config=bert_config(num_hidden_layers=2))
    source = resolve(REPO)
    assert source.kind == "hub-cache"
    assert "local Hugging Face cache" in source.description
    assert source.config["num_hidden_layers"] == 2


def test_hub_id_offline_nothing_cached_says_which(offline_cache):
    with pytest.raises(SourceError, match="HF_HUB_OFFLINE is set, and its config.json is not in the local cache"):
        resolve("nobody/nothing-here")


def test_hub_unreachable_falls_back_to_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    import paramscope.sources as sources

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    connects = []
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: connects.append(timeout) or False)
    with pytest.raises(SourceError) as refused:
        resolve(REPO)
    # one line naming the bound that applied: the one quick connect, HUB_CONNECT_TIMEOUT (3 s), made once
    assert str(refused.value) == (f"hub id {REPO}: the Hugging Face Hub cannot be reached (no answer from "
                                  f"huggingface.co:443 within 3 s), and its config.json is not in the local cache "
                                  f"({cache})")
    assert connects == [3.0] and sources.HUB_CONNECT_TIMEOUT == 3.0
    make_hf_cache(cache)
    assert resolve(REPO).kind == "hub-cache"


def test_a_hub_that_answers_the_connect_but_not_the_request_names_huggingface_hubs_bound(tmp_path, monkeypatch):
    """The quick connect succeeds, but huggingface_hub's request finds nothing (it gives up after its own
    HF_HUB_ETAG_TIMEOUT and looks in the cache): one line naming that bound, not a bare "cannot be reached"."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    import paramscope.sources as sources

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 10)
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: True)

    def unanswered(*args, **kwargs):
        raise LocalEntryNotFoundError("connection timed out (test)")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unanswered)
    with pytest.raises(SourceError) as refused:
        resolve(REPO)
    assert str(refused.value) == (f"hub id {REPO}: the Hugging Face Hub did not answer ({constants.ENDPOINT}, within "
                                  "huggingface_hub's HF_HUB_ETAG_TIMEOUT of 10 s), and its config.json is not in the "
                                  f"local cache ({cache})")


def test_hub_cache_report_end_to_end(offline_cache):
    make_hf_cache(offline_cache)
    report = report_of(REPO, "BertModel")
    assert report.parameters.total == 109_482_240
    assert report.model.source_kind == "hub-cache"


def test_unknown_name_and_missing_path():
    with pytest.raises(SourceError, match="unknown model 'not-a-model'"):
        resolve("not-a-model")
    with pytest.raises(SourceError, match="no such file or directory: missing/config.json"):
        resolve("missing/config.json")


def test_python_inputs_config_object_dict_and_live_module():
    import torch
    import transformers

    import paramscope

    config = transformers.BertConfig(num_hidden_layers=2)
    assert paramscope.inspect(config, model_class="BertModel").model.source_kind == "config-object"
    as_dict = paramscope.inspect(bert_config(), model_class="BertModel")
    assert as_dict.parameters.total == 109_482_240

    class TinyLM(torch.nn.Module):
        """A user's own model: tied input/output embeddings and a frozen part."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(100, 16)
            self.body = torch.nn.Linear(16, 16)
            self.out = torch.nn.Linear(16, 100, bias=False)
            self.out.weight = self.embed.weight
            self.body.requires_grad_(False)

    with torch.device("meta"):
        model = TinyLM()
    report = paramscope.inspect(model)
    assert report.model.source_kind == "module"
    assert report.parameters.total == 100 * 16 + 16 * 16 + 16
    assert report.parameters.frozen == 16 * 16 + 16
    assert report.parameters.trainable == 1_600
    assert report.parameters.with_tied_duplicates == 1_600 * 2 + 272
    assert [(g.canonical, g.aliases) for g in report.tied] == [("embed.weight", ("out.weight",))]
    assert report.tree.params == report.parameters.total


def test_a_misspelled_preset_gets_the_closest_names():
    from paramscope.presets import close_preset_names, presets_named

    assert close_preset_names("bert-base-uncasd") == ["bert-base-uncased"]
    assert close_preset_names("google-bert/bert-base-uncasd") == ["google-bert/bert-base-uncased"]
    assert close_preset_names("explode") == []
    assert close_preset_names("x" * 10_000) == []
    with pytest.raises(SourceError, match=r"no preset named 'mixtral-8x7'; did you mean 'mixtral-8x7b'\?"):
        presets_named(["mixtral-8x7"])
    with pytest.raises(SourceError, match=r"unknown model 'gpt-2': did you mean 'gpt2'\?"):
        resolve("gpt-2")


def test_a_config_transformers_saved_with_an_infinite_field_reads_as_transformers_loads_it(tmp_path):
    # transformers 5's save_pretrained writes float("inf") as {"__float__": "Infinity"} (Granite-4.0-H's
    # time_step_limit): read raw, the class's own validation refuses the object
    from transformers import AutoConfig

    AutoConfig.for_model("granitemoehybrid", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, intermediate_size=32, shared_intermediate_size=64,
                         mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, num_local_experts=4,
                         num_experts_per_tok=2, layer_types=["mamba", "attention"]).save_pretrained(tmp_path)
    assert {"__float__": "Infinity"} in json.loads((tmp_path / "config.json").read_text())["time_step_limit"]
    source = resolve(str(tmp_path))
    assert source.config["time_step_limit"] == [0.0, float("inf")]
    import torch
    from transformers import AutoModel

    with torch.device("meta"):
        real = AutoModel.from_config(AutoConfig.from_pretrained(tmp_path))
    assert report_of(str(tmp_path)).total == sum(p.numel() for p in real.parameters())
