"""Issue 25 §4: the analytic engine's peak, as `paramscope memory PRESET --training` answers it (bf16-mixed, AdamW,
no checkpointing: the default), against the full-depth step of the real class, for every preset family at three
batch × seq points.

The full-depth step is the derived engine's, derived afresh and checked by a trace at the first point (its recipes
equal a full trace of every layer to the byte: tests/test_derived_memory.py); where the class has no single stack of
layers to cut (ALBERT's shared layer, T5's and BART's two stacks), every layer is traced at each point. Five
families whose step can peak inside a layer, where no analytic moment reaches (ELECTRA's discriminator and the bare
DeBERTa, without vocabulary-wide logits; the MoE decoders' experts backward, Mixtral, Qwen2-MoE and DeepSeek-V3,
whose attention backward also runs the math kernel), are answered by the derived engine, and their rows check that
it is what answers.
"""

from __future__ import annotations

import pytest

from paramscope import TrainingOptions, estimate_training

# the five families the derived engine answers derive their first point twice with the same cuts, points and settings:
# the answer's derivation, then the full-depth step's, afresh; their cuts' recorded steps are traced once
pytestmark = pytest.mark.usefixtures("shared_traces")

# three points in one regime (B ≥ 2, S under every window), so that one derivation answers them; batch 1 is held
# to the full-depth step by the Llama-2-7B test below
DECODER_POINTS = ((2, 512), (4, 1024), (2, 2040))
ENCODER_POINTS = ((2, 128), (4, 256), (2, 512))
TRACED_POINTS = ((2, 64), (4, 128), (2, 256))  # every layer traced at each: shorter

# (preset, model class or None for the preset's own, points, the analytic recipe that answers or None)
FAMILIES = [
    ("llama-2-7b", None, DECODER_POINTS, "Llama-style decoder"),  # its step peaks in the forward
    ("mistral-7b", None, DECODER_POINTS, "Llama-style decoder"),
    ("qwen2.5-0.5b", None, DECODER_POINTS, "Llama-style decoder"),  # tied embedding
    ("gemma-2b", None, DECODER_POINTS, "Gemma decoder"),
    ("gemma-2-2b", None, DECODER_POINTS, "Gemma-2 decoder"),  # eager attention
    ("phi-3-mini-4k-instruct", None, DECODER_POINTS, "Phi-3 decoder"),  # 2,048 fills its 2,047-token window
    ("mixtral-8x7b", None, DECODER_POINTS, None),  # the experts' backward peaks inside the first layer
    ("qwen1.5-moe-a2.7b", None, DECODER_POINTS, None),
    ("gpt2", None, ((2, 256), (4, 512), (2, 1024)), "GPT-2"),
    ("pythia-410m", None, DECODER_POINTS, "GPT-NeoX"),
    ("gpt-j-6b", None, DECODER_POINTS, "GPT-J"),
    ("bert-base-uncased", None, ENCODER_POINTS, "BERT masked LM"),
    ("roberta-base", None, ENCODER_POINTS, "RoBERTa masked LM"),
    ("distilbert-base-uncased", None, ENCODER_POINTS, "DistilBERT masked LM"),
    ("modernbert-base", None, DECODER_POINTS, "ModernBERT masked LM"),
    ("deberta-v3-base", "DebertaV2ForMaskedLM", ENCODER_POINTS, "DeBERTa-v2 masked LM"),
    ("albert-base-v2", None, TRACED_POINTS, "ALBERT masked LM"),
    ("t5-small", None, TRACED_POINTS, "T5 (v1)"),
    ("bart-base", "BartForConditionalGeneration", TRACED_POINTS, "BART"),
    ("electra-base-discriminator", None, ENCODER_POINTS, None),
    ("deberta-v3-base", None, ENCODER_POINTS, None),
    ("deepseek-v3", None, DECODER_POINTS, None),
]


def _full_depth_peaks(preset: str, model_class: str | None, points, estimates) -> list[int]:
    """The full-depth step's peak at each point: derived afresh (and checked by a trace) where the class has one stack
    of layers to cut, else every layer traced."""
    from paramscope.api import inspect_with_module
    from paramscope.cost.derived.step import DerivedStep
    from paramscope.cost.derived.symbols import NotDerivable
    from paramscope.cost.traced.step import StepSettings

    _, module = inspect_with_module(preset, model_class=model_class, dtype="float32")  # bf16-mixed: fp32 weights
    settings = StepSettings(precision="bf16-mixed", optimizer="adamw")
    try:
        step = DerivedStep.first(module, type(module).__name__, module.config, settings, batch=points[0][0],
                                 seq=points[0][1], limit=None, fresh=True)
    except NotDerivable:
        return [estimate_training(preset, TrainingOptions(batch=batch, seq=seq, trace=True),
                                  model_class=model_class).peak for batch, seq in points]
    peaks = []
    for (batch, seq), estimate in zip(points, estimates):
        figures = step.at(batch, seq)
        assert figures is not None, step.declined
        states = estimate.training.states
        resident = estimate.weights.bytes + estimate.weights.buffer_bytes + states.optimizer.bytes + \
            states.master_weights.bytes
        optimizer_step = [p for p in estimate.training.phases if p.phase == "optimizer step"][0].bytes
        peaks.append(max(resident + figures.forward, resident + figures.backward, optimizer_step))
    return peaks


@pytest.mark.parametrize("preset, model_class, points, recipe", FAMILIES,
                         ids=[f"{preset}-{model_class or 'preset'}" for preset, model_class, _, _ in FAMILIES])
def test_the_default_answer_is_within_0_1_percent_of_the_full_depth_step(preset, model_class, points, recipe):
    # the peak at each point (no fits table: its searches would derive the five derived families again at batch 1,
    # a regime of its own that no point here reaches)
    estimates = [estimate_training(preset, TrainingOptions(batch=batch, seq=seq, fits=False), model_class=model_class)
                 for batch, seq in points]
    full = _full_depth_peaks(preset, model_class, points, estimates)
    for (batch, seq), estimate, peak in zip(points, estimates, full):
        if recipe is None:  # its step can peak inside a layer: derived, the recipe's figure beside as a check
            assert estimate.engine == "derived", (batch, seq)
            assert estimate.peak == peak, (batch, seq)
            assert any(note.startswith("check: the analytic peak is") for note in estimate.notes)
            continue
        assert estimate.engine == "analytic" and estimate.settings["activations_from"] == f"analytic: {recipe}"
        assert abs(estimate.peak - peak) <= 0.001 * peak, (batch, seq, estimate.peak, peak)


def test_llama_2_7b_peaks_in_its_forward_and_the_analytic_moment_holds_it_to_a_few_bytes():
    """The family whose forward peak the analytic engine missed by 0.88% (issue 25): at 1 × 2,048 the full-depth
    step (110,830,888,604 B, docs/benchmarks.md) peaks as the loss is taken, and the analytic moment is it to the
    byte (16,384 B = 8·S above it until the recipe took the batch-1 shifted labels as a view of the padded ones,
    counting the pad's one element rather than the whole padded labels)."""
    points = ((1, 2048),)
    estimates = [estimate_training("llama-2-7b", TrainingOptions(batch=1, seq=2048))]
    [peak] = _full_depth_peaks("llama-2-7b", None, points, estimates)
    assert peak == 110_830_888_604
    assert estimates[0].peak_phase == "forward" and estimates[0].peak == peak
