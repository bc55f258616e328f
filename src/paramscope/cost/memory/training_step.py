"""One training step's answer from a model's report and view (`step_estimate`): the model states, the activations from
the analytic recipe, the derived step or the traced one, the step's moments, one device's share under ZeRO or a
layout, the peak, and the largest batch and context that fit."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...selection import match_all
from .activations import TrainingActivations, training_activations
from ..dims import attention_dropout, dim, text_config
from ..hardware import Accelerator, find_accelerator
from ..traced.step import StepSettings
from .fits import fit_on, fit_table
from .phases import PhaseFigure, cast_weights, moment_phases
from .precision_default import default_precision_words
from .quantization import weight_format
from .result import MemoryEstimate, Workspace
from .serving import step_length
from .states import (
    MASTER_PRECISION, as_trained, check_optimizer, check_precision, grad_buffer, master_gradient_copy, model_states,
    per_device, step_precision, weight_dtype, zero_stage,
)
from .training_engines import accumulating_moments, derive_step
from .training_input import input_words, step_input
from .training_layout import rank_layout
from .training_master import MAIN_GRAD_CONVENTION, MASTER_CONVENTION, with_master_copy
from .training_moments import derived_moments, traced_moments
from .training_options import DEFAULT_TRAINING_SEQ, TrainingOptions, trace_depth
from .training_recipe import step_recipe
from .training_parts import TrainingDetail, own_dtypes, step_temporaries, tied_embedding_bytes, tower_activations
from .weights import weight_memory


def step_estimate(report: Any, view: Any, options: TrainingOptions, *, live: bool,
                  structure: str | None = None) -> MemoryEstimate | None:
    """The training answer from the report and view; None when it needs a traced step and the view has no module
    (the caller builds). `live`: the report is of a module as it is (a plan's, a user's), whose requires_grad flags
    say what trains; `structure`: the key its derived recipes are kept under (plan.py's plan key). Under gradient
    accumulation: the micro-batch's step, its later micro-steps' moments added (grad_accum.py)."""
    if options.grad_accum > 1:
        from .grad_accum import accumulated, micro_options

        micro = step_estimate_at(report, view, micro_options(options), live=live, structure=structure,
                                 accumulating=True)
        return None if micro is None else accumulated(micro, report, options)
    return step_estimate_at(report, view, options, live=live, structure=structure)


def step_estimate_at(report: Any, view: Any, options: TrainingOptions, *, live: bool,
                     structure: str | None = None, accumulating: bool = False) -> MemoryEstimate | None:
    """step_estimate's one step of options.batch; `accumulating`: a traced step runs two micro-steps (the second
    over the gradients the first left) before its optimizer's."""
    optimizer = check_optimizer(options.optimizer)
    precision = check_precision(options.precision)
    run = step_precision(precision)  # the forward and backward's precision (bf16-master runs bf16-pure's)
    zero = zero_stage(options.zero)
    accelerator = find_accelerator(options.gpu) if options.gpu else None
    dtype = weight_dtype(precision)
    module = view.module
    if options.grad_checkpointing == "full" and not live:
        view.check_checkpointing()
    frozen = match_all(report.params, options.freeze)
    if live:  # a user's module (a PEFT model, a half-frozen one) trains what its requires_grad flags say
        frozen = sorted(set(frozen) | {p.name for p in report.params if not p.trainable})
    inputs = step_input(report, view, options, frozen, run)
    if inputs is None:
        return None
    media, cross, frozen, idle, unused = inputs.media, inputs.cross, inputs.frozen, inputs.idle, inputs.unused
    trainable = frozenset(p.name for p in report.params) - frozenset(frozen)
    own = options.own_dtype if live else frozenset()
    states = model_states(report.params, precision=precision, optimizer=optimizer, trainable=trainable, own=own)
    fmt = weight_format({"float32": "fp32", "bfloat16": "bf16"}[dtype])
    # each parameter in the dtype the step holds it in (a live module is cast to the precision's, as traced)
    weights = weight_memory(as_trained(report.params, precision, own), report.buffers, fmt,
                            components=[c.name for c in report.components])
    text = text_config(view.config)
    seq, limit, notes = step_length(report, text, options.seq, DEFAULT_TRAINING_SEQ)
    notes.extend(inputs.notes)
    notes.extend(input_words(report, view, inputs, seq))
    tower_saved = 0
    if media is not None:
        seq += media.tokens
        tower_saved = media.saved_bytes or 0
    checkpointing = options.grad_checkpointing == "full"
    resident = weights.bytes + weights.buffer_bytes + states.optimizer.bytes + states.master_weights.bytes
    gradients = states.gradients.bytes
    if grad_buffer(states):  # bf16-main-grad: the fp32 gradient buffer is resident, no .grad is held past its hook
        resident, gradients = resident + gradients, 0
        notes.append(MAIN_GRAD_CONVENTION)
    cast, cast_head, cast_biases = cast_weights(view) if precision.endswith("-mixed") else (0, 0, 0)
    shape = dict(precision=run, checkpointing=checkpointing, cast_weights=cast, cast_head=cast_head,
                 cast_biases=cast_biases)
    class_name = view.class_name
    found = step_recipe(view, text, options, live=live, seq=seq, shape=shape, cross=cross, notes=notes)
    attention, fused, adapters, recipe = found.attention, found.fused, found.adapters, found.recipe
    analytic, beside = found.analytic, found.beside

    tied = tied_embedding_bytes(report, trainable)
    step_bytes, step_text = step_temporaries(optimizer, gradients)
    master_copy = master_gradient_copy(states)  # bf16-master: the step's fp32 gradients, beside the bf16 ones
    optimizer_text = step_text
    if master_copy:
        step_bytes += master_copy
        step_text = with_master_copy(master_copy, optimizer_text)
        notes.append(MASTER_CONVENTION)
    if grad_buffer(states):  # Megatron's step reads the buffer itself as the masters' gradients
        step_text = ("the fp32 main-gradient buffer (resident, among the states) is the masters' .grad: nothing cast; "
                     f"{step_text}")

    def analytic_phases(act: TrainingActivations, batch: int, length: int) -> tuple[PhaseFigure, ...]:
        return moment_phases(act, resident=resident, gradients=gradients, tied=tied, text=text, batch=batch,
                             length=length, precision=run, step=(step_bytes, step_text),
                             # the recomputed layers' moments read each layer's gradient off the total: every
                             # parameter trains (a frozen one would make the per-layer share wrong)
                             recompute=None if frozen else (1, 0, False))

    traced = None
    derived = None
    # under a layout --trace traces one rank's step on torch's fake process group, beside the analytic answer
    layout_active = options.layout is not None and not options.layout.trivial
    depth = None if layout_active else trace_depth(options.trace)
    if cross is None and (depth == "extended" or (analytic is None and depth is None)):
        derived, why_not = derive_step(view, options, seq, limit, frozen, dtype if live else None, own,
                                       live=live, fresh=depth == "extended", structure=structure)
        if derived is None and why_not and depth == "extended":
            notes.append(f"the depth-extended trace declined ({why_not}): every layer traced")
        elif derived is None and why_not:
            notes.append(f"no closed form derived for {class_name} ({why_not}): one step traced")
    extended = derived is not None and depth == "extended"
    if derived is not None:
        phases, activations, source_label = derived_moments(
            derived, report, view, batch=options.batch, seq=seq, states=states, precision=precision, own=own,
            resident=resident, gradients=gradients, step=(step_bytes, step_text), extended=extended,
            accumulating=accumulating, text=text, notes=notes)
    elif depth or analytic is None:
        if module is None:
            return None
        settings = StepSettings(batch=options.batch, seq=seq, precision=precision, optimizer=optimizer,
                                grad_checkpointing=checkpointing, attention=options.attention, frozen=frozenset(frozen),
                                weights_dtype=dtype if live else None, own_dtype=own, media=cross,
                                grad_accum=2 if accumulating else 1)
        traced, phases, activations = traced_moments(
            module, report, view, settings, states=states, resident=resident, gradients=gradients,
            step=(step_bytes, step_text), master_copy=master_copy, media=media, cross=cross, text=text, notes=notes)
        if (recipe is None or adapters) and cross is None:
            notes.append(f"no analytic activation recipe for {class_name}: one step traced on fake "
                         "tensors; the largest batch scales the measured activations (linear in the batch), the "
                         "largest context is left to a trace at that length (--seq)")
        source_label = "traced"
    else:
        phases = analytic_phases(analytic, options.batch, seq)
        activations = Workspace(analytic.saved, analytic.saved_arithmetic, analytic.logits)
        source_label = f"analytic: {analytic.recipe}"
    if tower_saved:
        phases = tuple(dataclasses.replace(p, bytes=p.bytes + tower_saved, variable=p.variable + tower_saved)
                       if p.phase != "optimizer step" else p for p in phases)
        activations = dataclasses.replace(activations, bytes=activations.bytes + tower_saved)
    dropout = attention_dropout(text)
    if dropout and fused:
        layers = dim(text, "layers") or 0
        heads = dim(text, "heads") or 0
        scores = layers * 12 * options.batch * heads * seq * seq
        notes.append(f"attention dropout {dropout:g} in training: torch's fused CPU attention kernels do not support "
                     f"dropout, so sdpa keeps the probabilities and the mask, 12·B·heads·S² B per layer "
                     f"({scores:,} B here); CUDA's flash and memory-efficient kernels support dropout and keep "
                     "only a log-sum-exp, so on a GPU the peak is lower by up to that much")
    top = max(phases, key=lambda p: p.bytes)
    analytic_peak = None
    checked = analytic if analytic is not None else beside
    if (traced is not None or derived is not None) and checked is not None:
        analytic_peak = max(p.bytes for p in analytic_phases(checked, options.batch, seq))
        diff = (analytic_peak - top.bytes) / top.bytes
        if traced is not None:
            saved_diff = (checked.saved - activations.bytes) / activations.bytes if activations.bytes else 0.0
            saved_words = f"; its saved activations {checked.saved:,} B, {100 * saved_diff:+.2f}%"
        else:  # the derived end of the forward holds more than what is saved: no like-for-like figure
            saved_words = ""
        notes.append(f"check: the analytic peak is {analytic_peak:,} B, {100 * diff:+.2f}% from the "
                     f"{'traced' if traced is not None or extended else 'derived'} one{saved_words}")
    sharded = per_device(states, devices=options.devices, zero=zero) if options.devices > 1 and zero else None
    if options.devices > 1 and not zero:
        notes.append(f"data parallel over {options.devices:,} devices without ZeRO: each holds the full model "
                     "states; the figures are per device")
    elif zero and options.devices == 1:
        notes.append(f"ZeRO stage {zero} over one device shards nothing; give --devices N")

    device, layout_at, to_rank = None, None, None
    if options.layout is not None and not options.layout.trivial:
        from ..parallel.device import StepContext

        rank = rank_layout(StepContext(
            report=report, view=view, layout=options.layout, states=states, buffer_bytes=weights.buffer_bytes,
            phases=phases, activations=activations.bytes, analytic=analytic,
            derived_or_traced=derived is not None or traced is not None, source_label=source_label,
            precision=run, optimizer=optimizer, trainable=trainable, own=own, text=text, batch=options.batch,
            seq=seq, shape=shape, step=(step_bytes, step_text), trace=bool(options.trace),
            attention=options.attention, frozen=frozenset(frozen), weights_dtype=dtype if live else None,
            limit=limit, live=live, structure=structure, derive=options.derive_layout,
            accumulating=accumulating), master_copy=master_copy, optimizer_text=optimizer_text, notes=notes)
        if rank is None:  # its per-device recipe is neither kept nor derivable without the build
            return None
        device, layout_at, to_rank = rank.device, rank.layout_at, rank.to_rank

    rank_later = None
    if accumulating and device is not None:  # the fits table beside a layout: each micro-batch's later micro-step
        from .grad_accum import later_rank_step

        rank_later = later_rank_step(report, trainable, precision, own, device.activations_from, options.layout)

    def on_one_device(figures: tuple[PhaseFigure, ...], batch: int = options.batch,
                      length: int = seq) -> PhaseFigure:
        """The largest moment on one device, each moment's model states replaced by the device's shares."""
        if layout_at is not None and rank_later is not None:  # accumulation: the device's later micro-step too
            return max(rank_later(layout_at(to_rank(figures), batch, length, every=True), batch, length),
                       key=lambda p: p.bytes)
        if layout_at is not None:
            return layout_at(to_rank(figures), batch, length)
        if sharded is None:
            return max(figures, key=lambda p: p.bytes)
        fixed = (states.weights.bytes - sharded["weights"]) + (states.optimizer.bytes - sharded["optimizer"]) + \
            (states.master_weights.bytes - sharded["master_weights"])
        # bf16-master's step casts the device's partition of the gradients only (master_gradient_copy)
        copy = master_copy - master_gradient_copy(states, devices=options.devices, zero=zero)
        return max((PhaseFigure(p.phase, p.bytes - fixed - (p.gradients - -(-p.gradients // options.devices)
                                                              if zero >= 2 else 0)
                                - (copy if p.phase == "optimizer step" else 0), p.where, p.arithmetic)
                    for p in figures), key=lambda p: p.bytes)

    device_top = on_one_device(phases)
    peak = device_top.bytes
    if traced is None and derived is None and device_top.where == "end of forward":
        notes.append("the peak is the end of the forward, as the loss is taken: what the forward saves for backward, "
                     "the loss's buffers, and what the model's output still holds then (named in the phase's "
                     "arithmetic)")
    if sharded is not None:
        sharded = dict(sharded, activations=activations.bytes, peak=peak, peak_phase=device_top.phase)
        if zero >= 3:
            notes.append("ZeRO-3 gathers each layer's full weights while it runs; that transient is not counted")

    def peak_at(batch: int, length: int) -> int:
        return language_peak_at(batch, length) + tower_saved * batch // options.batch

    later = accumulating_moments(report, trainable, precision, own, source_label, options, accumulating)

    def language_peak_at(batch: int, length: int) -> int:
        if derived is not None:
            figures = derived.at(batch, length)
            if figures is None:  # that regime's derivation declined: counted as not fitting, and said
                return 1 << 62
            figures = (
                PhaseFigure("forward", resident + figures.forward, "", ""),
                PhaseFigure("backward", resident + figures.backward, "", "", figures.gradients_at_backward_peak),
                PhaseFigure("optimizer step", resident + gradients + step_bytes, "", "", gradients))
            if accumulating:
                from .grad_accum import derived_later

                figures = derived_later(figures, derived, batch, length, resident, gradients)
            return on_one_device(later(figures, batch, length), batch, length).bytes
        if analytic is not None and traced is None:
            act = training_activations(text, class_name, batch=batch, seq=length, **shape)
            return on_one_device(later(analytic_phases(act, batch, length), batch, length), batch, length).bytes
        # traced: each moment's activations and temporaries scale with the batch (at the traced length only)
        scaled = tuple(dataclasses.replace(p, bytes=p.bytes + p.variable * (batch - options.batch) // options.batch)
                       for p in phases)
        return on_one_device(scaled).bytes

    if options.precision_defaulted and precision == MASTER_PRECISION:  # the default under ZeRO 1-3, named first
        notes.insert(0, default_precision_words(precision))
    settings_out = {
        "precision": precision, "precision_defaulted": options.precision_defaulted, "optimizer": optimizer, "weights_dtype": dtype, "own_dtype": own_dtypes(report, own),
        "batch": options.batch, "seq": seq,
        "seq_from": "--seq" if options.seq else "default for training (2,048, or the model's maximum)",
        "grad_checkpointing": options.grad_checkpointing, "attention": attention,
        "freeze": list(options.freeze), "idle_towers": list(idle) if unused else [], "devices": options.devices, "zero": zero, "reserve": options.reserve,
        "activations_from": source_label, "max_context": limit,
        "trace": "full" if traced is not None else "extended" if extended else None,
    }
    if accelerator is None and options.budget is not None:
        accelerator = Accelerator("budget", options.budget, "", "budget")
    contexts = traced is None  # a full-depth traced peak is known at its own length only; a derived one at any
    # under a pipeline the largest batch is one its microbatches divide (as the layout requires of --batch)
    step = options.layout.micro_batches if options.layout is not None and options.layout.pp > 1 else 1
    budget = fit_on(accelerator, peak_at, options.reserve, batch=options.batch, seq=seq, max_context=limit,
                    contexts=contexts, batch_step=step) if accelerator else None
    if derived is not None and derived.declined:
        notes.append("largest batch and context: a regime whose derivation declined counts as not fitting (" +
                     "; ".join(derived.declined[:3]) + ")")
    if device is not None:
        from ..parallel.estimate import layout_settings

        settings_out["layout"] = layout_settings(options.layout)
        settings_out["devices"] = options.layout.devices
    detail = TrainingDetail(states, tuple(sorted(frozen)), source_label, phases, sharded, traced, analytic_peak,
                            dict(traced.peak.by_category) if traced is not None else {},
                            checked.saved if traced is not None and checked is not None else None,
                            settings_out["trace"], device, tower_activations(traced, cross))
    engine = "traced" if traced is not None or extended else "derived" if derived is not None else "analytic"
    if device is not None and device.activations_from.startswith("derived"):
        engine = "derived"
    estimate = MemoryEstimate(
        mode="training",
        engine=engine,
        settings=settings_out,
        weights=weights, kv_cache=None, activations=activations, peak=peak, peak_phase=device_top.phase,
        reserve=options.reserve,
        fits=fit_table(peak_at, options.reserve, batch=options.batch, seq=seq, max_context=limit, contexts=contexts,
                       batch_step=step) if options.fits else (),
        budget=budget, notes=tuple(notes), training=detail)
    return estimate
