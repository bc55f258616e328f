"""`paramscope audit ORG/NAME` online: config.json and the safetensors headers only, over HTTP range requests.

The Hub cannot be reached from the test machines, so the two network calls are replaced by what they return:
huggingface_hub's own SafetensorsRepoMetadata, built here from the real all-MiniLM-L6-v2 header, and the path
hf_hub_download would give for config.json. Everything from there on is paramscope's real code path.
"""

from __future__ import annotations

import json

import huggingface_hub
import pytest
from huggingface_hub.utils._safetensors import (
    SafetensorsFileMetadata,
    SafetensorsRepoMetadata,
    TensorInfo,
)

from paramscope.audit import audit, locate_checkpoint
from paramscope.checkpoint import checkpoint_from_hub_metadata
from paramscope.checkpoint.read import read_safetensors_header
from paramscope.cli import main
from paramscope.errors import CheckpointError

MINILM_PARAMS = 22_713_216
REPO = "sentence-transformers/all-MiniLM-L6-v2"


def repo_metadata(header: dict, shards: int = 1) -> SafetensorsRepoMetadata:
    """What get_safetensors_metadata returns for this header, split over `shards` files when asked."""
    header = dict(header)
    header.pop("__metadata__", None)
    names = sorted(header)
    files, weight_map = {}, {}
    for i in range(shards):
        part = names[i::shards]
        filename = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        offset, tensors = 0, {}
        for name in part:  # offsets rebased per file, as a real shard would have them
            begin, end = header[name]["data_offsets"]
            tensors[name] = TensorInfo(dtype=header[name]["dtype"], shape=header[name]["shape"],
                                       data_offsets=(offset, offset + end - begin))
            offset += end - begin
            weight_map[name] = filename
        files[filename] = SafetensorsFileMetadata(metadata={}, tensors=tensors)
    return SafetensorsRepoMetadata(metadata={"total_size": 0} if shards > 1 else None, sharded=shards > 1,
                                   weight_map=weight_map, files_metadata=files)


@pytest.fixture
def online_hub(tmp_path, monkeypatch, minilm_dir):
    """A reachable Hub that serves all-MiniLM-L6-v2's config.json and safetensors headers, and an empty cache."""
    from huggingface_hub import constants

    header, _ = read_safetensors_header(minilm_dir / "model.safetensors")
    served = {"metadata": repo_metadata(header), "calls": []}

    def get_safetensors_metadata(repo_id, *, revision=None, **_):
        served["calls"].append(("headers", repo_id, revision))
        return served["metadata"]

    def hf_hub_download(repo_id, filename, *, revision=None, local_files_only=False, **_):
        assert filename == "config.json" and not local_files_only  # config.json only, fetched online
        served["calls"].append(("download", repo_id, filename))
        return str(minilm_dir / "config.json")

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("paramscope.sources.hub_online", lambda: True)
    monkeypatch.setattr("paramscope.sources._hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", get_safetensors_metadata)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    return served


@pytest.mark.checkpoint
def test_hub_id_online_reads_headers_and_config_only(online_hub):
    located = locate_checkpoint(REPO)
    assert located.hub_id == REPO and "safetensors headers read from the Hub" in located.description
    result = audit(REPO)
    assert online_hub["calls"] == [("headers", REPO, None), ("download", REPO, "config.json")]
    assert result.report.model.class_name == "BertModel"
    assert result.audit.parameters == MINILM_PARAMS == result.report.total
    assert result.audit.complete
    assert result.checkpoint.format == "safetensors"
    assert result.checkpoint.elements == MINILM_PARAMS + 512  # embeddings.position_ids, a buffer
    assert [f.name for f in result.audit.non_parameters] == ["embeddings.position_ids"]


@pytest.mark.checkpoint
def test_hub_id_online_sharded_repo(online_hub, minilm_dir):
    header, _ = read_safetensors_header(minilm_dir / "model.safetensors")
    online_hub["metadata"] = repo_metadata(header, shards=3)
    result = audit(REPO, model_class="BertForSequenceClassification", num_labels=3)
    assert result.checkpoint.format == "safetensors-sharded"
    assert len(result.checkpoint.files) == 3
    assert result.audit.parameters == MINILM_PARAMS
    assert sorted(f.name for f in result.audit.missing) == ["classifier.bias", "classifier.weight"]
    assert result.report.total == MINILM_PARAMS + 384 * 3 + 3


@pytest.mark.checkpoint
def test_cli_audit_hub_id_json(online_hub, capsys):
    assert main(["audit", REPO, "--json"]) == 0
    ck = json.loads(capsys.readouterr().out)["checkpoint"]
    assert ck["parameters"] == MINILM_PARAMS and ck["elements"] == MINILM_PARAMS + 512
    assert ck["path"] == f"hub:{REPO}"
    assert ck["by_dtype"]["F32"] == {"tensors": 103, "elements": MINILM_PARAMS, "bytes": 90_852_864}


def test_hub_headers_are_checked_like_local_ones():
    good = {"w": TensorInfo(dtype="F32", shape=[2, 3], data_offsets=(0, 24))}
    meta = SafetensorsRepoMetadata(metadata=None, sharded=False, weight_map={"w": "model.safetensors"},
                                   files_metadata={"model.safetensors": SafetensorsFileMetadata({}, good)})
    assert checkpoint_from_hub_metadata("hub:x/y", meta).elements == 6

    wrong_span = {"w": TensorInfo(dtype="F32", shape=[2, 3], data_offsets=(0, 20))}
    meta = SafetensorsRepoMetadata(metadata=None, sharded=False, weight_map={"w": "model.safetensors"},
                                   files_metadata={"model.safetensors": SafetensorsFileMetadata({}, wrong_span)})
    with pytest.raises(CheckpointError, match=r"shape \[2, 3\] needs (more bytes than the file holds|24 bytes but data_offsets span 20)"):
        checkpoint_from_hub_metadata("hub:x/y", meta)

    unknown = {"w": TensorInfo(dtype="Q9", shape=[2], data_offsets=(0, 2))}
    meta = SafetensorsRepoMetadata(metadata=None, sharded=False, weight_map={"w": "model.safetensors"},
                                   files_metadata={"model.safetensors": SafetensorsFileMetadata({}, unknown)})
    with pytest.raises(CheckpointError, match="unknown dtype 'Q9'"):
        checkpoint_from_hub_metadata("hub:x/y", meta)

    meta = SafetensorsRepoMetadata(metadata=None, sharded=True, weight_map={"w": "b.safetensors"},
                                   files_metadata={"a.safetensors": SafetensorsFileMetadata({}, good)})
    with pytest.raises(CheckpointError, match="the index puts 'w' in b.safetensors"):
        checkpoint_from_hub_metadata("hub:x/y", meta)


def test_not_a_safetensors_repo_is_one_line(monkeypatch, tmp_path, capsys):
    from huggingface_hub import constants
    from huggingface_hub.errors import NotASafetensorsRepoError

    def no_safetensors(repo_id, **_):
        raise NotASafetensorsRepoError(f"{repo_id} is not a safetensors repo")

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("paramscope.sources._hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", no_safetensors)
    assert main(["audit", "someone/pickles-only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["paramscope: error: hub id someone/pickles-only has no model.safetensors or "
                   "model.safetensors.index.json; paramscope audit reads a .bin checkpoint only from local files"]


def test_offline_hub_id_with_no_checkpoint_cached_says_which(monkeypatch, tmp_path, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("paramscope.sources._hub_reachable", lambda timeout=3.0: False)
    assert main(["audit", "someone/absent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("paramscope: error: hub id someone/absent: the Hugging Face Hub cannot be reached (no answer from "
                   "huggingface.co:443 within 3 s), and no checkpoint of it is in the local cache "
                   f"({tmp_path}); download it first or give a path")


@pytest.mark.checkpoint
def test_cli_audit_hub_id_text(online_hub, capsys):
    assert main(["audit", REPO, "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "hub id sentence-transformers/all-MiniLM-L6-v2: safetensors headers read from the Hub" in out
    assert "matched         103 names, 22,713,216 of 22,713,216 parameters: complete" in out
    assert "embeddings.position_ids 1×512: buffer, not a parameter" in out
