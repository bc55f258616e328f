"""`paramscope audit`: a real checkpoint reconciled with its architecture, from headers only."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from paramscope.audit import audit, locate_checkpoint
from paramscope.cli import main
from paramscope.errors import SourceError

from conftest import bert_config

# ---------------------------------------------------------------------------------------------
# the real all-MiniLM-L6-v2 checkpoint (a BertModel: 6 layers, hidden 384)
# ---------------------------------------------------------------------------------------------

MINILM_PARAMS = 22_713_216


@pytest.mark.checkpoint
def test_minilm_matches_bert_model_exactly(minilm_dir):
    result = audit(minilm_dir)
    assert result.report.model.class_name == "BertModel"
    assert result.report.total == MINILM_PARAMS
    a = result.audit
    assert a.complete
    assert len(a.matched) == 103
    assert a.parameters == MINILM_PARAMS
    assert a.missing == () and a.unexpected == () and a.mismatched == ()
    assert [(f.name, f.shape) for f in a.non_parameters] == [("embeddings.position_ids", (1, 512))]
    assert result.checkpoint.elements == 22_713_728 == MINILM_PARAMS + 512
    assert result.checkpoint.nbytes == 90_856_960
    assert dict(a.by_dtype) == {"F32": {"tensors": 103, "elements": MINILM_PARAMS, "bytes": 90_852_864},
                                "I64": {"tensors": 1, "elements": 512, "bytes": 4_096}}
    counts = result.counts
    assert counts.value("checkpoint_elements") == 22_713_728
    assert counts.value("checkpoint_parameters") == MINILM_PARAMS
    words = next(line.explanation for line in counts.lines if line.key == "checkpoint_elements")
    assert words == "22,713,728 = 22,713,216 model parameters + 512 in non-parameters (embeddings.position_ids)"


@pytest.mark.checkpoint
def test_minilm_as_sequence_classifier_has_a_new_head(minilm_dir):
    result = audit(minilm_dir / "model.safetensors", model_class="BertForSequenceClassification")
    assert result.report.total == MINILM_PARAMS + 384 * 2 + 2
    a = result.audit
    assert not a.complete
    assert [(f.name, f.shape) for f in a.missing] == [("classifier.bias", (2,)), ("classifier.weight", (2, 384))]
    assert all("newly initialised" in f.reason for f in a.missing)
    assert a.parameters == MINILM_PARAMS
    assert len(a.renamed) == 103  # every key gains the base-model prefix "bert."


@pytest.mark.checkpoint
def test_minilm_as_masked_lm(minilm_dir):
    result = audit(minilm_dir, model_class="BertForMaskedLM")
    a = result.audit
    assert [f.name for f in a.unexpected] == ["pooler.dense.bias", "pooler.dense.weight"]
    assert all("pooler that BertForMaskedLM does not have" in f.reason for f in a.unexpected)
    assert sum(f.shape[0] * (f.shape[1] if len(f.shape) > 1 else 1) for f in a.missing) == 179_130
    assert a.parameters == MINILM_PARAMS - 147_840
    assert result.counts.value("checkpoint_elements") == 22_713_728


@pytest.mark.checkpoint
def test_cli_audit_json(capsys, minilm_dir):
    assert main(["audit", str(minilm_dir), "--class", "BertForSequenceClassification", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["parameters"]["total"] == MINILM_PARAMS + 770
    ck = doc["checkpoint"]
    assert {"parameters", "elements", "missing", "unexpected", "non_parameters", "mismatched", "by_dtype"} <= set(ck)
    assert ck["parameters"] == MINILM_PARAMS
    assert ck["elements"] == 22_713_728
    assert [m["name"] for m in ck["missing"]] == ["classifier.bias", "classifier.weight"]
    assert ck["unexpected"] == [] and ck["mismatched"] == []
    assert ck["non_parameters"] == [{"name": "embeddings.position_ids", "shape": [1, 512],
                                     "reason": "buffer, not a parameter"}]
    assert ck["by_dtype"]["F32"] == {"tensors": 103, "elements": MINILM_PARAMS, "bytes": 90_852_864}
    assert ck["format"] == "safetensors" and ck["complete"] is False


@pytest.mark.checkpoint
def test_cli_audit_text(capsys, minilm_dir):
    assert main(["audit", str(minilm_dir), "--class", "BertForSequenceClassification", "--width", "160"]) == 0
    out = capsys.readouterr().out
    assert "newly initialised in BertForSequenceClassification (not in the checkpoint): classifier.bias, " \
           "classifier.weight" in out
    assert "expected for a new task head" in out
    assert "22,713,728 = 22,713,216 model parameters + 512 in non-parameters (embeddings.position_ids)" in out
    assert "103 keys gain the base-model prefix 'bert.'" in out


# ---------------------------------------------------------------------------------------------
# synthetic checkpoints from a tiny BERT config
# ---------------------------------------------------------------------------------------------

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100,
            max_position_embeddings=64)


def state_dict_shapes(model_class: str, config: dict) -> dict[str, tuple[int, ...]]:
    import torch
    import transformers
    cfg = transformers.BertConfig.from_dict(config)
    with torch.device("meta"):
        module = getattr(transformers, model_class)(cfg)
    return {name: tuple(t.shape) for name, t in module.state_dict().items()}


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "F32") -> Path:
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d
        size = n * (8 if name.endswith("_ids") else 4)
        header[name] = {"dtype": "I64" if name.endswith("_ids") else dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return path


def tiny_checkpoint(directory: Path, model_class: str, *, legacy_names: bool = False, drop=(),
                    architectures=None) -> Path:
    config = bert_config(**TINY, architectures=architectures or [model_class])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    shapes = state_dict_shapes(model_class, config)
    shapes = {k: v for k, v in shapes.items() if k not in drop}
    if legacy_names:  # the original BERT release's names
        shapes = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                  for k, v in shapes.items()}
    shapes["bert.embeddings.position_ids" if model_class != "BertModel" else "embeddings.position_ids"] = (1, 64)
    return write_safetensors(directory / "model.safetensors", shapes)


def tiny_total(model_class: str) -> int:
    import paramscope

    return paramscope.inspect(bert_config(**TINY), model_class=model_class).total


def test_pretraining_checkpoint_audited_as_bert_model(tmp_path):
    # Like bert-base-uncased's own checkpoint: BertForPreTraining keys with "bert." and cls.*, gamma/beta names.
    tiny_checkpoint(tmp_path / "ckpt", "BertForPreTraining", legacy_names=True)
    result = audit(tmp_path / "ckpt", model_class="BertModel")
    a = result.audit
    assert a.complete and a.parameters == tiny_total("BertModel") == result.report.total
    reasons = {f.name: f.reason for f in a.unexpected}
    assert sorted(reasons) == [
        "cls.predictions.bias", "cls.predictions.decoder.bias", "cls.predictions.decoder.weight",
        "cls.predictions.transform.LayerNorm.beta", "cls.predictions.transform.LayerNorm.gamma",
        "cls.predictions.transform.dense.bias", "cls.predictions.transform.dense.weight",
        "cls.seq_relationship.bias", "cls.seq_relationship.weight",
    ]
    assert reasons["cls.predictions.bias"] == "part of the MLM pretraining head that BertModel does not have"
    assert reasons["cls.seq_relationship.weight"] == (
        "part of the next-sentence-prediction pretraining head that BertModel does not have")
    renamed = dict(a.renamed)
    assert renamed["bert.embeddings.LayerNorm.gamma"] == "embeddings.LayerNorm.weight"  # prefix and gamma/beta
    assert renamed["bert.pooler.dense.weight"] == "pooler.dense.weight"
    assert [f.name for f in a.non_parameters] == ["bert.embeddings.position_ids"]
    unexpected = 32 * 32 + 32 + 32 + 32 + 100 + 100 + 100 * 32 + 2 * 32 + 2
    assert result.counts.value("checkpoint_elements") == a.parameters + 64 + unexpected


def test_bert_model_checkpoint_audited_as_sequence_classifier(tmp_path, capsys):
    tiny_checkpoint(tmp_path / "base", "BertModel")
    result = audit(tmp_path / "base", model_class="BertForSequenceClassification", num_labels=3)
    a = result.audit
    assert [(f.name, f.shape) for f in a.missing] == [("classifier.bias", (3,)), ("classifier.weight", (3, 32))]
    assert all(f.reason == "task head not in the checkpoint: newly initialised, must be trained" for f in a.missing)
    assert a.unexpected == ()
    assert a.parameters == tiny_total("BertModel") == result.report.total - (32 * 3 + 3)
    assert main(["audit", str(tmp_path / "base"), "--class", "BertForSequenceClassification", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "newly initialised in BertForSequenceClassification (not in the checkpoint): classifier.bias, " \
           "classifier.weight" in out


def test_masked_lm_checkpoint_without_the_tied_decoder(tmp_path):
    # save_pretrained writes a tied tensor once: the decoder weight is not in the file, and nothing is missing.
    tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM",
                    drop=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"))
    result = audit(tmp_path / "mlm")
    assert result.report.model.class_name == "BertForMaskedLM"
    assert result.audit.complete and result.audit.unexpected == ()
    assert result.audit.parameters == result.report.total


def test_shape_mismatch(tmp_path):
    directory = tmp_path / "ck"
    tiny_checkpoint(directory, "BertModel")
    config = json.loads((directory / "config.json").read_text())
    config["vocab_size"] = 120
    (directory / "config.json").write_text(json.dumps(config))
    result = audit(directory)
    assert [(m.name, m.checkpoint_shape, m.model_shape) for m in result.audit.mismatched] == [
        ("embeddings.word_embeddings.weight", (100, 32), (120, 32))]
    assert not result.audit.complete


def test_pytorch_bin_is_read_safely(tmp_path):
    import torch
    import transformers
    directory = tmp_path / "bin"
    directory.mkdir()
    config = bert_config(**TINY, architectures=["BertModel"])
    (directory / "config.json").write_text(json.dumps(config))
    module = transformers.BertModel(transformers.BertConfig.from_dict(config))
    torch.save(module.state_dict(), directory / "pytorch_model.bin")
    result = audit(directory)
    assert result.checkpoint.format == "pytorch-bin"
    assert result.audit.complete and result.audit.parameters == result.report.total == tiny_total("BertModel")


def test_a_config_can_be_named_for_a_bare_file(tmp_path, capsys):
    path = tiny_checkpoint(tmp_path / "x", "BertModel")
    (tmp_path / "x" / "config.json").unlink()
    with pytest.raises(SourceError, match="no config.json next to checkpoint"):
        audit(path)
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(bert_config(**TINY)))
    result = audit(path, config=str(config), model_class="BertModel")
    assert result.audit.complete
    assert main(["audit", str(path)]) == 2
    assert "no config.json next to checkpoint" in capsys.readouterr().err


def test_hub_id_from_the_local_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    repo = tmp_path / "models--someone--tiny-bert"
    commit = "0123456789abcdef0123456789abcdef01234567"
    tiny_checkpoint(repo / "snapshots" / commit, "BertModel")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    located = locate_checkpoint("someone/tiny-bert")
    assert located.checkpoint == repo / "snapshots" / commit
    assert audit("someone/tiny-bert").audit.complete
    assert locate_checkpoint(repo).checkpoint == repo / "snapshots" / commit  # the cache folder itself
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("paramscope.sources._hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(SourceError) as refused:
        locate_checkpoint("someone/absent")
    assert str(refused.value) == ("hub id someone/absent: the Hugging Face Hub cannot be reached (no answer from "
                                  "huggingface.co:443 within 3 s), and no checkpoint of it is in the local cache "
                                  f"({tmp_path}); download it first or give a path")


def test_missing_path_is_one_line(capsys):
    assert main(["audit", "nowhere/model.safetensors"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["paramscope: error: no such file or directory: nowhere/model.safetensors"]
