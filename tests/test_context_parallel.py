"""Context parallelism for classes whose step is derived from traces (issue 28 §1, --cp): one rank's step under
torch's ring attention (traced/context_parallel.py) traced on torch's fake process group, the derived recipe of that
rank (derived/, cp in the layout key) held to it to the byte, and the layouts it does not answer refused in a line."""

from __future__ import annotations

import pytest

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import layout_for
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings
from paramscope.errors import ParamscopeError

MIXTRAL = dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=64, intermediate_size=96,
               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
               max_position_embeddings=4096, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
# six layers: the rank's forward frees a few bytes per layer at its end (outside the layers), which the derivation
# reads from a longer cut and checks on a third (derive.choose_depths)
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=64, n_layer=6, n_head=4, vocab_size=512,
            n_positions=1024, attn_pdrop=0.0)


def _derived_and_traced(config, cp, *, batch=2, seq=64):
    report, estimate, view = training_answer(config, TrainingOptions(
        batch=batch, seq=seq, precision="bf16-mixed", layout=layout_for(devices=cp, cp=cp), fits=False),
        use_cache=False)
    traced = trace_parallel_training(view.module, StepSettings(batch=batch, seq=seq, precision="bf16-mixed",
                                                               optimizer="adamw"), cp=cp)
    return estimate, traced


def test_derived_cp_rank_equals_the_traced_rank():
    estimate, traced = _derived_and_traced(GPT2, 2)
    device = estimate.training.device
    assert device.activations_from.startswith("derived")
    assert estimate.peak == device.peak == traced.peak.bytes
    notes = " ".join(device.notes)
    assert "torch's context_parallel ring attention, rank 0" in notes and "equal to the byte" in notes
    assert "all-gathered at once" in notes  # the ring's buffers named


# a Llama-family class has the closed form too (the recipe at S / cp tokens and the ring's kept output copies): the
# derived rank answers, the closed form beside it as a check
LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=96,
             num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
             max_position_embeddings=4096, tie_word_embeddings=False)


def test_a_llama_cp_rank_is_derived_and_checked_by_its_closed_form():
    estimate, traced = _derived_and_traced(LLAMA, 2)
    device = estimate.training.device
    assert device.activations_from.startswith("derived")
    assert estimate.peak == device.peak == traced.peak.bytes
    closed = next(n for n in device.notes if n.startswith("check: the closed form gives"))
    assert "% from the derived peak" in closed


def test_the_ring_is_traced_where_the_tracker_sees_it():
    """torch's ring runs where the dispatch modes see its buffers: the all-gathered K and V of both ranks, 2 × 2·B·
    (S / 2)·kv·head_dim × 2 B (bf16 under autocast), among the rank's allocations; a Mixtral rank (GQA: 2 KV heads
    for 4 query heads) traces too."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    from paramscope.cost.traced.timeline import record_training_step

    config = {k: v for k, v in MIXTRAL.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        model = MixtralForCausalLM(MixtralConfig(**config, attn_implementation="sdpa"))
    settings = StepSettings(batch=2, seq=64, precision="bf16-mixed", optimizer="adamw",
                            layout=(1, "none", 1, False, 0, 1, 2))
    timeline = record_training_step(model, settings, "model.layers")
    gathered = 2 * (2 * 2 * 32 * 2 * 16) * 2
    assert gathered in {a.nbytes for a in timeline.allocations}


BERT = dict(model_type="bert", architectures=["BertForMaskedLM"], hidden_size=64, intermediate_size=128,
            num_hidden_layers=4, num_attention_heads=4, vocab_size=512, max_position_embeddings=512)


@pytest.mark.parametrize("config, seq, layout, words", [
    (dict(GPT2, attn_pdrop=0.1), 64, dict(devices=2, cp=2), "attention dropout 0.1 "),
    (dict(GPT2, attn_pdrop=0.1), 66, dict(devices=2, cp=2), "2·cp = 4 divides"),
    (BERT, 64, dict(devices=2, cp=2), "bidirectional"),
    (dict(GPT2, attn_pdrop=0.1), 64, dict(devices=4, tp=2, cp=2), "attention dropout 0.1 "),
], ids=["dropout", "unbalanced", "encoder", "beside tp"])
def test_cp_refusals(config, seq, layout, words):
    with pytest.raises(ParamscopeError, match=words):
        training_answer(config, TrainingOptions(batch=1, seq=seq, layout=layout_for(**layout)), use_cache=False)


def test_a_step_that_never_calls_sdpa_is_refused():
    """Eager attention never reaches F.scaled_dot_product_attention: the rank would attend to its own tokens alone."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = {k: v for k, v in GPT2.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(**dict(config, n_layer=1), attn_implementation="eager"))
    with pytest.raises(ParamscopeError, match="never called F.scaled_dot_product_attention"):
        trace_parallel_training(model, StepSettings(batch=1, seq=32, attention="eager"), cp=2)


def test_the_llama_closed_form_equals_the_traced_cp_rank():
    """The closed form on a cp rank (the recipe at S / cp tokens, plus ring attention's output copied for o_proj in
    each layer) against torch's ring traced on rank 0, moment by moment: equal to the traced forward and the traced
    backward, as the one-device recipe is to a one-device trace of S / cp tokens (its start of backward was 8·B·S/cp
    − 8 B over both until it took the shifted labels nll_loss's backward frees first), so every byte of the ring is
    counted: balanced (2·cp divides S: the output copies) and not, 66 tokens (no copy). cp 4 and other lengths and
    batches: the same, in the commit."""
    config = dict(LLAMA, num_hidden_layers=2)
    for seq in (64, 66):
        _, estimate, view = training_answer(config, TrainingOptions(
            batch=2, seq=seq, precision="bf16-mixed", layout=layout_for(devices=2, cp=2), fits=False,
            derive_layout=False), use_cache=False)
        closed = {p.where: p.bytes for p in estimate.training.device.phases}
        settings = StepSettings(batch=2, seq=seq, precision="bf16-mixed", optimizer="adamw")
        traced = {p.phase: p.bytes for p in trace_parallel_training(view.module, settings, cp=2).phases}
        gap = (traced["forward"] - closed["end of forward"], traced["backward"] - closed["start of backward"])
        assert gap == (0, 0)
    one_closed, one_traced = _one_device(view.module, config, batch=2, seq=32)
    assert (one_traced["forward"] - one_closed["end of forward"],
            one_traced["backward"] - one_closed["start of backward"]) == (0, 0)


def _one_device(module, config, *, batch, seq):
    from paramscope.cost.traced.step import trace_training

    _, estimate, _ = training_answer(config, TrainingOptions(batch=batch, seq=seq, precision="bf16-mixed", fits=False),
                                     use_cache=False)
    closed = {p.where: p.bytes for p in estimate.training.phases}
    settings = StepSettings(batch=batch, seq=seq, precision="bf16-mixed", optimizer="adamw")
    return closed, {p.phase: p.bytes for p in trace_training(module, settings).phases}
