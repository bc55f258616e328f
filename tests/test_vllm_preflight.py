"""vLLM pre-flight (issue 29 §6): `memory MODEL --engine vllm` gives what vLLM computes at launch.

The arithmetic is written out by hand and must be equal to the byte: vLLM's budget (⌈total × utilization⌉ −
weights − the named estimates), the page of one layer (block_size × bytes per token and layer, from the project's
KV engine), blocks = available // (page × layers a pool), the blocks one request of max_model_len needs, the
concurrency vLLM logs, the largest max_model_len that fits, and the `vllm serve` line.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from paramscope.cli import main
from paramscope.cost.memory.vllm import (CUDA_GRAPH_ALLOWANCE, NON_TORCH_ALLOWANCE, vllm_blocks, vllm_grouping,
                                          vllm_layer_kinds, vllm_pages, vllm_pp_partition)
from paramscope.cost.memory.vllm_kv_blocks import worker_group_size
from paramscope.cost.memory.vllm_layers import encoder_shape
from paramscope.cost.memory.vllm_reserve import fused_experts_at, profile_activation

GiB = 2**30


def _vllm(capsys, *argv: str) -> dict:
    assert main(["memory", *argv, "--engine", "vllm", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["memory"]["vllm"]


def test_llama_3_8b_bf16_on_an_h100(capsys):
    v = _vllm(capsys, "llama-3-8b", "--gpu", "h100", "--gpu-memory-utilization", "0.9", "--max-model-len", "8192")
    # 8,030,261,248 parameters × 2 B, and transformers' rotary inv_freq (64 × fp32 = 256 B… twice: 512 B)
    assert v["weights_bytes"] == 8_030_261_248 * 2 + 512 == 16_060_523_008
    assert v["total_bytes"] == 80 * GiB and v["requested_bytes"] == math.ceil(80 * GiB * 0.9) == 77_309_411_328
    # the profile run's estimate at vllm serve's H100 defaults (8,192 tokens, 1,024 requests): the sampler's moment
    assert (v["max_num_batched_tokens"], v["max_num_seqs"]) == (8192, 1024)
    assert v["activation"]["bytes"] == 8192 * 4096 * 2 + 1024 * 128_256 * (2 + 12) == 1_905_786_880
    assert v["activation"]["estimate"] and v["non_torch"]["bytes"] == NON_TORCH_ALLOWANCE
    # vLLM (v0.21.0 on) subtracts its CUDA-graph estimate from the budget too: an allowance here
    assert v["cuda_graphs"]["bytes"] == CUDA_GRAPH_ALLOWANCE == 512 * 2**20
    available = math.ceil(80 * GiB * 0.9) - (16_060_523_008 + 1_905_786_880 + NON_TORCH_ALLOWANCE) - CUDA_GRAPH_ALLOWANCE
    assert v["available_bytes"] == available == 58_537_795_072
    # one block over all layers: 32 layers × 2 (K and V) × 8 KV heads × 128 × 2 B × 16 tokens
    assert v["page_bytes"] == 2 * 8 * 128 * 2 * 16 == 65_536
    assert v["bytes_per_block"] == 32 * 2 * 8 * 128 * 2 * 16 == 2_097_152
    assert v["groups"] == [{"kind": "full attention", "spec": "FullAttentionSpec", "layers": 32, "groups": 1,
                            "bytes_per_token": 4096, "arithmetic": "2 × 8 kv heads × 128 × 2 B",
                            "page_bytes": 65_536, "window": None, "blocks_per_request": 512,
                            "blocks_arithmetic": "cdiv(8,192, 16) = 512", "encoder_tokens": None}]
    assert v["blocks"] == available // 2_097_152 == 27_912
    assert v["blocks_per_request"] == 8192 // 16 == 512
    assert v["max_concurrency"] == 27_912 / 512 == 54.515625
    assert v["kv_tokens"] == 27_912 * 16 == 446_592
    assert v["largest_max_model_len"] == 8192 and v["fits"] and v["why"] is None
    assert v["command"] == ("vllm serve meta-llama/Meta-Llama-3-8B --gpu-memory-utilization 0.9 "
                            "--max-model-len 8192")
    assert v["headroom_bytes"] == 80 * GiB - 77_309_411_328
    assert v["headroom_needs_bytes"] == GiB  # the CUDA context (--reserve): the graphs are inside the budget now
    assert v["follows"].startswith("vLLM v0.27.1's defaults")


def test_text_states_the_figures_and_the_estimates(capsys):
    assert main(["memory", "llama-3-8b", "--engine", "vllm", "--gpu", "h100", "--max-model-len", "8192",
                 "--width", "120"]) == 0
    out = capsys.readouterr().out
    # vLLM's default utilization 0.92: ⌈80 GiB × 0.92⌉ (request_memory) − weights, activation, non-torch, CUDA graphs
    assert math.ceil(80 * GiB * 0.92) - (16_060_523_008 + 1_905_786_880 + NON_TORCH_ALLOWANCE) \
        - CUDA_GRAPH_ALLOWANCE == 60_255_781_991
    assert "KV blocks: 60,255,781,991 // 2,097,152 = 28,732" in out
    assert "Maximum concurrency for 8,192 tokens per request: 56.12x" in out
    assert "estimate: vLLM measures torch's peak allocation over its profile run" in out
    assert "not reproducible from the config, so an allowance" in out
    assert "follows: vLLM v0.27.1's defaults" in out
    assert "vllm serve meta-llama/Meta-Llama-3-8B --gpu-memory-utilization 0.92 --max-model-len 8192" in out


def test_gemma_2_sliding_and_full_layers_in_vllm_groups(capsys):
    """Gemma-2-9B: 21 sliding (4,096) and 21 full layers alternate; vLLM's hybrid allocator keeps two groups of 21
    sharing 21 pools. Its float32 config is served in bfloat16 (vLLM's --dtype auto)."""
    v = _vllm(capsys, "gemma-2-9b", "--gpu", "h100", "--max-num-batched-tokens", "512", "--max-num-seqs", "256")
    page = 16 * 2 * 8 * 256 * 2  # 16 tokens × K and V × 8 KV heads × 256 × bf16
    assert v["page_bytes"] == page == 131_072 and v["group_size"] == 21
    assert v["bytes_per_block"] == 21 * page
    sliding, full = v["groups"]
    assert (sliding["kind"], sliding["spec"], sliding["layers"], sliding["window"]) == (
        "sliding window 4,096", "SlidingWindowSpec", 21, 4096)
    # the window's last 4,095 tokens plus a chunk of 512 scheduled ones, one block more for a window mid-block
    assert sliding["blocks_per_request"] == -(-(4095 + 512) // 16) + 1 == 289
    assert (full["kind"], full["blocks_per_request"]) == ("full attention", 8192 // 16)
    assert v["blocks_per_request"] == 289 + 512
    assert v["blocks"] == v["available_bytes"] // (21 * page)
    assert v["max_concurrency"] == v["blocks"] / 801
    assert "--dtype bfloat16" in v["command"]
    assert any("float32" in note for note in v["notes"])


def test_a_sliding_window_without_layer_types_is_full_attention_in_vllm():
    """Mistral-7B-v0.1's shape: sliding_window set, no layer_types. vLLM's llama.py gives a layer a window only
    where layer_types says so: every layer is full attention (transformers' cache slides them)."""
    config = SimpleNamespace(model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, head_dim=128, sliding_window=4096)  # MistralConfig's fields
    kinds, per_layer, arithmetic, notes, mamba = vllm_layer_kinds(config, "bfloat16", 1)
    assert kinds == [("full attention", None, 32)]
    assert per_layer == 2 * 8 * 128 * 2 and arithmetic == "2 × 8 kv heads × 128 × 2 B"
    assert any("no layer_types" in note for note in notes) and mamba is None
    config.layer_types = ["sliding_attention", "full_attention"] * 16  # as Gemma-2 declares them
    kinds, _, _, notes, _ = vllm_layer_kinds(config, "float8_e4m3fn", 2)
    assert kinds == [("sliding window 4,096", 4096, 16), ("full attention", None, 16)] and not notes


def test_hybrid_grouping_follows_vllm():
    """_get_kv_cache_groups_uniform_page_size: the smallest kind's count is the group size (Gemma-3's 5:1), unless
    the largest is under 1.5× it (gpt-oss-20b + eagle: 12 and 13 → 13)."""
    assert vllm_grouping([("sliding window 1,024", 1024, 50), ("full attention", None, 10)]) == (
        10, [("sliding window 1,024", 1024, 50, 5), ("full attention", None, 10, 1)])
    assert vllm_grouping([("sliding window 128", 128, 12), ("full attention", None, 13)]) == (
        13, [("sliding window 128", 128, 12, 1), ("full attention", None, 13, 1)])


def test_qwen3_next_gated_delta_net_and_attention_share_vllm_pages():
    """Qwen3-Next-80B-A3B's shape: 36 gated-delta-net layers and 12 full-attention layers (2 KV heads of 256).
    vLLM's state: conv (2 × 16 × 128 + 32 × 128) × (4 − 1) columns + 32 heads × 128 × 128, in bf16; the
    attention block rises to 16 × cdiv(state, 16 × 2,048 B) tokens so a page holds a state, which is padded to it."""
    config = SimpleNamespace(
        model_type="qwen3_next", hidden_size=2048, num_hidden_layers=48, num_attention_heads=16,
        num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 12)
    kinds, per_layer, _, _, mamba = vllm_layer_kinds(config, "bfloat16", 1, "bfloat16")
    assert kinds == [("mamba state", None, 36), ("full attention", None, 12)]
    state = (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 2
    assert per_layer == 2 * 2 * 256 * 2 == 2048 and mamba[0] == state == 1_097_728
    block, page, notes = vllm_pages(per_layer, mamba, 16, 262_144)
    assert block == 16 * -(-state // (16 * 2048)) == 544 and page == 544 * 2048 == 1_114_112
    assert any("attention block size to 544" in n for n in notes) and any("padded" in n for n in notes)
    size, groups = vllm_grouping(kinds)
    assert size == 12 and groups == [("mamba state", None, 36, 3), ("full attention", None, 12, 1)]
    # one request of 262,144 tokens: a block for each Mamba group's state, and the attention's blocks
    need = sum(n * vllm_blocks(k, w, block, 262_144, 8192) for k, w, _, n in groups)
    assert need == 3 + -(-262_144 // 544)
    _, _, _, _, at_tp4 = vllm_layer_kinds(config, "bfloat16", 4, "bfloat16")
    assert at_tp4[0] == state // 4  # conv channels and value heads split over the ranks


def test_deepseek_v3_mla_on_tp_8(capsys):
    """MLA keeps its latent and rope key, (512 + 64) × 2 B a token and layer, whole on every rank: 61 layers."""
    v = _vllm(capsys, "deepseek-v3", "--gpu", "h200", "--tp", "8", "--max-model-len", "8192")
    assert v["groups"][0]["spec"] == "MLAAttentionSpec" and v["groups"][0]["layers"] == 61
    assert v["page_bytes"] == 16 * (512 + 64) * 2 == 18_432
    assert v["bytes_per_block"] == 61 * 18_432 == 1_124_352
    assert v["tp"] == 8 and v["fits"]
    assert v["available_bytes"] == math.ceil(141 * GiB * 0.92) - (v["weights_bytes"] + v["activation"]["bytes"]
                                                                  + NON_TORCH_ALLOWANCE) - CUDA_GRAPH_ALLOWANCE
    assert v["blocks"] == v["available_bytes"] // 1_124_352
    assert v["blocks_per_request"] == 512 and v["max_concurrency"] == v["blocks"] / 512
    assert "--tensor-parallel-size 8" in v["command"]


def test_deepseek_v3_on_8_h100s_does_not_fit_and_says_the_smallest_tp(capsys):
    v = _vllm(capsys, "deepseek-v3", "--gpu", "h100", "--tp", "8", "--max-model-len", "8192")
    assert not v["fits"] and v["available_bytes"] < 0 and v["blocks"] == 0
    assert v["why"].startswith("no memory for the KV cache: the non-KV reserve")
    assert v["weights_bytes"] > int(80 * GiB * 0.92)  # the fp8 shards alone exceed the budget
    assert v["smallest_tp"] == 16 and v["tried"][-1]["fits"]
    assert "--tensor-parallel-size 16" in v["command"]
    assert v["command_changes"] == "--tensor-parallel-size 8 → 16 (at --max-model-len 8,192)"


def test_a_context_too_long_gives_the_largest_max_model_len(capsys):
    """Llama-3.1-8B's 131,072 tokens on a 24 GiB card: the blocks hold fewer; the largest length is the one whose
    blocks fit, as vLLM's binary search finds it."""
    v = _vllm(capsys, "llama-3.1-8b", "--gpu", "4090")
    assert (v["max_num_batched_tokens"], v["max_num_seqs"]) == (2048, 256)  # under 70 GiB: the smaller defaults
    assert v["max_model_len"] == 131_072 and not v["fits"]
    per_block = 2_097_152
    assert v["why"].startswith(f"one sequence of 131,072 tokens needs 8,192 blocks × {per_block:,} B")
    largest = v["largest_max_model_len"]
    assert -(-largest // 16) * per_block <= v["available_bytes"] < -(-(largest + 1) // 16) * per_block
    assert largest == v["available_bytes"] // per_block * 16
    assert v["command"].endswith(f"--max-model-len {largest}")
    assert v["smallest_tp"] == 2  # the other way: two GPUs hold the whole context
    assert v["command_changes"] == f"--max-model-len 131,072 → {largest:,}, the largest that fits; or " \
        "--tensor-parallel-size 2 at 131,072"


@pytest.mark.parametrize("argv, message", [
    (["--engine", "vllm", "--gpu", "h100", "--gpu-memory-utilization", "1.5"],
     "--gpu-memory-utilization must be a fraction in (0, 1], got 1.5"),
    (["--gpu", "h100", "--max-model-len", "4096"], "--max-model-len is for --engine vllm"),
    (["--engine", "vllm"], "--engine vllm needs one of --gpu NAME or --budget SIZE"),
    (["--engine", "vllm", "--gpu", "h100", "--block-size", "24"], "--block-size must be one of"),
    (["--engine", "vllm", "--gpu", "h100", "--kv-dtype", "int8"], "--kv-dtype int8: vLLM's --kv-cache-dtype takes"),
    (["--engine", "vllm", "--gpu", "h100", "--kv-dtype", "fp16"], "--kv-dtype float16 is no KV cache dtype of vLLM's"),
    (["--engine", "vllm", "--gpu", "h100", "--max-model-len", "100000"],
     "--max-model-len 100,000 is beyond the model's max_position_embeddings 8,192"),
    (["--engine", "vllm", "--gpu", "h100", "--dtype", "q4_k_m"],  # it read as a --kv-dtype float16 of its own
     "vLLM's pre-flight on a GGUF model (a .gguf file or a llama.cpp mixture --dtype) is not modelled"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert main(["memory", "llama-3-8b", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err



def test_llama_3_70b_on_h100s_at_tp_4_pp_2(capsys):
    """Two stages of 40 layers (get_pp_indices), four GPUs each. Each worker budgets its own memory; vLLM gives every
    worker the smallest block count: stage 1's, which holds the head and runs the sampler."""
    v = _vllm(capsys, "llama-3-70b", "--gpu", "h100", "--tp", "4", "--pp", "2", "--gpu-memory-utilization", "0.9",
              "--max-model-len", "8192")
    # a layer's shards at tp 4: (q, o 8,192² + k, v 8,192 × 1,024 + gate, up, down 8,192 × 28,672) / 4 + two norms
    layer = (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28_672) // 4 + 2 * 8192
    vocab_shard = 128_256 * 8192 // 4  # the embedding on stage 0, the untied head on stage 1
    first, last = v["stages"]
    assert (first["first_layer"], first["last_layer"], last["first_layer"], last["last_layer"]) == (0, 39, 40, 79)
    assert first["weights_bytes"] == (40 * layer + vocab_shard) * 2 + 512 == 17_639_408_128  # + rotary buffers
    assert last["weights_bytes"] == (40 * layer + vocab_shard + 8192) * 2 + 512 == 17_639_424_512  # + final norm
    # stage 0 runs no sampler: the MLP's moment; stage 1 the sampler, plus the intermediate tensors it receives
    assert first["activation"]["bytes"] == 8192 * (2 * 8192 + 3 * 28_672 // 4) * 2 == 620_756_992
    assert last["activation"]["bytes"] == 8192 * 8192 * 2 + 1024 * 128_256 * 14 + 2 * 8192 * 8192 * 2
    per_block = 16 * 2 * (8 // 4) * 128 * 2 * 40  # a worker's 40 layers, 2 KV heads a rank
    for stage in (first, last):
        assert stage["available_bytes"] == math.ceil(80 * GiB * 0.9) - stage["weights_bytes"] \
            - stage["activation"]["bytes"] - NON_TORCH_ALLOWANCE - CUDA_GRAPH_ALLOWANCE
        assert stage["pool_layers"] == 40 and stage["bytes_per_block"] == per_block == 655_360
        assert stage["blocks"] == stage["available_bytes"] // per_block
    assert (first["blocks"], last["blocks"]) == (88_873, 86_400)
    assert v["blocks"] == 86_400 and v["limiting_stage"] == 1 and v["pp"] == 2
    assert v["available_bytes"] == last["available_bytes"] == 56_623_349_248
    assert v["blocks_per_request"] == 512 and v["max_concurrency"] == 86_400 / 512 == 168.75
    assert v["kv_tokens"] == 86_400 * 16 and v["largest_max_model_len"] == 8192 and v["fits"]
    assert v["command"] == ("vllm serve meta-llama/Meta-Llama-3-70B --tensor-parallel-size 4 "
                            "--pipeline-parallel-size 2 --gpu-memory-utilization 0.9 --max-model-len 8192")


def test_vllm_pp_partition_gives_the_remainder_to_the_stages_before_the_last():
    assert vllm_pp_partition(80, 2) == (40, 40)
    assert vllm_pp_partition(80, 3) == (27, 27, 26)
    assert vllm_pp_partition(61, 4) == (15, 15, 16, 15)
    assert vllm_pp_partition(32, 5) == (6, 6, 7, 7, 6)
    assert vllm_pp_partition(32, 2, (20, 12)) == (20, 12)


def test_a_stage_pools_its_largest_share_of_a_global_group():
    """Gemma-3's 5 sliding : 1 full over 48 layers, group size 8: five sliding groups of layers[i::5] and one full
    group. On the first of two stages each group keeps 4 of its 8 layers: 4 layers a pool."""
    keys = [[("sliding window 1,024", 1024)] if i % 6 != 5 else [("full attention", None)] for i in range(48)]
    assert vllm_grouping([("sliding window 1,024", 1024, 40), ("full attention", None, 8)])[0] == 8
    assert worker_group_size(keys, 8, 0, 24) == worker_group_size(keys, 8, 24, 48) == 4
    # Gemma-2's alternation, 42 layers over two stages of 21: 11 sliding and 10 full on the first, 11 a pool
    keys = [[("sliding window 4,096", 4096)] if i % 2 == 0 else [("full attention", None)] for i in range(42)]
    assert worker_group_size(keys, 21, 0, 21) == 11 and worker_group_size(keys, 21, 21, 42) == 11
    assert worker_group_size(keys, 21, 0, 42) == 21


def test_a_layer_partition_is_vllms_environment_variable(capsys):
    v = _vllm(capsys, "llama-3-8b", "--budget", "40GiB", "--pp", "2", "--pp-layer-partition", "20,12",
              "--max-model-len", "8192")
    assert [(s["first_layer"], s["last_layer"], s["pool_layers"]) for s in v["stages"]] == [(0, 19, 20), (20, 31, 12)]
    assert v["limiting_stage"] == 0 and v["blocks"] == v["stages"][0]["available_bytes"] // (20 * 65_536)
    assert v["command"].startswith("VLLM_PP_LAYER_PARTITION=20,12 vllm serve meta-llama/Meta-Llama-3-8B "
                                   "--pipeline-parallel-size 2")


def test_text_names_each_stage_and_the_fewest_blocks(capsys):
    assert main(["memory", "llama-3-8b", "--engine", "vllm", "--budget", "40GiB", "--pp", "2", "--max-model-len",
                 "8192", "--width", "140"]) == 0
    out = capsys.readouterr().out
    assert "Memory vLLM budgets on one GPU of stage 1, the stage with the fewest blocks" in out
    assert "0–15 (16)" in out and "16–31 (16)" in out and "← the fewest blocks, which every worker gets" in out
    assert "pipeline stages: 32 layers, 16 a stage (vLLM's get_pp_indices)" in out


def test_whisper_cross_attention_holds_the_encoder_length():
    """whisper-large-v3's shapes: each decoder layer a self-attention FullAttentionSpec and a CrossAttentionSpec of
    the same page (20 KV heads of 64 in fp16); two groups of 32 share 32 pools; a request holds cdiv(448, 16)
    self-attention blocks at max_model_len and cdiv(1,500, 16) cross-attention blocks, whatever its length."""
    config = SimpleNamespace(  # WhisperConfig's fields (transformers' import is seconds; its attributes are these)
        model_type="whisper", is_encoder_decoder=True, d_model=1280, hidden_size=1280, encoder_layers=32,
        decoder_layers=32, num_hidden_layers=32, encoder_attention_heads=20, decoder_attention_heads=20,
        num_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120, vocab_size=51866,
        max_source_positions=1500, max_target_positions=448)
    kinds, per_layer, arithmetic, _, mamba = vllm_layer_kinds(config, "float16", 1, "float16")
    assert kinds == [("full attention", None, 32), ("cross-attention", 1500, 32)] and mamba is None
    assert per_layer == 2 * 20 * 64 * 2 == 5120
    block, page, _ = vllm_pages(per_layer, None, 16, 448)
    assert page == 16 * 5120 == 81_920
    size, groups = vllm_grouping(kinds)
    assert size == 32 and groups == [("full attention", None, 32, 1), ("cross-attention", 1500, 32, 1)]
    need = [vllm_blocks(kind, window, block, 448, 8192) for kind, window, _, _ in groups]
    assert need == [448 // 16, -(-1500 // 16)] == [28, 94]
    assert vllm_blocks("cross-attention", 1500, 16, 1, 8192) == 94  # whatever the request's length
    # at tp 4 each rank keeps 5 heads of both
    assert vllm_layer_kinds(config, "float16", 4, "float16")[1] == 5120 // 4
    # the profile run's encoder moment: one item of 1,500 tokens (the encoder budget is the encoder length)
    encoder = encoder_shape(config)
    assert encoder[0] == 1500
    moment = profile_activation(config, "float16", 512, 1, 1, encoder=encoder)
    assert moment.bytes == 1500 * (3 * 1280 + 2 * 5120) * 2 == 42_240_000 and moment.arithmetic.startswith("encoder")


def test_a_moe_layer_holds_vllms_fused_experts_workspace_beside_every_moment():
    """Mixtral-8x7B's shapes at tp 2, 8,192 tokens: TritonExperts' workspace (fused_moe.py workspace_shapes, one
    WorkspaceManager request, each tensor rounded up to 256 B) at the expert width 14,336 / 2, held beside the
    largest moment (the sampler's here); the MoE layer's own tensors beside the workspace by hand."""
    config = SimpleNamespace(model_type="mixtral", hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                             intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000)
    params = [SimpleNamespace(name=f"model.layers.0.block_sparse_moe.experts.0.{n}.weight", role="moe.experts",
                              shape=shape) for n, shape in (("w1", (14336, 4096)), ("w2", (4096, 14336)),
                                                            ("w3", (14336, 4096)))]
    experts = fused_experts_at(params, config, "bfloat16")(2)
    assert (experts.width, experts.gated) == (7168, True)
    workspace = 8192 * 2 * max(7168, 4096) * 2 + 8192 * 2 * max(2 * 7168, 4096) * 2
    assert workspace == 704_643_072
    sampler = 8192 * 4096 * 2 + 1024 * 32_000 * (2 + 12)
    moment = profile_activation(config, "bfloat16", 8192, 1024, 2, experts=experts)
    assert moment.bytes == sampler + workspace == 1_230_503_936
    assert "fused experts' workspace 704,643,072 B" in moment.arithmetic and "WorkspaceManager" in moment.source
    # without the sampler (a pipeline stage before the last) the MLP's moment is the largest; a stage holding no
    # routed experts holds no workspace
    mlp = 8192 * (2 * 4096 + 3 * 14336 // 2) * 2
    assert profile_activation(config, "bfloat16", 8192, 1024, 2, last=False, experts=experts).bytes == mlp + workspace
    assert profile_activation(config, "bfloat16", 8192, 1024, 2, last=False).bytes == mlp == 486_539_264
    # the MoE layer's own tensors: residual, normed input and the output (zeros_like), the router's logits, fp32
    # top-k weights and int32 ids, moe_align_block_size's sorted ids (t·k + E·63) and expert ids at BLOCK_SIZE_M 64
    padded = 8192 * 2 + 8 * 63
    own = 8192 * 3 * 4096 * 2 + 8192 * 8 * 2 + 8192 * 2 * 8 + 4 * (padded + -(-padded // 64) + 1)
    tiny = SimpleNamespace(**{**vars(config), "intermediate_size": 64, "head_dim": 8})  # narrow attention and MLP
    moe = profile_activation(tiny, "bfloat16", 8192, 1024, 2, last=False, experts=experts)
    assert moe.bytes == own + workspace == 201_657_348 + 704_643_072 and moe.arithmetic.startswith("MoE layer")


@pytest.mark.parametrize("model, argv, message", [
    ("t5-small", ["--gpu", "h100"], "t5 is an encoder-decoder vLLM's V1 engine does not serve"),
    ("llama-3-8b", ["--gpu", "h100", "--pp", "2", "--pp-layer-partition", "20,11"],
     "--pp-layer-partition 20,11 must give 2 stages' layers summing to the model's 32"),
    ("llama-3-8b", ["--gpu", "h100", "--pp-layer-partition", "16,16"], "--pp-layer-partition is for --pp"),
    ("llama-3-8b", ["--gpu", "h100", "--pp", "2", "--pp-layer-partition", "a,b"],
     "--pp-layer-partition must be layer counts"),
    ("llama-3-8b", ["--gpu", "h100", "--pp", "33"], "--pp 33 is more than the model's 32 layers"),
])
def test_pp_and_encoder_decoder_refusals_are_one_line(capsys, model, argv, message):
    assert main(["memory", model, "--engine", "vllm", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_the_stages_table_and_the_command_stay_whole_at_the_default_width(capsys):
    """No exact figure split across lines, and a long `vllm serve` line continued for the shell, not wrapped."""
    assert main(["memory", "llama-3-70b", "--engine", "vllm", "--gpu", "h100", "--tp", "4", "--pp", "2",
                 "--max-model-len", "8192", "--width", "100"]) == 0
    out = capsys.readouterr().out
    assert "17,639,408,128" in out and "59,961,926,759" in out and "89,021 ←" in out
    assert ("    vllm serve meta-llama/Meta-Llama-3-70B --tensor-parallel-size 4 --pipeline-parallel-size 2 \\\n"
            "        --gpu-memory-utilization 0.92 --max-model-len 8192\n") in out


def test_the_budget_rows_add_up_to_the_byte_when_short(capsys):
    """vLLM's request_memory rounds ⌈total × utilization⌉ up, then subtracts integers: a negative KV budget is the
    printed rows' exact difference (a float truncated by int() came out 1 B above it)."""
    v = _vllm(capsys, "deepseek-v3", "--gpu", "h100", "--tp", "8", "--max-model-len", "16384")
    assert v["requested_bytes"] == math.ceil(80 * GiB * 0.92) == 79_027_398_247
    # the sampler's moment, 1,970,798,592 B, with vLLM's fused experts' workspace held beside it (8,192 tokens ×
    # top-8 × (max(256, 7,168) + max(512, 7,168)) × 2 B: TritonExperts at the expert width 2,048 / tp 8)
    workspace = 2 * 8192 * 8 * 7168 * 2
    assert (v["weights_bytes"], v["activation"]["bytes"]) == (85_352_992_032, 1_970_798_592 + workspace)
    assert workspace == 1_879_048_192 and v["activation"]["bytes"] == 3_849_846_784
    non_kv = v["weights_bytes"] + v["activation"]["bytes"] + NON_TORCH_ALLOWANCE + CUDA_GRAPH_ALLOWANCE
    assert non_kv == 90_008_145_184
    assert v["available_bytes"] == 79_027_398_247 - 90_008_145_184 == -10_980_746_937
