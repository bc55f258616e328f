"""Each device's printed peak line is the whole sum it names: resident model states + the moment's own terms = the
printed figure, to the byte (the project's rule: every figure expands to arithmetic that sums to it).

The line's grammar, which the device moments keep: top-level terms joined by " + " (or "; "), each opening on its
value or ending on it ("8·T·V = 2,101,346,304"), its parts in parentheses, and " = total" at the end."""

from __future__ import annotations

import re

import pytest

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.render.memory import render_memory_text

NUMBER = re.compile(r"\d[\d,]*")


def _top_level_terms(body: str) -> list[tuple[int, str]]:
    """(sign, text) of each term outside parentheses, split on " + ", " − " and "; "."""
    terms, depth, start, sign, i = [], 0, 0, 1, 0
    while i < len(body):
        char = body[i]
        depth += char == "("
        depth -= char == ")"
        for sep, next_sign in ((" + ", 1), (" − ", -1), ("; + ", 1), ("; ", 1)):
            if depth == 0 and body.startswith(sep, i):
                terms.append((sign, body[start:i]))
                sign, start, i = next_sign, i + len(sep), i + len(sep) - 1
                break
        i += 1
    terms.append((sign, body[start:]))
    return terms


def _value(term: str) -> int:
    """The term's value: its last number outside parentheses (none: a term in words alone, 0)."""
    flat, depth = [], 0
    for char in term:
        depth += char == "("
        if depth == 0:
            flat.append(char)
        depth -= char == ")"
    numbers = NUMBER.findall("".join(flat))
    return int(numbers[-1].replace(",", "")) if numbers else 0


def _peak_line(report, estimate) -> tuple[int, str]:
    text = render_memory_text(report, estimate, width=3000)
    line = next(row for row in text.splitlines() if re.match(r"^\s*peak \((forward|backward|optimizer step)\)\s+[\d,]+"
                                                             r"\s+\S+ \S+\s+.*resident", row))
    printed = int(re.match(r"^\s*peak \([^)]*\)\s+([\d,]+)", line).group(1).replace(",", ""))
    return printed, line


def _check(report, estimate) -> str:
    printed, line = _peak_line(report, estimate)
    assert printed == estimate.training.device.peak
    body = line[line.index("resident "):]
    total = re.search(r" = ([\d,]+)$", body.rstrip())
    assert total and int(total.group(1).replace(",", "")) == printed, line
    terms = _top_level_terms(body[:total.start()])
    assert sum(sign * _value(term) for sign, term in terms) == printed, (terms, line)
    return line


def _gpt2_cut():
    import transformers as T

    return T.GPT2Config(n_embd=128, n_head=4, n_layer=5, vocab_size=500, bos_token_id=0, eos_token_id=0,
                        architectures=["GPT2LMHeadModel"])


def _answer(config, layout: ParallelLayout, batch: int, seq: int, **more):
    return training_answer(config, TrainingOptions(batch=batch, seq=seq, layout=layout, fits=False, **more))[:2]


@pytest.mark.parametrize("layout, batch, seq, shown", [
    (ParallelLayout(pp=4, micro_batches=8, schedule="gpipe"), 8, 2048, "saved 77,092,552,768"),
    (ParallelLayout(pp=4, micro_batches=8, schedule="1f1b"), 8, 2048, "= 15,846,604,800"),
    (ParallelLayout(tp=2), 1, 2048, "saved 20,054,564,864"),
])
def test_llama_3_8b_device_peaks_sum_to_their_figure(layout, batch, seq, shown):
    report, estimate = _answer("llama-3-8b", layout, batch, seq)
    line = _check(report, estimate)
    assert shown in line


def test_the_pipeline_heading_names_the_stage_shown():
    report, estimate = _answer("llama-3-8b", ParallelLayout(pp=4, micro_batches=8, schedule="gpipe"), 8, 2048)
    text = render_memory_text(report, estimate, width=3000)
    # the last stage (its head, the logits' gradient) peaks highest: its figures, its rank, named as such
    assert "One device, pipeline stage 3 at rank 3 (pp outermost" in text
    assert "its peak is the largest of the 4 stages'" in text
    assert "rank 0, the largest share" not in text
    # the JSON and the HTML page say the same: the device shown, and the peak as its whole sum
    import html

    from paramscope.render.html.cost import render_memory_html
    from paramscope.render.memory import memory_to_dict

    device = memory_to_dict(estimate)["layout"]["device"]
    assert device["shown"].startswith("One device, pipeline stage 3 at rank 3")
    assert device["peak"]["arithmetic"] in text
    assert device["peak"]["arithmetic"].endswith(f" = {device['peak']['bytes']:,}")
    page = render_memory_html(report, estimate)
    assert html.escape(device["shown"]) in page and html.escape(device["peak"]["arithmetic"]) in page


def test_a_derived_gpt2_cut_pipeline_peak_sums_to_its_figure():
    report, estimate = _answer(_gpt2_cut(), ParallelLayout(pp=2, micro_batches=2, schedule="1f1b"), 2, 32,
                               precision="bf16-mixed")
    assert estimate.training.device.stages[0].replayed is not None  # derived: the stages replayed from the recipe
    _check(report, estimate)


def test_a_llama_cut_context_parallel_peak_sums_to_its_figure():
    """cp 2 on a 2-layer cut (the closed form, the ring's buffers added with their values)."""
    import transformers as T

    config = T.LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
                           vocab_size=500, num_hidden_layers=2, architectures=["LlamaForCausalLM"])
    report, estimate = _answer(config, ParallelLayout(cp=2), 1, 256)
    _check(report, estimate)


def test_a_derived_gpt2_cut_tensor_parallel_peak_sums_to_its_figure():
    """tp 2 on a GPT-2 cut: one rank's step derived from traces (as llama-3-8b's cp 2, ~15 s there); its closed
    form's value opens the term, the resident states before it."""
    report, estimate = _answer(_gpt2_cut(), ParallelLayout(tp=2), 2, 64, precision="bf16-mixed")
    line = _check(report, estimate)
    assert "(live at the " in line and estimate.training.device.activations_from.startswith("derived")
