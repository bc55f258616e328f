"""A training step's moments from a derived recipe or a traced step (training_step.py): each moment's bytes over the
resident model states, the gradients it holds and what scales with the batch, the activations at the end of the
forward, and the words on how they were counted."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..dims import config_int
from ..model_view import towers_not_run
from ..traced.step import StepSettings, TORCH_OPTIMIZERS, trace_training
from .expert_offsets import expert_offsets
from .phases import PhaseFigure
from .result import Workspace
from .states import grad_buffer, model_states


def derived_moments(derived: Any, report: Any, view: Any, *, batch: int, seq: int, states: Any, precision: str,
                    own: frozenset[str], resident: int, gradients: int, step: tuple[int, str], extended: bool,
                    accumulating: bool, text: Any, notes: list[str]) -> tuple[tuple[PhaseFigure, ...], Workspace, str]:
    """The moments, the end of the forward's activations and their source label from `derived` (a derived or
    depth-extended recipe) at `batch` x `seq`; `step` the optimizer step's temporaries (bytes, words). Its words are
    added to `notes`."""
    step_bytes, step_text = step
    figures = derived.recipe.peaks(batch, seq)
    how = "depth-extended trace" if extended else "derived"
    if grad_buffer(states) and figures.gradients_at_backward_peak:  # derived under bf16-pure's AccumulateGrad
        notes.append(f"the derived backward peak holds {figures.gradients_at_backward_peak:,} B of bf16 gradients "
                     "(bf16-pure's step), which Megatron's hooks add into the fp32 buffer and free: a bound, up "
                     "to that much over (--trace full runs the hooks)")
    # what the traced step still holds at its optimizer step: the MoE layers' expert offsets
    offsets, offsets_text = expert_offsets(report.params, precision, own, config=view.config)
    step_end = resident + gradients + step_bytes + offsets
    phases = (
        PhaseFigure("forward", resident + figures.forward, how, derived.recipe.words("forward", batch, seq), 0,
                    figures.forward),
        PhaseFigure("backward", resident + figures.backward, how, derived.recipe.words("backward", batch, seq),
                    figures.gradients_at_backward_peak, figures.backward - figures.gradients_at_backward_peak),
        PhaseFigure("optimizer step", step_end, "optimizer step",
                    f"gradients {gradients:,}; {step_text}" + (f"; held past the backward: {offsets_text}"
                                                              if offsets else ""), gradients),
    )
    if accumulating:  # a later micro-step, replayed from the same recipe (grad_accum.derived_later)
        from .grad_accum import derived_later

        phases = derived_later(phases, derived, batch, seq, resident, gradients)
    activations = Workspace(figures.end_of_forward, derived.recipe.words("end of forward", batch, seq),
                            4 * batch * seq * (config_int(text, "vocab_size") or 0))
    if extended:
        layers = len(derived.recipe.layer_types)
        notes.append(f"traced, depth-extended: {derived.recipe.traced}; {derived.recipe.check}; extended to "
                     f"the model's {layers:,} layers exactly, allocation by allocation (--trace full traces "
                     "every layer); the optimizer step's moment is counted (gradients, the step's temporaries "
                     "and what a layer keeps referenced past the backward: a MoE layer's 4 B per expert)")
    else:
        notes.extend(derived.notes())
    return phases, activations, "traced (depth-extended)" if extended else "derived"


def traced_moments(module: Any, report: Any, view: Any, settings: StepSettings, *, states: Any, resident: int,
                   gradients: int, step: tuple[int, str], master_copy: int, media: Any, cross: Any, text: Any,
                   notes: list[str]) -> tuple[Any, tuple[PhaseFigure, ...], Workspace]:
    """The trace of one step of `module` under `settings` (MemTracker, fake tensors), its moments and its activations
    at the end of the forward; `step` the optimizer step's temporaries (bytes, words), `master_copy` bf16-master's
    fp32 gradient copy among them; `media` an image input's towers (the trace runs the text), `cross` a
    cross-attention family's input (the trace runs it). Its words are added to `notes`."""
    step_bytes, step_text = step
    traced = trace_training(module, settings)
    notes.extend(traced.notes)
    extra = 0 if settings.optimizer in TORCH_OPTIMIZERS[:4] else states.optimizer.bytes  # states the trace lacks
    phases = tuple(PhaseFigure(p.phase, p.bytes + extra, "measured",
                               "MemTracker: " + ", ".join(f"{k} {v:,}" for k, v in p.by_category.items() if v),
                               p.by_category["gradients"],
                               p.by_category["activations"] + p.by_category["temporaries"] +
                               p.by_category["other"])
                   for p in traced.phases)
    if master_copy:  # MemTracker files the step's fp32 gradient copies under activations: they do not scale
        phases = tuple(dataclasses.replace(p, variable=p.variable - master_copy) if p.phase == "optimizer step"
                       else p for p in phases)
    if extra:
        phases = phases + (PhaseFigure("optimizer step", resident + gradients + step_bytes,
                                       "optimizer step (analytic)", f"gradients {gradients:,}; {step_text}",
                                       gradients),)
    if media is not None:  # the trace runs text only: its optimizer holds no state for the towers, which train
        towers = towers_not_run(view)
        held = model_states([p for p in report.params if any(p.name.startswith(t + ".") for t in towers)],
                            precision=settings.precision, optimizer=settings.optimizer, own=settings.own_dtype,
                            trainable=frozenset(p.name for p in report.params if p.name not in settings.frozen
                                                and any(p.name.startswith(t + ".") for t in towers)))
        kept = held.optimizer.bytes + held.master_weights.bytes
        phases = tuple(dataclasses.replace(p, bytes=p.bytes + kept + (held.gradients.bytes if p.phase ==
                                                                       "optimizer step" else 0)) for p in phases)
        notes.append(f"the traced step runs the text: the towers' optimizer state and master copy ({kept:,} B) "
                     f"are added to each moment, their gradients ({held.gradients.bytes:,} B) to the optimizer "
                     "step's")
    rows = cross.sequences if cross is not None else settings.batch
    activations = Workspace(traced.saved_activations, "measured at the end of the forward (MemTracker, fake tensors)",
                            4 * rows * settings.seq * (config_int(text, "vocab_size") or 0))
    return traced, phases, activations
