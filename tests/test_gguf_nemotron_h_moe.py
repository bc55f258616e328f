"""Nemotron-H's MoE GGUF (llama.cpp's nemotron_h_moe: Nemotron-3 Nano 30B-A3B, Super), issue 29 §1 and §3: written
as convert_hf_to_gguf.py's NemotronHModel writes it with is_moe (per-layer KV heads and expert widths, 0 off their
layers; the experts' keys; the routed experts stacked as ffn_up_exps/ffn_down_exps, no gate; the shared expert as
ffn_up_shexp/ffn_down_shexp; the router's score-correction bias as exp_probs_b; Super's latent projections as
ffn_latent_down/up), then built as transformers' one NemotronH class with "moe" layers, held against it tensor by
tensor, and served under llama.cpp: attention layers in the KV cache, Mamba-2 layers as F32 states, MoE layers
keeping nothing (llama-model.cpp: recurrent iff n_head_kv(i) == 0 and n_ff(i) == 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from paramscope.checkpoint.gguf_config import gguf_config  # noqa: E402
from paramscope.checkpoint.gguf_read import read_gguf  # noqa: E402
from paramscope.cli import main  # noqa: E402
from test_gguf_families import VOCAB, H, Q, reconcile, ways, write  # noqa: E402

E, I, S = 4, 32, 64  # routed experts, expert width, shared expert width


def nemotron_h_moe(latent: int | None = None) -> tuple[dict, dict]:
    """Pattern "ME*" (Mamba-2, MoE, attention), each layer's one norm as attn_norm, an untied head."""
    inner, heads, groups, state, conv = 2 * H, 8, 2, 16, 4
    kv = {"context_length": 2**18, "embedding_length": H, "block_count": 3, "feed_forward_length": [0, I, 0],
          "attention.head_count": 4, "attention.head_count_kv": [0, 0, 2], "attention.key_length": 16,
          "attention.value_length": 16, "attention.layer_norm_rms_epsilon": 1e-5, "vocab_size": VOCAB,
          "ssm.conv_kernel": conv, "ssm.state_size": state, "ssm.group_count": groups, "ssm.inner_size": inner,
          "ssm.time_step_rank": heads, "expert_count": E, "expert_used_count": 2, "expert_feed_forward_length": I,
          "expert_shared_feed_forward_length": S, "expert_shared_count": 1, "expert_weights_norm": True,
          "expert_weights_scale": 2.5, "expert_group_count": 1}
    if latent:
        kv["moe_latent_size"] = latent
    channels = inner + 2 * groups * state
    width = latent or H
    tensors = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
               "output.weight": ((VOCAB, H), Q.Q8_0),
               "blk.0.ssm_in.weight": ((inner + channels + heads, H), Q.Q8_0),
               "blk.0.ssm_conv1d.weight": ((channels, conv), Q.F32), "blk.0.ssm_conv1d.bias": ((channels,), Q.F32),
               "blk.0.ssm_dt.bias": ((heads,), Q.F32), "blk.0.ssm_a": ((heads, 1), Q.F32),
               "blk.0.ssm_d": ((heads, 1), Q.F32), "blk.0.ssm_norm.weight": ((groups, inner // groups), Q.F32),
               "blk.0.ssm_out.weight": ((H, inner), Q.Q8_0),
               "blk.1.ffn_gate_inp.weight": ((E, H), Q.F32), "blk.1.exp_probs_b.bias": ((E,), Q.F32),
               "blk.1.ffn_up_exps.weight": ((E, I, width), Q.Q8_0),
               "blk.1.ffn_down_exps.weight": ((E, width, I), Q.Q8_0),
               "blk.1.ffn_up_shexp.weight": ((S, H), Q.Q8_0), "blk.1.ffn_down_shexp.weight": ((H, S), Q.Q8_0),
               "blk.2.attn_q.weight": ((H, H), Q.Q8_0), "blk.2.attn_k.weight": ((32, H), Q.Q8_0),
               "blk.2.attn_v.weight": ((32, H), Q.Q8_0), "blk.2.attn_output.weight": ((H, H), Q.Q8_0)}
    if latent:
        tensors |= {"blk.1.ffn_latent_down.weight": ((latent, H), Q.Q8_0),
                    "blk.1.ffn_latent_up.weight": ((H, latent), Q.Q8_0)}
    tensors |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32) for i in range(3)}
    return kv, tensors


@pytest.mark.parametrize("latent", [None, 32])
def test_a_nemotron_h_moe_file_builds_its_moe_layers_and_reconciles(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    latent: int | None) -> None:
    path = write(tmp_path / "nemotron_h_moe.gguf", "nemotron_h_moe", *nemotron_h_moe(latent))
    built = gguf_config(read_gguf(path))
    assert (built.model_type, built.class_name) == ("nemotron_h", "NemotronHForCausalLM")
    assert {k: built.config.get(k) for k in (
        "layers_block_type", "num_key_value_heads", "n_routed_experts", "num_experts_per_tok",
        "moe_intermediate_size", "moe_shared_expert_intermediate_size", "n_shared_experts", "routed_scaling_factor",
        "norm_topk_prob", "moe_latent_size", "mamba_head_dim", "intermediate_size")} == {
        "layers_block_type": ["mamba", "moe", "attention"], "num_key_value_heads": 2, "n_routed_experts": E,
        "num_experts_per_tok": 2, "moe_intermediate_size": I, "moe_shared_expert_intermediate_size": S,
        "n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "moe_latent_size": latent,
        "mamba_head_dim": 16, "intermediate_size": I}
    rec = reconcile(capsys, path)
    assert (rec["class"], rec["equal"]) == ("NemotronHForCausalLM", True), rec["differences"]
    # the router's score-correction bias is the class's buffer, not a parameter: explained
    assert [(d["kind"], d["name"], d["explained"]) for d in rec["differences"]] == [
        ("file only", "blk.1.exp_probs_b.bias", True)]
    # norms 3 × 64; Mamba-2 layer 0: in 328 × 64, conv 192 × 4 + 192, dt_bias, A, D 3 × 8, gated norm 128, out
    # 64 × 128; MoE layer 1: router 4 × 64, experts 2 × 4 × 32 × width (width: 64, or the latent 32 with its
    # projections 2 × 32 × 64), shared expert 2 × 64 × 64; attention layer 2: q, o 2 × 4,096, k, v 2 × 2,048;
    # token_embd and output 2 × 104 × 64, norm_f 64
    width = latent or H
    moe = E * H + 2 * E * I * width + 2 * S * H + (2 * latent * H if latent else 0)
    params = (3 * 64 + 328 * 64 + 192 * 4 + 192 + 3 * 8 + 128 + 64 * 128 + moe + 2 * 4_096 + 2 * 2_048
              + 2 * VOCAB * H + 64)
    assert rec["class_parameters"] == rec["matched_parameters"] == params == (76_888 if latent else 80_984)
    assert rec["file_parameters"] == params + E  # exp_probs_b
    assert rec["roles"]["moe.experts"] == {"file": 2 * E * I * width, "class": 2 * E * I * width}
    assert rec["roles"]["moe.shared_experts"] == {"file": 2 * S * H, "class": 2 * S * H}
    assert rec["roles"]["moe.router"] == {"file": E * H + E, "class": E * H}
    assert rec["roles"]["mixer.norm"] == {"file": 3 * 64, "class": 3 * 64}
    # Super's latent projections have no role of their own yet on either side (roles.py knows no fc*_latent_proj)
    assert rec["roles"].get("other") == ({"file": 2 * latent * H, "class": 2 * latent * H} if latent else None)
    assert all(r["file"] == r["class"] for k, r in rec["roles"].items() if k != "moe.router"), rec["roles"]
    assert ways(rec)["rows permuted for rope (convert_hf_to_gguf.py), shape kept"] == 2
    up = next(m for m in rec["matches"] if m["parameter"] == "model.layers.1.mixer.experts.up_proj")
    assert (up["gguf"], up["shape"], up["how"]) == (["blk.1.ffn_up_exps.weight"], [E, I, width], "as is")


def test_memory_under_llama_cpp_keeps_nothing_for_the_moe_layers(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """One Mamba-2 state ((4 − 1) × (128 + 2 × 2 × 16) conv + 16 × 128 SSM values, F32) and one attention layer's
    f16 K and V (256 cells × 2 heads × 16), the MoE layer none; every tensor at its file bytes."""
    path = write(tmp_path / "nemotron_h_moe.gguf", "nemotron_h_moe", *nemotron_h_moe())
    assert main(["memory", str(path), "--engine", "llama.cpp", "-c", "256", "--json", "--no-cache"]) == 0
    plan = json.loads(capsys.readouterr().out)["memory"]["llama_cpp"]
    gpu, cpu = plan["devices"]
    assert (gpu["kv"], gpu["recurrent"]) == (256 * (32 + 32) * 2, (3 * 192 + 16 * 128) * 4) == (32_768, 10_496)
    assert {c["kind"]: c["layers"] for c in plan["caches"]} == {"recurrent state": 1, "full attention": 1}
    assert cpu["weights"] == 7_072 and gpu["weights"] + cpu["weights"] == read_gguf(path).nbytes
    # the compute buffer names what it leaves out for the Mamba-2 layer (measured 22% over with flash attention)
    assert "a recurrent layer's own working set (Mamba-2: the in_proj output beside ssm_scan's) is not counted" in \
        plan["compute"]["arithmetic"]


def test_a_nemotron_h_moe_file_whose_experts_differ_in_width_is_one_line(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    kv, tensors = nemotron_h_moe()
    kv["expert_feed_forward_length"] = 64
    path = write(tmp_path / "bad.gguf", "nemotron_h_moe", kv, tensors)
    assert main(["inspect", str(path), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert ("nemotron_h_moe.feed_forward_length's MoE widths [32] are not one expert width "
            "(nemotron_h_moe.expert_feed_forward_length = 64)") in err


def test_the_predicted_q8_0_file_of_the_built_class_is_the_written_file() -> None:
    """The class built from the file's header, predicted as llama-quantize's Q8_0 (config → llama.cpp's
    nemotron_h_moe, since its layers_block_type holds "moe"): the same 24 tensors at the same types and bytes as the
    file, the router's score-correction bias (a buffer of the class) included."""
    import tempfile

    import torch
    import transformers

    from paramscope.api import inspect_module
    from paramscope.cost.memory.llama_cpp_mixture import predict_gguf

    with tempfile.TemporaryDirectory() as tmp:
        ck = read_gguf(write(Path(tmp) / "nemotron_h_moe.gguf", "nemotron_h_moe", *nemotron_h_moe()))
    built = gguf_config(ck)
    config = transformers.AutoConfig.for_model(**built.config)
    with torch.device("meta"):
        report = inspect_module(transformers.AutoModelForCausalLM.from_config(config))
    predicted = predict_gguf(report.params, config.to_dict(), "Q8_0", n_layers=3, buffers=report.buffers)
    assert predicted.arch == "nemotron_h_moe"
    assert sorted((t.name, t.ggml_type, t.nbytes) for t in predicted.tensors) == sorted(
        (t.name, t.ggml_type, t.nbytes) for t in ck.tensors)
    # 3 + Mamba-2 layer 9 + MoE layer 7 + attention layer 5 tensors
    assert (len(ck.tensors), predicted.nbytes, predicted.elements) == (24, ck.nbytes, 80_984 + E) == (24, 90_832,
                                                                                                       80_988)
