"""FSDP2's MixedPrecisionPolicy (--fsdp-mixed-precision policy: param_dtype bf16, reduce_dtype fp32, no autocast,
torchtitan's) under a pipeline and in --find-layout.

A pipeline's stages replay the policy's FSDP2 rank, derived from traces as without a pipeline (the same recipe key),
its root unit apart: each stage holds its own root unit gathered in 16 bits. The replay's mechanics are held to the
rank traced under the policy (the whole cut replayed as one stage equals it to the byte); the stages themselves are
an estimate, named, since no stage is traced under FSDP2. The search prices each FSDP2 layout under the policy: its
memory as memory answers it, its dp bytes the 16-bit gathers and fp32 reduce-scatters, padded as fully_shard pads,
and its derivations keyed apart from autocast's. Llama's 4-layer cut of test_fsdp_mixed_precision_policy.py."""

from __future__ import annotations

import math

import pytest

from paramscope.cli import main
from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.parallel.layout import layout_for
from paramscope.errors import OptionError

CUT = dict(hidden_size=128, intermediate_size=448, num_attention_heads=4, num_key_value_heads=1, vocab_size=4008)
SEQ = 64


def _config():
    import transformers as T

    return T.LlamaConfig(num_hidden_layers=4, architectures=["LlamaForCausalLM"], **CUT)


def _device(layout, batch, trace=False, derive=True):
    _, estimate, view = training_answer(_config(), TrainingOptions(batch=batch, seq=SEQ, precision="bf16-mixed",
                                                                   fits=False, trace=trace, layout=layout,
                                                                   derive_layout=derive))
    return estimate.training.device, view


def test_the_whole_cut_replayed_as_one_stage_equals_the_traced_policy_rank():
    """dp 2, 2 × 64 (test_fsdp_mixed_precision_policy.py: derived = --trace, 22,249,780 / 23,273,764 B): the policy
    rank's recipe with its root unit apart, replayed as one stage of every layer, plus the root unit held (embedding,
    final norm and head in bf16), equals the rank's forward and backward to the byte."""
    from paramscope.cost.derived.step import DerivedStep
    from paramscope.cost.parallel.pipeline_replay import root_apart
    from paramscope.cost.parallel.stage_recipe import stage_activations
    from paramscope.cost.traced.parallel import with_mixed_precision
    from paramscope.cost.traced.step import StepSettings

    device, view = _device(layout_for(dp=2, zero="fsdp", batch=2, fsdp_mixed_precision="policy"), 2)
    resident = device.weights + device.optimizer + device.master_weights + device.buffers
    # the derived rank, which equals --trace in every phase (test_fsdp_mixed_precision_policy.py traces it)
    traced = {p.phase: p.bytes - resident for p in device.phases}
    assert {p.phase: p.bytes for p in device.phases} == \
        {"forward": 22_249_780, "backward": 23_273_764, "optimizer step": 15_033_628}
    settings = StepSettings(precision="bf16-mixed", optimizer="adamw", grad_checkpointing=False, attention="sdpa",
                            frozen=(), weights_dtype=None, own_dtype=(),
                            layout=with_mixed_precision((2, "fsdp", 1, False), "policy"))
    recipe = DerivedStep.first(view.module, "LlamaForCausalLM", view.config, settings, batch=2, seq=SEQ,
                               limit=None).recipe
    whole = stage_activations(root_apart(recipe), 2, SEQ, 0, 4, 1, 2 * SEQ * 128 * 2)
    root = 2 * (4008 * 128 + 128 + 4008 * 128)  # the root's parameters unsharded in bf16
    assert (whole.forward_peak + root, whole.backward_peak + root) == (traced["forward"], traced["backward"]) == \
        (10_974_488, 11_998_472)


def test_pipeline_stages_replay_the_policy_rank():
    """dp 2 × pp 2, 2 microbatches of 2 × 64: each stage replays the policy's FSDP2 rank (its layers' bf16
    activations and gradients), every unit of the stage gathered in bf16 and its gradients unsharded in fp32 as torch's
    PipelineStage and torchtitan hold them (tests/test_fsdp_pipeline_stage.py), the hidden state between stages bf16;
    autocast's closed form beside for comparison. The convention is named; --trace refused."""
    policy, _ = _device(layout_for(dp=2, zero="fsdp", pp=2, micro_batches=2, batch=4,
                                   fsdp_mixed_precision="policy"), 4)
    assert policy.activations_from.startswith("derived: stage 1's layers from the recipe's segments")
    assert [(r.layers, r.in_flight, r.peak, r.peak_phase) for r in policy.stages] == [
        ((0, 1), 2, 14_412_492, "backward"), ((2, 3), 1, 19_208_412, "backward")]
    assert policy.peak == 19_208_412
    units = {b.name: b.bytes for b in policy.comm}["FSDP2's units of the stage, all gathered"]
    layer = 2 * 128 * 128 + 2 * 32 * 128 + 3 * 448 * 128 + 2 * 128
    assert units == 2 * (2 * layer + 128 + 4008 * 128)  # stage 1's two layers, final norm and head, in bf16
    received = {b.name: b.bytes for b in policy.comm}["pipeline's received hidden state"]
    assert received == 2 * SEQ * 128 * 2  # bf16 under the policy
    assert any(n.startswith("pipeline convention under FSDP2's MixedPrecisionPolicy(param_dtype=bf16, "
                            "reduce_dtype=fp32), no autocast") for n in policy.notes)
    assert any(n.startswith("FSDP2 beside a pipeline, as torchtitan and torch's PipelineStage run it") and
               "set_requires_gradient_sync(False)" in n for n in policy.notes)
    autocast, _ = _device(layout_for(dp=2, zero="fsdp", pp=2, micro_batches=2, batch=4,
                                     fsdp_mixed_precision="autocast"), 4)
    assert autocast.activations_from.startswith("analytic") and autocast.peak == 23_293_412
    # the derivation off (the layout search): the Llama closed form over bf16-pure's stages and the fp32 shards, the
    # last stage 8 B over the replay, the first 200,192 B over it
    closed, _ = _device(layout_for(dp=2, zero="fsdp", pp=2, micro_batches=2, batch=4, fsdp_mixed_precision="policy"),
                        4, derive=False)
    assert closed.activations_from.startswith("analytic")
    assert [r.peak for r in closed.stages] == [14_612_684, 19_208_420]
    assert any(n.startswith("FSDP2's MixedPrecisionPolicy (--fsdp-mixed-precision policy) with the derivation off")
               for n in closed.notes)
    with pytest.raises(OptionError, match="MixedPrecisionPolicy beside pipeline stages is not traced"):
        _device(layout_for(dp=2, zero="fsdp", pp=2, micro_batches=2, batch=4, fsdp_mixed_precision="policy"), 4,
                trace=True)


def test_the_policy_beside_a_pipeline_and_context_parallel_is_the_closed_form_named_an_estimate(capsys):
    """The derived replay reaches no cp rank under the policy: a Llama's stages take the closed form over bf16-pure's
    stages on the cp rank's tokens, derived or not, and say so (pipeline_device.POLICY_BESIDE_CP)."""
    argv = ["memory", "llama-3-8b", "--training", "--dp", "2", "--pp", "2", "--cp", "2", "--zero", "fsdp",
            "--fsdp-mixed-precision", "policy", "--seq", "1024", "--width", "400"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "beside context parallel the derived replay reaches no cp rank under FSDP2's MixedPrecisionPolicy" in out


def test_derivation_keys_carry_the_policy():
    from paramscope.cost.parallel.layout_derivation import derivation_key, derivation_words

    def key(mixed, **degrees):
        return derivation_key(layout_for(zero="fsdp", batch=2, fsdp_mixed_precision=mixed, **degrees), 2, 0)

    assert key("autocast", dp=4) == ("rank", 4, "fsdp", 1, False, 2)
    assert key("policy", dp=4) == ("rank", 4, "fsdp", 1, False, "policy", 2)
    assert derivation_words(key("policy", dp=2, tp=2, sp=True)) == \
        "tp 2 with sequence parallel, FSDP2 over 2, under FSDP2's MixedPrecisionPolicy, batch 2 and up"
    # a pipeline under the policy replays the policy's FSDP2 rank at the microbatch (the same recipe as dp 2's at
    # one sequence); under autocast the one-device recipe
    assert key("policy", dp=2, pp=2) == ("rank", 2, "fsdp", 1, False, "policy", 1)
    assert key("autocast", dp=2, pp=2) == ("device", 1)
    assert key("policy", dp=2, pp=2, cp=2) is None  # no derivation: the closed form answers it


def test_fsdp_bytes_under_the_policy_and_autocast_by_hand():
    """dp 3 over the cut (dims 128 and 4008 padded to multiples of 3): each parameter padded as fully_shard pads it,
    ⌈dim0 / 3⌉·3 rows; the policy gathers bf16 (2 B an element) and reduce-scatters fp32 (4 B), autocast 4 B both;
    2/3 × (2P + G), each of the 2 micro-steps (gradient accumulation of one sequence)."""
    from paramscope.cost.parallel.layout_comm import StepCommunication
    from paramscope.cost.parallel.layout_facts import read_facts
    from paramscope.cost.parallel.search_options import SearchOptions

    report, _, view = training_answer(_config(), TrainingOptions(batch=1, seq=SEQ, fits=False))
    padded = sum(-(-p.shape[0] // 3) * 3 * math.prod(p.shape[1:]) for p in report.params)
    # a layer: q, k, v, o one row of 128 more each, gate and up two rows of 128, down one row of 448, its two norms
    # one element each; the final norm one; the embedding and head's 4,008 rows divide
    assert padded - sum(p.numel for p in report.params) == 4 * (4 * 128 + 2 * 256 + 448 + 2) + 1 == 5_897
    for mixed, gathered in (("policy", 2), ("autocast", 4)):
        options = SearchOptions(devices=3, gpu="h100", seq=SEQ, fsdp_mixed_precision=mixed)
        comm = StepCommunication(read_facts(report, view, options, SEQ))
        layout = layout_for(dp=3, zero="fsdp", batch=2, fsdp_mixed_precision=mixed)
        _, terms = comm.busiest(layout, 2, steps=2)
        (term,) = terms
        assert term.bytes == 2 * -(-2 * (2 * gathered * padded + 4 * padded) // 3)
        assert ("16 bits (its MixedPrecisionPolicy's param_dtype)" in term.arithmetic) == (mixed == "policy")
    # the search's layouts: the policy wherever FSDP2 shards over more than one rank (none on one: no fully_shard)
    from paramscope.cost.parallel.layout_candidates import candidate_layouts

    options = SearchOptions(devices=4, gpu="h100", seq=SEQ, fsdp_mixed_precision="policy")
    layouts, _ = candidate_layouts(read_facts(report, view, options, SEQ), 4)
    assert {(layout.dp * layout.cp > 1, layout.fsdp_mixed_precision) for layout, _ in layouts} == \
        {(True, "policy"), (False, "autocast")}
    assert "dp 4 (FSDP2, its MixedPrecisionPolicy) = 4 devices" in [layout.words() for layout, _ in layouts]
    # which are derived: none of this Llama's, dp, a pipeline, cp alone or beside sp (the closed forms); a tied head's neither, alone or beside tp (the policy's closed form prices it: fsdp_moments' tied moments)
    from paramscope.cost.parallel.layout_evaluation import policy_derived

    facts = read_facts(report, view, options, SEQ)
    assert [policy_derived(layout_for(zero="fsdp", batch=2, fsdp_mixed_precision="policy", **degrees), facts)
            for degrees in (dict(dp=4), dict(dp=2, pp=2), dict(dp=2, cp=2), dict(cp=2, tp=2, sp=True))] == \
        [False, False, False, False]
    tied = _config()
    tied.tie_word_embeddings = True
    report, _, view = training_answer(tied, TrainingOptions(batch=1, seq=SEQ, fits=False))
    facts = read_facts(report, view, options, SEQ)
    assert [policy_derived(layout_for(zero="fsdp", batch=2, fsdp_mixed_precision="policy", **degrees), facts)
            for degrees in (dict(dp=4), dict(dp=2, tp=2, sp=True))] == [False, False]


def test_the_search_options_take_the_policy_and_refuse_it_in_one_line(capsys):
    from paramscope.cost.parallel.search_options import SearchOptions

    SearchOptions(devices=8, gpu="h100", fsdp_mixed_precision="policy").check()
    with pytest.raises(OptionError, match="must be one of autocast, policy"):
        SearchOptions(devices=8, gpu="h100", fsdp_mixed_precision="amp").check()
    with pytest.raises(OptionError, match="the search's layouts need zero fsdp or hybrid_shard, got 3"):
        SearchOptions(devices=8, gpu="h100", zero="3", fsdp_mixed_precision="policy").check()
    argv = ["memory", "llama-3-8b", "--training", "--find-layout", "--gpu", "h100", "--devices", "8",
            "--precision", "fp32", "--fsdp-mixed-precision", "policy"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a mixed precision (bf16-mixed, fp16-mixed), got fp32" in err
