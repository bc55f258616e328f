"""Serving across GPUs with data parallelism (issue 28 §4): `memory MODEL --tp T --dp D [--ep]`, vLLM's
--data-parallel-size with and without --enable-expert-parallel (FusedMoEParallelConfig.make: EP = TP × DP, the
experts whole; without EP the MoE layers' TP flattened over TP × DP). Each replica serves its own --batch; a GPU's
attention, dense weights, KV cache and workspace are its replica's tp rank's.

The routed experts on a GPU are held against the meta-built module's own expert tensors, sliced rank by rank as
vLLM's linear placement places them; the full-size figures (Qwen1.5-MoE-A2.7B: 60 experts of 3 × 2,048 × 1,408,
24 layers; Mixtral-8x7B: 8 experts of 3 × 4,096 × 14,336, 32 layers) are written out by hand.
"""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main
from paramscope.cost.memory.serving import MemoryOptions
from paramscope.cost.memory.serving_answer import memory_answer
from paramscope.cost.parallel.serving_experts import expert_ranges

QWEN_MOE = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "torch_dtype": "bfloat16",
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "intermediate_size": 96, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
            "num_experts": 6, "num_experts_per_tok": 2, "vocab_size": 128, "max_position_embeddings": 256,
            "tie_word_embeddings": False}


def _answer(config: dict = QWEN_MOE, **options):
    return memory_answer(config, MemoryOptions(seq=64, **options), use_cache=False, check=False)


def _experts_by_rank(module, ep: int) -> list[int]:
    """Each ep rank's routed-expert bytes (bf16), sliced from the module's own packed tensors."""
    return [sum(2 * t[start:stop].numel() for layer in module.model.layers
                for t in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj))
            for start, stop in expert_ranges(6, ep)]


def _rest_at_tp2(shared: int = 48) -> int:
    """Everything but the routed experts on tp rank 0 of 2, in parameters: q and o / 2 (q's bias too), k and v one
    16-wide head each (2 KV heads / 2), the shared expert / 2 (its one-output gate whole), router and norms whole,
    the vocabulary / 2 twice (untied), the final norm."""
    layer = (64 * 64 // 2 + 64 // 2) + 2 * (16 * 64 + 16) + 64 * 64 // 2 + 3 * shared // 2 * 64 + 64 + 6 * 64 + 2 * 64
    return 2 * layer + 2 * (128 // 2) * 64 + 64


def test_dp_with_ep_splits_the_experts_over_tp_times_dp():
    """tp 2 × dp 2 with ep: EP = 4, rank 0 (replica 0's tp rank 0) holds experts 0-1 whole, as tp 4 with ep does;
    attention and the rest are tp 2's, the KV cache and workspace replica 0's at its own --batch."""
    _, estimate, view = _answer(tp=2, dp=2, expert_parallel=True)
    layout = estimate.parallel.layout
    device = layout.device
    sliced = _experts_by_rank(view.module, 4)
    assert sliced == [49_152, 49_152, 24_576, 24_576]
    assert sum(sliced) == sum(2 * p.numel() for n, p in view.module.named_parameters() if ".mlp.experts." in n)
    assert device.weights.by_role["moe.experts"] == sliced[0]
    assert _rest_at_tp2() == 31_040
    assert device.weights.bytes == sliced[0] + 2 * 31_040 == 111_232
    tp2 = _answer(tp=2)[1].parallel.layout.device  # one replica at tp 2, the experts cut by their widths
    assert device.kv_cache.bytes == tp2.kv_cache.bytes == 2 * 64 * 2 * 1 * 16 * 2 == 8_192
    assert device.workspace.bytes == tp2.workspace.bytes
    assert device.peak == device.weights.bytes + device.weights.buffer_bytes + 8_192 + device.workspace.bytes + \
        device.gathered + device.experts_workspace
    # vLLM's fused experts' workspace under DP+EP: the profile run's worst case at VLLM_FUSED_MOE_CHUNK_SIZE 16,384
    # tokens, kept by the WorkspaceManager: 16,384 × k 2 × (max(i 32, h 64) + max(2i 64, h 64)) × 2 B + the output
    # 16,384 × 64 × 2 B (the 128 gathered tokens ask less)
    assert device.experts_workspace == 16384 * 2 * (64 + 64) * 2 + 16384 * 64 * 2 == 10_485_760
    assert (layout.tp, layout.dp, layout.ep, layout.devices) == (2, 2, 4, 4)
    assert layout.words() == "tp 2 × dp 2 with ep 4 = 4 GPUs"
    assert estimate.settings["layout"]["dp"] == 2 and estimate.settings["layout"]["ep"] == 4
    assert any("EP size = TP × DP = 2 × 2 = 4" in n and "rank 0 holds experts 0–1" in n for n in estimate.notes)
    assert any("--batch is each replica's" in n for n in estimate.notes)


def test_the_moe_dispatch_gathers_every_replicas_tokens():
    """vLLM's default allgather_reducescatter dispatch: each GPU holds, at a MoE layer, every replica's tokens'
    hidden states (compute dtype), top-k weights (fp32) and ids (int32), with --ep and without; one replica gathers
    nothing. The widths and k are the module's own: its router's input width and the top-k it returns on them."""
    import torch

    _, estimate, view = _answer(tp=2, dp=2, expert_parallel=True)
    router = view.module.model.layers[0].mlp.gate
    hidden = torch.empty(2 * 1 * 64, router.weight.shape[1], dtype=view.module.dtype, device="meta")
    ids = router(hidden)[-1]  # [D·B·S, k]: vLLM's fused_topk makes them int32, its weights fp32
    expected = hidden.nbytes + ids.numel() * (4 + 4)
    assert expected == 128 * (64 * 2 + 2 * 8) == 18_432
    layout = estimate.parallel.layout
    assert [s.gathered for s in layout.stages] == [18_432] and layout.dispatch.at(1, 64) == expected
    without = _answer(tp=2, dp=2)[1].parallel.layout
    assert without.device.gathered == 18_432
    assert without.device.peak - without.device.gathered - without.device.experts_workspace == \
        sum(getattr(without.device, k) for k in ("weight_bytes", "correction")) + \
        without.device.kv_cache.bytes + without.device.workspace.bytes
    # without --ep: one chunk of the 128 gathered tokens, the expert's width / (tp × dp) = 32 / 4 = 8:
    # 128 × k 2 × (max(8, 64) + max(16, 64)) × 2 B (the output, 128 × 64, shares workspace13)
    assert without.device.experts_workspace == 128 * 2 * (64 + 64) * 2 == 65_536
    assert _answer(tp=2, expert_parallel=True)[1].parallel.layout.device.gathered == 0  # one replica
    staged = _answer(tp=1, dp=2, pp=2)[1].parallel.layout  # each stage runs MoE layers: each gathers
    assert [s.gathered for s in staged.stages] == [18_432, 18_432]
    note = next(n for n in estimate.notes if n.startswith("the MoE layers' gathered tokens"))
    assert "2 replicas × 1 × 64 tokens × (hidden 64 × 2 B + top-k 2 × (4 B fp32 weight + 4 B int32 id)) = " \
           "18,432 B" in note and "allgather_reducescatter" in note


# wider experts (moe_intermediate_size 256), so that splitting them further saves more than a replica's gathered
# tokens and the fused experts' workspace over them cost
WIDE_EXPERTS = {**QWEN_MOE, "moe_intermediate_size": 256}


@pytest.fixture
def small_chunks(monkeypatch):
    """VLLM_FUSED_MOE_CHUNK_SIZE=16: the DP+EP profile run's fused-experts buffer at 16 tokens, not 16,384 (which on
    this 64-wide model outweighs every expert, so that fewer GPUs would always fit first)."""
    from paramscope.cost.parallel import serving_experts

    monkeypatch.setattr(serving_experts, "FUSED_MOE_CHUNK_SIZE", 16)


def test_the_smallest_moe_layout_searches_tp_times_dp(small_chunks):
    """A MoE model's smallest layout: T × D by GPUs, the fewer replicas first at equal GPUs (4 heads: T is 1, 2 or
    4, so 8 GPUs are tp 4 × dp 2 alone); each try's peak is that layout's own answer. The budget holds tp 4 × dp
    2's peak and none of 4 GPUs'."""
    peak = _answer(WIDE_EXPERTS, tp=4, dp=2, expert_parallel=True)[1].peak
    search = _answer(WIDE_EXPERTS, budget=peak + (1 << 30), reserve=1 << 30,
                     expert_parallel=True)[1].parallel.smallest
    layouts = [(t, d) for (t, _, _), d in zip(search.tried, search.tried_dp)]
    assert search.dp_searched and layouts == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4), (4, 2)]
    assert (search.tp, search.dp, search.peak) == (4, 2, peak) and search.expert_parallel
    assert search.tried[4][1] == _answer(WIDE_EXPERTS, tp=2, dp=2, expert_parallel=True)[1].peak
    assert min(p for _, p, _ in search.tried[3:6]) > peak  # more replicas split the experts further


def test_the_smallest_layout_sentence(small_chunks):
    """One line from the JSON form: the order tried, the layout found, the least the next fewer GPUs need; the
    JSON names each try's dp. Where none fits, the least any layout tried needs."""
    from paramscope.render.memory import smallest_to_dict, smallest_tp_sentence

    peak = _answer(WIDE_EXPERTS, tp=4, dp=2, expert_parallel=True)[1].peak
    search = _answer(WIDE_EXPERTS, budget=peak + (1 << 30), reserve=1 << 30,
                     expert_parallel=True)[1].parallel.smallest
    smallest = smallest_to_dict(search)
    assert smallest["dp_searched"] and (smallest["tp"], smallest["dp"], smallest["peak"]) == (4, 2, peak)
    assert [(t["tp"], t["dp"]) for t in smallest["tried"]][-2:] == [(1, 4), (4, 2)]
    least = min(t["peak"] for t in smallest["tried"][3:6])
    line = smallest_tp_sentence(smallest)
    assert line.startswith("Smallest layout that fits a 1.00 GiB budget at batch 1 (a replica's) × 64 tokens (MoE, "
                           "tried tp × dp by GPUs, fewer replicas first at equal GPUs, dp in powers of two, ep = tp "
                           "× dp): tp 4 × dp 2 = 8 GPUs, ")
    best = next(t for t in smallest["tried"][3:6] if t["peak"] == least)
    assert f"(at best tp {best['tp']} × dp {best['dp']} = 4 GPUs needs " in line and "\n" not in line
    none = smallest_to_dict(_answer(WIDE_EXPERTS, budget=1 << 30, reserve=1 << 30,
                                     expert_parallel=True)[1].parallel.smallest)
    assert none["tp"] is None and len(none["tried"]) == 7 + 6 + 5  # 4 heads: T 1, 2, 4 × D 1 … 64, 64 GPUs at most
    assert smallest_tp_sentence(none).startswith("No layout fits a 1.00 GiB budget")


def test_dp_without_ep_cuts_the_experts_over_tp_times_dp():
    """vLLM's MoE layers flatten TP across DP: without --ep each expert's widths / (tp × dp); the rest is tp 2's."""
    _, estimate, view = _answer(tp=2, dp=2)
    device = estimate.parallel.layout.device
    whole = sum(2 * p.numel() for n, p in view.module.named_parameters() if ".mlp.experts." in n)
    assert device.weights.by_role["moe.experts"] == whole // 4 == 36_864
    assert device.weights.bytes == 36_864 + 2 * _rest_at_tp2()
    assert estimate.parallel.layout.rules["moe.experts"].endswith("over tp × dp = 4 ranks (vLLM's MoE layers "
                                                                   "flatten TP across DP without expert parallelism)")


def test_ep_accepts_a_tp_that_does_not_divide_the_expert_width():
    """moe_intermediate_size 30: tp 4 alone (or tp 2 × dp 2 without ep) cuts it and is refused; under ep the
    experts are whole (vLLM's MoE TP size 1), so tp 4 is accepted, as vLLM accepts it."""
    from paramscope.errors import OptionError

    config = {**QWEN_MOE, "moe_intermediate_size": 30}
    with pytest.raises(OptionError, match="tp 4 does not divide 30, the input features of "
                                          "model.layers.0.mlp.experts.down_proj"):
        _answer(config, tp=4)
    with pytest.raises(OptionError, match=r"dp 2 with tp 2: without ep, vLLM's MoE layers cut the routed experts' "
                                          r"widths over tp × dp = 4 ranks, which does not divide 30"):
        _answer(config, tp=2, dp=2)
    _, estimate, view = _answer(config, tp=4, expert_parallel=True)
    first, last = expert_ranges(6, 4)[0]
    experts = sum(2 * t[first:last].numel() for layer in view.module.model.layers
                  for t in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj))
    assert experts == 2 * 2 * 2 * (64 * 60 + 64 * 30) == 46_080
    assert estimate.parallel.layout.device.weights.by_role["moe.experts"] == experts
    with pytest.raises(OptionError, match="tp 4 does not divide 98, the output features of "
                                          "model.layers.0.mlp.shared_expert.gate_proj"):  # tensor parallel still
        _answer({**config, "shared_expert_intermediate_size": 96 + 2}, tp=4, expert_parallel=True)


def test_more_ranks_than_experts_leaves_some_without():
    """vLLM's determine_expert_map asserts nothing of E against EP: 6 experts over 8 ranks, rank 0 holds one."""
    _, estimate, view = _answer(tp=1, dp=8, expert_parallel=True)
    assert estimate.parallel.layout.device.weights.by_role["moe.experts"] == _experts_by_rank(view.module, 8)[0] \
        == 2 * 2 * (64 * 64 + 64 * 32)
    assert expert_ranges(6, 8)[6:] == ((6, 6), (6, 6))
    assert any("ranks 6–7 hold none" in n for n in estimate.notes)


def test_a_dense_model_is_replicated():
    """Llama-3-70B at tp 8 × dp 2: each GPU is tp 8's; the smallest T at dp 2 is one replica's."""
    one = memory_answer("llama-3-70b", MemoryOptions(seq=8192, tp=8), check=False)[1].parallel.layout.device
    estimate = memory_answer("llama-3-70b", MemoryOptions(seq=8192, tp=8, dp=2, gpu="h100"), check=False)[1]
    device = estimate.parallel.layout.device
    assert (device.weights.bytes, device.kv_cache.bytes, device.workspace.bytes, device.peak) == \
        (17_640_734_720, 335_544_320, 717_291_520, one.peak)
    assert estimate.parallel.layout.words() == "tp 8 × dp 2 = 16 GPUs"
    assert estimate.parallel.smallest.tp == 2 and estimate.parallel.smallest.tried[0] == (1, 145_742_184_960, "")
    assert not estimate.parallel.smallest.dp_searched and estimate.parallel.smallest.tried_dp == ()  # T alone


def test_full_size_per_gpu_figures(cache, capsys):
    """qwen1.5-moe-a2.7b and mixtral-8x7b at --tp 2 --dp 4 --ep, 8,192 tokens: 8 and 1 experts a GPU (60 / 8, the
    first 4 ranks one more; 8 / 8), from the cost facts."""
    from tests.test_serving_parallel_cache import _qwen_moe_kept

    _qwen_moe_kept()  # Qwen1.5-MoE's one-device correction at this point, as measured (455,279,072 B)
    figures = {}
    for model in ("qwen1.5-moe-a2.7b", "mixtral-8x7b"):
        assert main(["memory", model, "--tp", "2", "--dp", "4", "--ep", "--seq", "8192", "--json"]) == 0
        memory = json.loads(capsys.readouterr().out)["memory"]
        layout = memory["layout"]
        assert (layout["tp"], layout["dp"], layout["ep"], layout["devices"]) == (2, 4, 8, 8)
        device = layout["device"]
        assert device["peak"] == memory["peak"]["bytes"] == device["weights"]["bytes"] + device["buffers"] + \
            device["kv_cache"]["bytes"] + device["workspace"]["bytes"] + device["correction"] + \
            device["moe_gathered"] + device["moe_workspace"]
        figures[model] = (device["weights"]["by_role"]["moe.experts"], device["weights"]["bytes"],
                          device["kv_cache"]["bytes"], device["moe_gathered"], device["moe_workspace"],
                          device["peak"])
    # the gathered tokens: 4 replicas × 8,192 × (hidden × 2 B + top-k × (4 + 4) B), Qwen's top-4, Mixtral's top-2
    # Qwen: the one-device correction carries the formula's tp cut back (2 × 2,816 × 8,192 × 2 B): the traced moment
    # does not shrink with it (test_serving_expert_workspace.py)
    # vLLM's fused experts over the 32,768 gathered tokens, two chunks of 16,384: workspace13 16,384 × k × max(i, h),
    # workspace2 16,384 × k × max(2i, h), the output 32,768 × h, each in bf16 (256-byte multiples already)
    qwen_fused = 16384 * 4 * 2048 * 2 + 16384 * 4 * 2816 * 2 + 32768 * 2048 * 2
    assert qwen_fused == 771_751_936
    assert figures["qwen1.5-moe-a2.7b"] == (8 * 24 * 3 * 2048 * 1408 * 2, 5_183_688_704,
                                            24 * 8192 * 2 * 8 * 128 * 2, 4 * 8192 * (2048 * 2 + 4 * 8), qwen_fused,
                                            6_675_026_912 + 135_266_304 + 2 * 2816 * 8192 * 2 + qwen_fused)
    assert figures["qwen1.5-moe-a2.7b"][5] == 7_674_319_840  # was 6,902,567,904 without the fused workspace
    assert figures["qwen1.5-moe-a2.7b"][:3] == (3_321_888_768, 5_183_688_704, 805_306_368)
    # Mixtral's rest on tp rank 0 of 2: per layer q and o / 2, k and v 4 heads of 128, router and norms whole;
    # embeddings and head / 2, the final norm
    rest = 32 * (2 * 4096 * 4096 // 2 + 2 * 512 * 4096 + 8 * 4096 + 2 * 4096) + 2 * 16000 * 4096 + 4096
    # Mixtral's workspace under ep keeps the experts' intermediate whole: 8·T·k·i at i 14,336, not 14,336 / 2
    mixtral_fused = 16384 * 2 * 14336 * 2 + 16384 * 2 * 28672 * 2 + 32768 * 4096 * 2
    assert mixtral_fused == 3_087_007_744
    assert figures["mixtral-8x7b"] == (1 * 32 * 3 * 4096 * 14336 * 2, 11_274_289_152 + 2 * rest,
                                       32 * 8192 * 2 * 4 * 128 * 2, 4 * 8192 * (4096 * 2 + 2 * 8), mixtral_fused,
                                       14_765_269_568 + 268_959_744 + 8 * 8192 * 2 * (14336 - 14336 // 2)
                                       + mixtral_fused)
    assert 2 * rest == 1_606_950_912 and figures["mixtral-8x7b"][5] == 19_060_761_152  # was 15,973,753,408


@pytest.mark.parametrize("argv, message", [
    (["--tp", "2", "--dp", "2", "--ep", "2"], "--ep 2: serving's expert-parallel size is vLLM's, TP × DP = --tp 2 × "
                                              "--dp 2 = 4 here: give --ep alone or --ep 4"),
    (["--dp", "2", "--trace"], "--trace measures one device; with --tp, --pp or --dp"),
])
def test_bad_data_parallel_refused_in_one_line(argv, message, capsys):
    assert main(["memory", "qwen1.5-moe-a2.7b", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
