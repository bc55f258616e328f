"""Pipeline with tensor parallelism on a class whose step is derived from traces (Mixtral): each stage replayed
(cost/parallel/stage_recipe.py) from the tensor-parallel rank's derived recipe, the one traced with the tp layout on
torch's fake process group, whose segments (prefix, each layer's forward, head, each layer's backward) are the
one-device recipe's. Each stage's forwards and first backward equal MemTracker on the real class cut to the stage with
the tp layout applied on the fake process group (traced/pipeline_stage.py, as --trace runs it); at pp 1 the replay is the tp
answer to the byte; each stage's figures are the rank's recipe's segments for its layers (not the one-device
recipe's); the stages' model states add up to the tp rank's; under sequence parallel the point-to-point buffers are
the sequence shard. A later backward (1F1B's steady state) equals it too: the packed experts' down_proj gradient waits
for gate_up_proj's before either is added into its .grad (the experts read their local shards as they are entered)."""

from __future__ import annotations

from paramscope.cost.parallel.layout import ParallelLayout
from parallel_steps import small_mixtral

MICRO, SEQ, HIDDEN, TP = 2, 32, 64, 2


def _recipes(cache):
    from paramscope.cost.derived.store import FORMAT, find_recipe

    found = {}
    for path in (cache / f"derived-v{FORMAT}").rglob("*.json"):
        recipe = find_recipe("MixtralForCausalLM", path.stem)
        if recipe is not None:
            found[recipe.seq_unit] = recipe  # sequence parallel: the rank's sizes in S / tp
    return found


def test_tp_pp_stages_replay_the_tensor_parallel_rank_s_recipe(cache):
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.stage_recipe import stage_activations
    from paramscope.cost.traced.parallel import check_layout
    from paramscope.cost.traced.pipeline_stage import trace_stage
    from paramscope.cost.traced.step import StepSettings

    config = small_mixtral()
    layout = ParallelLayout(tp=TP, sp=True, pp=3, micro_batches=3, schedule="1f1b")
    _, estimate, view = training_answer(config, TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False), use_cache=False)
    device = estimate.training.device
    rows = device.stages
    assert [(r.layers, r.in_flight) for r in rows] == [((0, 1), 3), ((2, 3), 2), ((4, 4), 1)]
    _, flat, _ = training_answer(config, TrainingOptions(
        batch=MICRO, seq=SEQ, precision="bf16-mixed", layout=ParallelLayout(tp=TP, sp=True), fits=False),
        use_cache=False)
    one = flat.training.device  # the tp rank at pp 1: derived (traced on the fake process group)
    recipes = _recipes(cache)
    rank, single = recipes[TP], recipes[1]  # the tp rank's recipe and the one-device one
    assert len(rank.layer_types) == len(single.layer_types) == 5

    # pp 1: the whole model as one stage, one microbatch, replayed from the rank's recipe = the tp answer's moments
    whole = stage_activations(rank, MICRO, SEQ, 0, 5, 1, 0)
    resident = one.weights + one.optimizer + one.master_weights + one.buffers
    moments = {p.phase: p.bytes for p in one.phases if p.phase != "optimizer step"}
    assert (whole.per_microbatch, resident + whole.forward_peak, resident + whole.backward_peak) == (
        one.activations, moments["forward"], moments["backward"])

    residual = MICRO * (SEQ // TP) * HIDDEN * 4  # the sequence shard of the fp32 hidden state under bf16-mixed
    settings = StepSettings(batch=MICRO, seq=SEQ, precision="bf16-mixed", optimizer="adamw", attention="sdpa")
    gaps = []
    for row in rows:  # each stage traced as --trace traces it: rank 0 of tp 2 (sp) on the fake process group
        derived = row.replayed
        traced = trace_stage(view.module, settings, "model.layers", row.layers[0], row.layers[1] + 1,
                             row.in_flight, later=derived.later_in_flight, parallel=check_layout(1, "none", TP, True, 0))
        assert (derived.held, derived.forward_peak, derived.peak) == (traced.held, traced.forward_peak,
                                                                        traced.peak), row.rank
        gaps.append((traced.later_peak - traced.after_backward) - (derived.later_peak - derived.after_first_backward))
    # the later backward (1F1B's steady state) too: the experts' down_proj gradient (the rank's [4, 64, 64] fp32,
    # 65,536 B) held until gate_up_proj's is made, as autograd runs their AccumulateGrad after the experts' backward
    # (31,744 B above the replay on the first two stages while it was added at once)
    assert gaps == [0, 0, 0]
    waiting = frozenset({4 * HIDDEN * 64 * 4})  # the experts' down_proj gradient on the rank: [4, 64, 128 / tp] fp32
    for row in rows:
        a, b = row.layers
        later = row.in_flight - (row.rank == 0)
        assert row.replayed == stage_activations(rank, MICRO, SEQ, a, b + 1, row.in_flight, residual, later, waiting)
        assert row.replayed != stage_activations(single, MICRO, SEQ, a, b + 1, row.in_flight, residual, later,
                                                 waiting)
        assert row.replayed.received == (0 if row.first else residual)
        assert row.replayed.output_gradient == (0 if row.last else residual)
    # the stages' model states: the tp rank's shards, cut by layer (no tied head here: no copy)
    assert sum(r.weights for r in rows) == one.weights and sum(r.gradients for r in rows) == one.gradients
    assert sum(r.optimizer for r in rows) == one.optimizer
    assert device.peak == max(r.peak for r in rows)
    # the first backward's words sum to their figure: k × each + what is held once a stage (stage 0's 512 B, the
    # step never frees it) = held, where each is a microbatch's own bytes (1,024 B off when each carried the 512)
    import re

    first = next(p for p in device.phases if p.where == "first backward")
    words = re.search(r"\((\d+) microbatches in flight × ([\d,]+) B each(?: \([^()]*\))?(?: \+ ([\d,]+) B held once a "
                      r"stage \([^()]*\))? = ([\d,]+),", first.arithmetic)
    k, each, once, held = (int((g or "0").replace(",", "")) for g in words.groups())
    assert (k, once) == (rows[0].in_flight, rows[0].replayed.kept_once) == (3, 512)
    assert k * each + once == held == rows[0].replayed.held
    assert any("tensor-parallel rank's derived step" in n and "down_proj gradient is held until" in n
               for n in estimate.notes)
