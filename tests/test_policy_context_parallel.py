"""FSDP2's MixedPrecisionPolicy beside context parallel (--cp C with --zero fsdp, FSDP2 over dp × cp as torchtitan
shards it) in the Llama family's closed form (cost/parallel/fsdp_moments.py over bf16-pure's step at S / cp tokens,
with each layer's ring attention output copied for o_proj, device_parts.ring_output_copies, and a moment inside each
layer's ring backward, fsdp_moments._ring_backward_bytes), against one rank traced on torch's ring and fake process
group with the policy applied: equal to the byte, with and without tp beside. Where sp splits the ring's tokens
again, or the ring runs unbalanced beyond cp 2, the closed form refuses and the rank is derived; the layout search
routes those alone to the derivation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import ParallelLayout
from paramscope.cost.parallel.layout_evaluation import policy_derived
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings
from paramscope.errors import UnsupportedError

# test_fsdp_policy_closed_form.py's cut (Llama-3's proportions at hidden size 128), 4 layers, a 512-token vocabulary
CUT = dict(hidden_size=128, intermediate_size=448, num_attention_heads=4, num_key_value_heads=1, vocab_size=512,
           num_hidden_layers=4)


def _closed(batch: int, seq: int, checkpointing: bool = False, vocab: int = 512, kv: int = 1, **layout):
    import transformers as T

    config = T.LlamaConfig(architectures=["LlamaForCausalLM"], **dict(CUT, vocab_size=vocab, num_key_value_heads=kv))
    _, estimate, view = training_answer(config, TrainingOptions(
        batch=batch, seq=seq, precision="bf16-mixed", fits=False, derive_layout=False,
        grad_checkpointing="full" if checkpointing else "none",
        layout=ParallelLayout(shard="fsdp", fsdp_mixed_precision="policy", **layout)), use_cache=False)
    return estimate.training.device, view


@pytest.mark.parametrize("seq, layout, peak, moment, words, fwd, fwd_where", [
    (128, dict(cp=4), 6_798_756, "the ring attention's", "2 × 16,384", 5_831_836,
     "FSDP2: layer 3's residual add in the forward"),
    (64, dict(cp=2, tp=2), 5_408_292, "MLP's norm", "3 × 8,192", 4_924_980, "end of forward"),
], ids=["cp 4", "cp 2 × tp 2"])
def test_the_policy_ring_rank_is_the_traced_rank(seq, layout, peak, moment, words, fwd, fwd_where):
    """2 sequences, 32 tokens a rank, layer 2's backward. cp 4: inside its ring backward (8,704 B over the MLP's
    norm, which the closed form alone gave); cp 2 × tp 2: the MLP's norm, the two layers below's and its own ring
    output copies held (B·(S / cp)·heads·head_dim × 2 B each, the rank's heads; 49,152 B under the trace without
    them at dp 2 × cp 2)."""
    device, view = _closed(2, seq, **layout)
    traced = trace_parallel_training(view.module, StepSettings(batch=2, seq=seq, precision="bf16-mixed",
                                                               optimizer="adamw"),
                                     shard="fsdp", mixed="policy", **layout)
    assert device.activations_from.startswith("analytic")
    assert device.peak == traced.peak.bytes == peak
    assert device.peak_figure.where == f"FSDP2: inside layer 2's backward ({moment})"
    assert f"ring attention's outputs copied for o_proj, {words}" in device.peak_figure.arithmetic
    # the forward's largest moment too: cp 4's the last layer's residual add (its all-gather output held, no unit
    # after it; 58,368 B under before it was named), cp 2 × tp 2's the end of forward
    forward = max((p for p in device.phases if p.phase == "forward"), key=lambda p: p.bytes)
    assert forward.bytes == next(p.bytes for p in traced.phases if p.phase == "forward") == fwd
    assert forward.where == fwd_where


@pytest.mark.parametrize("args, layout, peak, forward", [
    ((2, 64), dict(dp=2, cp=2), 6_790_052, 5_831_836),
    ((1, 64), dict(dp=2, cp=2, tp=2), 3_334_436, None),
    ((2, 512), dict(dp=2, cp=2), 20_765_092, 20_249_012),
    ((1, 32, False, 4008), dict(dp=2, cp=2), 12_647_844, 10_601_756),
    ((2, 128, True), dict(dp=2, cp=2), 6_768_804, 4_634_524),
    ((2, 68), dict(dp=2, cp=2), 6_863_796, 5_942_060),
    ((1, 256), dict(cp=8), 4_656_356, 3_668_188),
    ((1, 128), dict(dp=2, cp=4), 4_639_972, 3_668_188),
    ((2, 128, False, 512, 2), dict(cp=4), 7_093_668, 5_995_676),
    ((2, 128, False, 512, 2), dict(cp=4, tp=2), 3_770_276, None),
], ids=["dp 2 × cp 2", "dp 2 × cp 2 × tp 2", "2 × 512", "a 4,008-token vocabulary", "checkpointing", "unbalanced",
        "cp 8", "dp 2 × cp 4", "2 KV heads, cp 4", "2 KV heads, cp 4 × tp 2"])
def test_the_closed_form_at_each_traced_cut(args, layout, peak, forward):
    """Each traced equal (torch 2.13, not re-traced here to keep the file short): beside tp over 8 ranks, at 256
    tokens a rank, a vocabulary whose root outweighs the layers, full checkpointing (the recomputed layer's own copy
    alone), 68 tokens, which 2·cp does not divide (torch's ring runs unbalanced and copies nothing), the ring's
    backward peaking at cp 8, at dp 2 × cp 4 and with 2 KV heads (its K and V buffers twice as large). The forward's
    largest moment too, where traced (torch 2.13): the last layer's residual add (2 × 64, 68, cp 4 with 2 KV heads;
    at 2 × 64 58,368 B above the all-gather moment named before), the last layer's all-gather with the embedding's
    output held (cp 8, dp 2 × cp 4: 8,192 B under before), the end of forward or layer 0's all-gather."""
    device = _closed(*args, **layout)[0]
    assert device.peak == peak
    if forward is not None:
        assert max(p.bytes for p in device.phases if p.phase == "forward") == forward


def test_llama_3_8b_is_the_derived_rank():
    """llama-3-8b --dp 4 --cp 2 --zero fsdp --seq 8192 under the policy: the closed form (derivation off) is memory's
    derived rank to the byte, 48,421,584,532 B at the start of backward (its end of forward 47,370,944,156 B, also
    the derived rank's forward)."""
    options = TrainingOptions(batch=1, seq=8192, fits=False, derive_layout=False,
                              layout=ParallelLayout(dp=4, cp=2, shard="fsdp", fsdp_mixed_precision="policy"))
    device = training_answer("llama-3-8b", options)[1].training.device
    assert (device.peak, device.peak_figure.where) == (48_421_584_532, "start of backward")


@pytest.mark.parametrize("seq, layout, why", [
    (132, dict(cp=4), "context parallel 4 runs unbalanced at 132 tokens"),
])
def test_what_the_closed_form_does_not_price_is_refused_with_the_derivation_off(seq, layout, why):
    """cp 4 at 132 tokens, which 2·cp does not divide (torch's ring unbalanced: not traced beyond cp 2). cp 2 × tp 2
    with sp is priced (its in-layer moments as without sp, as beside tp alone: 44,672 B over the traced rank on 2 ×
    64 tokens, which peaks inside the ring's backward)."""
    with pytest.raises(UnsupportedError, match=why):
        _closed(2, seq, **layout)


def test_the_search_derives_only_the_ring_layouts_the_closed_form_does_not_price():
    facts = SimpleNamespace(text=SimpleNamespace(model_type="llama"), tied=None, experts=0, seq=2048)

    def derived(**layout):
        return policy_derived(ParallelLayout(shard="fsdp", fsdp_mixed_precision="policy", **layout), facts)
    assert not any(derived(**layout) for layout in (dict(dp=4, cp=2), dict(dp=2, cp=4), dict(cp=8), dict(dp=8)))
    # beside sp and under a pipeline too (memory answers pp × cp with the closed form: POLICY_BESIDE_CP)
    assert not derived(dp=2, cp=2, tp=2, sp=True) and not derived(dp=1, cp=2, pp=4)
    assert policy_derived(ParallelLayout(  # unbalanced: 2·cp = 16 does not divide 2,056
        cp=8, shard="fsdp", fsdp_mixed_precision="policy"), SimpleNamespace(**dict(vars(facts), seq=2056)))
