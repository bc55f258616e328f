"""Which engine gives a training step's moments (training_step.py), and the moments: the derived recipe (from the
cache or derived from traces), one traced step, or the analytic recipe; a media model's tower activations added, and
the analytic peak's check against a derived or traced one named."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..dims import attention_dropout, dim
from ..traced.step import StepSettings
from .phases import PhaseFigure
from .result import Workspace
from .training_basis import StepBasis
from .training_engines import derive_step
from .training_moments import derived_moments, traced_moments
from .training_options import TrainingOptions, trace_depth


@dataclass(frozen=True)
class StepSource:
    """The step's moments `phases` and its `activations` (Workspace) from the engine `label` names: `derived` the
    derived step (derived/step.DerivedStep) or None, `traced` the traced step or None, `extended` whether the derived
    one is the depth-extended trace (--trace extended); `analytic_peak` the analytic peak a derived or traced answer
    was checked against, or None."""

    phases: tuple[PhaseFigure, ...]
    activations: Workspace
    label: str
    derived: Any
    traced: Any
    extended: bool
    analytic_peak: int | None


def step_source(basis: StepBasis, report: Any, view: Any, options: TrainingOptions, *, live: bool,
                structure: str | None, accumulating: bool) -> StepSource | None:
    """The step's moments from the engine that answers it; None when that is a traced step and the view has no module
    (the caller builds). Adds the engine's words to basis.notes."""
    notes, seq, cross = basis.notes, basis.seq, basis.inputs.cross
    analytic, class_name = basis.found.analytic, view.class_name
    step = basis.step
    traced = None
    derived = None
    # under a layout --trace traces one rank's step on torch's fake process group, beside the analytic answer
    layout_active = options.layout is not None and not options.layout.trivial
    depth = None if layout_active else trace_depth(options.trace)
    if cross is None and (depth == "extended" or (analytic is None and depth is None)):
        derived, why_not = derive_step(view, options, seq, basis.limit, basis.frozen, basis.dtype if live else None,
                                       basis.own, live=live, fresh=depth == "extended", structure=structure)
        if derived is None and why_not and depth == "extended":
            notes.append(f"the depth-extended trace declined ({why_not}): every layer traced")
        elif derived is None and why_not:
            notes.append(f"no closed form derived for {class_name} ({why_not}): one step traced")
    extended = derived is not None and depth == "extended"
    if derived is not None:
        phases, activations, label = derived_moments(
            derived, report, view, batch=options.batch, seq=seq, states=basis.states, precision=basis.precision,
            own=basis.own, resident=basis.resident, gradients=basis.gradients, step=step, extended=extended,
            accumulating=accumulating, text=basis.text, notes=notes)
    elif depth or analytic is None:
        if view.module is None:
            return None
        settings = StepSettings(batch=options.batch, seq=seq, precision=basis.precision, optimizer=basis.optimizer,
                                grad_checkpointing=basis.checkpointing, attention=options.attention,
                                frozen=frozenset(basis.frozen), weights_dtype=basis.dtype if live else None,
                                own_dtype=basis.own, media=cross, grad_accum=2 if accumulating else 1)
        traced, phases, activations = traced_moments(
            view.module, report, view, settings, states=basis.states, resident=basis.resident,
            gradients=basis.gradients, step=step, master_copy=basis.master_copy, media=basis.inputs.media,
            cross=cross, text=basis.text, notes=notes)
        if (basis.found.recipe is None or basis.found.adapters) and cross is None:
            notes.append(f"no analytic activation recipe for {class_name}: one step traced on fake "
                         "tensors; the largest batch scales the measured activations (linear in the batch), the "
                         "largest context is left to a trace at that length (--seq)")
        label = "traced"
    else:
        phases = basis.analytic_phases(analytic, options.batch, seq)
        activations = Workspace(analytic.saved, analytic.saved_arithmetic, analytic.logits)
        label = f"analytic: {analytic.recipe}"
    if basis.tower_saved:
        phases = tuple(dataclasses.replace(p, bytes=p.bytes + basis.tower_saved, variable=p.variable + basis.tower_saved)
                       if p.phase != "optimizer step" else p for p in phases)
        activations = dataclasses.replace(activations, bytes=activations.bytes + basis.tower_saved)
    dropout = attention_dropout(basis.text)
    if dropout and basis.found.fused:
        layers = dim(basis.text, "layers") or 0
        heads = dim(basis.text, "heads") or 0
        scores = layers * 12 * options.batch * heads * seq * seq
        notes.append(f"attention dropout {dropout:g} in training: torch's fused CPU attention kernels do not support "
                     f"dropout, so sdpa keeps the probabilities and the mask, 12·B·heads·S² B per layer "
                     f"({scores:,} B here); CUDA's flash and memory-efficient kernels support dropout and keep "
                     "only a log-sum-exp, so on a GPU the peak is lower by up to that much")
    source = StepSource(phases, activations, label, derived, traced, extended, None)
    return dataclasses.replace(source, analytic_peak=checked_peak(basis, source, options.batch))


def checked_peak(basis: StepBasis, source: StepSource, batch: int) -> int | None:
    """The analytic peak a derived or traced step is checked against (the analytic recipe, or the one beside it
    that counts less than the step holds), its difference named in basis.notes; None where there is none."""
    checked = basis.found.analytic if basis.found.analytic is not None else basis.found.beside
    if (source.traced is None and source.derived is None) or checked is None:
        return None
    top = max(source.phases, key=lambda p: p.bytes)
    analytic_peak = max(p.bytes for p in basis.analytic_phases(checked, batch, basis.seq))
    diff = (analytic_peak - top.bytes) / top.bytes
    activations = source.activations
    if source.traced is not None:
        saved_diff = (checked.saved - activations.bytes) / activations.bytes if activations.bytes else 0.0
        saved_words = f"; its saved activations {checked.saved:,} B, {100 * saved_diff:+.2f}%"
    else:  # the derived end of the forward holds more than what is saved: no like-for-like figure
        saved_words = ""
    basis.notes.append(f"check: the analytic peak is {analytic_peak:,} B, {100 * diff:+.2f}% from the "
                       f"{'traced' if source.traced is not None or source.extended else 'derived'} one{saved_words}")
    return analytic_peak
