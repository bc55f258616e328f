"""Serving memory under llama.cpp (issue 29 §3): `memory MODEL|FILE.gguf --engine llama.cpp` gives the bytes per
device as llama.cpp places them. Weights follow -ngl (the last N layers, the output layer when N > n_layer,
token_embd on the CPU) and --n-cpu-moe (the first N layers' experts on the CPU), at the file's own bytes; the KV
cache is ggml_row_size × cells per layer on its layer's device, sliding-window layers keeping n_swa + n_ubatch cells
padded to 256. Expected bytes are written out here from the tensors each test writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from paramscope.cli import main  # noqa: E402

Q = gguf.GGMLQuantizationType
H, I, HEADS, KV, VOCAB = 64, 128, 4, 2, 100  # noqa: E741 - width, intermediate, heads, KV heads, vocabulary
KV_WIDTH = KV * H // HEADS  # n_embd_k_gqa: 2 KV heads × 16


def nbytes(shape: tuple[int, ...], qtype: Q) -> int:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


def write(path: Path, arch: str, kv: dict, tensors: dict[str, tuple[tuple[int, ...], Q]]) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{arch}.{key}", value)
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    for name, (shape, qtype) in tensors.items():
        data = np.full(shape, 0.5, dtype=np.float32)
        if qtype == Q.Q8_0:
            packed = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, data.astype(np.float16) if qtype == Q.F16 else data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def base_kv(layers: int) -> dict:
    return {"context_length": 4096, "embedding_length": H, "block_count": layers, "feed_forward_length": I,
            "attention.head_count": HEADS, "attention.head_count_kv": KV, "rope.freq_base": 10000.0,
            "attention.layer_norm_rms_epsilon": 1e-5}


def llama(layers: int, *, head: bool = True) -> dict:
    out = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32)}
    if head:
        out["output.weight"] = ((VOCAB, H), Q.F16)
    for i in range(layers):
        out |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.attn_q.weight": ((H, H), Q.Q8_0),
                f"blk.{i}.attn_k.weight": ((KV_WIDTH, H), Q.Q8_0), f"blk.{i}.attn_v.weight": ((KV_WIDTH, H), Q.F16),
                f"blk.{i}.attn_output.weight": ((H, H), Q.Q8_0), f"blk.{i}.ffn_norm.weight": ((H,), Q.F32),
                f"blk.{i}.ffn_gate.weight": ((I, H), Q.Q8_0), f"blk.{i}.ffn_up.weight": ((I, H), Q.Q8_0),
                f"blk.{i}.ffn_down.weight": ((H, I), Q.F16)}
    return out


def qwen2moe(layers: int) -> dict:
    out = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
           "output.weight": ((VOCAB, H), Q.Q8_0)}
    for i in range(layers):
        out |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.attn_q.weight": ((H, H), Q.Q8_0),
                f"blk.{i}.attn_q.bias": ((H,), Q.F32), f"blk.{i}.attn_k.weight": ((32, H), Q.Q8_0),
                f"blk.{i}.attn_k.bias": ((32,), Q.F32), f"blk.{i}.attn_v.weight": ((32, H), Q.Q8_0),
                f"blk.{i}.attn_v.bias": ((32,), Q.F32), f"blk.{i}.attn_output.weight": ((H, H), Q.Q8_0),
                f"blk.{i}.ffn_norm.weight": ((H,), Q.F32), f"blk.{i}.ffn_gate_inp.weight": ((4, H), Q.F32),
                f"blk.{i}.ffn_gate_exps.weight": ((4, 32, H), Q.Q8_0),
                f"blk.{i}.ffn_up_exps.weight": ((4, 32, H), Q.Q8_0),
                f"blk.{i}.ffn_down_exps.weight": ((4, H, 32), Q.Q8_0),
                f"blk.{i}.ffn_gate_inp_shexp.weight": ((1, H), Q.F32),
                f"blk.{i}.ffn_gate_shexp.weight": ((96, H), Q.Q8_0), f"blk.{i}.ffn_up_shexp.weight": ((96, H), Q.Q8_0),
                f"blk.{i}.ffn_down_shexp.weight": ((H, 96), Q.Q8_0)}
    return out


def gemma2(layers: int) -> dict:
    out = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32)}
    for i in range(layers):
        out |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.attn_q.weight": ((128, H), Q.Q8_0),
                f"blk.{i}.attn_k.weight": ((64, H), Q.Q8_0), f"blk.{i}.attn_v.weight": ((64, H), Q.Q8_0),
                f"blk.{i}.attn_output.weight": ((H, 128), Q.Q8_0),
                f"blk.{i}.post_attention_norm.weight": ((H,), Q.F32), f"blk.{i}.ffn_norm.weight": ((H,), Q.F32),
                f"blk.{i}.ffn_gate.weight": ((I, H), Q.Q8_0), f"blk.{i}.ffn_up.weight": ((I, H), Q.Q8_0),
                f"blk.{i}.ffn_down.weight": ((H, I), Q.Q8_0), f"blk.{i}.post_ffw_norm.weight": ((H,), Q.F32)}
    return out


def total(tensors: dict, keep=lambda name: True) -> int:
    return sum(nbytes(shape, qtype) for name, (shape, qtype) in tensors.items() if keep(name))


def layer_of(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("blk.") else None


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["memory", *argv, "--engine", "llama.cpp", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["memory"]["llama_cpp"]


def devices(doc: dict) -> dict[str, dict]:
    return {d["device"]: d for d in doc["devices"]}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llama_cpp")
    moe_kv = base_kv(3) | {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
                           "expert_shared_feed_forward_length": 96}
    gemma_kv = base_kv(2) | {"attention.key_length": 32, "attention.value_length": 32,
                             "attention.sliding_window": 512, "attn_logit_softcapping": 50.0,
                             "final_logit_softcapping": 30.0}
    return {"llama": write(root / "llama.gguf", "llama", base_kv(4) | {"rope.dimension_count": 16}, llama(4)),
            "tied": write(root / "tied.gguf", "llama", base_kv(2) | {"rope.dimension_count": 16},
                          llama(2, head=False)),
            "moe": write(root / "moe.gguf", "qwen2moe", moe_kv, qwen2moe(3)),
            "gemma2": write(root / "gemma2.gguf", "gemma2", gemma_kv, gemma2(2))}


def test_n_gpu_layers_places_the_last_layers_and_their_kv_on_the_gpu(files: dict[str, Path],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """-ngl 3 of 4 layers: the output layer (the first to go in current llama.cpp) and layers 2 and 3 on the GPU,
    token_embd and layers 0 and 1 on the CPU; --ctx-size 300 is padded to 512 cells, f16 K and V rows of 32 values;
    q8_0 K rows are 34 B a block of 32."""
    tensors = llama(4)
    doc = run_json(capsys, str(files["llama"]), "--n-gpu-layers", "3", "--ctx-size", "300")
    on_gpu = total(tensors, lambda n: layer_of(n) in (2, 3) or n.startswith("output"))
    gpu, cpu = devices(doc)["GPU"], devices(doc)["CPU"]
    assert (gpu["weights"], cpu["weights"]) == (on_gpu, total(tensors) - on_gpu)
    assert doc["settings"]["n_ctx"] == 512 and doc["placement"]["output_on_gpu"] is True
    per_layer = (KV_WIDTH * 2 + KV_WIDTH * 2) * 512  # K and V, f16
    assert (gpu["kv"], cpu["kv"]) == (2 * per_layer, 2 * per_layer)
    # -ngl 5 = n_layer + 1: every layer; q8_0 K with flash attention: 32 / 32 blocks × 34 B a row
    doc = run_json(capsys, str(files["llama"]), "-ngl", "5", "-c", "512", "-ctk", "q8_0", "-ctv", "q8_0",
                   "--flash-attn")
    gpu, cpu = devices(doc)["GPU"], devices(doc)["CPU"]
    assert cpu["weights"] == nbytes((VOCAB, H), Q.Q8_0) and gpu["weights"] == total(tensors) - cpu["weights"]
    assert (gpu["kv"], cpu["kv"]) == (4 * (34 + 34) * 512, 0)
    # a tied head: token_embd stays on the CPU and is copied to the GPU as the output (TENSOR_DUPLICATED)
    doc = run_json(capsys, str(files["tied"]), "-ngl", "-1", "-c", "256")
    embd = nbytes((VOCAB, H), Q.Q8_0)
    assert devices(doc)["CPU"]["weights"] == embd
    assert devices(doc)["GPU"]["weights"] == total(llama(2, head=False)) - embd + embd


def test_n_cpu_moe_keeps_the_first_layers_experts_on_the_cpu(files: dict[str, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    tensors = qwen2moe(3)
    doc = run_json(capsys, str(files["moe"]), "-ngl", "-1", "--n-cpu-moe", "2", "-c", "256")
    kept = total(tensors, lambda n: layer_of(n) in (0, 1) and "_exps." in n)
    cpu = nbytes((VOCAB, H), Q.Q8_0) + kept
    assert kept == 2 * 3 * nbytes((4, 32, H), Q.Q8_0)  # gate, up and down experts of layers 0 and 1
    assert (devices(doc)["CPU"]["weights"], devices(doc)["GPU"]["weights"]) == (cpu, total(tensors) - cpu)
    assert doc["placement"]["cpu_moe_layers"] == 2 and doc["placement"]["moe"] is True
    # a budget of exactly that GPU total: every layer offloaded, the fewest expert layers on the CPU is 2
    budget = devices(doc)["GPU"]["total"]
    doc = run_json(capsys, str(files["moe"]), "-c", "256", "--budget", f"{budget}B", "--reserve", "0")
    assert (doc["fit"]["n_gpu_layers"], doc["fit"]["n_cpu_moe"]) == (4, 2)
    assert "-ngl 4 --n-cpu-moe 2 -c 256" in doc["fit"]["command"]


def test_sliding_window_layers_keep_n_swa_plus_ubatch_cells(files: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma 2: layer 0 slides (window 512), layer 1 is full. At -c 4096 the SWA cache keeps GGML_PAD(512 + 512,
    256) = 1,024 cells; --swa-full keeps 4,096. Without flash attention V rows are n_embd_v_gqa (2 heads × 32)."""
    doc = run_json(capsys, str(files["gemma2"]), "-c", "4096")
    caches = {c["kind"]: c for c in doc["caches"]}
    row = 2 * 32 * 2  # 2 KV heads × 32 × f16
    assert caches["sliding window 512"]["cells"] == 1024
    assert caches["sliding window 512"]["bytes"] == 2 * row * 1024
    assert caches["full attention"]["bytes"] == 2 * row * 4096
    assert devices(doc)["GPU"]["kv"] == 2 * row * (1024 + 4096)
    # the compute buffer (an estimate): both caches' f32 masks + the larger of a layer's peak (the scores of 4 heads
    # over 4,096 cells and 6 hidden rows) and the head's (logits and their input), at n_ubatch 512 (checked against
    # llama.cpp's own log in docs/commands.md)
    u = 512
    assert devices(doc)["GPU"]["compute_estimate"] == (1024 + 4096) * u * 4 + max(
        4096 * u * HEADS * 4 + 6 * H * u * 4, VOCAB * u * 4 + H * u * 4)
    doc = run_json(capsys, str(files["gemma2"]), "-c", "4096", "--swa-full", "--ubatch-size", "256")
    assert devices(doc)["GPU"]["kv"] == 2 * row * 4096 * 2


def test_llama_3_8b_q4_k_m_on_a_24_gb_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """The predicted Q4_K_M file at 8,192 tokens: f16 KV 32 layers × 8,192 × 1,024 × 2 B × 2; q8_0 KV rows of
    1,024 values in 32 blocks of 34 B. token_embd (Q4_K) stays on the CPU; everything fits a 24 GB GPU."""
    doc = run_json(capsys, "llama-3-8b", "--dtype", "q4_k_m", "-c", "8192", "--gpu", "4090")
    gpu, cpu = devices(doc)["GPU"], devices(doc)["CPU"]
    assert gpu["kv"] == 32 * 8192 * 1024 * 2 * 2 == 1_073_741_824
    assert cpu["weights"] == 128256 * 4096 // 256 * 144  # token_embd in Q4_K
    assert doc["fit"]["fits"] and doc["fit"]["n_gpu_layers"] == 33 and doc["fit"]["ctx_size"] == 8192
    assert doc["fit"]["command"] == "llama-server -m Meta-Llama-3-8B-Q4_K_M.gguf -ngl 33 -c 8192 -fa off -np 1"
    doc = run_json(capsys, "llama-3-8b", "--dtype", "q4_k_m", "-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0", "-fa")
    assert devices(doc)["GPU"]["kv"] == 32 * 8192 * (1024 // 32 * 34) * 2 == 570_425_344


def test_a_budget_gets_the_most_layers_that_fit(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """auto: the largest -ngl whose GPU total fits; one layer more does not."""
    full = run_json(capsys, str(files["llama"]), "-ngl", "-1", "-c", "256", "--budget", "1GiB", "--reserve", "0")
    budget = full["devices"][0]["total"] - 1  # one byte short of everything on the GPU
    doc = run_json(capsys, str(files["llama"]), "-c", "256", "--budget", f"{budget}B", "--reserve", "0")
    ngl = doc["fit"]["n_gpu_layers"]
    assert 0 < ngl < 5 and doc["fit"]["fits"] and doc["settings"]["n_gpu_layers"] == ngl
    more = run_json(capsys, str(files["llama"]), "-ngl", str(ngl + 1), "-c", "256")
    assert devices(doc)["GPU"]["total"] <= budget < devices(more)["GPU"]["total"]


def test_the_server_line_names_the_file_when_given_its_folder(files: dict[str, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """llama-server -m takes a file: a folder holding one .gguf is answered with that file's path."""
    folder = files["llama"].parent / "folder"
    folder.mkdir(exist_ok=True)
    (folder / files["llama"].name).write_bytes(files["llama"].read_bytes())
    doc = run_json(capsys, str(folder), "-c", "256", "--budget", "1GiB", "--reserve", "0")
    assert doc["fit"]["command"].startswith(f"llama-server -m {folder / files['llama'].name} ")


def test_serve_moves_a_gguf_files_own_bytes(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """`serve FILE.gguf` reads the weights in the file's ggml types, the KV cache in llama.cpp's f16, at the fp16
    peak (it read them at the config's fp32, and a 4090 has no tf32 peak in the table)."""
    assert main(["serve", str(files["llama"]), "--gpu", "4090", "--json", "--no-cache"]) == 0
    serve = json.loads(capsys.readouterr().out)["serve"]
    assert (serve["settings"]["dtype"], serve["settings"]["kv_dtype"], serve["gpu"]["peak_dtype"]) == (
        "gguf-file", "float16", "fp16")
    # at batch 128 every one of the 100 embedding rows is read: the step moves the whole file's tensors
    stored = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(files["llama"])).tensors)
    assert serve["decode"][-1]["batch"] == 128 and serve["decode"][-1]["weight_bytes"] == stored == 216_976


@pytest.mark.parametrize("argv, why", [
    (("-ngl", "-2"), "--n-gpu-layers must be -1"),
    (("--cache-type-k", "q3_k"), "--cache-type-k 'q3_k'"),
    (("-ctv", "q4_0"), "needs --flash-attn"),
    (("--engine", "vllm", "--swa-full"), "--swa-full is for --engine llama.cpp"),
])
def test_bad_flags_are_one_line(files: dict[str, Path], capsys: pytest.CaptureFixture[str], argv: tuple,
                                why: str) -> None:
    assert main(["memory", str(files["tied"]), *(() if "--engine" in argv else ("--engine", "llama.cpp")),
                 *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and "Traceback" not in err


def test_mamba_states_are_f32_rows_per_sequence() -> None:
    """llama_memory_recurrent: per layer (d_conv − 1) × d_inner conv values and d_state × d_inner SSM values
    (Mamba-1: no groups), F32, max(1, --parallel) rows, on the layer's device (-ngl 2: the output layer and the
    last layer)."""
    from transformers import MambaConfig

    from paramscope.cost.memory.llama_cpp import LlamaCppOptions, Tensor, llama_cpp_plan, model_facts

    facts = model_facts(MambaConfig(hidden_size=64, num_hidden_layers=2, intermediate_size=128, state_size=16,
                                    conv_kernel=4, vocab_size=VOCAB))
    tensors = (Tensor("token_embd.weight", 100), Tensor("blk.0.ssm_in.weight", 10), Tensor("blk.1.ssm_in.weight", 10))
    plan = llama_cpp_plan(tensors, facts, LlamaCppOptions(n_gpu_layers=2, parallel=3, ctx_size=256), model="mamba",
                          weights_from="test", budget=None, model_arg="m.gguf")
    one = (3 * 128 + 16 * 128) * 4 * 3
    assert (plan.device("GPU").recurrent, plan.device("CPU").recurrent) == (one, one)
    # the GPU: layer 1 and the tied output's copy of token_embd; the CPU: layer 0 and token_embd
    assert (plan.device("GPU").kv, plan.device("GPU").weights, plan.device("CPU").weights) == (0, 10 + 100, 110)


def test_deepseek_v3_mla_caches_the_latent_as_k_only(capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp's deepseek2: one KV head of kv_lora_rank 512 + qk_rope_head_dim 64 values, V a view of K (no V
    cache): 61 layers × (512 + 64) × 2 B (f16) a token, at -c 4096 (a multiple of 256: no padding)."""
    doc = run_json(capsys, "deepseek-v3", "--dtype", "q4_k_m", "-c", "4096")
    per_token = 61 * (512 + 64) * 2
    assert per_token == 70_272
    assert devices(doc)["GPU"]["kv"] + devices(doc)["CPU"]["kv"] == per_token * 4096 == 287_834_112
    (cache,) = doc["caches"]
    assert cache["layers"] == 61 and "no V" in cache["arithmetic"]
    assert any("has_v = !is_mla" in note for note in doc["notes"])


def test_hybrid_attention_kv_beside_recurrent_states() -> None:
    """llama_memory_hybrid: Jamba's attention layers (1 and 3 of 4) in the KV cache, its Mamba layers (0 and 2) as
    F32 states per sequence: conv (d_conv 4 − 1) × d_inner (expand 2 × 64), ssm d_state 16 × d_inner; Falcon-H1's
    layers hold both; LFM2's short convolution n_embd × (L_cache − 1); Qwen3-Next's gated delta net conv (4 − 1) ×
    (value 2 × 16 + 2 × key 2 × 8), state key dim 8 × value 2 × 16."""
    from transformers import FalconH1Config, JambaConfig, Lfm2Config, Qwen3NextConfig

    from paramscope.cost.memory.llama_cpp import LlamaCppOptions, Tensor, llama_cpp_plan, model_facts

    def plan(config):
        return llama_cpp_plan((Tensor("token_embd.weight", 100),), model_facts(config),
                              LlamaCppOptions(ctx_size=512, parallel=2, kv_unified=True), model="m",
                              weights_from="test", budget=None, model_arg="m.gguf")

    jamba = plan(JambaConfig(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, hidden_size=64,
                             num_attention_heads=4, num_key_value_heads=2, mamba_d_state=16, mamba_d_conv=4,
                             mamba_expand=2, vocab_size=VOCAB))
    kv = 2 * (2 * 16 * 2 + 2 * 16 * 2) * 512  # 2 layers × (K + V: 2 KV heads × 16 × f16) × 512 cells
    states = 2 * (3 * 128 + 16 * 128) * 4 * 2  # 2 layers × (conv + ssm) × F32 × 2 sequences
    assert (jamba.device("GPU").kv, jamba.device("GPU").recurrent) == (kv, states) == (131_072, 38_912)
    falcon = plan(FalconH1Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=16, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
                                 mamba_d_state=16, mamba_d_conv=4, vocab_size=VOCAB))
    assert (falcon.device("GPU").kv, falcon.device("GPU").recurrent) == (
        2 * (2 * 16 * 2) * 2 * 512, 2 * (3 * (128 + 2 * 16) + 16 * 128) * 4 * 2)
    lfm2 = plan(Lfm2Config(num_hidden_layers=3, full_attn_idxs=[1], hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2, conv_L_cache=3, vocab_size=VOCAB))
    assert (lfm2.device("GPU").kv, lfm2.device("GPU").recurrent) == (
        (2 * 16 * 2) * 2 * 512, 2 * (64 * 2) * 4 * 2)
    qwen = plan(Qwen3NextConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
                                linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
                                vocab_size=VOCAB))
    assert (qwen.device("GPU").kv, qwen.device("GPU").recurrent) == (
        (2 * 16 * 2) * 2 * 512, 3 * (3 * (2 * 16 + 2 * 2 * 8) + 8 * 2 * 16) * 4 * 2)


def mamba(layers: int, inner: int = 128, state: int = 16, conv: int = 4, rank: int = 4) -> dict:
    """A Mamba GGUF's tensors as convert_hf_to_gguf.py writes them: ssm_a (−exp(A_log)) and ssm_d bare, with no
    .weight suffix; conv1d squeezed to [d_inner, d_conv]; the head tied (no output.weight)."""
    out = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32)}
    for i in range(layers):
        out |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.ssm_in.weight": ((2 * inner, H), Q.Q8_0),
                f"blk.{i}.ssm_conv1d.weight": ((inner, conv), Q.F32), f"blk.{i}.ssm_conv1d.bias": ((inner,), Q.F32),
                f"blk.{i}.ssm_x.weight": ((rank + 2 * state, inner), Q.Q8_0),
                f"blk.{i}.ssm_dt.weight": ((inner, rank), Q.F32), f"blk.{i}.ssm_dt.bias": ((inner,), Q.F32),
                f"blk.{i}.ssm_a": ((inner, state), Q.F32), f"blk.{i}.ssm_d": ((inner,), Q.F32),
                f"blk.{i}.ssm_out.weight": ((H, inner), Q.F16)}
    return out


def test_a_mamba_gguf_prices_to_its_own_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`memory FILE.gguf` on a Mamba file: every parameter of the class (A_log and D included) is the file's tensor,
    so the weights are the sum of the header's tensor bytes (112,592 B: per layer 256 + 17,408 + 2,048 + 512 +
    4,896 + 2,048 + 512 + 8,192 + 512 + 16,384, plus token_embd 6,800 and output_norm 256); under llama.cpp each
    layer keeps (conv 3 × 128 + ssm 16 × 128) F32 values a sequence."""
    # a 32-token training context: the memory report traces Mamba's sequential scan over it, a token a step
    kv = {"context_length": 32, "embedding_length": H, "block_count": 2, "ssm.conv_kernel": 4,
          "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.time_step_rank": 4,
          "attention.layer_norm_rms_epsilon": 1e-5}
    path = write(tmp_path / "mamba.gguf", "mamba", kv, mamba(2))
    on_disk = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)
    assert on_disk == total(mamba(2)) == 112_592
    # one run prices both: the memory report's weights (the file format, parameter by parameter) and llama.cpp's
    assert main(["memory", str(path), "--engine", "llama.cpp", "-c", "256", "-np", "2", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    weights, doc = memory["weights"], memory["llama_cpp"]
    assert weights["format"] == "gguf-file" and weights["bytes"] == on_disk
    assert weights["by_role"]["ssm.state"] == 2 * (128 * 16 * 4 + 128 * 4)  # A_log as ssm_a, D as ssm_d
    assert devices(doc)["GPU"]["recurrent"] == 2 * (3 * 128 + 16 * 128) * 4 * 2
    assert devices(doc)["GPU"]["weights"] + devices(doc)["CPU"]["weights"] == on_disk + nbytes((VOCAB, H), Q.Q8_0)
