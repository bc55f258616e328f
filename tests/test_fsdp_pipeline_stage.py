"""FSDP2 beside a pipeline, as torch's PipelineStage and torchtitan run it (parallel/pipeline_replay.UNSYNCED):
every unit of a stage gathered from its first forward to the reduce after its last backward, its gradients unsharded
(fp32) until then. Held to FSDP2's rank traced as one stage runs it (traced/pipeline_stage.trace_unsynced_fsdp: two
microbatches without gradient sync, then PipelineStage.perform_reduce_grad's reduce) on Llama's 4-layer cut of
test_policy_pipeline_search.py, dp 2, 2 × 64; the engines' answers on llama-3-8b; the dp bytes of the search."""

from __future__ import annotations

import pytest

from test_policy_pipeline_search import SEQ, _config
from test_policy_pipeline_tp_search import _config as small_vocabulary

# the cut's parameters: the embedding and head 4,008 × 128 each, the final norm 128, and a layer's q, o 128 × 128,
# k, v 32 × 128, gate, up, down 448 × 128, its two norms 128 each
LAYER = 2 * 128 * 128 + 2 * 32 * 128 + 3 * 448 * 128 + 2 * 128
N = 2 * 4008 * 128 + 128 + 4 * LAYER


def _recipe(settings_layout):
    import torch
    import transformers as T

    from paramscope.cost.derived.step import DerivedStep
    from paramscope.cost.traced.step import StepSettings

    with torch.device("meta"):
        module = T.LlamaForCausalLM(_config())
    settings = StepSettings(precision="bf16-mixed", optimizer="adamw", grad_checkpointing=False, attention="sdpa",
                            frozen=(), weights_dtype=None, own_dtype=(), layout=settings_layout)
    return module, DerivedStep.first(module, "LlamaForCausalLM", module.config, settings, batch=2, seq=SEQ,
                                     limit=None).recipe


def _traced(module, mixed):
    from paramscope.cost.traced.pipeline_stage import trace_unsynced_fsdp
    from paramscope.cost.traced.step import StepSettings

    settings = StepSettings(precision="bf16-mixed", optimizer="adamw", grad_checkpointing=False, attention="sdpa",
                            frozen=(), weights_dtype=None, own_dtype=(), batch=2, seq=SEQ)
    return trace_unsynced_fsdp(module, settings, 2, mixed)


@pytest.mark.parametrize("mixed", ["policy", "autocast"])
def test_the_unsynced_stage_is_the_replay_with_every_unit_gathered_and_the_gradients_unsharded(mixed):
    """The whole cut as one stage, two microbatches each forward then backward. Under the policy the replay of the
    policy's FSDP2 rank (root apart) + every unit gathered in bf16 (2·N) + the gradients unsharded in fp32 (4·N, from
    the first backward), less the running layer's bf16 gather the rank makes (2·L) where the stage gathers nothing:
    the first forward equal, each backward and the later forward equal. Under autocast the one-device recipe (the
    closed form's own, held to its traces) + every unit gathered in fp32 (4·N) + 4·N of gradients: equal but the
    first forward, one layer's fp32 parameters (4·L) over it as its unit is first gathered. The later backward: the
    replay keeps the first microbatch's loss (4 B, torch's schedule holds it), which the trace drops. The reduce after
    the last backward is below it (no activations left), and the optimizer step is FSDP2's default rank's."""
    from paramscope.cost.parallel.pipeline_replay import root_apart
    from paramscope.cost.parallel.stage_recipe import stage_activations
    from paramscope.cost.traced.parallel import with_mixed_precision

    policy = mixed == "policy"
    module, recipe = _recipe(with_mixed_precision((2, "fsdp", 1, False), "policy") if policy else None)
    replay = stage_activations(root_apart(recipe) if policy else recipe, 2, SEQ, 0, 4, 1, 2 * SEQ * 128 * 2, 1,
                               frozenset(), None)
    traced = _traced(module, mixed)
    gathered, gradients = (2 if policy else 4) * N, 4 * N
    running = 2 * LAYER if policy else 0
    first_gather = 0 if policy else 4 * LAYER
    assert [traced.forward_first, traced.backward_first, traced.forward_later, traced.backward_later] == [
        traced.resident + replay.forward_peak + gathered + first_gather,
        traced.resident + replay.backward_peak + gathered - running,
        traced.resident + replay.forward_peak + gathered + gradients - running,
        traced.resident + replay.later_peak + gathered + gradients - running - 4]
    assert traced.reduce < traced.backward_later
    assert (traced.resident, traced.optimizer_step) == (11_275_292, 15_033_628)
    assert (traced.backward_later - traced.resident) == (20_794_632 if policy else 27_979_272)


def test_the_engines_count_the_unsynced_stage_on_llama_3_8b(capsys):
    """dp 2 × pp 4, 8 microbatches of 2,048 tokens, autocast (the closed form): stage 0's 1F1B steady state holds its
    8 layers and embedding gathered in fp32 (4·N = 9,080,930,304 B, in place of the root unit 2,101,346,304 and one
    layer 872,448,000) and their gradients unsharded (9,080,930,304 B, in place of 4,540,465,152 of shards):
    51,351,946,020 → 61,999,547,172 B; its optimizer step unchanged (the shards after the reduce)."""
    import json

    from paramscope.cli import main

    assert main(["memory", "llama-3-8b", "--training", "--dp", "2", "--pp", "4", "--batch", "8", "--zero", "fsdp",
                 "--fsdp-mixed-precision", "autocast", "--json"]) == 0
    device = json.loads(capsys.readouterr().out)["memory"]["layout"]["device"]
    steady, step = device["phases"]
    assert (steady["moment"], steady["bytes"], step["bytes"]) == ("1F1B steady state", 61_999_547_172, 18_161_861_412)
    assert "FSDP2's units of the stage, all gathered 9,080,930,304" in steady["arithmetic"]
    assert steady["arithmetic"].endswith("9,080,930,304 − the shards 4,540,465,152 = 4,540,465,152")
    assert "layer unit" not in steady["arithmetic"]
    assert [s["peak"] for s in device["stages"]] == [61_999_547_172, 47_151_579_936, 39_666_713_376, 43_521_213_268]


def test_fsdp_beside_a_pipeline_gathers_once_a_step():
    """The dp bytes: beside a pipeline FSDP2 gathers each unit once (kept through the microbatches) and
    reduce-scatters once, (n−1)/n · (P + G); without one (n−1)/n · (2P + G)."""
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.parallel.layout_comm import dp_terms

    for pp, gathers in ((1, 2), (2, 1)):
        (term,) = dp_terms(layout_for(dp=4, pp=pp, zero="fsdp", batch=8, fsdp_mixed_precision="policy"),
                           (1_000, 2_000), 0)
        assert term.bytes == -(-3 * (gathers * 1_000 + 2_000) // 4)
        assert ("once a step" in term.what) == (pp > 1)


@pytest.mark.parametrize("in_flight, tp, figures, held, cut", [
    (3, 1, (27_113_988, 30_346_932, 31_885_356), 3 * 3_385_288, _config),
    (2, 1, (23_728_700, 26_961_644, 28_500_068), 2 * 3_385_288, _config),
    (3, 2, (16_936_356, 17_917_428, 19_968_876), 3 * 2_449_448 + 640, _config),
    (2, 2, (6_991_484, 7_636_940, 7_898_436), 2 * 1_330_728 + 640, small_vocabulary)],
    ids=["k3", "k2", "k3 tp2 sp", "k2 tp2 sp V512"])
def test_the_policy_stage_with_k_in_flight_is_the_trace(monkeypatch, in_flight, tp, figures, held, cut):
    """Issue 28: does the replay count a layer's 16-bit gather again once a microbatch in flight? No. The whole cut
    (2 × 40: T ≠ h) replayed by pipeline_replay as one stage (dp 2, the stage list asked for one stage of every
    layer, k = 3 and 2 microbatches in flight), against FSDP2's rank traced with k forwards, then k backwards
    (trace_unsynced_fsdp, in_flight k): in the trace each microbatch holds 3,385,288 B, all of it MemTracker's
    activations (no parameter: every unit gathered once, for the stage), and so does the replay's microbatch; the
    forwards equal, and the later backward, the stage's peak, equals but for the first microbatch's loss the replay
    keeps (4 B). The first backward peaks at its end (the trace's peak there is outside every module: the root's
    post-backward in its final callback), each gradient unsharded in fp32 and the head's 16-bit gradient beside its
    fp32 copy as the last cast runs (2·V·h = 1,026,048 B; it was 2,592,960 B under, at the replay's largest moment
    with no gradient made): equal to the byte, the replay's largest moment (the loss's gradients over the vocabulary,
    no gradient made) below it. Beside tp 2 with sequence parallel (the tp row) the same, each microbatch 2,449,448 B
    (and 640 B held once a stage): the vocabulary-parallel embedding's gradient is whole (DTensor's embedding
    backward makes it Replicate, and without the sync FSDP2 casts and adds it so), 4·(V − V/tp)·h = 1,026,048 B over
    the rank's own from the first backward's end; without it the first backward was 351,328 B under (the replay's
    largest moment above the end moment short of it) and the later 1,026,044 (2 in flight too). The optimizer step
    equals but for the kept loss (4 B): beside tp the trace holds the token ids there (8·B·S = 640 B, the 640 B held
    once a stage: the tp plan's DTensor input aliases them, estimate_closed_form.token_ids_held), 636 B under before
    they were counted. On test_policy_pipeline_tp_search's cut (vocabulary 512, two KV heads; the last row) the
    trace's later backward peaks at the loss's moment (4 × the fp32 logits' shard, 327,680 B, above every fp32
    gradient), which the replay's largest later moment, inside a middle layer's backward, was 49,828 B above: there
    the replayed rank holds the layer's 16-bit parameters copied out of its all-gather, the next layer's prefetched
    all-gather and the layer above's fp32 reduce-scatter input, none of which the stage makes (every unit gathered, no
    reduce without the sync); the later backward without them (unsynced_backward.backward_gathers_apart) is the
    loss's moment, the trace + 4 B (3 in flight too, and on the vocabulary-4,008 cut at 3 and 2)."""
    import torch
    import transformers as T

    import paramscope.cost.parallel.pipeline_replay as replay
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.parallel.pipeline import Stage
    from paramscope.cost.traced.pipeline_stage import trace_unsynced_fsdp
    from paramscope.cost.traced.step import StepSettings

    monkeypatch.setattr(replay, "stages", lambda layout, count: (Stage(0, tuple(range(count)), (count,), True, True,
                                                                        in_flight),))
    layout = layout_for(dp=2, tp=tp, sp=tp > 1, pp=2, zero="fsdp", micro_batches=in_flight, batch=2 * in_flight,
                        fsdp_mixed_precision="policy")
    _, estimate, _ = training_answer(cut(), TrainingOptions(batch=2 * in_flight, seq=40, precision="bf16-mixed",
                                                            fits=False, layout=layout, derive_layout=True))
    phases = {p.where: p.bytes for p in estimate.training.device.phases}
    with torch.device("meta"):
        module = T.LlamaForCausalLM(cut())
    settings = StepSettings(precision="bf16-mixed", optimizer="adamw", grad_checkpointing=False, attention="sdpa",
                            frozen=(), weights_dtype=None, own_dtype=(), batch=2, seq=40)
    traced = trace_unsynced_fsdp(module, settings, 2, "policy", in_flight, tp=tp, sp=tp > 1)
    assert (traced.forward_later, traced.backward_first, traced.backward_later) == figures
    assert phases["forwards in flight"] == traced.forward_later
    assert phases["later backward"] == traced.backward_later + 4
    assert phases["end of the first backward"] == traced.backward_first
    assert phases["first backward"] < traced.backward_first
    assert phases["optimizer step"] == traced.optimizer_step + 4
    assert estimate.training.device.stages[0].activations == held


def test_the_policy_rank_at_another_shard_degree_is_its_sibling_resized(monkeypatch, tmp_path):
    """The layout search derives the policy's FSDP2 tp rank once a tp degree (parallel/policy_degrees.py): its
    recipe at one shard degree with each shard allocation resized answers another. The cut beside tp 2 with sequence
    parallel, 4 microbatches of 1 × 64, pp 2: dp 4's stages from dp 2's recipe resized equal dp 4's own
    derivation's, every phase to the byte."""
    from paramscope.cost.parallel.layout import layout_for
    from test_policy_pipeline_search import _device

    def device(dp, cache):
        monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path / cache))
        layout = layout_for(dp=dp, tp=2, sp=True, pp=2, zero="fsdp", micro_batches=4, batch=4,
                            fsdp_mixed_precision="policy")
        return _device(layout, 4)[0]

    device(2, "sibling")
    resized, derived = device(4, "sibling"), device(4, "own")
    assert any("resized to d = 4" in note for note in resized.notes)
    assert not any("resized" in note for note in derived.notes)
    assert [(p.where, p.bytes) for p in resized.phases] == [(p.where, p.bytes) for p in derived.phases]
    assert [s.peak for s in resized.stages] == [s.peak for s in derived.stages]
    assert resized.peak == derived.peak
