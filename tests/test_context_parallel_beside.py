"""Context parallelism beside tensor parallelism and FSDP2 (issue 28, --cp with --tp / --zero fsdp), composed as
torchtitan composes them: a (dp, cp, tp) device mesh, parallelize_module's plan on the tp submesh, torch's ring
attention on the cp submesh over the rank's local heads, FSDP2 over the flattened (dp, cp) ranks (dp_shard_cp). One
rank traced on torch's fake process group; the rank derived from such traces (derived/, keyed by the layout) equal to
it to the byte; the Llama family's closed form beside it, equal to it (8 B under until the one-device recipe's start
of backward took the shifted labels nll_loss's backward frees first; with --sp too, on the same cut: 2,841,772 B,
not pinned here, to keep the file short)."""

from __future__ import annotations

import pytest

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings
from paramscope.errors import ParamscopeError

from test_context_parallel import GPT2, LLAMA


def _answer(config, layout, **options):
    return training_answer(config, TrainingOptions(batch=2, seq=64, precision="bf16-mixed", layout=layout_for(
        **layout), fits=False, **options), use_cache=False)


def _traced(view, **layout):
    settings = StepSettings(batch=2, seq=64, precision="bf16-mixed", optimizer="adamw")
    return trace_parallel_training(view.module, settings, **layout)


@pytest.mark.parametrize("config, layout, traced, peak", [
    (GPT2, dict(devices=4, cp=2, tp=2), dict(cp=2, tp=2), 4_627_256),
    (GPT2, dict(devices=4, dp=2, cp=2, zero="fsdp", fsdp_mixed_precision="autocast"), dict(cp=2, dp=2, shard="fsdp"),
     4_612_408),
    (LLAMA, dict(devices=4, cp=2, tp=2), dict(cp=2, tp=2), 3_056_428),
    (GPT2, dict(devices=8, dp=2, cp=2, tp=2, sp=True, zero="fsdp", fsdp_mixed_precision="autocast"),
     dict(cp=2, tp=2, sp=True, dp=2, shard="fsdp"), 2_798_840),
], ids=["gpt2 cp×tp", "gpt2 cp×fsdp", "llama cp×tp", "gpt2 fsdp×cp×tp×sp"])
def test_the_derived_rank_equals_the_traced_rank(config, layout, traced, peak):
    """FSDP2 shards over dp × cp = 4 ranks: the trace's dp is 2 (its flattened mesh), the derived layout's shard
    degree 4; under sp the rank's S / cp tokens split again over tp between the blocks (the recipe in S / (2·cp·tp))."""
    _, estimate, view = _answer(config, layout)
    device = estimate.training.device
    assert device.activations_from.startswith("derived")
    step = _traced(view, **traced)
    assert estimate.peak == device.peak == step.peak.bytes == peak
    assert [p.bytes for p in device.phases[:2]] == [p.bytes for p in step.phases[:2]]
    notes = " ".join(device.notes)
    assert "torch's context_parallel ring attention" in notes and "equal to the byte" in notes
    assert ("on the tp rank's heads" in notes) == ("tp" in traced)
    assert ("FSDP2 over dp × cp = 4 ranks" in notes) == ("shard" in traced)
    if config is LLAMA:  # the closed form on the (cp, tp) rank's shard, equal (8 B under until the recipe's start of
        # backward took the shifted labels nll_loss's backward frees first and the masked token ids held there)
        _, closed, _ = _answer(config, layout, derive_layout=False)
        assert closed.training.device.activations_from.startswith("analytic")
        assert step.peak.bytes == closed.peak


@pytest.mark.parametrize("seq, layout, words", [
    (64, dict(devices=6, dp=3, cp=2, zero="hybrid_shard", shard_group=3), "hybrid sharding over 3 ranks"),
    (68, dict(devices=4, cp=2, tp=2, sp=True), "2·cp·tp = 8 divides S"),
], ids=["hsdp group", "sp length"])
def test_what_a_derived_class_is_refused_in_one_line(seq, layout, words):
    """Hybrid sharding over a group cp does not divide (torchtitan shards over dp_shard × cp); under sp a length 2·cp
    divides and 2·cp·tp does not."""
    with pytest.raises(ParamscopeError, match=words) as refusal:
        training_answer(GPT2, TrainingOptions(batch=1, seq=seq, layout=layout_for(**layout)), use_cache=False)
    assert "\n" not in str(refusal.value)
