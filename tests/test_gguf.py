"""GGUF checkpoints (issue 29 §1 and §7): `audit FILE.gguf` reads the header only, with exact bytes per ggml type,
the metadata, unpacked parameter counts, bits per weight by type and role, and GGUF names mapped to roles; and a
hostile or broken file is one clear line, a non-zero exit, in bounded time and memory.

Every file is written here with gguf's own GGUFWriter (and gguf.quants for Q8_0/Q4_0 data), and the figures are
checked against gguf's own GGUFReader where it has them.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from paramscope.checkpoint.gguf_read import gguf_role, is_gguf_path, read_gguf  # noqa: E402
from paramscope.cli import main  # noqa: E402

from gguf_files import add_tensors_and_close  # noqa: E402
from paramscope.errors import CheckpointError, ParamscopeError  # noqa: E402

Q = gguf.GGMLQuantizationType


def write_gguf(path: Path, tensors: dict[str, tuple[tuple[int, ...], Q]], *, arch: str = "llama",
               meta: dict | None = None, split_max_tensors: int = 0) -> Path:
    """A GGUF file (or shard set) with these tensors: name → (PyTorch shape, ggml type)."""
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    meta = {"context_length": 4096, "embedding_length": 64, "block_count": 2, "head_count": 4,
            "head_count_kv": 2, "feed_forward_length": 128, **(meta or {})}
    w.add_context_length(meta["context_length"])
    w.add_embedding_length(meta["embedding_length"])
    w.add_block_count(meta["block_count"])
    w.add_head_count(meta["head_count"])
    w.add_head_count_kv(meta["head_count_kv"])
    w.add_feed_forward_length(meta["feed_forward_length"])
    w.add_rope_freq_base(500000.0)
    if "expert_count" in meta:
        w.add_expert_count(meta["expert_count"])
        w.add_expert_used_count(meta["expert_used_count"])
    w.add_token_list([f"tok{i}" for i in range(100)])
    rng = np.random.default_rng(0)
    add_tensors_and_close(w, tensors, lambda shape: rng.standard_normal(shape).astype(np.float32))
    return path


DENSE = {
    "token_embd.weight": ((100, 64), Q.Q8_0),
    "output_norm.weight": ((64,), Q.F32),
    "output.weight": ((100, 64), Q.F16),
    **{f"blk.{i}.{n}": s for i in range(2) for n, s in {
        "attn_norm.weight": ((64,), Q.F32),
        "attn_q.weight": ((64, 64), Q.Q4_0),
        "attn_k.weight": ((32, 64), Q.Q4_0),
        "attn_v.weight": ((32, 64), Q.Q8_0),
        "attn_output.weight": ((64, 64), Q.Q4_0),
        "ffn_norm.weight": ((64,), Q.F32),
        "ffn_gate.weight": ((128, 64), Q.Q4_0),
        "ffn_up.weight": ((128, 64), Q.Q4_0),
        "ffn_down.weight": ((64, 128), Q.Q8_0),
    }.items()},
}
BYTES_PER_BLOCK = {Q.F32: (1, 4), Q.F16: (1, 2), Q.Q8_0: (32, 34), Q.Q4_0: (32, 18)}  # ggml's own block layouts


def expected_bytes(shape: tuple[int, ...], qtype: Q) -> int:
    block, size = BYTES_PER_BLOCK[qtype]
    return int(np.prod(shape)) // block * size


@pytest.fixture
def dense(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "model-Q4_0.gguf", DENSE)


def test_exact_bytes_types_and_counts_of_a_quantised_file(dense: Path) -> None:
    ck = read_gguf(dense)
    assert ck.format == "gguf" and ck.version == 3 and ck.architecture == "llama"
    assert len(ck.tensors) == len(DENSE)
    by_name = {t.name: t for t in ck.tensors}
    for name, (shape, qtype) in DENSE.items():
        t = by_name[name]
        assert (t.ggml_type, t.shape, t.elements) == (qtype.name, shape, int(np.prod(shape)))
        assert t.nbytes == expected_bytes(shape, qtype)
    # gguf's own reader agrees on every type, element count and byte count
    reader = gguf.GGUFReader(str(dense))
    assert {t.name: (t.tensor_type.name, int(t.n_elements), int(t.n_bytes)) for t in reader.tensors} == {
        t.name: (t.ggml_type, t.elements, t.nbytes) for t in ck.tensors}
    params = sum(int(np.prod(s)) for s, _ in DENSE.values())
    stored = sum(expected_bytes(s, q) for s, q in DENSE.values())
    assert (ck.elements, ck.nbytes) == (params, stored)
    assert ck.bits_per_weight == round(stored * 8 / params, 4)
    types = ck.by_type()
    assert types["Q4_0"]["bits_per_weight"] == 4.5 and types["Q8_0"]["bits_per_weight"] == 8.5
    assert types["F16"] == {"tensors": 1, "elements": 6400, "bytes": 12800, "bits_per_weight": 16.0}
    assert sum(r["bytes"] for r in types.values()) == stored


def test_metadata_and_the_roles_of_every_tensor(dense: Path) -> None:
    ck = read_gguf(dense)
    assert ck.hparams() == {"context_length": 4096, "embedding_length": 64, "block_count": 2,
                            "feed_forward_length": 128, "attention.head_count": 4, "attention.head_count_kv": 2,
                            "rope.freq_base": 500000.0, "vocab_size": 100}
    roles = ck.by_role()
    assert set(roles) == {"embeddings.word", "norm.final", "head.lm", "attention.norm", "attention.query",
                          "attention.key", "attention.value", "attention.output", "mlp.norm", "mlp.gate", "mlp.up",
                          "mlp.down"}
    assert roles["attention.query"] == {"tensors": 2, "elements": 8192, "bytes": 4608, "bits_per_weight": 4.5}
    assert roles["mlp.down"]["bits_per_weight"] == 8.5
    assert sum(r["elements"] for r in roles.values()) == ck.elements


@pytest.mark.parametrize(("name", "role"), [
    ("token_embd.weight", "embeddings.word"), ("output.weight", "head.lm"), ("output_norm.weight", "norm.final"),
    ("blk.0.attn_q.weight", "attention.query"), ("blk.11.attn_k.weight", "attention.key"),
    ("blk.3.attn_v.weight", "attention.value"), ("blk.3.attn_output.weight", "attention.output"),
    ("blk.3.attn_qkv.weight", "attention.qkv"), ("blk.3.attn_q_norm.weight", "attention.norm"),
    ("blk.3.attn_norm.weight", "attention.norm"), ("blk.3.ffn_norm.weight", "mlp.norm"),
    ("blk.3.ffn_gate.weight", "mlp.gate"), ("blk.3.ffn_up.weight", "mlp.up"), ("blk.3.ffn_down.weight", "mlp.down"),
    ("blk.3.ffn_gate_exps.weight", "moe.experts"), ("blk.3.ffn_down_exps.weight", "moe.experts"),
    ("blk.3.ffn_up_exps.weight", "moe.experts"), ("blk.3.ffn_gate_inp.weight", "moe.router"),
    ("blk.3.exp_probs_b.bias", "moe.router"), ("blk.3.ffn_up_shexp.weight", "moe.shared_experts"),
    ("blk.3.attn_kv_a_mqa.weight", "attention.kv_down"), ("blk.3.attn_kv_b.weight", "attention.kv_up"),
    ("blk.3.attn_kv_a_norm.weight", "attention.latent_norm"), ("blk.3.attn_q_a.weight", "attention.q_down"),
    ("blk.3.attn_sinks.weight", "attention.sinks"), ("rope_freqs.weight", "other"),
])
def test_gguf_names_map_to_paramscope_roles(name: str, role: str) -> None:
    from paramscope.roles import ROLES

    assert gguf_role(name) == role
    assert role in {r for r, _ in ROLES}


def test_a_moe_file_counts_its_experts(tmp_path: Path) -> None:
    tensors = {"token_embd.weight": ((100, 64), Q.F16),
               "blk.0.ffn_gate_inp.weight": ((4, 64), Q.F32),
               "blk.0.ffn_gate_exps.weight": ((4, 32, 64), Q.Q8_0),
               "blk.0.ffn_up_exps.weight": ((4, 32, 64), Q.Q8_0),
               "blk.0.ffn_down_exps.weight": ((4, 64, 32), Q.Q8_0)}
    ck = read_gguf(write_gguf(tmp_path / "moe.gguf", tensors, meta={"expert_count": 4, "expert_used_count": 2}))
    assert ck.hparams()["expert_count"] == 4 and ck.hparams()["expert_used_count"] == 2
    experts = ck.by_role()["moe.experts"]
    assert experts == {"tensors": 3, "elements": 3 * 4 * 32 * 64, "bytes": 3 * 4 * 32 * 64 // 32 * 34,
                       "bits_per_weight": 8.5}
    assert ck.by_role()["moe.router"]["elements"] == 256


def test_a_shard_set_from_any_shard_or_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    write_gguf(folder / "model.gguf", DENSE, split_max_tensors=8)
    shards = sorted(folder.glob("*.gguf"))
    assert [s.name for s in shards] == [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    whole = read_gguf(write_gguf(tmp_path / "whole.gguf", DENSE))
    for path in (shards[0], shards[2], folder):
        ck = read_gguf(path)
        assert ck.format == "gguf-sharded" and len(ck.files) == 3
        assert [(t.name, t.ggml_type, t.nbytes) for t in ck.tensors] == [
            (t.name, t.ggml_type, t.nbytes) for t in whole.tensors]
    shards[1].unlink()
    with pytest.raises(CheckpointError, match="1 of its 3 shards missing .*model-00002-of-00003.gguf"):
        read_gguf(shards[0])


def test_a_big_endian_file_reads_the_same(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "be.gguf"), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_block_count(3)
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 32), np.float32).byteswap())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ck = read_gguf(tmp_path / "be.gguf")
    assert ck.hparams() == {"block_count": 3}
    assert [(t.name, t.ggml_type, t.shape, t.nbytes, t.role) for t in ck.tensors] == [
        ("blk.0.ffn_up.weight", "F32", (4, 32), 512, "mlp.up")]


def test_a_hugging_face_cache_folder_of_a_gguf_repo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "models--org--Model-GGUF"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    write_gguf(snapshot / "Model-Q4_0.gguf", DENSE)
    assert main(["audit", str(repo), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["checkpoint"]
    assert doc["files"] == [str(snapshot / "Model-Q4_0.gguf")] and doc["tensors"] == len(DENSE)


def test_a_folder_of_several_models_asks_for_one_in_one_line(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Two quantisations, a projector beside them and a shard set one folder down (one checkpoint, named by its
    first shard), as GGUF repos lay them out: each listed once, the projector last."""
    write_gguf(tmp_path / "a-Q4_0.gguf", DENSE)
    write_gguf(tmp_path / "a-Q8_0.gguf", DENSE)
    write_gguf(tmp_path / "mmproj-a-F16.gguf", DENSE)
    (tmp_path / "BF16").mkdir()
    write_gguf(tmp_path / "BF16" / "a-BF16.gguf", DENSE, split_max_tensors=8)  # a-BF16-0000{1,2,3}-of-00003.gguf
    assert main(["inspect", str(tmp_path), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err == (f"paramscope: error: {tmp_path}: holds 4 GGUF checkpoints, not one: BF16/a-BF16-00001-of-00003.gguf "
                   "(3 shards), a-Q4_0.gguf, a-Q8_0.gguf, mmproj-a-F16.gguf (a multimodal projector); name the one "
                   f"to read, e.g. {tmp_path / 'BF16' / 'a-BF16-00001-of-00003.gguf'}\n")
    for f in (tmp_path / "a-Q8_0.gguf", tmp_path / "mmproj-a-F16.gguf", *(tmp_path / "BF16").iterdir()):
        f.unlink()
    assert read_gguf(tmp_path).files == (str(tmp_path / "a-Q4_0.gguf"),)  # one model left: the folder reads as it


def test_a_cache_snapshot_keeping_its_quantisation_in_a_folder_reads_it(tmp_path: Path) -> None:
    """GGUF repos keep large quantisations as shards in a folder; in the Hugging Face cache those are links into
    the repo's blobs/, which they may reach."""
    repo = tmp_path / "models--org--Model-GGUF"
    snapshot = repo / "snapshots" / ("b" * 40)
    (snapshot / "Q4_0").mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    write_gguf(tmp_path / "Model-Q4_0.gguf", DENSE, split_max_tensors=8)
    for i, shard in enumerate(sorted(tmp_path.glob("Model-Q4_0-*.gguf"))):
        blob = shard.rename(repo / "blobs" / f"{i}{'c' * 63}")  # the cache names a blob by its hash
        (snapshot / "Q4_0" / shard.name).symlink_to(Path("..", "..", "..", "blobs", blob.name))
    assert is_gguf_path(snapshot) and not is_gguf_path(repo / "refs")  # the cache folder's snapshot is a GGUF one
    ck = read_gguf(snapshot)
    assert [Path(f).name for f in ck.files] == [f"Model-Q4_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert len(ck.tensors) == len(DENSE)


def test_the_cli_text_and_json(dense: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(dense), "--width", "120"]) == 0
    text = capsys.readouterr().out
    assert "GGUF v3, 21 tensors" in " ".join(text.split()) and "bits per weight" in text  # the headline wraps
    assert "attention.query" in text and "Q4_0" in text and "head_count_kv  2" in text
    assert main(["audit", str(dense.parent), "--json"]) == 0  # the folder holding it
    doc = json.loads(capsys.readouterr().out)["checkpoint"]
    assert doc["format"] == "gguf" and doc["tensors"] == 21 and doc["architecture"] == "llama"
    assert doc["by_type"]["Q4_0"]["bits_per_weight"] == 4.5
    assert doc["metadata"]["tokenizer.ggml.tokens"] == {"type": "array of string", "length": 100}
    assert len(doc["tensor_list"]) == 21
    assert main(["audit", str(dense), "--width", "60"]) == 0  # narrow: rows stacked and lines wrapped, nothing cut
    narrow = capsys.readouterr().out
    assert "…" not in narrow.replace("… and 1 more", "")
    assert all(len(line) <= 60 or len(line.split()) == 1 for line in narrow.splitlines())  # only the path is wider
    first = doc["tensor_list"][0]  # the tensor list is stacked at 60: each row its name, then its pairs
    assert f"  {first['name']}\n    type {first['type']}, shape " in narrow
    assert main(["audit", str(dense), "--config", "bert-base-uncased"]) == 2
    assert "not supported yet" in capsys.readouterr().err


def test_importing_paramscope_and_its_cli_does_not_import_gguf() -> None:
    code = "import sys, paramscope, paramscope.cli, paramscope.checkpoint; print('gguf' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---------------------------------------------------------------------------------------------
# §7: hostile and broken files, each one line, non-zero, bounded
# ---------------------------------------------------------------------------------------------


def _header(n_tensors: int, n_kv: int, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def _string(text: str, claimed: int | None = None) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw) if claimed is None else claimed) + raw


def _hostile(tmp_path: Path, case: str, dense_bytes: bytes) -> Path:
    path = tmp_path / f"{case}.gguf"
    if case == "fifo":
        os.mkfifo(path)
        return path
    data = {
        "truncated_header": dense_bytes[:700],
        "truncated_data": dense_bytes[:-100],
        "billion_tensors": _header(10**9, 0) + b"\0" * 64,
        "terabyte_string": _header(0, 1) + _string("general.name") + struct.pack("<I", 8) + _string("x", 10**12),
        "terabyte_key": _header(0, 1) + _string("k", 10**12) + b"\0" * 64,
        "huge_array": _header(0, 1) + _string("a") + struct.pack("<IIQ", 9, 8, 10**15) + b"\0" * 64,
        "wrong_magic": _header(0, 0, magic=b"GGML") + b"\0" * 16,
        "safetensors_named_gguf": struct.pack("<Q", 2) + b"{}" + b"\0" * 32,
        "bad_type": _header(1, 0) + _string("t") + struct.pack("<IQIQ", 1, 32, 99, 0) + b"\0" * 64,
        "bad_value_type": _header(0, 1) + _string("k") + struct.pack("<I", 77) + b"\0" * 32,
        "too_many_dims": _header(1, 0) + _string("t") + struct.pack("<I", 10**6) + b"\0" * 64,
        "version_1": _header(0, 0, version=1) + b"\0" * 16,
        "long_tensor_name": _header(1, 0) + _string("t" * 100_000) + b"\0" * 64,
        "overlapping": _header(2, 0) + _string("a") + struct.pack("<IQIQ", 1, 32, 0, 0)
        + _string("b") + struct.pack("<IQIQ", 1, 32, 0, 64) + b"\0" * 512,
        "empty": b"",
    }[case]
    path.write_bytes(data)
    return path


HOSTILE = {
    "truncated_header": "more than the file holds|truncated",
    "truncated_data": "past the end of the file .*truncated",
    "billion_tensors": "claims 1,000,000,000 tensors, more than 1,000,000",
    "terabyte_string": "claims 1,000,000,000,000 bytes, more than the file holds",
    "terabyte_key": "a metadata key claims 1,000,000,000,000 bytes",
    "huge_array": "claims 1,000,000,000,000,000 items",
    "wrong_magic": "not a GGUF file .*b'GGML'",
    "safetensors_named_gguf": "not a GGUF file",
    "bad_type": "ggml type 99, which gguf .* does not know",
    "bad_value_type": "value type 77, which GGUF does not define",
    "too_many_dims": "claims 1,000,000 dimensions",
    "version_1": "GGUF version 1 is not supported",
    "long_tensor_name": "a tensor name claims 100,000 bytes, more than 256",
    "overlapping": "tensor 'b' overlaps the tensor before it",
    "empty": "not a GGUF file \\(0 bytes",
    "fifo": "is a FIFO \\(named pipe\\), not a regular GGUF file",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_gguf_is_one_clear_line(tmp_path: Path, dense: Path, case: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import re

    path = _hostile(tmp_path, case, dense.read_bytes())
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ParamscopeError) as caught:
            read_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 2
    assert peak < 32 * 2**20, peak
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and re.search(HOSTILE[case], message), message
    assert main(["audit", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("paramscope: error:") and re.search(HOSTILE[case], err), err
