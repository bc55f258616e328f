"""Serving a MoE model across GPUs as vLLM lays it out (issue 28 §4), two gaps the data-parallel dispatch left:

1. vLLM's fused experts' workspace over the gathered tokens. FusedMoEModularKernel (modular_kernel.py:
   `_chunk_info`, `_allocate_buffers`) sizes TritonExperts' intermediate caches (fused_moe.py: `workspace_shapes`,
   workspace13 (M, k, max(N / 2, K)), workspace2 (M, k, max(N, K)), output (M, K)) by the tokens after the dispatch,
   chunked by VLLM_FUSED_MOE_CHUNK_SIZE (16,384, envs.py), in one WorkspaceManager request (v1/worker/workspace.py:
   each tensor rounded up to 256 B, one buffer grown to the largest request and kept); under DP+EP the profile run
   asks for the worst case at a full chunk. Not traced (transformers' prefill runs no fused kernel): held to that
   arithmetic, written out by hand.
2. DeepSeek (MLA, dense first layers, shared + routed experts) under --ep: the routed experts whole over tp × dp
   ranks, the MLA down-projections replicated and up-projections tensor parallel, the dense MLPs tensor parallel,
   the latent cache whole on every rank; under vLLM's sequence-parallel MoE (--ep with tp > 1 and dp > 1:
   ParallelConfig.use_sequence_parallel_moe, read by deepseek_v2.py's DeepseekV2MoE) the shared experts whole on
   every rank (DeepseekV2MLP's disable_tp) and each tp rank dispatching its own ⌈T / tp⌉ tokens. Each GPU's weights
   are held against the meta-built module's own tensors, sliced by those rules here.
"""

from __future__ import annotations

import pytest

from paramscope.cost.parallel.serving_experts import (SHARED_WHOLE, FusedExpertsWorkspace, GatheredDispatch,
                                                      expert_ranges, sequence_parallel_moe)

DEEPSEEK = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "torch_dtype": "bfloat16",
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 3,
            "intermediate_size": 96, "moe_intermediate_size": 32, "n_shared_experts": 1, "n_routed_experts": 6,
            "num_experts_per_tok": 2, "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16,
            "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "n_group": 1, "topk_group": 1,
            "vocab_size": 128, "max_position_embeddings": 256, "tie_word_embeddings": False}


def test_fused_workspace_one_chunk_many_chunks_and_the_profile_run():
    """TritonExperts' caches at the gathered M: one chunk (the output shares workspace13), past a chunk (the three
    apart, the output over all M), and DP+EP's profile-run worst case kept by the WorkspaceManager; each tensor of a
    request rounded up to 256 B. hidden 100, top-k 3, expert width 40 (gated: N = 80, N / 2 = 40), bf16."""
    dispatch = GatheredDispatch(dp=2, hidden=100, top_k=3, dtype_size=2)
    work = FusedExpertsWorkspace(dispatch, width=40, gated=True, dp_ep=False, chunk=32)

    def up(n: int) -> int:
        return -(-n // 256) * 256

    # 2 replicas × 1 × 7 tokens = 14 ≤ 32: workspace13 max(14·3·max(40, 100), 14·100) and workspace2 14·3·max(80, 100)
    assert dispatch.tokens(1, 7) == 14
    assert work.at(1, 7) == up(14 * 3 * 100 * 2) + up(14 * 3 * 100 * 2) == 8_448 + 8_448
    # 2 × 20 = 40 tokens > 32: chunks of 32, the output over all 40 apart
    assert work.at(1, 20) == up(32 * 3 * 100 * 2) + up(32 * 3 * 100 * 2) + up(40 * 100 * 2) == 19_200 * 2 + 8_192
    # DP+EP: the profile run's full chunk is the floor; past it the asked point's request
    ep = FusedExpertsWorkspace(dispatch, width=40, gated=True, dp_ep=True, chunk=32)
    profile = up(32 * 3 * 100 * 2) * 2 + up(32 * 100 * 2)
    assert profile == 44_800 and ep.at(1, 7) == profile and ep.at(1, 20) == work.at(1, 20) == 46_592
    assert "the profile run's worst case under DP+EP" in ep.arithmetic(1, 7)
    # a wide expert: max(N, K) is 2i, not h
    wide = FusedExpertsWorkspace(dispatch, width=300, gated=True, dp_ep=False, chunk=32)
    assert wide.at(1, 7) == up(14 * 3 * 300 * 2) + up(14 * 3 * 600 * 2) == 25_344 + 50_432


def test_sequence_parallel_dispatch_gathers_each_tp_ranks_chunk():
    """Under vLLM's sequence-parallel MoE each of tp ranks dispatches ⌈T / tp⌉ tokens (sequence_parallel_chunk pads
    T to a multiple of tp): 63 tokens at tp 2 × dp 2 gather 2 × 2 × 32 = 128, not 2 × 63."""
    chunked = GatheredDispatch(dp=2, hidden=64, top_k=2, dtype_size=2, tp_chunks=2)
    assert chunked.tokens(1, 63) == 128 and chunked.at(1, 63) == 128 * (64 * 2 + 2 * 8) == 18_432
    assert GatheredDispatch(dp=2, hidden=64, top_k=2, dtype_size=2).tokens(1, 63) == 126
    assert sequence_parallel_moe("DeepseekV3ForCausalLM", 2, 2, 4)
    assert not sequence_parallel_moe("DeepseekV3ForCausalLM", 2, 1, 2)  # one replica
    assert not sequence_parallel_moe("DeepseekV3ForCausalLM", 1, 4, 4)  # tp 1
    assert not sequence_parallel_moe("DeepseekV3ForCausalLM", 2, 2, 1)  # no --ep
    assert not sequence_parallel_moe("Qwen2MoeForCausalLM", 2, 2, 4)  # its MoE block does not read it


def _rank0_bytes(module, tp: int, experts: tuple[int, int] | None, shared_whole: bool) -> int:
    """Rank 0's weight bytes, sliced from the module's own tensors by vLLM's DeepSeek rules: q_a_proj,
    kv_a_proj_with_mqa, norms and the router whole; q_b_proj, kv_b_proj, the dense gate/up column-parallel (rows /
    tp), o_proj and the dense down row-parallel (columns / tp); the vocabulary / tp; the routed experts whole
    experts [start, stop) (`experts`), or else their widths / tp; the shared experts whole or tensor parallel."""
    total = 0
    for name, p in module.named_parameters():
        size = p.element_size()
        if ".mlp.experts." in name:
            if experts is not None:
                total += p[experts[0]:experts[1]].numel() * size
            else:  # gate_up [E, 2i, h] column (gate and up halves each / tp), down [E, h, i] row
                total += p.numel() // tp * size
            continue
        column = any(k in name for k in ("q_b_proj", "kv_b_proj", "mlp.gate_proj", "mlp.up_proj", "embed_tokens",
                                         "lm_head"))
        row = any(k in name for k in ("o_proj", "mlp.down_proj"))
        if "shared_experts" in name:
            column = column or ("gate_proj" in name or "up_proj" in name) and not shared_whole
            row = row or "down_proj" in name and not shared_whole
            if shared_whole:
                column = row = False
        if column:
            total += p.shape[0] // tp * p[0].numel() * size
        elif row:
            total += p.shape[0] * (p.shape[1] // tp) * size
        else:
            total += p.numel() * size
    return total


@pytest.fixture(scope="module")
def deepseek():
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import memory_answer

    def answer(**options):
        return memory_answer(DEEPSEEK, MemoryOptions(seq=63, **options), use_cache=False, check=False)
    return answer


def test_deepseek_under_ep_with_data_parallel(deepseek):
    """tp 2 × dp 2 with ep (EP 4): rank 0 holds routed experts 0-1 whole, the shared experts whole (sequence-parallel
    MoE), MLA's down-projections whole and up-projections / 2, the dense layer's MLP / 2; its KV cache is the whole
    latent (as one GPU's); its gathered tokens are each tp rank's ⌈63 / 2⌉ = 32 from 4 ranks, and its fused-experts
    workspace the DP+EP profile run's full chunk."""
    _, estimate, view = deepseek(tp=2, dp=2, expert_parallel=True)
    layout = estimate.parallel.layout
    device = layout.device
    assert layout.sequence_parallel and layout.rules["moe.shared_experts"] == SHARED_WHOLE
    assert expert_ranges(6, 4)[0] == (0, 2)
    assert device.weights.bytes == _rank0_bytes(view.module, 2, (0, 2), shared_whole=True) == 145_008
    by_role = device.weights.by_role
    assert by_role["moe.experts"] == 2 * 2 * (64 * 64 + 64 * 32) * 2 == 49_152  # 2 MoE layers, 2 experts each
    assert by_role["moe.shared_experts"] == 2 * 3 * 32 * 64 * 2 == 24_576  # whole
    assert by_role["attention.q_down"] == by_role["attention.kv_down"] == 3 * 24 * 64 * 2  # replicated
    assert by_role["attention.q_up"] == 3 * (64 // 2) * 24 * 2 and by_role["attention.kv_up"] == 3 * 32 * 16 * 2
    assert by_role["attention.output"] == 3 * 64 * (32 // 2) * 2
    assert by_role["mlp.gate"] == by_role["mlp.up"] == by_role["mlp.down"] == 96 // 2 * 64 * 2  # the dense layer
    assert by_role["moe.router"] == 2 * 6 * 64 * 4  # fp32, whole
    one = deepseek()[1]
    assert device.kv_cache.bytes == one.kv_cache.bytes == 3 * 63 * (16 + 8) * 2 == 9_072  # the latent, whole
    assert device.gathered == 2 * 2 * 32 * (64 * 2 + 2 * 8) == 18_432
    assert device.experts_workspace == 16384 * 2 * (64 + 64) * 2 + 16384 * 64 * 2 == 10_485_760
    assert device.peak == device.weight_bytes + device.kv_cache.bytes + device.workspace.bytes + \
        device.correction + device.gathered + device.experts_workspace
    assert any(n.startswith(SHARED_WHOLE) for n in estimate.notes)


def test_deepseek_shared_experts_tensor_parallel_without_sequence_parallel_moe(deepseek):
    """One replica (tp 2 with ep) or no --ep (tp 2 × dp 2): vLLM's MoE is not sequence parallel, so the shared
    experts are tensor parallel; without ep the routed experts' widths are cut over tp × dp = 4 and the 126 tokens of
    both replicas gathered whole."""
    _, estimate, view = deepseek(tp=2, expert_parallel=True)
    layout = estimate.parallel.layout
    assert not layout.sequence_parallel and layout.rules["moe.shared_experts"].startswith("column-parallel")
    experts = expert_ranges(6, 2)[0]
    assert layout.device.weights.bytes == _rank0_bytes(view.module, 2, experts, shared_whole=False)
    assert layout.device.weights.by_role["moe.shared_experts"] == 24_576 // 2
    assert layout.device.gathered == layout.device.experts_workspace == 0  # one replica: no dispatch
    _, estimate, view = deepseek(tp=2, dp=2)
    device = estimate.parallel.layout.device
    assert device.weights.by_role["moe.shared_experts"] == 24_576 // 2
    assert device.weights.by_role["moe.experts"] == 2 * 6 * (64 * 64 + 64 * 32) * 2 // 4 == 36_864
    assert device.gathered == 2 * 63 * (64 * 2 + 2 * 8) == 18_144
    # one chunk of 126 gathered tokens, the expert's width 32 / 4 = 8 (N = 16): max(8, 64) and max(16, 64)
    assert device.experts_workspace == 126 * 2 * 64 * 2 * 2 == 64_512
