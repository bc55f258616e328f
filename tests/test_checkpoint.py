"""Reading checkpoint headers and reconciling them with a model: exact counts, no tensor data read."""

from __future__ import annotations

import json
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramscope.checkpoint import (
    SAFETENSORS_DTYPE_BITS,
    Audit,
    Checkpoint,
    CheckpointTensor,
    read_checkpoint,
    reconcile,
)
from paramscope.errors import CheckpointError, SourceError

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def write_raw_safetensors(path: Path, tensors: list[tuple[str, str, list[int]]], metadata=None) -> Path:
    """Write a safetensors file by hand (any dtype, zero-filled data), tensors laid out in order."""
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        size = n * SAFETENSORS_DTYPE_BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return path


def shapes_of(checkpoint: Checkpoint) -> dict[str, tuple[int, ...]]:
    return {t.name: t.shape for t in checkpoint.tensors}


# ---------------------------------------------------------------------------------------------
# the real all-MiniLM-L6-v2 checkpoint
# ---------------------------------------------------------------------------------------------

MINILM_PARAMS = 22_713_216


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> Checkpoint:
    return read_checkpoint(minilm_dir / "model.safetensors")


def meta_model(minilm_dir: Path, class_name: str):
    import torch
    import transformers
    config = transformers.BertConfig.from_dict(json.loads((minilm_dir / "config.json").read_text()))
    with torch.device("meta"):
        return getattr(transformers, class_name)(config)


def reconcile_with(checkpoint: Checkpoint, model) -> Audit:
    return reconcile(
        checkpoint,
        {name: tuple(p.shape) for name, p in model.named_parameters()},
        expected_buffers=[name for name, _ in model.named_buffers()],
        tied_aliases=dict(getattr(model, "all_tied_weights_keys", {}) or {}),
        base_model_prefix=model.base_model_prefix,
        model_class=type(model).__name__,
    )


@pytest.mark.checkpoint
def test_minilm_header_counts(minilm: Checkpoint, minilm_dir: Path) -> None:
    assert minilm.format == "safetensors"
    assert minilm.path == str(minilm_dir / "model.safetensors")
    assert len(minilm.tensors) == 104
    assert minilm.elements == 22_713_728  # 22,713,216 parameters + the 512-element position_ids buffer
    assert minilm.nbytes == 90_856_960
    assert minilm.by_dtype == {
        "F32": {"tensors": 103, "elements": 22_713_216, "bytes": 90_852_864},
        "I64": {"tensors": 1, "elements": 512, "bytes": 4_096},
    }
    assert minilm.metadata == {"safetensors_metadata": {"format": "pt"}}
    # sentence-transformers saved the bare encoder: no "bert." prefix on any key.
    assert not any(t.name.startswith("bert.") for t in minilm.tensors)
    assert minilm.tensor("embeddings.word_embeddings.weight").shape == (30522, 384)
    assert minilm.tensor("embeddings.position_ids").dtype == "I64"
    assert {t.role for t in minilm.tensors} == {"tensor"}
    assert minilm.files == (str(minilm_dir / "model.safetensors"),)


@pytest.mark.checkpoint
def test_minilm_directory_resolves_to_the_safetensors_file(minilm: Checkpoint, minilm_dir: Path) -> None:
    from_dir = read_checkpoint(minilm_dir)
    assert from_dir.path == minilm.path
    assert from_dir.tensors == minilm.tensors


@pytest.mark.checkpoint
def test_minilm_reconciles_with_bert_model(minilm: Checkpoint, minilm_dir: Path) -> None:
    model = meta_model(minilm_dir, "BertModel")
    assert sum(p.numel() for p in model.parameters()) == MINILM_PARAMS
    audit = reconcile_with(minilm, model)
    assert audit.parameters == MINILM_PARAMS
    assert len(audit.matched) == 103
    assert audit.missing == ()
    assert audit.mismatched == ()
    assert audit.unexpected == ()
    assert [(f.name, f.shape, f.reason) for f in audit.non_parameters] == [
        ("embeddings.position_ids", (1, 512), "buffer, not a parameter")
    ]
    assert audit.renamed == ()
    assert audit.complete
    d = audit.to_dict()
    assert d["parameters"] == MINILM_PARAMS
    assert d["elements"] == 22_713_728
    assert d["bytes"] == 90_856_960
    assert d["matched_count"] == 103
    assert d["missing"] == [] and d["unexpected"] == [] and d["mismatched"] == []
    assert d["non_parameters"] == [
        {"name": "embeddings.position_ids", "shape": [1, 512], "reason": "buffer, not a parameter"}
    ]
    assert d["by_dtype"] == minilm.by_dtype
    assert json.loads(json.dumps(d)) == d


@pytest.mark.checkpoint
def test_minilm_into_masked_lm_adds_prefix_and_reports_the_missing_head(minilm: Checkpoint, minilm_dir: Path) -> None:
    model = meta_model(minilm_dir, "BertForMaskedLM")
    audit = reconcile_with(minilm, model)
    # Every encoder key gains "bert."; the pooler has nowhere to go; the MLM head is new.
    assert len(audit.renamed) == 101
    assert ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight") in audit.renamed
    assert [f.name for f in audit.missing] == [
        "cls.predictions.bias",
        "cls.predictions.transform.LayerNorm.bias",
        "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.dense.weight",
    ]
    assert [(f.name, f.reason) for f in audit.unexpected] == [
        ("pooler.dense.bias", "pooler that BertForMaskedLM does not have: unused when loaded"),
        ("pooler.dense.weight", "pooler that BertForMaskedLM does not have: unused when loaded"),
    ]
    assert audit.parameters == MINILM_PARAMS - (384 * 384 + 384)
    assert audit.parameters == 22_565_376
    # The tied decoder weight is reachable through the embeddings: not missing.
    assert "cls.predictions.decoder.weight" not in {f.name for f in audit.missing}


@pytest.mark.checkpoint
def test_minilm_into_sequence_classifier_reports_a_new_task_head(minilm: Checkpoint, minilm_dir: Path) -> None:
    model = meta_model(minilm_dir, "BertForSequenceClassification")
    audit = reconcile_with(minilm, model)
    assert [(f.name, f.shape, f.reason) for f in audit.missing] == [
        ("classifier.bias", (2,), "task head not in the checkpoint: newly initialised, must be trained"),
        ("classifier.weight", (2, 384), "task head not in the checkpoint: newly initialised, must be trained"),
    ]
    assert audit.unexpected == () and audit.mismatched == ()
    assert audit.parameters == MINILM_PARAMS
    assert len(audit.renamed) == 103
    assert not audit.complete


@pytest.mark.checkpoint
def test_reading_a_header_imports_no_torch(minilm_dir: Path) -> None:
    code = (
        "import sys; from paramscope.checkpoint import read_checkpoint; "
        f"c = read_checkpoint({str(minilm_dir)!r}); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(len(c.tensors))"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "104"


# ---------------------------------------------------------------------------------------------
# sharded safetensors
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    from safetensors.numpy import save_file

    save_file(
        {"a.weight": np.zeros((2, 3), np.float32), "a.bias": np.zeros(3, np.float32)},
        str(tmp_path / "model-00001-of-00002.safetensors"),
        metadata={"format": "pt"},
    )
    save_file(
        {"b.weight": np.zeros(4, np.float16), "c": np.zeros((2, 2), np.int64)},
        str(tmp_path / "model-00002-of-00002.safetensors"),
    )
    index = {
        "metadata": {"total_size": 76},
        "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors",
            "a.bias": "model-00001-of-00002.safetensors",
            "b.weight": "model-00002-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors",
        },
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path


def test_sharded_safetensors_via_index(sharded: Path) -> None:
    ckpt = read_checkpoint(sharded / "model.safetensors.index.json")
    assert ckpt.format == "safetensors-sharded"
    assert [t.name for t in ckpt.tensors] == ["a.bias", "a.weight", "b.weight", "c"]
    assert shapes_of(ckpt) == {"a.bias": (3,), "a.weight": (2, 3), "b.weight": (4,), "c": (2, 2)}
    assert ckpt.elements == 17
    assert ckpt.nbytes == 76
    assert ckpt.by_dtype == {
        "F16": {"tensors": 1, "elements": 4, "bytes": 8},
        "F32": {"tensors": 2, "elements": 9, "bytes": 36},
        "I64": {"tensors": 1, "elements": 4, "bytes": 32},
    }
    assert ckpt.tensor("c").file == str(sharded / "model-00002-of-00002.safetensors")
    assert ckpt.files == (
        str(sharded / "model-00001-of-00002.safetensors"),
        str(sharded / "model-00002-of-00002.safetensors"),
    )
    assert ckpt.metadata["index_metadata"] == {"total_size": 76}
    assert ckpt.metadata["shards"] == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    assert "unindexed_tensors" not in ckpt.metadata


def test_sharded_directory_resolves_to_the_index(sharded: Path) -> None:
    assert read_checkpoint(sharded) == read_checkpoint(sharded / "model.safetensors.index.json")


def test_tensors_a_shard_holds_beyond_the_index_are_kept_and_noted(sharded: Path) -> None:
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    del index["weight_map"]["c"]
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    ckpt = read_checkpoint(sharded / "model.safetensors.index.json")
    assert len(ckpt.tensors) == 4
    assert ckpt.metadata["unindexed_tensors"] == ("c",)  # read-only: a tuple


def test_index_naming_a_missing_tensor_is_an_error(sharded: Path) -> None:
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="'ghost' in model-00001-of-00002.safetensors but it is in no shard"):
        read_checkpoint(sharded / "model.safetensors.index.json")


def test_index_naming_a_missing_shard_is_an_error(sharded: Path) -> None:
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard 'model-00002-of-00002.safetensors' listed in the index does not"):
        read_checkpoint(sharded)


@pytest.mark.parametrize("shard", ["../model-00001-of-00002.safetensors", "/etc/passwd", "", "a\\..\\b"])
def test_index_cannot_point_outside_its_directory(sharded: Path, shard: str) -> None:
    index = {"weight_map": {"a.weight": shard}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="points outside the checkpoint directory"):
        read_checkpoint(sharded / "model.safetensors.index.json")


def test_a_tensor_in_two_shards_is_an_error(tmp_path: Path) -> None:
    write_raw_safetensors(tmp_path / "s1.safetensors", [("x", "F32", [2])])
    write_raw_safetensors(tmp_path / "s2.safetensors", [("x", "F32", [2])])
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})
    )
    with pytest.raises(CheckpointError, match="'x' is stored in two shards"):
        read_checkpoint(tmp_path)


# ---------------------------------------------------------------------------------------------
# PyTorch .bin (zip format), read without a normal unpickler
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ordinary way of unpickling explode, to prove none is used."""

    def boom(*_args, **_kwargs):
        raise AssertionError("a normal unpickler was used")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "Unpickler", boom)
    import torch
    monkeypatch.setattr(torch, "load", boom)


def test_pytorch_bin_read_without_unpickling(tmp_path: Path, no_unpickling: None) -> None:
    import torch
    weight = torch.zeros(4, 3)
    state = {
        "dense.weight": weight,
        "dense.bias": torch.zeros(4, dtype=torch.float16),
        "tied.weight": weight,  # shares storage with dense.weight
        "row": weight[1],  # a view with an offset into the same storage
        "steps": torch.zeros(2, 2, dtype=torch.int64),
        "bf": torch.zeros(5, dtype=torch.bfloat16),
        "fp8": torch.zeros(2, 8, dtype=torch.float8_e4m3fn),
        "flag": torch.zeros(3, dtype=torch.bool),
        "param": torch.nn.Parameter(torch.zeros(6)),
    }
    torch.save(state, tmp_path / "pytorch_model.bin")
    ckpt = read_checkpoint(tmp_path / "pytorch_model.bin")
    assert ckpt.format == "pytorch-bin"
    assert {t.name: (t.dtype, t.shape, t.numel, t.nbytes) for t in ckpt.tensors} == {
        "bf": ("BF16", (5,), 5, 10),
        "dense.bias": ("F16", (4,), 4, 8),
        "dense.weight": ("F32", (4, 3), 12, 48),
        "flag": ("BOOL", (3,), 3, 3),
        "fp8": ("F8_E4M3", (2, 8), 16, 16),
        "param": ("F32", (6,), 6, 24),
        "row": ("F32", (3,), 3, 12),
        "steps": ("I64", (2, 2), 4, 32),
        "tied.weight": ("F32", (4, 3), 12, 48),
    }
    assert ckpt.elements == 65
    assert ckpt.nbytes == 201
    # On disk the tied weight and the view share one 48-byte storage.
    assert ckpt.metadata == {"storage_bytes": 201 - 48 - 12}
    assert read_checkpoint(tmp_path).tensors == ckpt.tensors


def test_pytorch_bin_new_dtypes(tmp_path: Path) -> None:
    import torch
    state = {
        "u16": torch.zeros(3, dtype=torch.uint16),
        "e8m0": torch.zeros(4, dtype=torch.float8_e8m0fnu),
        "fp4": torch.zeros(2, 3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
    }
    torch.save(state, tmp_path / "new.bin")
    ckpt = read_checkpoint(tmp_path / "new.bin")
    # float4_e2m1fn_x2 holds two values per byte; reported as safetensors would store it (F4, last dim x2).
    assert {t.name: (t.dtype, t.shape, t.numel, t.nbytes) for t in ckpt.tensors} == {
        "e8m0": ("F8_E8M0", (4,), 4, 4),
        "fp4": ("F4", (2, 6), 12, 6),
        "u16": ("U16", (3,), 3, 6),
    }


def test_sharded_pytorch_bin(tmp_path: Path) -> None:
    import torch
    torch.save({"a": torch.zeros(2, 2)}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({"b": torch.zeros(3, dtype=torch.float16)}, tmp_path / "pytorch_model-00002-of-00002.bin")
    index = {"weight_map": {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.format == "pytorch-bin-sharded"
    assert shapes_of(ckpt) == {"a": (2, 2), "b": (3,)}
    assert ckpt.nbytes == 22
    assert ckpt.metadata["storage_bytes"] == 22


def test_legacy_torch_save_format_is_refused(tmp_path: Path) -> None:
    import torch
    torch.save({"a": torch.zeros(2)}, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"old\.bin: .*legacy .*convert to safetensors"):
        read_checkpoint(tmp_path / "old.bin")


def test_directory_prefers_safetensors_over_bin(tmp_path: Path) -> None:
    import torch
    torch.save({"from_bin": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    assert read_checkpoint(tmp_path).format == "pytorch-bin"
    write_raw_safetensors(tmp_path / "model.safetensors", [("from_st", "F32", [1])])
    assert [t.name for t in read_checkpoint(tmp_path).tensors] == ["from_st"]


def test_missing_inputs_are_source_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file or directory"):
        read_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(SourceError, match="no checkpoint found"):
        read_checkpoint(tmp_path)
    write_raw_safetensors(tmp_path / "one.safetensors", [("x", "F32", [1])])
    write_raw_safetensors(tmp_path / "two.safetensors", [("x", "F32", [1])])
    with pytest.raises(SourceError, match="several checkpoints"):
        read_checkpoint(tmp_path)


def test_an_odd_name_alone_in_a_directory_is_found(tmp_path: Path) -> None:
    write_raw_safetensors(tmp_path / "adapter_model.safetensors", [("lora_A", "F32", [2, 2])])
    assert read_checkpoint(tmp_path).elements == 4


# ---------------------------------------------------------------------------------------------
# safetensors dtypes, including sub-byte and fp8
# ---------------------------------------------------------------------------------------------


def test_every_safetensors_dtype_is_sized_exactly(tmp_path: Path) -> None:
    tensors = [(f"t.{dtype}", dtype, [2, 4]) for dtype in SAFETENSORS_DTYPE_BITS]
    ckpt = read_checkpoint(write_raw_safetensors(tmp_path / "all.safetensors", tensors))
    sizes = {t.dtype: t.nbytes for t in ckpt.tensors}
    assert sizes == {dtype: 8 * bits // 8 for dtype, bits in SAFETENSORS_DTYPE_BITS.items()}
    assert sizes["F4"] == 4 and sizes["F6_E2M3"] == 6 and sizes["C64"] == 64
    assert ckpt.elements == 8 * 22


def test_zero_sized_tensors_are_fine(tmp_path: Path) -> None:
    path = write_raw_safetensors(tmp_path / "z.safetensors", [("empty", "F32", [0, 5]), ("x", "F16", [3])])
    ckpt = read_checkpoint(path)
    assert {t.name: (t.numel, t.nbytes) for t in ckpt.tensors} == {"empty": (0, 0), "x": (3, 6)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=st.lists(
        st.tuples(
            st.sampled_from(sorted(SAFETENSORS_DTYPE_BITS)),
            st.lists(st.integers(min_value=0, max_value=5), max_size=3),
        ),
        max_size=6,
    )
)
def test_any_well_formed_file_reads_back_exactly(tmp_path: Path, spec) -> None:
    spec = [
        (f"t{i}", dtype, shape)
        for i, (dtype, shape) in enumerate(spec)
        # sub-byte types must fill whole bytes; the writer cannot lay out anything else
        if (SAFETENSORS_DTYPE_BITS[dtype] * int(np.prod(shape, dtype=np.int64))) % 8 == 0
    ]
    path = write_raw_safetensors(tmp_path / "h.safetensors", spec)
    ckpt = read_checkpoint(path)
    want = {name: (dtype, tuple(shape)) for name, dtype, shape in spec}
    assert {t.name: (t.dtype, t.shape) for t in ckpt.tensors} == want
    data_size = path.stat().st_size - 8 - struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert ckpt.nbytes == data_size
    for t in ckpt.tensors:
        assert t.numel == int(np.prod(t.shape, dtype=np.int64))
        assert t.nbytes * 8 == t.numel * SAFETENSORS_DTYPE_BITS[t.dtype]


# ---------------------------------------------------------------------------------------------
# reconcile: names as transformers maps them
# ---------------------------------------------------------------------------------------------


def ckpt_of(tmp_path: Path, tensors: list[tuple[str, str, list[int]]]) -> Checkpoint:
    return read_checkpoint(write_raw_safetensors(tmp_path / "c.safetensors", tensors))


def test_legacy_gamma_beta_keys_are_renamed(tmp_path: Path) -> None:
    ckpt = ckpt_of(
        tmp_path,
        [
            ("encoder.LayerNorm.gamma", "F32", [8]),
            ("encoder.LayerNorm.beta", "F32", [8]),
            ("encoder.dense.weight", "F32", [8, 8]),
        ],
    )
    audit = reconcile(
        ckpt,
        {"encoder.LayerNorm.weight": (8,), "encoder.LayerNorm.bias": (8,), "encoder.dense.weight": (8, 8)},
    )
    assert audit.matched == ("encoder.LayerNorm.bias", "encoder.LayerNorm.weight", "encoder.dense.weight")
    assert audit.renamed == (
        ("encoder.LayerNorm.beta", "encoder.LayerNorm.bias"),
        ("encoder.LayerNorm.gamma", "encoder.LayerNorm.weight"),
    )
    assert audit.parameters == 80
    assert audit.missing == () and audit.unexpected == ()


def test_legacy_rename_does_not_fire_when_the_key_already_exists(tmp_path: Path) -> None:
    # A model that really has a parameter called LayerNorm.gamma keeps it.
    ckpt = ckpt_of(tmp_path, [("x.LayerNorm.gamma", "F32", [4])])
    audit = reconcile(ckpt, {"x.LayerNorm.gamma": (4,)})
    assert audit.matched == ("x.LayerNorm.gamma",) and audit.renamed == ()


def test_weight_norm_legacy_names(tmp_path: Path) -> None:
    ckpt = ckpt_of(tmp_path, [("conv.weight_g", "F32", [1, 1, 3]), ("conv.weight_v", "F32", [4, 2, 3])])
    audit = reconcile(
        ckpt,
        {"conv.parametrizations.weight.original0": (1, 1, 3), "conv.parametrizations.weight.original1": (4, 2, 3)},
    )
    assert audit.parameters == 27 and audit.missing == () and audit.unexpected == ()


def test_prefix_is_stripped_for_a_base_model(tmp_path: Path) -> None:
    ckpt = ckpt_of(
        tmp_path,
        [
            ("bert.embeddings.word_embeddings.weight", "F32", [10, 4]),
            ("cls.predictions.bias", "F32", [10]),
            ("cls.predictions.transform.dense.weight", "F32", [4, 4]),
        ],
    )
    audit = reconcile(
        ckpt, {"embeddings.word_embeddings.weight": (10, 4)}, base_model_prefix="bert", model_class="BertModel"
    )
    assert audit.matched == ("embeddings.word_embeddings.weight",)
    assert audit.renamed == (("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),)
    assert [(f.name, f.reason) for f in audit.unexpected] == [
        ("cls.predictions.bias", "part of the MLM pretraining head that BertModel does not have"),
        ("cls.predictions.transform.dense.weight", "part of the MLM pretraining head that BertModel does not have"),
    ]
    assert audit.parameters == 40
    assert audit.elements == 66


def test_prefix_is_added_for_a_task_model(tmp_path: Path) -> None:
    ckpt = ckpt_of(tmp_path, [("embeddings.word_embeddings.weight", "F32", [10, 4])])
    audit = reconcile(
        ckpt,
        {"bert.embeddings.word_embeddings.weight": (10, 4), "classifier.weight": (3, 4), "classifier.bias": (3,)},
        base_model_prefix="bert",
    )
    assert audit.matched == ("bert.embeddings.word_embeddings.weight",)
    assert [(f.name, f.shape, f.reason) for f in audit.missing] == [
        ("classifier.bias", (3,), "task head not in the checkpoint: newly initialised, must be trained"),
        ("classifier.weight", (3, 4), "task head not in the checkpoint: newly initialised, must be trained"),
    ]
    assert audit.parameters == 40


def test_tied_alias_in_checkpoint_counts_for_its_canonical_parameter(tmp_path: Path) -> None:
    params = {"model.embed_tokens.weight": (16, 4), "model.norm.weight": (4,)}
    aliases = {"lm_head.weight": "model.embed_tokens.weight"}

    only_alias = ckpt_of(tmp_path, [("lm_head.weight", "F16", [16, 4]), ("model.norm.weight", "F16", [4])])
    audit = reconcile(only_alias, params, tied_aliases=aliases)
    assert audit.missing == () and audit.unexpected == ()
    assert audit.matched == ("lm_head.weight", "model.norm.weight")
    assert audit.parameters == 68

    both = ckpt_of(
        tmp_path,
        [
            ("lm_head.weight", "F16", [16, 4]),
            ("model.embed_tokens.weight", "F16", [16, 4]),
            ("model.norm.weight", "F16", [4]),
        ],
    )
    audit = reconcile(both, params, tied_aliases=aliases)
    assert audit.missing == () and audit.unexpected == ()
    assert len(audit.matched) == 3
    assert audit.parameters == 68  # the tied matrix counts once
    assert audit.elements == 132  # but is stored twice


def test_shape_mismatch_is_reported_not_matched(tmp_path: Path) -> None:
    ckpt = ckpt_of(tmp_path, [("classifier.weight", "F32", [2, 4]), ("encoder.weight", "F32", [4, 4])])
    audit = reconcile(ckpt, {"classifier.weight": (5, 4), "encoder.weight": (4, 4)})
    assert [(m.name, m.checkpoint_key, m.checkpoint_shape, m.model_shape) for m in audit.mismatched] == [
        ("classifier.weight", "classifier.weight", (2, 4), (5, 4))
    ]
    assert audit.missing == ()
    assert audit.matched == ("encoder.weight",)
    assert audit.parameters == 16
    assert audit.to_dict()["mismatched"][0]["checkpoint_shape"] == [2, 4]
    assert audit.to_dict()["mismatched"][0]["model_shape"] == [5, 4]


def test_two_keys_for_one_parameter_leave_the_second_unexpected(tmp_path: Path) -> None:
    ckpt = ckpt_of(tmp_path, [("bert.pooler.weight", "F32", [2]), ("pooler.weight", "F32", [2])])
    audit = reconcile(ckpt, {"pooler.weight": (2,)}, base_model_prefix="bert")
    assert audit.matched == ("pooler.weight",)
    assert [f.name for f in audit.unexpected] == ["pooler.weight"]
    assert audit.unexpected[0].reason.startswith("duplicate: pooler.weight is already loaded from bert.pooler.weight")
    assert audit.parameters == 2


def test_buffers_and_legacy_buffers_are_not_parameters(tmp_path: Path) -> None:
    ckpt = ckpt_of(
        tmp_path,
        [
            ("embeddings.position_ids", "I64", [1, 8]),
            ("layers.0.rotary_emb.inv_freq", "F32", [4]),
            ("running_mean", "F32", [3]),
            ("w", "F32", [3]),
        ],
    )
    audit = reconcile(ckpt, {"w": (3,)}, expected_buffers=["running_mean"])
    assert [f.name for f in audit.non_parameters] == [
        "embeddings.position_ids",
        "layers.0.rotary_emb.inv_freq",
        "running_mean",
    ]
    assert audit.unexpected == ()
    assert audit.parameters == 3 and audit.elements == 18


def test_unexpected_reasons(tmp_path: Path) -> None:
    ckpt = ckpt_of(
        tmp_path,
        [
            ("cls.seq_relationship.weight", "F32", [2, 4]),
            ("lm_head.weight", "F32", [4, 4]),
            ("pooler.dense.weight", "F32", [4, 4]),
            ("qa_outputs.weight", "F32", [2, 4]),
            ("something.else", "F32", [1]),
        ],
    )
    reasons = {f.name: f.reason for f in reconcile(ckpt, {}, model_class="BertModel").unexpected}
    assert reasons == {
        "cls.seq_relationship.weight": (
            "part of the next-sentence-prediction pretraining head that BertModel does not have"
        ),
        "lm_head.weight": "language-modelling head that BertModel does not have: unused when loaded",
        "pooler.dense.weight": "pooler that BertModel does not have: unused when loaded",
        "qa_outputs.weight": "task head that BertModel does not have: unused when loaded",
        "something.else": "no parameter of that name in BertModel: unused when loaded",
    }


def test_alias_to_an_unknown_parameter_is_a_programming_error(tmp_path: Path) -> None:
    ckpt = ckpt_of(tmp_path, [("w", "F32", [1])])
    with pytest.raises(ValueError, match="not in expected_params"):
        reconcile(ckpt, {"w": (1,)}, tied_aliases={"lm_head.weight": "missing.weight"})


def test_to_dict_has_the_agreed_keys(tmp_path: Path) -> None:
    ckpt = ckpt_of(tmp_path, [("w", "BF16", [2, 3]), ("extra", "F32", [1])])
    d = reconcile(ckpt, {"w": (2, 3), "b": (3,)}).to_dict()
    assert {"parameters", "elements", "missing", "unexpected", "non_parameters", "mismatched", "by_dtype"} <= set(d)
    assert d == {
        "format": "safetensors",
        "parameters": 6,
        "elements": 7,
        "bytes": 16,
        "matched_count": 1,
        "missing": [{"name": "b", "shape": [3], "reason": "not in the checkpoint: newly initialised when loaded"}],
        "unexpected": [
            {"name": "extra", "shape": [1], "reason": "no parameter of that name in the model: unused when loaded"}
        ],
        "non_parameters": [],
        "mismatched": [],
        "renamed": {},
        "by_dtype": {
            "BF16": {"tensors": 1, "elements": 6, "bytes": 12},
            "F32": {"tensors": 1, "elements": 1, "bytes": 4},
        },
    }


# ---------------------------------------------------------------------------------------------
# quantised checkpoints
# ---------------------------------------------------------------------------------------------


def test_gptq_qweight_is_packed_and_scales_are_not_parameters(tmp_path: Path) -> None:
    # in=64, out=32, 4-bit, group size 32: qweight [64*4/32, 32], qzeros [2, 32*4/32], scales [2, 32].
    ckpt = ckpt_of(
        tmp_path,
        [
            ("l.q_proj.qweight", "I32", [8, 32]),
            ("l.q_proj.qzeros", "I32", [2, 4]),
            ("l.q_proj.scales", "F16", [2, 32]),
            ("l.q_proj.g_idx", "I32", [64]),
            ("l.q_proj.bias", "F16", [32]),
        ],
    )
    qweight = ckpt.tensor("l.q_proj.qweight")
    assert (qweight.role, qweight.packing, qweight.numel, qweight.logical_numel) == ("packed", "gptq", 256, 2048)
    assert {t.name for t in ckpt.tensors if t.role == "quant_aux"} == {
        "l.q_proj.qzeros",
        "l.q_proj.scales",
        "l.q_proj.g_idx",
    }
    audit = reconcile(ckpt, {"l.q_proj.weight": (32, 64), "l.q_proj.bias": (32,)})
    assert audit.matched == ("l.q_proj.bias", "l.q_proj.weight")
    assert audit.renamed == (("l.q_proj.qweight", "l.q_proj.weight"),)
    assert audit.parameters == 2048 + 32
    assert [f.name for f in audit.non_parameters] == ["l.q_proj.g_idx", "l.q_proj.qzeros", "l.q_proj.scales"]
    assert audit.missing == () and audit.unexpected == () and audit.mismatched == ()


def test_gptq_with_a_partial_last_group_reconciles(tmp_path: Path) -> None:
    # in=144, out=32, 4-bit, group size 32 (does not divide 144): GPTQ stores ⌈144/32⌉ = 5 groups, the last of 16.
    ckpt = ckpt_of(
        tmp_path,
        [
            ("l.down_proj.qweight", "I32", [18, 32]),
            ("l.down_proj.qzeros", "I32", [5, 4]),
            ("l.down_proj.scales", "F16", [5, 32]),
            ("l.down_proj.g_idx", "I32", [144]),
        ],
    )
    qweight = ckpt.tensor("l.down_proj.qweight")
    assert (qweight.role, qweight.packing, qweight.logical_numel) == ("packed", "gptq", 144 * 32)
    audit = reconcile(ckpt, {"l.down_proj.weight": (32, 144)})
    assert audit.matched == ("l.down_proj.weight",) and audit.parameters == 4608
    assert audit.missing == () and audit.unexpected == () and audit.mismatched == ()


def test_bnb_4bit_weight_and_state(tmp_path: Path) -> None:
    ckpt = ckpt_of(
        tmp_path,
        [
            ("fc.weight", "U8", [1024, 1]),
            ("fc.weight.absmax", "F32", [32]),
            ("fc.weight.quant_map", "F32", [16]),
            ("fc.weight.quant_state.bitsandbytes__nf4", "U8", [120]),
            ("fc.bias", "F16", [32]),
        ],
    )
    weight = ckpt.tensor("fc.weight")
    assert (weight.role, weight.packing, weight.logical_numel) == ("packed", "bnb-4bit", None)
    audit = reconcile(ckpt, {"fc.weight": (32, 64), "fc.bias": (32,)})
    assert audit.matched == ("fc.bias", "fc.weight")
    assert audit.parameters == 32 * 64 + 32
    assert len(audit.non_parameters) == 3
    # 1024 bytes cannot hold a 64 x 64 matrix at 2 values per byte.
    bad = reconcile(ckpt, {"fc.weight": (64, 64), "fc.bias": (32,)})
    assert [m.name for m in bad.mismatched] == ["fc.weight"]


def test_fp8_weight_with_scales(tmp_path: Path) -> None:
    ckpt = ckpt_of(
        tmp_path,
        [
            ("mlp.down_proj.weight", "F8_E4M3", [16, 32]),
            ("mlp.down_proj.weight_scale_inv", "F32", [1, 1]),
            ("mlp.down_proj.input_scale", "F32", []),
        ],
    )
    audit = reconcile(ckpt, {"mlp.down_proj.weight": (16, 32)})
    assert audit.parameters == 512
    assert [f.name for f in audit.non_parameters] == ["mlp.down_proj.input_scale", "mlp.down_proj.weight_scale_inv"]
    assert audit.by_dtype["F8_E4M3"] == {"tensors": 1, "elements": 512, "bytes": 512}
    assert audit.unexpected == ()


def test_plain_checkpoint_tensor_defaults() -> None:
    t = CheckpointTensor(name="w", dtype="F32", shape=(2, 3), numel=6, nbytes=24, file="f")
    assert (t.role, t.logical_numel, t.packing) == ("tensor", 6, "")
