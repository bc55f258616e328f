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
    assert CutDifference(1, 64, 2, 9, 2).difference == 9  # the cut was the whole model


@pytest.mark.parametrize("change", [
    {"first": True}, {"short": 30}, {"long": 2}, {"second": None}, {"seq": 0}, {"first": 1 << 60}, {"extra": 1},
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
    path.write_text(json.dumps({**data, "difference": {**data["difference"], "second": -1}}))
    assert find_difference("Qwen2MoeForCausalLM", key, 1, 8192).difference is None  # the words follow the figures
    path.unlink()
    os.symlink("/dev/zero", path)  # not a regular file: one lstat, refused
    assert find_difference("Qwen2MoeForCausalLM", key, 1, 8192) is None


def test_measured_once_then_read_without_the_module(cache):
    calls = []

    def measure(module, dtype, batch, seq, encoder_seq):
        calls.append((dtype, batch, seq, encoder_seq))
        return CutDifference(batch, seq, 2, -10, 8, 4, -10)

    correct = CorrectionFor("config", True, measure)
    built = SimpleNamespace(class_name="X", module=object())
    assert correct(built, "bfloat16", 3, 64, None) == (-10, "at B=3, S=64 the analytic peak is -10 B from the traced "
                                                            "one on 2 layers and -10 B on 4")
    facts_only = SimpleNamespace(class_name="X", module=None)
    assert correct(facts_only, "bfloat16", 3, 64, None)[0] == -10
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
    assert device.correction == 455_279_072
    assert device.peak == estimate.peak == 7_162_540_032 + 512 + 402_653_184 + 184_614_912 + 455_279_072 \
        == 8_205_087_712
    assert any("adds the one-device correction whole, 455,279,072 B, a bound" in n for n in estimate.notes)
    assert not any("uncorrected" in n for n in estimate.notes)
    tried = dict((t, peak) for t, peak, _ in estimate.parallel.smallest.tried)
    assert tried[1] == 30_565_208_576 + 455_279_072  # the one-device answer, corrected
    assert estimate.parallel.smallest.tp == 2 and tried[2] == estimate.parallel.smallest.peak
