"""Serving across GPUs, issue 28 §4: the serving correction kept on disk (memory/serving_correction.py), so a config
whose analytic peak differs from a traced prefill is answered from its cost facts the next time (no build, no
trace), and each GPU's peak takes the one-device correction (parallel/serving.PerGpuCorrection).

Qwen1.5-MoE-A2.7B at tp 4, B=1, S=8,192: its analytic one-device peak is 455,279,072 B below the traced prefill on
a 2- and on a 4-layer cut (measured by serving_check.extended_difference; 10-30 s, so the tests keep that measured
difference in the cache as the first run does and check what is read back and carried).
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from paramscope.cost.facts.store import facts_key
from paramscope.cost.memory.serving import MemoryOptions
from paramscope.cost.memory.serving_answer import memory_answer
from paramscope.cost.memory.serving_correction import (CorrectionFor, CutDifference, correction_key, find_difference,
                                                       keep_difference, _path)
from paramscope.cost.model_view import FactsGap
from paramscope.disk_cache import CacheEntryError

MEASURED = CutDifference(1, 8192, 2, -455_279_072, 24, 4, -455_279_072)  # Qwen1.5-MoE-A2.7B in bf16


def test_cut_difference_round_trip_and_what_it_gives():
    assert CutDifference.from_json(MEASURED.to_json()) == MEASURED
    assert MEASURED.difference == -455_279_072
    assert MEASURED.words() == ("at B=1, S=8,192 the analytic peak is -455,279,072 B from the traced one on 2 layers "
                                "and -455,279,072 B on 4")
    assert CutDifference(1, 64, 2, -5, 24, 4, -7).difference is None  # grows with depth: the whole model is traced
    grown = CutDifference(1, 64, 2, -5, 24, 4, -7, -31, "prefill", ("sdpa",))  # and was: its difference answers
    assert grown.difference == -31 and grown.traced_whole and CutDifference.from_json(grown.to_json()) == grown
    assert grown.words().endswith("so the whole model was traced (24 layers, its peak in the prefill): -31 B")
    assert CutDifference(1, 64, 2, 9, 2).difference == 9  # the cut was the whole model


@pytest.mark.parametrize("change", [
    {"first": True}, {"short": 30}, {"long": 2}, {"second": None}, {"seq": 0}, {"first": 1 << 60}, {"extra": 1},
    {"whole": 3}, {"phase": "prefill"}, {"notes": ["x"]},  # a whole-model trace where the cuts agree
    {"second": 1, "whole": None, "phase": "prefill", "notes": []},  # they disagree: the whole trace is missing
    {"second": 1, "whole": 3, "phase": "forward", "notes": []},  # not a serving trace's phase
    {"second": 1, "whole": 3, "phase": "prefill", "notes": ["x\x1b[2J"]},  # a note that is not printable
    {"second": 1, "whole": 3, "phase": "prefill", "notes": ["x"] * 33},
])
def test_a_malformed_difference_is_refused(change):
    with pytest.raises(CacheEntryError):
        CutDifference.from_json({**MEASURED.to_json(), **change})


def test_an_entry_is_read_back_only_where_it_matches(cache):
    key = correction_key("Qwen2MoeForCausalLM", "k", "bfloat16", 1, 8192, None)
    path = keep_difference("Qwen2MoeForCausalLM", key, MEASURED)
    assert find_difference("Qwen2MoeForCausalLM", key, 1, 8192) == MEASURED
    assert find_difference("Qwen2MoeForCausalLM", key, 2, 8192) is None  # kept for another point
    assert find_difference("LlamaForCausalLM", key, 1, 8192) is None
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "versions": ["0.0.1", "x", "y"]}))  # made by other versions
    assert find_difference("Qwen2MoeForCausalLM", key, 1, 8192) is None
    # cuts that disagree without the whole model's trace: no answer, measured again
    path.write_text(json.dumps({**data, "difference": {**data["difference"], "second": -1}}))
    assert find_difference("Qwen2MoeForCausalLM", key, 1, 8192) is None
    grown = {**data["difference"], "second": -1, "whole": -7, "phase": "decode", "notes": ["a trace's note"]}
    path.write_text(json.dumps({**data, "difference": grown}))
    assert find_difference("Qwen2MoeForCausalLM", key, 1, 8192).difference == -7  # the words follow the figures
    path.unlink()
    os.symlink("/dev/zero", path)  # not a regular file: one lstat, refused
    assert find_difference("Qwen2MoeForCausalLM", key, 1, 8192) is None


@pytest.mark.parametrize("grows", [False, True])
def test_measured_once_then_read_without_the_module(cache, grows):
    """The cuts' agreeing difference, and where they disagree the whole model's trace, are each measured once at a
    point and answered from the cache the next time, without a module."""
    calls = []

    def measure(module, dtype, batch, seq, encoder_seq):
        calls.append((dtype, batch, seq, encoder_seq))
        if grows:
            return CutDifference(batch, seq, 2, -10, 8, 4, -12, -21, "prefill", ("a note of the trace",))
        return CutDifference(batch, seq, 2, -10, 8, 4, -10)

    correct = CorrectionFor("config", True, measure)
    built = SimpleNamespace(class_name="X", module=object())
    first = correct(built, "bfloat16", 3, 64, None)
    assert (first.difference, first.traced_whole) == ((-21, True) if grows else (-10, False))
    assert first.words().startswith("at B=3, S=64 the analytic peak is -10 B from the traced one on 2 layers and "
                                    + ("-12 B on 4: it grows with depth" if grows else "-10 B on 4"))
    facts_only = SimpleNamespace(class_name="X", module=None)
    assert correct(facts_only, "bfloat16", 3, 64, None) == first
    assert calls == [("bfloat16", 3, 64, None)]
    with pytest.raises(FactsGap):  # another point: nothing kept, no module to trace
        correct(facts_only, "bfloat16", 3, 65, None)
    uncached = CorrectionFor("config", False, measure)  # --no-cache: neither read nor kept
    with pytest.raises(FactsGap):
        uncached(facts_only, "bfloat16", 3, 64, None)
    uncached(built, "bfloat16", 5, 64, None)
    assert not _path("X", correction_key("X", "config", "bfloat16", 5, 64, None)).exists()


def _qwen_moe_kept() -> None:
    """The measured difference kept as the first run keeps it."""
    from paramscope.api import as_source

    key = facts_key(as_source("qwen1.5-moe-a2.7b").config, model_class=None, task=None, num_labels=None)
    keep_difference("Qwen2MoeForCausalLM", correction_key("Qwen2MoeForCausalLM", key, "bfloat16", 1, 8192, None),
                    MEASURED)


def test_each_gpu_takes_the_one_device_correction(cache):
    _qwen_moe_kept()
    _, estimate, view = memory_answer("qwen1.5-moe-a2.7b", MemoryOptions(seq=8192, tp=4, gpu="4090"))
    assert view.module is None  # answered from the cost facts and the kept difference: no build, no trace
    layout = estimate.parallel.layout
    device = layout.device
    assert device.weights.bytes == 7_162_540_032 and device.weights.buffer_bytes == 512
    assert device.kv_cache.bytes == 24 * 8192 * 2 * 4 * 128 * 2 == 402_653_184  # 16 KV heads / tp 4
    assert device.workspace.bytes == 184_614_912
    # the correction whole and the formula's tp cut given back: 2 × intermediate 5,632 × (1 - 1/4) × 8,192 × 2 B
    # (the traced moment does not shrink with it: test_serving_expert_workspace.py traces a rank-shaped module)
    assert device.correction == 455_279_072 + 8192 * 2 * (5632 - 5632 // 4) * 2 == 593_691_104
    assert device.peak == estimate.peak == 7_162_540_032 + 512 + 402_653_184 + 184_614_912 + 593_691_104 \
        == 8_343_499_744
    assert any("adds the one-device correction whole, 455,279,072 B, and gives back the formula's own tp cut" in n
               for n in estimate.notes)
    assert not any("uncorrected" in n for n in estimate.notes)
    tried = dict((t, peak) for t, peak, _ in estimate.parallel.smallest.tried)
    assert tried[1] == 30_565_208_576 + 455_279_072  # the one-device answer, corrected
    assert estimate.parallel.smallest.tp == 2 and tried[2] == estimate.parallel.smallest.peak


# --------------------------------------------------------------------------- expert parallel (vLLM's --enable-expert-parallel)

QWEN_MOE = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "torch_dtype": "bfloat16",
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "intermediate_size": 96, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
            "num_experts": 6, "num_experts_per_tok": 2, "vocab_size": 128, "max_position_embeddings": 256,
            "tie_word_embeddings": False}


def test_vllm_linear_placement():
    from paramscope.cost.parallel.serving_experts import expert_ranges

    assert expert_ranges(6, 4) == ((0, 2), (2, 4), (4, 5), (5, 6))  # the first E mod ep ranks one more
    assert expert_ranges(60, 8)[0] == (0, 8) and expert_ranges(60, 8)[-1] == (53, 60)
    assert expert_ranges(8, 8) == tuple((r, r + 1) for r in range(8))


def test_expert_parallel_weights_are_the_real_experts_sliced_as_placed():
    """Qwen2-MoE, 6 experts over tp 4 with ep: rank 0 holds experts 0-1 whole; attention, the shared expert and
    the vocabulary stay tensor parallel. Held against the module's own expert tensors, built on meta and sliced
    rank by rank as vLLM's linear placement places them."""
    from paramscope.cost.parallel.serving_experts import expert_ranges

    _, estimate, view = memory_answer(QWEN_MOE, MemoryOptions(seq=64, tp=4, expert_parallel=True), use_cache=False,
                                      check=False)
    layout = estimate.parallel.layout
    device = layout.device
    module = view.module  # the class built on meta in bf16, as the answer read it
    assert type(module).__name__ == "Qwen2MoeForCausalLM" and module.model.layers[0].mlp.experts.down_proj.is_meta
    ranges = expert_ranges(6, 4)
    sliced = [sum(2 * t[start:stop].numel() for layer in module.model.layers
                  for t in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj)) for start, stop in ranges]
    whole = sum(2 * p.numel() for n, p in module.named_parameters() if ".mlp.experts." in n)
    assert sliced == [2 * 2 * (64 * 64 + 64 * 32) * 2] * 2 + [2 * 1 * (64 * 64 + 64 * 32) * 2] * 2 \
        == [49_152, 49_152, 24_576, 24_576] and sum(sliced) == whole == 147_456
    assert device.weights.by_role["moe.experts"] == sliced[0]
    # the rest per the tensor-parallel rules: q and o / 4, k and v one 16-wide head (2 KV heads replicated past
    # them), the shared expert / 4 (its one-output gate whole), router and norms whole, vocabulary / 4
    layer = (64 * 64 // 4 + 64 // 4) + 2 * (16 * 64 + 16) + 64 * 64 // 4 + 3 * 48 // 4 * 64 + 64 + 6 * 64 + 2 * 64
    rest = 2 * layer + 2 * (128 // 4) * 64 + 64
    assert rest == 2 * 7_024 + 4_096 + 64 == 18_208
    assert device.weights.bytes == sliced[0] + 2 * rest == 49_152 + 36_416 == 85_568
    assert device.kv_cache.bytes == 2 * 64 * 2 * 1 * 16 * 2 == 8_192  # 2 layers × 64 tokens × K, V × 1 head × 16
    assert layout.ep == 4 and layout.words() == "tp 4 with ep 4 = 4 GPUs"
    assert layout.rules["moe.experts"] == ("expert parallel: whole experts, 6 / ep 4 = 2 on the first 2 ranks, 1 on "
                                           "the rest (rank 0: 2) (vLLM's linear placement)")
    assert any("rank 0 holds experts 0–1" in n for n in estimate.notes)
    tp_only = memory_answer(QWEN_MOE, MemoryOptions(seq=64, tp=4), use_cache=False, check=False)[1]
    assert tp_only.parallel.layout.device.weights.by_role["moe.experts"] == whole // 4 == 36_864  # widths / 4


@pytest.mark.parametrize("argv, message", [
    (["--tp", "4", "--ep", "2"], "--ep 2: serving's expert-parallel size is vLLM's, TP × DP = --tp 4 × --dp 1 = 4"),
    (["--ep"], "--ep splits the routed experts over the tensor-parallel ranks"),
    (["--training", "--ep"], "--ep takes a degree E with --training"),
])
def test_expert_parallel_flags_refused_in_one_line(argv, message, capsys):
    from paramscope.cli import main

    assert main(["memory", "qwen1.5-moe-a2.7b", *argv]) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_dense_model_has_no_experts_to_split():
    from paramscope.errors import OptionError

    with pytest.raises(OptionError, match="has none"):
        memory_answer("llama-3-8b", MemoryOptions(seq=64, tp=2, expert_parallel=True), check=False)
