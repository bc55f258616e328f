"""The analytic per-device step against one rank traced on torch's fake process group (issue 28 §3).

Each case builds the real class, applies FSDP2 (`fully_shard`) and/or DTensor tensor parallelism as
traced/parallel.py does (the rules read from transformers' tp plans), runs one steady step measured by MemTracker,
and holds the analytic device peak (memory/training.py → parallel/estimate.py) to it. The issue asks for 1%; every
case here agrees within 0.05% (most to 8 bytes), on Llama, Qwen2, Gemma-2 (tied, eager), Mixtral and Qwen2-MoE
(MoE), and BERT (an encoder), in bf16-mixed, fp32 and bf16-pure.

Known and named, not tested here: FSDP2's backward can peak inside a layer where the sequence is short against the
vocabulary and the root unit (the root's gradients stay unsharded until its reduce-scatter at the end of backward);
there the analytic figure is low (Llama-3-8B cut to 4 layers at 512 tokens: −12%; at 2,048 tokens, full depth, dp 8:
+16 KB of 51 GB). `--trace` gives the traced rank beside the answer.
"""

from __future__ import annotations

import pytest

from paramscope.cli import main
from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import layout_for

from parallel_steps import derived_and_traced


def _decoder(model_type="llama", arch="LlamaForCausalLM", layers=2, vocab=8192, **extra):
    config = dict(model_type=model_type, architectures=[arch], hidden_size=256, intermediate_size=512,
                  num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4, vocab_size=vocab,
                  max_position_embeddings=4096, tie_word_embeddings=False)
    config.update(extra)
    return config


MIXTRAL = _decoder("mixtral", "MixtralForCausalLM", layers=4, num_local_experts=4, num_experts_per_tok=2)
QWEN2_MOE = _decoder("qwen2_moe", "Qwen2MoeForCausalLM", layers=4, moe_intermediate_size=128,
                     shared_expert_intermediate_size=256, num_experts=4, num_experts_per_tok=2)
BERT = dict(model_type="bert", architectures=["BertForMaskedLM"], hidden_size=256, intermediate_size=1024,
            num_hidden_layers=4, num_attention_heads=4, vocab_size=8192, max_position_embeddings=512)
GEMMA2 = _decoder("gemma2", "Gemma2ForCausalLM", vocab=1024, head_dim=32, tie_word_embeddings=True)


_both = derived_and_traced


CASES = [
    ("llama fsdp dp4", _decoder(), dict(devices=4, zero="fsdp"), {}),
    # tp 2 with and without sp: test_tensor_parallel_moments_equal_the_trace_phase_by_phase, moment by moment
    ("llama tp4 sp", _decoder(), dict(devices=4, tp=4, sp=True), {}),
    ("llama tp8, KV heads replicated", _decoder(), dict(devices=8, tp=8), {}),
    ("llama dp2 fsdp × tp2 sp", _decoder(), dict(devices=4, tp=2, sp=True, zero="fsdp"), dict(seq=256)),
    ("llama tp2 sp fp32", _decoder(), dict(devices=2, tp=2, sp=True), dict(precision="fp32")),
    ("llama tp2 sp bf16-pure", _decoder(), dict(devices=2, tp=2, sp=True), dict(precision="bf16-pure")),
    ("qwen2 tp2 sp", _decoder("qwen2", "Qwen2ForCausalLM"), dict(devices=2, tp=2, sp=True), {}),
    ("gemma-2 tp2 sp, tied, eager", GEMMA2, dict(devices=2, tp=2, sp=True), dict(attention="eager")),
    ("gemma-2 tp2 sp bf16-pure", GEMMA2, dict(devices=2, tp=2, sp=True),
     dict(attention="eager", precision="bf16-pure")),
    ("mixtral fsdp dp4", MIXTRAL, dict(devices=4, zero="fsdp"), dict(seq=256)),
    ("qwen2-moe fsdp dp4", QWEN2_MOE, dict(devices=4, zero="fsdp"), dict(seq=256)),
    ("bert fsdp dp4", BERT, dict(devices=4, zero="fsdp"), dict(seq=256)),
]


@pytest.mark.parametrize("name, config, layout, point", CASES, ids=[c[0] for c in CASES])
def test_analytic_device_peak_equals_the_traced_rank(name, config, layout, point):
    estimate, traced = _both(config, layout_for(**layout), **point)
    assert abs(estimate.peak - traced.peak.bytes) <= 5e-4 * traced.peak.bytes, (
        name, estimate.peak, traced.peak.bytes, estimate.peak_phase, traced.peak.phase)


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2 sp"])
def test_tensor_parallel_moments_equal_the_trace_phase_by_phase(sp):
    """tp 2 on Llama, with and without sp: the backward's peak and the optimizer step (with the embedding's whole
    gradient: torch's DTensor gives a vocabulary-parallel embedding its gradient Replicate) to the byte. The start of
    backward was 8 B under until the recipe took the shifted labels nll_loss's backward frees first and the
    embedding's masked token ids were held there too; the step 1,024 B under until it held the token ids the rank's
    DTensor input aliases (8·T, estimate.held_at_step, as the derived rank does). The forward's peak too: with sp it
    was 4·T·h·(1 − 1/t) = 65,536 B over until the final norm's fp32 output, which the model's output holds as the
    loss is taken, was counted on the rank's S / t tokens."""
    estimate, traced = _both(_decoder(vocab=8192), layout_for(devices=2, tp=2, sp=sp))
    analytic = {p.where: p.bytes for p in estimate.training.device.phases}
    measured = {p.phase: p.bytes for p in traced.phases}
    assert measured["backward"] == analytic["start of backward"]
    assert measured["optimizer step"] == analytic["optimizer step"]
    assert "the token ids 8·B·S = 1,024 B" in next(p.arithmetic for p in estimate.training.device.phases
                                                   if p.where == "optimizer step")
    assert measured["forward"] == analytic["end of forward"]
    assert estimate.peak == traced.peak.bytes


def test_trace_flag_checks_one_rank(tmp_path, capsys):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_decoder()))
    assert main(["memory", str(path), "--training", "--batch", "2", "--seq", "64", "--devices", "2", "--tp", "2",
                 "--sp", "--trace", "--width", "200", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "note: check: rank 0's step traced on torch's fake process group" in out
    import re

    assert re.search(r"the analytic [\d,]+ B is [+-]0\.0\d\d% from it", out), out[-2000:]


DEEP = 6  # layers: the derived engine cuts a model of 4 or more


@pytest.mark.parametrize("name, config, layout, point", [
    ("llama fsdp dp4, short sequence", _decoder(layers=DEEP, vocab=1024), dict(devices=4, zero="fsdp"), {}),
    ("llama fsdp dp2 × tp2", _decoder(layers=DEEP, vocab=1024), dict(devices=4, tp=2, zero="fsdp"), {}),
    ("bert tp2 (no closed form per rank)", dict(BERT, num_hidden_layers=DEEP), dict(devices=2, tp=2),
     dict(seq=128)),
    ("bert fsdp dp4", dict(BERT, num_hidden_layers=DEEP, vocab_size=1024), dict(devices=4, zero="fsdp"),
     dict(seq=128)),
    # post-norm: the LayerNorms after the residual adds run SequenceParallel, attention.self and intermediate gather
    ("bert tp2 sp (post-norm)", dict(BERT, hidden_size=128, intermediate_size=256, num_hidden_layers=DEEP,
                                     vocab_size=1024), dict(devices=2, tp=2, sp=True), dict(batch=1, seq=64)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_derived_device_step_equals_the_traced_rank(name, config, layout, point):
    """Where the closed form does not hold the step (FSDP2's in-backward buffers at short sequences; a class without
    a per-rank recipe under tensor parallelism), one rank's step is derived from traces of short cuts with the
    layout applied, and equals the whole model's traced rank (to the byte in the forward; within 0.01% here)."""
    estimate, traced = _both(config, layout_for(**layout), **point)
    assert estimate.engine == "derived", estimate.notes
    assert abs(estimate.peak - traced.peak.bytes) <= 1e-4 * traced.peak.bytes, (
        name, estimate.peak, traced.peak.bytes)


def test_sequence_parallel_is_derived_in_tokens_per_rank():
    """FSDP2 × tp 2 + SP: a rank holds S / t of the tokens between blocks, a dimension no integer form of S gives, so
    the step is derived in S' = S / t from traces at multiples of t, and equals the traced rank to the byte (the
    closed form is −1.6% here: it misses FSDP2's in-backward buffers). A length t does not divide is not derived."""
    from paramscope.cost.derived.recipe import recipe_from_json, recipe_to_json
    from paramscope.cost.derived.step import DerivedStep
    from paramscope.cost.traced.step import StepSettings

    config = _decoder(layers=DEEP, vocab=1024)
    estimate, traced = _both(config, layout_for(devices=4, tp=2, sp=True, zero="fsdp"), batch=1, seq=128)
    assert estimate.engine == "derived", estimate.notes
    assert estimate.peak == traced.peak.bytes
    assert any("sizes in S' = S / 2" in note for note in estimate.notes), estimate.notes

    _, _, view = training_answer(config, TrainingOptions(batch=1, seq=128), use_cache=False)
    settings = StepSettings(precision="bf16-mixed", optimizer="adamw", layout=(2, "fsdp", 2, True))
    step = DerivedStep.first(view.module, view.class_name, view.config, settings, batch=1, seq=128, limit=4096)
    recipe = step.recipe
    assert recipe.seq_unit == 2 and recipe.covers(1, 128) and not recipe.covers(1, 127)
    assert step.at(1, 127) is None and step.declined == []  # an odd length: not derived, and not held against S even
    assert recipe_from_json(recipe_to_json(recipe)) == recipe
    assert "S′" in recipe.words("backward", 1, 128) and "S' = S / 2 = 64" in recipe.words("backward", 1, 128)
