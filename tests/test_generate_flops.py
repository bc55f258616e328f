"""`flops --generate N` (issue 31 §2): generate()'s FLOPs — the prefill with the lm head on the last token only, and
the decode steps over the growing cache — analytic once checked against FlopCounterMode, traced where not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paramscope.cost.flops.estimate import FlopOptions, estimate_flops

CONFIGS = Path(__file__).parent / "configs"
BENCH = Path(__file__).parent.parent / "bench" / "configs"


def test_llama3_8b_generates_256_tokens_after_1024_exactly():
    estimate = estimate_flops("llama-3-8b", FlopOptions(seq=1024, generate=256))
    g = estimate.generation
    assert g.engine == "analytic" and g.check.status == "equal"
    head = 2 * 4096 * 128_256  # one token's logits
    assert g.prefill == estimate.forward - 1023 * head == 14_844_457_648_128
    assert g.head_skipped == 1023 * head
    weights = 7_504_658_432  # the matmul weights a token meets, the head's included
    per_key = 32 * 2 * 32 * (128 + 128)  # 32 layers × 2 × heads × (d_qk + d_v)
    assert g.first_step == 2 * weights + per_key * 1025 == 15_546_712_064
    assert g.last_step == 2 * weights + per_key * 1279 == 15_679_881_216
    assert g.decode == sum(2 * weights + per_key * keys for keys in range(1025, 1280)) == 3_981_390_643_200
    assert g.total == 18_825_848_291_328


@pytest.mark.parametrize("model, seq, new", [
    ("mistral-7b", 4090, 12),  # the window (4,096) crossed mid-decode
    ("gemma-2-2b", 4093, 8),  # sliding and full layers alternate
    ("deepseek-v3", 40, 6),  # MLA decompresses every cached latent each step
    ("gpt2", 100, 5),
    ("Qwen--Qwen3-0.6B.json", 64, 9),
])
def test_the_analytic_generation_equals_flopcountermode_step_by_step(model, seq, new):
    """On a cut of each class, both engines' prefill and every decode step (the traced one sums stretches on the
    line its traced steps draw, checked on a third)."""
    from paramscope.api import inspect_module, inspect_with_module
    from paramscope.cost.engine_check import check_cut
    from paramscope.cost.flops.generation import analytic_generation, traced_generation
    from paramscope.cost.model_view import from_module
    from paramscope.cost.traced.flops import count_generation

    _, module = inspect_with_module(str(BENCH / model) if model.endswith(".json") else model)
    cut, _, _ = check_cut(module)
    analytic = analytic_generation(from_module(cut), inspect_module(cut).params, batch=2, seq=seq, new_tokens=new)
    traced = traced_generation(cut, batch=2, seq=seq, new_tokens=new)
    every = count_generation(cut, 2, seq, new - 1)
    assert (analytic.prefill, analytic.decode) == (traced.prefill, traced.decode) == (every.prefill, sum(every.steps))
    assert (analytic.first_step, analytic.last_step) == (every.steps[0], every.steps[-1])


def test_a_class_the_analytic_engine_miscounts_generates_by_trace(tmp_path, monkeypatch):
    """LFM2's convolutions run in every decode step too: the forward's check differs, and FlopCounterMode counts
    generate()."""
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    config = json.loads((CONFIGS / "families" / "LiquidAI--LFM2-1.2B.json").read_text()) | {"num_hidden_layers": 4,
                                                                                           "full_attn_idxs": [2]}
    estimate = estimate_flops(config, FlopOptions(seq=40, generate=6))
    assert estimate.engine == "traced" and estimate.generation.engine == "traced"
    from paramscope.api import inspect_with_module
    from paramscope.cost.traced.flops import count_generation

    _, module = inspect_with_module(config)
    every = count_generation(module, 1, 40, 5)
    assert (estimate.generation.prefill, estimate.generation.decode) == (every.prefill, sum(every.steps))


def test_a_prompt_without_seq_is_shortened_to_fit_learned_positions():
    estimate = estimate_flops("gpt2", FlopOptions(generate=100))
    assert estimate.seq == 925 and estimate.notes[0] == (
        "the prompt is 925 tokens, so that it and the 100 new tokens fit the model's 1,024 positions")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "paramscope", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, line", [
    (["gpt2", "--generate", "10", "--training"], "error: --generate counts generation, which does not train: drop "
                                                 "--training"),
    (["gpt2", "--generate", "0"], "error: --generate must be between 1 and 16,777,216 new tokens, got 0"),
    (["gpt2", "--generate", "10", "--seq", "1024"], "error: --generate 10 after a 1,024-token prompt reaches position "
                                                    "1,033, beyond the model's 1,024 learned positions"),
    (["bert-base-uncased", "--generate", "10"], "error: BertForMaskedLM does not generate: --generate is for causal "
                                                "language models"),
    (["t5-small", "--generate", "10"], "error: --generate counts decoder-only models here; "
                                       "T5ForConditionalGeneration is an encoder-decoder"),
    (["gpt2", "--generate", "10", "--causal", "half"], "error: --causal half halves a forward's masked scores; "
                                                       "generate()'s decode steps mask none, so --generate counts in "
                                                       "full"),
])
def test_bad_generate_options_are_one_line(args, line):
    result = _cli("flops", *args)
    assert result.returncode != 0 and result.stderr.strip() == f"paramscope: {line}", result.stderr


def test_the_cli_shows_and_writes_generation(tmp_path):
    result = _cli("flops", "gpt2", "--seq", "512", "--generate", "64", "--width", "120")
    assert result.returncode == 0, result.stderr
    assert "generate(): 64 new tokens after the 512-token prompt (analytic engine)" in result.stdout
    result = _cli("flops", "gpt2", "--seq", "512", "--generate", "64", "--json")
    document = json.loads(result.stdout)
    generation = document["flops"]["generation"]
    assert generation["new_tokens"] == 64 and generation["engine"] == "analytic"
    assert generation["total"] == generation["prefill"] + generation["decode"]
    assert generation["check"]["status"] == "equal" and document["flops"]["settings"]["generate"] == 64


def test_the_text_gives_each_generation_figure_exactly():
    from paramscope.render.flops import render_flops_text

    estimate = estimate_flops("llama-3-8b", FlopOptions(seq=1024, generate=256))
    text = render_flops_text(estimate.report, estimate, estimate.compute, width=140)
    rows = {line.split()[0] + (" " + line.split()[1] if line.split()[0] in ("per", "first", "last") else ""):
            line.split() for line in text.splitlines() if line.strip()}
    assert rows["prefill"][1] == "14,844,457,648,128"
    assert rows["first decode"][3] == "15,546,712,064" and rows["last decode"][3] == "15,679,881,216"
    assert rows["generate()"][1] == "18,825,848,291,328"
    assert rows["per new"][3] == f"{18_825_848_291_328 // 256:,}" == "73,538,469,888"
