"""llama.cpp serving memory (issue 29 §3): the Mamba-2 hybrids llama.cpp runs as granitehybrid (Granite-4, Bamba)
and nemotron_h, their attention layers in the KV cache and their Mamba-2 layers as F32 states of (d_conv − 1) ×
(d_inner + 2 × n_group × d_state) conv and d_state × d_inner SSM values, d_inner as convert_hf_to_gguf.py writes it;
and --tensor-split: layers over several GPUs by llama.cpp's float32 split points. Expected bytes are written out here
from the tensors and shapes each test sets.
"""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main
from paramscope.cost.memory.llama_cpp import LlamaCppOptions, Tensor, llama_cpp_plan, model_facts, placement
from paramscope.errors import UnsupportedError

H, VOCAB = 64, 100


def plan(config, tensors=(Tensor("token_embd.weight", 100),), **options):
    return llama_cpp_plan(tuple(tensors), model_facts(config), LlamaCppOptions(**options), model="m",
                          weights_from="test", budget=None, model_arg="m.gguf")


def test_granite_4_bamba_and_nemotron_h_keep_attention_kv_and_mamba_2_states() -> None:
    """Granite-4 (layers 1 and 3 attention) and Bamba (attn_layer_indices [2]): d_inner = mamba_expand 2 × hidden 64
    = 128, as GraniteHybridModel converts it; conv 3 × (128 + 2 × n_group × 16), ssm 16 × 128. Nemotron-H (M - * M
    E): d_inner = mamba_num_heads 4 × mamba_head_dim 16 = 64, n_groups 2, ssm_state_size 8; its MLP and MoE layers
    keep nothing (llama.cpp's filters: attention when not recurrent and n_ff 0). -ngl 3: the output layer and the
    last two layers on the GPU, the rest on the CPU; 2 sequences of F32 states, 512 cells of f16 K and V."""
    from transformers import BambaConfig, GraniteMoeHybridConfig, NemotronHConfig

    mamba = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2)
    options = dict(n_gpu_layers=3, ctx_size=512, parallel=2, kv_unified=True)
    granite = plan(GraniteMoeHybridConfig(hidden_size=H, intermediate_size=128, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                          layer_types=["mamba", "attention", "mamba", "attention"],
                                          mamba_n_groups=1, vocab_size=VOCAB, **mamba), **options)
    kv = (2 * 16 * 2) * 2 * 512  # (K + V: 2 KV heads × 16 × f16) × 512 cells, one layer
    state = (3 * (128 + 2 * 1 * 16) + 16 * 128) * 4 * 2  # (conv + ssm) × F32 × 2 sequences, one layer
    assert (kv, state) == (65_536, 20_224)
    # GPU: layers 2 (Mamba) and 3 (attention); CPU: layers 0 (Mamba) and 1 (attention)
    assert [(d.device, d.kv, d.recurrent) for d in granite.devices] == [("GPU", kv, state), ("CPU", kv, state)]
    assert granite.n_ctx_from == "--ctx-size" and model_facts(
        GraniteMoeHybridConfig(layer_types=["mamba", "attention"], num_hidden_layers=2)).n_ctx_train == 1 << 20

    bamba = plan(BambaConfig(hidden_size=H, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=2, attn_layer_indices=[2], mamba_n_groups=2, vocab_size=VOCAB,
                             **mamba), **options)
    state = (3 * (128 + 2 * 2 * 16) + 16 * 128) * 4 * 2
    assert state == 20_992
    assert [(d.kv, d.recurrent) for d in bamba.devices] == [(kv, state), (0, 2 * state)]

    nemotron = plan(NemotronHConfig(hidden_size=H, intermediate_size=128, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16,
                                    layers_block_type=["mamba", "mlp", "attention", "mamba", "moe"],
                                    mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=2,
                                    conv_kernel=4, n_routed_experts=4, moe_intermediate_size=32,
                                    moe_shared_expert_intermediate_size=32, num_experts_per_tok=2,
                                    vocab_size=VOCAB), **options)
    state = (3 * (64 + 2 * 2 * 8) + 8 * 64) * 4 * 2
    assert state == 6_400
    # -ngl 3 of 5 layers: layers 3 (Mamba) and 4 (MoE) on the GPU; 0 (Mamba), 1 (MLP) and 2 (attention) on the CPU
    assert [(d.kv, d.recurrent) for d in nemotron.devices] == [(0, state), (kv, state)]
    assert {c.kind: c.layers for c in nemotron.caches} == {"recurrent state": 2, "full attention": 1}


def test_rwkv_4_is_refused_with_the_reason() -> None:
    from transformers import RwkvConfig

    with pytest.raises(UnsupportedError, match="RWKV-4.*llama.cpp runs RWKV-6 and RWKV-7"):
        model_facts(RwkvConfig(hidden_size=H, num_hidden_layers=2, vocab_size=VOCAB))


def test_tensor_split_places_layers_by_float32_split_points() -> None:
    """load_tensors: layer il (the output layer il = n_layer) on the first GPU whose cumulative share exceeds
    float(il − i_gpu_start) / act_gpu_layers. 4 layers, every one offloaded (act 5: 0, .2, .4, .6, .8): -ts 1,1
    puts layers 0–2 on GPU0, layer 3 and the output on GPU1; three even GPUs (no -ts) 0–1, 2–3 and the output.
    -ngl 3 (start 2, act 3): -ts 3,1 leaves GPU1 empty; -ts 1,2 sends layer 3 (1/3, not above the split 1/3) to
    GPU1. -ts 0.1,0.6 over 6 layers: layer 1 goes to GPU1 because 0.1f / 0.7f = 0.142857134 < 1/7 = 0.142857149 in
    float32 (float64 would keep it on GPU0)."""
    assert placement(4, -1, 0, (1, 1), 2).layer_devices == (0, 0, 0, 1, 1)
    assert placement(4, -1, 0, None, 3).layer_devices == (0, 0, 1, 1, 2)
    assert placement(4, 3, 0, (3, 1), 2).layer_devices == (None, None, 0, 0, 0)
    assert placement(4, 3, 0, (1, 2), 2).layer_devices == (None, None, 0, 1, 1)
    assert placement(6, -1, 0, (0.1, 0.6), 2).layer_devices == (0, 1, 1, 1, 1, 1, 1)
    assert placement(4, -1, 0, (0, 0), 2).layer_devices == (0, 0, 0, 1, 1)  # all zero: by free memory (even)


def test_tensor_split_gives_each_gpu_its_weights_kv_and_compute() -> None:
    """-ts 1,1 over 4 Llama layers: GPU0 holds layers 0–2's weights and KV, GPU1 layer 3's and the output layer's
    (output.weight and output_norm); token_embd stays on the CPU. The compute estimate: each GPU computing layers
    has the f32 mask (256 cells × 256 tokens) and a layer's peak (4 heads' scores 256 × 256 × 4 B + 6 × 64 × 256 ×
    4 B); the head's (logits 100 × 256 × 4 B + 64 × 256 × 4 B) is smaller, so both GPUs are equal."""
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=H, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB)
    tensors = [Tensor("token_embd.weight", 1000), Tensor("output.weight", 700), Tensor("output_norm.weight", 3)]
    tensors += [Tensor(f"blk.{i}.attn_q.weight", 10 * (i + 1)) for i in range(4)]
    split = plan(config, tensors, ctx_size=256, gpus=2, tensor_split=(1.0, 1.0))
    kv = (2 * 16 * 2) * 2 * 256  # one layer: (K + V: 2 KV heads × 16 × f16) × 256 cells
    compute = 256 * 256 * 4 + 256 * 256 * 4 * 4 + 6 * H * 256 * 4
    assert compute == 1_703_936
    assert [(d.device, d.weights, d.kv, d.compute) for d in split.devices] == [
        ("GPU0", 10 + 20 + 30, 3 * kv, compute), ("GPU1", 40 + 700 + 3, kv, compute), ("CPU", 1000, 0, H * 256 * 4)]
    assert split.gpu_total == 60 + 3 * kv + compute and split.caches[0].per_gpu == (3 * kv, kv)
    assert any("pipeline parallelism is on" in note for note in split.notes)
    from paramscope.render.llama_cpp import render_llama_cpp_text

    text = render_llama_cpp_text(None, split, None, 0, 200)
    assert "on 2 GPUs (GPU0 layers 0–2; GPU1 layer 3 and the output layer)" in text
    lone = plan(config, tensors, ctx_size=256, n_gpu_layers=3, gpus=2, tensor_split=(3.0, 1.0))
    assert "(GPU0 layers 2–3 and the output layer; GPU1 nothing)" in render_llama_cpp_text(None, lone, None, 0, 200)


@pytest.mark.parametrize("argv, why", [
    (("--tensor-split", "1,x"), "--tensor-split/-ts: invalid value '1,x'"),
    (("-ts", "1,1,1", "--devices", "2"), "--tensor-split has 3 shares for 2 GPUs"),
    (("--devices", "17"), "--devices must be between 1 and 16"),
    (("--tensor-split", "1,1"), "--tensor-split is for --engine llama.cpp"),
])
def test_bad_tensor_splits_are_one_line(capsys: pytest.CaptureFixture[str], argv: tuple, why: str) -> None:
    engine = () if argv == ("--tensor-split", "1,1") else ("--engine", "llama.cpp")
    assert main(["memory", "gpt2", "--dtype", "q8_0", *engine, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and "Traceback" not in err


def rwkv_gguf(path, arch: str = "rwkv7", layers: int = 2, **keys) -> str:
    """An RWKV GGUF header as llama.cpp reads it (a tensor a layer: only their bytes matter here)."""
    import gguf
    import numpy as np

    from gguf_files import Q, add_tensors_and_close

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in ({"context_length": 1 << 20, "embedding_length": H, "block_count": layers,
                        "feed_forward_length": 224, "wkv.head_size": 16} | keys).items():
        if value is not None:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    tensors = {"token_embd.weight": ((VOCAB, H), Q.F16), "output.weight": ((VOCAB, H), Q.F32)}
    tensors |= {f"blk.{i}.time_mix_key.weight": ((H, H), Q.F32) for i in range(layers)}
    add_tensors_and_close(writer, tensors, lambda shape: np.full(shape, 0.5, dtype=np.float32))
    return str(path)


def test_an_rwkv_gguf_is_sized_from_its_header_alone(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """RWKV-7 has no transformers class, and llama.cpp's memory needs only the header: per layer and sequence
    token_shift_count (default 2) × n_embd 64 + n_embd 64 × head size 16 F32 values (llama-hparams.cpp n_embd_r and
    n_embd_s; checked against llama.cpp's RS buffer on an RWKV-6 file, docs/commands.md). -ngl 2: layer 1 and the
    output on the GPU; 3 sequences."""
    path = rwkv_gguf(tmp_path / "r.gguf")
    assert main(["memory", path, "--engine", "llama.cpp", "-ngl", "2", "-np", "3", "-c", "256", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["class"] is None and doc["model"]["model_type"] == "rwkv7"
    plan = doc["memory"]["llama_cpp"]
    one = (2 * 64 + 64 * 16) * 4 * 3
    assert one == 13_824
    assert [(d["device"], d["weights"], d["kv"], d["recurrent"]) for d in plan["devices"]] == [
        ("GPU", H * H * 4 + VOCAB * H * 4, 0, one), ("CPU", VOCAB * H * 2 + H * H * 4, 0, one)]
    # token_shift_count 1 (RWKV6Qwen2 writes it) halves the shift state
    path = rwkv_gguf(tmp_path / "q.gguf", "rwkv6qwen2", token_shift_count=1)
    assert main(["memory", path, "--engine", "llama.cpp", "-c", "256", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["memory"]["llama_cpp"]
    assert plan["devices"][0]["recurrent"] == 2 * (64 + 64 * 16) * 4


def test_an_rwkv_header_without_its_head_size_is_one_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = rwkv_gguf(tmp_path / "r.gguf", **{"wkv.head_size": None})
    assert main(["memory", path, "--engine", "llama.cpp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "it has no rwkv7.wkv.head_size" in err


def test_tensor_split_in_the_json_and_the_command(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 6-layer RWKV-7 GGUF over two GPUs, -ts 1,1: 6 layers and the output (act 7), layers 0–3 below the split 0.5
    (3/7 = 0.43) on GPU0, layers 4 and 5 and the output on GPU1, each layer's state (2 × 64 + 64 × 16) × 4 B there;
    the flags that fit repeat the split."""
    path = rwkv_gguf(tmp_path / "r.gguf", layers=6)
    assert main(["memory", path, "--engine", "llama.cpp", "-ts", "1,1", "-c", "256", "--budget", "1GiB",
                 "--reserve", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["memory"]["llama_cpp"]
    where = doc["placement"]
    assert (where["gpus"], where["layers_per_gpu"], where["output_device"]) == (2, [4, 2], "GPU1")
    assert [(d["device"], d["weights"]) for d in doc["devices"]] == [
        ("GPU0", 4 * H * H * 4), ("GPU1", 2 * H * H * 4 + VOCAB * H * 4), ("CPU", VOCAB * H * 2)]
    assert doc["caches"][0]["gpu_bytes_per_gpu"] == [4 * 4_608, 2 * 4_608]
    assert doc["fit"]["command"].endswith("-ts 1,1") and "-ngl 7" in doc["fit"]["command"]
