"""One device's step under a layout, both ways: the engines' answer and the traced rank on torch's fake process
group (the tests of the per-device engines hold the first to the second)."""

from __future__ import annotations

import dataclasses

from paramscope.cost.memory.training import TrainingOptions, training_answer
from paramscope.cost.traced.parallel import trace_parallel_training
from paramscope.cost.traced.step import StepSettings


def derived_and_traced(config, layout, *, batch=2, seq=64, precision="bf16-mixed", attention=None):
    """(the answer for `config` under `layout`, the traced rank 0's step of the same class). One answer gives both
    the estimate and the built class (estimate_training's, with its report): a second answer without the layout
    would derive the one-device step again."""
    # no fits table: the tests hold the asked point's step, and the table's searches derive a device step again at
    # other batches (a third of the time); the fits under a layout are held in test_html_layout.py. FSDP2 where no
    # convention was asked: autocast's, which the trace below runs (the policy's ranks are held to their traces in
    # test_fsdp_policy_closed_form.py, test_policy_context_parallel.py and test_fsdp_tied_head.py)
    if layout.fsdp_mixed_precision_defaulted:
        layout = dataclasses.replace(layout, fsdp_mixed_precision="autocast", fsdp_mixed_precision_defaulted=False)
    report, estimate, view = training_answer(config, TrainingOptions(batch=batch, seq=seq, precision=precision,
                                                                     attention=attention, layout=layout, fits=False),
                                             use_cache=False)
    estimate = dataclasses.replace(estimate, report=report)
    fsdp = layout.shard == "fsdp"
    traced = trace_parallel_training(view.module, StepSettings(batch=batch, seq=seq, precision=precision,
                                                               optimizer="adamw", attention=attention),
                                     dp=layout.dp if fsdp else 1, shard="fsdp" if fsdp else "none", tp=layout.tp,
                                     sp=layout.sp)
    return estimate, traced


def small_mixtral_phases(layout, seq, *, batch=2):
    """small_mixtral's device answered under `layout` with --trace (batch × seq tokens, bf16-mixed, no fits search):
    (the device, its derived phases, its traced rank's phases), each phase list as {phase: bytes}."""
    _, estimate, _ = training_answer(small_mixtral(), TrainingOptions(batch=batch, seq=seq, precision="bf16-mixed",
                                                                      fits=False, trace=True, layout=layout),
                                     use_cache=False)
    device = estimate.training.device
    return device, {p.phase: p.bytes for p in device.phases}, {p.phase: p.bytes for p in device.traced.phases}


def small_mixtral(layers: int = 5):
    """The Mixtral cut the pipeline and expert-parallel tests trace: hidden 64, 4 heads (2 KV heads, head_dim 16),
    4 experts of width 128, top-2, a 256-token vocabulary."""
    import transformers as T

    return T.MixtralConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           intermediate_size=128, vocab_size=256, num_hidden_layers=layers, num_local_experts=4,
                           num_experts_per_tok=2, architectures=["MixtralForCausalLM"])


def stage_gaps(rows, traces):
    """Each pipeline stage's replayed held, forward peak and peak equal to its trace (asserted, naming the stage's
    rank); returns each stage's later-backward gap: the traced rise above what its first backward left, less the
    replayed one (0 where the replay is exact there too)."""
    gaps = []
    for row, traced in zip(rows, traces, strict=True):
        replayed = row.replayed
        assert (replayed.held, replayed.forward_peak, replayed.peak) == (traced.held, traced.forward_peak,
                                                                          traced.peak), row.rank
        gaps.append((traced.later_peak - traced.after_backward) -
                    (replayed.later_peak - replayed.after_first_backward))
    return gaps


def cp_rank_beside_its_trace(llama: dict, precision: str, *, batch: int = 2, seq: int = 64, cp: int = 2):
    """A Llama cut's cp rank by the closed form (no derivation) and traced on torch's ring in `precision`: (the
    closed form's phases by moment name, the traced step)."""
    import transformers as T

    from paramscope.cost.parallel.layout import layout_for

    config = T.LlamaConfig(**{k: v for k, v in llama.items() if k != "model_type"})
    _, alone, view = training_answer(config, TrainingOptions(batch=batch, seq=seq, precision=precision, fits=False,
                                                             layout=layout_for(cp=cp), derive_layout=False),
                                     use_cache=False)
    traced = trace_parallel_training(view.module, StepSettings(batch=batch, seq=seq, precision=precision,
                                                               optimizer="adamw"), cp=cp)
    return {p.where: p.bytes for p in alone.training.device.phases}, traced
