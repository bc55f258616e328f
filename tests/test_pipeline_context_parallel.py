"""Pipeline × context parallelism (issue 28 §1, --pp P --cp C): torchtitan's order, pp outermost then (dp, cp, tp).

A class whose stages are replayed from a derived step (Mixtral) replays them (cost/parallel/stage_recipe.py) from the
context-parallel rank's derived recipe: rank 0 of the (dp, cp, tp) mesh, traced with torch's ring attention over the cp
ranks on the fake process group at its S / cp tokens (the key the cp rank at dp 1 has). --trace cuts each stage of the
real class and runs it on that rank with the ring (traced/pipeline_stage.py): its forwards, first backward and a later
backward (1F1B's steady state) equal the replay to the byte. The Llama family's closed form takes the cp rank's
activations as without a pipeline: the recipe at S / cp tokens and the ring's kept output copies, a layer's for each
microbatch in flight."""

from __future__ import annotations

from paramscope.cost.parallel.layout import ParallelLayout
from parallel_steps import small_mixtral, stage_gaps

MICRO, SEQ, HIDDEN, CP, TP = 2, 64, 64, 2, 2


def test_pp_cp_tp_stages_replay_the_context_parallel_rank_and_equal_their_traced_stages():
    from paramscope.cost.memory.training import TrainingOptions, training_answer

    layout = ParallelLayout(cp=CP, tp=TP, sp=True, pp=3, micro_batches=3, schedule="1f1b")
    _, estimate, _ = training_answer(small_mixtral(), TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False, trace=True), use_cache=False)
    device = estimate.training.device
    rows = device.stages
    assert [(r.layers, r.in_flight) for r in rows] == [((0, 1), 3), ((2, 3), 2), ((4, 4), 1)]
    assert len(device.traced) == 3  # --trace: each stage cut, on rank 0 of (dp 1, cp 2, tp 2) with the ring
    # each stage's held and peaks equal to its trace, and the later backward (1F1B's steady state) too
    assert stage_gaps(rows, device.traced) == [0, 0, 0]
    # the cp rank's recipe at S / cp tokens (not the tp rank's at S): the stages' figures
    assert [(r.replayed.held, r.replayed.forward_peak, r.replayed.peak) for r in rows] == [
        (1_828_448, 1_937_776, 1_966_688), (1_210_432, 1_303_120, 1_348_672), (405_656, 516_776, 536_216)]
    assert [r.replayed.later_peak - r.replayed.after_first_backward for r in rows] == [138_240, 743_456, 536_216]
    assert device.peak == max(r.peak for r in rows) == 3_401_452
    # the hidden state sent and received: the rank's S / cp tokens, split again over tp under sp, fp32
    residual = MICRO * (SEQ // (CP * TP)) * HIDDEN * 4
    assert all(r.replayed.received == (0 if r.first else residual) for r in rows)
    assert all(r.replayed.output_gradient == (0 if r.last else residual) for r in rows)
    notes = " ".join(device.notes)
    assert "context-parallel rank's derived step (cp 2" in notes and "beside tp 2 with sequence parallel" in notes
    assert all("(equal)" in n for n in device.notes if n.startswith("check: stage"))


def test_the_llama_closed_form_under_pp_and_cp_adds_the_ring_s_kept_copies_exactly():
    """The closed form's middle stage holds what its trace holds, to the byte, at cp 1 and at cp 2 (the recipe at
    S / cp, each microbatch's own 16-bit weight copies and cached output, the ring's output copies)."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.traced.parallel import check_layout
    from paramscope.cost.traced.pipeline_stage import trace_stage
    from paramscope.cost.traced.step import StepSettings

    llama = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=96,
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=4096, tie_word_embeddings=False)
    settings = StepSettings(batch=MICRO, seq=SEQ, precision="bf16-mixed", optimizer="adamw", attention="sdpa")
    gap = {}
    for cp in (1, CP):
        layout = ParallelLayout(cp=cp, pp=3, micro_batches=3, schedule="1f1b")
        _, estimate, view = training_answer(llama, TrainingOptions(
            batch=3 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False), use_cache=False)
        device = estimate.training.device
        assert device.activations_from.startswith("analytic")
        middle = device.stages[1]
        assert (middle.layers, middle.in_flight) == ((1, 1), 2)
        traced = trace_stage(view.module, settings, "model.layers", 1, 2, 2,
                             parallel=check_layout(1, "none", 1, False, 0, 1, cp) if cp > 1 else None)
        gap[cp] = middle.activations - traced.held
    assert gap == {1: 0, CP: 0}
    # the ring's copies in the closed form: 2 microbatches × 1 layer × B·(S / 2)·heads·head_dim × 2 B
    ring = 2 * MICRO * (SEQ // CP) * 4 * 16 * 2
    assert ring == 16_384 and "ring attention's output copied for o_proj" in " ".join(
        p.arithmetic for p in device.phases)


def test_pp_cp_layouts_are_traced_and_searched():
    """No layout-level refusal remains: --trace takes pp × cp (the class decides), and the search asks a derived
    class's pp × cp layout for the cp rank's recipe memory replays (the key of the cp rank at dp 1)."""
    from paramscope.cost.parallel.layout_derivation import derivation_key
    from paramscope.cost.parallel.trace_reach import untraced_by_layout

    layout = ParallelLayout(cp=2, tp=2, sp=True, pp=2, micro_batches=2, schedule="1f1b")
    assert untraced_by_layout(layout) is None
    interleaved = ParallelLayout(cp=2, pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    assert untraced_by_layout(interleaved) is None  # each chunk at the rank's S / cp tokens too
    flat = ParallelLayout(cp=2, tp=2, sp=True)
    assert derivation_key(layout, 2, 0) == derivation_key(flat, 1, 0) == ("context", 2, 1, 2, True, 1)


def test_pp_cp_with_attention_dropout_is_refused_in_one_line(capsys):
    from paramscope.cli import main

    assert main(["memory", "gpt2", "--training", "--pp", "2", "--cp", "2", "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert "context parallelism with attention dropout 0.1" in err and err.count("\n") == 1, err
