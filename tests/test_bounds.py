"""The bounds of README's "Limits and safety" that need more than one bad field to reach, and the files they protect."""

from __future__ import annotations

import os

import pytest

import paramscope
from paramscope import ConfigError, SourceError
from paramscope import build
from paramscope.build import meta
from paramscope.safe_io import hf_cache_repo, is_within, read_regular

from conftest import bert_config


def test_the_module_budget_stops_a_build_that_passed_the_field_checks(monkeypatch):
    """Fields can each be legal and still describe too many modules: the build itself is cut off."""
    monkeypatch.setattr(meta, "MAX_MODULES", 100)
    config = bert_config(num_hidden_layers=12, hidden_size=16, num_attention_heads=2, intermediate_size=32)
    with pytest.raises(ConfigError, match="more than 100 modules"):
        paramscope.inspect(config, model_class="BertModel")
    # the hook is gone afterwards: the same model builds under the real budget
    monkeypatch.setattr(meta, "MAX_MODULES", 15_000)
    assert paramscope.inspect(config, model_class="BertModel").num_layers == 12


def test_deepest_allowed_stack_is_accepted_and_one_more_refused():
    build.validate_config_dict(bert_config(num_hidden_layers=build.MAX_LAYERS))
    with pytest.raises(ConfigError, match="'num_hidden_layers' is 1,025"):
        build.validate_config_dict(bert_config(num_hidden_layers=build.MAX_LAYERS + 1))


def test_per_stage_lists_are_checked_element_by_element():
    build.validate_config_dict({"model_type": "swin", "num_heads": [3, 6, 12, 24], "depths": [2, 2, 6, 2]})
    with pytest.raises(ConfigError, match="'depths' is 1,028"):
        build.validate_config_dict({"model_type": "swin", "depths": [2, 2, 1000, 24]})
    with pytest.raises(ConfigError, match="'num_heads' must be positive"):
        build.validate_config_dict({"model_type": "swin", "num_heads": [3, 0]})


def test_read_regular_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(SourceError, match="FIFO"):
        read_regular(tmp_path / "pipe", 100)
    with pytest.raises(SourceError, match="directory"):
        read_regular(tmp_path, 100)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(SourceError, match="101 bytes, over the 100-byte limit"):
        read_regular(tmp_path / "big", 100)
    assert read_regular(tmp_path / "big", 101) == b"x" * 101


def test_is_within_follows_symlinks(tmp_path):
    (tmp_path / "inside").mkdir()
    os.symlink("/etc/passwd", tmp_path / "inside" / "out")
    os.symlink(tmp_path / "inside" / "real", tmp_path / "inside" / "in")
    (tmp_path / "inside" / "real").write_text("")
    assert not is_within(tmp_path / "inside" / "out", tmp_path / "inside")
    assert is_within(tmp_path / "inside" / "in", tmp_path / "inside")


def test_hf_cache_repo_is_the_boundary_of_a_snapshot(tmp_path):
    snapshot = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc"
    assert hf_cache_repo(snapshot) == tmp_path / "hub" / "models--org--name"
    assert hf_cache_repo(snapshot / "model.safetensors") == tmp_path / "hub" / "models--org--name"
    assert hf_cache_repo(tmp_path / "plain" / "snapshots" / "abc") is None


def test_a_snapshot_shard_may_lead_into_its_repo_blobs(tmp_path):
    """The layout huggingface_hub writes: snapshot files are symlinks into ../../blobs."""
    from paramscope.checkpoint import read_checkpoint

    import json
    import struct

    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (repo / "blobs" / "f00d").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    os.symlink("../../blobs/f00d", snapshot / "model.safetensors")
    assert read_checkpoint(snapshot).tensors[0].numel == 2
