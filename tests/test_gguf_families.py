"""GGUF files of MLA, recurrent and hybrid families (issue 29 §1): each written as llama.cpp's convert_hf_to_gguf.py
writes it (its metadata keys and tensor shapes: MambaModel, Mamba2Model, LFM2Model, DeepseekV2Model, JambaModel,
LFM2MoeModel, Qwen3NextModel, GraniteHybridModel, NemotronHModel, FalconH1Model), then held against the transformers
class built from its metadata, tensor by tensor: same parameters, same roles. Roles follow the layer kind: llama.cpp
names every layer's pre-mixer norm `attn_norm`, which is the SSM's norm in a Mamba layer and the mixer's in LFM2,
Granite-4.0-H, Nemotron-H and Falcon-H1.
deepseek2, mamba2, jamba, lfm2moe, qwen3next, granitehybrid, nemotron_h and falcon-h1, which transformers reads no
GGUF of, are built from paramscope's own table (and `memory --engine llama.cpp` answers on the hybrids; nemotron_h_moe
in test_gguf_nemotron_h_moe.py); the families no class is built for from a GGUF yet (exaone4) are refused in one
line.
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
    ("blk.0.attn_norm.weight", "mamba2", "ssm2", "ssm.norm"),
    ("blk.0.ssm_dt.bias", "mamba2", "ssm2", "ssm.state"),  # Mamba-2's dt_bias
    ("blk.0.ssm_dt.bias", "mamba", "ssm", "ssm.dt_proj"),  # Mamba's dt_proj.bias
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
               "blk.0.ssm_in.weight": ((256, H), Q.F32), "blk.0.ssm_x.weight": ((36, 128), Q.F32),
               "blk.0.ssm_b_norm.weight": ((16,), Q.F32),
               "blk.1.attn_norm.weight": ((H,), Q.F32), "blk.1.attn_q.weight": ((H, H), Q.F32)}
    ck = read_gguf(write(tmp_path / "jamba.gguf", "jamba", {"block_count": 2}, tensors))
    assert block_kinds(t.name for t in ck.tensors) == {0: "ssm", 1: "attention"}
    assert {t.name: t.role for t in ck.tensors if "norm" in t.name} == {
        "blk.0.attn_norm.weight": "ssm.norm", "blk.0.ssm_b_norm.weight": "ssm.norm",
        "blk.1.attn_norm.weight": "attention.norm"}


@pytest.mark.parametrize("arch", ["exaone4"])
def test_families_transformers_builds_no_class_for_are_refused_in_one_line(tmp_path: Path, arch: str,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / f"{arch}.gguf", arch, {"block_count": 1},
                 {"token_embd.weight": ((VOCAB, H), Q.F32), "blk.0.attn_norm.weight": ((H,), Q.F32)})
    why = f"cannot build a model from this GGUF: transformers has no config mapping for architecture '{arch}'"
    assert main(["inspect", str(path), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and "Traceback" not in err
    assert ("nor has paramscope a table of its own for it yet (it has deepseek2, falcon-h1, granitehybrid, jamba, "
            "lfm2moe, mamba2, nemotron_h, nemotron_h_moe, qwen3next)") in err


def jamba(layers: int = 4, inner: int = 2 * H, state: int = 16, conv: int = 4, rank: int = 4, experts: int = 4,
          ff: int = 128) -> tuple[dict, dict]:
    """JambaModel's metadata (KV heads per layer, 0 on a Mamba layer: attention at 1 and 3; no vocab_size, no expert
    period; a short training context, which memory's traced prefill check runs at) and tensors: Mamba layers as MambaModel's plus the dt/B/C norms, experts stacked (ffn_*_exps) on layers
    1 and 3 (Jamba's every other layer), dense FFNs on 0 and 2, an untied head."""
    kv = {"block_count": layers, "context_length": 8, "embedding_length": H, "feed_forward_length": ff,
          "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0, 2], "ssm.conv_kernel": conv,
          "ssm.inner_size": inner, "ssm.state_size": state, "ssm.time_step_rank": rank,
          "attention.layer_norm_rms_epsilon": 1e-6, "expert_count": experts, "expert_used_count": 2}
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
               "output.weight": ((VOCAB, H), Q.Q8_0)}
    for i in range(layers):
        b = f"blk.{i}."
        tensors |= {b + "attn_norm.weight": ((H,), Q.F32), b + "ffn_norm.weight": ((H,), Q.F32)}
        if i % 2:
            tensors |= {b + "attn_q.weight": ((H, H), Q.Q8_0), b + "attn_k.weight": ((32, H), Q.Q8_0),
                        b + "attn_v.weight": ((32, H), Q.Q8_0), b + "attn_output.weight": ((H, H), Q.Q8_0)}
        else:
            tensors |= {b + "ssm_in.weight": ((2 * inner, H), Q.Q8_0), b + "ssm_conv1d.weight": ((inner, conv), Q.F32),
                        b + "ssm_conv1d.bias": ((inner,), Q.F32),
                        b + "ssm_x.weight": ((rank + 2 * state, inner), Q.Q8_0),
                        b + "ssm_dt.weight": ((inner, rank), Q.F32), b + "ssm_dt.bias": ((inner,), Q.F32),
                        b + "ssm_a": ((inner, state), Q.F32), b + "ssm_d": ((inner,), Q.F32),
                        b + "ssm_out.weight": ((H, inner), Q.Q8_0), b + "ssm_dt_norm.weight": ((rank,), Q.F32),
                        b + "ssm_b_norm.weight": ((state,), Q.F32), b + "ssm_c_norm.weight": ((state,), Q.F32)}
        if i % 2:
            tensors |= {b + "ffn_gate_inp.weight": ((experts, H), Q.F32),
                        b + "ffn_gate_exps.weight": ((experts, ff, H), Q.Q8_0),
                        b + "ffn_up_exps.weight": ((experts, ff, H), Q.Q8_0),
                        b + "ffn_down_exps.weight": ((experts, H, ff), Q.Q8_0)}
        else:
            tensors |= {b + "ffn_gate.weight": ((ff, H), Q.Q8_0), b + "ffn_up.weight": ((ff, H), Q.Q8_0),
                        b + "ffn_down.weight": ((H, ff), Q.Q8_0)}
    return kv, tensors


def test_a_jamba_file_builds_its_layer_pattern_and_reconciles(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "jamba.gguf", "jamba", *jamba())
    built = gguf_config(read_gguf(path))
    assert built.class_name == "JambaForCausalLM"
    assert {k: built.config[k] for k in ("attn_layer_period", "attn_layer_offset", "expert_layer_period",
                                         "expert_layer_offset", "num_key_value_heads", "mamba_expand",
                                         "mamba_dt_rank", "mamba_conv_bias", "mamba_proj_bias", "vocab_size")} == {
        "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
        "num_key_value_heads": 2, "mamba_expand": 2, "mamba_dt_rank": 4, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "vocab_size": VOCAB}
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"], rec["differences"]) == ("JambaForCausalLM", True, [])
    # norms 4 × 128; Mamba layers 2 × (in 16,384 + conv 512 + 128 + x 4,608 + dt 512 + 128 + A 2,048 + D 128
    # + out 8,192 + dt/B/C norms 36); attention layers 2 × (q, o 2 × 4,096 + k, v 2 × 2,048); dense FFNs
    # 2 × 3 × 8,192; expert layers 2 × (router 256 + 3 × 4 × 8,192); token_embd, output 2 × 6,656, norm 64
    params = (4 * 128 + 2 * (16_384 + 512 + 128 + 4_608 + 512 + 128 + 2_048 + 128 + 8_192 + 36)
              + 2 * (2 * 4_096 + 2 * 2_048) + 2 * 3 * 8_192 + 2 * (256 + 3 * 4 * 8_192) + 2 * VOCAB * H + 64)
    assert rec["file_parameters"] == rec["class_parameters"] == rec["matched_parameters"] == params == 350_088
    assert rec["roles"]["ssm.norm"] == {"file": 2 * (64 + 36), "class": 2 * (64 + 36)}
    assert rec["roles"]["attention.norm"] == {"file": 2 * 64, "class": 2 * 64}
    assert all(r["file"] == r["class"] for r in rec["roles"].values())
    assert ways(rec)["fused: gate ‖ up along dim 1 (transformers' gate_up_proj)"] == 2


def test_a_jamba_file_whose_attention_layers_follow_no_period_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kv, tensors = jamba()
    kv["attention.head_count_kv"] = [2, 2, 0, 2]
    assert main(["inspect", str(write(tmp_path / "jamba.gguf", "jamba", kv, tensors)), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its attention layers [0, 1, 3] follow no period JambaConfig can lay out" in err


@pytest.mark.parametrize(("arch", "files", "states", "kv"), [
    # Jamba: 2 Mamba layers × ((d_conv − 1) × d_inner 3 × 128 + d_state × d_inner 16 × 128) F32; 2 attention layers
    ("jamba", jamba, 2 * (3 * 128 + 16 * 128) * 4, 2 * 256 * (32 + 32) * 2),
    # LFM2-MoE: 2 short-convolution layers × n_embd 64 × (L_cache 3 − 1) F32; 1 attention layer
    ("lfm2moe", lambda: lfm2moe(), 2 * 64 * 2 * 4, 1 * 256 * (32 + 32) * 2),
    # Qwen3-Next: 1 gated-delta-net layer × ((d_conv − 1) × (d_inner 64 + 2 × 2 key heads × 16) + 16 × 64) F32
    ("qwen3next", lambda: qwen3next(), (3 * 128 + 16 * 64) * 4, 1 * 256 * (32 + 32) * 2),
    # Granite-4 hybrid: 1 Mamba-2 layer × ((d_conv − 1) × (d_inner 128 + 2 × 2 groups × 16) + 16 × 128) F32
    ("granitehybrid", lambda: granitehybrid(), (3 * 192 + 16 * 128) * 4, 1 * 256 * (32 + 32) * 2),
    # Nemotron-H: its Mamba-2 layer as Granite-4's; 1 attention layer
    ("nemotron_h", lambda: nemotron_h(), (3 * 192 + 16 * 128) * 4, 1 * 256 * (32 + 32) * 2),
    # Falcon-H1: 2 layers, each Mamba-2 (as Granite-4's) beside attention
    ("falcon-h1", lambda: falcon_h1(), 2 * (3 * 192 + 16 * 128) * 4, 2 * 256 * (32 + 32) * 2),
])
def test_memory_under_llama_cpp_answers_on_a_hybrid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          arch: str, files, states: int, kv: int) -> None:
    path = write(tmp_path / f"{arch}.gguf", arch, *files())
    assert main(["memory", str(path), "--engine", "llama.cpp", "-c", "256", "--json", "--no-cache"]) == 0
    plan = json.loads(capsys.readouterr().out)["memory"]["llama_cpp"]
    gpu, cpu = plan["devices"]
    assert (gpu["kv"], gpu["recurrent"]) == (kv, states) == {"jamba": (65_536, 19_456), "lfm2moe": (32_768, 1_024),
                                                             "qwen3next": (32_768, 5_632),
                                                             "granitehybrid": (32_768, 10_496),
                                                             "nemotron_h": (32_768, 10_496),
                                                             "falcon-h1": (65_536, 20_992)}[arch]
    # every tensor's exact bytes, token_embd (Q8_0: 104 × 64 / 32 blocks of 34 B) on the CPU; LFM2-MoE's head is
    # and Granite-4's heads are tied, and the output layer's device takes its own copy of token_embd
    copy = 7_072 if arch in ("lfm2moe", "granitehybrid") else 0
    assert cpu["weights"] == 7_072 and gpu["weights"] + cpu["weights"] == read_gguf(path).nbytes + copy


def qwen3next() -> tuple[dict, dict]:
    """Qwen3NextModel's metadata (Qwen2MoeModel's keys; the gated delta net's as ssm.*: conv kernel, key head width
    as state_size, key heads as group_count, value heads as time_step_rank, value heads × width as inner_size) and
    tensors: layer 0 the gated delta net (in_proj_qkvz split into attn_qkv and attn_gate, in_proj_ba as ssm_ba,
    conv1d squeezed, A and dt_bias bare), layer 1 full attention (q with its gate, q/k norms), both MoE with experts
    stacked apart (ffn_gate_exps, ffn_up_exps) and the shared expert's gate squeezed to [hidden]."""
    kv = {"context_length": 8, "embedding_length": H, "block_count": 2, "feed_forward_length": 128,
          "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16,
          "attention.value_length": 16, "rope.freq_base": 1e7, "attention.layer_norm_rms_epsilon": 1e-6,
          "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
          "expert_shared_feed_forward_length": 32, "ssm.conv_kernel": 4, "ssm.state_size": 16,
          "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.inner_size": 64, "full_attention_interval": 2,
          "rope.dimension_count": 4}
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
               "output.weight": ((VOCAB, H), Q.Q8_0)}
    for i in range(2):
        b = f"blk.{i}."
        tensors |= {b + "attn_norm.weight": ((H,), Q.F32), b + "post_attention_norm.weight": ((H,), Q.F32),
                    b + "ffn_gate_inp.weight": ((4, H), Q.F32), b + "ffn_gate_exps.weight": ((4, 32, H), Q.Q8_0),
                    b + "ffn_up_exps.weight": ((4, 32, H), Q.Q8_0), b + "ffn_down_exps.weight": ((4, H, 32), Q.Q8_0),
                    b + "ffn_gate_shexp.weight": ((32, H), Q.Q8_0), b + "ffn_up_shexp.weight": ((32, H), Q.Q8_0),
                    b + "ffn_down_shexp.weight": ((H, 32), Q.Q8_0), b + "ffn_gate_inp_shexp.weight": ((H,), Q.F32)}
    tensors |= {"blk.0.attn_qkv.weight": ((128, H), Q.Q8_0), "blk.0.attn_gate.weight": ((64, H), Q.Q8_0),
                "blk.0.ssm_ba.weight": ((8, H), Q.F32), "blk.0.ssm_conv1d.weight": ((128, 4), Q.F32),
                "blk.0.ssm_dt.bias": ((4,), Q.F32), "blk.0.ssm_a": ((4,), Q.F32),
                "blk.0.ssm_norm.weight": ((16,), Q.F32), "blk.0.ssm_out.weight": ((H, 64), Q.Q8_0),
                "blk.1.attn_q.weight": ((128, H), Q.Q8_0), "blk.1.attn_k.weight": ((32, H), Q.Q8_0),
                "blk.1.attn_v.weight": ((32, H), Q.Q8_0), "blk.1.attn_output.weight": ((H, 64), Q.Q8_0),
                "blk.1.attn_q_norm.weight": ((16,), Q.F32), "blk.1.attn_k_norm.weight": ((16,), Q.F32)}
    return kv, tensors


def test_a_qwen3next_file_builds_its_gated_delta_net_and_reconciles(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "qwen3next.gguf", "qwen3next", *qwen3next())
    built = gguf_config(read_gguf(path))
    assert built.class_name == "Qwen3NextForCausalLM"
    assert {k: built.config[k] for k in ("layer_types", "linear_num_key_heads", "linear_num_value_heads",
                                         "linear_key_head_dim", "linear_value_head_dim", "head_dim",
                                         "partial_rotary_factor")} == {
        "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "head_dim": 16,
        "partial_rotary_factor": 0.25}
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"], rec["differences"]) == ("Qwen3NextForCausalLM", True, [])
    # per layer: norms 128, router 256, experts 3 × 4 × 2,048, shared 3 × 2,048 + its gate 64; layer 0: qkvz
    # 192 × 64, ba 8 × 64, conv 128 × 4, dt_bias and A 8, norm 16, out 64 × 64; layer 1: q 128 × 64, k and v
    # 2 × 32 × 64, o 64 × 64, q/k norms 32; token_embd and output 2 × 6,656, norm 64
    params = (2 * (128 + 256 + 3 * 4 * 2_048 + 3 * 2_048 + 64) + 192 * 64 + 8 * 64 + 128 * 4 + 8 + 16 + 64 * 64
              + 128 * 64 + 2 * 32 * 64 + 64 * 64 + 32 + 2 * VOCAB * H + 64)
    assert rec["file_parameters"] == rec["class_parameters"] == rec["matched_parameters"] == params == 109_560
    assert rec["roles"]["linear_attention.in_proj"] == {"file": 200 * 64, "class": 200 * 64}
    assert rec["roles"]["mlp.norm"] == {"file": 2 * 64, "class": 2 * 64}  # post_attention_norm: the pre-MLP norm
    assert ways(rec)["split by rows: attn_qkv (q ‖ k ‖ v) and attn_gate (z), heads regrouped "
                     "(convert_hf_to_gguf.py's Qwen3-Next), values kept"] == 1
    assert ways(rec)["fused: gate ‖ up along dim 1 (transformers' gate_up_proj)"] == 2


def lfm2moe(layers: int = 3, ff: int = 128, moe: int = 32, experts: int = 4) -> tuple[dict, dict]:
    """LFM2MoeModel's metadata (LFM2's, plus expert count and width, leading_dense_block_count 1) and tensors:
    LFM2's, with layers 1 and 2 holding stacked experts (w1, w3, w2 → ffn_gate/up/down_exps), the router and its
    expert_bias (written as exp_probs_b.bias)."""
    kv, tensors = lfm2(layers=layers, ff=ff)
    kv |= {"expert_count": experts, "expert_used_count": 2, "expert_feed_forward_length": moe,
           "leading_dense_block_count": 1, "expert_gating_func": 2}
    for i in range(1, layers):
        b = f"blk.{i}."
        for name in ("ffn_gate", "ffn_up", "ffn_down"):
            del tensors[b + name + ".weight"]
        tensors |= {b + "ffn_gate_inp.weight": ((experts, H), Q.F32), b + "exp_probs_b.bias": ((experts,), Q.F32),
                    b + "ffn_gate_exps.weight": ((experts, moe, H), Q.Q8_0),
                    b + "ffn_up_exps.weight": ((experts, moe, H), Q.Q8_0),
                    b + "ffn_down_exps.weight": ((experts, H, moe), Q.Q8_0)}
    return kv, tensors


def test_an_lfm2moe_file_builds_its_layer_kinds_and_experts_and_reconciles(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "lfm2moe.gguf", "lfm2moe", *lfm2moe())
    built = gguf_config(read_gguf(path))
    assert built.class_name == "Lfm2MoeForCausalLM"
    assert {k: built.config[k] for k in ("layer_types", "num_key_value_heads", "num_dense_layers", "num_experts",
                                         "moe_intermediate_size", "use_expert_bias")} == {
        "layer_types": ["conv", "full_attention", "conv"], "num_key_value_heads": 2, "num_dense_layers": 1,
        "num_experts": 4, "moe_intermediate_size": 32, "use_expert_bias": True}
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"]) == ("Lfm2MoeForCausalLM", True), rec["differences"]
    # LFM2's 126,304 less two dense FFNs (2 × 3 × 8,192), plus two expert layers (router 256 + 3 × 4 × 2,048);
    # the file's expert_bias (2 × 4) is the class's buffer
    params = 126_304 - 2 * 3 * 8_192 + 2 * (256 + 3 * 4 * 2_048)
    assert rec["class_parameters"] == rec["matched_parameters"] == params == 126_816
    assert rec["file_parameters"] == params + 2 * 4
    assert [(d["kind"], d["name"], d["explained"]) for d in rec["differences"]] == [
        ("tied", "lm_head.weight", True), ("file only", "blk.1.exp_probs_b.bias", True),
        ("file only", "blk.2.exp_probs_b.bias", True)]
    assert rec["roles"]["mixer.conv"] == {"file": 2 * (192 + 12_288 + 4_096), "class": 2 * (192 + 12_288 + 4_096)}


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


def test_a_mixture_whose_type_has_no_fallback_stops_as_llama_quantize_does() -> None:
    """Mamba's ssm_dt rows are the dt rank (4 here, 48 in mamba-130m): no Q8_0 block of 32 fits. llama-quantize's
    tensor_type_fallback (src/llama-quant.cpp at 007dbbf3fd17) falls back only from the K and IQ types and throws for
    Q8_0, writing no file: refused in one line naming the tensor; Q4_K_M takes Q4_K → Q5_0 → F16 for it."""
    import torch
    import transformers

    from paramscope.api import inspect_module
    from paramscope.cost.memory.llama_cpp_mixture import predict_gguf
    from paramscope.errors import UnsupportedError

    config = transformers.MambaConfig(hidden_size=H, num_hidden_layers=2, state_size=16, vocab_size=VOCAB,
                                      intermediate_size=2 * H, time_step_rank=4)
    with torch.device("meta"):
        params = inspect_module(transformers.AutoModelForCausalLM.from_config(config)).params
    with pytest.raises(UnsupportedError) as caught:
        predict_gguf(params, config.to_dict(), "Q8_0", n_layers=2)
    assert str(caught.value).count("\n") == 0 and str(caught.value).startswith(
        "llama-quantize Q8_0 writes no file for this model: blk.0.ssm_dt.weight's rows of 4 values are no whole "
        "number of Q8_0 blocks of 32") and 'throws "no tensor type fallback is defined for type q8_0"' in str(caught.value)
    dt = next(t for t in predict_gguf(params, config.to_dict(), "Q4_K_M", n_layers=2).tensors
              if t.name == "blk.0.ssm_dt.weight")
    assert (dt.ggml_type, dt.nbytes) == ("F16", 128 * 4 * 2)


def deepseek2(v3: bool = True, layers: int = 2, heads: int = 4, rank: int = 32, rope: int = 8, nope: int = 16,
              v: int = 16, q_rank: int = 64, experts: int = 4, moe: int = 32) -> tuple[dict, dict]:
    """DeepseekV2Model's metadata and tensors. V3 (today's converter): MLA as MQA (one KV head, key_length the
    latent + rope, value_length the latent, the heads' widths in key/value_length_mla), kv_b_proj split per head
    into attn_k_b (transposed) and attn_v_b, the router's exp_probs_b. V2-Lite (an older file): no q_lora_rank
    (attn_q), key/value_length the heads' widths, attn_kv_b whole. The first layer dense, the rest MoE."""
    kv = {"context_length": 4096, "embedding_length": H, "block_count": layers, "feed_forward_length": 128,
          "attention.head_count": heads, "attention.head_count_kv": 1 if v3 else heads, "rope.freq_base": 10000.0,
          "attention.layer_norm_rms_epsilon": 1e-6, "leading_dense_block_count": 1, "vocab_size": VOCAB,
          "attention.kv_lora_rank": rank, "expert_feed_forward_length": moe, "expert_count": experts,
          "expert_shared_count": 1, "expert_used_count": 2, "rope.dimension_count": rope}
    kv |= ({"attention.q_lora_rank": q_rank, "attention.key_length": rank + rope, "attention.value_length": rank,
            "attention.key_length_mla": nope + rope, "attention.value_length_mla": v, "expert_weights_scale": 2.5,
            "expert_weights_norm": True} if v3 else
           {"attention.key_length": nope + rope, "attention.value_length": v})
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
               "output.weight": ((VOCAB, H), Q.Q8_0)}
    for i in range(layers):
        b = f"blk.{i}."
        tensors |= {b + "attn_norm.weight": ((H,), Q.F32), b + "ffn_norm.weight": ((H,), Q.F32),
                    b + "attn_kv_a_mqa.weight": ((rank + rope, H), Q.Q8_0),
                    b + "attn_kv_a_norm.weight": ((rank,), Q.F32),
                    b + "attn_output.weight": ((H, heads * v), Q.Q8_0)}
        if v3:
            tensors |= {b + "attn_q_a.weight": ((q_rank, H), Q.Q8_0), b + "attn_q_a_norm.weight": ((q_rank,), Q.F32),
                        b + "attn_q_b.weight": ((heads * (nope + rope), q_rank), Q.Q8_0),
                        b + "attn_k_b.weight": ((heads, rank, nope), Q.F16),
                        b + "attn_v_b.weight": ((heads, v, rank), Q.Q8_0)}
        else:
            tensors |= {b + "attn_q.weight": ((heads * (nope + rope), H), Q.Q8_0),
                        b + "attn_kv_b.weight": ((heads * (nope + v), rank), Q.Q8_0)}
        if i == 0:
            tensors |= {b + "ffn_gate.weight": ((128, H), Q.Q8_0), b + "ffn_up.weight": ((128, H), Q.Q8_0),
                        b + "ffn_down.weight": ((H, 128), Q.Q8_0)}
        else:
            tensors |= {b + "ffn_gate_inp.weight": ((experts, H), Q.F32),
                        b + "ffn_gate_exps.weight": ((experts, moe, H), Q.Q8_0),
                        b + "ffn_up_exps.weight": ((experts, moe, H), Q.Q8_0),
                        b + "ffn_down_exps.weight": ((experts, H, moe), Q.Q8_0),
                        b + "ffn_gate_shexp.weight": ((moe, H), Q.Q8_0), b + "ffn_up_shexp.weight": ((moe, H), Q.Q8_0),
                        b + "ffn_down_shexp.weight": ((H, moe), Q.Q8_0)}
            if v3:
                tensors[b + "exp_probs_b.bias"] = ((experts,), Q.F32)
    return kv, tensors


@pytest.mark.parametrize(("v3", "cls"), [(True, "DeepseekV3ForCausalLM"), (False, "DeepseekV2ForCausalLM")])
def test_a_deepseek2_file_builds_its_mla_class_and_reconciles(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              v3: bool, cls: str) -> None:
    path = write(tmp_path / "deepseek2.gguf", "deepseek2", *deepseek2(v3))
    built = gguf_config(read_gguf(path))
    assert built.class_name == cls
    assert {k: built.config[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank",
                                         "q_lora_rank", "num_key_value_heads", "n_routed_experts",
                                         "first_k_dense_replace", "moe_intermediate_size")} == {
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 32,
        "q_lora_rank": 64 if v3 else None, "num_key_value_heads": 4, "n_routed_experts": 4,
        "first_k_dense_replace": 1, "moe_intermediate_size": 32}
    assert any(n.startswith("config from paramscope's table for deepseek2") for n in built.notes)
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"]) == (cls, True), rec["differences"]
    # per layer: norms 128, kv_a 40 × 64 + 32, o 64 × 64, kv_b 4 × 32 × 32; V3 q_a 64 × 64 + 64, q_b 96 × 64;
    # V2 q 96 × 64; layer 0 dense 3 × 128 × 64, layer 1 router 4 × 64, experts 3 × 4 × 32 × 64, shared
    # 3 × 32 × 64; token_embd and output 2 × 104 × 64, output_norm 64
    attention = 128 + 40 * 64 + 32 + 64 * 64 + 4 * 32 * 32 + (64 * 64 + 64 + 96 * 64 if v3 else 96 * 64)
    params = 2 * attention + 3 * 128 * 64 + 4 * 64 + 3 * 4 * 32 * 64 + 3 * 32 * 64 + 2 * VOCAB * H + 64
    assert rec["class_parameters"] == rec["matched_parameters"] == params == (111_360 if v3 else 103_040)
    assert rec["file_parameters"] == params + (4 if v3 else 0)  # V3's router bias: a buffer of the class
    assert rec["roles"]["attention.kv_up"] == {"file": 2 * 4096, "class": 2 * 4096}
    if v3:
        assert [(d["kind"], d["name"], d["explained"]) for d in rec["differences"]] == [
            ("file only", "blk.1.exp_probs_b.bias", True)]
        split = next(m for m in rec["matches"] if m["parameter"] == "model.layers.0.self_attn.kv_b_proj.weight")
        assert (split["gguf"], split["gguf_shapes"], split["shape"]) == (
            ["blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight"], [[4, 32, 16], [4, 16, 32]], [128, 32])
        assert split["how"].startswith("split per head: attn_k_b (transposed)")
    else:
        assert rec["differences"] == []


def test_a_deepseek2_file_without_its_head_widths_is_one_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    kv, tensors = deepseek2()
    kv = {k: v for k, v in kv.items() if not k.startswith(("attention.key_length", "attention.value_length"))}
    path = write(tmp_path / "deepseek2.gguf", "deepseek2", kv, tensors)
    assert main(["inspect", str(path), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "deepseek2.attention.key_length(_mla) = None is no head width" in err


def mamba2(layers: int = 2, inner: int = 2 * H, state: int = 16, heads: int = 8, groups: int = 2,
           conv: int = 4) -> tuple[dict, dict]:
    """Mamba2Model's metadata (ssm.time_step_rank the number of heads, ssm.group_count) and tensors: dt_bias as
    ssm_dt.bias, A (−exp(A_log)) and D unsqueezed to [heads, 1], the gated norm reshaped to [groups, inner / groups],
    conv1d squeezed, an untied head (Mamba-Codestral's)."""
    kv = {"context_length": 2**20, "embedding_length": H, "feed_forward_length": 0, "attention.head_count": 0,
          "block_count": layers, "ssm.conv_kernel": conv, "ssm.inner_size": inner, "ssm.state_size": state,
          "ssm.time_step_rank": heads, "ssm.group_count": groups, "attention.layer_norm_rms_epsilon": 1e-5}
    channels = inner + 2 * groups * state  # the convolution runs over x, B and C
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
               "output.weight": ((VOCAB, H), Q.Q8_0)}
    for i in range(layers):
        b = f"blk.{i}."
        tensors |= {b + "attn_norm.weight": ((H,), Q.F32), b + "ssm_in.weight": ((inner + channels + heads, H), Q.F16),
                    b + "ssm_conv1d.weight": ((channels, conv), Q.F32), b + "ssm_conv1d.bias": ((channels,), Q.F32),
                    b + "ssm_dt.bias": ((heads,), Q.F32), b + "ssm_a": ((heads, 1), Q.F32),
                    b + "ssm_d": ((heads, 1), Q.F32), b + "ssm_norm.weight": ((groups, inner // groups), Q.F32),
                    b + "ssm_out.weight": ((H, inner), Q.Q8_0)}
    return kv, tensors


def test_a_mamba2_file_builds_its_heads_and_reconciles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "mamba2.gguf", "mamba2", *mamba2())
    built = gguf_config(read_gguf(path))
    assert built.class_name == "Mamba2ForCausalLM"
    assert {k: built.config[k] for k in ("num_heads", "head_dim", "expand", "n_groups", "state_size")} == {
        "num_heads": 8, "head_dim": 16, "expand": 2, "n_groups": 2, "state_size": 16}
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"], rec["differences"]) == ("Mamba2ForCausalLM", True, [])
    # per layer: norm 64, in 328 × 64, conv 192 × 4 + 192, dt_bias, A, D 3 × 8, gated norm 128, out 64 × 128;
    # token_embd and output 2 × 104 × 64, norm_f 64
    params = 2 * (64 + 328 * 64 + 192 * 4 + 192 + 3 * 8 + 128 + 64 * 128) + 2 * VOCAB * H + 64
    assert rec["file_parameters"] == rec["class_parameters"] == params == 74_096
    assert rec["roles"]["ssm.norm"] == {"file": 2 * (64 + 128), "class": 2 * (64 + 128)}
    assert rec["roles"]["ssm.state"] == {"file": 2 * 3 * 8, "class": 2 * 3 * 8}  # dt_bias (ssm_dt.bias), A, D
    assert ways(rec)["reshaped [128] → [2, 64] (convert_hf_to_gguf.py's SSM layout), values kept"] == 2


def granitehybrid(experts: int = 4, moe: int = 32, shared: int = 64) -> tuple[dict, dict]:
    """GraniteHybridModel's metadata (GraniteMoeModel's keys, the multipliers as *_scale; KV heads per layer, 0 on a
    Mamba-2 layer; Mamba-2's ssm.*: time_step_rank the heads, inner_size expand × hidden; context_length 2**20 and
    rope.scaling.finetuned false for a hybrid run without RoPE) and tensors: layer 0 Mamba-2 (as Mamba2Model writes
    it: A and D [heads, 1], the gated norm [groups, inner / groups], conv1d squeezed, dt_bias as ssm_dt.bias), layer 1
    attention; in each, the experts stacked apart (ffn_gate/up/down_exps) and the shared MLP's input_linear split by
    rows into ffn_gate_shexp and ffn_up_shexp; with no experts (Granite-4.0-H-Micro) the shared MLP is written as
    ffn_gate/up/down. The head is tied (no output.weight), as Granite-4.0-H's."""
    inner, heads, groups, state, conv = 2 * H, 8, 2, 16, 4
    kv = {"context_length": 2**20, "embedding_length": H, "block_count": 2, "feed_forward_length": moe,
          "attention.head_count": 4, "attention.head_count_kv": [0, 2], "rope.freq_base": 10000.0,
          "attention.layer_norm_rms_epsilon": 1e-5, "vocab_size": VOCAB, "rope.dimension_count": 16,
          "attention.scale": 0.0078125, "embedding_scale": 12.0, "residual_scale": 0.22, "logit_scale": 8.0,
          "ssm.conv_kernel": conv, "ssm.state_size": state, "ssm.group_count": groups, "ssm.inner_size": inner,
          "ssm.time_step_rank": heads, "rope.scaling.finetuned": False, "expert_shared_feed_forward_length": shared}
    if experts:
        kv |= {"expert_count": experts, "expert_used_count": 2}
    channels = inner + 2 * groups * state
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
               "blk.0.ssm_in.weight": ((inner + channels + heads, H), Q.Q8_0),
               "blk.0.ssm_conv1d.weight": ((channels, conv), Q.F32), "blk.0.ssm_conv1d.bias": ((channels,), Q.F32),
               "blk.0.ssm_dt.bias": ((heads,), Q.F32), "blk.0.ssm_a": ((heads, 1), Q.F32),
               "blk.0.ssm_d": ((heads, 1), Q.F32), "blk.0.ssm_norm.weight": ((groups, inner // groups), Q.F32),
               "blk.0.ssm_out.weight": ((H, inner), Q.Q8_0),
               "blk.1.attn_q.weight": ((H, H), Q.Q8_0), "blk.1.attn_k.weight": ((32, H), Q.Q8_0),
               "blk.1.attn_v.weight": ((32, H), Q.Q8_0), "blk.1.attn_output.weight": ((H, H), Q.Q8_0)}
    for i in range(2):
        b = f"blk.{i}."
        tensors |= {b + "attn_norm.weight": ((H,), Q.F32), b + "ffn_norm.weight": ((H,), Q.F32)}
        if experts:
            tensors |= {b + "ffn_gate_inp.weight": ((experts, H), Q.F32),
                        b + "ffn_gate_exps.weight": ((experts, moe, H), Q.Q8_0),
                        b + "ffn_up_exps.weight": ((experts, moe, H), Q.Q8_0),
                        b + "ffn_down_exps.weight": ((experts, H, moe), Q.Q8_0),
                        b + "ffn_gate_shexp.weight": ((shared, H), Q.Q8_0),
                        b + "ffn_up_shexp.weight": ((shared, H), Q.Q8_0),
                        b + "ffn_down_shexp.weight": ((H, shared), Q.Q8_0)}
        else:
            tensors |= {b + "ffn_gate.weight": ((shared, H), Q.Q8_0), b + "ffn_up.weight": ((shared, H), Q.Q8_0),
                        b + "ffn_down.weight": ((H, shared), Q.Q8_0)}
    return kv, tensors


@pytest.mark.parametrize("experts", [4, 0])
def test_a_granitehybrid_file_builds_its_layer_kinds_and_reconciles(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    experts: int) -> None:
    path = write(tmp_path / "granitehybrid.gguf", "granitehybrid", *granitehybrid(experts))
    built = gguf_config(read_gguf(path))
    assert built.class_name == "GraniteMoeHybridForCausalLM"
    assert {k: built.config[k] for k in ("layer_types", "num_key_value_heads", "mamba_n_heads", "mamba_d_head",
                                         "mamba_expand", "mamba_n_groups", "mamba_d_state", "mamba_conv_bias",
                                         "mamba_proj_bias", "num_local_experts", "shared_intermediate_size",
                                         "attention_multiplier", "embedding_multiplier", "logits_scaling")} == {
        "layer_types": ["mamba", "attention"], "num_key_value_heads": 2, "mamba_n_heads": 8, "mamba_d_head": 16,
        "mamba_expand": 2, "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "num_local_experts": experts, "shared_intermediate_size": 64,
        "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0, "logits_scaling": 8.0}
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"]) == ("GraniteMoeHybridForCausalLM", True), rec["differences"]
    assert [(d["kind"], d["name"]) for d in rec["differences"]] == [("tied", "lm_head.weight")]
    # norms 2 × 128; shared MLP 2 × 3 × 64 × 64; experts 2 × (router 256 + 3 × 4 × 32 × 64); Mamba-2 layer: in
    # 328 × 64, conv 192 × 4 + 192, dt_bias, A, D 3 × 8, gated norm 128, out 64 × 128; attention layer: q, o
    # 2 × 4,096, k, v 2 × 2,048; token_embd 104 × 64, output_norm 64
    moe = 2 * (256 + 3 * 4 * 32 * 64) if experts else 0
    params = (2 * 128 + 2 * 3 * 64 * 64 + moe + 328 * 64 + 192 * 4 + 192 + 3 * 8 + 128 + 64 * 128
              + 2 * 4_096 + 2 * 2_048 + VOCAB * H + 64)
    assert rec["file_parameters"] == rec["class_parameters"] == rec["matched_parameters"] == params
    assert params == (123_800 if experts else 74_136)
    assert all(r["file"] == r["class"] for r in rec["roles"].values()), rec["roles"]
    # one decoder-layer class runs Mamba-2 or attention: each layer's input_layernorm (attn_norm) is the mixer's norm
    assert rec["roles"]["mixer.norm"] == {"file": 2 * 64, "class": 2 * 64} and "attention.norm" not in rec["roles"]
    assert rec["roles"]["ssm.norm"] == {"file": 128, "class": 128}  # the gated norm
    split = next(m for m in rec["matches"] if m["parameter"] == "model.layers.0.shared_mlp.input_linear.weight")
    assert (split["gguf"], split["shape"]) == (
        ["blk.0.ffn_gate_shexp.weight", "blk.0.ffn_up_shexp.weight"] if experts else
        ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"], [128, 64])
    assert split["how"].startswith("split by rows: gate ‖ up (convert_hf_to_gguf.py's GraniteMoeModel")
    assert ways(rec)["rows permuted for rope (convert_hf_to_gguf.py), shape kept"] == 2
    assert ways(rec).get("fused: gate ‖ up along dim 1 (transformers' gate_up_proj)", 0) == (2 if experts else 0)


def nemotron_h() -> tuple[dict, dict]:
    """NemotronHModel's metadata (GraniteHybridModel's keys; per-layer KV heads and FFN widths, 0 off their layers:
    pattern "M*-"; the attention head width as key_length; ssm.inner_size = heads × head width) and tensors: layer 0
    Mamba-2 (as Granite-4's), layer 1 attention, layer 2 the squared-ReLU MLP (up, down), each with its one norm as
    attn_norm; an untied head."""
    inner, heads, groups, state, conv = 2 * H, 8, 2, 16, 4
    kv = {"context_length": 2**20, "embedding_length": H, "block_count": 3, "feed_forward_length": [0, 0, 128],
          "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0], "attention.key_length": 16,
          "attention.value_length": 16, "attention.layer_norm_rms_epsilon": 1e-5, "vocab_size": VOCAB,
          "ssm.conv_kernel": conv, "ssm.state_size": state, "ssm.group_count": groups, "ssm.inner_size": inner,
          "ssm.time_step_rank": heads, "rope.scaling.finetuned": False}
    channels = inner + 2 * groups * state
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
               "output.weight": ((VOCAB, H), Q.Q8_0),
               "blk.0.ssm_in.weight": ((inner + channels + heads, H), Q.Q8_0),
               "blk.0.ssm_conv1d.weight": ((channels, conv), Q.F32), "blk.0.ssm_conv1d.bias": ((channels,), Q.F32),
               "blk.0.ssm_dt.bias": ((heads,), Q.F32), "blk.0.ssm_a": ((heads, 1), Q.F32),
               "blk.0.ssm_d": ((heads, 1), Q.F32), "blk.0.ssm_norm.weight": ((groups, inner // groups), Q.F32),
               "blk.0.ssm_out.weight": ((H, inner), Q.Q8_0),
               "blk.1.attn_q.weight": ((H, H), Q.Q8_0), "blk.1.attn_k.weight": ((32, H), Q.Q8_0),
               "blk.1.attn_v.weight": ((32, H), Q.Q8_0), "blk.1.attn_output.weight": ((H, H), Q.Q8_0),
               "blk.2.ffn_up.weight": ((128, H), Q.Q8_0), "blk.2.ffn_down.weight": ((H, 128), Q.Q8_0)}
    tensors |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32) for i in range(3)}
    return kv, tensors


def test_a_nemotron_h_file_builds_its_layer_kinds_and_reconciles(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "nemotron_h.gguf", "nemotron_h", *nemotron_h())
    built = gguf_config(read_gguf(path))
    assert built.class_name == "NemotronHForCausalLM"
    assert {k: built.config[k] for k in ("layers_block_type", "num_key_value_heads", "intermediate_size",
                                         "head_dim", "mamba_num_heads", "mamba_head_dim", "n_groups",
                                         "ssm_state_size", "use_conv_bias", "use_bias")} == {
        "layers_block_type": ["mamba", "attention", "mlp"], "num_key_value_heads": 2, "intermediate_size": 128,
        "head_dim": 16, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
        "use_conv_bias": True, "use_bias": False}
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"], rec["differences"]) == ("NemotronHForCausalLM", True, [])
    # norms 3 × 64; Mamba-2 layer: in 328 × 64, conv 192 × 4 + 192, dt_bias, A, D 3 × 8, gated norm 128, out
    # 64 × 128; attention: q, o 2 × 4,096, k, v 2 × 2,048; MLP: up, down 2 × 128 × 64; token_embd and output
    # 2 × 104 × 64, norm_f 64
    params = (3 * 64 + 328 * 64 + 192 * 4 + 192 + 3 * 8 + 128 + 64 * 128 + 2 * 4_096 + 2 * 2_048 + 2 * 128 * 64
              + 2 * VOCAB * H + 64)
    assert rec["file_parameters"] == rec["class_parameters"] == rec["matched_parameters"] == params == 72_536
    assert all(r["file"] == r["class"] for r in rec["roles"].values()), rec["roles"]
    assert ways(rec)["rows permuted for rope (convert_hf_to_gguf.py), shape kept"] == 2
    # one block class runs Mamba-2, attention or the MLP behind its one norm (attn_norm): the mixer's norm
    assert rec["roles"]["mixer.norm"] == {"file": 3 * 64, "class": 3 * 64} and "other" not in rec["roles"]
    assert rec["roles"]["attention.query"] == {"file": 4_096, "class": 4_096}


def falcon_h1() -> tuple[dict, dict]:
    """FalconH1Model's metadata (Mamba2Model's keys: ssm.inner_size mamba_d_ssm, ssm.time_step_rank the heads; the
    attention's heads, KV heads and head width; the FFN width; no multiplier key, the converter multiplies them into
    the weights) and tensors: every layer attention, Mamba-2 (as Mamba2Model writes it, its gated norm reshaped) and
    the FFN side by side, input_layernorm as attn_norm, pre_ff_layernorm as ffn_norm; an untied head."""
    inner, heads, groups, state, conv = 2 * H, 8, 2, 16, 4
    kv = {"context_length": 8, "embedding_length": H, "block_count": 2, "feed_forward_length": 128,
          "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16,
          "attention.value_length": 16, "rope.freq_base": 1e11, "attention.layer_norm_rms_epsilon": 1e-5,
          "vocab_size": VOCAB, "ssm.conv_kernel": conv, "ssm.state_size": state, "ssm.group_count": groups,
          "ssm.inner_size": inner, "ssm.time_step_rank": heads}
    channels = inner + 2 * groups * state
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
               "output.weight": ((VOCAB, H), Q.Q8_0)}
    for i in range(2):
        b = f"blk.{i}."
        tensors |= {b + "attn_norm.weight": ((H,), Q.F32), b + "ffn_norm.weight": ((H,), Q.F32),
                    b + "attn_q.weight": ((H, H), Q.Q8_0), b + "attn_k.weight": ((32, H), Q.Q8_0),
                    b + "attn_v.weight": ((32, H), Q.Q8_0), b + "attn_output.weight": ((H, H), Q.Q8_0),
                    b + "ssm_in.weight": ((inner + channels + heads, H), Q.Q8_0),
                    b + "ssm_conv1d.weight": ((channels, conv), Q.F32), b + "ssm_conv1d.bias": ((channels,), Q.F32),
                    b + "ssm_dt.bias": ((heads,), Q.F32), b + "ssm_a": ((heads, 1), Q.F32),
                    b + "ssm_d": ((heads, 1), Q.F32), b + "ssm_norm.weight": ((groups, inner // groups), Q.F32),
                    b + "ssm_out.weight": ((H, inner), Q.Q8_0), b + "ffn_gate.weight": ((128, H), Q.Q8_0),
                    b + "ffn_up.weight": ((128, H), Q.Q8_0), b + "ffn_down.weight": ((H, 128), Q.Q8_0)}
    return kv, tensors


def test_a_falcon_h1_file_builds_its_parallel_layers_and_reconciles(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "falcon-h1.gguf", "falcon-h1", *falcon_h1())
    built = gguf_config(read_gguf(path))
    assert built.class_name == "FalconH1ForCausalLM"
    assert {k: built.config[k] for k in ("mamba_d_ssm", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                                         "mamba_rms_norm", "head_dim", "num_key_value_heads",
                                         "embedding_multiplier", "mlp_multipliers")} == {
        "mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_rms_norm": True,
        "head_dim": 16, "num_key_value_heads": 2, "embedding_multiplier": 1.0, "mlp_multipliers": [1.0, 1.0]}
    assert any("every multiplier 1" in n for n in built.notes)
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"], rec["differences"]) == ("FalconH1ForCausalLM", True, [])
    # per layer: norms 128; attention q, o 2 × 4,096, k, v 2 × 2,048; Mamba-2 in 328 × 64, conv 192 × 4 + 192,
    # dt_bias, A, D 3 × 8, gated norm 128, out 64 × 128; FFN 3 × 128 × 64; token_embd and output 2 × 104 × 64,
    # final norm 64
    params = (2 * (128 + 2 * 4_096 + 2 * 2_048 + 328 * 64 + 192 * 4 + 192 + 3 * 8 + 128 + 64 * 128 + 3 * 128 * 64)
              + 2 * VOCAB * H + 64)
    assert rec["file_parameters"] == rec["class_parameters"] == rec["matched_parameters"] == params == 147_952
    assert all(r["file"] == r["class"] for r in rec["roles"].values()), rec["roles"]
    # the one input_layernorm feeds attention and Mamba-2 side by side: the mixer's norm; pre_ff_layernorm as ffn_norm
    assert rec["roles"]["mixer.norm"] == {"file": 2 * 64, "class": 2 * 64} and "attention.norm" not in rec["roles"]
    assert rec["roles"]["mlp.norm"] == {"file": 2 * 64, "class": 2 * 64}
