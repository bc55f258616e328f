"""Serving across GPUs (issue 28 §4): each GPU's weights, KV cache and prefill workspace under --tp and --pp, the
fits per GPU and the smallest tensor-parallel degree that fits a GPU.

The figures are written out by hand (nanoGPT-style) and must be equal to the byte. Llama-3-70B: hidden 8,192,
intermediate 28,672, 80 layers, 64 heads, 8 KV heads of 128, vocabulary 128,256, head untied.
"""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main
from paramscope.cost.memory.prefill import prefill_workspace
from paramscope.cost.memory.serving import MemoryOptions
from paramscope.cost.memory.serving_answer import estimate_memory
from paramscope.errors import ParamscopeError

H, I, L, V = 8192, 28672, 80, 128256


def _layer(tp: int, kv_rows: int) -> int:
    """One Llama-3-70B layer on tensor-parallel rank 0: q and o / tp, k and v `kv_rows` rows each, the MLP / tp,
    both norms whole."""
    return 2 * H * H // tp + 2 * kv_rows * H + 3 * I // tp * H + 2 * H


def _serve(model: str, **options):
    return estimate_memory(model, MemoryOptions(**options))


def test_llama_70b_tp8_weights_and_kv_per_gpu():
    estimate = _serve("llama-3-70b", seq=8192, tp=8)
    device = estimate.parallel.layout.device
    vocab_rows = -(-V // 8)  # 16,032: torch's Shard(0) and vLLM's vocabulary padding agree here (V / 8 exact)
    params = L * _layer(8, 1024 // 8) + 2 * vocab_rows * H + H
    assert params == 8_820_367_360
    assert device.weights.bytes == 2 * params == 17_640_734_720
    assert device.weights.buffer_bytes == 512  # rotary inv_freq, whole on every GPU
    # 8 KV heads / 8 = 1 a rank: 2 (K and V) × 1 × 128 × 2 B × 80 layers
    assert device.kv_cache.bytes_per_token == 2 * 1 * 128 * 2 * L == 40_960
    assert device.kv_cache.bytes == 40_960 * 8192
    # the prefill workspace on the shard: intermediate / 8, hidden whole; RoPE and positions as one device's
    assert device.workspace.bytes == 8192 * (4 * H + 3 * I // 8) * 2 + 2 * 8192 * 128 * 2 + 8192 * 8 == 717_291_520
    assert device.peak == estimate.peak == 17_640_734_720 + 512 + 40_960 * 8192 + 717_291_520
    assert estimate.settings["layout"] == {"devices": 8, "tp": 8, "pp": 1, "words": "tp 8 = 8 GPUs"}


def test_kv_heads_replicated_past_tp():
    """tp 16 over 8 KV heads: each rank keeps one head (its query heads'), so the cache per GPU is tp 8's."""
    estimate = _serve("llama-3-70b", seq=8192, tp=16)
    layout = estimate.parallel.layout
    device = layout.device
    assert device.kv_cache.bytes_per_token == 40_960  # not 20,480: the 8 heads are replicated twice
    assert "replicated" in layout.kv_heads and "each replicated 2 times" in layout.kv_heads
    params = L * _layer(16, 128) + 2 * (V // 16) * H + H  # k and v: one 128-row head a rank
    assert device.weights.bytes == 2 * params == 8_989_458_432
    assert layout.rules["attention.key"] == "KV heads replicated: one KV head a rank"


def test_deepseek_v3_latent_replicated_on_every_rank():
    one = _serve("deepseek-v3", seq=4096)
    assert one.kv_cache.layout == "latent"
    for tp in (8, 16):
        device = _serve("deepseek-v3", seq=4096, tp=tp).parallel.layout.device
        # (kv_lora_rank 512 + rope 64) × 2 B × 61 layers, whole on every rank
        assert device.kv_cache.bytes_per_token == one.kv_cache.bytes_per_token == 61 * 576 * 2 == 70_272
        assert "whole on every rank" in device.kv_cache.groups[0].arithmetic


def test_pipeline_stages_split_layers_and_cache():
    layout = _serve("llama-3-70b", seq=8192, tp=16, pp=2).parallel.layout
    first, last = layout.stages
    assert (first.layers, last.layers) == ((0, 39), (40, 79)) and first.first and last.last
    assert layout.pipeline == "80 layers, 40 a stage"
    # stage 0: 40 layers + the embedding shard; stage 1: 40 layers + the final norm and the head shard
    assert first.weights.bytes == 2 * (40 * _layer(16, 128) + (V // 16) * H)
    assert last.weights.bytes == 2 * (40 * _layer(16, 128) + (V // 16) * H + H) == 4_494_737_408
    assert first.kv_cache.bytes_per_token == last.kv_cache.bytes_per_token == 40 * 2 * 128 * 2 == 20_480
    assert first.workspace.logits == 0 and last.workspace.logits == V * 2  # the last token's logits, gathered
    assert layout.device is last  # the head's stage holds the most


def test_tied_head_costs_the_last_stage_a_copy():
    """Qwen2.5-0.5B ties its head to the input embedding: the last stage holds a copy (vLLM's and Megatron's)."""
    layout = _serve("qwen2.5-0.5b", seq=1024, pp=2).parallel.layout
    first, last = layout.stages
    assert first.weights.by_role["embeddings.word"] == 151936 * 896 * 2 == 272_269_312
    assert last.weights.by_role["head.lm"] == 272_269_312
    assert "embeddings.word" not in last.weights.by_role


def test_quantised_shard_is_the_format_on_the_slice():
    """GPTQ int4, group 128, on Llama-3-70B's row-parallel down_proj at tp 8: the slice is [8,192, 3,584]."""
    device = _serve("llama-3-70b", seq=8192, tp=8, dtype="gptq-int4").parallel.layout.device
    inputs, out, groups = I // 8, H, I // 8 // 128
    one = inputs * 4 // 32 * out * 4 + groups * out * 4 // 32 * 4 + groups * out * 2 + inputs * 4
    assert one == 15_267_840  # qweight + qzeros + fp16 scales + g_idx
    assert device.weights.by_role["mlp.down"] == L * one


@pytest.mark.parametrize("preset, seq", [("llama-3-8b", 4096), ("gpt2", 1024), ("mixtral-8x7b", 2048)])
def test_a_ranks_workspace_is_the_one_device_formula_on_its_shard(preset, seq):
    estimate = _serve(preset, seq=seq)
    from paramscope.api import as_source
    from transformers import AutoConfig

    config = AutoConfig.for_model(**as_source(preset).config)
    shape = dict(dtype_size=2 if preset != "gpt2" else 4, vocab=config.vocab_size, layers=estimate.report.num_layers,
                 gated=preset != "gpt2", class_name=estimate.report.model.class_name)
    cache = estimate.kv_cache.at(1, seq)
    one = prefill_workspace(config, batch=1, seq=seq, cache_bytes=cache, **shape)
    assert one.bytes == estimate.activations.bytes
    rank = prefill_workspace(config, tp=2, batch=1, seq=seq, cache_bytes=cache, **shape)
    assert rank.bytes < one.bytes and "/ tp 2" in rank.arithmetic
    # a pipeline's earlier stage computes no logits
    assert prefill_workspace(config, tp=2, batch=1, seq=seq, cache_bytes=cache, last=False, **shape).logits == 0


def test_fits_are_per_gpu_and_the_smallest_tp():
    estimate = _serve("llama-3-70b", seq=8192, tp=8, gpu="h100")
    assert estimate.budget.fits and estimate.budget.free == 80 * 2**30 - 2**30 - estimate.peak
    smallest = estimate.parallel.smallest
    # tp 1: the whole model, 145,742,184,960 B, does not fit 80 GiB; tp 2 does
    assert smallest.tp == 2 and smallest.tried[0] == (1, 145_742_184_960, "")
    tp2 = L * _layer(2, 512) + 2 * (V // 2) * H + H
    kv2 = 2 * 4 * 128 * 2 * L * 8192
    work2 = 8192 * (4 * H + 3 * I // 2) * 2 + 2 * 8192 * 128 * 2 + 8192 * 8
    assert smallest.peak == 2 * tp2 + 512 + kv2 + work2


def test_smallest_tp_names_the_degrees_refused():
    """Qwen2.5-0.5B (14 heads, 2 KV heads, intermediate 4,864): tp 7 cannot replicate 2 KV heads evenly, tp 14 does
    not divide the MLP; with a 200 MiB budget nothing fits."""
    smallest = _serve("qwen2.5-0.5b", seq=1024, budget=200 * 2**20, reserve=0).parallel.smallest
    assert smallest.tp is None
    assert [t for t, _, _ in smallest.tried] == [1, 2, 7, 14]
    assert [t for t, peak, _ in smallest.tried if peak is None] == [7, 14]


def test_without_a_layout_the_answer_is_one_device():
    estimate = _serve("llama-3-8b", seq=4096)
    assert estimate.parallel is None and "layout" not in estimate.settings


def test_cli_text_and_json(capsys):
    assert main(["memory", "llama-3-70b", "--seq", "8192", "--tp", "8", "--gpu", "h100", "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert "One GPU (tensor-parallel rank 0, the largest peak): tp 8 = 8 GPUs" in out
    assert "17,640,734,720" in out and "each GPU of tp 8 = 8 GPUs" in out
    assert "Smallest tensor-parallel degree that fits H100 80GB at batch 1 × 8,192 tokens: tp 2" in out
    assert main(["memory", "llama-3-70b", "--seq", "8192", "--tp", "8", "--pp", "2", "--gpu", "h100",
                 "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    layout = memory["layout"]
    assert (layout["tp"], layout["pp"], layout["devices"]) == (8, 2, 16)
    assert layout["device"]["peak"] == memory["peak"]["bytes"] == max(s["peak"] for s in layout["stages"])
    assert layout["device"]["kv_cache"]["bytes_per_token"] == 40 * 512
    assert sum(layout["device"]["weights"]["by_role"].values()) == layout["device"]["weights"]["bytes"]
    assert main(["memory", "llama-3-70b", "--seq", "8192", "--tp", "8", "--pp", "2", "--width", "120"]) == 0
    rows = [line.split()[:3] for line in capsys.readouterr().out.splitlines()]
    # the text's stage table renders (it raised before)
    assert ["0", "embeddings,", "0–39"] in rows and ["1", "40–79,", "head"] in rows
    assert memory["smallest_tp"]["pp"] == 2 and memory["smallest_tp"]["tp"] == 1  # 66 GiB a stage at tp 1
    assert main(["memory", "llama-3-8b", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["memory"]
    assert plain["layout"] is None and plain["smallest_tp"] is None


@pytest.mark.parametrize("argv, message", [
    (["--tp", "3"], "--tp 3 would split attention heads: 64 heads are not a multiple of it"),
    (["--tp", "0"], "--tp must be a whole number from 1 to 65,536"),
    (["--pp", "100"], "--pp 100 is more than the model's 80 layers"),
    (["--dp", "0"], "--dp must be a whole number from 1 to 65,536, got '0'"),
    (["--zero", "3"], "--zero is for --training; serving across GPUs takes --tp, --pp, --dp and --ep"),
    (["--ep", "2"], "--ep 2: serving's expert-parallel size is vLLM's, TP × DP = --tp 1 × --dp 1 = 1 here"),
    (["--tp", "2", "--trace"], "--trace measures one device; with --tp, --pp or --dp"),
])
def test_bad_layouts_refused_in_one_line(argv, message, capsys):
    assert main(["memory", "llama-3-70b", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_pipeline_over_two_stacks_refused(capsys):
    assert main(["memory", "t5-small", "--pp", "2"]) == 2
    err = capsys.readouterr().err
    assert "pipeline stages over 2 layer stacks" in err and len(err.strip().splitlines()) == 1


def test_library_refuses_uneven_heads():
    with pytest.raises(ParamscopeError, match="tp 5 would split attention heads"):
        _serve("llama-3-8b", seq=1024, tp=5)


def test_sliding_window_and_recurrent_state_split_over_tp():
    from transformers import MambaConfig

    from paramscope.cost.memory.kv import kv_cache

    # Gemma-2-9B (its config declares float32): 42 layers alternating sliding (window 4,096) and full, 8 KV heads
    # of 256
    whole = _serve("gemma-2-9b", seq=8192).kv_cache
    rank = _serve("gemma-2-9b", seq=8192, tp=2).parallel.layout.device.kv_cache
    assert [(g.kind, g.layers, g.tokens) for g in rank.groups] == [(g.kind, g.layers, g.tokens) for g in whole.groups]
    assert [g.per_token for g in rank.groups] == [2 * 4 * 256 * 4 * 21] * 2  # 4 KV heads a rank, 21 layers a kind
    assert rank.bytes == sum(g.bytes for g in rank.groups) and rank.at(1, 8192) == rank.bytes
    # Mamba: conv (inner × kernel, bf16) and ssm (inner × state, fp32) states, inner channels / tp
    config = MambaConfig(hidden_size=768, num_hidden_layers=4, intermediate_size=1536)
    one = kv_cache(config, batch=1, seq=16, dtype="bfloat16").groups[0].fixed
    two = kv_cache(config, batch=1, seq=16, dtype="bfloat16", tp=2).groups[0].fixed
    assert one == 4 * (1536 * 4 * 2 + 1536 * 16 * 4) == 442_368 and two == one // 2
