"""The Llama family's closed form for pipeline stages (cost/parallel/pipeline_device.py) held to each stage's trace
(traced/pipeline_stage.py: the real class cut to the stage, k microbatch forwards kept before the first backward).

Each microbatch's forward runs under its own autocast, so each microbatch in flight holds its own 16-bit copies of the
weights its matmuls read (the layers' q, k, v, o, gate, up and down; the head's on the last stage; never the
embedding's or the norms'), as the derived classes' replays count them (stage_recipe.py). A stage's cache also holds
each microbatch's output (and in bf16-pure its received 16-bit input, whose fp32 copy the first norm saves); the first
stage makes the rotary tables each microbatch; the last stage keeps each microbatch's loss. What a stage holds before
its first backward equals the trace to the byte, on every stage, under GPipe and 1F1B."""

from __future__ import annotations

from paramscope.cost.parallel.layout import ParallelLayout

MICRO, SEQ, HIDDEN, INNER = 2, 32, 32, 48
LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=HIDDEN, intermediate_size=INNER,
             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
             max_position_embeddings=4096, tie_word_embeddings=False)
# one layer's 16-bit copies: q and o (h × h), k and v (h × kv, kv = 2 heads × 8), gate, up, down (h × i), 2 B each
LAYER_COPIES = (HIDDEN * HIDDEN * 2 + HIDDEN * 16 * 2 + HIDDEN * INNER * 3) * 2


def _stages(precision: str, schedule: str) -> tuple[list, list, object]:
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.traced.pipeline_stage import trace_stage
    from paramscope.cost.traced.step import StepSettings

    layout = ParallelLayout(pp=3, micro_batches=3, schedule=schedule)
    _, estimate, view = training_answer(LLAMA, TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision=precision, layout=layout, fits=False), use_cache=False)
    device = estimate.training.device
    assert device.activations_from.startswith("analytic")
    settings = StepSettings(batch=MICRO, seq=SEQ, precision=precision, optimizer="adamw", attention="sdpa")
    traces = [trace_stage(view.module, settings, "model.layers", r.layers[0], r.layers[1] + 1, r.in_flight)
              for r in device.stages]
    return list(device.stages), traces, device


def test_each_microbatch_in_flight_holds_its_own_16_bit_weight_copies_under_gpipe():
    rows, traces, device = _stages("bf16-mixed", "gpipe")
    assert [r.in_flight for r in rows] == [3, 3, 3]
    assert [r.activations for r in rows] == [t.held for t in traces] == [351_744, 345_600, 507_672]
    assert LAYER_COPIES == 15_360
    words = " ".join(p.arithmetic for p in device.phases)  # the last stage's: its layer's and the head's, 3 times
    assert f"the 16-bit weight copies each microbatch's autocast keeps, 3 × {LAYER_COPIES + HIDDEN * 128 * 2:,}" \
        in words
    # GPipe's last stage: its first backward's moments hold no gradient yet (every forward runs first), a later
    # backward's start every gradient and one microbatch fewer; its end of forward the KV cache's fp32 keys of its
    # own layer only (the one device's moment had all 3 layers': 2 × 4·T·kv = 8,192 B over). Each moment the trace's
    # + 8 B, the loss and its gradient the recipe's start of backward holds beside (c33582f)
    last = rows[2]
    resident = last.weights + last.optimizer + last.master_weights + device.buffers
    at = {p.where: p.bytes - resident for p in device.phases}
    assert (at["end of forward"], at["start of backward"], last.peak - resident) == \
        (traces[2].forward_peak + 8, traces[2].peak + 8, traces[2].peak + 8) == (569_648, 572_704, 572_704)
    assert at["later backward"] == at["start of backward"] + last.gradients - last.activations // 3


def test_bf16_pure_stages_hold_each_microbatch_s_received_input_beside_its_output_under_1f1b():
    rows, traces, _ = _stages("bf16-pure", "1f1b")
    assert [r.in_flight for r in rows] == [3, 2, 1]
    assert [r.activations for r in rows] == [t.held for t in traces] == [228_864, 158_720, 125_192]


def test_interleaved_chunk_microbatches_hold_their_own_copies_and_outputs_along_torchs_order():
    """pp 2 × 2 virtual stages on a 4-layer cut, 2 microbatches: each chunk-microbatch in flight holds its chunk's
    16-bit copies and its output (the first chunk its rotary tables, the last its head's copies and loss), as torch's
    ScheduleInterleaved1F1B order leaves them at the rank's first backward (traced/interleaved_stage.py). They
    counted the rank's copies once: 30,720 B copies, 16,384 B outputs and 4,096 B tables under on rank 0."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.pipeline import interleaved_order
    from paramscope.cost.traced.interleaved_stage import trace_interleaved_stage
    from paramscope.cost.traced.step import StepSettings

    layout = ParallelLayout(pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2)
    _, estimate, view = training_answer(dict(LLAMA, num_hidden_layers=4), TrainingOptions(
        batch=2 * MICRO, seq=SEQ, precision="bf16-mixed", layout=layout, fits=False), use_cache=False)
    rows = estimate.training.device.stages
    settings = StepSettings(batch=MICRO, seq=SEQ, precision="bf16-mixed", optimizer="adamw", attention="sdpa")
    traced = [trace_interleaved_stage(view.module, settings, "model.layers", tuple((a, b + 1) for a, b in r.chunks),
                                      interleaved_order(layout, r.rank)).held for r in rows]
    assert [r.activations for r in rows] == traced == [464_896, 399_624]


def _middle_stage_steady_state(precision: str) -> tuple[int, int]:
    """(the middle stage's 1F1B steady state above its resident states, its trace's: one more forward then the next
    backward with every gradient held, less any received leaf the tracker's books keep past the first backward:
    what it left beyond its other microbatch and the gradients) on the 3-layer cut, pp 3, 3 microbatches (the
    middle stage holds 2)."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.traced.pipeline_stage import trace_stage
    from paramscope.cost.traced.step import StepSettings

    layout = ParallelLayout(pp=3, micro_batches=3, schedule="1f1b")
    _, estimate, view = training_answer(LLAMA, TrainingOptions(
        batch=3 * MICRO, seq=SEQ, precision=precision, layout=layout, fits=False), use_cache=False)
    device = estimate.training.device
    row = device.stages[1]
    assert (row.in_flight, row.peak_phase) == (2, "backward")
    settings = StepSettings(batch=MICRO, seq=SEQ, precision=precision, optimizer="adamw", attention="sdpa")
    traced = trace_stage(view.module, settings, "model.layers", 1, 2, 2, later=2)
    leaf = traced.after_backward - (traced.held - traced.held // 2 + traced.gradients)
    assert leaf in (0, (2 if precision == "bf16-pure" else 4) * MICRO * SEQ * HIDDEN)
    return row.peak - (row.weights + row.optimizer + row.master_weights + device.buffers), traced.later_peak - leaf


def test_the_1f1b_steady_state_holds_the_top_layer_s_mlp_backward_moment():
    """1F1B's steady state on a middle stage: every gradient, its 2 microbatches, the gradient arriving (4·T·h) and
    the top layer's MLP backward moment (mlp_backward_working), equal to the trace. The moment, T = 64 tokens, h 32,
    i 48: fp32 the gated product's two gradients beside its own, its input freed, 8·T·i = 24,576 B; mixed the
    output's gradient cast to 16 bits, down_proj's 16-bit weight and input gradients 2·T·h + 2·h·i + 2·T·i =
    13,312 B; bf16-pure 4·T·i = 12,288 B. It was not counted: the stage 24,576, 13,312 and 12,288 B under."""
    from paramscope.cost.parallel.pipeline_device import mlp_backward_working

    tokens = MICRO * SEQ
    assert [mlp_backward_working(p, tokens, HIDDEN, INNER)[0] for p in ("fp32", "bf16-mixed", "bf16-pure")] == \
        [8 * tokens * INNER, 2 * tokens * HIDDEN + 2 * HIDDEN * INNER + 2 * tokens * INNER, 4 * tokens * INNER] == \
        [24_576, 13_312, 12_288]
    assert [_middle_stage_steady_state(p) for p in ("fp32", "bf16-mixed", "bf16-pure")] == \
        [(328_960, 328_960), (282_880, 282_880), (190_592, 190_592)]


def test_trace_checks_each_stage_where_the_closed_form_is_held_to_it():
    """--trace on a Llama pipeline, 1F1B with more microbatches (4) than stages (3): each stage traced, its forwards,
    a backward, then one more forward and the next backward with every gradient held, beside the closed form; the
    stages before the last equal at their steady state (the last within the loss's few bytes, named); GPipe, where
    the closed form is an estimate, stays refused before the build."""
    from paramscope.cost.memory.training import TrainingOptions, training_answer
    from paramscope.cost.parallel.trace_reach import closed_form_traced

    layout = ParallelLayout(pp=3, micro_batches=4, schedule="1f1b")
    _, estimate, _ = training_answer(LLAMA, TrainingOptions(batch=4 * MICRO, seq=SEQ, precision="bf16-mixed",
                                                            layout=layout, fits=False, trace=True), use_cache=False)
    checks = [n for n in estimate.training.device.notes if n.startswith("check: stage")]
    assert len(checks) == 3 and len(estimate.training.device.traced) == 3
    assert "held 351,744 B (the closed form 351,744), largest moment 420,608 B above its states; the closed form " \
        "420,608 B (equal)" in checks[0]
    assert "held 230,400 B (the closed form 230,400), largest moment 282,880 B above its states; the closed form " \
        "282,880 B (equal)" in checks[1]
    assert "held 169,224 B (the closed form 169,224)" in checks[2]
    assert closed_form_traced(layout, checkpointing=False) is None
    assert closed_form_traced(ParallelLayout(pp=3, micro_batches=4, schedule="gpipe"), checkpointing=False) == \
        "outside 1F1B with more microbatches than stages"
    assert closed_form_traced(ParallelLayout(pp=3, micro_batches=3, schedule="1f1b"), checkpointing=False) == \
        "outside 1F1B with more microbatches than stages"
