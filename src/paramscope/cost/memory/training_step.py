"""One training step's answer from a model's report and view (`step_estimate`): the model states, the activations from
the analytic recipe, the derived step or the traced one, the step's moments, one device's share under ZeRO or a
layout, the peak, and the largest batch and context that fit. Its parts: training_basis (the settings and model
states), training_source (the engine and its moments), training_layout (a layout's device), here the device's share
and the largest moment at any batch and length."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..hardware import Accelerator
from .activations import training_activations
from .fits import fit_on, fit_table
from .phases import PhaseFigure
from .precision_default import default_precision_words
from .result import MemoryEstimate
from .states import MASTER_PRECISION, master_gradient_copy, per_device
from .training_basis import StepBasis, step_basis
from .training_engines import accumulating_moments
from .training_layout import RankLayout, rank_layout
from .training_options import TrainingOptions
from .training_parts import TrainingDetail, own_dtypes, tower_activations
from .training_source import StepSource, step_source


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
    basis = step_basis(report, view, options, live=live)
    if basis is None:
        return None
    source = step_source(basis, report, view, options, live=live, structure=structure, accumulating=accumulating)
    if source is None:
        return None
    notes, states, zero, seq = basis.notes, basis.states, basis.zero, basis.seq
    sharded = per_device(states, devices=options.devices, zero=zero) if options.devices > 1 and zero else None
    if options.devices > 1 and not zero:
        notes.append(f"data parallel over {options.devices:,} devices without ZeRO: each holds the full model "
                     "states; the figures are per device")
    elif zero and options.devices == 1:
        notes.append(f"ZeRO stage {zero} over one device shards nothing; give --devices N")

    rank = None
    if options.layout is not None and not options.layout.trivial:
        rank = layout_rank(basis, source, report, view, options, live=live, structure=structure,
                           accumulating=accumulating)
        if rank is None:  # its per-device recipe is neither kept nor derivable without the build
            return None
    on_one_device = device_share(basis, options, rank, sharded,
                                 later_rank=later_rank_moments(basis, report, options, rank, accumulating))
    device_top = on_one_device(source.phases)
    peak = device_top.bytes
    if source.traced is None and source.derived is None and device_top.where == "end of forward":
        notes.append("the peak is the end of the forward, as the loss is taken: what the forward saves for backward, "
                     "the loss's buffers, and what the model's output still holds then (named in the phase's "
                     "arithmetic)")
    if sharded is not None:
        sharded = dict(sharded, activations=source.activations.bytes, peak=peak, peak_phase=device_top.phase)
        if zero >= 3:
            notes.append("ZeRO-3 gathers each layer's full weights while it runs; that transient is not counted")
    peak_at = peak_function(basis, source, report, view, options, on_one_device, accumulating)
    if options.precision_defaulted and basis.precision == MASTER_PRECISION:  # the default under ZeRO 1-3, named first
        notes.insert(0, default_precision_words(basis.precision))
    device = rank.device if rank is not None else None
    settings_out = step_settings(basis, source, report, options, device)
    accelerator = basis.accelerator
    if accelerator is None and options.budget is not None:
        accelerator = Accelerator("budget", options.budget, "", "budget")
    contexts = source.traced is None  # a full-depth traced peak is known at its own length only; a derived one at any
    # under a pipeline the largest batch is one its microbatches divide (as the layout requires of --batch)
    step = options.layout.micro_batches if options.layout is not None and options.layout.pp > 1 else 1
    budget = fit_on(accelerator, peak_at, options.reserve, batch=options.batch, seq=seq, max_context=basis.limit,
                    contexts=contexts, batch_step=step) if accelerator else None
    derived, traced = source.derived, source.traced
    if derived is not None and derived.declined:
        notes.append("largest batch and context: a regime whose derivation declined counts as not fitting (" +
                     "; ".join(derived.declined[:3]) + ")")
    checked = basis.found.analytic if basis.found.analytic is not None else basis.found.beside
    detail = TrainingDetail(states, tuple(sorted(basis.frozen)), source.label, source.phases, sharded, traced,
                            source.analytic_peak,
                            dict(traced.peak.by_category) if traced is not None else {},
                            checked.saved if traced is not None and checked is not None else None,
                            settings_out["trace"], device, tower_activations(traced, basis.inputs.cross))
    engine = "traced" if traced is not None or source.extended else "derived" if derived is not None else "analytic"
    if device is not None and device.activations_from.startswith("derived"):
        engine = "derived"
    return MemoryEstimate(
        mode="training",
        engine=engine,
        settings=settings_out,
        weights=basis.weights, kv_cache=None, activations=source.activations, peak=peak,
        peak_phase=device_top.phase, reserve=options.reserve,
        fits=fit_table(peak_at, options.reserve, batch=options.batch, seq=seq, max_context=basis.limit,
                       contexts=contexts, batch_step=step) if options.fits else (),
        budget=budget, notes=tuple(notes), training=detail)


def layout_rank(basis: StepBasis, source: StepSource, report: Any, view: Any, options: TrainingOptions, *,
                live: bool, structure: str | None, accumulating: bool) -> RankLayout | None:
    """One device's answer under options.layout from the one-device step (training_layout.rank_layout)."""
    from ..parallel.device import StepContext

    return rank_layout(StepContext(
        report=report, view=view, layout=options.layout, states=basis.states,
        buffer_bytes=basis.weights.buffer_bytes, phases=source.phases, activations=source.activations.bytes,
        analytic=basis.found.analytic, derived_or_traced=source.derived is not None or source.traced is not None,
        source_label=source.label, precision=basis.run, optimizer=basis.optimizer, trainable=basis.trainable,
        own=basis.own, text=basis.text, batch=options.batch, seq=basis.seq, shape=basis.shape, step=basis.step,
        trace=bool(options.trace), attention=options.attention, frozen=frozenset(basis.frozen),
        weights_dtype=basis.dtype if live else None, limit=basis.limit, live=live, structure=structure,
        derive=options.derive_layout, accumulating=accumulating), master_copy=basis.master_copy,
        optimizer_text=basis.optimizer_text, notes=basis.notes)


def later_rank_moments(basis: StepBasis, report: Any, options: TrainingOptions, rank: RankLayout | None,
                       accumulating: bool) -> Callable[..., Any] | None:
    """Under gradient accumulation beside a layout, (moments, batch, length) → the device's moments with each
    micro-batch's later micro-step added (grad_accum.later_rank_step), for the fits table; else None."""
    if not accumulating or rank is None:
        return None
    from .grad_accum import later_rank_step

    return later_rank_step(report, basis.trainable, basis.precision, basis.own, rank.device.activations_from,
                           options.layout)


def device_share(basis: StepBasis, options: TrainingOptions, rank: RankLayout | None, sharded: dict | None, *,
                 later_rank: Callable[..., Any] | None) -> Callable[..., PhaseFigure]:
    """(moments, batch, length) → the largest moment on one device, each moment's model states replaced by the
    device's shares: a layout's rank (training_layout), ZeRO's partition over options.devices, or the moments as
    they are on one device."""
    states, zero, master_copy = basis.states, basis.zero, basis.master_copy

    def on_one_device(figures: tuple[PhaseFigure, ...], batch: int = options.batch,
                      length: int = basis.seq) -> PhaseFigure:
        if rank is not None and later_rank is not None:  # accumulation: the device's later micro-step too
            return max(later_rank(rank.layout_at(rank.to_rank(figures), batch, length, every=True), batch, length),
                       key=lambda p: p.bytes)
        if rank is not None:
            return rank.layout_at(rank.to_rank(figures), batch, length)
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

    return on_one_device


def peak_function(basis: StepBasis, source: StepSource, report: Any, view: Any, options: TrainingOptions,
                  on_one_device: Callable[..., PhaseFigure], accumulating: bool) -> Callable[[int, int], int]:
    """(batch, length) → the device's peak there, for the largest batch and context: the derived recipe's moments
    at any point (a declined regime counts as not fitting), the analytic recipe's, or a traced step's scaled in the
    batch at its own length; a media model's tower activations scaled with the batch."""
    derived, traced, analytic = source.derived, source.traced, basis.found.analytic
    resident, gradients = basis.resident, basis.gradients
    step_bytes = basis.step[0]
    later = accumulating_moments(report, basis.trainable, basis.precision, basis.own, source.label, options,
                                 accumulating)

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
            act = training_activations(basis.text, view.class_name, batch=batch, seq=length, **basis.shape)
            return on_one_device(later(basis.analytic_phases(act, batch, length), batch, length), batch,
                                 length).bytes
        # traced: each moment's activations and temporaries scale with the batch (at the traced length only)
        scaled = tuple(dataclasses.replace(p, bytes=p.bytes + p.variable * (batch - options.batch) // options.batch)
                       for p in source.phases)
        return on_one_device(scaled).bytes

    def peak_at(batch: int, length: int) -> int:
        return language_peak_at(batch, length) + basis.tower_saved * batch // options.batch

    return peak_at


def step_settings(basis: StepBasis, source: StepSource, report: Any, options: TrainingOptions,
                  device: Any) -> dict[str, Any]:
    """The answer's settings as its JSON gives them (docs/json-schema.md)."""
    inputs = basis.inputs
    settings = {
        "precision": basis.precision, "precision_defaulted": options.precision_defaulted,
        "optimizer": basis.optimizer, "weights_dtype": basis.dtype, "own_dtype": own_dtypes(report, basis.own),
        "batch": options.batch, "seq": basis.seq,
        "seq_from": "--seq" if options.seq else "default for training (2,048, or the model's maximum)",
        "grad_checkpointing": options.grad_checkpointing, "attention": basis.found.attention,
        "freeze": list(options.freeze), "idle_towers": list(inputs.idle) if inputs.unused else [],
        "devices": options.devices, "zero": basis.zero, "reserve": options.reserve,
        "activations_from": source.label, "max_context": basis.limit,
        "trace": "full" if source.traced is not None else "extended" if source.extended else None,
    }
    if device is not None:
        from ..parallel.estimate import layout_settings

        settings["layout"] = layout_settings(options.layout)
        settings["devices"] = options.layout.devices
    return settings
