"""GGUF files of recurrent and hybrid families (issue 29 §1): each written as llama.cpp's convert_hf_to_gguf.py
writes it (its metadata keys and tensor shapes: MambaModel, LFM2Model), then held against the transformers class
built from its metadata, tensor by tensor: same parameters, same roles. Roles follow the layer kind: llama.cpp names
every layer's pre-mixer norm `attn_norm`, which is the SSM's norm in a Mamba layer and the mixer's in LFM2. Families
transformers builds no class for from a GGUF (deepseek2, Jamba, Falcon-H1, Mamba-2, ...) are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from gguf_files import add_tensors_and_close  # noqa: E402
from paramscope.checkpoint.gguf_config import gguf_config  # noqa: E402
from paramscope.checkpoint.gguf_read import block_kinds, gguf_role, read_gguf  # noqa: E402
from paramscope.cli import main  # noqa: E402

Q = gguf.GGMLQuantizationType
H, VOCAB = 64, 104  # Mamba's converter pads the vocabulary to a multiple of 8


def write(path: Path, arch: str, kv: dict, tensors: dict) -> Path:
    """A GGUF of `arch`: metadata `kv` ({key after "{arch}.": value}; lists as arrays of uint32) and tensors
    (name → (PyTorch shape, ggml type))."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("test model")
    for key, value in kv.items():
        if isinstance(value, bool):
            w.add_bool(f"{arch}.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        elif isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    add_tensors_and_close(w, tensors, lambda shape: np.full(shape, 0.5, dtype=np.float32))
    return path


def mamba(layers: int = 2, inner: int = 2 * H, state: int = 16, conv: int = 4, rank: int = 4) -> tuple[dict, dict]:
    """MambaModel's metadata (context 2^20, feed_forward_length and head_count 0, "unused, but seemingly required")
    and tensors: ssm_a (−exp(A_log)) and ssm_d bare, conv1d squeezed, the tied head left out."""
    kv = {"context_length": 2**20, "embedding_length": H, "feed_forward_length": 0, "attention.head_count": 0,
          "block_count": layers, "ssm.conv_kernel": conv, "ssm.inner_size": inner, "ssm.state_size": state,
          "ssm.time_step_rank": rank, "attention.layer_norm_rms_epsilon": 1e-5, "ssm.dt_b_c_rms": False}
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32)}
    for i in range(layers):
        tensors |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.ssm_in.weight": ((2 * inner, H), Q.Q8_0),
                    f"blk.{i}.ssm_conv1d.weight": ((inner, conv), Q.F32),
                    f"blk.{i}.ssm_conv1d.bias": ((inner,), Q.F32),
                    f"blk.{i}.ssm_x.weight": ((rank + 2 * state, inner), Q.Q8_0),
                    f"blk.{i}.ssm_dt.weight": ((inner, rank), Q.F32), f"blk.{i}.ssm_dt.bias": ((inner,), Q.F32),
                    f"blk.{i}.ssm_a": ((inner, state), Q.F32), f"blk.{i}.ssm_d": ((inner,), Q.F32),
                    f"blk.{i}.ssm_out.weight": ((H, inner), Q.Q8_0)}
    return kv, tensors


def lfm2(attention: tuple[int, ...] = (1,), layers: int = 3, ff: int = 128, cache: int = 3) -> tuple[dict, dict]:
    """LFM2Model's metadata (KV heads per layer, 0 on a short-convolution layer; feed_forward_length already
    adjusted; shortconv.l_cache) and tensors: shortconv.conv squeezed to [H, L], embedding_norm as token_embd_norm,
    q/k layernorms, the tied head left out."""
    kv = {"context_length": 128, "embedding_length": H, "block_count": layers, "feed_forward_length": ff,
          "attention.head_count": 4, "attention.head_count_kv": [2 if i in attention else 0 for i in range(layers)],
          "rope.freq_base": 1e6, "attention.layer_norm_rms_epsilon": 1e-5, "vocab_size": VOCAB,
          "shortconv.l_cache": cache}
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "token_embd_norm.weight": ((H,), Q.F32)}
    for i in range(layers):
        tensors |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.ffn_norm.weight": ((H,), Q.F32),
                    f"blk.{i}.ffn_gate.weight": ((ff, H), Q.Q8_0), f"blk.{i}.ffn_up.weight": ((ff, H), Q.Q8_0),
                    f"blk.{i}.ffn_down.weight": ((H, ff), Q.Q8_0)}
        if i in attention:
            tensors |= {f"blk.{i}.attn_q.weight": ((H, H), Q.Q8_0), f"blk.{i}.attn_k.weight": ((32, H), Q.Q8_0),
                        f"blk.{i}.attn_v.weight": ((32, H), Q.Q8_0),
                        f"blk.{i}.attn_output.weight": ((H, H), Q.Q8_0),
                        f"blk.{i}.attn_q_norm.weight": ((16,), Q.F32), f"blk.{i}.attn_k_norm.weight": ((16,), Q.F32)}
        else:
            tensors |= {f"blk.{i}.shortconv.conv.weight": ((H, cache), Q.F32),
                        f"blk.{i}.shortconv.in_proj.weight": ((3 * H, H), Q.Q8_0),
                        f"blk.{i}.shortconv.out_proj.weight": ((H, H), Q.Q8_0)}
    return kv, tensors


def reconcile(capsys: pytest.CaptureFixture[str], path: Path) -> dict:
    assert main(["audit", str(path), "--json", "--no-cache"]) == 0
    return json.loads(capsys.readouterr().out)["checkpoint"]["reconcile"]


def ways(rec: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in rec["matches"]:
        out[m["how"]] = out.get(m["how"], 0) + 1
    return out


def test_a_mamba_file_reconciles_tensor_by_tensor_with_the_ssm_norm(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "mamba.gguf", "mamba", *mamba())
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"]) == ("MambaForCausalLM", True), rec["differences"]
    # 2 layers × (norm 64 + in 16,384 + conv 512 + 128 + x 4,608 + dt 512 + 128 + A 2,048 + D 128 + out 8,192)
    # + token_embd 104 × 64 + output_norm 64
    params = 2 * (64 + 16_384 + 512 + 128 + 4_608 + 512 + 128 + 2_048 + 128 + 8_192) + VOCAB * H + 64
    assert rec["file_parameters"] == rec["class_parameters"] == rec["matched_parameters"] == params == 72_128
    assert [(d["kind"], d["name"]) for d in rec["differences"]] == [("tied", "lm_head.weight")]
    assert rec["roles"]["ssm.norm"] == {"file": 128, "class": 128} and "attention.norm" not in rec["roles"]
    assert all(r["file"] == r["class"] for r in rec["roles"].values())
    assert ways(rec) == {"as is": 18, "holds −exp(A_log) (convert_hf_to_gguf.py), shape kept": 2,
                         "reshaped [128, 1, 4] → [128, 4] (convert_hf_to_gguf.py's SSM layout), values kept": 2}
    assert read_gguf(path).by_role()["ssm.norm"]["elements"] == 128


def test_an_lfm2_file_builds_its_layer_kinds_and_reconciles(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "lfm2.gguf", "lfm2", *lfm2())
    built = gguf_config(read_gguf(path))
    assert built.class_name == "Lfm2ForCausalLM"
    # transformers' LFM2 step: the layers with KV heads attend, the largest count is the class's, no re-adjusted FFN
    assert {k: built.config[k] for k in ("num_key_value_heads", "full_attn_idxs", "block_auto_adjust_ff_dim",
                                         "intermediate_size", "conv_L_cache")} == {
        "num_key_value_heads": 2, "full_attn_idxs": [1], "block_auto_adjust_ff_dim": False,
        "intermediate_size": 128, "conv_L_cache": 3}
    assert any(n.startswith("full_attn_idxs [1] (the layers with KV heads") for n in built.notes)
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"]) == ("Lfm2ForCausalLM", True), rec["differences"]
    # 3 layers × (operator and ffn norms 128 + FFN 3 × 8,192) + 2 conv layers × (conv 192 + in 12,288 + out 4,096)
    # + 1 attention layer (q, o 2 × 4,096 + k, v 2 × 2,048 + q/k norms 32) + token_embd 6,656 + embedding_norm 64
    params = 3 * (128 + 3 * 8_192) + 2 * (192 + 12_288 + 4_096) + (2 * 4_096 + 2 * 2_048 + 32) + VOCAB * H + 64
    assert rec["file_parameters"] == rec["class_parameters"] == params == 126_304
    assert rec["roles"]["mixer.norm"] == {"file": 3 * 64, "class": 3 * 64}  # every layer's operator_norm
    assert rec["roles"]["mixer.conv"] == {"file": 2 * (192 + 12_288 + 4_096), "class": 2 * (192 + 12_288 + 4_096)}
    assert rec["roles"]["norm.final"] == {"file": 64, "class": 64}  # embedding_norm, applied after the last layer
    assert all(r["file"] == r["class"] for r in rec["roles"].values())
    assert ways(rec)["squeezed [64, 1, 3] → [64, 3] (convert_hf_to_gguf.py's LFM2 conv), values kept"] == 2


@pytest.mark.parametrize(("name", "arch", "kind", "role"), [
    ("blk.0.attn_norm.weight", "mamba", "ssm", "ssm.norm"),
    ("blk.0.attn_norm.weight", "jamba", "ssm", "ssm.norm"),
    ("blk.1.attn_norm.weight", "jamba", "attention", "attention.norm"),
    ("blk.0.attn_norm.weight", "lfm2", "attention", "mixer.norm"),
    ("blk.0.attn_norm.weight", "lfm2", "conv", "mixer.norm"),
    ("blk.0.attn_norm.weight", "llama", "attention", "attention.norm"),
    ("blk.0.attn_norm.weight", None, None, "attention.norm"),  # the name alone
    ("blk.0.shortconv.in_proj.weight", "lfm2", "conv", "mixer.conv"),
    ("token_embd_norm.weight", "lfm2", None, "norm.final"),
    ("token_embd_norm.weight", "bert", None, "embeddings.norm"),
    ("blk.0.ssm_dt_norm.weight", "jamba", "ssm", "ssm.norm"),
    ("blk.0.ssm_conv1d.weight", "qwen3next", "ssm", "linear_attention.conv"),
    ("blk.0.ssm_a", "qwen3next", "ssm", "linear_attention.decay"),
    ("blk.0.ssm_ba.weight", "qwen3next", "ssm", "linear_attention.in_proj"),
    ("blk.0.ssm_out.weight", "qwen3next", "ssm", "linear_attention.output"),
    ("blk.0.ssm_conv1d.weight", "mamba", "ssm", "ssm.conv"),
])
def test_roles_follow_the_architecture_and_layer_kind(name: str, arch: str | None, kind: str | None,
                                                      role: str) -> None:
    assert gguf_role(name, arch, kind) == role


def test_a_hybrid_files_blocks_take_their_own_kinds(tmp_path: Path) -> None:
    """Jamba as llama.cpp writes it: a Mamba block and an attention block, each with its `attn_norm`."""
    tensors = {"token_embd.weight": ((VOCAB, H), Q.F32), "blk.0.attn_norm.weight": ((H,), Q.F32),
               "blk.0.ssm_in.weight": ((256, H), Q.F32), "blk.0.ssm_b_norm.weight": ((16,), Q.F32),
               "blk.1.attn_norm.weight": ((H,), Q.F32), "blk.1.attn_q.weight": ((H, H), Q.F32)}
    ck = read_gguf(write(tmp_path / "jamba.gguf", "jamba", {"block_count": 2}, tensors))
    assert block_kinds(t.name for t in ck.tensors) == {0: "ssm", 1: "attention"}
    assert {t.name: t.role for t in ck.tensors if "norm" in t.name} == {
        "blk.0.attn_norm.weight": "ssm.norm", "blk.0.ssm_b_norm.weight": "ssm.norm",
        "blk.1.attn_norm.weight": "attention.norm"}


@pytest.mark.parametrize("arch", ["deepseek2", "jamba", "falcon-h1", "mamba2", "granitehybrid", "nemotron_h",
                                  "qwen3next", "lfm2moe"])
def test_families_transformers_builds_no_class_for_are_refused_in_one_line(tmp_path: Path, arch: str,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / f"{arch}.gguf", arch, {"block_count": 1},
                 {"token_embd.weight": ((VOCAB, H), Q.F32), "blk.0.attn_norm.weight": ((H,), Q.F32)})
    why = f"cannot build a model from this GGUF: transformers has no config mapping for architecture '{arch}'"
    assert main(["inspect", str(path), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and "Traceback" not in err


def test_a_predicted_mamba_file_names_its_norm_the_ssms() -> None:
    """--dtype q8_0 on a Mamba config: the converter's names carry the roles a written file's do."""
    import torch
    import transformers

    from paramscope.api import inspect_module
    from paramscope.cost.memory.llama_cpp_mixture import predict_gguf

    # a dt rank of 32: ssm_dt's rows are whole Q8_0 blocks
    config = transformers.MambaConfig(hidden_size=H, num_hidden_layers=2, state_size=16, vocab_size=VOCAB,
                                      intermediate_size=2 * H, time_step_rank=32)
    with torch.device("meta"):
        module = transformers.AutoModelForCausalLM.from_config(config)
    predicted = predict_gguf(inspect_module(module).params, config.to_dict(), "Q8_0", n_layers=2)
    roles = {t.name: t.role for t in predicted.tensors}
    assert roles["blk.0.attn_norm.weight"] == roles["blk.1.attn_norm.weight"] == "ssm.norm"
    assert predicted.by_role()["ssm.norm"]["elements"] == 2 * H
